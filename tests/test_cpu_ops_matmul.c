/*
 * The reference cpu plugin's get_rows and mul_mat over every weight type it
 * supports, against float64 from the exact values of blocks packed from
 * chosen codes (ggml's layouts). Shared set-up: tests/cpu_ops_helpers.h.
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
