/*
 * ABI 1.2's entries (plugin.h): the ops whose per-step values (token ids,
 * positions, KV-cache rows) are I32 tensors in device memory, read when the
 * kernel runs, and ABI 1.4's rope_set_rows (rope_ext and set_rows in one
 * kernel), rope_store (an attention layer's rope_ext of q, rope_set_rows
 * of k and set_rows of v in one kernel) and top2 (the greedy pick,
 * cuda_top2.cu). Nothing here touches host memory per call, so a step
 * made of these ops records once (graph_begin) and replays for every
 * later token with only those tensors rewritten in between. The values
 * themselves are checked on the device (cuda_kernels.h, enum cuda_fault).
 */
#include <math.h>

#include "cuda.h"

static const int32_t *index_data(const struct q4kh_tensor *t)
{
	return (const int32_t *)(t->buffer->ptr + t->offset);
}

q4kh_status cuda_get_rows_ext(q4kh_device_ctx *dev,
                              const struct q4kh_tensor *table,
                              const struct q4kh_tensor *ids, float scale,
                              const struct q4kh_tensor *out)
{
	struct cuda_view vt, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_get_rows_ext(&c, table, ids, out)) ||
	    (st = cuda_enter(dev, "get_rows_ext")))
		return st;
	vt = cuda_view_of(table);
	vo = cuda_view_of(out);
	return cuda_launched(dev, "get_rows_ext",
	                cuda_launch_get_rows(&vt, index_data(ids), ids->ne[0],
	                                     scale, &vo, dev->fault, dev->stream));
}

/* YaRN's d(b): the pair whose wavelength fits b times in n_ctx_orig. */
static double yarn_dim(const struct q4kh_rope_params *p, double beta)
{
	return p->n_rot * log(p->n_ctx_orig / (beta * 2.0 * M_PI)) /
	       (2.0 * log((double)p->base));
}

struct cuda_rope cuda_rope_of(const struct q4kh_rope_params *p)
{
	struct cuda_rope r = {
		.n_rot = p->n_rot,
		.neox = p->mode == Q4KH_ROPE_NEOX,
		.base = p->base,
		.freq_scale = p->freq_scale,
		.ext_factor = p->ext_factor,
		.mscale = p->attn_factor,
		.freq_factors = p->freq_factors
			? (const float *)(p->freq_factors->buffer->ptr +
			                  p->freq_factors->offset)
			: NULL,
	};

	if (p->ext_factor != 0.0f) {
		r.lo = fmax(0.0, floor(yarn_dim(p, p->beta_fast)));
		r.hi = fmin(p->n_rot - 1, ceil(yarn_dim(p, p->beta_slow)));
		r.mscale *= 1.0 + 0.1 * log(1.0 / p->freq_scale);
	}
	return r;
}

/*
 * The RoPE kernel for OP over checked arguments: x rotated into out, and
 * with CACHE (not NULL: rope_set_rows) out's rows written to the cache
 * at rows pos.
 */
static q4kh_status rope_launch(q4kh_device_ctx *dev, const char *op,
                               const struct q4kh_tensor *x,
                               const struct q4kh_tensor *pos,
                               const struct q4kh_rope_params *params,
                               const struct q4kh_tensor *out,
                               const struct q4kh_tensor *cache)
{
	struct cuda_view vx, vo, vc;
	struct cuda_rope r;
	q4kh_status st;

	if ((st = cuda_enter(dev, op)))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	if (cache)
		vc = cuda_view_of(cache);
	r = cuda_rope_of(params);
	return cuda_launched(dev, op,
	                cuda_launch_rope_set_rows(&vx, index_data(pos), &r, &vo,
	                                          cache ? &vc : NULL, dev->fault, dev->pdl,
	                                          dev->stream));
}

q4kh_status cuda_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *pos,
                          const struct q4kh_rope_params *params,
                          const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope_ext(&c, x, pos, params, out)))
		return st;
	return rope_launch(dev, "rope_ext", x, pos, params, out, NULL);
}

q4kh_status cuda_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                          const struct q4kh_tensor *rows,
                          const struct q4kh_tensor *dst)
{
	struct cuda_view vs, vd;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_set_rows(&c, src, rows, dst)) ||
	    (st = cuda_enter(dev, "set_rows")))
		return st;
	vs = cuda_view_of(src);
	vd = cuda_view_of(dst);
	return cuda_launched(dev, "set_rows",
	                cuda_launch_set_rows(&vs, index_data(rows), &vd,
	                                     dev->fault, dev->pdl, dev->stream));
}

q4kh_status cuda_rope_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *pos,
                              const struct q4kh_rope_params *params,
                              const struct q4kh_tensor *cache)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope_set_rows(&c, x, pos, params, cache)))
		return st;
	return rope_launch(dev, "rope_set_rows", x, pos, params, x, cache);
}

q4kh_status cuda_rope_store(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                            const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                            const struct q4kh_tensor *pos,
                            const struct q4kh_rope_params *params,
                            const struct q4kh_tensor *k_cache,
                            const struct q4kh_tensor *v_cache)
{
	struct cuda_view vq, vk, vv, vkc, vvc;
	struct cuda_rope r;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope_store(&c, q, k, v, pos, params, k_cache, v_cache)) ||
	    (st = cuda_enter(dev, "rope_store")))
		return st;
	vq = cuda_view_of(q);
	vk = cuda_view_of(k);
	vv = cuda_view_of(v);
	vkc = cuda_view_of(k_cache);
	vvc = cuda_view_of(v_cache);
	r = cuda_rope_of(params);
	return cuda_launched(dev, "rope_store",
	                cuda_launch_rope_store(&vq, &vk, &vv, index_data(pos), &r, &vkc,
	                                       &vvc, NULL, dev->fault, dev->pdl, dev->stream));
}

q4kh_status cuda_top2(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const struct q4kh_tensor *idx, const struct q4kh_tensor *val)
{
	const struct q4kh_check c = cuda_contract(dev);
	struct cuda_view vx;
	size_t scratch;
	q4kh_status st;

	if ((st = q4kh_check_top2(&c, x, idx, val)) || (st = cuda_enter(dev, "top2")))
		return st;
	vx = cuda_view_of(x);
	/* A recording that meets a scratch too small for the split form (the
	 * shape never ran before) takes a block per column, as attention. */
	scratch = cuda_top2_scratch(&vx, dev->sms);
	if (scratch > dev->scratch_size && dev->recording)
		scratch = 0;
	else if (scratch && (st = cuda_scratch(dev, "top2", scratch)))
		return st;
	return cuda_launched(dev, "top2",
	                cuda_launch_top2(&vx, (int32_t *)(idx->buffer->ptr + idx->offset),
	                                 (float *)(val->buffer->ptr + val->offset),
	                                 val->nb[1] / (int64_t)sizeof(float),
	                                 scratch ? dev->scratch : NULL, dev->sms, dev->pdl,
	                                 dev->stream));
}

q4kh_status cuda_attention_ext(q4kh_device_ctx *dev,
                               const struct q4kh_tensor *q,
                               const struct q4kh_tensor *k_cache,
                               const struct q4kh_tensor *v_cache,
                               const struct q4kh_tensor *pos,
                               const struct q4kh_attn_params *params,
                               const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention_ext(&c, q, k_cache, v_cache, pos, params,
	                                   out)))
		return st;
	return cuda_attend(dev, "attention_ext", q, k_cache, v_cache,
	                   index_data(pos), NULL, 0, params, out);
}

q4kh_status cuda_attention_paged(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                 const struct q4kh_tensor *k_pool,
                                 const struct q4kh_tensor *v_pool,
                                 const struct q4kh_tensor *pos,
                                 const struct q4kh_tensor *pages, int32_t page_size,
                                 const struct q4kh_attn_params *params,
                                 const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention_paged(&c, q, k_pool, v_pool, pos, pages, page_size, params,
	                                     out)))
		return st;
	return cuda_attend(dev, "attention_paged", q, k_pool, v_pool, index_data(pos), pages,
	                   page_size, params, out);
}
