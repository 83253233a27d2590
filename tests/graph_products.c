/*
 * What tests/test_graph.c (the reference cpu through cpu-simd) and
 * tests/test_cuda_graph.c (cuda through cuda-mwv) both check of a kernel
 * variant's ABI 1.4 products on whole steps: gemv_multi (mul_mat nodes of
 * one input as one call) and gemv_glu (gate, up and their GLU as one
 * call), on tiny-qwen2 and on Gemma 3 (graph_products.h).
 */
#include "graph_products.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "helpers.h"
#include "kernel.h"
#include "model.h"
#include "policy.h"
#include "session.h"

char *graph_model_file(const char *file)
{
	char *path = NULL;

	if (file[0] == '/' ? !(path = strdup(file))
	                   : asprintf(&path, "%s/tests/fixtures/%s", test_srcdir(), file) < 0)
		cr_assert_fail("out of memory");
	return path;
}

/* --- gemv_multi: the interpreter's grouping of mul_mat nodes ------------ */

/* The variant's own table, and what the wrappers below saw. */
static const struct q4kh_kernel_v1 *multi_real;
static int multi_calls[Q4KH_GEMV_MULTI_MAX + 1]; /* by n */
static int multi_biased;                         /* calls with a bias */

/* Counts the call, then forwards it. */
static q4kh_status counting_multi(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                                  uint32_t n, q4kh_prepared *const w[],
                                  const struct q4kh_tensor *x,
                                  const struct q4kh_tensor *const y[],
                                  const struct q4kh_tensor *const bias[])
{
	cr_assert(n >= 2 && n <= Q4KH_GEMV_MULTI_MAX, "gemv_multi of %u matrices", n);
	multi_calls[n]++;
	for (uint32_t i = 0; bias && i < n; i++)
		if (bias[i]) {
			multi_biased++;
			break;
		}
	return multi_real->gemv_multi(ctx, dev, n, w, x, y, bias);
}

/* Refuses three matrices (the host must split them), forwards the rest. */
static q4kh_status refusing_multi(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                                  uint32_t n, q4kh_prepared *const w[],
                                  const struct q4kh_tensor *x,
                                  const struct q4kh_tensor *const y[],
                                  const struct q4kh_tensor *const bias[])
{
	if (n == 3)
		return Q4KH_ERR_UNSUPPORTED;
	return counting_multi(ctx, dev, n, w, x, y, bias);
}

#define MULTI_PROMPT 5 /* tokens: one step of 5 columns, within cpu-simd's 8 */
#define MULTI_DECODE 3 /* then one-token steps */
#define STEPS (1 + MULTI_DECODE) /* columns of logits multi_logits gives */

/*
 * Logits of the prompt's last token and of each decode step, in a row, on
 * a new session of M (each mode records its own steps where the backend
 * replays them).
 */
static float *multi_logits(struct q4kh_model *m)
{
	static const int32_t prompt[MULTI_PROMPT] = { 17, 400, 1203, 9, 77 };
	struct q4kh_error err = { { 0 } };
	struct q4kh_session_params sp = { .n_ctx = 64 };
	struct q4kh_session *s = NULL;
	const int64_t n_vocab = m->hp.n_vocab;
	float *out = calloc((size_t)n_vocab * (1 + MULTI_DECODE), sizeof(float));

	cr_assert_not_null(out);
	cr_assert_eq(q4kh_session_new(m, &sp, &s, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_eval(s, prompt, MULTI_PROMPT, out, 0, &err), 0, "%s", err.msg);
	for (int i = 0; i < MULTI_DECODE; i++) {
		int32_t id = (int32_t)(31 * i + 5);

		cr_assert_eq(q4kh_session_eval(s, &id, 1, out + (size_t)n_vocab * (i + 1), 0, &err),
		             0, "%s", err.msg);
	}
	q4kh_session_free(s);
	return out;
}

/* A model on a backend, its weights served by a kernel variant. */
struct on_variant {
	struct q4kh_backend be;
	struct q4kh_kernel k;
	struct q4kh_model *m;
	int layers; /* m's */
};

/*
 * The model FILE (graph_model_file; tiny-qwen2: q, k, v with biases, Q4_K
 * and Q6_K) uploaded to BACKEND of REG, its weights served by VARIANT,
 * into O.
 */
static void model_on(struct on_variant *o, struct q4kh_registry *reg, const char *file,
                     const char *backend, const char *variant)
{
	char *model = graph_model_file(file);
	struct q4kh_error err = { { 0 } };

	memset(o, 0, sizeof(*o));
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(reg, backend), 0, &o->be, &err), 0,
	             "%s", err.msg);
	cr_assert_eq(q4kh_model_open(model, &o->m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(o->m, &o->be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_policy_use_kernel(reg, &o->be, o->m, variant, &o->k, &err), 0, "%s",
	             err.msg);
	o->layers = (int)o->m->hp.n_layer;
	free(model);
}

/* Close what model_on() opened. */
static void model_close(struct on_variant *o)
{
	q4kh_model_free(o->m);
	q4kh_kernel_close(&o->k);
	q4kh_backend_close(&o->be);
}

/*
 * The logits (STEPS columns of M's vocabulary) with ENTRY (WITH) and
 * with ENTRY refused (REFUSED; NULL: not run) bit for bit those without
 * it (WITHOUT), BACKEND/VARIANT named when they differ; the three freed.
 */
static void expect_same_logits(const char *entry, float *with, float *without, float *refused,
                               const struct q4kh_model *m, const char *backend,
                               const char *variant)
{
	const size_t bytes = sizeof(float) * (size_t)m->hp.n_vocab * STEPS;

	cr_expect_eq(memcmp(with, without, bytes), 0,
	             "%s/%s: the logits differ with %s and without", backend, variant, entry);
	if (refused)
		cr_expect_eq(memcmp(refused, without, bytes), 0,
		             "%s/%s: after a refused %s the logits differ", backend, variant, entry);
	free(refused);
	free(without);
	free(with);
}

/*
 * O on tiny-qwen2 (q, k, v with biases; Q4_K and Q6_K): with gemv_multi
 * every layer's q, k, v and gate, up go as one call each (in every step
 * where the backend runs the interpreter; EXACT: each step does), and the
 * logits are bit for bit those of the variant seen as ABI 1.3 and of one
 * that refuses three matrices.
 */
static void grouping(struct on_variant *o, const char *backend, const char *variant, int exact)
{
	struct q4kh_kernel_v1 counting, refusing, old;
	float *grouped, *split, *refused;

	cr_assert_not_null(o->m->layers[0].bq.src, "tiny-qwen2 without q bias");
	multi_real = o->k.v;
	/* without gemv_glu, which would take gate and up first */
	counting = *o->k.v;
	counting.gemv_multi = counting_multi;
	counting.gemv_glu = NULL;
	refusing = counting;
	refusing.gemv_multi = refusing_multi;
	old = *o->k.v; /* as a 1.3 variant: the table ends before gemv_multi */
	old.struct_size = (uint32_t)offsetof(struct q4kh_kernel_v1, gemv_multi);

	memset(multi_calls, 0, sizeof(multi_calls));
	multi_biased = 0;
	o->k.v = &counting;
	grouped = multi_logits(o->m);
	/* q, k, v and gate, up of every layer, once each per interpreted step */
	if (exact) {
		cr_expect_eq(multi_calls[3], o->layers * STEPS, "%d calls for q, k, v",
		             multi_calls[3]);
		cr_expect_eq(multi_calls[2], o->layers * STEPS, "%d calls for gate, up",
		             multi_calls[2]);
		cr_expect_eq(multi_biased, o->layers * STEPS, "%d calls with biases", multi_biased);
	} else {
		cr_expect_geq(multi_calls[3], o->layers, "%d calls for q, k, v", multi_calls[3]);
		cr_expect_eq(multi_calls[3], multi_calls[2]);
		cr_expect_eq(multi_biased, multi_calls[3]);
		cr_expect_eq(multi_calls[3] % o->layers, 0);
	}
	cr_expect_eq(multi_calls[4], 0);

	o->k.v = &old;
	memset(multi_calls, 0, sizeof(multi_calls));
	split = multi_logits(o->m);
	cr_expect_eq(multi_calls[2] + multi_calls[3], 0, "a 1.3 table got gemv_multi calls");

	o->k.v = &refusing;
	refused = multi_logits(o->m);
	cr_expect_eq(multi_calls[3], 0);
	cr_expect_gt(multi_calls[2], 0);

	expect_same_logits("gemv_multi", grouped, split, refused, o->m, backend, variant);
}

/* --- gemv_glu: gate, up and their GLU in one kernel-variant call -------- */

static const struct q4kh_kernel_v1 *glu_real;
static int glu_calls, glu_refusals;

/* Counts the call, then forwards it. */
static q4kh_status counting_glu(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                                q4kh_glu_kind kind, q4kh_prepared *w_gate,
                                q4kh_prepared *w_up, const struct q4kh_tensor *x,
                                const struct q4kh_tensor *y)
{
	glu_calls++;
	return glu_real->gemv_glu(ctx, dev, kind, w_gate, w_up, x, y);
}

/* Refuses every call, as a variant that lacks the kind or the types. */
static q4kh_status refusing_glu(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                                q4kh_glu_kind kind, q4kh_prepared *w_gate,
                                q4kh_prepared *w_up, const struct q4kh_tensor *x,
                                const struct q4kh_tensor *y)
{
	(void)ctx, (void)dev, (void)kind, (void)w_gate, (void)w_up, (void)x, (void)y;
	glu_refusals++;
	return Q4KH_ERR_UNSUPPORTED;
}

/*
 * O on tiny-qwen2 (SwiGLU): with gemv_glu every layer's gate, up and GLU
 * go as one call (per interpreted step; EXACT: each step is) and no gate,
 * up pair reaches gemv_multi; the logits are bit for bit those of the
 * variant without the entry (gate and up through gemv_multi, then the
 * backend's glu) and of one that refuses every call (the host falls back
 * to the same).
 */
static void glu(struct on_variant *o, const char *backend, const char *variant, int exact)
{
	struct q4kh_kernel_v1 counting, refusing, without;
	float *fused, *apart, *refused;

	cr_assert(Q4KH_KERNEL_HAS(o->k.v, gemv_glu), "%s has no gemv_glu", variant);
	glu_real = multi_real = o->k.v;
	counting = *o->k.v;
	counting.gemv_multi = counting_multi;
	counting.gemv_glu = counting_glu;
	refusing = counting;
	refusing.gemv_glu = refusing_glu;
	without = counting;
	without.gemv_glu = NULL;

	glu_calls = 0;
	memset(multi_calls, 0, sizeof(multi_calls));
	o->k.v = &counting;
	fused = multi_logits(o->m);
	if (exact)
		cr_expect_eq(glu_calls, o->layers * STEPS, "%d gemv_glu calls", glu_calls);
	else
		cr_expect(glu_calls >= o->layers && glu_calls % o->layers == 0, "%d gemv_glu calls",
		          glu_calls);
	cr_expect_eq(multi_calls[2], 0, "%d gate, up pairs reached gemv_multi", multi_calls[2]);
	cr_expect_eq(multi_calls[3], glu_calls, "q, k, v: %d calls", multi_calls[3]);

	memset(multi_calls, 0, sizeof(multi_calls));
	o->k.v = &without;
	apart = multi_logits(o->m);
	cr_expect_eq(multi_calls[2], multi_calls[3], "gate, up: %d calls", multi_calls[2]);

	glu_refusals = 0;
	memset(multi_calls, 0, sizeof(multi_calls));
	o->k.v = &refusing;
	refused = multi_logits(o->m);
	cr_expect_eq(glu_refusals, multi_calls[2], "%d refusals, %d gate, up calls",
	             glu_refusals, multi_calls[2]);
	cr_expect_gt(glu_refusals, 0);

	expect_same_logits("gemv_glu", fused, apart, refused, o->m, backend, variant);
}

/*
 * O on Gemma 3 (the default model: Q5_0 q, k, gate, up, Q8_0 or Q5_0 v):
 * its per-head q/k norms come after the three products and its
 * post-norms after the FFN, so every
 * layer's q, k, v go as one gemv_multi and its gate, up and tanh GELU as
 * one gemv_glu (per interpreted step; EXACT: each step is); the logits
 * are bit for bit those of the variant seen as ABI 1.3 (one gemv per
 * node, then the backend's glu).
 */
static void gemma3_products(struct on_variant *o, const char *backend, const char *variant,
                            int exact)
{
	struct q4kh_kernel_v1 counting, old;
	float *fused, *apart;

	cr_assert_str_eq(o->m->arch->name, "gemma3");
	cr_assert(Q4KH_KERNEL_HAS(o->k.v, gemv_glu), "%s has no gemv_glu", variant);
	glu_real = multi_real = o->k.v;
	counting = *o->k.v;
	counting.gemv_multi = counting_multi;
	counting.gemv_glu = counting_glu;
	old = *o->k.v;
	old.struct_size = (uint32_t)offsetof(struct q4kh_kernel_v1, gemv_multi);

	glu_calls = 0;
	memset(multi_calls, 0, sizeof(multi_calls));
	o->k.v = &counting;
	fused = multi_logits(o->m);
	if (exact) {
		cr_expect_eq(multi_calls[3], o->layers * STEPS, "%d calls for q, k, v",
		             multi_calls[3]);
		cr_expect_eq(glu_calls, o->layers * STEPS, "%d gemv_glu calls", glu_calls);
	} else {
		cr_expect(glu_calls >= o->layers && glu_calls % o->layers == 0, "%d gemv_glu calls",
		          glu_calls);
		cr_expect_eq(multi_calls[3], glu_calls, "q, k, v: %d calls", multi_calls[3]);
	}
	cr_expect_eq(multi_calls[2] + multi_calls[4], 0, "other groups: %d, %d",
	             multi_calls[2], multi_calls[4]);

	o->k.v = &old;
	apart = multi_logits(o->m);
	expect_same_logits("gemv_multi and gemv_glu", fused, apart, NULL, o->m, backend,
	                   variant);
}

/*
 * RUN on the model FILE (graph_model_file) on BACKEND of REG through
 * VARIANT, which must have gemv_multi; the variant's table back in place
 * before the three are closed.
 */
static void run_on(struct q4kh_registry *reg, const char *file, const char *backend,
                   const char *variant, int exact,
                   void (*run)(struct on_variant *o, const char *backend, const char *variant,
                               int exact))
{
	struct on_variant o;
	const struct q4kh_kernel_v1 *real;

	model_on(&o, reg, file, backend, variant);
	cr_assert(Q4KH_KERNEL_HAS(o.k.v, gemv_multi), "%s has no gemv_multi", variant);
	real = o.k.v;
	run(&o, backend, variant, exact);
	o.k.v = real;
	model_close(&o);
}

void expect_grouping(struct q4kh_registry *reg, const char *backend, const char *variant,
                     int exact)
{
	run_on(reg, "tiny-qwen2.gguf", backend, variant, exact, grouping);
}

void expect_glu(struct q4kh_registry *reg, const char *backend, const char *variant, int exact)
{
	run_on(reg, "tiny-qwen2.gguf", backend, variant, exact, glu);
}

void expect_gemma3_products(struct q4kh_registry *reg, const char *backend,
                            const char *variant, int exact)
{
	run_on(reg, test_model_path(), backend, variant, exact, gemma3_products);
}
