/*
 * The cuda backend's mixture-of-experts entries (ABI 1.7: moe_route,
 * mul_mat_id) against the reference cpu plugin (cuda_rig.h), on a device;
 * every test skips without one.
 *  - moe_route: the cpu's expert ids exactly (ties to the lower index,
 *    a NaN column to the lowest indices), its weights within one float
 *    rounding (the sums' order differs: double, then one rounding);
 *  - mul_mat_id of every weight type cuda takes, direct (a decode's few
 *    columns) and grouped on the device (a prompt's), x one input a token
 *    or one a slot: each element of y within product_bounds.h's fp32 GEMV
 *    bound of the cpu's (the grouped products never take the tensor
 *    cores), nothing outside y written;
 *  - an id out of range fails at the next synchronisation, naming it.
 * The tiny qwen3moe model end to end on cuda: test_cuda_archs (against
 * llama.cpp and float64) and test_cuda_graph (the graph entry).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rig.h"
#include "product_bounds.h"

static const uint32_t weight_types[] = {
	Q4KH_TYPE_F32,  Q4KH_TYPE_F16,  Q4KH_TYPE_BF16, Q4KH_TYPE_Q4_0,   Q4KH_TYPE_Q4_1,
	Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q2_K,   Q4KH_TYPE_Q3_K,
	Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS,
};
#define N_WEIGHT_TYPES (sizeof(weight_types) / sizeof(weight_types[0]))

/* Side S's bytes of tensor T's view, rows packed; free() them. */
static uint8_t *download_rows(struct rig *r, const struct q4kh_tensor *t, int s)
{
	const size_t rb = row_bytes(t->type, t->ne[0]);
	uint8_t *out = malloc(rb * (size_t)(t->ne[1] * t->ne[2]));

	cr_assert_not_null(out);
	for (int64_t i = 0; i < t->ne[1] * t->ne[2]; i++)
		cr_assert_eq(V(r, s)->buffer_download(DEV(r, s), t->buffer,
		                                      t->offset + (uint64_t)(i * t->nb[1]),
		                                      out + (size_t)i * rb, rb),
		             Q4KH_OK, "%s", ERR(r, s));
	return out;
}

/*
 * moe_route of T columns of E logits, K chosen, both ways: random logits,
 * column 1 with every value twice (ties), column 2 all NaN.
 */
static void route_case(struct rig *r, int64_t e, int64_t k, int64_t t, int32_t norm)
{
	float *l = rvals((size_t)(e * t));
	struct twin lt, ids, w;
	int32_t *ic, *ig;
	float *wc, *wg;

	for (int64_t i = 0; t > 2 && i < e; i++) {
		l[e + i] = (float)((i / 2) % 5) * 0.5f;
		l[2 * e + i] = NAN;
	}
	lt = twin_new(r, Q4KH_TYPE_F32, e, t, 1, 12, l);
	ids = twin_new(r, Q4KH_TYPE_I32, k, t, 1, 8, NULL);
	w = twin_new(r, Q4KH_TYPE_F32, k, t, 1, 4, NULL);
	BOTH(r, moe_route(DEV(r, s_), T(lt), norm, T(ids), T(w)));
	cr_assert_eq(V(r, GPU)->synchronize(DEV(r, GPU)), Q4KH_OK, "%s", ERR(r, GPU));
	ic = (int32_t *)download_rows(r, &ids.t[REF], REF);
	ig = (int32_t *)download_rows(r, &ids.t[GPU], GPU);
	wc = (float *)download_rows(r, &w.t[REF], REF);
	wg = (float *)download_rows(r, &w.t[GPU], GPU);
	for (int64_t i = 0; i < k * t; i++) {
		cr_assert_eq(ig[i], ic[i], "E %lld, k %lld: column %lld slot %lld: expert %d, cpu %d",
		             (long long)e, (long long)k, (long long)(i / k), (long long)(i % k),
		             ig[i], ic[i]);
		cr_assert(isnan(wc[i]) ? isnan(wg[i]) : fabsf(wg[i] - wc[i]) <= ldexpf(fabsf(wc[i]), -23),
		          "E %lld, k %lld: column %lld slot %lld: weight %.9g, cpu %.9g",
		          (long long)e, (long long)k, (long long)(i / k), (long long)(i % k),
		          wg[i], wc[i]);
	}
	free(ic);
	free(ig);
	free(wc);
	free(wg);
	twin_free(r, &lt);
	twin_free(r, &ids);
	twin_free(r, &w);
	free(l);
}

Test(cuda_moe, route_as_the_cpu, .timeout = 120)
{
	struct rig *r = rig_open();

	rng_seed(31);
	route_case(r, 8, 2, 5, 1);
	route_case(r, 8, 8, 3, 0);
	route_case(r, 128, 8, 1, 1);
	route_case(r, 128, 8, 37, 1);
	route_case(r, 1500, 3, 4, 0);
	rig_close(r);
}

/* Random expert ids {S, T}: distinct in a token, expert 1 in every token
 * (several tiles of it when grouped), expert E - 1 in none. */
static int32_t *random_ids(int64_t e, int64_t s, int64_t t)
{
	int32_t *ids = malloc(sizeof(*ids) * (size_t)(s * t));

	cr_assert_not_null(ids);
	for (int64_t tt = 0; tt < t; tt++)
		for (int64_t j = 0; j < s; j++) {
			int32_t x;
			int fresh;

			do {
				x = j == tt % s ? 1 : (int32_t)irand(0, e - 2);
				fresh = 1;
				for (int64_t i = 0; i < j; i++)
					fresh &= ids[tt * s + i] != x;
				fresh &= j == tt % s || x != 1;
			} while (!fresh);
			ids[tt * s + j] = x;
		}
	return ids;
}

/*
 * mul_mat_id of E experts {K, N} of TYPE, S slots of T tokens, x of X
 * columns a token, both ways; each element of y within the GEMV bound of
 * the cpu's. Returns the worst error over its bound.
 */
static double product_case(struct rig *r, uint32_t type, int64_t e, int64_t k, int64_t n,
                           int64_t s, int64_t t, int64_t xn)
{
	uint8_t *bytes = random_weights(type, k, n * e);
	double *range = group_ranges(type, bytes, k, n * e), worst = 0;
	int32_t *id = random_ids(e, s, t);
	float *xv = rvals((size_t)(k * xn * t));
	struct twin w = twin_new(r, type, k, n, e, 0, bytes);
	struct twin x = twin_new(r, Q4KH_TYPE_F32, k, xn, t, 16, xv);
	struct twin ids = twin_new(r, Q4KH_TYPE_I32, s, t, 1, 4, id);
	struct twin y = twin_new(r, Q4KH_TYPE_F32, n, s, t, 12, NULL);
	const int64_t groups = k / BOUND_GROUP;
	double *yc, *yg;
	char what[96];

	snprintf(what, sizeof(what), "mul_mat_id %s E %lld K %lld N %lld k %lld T %lld X %lld",
	         q4kh_type_name(type), (long long)e, (long long)k, (long long)n, (long long)s,
	         (long long)t, (long long)xn);
	BOTH(r, mul_mat_id(DEV(r, s_), T(w), T(x), T(ids), T(y)));
	cr_assert_eq(V(r, GPU)->synchronize(DEV(r, GPU)), Q4KH_OK, "%s: %s", what, ERR(r, GPU));
	/* every element written, nothing beside them, and near the cpu's */
	expect_agree(r, what, &y, NMSE_BOUND);
	yc = twin_values(r, &y, REF);
	yg = twin_values(r, &y, GPU);
	for (int64_t c = 0; c < s * t; c++) {
		const float *xc = xv + (c / s * xn + c % s % xn) * k;

		for (int64_t row = 0; row < n; row++) {
			const double *rg = range + (id[c] * n + row) * groups;
			const double got = yg[c * n + row], want = yc[c * n + row];
			double S = 0, bound;

			for (int64_t g = 0; g < groups; g++)
				for (int64_t i = g * BOUND_GROUP; i < (g + 1) * BOUND_GROUP; i++)
					S += rg[g] * fabs(xc[i]);
			bound = gemv_bound(k, S);
			cr_assert(fabs(got - want) <= bound,
			          "%s: y[%lld, %lld, %lld] (expert %d) = %.9g, cpu %.9g: error %.3g "
			          "> bound %.3g", what, (long long)row, (long long)(c % s),
			          (long long)(c / s), id[c], got, want, fabs(got - want), bound);
			worst = fmax(worst, fabs(got - want) / bound);
		}
	}
	free(yc);
	free(yg);
	twin_free(r, &w);
	twin_free(r, &x);
	twin_free(r, &ids);
	twin_free(r, &y);
	free(bytes);
	free(range);
	free(id);
	free(xv);
	return worst;
}

/* A row length of a few units of every type's blocks. */
static int64_t row_length(uint32_t type)
{
	return q4kh_type_block_elems(type) == 256 ? 768 : 640;
}

Test(cuda_moe, mul_mat_id_within_the_gemv_bound, .timeout = 300)
{
	struct rig *r = rig_open();

	rng_seed(32);
	for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
		const uint32_t type = weight_types[i];
		const int64_t k = row_length(type);
		double worst = 0;

		/* decode: one token, direct; a few tokens, direct; a prompt,
		 * grouped (k T >= 2 E), x a token's or a slot's */
		worst = fmax(worst, product_case(r, type, 8, k, 37, 2, 1, 1));
		worst = fmax(worst, product_case(r, type, 8, k, 37, 3, 3, 3));
		worst = fmax(worst, product_case(r, type, 8, k, 37, 2, 29, 1));
		worst = fmax(worst, product_case(r, type, 6, k, 21, 3, 17, 3));
		cr_log_info("mul_mat_id %s: worst error %.3g of the GEMV bound",
		            q4kh_type_name(type), worst);
	}
	rig_close(r);
}

/* Qwen3-30B-A3B's experts (Q4_K gate and up {2048, 768}, Q6_K down {768,
 * 2048}), 128 of them, 8 a token: a decode and a prompt of 64 tokens. */
Test(cuda_moe, mul_mat_id_at_qwen3_30b_a3b_shapes, .timeout = 300)
{
	struct rig *r = rig_open();

	rng_seed(33);
	product_case(r, Q4KH_TYPE_Q4_K, 128, 2048, 768, 8, 1, 1);
	product_case(r, Q4KH_TYPE_Q6_K, 128, 768, 2048, 8, 1, 8);
	product_case(r, Q4KH_TYPE_Q4_K, 128, 2048, 768, 8, 64, 1);
	product_case(r, Q4KH_TYPE_Q6_K, 128, 768, 2048, 8, 64, 8);
	rig_close(r);
}

/* An id out of range: the call is enqueued, the next synchronisation
 * fails naming the element; direct and grouped. */
Test(cuda_moe, bad_id_fails_at_the_next_sync, .timeout = 120)
{
	struct rig *r = rig_open();

	rng_seed(34);
	for (int64_t t = 1; t <= 20; t += 19) {
		uint8_t *bytes = random_weights(Q4KH_TYPE_Q4_K, 256, 5 * 8);
		float *xv = rvals((size_t)(256 * t));
		int32_t *id = random_ids(8, 2, t);
		struct twin w, x, ids, y;
		char want[64];

		id[2 * t - 1] = 8;
		w = twin_new(r, Q4KH_TYPE_Q4_K, 256, 5, 8, 0, bytes);
		x = twin_new(r, Q4KH_TYPE_F32, 256, 1, t, 0, xv);
		ids = twin_new(r, Q4KH_TYPE_I32, 2, t, 1, 0, id);
		y = twin_new(r, Q4KH_TYPE_F32, 5, 2, t, 0, NULL);
		cr_assert_eq(V(r, GPU)->mul_mat_id(DEV(r, GPU), &w.t[GPU], &x.t[GPU], &ids.t[GPU],
		                                   &y.t[GPU]),
		             Q4KH_OK, "%s", ERR(r, GPU));
		cr_assert_eq(V(r, GPU)->synchronize(DEV(r, GPU)), Q4KH_ERR_INVALID);
		snprintf(want, sizeof(want), "mul_mat_id ids[%lld] = 8, expected 0 .. 7",
		         (long long)(2 * t - 1));
		cr_assert(strstr(ERR(r, GPU), want), "T %lld: \"%s\", expected \"%s\"",
		          (long long)t, ERR(r, GPU), want);
		/* the fault is cleared: the next sync succeeds */
		cr_assert_eq(V(r, GPU)->synchronize(DEV(r, GPU)), Q4KH_OK, "%s", ERR(r, GPU));
		twin_free(r, &w);
		twin_free(r, &x);
		twin_free(r, &ids);
		twin_free(r, &y);
		free(bytes);
		free(xv);
		free(id);
	}
	rig_close(r);
}
