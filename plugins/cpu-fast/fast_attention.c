/*
 * Causal grouped-query attention over an f32 or f16 KV cache (plugin.h,
 * attention). A work item is a token and some query heads of one KV
 * group, all of them when there are enough items for the threads: their
 * scores against the visible keys, softmax, and the weighted sum of
 * values, in f32 SIMD, on one thread, each key and value row read once
 * for all of its heads (f16 converted in registers), since reading the
 * cache, not multiplying it, is what a long prompt's attention costs.
 * attention_paged (ABI 1.8) is the same work with each key's row looked
 * up in the block table (row_of).
 */
#include <math.h>
#include <stddef.h>

#include "fast.h"

struct attn_job {
	q4kh_device_ctx *dev;
	const struct q4kh_tensor *q, *k, *v, *out;
	const int32_t *pos; /* query t's position; NULL: pos0 + t */
	const int32_t *pages; /* the block table; NULL: key j is row j */
	int64_t page_size;
	int64_t pos0;
	int32_t window;
	float scale, softcap;
	int64_t n_keys; /* scratch floats for one head's scores */
	int64_t span;   /* query heads per item (of one group) */
	int64_t blocks; /* items per token and group */
};

/* The row of the cache (or the pool) holding key I. */
static int64_t row_of(const struct attn_job *j, int64_t i)
{
	return j->pages ? j->pages[i / j->page_size] * j->page_size + i % j->page_size : i;
}

/*
 * Token t's queries of heads h0 .. h1 (of one group): out = softmax(scores)
 * . V over their visible keys; SCRATCH holds (h1 - h0) rows of n_keys
 * scores, as many accumulators of head_dim, and their sums.
 */
static void attend(const struct attn_job *j, float *scratch, int64_t t, int64_t h0,
                   int64_t h1)
{
	const struct fast_kernels *k = j->dev->k;
	const int64_t hd = j->q->ne[0], g = h0 / (j->q->ne[1] / j->k->ne[1]), nh = h1 - h0;
	const int64_t p = j->pos ? j->pos[t] : j->pos0 + t;
	const int64_t first = j->window && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
	const int64_t n = p - first + 1;
	float *acc = scratch + nh * j->n_keys, *sum = acc + nh * hd;
	const int kf16 = j->k->type == Q4KH_TYPE_F16, vf16 = j->v->type == Q4KH_TYPE_F16;

	for (int64_t i = 0; i < n; i++) {
		const void *key = q4kh_cpu_at(j->k, g, row_of(j, first + i), 0);

		for (int64_t h = 0; h < nh; h++) {
			const float *q = (const float *)q4kh_cpu_at(j->q, h0 + h, t, 0);
			float x = j->scale * (kf16 ? k->dot_f16(q, key, hd) : k->dot(q, key, hd));

			if (j->softcap > 0.0f)
				x = j->softcap * tanhf(x / j->softcap);
			scratch[h * j->n_keys + i] = x;
		}
	}
	for (int64_t h = 0; h < nh; h++) {
		float *s = scratch + h * j->n_keys, max = -INFINITY;

		for (int64_t i = 0; i < n; i++)
			max = s[i] > max ? s[i] : max;
		sum[h] = k->exp_sum(s, max, n);
		for (int64_t d = 0; d < hd; d++)
			acc[h * hd + d] = 0.0f;
	}
	for (int64_t i = 0; i < n; i++) {
		const void *value = q4kh_cpu_at(j->v, g, row_of(j, first + i), 0);

		for (int64_t h = 0; h < nh; h++) {
			const float w = scratch[h * j->n_keys + i];

			if (vf16)
				k->axpy_f16(w, value, acc + h * hd, hd);
			else
				k->axpy(w, value, acc + h * hd, hd);
		}
	}
	for (int64_t h = 0; h < nh; h++)
		k->scale(acc + h * hd, 1.0f / sum[h], (float *)q4kh_cpu_at(j->out, h0 + h, t, 0),
		         hd);
}

static void attn_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct attn_job *j = arg;
	const int64_t groups = j->k->ne[1], group = j->q->ne[1] / groups;

	for (int64_t r = begin; r < end; r++) {
		const int64_t t = r / (groups * j->blocks), g = r / j->blocks % groups;
		const int64_t h0 = g * group + r % j->blocks * j->span;

		attend(j, j->dev->scratch.part[thread], t, h0,
		       h0 + j->span < (g + 1) * group ? h0 + j->span : (g + 1) * group);
	}
}

/* Run checked job J, whose queries reach at most key position LAST. */
static q4kh_status attn_run(q4kh_device_ctx *dev, struct attn_job *j,
                            const struct q4kh_attn_params *params, int64_t last)
{
	const int64_t groups = j->k->ne[1], group = j->q->ne[1] / groups;
	/* Whole groups when tokens and groups give every thread two items,
	 * else groups cut so they do. */
	int64_t want = (2 * (int64_t)dev->threads + j->q->ne[2] * groups - 1) /
	               (j->q->ne[2] * groups);
	q4kh_status st;

	j->window = params->window;
	j->scale = params->scale;
	j->softcap = params->softcap;
	want = want < 1 ? 1 : want > group ? group : want;
	j->span = (group + want - 1) / want;
	j->blocks = (group + j->span - 1) / j->span;
	j->n_keys = (last + Q4KH_CPU_ALIGN / 4) / (Q4KH_CPU_ALIGN / 4) * (Q4KH_CPU_ALIGN / 4);
	if ((st = fast_scratch(dev, sizeof(float) *
	                                    (uint64_t)(j->span * (j->n_keys + j->q->ne[0] + 1)))))
		return st;
	q4kh_pool_run(dev->pool, j->q->ne[2] * groups * j->blocks, 1, attn_task, j);
	return Q4KH_OK;
}

q4kh_status fast_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k_cache,
                           const struct q4kh_tensor *v_cache,
                           const struct q4kh_attn_params *params,
                           const struct q4kh_tensor *out)
{
	struct attn_job j = { .dev = dev, .q = q, .k = k_cache, .v = v_cache, .out = out };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention(&c, q, k_cache, v_cache, params, out)))
		return st;
	j.pos0 = params->pos0;
	return attn_run(dev, &j, params, params->pos0 + q->ne[2] - 1);
}

q4kh_status fast_attention_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                               const struct q4kh_tensor *k_cache,
                               const struct q4kh_tensor *v_cache,
                               const struct q4kh_tensor *pos,
                               const struct q4kh_attn_params *params,
                               const struct q4kh_tensor *out)
{
	struct attn_job j = { .dev = dev, .q = q, .k = k_cache, .v = v_cache, .out = out };
	int64_t last = 0;
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention_ext(&c, q, k_cache, v_cache, pos, params, out)) ||
	    (st = fast_index_values(dev, "attention_ext pos", pos, k_cache->ne[2])))
		return st;
	j.pos = (const int32_t *)q4kh_cpu_at(pos, 0, 0, 0);
	for (int64_t t = 0; t < q->ne[2]; t++)
		last = j.pos[t] > last ? j.pos[t] : last;
	return attn_run(dev, &j, params, last);
}

q4kh_status fast_attention_paged(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                 const struct q4kh_tensor *k_pool,
                                 const struct q4kh_tensor *v_pool,
                                 const struct q4kh_tensor *pos,
                                 const struct q4kh_tensor *pages, int32_t page_size,
                                 const struct q4kh_attn_params *params,
                                 const struct q4kh_tensor *out)
{
	struct attn_job j = { .dev = dev, .q = q, .k = k_pool, .v = v_pool, .out = out };
	int64_t last = 0;
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_cpu_attention_paged_args(&c, q, k_pool, v_pool, pos, pages, page_size,
	                                        params, out, &j.pos, &j.pages, &last)))
		return st;
	j.page_size = page_size;
	return attn_run(dev, &j, params, last);
}
