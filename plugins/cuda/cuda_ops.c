/*
 * The ops' entry points: each validates its arguments on the host (the same
 * contract as the cpu reference, plugin.h), makes the device current,
 * stages host-side ids or positions, and enqueues its kernel on the device
 * context's stream without waiting.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "cuda.h"

#define F32 CUDA_T(Q4KH_TYPE_F32)
#define F16 CUDA_T(Q4KH_TYPE_F16)

/* The launch's own error, named after the op. */
static q4kh_status launched(q4kh_device_ctx *dev, const char *op,
                            cudaError_t e)
{
	char what[64];

	snprintf(what, sizeof(what), "%s: kernel launch", op);
	return cuda_check(dev, e, what);
}

/* --- get_rows, mul_mat --- */

q4kh_status cuda_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                          const int32_t *ids, int64_t n, float scale,
                          const struct q4kh_tensor *out)
{
	struct cuda_view vt, vo;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_tensor_check(dev, "get_rows table", table,
	                            cuda_weight_types())) ||
	    (st = cuda_tensor_shape(dev, "get_rows table", table, -1, -1, 1, 1)) ||
	    (st = cuda_tensor_check(dev, "get_rows out", out, F32)) ||
	    (st = cuda_tensor_apart(dev, "get_rows out", out, "table", table, 0)))
		return st;
	if (n < 1 || !ids)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "get_rows: %lld ids at %p, expected at least one",
		                 (long long)n, (const void *)ids);
	if ((st = cuda_tensor_shape(dev, "get_rows out", out, table->ne[0], n, 1,
	                            1)))
		return st;
	for (int64_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= table->ne[1])
			return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
			                 "get_rows: ids[%lld] = %d, expected 0 .. %lld",
			                 (long long)i, ids[i],
			                 (long long)table->ne[1] - 1);
	if ((st = cuda_enter(dev, "get_rows")) ||
	    (st = cuda_stage(dev, "get_rows", ids, n)))
		return st;
	vt = cuda_view_of(table);
	vo = cuda_view_of(out);
	return launched(dev, "get_rows",
	                cuda_launch_get_rows(&vt, dev->stage, n, scale, &vo,
	                                     dev->stream));
}

q4kh_status cuda_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                         const struct q4kh_tensor *x,
                         const struct q4kh_tensor *y)
{
	struct cuda_view vw, vx, vy;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_tensor_check(dev, "mul_mat w", w, cuda_weight_types())) ||
	    (st = cuda_tensor_shape(dev, "mul_mat w", w, -1, -1, 1, 1)) ||
	    (st = cuda_tensor_check(dev, "mul_mat x", x, F32)) ||
	    (st = cuda_tensor_shape(dev, "mul_mat x", x, w->ne[0], -1, 1, 1)) ||
	    (st = cuda_tensor_check(dev, "mul_mat y", y, F32)) ||
	    (st = cuda_tensor_shape(dev, "mul_mat y", y, w->ne[1], x->ne[1], 1,
	                            1)) ||
	    (st = cuda_tensor_apart(dev, "mul_mat y", y, "x", x, 0)) ||
	    (st = cuda_tensor_apart(dev, "mul_mat y", y, "w", w, 0)) ||
	    (st = cuda_enter(dev, "mul_mat")))
		return st;
	vw = cuda_view_of(w);
	vx = cuda_view_of(x);
	vy = cuda_view_of(y);
	return launched(dev, "mul_mat",
	                cuda_launch_mul_mat(&vw, &vx, &vy, dev->stream));
}

/* --- rms_norm, rope --- */

q4kh_status cuda_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w, float eps,
                          const struct q4kh_tensor *out)
{
	struct cuda_view vx, vw, vo;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_tensor_check(dev, "rms_norm x", x, F32)) ||
	    (st = cuda_tensor_check(dev, "rms_norm out", out, F32)) ||
	    (st = cuda_tensor_shape(dev, "rms_norm out", out, x->ne[0], x->ne[1],
	                            x->ne[2], x->ne[3])) ||
	    (st = cuda_tensor_apart(dev, "rms_norm out", out, "x", x, 1)))
		return st;
	if (w && ((st = cuda_tensor_check(dev, "rms_norm w", w, F32)) ||
	          (st = cuda_tensor_shape(dev, "rms_norm w", w, x->ne[0], 1, 1,
	                                  1)) ||
	          (st = cuda_tensor_apart(dev, "rms_norm out", out, "w", w, 0))))
		return st;
	if (!(eps >= 0.0f) || isinf(eps))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "rms_norm: eps = %g, expected a finite value >= 0",
		                 (double)eps);
	if ((st = cuda_enter(dev, "rms_norm")))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	if (w)
		vw = cuda_view_of(w);
	return launched(dev, "rms_norm",
	                cuda_launch_rms_norm(&vx, w ? &vw : NULL, eps, &vo,
	                                     dev->stream));
}

static q4kh_status rope_args(q4kh_device_ctx *dev, const int32_t *pos,
                             int32_t n_rot, q4kh_rope_mode mode, float base,
                             float freq_scale, int64_t hd)
{
	if (!pos)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID, "rope: pos is NULL");
	if (mode != Q4KH_ROPE_NORM && mode != Q4KH_ROPE_NEOX)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "rope: mode %d, expected %d (NORM) or %d (NEOX)",
		                 (int)mode, Q4KH_ROPE_NORM, Q4KH_ROPE_NEOX);
	if (n_rot < 2 || n_rot % 2 || n_rot > hd)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "rope: n_rot = %d, expected an even number from 2 "
		                 "to the head dimension %lld",
		                 n_rot, (long long)hd);
	if (!(base > 0.0f) || isinf(base) || !isfinite(freq_scale))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "rope: base %g and freq_scale %g, expected a finite "
		                 "base > 0 and a finite scale",
		                 (double)base, (double)freq_scale);
	return Q4KH_OK;
}

q4kh_status cuda_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                      float base, float freq_scale,
                      const struct q4kh_tensor *out)
{
	struct cuda_view vx, vo;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_tensor_check(dev, "rope x", x, F32)) ||
	    (st = cuda_tensor_shape(dev, "rope x", x, -1, -1, -1, 1)) ||
	    (st = cuda_tensor_check(dev, "rope out", out, F32)) ||
	    (st = cuda_tensor_shape(dev, "rope out", out, x->ne[0], x->ne[1],
	                            x->ne[2], 1)) ||
	    (st = cuda_tensor_apart(dev, "rope out", out, "x", x, 1)) ||
	    (st = rope_args(dev, pos, n_rot, mode, base, freq_scale, x->ne[0])) ||
	    (st = cuda_enter(dev, "rope")) ||
	    (st = cuda_stage(dev, "rope", pos, x->ne[2])))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	return launched(dev, "rope",
	                cuda_launch_rope(&vx, dev->stage, n_rot,
	                                 mode == Q4KH_ROPE_NEOX, base, freq_scale,
	                                 &vo, dev->stream));
}

/* --- add, mul, scale, glu, copy --- */

static q4kh_status binary(q4kh_device_ctx *dev, const char *op,
                          const struct q4kh_tensor *a,
                          const struct q4kh_tensor *b,
                          const struct q4kh_tensor *out, int mul)
{
	char na[16], nb[16], no[16];
	struct cuda_view va, vb, vo;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	snprintf(na, sizeof(na), "%s a", op);
	snprintf(nb, sizeof(nb), "%s b", op);
	snprintf(no, sizeof(no), "%s out", op);
	if ((st = cuda_tensor_check(dev, na, a, F32)) ||
	    (st = cuda_tensor_check(dev, nb, b, F32)) ||
	    (st = cuda_tensor_check(dev, no, out, F32)) ||
	    (st = cuda_tensor_shape(dev, no, out, a->ne[0], a->ne[1], a->ne[2],
	                            a->ne[3])) ||
	    (st = cuda_tensor_apart(dev, no, out, "a", a, 1)) ||
	    (st = cuda_tensor_apart(dev, no, out, "b", b, 1)))
		return st;
	for (int i = 0; i < 4; i++)
		if (b->ne[i] != 1 && b->ne[i] != a->ne[i])
			return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
			                 "%s: b->ne[%d] = %lld, expected 1 or a->ne[%d] "
			                 "= %lld",
			                 op, i, (long long)b->ne[i], i,
			                 (long long)a->ne[i]);
	if ((st = cuda_enter(dev, op)))
		return st;
	va = cuda_view_of(a);
	vb = cuda_view_of(b);
	vo = cuda_view_of(out);
	return launched(dev, op,
	                cuda_launch_binary(mul, &va, &vb, &vo, dev->stream));
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
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_tensor_check(dev, "scale x", x, F32)) ||
	    (st = cuda_tensor_check(dev, "scale out", out, F32)) ||
	    (st = cuda_tensor_shape(dev, "scale out", out, x->ne[0], x->ne[1],
	                            x->ne[2], x->ne[3])) ||
	    (st = cuda_tensor_apart(dev, "scale out", out, "x", x, 1)) ||
	    (st = cuda_enter(dev, "scale")))
		return st;
	vx = cuda_view_of(x);
	vo = cuda_view_of(out);
	return launched(dev, "scale", cuda_launch_scale(&vx, s, &vo, dev->stream));
}

q4kh_status cuda_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                     const struct q4kh_tensor *gate,
                     const struct q4kh_tensor *up,
                     const struct q4kh_tensor *out)
{
	struct cuda_view vg, vu, vo;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (kind != Q4KH_GLU_GELU_TANH && kind != Q4KH_GLU_SILU)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "glu: kind %d, expected %d (GELU tanh) or %d (SiLU)",
		                 (int)kind, Q4KH_GLU_GELU_TANH, Q4KH_GLU_SILU);
	if ((st = cuda_tensor_check(dev, "glu gate", gate, F32)) ||
	    (st = cuda_tensor_check(dev, "glu up", up, F32)) ||
	    (st = cuda_tensor_check(dev, "glu out", out, F32)) ||
	    (st = cuda_tensor_shape(dev, "glu up", up, gate->ne[0], gate->ne[1],
	                            gate->ne[2], gate->ne[3])) ||
	    (st = cuda_tensor_shape(dev, "glu out", out, gate->ne[0], gate->ne[1],
	                            gate->ne[2], gate->ne[3])) ||
	    (st = cuda_tensor_apart(dev, "glu out", out, "gate", gate, 1)) ||
	    (st = cuda_tensor_apart(dev, "glu out", out, "up", up, 1)) ||
	    (st = cuda_enter(dev, "glu")))
		return st;
	vg = cuda_view_of(gate);
	vu = cuda_view_of(up);
	vo = cuda_view_of(out);
	return launched(dev, "glu",
	                cuda_launch_glu(kind == Q4KH_GLU_SILU, &vg, &vu, &vo,
	                                dev->stream));
}

q4kh_status cuda_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                      const struct q4kh_tensor *dst)
{
	struct cuda_view vs, vd;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_tensor_check(dev, "copy src", src, F32 | F16)) ||
	    (st = cuda_tensor_check(dev, "copy dst", dst, F32 | F16)) ||
	    (st = cuda_tensor_shape(dev, "copy dst", dst, src->ne[0], src->ne[1],
	                            src->ne[2], src->ne[3])) ||
	    (st = cuda_tensor_apart(dev, "copy dst", dst, "src", src, 1)) ||
	    (st = cuda_enter(dev, "copy")))
		return st;
	vs = cuda_view_of(src);
	vd = cuda_view_of(dst);
	return launched(dev, "copy", cuda_launch_copy(&vs, &vd, dev->stream));
}

/* --- attention --- */

static q4kh_status attn_tensors(q4kh_device_ctx *dev,
                                const struct q4kh_tensor *q,
                                const struct q4kh_tensor *k,
                                const struct q4kh_tensor *v,
                                const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = cuda_tensor_check(dev, "attention q", q, F32)) ||
	    (st = cuda_tensor_shape(dev, "attention q", q, -1, -1, -1, 1)) ||
	    (st = cuda_tensor_check(dev, "attention k_cache", k, F32 | F16)) ||
	    (st = cuda_tensor_shape(dev, "attention k_cache", k, q->ne[0], -1, -1,
	                            1)) ||
	    (st = cuda_tensor_check(dev, "attention v_cache", v, F32 | F16)) ||
	    (st = cuda_tensor_shape(dev, "attention v_cache", v, k->ne[0],
	                            k->ne[1], k->ne[2], 1)) ||
	    (st = cuda_tensor_check(dev, "attention out", out, F32)) ||
	    (st = cuda_tensor_shape(dev, "attention out", out, q->ne[0], q->ne[1],
	                            q->ne[2], 1)) ||
	    (st = cuda_tensor_apart(dev, "attention out", out, "q", q, 0)) ||
	    (st = cuda_tensor_apart(dev, "attention out", out, "k_cache", k, 0)) ||
	    (st = cuda_tensor_apart(dev, "attention out", out, "v_cache", v, 0)))
		return st;
	if (q->ne[1] % k->ne[1])
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "attention: %lld query heads is not a multiple of "
		                 "%lld KV heads",
		                 (long long)q->ne[1], (long long)k->ne[1]);
	if (q->ne[0] > CUDA_ATTN_MAX_HEAD_DIM)
		return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
		                 "attention: head dimension %lld, the cuda kernel "
		                 "takes at most %d",
		                 (long long)q->ne[0], CUDA_ATTN_MAX_HEAD_DIM);
	return Q4KH_OK;
}

static q4kh_status attn_params(q4kh_device_ctx *dev,
                               const struct q4kh_attn_params *p, int64_t T,
                               int64_t n_ctx)
{
	const size_t need =
		offsetof(struct q4kh_attn_params, softcap) + sizeof(p->softcap);

	if (!p)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "attention: params is NULL");
	if (p->struct_size < need)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "attention: params struct_size %u, expected at "
		                 "least %zu",
		                 p->struct_size, need);
	if (p->pos0 < 0 || p->pos0 > n_ctx - T)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "attention: positions %lld .. %lld, expected inside "
		                 "the %lld-position cache",
		                 (long long)p->pos0, (long long)(p->pos0 + T - 1),
		                 (long long)n_ctx);
	if (p->window < 0)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "attention: window %d, expected >= 0", p->window);
	if (!isfinite(p->scale) || !(p->softcap >= 0.0f) || isinf(p->softcap))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "attention: scale %g and softcap %g, expected "
		                 "finite values, softcap >= 0",
		                 (double)p->scale, (double)p->softcap);
	return Q4KH_OK;
}

q4kh_status cuda_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k_cache,
                           const struct q4kh_tensor *v_cache,
                           const struct q4kh_attn_params *params,
                           const struct q4kh_tensor *out)
{
	struct cuda_view vq, vk, vv, vo;
	struct cuda_attn a;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = attn_tensors(dev, q, k_cache, v_cache, out)) ||
	    (st = attn_params(dev, params, q->ne[2], k_cache->ne[2])) ||
	    (st = cuda_enter(dev, "attention")))
		return st;
	a.pos0 = params->pos0;
	a.window = params->window;
	a.scale = params->scale;
	a.softcap = params->softcap;
	vq = cuda_view_of(q);
	vk = cuda_view_of(k_cache);
	vv = cuda_view_of(v_cache);
	vo = cuda_view_of(out);
	return launched(dev, "attention",
	                cuda_launch_attention(&vq, &vk, &vv, &a, &vo, dev->stream));
}
