/*
 * The ops that carry a state from one step to the next (linear-attention
 * layers, plugin.h): the short causal convolution and the gated delta
 * rule. The reference runs the delta rule as it is defined, token by
 * token, whatever the step's length: its prompt steps and its decode steps
 * are one code path, which fast backends' chunked forms are judged
 * against. One channel (convolution) or one value head (delta rule) is a
 * work item, computed by one thread in double in a fixed order; a state
 * is read once as it was and written once when the item is done.
 */
#include <math.h>
#include <stddef.h>

#include "cpu.h"

#define F32 CPU_T(Q4KH_TYPE_F32)

/* --- ssm_conv --- */

struct conv_job {
	const struct q4kh_tensor *x, *w, *state, *out;
	q4kh_device_ctx *dev;
};

/* Channel c: its window u (kept values, then the step's inputs), the
 * outputs, then the new kept values. */
static void conv_channel(const struct conv_job *j, double *u, int64_t c)
{
	const int64_t k = j->w->ne[0], kept = k - 1, T = j->x->ne[1];
	const float *w = (const float *)cpu_row(j->w, c, 0, 0);
	float *state = (float *)cpu_row(j->state, c, 0, 0);

	for (int64_t i = 0; i < kept; i++)
		u[i] = state[i];
	for (int64_t t = 0; t < T; t++)
		u[kept + t] = ((const float *)cpu_row(j->x, t, 0, 0))[c];
	for (int64_t t = 0; t < T; t++) {
		double sum = 0.0;

		for (int64_t i = 0; i < k; i++)
			sum += (double)w[i] * u[t + i];
		((float *)cpu_row(j->out, t, 0, 0))[c] = (float)sum;
	}
	for (int64_t i = 0; i < kept; i++)
		state[i] = (float)u[T + i];
}

static void conv_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct conv_job *j = arg;

	for (int64_t c = begin; c < end; c++)
		conv_channel(j, j->dev->scratch[part], c);
}

q4kh_status cpu_ssm_conv(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *w,
                         const struct q4kh_tensor *state,
                         const struct q4kh_tensor *out)
{
	struct conv_job j = { x, w, state, out, dev };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cpu_tensor_check(dev, "ssm_conv x", x, F32)) ||
	    (st = cpu_tensor_shape(dev, "ssm_conv x", x, -1, -1, 1, 1)) ||
	    (st = cpu_tensor_check(dev, "ssm_conv w", w, F32)) ||
	    (st = cpu_tensor_shape(dev, "ssm_conv w", w, -1, x->ne[0], 1, 1)) ||
	    (st = cpu_tensor_check(dev, "ssm_conv state", state, F32)) ||
	    (st = cpu_tensor_check(dev, "ssm_conv out", out, F32)) ||
	    (st = cpu_tensor_shape(dev, "ssm_conv out", out, x->ne[0], x->ne[1],
	                           1, 1)))
		return st;
	if (w->ne[0] < 2)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "ssm_conv: w has %lld taps, expected at least 2",
		                (long long)w->ne[0]);
	if ((st = cpu_tensor_shape(dev, "ssm_conv state", state, w->ne[0] - 1,
	                           x->ne[0], 1, 1)) ||
	    (st = cpu_tensor_disjoint(dev, "ssm_conv out", out, "x", x)) ||
	    (st = cpu_tensor_disjoint(dev, "ssm_conv out", out, "w", w)) ||
	    (st = cpu_tensor_disjoint(dev, "ssm_conv out", out, "state", state)) ||
	    (st = cpu_tensor_disjoint(dev, "ssm_conv state", state, "x", x)) ||
	    (st = cpu_tensor_disjoint(dev, "ssm_conv state", state, "w", w)))
		return st;
	st = cpu_scratch_reserve(dev, sizeof(double) *
	                                      (uint64_t)(w->ne[0] - 1 + x->ne[1]));
	if (st)
		return st;
	cpu_pool_run(dev->pool, x->ne[0], 1, conv_task, &j);
	return Q4KH_OK;
}

/* --- delta_net --- */

struct delta_job {
	const struct q4kh_tensor *q, *k, *v, *g, *beta, *state, *out;
	q4kh_device_ctx *dev;
	double scale;
};

/* Value head h over every token of the step; s: S_v rows of S_k. */
static void delta_head(const struct delta_job *j, double *s, int64_t h)
{
	const int64_t sk = j->q->ne[0], sv = j->v->ne[0], T = j->v->ne[2];
	const int64_t kh = h % j->q->ne[1];
	double *kd = s + sv * sk, *qd = kd + sk;

	for (int64_t i = 0; i < sv; i++) {
		const float *row = (const float *)cpu_row(j->state, i, h, 0);

		for (int64_t c = 0; c < sk; c++)
			s[i * sk + c] = row[c];
	}
	for (int64_t t = 0; t < T; t++) {
		const float *k = (const float *)cpu_row(j->k, kh, t, 0);
		const float *q = (const float *)cpu_row(j->q, kh, t, 0);
		const float *v = (const float *)cpu_row(j->v, h, t, 0);
		float *o = (float *)cpu_row(j->out, h, t, 0);
		double decay = exp((double)((const float *)cpu_row(j->g, t, 0, 0))[h]);
		double beta = ((const float *)cpu_row(j->beta, t, 0, 0))[h];

		for (int64_t c = 0; c < sk; c++) {
			kd[c] = k[c];
			qd[c] = q[c];
		}
		/* Row i of S depends on v[i] alone: decay, correct, read out. */
		for (int64_t i = 0; i < sv; i++) {
			double *row = s + i * sk, d;

			for (int64_t c = 0; c < sk; c++)
				row[c] *= decay;
			d = beta * ((double)v[i] - cpu_dot(row, kd, sk));
			for (int64_t c = 0; c < sk; c++)
				row[c] += d * kd[c];
			o[i] = (float)(j->scale * cpu_dot(row, qd, sk));
		}
	}
	for (int64_t i = 0; i < sv; i++) {
		float *row = (float *)cpu_row(j->state, i, h, 0);

		for (int64_t c = 0; c < sk; c++)
			row[c] = (float)s[i * sk + c];
	}
}

static void delta_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct delta_job *j = arg;

	for (int64_t h = begin; h < end; h++)
		delta_head(j, j->dev->scratch[part], h);
}

/* The shapes of the job's tensors, given q's and v's. */
static q4kh_status delta_shapes(q4kh_device_ctx *dev, const struct delta_job *j)
{
	const int64_t sk = j->q->ne[0], hk = j->q->ne[1], T = j->q->ne[2];
	const int64_t sv = j->v->ne[0], hv = j->v->ne[1];
	q4kh_status st;

	if ((st = cpu_tensor_shape(dev, "delta_net q", j->q, -1, -1, -1, 1)) ||
	    (st = cpu_tensor_shape(dev, "delta_net k", j->k, sk, hk, T, 1)) ||
	    (st = cpu_tensor_shape(dev, "delta_net v", j->v, -1, -1, T, 1)) ||
	    (st = cpu_tensor_shape(dev, "delta_net g", j->g, hv, T, 1, 1)) ||
	    (st = cpu_tensor_shape(dev, "delta_net beta", j->beta, hv, T, 1, 1)) ||
	    (st = cpu_tensor_shape(dev, "delta_net state", j->state, sk, sv, hv,
	                           1)) ||
	    (st = cpu_tensor_shape(dev, "delta_net out", j->out, sv, hv, T, 1)))
		return st;
	if (hv % hk)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "delta_net: %lld value heads is not a multiple of "
		                "%lld key heads",
		                (long long)hv, (long long)hk);
	return Q4KH_OK;
}

q4kh_status cpu_delta_net(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                          const struct q4kh_tensor *k,
                          const struct q4kh_tensor *v,
                          const struct q4kh_tensor *g,
                          const struct q4kh_tensor *beta,
                          const struct q4kh_tensor *state, float scale,
                          const struct q4kh_tensor *out)
{
	static const char *const names[] = { "delta_net q", "delta_net k",
		                             "delta_net v", "delta_net g",
		                             "delta_net beta" };
	const struct q4kh_tensor *in[] = { q, k, v, g, beta };
	struct delta_job j = { q, k, v, g, beta, state, out, dev, scale };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	for (int i = 0; i < 5; i++)
		if ((st = cpu_tensor_check(dev, names[i], in[i], F32)))
			return st;
	if ((st = cpu_tensor_check(dev, "delta_net state", state, F32)) ||
	    (st = cpu_tensor_check(dev, "delta_net out", out, F32)) ||
	    (st = delta_shapes(dev, &j)))
		return st;
	for (int i = 0; i < 5; i++)
		if ((st = cpu_tensor_disjoint(dev, "delta_net out", out, names[i],
		                              in[i])) ||
		    (st = cpu_tensor_disjoint(dev, "delta_net state", state,
		                              names[i], in[i])))
			return st;
	if ((st = cpu_tensor_disjoint(dev, "delta_net out", out, "state", state)))
		return st;
	if (!isfinite(scale))
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "delta_net: scale %g, expected a finite value",
		                (double)scale);
	st = cpu_scratch_reserve(dev, sizeof(double) *
	                                      (uint64_t)(v->ne[0] + 2) *
	                                      (uint64_t)q->ne[0]);
	if (st)
		return st;
	cpu_pool_run(dev->pool, v->ne[1], 1, delta_task, &j);
	return Q4KH_OK;
}
