/*
 * moe_route and mul_mat_id for the backends in host memory (q4khost/moe.h),
 * as llama.cpp's build_moe_ffn computes them with softmax gating:
 * ggml_soft_max, ggml_top_k (argsort, descending), ggml_get_rows of the
 * chosen probabilities, their sum clamped to 2^-14 and the division
 * (norm_w), then ggml_mul_mat_id.
 */
#include "q4khost/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One column: logits[0 .. e) in, ids and weights[0 .. k) out; p scratch
 * of e + k doubles (the probabilities, then the chosen ones). */
static void route_column(const float *logits, int64_t e, int64_t k, int32_t norm,
                         double *p, int32_t *ids, float *weights)
{
	double max = logits[0], sum = 0.0, chosen = 0.0, *w = p + e;

	for (int64_t i = 1; i < e; i++)
		max = logits[i] > max ? logits[i] : max;
	for (int64_t i = 0; i < e; i++) {
		p[i] = exp((double)logits[i] - max);
		sum += p[i];
	}
	for (int64_t i = 0; i < e; i++)
		p[i] /= sum;
	for (int64_t j = 0; j < k; j++) {
		int64_t best = -1;

		/* a strict > keeps the lower index of equal values; a chosen
		 * expert is marked -1, below every probability */
		for (int64_t i = 0; i < e; i++)
			if (p[i] >= 0.0 && (best < 0 || p[i] > p[best]))
				best = i;
		if (best < 0) /* NaN logits: the lowest index not yet chosen */
			for (best = 0; p[best] == -1.0; best++)
				;
		ids[j] = (int32_t)best;
		w[j] = p[best];
		chosen += p[best];
		p[best] = -1.0;
	}
	for (int64_t j = 0; j < k; j++)
		weights[j] = (float)(norm ? w[j] / (chosen > 0x1p-14 ? chosen : 0x1p-14) : w[j]);
}

q4kh_status q4kh_moe_route(const struct q4kh_moe_backend *b, const struct q4kh_tensor *logits,
                           int32_t norm, const struct q4kh_tensor *ids,
                           const struct q4kh_tensor *weights)
{
	q4kh_status st = q4kh_check_moe_route(&b->check, logits, norm, ids, weights);
	double *p;

	if (st)
		return st;
	p = malloc(sizeof(*p) * (size_t)(logits->ne[0] + ids->ne[0]));
	if (!p) {
		snprintf(b->check.msg, b->check.cap, "moe_route: out of memory for %lld experts",
		         (long long)logits->ne[0]);
		return Q4KH_ERR_NOMEM;
	}
	for (int64_t t = 0; t < logits->ne[1]; t++)
		route_column((const float *)b->at(logits, t, 0), logits->ne[0], ids->ne[0], norm, p,
		             (int32_t *)b->at(ids, t, 0), (float *)b->at(weights, t, 0));
	free(p);
	return Q4KH_OK;
}

static int32_t id_at(const struct q4kh_moe_backend *b, const struct q4kh_tensor *ids,
                     int64_t j, int64_t t)
{
	return ((const int32_t *)b->at(ids, t, 0))[j];
}

/* An F32 tensor {ne0, ne1}, contiguous, at float OFF of BUF. */
static struct q4kh_tensor in_scratch(q4kh_buffer *buf, uint64_t off, int64_t ne0, int64_t ne1)
{
	const int64_t row = ne0 * (int64_t)sizeof(float);
	struct q4kh_tensor t = {
		.buffer = buf,
		.offset = off * sizeof(float),
		.type = Q4KH_TYPE_F32,
		.ne = { ne0, ne1, 1, 1 },
		.nb = { sizeof(float), row, row * ne1, row * ne1 },
	};

	return t;
}

/* Expert E's columns through the backend's mul_mat, via xs and ys. */
static q4kh_status one_expert(const struct q4kh_moe_backend *b, const struct q4kh_tensor *w,
                              const struct q4kh_tensor *x, const struct q4kh_tensor *ids,
                              const struct q4kh_tensor *y, int64_t e,
                              const struct q4kh_tensor *xs, const struct q4kh_tensor *ys)
{
	const int64_t K = w->ne[0], N = w->ne[1], S = ids->ne[0], T = ids->ne[1];
	struct q4kh_tensor we = *w, xv = *xs, yv = *ys;
	float *xd = (float *)b->at(xs, 0, 0), *yd = (float *)b->at(ys, 0, 0);
	int64_t n = 0;
	q4kh_status st;

	for (int64_t t = 0; t < T; t++)
		for (int64_t j = 0; j < S; j++)
			if (id_at(b, ids, j, t) == e)
				memcpy(xd + K * n++, b->at(x, j % x->ne[1], t), sizeof(float) * (size_t)K);
	if (!n)
		return Q4KH_OK;
	we.offset += (uint64_t)(e * w->nb[2]);
	we.ne[2] = 1;
	xv.ne[1] = yv.ne[1] = n;
	if ((st = b->mul_mat(b->dev, &we, &xv, &yv)))
		return st;
	n = 0;
	for (int64_t t = 0; t < T; t++)
		for (int64_t j = 0; j < S; j++)
			if (id_at(b, ids, j, t) == e)
				memcpy(b->at(y, j, t), yd + N * n++, sizeof(float) * (size_t)N);
	return Q4KH_OK;
}

q4kh_status q4kh_moe_mul_mat_id(const struct q4kh_moe_backend *b, const struct q4kh_tensor *w,
                                const struct q4kh_tensor *x, const struct q4kh_tensor *ids,
                                const struct q4kh_tensor *y)
{
	const int64_t S = ids->ne[0], T = ids->ne[1];
	q4kh_status st = q4kh_check_mul_mat_id(&b->check, w, x, ids, y);
	struct q4kh_tensor xs, ys;
	q4kh_buffer *buf;

	if (st)
		return st;
	for (int64_t t = 0; t < T; t++)
		for (int64_t j = 0; j < S; j++)
			if (id_at(b, ids, j, t) < 0 || id_at(b, ids, j, t) >= w->ne[2]) {
				snprintf(b->check.msg, b->check.cap,
				         "mul_mat_id ids[%lld, %lld] = %d, expected 0 .. %lld",
				         (long long)j, (long long)t, id_at(b, ids, j, t),
				         (long long)w->ne[2] - 1);
				return Q4KH_ERR_INVALID;
			}
	if ((st = b->buffer_alloc(b->dev, sizeof(float) * (uint64_t)(w->ne[0] + w->ne[1]) *
	                                          (uint64_t)(S * T),
	                          &buf)))
		return st;
	xs = in_scratch(buf, 0, w->ne[0], S * T);
	ys = in_scratch(buf, (uint64_t)(w->ne[0] * S * T), w->ne[1], S * T);
	for (int64_t e = 0; e < w->ne[2] && !st; e++)
		st = one_expert(b, w, x, ids, y, e, &xs, &ys);
	b->buffer_free(b->dev, buf);
	return st;
}
