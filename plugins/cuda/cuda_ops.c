/*
 * The ops' entry points (ABI 1.0, 1.2's ops of linear-attention layers
 * and 1.7's of mixture-of-experts layers): each validates its arguments on the host (the same
 * contract as the cpu reference, plugin.h), makes the device current,
 * stages host-side ids or positions, and enqueues its kernel on the device
 * context's stream without waiting.
 */
#include "cuda.h"
#include "q4khost/cuda_tc.h"

/* --- get_rows, mul_mat --- */

q4kh_status cuda_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                          const int32_t *ids, int64_t n, float scale,
                          const struct q4kh_tensor *out)
{
	struct cuda_view vt, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_get_rows(&c, table, ids, n, out)) ||
	    (st = cuda_enter(dev, "get_rows")) ||
	    (st = cuda_stage(dev, "get_rows", ids, n)))
		return st;
	vt = cuda_view_of(table);
	vo = cuda_view_of(out);
	return cuda_launched(dev, "get_rows",
	                cuda_launch_get_rows(&vt, dev->stage, n, scale, &vo,
	                                     dev->fault, dev->stream));
}

/*
 * y = w x on tensor cores (q4khost/cuda_tc.h): the scratch past attention's
 * counters, which must stay zero, lends the fp16 copies. The cuBLAS
 * handle comes from device_open's warm-up thread, else is made by the
 * first such product; a shape is always run once before it is recorded,
 * so a recording finds it.
 */
static q4kh_status tc_mul_mat(q4kh_device_ctx *dev, const struct cuda_view *w,
                              const struct cuda_view *x,
                              const struct cuda_view *y)
{
	const size_t base = CUDA_SCRATCH_COUNTERS * sizeof(int);
	char why[512];
	q4kh_status st;

	cuda_warm_join(dev);
	if (!dev->blas && q4kh_tc_open(&dev->blas, why, sizeof(why)))
		return cuda_fail(dev->ctx, Q4KH_ERR_DEVICE, "mul_mat: %s", why);
	if ((st = cuda_scratch(dev, "mul_mat",
	                       base + q4kh_tc_scratch_bytes(w->ne[0], w->ne[1],
	                                                    x->ne[1]))))
		return st;
	if (q4kh_tc_gemm(dev->blas, w->type, (const uint8_t *)w->data, w->nb[1],
	                 w->ne[0], w->ne[1], (const float *)x->data, x->nb[1] / 4,
	                 (float *)y->data, y->nb[1] / 4, x->ne[1],
	                 (char *)dev->scratch + base, dev->stream, why, sizeof(why)))
		return cuda_fail(dev->ctx, Q4KH_ERR_DEVICE, "mul_mat: %s", why);
	return Q4KH_OK;
}

q4kh_status cuda_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                         const struct q4kh_tensor *x,
                         const struct q4kh_tensor *y)
{
	struct cuda_view vw, vx, vy;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_mul_mat(&c, w, x, y)) ||
	    (st = cuda_enter(dev, "mul_mat")))
		return st;
	vw = cuda_view_of(w);
	vx = cuda_view_of(x);
	vy = cuda_view_of(y);
	if (q4kh_tc_wanted(w->type, x->ne[1], Q4KH_TC_MIN_COLUMNS) && x->nb[1] % 4 == 0 &&
	    y->nb[1] % 4 == 0)
		return tc_mul_mat(dev, &vw, &vx, &vy);
	return cuda_launched(dev, "mul_mat",
	                     cuda_launch_mul_mat(&vw, &vx, &vy, dev->sms, dev->pdl,
	                                         dev->stream));
}

/* --- rms_norm, rope --- */

/*
 * rms_norm, add_rms_norm and norm_add_rms_norm once OP's checks passed:
 * one launch (cuda_launch_norm) norms x, after x += a when A is not NULL,
 * after a's own norm (W_A, which may be NULL, and EPS_A) when NORM_A.
 */
static q4kh_status launch_norm(q4kh_device_ctx *dev, const char *op,
                               const struct q4kh_tensor *x, const struct q4kh_tensor *a,
                               int norm_a, const struct q4kh_tensor *w_a, float eps_a,
                               const struct q4kh_tensor *w, float eps,
                               const struct q4kh_tensor *out)
{
	struct cuda_view vx, va, vwa, vw, vo;
	q4kh_status st;

	if ((st = cuda_enter(dev, op)))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	if (a)
		va = cuda_view_of(a);
	if (w_a)
		vwa = cuda_view_of(w_a);
	if (w)
		vw = cuda_view_of(w);
	return cuda_launched(dev, op,
	                     cuda_launch_norm(&vx, a ? &va : NULL, norm_a, w_a ? &vwa : NULL,
	                                      eps_a, w ? &vw : NULL, eps, &vo, dev->pdl,
	                                      dev->stream));
}

q4kh_status cuda_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w, float eps,
                          const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rms_norm(&c, x, w, eps, out)))
		return st;
	return launch_norm(dev, "rms_norm", x, NULL, 0, NULL, 0.0f, w, eps, out);
}

q4kh_status cuda_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *a,
                              const struct q4kh_tensor *w, float eps,
                              const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_add_rms_norm(&c, x, a, w, eps, out)))
		return st;
	return launch_norm(dev, "add_rms_norm", x, a, 0, NULL, 0.0f, w, eps, out);
}

q4kh_status cuda_norm_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                   const struct q4kh_tensor *a,
                                   const struct q4kh_tensor *w_a, float eps_a,
                                   const struct q4kh_tensor *w, float eps,
                                   const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_norm_add_rms_norm(&c, x, a, w_a, eps_a, w, eps, out)))
		return st;
	return launch_norm(dev, "norm_add_rms_norm", x, a, 1, w_a, eps_a, w, eps, out);
}

q4kh_status cuda_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                      float base, float freq_scale,
                      const struct q4kh_tensor *out)
{
	const struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = n_rot, .mode = (uint32_t)mode,
		.base = base, .freq_scale = freq_scale, .attn_factor = 1.0f,
	};
	struct cuda_view vx, vo;
	struct cuda_rope r;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope(&c, x, pos, n_rot, mode, base, freq_scale, out)) ||
	    (st = cuda_enter(dev, "rope")) ||
	    (st = cuda_stage(dev, "rope", pos, x->ne[2])))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	r = cuda_rope_of(&p);
	return cuda_launched(dev, "rope",
	                cuda_launch_rope(&vx, dev->stage, &r, &vo, dev->fault, dev->pdl,
	                                 dev->stream));
}

/* --- add, mul, scale, glu, copy --- */

static q4kh_status binary(q4kh_device_ctx *dev, const char *op,
                          const struct q4kh_tensor *a,
                          const struct q4kh_tensor *b,
                          const struct q4kh_tensor *out, int mul)
{
	struct cuda_view va, vb, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_binary(&c, op, a, b, out)) || (st = cuda_enter(dev, op)))
		return st;
	va = cuda_view_of(a);
	vb = cuda_view_of(b);
	vo = cuda_view_of(out);
	return cuda_launched(dev, op,
	                cuda_launch_binary(mul, &va, &vb, &vo, dev->pdl, dev->stream));
}

q4kh_status cuda_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b,
                     const struct q4kh_tensor *out)
{
	return binary(dev, "add", a, b, out, 0);
}

q4kh_status cuda_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b,
                     const struct q4kh_tensor *out)
{
	return binary(dev, "mul", a, b, out, 1);
}

q4kh_status cuda_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                       float s, const struct q4kh_tensor *out)
{
	struct cuda_view vx, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_scale(&c, x, out)) || (st = cuda_enter(dev, "scale")))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	return cuda_launched(dev, "scale",
	                     cuda_launch_scale(&vx, s, &vo, dev->pdl, dev->stream));
}

q4kh_status cuda_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                     const struct q4kh_tensor *gate,
                     const struct q4kh_tensor *up,
                     const struct q4kh_tensor *out)
{
	struct cuda_view vg, vu, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_glu(&c, kind, gate, up, out)) ||
	    (st = cuda_enter(dev, "glu")))
		return st;
	vg = cuda_view_of(gate);
	vu = cuda_view_of(up);
	vo = cuda_view_of(out);
	return cuda_launched(dev, "glu",
	                cuda_launch_glu(kind == Q4KH_GLU_SILU, &vg, &vu, &vo, dev->pdl,
	                                dev->stream));
}

q4kh_status cuda_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                      const struct q4kh_tensor *dst)
{
	struct cuda_view vs, vd;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_copy(&c, src, dst)) || (st = cuda_enter(dev, "copy")))
		return st;
	vs = cuda_view_of(src);
	vd = cuda_view_of(dst);
	return cuda_launched(dev, "copy", cuda_launch_copy(&vs, &vd, dev->pdl, dev->stream));
}

/* --- unary, ssm_conv, delta_net: linear-attention layers --- */

q4kh_status cuda_unary(q4kh_device_ctx *dev, q4kh_unary_kind kind,
                       const struct q4kh_tensor *x,
                       const struct q4kh_tensor *out)
{
	struct cuda_view vx, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_unary(&c, kind, x, out)) || (st = cuda_enter(dev, "unary")))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	return cuda_launched(dev, "unary",
	                     cuda_launch_unary((int)kind, &vx, &vo, dev->pdl, dev->stream));
}

q4kh_status cuda_ssm_conv(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w,
                          const struct q4kh_tensor *state,
                          const struct q4kh_tensor *out)
{
	struct cuda_view vx, vw, vs, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_ssm_conv(&c, x, w, state, out)) ||
	    (st = cuda_enter(dev, "ssm_conv")))
		return st;
	vx = cuda_view_of(x);
	vw = cuda_view_of(w);
	vs = cuda_view_of(state);
	vo = cuda_view_of(out);
	return cuda_launched(dev, "ssm_conv",
	                     cuda_launch_ssm_conv(&vx, &vw, &vs, &vo, dev->stream));
}

q4kh_status cuda_delta_net(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k,
                           const struct q4kh_tensor *v,
                           const struct q4kh_tensor *g,
                           const struct q4kh_tensor *beta,
                           const struct q4kh_tensor *state, float scale,
                           const struct q4kh_tensor *out)
{
	struct cuda_view vq, vk, vv, vg, vb, vs, vo;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_delta_net(&c, q, k, v, g, beta, state, scale, out)))
		return st;
	if (q->ne[0] > CUDA_DELTA_MAX_KEYS)
		return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
		                 "delta_net: %lld keys per head (q's ne[0]), the cuda "
		                 "kernel takes at most %d (a warp's registers hold "
		                 "a row of the state)",
		                 (long long)q->ne[0], CUDA_DELTA_MAX_KEYS);
	if ((st = cuda_enter(dev, "delta_net")))
		return st;
	vq = cuda_view_of(q);
	vk = cuda_view_of(k);
	vv = cuda_view_of(v);
	vg = cuda_view_of(g);
	vb = cuda_view_of(beta);
	vs = cuda_view_of(state);
	vo = cuda_view_of(out);
	return cuda_launched(dev, "delta_net",
	                     cuda_launch_delta_net(&vq, &vk, &vv, &vg, &vb, &vs, scale,
	                                           &vo, dev->stream));
}

/* --- attention --- */

q4kh_status cuda_attend(q4kh_device_ctx *dev, const char *op,
                        const struct q4kh_tensor *q,
                        const struct q4kh_tensor *k_cache,
                        const struct q4kh_tensor *v_cache, const int32_t *pos,
                        const struct q4kh_tensor *pages, int32_t page_size,
                        const struct q4kh_attn_params *params,
                        const struct q4kh_tensor *out)
{
	struct cuda_view vq, vk, vv, vo;
	struct cuda_attn a;
	size_t scratch;
	q4kh_status st;

	if (q->ne[0] > CUDA_ATTN_MAX_HEAD_DIM)
		return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
		                 "%s: head dimension %lld, the cuda kernel takes at "
		                 "most %d",
		                 op, (long long)q->ne[0], CUDA_ATTN_MAX_HEAD_DIM);
	if ((st = cuda_enter(dev, op)))
		return st;
	a.pos0 = params->pos0;
	a.pos = pos;
	a.window = params->window;
	a.scale = params->scale;
	a.softcap = params->softcap;
	a.pages = pages ? (const int32_t *)(pages->buffer->ptr + pages->offset) : NULL;
	a.n_table = pages ? pages->ne[0] : 0;
	a.page_size = page_size;
	a.n_pages = pages ? k_cache->ne[2] / page_size : 0;
	vq = cuda_view_of(q);
	vk = cuda_view_of(k_cache);
	vv = cuda_view_of(v_cache);
	vo = cuda_view_of(out);
	/* The split form needs scratch; a recording that meets a scratch too
	 * small for it (the shape never ran before) takes the one-pass form. */
	scratch = cuda_attention_scratch(&vq, &vk, &vv, dev->sms);
	if (scratch > dev->scratch_size && dev->recording)
		scratch = 0;
	else if (scratch && (st = cuda_scratch(dev, op, scratch)))
		return st;
	return cuda_launched(dev, op,
	                cuda_launch_attention(&vq, &vk, &vv, &a, &vo,
	                                      scratch ? dev->scratch : NULL,
	                                      dev->sms, dev->cc_major, dev->fault,
	                                      dev->pdl, dev->stream));
}

q4kh_status cuda_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k_cache,
                           const struct q4kh_tensor *v_cache,
                           const struct q4kh_attn_params *params,
                           const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention(&c, q, k_cache, v_cache, params, out)))
		return st;
	return cuda_attend(dev, "attention", q, k_cache, v_cache, NULL, NULL, 0, params, out);
}

/* --- moe_route, mul_mat_id: mixture-of-experts layers (ABI 1.7) --- */

/* Q4KH_OK when E experts are within the kernels' reach. */
static q4kh_status moe_experts(q4kh_device_ctx *dev, const char *op, int64_t e)
{
	if (e <= CUDA_MOE_MAX_EXPERTS)
		return Q4KH_OK;
	return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
	                 "%s: %lld experts, the cuda kernels take at most %d", op, (long long)e,
	                 CUDA_MOE_MAX_EXPERTS);
}

q4kh_status cuda_moe_route(q4kh_device_ctx *dev, const struct q4kh_tensor *logits,
                           int32_t norm, const struct q4kh_tensor *ids,
                           const struct q4kh_tensor *weights)
{
	struct cuda_view vl, vi, vw;
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_moe_route(&c, logits, norm, ids, weights)) ||
	    (st = moe_experts(dev, "moe_route", logits->ne[0])) ||
	    (st = cuda_enter(dev, "moe_route")))
		return st;
	vl = cuda_view_of(logits);
	vi = cuda_view_of(ids);
	vw = cuda_view_of(weights);
	return cuda_launched(dev, "moe_route",
	                     cuda_launch_moe_route(&vl, norm, &vi, &vw, dev->stream));
}

/* The grouping of many columns lies past the scratch's counters, as the
 * tensor cores' copies do (tc_mul_mat); a decode's needs none. */
q4kh_status cuda_mul_mat_id(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                            const struct q4kh_tensor *x, const struct q4kh_tensor *ids,
                            const struct q4kh_tensor *y)
{
	const size_t base = CUDA_SCRATCH_COUNTERS * sizeof(int);
	struct cuda_view vw, vx, vi, vy;
	const struct q4kh_check c = cuda_contract(dev);
	size_t scratch;
	q4kh_status st;

	if ((st = q4kh_check_mul_mat_id(&c, w, x, ids, y)) ||
	    (st = moe_experts(dev, "mul_mat_id", w->ne[2])) ||
	    (st = cuda_enter(dev, "mul_mat_id")))
		return st;
	vw = cuda_view_of(w);
	vx = cuda_view_of(x);
	vi = cuda_view_of(ids);
	vy = cuda_view_of(y);
	scratch = cuda_mul_mat_id_scratch(&vw, &vi);
	if (scratch && (st = cuda_scratch(dev, "mul_mat_id", base + scratch)))
		return st;
	return cuda_launched(dev, "mul_mat_id",
	                     cuda_launch_mul_mat_id(&vw, &vx, &vi, &vy,
	                                            scratch ? (char *)dev->scratch + base : NULL,
	                                            dev->sms, dev->fault, dev->stream));
}
