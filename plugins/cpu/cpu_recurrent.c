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

#include "cpu.h"

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
	const float *w = (const float *)q4kh_cpu_at(j->w, c, 0, 0);
	float *state = (float *)q4kh_cpu_at(j->state, c, 0, 0);

	for (int64_t i = 0; i < kept; i++)
		u[i] = state[i];
	for (int64_t t = 0; t < T; t++)
		u[kept + t] = ((const float *)q4kh_cpu_at(j->x, t, 0, 0))[c];
	for (int64_t t = 0; t < T; t++) {
		double sum = 0.0;

		for (int64_t i = 0; i < k; i++)
			sum += (double)w[i] * u[t + i];
		((float *)q4kh_cpu_at(j->out, t, 0, 0))[c] = (float)sum;
	}
	for (int64_t i = 0; i < kept; i++)
		state[i] = (float)u[T + i];
}

static void conv_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct conv_job *j = arg;

	for (int64_t c = begin; c < end; c++)
		conv_channel(j, j->dev->scratch.part[part], c);
}

q4kh_status cpu_ssm_conv(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *w,
                         const struct q4kh_tensor *state,
                         const struct q4kh_tensor *out)
{
	struct conv_job j = { x, w, state, out, dev };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_ssm_conv(&c, x, w, state, out)))
		return st;
	st = cpu_scratch_reserve(dev, sizeof(double) *
	                                      (uint64_t)(w->ne[0] - 1 + x->ne[1]));
	if (st)
		return st;
	q4kh_pool_run(dev->pool, x->ne[0], 1, conv_task, &j);
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
		const float *row = (const float *)q4kh_cpu_at(j->state, i, h, 0);

		for (int64_t c = 0; c < sk; c++)
			s[i * sk + c] = row[c];
	}
	for (int64_t t = 0; t < T; t++) {
		const float *k = (const float *)q4kh_cpu_at(j->k, kh, t, 0);
		const float *q = (const float *)q4kh_cpu_at(j->q, kh, t, 0);
		const float *v = (const float *)q4kh_cpu_at(j->v, h, t, 0);
		float *o = (float *)q4kh_cpu_at(j->out, h, t, 0);
		double decay = exp((double)((const float *)q4kh_cpu_at(j->g, t, 0, 0))[h]);
		double beta = ((const float *)q4kh_cpu_at(j->beta, t, 0, 0))[h];

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
		float *row = (float *)q4kh_cpu_at(j->state, i, h, 0);

		for (int64_t c = 0; c < sk; c++)
			row[c] = (float)s[i * sk + c];
	}
}

static void delta_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct delta_job *j = arg;

	for (int64_t h = begin; h < end; h++)
		delta_head(j, j->dev->scratch.part[part], h);
}

q4kh_status cpu_delta_net(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                          const struct q4kh_tensor *k,
                          const struct q4kh_tensor *v,
                          const struct q4kh_tensor *g,
                          const struct q4kh_tensor *beta,
                          const struct q4kh_tensor *state, float scale,
                          const struct q4kh_tensor *out)
{
	struct delta_job j = { q, k, v, g, beta, state, out, dev, scale };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_delta_net(&c, q, k, v, g, beta, state, scale, out)))
		return st;
	st = cpu_scratch_reserve(dev, sizeof(double) *
	                                      (uint64_t)(v->ne[0] + 2) *
	                                      (uint64_t)q->ne[0]);
	if (st)
		return st;
	q4kh_pool_run(dev->pool, v->ne[1], 1, delta_task, &j);
	return Q4KH_OK;
}
