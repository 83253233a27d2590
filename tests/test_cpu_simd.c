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
 *
 * The Q4_K and Q6_K weights repacked for the AVX-512 VNNI and AMX gemms
 * (struct simd_pack_q4_k, simd_pack_q6_k): packed here with the plugin's
 * own simd_pack.c and read back by the layout as simd.h documents it, on
 * any CPU; their product emulated in scalar C with the kernel's integer
 * steps; both kernels' own code on any CPU (their intrinsics emulated),
 * the AMX one bit for bit the VNNI one; and the kernels themselves through
 * the plugin where the CPU runs them, at the layout's edges, on odd thread
 * counts, AMX bit for bit VNNI. Where AMX is not usable, its tests on the
 * hardware skip with the plugin's reason.
 *
 * cpu-simd8, the same sources with int8 activations (d_b = max |x| / 127,
 * SIMD_QMAX8): every product against float64 sums of the same weights
 * times the activations quantised to int8 here, sum_b d_b sum_i w_ri q_i,
 * within 1e-5 sum_i |w_ri x_i| (its integer sums are exact: only the
 * float scaling and summation may differ); its packed products' code
 * emulated at the tiles' edges, AMX bit for bit VNNI; through the plugin
 * at the same edges and thread counts; AVX2 refused, and its score above
 * cpu-simd's.
 */
#include "buildconf.h"

#include <cpuid.h>
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the plugin can run AMX at all: a build with its gemm, on an OS
 * that grants the tile data as Linux does. */
#if defined(HAVE_SIMD_AMX) && HAVE_DECL_ARCH_REQ_XCOMP_PERM && HAVE_DECL_SYS_ARCH_PRCTL
#define AMX_BUILT 1
#include <asm/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "blocks_fixture.h"
#include "gguf.h"
#include "helpers.h"
#include "q4khost/plugin.h"
#include "../plugins/cpu-simd/simd.h"

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
	int qmax;            /* the variant's: SIMD_QMAX, or SIMD_QMAX8 (cpu-simd8) */
	const char *isa;     /* the [plugin.cpu-simd] isa setting */
	const char *threads; /* and its threads; NULL: "2" */
	const char *repack;  /* and its repack setting; NULL: unset */
};

static const char *config(void *host_data, const char *key)
{
	const struct env *e = host_data;

	if (!strcmp(key, "isa"))
		return e->isa;
	if (!strcmp(key, "repack"))
		return e->repack;
	return !strcmp(key, "threads") ? (e->threads ? e->threads : "2") : NULL;
}

/* BACKEND ("cpu", "cpu-fast") and the table of VARIANT ("cpu-simd",
 * "cpu-simd8"); the variant's context is opened by env_variant(). */
static struct env *env_of(const char *backend, const char *variant)
{
	struct env *e = calloc(1, sizeof(*e));
	const struct q4kh_plugin_desc *cpu, *simd;
	char rel[128];

	cr_assert_not_null(e);
	snprintf(rel, sizeof(rel), "plugins/%s/.libs/%s.so", backend, backend);
	cpu = test_plugin_load(rel, &e->cpu_dl);
	snprintf(rel, sizeof(rel), "plugins/%s/.libs/%s.so", variant, variant);
	simd = test_plugin_load(rel, &e->simd_dl);
	cr_assert_str_eq(simd->name, variant);
	cr_assert_eq(simd->kind, Q4KH_KIND_KERNEL);
	e->qmax = strcmp(variant, "cpu-simd8") ? SIMD_QMAX : SIMD_QMAX8;
	cr_assert_eq(simd->kernel->arith,
	             e->qmax == SIMD_QMAX8 ? Q4KH_ARITH_INT8 : Q4KH_ARITH_INT16);
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

static struct env *env_on(const char *backend)
{
	return env_of(backend, "cpu-simd");
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

/* Does the CPU report AMX-TILE and AMX-INT8 (CPUID.(7,0):EDX bits 24,
 * 25)? Read here, not through the SDK. */
static int cpuid_has_amx(void)
{
	unsigned a, b, c, d;

	return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 3) == 3;
}

/*
 * Does this CPU run ISA? Asked of libgcc (CPUID and XCR0), not of the
 * plugin; for amx also of Linux (the tile data, which the test asks for
 * itself) and of this build (AMX_BUILT).
 */
static int cpu_runs(const char *isa)
{
	__builtin_cpu_init();
	if (!strcmp(isa, "avx2"))
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	if (!strcmp(isa, "amx")) {
#ifdef AMX_BUILT
		return cpu_runs("avx512-vnni") && cpuid_has_amx() &&
		       syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, 18 /* XTILEDATA */) == 0;
#else
		return 0;
#endif
	}
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
 * moved SHIFT rows on (weight_rows(); without a model G, the blocks
 * fixture's Q4_K or Q6_K rows made each its own).
 */
struct weight {
	const char *name;
	int64_t k;
	struct q4kh_tensor t; /* in a cpu buffer */
	double *exact;        /* ROWS x k, dequantised by the cpu plugin */
};

/*
 * Row I of a Q4_K, Q6_K or Q5_0 copy made its own: in every block, the
 * codes (Q4_K qs, Q6_K ql, Q5_0 qs) and the scales (Q5_0: the fifth bits,
 * qh) rotated by I bytes. Any bytes there are valid blocks, and d stays:
 * the reference dequantises the result exactly as it does the file's.
 */
static void vary_row(uint32_t type, uint8_t *row, size_t row_bytes, int i)
{
	const int q4 = type == Q4KH_TYPE_Q4_K, q5 = type == Q4KH_TYPE_Q5_0;
	const size_t bb = q4kh_type_block_bytes(type);
	/* Offsets and lengths of the codes and the scales in a block. */
	const size_t codes = q4 ? offsetof(struct q4kh_block_q4_k, qs)
	                     : q5 ? offsetof(struct q4kh_block_q5_0, qs) : 0;
	const size_t scales = q4 ? offsetof(struct q4kh_block_q4_k, scales)
	                      : q5 ? offsetof(struct q4kh_block_q5_0, qh)
	                           : offsetof(struct q4kh_block_q6_k, scales);
	const size_t sizes[2] = { q5 ? Q4KH_QK / 2 : Q4KH_QK_K / 2,
		                  q4 ? 12 : q5 ? 4 : Q4KH_QK_K / 16 };

	for (uint8_t *b = row; b < row + row_bytes; b += bb)
		for (int f = 0; f < 2; f++) {
			uint8_t tmp[Q4KH_QK_K / 2], *at = b + (f ? scales : codes);

			for (size_t j = 0; j < sizes[f]; j++)
				tmp[j] = at[(j + (size_t)i) % sizes[f]];
			memcpy(at, tmp, sizes[f]);
		}
}

/* ROWS rows of TYPE from the blocks fixture into W: its rows repeated, or
 * with VARY (Q4_K, Q6_K, Q5_0) each made its own by vary_row(); each row
 * REPEAT fixture rows long, the copies (with VARY) made different too. */
static void fixture_rows(struct env *e, uint32_t type, int vary, int repeat, struct weight *w)
{
	struct blocks_fixture bf;
	const struct blocks_tensor *bt;
	uint8_t *rows;
	size_t rb;

	blocks_fixture_load(&bf);
	bt = blocks_fixture_find(&bf, type);
	cr_assert_not_null(bt, "neither the default model nor the blocks fixture has %s",
	                   q4kh_type_name(type));
	rb = bt->row_bytes * (size_t)repeat;
	w->k = bt->ne0 * repeat;
	w->t.nb[1] = (int64_t)rb;
	rows = malloc(rb * ROWS);
	cr_assert_not_null(rows);
	for (int i = 0; i < ROWS; i++)
		for (int j = 0; j < repeat; j++) {
			uint8_t *at = rows + rb * (size_t)i + bt->row_bytes * (size_t)j;

			memcpy(at, bt->bytes + bt->row_bytes * (size_t)(i % bt->rows), bt->row_bytes);
			if (vary)
				vary_row(type, at, bt->row_bytes, i + 7 * j);
		}
	cr_assert_eq(e->b->buffer_alloc(e->dev, rb * ROWS, &w->t.buffer), Q4KH_OK);
	cr_assert_eq(e->b->buffer_upload(e->dev, w->t.buffer, 0, rows, rb * ROWS), Q4KH_OK);
	free(rows);
	blocks_fixture_free(&bf);
}

/* ROWS rows of TYPE into W: the model G's first {K, N} weight of the type
 * from the middle moved SHIFT rows on; without G, fixture_rows(), each row
 * REPEAT fixture rows long; exact from the cpu plugin's get_rows. */
static void weight_rows_of(struct env *e, const struct q4kh_gguf *g, uint32_t type,
                           int64_t shift, int repeat, struct weight *w)
{
	const struct q4kh_gguf_tensor *gt = NULL;
	struct q4kh_tensor out;
	int32_t ids[ROWS];
	uint64_t rb;
	float *v;

	for (uint64_t i = 0; g && i < g->n_tensors && !gt; i++)
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
		fixture_rows(e, type, !g, repeat, w);
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

static void weight_rows(struct env *e, const struct q4kh_gguf *g, uint32_t type,
                        int64_t shift, struct weight *w)
{
	weight_rows_of(e, g, type, shift, 1, w);
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

/*
 * The 32 values at X quantised to int8 as struct simd_act says:
 * d = max |x| / 127 and q = x * (127 / max |x|) rounded to nearest even,
 * in float; the values q d into XQ.
 */
static void int8_block(const float *x, double *xq)
{
	float amax = 0, scale;

	for (int i = 0; i < 32; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	scale = amax > 0 ? 127.0f / amax : 0;
	for (int i = 0; i < 32; i++)
		xq[i] = (double)rintf(x[i] * scale) * (double)(amax / 127.0f);
}

/*
 * Check rows [0, N) of column c of got against float64: weight row r's K
 * values at EXACT + r * LD. QMAX SIMD_QMAX (cpu-simd): against x, within
 * the bound of the header; SIMD_QMAX8 (cpu-simd8): against x quantised to
 * int8 here (int8_block()), within 1e-5 sum |w x|.
 */
static void check_rows(const char *name, const double *exact_w, int64_t ld, int64_t k,
                       int64_t n, const char *isa, int64_t cols, int64_t c, const float *x,
                       const float *got, int qmax)
{
	const int64_t block = 32;

	for (int64_t r = 0; r < n; r++) {
		const double *wr = exact_w + r * ld;
		double exact = 0, mag = 0, bound = 0;

		for (int64_t b = 0; b < k / block; b++) {
			double amax = 0, wabs = 0, xq[32];

			if (qmax == SIMD_QMAX8)
				int8_block(x + b * block, xq);
			for (int64_t i = b * block; i < (b + 1) * block; i++) {
				amax = fmax(amax, fabs(x[i]));
				wabs += fabs(wr[i]);
				exact += wr[i] * (qmax == SIMD_QMAX8 ? xq[i - b * block] : x[i]);
				mag += fabs(wr[i] * x[i]);
			}
			if (qmax != SIMD_QMAX8)
				bound += amax / 32639 / 2 * wabs;
		}
		bound += 1e-5 * mag;
		cr_assert(fabs(got[r] - exact) <= bound,
		          "%s %s, K %lld, %lld columns: y[%lld, %lld] = %.9g, float64 %.9g, "
		          "error %.3g > bound %.3g",
		          name, isa, (long long)k, (long long)cols, (long long)r, (long long)c,
		          (double)got[r], exact, fabs(got[r] - exact), bound);
	}
}

/* Check column c of got: every one of w's ROWS rows, as QMAX's variant
 * rounds. */
static void check_column(const struct weight *w, const char *isa, int64_t cols,
                         int64_t c, const float *x, const float *got, int qmax)
{
	check_rows(w->name, w->exact, w->k, w->k, ROWS, isa, cols, c, x, got, qmax);
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
		check_column(w, isa, cols, c, x + c * w->k, y + c * ROWS, e->qmax);
	e->b->buffer_free(e->dev, xt.buffer);
	e->b->buffer_free(e->dev, yt.buffer);
	return y;
}

static const uint32_t simd_types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q6_K,
	                               Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q4_0, Q4KH_TYPE_Q4_1,
	                               Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q5_K };
#define N_SIMD_TYPES (int)(sizeof(simd_types) / sizeof(simd_types[0]))
static const char *const isas[] = { "avx2", "avx512-vnni", "amx" };
#define N_ISAS (int)(sizeof(isas) / sizeof(isas[0]))

/* VARIANT's products of every type with each set this CPU runs, every
 * column count, on BACKEND: within the bound of VARIANT's rounding. */
static void every_type_and_column_count(const char *backend, const char *variant)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct env *e;
	struct weight w[N_SIMD_TYPES];
	int ran = 0;

	cr_assert_eq(q4kh_gguf_open(test_model_path(), &g, &err), 0, "%s", err.msg);
	e = env_of(backend, variant);
	for (int t = 0; t < N_SIMD_TYPES; t++)
		weight_load(e, g, simd_types[t], &w[t]);
	for (int i = 0; i < N_ISAS; i++) {
		/* cpu-simd8 refuses AVX2 (its score test checks why). */
		if (!cpu_runs(isas[i]) || (e->qmax == SIMD_QMAX8 && !strcmp(isas[i], "avx2")))
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
		cr_skip_test("this CPU runs none of %s's instruction sets", variant);
	for (int t = 0; t < N_SIMD_TYPES; t++) {
		e->b->buffer_free(e->dev, w[t].t.buffer);
		free(w[t].exact);
	}
	env_close(e);
	q4kh_gguf_close(g);
}

Test(cpu_simd, every_type_and_column_count_within_the_int16_bound, .timeout = 300)
{
	every_type_and_column_count("cpu", "cpu-simd");
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
	every_type_and_column_count("cpu-fast", "cpu-simd");
}

Test(cpu_simd8, every_type_and_column_count_against_the_int8_activations, .timeout = 300)
{
	every_type_and_column_count("cpu", "cpu-simd8");
}

Test(cpu_simd8, on_cpu_fast_threads_against_the_int8_activations, .timeout = 300)
{
	if (!cpu_runs("avx2"))
		cr_skip_test("cpu-fast has no device on a CPU without AVX2");
	every_type_and_column_count("cpu-fast", "cpu-simd8");
}

Test(cpu_simd, score_follows_the_cpu_and_the_types)
{
	struct env *e = env_open();
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };

	cr_assert_eq(e->b->device_info(e->ctx, 0, &rec), Q4KH_OK);
	for (int i = 0; i < N_ISAS; i++) {
		q4kh_status st = env_variant(e, isas[i]);
		char want[256];

		if (!cpu_runs(isas[i])) {
			cr_expect_eq(st, Q4KH_ERR_UNSUPPORTED, "isa = %s", isas[i]);
			snprintf(want, sizeof(want), "[plugin.cpu-simd] isa = %s: ", isas[i]);
			cr_expect(strncmp(e->v->last_error(NULL), want, strlen(want)) == 0 &&
			          strlen(e->v->last_error(NULL)) > strlen(want) + 20,
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
	                 "[plugin.cpu-simd] isa = \"sse9\": expected auto, avx2, avx512-vnni or amx");
	e->repack = "maybe";
	cr_expect_eq(env_variant(e, "auto"), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->v->last_error(NULL),
	                 "[plugin.cpu-simd] repack = \"maybe\": expected 1, on, true, yes or 0, "
	                 "off, false, no (any case)");
	env_close(e);
}

/*
 * cpu-simd8 scores each set above cpu-simd's (a device without a kernel
 * setting tries it first), and refuses AVX2 and repack = off, naming why
 * (it would round to int8 for nothing there); on auto it then has no
 * kernels and scores 0.
 */
Test(cpu_simd8, scores_above_cpu_simd_and_refuses_avx2_and_repack_off)
{
	struct env *e = env_of("cpu", "cpu-simd8");
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };

	cr_assert_eq(e->b->device_info(e->ctx, 0, &rec), Q4KH_OK);
	cr_expect_eq(env_variant(e, "avx2"), Q4KH_ERR_UNSUPPORTED);
	if (cpu_runs("avx2"))
		cr_expect_str_eq(e->v->last_error(NULL),
		                 "[plugin.cpu-simd8] isa = avx2: the int8 products are AVX-512 "
		                 "VNNI's and AMX's (cpu-simd serves AVX2 in int16)");
	for (int i = 1; i < N_ISAS; i++) {
		if (!cpu_runs(isas[i]))
			continue;
		cr_assert_eq(env_variant(e, isas[i]), Q4KH_OK, "%s", e->v->last_error(NULL));
		for (int t = 0; t < N_SIMD_TYPES; t++)
			cr_expect_eq(e->v->score(e->kctx, &rec, simd_types[t]), (uint32_t)(2 + i + 4),
			             "%s %s", isas[i], q4kh_type_name(simd_types[t]));
	}
	e->repack = "off";
	if (cpu_runs("avx512-vnni")) {
		cr_expect_eq(env_variant(e, "avx512-vnni"), Q4KH_ERR_UNSUPPORTED);
		cr_expect_str_eq(e->v->last_error(NULL),
		                 "[plugin.cpu-simd8] isa = avx512-vnni: repack = off, and the int8 "
		                 "products run on repacked weights only");
	}
	cr_assert_eq(env_variant(e, "auto"), Q4KH_OK, "%s", e->v->last_error(NULL));
	cr_expect_eq(e->v->score(e->kctx, &rec, Q4KH_TYPE_Q4_K), 0);
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
	static const char *const names[] = { "cpu-simd", "cpu-simd8" };

	for (int i = 0; i < 2; i++) {
		char so[4096], first[256];
		int n;

		snprintf(so, sizeof(so), "%s/plugins/%s/.libs/%s.so", test_builddir(), names[i],
		         names[i]);
		n = test_exported_symbols(so, first, sizeof(first));
		cr_assert_eq(n, 1, "%s.so exports %d symbols", names[i], n);
		cr_assert_str_eq(first, "q4kh_plugin_entry_v1", "%s.so", names[i]);
	}
}

/* ---- The packed layout of the AVX-512 VNNI gemm (simd.h) ---- */

/* Rows of a packed test weight: two whole tiles and 5 rows of a third. */
#define PACK_N 37

/* Code I (< 256) of row R's super-block from the octets QS, 4 bits. */
static int octet_code(const uint8_t qs[][SIMD_PACK_ROWS][4], int r, int i)
{
	const uint8_t byte = qs[i / 8][r][i % 4];

	return i % 8 < 4 ? byte & 0x0F : byte >> 4;
}

/* The packed block (super-block of Q4_K and Q6_K) of row R (of N) that
 * holds value V. */
static const void *packed_block(int type, const void *packed, int64_t k, int64_t r, int64_t v)
{
	const int64_t bv = simd_pack_block_values(type);
	const size_t bytes = simd_pack_bytes(type, SIMD_PACK_ROWS, bv);

	return (const uint8_t *)packed + bytes * (size_t)(r / SIMD_PACK_ROWS * (k / bv) + v / bv);
}

/* Row R's code of value V (Q6_K: with bits 4 and 5, before the - 32; Q5_0
 * with bit 4, before the - 16). */
static int packed_code(int type, const void *packed, int64_t k, int64_t r, int64_t v)
{
	const int lane = (int)(r % SIMD_PACK_ROWS);
	const int i = (int)(v % simd_pack_block_values(type));

	if (type == SIMD_Q4_K) {
		const struct simd_pack_q4_k *b = packed_block(type, packed, k, r, v);

		return octet_code(b->qs, lane, i);
	} else if (type == SIMD_Q5_0) {
		const struct simd_pack_q5_0 *b = packed_block(type, packed, k, r, v);

		return octet_code(b->qs, lane, i) | (b->qh[lane][i % 4] >> (i / 4) & 1) << 4;
	} else {
		const struct simd_pack_q6_k *b = packed_block(type, packed, k, r, v);
		const int h = b->qh[i / 16][lane][i % 4] >> (2 * (i % 16 / 4)) & 3;

		return octet_code(b->ql, lane, i) | h << 4;
	}
}

/* Row R's value V as the layout gives it, by ggml's formulas (quant.h);
 * *mag: the size of its terms, for the tolerance. */
static double packed_value(int type, const void *packed, int64_t k, int64_t r, int64_t v,
                           double *mag)
{
	const int lane = (int)(r % SIMD_PACK_ROWS), i = (int)(v % Q4KH_QK_K);
	const int q = packed_code(type, packed, k, r, v);

	if (type == SIMD_Q4_K) {
		const struct simd_pack_q4_k *b = packed_block(type, packed, k, r, v);
		const double d1 = (double)b->d[lane] * b->sc[i / 32][lane];
		const double m1 = (double)b->dmin[lane] * b->m[i / 32][lane];

		*mag = fabs(d1 * q) + fabs(m1);
		return d1 * q - m1;
	} else if (type == SIMD_Q5_0) {
		const struct simd_pack_q5_0 *b = packed_block(type, packed, k, r, v);

		*mag = fabs((double)b->d[lane] * (q - 16));
		return (double)b->d[lane] * (q - 16);
	} else {
		const struct simd_pack_q6_k *b = packed_block(type, packed, k, r, v);
		const double d1 = (double)b->d[lane] * b->sc[i / 16][lane];

		*mag = fabs(d1 * (q - 32));
		return d1 * (q - 32);
	}
}

/* W's first N rows (of its first K values each) repacked, the first tile
 * apart from the others as by two threads. */
static void *pack_weight(const struct weight *w, int type, int64_t k, int64_t n, struct env *e)
{
	const size_t bytes = simd_pack_bytes(type, n, k);
	void *packed = aligned_alloc(64, bytes);
	const uint8_t *rows;

	cr_assert_not_null(packed);
	memset(packed, 0xA5, bytes); /* padding must be written, not left */
	rows = (const uint8_t *)e->nd.address(w->t.buffer) + w->t.offset;
	simd_pack_tiles(type, rows, w->t.nb[1], n, k, 0, 1, packed);
	simd_pack_tiles(type, rows, w->t.nb[1], n, k, 1, (n + 15) / 16, packed);
	return packed;
}

/* The types with a packed layout, as GGUF and enum simd_wtype give them,
 * and the bytes of 16 rows' block (simd.h). */
static const uint32_t packed_gguf[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_Q5_0 };
static const int packed_wtype[] = { SIMD_Q4_K, SIMD_Q6_K, SIMD_Q5_0 };
static const size_t packed_block_bytes[] = { 2432, 3392, 384 };
#define N_PACKED (int)(sizeof(packed_wtype) / sizeof(packed_wtype[0]))

/*
 * The K after K that the edge tests try for type T, up to the row's WK (0
 * past it): each super-block for Q4_K and Q6_K; for Q5_0 one, two and
 * three blocks, then six blocks more at a time, and WK.
 */
static int64_t packed_k_next(int t, int64_t k, int64_t wk)
{
	const int64_t next = packed_wtype[t] != SIMD_Q5_0 ? k + Q4KH_QK_K : k < 96 ? k + 32 : k + 192;

	return k >= wk ? 0 : next < wk ? next : wk;
}

static void weight_free(struct env *e, struct weight *w)
{
	e->b->buffer_free(e->dev, w->t.buffer);
	free(w->exact);
}

Test(cpu_simd_pack, repacked_rows_read_back_as_the_reference_dequantises, .timeout = 120)
{
	struct env *e = env_open();
	for (int t = 0; t < N_PACKED; t++) {
		struct weight w;
		void *packed;
		const int64_t bv = simd_pack_block_values(packed_wtype[t]);

		weight_rows(e, NULL, packed_gguf[t], 0, &w);
		cr_assert_eq(w.k % bv, 0);
		cr_assert_eq(simd_pack_bytes(packed_wtype[t], PACK_N, w.k),
		             3 * (size_t)(w.k / bv) * packed_block_bytes[t]);
		packed = pack_weight(&w, packed_wtype[t], w.k, PACK_N, e);
		for (int64_t r = 0; r < 3 * SIMD_PACK_ROWS; r++)
			for (int64_t v = 0; v < w.k; v++) {
				double mag, got = packed_value(packed_wtype[t], packed, w.k, r, v, &mag);
				const double want = r < PACK_N ? w.exact[r * w.k + v] : 0;

				cr_assert(fabs(got - want) <= 1e-6 * mag,
				          "%s row %lld value %lld: packed %.9g, reference %.9g",
				          w.name, (long long)r, (long long)v, got, want);
				if (r >= PACK_N)
					cr_assert_eq(packed_code(packed_wtype[t], packed, w.k, r, v), 0,
					             "%s padding row %lld", w.name, (long long)r);
			}
		free(packed);
		weight_free(e, &w);
	}
	env_close(e);
}

/*
 * Column X (K values) quantised as struct simd_act says (d = max |x| /
 * QMAX, SIMD_QMAX or SIMD_QMAX8, q rounded to nearest even) and split: q =
 * 256 hi + lo, with the sums of q per 32 (sum) and per 16 (s16) and ds =
 * d sum.
 */
struct split_col {
	int8_t *hi, *lo;
	float *d, *ds, *s16;
	int32_t *sum;
	struct simd_act act; /* the same, as the kernels take it */
};

/* Column X into COL, its bytes into HI and LO (K each). */
static void split_col(const float *x, int64_t k, int qmax, int8_t *hi, int8_t *lo,
                      struct split_col *col)
{
	col->hi = hi;
	col->lo = lo;
	col->d = malloc(sizeof(float) * (size_t)(k / 32));
	col->ds = malloc(sizeof(float) * (size_t)(k / 32));
	col->s16 = calloc((size_t)(k / 16), sizeof(float));
	col->sum = malloc(sizeof(int32_t) * (size_t)(k / 32));
	cr_assert(col->d && col->ds && col->s16 && col->sum);
	for (int64_t b = 0; b < k / 32; b++) {
		float amax = 0;

		for (int i = 0; i < 32; i++)
			amax = fmaxf(amax, fabsf(x[32 * b + i]));
		col->d[b] = amax / (float)qmax;
		col->sum[b] = 0;
		for (int i = 0; i < 32; i++) {
			const int q = (int)rintf(x[32 * b + i] * (amax > 0 ? (float)qmax / amax : 0));

			col->hi[32 * b + i] = (int8_t)((q + 128) >> 8);
			col->lo[32 * b + i] = (int8_t)(q - 256 * ((q + 128) >> 8));
			col->sum[b] += q;
			col->s16[2 * b + i / 16] += (float)q;
		}
		col->ds[b] = col->d[b] * (float)col->sum[b];
	}
	col->act = (struct simd_act){ NULL, col->d, col->ds, col->hi, col->lo, col->s16 };
}

/*
 * N columns X (K values each, one after another) split, their bytes K
 * apart as the packed products take them (simd_packed_fn, simd.h).
 */
struct split_cols {
	int n;
	int8_t *hi, *lo;      /* column c at + c K */
	struct split_col *col;
	struct simd_act *act; /* col[c].act */
};

static void split_cols(const float *x, int64_t k, int n, int qmax, struct split_cols *s)
{
	s->n = n;
	s->hi = malloc((size_t)(n * k));
	s->lo = malloc((size_t)(n * k));
	s->col = malloc(sizeof(*s->col) * (size_t)n);
	s->act = malloc(sizeof(*s->act) * (size_t)n);
	cr_assert(s->hi && s->lo && s->col && s->act);
	for (int c = 0; c < n; c++) {
		split_col(x + c * k, k, qmax, s->hi + c * k, s->lo + c * k, &s->col[c]);
		s->act[c] = s->col[c].act;
	}
}

static void split_cols_free(struct split_cols *s)
{
	for (int c = 0; c < s->n; c++) {
		free(s->col[c].d);
		free(s->col[c].ds);
		free(s->col[c].s16);
		free(s->col[c].sum);
	}
	free(s->hi);
	free(s->lo);
	free(s->col);
	free(s->act);
}

/*
 * The packed product of row R with one column, in the kernel's steps: per
 * scale group an int32 sum of codes times the column's high bytes, shifted
 * by 8, plus the sum against its low bytes; then scaled, and the Q4_K mins,
 * the Q6_K - 32 or the Q5_0 - 16 taken off through the column's sums.
 */
static double emulated_dot(int type, const void *packed, int64_t k, int64_t r,
                           const struct split_col *col)
{
	const int8_t *hi = col->hi, *lo = col->lo;
	const float *d = col->d;
	const int32_t *sum = col->sum;
	const int lane = (int)(r % SIMD_PACK_ROWS), group = type == SIMD_Q6_K ? 16 : 32;
	double y = 0;

	for (int64_t v0 = 0; v0 < k; v0 += group) {
		const int i = (int)(v0 % Q4KH_QK_K);
		int32_t ph = 0, pl = 0, qsum = 0;

		for (int64_t v = v0; v < v0 + group; v++) {
			const int c = packed_code(type, packed, k, r, v);

			ph += c * hi[v];
			pl += c * lo[v];
			qsum += 256 * hi[v] + lo[v];
		}
		if (type == SIMD_Q4_K) {
			const struct simd_pack_q4_k *b = packed_block(type, packed, k, r, v0);

			y += (double)(ph * 256 + pl) * b->d[lane] * b->sc[i / 32][lane] * d[v0 / 32] -
			     (double)b->dmin[lane] * b->m[i / 32][lane] * d[v0 / 32] * sum[v0 / 32];
		} else if (type == SIMD_Q5_0) {
			const struct simd_pack_q5_0 *b = packed_block(type, packed, k, r, v0);

			y += ((double)(ph * 256 + pl) - 16.0 * qsum) * b->d[lane] * d[v0 / 32];
		} else {
			const struct simd_pack_q6_k *b = packed_block(type, packed, k, r, v0);

			y += ((double)(ph * 256 + pl) - 32.0 * qsum) * b->d[lane] *
			     b->sc[i / 16][lane] * d[v0 / 32];
		}
	}
	return y;
}

Test(cpu_simd_pack, the_packed_products_steps_hold_the_int16_bound, .timeout = 120)
{
	struct env *e = env_open();
	for (int t = 0; t < N_PACKED; t++) {
		struct weight w;
		float *x, y[PACK_N];
		void *packed;
		struct split_cols cols;

		weight_rows(e, NULL, packed_gguf[t], 0, &w);
		packed = pack_weight(&w, packed_wtype[t], w.k, PACK_N, e);
		x = activations(w.k, 3);
		split_cols(x, w.k, 3, SIMD_QMAX, &cols);
		for (int c = 0; c < 3; c++) {
			for (int64_t r = 0; r < PACK_N; r++)
				y[r] = (float)emulated_dot(packed_wtype[t], packed, w.k, r, &cols.col[c]);
			check_rows(w.name, w.exact, w.k, w.k, PACK_N, "scalar", 3, c, x + c * w.k, y,
			           SIMD_QMAX);
		}
		split_cols_free(&cols);
		free(x);
		free(packed);
		weight_free(e, &w);
	}
	env_close(e);
}

/* Columns of y the kernels write N rows of, PAD floats apart beyond them. */
#define PAD 16
/* The packed products' edges: rows (part of a tile, one, one and a row,
 * two and part of a third); the most columns (two passes of 16 and one
 * column, four of 8 and one). */
static const int64_t edge_rows[] = { 5, 16, 17, PACK_N };
#define N_EDGE_ROWS (int)(sizeof(edge_rows) / sizeof(edge_rows[0]))
#define EDGE_COLS 33
/* Fixture rows (512 values) a wide test row is long: K = 24576, so that 2
 * tiles of Q4_K (3 of Q6_K: 48 x 3392 bytes a tile) fill the products'
 * cache block (PACK_L2_BYTES, 256 KiB) and 37 rows cross one. */
#define WIDE_REPEAT 48

/* Column counts tried at K: every one up to EDGE_COLS, or on a wide K
 * the edges of the passes only. */
static int edge_cols_next(int64_t k, int cols)
{
	static const int few[] = { 1, 7, 8, 9, 15, 16, 17, EDGE_COLS, 0 };

	if (k <= 2 * Q4KH_QK_K)
		return cols < EDGE_COLS ? cols + 1 : 0;
	for (int i = 0; few[i]; i++)
		if (few[i] > cols)
			return few[i];
	return 0;
}

/* A set's packed products, in the order of packed_gguf, for columns
 * quantised with QMAX (SIMD_QMAX, or SIMD_QMAX8 for the int8 forms). */
struct packed_set {
	const char *name;
	int qmax;
	simd_packed_fn fn[N_PACKED];
};

/*
 * KERNEL's own code (plugins/cpu-simd/simd_*_packed.c, built into this
 * program against tests/avx512-emu/immintrin.h: its intrinsics in plain
 * C) at the tiles' edges, on any CPU: edge_rows, K of one super-block, of
 * two and wide, 1 .. EDGE_COLS columns, the tiles in three parts as by
 * three threads. Every value within the bound of KERNEL's rounding
 * (check_rows()), nothing written past a
 * column's N rows, a column's bits the same whatever the batch, and with
 * SAME, every bit as SAME's code gives it.
 */
static void packed_code_at_the_edges(const struct packed_set *kernel,
                                     const struct packed_set *same)
{
	struct env *e = env_open();

	for (int t = 0; t < N_PACKED; t++)
		for (int wide = 0; wide < 2; wide++) {
			struct weight w;

			weight_rows_of(e, NULL, packed_gguf[t], 0, wide ? WIDE_REPEAT : 1, &w);
			for (int64_t k = wide ? w.k : simd_pack_block_values(packed_wtype[t]); k;
			     k = packed_k_next(t, k, w.k)) {
				float *x = activations(k, EDGE_COLS);
				struct split_cols sc;

				split_cols(x, k, EDGE_COLS, kernel->qmax, &sc);
				for (int n = 0; n < N_EDGE_ROWS; n++) {
					const int64_t ld = edge_rows[n] + PAD, tiles = (edge_rows[n] + 15) / 16;
					const int64_t cut[4] = { 0, 1, tiles < 2 ? tiles : 2, tiles };
					void *packed = pack_weight(&w, packed_wtype[t], k, edge_rows[n], e);
					float *y = malloc(sizeof(float) * (size_t)(2 * EDGE_COLS * ld));
					float *first = malloc(sizeof(float) * (size_t)edge_rows[n]);
					float *yc[EDGE_COLS], *yv[EDGE_COLS];

					cr_assert(y && first);
					for (int cols = 1; cols; cols = edge_cols_next(k, cols)) {
						for (int64_t i = 0; i < 2 * EDGE_COLS * ld; i++)
							y[i] = NAN;
						for (int c = 0; c < cols; c++) {
							yc[c] = y + c * ld;
							yv[c] = y + (EDGE_COLS + c) * ld;
						}
						for (int part = 0; part < 3; part++) {
							kernel->fn[t](packed, edge_rows[n], k, cut[part], cut[part + 1],
							              sc.act, cols, yc);
							if (same)
								same->fn[t](packed, edge_rows[n], k, cut[part],
								            cut[part + 1], sc.act, cols, yv);
						}
						for (int c = 0; c < cols; c++) {
							check_rows(w.name, w.exact, w.k, k, edge_rows[n], kernel->name,
							           cols, c, x + c * k, yc[c], kernel->qmax);
							for (int64_t i = edge_rows[n]; i < ld; i++)
								cr_assert(isnan(yc[c][i]), "%s K %lld, %lld rows: column "
								          "%d written at row %lld", w.name, (long long)k,
								          (long long)edge_rows[n], c, (long long)i);
							cr_assert(!same || !memcmp(yc[c], yv[c], sizeof(float) *
							                                          (size_t)ld),
							          "%s %s, K %lld, %lld rows, %d columns: column %d is "
							          "not %s's bit for bit", w.name, kernel->name,
							          (long long)k, (long long)edge_rows[n], cols, c,
							          same ? same->name : "");
						}
						if (cols == 1)
							memcpy(first, y, sizeof(float) * (size_t)edge_rows[n]);
						cr_assert_eq(memcmp(first, y, sizeof(float) * (size_t)edge_rows[n]),
						             0, "%s K %lld: column 0 differs between 1 and %d "
						             "columns", w.name, (long long)k, cols);
					}
					free(first);
					free(y);
					free(packed);
				}
				split_cols_free(&sc);
				free(x);
			}
			weight_free(e, &w);
		}
	env_close(e);
}

static const struct packed_set emulated_vnni = { "emulated avx512-vnni", SIMD_QMAX,
	                                         { simd_vnni_packed_q4_k, simd_vnni_packed_q6_k,
	                                           simd_vnni_packed_q5_0 } };
static const struct packed_set emulated_amx = { "emulated amx", SIMD_QMAX,
	                                        { simd_amx_packed_q4_k, simd_amx_packed_q6_k,
	                                          simd_amx_packed_q5_0 } };
static const struct packed_set emulated_vnni8 = { "emulated avx512-vnni int8", SIMD_QMAX8,
	                                          { simd_vnni_packed8_q4_k, simd_vnni_packed8_q6_k,
	                                            simd_vnni_packed8_q5_0 } };
static const struct packed_set emulated_amx8 = { "emulated amx int8", SIMD_QMAX8,
	                                         { simd_amx_packed8_q4_k, simd_amx_packed8_q6_k,
	                                           simd_amx_packed8_q5_0 } };

Test(cpu_simd_pack, the_avx512_kernels_code_emulated_at_the_tiles_edges, .timeout = 300)
{
	packed_code_at_the_edges(&emulated_vnni, NULL);
}

/*
 * The AMX kernel's code, its tiles emulated as the SDM defines
 * ldtilecfg, tileloadd, tdpbsud and tilestored (the emulation also
 * faults where the hardware would: a shape tdpbsud refuses, a tile used
 * unconfigured), at the same edges, every bit as the VNNI kernel's code
 * gives it: the same int32 sums per block, scaled by the same steps.
 */
Test(cpu_simd_amx, the_amx_kernels_code_emulated_is_the_vnni_kernels_bit_for_bit,
     .timeout = 600)
{
	packed_code_at_the_edges(&emulated_amx, &emulated_vnni);
}

/* The int8 forms (cpu-simd8: the low bytes only) the same way, against
 * the int8 activations. */
Test(cpu_simd_pack, the_int8_kernels_code_emulated_at_the_tiles_edges, .timeout = 300)
{
	packed_code_at_the_edges(&emulated_vnni8, NULL);
}

Test(cpu_simd_amx, the_int8_amx_kernels_code_emulated_is_the_vnni_kernels_bit_for_bit,
     .timeout = 600)
{
	packed_code_at_the_edges(&emulated_amx8, &emulated_vnni8);
}

/* y = w x through the plugin's gemm (GEMM) or gemv on rows [0, N) of W,
 * its first K values (a view), for COLS columns of XK (K values each). */
static float *plugin_product(struct env *e, const struct weight *w, int64_t k, int64_t n,
                             const float *xk, int64_t cols, int gemm)
{
	struct q4kh_tensor view = w->t, xt, yt;
	q4kh_prepared *p;
	float *y;

	view.ne[0] = k;
	view.ne[1] = n;
	cr_assert_eq(e->v->prepare(e->kctx, &e->nd, &view, &p), Q4KH_OK, "%s",
	             e->v->last_error(e->kctx));
	xt = f32_tensor(e, k, cols, 64, xk);
	yt = f32_tensor(e, n, cols, 32, NULL);
	cr_assert_eq((gemm ? e->v->gemm : e->v->gemv)(e->kctx, &e->nd, p, &xt, &yt), Q4KH_OK,
	             "%s", e->v->last_error(e->kctx));
	y = fetch(e, &yt);
	e->b->buffer_free(e->dev, xt.buffer);
	e->b->buffer_free(e->dev, yt.buffer);
	e->v->release(e->kctx, p);
	return y;
}

/* As edge_cols_next(), then 100 columns: many passes, cut into chunks. */
static int plugin_cols_next(int64_t k, int cols)
{
	const int next = cols < 100 ? edge_cols_next(k, cols) : 0;

	return next ? next : cols < 100 ? 100 : 0;
}

/* Threads the plugin's gemm is tried on: one, odd counts, and the 16
 * cores of the server parts (the packed gemm then cuts the columns too). */
static const char *const edge_threads[] = { "1", "3", "7", "16" };
#define N_EDGE_THREADS (int)(sizeof(edge_threads) / sizeof(edge_threads[0]))

/* The packed types gemv runs on the repacked tiles (struct simd_kernels
 * packed_gemv: Q4_K, Q5_0; Q6_K reads its blocks in place). */
static int gemv_packed(int t)
{
	return packed_wtype[t] == SIMD_Q4_K || packed_wtype[t] == SIMD_Q5_0;
}

/* The column count after COLS that the edge tests try at K: through gemv
 * (GEMV) 1 to 8, else plugin_cols_next(); 0 past the last. */
static int plugin_next(int gemv, int64_t k, int cols)
{
	return gemv ? (cols < 8 ? cols + 1 : 0) : plugin_cols_next(k, cols);
}

/*
 * Through VARIANT (cpu-simd, cpu-simd8) with the kernels of ISA on this
 * CPU: gemm of
 * 1 .. EDGE_COLS columns and of 100 (with GEMV, gemv of 1 .. 8) on
 * edge_rows, K of one super-block, of two and wide (views of the first
 * values of each row), on edge_threads: every value within the bound of
 * VARIANT's rounding (check_rows()),
 * column 0 the same bits whatever the batch, every result the same bits
 * at every thread count and, with SAME, as the plugin's gemm with isa =
 * SAME gives them; with GEMV, for the types gemv runs on the repacked
 * tiles, as the plugin's gemm with ISA gives them.
 */
static void plugin_at_the_edges(const char *variant, const char *isa, const char *same,
                                int gemv)
{
	struct env *e = env_of("cpu", variant);

	for (int t = 0; t < N_PACKED; t++)
		for (int wide = 0; wide < 2; wide++) {
			struct weight w;
			float *x;

			weight_rows_of(e, NULL, packed_gguf[t], 0, wide ? WIDE_REPEAT : 1, &w);
			x = activations(w.k, 100);
			for (int64_t k = wide ? w.k : simd_pack_block_values(packed_wtype[t]); k;
			     k = packed_k_next(t, k, w.k)) {
				float *xk = malloc(sizeof(float) * (size_t)(k * 100));

				cr_assert_not_null(xk);
				for (int64_t c = 0; c < 100; c++)
					memcpy(xk + c * k, x + c * w.k, sizeof(float) * (size_t)k);
				for (int n = 0; n < N_EDGE_ROWS; n++)
					for (int cols = 1; cols; cols = plugin_next(gemv, k, cols)) {
						const char *gemm = same ? same : gemv && gemv_packed(t) ? isa : NULL;
						float *one = NULL, *want = NULL;

						for (int th = 0; th < N_EDGE_THREADS; th++) {
							float *y;

							e->threads = edge_threads[th];
							cr_assert_eq(env_variant(e, isa), Q4KH_OK, "%s",
							             e->v->last_error(NULL));
							y = plugin_product(e, &w, k, edge_rows[n], xk, cols, !gemv);
							for (int64_t c = 0; c < cols; c++)
								check_rows(w.name, w.exact, w.k, k, edge_rows[n], isa, cols,
								           c, xk + c * k, y + c * edge_rows[n], e->qmax);
							if (!one)
								one = y;
							else
								cr_assert(!memcmp(one, y, sizeof(float) *
								                          (size_t)(cols * edge_rows[n])),
								          "%s %s, K %lld, %lld rows, %d columns: %s "
								          "threads differ from 1", w.name, isa,
								          (long long)k, (long long)edge_rows[n], cols,
								          edge_threads[th]);
							if (y != one)
								free(y);
						}
						if (gemm) {
							cr_assert_eq(env_variant(e, gemm), Q4KH_OK, "%s",
							             e->v->last_error(NULL));
							want = plugin_product(e, &w, k, edge_rows[n], xk, cols, 1);
							for (int64_t i = 0; i < cols * edge_rows[n]; i++)
								cr_assert(!memcmp(&one[i], &want[i], sizeof(float)),
								          "%s %s%s, K %lld, %lld rows, %d columns: y[%lld, "
								          "%lld] = %.9g, %s gemm %.9g", w.name, isa,
								          gemv ? " gemv" : "", (long long)k,
								          (long long)edge_rows[n], cols,
								          (long long)(i % edge_rows[n]),
								          (long long)(i / edge_rows[n]), (double)one[i],
								          gemm, (double)want[i]);
						}
						free(want);
						free(one);
					}
				free(xk);
			}
			free(x);
			weight_free(e, &w);
		}
	env_close(e);
}

Test(cpu_simd_pack, avx512_gemm_at_the_tiles_edges_within_the_int16_bound, .timeout = 600)
{
	if (!cpu_runs("avx512-vnni"))
		cr_skip_test("this CPU has no AVX-512 VNNI: the packed gemm runs only there "
		             "(its layout and steps are checked by the tests above)");
	plugin_at_the_edges("cpu-simd", "avx512-vnni", NULL, 0);
}

/*
 * The same through gemv (1 to 8 columns) with this CPU's AVX-512 VNNI
 * kernels: within the bound, every thread count the same bits as one, and
 * for the types gemv runs on the repacked tiles, every column the same
 * bits as the plugin's gemm gives it.
 */
Test(cpu_simd_pack, avx512_gemv_at_the_tiles_edges_is_the_gemm_bit_for_bit, .timeout = 600)
{
	if (!cpu_runs("avx512-vnni"))
		cr_skip_test("this CPU has no AVX-512 VNNI: the packed products run only there");
	plugin_at_the_edges("cpu-simd", "avx512-vnni", NULL, 1);
}

/*
 * The plugin's reason why isa = amx cannot run here, for a skip; NULL
 * where it runs. Checked against this test's own view (cpu_runs()).
 */
static const char *amx_unusable(void)
{
	static char why[512];
	struct env *e = env_open();
	const q4kh_status st = env_variant(e, "amx");

	snprintf(why, sizeof(why), "%s", e->v->last_error(NULL));
	env_close(e);
	cr_assert_eq(st == Q4KH_OK, cpu_runs("amx"),
	             "the plugin says %s, this test that the CPU %s AMX", st ? why : "it runs",
	             cpu_runs("amx") ? "runs" : "does not run");
	return st == Q4KH_OK ? NULL : why;
}

/*
 * On a CPU with AMX, the plugin's AMX gemm at the tiles' edges (rows not
 * a multiple of 16, K at the super-blocks' edges and across the cache
 * blocks, 1 .. 33 and 100 columns, 1, 3, 7 and 16 threads) within the
 * bound and every bit the plugin's AVX-512 VNNI gemm. Elsewhere, a skip
 * that says why.
 */
Test(cpu_simd_amx, amx_gemm_at_the_tiles_edges_is_the_vnni_gemm_bit_for_bit, .timeout = 900)
{
	const char *why = amx_unusable();

	if (why)
		cr_skip_test("AMX is not usable here: %s", why);
	plugin_at_the_edges("cpu-simd", "amx", "avx512-vnni", 0);
}

/* cpu-simd8's gemm, and its gemv (on the repacked tiles for Q4_K and
 * Q5_0, the gemm's bits), at the same edges against the int8
 * activations. */
Test(cpu_simd8_pack, avx512_gemm_at_the_tiles_edges_against_the_int8_activations,
     .timeout = 600)
{
	if (!cpu_runs("avx512-vnni"))
		cr_skip_test("this CPU has no AVX-512 VNNI, which cpu-simd8 needs");
	plugin_at_the_edges("cpu-simd8", "avx512-vnni", NULL, 0);
}

Test(cpu_simd8_pack, avx512_gemv_at_the_tiles_edges_is_the_gemm_bit_for_bit, .timeout = 600)
{
	if (!cpu_runs("avx512-vnni"))
		cr_skip_test("this CPU has no AVX-512 VNNI, which cpu-simd8 needs");
	plugin_at_the_edges("cpu-simd8", "avx512-vnni", NULL, 1);
}

Test(cpu_simd_amx, int8_amx_gemm_at_the_tiles_edges_is_the_vnni_gemm_bit_for_bit,
     .timeout = 900)
{
	const char *why = amx_unusable();

	if (why)
		cr_skip_test("AMX is not usable here: %s", why);
	plugin_at_the_edges("cpu-simd8", "amx", "avx512-vnni", 0);
}

/* The plugin's debug line from init (the host's log), kept by the test. */
static char init_line[1024];

static void keep_line(void *host_data, q4kh_log_level level, const char *msg)
{
	(void)host_data;
	if (level == Q4KH_LOG_DEBUG)
		snprintf(init_line, sizeof(init_line), "%s", msg);
}

/*
 * isa = amx where AMX does not run fails init() naming the reason, read
 * here from CPUID and Linux, not through the SDK; auto then takes AVX-512
 * VNNI and its debug line says why amx was passed over. Where AMX runs,
 * auto takes it, and amx with repack = off fails, naming the setting.
 */
Test(cpu_simd_amx, isa_amx_and_auto_say_why_amx_does_not_run)
{
	struct env *e = env_open();
	q4kh_status st;

	e->api.log = keep_line;
	if (!cpu_runs("avx512-vnni"))
		cr_skip_test("this CPU has no AVX-512 VNNI: what AMX lacks comes after that");
	cr_assert_eq(env_variant(e, "auto"), Q4KH_OK, "%s", e->v->last_error(NULL));
	if (cpu_runs("amx")) {
		cr_expect_str_eq(init_line, "cpu-simd: amx kernels, 2 threads");
		e->repack = "off";
		cr_expect_eq(env_variant(e, "amx"), Q4KH_ERR_UNSUPPORTED);
		cr_expect_str_eq(e->v->last_error(NULL),
		                 "[plugin.cpu-simd] isa = amx: repack = off, and the AMX products "
		                 "run on repacked weights only");
		cr_expect_eq(env_variant(e, "auto"), Q4KH_OK);
		cr_expect_str_eq(init_line, "cpu-simd: avx512-vnni kernels, 2 threads (isa auto; "
		                            "passed over: amx: repack = off, and the AMX products "
		                            "run on repacked weights only)");
		env_close(e);
		return;
	}
	st = env_variant(e, "amx");
	cr_expect_eq(st, Q4KH_ERR_UNSUPPORTED);
	if (!cpuid_has_amx()) {
		cr_expect_str_eq(e->v->last_error(NULL),
		                 "[plugin.cpu-simd] isa = amx: the CPU reports no AMX-TILE and "
		                 "AMX-INT8 (CPUID.(7,0):EDX bits 24, 25)");
		cr_expect_str_eq(init_line, "cpu-simd: avx512-vnni kernels, 2 threads (isa auto; "
		                            "passed over: amx: the CPU reports no AMX-TILE and "
		                            "AMX-INT8 (CPUID.(7,0):EDX bits 24, 25))");
	} else {
		/* The CPU has the tiles: the OS, Linux or this build keeps them off. */
		cr_expect(strncmp(e->v->last_error(NULL), "[plugin.cpu-simd] isa = amx: ", 29) == 0,
		          "%s", e->v->last_error(NULL));
		cr_expect(strstr(init_line, "avx512-vnni kernels, 2 threads (isa auto; passed over: "
		                            "amx: ") == init_line + strlen("cpu-simd: "),
		          "%s", init_line);
	}
	env_close(e);
}
