/*
 * Causal grouped-query attention over the KV cache. One (token, head) pair
 * is one work item: its scores, softmax and weighted sum of values are
 * computed by one thread, in double, over the visible keys in increasing
 * position.
 */
#include <math.h>

#include "cpu.h"

struct attn_job {
	const struct q4kh_tensor *q, *k, *v, *out;
	q4kh_device_ctx *dev;
	const int32_t *pos; /* query t's position; NULL: pos0 + t */
	int64_t pos0;
	int32_t window;
	double scale, softcap;
};

/* Row (head g, position j) of an f32 or f16 cache, as doubles. */
static void cache_row(const q4kh_device_ctx *dev, const struct q4kh_tensor *c,
                      int64_t g, int64_t j, double *out)
{
	const unsigned char *p = cpu_row(c, g, j, 0);

	if (c->type == Q4KH_TYPE_F32)
		for (int64_t i = 0; i < c->ne[0]; i++)
			out[i] = ((const float *)p)[i];
	else
		for (int64_t i = 0; i < c->ne[0]; i++)
			out[i] = dev->f16[((const uint16_t *)p)[i]];
}

/* Query t of head h: out = softmax(scores) . V over keys first .. p. */
static void attend(const struct attn_job *j, double *scratch, int64_t t,
                   int64_t h)
{
	int64_t hd = j->q->ne[0];
	int64_t g = h / (j->q->ne[1] / j->k->ne[1]);
	int64_t p = j->pos ? j->pos[t] : j->pos0 + t;
	int64_t first = j->window && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
	int64_t n = p - first + 1;
	double *qd = scratch, *row = qd + hd, *acc = row + hd, *s = acc + hd;
	const float *q = (const float *)cpu_row(j->q, h, t, 0);
	float *o = (float *)cpu_row(j->out, h, t, 0);
	double max = -INFINITY, sum = 0.0;

	for (int64_t i = 0; i < hd; i++) {
		qd[i] = q[i];
		acc[i] = 0.0;
	}
	for (int64_t i = 0; i < n; i++) {
		cache_row(j->dev, j->k, g, first + i, row);
		s[i] = j->scale * cpu_dot(qd, row, hd);
		if (j->softcap > 0.0)
			s[i] = j->softcap * tanh(s[i] / j->softcap);
		if (s[i] > max)
			max = s[i];
	}
	for (int64_t i = 0; i < n; i++) {
		s[i] = exp(s[i] - max);
		sum += s[i];
	}
	for (int64_t i = 0; i < n; i++) {
		cache_row(j->dev, j->v, g, first + i, row);
		for (int64_t d = 0; d < hd; d++)
			acc[d] += s[i] * row[d];
	}
	for (int64_t d = 0; d < hd; d++)
		o[d] = (float)(acc[d] / sum);
}

static void attn_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct attn_job *j = arg;
	int64_t n_head = j->q->ne[1];

	for (int64_t r = begin; r < end; r++)
		attend(j, j->dev->scratch[part], r / n_head, r % n_head);
}

/* Run job J, checked, whose queries reach at most key position LAST. */
static q4kh_status attn_run(q4kh_device_ctx *dev, struct attn_job *j,
                            const struct q4kh_attn_params *params, int64_t last)
{
	q4kh_status st;

	j->window = params->window;
	j->scale = params->scale;
	j->softcap = params->softcap;
	st = cpu_scratch_reserve(dev, sizeof(double) *
	                                      (uint64_t)(3 * j->q->ne[0] + last + 1));
	if (st)
		return st;
	cpu_pool_run(dev->pool, j->q->ne[1] * j->q->ne[2], 1, attn_task, j);
	return Q4KH_OK;
}

q4kh_status cpu_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                          const struct q4kh_tensor *k_cache,
                          const struct q4kh_tensor *v_cache,
                          const struct q4kh_attn_params *params,
                          const struct q4kh_tensor *out)
{
	struct attn_job j = { q, k_cache, v_cache, out, dev, NULL, 0, 0, 0, 0 };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention(&c, q, k_cache, v_cache, params, out)))
		return st;
	j.pos0 = params->pos0;
	return attn_run(dev, &j, params, params->pos0 + q->ne[2] - 1);
}

q4kh_status cpu_attention_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                              const struct q4kh_tensor *k_cache,
                              const struct q4kh_tensor *v_cache,
                              const struct q4kh_tensor *pos,
                              const struct q4kh_attn_params *params,
                              const struct q4kh_tensor *out)
{
	struct attn_job j = { q, k_cache, v_cache, out, dev, NULL, 0, 0, 0, 0 };
	const struct q4kh_check c = cpu_contract(dev);
	int64_t last = 0;
	q4kh_status st;

	if ((st = q4kh_check_attention_ext(&c, q, k_cache, v_cache, pos, params, out)) ||
	    (st = cpu_index_values(dev, "attention_ext pos", pos, k_cache->ne[2])))
		return st;
	j.pos = (const int32_t *)cpu_row(pos, 0, 0, 0);
	for (int64_t t = 0; t < q->ne[2]; t++)
		if (j.pos[t] > last)
			last = j.pos[t];
	return attn_run(dev, &j, params, last);
}
