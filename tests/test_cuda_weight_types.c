/*
 * The cuda backend's built-in kernels for every weight type q4khost runs,
 * against gguf-py: the blocks of tests/fixtures/dequant-blocks.txt
 * (scripts/gen-blocks-fixture.py), each with gguf-py's dequantized values.
 *  - supports_type names exactly the types q4khost runs (weight_types.c);
 *  - get_rows gives gguf-py's values bit for bit, times the scale rounded
 *    once;
 *  - mul_mat, through each of its kernels (the GEMV format of each type in
 *    cuda_gemv_formats.cuh; the plain kernel of cuda_matmul.cu, which takes
 *    columns the GEMV's 16-byte activation loads cannot read; the tensor
 *    cores of sdk/lib/cuda_tc.cu from 17 columns on), is within
 *    product_bounds.h's bound of the float64 product of gguf-py's values,
 *    element by element.
 * Rows of the fixture are tiled (each row's blocks repeated along K, the
 * rows cycled) so that a warp's lanes walk several groups of a row and a
 * launch has many rows. The first two tests run everywhere; the others skip
 * without a CUDA device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks_fixture.h"
#include "cuda_rig.h"
#include "helpers.h"
#include "product_bounds.h"
#include "q4khost/quant.h"
#include "weight_types.h"

#define TC_COLUMNS 17 /* Q4KH_TC_MIN_COLUMNS (sdk/include/q4khost/cuda_tc.h) */
#define TILE_K 9      /* each fixture row's blocks, repeated along K */
#define TILE_N 37     /* rows of the tiled weight */

TestSuite(cuda_weight_types, .timeout = 600);

Test(cuda_weight_types, supports_every_type_q4khost_runs)
{
	struct q4kh_registry *reg = scan();
	const struct q4kh_plugin *p = find_plugin(reg, "cuda");
	const struct q4kh_backend_v1 *b = p->desc->backend;
	q4kh_backend_ctx *ctx;

	cr_assert_eq(b->init(&p->api, &ctx), Q4KH_OK, "%s", b->last_error(NULL));
	for (uint32_t t = 0; t < Q4KH_TYPE_COUNT + 60; t++)
		cr_expect_eq(b->supports_type(ctx, t), q4kh_weight_type_supported(t),
		             "type %u (%s)", t, q4kh_type_name(t));
	b->shutdown(ctx);
	q4kh_registry_free(reg);
}

/*
 * The premise of the bounds: no gguf-py value exceeds its group's range
 * s_g, and the ranges are no looser than the formats make them (some
 * value reaches a quarter of its group's: Q4_1's d q + m with m = -7.5 d
 * reaches a third). Needs no GPU.
 */
Test(cuda_weight_types, every_value_within_its_groups_range)
{
	struct blocks_fixture bf;

	blocks_fixture_load(&bf);
	cr_assert_eq(bf.n, 15, "the fixture has %zu types, q4khost runs 15", bf.n);
	for (size_t i = 0; i < bf.n; i++) {
		const struct blocks_tensor *b = &bf.t[i];
		double *s = group_ranges(b->type, b->bytes, b->ne0, b->rows), reach = 0;

		for (int64_t v = 0; v < b->ne0 * b->rows; v++) {
			const double a = fabs((double)b->values[v]), sg = s[v / BOUND_GROUP];

			cr_assert_leq(a, sg, "%s value %lld: |%g| above its group's range %g",
			              b->name, (long long)v, a, sg);
			if (sg > 0)
				reach = fmax(reach, a / sg);
		}
		cr_expect_geq(reach, 0.25, "%s: no value reaches a quarter of its range (%g)",
		              b->name, reach);
		free(s);
	}
	blocks_fixture_free(&bf);
}

/* B tiled: TILE_N rows of TILE_K * ne0 values, row r being fixture row
 * r % rows with its blocks repeated TILE_K times; bytes and values. */
struct tiled {
	int64_t k, n;
	uint8_t *bytes;
	double *values;
};

static struct tiled tile(const struct blocks_tensor *b)
{
	struct tiled t = { b->ne0 * TILE_K, TILE_N, NULL, NULL };

	t.bytes = malloc(b->row_bytes * TILE_K * TILE_N);
	t.values = malloc(sizeof(double) * (size_t)(t.k * t.n));
	cr_assert(t.bytes && t.values);
	for (int64_t r = 0; r < t.n; r++)
		for (int64_t c = 0; c < TILE_K; c++) {
			const int64_t src = r % b->rows;

			memcpy(t.bytes + (size_t)(r * TILE_K + c) * b->row_bytes,
			       b->bytes + (size_t)src * b->row_bytes, b->row_bytes);
			for (int64_t v = 0; v < b->ne0; v++)
				t.values[r * t.k + c * b->ne0 + v] = b->values[src * b->ne0 + v];
		}
	return t;
}

static void untile(struct tiled *t)
{
	free(t->bytes);
	free(t->values);
}

Test(cuda_weight_types, get_rows_gives_gguf_py_values)
{
	static const float scales[] = { 1.0f, 0.75f };
	struct blocks_fixture bf;
	struct rig *r = rig_open();

	blocks_fixture_load(&bf);
	for (size_t i = 0; i < bf.n; i++) {
		struct tiled t = tile(&bf.t[i]);
		const int32_t ids[5] = { 0, TILE_N - 1, 5, 5, 1 };
		struct twin w = twin_new(r, bf.t[i].type, t.k, t.n, 1, 0, t.bytes);

		for (size_t s = 0; s < sizeof(scales) / sizeof(scales[0]); s++) {
			struct twin o = twin_new(r, Q4KH_TYPE_F32, t.k, 5, 1, 16, NULL);
			double *want = malloc(sizeof(double) * (size_t)(5 * t.k));
			char what[96];

			cr_assert_not_null(want);
			for (int64_t c = 0; c < 5; c++)
				for (int64_t v = 0; v < t.k; v++)
					want[c * t.k + v] = (float)(t.values[ids[c] * t.k + v] * scales[s]);
			cr_assert_eq(V(r, GPU)->get_rows(DEV(r, GPU), &w.t[GPU], ids, 5, scales[s],
			                                 &o.t[GPU]),
			             Q4KH_OK, "%s: %s", bf.t[i].name, ERR(r, GPU));
			snprintf(what, sizeof(what), "get_rows %s K=%lld scale %g", bf.t[i].name,
			         (long long)t.k, scales[s]);
			/* NMSE 0: every element gguf-py's value times the scale, one rounding */
			expect_near(r, what, &o, want, 0.0);
			free(want);
			twin_free(r, &o);
		}
		twin_free(r, &w);
		untile(&t);
	}
	blocks_fixture_free(&bf);
	rig_close(r);
}

/* y = w x of T columns on the cuda backend, x's columns XPAD bytes apart
 * beyond K values, every element within its bound of the float64 product
 * of gguf-py's values; the largest error over its bound. */
static double check_product(struct rig *r, const struct blocks_tensor *b,
                            const struct tiled *t, const struct twin *w, const double *s,
                            int64_t cols, int64_t xpad)
{
	const int tc = cols >= TC_COLUMNS && q4kh_type_block_elems(b->type) > 1;
	const int plain = !tc && cols > 1 && xpad % 16;
	const int64_t groups = t->k / BOUND_GROUP;
	float *xv = rvals((size_t)(t->k * cols));
	struct twin xt = twin_new(r, Q4KH_TYPE_F32, t->k, cols, 1, xpad, xv);
	struct twin yt = twin_new(r, Q4KH_TYPE_F32, t->n, cols, 1, 12, NULL);
	double *want = malloc(sizeof(double) * (size_t)(t->n * cols)), *got, worst = 0;
	double *ax = malloc(sizeof(double) * (size_t)groups);
	char what[128];

	cr_assert(want && ax);
	cr_assert_eq(V(r, GPU)->mul_mat(DEV(r, GPU), &w->t[GPU], &xt.t[GPU], &yt.t[GPU]),
	             Q4KH_OK, "%s: %s", b->name, ERR(r, GPU));
	for (int64_t c = 0; c < cols; c++)
		for (int64_t n = 0; n < t->n; n++) {
			double sum = 0;

			for (int64_t v = 0; v < t->k; v++)
				sum += t->values[n * t->k + v] * (double)xv[c * t->k + v];
			want[c * t->n + n] = sum;
		}
	snprintf(what, sizeof(what), "mul_mat %s K=%lld N=%lld T=%lld (%s)", b->name,
	         (long long)t->k, (long long)t->n, (long long)cols,
	         tc ? "tensor cores" : plain ? "plain kernel" : "fp32 GEMV");
	/* written, nothing else touched; then each element's bound */
	expect_near(r, what, &yt, want, NMSE_BOUND);
	got = twin_values(r, &yt, GPU);
	for (int64_t c = 0; c < cols; c++) {
		const float *x = xv + c * t->k;
		double xsum = 0;

		for (int64_t g = 0; g < groups; g++) {
			ax[g] = 0;
			for (int64_t v = g * BOUND_GROUP; v < (g + 1) * BOUND_GROUP; v++)
				ax[g] += fabs((double)x[v]);
			xsum += ax[g];
		}
		for (int64_t n = 0; n < t->n; n++) {
			const double e = fabs(got[c * t->n + n] - want[c * t->n + n]);
			double S = 0, bound;

			for (int64_t g = 0; g < groups; g++)
				S += s[n * groups + g] * ax[g];
			bound = tc ? tc_bound(t->k, S, xsum) : gemv_bound(t->k, S);
			cr_assert_leq(e, bound, "%s: y[%lld, %lld] = %.9g, float64 %.9g: error %.3g "
			              "> bound %.3g", what, (long long)n, (long long)c,
			              got[c * t->n + n], want[c * t->n + n], e, bound);
			worst = fmax(worst, e / bound);
		}
	}
	free(got);
	free(ax);
	free(want);
	free(xv);
	twin_free(r, &xt);
	twin_free(r, &yt);
	return worst;
}

/*
 * 1 to 9 columns (the GEMV's passes of 1, 2, 4 and 8, a tile beyond),
 * 16 (the last below the tensor cores) and 17, 33 (on them: quantised
 * types only; F32, F16 and BF16 stay on fp32); 2 and 9 columns also 4
 * bytes apart beyond K, which only the plain kernel reads.
 */
Test(cuda_weight_types, mul_mat_within_bounds_of_gguf_py_values)
{
	static const int64_t cols[] = { 1, 2, 3, 4, 5, 8, 9, 16, 17, 33 };
	struct blocks_fixture bf;
	struct rig *r = rig_open();

	rng_seed(31);
	blocks_fixture_load(&bf);
	for (size_t i = 0; i < bf.n; i++) {
		struct tiled t = tile(&bf.t[i]);
		struct twin w = twin_new(r, bf.t[i].type, t.k, t.n, 1, 0, t.bytes);
		double *s = group_ranges(bf.t[i].type, t.bytes, t.k, t.n), worst = 0;

		for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++)
			worst = fmax(worst, check_product(r, &bf.t[i], &t, &w, s, cols[c], 32));
		worst = fmax(worst, check_product(r, &bf.t[i], &t, &w, s, 2, 4));
		worst = fmax(worst, check_product(r, &bf.t[i], &t, &w, s, 9, 4));
		cr_log_info("%s: largest error %.3g of its bound", bf.t[i].name, worst);
		free(s);
		twin_free(r, &w);
		untile(&t);
	}
	blocks_fixture_free(&bf);
	rig_close(r);
}
