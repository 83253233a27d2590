/*
 * The cpu-fast backend's ops against float64, with each instruction set
 * this CPU runs (test_cpu_fast; cpu_fast_rig.h is the rig). u = 2^-24 is
 * float32's unit roundoff; every bound below is the rounding the op's
 * arithmetic allows, with room of a small factor:
 *   - add, mul, scale: one rounding, so exactly float64's result rounded;
 *   - copy and set_rows to f16: round to nearest even, bit for bit;
 *   - get_rows: the reference's decoder (exact), then one rounding;
 *   - rms_norm: a sum of n squares (n u relative), then two products;
 *   - glu: e^x within 2 ulp, so (16 + 4 |x|) u relative, x the argument;
 *   - rope: cos and sin rounded once and a rotation with FMA:
 *     4 u m (|a| + |b|) per pair;
 *   - attention: each score within hd u of its exact sum of |q k|, so each
 *     weight within that (and a few u) relative, and the output within
 *     (2 max score error + (n + 8) u) of the weighted sum of |v|; over
 *     pages (attention_paged), the contiguous cache's bits;
 *   - the built-in mul_mat: K u of the sum of |w x|, on every weight type
 *     q4khost runs, from gguf-py's values of the same blocks
 *     (tests/fixtures/dequant-blocks.txt);
 *   - unary: as glu (sigmoid, SiLU), a few ulp (softplus);
 *   - ssm_conv: K u of the sum of |w u|, the kept values bit for bit;
 *   - delta_net: a running error bound over the recurrence on absolute
 *     values (at the test).
 * tests/test_cpu_fast_fused.c has the fused entries and top2,
 * tests/test_cpu_fast_plugin.c the pool, the records and the errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks_fixture.h"
#include "cpu_fast_rig.h"
#include "helpers.h"
#include "weight_types.h"

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
 * attention_paged of Q at positions POS over the cache rows KDATA and
 * VDATA (N_CTX rows of N_KV heads) scattered over pools of 16 pages of 5
 * tokens through a table of 13 of them out of order (the last one 4/5
 * full; the others NaN, so that a read shows): OUT's bits, or the test
 * fails.
 */
static void expect_paged_bits(struct env *e, uint32_t type, const struct q4kh_tensor *q,
                              const void *kdata, const void *vdata, int64_t n_kv,
                              int64_t n_ctx, const struct q4kh_tensor *pos,
                              const struct q4kh_attn_params *p, const float *out)
{
	static const int32_t table[13] = { 11, 4, 15, 0, 8, 2, 13, 6, 1, 9, 14, 3, 7 };
	const int32_t page = 5, pages = 16;
	const size_t row = (size_t)(type == Q4KH_TYPE_F16 ? 2 : 4) * (size_t)(q->ne[0] * n_kv);
	uint8_t *kp = malloc(row * (size_t)(pages * page)), *vp = malloc(row * (size_t)(pages * page));
	struct q4kh_tensor kt, vt, tt, ot;
	float *got;

	cr_assert(kp && vp && n_ctx <= 13 * page);
	memset(kp, 0xFF, row * (size_t)(pages * page));
	memset(vp, 0xFF, row * (size_t)(pages * page));
	for (int64_t j = 0; j < n_ctx; j++) {
		const size_t slot = (size_t)(table[j / page] * page + j % page);

		memcpy(kp + slot * row, (const uint8_t *)kdata + (size_t)j * row, row);
		memcpy(vp + slot * row, (const uint8_t *)vdata + (size_t)j * row, row);
	}
	kt = tensor(e, type, q->ne[0], n_kv, pages * page, kp);
	vt = tensor(e, type, q->ne[0], n_kv, pages * page, vp);
	tt = tensor(e, Q4KH_TYPE_I32, 13, 1, 1, table);
	ot = tensor(e, Q4KH_TYPE_F32, q->ne[0], q->ne[1], q->ne[2], NULL);
	cr_assert_eq(e->b->attention_paged(e->dev, q, &kt, &vt, pos, &tt, page, p, &ot), Q4KH_OK,
	             "%s", e->b->last_error(e->ctx));
	got = fetch(e, &ot);
	for (int64_t i = 0; i < q->ne[0] * q->ne[1] * q->ne[2]; i++)
		cr_assert(!memcmp(&got[i], &out[i], sizeof(float)),
		          "attention_paged out[%lld] = %.9g, the contiguous cache's %.9g",
		          (long long)i, (double)got[i], (double)out[i]);
	free(got);
	free(kp);
	free(vp);
	drop(e, &kt);
	drop(e, &vt);
	drop(e, &tt);
	drop(e, &ot);
}

/*
 * Attention of T queries over a cache of TYPE, against float64: at
 * positions pos0 + t, or with EXT at 5, 30, 31 (T = 3) or 3 + 4t (more:
 * a step that converts an f16 cache first); the same queries over pages
 * give the same bits (expect_paged_bits).
 */
static void attention_case(struct env *e, const char *isa, uint32_t type, int32_t window,
                           float softcap, int ext, int64_t T)
{
	const int64_t hd = 40, heads = 4, kv = 2, n_ctx = 64;
	const int32_t pos0 = 20;
	int32_t ext_pos[12], paged_pos[12];
	float *q = randoms(hd * heads * T, 1.5), *k = randoms(hd * kv * n_ctx, 1.5);
	float *v = randoms(hd * kv * n_ctx, 4.0), *got;
	uint16_t *kh = malloc(sizeof(uint16_t) * (size_t)(hd * kv * n_ctx));
	uint16_t *vh = malloc(sizeof(uint16_t) * (size_t)(hd * kv * n_ctx));
	const int f16 = type == Q4KH_TYPE_F16;
	struct q4kh_tensor qt, kt, vt, ot, pt;

	cr_assert_leq(T, 12);
	for (int64_t t = 0; t < T; t++) {
		ext_pos[t] = T == 3 ? (int32_t[]){ 5, 30, 31 }[t] : (int32_t)(3 + 4 * t);
		paged_pos[t] = ext ? ext_pos[t] : pos0 + (int32_t)t;
	}
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
	drop(e, &pt);
	pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, paged_pos);
	expect_paged_bits(e, type, &qt, f16 ? (const void *)kh : k, f16 ? (const void *)vh : v,
	                  kv, n_ctx, &pt, &p, got);
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

/*
 * Every weight type against gguf-py's values of the same blocks: get_rows
 * is the reference's exact decoder then one rounding of the scale, and
 * mul_mat within (K + 4) u of the sum of |w x|.
 */
Test(cpu_fast, every_weight_type_against_gguf_py)
{
	struct blocks_fixture bf;
	const int64_t T = 3;

	blocks_fixture_load(&bf);
	FOR_EACH_ISA(e) {
		for (uint32_t t = 0; t < Q4KH_TYPE_COUNT + 60; t++)
			cr_expect_eq(e->b->supports_type(e->ctx, t), q4kh_weight_type_supported(t),
			             "%s type %u", isas[isa_], t);
		for (size_t i = 0; i < bf.n; i++) {
			const struct blocks_tensor *b = &bf.t[i];
			const int64_t k = b->ne0, n = b->rows;
			const int32_t ids[3] = { (int32_t)(n - 1), 0, (int32_t)(n - 1) };
			float *x = randoms(k * T, 2.0), *got;
			struct q4kh_tensor wt = tensor(e, b->type, k, n, 1, b->bytes);
			struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, k, T, 1, x);
			struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, k, T, 1, NULL);
			struct q4kh_tensor yt = tensor(e, Q4KH_TYPE_F32, n, T, 1, NULL);
			struct q4kh_tensor it = tensor(e, Q4KH_TYPE_I32, T, 1, 1, ids);

			cr_assert_eq(e->b->get_rows_ext(e->dev, &wt, &it, 0.75f, &ot), Q4KH_OK,
			             "%s %s: %s", isas[isa_], b->name, e->b->last_error(e->ctx));
			got = fetch(e, &ot);
			for (int64_t c = 0; c < T; c++)
				for (int64_t v = 0; v < k; v++)
					cr_expect_eq(got[c * k + v],
					             (float)((double)b->values[ids[c] * k + v] * 0.75),
					             "%s %s get_rows id %d value %lld", isas[isa_],
					             b->name, ids[c], (long long)v);
			free(got);
			cr_assert_eq(e->b->mul_mat(e->dev, &wt, &xt, &yt), Q4KH_OK, "%s %s: %s",
			             isas[isa_], b->name, e->b->last_error(e->ctx));
			got = fetch(e, &yt);
			for (int64_t c = 0; c < T; c++)
				for (int64_t r = 0; r < n; r++) {
					double exact = 0, mag = 0;

					for (int64_t v = 0; v < k; v++) {
						const double p = (double)b->values[r * k + v] * x[c * k + v];

						exact += p;
						mag += fabs(p);
					}
					EXPECT_NEAR(got[c * n + r], exact, (k + 4) * U * mag,
					            "%s mul_mat %s row %lld column %lld", isas[isa_],
					            b->name, (long long)r, (long long)c);
				}
			free(got);
			free(x);
			drop(e, &wt);
			drop(e, &xt);
			drop(e, &ot);
			drop(e, &yt);
			drop(e, &it);
		}
	}
	blocks_fixture_free(&bf);
}
