/*
 * The reference cpu plugin's linear-attention ops (ABI 1.2) against float64
 * from their definitions: sigmoid/softplus/silu, the short causal
 * convolution with its carried state, and the gated delta rule token by
 * token or in one call. Shared set-up and the delta_net workload:
 * tests/cpu_ops_helpers.h.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops_helpers.h"

/* --- linear-attention ops (ABI 1.2) ------------------------------------- */

static double ref_unary(q4kh_unary_kind kind, double x)
{
	switch (kind) {
	case Q4KH_UNARY_SIGMOID: return 1.0 / (1.0 + exp(-x));
	case Q4KH_UNARY_SOFTPLUS: return (double)log1pl(expl(x));
	case Q4KH_UNARY_SILU: return x / (1.0 + exp(-x));
	}
	return NAN;
}

Test(cpu_ops, unary_sigmoid_softplus_silu)
{
	struct env *e = env_open("2");
	const int64_t n = 50, rows = 3;

	rng_state = 61;
	for (int kind = 0; kind < 3; kind++) {
		float *x = random_floats((size_t)(n * rows));
		double want[50 * 3];
		struct q4kh_tensor xt, out;
		float *got;

		for (int64_t i = 0; i < n * rows; i++) {
			x[i] *= 8.0f; /* both tails */
			if (i % 13 == 0)
				x[i] = i % 2 ? 40.0f : -40.0f;
			want[i] = ref_unary((q4kh_unary_kind)kind, x[i]);
		}
		/* rows 3 floats apart beyond their length: strides are free */
		xt = make_tensor(e, Q4KH_TYPE_F32, n, rows, 1, x, 12);
		out = f32_tensor(e, n, rows, 1, NULL);
		cr_assert_eq(e->b->unary(e->dev, (q4kh_unary_kind)kind, &xt, &out), Q4KH_OK,
		             "%s", e->b->last_error(e->ctx));
		got = fetch(e, &out);
		expect_close("unary", got, want, (size_t)(n * rows), 1e-7, 1e-30);
		free(got);
		cr_assert_eq(e->b->unary(e->dev, (q4kh_unary_kind)kind, &xt, &xt), Q4KH_OK);
		got = fetch(e, &xt);
		expect_close("unary in place", got, want, (size_t)(n * rows), 1e-7, 1e-30);
		free(got);
		free(x);
		drop(e, &xt);
		drop(e, &out);
	}
	env_close(e);
}

/* Outputs {C, T} and the new state of the convolution, from the
 * definition: each channel's kept values, then its inputs. */
static void ref_conv(const float *x, const float *w, const float *state, int64_t c_n,
                     int64_t T, int64_t k, double *out, double *new_state)
{
	for (int64_t c = 0; c < c_n; c++) {
		double u[64];

		for (int64_t i = 0; i < k - 1; i++)
			u[i] = state[c * (k - 1) + i];
		for (int64_t t = 0; t < T; t++)
			u[k - 1 + t] = x[t * c_n + c];
		for (int64_t t = 0; t < T; t++) {
			out[t * c_n + c] = 0.0;
			for (int64_t i = 0; i < k; i++)
				out[t * c_n + c] += (double)w[c * k + i] * u[t + i];
		}
		for (int64_t i = 0; i < k - 1; i++)
			new_state[c * (k - 1) + i] = u[T + i];
	}
}

Test(cpu_ops, ssm_conv_matches_the_definition_and_carries_its_state)
{
	struct env *e = env_open("2");
	const int64_t C = 40, K = 4, T = 5;
	double want[40 * 5], want_state[40 * 3];
	struct q4kh_tensor xt, wt, st, out, x2, x3, o2, o3;
	float *x, *w, *s0, *got, *got_state, *a, *b;

	rng_state = 62;
	x = random_floats(C * T);
	w = random_floats(C * K);
	s0 = random_floats(C * 3);
	ref_conv(x, w, s0, C, T, K, want, want_state);
	xt = f32_tensor(e, C, T, 1, x);
	wt = f32_tensor(e, K, C, 1, w);
	st = f32_tensor(e, K - 1, C, 1, s0);
	out = f32_tensor(e, C, T, 1, NULL);
	cr_assert_eq(e->b->ssm_conv(e->dev, &xt, &wt, &st, &out), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &out);
	got_state = fetch(e, &st);
	expect_close("ssm_conv out", got, want, (size_t)(C * T), 1e-7, 1e-7);
	expect_close("ssm_conv state", got_state, want_state, (size_t)(C * 3), 0, 0);

	/* The same 5 tokens as steps of 2 and 3, and of 1 (fewer than the 3
	 * kept): the same bits, the state carrying the rest. */
	for (int split = 1; split <= 2; split++) {
		drop(e, &st);
		st = f32_tensor(e, K - 1, C, 1, s0);
		x2 = f32_tensor(e, C, split, 1, x);
		x3 = f32_tensor(e, C, T - split, 1, x + C * split);
		o2 = f32_tensor(e, C, split, 1, NULL);
		o3 = f32_tensor(e, C, T - split, 1, NULL);
		cr_assert_eq(e->b->ssm_conv(e->dev, &x2, &wt, &st, &o2), Q4KH_OK);
		cr_assert_eq(e->b->ssm_conv(e->dev, &x3, &wt, &st, &o3), Q4KH_OK);
		a = fetch(e, &o2);
		b = fetch(e, &o3);
		cr_expect_eq(memcmp(a, got, sizeof(float) * C * split), 0,
		             "steps of %d: first step differs", split);
		cr_expect_eq(memcmp(b, got + C * split, sizeof(float) * C * (T - split)), 0,
		             "steps of %d: second step differs", split);
		free(a);
		free(b);
		a = fetch(e, &st);
		cr_expect_eq(memcmp(a, got_state, sizeof(float) * C * 3), 0,
		             "steps of %d: state differs", split);
		free(a);
		drop(e, &x2);
		drop(e, &x3);
		drop(e, &o2);
		drop(e, &o3);
	}
	expect_status(e, e->b->ssm_conv(e->dev, &xt, &wt, &out, &out),
	              "ssm_conv state: shape {40, 5, 1, 1}, expected {3, 40, 1, 1}");
	expect_status(e, e->b->ssm_conv(e->dev, &xt, &wt, &st, &xt),
	              "ssm_conv out (offset 0) overlaps x");
	free(got);
	free(got_state);
	free(x);
	free(w);
	free(s0);
	drop(e, &xt);
	drop(e, &wt);
	drop(e, &st);
	drop(e, &out);
	env_close(e);
}

/* The gated delta rule as plugin.h defines it, in double: out {S_v, H_v,
 * T} and the final state {S_k, S_v, H_v}. */
static void ref_delta(const struct delta_case *c, double scale, double *out, double *state)
{
	const int64_t sk = c->sk, sv = c->sv;

	for (int64_t i = 0; i < sk * sv * c->hv; i++)
		state[i] = c->s0[i];
	for (int64_t h = 0; h < c->hv; h++) {
		double *s = state + h * sk * sv; /* s[i * sk + j] = S[i][j] */
		int64_t kh = h % c->hk;

		for (int64_t t = 0; t < c->T; t++) {
			const float *q = c->q + (t * c->hk + kh) * sk;
			const float *k = c->k + (t * c->hk + kh) * sk;
			const float *v = c->v + (t * c->hv + h) * sv;
			double decay = exp(c->g[t * c->hv + h]), b = c->beta[t * c->hv + h];

			for (int64_t i = 0; i < sk * sv; i++)
				s[i] *= decay;
			for (int64_t i = 0; i < sv; i++) {
				double sk_i = 0.0, d;

				for (int64_t j = 0; j < sk; j++)
					sk_i += s[i * sk + j] * k[j];
				d = b * (v[i] - sk_i);
				for (int64_t j = 0; j < sk; j++)
					s[i * sk + j] += d * k[j];
			}
			for (int64_t i = 0; i < sv; i++) {
				double o = 0.0;

				for (int64_t j = 0; j < sk; j++)
					o += s[i * sk + j] * q[j];
				out[(t * c->hv + h) * sv + i] = scale * o;
			}
		}
	}
}

Test(cpu_ops, delta_net_matches_the_definition_token_by_token_or_not)
{
	struct env *e = env_open("2");
	struct delta_case c = { .sk = 32, .sv = 24, .hk = 2, .hv = 6, .T = 9 };
	const float scale = 1.0f / sqrtf(32.0f);
	double *want, *want_state;
	struct q4kh_tensor st;
	float *got, *got_state;

	rng_state = 63;
	delta_inputs(&c);
	want = malloc(sizeof(double) * (size_t)(c.sv * c.hv * c.T));
	want_state = malloc(sizeof(double) * (size_t)(c.sk * c.sv * c.hv));
	cr_assert(want && want_state);
	ref_delta(&c, scale, want, want_state);
	st = f32_tensor(e, c.sk, c.sv, c.hv, c.s0);
	got = run_delta(e, &c, &st, 0, c.T, scale);
	got_state = fetch(e, &st);
	expect_close("delta_net out", got, want, (size_t)(c.sv * c.hv * c.T), 1e-6, 1e-7);
	expect_close("delta_net state", got_state, want_state, (size_t)(c.sk * c.sv * c.hv),
	             1e-6, 1e-7);
	free(got);
	free(got_state);

	/* One token per call, as decode runs it: the state goes through f32
	 * between calls, nothing else differs. */
	drop(e, &st);
	st = f32_tensor(e, c.sk, c.sv, c.hv, c.s0);
	for (int64_t t = 0; t < c.T; t++) {
		got = run_delta(e, &c, &st, t, 1, scale);
		expect_close("delta_net one token", got, want + t * c.hv * c.sv,
		             (size_t)(c.hv * c.sv), 1e-5, 1e-6);
		free(got);
	}
	got_state = fetch(e, &st);
	expect_close("delta_net state after single tokens", got_state, want_state,
	             (size_t)(c.sk * c.sv * c.hv), 1e-5, 1e-6);
	free(got_state);
	drop(e, &st);
	free(want);
	free(want_state);
	delta_free(&c);
	env_close(e);
}

Test(cpu_ops, delta_net_refuses_bad_shapes_and_aliasing)
{
	struct env *e = env_open("2");
	struct q4kh_tensor q = f32_tensor(e, 8, 3, 2, NULL), v = f32_tensor(e, 8, 4, 2, NULL);
	struct q4kh_tensor g = f32_tensor(e, 4, 2, 1, NULL), st = f32_tensor(e, 8, 8, 4, NULL);
	struct q4kh_tensor out = f32_tensor(e, 8, 4, 2, NULL), q2 = f32_tensor(e, 8, 2, 2, NULL);

	expect_status(e, e->b->delta_net(e->dev, &q, &q, &v, &g, &g, &st, 1.0f, &out),
	              "delta_net: 4 value heads is not a multiple of 3 key heads");
	expect_status(e, e->b->delta_net(e->dev, &q2, &q2, &v, &g, &g, &out, 1.0f, &out),
	              "delta_net state: shape {8, 4, 2, 1}, expected {8, 8, 4, 1}");
	expect_status(e, e->b->delta_net(e->dev, &q2, &q2, &v, &g, &g, &st, 1.0f, &v),
	              "delta_net out (offset 0) overlaps delta_net v");
	expect_status(e, e->b->unary(e->dev, (q4kh_unary_kind)7, &q, &q),
	              "unary: kind 7, expected 0 (sigmoid)");
	drop(e, &q);
	drop(e, &v);
	drop(e, &g);
	drop(e, &st);
	drop(e, &out);
	drop(e, &q2);
	env_close(e);
}
