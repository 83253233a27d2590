/*
 * example-backend: every op of the step graph, in float arithmetic, one
 * thread, as plugin.h defines each. Every op first checks its arguments
 * with q4khost/contract.h, which refuses what the reference refuses with
 * the reference's message, so the code below may trust the views it gets:
 * types, shapes, strides inside their buffers, outputs apart from their
 * inputs unless the op may run in place (then exactly the same view).
 *
 * The 1.0 entries take ids and positions in host memory, the 1.2 entries
 * (_ext, set_rows) in an I32 tensor of this device; each pair shares one
 * function that takes a plain array.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* Element (0, i1, i2, i3) of a checked tensor. */
static void *at(const struct q4kh_tensor *t, int64_t i1, int64_t i2, int64_t i3)
{
	return t->buffer->data + t->offset + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* Row R of T, counting over ne[1], then ne[2], then ne[3]. */
static void *flat_row(const struct q4kh_tensor *t, int64_t r)
{
	return at(t, r % t->ne[1], r / t->ne[1] % t->ne[2], r / (t->ne[1] * t->ne[2]));
}

static int64_t rows_of(const struct q4kh_tensor *t)
{
	return t->ne[1] * t->ne[2] * t->ne[3];
}

/* The values of an index tensor the contract has checked as I32 {n}. */
static const int32_t *values(const struct q4kh_tensor *t)
{
	return (const int32_t *)at(t, 0, 0, 0);
}

/*
 * sum a[i] b[i] with eight partial sums: independent additions a compiler
 * may put in one vector register. One sum would be as right, and slower.
 */
static float dot(const float *a, const float *b, int64_t n)
{
	float part[8] = { 0 };
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			part[l] += a[i + l] * b[i + l];
	for (; i < n; i++)
		part[i % 8] += a[i] * b[i];
	return ((part[0] + part[1]) + (part[2] + part[3])) +
	       ((part[4] + part[5]) + (part[6] + part[7]));
}

static q4kh_status out_of_memory(q4kh_device_ctx *dev, const char *op)
{
	return example_fail(dev->ctx, Q4KH_ERR_NOMEM, "%s: out of memory", op);
}

/* --- get_rows: out[:, i] = table[:, ids[i]] * scale --- */

static void gather(const struct q4kh_tensor *table, const int32_t *ids, int64_t n,
                   float scale, const struct q4kh_tensor *out)
{
	for (int64_t r = 0; r < n; r++) {
		float *o = at(out, r, 0, 0);

		example_row_to_f32(table->type, at(table, ids[r], 0, 0), o, table->ne[0]);
		for (int64_t i = 0; i < table->ne[0]; i++)
			o[i] *= scale;
	}
}

q4kh_status example_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                             const int32_t *ids, int64_t n, float scale,
                             const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_get_rows(&c, table, ids, n, out);

	if (!st)
		gather(table, ids, n, scale, out);
	return st;
}

q4kh_status example_get_rows_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                                 const struct q4kh_tensor *ids, float scale,
                                 const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st;

	/* ids are read now, when the op runs (plugin.h): check them now too */
	if ((st = q4kh_check_get_rows_ext(&c, table, ids, out)) ||
	    (st = q4kh_check_index_values(&c, "get_rows_ext ids", values(ids), ids->ne[0],
	                                  table->ne[1])))
		return st;
	gather(table, values(ids), ids->ne[0], scale, out);
	return Q4KH_OK;
}

/* --- mul_mat: y[n, t] = sum_k w[k, n] x[k, t] --- */

q4kh_status example_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                            const struct q4kh_tensor *x, const struct q4kh_tensor *y)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st;
	float *row;

	if ((st = q4kh_check_mul_mat(&c, w, x, y)))
		return st;
	row = malloc(sizeof(float) * (size_t)w->ne[0]);
	if (!row)
		return out_of_memory(dev, "mul_mat");
	/* each weight row is decoded once and used for every column */
	for (int64_t n = 0; n < w->ne[1]; n++) {
		example_row_to_f32(w->type, at(w, n, 0, 0), row, w->ne[0]);
		for (int64_t t = 0; t < x->ne[1]; t++)
			((float *)at(y, t, 0, 0))[n] = dot(row, at(x, t, 0, 0), w->ne[0]);
	}
	free(row);
	return Q4KH_OK;
}

/* --- rms_norm: out = x / sqrt(mean(x^2) + eps) * w --- */

q4kh_status example_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                             const struct q4kh_tensor *w, float eps,
                             const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_rms_norm(&c, x, w, eps, out);

	for (int64_t r = 0; !st && r < rows_of(x); r++) {
		const float *a = flat_row(x, r);
		float *o = flat_row(out, r);
		const int64_t n = x->ne[0];
		const float s = 1.0f / sqrtf(dot(a, a, n) / (float)n + eps);

		/* in place, o is a: the sum has read the row before it is written */
		for (int64_t i = 0; i < n; i++)
			o[i] = a[i] * s * (w ? ((const float *)at(w, 0, 0, 0))[i] : 1.0f);
	}
	return st;
}

/* --- rope: plugin.h's formula, frequency factors and YaRN included --- */

/*
 * cos and sin of pair i at position p, both scaled. The angle is taken in
 * double: p reaches 10^5 and more, and a float angle would be off by p
 * times float's rounding, enough to move the logits.
 */
static void rotation(const struct q4kh_rope_params *rp, const float *ff, int32_t p,
                     int i, float *cs, float *sn)
{
	const double extrap = p * pow(rp->base, -2.0 * i / rp->n_rot) / (ff ? ff[i] : 1.0);
	double theta = rp->freq_scale * extrap, m = rp->attn_factor;

	if (rp->ext_factor != 0.0f) {
		/* YaRN: mix in extrapolation by a ramp over the pairs */
		const double pi = 3.14159265358979323846;
		const double d_fast = rp->n_rot * log(rp->n_ctx_orig / (2 * pi * rp->beta_fast)) /
		                      (2 * log(rp->base));
		const double d_slow = rp->n_rot * log(rp->n_ctx_orig / (2 * pi * rp->beta_slow)) /
		                      (2 * log(rp->base));
		const double lo = fmax(0.0, floor(d_fast)), hi = fmin(rp->n_rot - 1, ceil(d_slow));
		const double ramp = 1.0 - fmin(1.0, fmax(0.0, (i - lo) / fmax(0.001, hi - lo)));
		const double r = rp->ext_factor * ramp;

		theta = theta * (1.0 - r) + extrap * r;
		m *= 1.0 + 0.1 * log(1.0 / rp->freq_scale);
	}
	*cs = (float)(cos(theta) * m);
	*sn = (float)(sin(theta) * m);
}

static void rotate(const struct q4kh_tensor *x, const int32_t *pos,
                   const struct q4kh_rope_params *rp, const float *ff,
                   const struct q4kh_tensor *out)
{
	const int half = rp->n_rot / 2;
	/* NORM turns pairs of neighbours (2i, 2i+1), NEOX (i, i + n_rot/2) */
	const int step = rp->mode == Q4KH_ROPE_NORM ? 2 : 1;
	const int other = rp->mode == Q4KH_ROPE_NORM ? 1 : half;

	for (int64_t t = 0; t < x->ne[2]; t++) {
		for (int i = 0; i < half; i++) {
			float cs, sn;

			rotation(rp, ff, pos[t], i, &cs, &sn);
			for (int64_t h = 0; h < x->ne[1]; h++) {
				const float *a = at(x, h, t, 0);
				float *o = at(out, h, t, 0);
				const float a0 = a[i * step], a1 = a[i * step + other];

				o[i * step] = a0 * cs - a1 * sn;
				o[i * step + other] = a0 * sn + a1 * cs;
			}
		}
		for (int64_t h = 0; h < x->ne[1]; h++)
			memmove((float *)at(out, h, t, 0) + rp->n_rot,
			        (const float *)at(x, h, t, 0) + rp->n_rot,
			        sizeof(float) * (size_t)(x->ne[0] - rp->n_rot));
	}
}

q4kh_status example_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                         float base, float freq_scale, const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_rope(&c, x, pos, n_rot, mode, base, freq_scale, out);
	struct q4kh_rope_params rp;

	if (st)
		return st;
	/* the 1.0 rotation is rope_ext's without factors or YaRN */
	memset(&rp, 0, sizeof(rp));
	rp.n_rot = n_rot;
	rp.mode = (uint32_t)mode;
	rp.base = base;
	rp.freq_scale = freq_scale;
	rp.attn_factor = 1.0f;
	rotate(x, pos, &rp, NULL, out);
	return Q4KH_OK;
}

q4kh_status example_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                             const struct q4kh_tensor *pos,
                             const struct q4kh_rope_params *params,
                             const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope_ext(&c, x, pos, params, out)) ||
	    (st = q4kh_check_index_values(&c, "rope_ext pos", values(pos), pos->ne[0],
	                                  INT32_MAX)))
		return st;
	rotate(x, values(pos), params,
	       params->freq_factors ? at(params->freq_factors, 0, 0, 0) : NULL, out);
	return Q4KH_OK;
}

/* --- add, mul (b broadcast where its ne is 1), scale --- */

static q4kh_status binary(q4kh_device_ctx *dev, const char *op,
                          const struct q4kh_tensor *a, const struct q4kh_tensor *b,
                          const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	const int mul = !strcmp(op, "mul");
	q4kh_status st;

	if ((st = q4kh_check_binary(&c, op, a, b, out)))
		return st;
	for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
		for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
			for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
				const float *x = at(a, i1, i2, i3);
				const float *y = at(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
				float *o = at(out, i1, i2, i3);

				for (int64_t i = 0; i < a->ne[0]; i++) {
					const float v = y[b->ne[0] == 1 ? 0 : i];

					o[i] = mul ? x[i] * v : x[i] + v;
				}
			}
	return Q4KH_OK;
}

q4kh_status example_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                        const struct q4kh_tensor *b, const struct q4kh_tensor *out)
{
	return binary(dev, "add", a, b, out);
}

q4kh_status example_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                        const struct q4kh_tensor *b, const struct q4kh_tensor *out)
{
	return binary(dev, "mul", a, b, out);
}

q4kh_status example_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x, float s,
                          const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_scale(&c, x, out);

	for (int64_t r = 0; !st && r < rows_of(x); r++) {
		const float *a = flat_row(x, r);
		float *o = flat_row(out, r);

		for (int64_t i = 0; i < x->ne[0]; i++)
			o[i] = a[i] * s;
	}
	return st;
}

/* --- glu: out = act(gate) * up --- */

static float gelu_tanh(float g)
{
	return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
}

static float silu(float g)
{
	return g / (1.0f + expf(-g));
}

q4kh_status example_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                        const struct q4kh_tensor *gate, const struct q4kh_tensor *up,
                        const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_glu(&c, kind, gate, up, out);
	float (*act)(float) = kind == Q4KH_GLU_SILU ? silu : gelu_tanh;

	for (int64_t r = 0; !st && r < rows_of(gate); r++) {
		const float *g = flat_row(gate, r), *u = flat_row(up, r);
		float *o = flat_row(out, r);

		for (int64_t i = 0; i < gate->ne[0]; i++)
			o[i] = act(g[i]) * u[i];
	}
	return st;
}

/* --- copy and set_rows: f32 or f16 to f32 or f16 --- */

static void convert(uint32_t from, const void *src, uint32_t to, void *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		const float v = from == Q4KH_TYPE_F32 ? ((const float *)src)[i]
		                                      : q4kh_fp16_to_f32(((const uint16_t *)src)[i]);

		if (to == Q4KH_TYPE_F32)
			((float *)dst)[i] = v;
		else
			((uint16_t *)dst)[i] = q4kh_f32_to_fp16(v);
	}
}

q4kh_status example_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                         const struct q4kh_tensor *dst)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_copy(&c, src, dst);

	for (int64_t r = 0; !st && r < rows_of(src); r++)
		convert(src->type, flat_row(src, r), dst->type, flat_row(dst, r), src->ne[0]);
	return st;
}

/* The KV-cache write: dst[:, :, rows[t]] = src[:, :, t]. */
q4kh_status example_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                             const struct q4kh_tensor *rows,
                             const struct q4kh_tensor *dst)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_set_rows(&c, src, rows, dst)) ||
	    (st = q4kh_check_index_values(&c, "set_rows rows", values(rows), rows->ne[0],
	                                  dst->ne[2])))
		return st;
	for (int64_t t = 0; t < src->ne[2]; t++)
		for (int64_t j = 0; j < src->ne[1]; j++)
			convert(src->type, at(src, j, t, 0), dst->type, at(dst, j, values(rows)[t], 0),
			        src->ne[0]);
	return Q4KH_OK;
}

/* --- attention: causal, grouped-query, over the KV cache --- */

/*
 * Query t of every head at position pos[t] (or pos0 + t when pos is
 * NULL): out = softmax(scale q.k_j, capped) . v_j over the keys j it sees.
 */
static q4kh_status attend(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                          const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                          const int32_t *pos, const struct q4kh_attn_params *p,
                          const struct q4kh_tensor *out)
{
	const int64_t hd = q->ne[0], group = q->ne[1] / k->ne[1], n_ctx = k->ne[2];
	float *s = malloc(sizeof(float) * (size_t)(n_ctx + 2 * hd));
	float *kv = s + n_ctx, *acc = kv + hd;

	if (!s)
		return out_of_memory(dev, "attention");
	for (int64_t t = 0; t < q->ne[2]; t++) {
		const int64_t last = pos ? pos[t] : p->pos0 + t;
		const int64_t first = p->window && last - p->window + 1 > 0 ? last - p->window + 1 : 0;

		for (int64_t h = 0; h < q->ne[1]; h++) {
			const float *qh = at(q, h, t, 0);
			float max = -INFINITY, sum = 0.0f;

			for (int64_t j = first; j <= last; j++) {
				float score;

				example_row_to_f32(k->type, at(k, h / group, j, 0), kv, hd);
				score = p->scale * dot(qh, kv, hd);
				if (p->softcap > 0.0f)
					score = p->softcap * tanhf(score / p->softcap);
				s[j - first] = score;
				max = fmaxf(max, score);
			}
			memset(acc, 0, sizeof(float) * (size_t)hd);
			for (int64_t j = first; j <= last; j++) {
				const float e = expf(s[j - first] - max);

				sum += e;
				example_row_to_f32(v->type, at(v, h / group, j, 0), kv, hd);
				for (int64_t d = 0; d < hd; d++)
					acc[d] += e * kv[d];
			}
			for (int64_t d = 0; d < hd; d++)
				((float *)at(out, h, t, 0))[d] = acc[d] / sum;
		}
	}
	free(s);
	return Q4KH_OK;
}

q4kh_status example_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                              const struct q4kh_tensor *k_cache,
                              const struct q4kh_tensor *v_cache,
                              const struct q4kh_attn_params *params,
                              const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_attention(&c, q, k_cache, v_cache, params, out);

	return st ? st : attend(dev, q, k_cache, v_cache, NULL, params, out);
}

q4kh_status example_attention_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                  const struct q4kh_tensor *k_cache,
                                  const struct q4kh_tensor *v_cache,
                                  const struct q4kh_tensor *pos,
                                  const struct q4kh_attn_params *params,
                                  const struct q4kh_tensor *out)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention_ext(&c, q, k_cache, v_cache, pos, params, out)) ||
	    (st = q4kh_check_index_values(&c, "attention_ext pos", values(pos), pos->ne[0],
	                                  k_cache->ne[2])))
		return st;
	return attend(dev, q, k_cache, v_cache, values(pos), params, out);
}
