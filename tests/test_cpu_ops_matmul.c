/*
 * The reference cpu plugin's get_rows and mul_mat over every weight type it
 * supports, against float64 from the exact values of blocks packed from
 * chosen codes (ggml's layouts), and its mixture-of-experts ops (moe_route,
 * mul_mat_id) against their definitions. Shared set-up:
 * tests/cpu_ops_helpers.h.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops_helpers.h"

/* --- get_rows and mul_mat over every type -------------------------------- */

Test(cpu_ops, get_rows_every_type)
{
	struct env *e = env_open("2");
	const int32_t ids[] = { 3, 0, 4, 3, 1 };
	const float scale = 1.75f;

	rng_state = 11;
	for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++) {
		uint32_t type = all_types[ti];
		double *exact;
		struct q4kh_tensor w = make_weight(e, type, 512, 5, &exact);
		struct q4kh_tensor out = f32_tensor(e, 512, 5, 1, NULL);
		float *got;

		cr_assert_eq(e->b->get_rows(e->dev, &w, ids, 5, scale, &out), Q4KH_OK,
		             "%s", e->b->last_error(e->ctx));
		got = fetch(e, &out);
		/* Exact: every block value is one rounding of its definition. */
		for (int i = 0; i < 5; i++)
			for (int k = 0; k < 512; k++) {
				float want = (float)exact[ids[i] * 512 + k] * scale;

				cr_assert(got[i * 512 + k] == want,
				          "%s row %d [%d] = %.9g, expected %.9g",
				          q4kh_type_name(type), ids[i], k,
				          (double)got[i * 512 + k], (double)want);
			}
		free(got);
		free(exact);
		drop(e, &w);
		drop(e, &out);
	}
	env_close(e);
}

/* y = w x in float64 from the exact weights; tol from sum |w x|. */
static void check_mul_mat(struct env *e, uint32_t type, int64_t k, int64_t n,
                          int64_t t)
{
	double *exact, *want = malloc(sizeof(double) * (size_t)(n * t));
	double *mag = malloc(sizeof(double) * (size_t)(n * t));
	struct q4kh_tensor w = make_weight(e, type, k, n, &exact);
	float *xv = random_floats((size_t)(k * t));
	/* Padded rows: strides must be honoured. */
	struct q4kh_tensor x = make_tensor(e, Q4KH_TYPE_F32, k, t, 1, xv, 64);
	struct q4kh_tensor y = make_tensor(e, Q4KH_TYPE_F32, n, t, 1, NULL, 32);
	float *got;

	for (int64_t c = 0; c < t; c++)
		for (int64_t r = 0; r < n; r++) {
			double s = 0, m = 0;

			for (int64_t i = 0; i < k; i++) {
				s += exact[r * k + i] * xv[c * k + i];
				m += fabs(exact[r * k + i] * xv[c * k + i]);
			}
			want[c * n + r] = s;
			mag[c * n + r] = m;
		}
	cr_assert_eq(e->b->mul_mat(e->dev, &w, &x, &y), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &y);
	for (int64_t i = 0; i < n * t; i++) {
		cr_assert(!isnan(got[i]), "%s y[%lld] not written",
		          q4kh_type_name(type), (long long)i);
		cr_assert(fabs(got[i] - want[i]) <= 1e-6 * mag[i] + 1e-30,
		          "%s K=%lld T=%lld y[%lld] = %.9g, expected %.9g",
		          q4kh_type_name(type), (long long)k, (long long)t,
		          (long long)i, (double)got[i], want[i]);
	}
	free(got);
	free(xv);
	free(exact);
	free(want);
	free(mag);
	drop(e, &w);
	drop(e, &x);
	drop(e, &y);
}

Test(cpu_ops, mul_mat_every_type)
{
	struct env *e = env_open("3");
	const int64_t ts[] = { 1, 3, 7 };

	rng_state = 12;
	for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++)
		for (size_t i = 0; i < 3; i++)
			check_mul_mat(e, all_types[ti], 512, 19, ts[i]);
	/* Lengths that leave a tail after the 8 accumulator lanes. */
	check_mul_mat(e, Q4KH_TYPE_F32, 37, 11, 5);
	check_mul_mat(e, Q4KH_TYPE_F16, 13, 9, 4);
	/* Every edge of the blocking: K in three slices of 512 and a tail,
	 * rows past a block of 32 and between register tiles, columns past
	 * a block of 128 and between tiles. */
	check_mul_mat(e, Q4KH_TYPE_F32, 1029, 37, 133);
	check_mul_mat(e, Q4KH_TYPE_Q4_K, 1280, 35, 130);
	env_close(e);
}

/*
 * Bit for bit, the order of sums the plugin states (ref_lanes_dot): F32
 * weights are exact in double, so y follows from that order alone. At
 * every edge of the blocking (K in slices of 512 and a tail, rows past a
 * block of 32, columns past a block of 128), a K shorter than the 8
 * lanes, and Gemma 3's 640. Products of two floats are exact in double,
 * so on plain inputs another order hardly shows in float: every 32nd
 * activation is 2^30 times larger and the one 16 on (the same lane) its
 * negation, with equal weights, so that the two products cancel and the
 * terms summed between them round to their grain. Each vector width of
 * the plugin's tiles must give the same bits.
 */
Test(cpu_ops, mul_mat_sums_in_its_stated_order)
{
	struct env *e = env_open("2");
	const int64_t shapes[][3] = { { 1029, 37, 133 }, { 5, 3, 2 }, { 640, 9, 6 } };

	rng_state = 14;
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int64_t k = shapes[s][0], n = shapes[s][1], t = shapes[s][2];
		float *wv = random_floats((size_t)(k * n)), *xv = random_floats((size_t)(k * t));
		double *xd = malloc(sizeof(double) * (size_t)(k * t));
		struct q4kh_tensor w, x, y = f32_tensor(e, n, t, 1, NULL);
		float *got;

		for (int64_t i = 3; i + 16 < k; i += 32) {
			for (int64_t c = 0; c < t; c++) {
				xv[c * k + i] *= 0x1p30f;
				xv[c * k + i + 16] = -xv[c * k + i];
			}
			for (int64_t r = 0; r < n; r++)
				wv[r * k + i + 16] = wv[r * k + i];
		}
		w = f32_tensor(e, k, n, 1, wv);
		x = f32_tensor(e, k, t, 1, xv);
		for (int64_t i = 0; i < k * t; i++)
			xd[i] = xv[i];
		cr_assert_eq(e->b->mul_mat(e->dev, &w, &x, &y), Q4KH_OK, "%s",
		             e->b->last_error(e->ctx));
		got = fetch(e, &y);
		for (int64_t c = 0; c < t; c++)
			for (int64_t r = 0; r < n; r++) {
				const float want = (float)ref_lanes_dot(wv + r * k, xd + c * k, k);

				cr_assert(got[c * n + r] == want,
				          "K=%lld N=%lld T=%lld y[%lld, %lld] = %.9g, expected "
				          "%.9g (the stated order)", (long long)k, (long long)n,
				          (long long)t, (long long)r, (long long)c,
				          (double)got[c * n + r], (double)want);
			}
		free(got);
		free(wv);
		free(xv);
		free(xd);
		drop(e, &w);
		drop(e, &x);
		drop(e, &y);
	}
	env_close(e);
}

/* Column t of y must not depend on what else is in the batch. */
Test(cpu_ops, mul_mat_column_independent_of_batch)
{
	struct env *e = env_open("2");
	double *exact;
	struct q4kh_tensor w, x7, x1, y7, y1;
	float *xv, *g7, *g1;

	rng_state = 13;
	/* 133 columns: column 130 is past a block of 128, alone in its tile */
	w = make_weight(e, Q4KH_TYPE_Q4_K, 1024, 29, &exact);
	xv = random_floats(1024 * 133);
	x7 = f32_tensor(e, 1024, 133, 1, xv);
	x1 = f32_tensor(e, 1024, 1, 1, xv + 1024 * 130);
	y7 = f32_tensor(e, 29, 133, 1, NULL);
	y1 = f32_tensor(e, 29, 1, 1, NULL);
	cr_assert_eq(e->b->mul_mat(e->dev, &w, &x7, &y7), Q4KH_OK);
	cr_assert_eq(e->b->mul_mat(e->dev, &w, &x1, &y1), Q4KH_OK);
	g7 = fetch(e, &y7);
	g1 = fetch(e, &y1);
	cr_assert_arr_eq(g1, g7 + 29 * 130, 29 * sizeof(float));
	free(g7);
	free(g1);
	free(xv);
	free(exact);
	drop(e, &w);
	drop(e, &x7);
	drop(e, &x1);
	drop(e, &y7);
	drop(e, &y1);
	env_close(e);
}

/* --- the mixture-of-experts ops (ABI 1.7) -------------------------------- */

/* moe_route of one column in double, from plugin.h's definition. */
static void route_ref(const float *l, int e, int k, int norm, int32_t *ids, double *w)
{
	double p[16], max = l[0], sum = 0.0, chosen = 0.0;
	int taken[16] = { 0 };

	for (int i = 1; i < e; i++)
		max = fmax(max, l[i]);
	for (int i = 0; i < e; i++)
		sum += p[i] = exp((double)l[i] - max);
	for (int j = 0; j < k; j++) {
		int best = -1;

		for (int i = 0; i < e; i++)
			if (!taken[i] && (best < 0 || p[i] > p[best]))
				best = i;
		taken[best] = 1;
		ids[j] = best;
		w[j] = p[best] / sum;
		chosen += w[j];
	}
	for (int j = 0; norm && j < k; j++)
		w[j] /= fmax(chosen, ldexp(1.0, -14));
}

/* Random logits with ties (columns 1 and 3: equal values where the
 * choice is made), norm on and off; weights within one rounding. */
Test(cpu_ops, moe_route_matches_its_definition)
{
	enum { E = 8, K = 3, T = 5 };
	/* column 3: two equal largest, then a tie at the edge of the three */
	static const float col3[E] = { 1.5f, 0.99f, 0.2f, -0.3f, 0.99f, 0.1f, -1.0f, 1.5f };
	struct env *e = env_open("2");
	float *l;

	rng_state = 21;
	l = random_floats(E * T);
	l[1 * E + 2] = l[1 * E + 6] = 2.0f; /* first and second, tied */
	memcpy(l + 3 * E, col3, sizeof(col3));
	for (int norm = 0; norm < 2; norm++) {
		struct q4kh_tensor lt = f32_tensor(e, E, T, 1, l);
		struct q4kh_tensor ids = make_tensor(e, Q4KH_TYPE_I32, K, T, 1, NULL, 8);
		struct q4kh_tensor w = make_tensor(e, Q4KH_TYPE_F32, K, T, 1, NULL, 4);
		int32_t got_ids[K * T + 2];
		float *got_w;

		cr_assert_eq(e->b->moe_route(e->dev, &lt, norm, &ids, &w), Q4KH_OK, "%s",
		             e->b->last_error(e->ctx));
		got_w = fetch(e, &w);
		for (int t = 0; t < T; t++) {
			int32_t want_ids[K];
			double want_w[K];

			cr_assert_eq(e->b->buffer_download(e->dev, ids.buffer, (uint64_t)(t * ids.nb[1]),
			                                   got_ids + t * K, sizeof(int32_t) * K),
			             Q4KH_OK);
			route_ref(l + t * E, E, K, norm, want_ids, want_w);
			for (int j = 0; j < K; j++) {
				cr_expect_eq(got_ids[t * K + j], want_ids[j],
				             "norm %d column %d slot %d: expert %d, expected %d", norm, t,
				             j, got_ids[t * K + j], want_ids[j]);
				cr_expect(fabs(got_w[t * K + j] - want_w[j]) <= 0x1p-24 * want_w[j],
				          "norm %d column %d slot %d: weight %.9g, expected %.9g", norm,
				          t, j, (double)got_w[t * K + j], want_w[j]);
			}
		}
		/* the tie at the edge goes to the lower index, expert 1 */
		cr_expect_eq(got_ids[3 * K + 2], 1);
		free(got_w);
		drop(e, &lt);
		drop(e, &ids);
		drop(e, &w);
	}
	free(l);
	env_close(e);
}

/* A stack {K, N, E} of TYPE over one weight {K, N E}: its exact values too. */
static struct q4kh_tensor make_stack(struct env *e, uint32_t type, int64_t k, int64_t n,
                                     int64_t experts, double **exact)
{
	struct q4kh_tensor w = make_weight(e, type, k, n * experts, exact);

	w.ne[1] = n;
	w.ne[2] = experts;
	w.nb[2] = w.nb[1] * n;
	w.nb[3] = w.nb[2] * experts;
	return w;
}

/*
 * Each slot's product is the chosen expert's, in float64 from the exact
 * weights, and bit for bit mul_mat's of that expert and column; with one
 * input per token (X = 1, gate and up) and one per slot (X = k, down).
 */
Test(cpu_ops, mul_mat_id_is_each_experts_mul_mat)
{
	enum { KD = 512, N = 19, E = 4, S = 2, T = 5 };
	static const int32_t route[S * T] = { 2, 0, 3, 2, 1, 1, 0, 3, 2, 1 };
	struct env *e = env_open("3");
	double *exact;
	struct q4kh_tensor w, ids;

	rng_state = 22;
	w = make_stack(e, Q4KH_TYPE_Q4_K, KD, N, E, &exact);
	ids = make_tensor(e, Q4KH_TYPE_I32, S, T, 1, route, 0);
	for (int x_slots = 1; x_slots <= S; x_slots++) {
		float *xv = random_floats((size_t)(KD * x_slots * T)), *got;
		struct q4kh_tensor x = make_tensor(e, Q4KH_TYPE_F32, KD, x_slots, T, xv, 64);
		struct q4kh_tensor y = make_tensor(e, Q4KH_TYPE_F32, N, S, T, NULL, 32);

		cr_assert_eq(e->b->mul_mat_id(e->dev, &w, &x, &ids, &y), Q4KH_OK, "%s",
		             e->b->last_error(e->ctx));
		got = fetch(e, &y);
		for (int t = 0; t < T; t++)
			for (int j = 0; j < S; j++) {
				const int32_t ex = route[t * S + j];
				const float *xc = xv + (t * x_slots + j % x_slots) * KD;
				struct q4kh_tensor we = w, xs = f32_tensor(e, KD, 1, 1, xc);
				struct q4kh_tensor ys = f32_tensor(e, N, 1, 1, NULL);
				float *one;

				we.offset += (uint64_t)(ex * w.nb[2]);
				we.ne[2] = 1;
				cr_assert_eq(e->b->mul_mat(e->dev, &we, &xs, &ys), Q4KH_OK);
				one = fetch(e, &ys);
				for (int r = 0; r < N; r++) {
					double s = 0, m = 0;

					for (int i = 0; i < KD; i++) {
						s += exact[((int64_t)ex * N + r) * KD + i] * xc[i];
						m += fabs(exact[((int64_t)ex * N + r) * KD + i] * xc[i]);
					}
					cr_expect(fabs(got[(t * S + j) * N + r] - s) <= 1e-6 * m,
					          "X=%d token %d slot %d row %d: %.9g, expected %.9g",
					          x_slots, t, j, r, (double)got[(t * S + j) * N + r], s);
				}
				cr_expect_arr_eq(one, got + (t * S + j) * N, N * sizeof(float),
				                 "X=%d token %d slot %d: not mul_mat's bits", x_slots, t, j);
				free(one);
				drop(e, &xs);
				drop(e, &ys);
			}
		free(got);
		free(xv);
		drop(e, &x);
		drop(e, &y);
	}
	free(exact);
	drop(e, &w);
	drop(e, &ids);
	env_close(e);
}

Test(cpu_ops, moe_ops_refuse_bad_ids_and_shapes)
{
	static const int32_t bad[4] = { 0, 1, 1, 4 };
	struct env *e = env_open("1");
	double *exact;
	struct q4kh_tensor w, ids, x, y, x3, lt, w2;

	rng_state = 23;
	w = make_stack(e, Q4KH_TYPE_Q8_0, 64, 3, 4, &exact);
	ids = make_tensor(e, Q4KH_TYPE_I32, 2, 2, 1, bad, 0);
	x = f32_tensor(e, 64, 1, 2, NULL);
	x3 = f32_tensor(e, 64, 3, 2, NULL);
	y = f32_tensor(e, 3, 2, 2, NULL);
	lt = f32_tensor(e, 4, 2, 1, NULL);
	w2 = f32_tensor(e, 5, 2, 1, NULL);
	expect_status(e, e->b->mul_mat_id(e->dev, &w, &x, &ids, &y),
	              "mul_mat_id ids[1, 1] = 4, expected 0 .. 3");
	expect_status(e, e->b->mul_mat_id(e->dev, &w, &x3, &ids, &y),
	              "mul_mat_id x: ne[1] = 3, expected 1 or the 2 slots of ids");
	expect_status(e, e->b->moe_route(e->dev, &lt, 2, &ids, &y),
	              "moe_route weights: shape {3, 2, 2, 1}, expected {2, 2, 1, 1}");
	expect_status(e, e->b->moe_route(e->dev, &lt, 2, &ids, &lt),
	              "moe_route weights: shape {4, 2, 1, 1}, expected {2, 2, 1, 1}");
	w2.ne[0] = 2;
	expect_status(e, e->b->moe_route(e->dev, &lt, 2, &ids, &w2), "moe_route: norm 2");
	free(exact);
	drop(e, &w);
	drop(e, &ids);
	drop(e, &x);
	drop(e, &x3);
	drop(e, &y);
	drop(e, &lt);
	w2.ne[0] = 5;
	drop(e, &w2);
	env_close(e);
}
