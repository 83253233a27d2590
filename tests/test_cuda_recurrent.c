/*
 * The cuda backend's ops of linear-attention layers (plugin.h, ABI 1.2:
 * unary, ssm_conv, delta_net; Qwen3.5's gated delta-net layers) against
 * float64 computations written here from plugin.h's definitions, not
 * against the cpu plugin: each op on several shapes (channels over a
 * block, every unary kind at its tails, taps K = 2 to 6 with steps
 * shorter than the K-1 kept values, several heads, key heads shared by
 * 2 and 3 value heads, S_k other than S_v and not a multiple of 32, up to
 * the kernel's 1024), strided rows, prompt lengths 1, 7, 64, 65 and 300
 * (chunk boundaries of the prompt kernel), outputs and states both
 * checked, nothing outside a view written (cuda_rig.h).
 *
 * Decode runs another kernel than a prompt (cuda_delta.cu): a prefill of
 * N tokens followed by three one-token steps must give what one prefill
 * of N + 3 tokens gives (each value within 1e-4 of the tensor's largest),
 * outputs and states, so a defect in either form alone is caught, and so
 * must a prompt cut in two and a decode step recorded once as a CUDA graph
 * and replayed.
 *
 * Tolerances: the kernels compute in float what is defined here in
 * double. A convolution output is K products, a unary value one libm
 * call: NMSE_ELEMENT. The delta rule's state goes through 300 tokens of
 * float dot products of up to 1024 terms; the rule contracts (|k| = 1,
 * 0 < beta < 1, decay <= 1), so rounding does not grow: a float32
 * computation of these shapes is 1e-14 from the double one, NMSE_DELTA
 * a million times that, while a wrong head, token, gate or order costs
 * 1e-3 and more. Every test skips without a CUDA device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rig.h"
#include "helpers.h"

#define NMSE_ELEMENT 1e-11
#define NMSE_DELTA 1e-8
#define SAME_REL 1e-4 /* decode after prefill against one prefill */
#define DECODE_STEPS 3

static const int64_t prompt_lengths[] = { 1, 7, 64, 65, 300 };
#define N_LENGTHS (sizeof(prompt_lengths) / sizeof(prompt_lengths[0]))

/* |a - b| <= rel max |b| for each of N values: one computation two ways. */
static void expect_same(const char *what, const double *a, const double *b, int64_t n,
                        double rel)
{
	double top = 0.0;

	for (int64_t i = 0; i < n; i++)
		top = fmax(top, fabs(b[i]));
	for (int64_t i = 0; i < n; i++)
		cr_assert(fabs(a[i] - b[i]) <= rel * top,
		          "%s: element %lld is %.9g, one prefill gives %.9g (more than "
		          "%g of the largest, %.6g, apart)",
		          what, (long long)i, a[i], b[i], rel, top);
}

/* --- unary ----------------------------------------------------------------- */

static double unary_f64(q4kh_unary_kind kind, double x)
{
	switch (kind) {
	case Q4KH_UNARY_SIGMOID:
		return 1.0 / (1.0 + exp(-x));
	case Q4KH_UNARY_SOFTPLUS:
		return log(1.0 + exp(x));
	case Q4KH_UNARY_SILU:
		break;
	}
	return x / (1.0 + exp(-x));
}

Test(cuda_recurrent, unary_every_kind_in_place_and_apart)
{
	static const q4kh_unary_kind kinds[] = { Q4KH_UNARY_SIGMOID, Q4KH_UNARY_SOFTPLUS,
		                                 Q4KH_UNARY_SILU };
	static const char *const names[] = { "sigmoid", "softplus", "SiLU" };
	const int64_t n0 = 70, n1 = 6, n2 = 3, n = n0 * n1 * n2;
	struct rig *r = rig_open();

	rng_seed(71);
	for (size_t k = 0; k < 3; k++) {
		float *xv = rvals((size_t)n);
		double *want = malloc(sizeof(double) * (size_t)n);
		char what[64];

		/* the tails too: softplus' large arguments overflow exp */
		for (int64_t i = 0; i < n; i++)
			xv[i] = i < 4 ? (float)((i % 2 ? -1 : 1) * (30 + 60 * (i / 2))) : 8.0f * xv[i];
		for (int64_t i = 0; i < n; i++)
			want[i] = unary_f64(kinds[k], xv[i]);
		struct twin x = twin_new(r, Q4KH_TYPE_F32, n0, n1, n2, 12, xv);
		struct twin out = twin_new(r, Q4KH_TYPE_F32, n0, n1, n2, 4, NULL);

		cr_assert_eq(V(r, GPU)->unary(DEV(r, GPU), kinds[k], &x.t[GPU], &out.t[GPU]),
		             Q4KH_OK, "%s", ERR(r, GPU));
		snprintf(what, sizeof(what), "unary %s {70, 6, 3}", names[k]);
		expect_near(r, what, &out, want, NMSE_ELEMENT);
		cr_assert_eq(V(r, GPU)->unary(DEV(r, GPU), kinds[k], &x.t[GPU], &x.t[GPU]),
		             Q4KH_OK, "%s", ERR(r, GPU));
		snprintf(what, sizeof(what), "unary %s {70, 6, 3} in place", names[k]);
		expect_near(r, what, &x, want, NMSE_ELEMENT);
		twin_free(r, &x);
		twin_free(r, &out);
		free(xv);
		free(want);
	}
	rig_close(r);
}

/* --- ssm_conv -------------------------------------------------------------- */

/*
 * plugin.h's definition over T tokens of x (x[t C + c]), taps w[c K + j],
 * the kept values state[c (K-1) + j] (updated): out[t C + c].
 */
static void conv_f64(const float *x, const float *w, double *state, int64_t C, int64_t K,
                     int64_t T, double *out)
{
	double *u = malloc(sizeof(double) * (size_t)(K - 1 + T));

	cr_assert_not_null(u);
	for (int64_t c = 0; c < C; c++) {
		for (int64_t j = 0; j < K - 1; j++)
			u[j] = state[c * (K - 1) + j];
		for (int64_t t = 0; t < T; t++)
			u[K - 1 + t] = x[t * C + c];
		for (int64_t t = 0; t < T; t++) {
			double sum = 0.0;

			for (int64_t j = 0; j < K; j++)
				sum += (double)w[c * K + j] * u[t + j];
			out[t * C + c] = sum;
		}
		for (int64_t j = 0; j < K - 1; j++)
			state[c * (K - 1) + j] = u[T + j];
	}
	free(u);
}

/* The cuda ssm_conv of X's columns [t0, t0 + T) with the state in ST;
 * their outputs appended to OUT (double, t C + c). */
static void conv_gpu(struct rig *r, const float *x, const struct twin *w,
                     const struct twin *st, int64_t C, int64_t t0, int64_t T, double *out)
{
	struct twin xt = twin_new(r, Q4KH_TYPE_F32, C, T, 1, 20, x + t0 * C);
	struct twin o = twin_new(r, Q4KH_TYPE_F32, C, T, 1, 8, NULL);
	double *got;

	cr_assert_eq(V(r, GPU)->ssm_conv(DEV(r, GPU), &xt.t[GPU], &w->t[GPU], &st->t[GPU],
	                                 &o.t[GPU]),
	             Q4KH_OK, "%s", ERR(r, GPU));
	got = twin_values(r, &o, GPU);
	memcpy(out + t0 * C, got, sizeof(double) * (size_t)(C * T));
	free(got);
	twin_free(r, &xt);
	twin_free(r, &o);
}

Test(cuda_recurrent, ssm_conv_against_its_definition)
{
	static const int64_t shapes[][2] = { { 40, 4 }, { 200, 2 }, { 33, 6 }, { 130, 4 } };
	static const int64_t lengths[] = { 1, 2, 7, 64, 65, 300 };
	struct rig *r = rig_open();

	rng_seed(72);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++) {
			const int64_t C = shapes[s][0], K = shapes[s][1], T = lengths[l];
			float *xv = rvals((size_t)(C * T)), *wv = rvals((size_t)(C * K));
			float *sv = rvals((size_t)(C * (K - 1)));
			double *want = malloc(sizeof(double) * (size_t)(C * T));
			double *state = malloc(sizeof(double) * (size_t)(C * (K - 1)));
			struct twin x = twin_new(r, Q4KH_TYPE_F32, C, T, 1, 20, xv);
			struct twin w = twin_new(r, Q4KH_TYPE_F32, K, C, 1, 4, wv);
			struct twin st = twin_new(r, Q4KH_TYPE_F32, K - 1, C, 1, 12, sv);
			struct twin out = twin_new(r, Q4KH_TYPE_F32, C, T, 1, 8, NULL);
			char what[96];

			for (int64_t i = 0; i < C * (K - 1); i++)
				state[i] = sv[i];
			conv_f64(xv, wv, state, C, K, T, want);
			cr_assert_eq(V(r, GPU)->ssm_conv(DEV(r, GPU), &x.t[GPU], &w.t[GPU],
			                                 &st.t[GPU], &out.t[GPU]),
			             Q4KH_OK, "%s", ERR(r, GPU));
			snprintf(what, sizeof(what), "ssm_conv C=%lld K=%lld T=%lld: out",
			         (long long)C, (long long)K, (long long)T);
			expect_near(r, what, &out, want, NMSE_ELEMENT);
			snprintf(what, sizeof(what), "ssm_conv C=%lld K=%lld T=%lld: kept state",
			         (long long)C, (long long)K, (long long)T);
			expect_near(r, what, &st, state, NMSE_ELEMENT);
			twin_free(r, &x);
			twin_free(r, &w);
			twin_free(r, &st);
			twin_free(r, &out);
			free(xv);
			free(wv);
			free(sv);
			free(want);
			free(state);
		}
	}
	rig_close(r);
}

Test(cuda_recurrent, ssm_conv_decode_after_prefill_is_one_prefill)
{
	const int64_t C = 96, K = 4;
	struct rig *r = rig_open();

	rng_seed(73);
	for (size_t l = 0; l < N_LENGTHS; l++) {
		const int64_t N = prompt_lengths[l], T = N + DECODE_STEPS;
		float *xv = rvals((size_t)(C * T)), *wv = rvals((size_t)(C * K));
		float *sv = rvals((size_t)(C * (K - 1)));
		double *steps = malloc(sizeof(double) * (size_t)(C * T));
		double *whole = malloc(sizeof(double) * (size_t)(C * T));
		struct twin w = twin_new(r, Q4KH_TYPE_F32, K, C, 1, 0, wv);
		struct twin sa = twin_new(r, Q4KH_TYPE_F32, K - 1, C, 1, 0, sv);
		struct twin sb = twin_new(r, Q4KH_TYPE_F32, K - 1, C, 1, 0, sv);
		double *ka, *kb;
		char what[96];

		conv_gpu(r, xv, &w, &sa, C, 0, N, steps);
		for (int64_t d = 0; d < DECODE_STEPS; d++)
			conv_gpu(r, xv, &w, &sa, C, N + d, 1, steps);
		conv_gpu(r, xv, &w, &sb, C, 0, T, whole);
		snprintf(what, sizeof(what), "ssm_conv, %lld-token prefill then %d decode steps",
		         (long long)N, DECODE_STEPS);
		expect_same(what, steps, whole, C * T, SAME_REL);
		ka = twin_values(r, &sa, GPU);
		kb = twin_values(r, &sb, GPU);
		expect_same(what, ka, kb, C * (K - 1), SAME_REL);
		free(ka);
		free(kb);
		twin_free(r, &w);
		twin_free(r, &sa);
		twin_free(r, &sb);
		free(xv);
		free(wv);
		free(sv);
		free(steps);
		free(whole);
	}
	rig_close(r);
}

/* --- delta_net ------------------------------------------------------------- */

struct delta_shape {
	int64_t sk, sv, hk, hv;
};

/* A sequence's inputs as a Qwen3.5 layer makes them, packed: q, k
 * (t H_k + kh) S_k + c, L2-normalised per head; v (t H_v + h) S_v + i;
 * the log decay g and beta at t H_v + h, decay in [0.5, 1), beta in
 * (0, 1); the state at (h S_v + i) S_k + c. */
struct delta_in {
	struct delta_shape d;
	int64_t T;
	float *q, *k, *v, *g, *beta, *state;
};

static void normalise(float *x, int64_t n)
{
	double ss = 0.0;

	for (int64_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(x[i] / sqrt(ss));
}

static struct delta_in delta_inputs(struct delta_shape d, int64_t T)
{
	struct delta_in in = { .d = d, .T = T };

	in.q = rvals((size_t)(d.sk * d.hk * T));
	in.k = rvals((size_t)(d.sk * d.hk * T));
	in.v = rvals((size_t)(d.sv * d.hv * T));
	in.g = rvals((size_t)(d.hv * T));
	in.beta = rvals((size_t)(d.hv * T));
	in.state = rvals((size_t)(d.sk * d.sv * d.hv));
	for (int64_t i = 0; i < d.hk * T; i++) {
		normalise(in.q + i * d.sk, d.sk);
		normalise(in.k + i * d.sk, d.sk);
	}
	for (int64_t i = 0; i < d.hv * T; i++) {
		in.g[i] = (float)log(0.5 + 0.5 * urand());
		in.beta[i] = (float)(0.02 + 0.96 * urand());
	}
	for (int64_t i = 0; i < d.sk * d.sv * d.hv; i++)
		in.state[i] *= 0.5f;
	return in;
}

static void delta_free(struct delta_in *in)
{
	free(in->q);
	free(in->k);
	free(in->v);
	free(in->g);
	free(in->beta);
	free(in->state);
}

/*
 * plugin.h's definition, token by token, over all of IN's tokens: state
 * (double, IN's layout) updated, out[(t H_v + h) S_v + i].
 */
static void delta_f64(const struct delta_in *in, double scale, double *state, double *out)
{
	const struct delta_shape d = in->d;

	for (int64_t t = 0; t < in->T; t++) {
		for (int64_t h = 0; h < d.hv; h++) {
			const float *k = in->k + (t * d.hk + h % d.hk) * d.sk;
			const float *q = in->q + (t * d.hk + h % d.hk) * d.sk;
			const double decay = exp(in->g[t * d.hv + h]), beta = in->beta[t * d.hv + h];

			for (int64_t i = 0; i < d.sv; i++) {
				double *s = state + (h * d.sv + i) * d.sk, sk = 0.0, sq = 0.0, e;

				for (int64_t c = 0; c < d.sk; c++) {
					s[c] *= decay;
					sk += s[c] * k[c];
				}
				e = beta * (in->v[(t * d.hv + h) * d.sv + i] - sk);
				for (int64_t c = 0; c < d.sk; c++) {
					s[c] += e * k[c];
					sq += s[c] * q[c];
				}
				out[(t * d.hv + h) * d.sv + i] = scale * sq;
			}
		}
	}
}

/* Tokens [t0, t0 + T) of IN on the cuda side, rows strided. */
struct delta_twins {
	struct twin q, k, v, g, beta, out;
};

static struct delta_twins delta_upload(struct rig *r, const struct delta_in *in, int64_t t0,
                                       int64_t T)
{
	const struct delta_shape d = in->d;

	return (struct delta_twins){
		.q = twin_new(r, Q4KH_TYPE_F32, d.sk, d.hk, T, 16, in->q + t0 * d.hk * d.sk),
		.k = twin_new(r, Q4KH_TYPE_F32, d.sk, d.hk, T, 24, in->k + t0 * d.hk * d.sk),
		.v = twin_new(r, Q4KH_TYPE_F32, d.sv, d.hv, T, 8, in->v + t0 * d.hv * d.sv),
		.g = twin_new(r, Q4KH_TYPE_F32, d.hv, T, 1, 4, in->g + t0 * d.hv),
		.beta = twin_new(r, Q4KH_TYPE_F32, d.hv, T, 1, 12, in->beta + t0 * d.hv),
		.out = twin_new(r, Q4KH_TYPE_F32, d.sv, d.hv, T, 4, NULL),
	};
}

static void delta_twins_free(struct rig *r, struct delta_twins *t)
{
	twin_free(r, &t->q);
	twin_free(r, &t->k);
	twin_free(r, &t->v);
	twin_free(r, &t->g);
	twin_free(r, &t->beta);
	twin_free(r, &t->out);
}

static struct twin state_upload(struct rig *r, const struct delta_in *in)
{
	return twin_new(r, Q4KH_TYPE_F32, in->d.sk, in->d.sv, in->d.hv, 32, in->state);
}

static double delta_scale(const struct delta_shape *d)
{
	return 1.0 / sqrt((double)d->sk);
}

static q4kh_status delta_run(struct rig *r, struct delta_twins *t, struct twin *st,
                             double scale)
{
	return V(r, GPU)->delta_net(DEV(r, GPU), &t->q.t[GPU], &t->k.t[GPU], &t->v.t[GPU],
	                            &t->g.t[GPU], &t->beta.t[GPU], &st->t[GPU], (float)scale,
	                            &t->out.t[GPU]);
}

/* Tokens [t0, t0 + T) of IN through the cuda delta_net with the state in
 * ST; their outputs into OUT (double, IN's layout). */
static void delta_gpu(struct rig *r, const struct delta_in *in, struct twin *st, int64_t t0,
                      int64_t T, double *out)
{
	const struct delta_shape d = in->d;
	struct delta_twins t = delta_upload(r, in, t0, T);
	double *got;

	cr_assert_eq(delta_run(r, &t, st, delta_scale(&d)), Q4KH_OK, "%s", ERR(r, GPU));
	got = twin_values(r, &t.out, GPU);
	memcpy(out + t0 * d.hv * d.sv, got, sizeof(double) * (size_t)(T * d.hv * d.sv));
	free(got);
	delta_twins_free(r, &t);
}

static const struct delta_shape delta_shapes[] = {
	{ 128, 128, 2, 4 }, /* Qwen3.5's head size; each key head shared by 2 */
	{ 32, 48, 2, 6 },   /* S_v != S_k; shared by 3 */
	{ 16, 16, 3, 3 },   /* a lane's values partly past S_k */
	{ 200, 40, 1, 2 },  /* S_k no multiple of 32 */
	{ 1024, 8, 1, 1 },  /* the kernel's largest S_k */
};

Test(cuda_recurrent, delta_net_against_its_definition, .timeout = 300)
{
	struct rig *r = rig_open();

	rng_seed(74);
	for (size_t s = 0; s < sizeof(delta_shapes) / sizeof(delta_shapes[0]); s++) {
		for (size_t l = 0; l < N_LENGTHS; l++) {
			const struct delta_shape d = delta_shapes[s];
			const int64_t T = prompt_lengths[l], ns = d.sk * d.sv * d.hv;
			struct delta_in in = delta_inputs(d, T);
			struct delta_twins t = delta_upload(r, &in, 0, T);
			struct twin st = state_upload(r, &in);
			double *state = malloc(sizeof(double) * (size_t)ns);
			double *want = malloc(sizeof(double) * (size_t)(T * d.hv * d.sv));
			char what[128];

			for (int64_t i = 0; i < ns; i++)
				state[i] = in.state[i];
			delta_f64(&in, delta_scale(&d), state, want);
			cr_assert_eq(delta_run(r, &t, &st, delta_scale(&d)), Q4KH_OK, "%s",
			             ERR(r, GPU));
			snprintf(what, sizeof(what),
			         "delta_net S_k=%lld S_v=%lld H_k=%lld H_v=%lld T=%lld: out",
			         (long long)d.sk, (long long)d.sv, (long long)d.hk,
			         (long long)d.hv, (long long)T);
			expect_near(r, what, &t.out, want, NMSE_DELTA);
			snprintf(what, sizeof(what),
			         "delta_net S_k=%lld S_v=%lld H_k=%lld H_v=%lld T=%lld: state",
			         (long long)d.sk, (long long)d.sv, (long long)d.hk,
			         (long long)d.hv, (long long)T);
			expect_near(r, what, &st, state, NMSE_DELTA);
			delta_twins_free(r, &t);
			twin_free(r, &st);
			delta_free(&in);
			free(state);
			free(want);
		}
	}
	rig_close(r);
}

/*
 * IN's tokens two ways on fresh copies of its state: CUTS steps (the
 * tokens before each cut, then the rest) against one step of them all;
 * outputs and final states the same.
 */
static void expect_cut_is_whole(struct rig *r, const struct delta_in *in,
                                const int64_t *cuts, int n_cuts, const char *what)
{
	const struct delta_shape d = in->d;
	const int64_t n = in->T * d.hv * d.sv;
	double *steps = malloc(sizeof(double) * (size_t)n);
	double *whole = malloc(sizeof(double) * (size_t)n);
	struct twin sa = state_upload(r, in), sb = state_upload(r, in);
	double *ka, *kb;
	int64_t t0 = 0;

	for (int c = 0; c <= n_cuts; c++) {
		const int64_t t1 = c < n_cuts ? cuts[c] : in->T;

		delta_gpu(r, in, &sa, t0, t1 - t0, steps);
		t0 = t1;
	}
	delta_gpu(r, in, &sb, 0, in->T, whole);
	expect_same(what, steps, whole, n, SAME_REL);
	ka = twin_values(r, &sa, GPU);
	kb = twin_values(r, &sb, GPU);
	expect_same(what, ka, kb, d.sk * d.sv * d.hv, SAME_REL);
	free(ka);
	free(kb);
	twin_free(r, &sa);
	twin_free(r, &sb);
	free(steps);
	free(whole);
}

Test(cuda_recurrent, delta_net_decode_after_prefill_is_one_prefill, .timeout = 300)
{
	static const struct delta_shape shapes[] = { { 128, 128, 2, 4 }, { 32, 48, 2, 6 } };
	struct rig *r = rig_open();

	rng_seed(75);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		for (size_t l = 0; l < N_LENGTHS; l++) {
			const int64_t N = prompt_lengths[l];
			const int64_t cuts[DECODE_STEPS] = { N, N + 1, N + 2 };
			struct delta_in in = delta_inputs(shapes[s], N + DECODE_STEPS);
			char what[128];

			snprintf(what, sizeof(what),
			         "delta_net S_k=%lld H_v=%lld: %lld-token prefill then %d decode "
			         "steps",
			         (long long)shapes[s].sk, (long long)shapes[s].hv, (long long)N,
			         DECODE_STEPS);
			expect_cut_is_whole(r, &in, cuts, DECODE_STEPS, what);
			delta_free(&in);
		}
	}
	rig_close(r);
}

Test(cuda_recurrent, delta_net_prompt_in_two_steps_is_one_step)
{
	const int64_t cut = 128;
	struct delta_in in;
	struct rig *r = rig_open();

	rng_seed(76);
	in = delta_inputs(delta_shapes[0], 300);
	expect_cut_is_whole(r, &in, &cut, 1, "delta_net, 300 tokens as 128 + 172");
	delta_free(&in);
	rig_close(r);
}

/* Rewrite the view of T's cuda side with V (its elements in order). */
static void refill(struct rig *r, const struct twin *t, const float *v)
{
	const struct q4kh_tensor *g = &t->t[GPU];

	for (int64_t row = 0; row < g->ne[1] * g->ne[2]; row++)
		cr_assert_eq(V(r, GPU)->buffer_upload(DEV(r, GPU), g->buffer,
		                                      g->offset + (uint64_t)((row % g->ne[1]) * g->nb[1] +
		                                                             (row / g->ne[1]) * g->nb[2]),
		                                      v + row * g->ne[0],
		                                      sizeof(float) * (size_t)g->ne[0]),
		             Q4KH_OK, "%s", ERR(r, GPU));
}

/*
 * plugin.h's rule S2: a decode step recorded once (a CUDA graph of
 * ssm_conv and delta_net) and replayed with new inputs reads and writes
 * the states as they are at each replay: after a prefill of 7 tokens,
 * four replays give what one prefill of 11 tokens gives.
 */
Test(cuda_recurrent, a_recorded_decode_step_replays_on_the_states_as_they_are)
{
	const struct delta_shape d = delta_shapes[0];
	const int64_t N = 7, steps = 4, T = N + steps, C = 96, K = 4;
	const int64_t nd = d.sv * d.hv;
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	float *xv, *wv, *kv;
	double *conv_steps, *conv_whole, *delta_steps, *delta_whole, *got, *ka, *kb;
	struct twin w, ca, cb, xs, os, da, db;
	struct delta_twins one;
	struct delta_in in;
	q4kh_graph *g = NULL;

	rng_seed(78);
	xv = rvals((size_t)(C * T));
	wv = rvals((size_t)(C * K));
	kv = rvals((size_t)(C * (K - 1)));
	in = delta_inputs(d, T);
	conv_steps = malloc(sizeof(double) * (size_t)(C * T));
	conv_whole = malloc(sizeof(double) * (size_t)(C * T));
	delta_steps = malloc(sizeof(double) * (size_t)(nd * T));
	delta_whole = malloc(sizeof(double) * (size_t)(nd * T));
	w = twin_new(r, Q4KH_TYPE_F32, K, C, 1, 0, wv);
	ca = twin_new(r, Q4KH_TYPE_F32, K - 1, C, 1, 0, kv);
	cb = twin_new(r, Q4KH_TYPE_F32, K - 1, C, 1, 0, kv);
	da = state_upload(r, &in);
	db = state_upload(r, &in);
	conv_gpu(r, xv, &w, &ca, C, 0, N, conv_steps);
	delta_gpu(r, &in, &da, 0, N, delta_steps);
	xs = twin_new(r, Q4KH_TYPE_F32, C, 1, 1, 0, NULL);
	os = twin_new(r, Q4KH_TYPE_F32, C, 1, 1, 0, NULL);
	one = delta_upload(r, &in, N, 1);
	for (int64_t i = 0; i < steps; i++) {
		const int64_t t = N + i;

		refill(r, &xs, xv + t * C);
		refill(r, &one.q, in.q + t * d.hk * d.sk);
		refill(r, &one.k, in.k + t * d.hk * d.sk);
		refill(r, &one.v, in.v + t * nd);
		refill(r, &one.g, in.g + t * d.hv);
		refill(r, &one.beta, in.beta + t * d.hv);
		if (!g) {
			cr_assert_eq(b->graph_begin(DEV(r, GPU)), Q4KH_OK, "%s", ERR(r, GPU));
			cr_assert_eq(b->ssm_conv(DEV(r, GPU), &xs.t[GPU], &w.t[GPU], &ca.t[GPU],
			                         &os.t[GPU]),
			             Q4KH_OK, "%s", ERR(r, GPU));
			cr_assert_eq(delta_run(r, &one, &da, delta_scale(&d)), Q4KH_OK, "%s",
			             ERR(r, GPU));
			cr_assert_eq(b->graph_end(DEV(r, GPU), &g), Q4KH_OK, "%s", ERR(r, GPU));
		}
		cr_assert_eq(b->graph_launch(DEV(r, GPU), g), Q4KH_OK, "%s", ERR(r, GPU));
		got = twin_values(r, &os, GPU);
		memcpy(conv_steps + t * C, got, sizeof(double) * (size_t)C);
		free(got);
		got = twin_values(r, &one.out, GPU);
		memcpy(delta_steps + t * nd, got, sizeof(double) * (size_t)nd);
		free(got);
	}
	conv_gpu(r, xv, &w, &cb, C, 0, T, conv_whole);
	delta_gpu(r, &in, &db, 0, T, delta_whole);
	expect_same("ssm_conv, replayed decode steps", conv_steps, conv_whole, C * T, SAME_REL);
	expect_same("delta_net, replayed decode steps", delta_steps, delta_whole, nd * T,
	            SAME_REL);
	ka = twin_values(r, &ca, GPU);
	kb = twin_values(r, &cb, GPU);
	expect_same("ssm_conv's state after the replays", ka, kb, C * (K - 1), SAME_REL);
	free(ka);
	free(kb);
	ka = twin_values(r, &da, GPU);
	kb = twin_values(r, &db, GPU);
	expect_same("delta_net's state after the replays", ka, kb, d.sk * nd, SAME_REL);
	free(ka);
	free(kb);
	b->graph_free(DEV(r, GPU), g);
	delta_twins_free(r, &one);
	twin_free(r, &w);
	twin_free(r, &ca);
	twin_free(r, &cb);
	twin_free(r, &da);
	twin_free(r, &db);
	twin_free(r, &xs);
	twin_free(r, &os);
	delta_free(&in);
	free(xv);
	free(wv);
	free(kv);
	free(conv_steps);
	free(conv_whole);
	free(delta_steps);
	free(delta_whole);
	rig_close(r);
}

Test(cuda_recurrent, delta_net_refuses_more_keys_than_it_holds)
{
	const struct delta_shape d = { 1056, 4, 1, 1 };
	struct delta_in in;
	struct delta_twins t;
	struct twin st;
	struct rig *r = rig_open();

	rng_seed(77);
	in = delta_inputs(d, 2);
	t = delta_upload(r, &in, 0, 2);
	st = state_upload(r, &in);
	cr_assert_eq(delta_run(r, &t, &st, delta_scale(&d)), Q4KH_ERR_UNSUPPORTED);
	cr_assert(strstr(ERR(r, GPU), "1056") && strstr(ERR(r, GPU), "1024"), "%s",
	          ERR(r, GPU));
	delta_twins_free(r, &t);
	twin_free(r, &st);
	delta_free(&in);
	rig_close(r);
}
