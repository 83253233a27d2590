/*
 * cuda-mwv's and cuda-dp4a's fused entries (ABI 1.4) against the calls
 * they stand for (cuda_variant_rig.h: the rig, the poison): gemv_multi must
 * give, bit for bit, what the variant's gemv and the cuda backend's add
 * give, for its types mixed in one call (cuda-mwv: Q4_K, Q6_K, Q5_0 and
 * Q8_0; cuda-dp4a: Q4_K and Q6_K), with and without biases, at T = 1 ..
 * 8; gemv_glu, what two gemv and the cuda backend's glu give, SwiGLU and
 * GeGLU, each of its types, at T = 1 .. 8, and refuse mixed types with
 * nothing written (cuda-dp4a also refuses a product whose int8
 * activations exceed a block's shared memory: K x T x 1.25 bytes over
 * 48 KiB). cuda-mwv's bad arguments to either fail with reasons.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_variant_rig.h"

TestSuite(cuda_variants, .timeout = 900);

/*
 * GOT's view on the gpu holds, bit for bit, what WANT's does (the same
 * shape), and no byte of GOT's buffer outside its view was written. WHAT
 * names the case in a failure.
 */
static void expect_same_bits(struct vrig *r, const struct view *got, const struct view *want,
                             const char *what)
{
	uint8_t *g = fetch(&r->gpu, got), *e = fetch(&r->gpu, want);

	for (uint64_t j = 0; j < got->size; j++)
		if (!in_view(got, j))
			cr_assert_eq(g[j], POISON, "%s: wrote byte %llu of y's buffer, outside "
			             "the view", what, (unsigned long long)j);
	for (int64_t c = 0; c < got->t.ne[1]; c++)
		for (int64_t row = 0; row < got->t.ne[0]; row++) {
			float a = f32_at(got, g, row, c), b = f32_at(want, e, row, c);

			cr_assert(!memcmp(&a, &b, sizeof(a)), "%s: y[%lld, %lld] = %.9g, the "
			          "calls it stands for give %.9g",
			          what, (long long)row, (long long)c, a, b);
		}
	free(g);
	free(e);
}

/* 1 when variant V fuses products of K values and T columns (cuda-dp4a:
 * its int8 activations within 48 KiB, DP4A_SHARED_MOST). */
static int fuses(const struct variant *v, int64_t k, int64_t t)
{
	return v != &dp4a || k * t * 5 / 4 <= 48 << 10;
}

/* --- gemv_multi (ABI 1.4): one launch against gemv + add ------------------ */

/* Products of one x: K, and per matrix its type, rows and whether a bias. */
struct multi_case {
	int64_t k;
	uint32_t n;
	uint32_t type[Q4KH_GEMV_MULTI_MAX];
	int64_t rows[Q4KH_GEMV_MULTI_MAX];
	int bias[Q4KH_GEMV_MULTI_MAX];
};

#define Q4K Q4KH_TYPE_Q4_K
#define Q6K Q4KH_TYPE_Q6_K
#define Q50 Q4KH_TYPE_Q5_0
#define Q80 Q4KH_TYPE_Q8_0

/*
 * q, k, v of a Q4_K_M file (v in Q6_K) with Qwen2's biases; gate and up
 * (enough rows for 4 rows per warp on an H200, K long enough for 4 pieces
 * per step); four mixed matrices of few rows and one super-block (1 row
 * per warp, 2 pieces per step), some with biases; one matrix alone;
 * q, k, v of the default model (rows of 640 values: 20 pieces; v in Q8_0
 * or Q5_0 by layer); all four types in one call; Q8_0 and Q5_0 of few
 * rows with biases.
 */
static const struct multi_case multi_cases[] = {
	{ 2048, 3, { Q4K, Q4K, Q6K }, { 2048, 259, 259 }, { 1, 1, 1 } },
	{ 4096, 2, { Q4K, Q4K }, { 5003, 5003 }, { 0, 0 } },
	{ 256, 4, { Q6K, Q4K, Q6K, Q4K }, { 77, 33, 200, 5 }, { 1, 0, 0, 1 } },
	{ 512, 1, { Q6K }, { 300 }, { 1 } },
	{ 640, 3, { Q50, Q50, Q80 }, { 1024, 256, 256 }, { 0, 0, 0 } },
	{ 640, 3, { Q50, Q50, Q50 }, { 1024, 256, 256 }, { 0, 0, 0 } },
	{ 4096, 4, { Q50, Q80, Q4K, Q6K }, { 33, 5, 77, 9 }, { 1, 0, 1, 0 } },
	{ 96, 2, { Q80, Q50 }, { 7, 301 }, { 1, 1 } },
};

#undef Q4K
#undef Q6K
#undef Q50
#undef Q80

/*
 * One case at T columns: y[i] by gemv_multi must hold, bit for bit, what
 * gemv(w[i]) followed by the cuda backend's add of bias[i] gives, and
 * nothing outside the y views may be written.
 */
static void multi_check(struct vrig *r, struct q4kh_kernel *k, const struct multi_case *mc,
                        const struct weight *w, const struct view *bias, int64_t t)
{
	float *xv = rvals((size_t)(mc->k * t));
	struct view x = put(&r->gpu, Q4KH_TYPE_F32, mc->k, t, 4 * mc->k + 64, xv);
	struct view ym[Q4KH_GEMV_MULTI_MAX], ys[Q4KH_GEMV_MULTI_MAX];
	q4kh_prepared *p[Q4KH_GEMV_MULTI_MAX];
	const struct q4kh_tensor *y[Q4KH_GEMV_MULTI_MAX], *b[Q4KH_GEMV_MULTI_MAX];

	for (uint32_t i = 0; i < mc->n; i++) {
		ym[i] = put(&r->gpu, Q4KH_TYPE_F32, w[i].n, t, 4 * w[i].n + 12, NULL);
		ys[i] = put(&r->gpu, Q4KH_TYPE_F32, w[i].n, t, 4 * w[i].n + 12, NULL);
		p[i] = w[i].p;
		y[i] = &ym[i].t;
		b[i] = mc->bias[i] ? &bias[i].t : NULL;
		cr_assert_eq(k->v->gemv(k->ctx, &k->native, w[i].p, &x.t, &ys[i].t), Q4KH_OK,
		             "gemv: %s", k->v->last_error(k->ctx));
		if (b[i])
			cr_assert_eq(r->gpu.v->add(r->gpu.dev, &ys[i].t, b[i], &ys[i].t), Q4KH_OK,
			             "add: %s", r->gpu.v->last_error(r->gpu.ctx));
	}
	cr_assert_eq(k->v->gemv_multi(k->ctx, &k->native, mc->n, p, &x.t, y, b), Q4KH_OK,
	             "gemv_multi of %u matrices, K %lld, T %lld: %s", mc->n, (long long)mc->k,
	             (long long)t, k->v->last_error(k->ctx));
	for (uint32_t i = 0; i < mc->n; i++) {
		char what[128];

		snprintf(what, sizeof(what), "gemv_multi, K %lld, T %lld: y[%u] (%s%s)",
		         (long long)mc->k, (long long)t, i, q4kh_type_name(w[i].type),
		         b[i] ? ", bias" : "");
		expect_same_bits(r, &ym[i], &ys[i], what);
		drop(&r->gpu, &ym[i]);
		drop(&r->gpu, &ys[i]);
	}
	drop(&r->gpu, &x);
	free(xv);
}

/* Every case of multi_cases whose types V takes, at T = 1 .. 8 (all fused). */
static void multi_cases_of(const struct variant *v, long seed)
{
	struct q4kh_kernel k;
	struct vrig r;

	variant_open(&r, v, seed, &k);
	cr_assert(Q4KH_KERNEL_HAS(k.v, gemv_multi));
	for (size_t c = 0; c < N_OF(multi_cases); c++) {
		const struct multi_case *mc = &multi_cases[c];
		struct weight w[Q4KH_GEMV_MULTI_MAX];
		struct view bias[Q4KH_GEMV_MULTI_MAX];
		uint32_t taken = 0;

		for (uint32_t i = 0; i < mc->n; i++)
			taken += (uint32_t)variant_takes(v, mc->type[i]);
		if (taken < mc->n) /* a type V does not take */
			continue;
		for (uint32_t i = 0; i < mc->n; i++) {
			float *bv = rvals((size_t)mc->rows[i]);

			weight_new(&r, &k, v, mc->type[i], mc->k, mc->rows[i], 0, &w[i]);
			bias[i] = put(&r.gpu, Q4KH_TYPE_F32, mc->rows[i], 1, 4 * mc->rows[i], bv);
			free(bv);
		}
		for (int64_t t = 1; t <= 8; t++) {
			cr_assert(fuses(v, mc->k, t));
			multi_check(&r, &k, mc, w, bias, t);
		}
		for (uint32_t i = 0; i < mc->n; i++) {
			drop(&r.gpu, &bias[i]);
			weight_free(&r, &k, &w[i]);
		}
	}
	variant_close(&r, &k);
}

Test(cuda_variants, mwv_gemv_multi_matches_gemv_and_add_bit_for_bit)
{
	multi_cases_of(&mwv, 14);
}

Test(cuda_variants, dp4a_gemv_multi_matches_gemv_and_add_bit_for_bit)
{
	multi_cases_of(&dp4a, 18);
}

Test(cuda_variants, mwv_gemv_multi_bad_arguments_fail_with_reasons)
{
	struct q4kh_kernel k;
	struct weight w[2];
	struct view x, x9, y0, y1, bias;
	q4kh_prepared *p[Q4KH_GEMV_MULTI_MAX + 1];
	const struct q4kh_tensor *y[Q4KH_GEMV_MULTI_MAX + 1], *b[2];
	struct q4kh_tensor bad;
	float *xv;
	struct vrig r;

	variant_open(&r, &mwv, 15, &k);
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q4_K, 512, 16, 0, &w[0]);
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q6_K, 256, 16, 0, &w[1]);
	xv = rvals(512 * 9);
	x = put(&r.gpu, Q4KH_TYPE_F32, 512, 2, 4 * 512, xv);
	x9 = put(&r.gpu, Q4KH_TYPE_F32, 512, 9, 4 * 512, xv);
	y0 = put(&r.gpu, Q4KH_TYPE_F32, 16, 2, 4 * 16, NULL);
	y1 = put(&r.gpu, Q4KH_TYPE_F32, 16, 2, 4 * 16, NULL);
	bias = put(&r.gpu, Q4KH_TYPE_F32, 16, 1, 4 * 16, xv);
	for (int i = 0; i <= Q4KH_GEMV_MULTI_MAX; i++) {
		p[i] = w[0].p;
		y[i] = &y0.t;
	}

	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 0, p, &x.t, y, NULL),
	             Q4KH_ERR_INVALID, "n = 0 (expected 1 .. 4)");
	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 5, p, &x.t, y, NULL),
	             Q4KH_ERR_INVALID, "n = 5 (expected 1 .. 4)");
	p[1] = w[1].p;
	y[1] = &y1.t;
	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 2, p, &x.t, y, NULL),
	             Q4KH_ERR_INVALID, "w[1] has K = 256, w[0] 512");
	p[1] = w[0].p;
	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 2, p, &x9.t, y, NULL),
	             Q4KH_ERR_INVALID, "gemv_multi x: shape {512, 9, 1, 1}");
	y[1] = &y0.t;
	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 2, p, &x.t, y, NULL),
	             Q4KH_ERR_INVALID, "y[1] overlaps y[0]");
	y[1] = &y1.t;
	b[0] = NULL;
	b[1] = &y0.t;
	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 2, p, &x.t, y, b),
	             Q4KH_ERR_INVALID, "overlaps bias[1]");
	bad = bias.t;
	bad.ne[0] = 15;
	b[1] = &bad;
	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 2, p, &x.t, y, b),
	             Q4KH_ERR_INVALID, "bias[1]: type 0 {15, 1, 1, 1}");
	bad = y1.t;
	bad.buffer = x.t.buffer;
	y[1] = &bad;
	expect_error(&k, k.v->gemv_multi(k.ctx, &k.native, 2, p, &x.t, y, NULL),
	             Q4KH_ERR_INVALID, "gemv_multi: y overlaps x");
	/* After all that, a good call still succeeds. */
	y[1] = &y1.t;
	b[1] = &bias.t;
	expect_good_call(&r, &k, k.v->gemv_multi(k.ctx, &k.native, 2, p, &x.t, y, b));

	drop(&r.gpu, &x);
	drop(&r.gpu, &x9);
	drop(&r.gpu, &y0);
	drop(&r.gpu, &y1);
	drop(&r.gpu, &bias);
	weight_free(&r, &k, &w[0]);
	weight_free(&r, &k, &w[1]);
	free(xv);
	variant_close(&r, &k);
}

/* --- gemv_glu (ABI 1.4): one launch against gemv, gemv, glu ----------------- */

/* Gate and up of one type, K and N. */
struct glu_case {
	uint32_t type;
	int64_t k, n;
};

/*
 * 4 rows a warp on an H200 (4 pieces a lane of each row); 2 rows a warp
 * with 4 pieces a step (long rows, few of them) and with 2 (Q6_K, one row
 * group of few rows); one super-block and a row count no multiple of
 * anything; the default model's gate and up (Q5_0, rows of 640 values),
 * and Q5_0 and Q8_0 at other shapes.
 */
static const struct glu_case glu_cases[] = {
	{ Q4KH_TYPE_Q4_K, 4096, 5003 },
	{ Q4KH_TYPE_Q4_K, 8192, 300 },
	{ Q4KH_TYPE_Q6_K, 2048, 259 },
	{ Q4KH_TYPE_Q6_K, 256, 33 },
	{ Q4KH_TYPE_Q5_0, 640, 2048 },
	{ Q4KH_TYPE_Q5_0, 4096, 5003 },
	{ Q4KH_TYPE_Q8_0, 640, 33 },
	{ Q4KH_TYPE_Q8_0, 2048, 259 },
};

/*
 * At T columns and KIND: y by gemv_glu must hold, bit for bit, what
 * gemv(gate), gemv(up) and the cuda backend's glu give, and nothing
 * outside y's view may be written; where variant V does not fuse (fuses),
 * gemv_glu must refuse and write nothing.
 */
static void glu_check(struct vrig *r, const struct variant *v, struct q4kh_kernel *k,
                      const struct weight *gate, const struct weight *up,
                      q4kh_glu_kind kind, int64_t t)
{
	const int64_t k0 = gate->k, n = gate->n, ynb = 4 * n + 12;
	float *xv = rvals((size_t)(k0 * t));
	struct view x = put(&r->gpu, Q4KH_TYPE_F32, k0, t, 4 * k0 + 64, xv);
	struct view yg = put(&r->gpu, Q4KH_TYPE_F32, n, t, ynb, NULL);
	struct view yu = put(&r->gpu, Q4KH_TYPE_F32, n, t, ynb, NULL);
	struct view want = put(&r->gpu, Q4KH_TYPE_F32, n, t, ynb, NULL);
	struct view y = put(&r->gpu, Q4KH_TYPE_F32, n, t, ynb, NULL);
	const char *what = kind == Q4KH_GLU_SILU ? "SwiGLU" : "GeGLU";
	char buf[128];

	cr_assert_eq(k->v->gemv(k->ctx, &k->native, gate->p, &x.t, &yg.t), Q4KH_OK, "gemv: %s",
	             k->v->last_error(k->ctx));
	cr_assert_eq(k->v->gemv(k->ctx, &k->native, up->p, &x.t, &yu.t), Q4KH_OK, "gemv: %s",
	             k->v->last_error(k->ctx));
	cr_assert_eq(r->gpu.v->glu(r->gpu.dev, kind, &yg.t, &yu.t, &want.t), Q4KH_OK, "glu: %s",
	             r->gpu.v->last_error(r->gpu.ctx));
	snprintf(buf, sizeof(buf), "gemv_glu %s, %s K %lld, N %lld, T %lld", what,
	         q4kh_type_name(gate->type), (long long)k0, (long long)n, (long long)t);
	if (fuses(v, k0, t)) {
		cr_assert_eq(k->v->gemv_glu(k->ctx, &k->native, kind, gate->p, up->p, &x.t,
		                            &y.t),
		             Q4KH_OK, "%s: %s", buf, k->v->last_error(k->ctx));
		expect_same_bits(r, &y, &want, buf);
	} else {
		uint8_t *raw;

		cr_assert_eq(k->v->gemv_glu(k->ctx, &k->native, kind, gate->p, up->p, &x.t,
		                            &y.t),
		             Q4KH_ERR_UNSUPPORTED, "%s: %s", buf, k->v->last_error(k->ctx));
		cr_assert_eq(r->gpu.v->synchronize(r->gpu.dev), Q4KH_OK);
		raw = fetch(&r->gpu, &y);
		for (uint64_t j = 0; j < y.size; j++)
			cr_assert_eq(raw[j], POISON, "%s: refused, but wrote byte %llu of y", buf,
			             (unsigned long long)j);
		free(raw);
	}
	drop(&r->gpu, &x);
	drop(&r->gpu, &yg);
	drop(&r->gpu, &yu);
	drop(&r->gpu, &want);
	drop(&r->gpu, &y);
	free(xv);
}

/* Every case of glu_cases whose type V takes, at T = 1 .. 8. */
static void glu_cases_of(const struct variant *v, long seed)
{
	struct q4kh_kernel k;
	struct vrig r;

	variant_open(&r, v, seed, &k);
	cr_assert(Q4KH_KERNEL_HAS(k.v, gemv_glu));
	for (size_t c = 0; c < N_OF(glu_cases); c++) {
		const struct glu_case *gc = &glu_cases[c];
		struct weight gate, up;

		if (!variant_takes(v, gc->type))
			continue;
		/* up's rows padded: the two strides differ */
		weight_new(&r, &k, v, gc->type, gc->k, gc->n, 0, &gate);
		weight_new(&r, &k, v, gc->type, gc->k, gc->n, 16, &up);
		for (int64_t t = 1; t <= 8; t++) {
			glu_check(&r, v, &k, &gate, &up, Q4KH_GLU_SILU, t);
			glu_check(&r, v, &k, &gate, &up, Q4KH_GLU_GELU_TANH, t);
		}
		weight_free(&r, &k, &gate);
		weight_free(&r, &k, &up);
	}
	variant_close(&r, &k);
}

Test(cuda_variants, mwv_gemv_glu_matches_gemv_and_glu_bit_for_bit)
{
	glu_cases_of(&mwv, 16);
}

/* Also refusing K 8192 from T = 5 (50 KiB of int8 activations). */
Test(cuda_variants, dp4a_gemv_glu_matches_gemv_and_glu_bit_for_bit)
{
	glu_cases_of(&dp4a, 19);
}

/*
 * Mixed types and an unknown kind are refused (Q4KH_ERR_UNSUPPORTED) with
 * nothing written; bad arguments fail with reasons.
 */
Test(cuda_variants, mwv_gemv_glu_refuses_and_fails_with_reasons)
{
	struct q4kh_kernel k;
	struct weight q4, q6, q4b;
	struct view x, x9, y;
	struct q4kh_tensor bad;
	uint8_t *raw;
	float *xv;
	struct vrig r;

	variant_open(&r, &mwv, 17, &k);
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q4_K, 512, 16, 0, &q4);
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q6_K, 512, 16, 0, &q6);
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q4_K, 512, 17, 0, &q4b);
	xv = rvals(512 * 9);
	x = put(&r.gpu, Q4KH_TYPE_F32, 512, 2, 4 * 512, xv);
	x9 = put(&r.gpu, Q4KH_TYPE_F32, 512, 9, 4 * 512, xv);
	y = put(&r.gpu, Q4KH_TYPE_F32, 16, 2, 4 * 16, NULL);

	expect_error(&k, k.v->gemv_glu(k.ctx, &k.native, Q4KH_GLU_SILU, q4.p, q6.p, &x.t, &y.t),
	             Q4KH_ERR_UNSUPPORTED, "gate Q4_K and up Q6_K");
	expect_error(&k, k.v->gemv_glu(k.ctx, &k.native, (q4kh_glu_kind)7, q4.p, q4.p, &x.t,
	                               &y.t),
	             Q4KH_ERR_UNSUPPORTED, "unknown kind 7");
	cr_assert_eq(r.gpu.v->synchronize(r.gpu.dev), Q4KH_OK);
	raw = fetch(&r.gpu, &y);
	for (uint64_t j = 0; j < y.size; j++)
		cr_assert_eq(raw[j], POISON, "a refused gemv_glu wrote byte %llu of y",
		             (unsigned long long)j);
	free(raw);
	expect_error(&k, k.v->gemv_glu(k.ctx, &k.native, Q4KH_GLU_SILU, q4.p, q4b.p, &x.t, &y.t),
	             Q4KH_ERR_INVALID, "up {512, 17} and gate {512, 16} differ");
	expect_error(&k, k.v->gemv_glu(k.ctx, &k.native, Q4KH_GLU_SILU, q4.p, q4.p, &x9.t, &y.t),
	             Q4KH_ERR_INVALID, "gemv_glu x: shape {512, 9, 1, 1}");
	bad = y.t;
	bad.buffer = x.t.buffer;
	expect_error(&k, k.v->gemv_glu(k.ctx, &k.native, Q4KH_GLU_SILU, q4.p, q4.p, &x.t, &bad),
	             Q4KH_ERR_INVALID, "gemv_glu: y overlaps x");
	/* After all that, a good call still succeeds. */
	expect_good_call(&r, &k,
	                 k.v->gemv_glu(k.ctx, &k.native, Q4KH_GLU_GELU_TANH, q4.p, q4.p, &x.t, &y.t));

	drop(&r.gpu, &x);
	drop(&r.gpu, &x9);
	drop(&r.gpu, &y);
	weight_free(&r, &k, &q4);
	weight_free(&r, &k, &q6);
	weight_free(&r, &k, &q4b);
	free(xv);
	variant_close(&r, &k);
}
