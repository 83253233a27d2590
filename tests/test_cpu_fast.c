/*
 * The cpu-fast backend against float64, with each instruction set this CPU
 * runs. u = 2^-24 is float32's unit roundoff; every bound below is the
 * rounding the op's arithmetic allows, with room of a small factor:
 *   - add, mul, scale: one rounding, so exactly float64's result rounded;
 *   - copy and set_rows to f16: round to nearest even, bit for bit;
 *   - get_rows: the reference's decoder (exact), then one rounding;
 *   - rms_norm: a sum of n squares (n u relative), then two products;
 *   - glu: e^x within 2 ulp, so (16 + 4 |x|) u relative, x the argument;
 *   - rope: cos and sin rounded once and a rotation with FMA:
 *     4 u m (|a| + |b|) per pair;
 *   - attention: each score within hd u of its exact sum of |q k|, so each
 *     weight within that (and a few u) relative, and the output within
 *     (2 max score error + (n + 8) u) of the weighted sum of |v|;
 *   - the built-in mul_mat: K u of the sum of |w x|;
 *   - unary: as glu (sigmoid, SiLU), a few ulp (softplus);
 *   - ssm_conv: K u of the sum of |w u|, the kept values bit for bit;
 *   - delta_net: a running error bound over the recurrence on absolute
 *     values (at the test);
 *   - add_rms_norm and rope_set_rows (ABI 1.4): bit for bit their two
 *     ops, and within those ops' bounds; rope_store (ABI 1.4) bit for bit
 *     its three; out-of-range positions as those ops issued one after the
 *     other (U2, U4: rotated, then the cache refused);
 *   - top2 (ABI 1.4): the host's q4kh_top2 bit for bit, on random and
 *     adversarial columns (helpers.h).
 * Also the worker pool (every item once, any thread count, lent to a
 * kernel variant through struct q4kh_native_device), the descriptor and
 * device record, settings and errors.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "q4khost/plugin.h"

#define U 0x1p-24

struct env {
	void *dl;
	const struct q4kh_plugin_desc *desc;
	const struct q4kh_backend_v1 *b;
	struct q4kh_host_api api;
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev;
	const char *isa, *threads, *spin;
};

static const char *config(void *host_data, const char *key)
{
	const struct env *e = host_data;

	if (!strcmp(key, "isa"))
		return e->isa;
	if (!strcmp(key, "spin_us"))
		return e->spin;
	return !strcmp(key, "threads") ? e->threads : NULL;
}

static struct env *env_load(void)
{
	struct env *e = calloc(1, sizeof(*e));
	char path[4096];
	q4kh_plugin_entry_fn entry;

	cr_assert_not_null(e);
	snprintf(path, sizeof(path), "%s/plugins/cpu-fast/.libs/cpu-fast.so", test_builddir());
	e->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(e->dl, "dlopen %s: %s", path, dlerror());
	entry = (q4kh_plugin_entry_fn)dlsym(e->dl, Q4KH_ENTRY_SYMBOL);
	cr_assert_not_null(entry);
	e->desc = entry();
	e->b = e->desc->backend;
	e->api = (struct q4kh_host_api){
		.struct_size = sizeof(e->api),
		.abi_major = Q4KH_ABI_MAJOR,
		.abi_minor = Q4KH_ABI_MINOR,
		.host_data = e,
		.config_get = config,
	};
	e->threads = "2";
	return e;
}

/* Init with the settings in E; the status of init. */
static q4kh_status env_init(struct env *e)
{
	if (e->dev)
		e->b->device_close(e->dev);
	if (e->ctx)
		e->b->shutdown(e->ctx);
	e->dev = NULL;
	e->ctx = NULL;
	return e->b->init(&e->api, &e->ctx);
}

static struct env *env_open(const char *isa)
{
	struct env *e = env_load();

	e->isa = isa;
	cr_assert_eq(env_init(e), Q4KH_OK, "%s", e->b->last_error(NULL));
	cr_assert_eq(e->b->device_open(e->ctx, 0, &e->dev), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	return e;
}

static void env_close(struct env *e)
{
	if (e->dev)
		e->b->device_close(e->dev);
	if (e->ctx)
		e->b->shutdown(e->ctx);
	dlclose(e->dl);
	free(e);
}

/* Does this CPU run ISA (cpu-fast's name)? Asked of libgcc. */
static int cpu_runs(const char *isa)
{
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return 0;
	return !strcmp(isa, "avx2") ||
	       (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"));
}

static const char *const isas[] = { "avx2", "avx512" };

/* An env on the instruction set cpu-fast picks itself; skips the test on
 * a CPU without AVX2, where cpu-fast has no device. */
static struct env *env_open_default(void)
{
	if (!cpu_runs("avx2"))
		cr_skip_test("cpu-fast has no device on a CPU without AVX2");
	return env_open(NULL);
}

/* The body once per instruction set this CPU runs, with env E open on it
 * and its name isas[isa_]. */
#define FOR_EACH_ISA(e)                                                      \
	for (int isa_ = 0; isa_ < 2; isa_++)                                 \
		if (!cpu_runs(isas[isa_]))                                   \
			continue;                                            \
		else                                                         \
			for (struct env *e = env_open(isas[isa_]); e;        \
			     env_close(e), e = NULL)

/* A contiguous tensor of TYPE {ne0, ne1, ne2} in a new buffer, holding
 * DATA when not NULL. */
static struct q4kh_tensor tensor(struct env *e, uint32_t type, int64_t ne0, int64_t ne1,
                                 int64_t ne2, const void *data)
{
	struct q4kh_tensor t = { .type = type, .ne = { ne0, ne1, ne2, 1 } };
	const uint64_t row = (uint64_t)(ne0 / q4kh_type_block_elems(type)) *
	                     q4kh_type_block_bytes(type);

	t.nb[0] = (int64_t)q4kh_type_block_bytes(type);
	t.nb[1] = (int64_t)row;
	t.nb[2] = t.nb[1] * ne1;
	t.nb[3] = t.nb[2] * ne2;
	cr_assert_eq(e->b->buffer_alloc(e->dev, (uint64_t)t.nb[3], &t.buffer), Q4KH_OK);
	if (data)
		cr_assert_eq(e->b->buffer_upload(e->dev, t.buffer, 0, data, (uint64_t)t.nb[3]),
		             Q4KH_OK);
	return t;
}

static void *fetch(struct env *e, const struct q4kh_tensor *t)
{
	void *out = malloc((size_t)t->nb[3]);

	cr_assert_not_null(out);
	cr_assert_eq(e->b->buffer_download(e->dev, t->buffer, t->offset, out, (uint64_t)t->nb[3]),
	             Q4KH_OK);
	return out;
}

static void drop(struct env *e, struct q4kh_tensor *t)
{
	e->b->buffer_free(e->dev, t->buffer);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double uniform(void) /* [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

static float *randoms(int64_t n, double scale)
{
	float *x = malloc(sizeof(float) * (size_t)n);

	cr_assert_not_null(x);
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(uniform() * scale);
	return x;
}

#define EXPECT_NEAR(got, exact, bound, fmt, ...)                               \
	cr_expect(fabs((double)(got) - (exact)) <= (bound),                    \
	          fmt ": %.9g, float64 %.9g, error %.3g > bound %.3g", __VA_ARGS__, \
	          (double)(got), (double)(exact), fabs((double)(got) - (exact)), \
	          (double)(bound))

Test(cpu_fast, rms_norm_within_the_bound_of_a_float_sum)
{
	static const int64_t lens[] = { 640, 37, 256 };

	FOR_EACH_ISA(e) {
		for (int li = 0; li < 3; li++) {
			const int64_t n = lens[li], rows = 5;
			float *x = randoms(n * rows, 3.0), *w = randoms(n, 2.0), *got;
			struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, n, rows, 1, x);
			struct q4kh_tensor wt = tensor(e, Q4KH_TYPE_F32, n, 1, 1, w);
			struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, n, rows, 1, NULL);

			for (int with_w = 0; with_w < 2; with_w++) {
				cr_assert_eq(e->b->rms_norm(e->dev, &xt, with_w ? &wt : NULL, 1e-6f, &ot),
				             Q4KH_OK, "%s", e->b->last_error(e->ctx));
				got = fetch(e, &ot);
				for (int64_t r = 0; r < rows; r++) {
					double ss = 0, s;

					for (int64_t i = 0; i < n; i++)
						ss += (double)x[r * n + i] * x[r * n + i];
					s = 1.0 / sqrt(ss / n + 1e-6);
					for (int64_t i = 0; i < n; i++) {
						double exact = x[r * n + i] * s * (with_w ? w[i] : 1.0);

						EXPECT_NEAR(got[r * n + i], exact, (n + 8) * U * fabs(exact),
						            "%s rms_norm n %lld, row %lld, %lld", isas[isa_],
						            (long long)n, (long long)r, (long long)i);
					}
				}
				free(got);
			}
			/* In place. */
			cr_assert_eq(e->b->rms_norm(e->dev, &xt, &wt, 1e-6f, &xt), Q4KH_OK);
			drop(e, &xt);
			drop(e, &wt);
			drop(e, &ot);
			free(x);
			free(w);
		}
	}
}

/* a op b for a {ne0, 3, 2} and b broadcast as B_NE says, OP 0 add, 1 mul. */
static void binary_case(struct env *e, const char *isa, int op, const int64_t b_ne[3])
{
	const int64_t ne0 = 45, n = ne0 * 6;
	float *a = randoms(n, 10.0), *b = randoms(b_ne[0] * b_ne[1] * b_ne[2], 10.0), *got;
	struct q4kh_tensor at = tensor(e, Q4KH_TYPE_F32, ne0, 3, 2, a);
	struct q4kh_tensor bt = tensor(e, Q4KH_TYPE_F32, b_ne[0], b_ne[1], b_ne[2], b);
	struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, ne0, 3, 2, NULL);

	cr_assert_eq((op ? e->b->mul : e->b->add)(e->dev, &at, &bt, &ot), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &ot);
	for (int64_t i = 0; i < n; i++) {
		const int64_t i0 = i % ne0, i1 = (i / ne0) % 3, i2 = i / (ne0 * 3);
		const float y = b[(i0 % b_ne[0]) + b_ne[0] * ((i1 % b_ne[1]) + b_ne[1] * (i2 % b_ne[2]))];
		/* One rounding of an exact double sum or product. */
		const float exact = op ? (float)((double)a[i] * y) : (float)((double)a[i] + y);

		cr_expect_eq(got[i], exact, "%s %s b {%lld, %lld, %lld}, value %lld: %.9g, expected %.9g",
		             isa, op ? "mul" : "add", (long long)b_ne[0], (long long)b_ne[1],
		             (long long)b_ne[2], (long long)i, (double)got[i], (double)exact);
	}
	free(got);
	free(a);
	free(b);
	drop(e, &at);
	drop(e, &bt);
	drop(e, &ot);
}

Test(cpu_fast, add_mul_scale_round_once)
{
	static const int64_t shapes[][3] = { { 45, 3, 2 }, { 45, 1, 1 }, { 1, 3, 1 }, { 45, 3, 1 } };

	FOR_EACH_ISA(e) {
		float *x = randoms(300, 5.0), *got;
		struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, 100, 3, 1, x);

		for (int s = 0; s < 4; s++)
			for (int op = 0; op < 2; op++)
				binary_case(e, isas[isa_], op, shapes[s]);
		cr_assert_eq(e->b->scale(e->dev, &xt, 0.3f, &xt), Q4KH_OK);
		got = fetch(e, &xt);
		for (int i = 0; i < 300; i++)
			cr_expect_eq(got[i], (float)((double)x[i] * 0.3f), "%s scale %d", isas[isa_], i);
		free(got);
		free(x);
		drop(e, &xt);
	}
}

Test(cpu_fast, glu_within_a_few_ulp_of_its_argument)
{
	const int64_t n = 1000 + 7;

	FOR_EACH_ISA(e) {
		float *g = randoms(n, 12.0), *u = randoms(n, 2.0), *got;
		struct q4kh_tensor gt, ut, ot;

		g[0] = 0.0f;
		g[1] = -90.0f;
		g[2] = 95.0f;
		gt = tensor(e, Q4KH_TYPE_F32, n, 1, 1, g);
		ut = tensor(e, Q4KH_TYPE_F32, n, 1, 1, u);
		ot = tensor(e, Q4KH_TYPE_F32, n, 1, 1, NULL);
		for (int kind = 0; kind < 2; kind++) {
			cr_assert_eq(e->b->glu(e->dev, (q4kh_glu_kind)kind, &gt, &ut, &ot), Q4KH_OK);
			got = fetch(e, &ot);
			for (int64_t i = 0; i < n; i++) {
				/* The exponent's argument, and the activation in the
				 * form without 1 + tanh's cancellation. */
				const double x = kind == Q4KH_GLU_SILU
				                         ? -(double)g[i]
				                         : -1.5957691216057308 *
				                                   (g[i] + 0.044715 * g[i] * g[i] * g[i]);
				const double exact = g[i] / (1.0 + exp(x)) * u[i];

				EXPECT_NEAR(got[i], exact, (16 + 4 * fmin(fabs(x), 88)) * U * fabs(exact) + 1e-36,
				            "%s %s g = %g", isas[isa_], kind ? "SiLU" : "GELU",
				            (double)g[i]);
			}
			free(got);
		}
		free(g);
		free(u);
		drop(e, &gt);
		drop(e, &ut);
		drop(e, &ot);
	}
}

static double softplus_exact(double x)
{
	return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

Test(cpu_fast, unary_within_a_few_ulp_of_its_argument)
{
	const int64_t n = 1000 + 7;

	FOR_EACH_ISA(e) {
		float *x = randoms(n, 12.0), *got, *again;
		struct q4kh_tensor xt, ot;

		x[0] = 0.0f;
		x[1] = -90.0f;
		x[2] = 95.0f;
		xt = tensor(e, Q4KH_TYPE_F32, n, 1, 1, x);
		ot = tensor(e, Q4KH_TYPE_F32, n, 1, 1, NULL);
		for (int kind = 0; kind < 3; kind++) {
			cr_assert_eq(e->b->unary(e->dev, (q4kh_unary_kind)kind, &xt, &ot), Q4KH_OK,
			             "%s", e->b->last_error(e->ctx));
			got = fetch(e, &ot);
			for (int64_t i = 0; i < n; i++) {
				const double sig = 1.0 / (1.0 + exp(-(double)x[i]));
				const double exact = kind == Q4KH_UNARY_SIGMOID    ? sig
				                     : kind == Q4KH_UNARY_SOFTPLUS ? softplus_exact(x[i])
				                                                   : x[i] * sig;
				/* e^x within 2 ulp: as glu; softplus: expf and log1pf,
				 * each within an ulp or two. */
				const double bound = kind == Q4KH_UNARY_SOFTPLUS
				                             ? 8 * U * fabs(exact) + 1e-36
				                             : (16 + 4 * fmin(fabs(x[i]), 88)) * U *
				                                       fabs(exact) + 1e-36;

				EXPECT_NEAR(got[i], exact, bound, "%s unary %d x = %g", isas[isa_],
				            kind, (double)x[i]);
			}
			/* In place: the same values. */
			cr_assert_eq(e->b->buffer_upload(e->dev, ot.buffer, 0, x, sizeof(float) * n),
			             Q4KH_OK);
			cr_assert_eq(e->b->unary(e->dev, (q4kh_unary_kind)kind, &ot, &ot), Q4KH_OK);
			again = fetch(e, &ot);
			cr_expect_arr_eq(again, got, sizeof(float) * n, "%s unary %d in place",
			                 isas[isa_], kind);
			free(again);
			free(got);
		}
		free(x);
		drop(e, &xt);
		drop(e, &ot);
	}
}

/*
 * ssm_conv: each output a float sum of K products (K u of the sum of
 * |w u|); the kept values are copies, bit for bit. A prompt step, then a
 * decode step from the state it left.
 */
Test(cpu_fast, ssm_conv_within_a_float_sum_and_keeps_its_state)
{
	const int64_t C = 37, K = 4, steps[] = { 5, 1 };

	FOR_EACH_ISA(e) {
		float *w = randoms(K * C, 1.0), *state = randoms((K - 1) * C, 2.0);
		struct q4kh_tensor wt = tensor(e, Q4KH_TYPE_F32, K, C, 1, w);
		struct q4kh_tensor st = tensor(e, Q4KH_TYPE_F32, K - 1, C, 1, state);

		for (int s = 0; s < 2; s++) {
			const int64_t T = steps[s];
			float *x = randoms(C * T, 3.0), *got, *kept;
			struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, C, T, 1, x);
			struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, C, T, 1, NULL);

			cr_assert_eq(e->b->ssm_conv(e->dev, &xt, &wt, &st, &ot), Q4KH_OK, "%s",
			             e->b->last_error(e->ctx));
			got = fetch(e, &ot);
			kept = fetch(e, &st);
			for (int64_t c = 0; c < C; c++) {
				/* u: the kept values, then the step's inputs. */
				double u[16];

				for (int64_t i = 0; i < K - 1; i++)
					u[i] = state[c * (K - 1) + i];
				for (int64_t t = 0; t < T; t++)
					u[K - 1 + t] = x[t * C + c];
				for (int64_t t = 0; t < T; t++) {
					double exact = 0, mag = 0;

					for (int64_t i = 0; i < K; i++) {
						exact += w[c * K + i] * u[t + i];
						mag += fabs(w[c * K + i] * u[t + i]);
					}
					EXPECT_NEAR(got[t * C + c], exact, 2 * K * U * mag + 1e-38,
					            "%s ssm_conv step %d c %lld t %lld", isas[isa_], s,
					            (long long)c, (long long)t);
				}
				for (int64_t i = 0; i < K - 1; i++)
					cr_expect_eq(kept[c * (K - 1) + i], (float)u[T + i],
					             "%s ssm_conv step %d: kept value %lld of channel %lld",
					             isas[isa_], s, (long long)i, (long long)c);
			}
			memcpy(state, kept, sizeof(float) * (size_t)((K - 1) * C));
			free(got);
			free(kept);
			free(x);
			drop(e, &xt);
			drop(e, &ot);
		}
		free(w);
		free(state);
		drop(e, &wt);
		drop(e, &st);
	}
}

/*
 * delta_net against plugin.h's recurrence in double. The bound is a
 * running error analysis: the same recurrence over absolute values
 * (|S|, |k|, |q|, |v|, and |d| from them) bounds every intermediate, and
 * each token adds at most (S_k + 8) roundings of those to a state value
 * (two dot products of S_k terms, exp, the update), so after token t a
 * state value is within 2 t (S_k + 8) u of its absolute counterpart, and
 * an output within that of scale |S| |q|. Prompt steps of 3 tokens, then
 * decode steps of 1, each from the state the last one left.
 */
Test(cpu_fast, delta_net_within_its_running_error_bound)
{
	const int64_t sk = 20, sv = 12, hk = 2, hv = 4, steps[] = { 3, 1, 1 };
	const float scale = 0.22f;

	FOR_EACH_ISA(e) {
		float *state = randoms(sk * sv * hv, 0.5);
		double *S = malloc(sizeof(double) * (size_t)(sk * sv * hv));
		double *A = calloc((size_t)(sk * sv * hv), sizeof(double));
		struct q4kh_tensor stt = tensor(e, Q4KH_TYPE_F32, sk, sv, hv, state);
		int64_t tokens = 0;

		cr_assert(S && A);
		for (int64_t i = 0; i < sk * sv * hv; i++) {
			S[i] = state[i];
			A[i] = fabs(state[i]);
		}
		for (int s = 0; s < 3; s++) {
			const int64_t T = steps[s];
			float *q = randoms(sk * hk * T, 0.4), *k = randoms(sk * hk * T, 0.4);
			float *v = randoms(sv * hv * T, 2.0), *g = randoms(hv * T, 0.5);
			float *beta = randoms(hv * T, 0.5), *got, *after;
			struct q4kh_tensor qt, kt, vt, gt, bt, ot;

			for (int64_t i = 0; i < hv * T; i++) {
				g[i] = g[i] - 0.5f;       /* log decay in [-1, 0) */
				beta[i] = beta[i] + 0.5f; /* in [0, 1) */
			}
			qt = tensor(e, Q4KH_TYPE_F32, sk, hk, T, q);
			kt = tensor(e, Q4KH_TYPE_F32, sk, hk, T, k);
			vt = tensor(e, Q4KH_TYPE_F32, sv, hv, T, v);
			gt = tensor(e, Q4KH_TYPE_F32, hv, T, 1, g);
			bt = tensor(e, Q4KH_TYPE_F32, hv, T, 1, beta);
			ot = tensor(e, Q4KH_TYPE_F32, sv, hv, T, NULL);
			cr_assert_eq(e->b->delta_net(e->dev, &qt, &kt, &vt, &gt, &bt, &stt, scale, &ot),
			             Q4KH_OK, "%s", e->b->last_error(e->ctx));
			got = fetch(e, &ot);
			after = fetch(e, &stt);
			for (int64_t t = 0; t < T; t++) {
				tokens++;
				for (int64_t h = 0; h < hv; h++) {
					const float *kk = k + (t * hk + h % hk) * sk;
					const float *qq = q + (t * hk + h % hk) * sk;
					const double decay = exp((double)g[t * hv + h]);
					const double b = beta[t * hv + h];
					const double room = 2.0 * (double)tokens * (double)(sk + 8) * U;

					for (int64_t i = 0; i < sv; i++) {
						double *row = S + (h * sv + i) * sk, *arow = A + (h * sv + i) * sk;
						double rk = 0, ak = 0, o = 0, ao = 0, d, ad;

						for (int64_t c = 0; c < sk; c++) {
							row[c] *= decay;
							arow[c] *= decay;
							rk += row[c] * kk[c];
							ak += arow[c] * fabs(kk[c]);
						}
						d = b * (v[(t * hv + h) * sv + i] - rk);
						ad = b * (fabs(v[(t * hv + h) * sv + i]) + ak);
						for (int64_t c = 0; c < sk; c++) {
							row[c] += d * kk[c];
							arow[c] += ad * fabs(kk[c]);
							o += row[c] * qq[c];
							ao += arow[c] * fabs(qq[c]);
						}
						EXPECT_NEAR(got[(t * hv + h) * sv + i], scale * o,
						            room * scale * ao + 1e-37,
						            "%s delta_net step %d token %lld head %lld row %lld",
						            isas[isa_], s, (long long)t, (long long)h,
						            (long long)i);
					}
				}
			}
			for (int64_t i = 0; i < sk * sv * hv; i++)
				EXPECT_NEAR(after[i], S[i],
				            2.0 * (double)tokens * (double)(sk + 8) * U * A[i] + 1e-37,
				            "%s delta_net step %d: state value %lld", isas[isa_], s,
				            (long long)i);
			free(q);
			free(k);
			free(v);
			free(g);
			free(beta);
			free(got);
			free(after);
			drop(e, &qt);
			drop(e, &kt);
			drop(e, &vt);
			drop(e, &gt);
			drop(e, &bt);
			drop(e, &ot);
		}
		free(state);
		free(S);
		free(A);
		drop(e, &stt);
	}
}

/* plugin.h's RoPE in double: pair i of a token at position pos. */
static void rope_exact(const struct q4kh_rope_params *p, const float *ff, int64_t pos,
                       int32_t i, double *c, double *s)
{
	double extrap = pos * pow(p->base, -2.0 * i / p->n_rot) / (ff ? ff[i] : 1.0);
	double theta = p->freq_scale * extrap, m = p->attn_factor;

	if (p->ext_factor != 0.0f) {
		double d_fast = p->n_rot * log(p->n_ctx_orig / (p->beta_fast * 2 * M_PI)) /
		                (2 * log(p->base));
		double d_slow = p->n_rot * log(p->n_ctx_orig / (p->beta_slow * 2 * M_PI)) /
		                (2 * log(p->base));
		double lo = fmax(0, floor(d_fast)), hi = fmin(p->n_rot - 1, ceil(d_slow));
		double r = p->ext_factor * (1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo))));

		theta = theta * (1 - r) + extrap * r;
		m *= 1 + 0.1 * log(1 / p->freq_scale);
	}
	*c = cos(theta) * m;
	*s = sin(theta) * m;
}

/*
 * GOT, x {hd, heads, T} rotated at POS with P (frequency factors FF or
 * NULL), against float64: within the rounding of the angles, the values
 * past n_rot passed through. WHAT names the case.
 */
static void expect_rope(const struct q4kh_rope_params *p, const float *ff, const int32_t *pos,
                        int64_t hd, int64_t heads, int64_t T, const float *x,
                        const float *got, const char *what)
{
	for (int64_t t = 0; t < T; t++)
		for (int64_t h = 0; h < heads; h++) {
			const float *xr = x + (t * heads + h) * hd;
			const float *gr = got + (t * heads + h) * hd;

			for (int32_t i = 0; i < p->n_rot / 2; i++) {
				const int ia = p->mode == Q4KH_ROPE_NEOX ? i : 2 * i;
				const int ib = p->mode == Q4KH_ROPE_NEOX ? i + p->n_rot / 2 : 2 * i + 1;
				double c, s, m;

				rope_exact(p, ff, pos[t], i, &c, &s);
				m = hypot(c, s);
				EXPECT_NEAR(gr[ia], xr[ia] * c - xr[ib] * s,
				            4 * U * m * (fabs(xr[ia]) + fabs(xr[ib])) + 1e-30,
				            "%s, t %lld head %lld pair %d", what, (long long)t,
				            (long long)h, i);
				EXPECT_NEAR(gr[ib], xr[ia] * s + xr[ib] * c,
				            4 * U * m * (fabs(xr[ia]) + fabs(xr[ib])) + 1e-30,
				            "%s, t %lld head %lld pair %d", what, (long long)t,
				            (long long)h, i);
			}
			for (int64_t i = p->n_rot; i < hd; i++)
				cr_expect_eq(gr[i], xr[i], "%s pass-through %lld", what, (long long)i);
		}
}

static void rope_case(struct env *e, const char *isa, uint32_t mode, int yarn, int factors)
{
	const int64_t hd = 64, heads = 3, T = 4;
	const int32_t pos[4] = { 0, 7, 2999, 8 };
	float ff[24];
	float *x = randoms(hd * heads * T, 3.0), *got;
	struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, hd, heads, T, x);
	struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, hd, heads, T, NULL);
	struct q4kh_tensor pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, pos), ft;
	struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 48, .mode = mode, .base = 10000.0f,
		.freq_scale = yarn ? 0.25f : 1.0f, .ext_factor = yarn ? 1.0f : 0.0f,
		.attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 4096,
	};
	char what[96];

	for (int i = 0; i < 24; i++)
		ff[i] = 1.0f + (float)i / 3;
	ft = tensor(e, Q4KH_TYPE_F32, 24, 1, 1, ff);
	p.freq_factors = factors ? &ft : NULL;
	cr_assert_eq(e->b->rope_ext(e->dev, &xt, &pt, &p, &ot), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &ot);
	snprintf(what, sizeof(what), "%s rope mode %u yarn %d factors %d", isa, mode, yarn,
	         factors);
	expect_rope(&p, factors ? ff : NULL, pos, hd, heads, T, x, got, what);
	free(got);
	free(x);
	drop(e, &xt);
	drop(e, &ot);
	drop(e, &pt);
	drop(e, &ft);
}

Test(cpu_fast, rope_within_the_rounding_of_its_angles)
{
	FOR_EACH_ISA(e) {
		for (int mode = 0; mode < 2; mode++)
			for (int yarn = 0; yarn < 2; yarn++)
				for (int factors = 0; factors < 2; factors++)
					rope_case(e, isas[isa_], mode ? Q4KH_ROPE_NEOX : Q4KH_ROPE_NORM,
					          yarn, factors);
	}
}

/*
 * Attention of T queries over a cache of TYPE, against float64: at
 * positions pos0 + t, or with EXT at 5, 30, 31 (T = 3) or 3 + 4t (more:
 * a step that converts an f16 cache first).
 */
static void attention_case(struct env *e, const char *isa, uint32_t type, int32_t window,
                           float softcap, int ext, int64_t T)
{
	const int64_t hd = 40, heads = 4, kv = 2, n_ctx = 64;
	const int32_t pos0 = 20;
	int32_t ext_pos[12];
	float *q = randoms(hd * heads * T, 1.5), *k = randoms(hd * kv * n_ctx, 1.5);
	float *v = randoms(hd * kv * n_ctx, 4.0), *got;
	uint16_t *kh = malloc(sizeof(uint16_t) * (size_t)(hd * kv * n_ctx));
	uint16_t *vh = malloc(sizeof(uint16_t) * (size_t)(hd * kv * n_ctx));
	const int f16 = type == Q4KH_TYPE_F16;
	struct q4kh_tensor qt, kt, vt, ot, pt;

	cr_assert_leq(T, 12);
	for (int64_t t = 0; t < T; t++)
		ext_pos[t] = T == 3 ? (int32_t[]){ 5, 30, 31 }[t] : (int32_t)(3 + 4 * t);
	struct q4kh_attn_params p = { .struct_size = sizeof(p), .window = window,
		                      .pos0 = pos0, .scale = 0.3f, .softcap = softcap };

	for (int64_t i = 0; i < hd * kv * n_ctx; i++) {
		/* The cache holds what it holds: f16 values seen exactly. */
		kh[i] = q4kh_f32_to_fp16(k[i]);
		vh[i] = q4kh_f32_to_fp16(v[i]);
		if (f16) {
			k[i] = q4kh_fp16_to_f32(kh[i]);
			v[i] = q4kh_fp16_to_f32(vh[i]);
		}
	}
	qt = tensor(e, Q4KH_TYPE_F32, hd, heads, T, q);
	kt = tensor(e, type, hd, kv, n_ctx, f16 ? (const void *)kh : k);
	vt = tensor(e, type, hd, kv, n_ctx, f16 ? (const void *)vh : v);
	ot = tensor(e, Q4KH_TYPE_F32, hd, heads, T, NULL);
	pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, ext_pos);
	cr_assert_eq(ext ? e->b->attention_ext(e->dev, &qt, &kt, &vt, &pt, &p, &ot)
	                 : e->b->attention(e->dev, &qt, &kt, &vt, &p, &ot),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	got = fetch(e, &ot);
	for (int64_t t = 0; t < T; t++)
		for (int64_t h = 0; h < heads; h++) {
			const int64_t g = h / (heads / kv), pos = ext ? ext_pos[t] : pos0 + t;
			const int64_t first = window && pos - window + 1 > 0 ? pos - window + 1 : 0;
			const float *qr = q + (t * heads + h) * hd;
			double s[64], max = -INFINITY, sum = 0, serr = 0;

			for (int64_t j = first; j <= pos; j++) {
				const float *kr = k + (j * kv + g) * hd;
				double dot = 0, mag = 0;

				for (int64_t i = 0; i < hd; i++) {
					dot += (double)qr[i] * kr[i];
					mag += fabs((double)qr[i] * kr[i]);
				}
				s[j] = 0.3 * dot;
				if (softcap > 0)
					s[j] = softcap * tanh(s[j] / softcap);
				/* tanhf adds a few ulp of the cap itself */
				serr = fmax(serr, (hd + 4) * U * 0.3 * mag + 4 * U * softcap);
				max = fmax(max, s[j]);
			}
			for (int64_t j = first; j <= pos; j++)
				sum += s[j] = exp(s[j] - max);
			for (int64_t d = 0; d < hd; d++) {
				double exact = 0, wabs = 0;

				for (int64_t j = first; j <= pos; j++) {
					exact += s[j] * v[(j * kv + g) * hd + d];
					wabs += s[j] * fabs(v[(j * kv + g) * hd + d]);
				}
				EXPECT_NEAR(got[(t * heads + h) * hd + d], exact / sum,
				            (2 * serr + (pos - first + 9) * U) * 2 * wabs / sum + 1e-30,
				            "%s attention %s window %d softcap %g ext %d, t %lld head %lld "
				            "value %lld",
				            isa, q4kh_type_name(type), window, (double)softcap, ext,
				            (long long)t, (long long)h, (long long)d);
			}
		}
	free(got);
	free(q);
	free(k);
	free(v);
	free(kh);
	free(vh);
	drop(e, &qt);
	drop(e, &kt);
	drop(e, &vt);
	drop(e, &ot);
	drop(e, &pt);
}

Test(cpu_fast, attention_within_the_bound_of_its_scores)
{
	FOR_EACH_ISA(e) {
		for (int f16 = 0; f16 < 2; f16++)
			for (int ext = 0; ext < 2; ext++) {
				const uint32_t type = f16 ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32;

				for (int64_t T = 3; T <= 12; T += 9) {
					attention_case(e, isas[isa_], type, 0, 0.0f, ext, T);
					attention_case(e, isas[isa_], type, 6, 0.0f, ext, T);
					attention_case(e, isas[isa_], type, 0, 2.5f, ext, T);
				}
			}
	}
}

Test(cpu_fast, cache_writes_round_to_nearest_even)
{
	FOR_EACH_ISA(e) {
		const int64_t a = 40, b = 2, T = 3, n = 10;
		const int32_t rows[3] = { 7, 0, 9 };
		float *src = randoms(a * b * T, 70000.0), *back;
		uint16_t *cache;
		struct q4kh_tensor st, rt, ct, ft;

		src[1] = 1e-7f; /* a subnormal half */
		src[2] = 65520.0f; /* rounds to infinity */
		st = tensor(e, Q4KH_TYPE_F32, a, b, T, src);
		rt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, rows);
		ct = tensor(e, Q4KH_TYPE_F16, a, b, n, NULL);
		ft = tensor(e, Q4KH_TYPE_F32, a, b, n, NULL);
		cr_assert_eq(e->b->set_rows(e->dev, &st, &rt, &ct), Q4KH_OK, "%s",
		             e->b->last_error(e->ctx));
		cr_assert_eq(e->b->copy(e->dev, &ct, &ft), Q4KH_OK, "%s", e->b->last_error(e->ctx));
		cache = fetch(e, &ct);
		back = fetch(e, &ft);
		for (int64_t t = 0; t < T; t++)
			for (int64_t i = 0; i < a * b; i++) {
				const int64_t at = rows[t] * a * b + i;

				cr_expect_eq(cache[at], q4kh_f32_to_fp16(src[t * a * b + i]),
				             "%s set_rows token %lld value %lld", isas[isa_], (long long)t,
				             (long long)i);
				cr_expect_eq(back[at], q4kh_fp16_to_f32(cache[at]), "%s copy back",
				             isas[isa_]);
			}
		free(src);
		free(cache);
		free(back);
		drop(e, &st);
		drop(e, &rt);
		drop(e, &ct);
		drop(e, &ft);
	}
}

/*
 * add_rms_norm (ABI 1.4) of x {n, rows} and a into out, which is apart
 * (OUT_AT 0), x (1) or a (2): bit for bit what add then rms_norm give,
 * the sum rounded once from float64's, the norm within rms_norm's bound.
 */
static void add_rms_norm_case(struct env *e, const char *isa, int64_t n, int with_w, int out_at)
{
	const int64_t rows = 5;
	float *x = randoms(n * rows, 3.0), *a = randoms(n * rows, 2.0), *w = randoms(n, 2.0);
	struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, n, rows, 1, x);
	struct q4kh_tensor at = tensor(e, Q4KH_TYPE_F32, n, rows, 1, a);
	struct q4kh_tensor wt = tensor(e, Q4KH_TYPE_F32, n, 1, 1, w);
	struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, n, rows, 1, NULL);
	struct q4kh_tensor *out = out_at == 1 ? &xt : out_at == 2 ? &at : &ot;
	float *sum, *norm, *want_sum, *want_norm;

	/* the two ops, then the fused entry on the same inputs */
	cr_assert_eq(e->b->add(e->dev, &xt, &at, &xt), Q4KH_OK);
	cr_assert_eq(e->b->rms_norm(e->dev, &xt, with_w ? &wt : NULL, 1e-6f, out), Q4KH_OK);
	want_sum = fetch(e, &xt);
	want_norm = fetch(e, out);
	cr_assert_eq(e->b->buffer_upload(e->dev, xt.buffer, 0, x, (uint64_t)xt.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->buffer_upload(e->dev, at.buffer, 0, a, (uint64_t)at.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->add_rms_norm(e->dev, &xt, &at, with_w ? &wt : NULL, 1e-6f, out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	sum = fetch(e, &xt);
	norm = fetch(e, out);
	if (out_at != 1)
		cr_expect_eq(memcmp(sum, want_sum, sizeof(float) * (size_t)(n * rows)), 0,
		             "%s add_rms_norm n %lld: x differs from add's", isa, (long long)n);
	cr_expect_eq(memcmp(norm, want_norm, sizeof(float) * (size_t)(n * rows)), 0,
	             "%s add_rms_norm n %lld w %d out %d: differs from add then rms_norm", isa,
	             (long long)n, with_w, out_at);
	for (int64_t r = 0; r < rows; r++) {
		double ss = 0, sc;

		for (int64_t i = 0; i < n; i++) {
			const float v = (float)((double)x[r * n + i] + a[r * n + i]);

			if (out_at != 1)
				cr_expect_eq(sum[r * n + i], v, "%s add_rms_norm sum %lld", isa,
				             (long long)i);
			ss += (double)v * v;
		}
		sc = 1.0 / sqrt(ss / n + 1e-6);
		for (int64_t i = 0; i < n; i++) {
			const float v = (float)((double)x[r * n + i] + a[r * n + i]);
			const double exact = v * sc * (with_w ? w[i] : 1.0);

			EXPECT_NEAR(norm[r * n + i], exact, (n + 8) * U * fabs(exact),
			            "%s add_rms_norm n %lld, row %lld, %lld", isa, (long long)n,
			            (long long)r, (long long)i);
		}
	}
	free(sum);
	free(norm);
	free(want_sum);
	free(want_norm);
	free(x);
	free(a);
	free(w);
	drop(e, &xt);
	drop(e, &at);
	drop(e, &wt);
	drop(e, &ot);
}

Test(cpu_fast, add_rms_norm_is_add_then_rms_norm)
{
	static const int64_t lens[] = { 640, 37 };

	FOR_EACH_ISA(e) {
		for (int li = 0; li < 2; li++)
			for (int with_w = 0; with_w < 2; with_w++)
				for (int out_at = 0; out_at < 3; out_at++)
					add_rms_norm_case(e, isas[isa_], lens[li], with_w, out_at);
	}
}

/*
 * rope_set_rows (ABI 1.4) into a cache of TYPE: x and the cache bit for
 * bit what rope_ext then set_rows give; the cache rows are x's rows
 * (rounded to f16 for an f16 cache), x within rope's bound of float64.
 */
static void rope_set_rows_case(struct env *e, const char *isa, uint32_t type, uint32_t mode,
                               int yarn)
{
	const int64_t hd = 64, heads = 3, T = 4, n = 12;
	const int32_t pos[4] = { 3, 0, 11, 7 };
	const size_t row = q4kh_type_block_bytes(type);
	float ff[24];
	float *x = randoms(hd * heads * T, 3.0), *got, *want;
	struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, hd, heads, T, x);
	struct q4kh_tensor pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, pos), ft;
	struct q4kh_tensor ct = tensor(e, type, hd, heads, n, NULL);
	struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 48, .mode = mode, .base = 10000.0f,
		.freq_scale = yarn ? 0.25f : 1.0f, .ext_factor = yarn ? 1.0f : 0.0f,
		.attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 4096,
	};
	unsigned char *cache, *want_cache;
	char what[96];

	for (int i = 0; i < 24; i++)
		ff[i] = 1.0f + (float)i / 3;
	ft = tensor(e, Q4KH_TYPE_F32, 24, 1, 1, ff);
	p.freq_factors = yarn ? &ft : NULL;
	cr_assert_eq(e->b->rope_ext(e->dev, &xt, &pt, &p, &xt), Q4KH_OK);
	cr_assert_eq(e->b->set_rows(e->dev, &xt, &pt, &ct), Q4KH_OK);
	want = fetch(e, &xt);
	want_cache = fetch(e, &ct);
	cr_assert_eq(e->b->buffer_upload(e->dev, xt.buffer, 0, x, (uint64_t)xt.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->rope_set_rows(e->dev, &xt, &pt, &p, &ct), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &xt);
	cache = fetch(e, &ct);
	cr_expect_eq(memcmp(got, want, sizeof(float) * (size_t)(hd * heads * T)), 0,
	             "%s rope_set_rows x differs from rope_ext's", isa);
	snprintf(what, sizeof(what), "%s rope_set_rows type %u mode %u yarn %d", isa, type, mode,
	         yarn);
	expect_rope(&p, yarn ? ff : NULL, pos, hd, heads, T, x, got, what);
	for (int64_t t = 0; t < T; t++) {
		const size_t at = (size_t)(pos[t] * heads * hd) * row;

		cr_expect_eq(memcmp(cache + at, want_cache + at, (size_t)(heads * hd) * row), 0,
		             "%s: cache row %d differs from set_rows'", what, pos[t]);
		for (int64_t h = 0; h < heads; h++) {
			const float *gr = got + (t * heads + h) * hd;

			for (int64_t i = 0; i < hd; i++) {
				const size_t ci = (size_t)((pos[t] * heads + h) * hd + i);

				if (type == Q4KH_TYPE_F16)
					cr_expect_eq(((const uint16_t *)cache)[ci], q4kh_f32_to_fp16(gr[i]),
					             "%s: cache value %lld", what, (long long)i);
				else
					cr_expect_eq(((const float *)cache)[ci], gr[i],
					             "%s: cache value %lld", what, (long long)i);
			}
		}
	}
	free(got);
	free(want);
	free(cache);
	free(want_cache);
	free(x);
	drop(e, &xt);
	drop(e, &pt);
	drop(e, &ft);
	drop(e, &ct);
}

Test(cpu_fast, rope_set_rows_is_rope_ext_then_set_rows)
{
	FOR_EACH_ISA(e) {
		for (int f16 = 0; f16 < 2; f16++)
			for (int mode = 0; mode < 2; mode++)
				for (int yarn = 0; yarn < 2; yarn++)
					rope_set_rows_case(e, isas[isa_],
					                   f16 ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
					                   mode ? Q4KH_ROPE_NEOX : Q4KH_ROPE_NORM, yarn);
	}
}

/*
 * rope_store (ABI 1.4): q, k and caches of types KT (keys) and VT
 * (values), holding the same bytes beforehand, bit for bit what
 * rope_ext of q, rope_ext and set_rows of k and set_rows of v give. T
 * tokens at arbitrary positions, grouped-query heads (6 query heads, 2 KV
 * heads), values of HD_V per head.
 */
static void rope_store_case(struct env *e, const char *isa, uint32_t kt, uint32_t vt,
                            uint32_t mode, int yarn, int64_t T, int64_t hd_v)
{
	const int64_t hd = 64, hq = 6, hkv = 2, n = 12;
	const int32_t pos[4] = { 3, 0, 11, 7 }, pos1[1] = { 9 };
	float ff[24];
	float *q = randoms(hd * hq * T, 3.0), *k = randoms(hd * hkv * T, 3.0);
	float *v = randoms(hd_v * hkv * T, 3.0);
	float *kfill = randoms(hd * hkv * n, 1.0), *vfill = randoms(hd_v * hkv * n, 1.0);
	struct q4kh_tensor pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, T == 1 ? pos1 : pos), ft;
	struct q4kh_tensor t[2][5]; /* the three ops', rope_store's: q k v k_cache v_cache */
	struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 48, .mode = mode, .base = 10000.0f,
		.freq_scale = yarn ? 0.25f : 1.0f, .ext_factor = yarn ? 1.0f : 0.0f,
		.attn_factor = yarn ? 0.75f : 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f,
		.n_ctx_orig = 4096,
	};
	static const char *const names[5] = { "q", "k", "v", "k_cache", "v_cache" };

	for (int i = 0; i < 24; i++)
		ff[i] = 1.0f + (float)i / 3;
	ft = tensor(e, Q4KH_TYPE_F32, 24, 1, 1, ff);
	p.freq_factors = yarn ? &ft : NULL;
	for (int s = 0; s < 2; s++) {
		t[s][0] = tensor(e, Q4KH_TYPE_F32, hd, hq, T, q);
		t[s][1] = tensor(e, Q4KH_TYPE_F32, hd, hkv, T, k);
		t[s][2] = tensor(e, Q4KH_TYPE_F32, hd_v, hkv, T, v);
		/* the caches' bytes beforehand: whatever the floats' bytes are */
		t[s][3] = tensor(e, kt, hd, hkv, n, NULL);
		t[s][4] = tensor(e, vt, hd_v, hkv, n, NULL);
		cr_assert_eq(e->b->buffer_upload(e->dev, t[s][3].buffer, 0, kfill,
		                                 (uint64_t)t[s][3].nb[3]), Q4KH_OK);
		cr_assert_eq(e->b->buffer_upload(e->dev, t[s][4].buffer, 0, vfill,
		                                 (uint64_t)t[s][4].nb[3]), Q4KH_OK);
	}
	cr_assert_eq(e->b->rope_ext(e->dev, &t[0][0], &pt, &p, &t[0][0]), Q4KH_OK);
	cr_assert_eq(e->b->rope_ext(e->dev, &t[0][1], &pt, &p, &t[0][1]), Q4KH_OK);
	cr_assert_eq(e->b->set_rows(e->dev, &t[0][1], &pt, &t[0][3]), Q4KH_OK);
	cr_assert_eq(e->b->set_rows(e->dev, &t[0][2], &pt, &t[0][4]), Q4KH_OK);
	cr_assert_eq(e->b->rope_store(e->dev, &t[1][0], &t[1][1], &t[1][2], &pt, &p, &t[1][3],
	                              &t[1][4]),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	for (int i = 0; i < 5; i++) {
		unsigned char *want = fetch(e, &t[0][i]), *got = fetch(e, &t[1][i]);

		cr_expect_eq(memcmp(got, want, (size_t)t[0][i].nb[3]), 0,
		             "%s rope_store %s, caches %u/%u, mode %u, yarn %d, T %lld, hd_v %lld: "
		             "differs from the three ops'",
		             isa, names[i], kt, vt, mode, yarn, (long long)T, (long long)hd_v);
		free(want);
		free(got);
	}
	for (int s = 0; s < 2; s++)
		for (int i = 0; i < 5; i++)
			drop(e, &t[s][i]);
	drop(e, &pt);
	drop(e, &ft);
	free(q);
	free(k);
	free(v);
	free(kfill);
	free(vfill);
}

Test(cpu_fast, rope_store_is_rope_ext_rope_set_rows_and_set_rows)
{
	FOR_EACH_ISA(e) {
		for (int kt = 0; kt < 2; kt++)
			for (int vt = 0; vt < 2; vt++)
				for (int mode = 0; mode < 2; mode++)
					for (int yarn = 0; yarn < 2; yarn++)
						for (int shape = 0; shape < 2; shape++)
							rope_store_case(e, isas[isa_],
							                kt ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
							                vt ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
							                mode ? Q4KH_ROPE_NEOX : Q4KH_ROPE_NORM,
							                yarn, shape ? 1 : 4, shape ? 40 : 64);
	}
}

/* The fused entries refuse what their two ops refuse, and their own
 * aliasing: a broadcast or overlapping a, a position beyond the cache;
 * rope_store a position beyond either cache, a negative one, q on k. */
Test(cpu_fast, fused_entries_refuse_with_one_line)
{
	const int32_t pos[2] = { 1, 4 }, neg[2] = { 1, -2 };
	const struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 8, .mode = Q4KH_ROPE_NORM, .base = 10000.0f,
		.freq_scale = 1.0f, .attn_factor = 1.0f,
	};
	struct q4kh_tensor x, a, b, pt, ct, kc;
	struct env *e;

	e = env_open_default();
	x = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	a = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	b = tensor(e, Q4KH_TYPE_F32, 8, 1, 1, NULL);
	cr_expect_eq(e->b->add_rms_norm(e->dev, &x, &b, NULL, 1e-6f, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "add_rms_norm a: shape {8, 1, 1, 1}, expected {8, 2, 1, 1}");
	cr_expect_eq(e->b->add_rms_norm(e->dev, &x, &x, NULL, 1e-6f, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "add_rms_norm a (offset 0) overlaps x (offset 0) in one buffer");
	drop(e, &x);
	x = tensor(e, Q4KH_TYPE_F32, 8, 1, 2, NULL);
	pt = tensor(e, Q4KH_TYPE_I32, 2, 1, 1, pos);
	ct = tensor(e, Q4KH_TYPE_F16, 8, 1, 4, NULL);
	cr_expect_eq(e->b->rope_set_rows(e->dev, &x, &pt, &p, &ct), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "set_rows rows[1] = 4, expected 0 .. 3");
	drop(e, &a);
	drop(e, &b);
	a = tensor(e, Q4KH_TYPE_F32, 8, 1, 2, NULL);
	b = tensor(e, Q4KH_TYPE_F32, 8, 1, 2, NULL);
	kc = tensor(e, Q4KH_TYPE_F16, 8, 1, 8, NULL);
	cr_expect_eq(e->b->rope_store(e->dev, &x, &a, &b, &pt, &p, &kc, &ct), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "set_rows rows[1] = 4, expected 0 .. 3");
	cr_expect_eq(e->b->rope_store(e->dev, &x, &a, &b, &pt, &p, &ct, &kc), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "set_rows rows[1] = 4, expected 0 .. 3");
	cr_expect_eq(e->b->rope_store(e->dev, &x, &x, &b, &pt, &p, &kc, &kc), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "rope_store q (offset 0) overlaps rope_store k (offset 0) in one buffer");
	drop(e, &pt);
	pt = tensor(e, Q4KH_TYPE_I32, 2, 1, 1, neg);
	cr_expect_eq(e->b->rope_store(e->dev, &x, &a, &b, &pt, &p, &kc, &ct), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "rope_ext pos[1] = -2, expected 0 .. 2147483646");
	drop(e, &kc);
	drop(e, &x);
	drop(e, &a);
	drop(e, &b);
	drop(e, &pt);
	drop(e, &ct);
	env_close(e);
}

/*
 * U2 and U4 (docs/plugin-abi.md): positions out of range fail as the ops
 * a fused entry stands for, issued one after the other, each failing
 * alone. ROPE_STORE 0: rope_set_rows of k into a cache of K_ROWS rows,
 * against rope_ext then set_rows; 1: rope_store with caches of K_ROWS
 * and V_ROWS rows, against rope_ext of q, rope_ext and set_rows of k,
 * set_rows of v. POS {1, POS1}: one past a cache leaves that cache's
 * bytes, and only that cache's, as they were (q and k rotated, the other
 * cache written); a negative one writes nothing. LINE: the one line
 * (rope_store's: k's cache first, as the ops run).
 */
static void out_of_range_case(struct env *e, const char *isa, int rope_store, int32_t pos1,
                              int64_t k_rows, int64_t v_rows, const char *line)
{
	const int64_t hd = 16, T = 2, rows[5] = { T, T, T, k_rows, v_rows };
	const int64_t heads[5] = { 2, 1, 1, 1, 1 };
	const int32_t pos[2] = { 1, pos1 };
	const struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 8, .mode = Q4KH_ROPE_NEOX, .base = 10000.0f,
		.freq_scale = 1.0f, .attn_factor = 1.0f,
	};
	static const char *const names[5] = { "q", "k", "v", "k_cache", "v_cache" };
	struct q4kh_tensor t[2][5], pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, pos); /* q k v kc vc */
	float *vals[5];
	q4kh_status st;

	for (int i = 0; i < 5; i++)
		vals[i] = randoms(hd * heads[i] * rows[i], 2.0);
	for (int s = 0; s < 2; s++)
		for (int i = 0; i < 5; i++)
			t[s][i] = tensor(e, i == 3 ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32, hd, heads[i],
			                 rows[i], vals[i]);
	/* the ops alone, each failing or not on its own */
	if (rope_store)
		(void)e->b->rope_ext(e->dev, &t[0][0], &pt, &p, &t[0][0]);
	(void)e->b->rope_ext(e->dev, &t[0][1], &pt, &p, &t[0][1]);
	(void)e->b->set_rows(e->dev, &t[0][1], &pt, &t[0][3]);
	if (rope_store)
		(void)e->b->set_rows(e->dev, &t[0][2], &pt, &t[0][4]);
	st = rope_store ? e->b->rope_store(e->dev, &t[1][0], &t[1][1], &t[1][2], &pt, &p,
	                                   &t[1][3], &t[1][4])
	                : e->b->rope_set_rows(e->dev, &t[1][1], &pt, &p, &t[1][3]);
	cr_expect_eq(st, Q4KH_ERR_INVALID, "%s %s pos[1] %d", isa,
	             rope_store ? "rope_store" : "rope_set_rows", pos1);
	cr_expect_str_eq(e->b->last_error(e->ctx), line);
	for (int i = 0; i < 5; i++) {
		unsigned char *want = fetch(e, &t[0][i]), *got = fetch(e, &t[1][i]);

		cr_expect_eq(memcmp(got, want, (size_t)t[0][i].nb[3]), 0,
		             "%s %s pos[1] %d, caches of %lld and %lld rows: %s differs from "
		             "the ops'",
		             isa, rope_store ? "rope_store" : "rope_set_rows", pos1,
		             (long long)k_rows, (long long)v_rows, names[i]);
		free(want);
		free(got);
	}
	for (int i = 0; i < 5; i++) {
		drop(e, &t[0][i]);
		drop(e, &t[1][i]);
		free(vals[i]);
	}
	drop(e, &pt);
}

Test(cpu_fast, fused_entries_rotate_before_a_position_past_the_cache_fails)
{
	static const char past_k[] = "set_rows rows[1] = 4, expected 0 .. 3";
	static const char past_v[] = "set_rows rows[1] = 4, expected 0 .. 2";
	static const char negative[] = "rope_ext pos[1] = -2, expected 0 .. 2147483646";

	FOR_EACH_ISA(e) {
		out_of_range_case(e, isas[isa_], 0, 4, 4, 8, past_k);
		out_of_range_case(e, isas[isa_], 0, -2, 4, 8, negative);
		out_of_range_case(e, isas[isa_], 1, 4, 4, 8, past_k);
		out_of_range_case(e, isas[isa_], 1, 4, 8, 3, past_v);
		out_of_range_case(e, isas[isa_], 1, 4, 4, 3, past_k);
		out_of_range_case(e, isas[isa_], 1, -2, 8, 8, negative);
	}
}

/*
 * top2 (ABI 1.4) of T columns of N values, each column of another kind
 * (from FIRST on), against the host's q4kh_top2, bit for bit; idx and val
 * in one buffer as the session places them, idx first, val's rows here
 * padded to 16 bytes.
 */
static void top2_case(struct env *e, const char *isa, int64_t n, int64_t T, int first)
{
	float *x = malloc(sizeof(float) * (size_t)(n * T));
	const char *kinds[16];
	struct q4kh_tensor xt, idx = { .type = Q4KH_TYPE_I32 }, val = { .type = Q4KH_TYPE_F32 };
	unsigned char *out;
	char what[160];

	cr_assert_not_null(x);
	for (int64_t t = 0; t < T; t++)
		kinds[t] = test_top2_column((first + (int)t) % TEST_TOP2_KINDS, x + t * n, n,
		                            (uint64_t)(n * 131 + t));
	xt = tensor(e, Q4KH_TYPE_F32, n, T, 1, x);
	cr_assert_eq(e->b->buffer_alloc(e->dev, (uint64_t)(20 * T), &idx.buffer), Q4KH_OK);
	idx.ne[0] = T;
	idx.ne[1] = idx.ne[2] = idx.ne[3] = 1;
	idx.nb[0] = 4;
	idx.nb[1] = idx.nb[2] = idx.nb[3] = 4 * T;
	val.buffer = idx.buffer;
	val.offset = (uint64_t)(4 * T);
	val.ne[0] = 2;
	val.ne[1] = T;
	val.ne[2] = val.ne[3] = 1;
	val.nb[0] = 4;
	val.nb[1] = 16;
	val.nb[2] = val.nb[3] = 16 * T;
	cr_assert_eq(e->b->top2(e->dev, &xt, &idx, &val), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	out = malloc((size_t)(20 * T));
	cr_assert_not_null(out);
	cr_assert_eq(e->b->buffer_download(e->dev, idx.buffer, 0, out, (uint64_t)(20 * T)),
	             Q4KH_OK);
	for (int64_t t = 0; t < T; t++) {
		int32_t i;

		memcpy(&i, out + 4 * t, sizeof(i));
		snprintf(what, sizeof(what), "%s top2 n %lld column %lld of %lld (%s)", isa,
		         (long long)n, (long long)t, (long long)T, kinds[t]);
		test_expect_top2(x + t * n, n, i, (const float *)(out + 4 * T + 16 * t), what);
	}
	drop(e, &xt);
	drop(e, &idx);
	free(out);
	free(x);
}

Test(cpu_fast, top2_is_the_hosts_pick)
{
	static const int64_t lens[] = { 1, 2, 3, 33, 4096, 151936 };

	FOR_EACH_ISA(e) {
		for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
			for (int k = 0; k < TEST_TOP2_KINDS; k++)
				top2_case(e, isas[isa_], lens[li], 1, k);
		top2_case(e, isas[isa_], 1, 16, 0);
		top2_case(e, isas[isa_], 1000, TEST_TOP2_KINDS, 0);
		top2_case(e, isas[isa_], 33, 16, 5);
	}
}

/* top2 refuses outputs that overlap x or each other, and wrong shapes. */
Test(cpu_fast, top2_refuses_with_one_line)
{
	struct q4kh_tensor x, o, idx, val;
	struct env *e;

	e = env_open_default();
	x = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	o = tensor(e, Q4KH_TYPE_F32, 6, 1, 1, NULL);
	idx = o;
	idx.type = Q4KH_TYPE_I32;
	idx.ne[0] = 2;
	val = o;
	val.ne[0] = 2;
	val.ne[1] = 2;
	val.nb[1] = 8;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 val (offset 0) overlaps idx (offset 0) in one buffer");
	val.offset = 12;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 val: view {2, 2, 1, 1} at offset 12 ends past its 24-byte buffer");
	val.ne[1] = 1;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 val: shape {2, 1, 1, 1}, expected {2, 2, 1, 1}");
	idx.ne[0] = 1;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 idx: shape {1, 1, 1, 1}, expected {2, 1, 1, 1}");
	val.ne[1] = 2;
	val.offset = 8;
	idx = x;
	idx.type = Q4KH_TYPE_I32;
	idx.ne[0] = 2;
	idx.ne[1] = 1;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 idx (offset 0) overlaps x (offset 0) in one buffer");
	drop(e, &x);
	drop(e, &o);
	env_close(e);
}

/* A Q8_0 matrix {K, N} of random blocks, and its values in double. */
static struct q4kh_block_q8_0 *q8_0_matrix(int64_t k, int64_t n, double *exact)
{
	struct q4kh_block_q8_0 *m = malloc(sizeof(*m) * (size_t)(k / 32 * n));

	cr_assert_not_null(m);
	for (int64_t b = 0; b < k / 32 * n; b++) {
		m[b].d = q4kh_f32_to_fp16((float)(0.01 + 0.02 * fabs(uniform())));
		for (int i = 0; i < 32; i++) {
			m[b].qs[i] = (int8_t)(uniform() * 127);
			exact[b * 32 + i] = (double)q4kh_fp16_to_f32(m[b].d) * m[b].qs[i];
		}
	}
	return m;
}

Test(cpu_fast, get_rows_and_the_built_in_mul_mat)
{
	const int64_t k = 96, n = 21, T = 3;
	const int32_t ids[3] = { 20, 0, 7 };

	FOR_EACH_ISA(e) {
		double *w = malloc(sizeof(double) * (size_t)(k * n));
		struct q4kh_block_q8_0 *q8 = q8_0_matrix(k, n, w);
		float *x = randoms(k * T, 2.0), *wf = malloc(sizeof(float) * (size_t)(k * n)), *got;
		struct q4kh_tensor qt = tensor(e, Q4KH_TYPE_Q8_0, k, n, 1, q8);
		struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, k, T, 1, x);
		struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, k, T, 1, NULL);
		struct q4kh_tensor yt = tensor(e, Q4KH_TYPE_F32, n, T, 1, NULL);
		struct q4kh_tensor ft, it = tensor(e, Q4KH_TYPE_I32, T, 1, 1, ids);

		for (int64_t i = 0; i < k * n; i++)
			wf[i] = (float)w[i];
		ft = tensor(e, Q4KH_TYPE_F32, k, n, 1, wf);
		cr_assert_eq(e->b->get_rows_ext(e->dev, &qt, &it, 0.75f, &ot), Q4KH_OK, "%s",
		             e->b->last_error(e->ctx));
		got = fetch(e, &ot);
		for (int64_t t = 0; t < T; t++)
			for (int64_t i = 0; i < k; i++)
				cr_expect_eq(got[t * k + i], (float)(w[ids[t] * k + i] * 0.75),
				             "%s get_rows id %d value %lld", isas[isa_], ids[t],
				             (long long)i);
		free(got);
		for (int f32 = 0; f32 < 2; f32++) {
			cr_assert_eq(e->b->mul_mat(e->dev, f32 ? &ft : &qt, &xt, &yt), Q4KH_OK, "%s",
			             e->b->last_error(e->ctx));
			got = fetch(e, &yt);
			for (int64_t t = 0; t < T; t++)
				for (int64_t r = 0; r < n; r++) {
					double exact = 0, mag = 0;

					for (int64_t i = 0; i < k; i++) {
						exact += w[r * k + i] * x[t * k + i];
						mag += fabs(w[r * k + i] * x[t * k + i]);
					}
					EXPECT_NEAR(got[t * n + r], exact, (k + 4) * U * mag,
					            "%s mul_mat %s row %lld column %lld", isas[isa_],
					            f32 ? "F32" : "Q8_0", (long long)r, (long long)t);
				}
			free(got);
		}
		free(w);
		free(q8);
		free(x);
		free(wf);
		drop(e, &qt);
		drop(e, &xt);
		drop(e, &ot);
		drop(e, &yt);
		drop(e, &ft);
		drop(e, &it);
	}
}

/* The pool: every item of every job once, whatever the thread count. */
struct count_job {
	_Atomic int *hits;
	_Atomic unsigned bad_thread;
	unsigned threads;
};

static void count_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	struct count_job *j = arg;

	if (thread >= j->threads)
		atomic_fetch_add(&j->bad_thread, 1);
	for (int64_t i = begin; i < end; i++)
		atomic_fetch_add(&j->hits[i], 1);
}

Test(cpu_fast, the_lent_pool_runs_every_item_once)
{
	static const char *const counts[] = { "1", "2", "3" };
	static const int64_t sizes[] = { 1, 2, 7, 100, 4097 };

	for (int c = 0; c < 3; c++) {
		struct env *e = env_load();
		struct q4kh_native_device nd = { .struct_size = sizeof(nd) };

		e->threads = counts[c];
		e->spin = c == 2 ? "0" : NULL; /* three threads on two cores: sleep */
		cr_assert_eq(env_init(e), Q4KH_OK, "%s", e->b->last_error(NULL));
		if (e->b->device_open(e->ctx, 0, &e->dev) != Q4KH_OK)
			cr_skip_test("cpu-fast has no device here: %s", e->b->last_error(e->ctx));
		cr_assert_eq(e->b->native_device(e->dev, &nd), Q4KH_OK);
		cr_assert_eq(nd.threads, (uint32_t)(c + 1));
		cr_assert(Q4KH_NATIVE_HAS(&nd, parallel));
		for (int rep = 0; rep < 300; rep++) {
			const int64_t n = sizes[rep % 5];
			struct count_job j = { calloc((size_t)n, sizeof(_Atomic int)), 0, nd.threads };

			nd.parallel(nd.pool, n, 1 + rep % 3, count_task, &j);
			for (int64_t i = 0; i < n; i++)
				cr_assert_eq(atomic_load(&j.hits[i]), 1,
				             "threads %s, job %d of %lld items: item %lld ran %d times",
				             counts[c], rep, (long long)n, (long long)i,
				             atomic_load(&j.hits[i]));
			cr_assert_eq(atomic_load(&j.bad_thread), 0);
			free(j.hits);
		}
		env_close(e);
	}
}

/* An older host's record: the backend writes nothing past it. */
Test(cpu_fast, native_handles_of_an_abi_1_0_host)
{
	struct env *e;
	unsigned char rec[64];
	struct q4kh_native_device *nd = (struct q4kh_native_device *)rec;

	e = env_open_default();
	memset(rec, 0xAB, sizeof(rec));
	nd->struct_size = offsetof(struct q4kh_native_device, address) + sizeof(nd->address);
	cr_assert_eq(e->b->native_device(e->dev, nd), Q4KH_OK);
	cr_expect_eq(nd->ordinal, -1);
	cr_expect_not_null(nd->address);
	for (size_t i = nd->struct_size; i < sizeof(rec); i++)
		cr_expect_eq(rec[i], 0xAB, "byte %zu past the record was written", i);
	env_close(e);
}

Test(cpu_fast, identity_device_and_settings)
{
	struct env *e = env_load();
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
	uint32_t n = 0;

	cr_expect_str_eq(e->desc->name, "cpu-fast");
	cr_expect_eq(e->desc->kind, Q4KH_KIND_BACKEND);
	cr_expect_str_eq(e->desc->backend_kind, "cpu");
	cr_expect_eq(e->desc->abi_minor, Q4KH_ABI_MINOR);
	cr_expect_null(e->b->graph_begin, "a recording could not hold a variant's products");
	cr_expect_not_null(e->b->attention_ext);
	cr_expect_not_null(e->b->buffer_wrap);
	e->threads = "0";
	cr_expect_eq(env_init(e), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(NULL),
	                 "[plugin.cpu-fast] threads = \"0\": expected an integer from 1 to 256");
	e->threads = "2";
	e->spin = "fast";
	cr_expect_eq(env_init(e), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(NULL),
	                 "[plugin.cpu-fast] spin_us = \"fast\": expected an integer from 0 to 100000");
	e->spin = NULL;
	e->isa = "sse9";
	cr_expect_eq(env_init(e), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(NULL),
	                 "[plugin.cpu-fast] isa = \"sse9\": expected auto, avx2 or avx512");
	e->isa = NULL;
	cr_assert_eq(env_init(e), Q4KH_OK);
	cr_assert_eq(e->b->device_count(e->ctx, &n), Q4KH_OK);
	if (!cpu_runs("avx2")) {
		cr_expect_eq(n, 0);
		env_close(e);
		return;
	}
	cr_assert_eq(n, 1);
	cr_assert_eq(e->b->device_info(e->ctx, 0, &rec), Q4KH_OK);
	cr_expect_str_eq(rec.name, cpu_runs("avx512") ? "cpu (avx512 float32, 2 threads)"
	                                             : "cpu (avx2 float32, 2 threads)");
	cr_expect_str_eq(rec.uuid, "cpu");
	cr_expect_eq(rec.multiprocessors, 2);
	env_close(e);
}

Test(cpu_fast, wrapped_weights_are_read_in_place_and_never_written)
{
	static const float host[16] __attribute__((aligned(32))) = { 1, 2, 3, 4 };
	struct env *e;
	q4kh_buffer *buf;
	struct q4kh_tensor w, o;
	float got[4];

	e = env_open_default();
	cr_assert_eq(e->b->buffer_wrap(e->dev, host, sizeof(host), &buf), Q4KH_OK);
	cr_expect_eq(e->b->buffer_upload(e->dev, buf, 0, host, 4), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "buffer_upload: the buffer wraps read-only host memory (buffer_wrap)");
	w = (struct q4kh_tensor){ .buffer = buf, .type = Q4KH_TYPE_F32, .ne = { 4, 1, 1, 1 },
		                  .nb = { 4, 16, 16, 16 } };
	o = tensor(e, Q4KH_TYPE_F32, 4, 1, 1, NULL);
	cr_assert_eq(e->b->scale(e->dev, &w, 2.0f, &o), Q4KH_OK);
	cr_assert_eq(e->b->buffer_download(e->dev, o.buffer, 0, got, sizeof(got)), Q4KH_OK);
	cr_expect(got[0] == 2 && got[3] == 8);
	e->b->buffer_free(e->dev, buf);
	drop(e, &o);
	env_close(e);
}

Test(cpu_fast, bad_views_fail_with_one_line)
{
	struct env *e;
	struct q4kh_tensor a, b;

	e = env_open_default();
	a = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	b = tensor(e, Q4KH_TYPE_F32, 8, 3, 1, NULL);
	cr_expect_eq(e->b->add(e->dev, &a, &b, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "add: b->ne[1] = 3, expected 1 or a->ne[1] = 2");
	a.ne[1] = 5;
	cr_expect_eq(e->b->scale(e->dev, &a, 1.0f, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "scale x: view {8, 5, 1, 1} at offset 0 ends past its 64-byte buffer");
	drop(e, &a);
	drop(e, &b);
	env_close(e);
}

Test(cpu_fast, exports_exactly_the_entry_symbol)
{
	char so[4096], first[256];
	int n;

	snprintf(so, sizeof(so), "%s/plugins/cpu-fast/.libs/cpu-fast.so", test_builddir());
	n = test_exported_symbols(so, first, sizeof(first));
	cr_assert_eq(n, 1, "cpu-fast.so exports %d symbols", n);
	cr_assert_str_eq(first, "q4kh_plugin_entry_v1");
}
