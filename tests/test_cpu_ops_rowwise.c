/*
 * The reference cpu plugin's row-wise and elementwise ops against float64
 * references written here from their definitions: RMSNorm, RoPE, add and
 * mul with broadcast, scale, GELU/SiLU gated units, copies between F32 and
 * F16. Outputs are poisoned with NaN first so an element the plugin
 * forgets to write fails the test. Shared set-up: tests/cpu_ops_helpers.h.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops_helpers.h"

/* --- row-wise ops --------------------------------------------------------- */

static void check_rms_norm(struct env *e, int with_weight, int in_place)
{
	const int64_t n = 300, rows = 10;
	const float eps = 1e-6f;
	float *xv = random_floats((size_t)(n * rows)), *wv = random_floats(n);
	double *want = malloc(sizeof(double) * (size_t)(n * rows));
	struct q4kh_tensor x = f32_tensor(e, n, 5, 2, xv);
	struct q4kh_tensor w = f32_tensor(e, n, 1, 1, wv);
	struct q4kh_tensor out = in_place ? x : f32_tensor(e, n, 5, 2, NULL);
	float *got;

	for (int64_t r = 0; r < rows; r++) {
		double ss = 0;

		for (int64_t i = 0; i < n; i++)
			ss += (double)xv[r * n + i] * xv[r * n + i];
		for (int64_t i = 0; i < n; i++)
			want[r * n + i] = xv[r * n + i] / sqrt(ss / n + eps) *
			                  (with_weight ? wv[i] : 1.0);
	}
	cr_assert_eq(e->b->rms_norm(e->dev, &x, with_weight ? &w : NULL, eps, &out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	expect_close("rms_norm", got, want, (size_t)(n * rows), 4e-7, 0);
	free(got);
	free(xv);
	free(wv);
	free(want);
	if (!in_place)
		drop(e, &out);
	drop(e, &x);
	drop(e, &w);
}

Test(cpu_ops, rms_norm)
{
	struct env *e = env_open("2");

	rng_state = 21;
	check_rms_norm(e, 1, 0);
	check_rms_norm(e, 0, 0);
	check_rms_norm(e, 1, 1);
	env_close(e);
}

static void check_rope(struct env *e, q4kh_rope_mode mode)
{
	const int64_t hd = 64, nh = 3, T = 4;
	const int32_t n_rot = 48, pos[4] = { 0, 7, 100, 4095 };
	const double base = 10000.0, fs = 0.5;
	float *xv = random_floats((size_t)(hd * nh * T));
	double *want = malloc(sizeof(double) * (size_t)(hd * nh * T));
	struct q4kh_tensor x = f32_tensor(e, hd, nh, T, xv);
	struct q4kh_tensor out = f32_tensor(e, hd, nh, T, NULL);
	float *got;

	for (int64_t t = 0; t < T; t++)
		for (int64_t h = 0; h < nh; h++) {
			const float *v = xv + (t * nh + h) * hd;
			double *o = want + (t * nh + h) * hd;

			for (int64_t i = 0; i < hd; i++)
				o[i] = v[i];
			for (int i = 0; i < n_rot / 2; i++) {
				double th = fs * pos[t] * pow(base, -2.0 * i / n_rot);
				int a = mode == Q4KH_ROPE_NORM ? 2 * i : i;
				int b = mode == Q4KH_ROPE_NORM ? 2 * i + 1 : i + n_rot / 2;

				o[a] = v[a] * cos(th) - v[b] * sin(th);
				o[b] = v[a] * sin(th) + v[b] * cos(th);
			}
		}
	cr_assert_eq(e->b->rope(e->dev, &x, pos, n_rot, mode, (float)base,
	                        (float)fs, &out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	expect_close(mode == Q4KH_ROPE_NORM ? "rope NORM" : "rope NEOX", got, want,
	             (size_t)(hd * nh * T), 1e-7, 1e-7);
	/* In place gives the same. */
	cr_assert_eq(e->b->rope(e->dev, &x, pos, n_rot, mode, (float)base,
	                        (float)fs, &x),
	             Q4KH_OK);
	free(got);
	got = fetch(e, &x);
	expect_close("rope in place", got, want, (size_t)(hd * nh * T), 1e-7, 1e-7);
	free(got);
	free(xv);
	free(want);
	drop(e, &x);
	drop(e, &out);
}

Test(cpu_ops, rope_norm_and_neox)
{
	struct env *e = env_open("2");

	rng_state = 22;
	check_rope(e, Q4KH_ROPE_NORM);
	check_rope(e, Q4KH_ROPE_NEOX);
	env_close(e);
}

/* add or mul of a {33, 4, 3} with b broadcast to it. */
static void check_binary(struct env *e, int mul, int64_t b0, int64_t b1,
                         int64_t b2)
{
	const int64_t n0 = 33, n1 = 4, n2 = 3;
	float *av = random_floats((size_t)(n0 * n1 * n2));
	float *bv = random_floats((size_t)(b0 * b1 * b2));
	double *want = malloc(sizeof(double) * (size_t)(n0 * n1 * n2));
	struct q4kh_tensor a = f32_tensor(e, n0, n1, n2, av);
	struct q4kh_tensor b = f32_tensor(e, b0, b1, b2, bv);
	struct q4kh_tensor out = f32_tensor(e, n0, n1, n2, NULL);
	float *got;

	for (int64_t k = 0; k < n2; k++)
		for (int64_t j = 0; j < n1; j++)
			for (int64_t i = 0; i < n0; i++) {
				double x = av[(k * n1 + j) * n0 + i];
				double y = bv[((k % b2) * b1 + j % b1) * b0 + i % b0];

				/* Exact in double, so one rounding: IEEE f32. */
				want[(k * n1 + j) * n0 + i] = (float)(mul ? x * y : x + y);
			}
	cr_assert_eq((mul ? e->b->mul : e->b->add)(e->dev, &a, &b, &out), Q4KH_OK,
	             "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	expect_close(mul ? "mul" : "add", got, want, (size_t)(n0 * n1 * n2), 0, 0);
	free(got);
	/* out may alias a. */
	cr_assert_eq((mul ? e->b->mul : e->b->add)(e->dev, &a, &b, &a), Q4KH_OK);
	got = fetch(e, &a);
	expect_close("in place", got, want, (size_t)(n0 * n1 * n2), 0, 0);
	free(got);
	free(av);
	free(bv);
	free(want);
	drop(e, &a);
	drop(e, &b);
	drop(e, &out);
}

Test(cpu_ops, add_mul_broadcast)
{
	struct env *e = env_open("2");

	rng_state = 23;
	for (int mul = 0; mul < 2; mul++) {
		check_binary(e, mul, 33, 4, 3);
		check_binary(e, mul, 33, 1, 1);
		check_binary(e, mul, 1, 4, 1);
		check_binary(e, mul, 33, 1, 3);
		check_binary(e, mul, 1, 1, 1);
	}
	env_close(e);
}

Test(cpu_ops, scale)
{
	struct env *e = env_open("2");
	float *xv;
	double want[70 * 3];
	struct q4kh_tensor x, out;
	float *got;

	rng_state = 24;
	xv = random_floats(70 * 3);
	x = f32_tensor(e, 70, 3, 1, xv);
	out = f32_tensor(e, 70, 3, 1, NULL);
	for (int i = 0; i < 70 * 3; i++)
		want[i] = (float)((double)xv[i] * 0.3f);
	cr_assert_eq(e->b->scale(e->dev, &x, 0.3f, &out), Q4KH_OK);
	got = fetch(e, &out);
	expect_close("scale", got, want, 70 * 3, 0, 0);
	free(got);
	cr_assert_eq(e->b->scale(e->dev, &x, 0.3f, &x), Q4KH_OK);
	got = fetch(e, &x);
	expect_close("scale in place", got, want, 70 * 3, 0, 0);
	free(got);
	free(xv);
	drop(e, &x);
	drop(e, &out);
	env_close(e);
}

Test(cpu_ops, glu_gelu_tanh_and_silu)
{
	struct env *e = env_open("2");
	const int64_t n = 96, rows = 4;

	rng_state = 25;
	for (int kind = 0; kind < 2; kind++) {
		float *g = random_floats((size_t)(n * rows));
		float *u = random_floats((size_t)(n * rows));
		double want[96 * 4];
		struct q4kh_tensor gt, ut, out;
		float *got;

		for (int64_t i = 0; i < n * rows; i++) {
			double x;

			g[i] *= 6.0f; /* reach both tails: |g| up to 6 */
			if (i % 17 == 0)
				g[i] = i % 2 ? 12.5f : -12.5f;
			x = g[i];
			if (kind == Q4KH_GLU_GELU_TANH)
				want[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) *
				                               (x + 0.044715 * x * x * x))) *
				          u[i];
			else
				want[i] = x / (1.0 + exp(-x)) * u[i];
		}
		gt = f32_tensor(e, n, rows, 1, g);
		ut = f32_tensor(e, n, rows, 1, u);
		out = f32_tensor(e, n, rows, 1, NULL);
		cr_assert_eq(e->b->glu(e->dev, (q4kh_glu_kind)kind, &gt, &ut, &out),
		             Q4KH_OK, "%s", e->b->last_error(e->ctx));
		got = fetch(e, &out);
		expect_close(kind ? "silu" : "gelu_tanh", got, want,
		             (size_t)(n * rows), 1e-7, 1e-12);
		free(got);
		free(g);
		free(u);
		drop(e, &gt);
		drop(e, &ut);
		drop(e, &out);
	}
	env_close(e);
}

Test(cpu_ops, copy_f32_f16)
{
	struct env *e = env_open("2");
	const int64_t n = 40, rows = 6;
	float *src;
	uint16_t *half;
	struct q4kh_tensor s, h, back, cache;
	double want[40 * 6];
	float *got;
	uint8_t *raw;

	rng_state = 26;
	src = random_floats((size_t)(n * rows));
	/* Edges: ties, overflow to inf, subnormals, underflow to zero. */
	src[0] = 65520.0f;
	src[1] = 65504.0f;
	src[2] = 1.0f + 1.0f / 2048.0f;
	src[3] = 1e-7f;
	src[4] = -3e-8f;
	src[5] = 1e-9f;
	src[6] = 1.0f + 3.0f / 2048.0f;
	half = malloc(sizeof(uint16_t) * (size_t)(n * rows));
	for (int64_t i = 0; i < n * rows; i++) {
		half[i] = ref_to_half(src[i]);
		want[i] = ref_from_half(half[i]);
	}
	s = f32_tensor(e, n, rows, 1, src);
	/* Rows of a KV cache slot: strides wider than the rows. */
	h = make_tensor(e, Q4KH_TYPE_F16, n, rows, 1, NULL, 24);
	back = f32_tensor(e, n, rows, 1, NULL);
	cr_assert_eq(e->b->copy(e->dev, &s, &h), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	raw = malloc((size_t)(h.nb[1] * rows));
	cr_assert_eq(e->b->buffer_download(e->dev, h.buffer, 0, raw,
	                                   (uint64_t)(h.nb[1] * rows)),
	             Q4KH_OK);
	for (int64_t r = 0; r < rows; r++)
		for (int64_t i = 0; i < n; i++) {
			const uint8_t *p = raw + r * h.nb[1] + 2 * i;

			cr_assert_eq(p[0] | p[1] << 8, half[r * n + i],
			             "f16 of %.9g: 0x%04x, expected 0x%04x",
			             (double)src[r * n + i], p[0] | p[1] << 8,
			             half[r * n + i]);
		}
	cr_assert_eq(e->b->copy(e->dev, &h, &back), Q4KH_OK);
	got = fetch(e, &back);
	for (int64_t i = 0; i < n * rows; i++)
		cr_assert(got[i] == want[i] || (isinf(got[i]) && isinf(want[i])),
		          "f32 of f16 [%lld] = %.9g, expected %.9g", (long long)i,
		          (double)got[i], want[i]);
	free(got);
	/* f32 to f32 into a strided destination. */
	cache = make_tensor(e, Q4KH_TYPE_F32, n, rows, 1, NULL, 16);
	cr_assert_eq(e->b->copy(e->dev, &s, &cache), Q4KH_OK);
	got = fetch(e, &cache);
	cr_assert_arr_eq(got, src, sizeof(float) * (size_t)(n * rows));
	free(got);
	free(raw);
	free(src);
	free(half);
	drop(e, &s);
	drop(e, &h);
	drop(e, &back);
	drop(e, &cache);
	env_close(e);
}
