/*
 * The cpu-simd kernel variant against float64. Weight rows of every type it
 * implements come from the default model (Q4_K, Q5_0, Q6_K, Q8_0), or for
 * the types it lacks (Q4_0, Q4_1, Q5_1, Q5_K) from the random blocks of
 * tests/fixtures/dequant-blocks.txt, their rows repeated; dequantised by
 * the cpu plugin's get_rows (checked value for value against gguf-py by
 * test_quant); they multiply random activations with a few large
 * channels, summed in double.
 *
 * The variant rounds each activation to int16 in blocks of 32 values with
 * scale d_b = max |x| / 32639 (SIMD_QMAX, plugins/cpu-simd/simd.h),
 * so each value moves by at most d_b / 2 and output r may differ from the
 * exact sum by at most
 *   sum_b (d_b / 2) sum_{i in b} |w_ri|      (activation rounding)
 *   + 1e-5 sum_i |w_ri x_i|                  (float scaling and summation)
 * which every output must respect, for every gemv column count
 * 1..max_gemv_columns and for gemm, with each instruction set this CPU runs,
 * on the reference cpu backend (the variant's own threads) and on cpu-fast
 * (the threads it lends, ABI 1.3). Its gemv_glu (ABI 1.4) must give the
 * bits of two gemv and the reference's glu, and refuse on cpu-fast.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks_fixture.h"
#include "gguf.h"
#include "helpers.h"
#include "q4khost/plugin.h"

#define ROWS 48
#define GEMM_COLS 37

struct env {
	void *cpu_dl, *simd_dl;
	const struct q4kh_backend_v1 *b;
	const struct q4kh_kernel_v1 *v;
	struct q4kh_host_api api;
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev;
	q4kh_kernel_ctx *kctx;
	struct q4kh_native_device nd;
	const char *isa; /* the [plugin.cpu-simd] isa setting */
};

static const char *config(void *host_data, const char *key)
{
	const struct env *e = host_data;

	if (!strcmp(key, "isa"))
		return e->isa;
	return !strcmp(key, "threads") ? "2" : NULL;
}

/* BACKEND ("cpu", "cpu-fast") and the variant's table; the variant's
 * context is opened by env_variant(). */
static struct env *env_on(const char *backend)
{
	struct env *e = calloc(1, sizeof(*e));
	const struct q4kh_plugin_desc *cpu, *simd;
	char rel[128];

	cr_assert_not_null(e);
	snprintf(rel, sizeof(rel), "plugins/%s/.libs/%s.so", backend, backend);
	cpu = test_plugin_load(rel, &e->cpu_dl);
	simd = test_plugin_load("plugins/cpu-simd/.libs/cpu-simd.so", &e->simd_dl);
	cr_assert_str_eq(simd->name, "cpu-simd");
	cr_assert_eq(simd->kind, Q4KH_KIND_KERNEL);
	e->b = cpu->backend;
	e->v = simd->kernel;
	cr_assert_str_eq(e->v->backend, "cpu");
	e->api = test_host_api(e, config);
	cr_assert_eq(e->b->init(&e->api, &e->ctx), Q4KH_OK, "%s", e->b->last_error(NULL));
	cr_assert_eq(e->b->device_open(e->ctx, 0, &e->dev), Q4KH_OK);
	e->nd.struct_size = sizeof(e->nd);
	cr_assert_eq(e->b->native_device(e->dev, &e->nd), Q4KH_OK);
	return e;
}

static struct env *env_open(void)
{
	return env_on("cpu");
}

/* Open the variant with isa = ISA; 0, or the failed init's status. */
static q4kh_status env_variant(struct env *e, const char *isa)
{
	if (e->kctx)
		e->v->shutdown(e->kctx);
	e->kctx = NULL;
	e->isa = isa;
	return e->v->init(&e->api, &e->kctx);
}

static void env_close(struct env *e)
{
	if (e->kctx)
		e->v->shutdown(e->kctx);
	e->b->device_close(e->dev);
	e->b->shutdown(e->ctx);
	dlclose(e->simd_dl);
	dlclose(e->cpu_dl);
	free(e);
}

/* Does this CPU run ISA? Asked of libgcc, not of the plugin. */
static int cpu_runs(const char *isa)
{
	__builtin_cpu_init();
	if (!strcmp(isa, "avx2"))
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
	       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
	       __builtin_cpu_supports("avx512vnni");
}

static struct q4kh_tensor f32_tensor(struct env *e, int64_t ne0, int64_t ne1,
                                     int64_t pad, const float *data)
{
	struct q4kh_tensor t = { .type = Q4KH_TYPE_F32, .ne = { ne0, ne1, 1, 1 } };

	t.nb[0] = 4;
	t.nb[1] = 4 * ne0 + pad;
	t.nb[2] = t.nb[3] = t.nb[1] * ne1;
	cr_assert_eq(e->b->buffer_alloc(e->dev, (uint64_t)t.nb[2], &t.buffer), Q4KH_OK);
	for (int64_t c = 0; data && c < ne1; c++)
		cr_assert_eq(e->b->buffer_upload(e->dev, t.buffer, (uint64_t)(c * t.nb[1]),
		                                 data + c * ne0, (uint64_t)(4 * ne0)),
		             Q4KH_OK);
	return t;
}

static float *fetch(struct env *e, const struct q4kh_tensor *t)
{
	float *out = malloc(sizeof(float) * (size_t)(t->ne[0] * t->ne[1]));

	cr_assert_not_null(out);
	for (int64_t c = 0; c < t->ne[1]; c++)
		cr_assert_eq(e->b->buffer_download(e->dev, t->buffer, (uint64_t)(c * t->nb[1]),
		                                   out + c * t->ne[0], (uint64_t)(4 * t->ne[0])),
		             Q4KH_OK);
	return out;
}

/*
 * ROWS rows of the model's first {K, N} weight of TYPE, from the middle
 * moved SHIFT rows on.
 */
struct weight {
	const char *name;
	int64_t k;
	struct q4kh_tensor t; /* in a cpu buffer */
	double *exact;        /* ROWS x k, dequantised by the cpu plugin */
};

/* ROWS rows of TYPE from the blocks fixture, its rows repeated, into W. */
static void fixture_rows(struct env *e, uint32_t type, struct weight *w)
{
	struct blocks_fixture bf;
	const struct blocks_tensor *bt;

	blocks_fixture_load(&bf);
	bt = blocks_fixture_find(&bf, type);
	cr_assert_not_null(bt, "neither the default model nor the blocks fixture has %s",
	                   q4kh_type_name(type));
	w->k = bt->ne0;
	w->t.nb[1] = (int64_t)bt->row_bytes;
	cr_assert_eq(e->b->buffer_alloc(e->dev, bt->row_bytes * ROWS, &w->t.buffer), Q4KH_OK);
	for (int i = 0; i < ROWS; i++)
		cr_assert_eq(e->b->buffer_upload(e->dev, w->t.buffer, bt->row_bytes * (uint64_t)i,
		                                 bt->bytes + bt->row_bytes * (uint64_t)(i % bt->rows),
		                                 bt->row_bytes),
		             Q4KH_OK);
	blocks_fixture_free(&bf);
}

static void weight_rows(struct env *e, const struct q4kh_gguf *g, uint32_t type,
                        int64_t shift, struct weight *w)
{
	const struct q4kh_gguf_tensor *gt = NULL;
	struct q4kh_tensor out;
	int32_t ids[ROWS];
	uint64_t rb;
	float *v;

	for (uint64_t i = 0; i < g->n_tensors && !gt; i++)
		if (g->tensors[i].type == type && g->tensors[i].n_dims == 2 &&
		    g->tensors[i].ne[1] >= ROWS)
			gt = &g->tensors[i];
	w->name = q4kh_type_name(type);
	w->t = (struct q4kh_tensor){ .type = type, .ne = { 0, ROWS, 1, 1 } };
	w->t.nb[0] = (int64_t)q4kh_type_block_bytes(type);
	if (gt) {
		w->k = gt->ne[0];
		rb = gt->size / (uint64_t)gt->ne[1];
		w->t.nb[1] = (int64_t)rb;
		cr_assert_eq(e->b->buffer_alloc(e->dev, rb * ROWS, &w->t.buffer), Q4KH_OK);
		cr_assert(gt->ne[1] / 2 + shift >= 0 && gt->ne[1] / 2 + shift + ROWS <= gt->ne[1]);
		cr_assert_eq(e->b->buffer_upload(e->dev, w->t.buffer, 0,
		                                 (const uint8_t *)gt->data +
		                                         rb * (uint64_t)(gt->ne[1] / 2 + shift),
		                                 rb * ROWS),
		             Q4KH_OK);
	} else {
		fixture_rows(e, type, w);
	}
	w->t.ne[0] = w->k;
	w->t.nb[2] = w->t.nb[3] = w->t.nb[1] * ROWS;
	for (int i = 0; i < ROWS; i++)
		ids[i] = i;
	out = f32_tensor(e, w->k, ROWS, 0, NULL);
	cr_assert_eq(e->b->get_rows(e->dev, &w->t, ids, ROWS, 1.0f, &out), Q4KH_OK);
	v = fetch(e, &out);
	w->exact = malloc(sizeof(double) * (size_t)(ROWS * w->k));
	cr_assert_not_null(w->exact);
	for (int64_t i = 0; i < ROWS * w->k; i++)
		w->exact[i] = v[i];
	free(v);
	e->b->buffer_free(e->dev, out.buffer);
}

/* ROWS rows of the model's first {K, N} weight of TYPE, from the middle. */
static void weight_load(struct env *e, const struct q4kh_gguf *g, uint32_t type,
                        struct weight *w)
{
	weight_rows(e, g, type, 0, w);
}

static uint64_t rng = 88172645463325252ull;

static double uniform(void) /* [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* K x T activations; a few channels 40 times larger, as real ones have. */
static float *activations(int64_t k, int64_t t)
{
	float *x = malloc(sizeof(float) * (size_t)(k * t));

	cr_assert_not_null(x);
	for (int64_t i = 0; i < k * t; i++)
		x[i] = (float)(uniform() * ((i % k) % 97 == 5 ? 40.0 : 1.0));
	return x;
}

/* Check column c of got against float64 and the bound of the header. */
static void check_column(const struct weight *w, const char *isa, int64_t cols,
                         int64_t c, const float *x, const float *got)
{
	const int64_t block = 32;

	for (int64_t r = 0; r < ROWS; r++) {
		const double *wr = w->exact + r * w->k;
		double exact = 0, mag = 0, bound = 0;

		for (int64_t b = 0; b < w->k / block; b++) {
			double amax = 0, wabs = 0;

			for (int64_t i = b * block; i < (b + 1) * block; i++) {
				amax = fmax(amax, fabs(x[i]));
				wabs += fabs(wr[i]);
				exact += wr[i] * x[i];
				mag += fabs(wr[i] * x[i]);
			}
			bound += amax / 32639 / 2 * wabs;
		}
		bound += 1e-5 * mag;
		cr_assert(fabs(got[r] - exact) <= bound,
		          "%s %s, %lld columns: y[%lld, %lld] = %.9g, float64 %.9g, "
		          "error %.3g > bound %.3g",
		          w->name, isa, (long long)cols, (long long)r, (long long)c,
		          (double)got[r], exact, fabs(got[r] - exact), bound);
	}
}

/* y = w x through gemv (cols <= max) or gemm; every column checked. */
static float *product(struct env *e, const struct weight *w, q4kh_prepared *p,
                      const char *isa, int64_t cols, const float *x, int use_gemm)
{
	/* Padded columns: strides must be honoured. */
	struct q4kh_tensor xt = f32_tensor(e, w->k, cols, 64, x);
	struct q4kh_tensor yt = f32_tensor(e, ROWS, cols, 32, NULL);
	q4kh_status st = use_gemm ? e->v->gemm(e->kctx, &e->nd, p, &xt, &yt)
	                          : e->v->gemv(e->kctx, &e->nd, p, &xt, &yt);
	float *y;

	cr_assert_eq(st, Q4KH_OK, "%s %s: %s", w->name, isa, e->v->last_error(e->kctx));
	y = fetch(e, &yt);
	for (int64_t c = 0; c < cols; c++)
		check_column(w, isa, cols, c, x + c * w->k, y + c * ROWS);
	e->b->buffer_free(e->dev, xt.buffer);
	e->b->buffer_free(e->dev, yt.buffer);
	return y;
}

static const uint32_t simd_types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q6_K,
	                               Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q4_0, Q4KH_TYPE_Q4_1,
	                               Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q5_K };
#define N_SIMD_TYPES (int)(sizeof(simd_types) / sizeof(simd_types[0]))
static const char *const isas[] = { "avx2", "avx512-vnni" };

static void every_type_and_column_count(const char *backend)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct env *e;
	struct weight w[N_SIMD_TYPES];
	int ran = 0;

	cr_assert_eq(q4kh_gguf_open(test_model_path(), &g, &err), 0, "%s", err.msg);
	e = env_on(backend);
	for (int t = 0; t < N_SIMD_TYPES; t++)
		weight_load(e, g, simd_types[t], &w[t]);
	for (int i = 0; i < 2; i++) {
		if (!cpu_runs(isas[i]))
			continue;
		cr_assert_eq(env_variant(e, isas[i]), Q4KH_OK, "%s", e->v->last_error(NULL));
		for (int t = 0; t < N_SIMD_TYPES; t++) {
			float *x = activations(w[t].k, GEMM_COLS), *all, *one;
			q4kh_prepared *p;

			cr_assert_eq(e->v->prepare(e->kctx, &e->nd, &w[t].t, &p), Q4KH_OK, "%s",
			             e->v->last_error(e->kctx));
			for (int64_t cols = 1; cols <= e->v->max_gemv_columns; cols++)
				free(product(e, &w[t], p, isas[i], cols, x, 0));
			one = product(e, &w[t], p, isas[i], 1, x, 1);
			all = product(e, &w[t], p, isas[i], GEMM_COLS, x, 1);
			/* A column's result does not depend on the batch. */
			cr_expect_eq(memcmp(one, all, sizeof(float) * ROWS), 0,
			             "%s %s: column 0 differs between 1 and %d columns",
			             w[t].name, isas[i], GEMM_COLS);
			free(one);
			free(all);
			free(x);
			e->v->release(e->kctx, p);
		}
		ran++;
	}
	if (!ran)
		cr_skip_test("this CPU runs neither AVX2 nor AVX-512 VNNI");
	for (int t = 0; t < N_SIMD_TYPES; t++) {
		e->b->buffer_free(e->dev, w[t].t.buffer);
		free(w[t].exact);
	}
	env_close(e);
	q4kh_gguf_close(g);
}

Test(cpu_simd, every_type_and_column_count_within_the_int16_bound, .timeout = 300)
{
	every_type_and_column_count("cpu");
}

/* The same on the threads cpu-fast lends (ABI 1.3, struct
 * q4kh_native_device parallel). */
Test(cpu_simd, on_cpu_fast_threads_within_the_int16_bound, .timeout = 300)
{
	struct env *e;

	if (!cpu_runs("avx2"))
		cr_skip_test("cpu-fast has no device on a CPU without AVX2");
	e = env_on("cpu-fast");

	cr_assert_not_null(e->nd.parallel, "cpu-fast lends no threads");
	cr_assert_eq(e->nd.threads, 2);
	env_close(e);
	every_type_and_column_count("cpu-fast");
}

Test(cpu_simd, score_follows_the_cpu_and_the_types)
{
	struct env *e = env_open();
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };

	cr_assert_eq(e->b->device_info(e->ctx, 0, &rec), Q4KH_OK);
	for (int i = 0; i < 2; i++) {
		q4kh_status st = env_variant(e, isas[i]);

		if (!cpu_runs(isas[i])) {
			cr_expect_eq(st, Q4KH_ERR_UNSUPPORTED, "isa = %s", isas[i]);
			cr_expect(strstr(e->v->last_error(NULL), "does not support it") != NULL,
			          "%s", e->v->last_error(NULL));
			continue;
		}
		cr_assert_eq(st, Q4KH_OK, "%s", e->v->last_error(NULL));
		for (int t = 0; t < N_SIMD_TYPES; t++)
			cr_expect_eq(e->v->score(e->kctx, &rec, simd_types[t]), (uint32_t)(2 + i),
			             "%s %s", isas[i], q4kh_type_name(simd_types[t]));
		cr_expect_eq(e->v->score(e->kctx, &rec, Q4KH_TYPE_IQ4_NL), 0);
		cr_expect_eq(e->v->score(e->kctx, &rec, Q4KH_TYPE_F32), 0);
	}
	cr_expect_eq(env_variant(e, "sse9"), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->v->last_error(NULL),
	                 "[plugin.cpu-simd] isa = \"sse9\": expected auto, avx2 or avx512-vnni");
	env_close(e);
}

Test(cpu_simd, a_non_finite_activation_gives_nan_in_its_column_only)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct env *e;
	struct weight w;
	q4kh_prepared *p;
	struct q4kh_tensor xt, yt;
	float *x, *y;

	cr_assert_eq(q4kh_gguf_open(test_model_path(), &g, &err), 0, "%s", err.msg);
	e = env_open();
	if (env_variant(e, "auto") != Q4KH_OK || !e->v->score(e->kctx, NULL, Q4KH_TYPE_Q8_0))
		cr_skip_test("this CPU runs neither AVX2 nor AVX-512 VNNI");
	weight_load(e, g, Q4KH_TYPE_Q8_0, &w);
	x = activations(w.k, 2);
	x[w.k + 7] = INFINITY;
	xt = f32_tensor(e, w.k, 2, 0, x);
	yt = f32_tensor(e, ROWS, 2, 0, NULL);
	cr_assert_eq(e->v->prepare(e->kctx, &e->nd, &w.t, &p), Q4KH_OK);
	cr_assert_eq(e->v->gemv(e->kctx, &e->nd, p, &xt, &yt), Q4KH_OK);
	y = fetch(e, &yt);
	for (int r = 0; r < ROWS; r++) {
		cr_expect(isfinite(y[r]), "column 0 row %d: %g", r, (double)y[r]);
		cr_expect(isnan(y[ROWS + r]), "column 1 row %d: %g", r, (double)y[ROWS + r]);
	}
	e->v->release(e->kctx, p);
	e->b->buffer_free(e->dev, w.t.buffer);
	e->b->buffer_free(e->dev, xt.buffer);
	e->b->buffer_free(e->dev, yt.buffer);
	free(x);
	free(y);
	free(w.exact);
	env_close(e);
	q4kh_gguf_close(g);
}

Test(cpu_simd, bad_weights_and_shapes_fail_with_messages)
{
	struct env *e = env_open();
	struct q4kh_tensor w = { .type = Q4KH_TYPE_Q4_K, .ne = { 640, 4, 1, 1 },
		                 .nb = { 144, 360, 1440, 1440 } };
	q4kh_prepared *p = NULL;

	if (env_variant(e, "auto") != Q4KH_OK || !e->v->score(e->kctx, NULL, Q4KH_TYPE_Q8_0))
		cr_skip_test("this CPU runs neither AVX2 nor AVX-512 VNNI");
	cr_assert_eq(e->b->buffer_alloc(e->dev, 1440, &w.buffer), Q4KH_OK);
	cr_expect_eq(e->v->prepare(e->kctx, &e->nd, &w, &p), Q4KH_ERR_UNSUPPORTED);
	cr_expect_str_eq(e->v->last_error(e->kctx),
	                 "prepare: type 12 {640, 4, 1, 1}: expected a 2-D Q4_K, Q5_K or Q6_K "
	                 "weight with K a multiple of 256, or Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 "
	                 "with K a multiple of 32");
	w.type = Q4KH_TYPE_Q8_0;
	w.nb[0] = 32;
	cr_expect_eq(e->v->prepare(e->kctx, &e->nd, &w, &p), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->v->last_error(e->kctx),
	                 "prepare: strides nb[0] 32, nb[1] 360: expected whole blocks "
	                 "of 34 bytes and rows of at least 680");
	e->b->buffer_free(e->dev, w.buffer);
	env_close(e);
}

/*
 * gemv_glu(kind, gate, up) at T = 1 .. max_gemv_columns on E's backend:
 * the backend's glu of two gemv() (into a tensor apart), bit for bit,
 * where it runs (EXPECT Q4KH_OK), else Q4KH_ERR_UNSUPPORTED with y
 * untouched.
 */
static void glu_against(struct env *e, q4kh_prepared *gate, q4kh_prepared *up, int64_t k,
                        q4kh_status expect)
{
	for (int64_t t = 1; t <= e->v->max_gemv_columns; t++)
		for (int kind = 0; kind < 2; kind++) {
			float *x = activations(k, t), *want, *got;
			struct q4kh_tensor xt = f32_tensor(e, k, t, 64, x);
			struct q4kh_tensor g = f32_tensor(e, ROWS, t, 32, NULL);
			struct q4kh_tensor u = f32_tensor(e, ROWS, t, 32, NULL);
			struct q4kh_tensor out = f32_tensor(e, ROWS, t, 32, NULL);
			struct q4kh_tensor y = f32_tensor(e, ROWS, t, 32, NULL);

			cr_assert_eq(e->v->gemv(e->kctx, &e->nd, gate, &xt, &g), Q4KH_OK);
			cr_assert_eq(e->v->gemv(e->kctx, &e->nd, up, &xt, &u), Q4KH_OK);
			cr_assert_eq(e->b->glu(e->dev, (q4kh_glu_kind)kind, &g, &u, &out), Q4KH_OK);
			/* y starts as a copy of g: a refusal must leave it so */
			cr_assert_eq(e->b->copy(e->dev, &g, &y), Q4KH_OK);
			cr_assert_eq(e->v->gemv_glu(e->kctx, &e->nd, (q4kh_glu_kind)kind, gate, up,
			                            &xt, &y),
			             expect, "kind %d, T %lld: %s", kind, (long long)t,
			             e->v->last_error(e->kctx));
			want = fetch(e, expect == Q4KH_OK ? &out : &g);
			got = fetch(e, &y);
			cr_assert_eq(memcmp(got, want, sizeof(float) * (size_t)(ROWS * t)), 0,
			             "kind %d, T %lld: gemv_glu %s", kind, (long long)t,
			             expect == Q4KH_OK ? "differs from gemv, gemv and glu"
			                               : "refused, yet wrote y");
			free(want);
			free(got);
			free(x);
			e->b->buffer_free(e->dev, xt.buffer);
			e->b->buffer_free(e->dev, g.buffer);
			e->b->buffer_free(e->dev, u.buffer);
			e->b->buffer_free(e->dev, out.buffer);
			e->b->buffer_free(e->dev, y.buffer);
		}
}

/*
 * gemv_glu (ABI 1.4), gate and up two row ranges of the model's first
 * Q4_K weight: on the reference cpu, bit for bit what gemv, gemv and its
 * glu give, SwiGLU and GeGLU; on cpu-fast, whose glu has arithmetic of its
 * own, refused with nothing written.
 */
Test(cpu_simd, gemv_glu_is_gemv_gemv_and_the_reference_glu_bit_for_bit, .timeout = 300)
{
	static const char *const backends[] = { "cpu", "cpu-fast" };
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;

	if (!cpu_runs("avx2"))
		cr_skip_test("cpu-simd and cpu-fast need AVX2");
	cr_assert_eq(q4kh_gguf_open(test_model_path(), &g, &err), 0, "%s", err.msg);
	for (int b = 0; b < 2; b++) {
		struct env *e = env_on(backends[b]);
		struct weight gate, up;
		q4kh_prepared *pg, *pu;

		cr_assert_eq(env_variant(e, "auto"), Q4KH_OK, "%s", e->v->last_error(NULL));
		weight_rows(e, g, Q4KH_TYPE_Q4_K, 0, &gate);
		weight_rows(e, g, Q4KH_TYPE_Q4_K, -ROWS, &up);
		cr_assert_eq(e->v->prepare(e->kctx, &e->nd, &gate.t, &pg), Q4KH_OK);
		cr_assert_eq(e->v->prepare(e->kctx, &e->nd, &up.t, &pu), Q4KH_OK);
		glu_against(e, pg, pu, gate.k, b == 0 ? Q4KH_OK : Q4KH_ERR_UNSUPPORTED);
		e->v->release(e->kctx, pg);
		e->v->release(e->kctx, pu);
		e->b->buffer_free(e->dev, gate.t.buffer);
		e->b->buffer_free(e->dev, up.t.buffer);
		free(gate.exact);
		free(up.exact);
		env_close(e);
	}
	q4kh_gguf_close(g);
}

Test(cpu_simd, exports_exactly_the_entry_symbol)
{
	char so[4096], first[256];
	int n;

	snprintf(so, sizeof(so), "%s/plugins/cpu-simd/.libs/cpu-simd.so", test_builddir());
	n = test_exported_symbols(so, first, sizeof(first));
	cr_assert_eq(n, 1, "cpu-simd.so exports %d symbols", n);
	cr_assert_str_eq(first, "q4kh_plugin_entry_v1");
}
