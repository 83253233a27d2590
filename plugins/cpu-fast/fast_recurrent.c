/*
 * The ops that carry a state from one step to the next (linear-attention
 * layers, plugin.h): unary (their gates), the short causal convolution and
 * the gated delta rule, in float32. The delta rule runs token by token as
 * the reference does, on the state in place: one value head is a work
 * item, its rows updated by the instruction set's delta_row.
 */
#include <math.h>

#include "fast.h"

/* --- unary --- */

struct unary_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *x, *out;
	q4kh_unary_kind kind;
};

static void unary_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct unary_job *j = arg;

	(void)thread;
	for (int64_t r = begin; r < end; r++)
		j->k->unary(j->kind, (const float *)q4kh_cpu_flat_row(j->x, r),
		            (float *)q4kh_cpu_flat_row(j->out, r), j->x->ne[0]);
}

q4kh_status fast_unary(q4kh_device_ctx *dev, q4kh_unary_kind kind,
                       const struct q4kh_tensor *x, const struct q4kh_tensor *out)
{
	struct unary_job j = { dev ? dev->k : NULL, x, out, kind };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_unary(&c, kind, x, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), fast_grain(x->ne[0]), unary_task, &j);
	return Q4KH_OK;
}

/* --- ssm_conv --- */

struct conv_job {
	const struct q4kh_tensor *x, *w, *state, *out;
};

/* Channels [begin, end): the K taps over the kept values, then the step's
 * inputs; then the last K-1 inputs are kept. */
static void conv_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct conv_job *j = arg;
	const int64_t K = j->w->ne[0], kept = K - 1, T = j->x->ne[1];

	(void)thread;
	for (int64_t c = begin; c < end; c++) {
		const float *w = (const float *)q4kh_cpu_at(j->w, c, 0, 0);
		float *state = (float *)q4kh_cpu_at(j->state, c, 0, 0);

		for (int64_t t = 0; t < T; t++) {
			float sum = 0.0f;

			for (int64_t i = 0; i < K; i++) {
				const int64_t u = t + i; /* index into kept, then x */

				sum += w[i] * (u < kept ? state[u]
				                        : ((const float *)q4kh_cpu_at(j->x, u - kept,
				                                                      0, 0))[c]);
			}
			((float *)q4kh_cpu_at(j->out, t, 0, 0))[c] = sum;
		}
		/* The new kept values: the last K-1 of (kept, x), oldest first. */
		for (int64_t i = 0; i < kept; i++) {
			const int64_t u = T + i;

			state[i] = u < kept ? state[u]
			                    : ((const float *)q4kh_cpu_at(j->x, u - kept, 0, 0))[c];
		}
	}
}

q4kh_status fast_ssm_conv(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w, const struct q4kh_tensor *state,
                          const struct q4kh_tensor *out)
{
	struct conv_job j = { x, w, state, out };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_ssm_conv(&c, x, w, state, out)))
		return st;
	q4kh_pool_run(dev->pool, x->ne[0], fast_grain(w->ne[0] * x->ne[1]), conv_task, &j);
	return Q4KH_OK;
}

/* --- delta_net --- */

struct delta_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *q, *kt, *v, *g, *beta, *state, *out;
	float scale;
};

/* Value heads [begin, end) over every token of the step. */
static void delta_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct delta_job *j = arg;
	const int64_t sk = j->q->ne[0], sv = j->v->ne[0], T = j->v->ne[2];

	(void)thread;
	for (int64_t h = begin; h < end; h++) {
		const int64_t kh = h % j->q->ne[1];

		for (int64_t t = 0; t < T; t++) {
			const float *k = (const float *)q4kh_cpu_at(j->kt, kh, t, 0);
			const float *q = (const float *)q4kh_cpu_at(j->q, kh, t, 0);
			const float *v = (const float *)q4kh_cpu_at(j->v, h, t, 0);
			float *o = (float *)q4kh_cpu_at(j->out, h, t, 0);
			const float decay = expf(((const float *)q4kh_cpu_at(j->g, t, 0, 0))[h]);
			const float beta = ((const float *)q4kh_cpu_at(j->beta, t, 0, 0))[h];
			const float kq = j->k->dot(k, q, sk);

			for (int64_t i = 0; i < sv; i++)
				o[i] = j->scale *
				       j->k->delta_row((float *)q4kh_cpu_at(j->state, i, h, 0), k, q,
				                       sk, decay, beta, v[i], kq);
		}
	}
}

q4kh_status fast_delta_net(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                           const struct q4kh_tensor *g, const struct q4kh_tensor *beta,
                           const struct q4kh_tensor *state, float scale,
                           const struct q4kh_tensor *out)
{
	struct delta_job j = { dev ? dev->k : NULL, q, k, v, g, beta, state, out, scale };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_delta_net(&c, q, k, v, g, beta, state, scale, out)))
		return st;
	q4kh_pool_run(dev->pool, v->ne[1], 1, delta_task, &j);
	return Q4KH_OK;
}
