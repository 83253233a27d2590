/*
 * Backend conformance against the cpu reference (conformance.h).
 *
 * Every tensor lives alone in a buffer of its own: GUARD bytes of a
 * sentinel, the rows (each followed by PAD bytes of sentinel when the
 * case is strided), GUARD bytes of sentinel. Outputs start as NaN
 * (0xFF bytes in f32 and f16). After the op the whole buffer is read
 * back: a changed sentinel is a write outside the view, a NaN the
 * reference does not have is an element left unwritten.
 */
#include "conformance.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/quant.h"
#include "q4khost/step.h"

#define GUARD 64
#define SENTINEL 0xA5
#define LIMIT_F32 1e-7
#define LIMIT_QUANT 5e-4

/* One tensor on both sides, with its host image. */
struct pair {
	q4kh_buffer *rb, *cb;
	struct q4kh_tensor r, c; /* the views on ref and cand */
	uint8_t *image;          /* the whole buffer as uploaded */
	uint64_t size;
};

struct run {
	const struct q4kh_backend *ref, *cand;
	uint64_t rng;
	q4kh_conf_fn fn;
	void *data;
	int failed;
	struct q4kh_error *err;
	int fatal;
};

/* splitmix64 */
static uint64_t next(struct run *R)
{
	uint64_t z = (R->rng += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float uniform(struct run *R)
{
	return (float)((double)(next(R) >> 11) / 4503599627370496.0 - 1.0);
}

static uint64_t row_bytes(uint32_t type, int64_t ne0)
{
	return (uint64_t)ne0 / q4kh_type_block_elems(type) * q4kh_type_block_bytes(type);
}

/* A random valid block of TYPE: random bits, finite fp16 scales. */
static void random_block(struct run *R, uint32_t type, uint8_t *b)
{
	uint32_t n = q4kh_type_block_bytes(type);

	for (uint32_t i = 0; i < n; i++)
		b[i] = (uint8_t)next(R);
	switch (type) {
	case Q4KH_TYPE_Q6_K:
		*(uint16_t *)(b + offsetof(struct q4kh_block_q6_k, d)) =
			q4kh_f32_to_fp16(0.002f + 0.01f * (uniform(R) + 1.0f));
		break;
	case Q4KH_TYPE_Q3_K:
		*(uint16_t *)(b + offsetof(struct q4kh_block_q3_k, d)) =
			q4kh_f32_to_fp16(0.002f + 0.01f * (uniform(R) + 1.0f));
		break;
	case Q4KH_TYPE_Q2_K:
		*(uint16_t *)(b + offsetof(struct q4kh_block_q2_k, d)) =
			q4kh_f32_to_fp16(0.005f + 0.02f * (uniform(R) + 1.0f));
		*(uint16_t *)(b + offsetof(struct q4kh_block_q2_k, dmin)) =
			q4kh_f32_to_fp16(0.002f * (uniform(R) + 1.0f));
		break;
	case Q4KH_TYPE_Q4_K:
	case Q4KH_TYPE_Q5_K:
	case Q4KH_TYPE_Q4_1: /* dmin or m second */
	case Q4KH_TYPE_Q5_1:
		((uint16_t *)b)[1] = q4kh_f32_to_fp16(0.002f * (uniform(R) + 1.0f));
		__attribute__((fallthrough)); /* d is first */
	default:
		((uint16_t *)b)[0] = q4kh_f32_to_fp16(0.005f + 0.02f * (uniform(R) + 1.0f));
	}
}

/* Element i of a row of f32, f16, bf16 (V's float truncated) or I32
 * values from V. */
static void put_value(uint32_t type, uint8_t *row, int64_t i, double v)
{
	union { float f; uint32_t u; } x = { (float)v };

	if (type == Q4KH_TYPE_F32)
		((float *)row)[i] = x.f;
	else if (type == Q4KH_TYPE_F16)
		((uint16_t *)row)[i] = q4kh_f32_to_fp16(x.f);
	else if (type == Q4KH_TYPE_BF16)
		((uint16_t *)row)[i] = (uint16_t)(x.u >> 16);
	else
		((int32_t *)row)[i] = (int32_t)v;
}

/*
 * Make a tensor of TYPE {ne0, ne1, ne2} on both sides, rows padded by PAD
 * bytes. VALUES (ne0 * ne1 * ne2 numbers, or NULL for random data; NaN
 * poison when OUTPUT) fill f32, f16 and I32 tensors; quantized ones get
 * random blocks. -1 on a backend failure (R->err set, R->fatal).
 */
static int make(struct run *R, struct pair *p, uint32_t type, int64_t ne0,
                int64_t ne1, int64_t ne2, uint64_t pad, const double *values,
                int output)
{
	uint64_t rb = row_bytes(type, ne0), stride = rb + pad;
	int64_t rows = ne1 * ne2;
	int quant = q4kh_type_block_elems(type) > 1;

	memset(p, 0, sizeof(*p));
	p->size = 2 * GUARD + stride * (uint64_t)rows;
	p->image = malloc(p->size);
	if (!p->image) {
		R->fatal = 1;
		return q4kh_fail(R->err, "out of memory");
	}
	memset(p->image, SENTINEL, p->size);
	for (int64_t r = 0; r < rows; r++) {
		uint8_t *row = p->image + GUARD + (uint64_t)r * stride;

		if (output)
			memset(row, 0xFF, rb);
		else if (quant)
			for (uint64_t b = 0; b < rb; b += q4kh_type_block_bytes(type))
				random_block(R, type, row + b);
		else
			for (int64_t i = 0; i < ne0; i++)
				put_value(type, row, i, values ? values[r * ne0 + i] : uniform(R));
	}
	p->r = (struct q4kh_tensor){ .type = type, .ne = { ne0, ne1, ne2, 1 },
		                     .offset = GUARD };
	p->r.nb[0] = q4kh_type_block_bytes(type);
	p->r.nb[1] = (int64_t)stride;
	p->r.nb[2] = p->r.nb[1] * ne1;
	p->r.nb[3] = p->r.nb[2] * ne2;
	p->c = p->r;
	if (q4kh_backend_check(R->ref, R->ref->v->buffer_alloc(R->ref->dev, p->size, &p->rb),
	                       "buffer_alloc", R->err) ||
	    q4kh_backend_check(R->cand, R->cand->v->buffer_alloc(R->cand->dev, p->size, &p->cb),
	                       "buffer_alloc", R->err) ||
	    q4kh_backend_check(R->ref, R->ref->v->buffer_upload(R->ref->dev, p->rb, 0, p->image,
	                                                        p->size),
	                       "buffer_upload", R->err) ||
	    q4kh_backend_check(R->cand, R->cand->v->buffer_upload(R->cand->dev, p->cb, 0,
	                                                          p->image, p->size),
	                       "buffer_upload", R->err)) {
		R->fatal = 1;
		return -1;
	}
	p->r.buffer = p->rb;
	p->c.buffer = p->cb;
	return 0;
}

static void drop(struct run *R, struct pair *p)
{
	if (p->rb)
		R->ref->v->buffer_free(R->ref->dev, p->rb);
	if (p->cb)
		R->cand->v->buffer_free(R->cand->dev, p->cb);
	free(p->image);
	memset(p, 0, sizeof(*p));
}

/* Element i of row r of a downloaded image as a double. */
static double get_value(const struct pair *p, const uint8_t *img, int64_t r, int64_t i)
{
	const uint8_t *row = img + p->r.offset + (uint64_t)r * (uint64_t)p->r.nb[1];

	return p->r.type == Q4KH_TYPE_F16 ? q4kh_fp16_to_f32(((const uint16_t *)row)[i])
	                                  : ((const float *)row)[i];
}

/*
 * Compare output OUT of both sides into res: guards, NaN placement, then
 * the NMSE over the elements both have finite.
 */
static void compare(struct run *R, const struct pair *out, struct q4kh_conf_result *res)
{
	uint8_t *ri = malloc(out->size), *ci = malloc(out->size);
	int64_t rows = out->r.ne[1] * out->r.ne[2];
	uint64_t rb = row_bytes(out->r.type, out->r.ne[0]);
	double num = 0.0, den = 0.0;

	res->nmse = NAN;
	if (!ri || !ci) {
		snprintf(res->message, sizeof(res->message), "out of memory");
		goto out;
	}
	if (R->ref->v->buffer_download(R->ref->dev, out->rb, 0, ri, out->size) ||
	    R->cand->v->buffer_download(R->cand->dev, out->cb, 0, ci, out->size)) {
		snprintf(res->message, sizeof(res->message), "buffer_download of the output failed");
		goto out;
	}
	for (uint64_t b = 0; b < out->size; b++) {
		uint64_t in_row = b < GUARD ? rb : (b - GUARD) % (uint64_t)out->r.nb[1];
		int outside = b < GUARD || b >= out->size - GUARD || in_row >= rb;

		if (outside && ci[b] != SENTINEL) {
			snprintf(res->message, sizeof(res->message),
			         "wrote byte %lld of the buffer, outside the output view",
			         (long long)b - GUARD);
			goto out;
		}
	}
	for (int64_t r = 0; r < rows; r++)
		for (int64_t i = 0; i < out->r.ne[0]; i++) {
			double x = get_value(out, ri, r, i), y = get_value(out, ci, r, i);

			if (isnan(x) != isnan(y)) {
				snprintf(res->message, sizeof(res->message),
				         "element %lld of row %lld: %s where the reference has %g",
				         (long long)i, (long long)r,
				         isnan(y) ? "NaN (unwritten?)" : "a number", x);
				goto out;
			}
			if (isfinite(x) && isfinite(y)) {
				num += (y - x) * (y - x);
				den += x * x;
			}
		}
	res->nmse = den > 0.0 ? num / den : num;
	if (!(res->nmse <= res->limit))
		snprintf(res->message, sizeof(res->message), "NMSE %.3g > %.3g", res->nmse,
		         res->limit);
	else
		res->ok = 1;
out:
	free(ri);
	free(ci);
}

/* Report a case; a failed call on the candidate is the case's failure. */
static void report(struct run *R, struct q4kh_conf_result *res)
{
	if (res->skipped)
		res->ok = 1;
	if (!res->ok)
		R->failed++;
	R->fn(R->data, res);
}

/* Begin a case: the result with its name and limit. */
static struct q4kh_conf_result begin(const char *op, double limit, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static struct q4kh_conf_result begin(const char *op, double limit, const char *fmt, ...)
{
	struct q4kh_conf_result res = { .op = op, .limit = limit, .nmse = NAN };
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(res.what, sizeof(res.what), fmt, ap);
	va_end(ap);
	return res;
}

/*
 * Run the op on both sides (REF_ST, CAND_ST: their statuses) and judge
 * OUT. The reference failing is a harness error, not the candidate's.
 */
static void judge(struct run *R, struct q4kh_conf_result *res, q4kh_status ref_st,
                  q4kh_status cand_st, const struct pair *out)
{
	if (ref_st)
		snprintf(res->message, sizeof(res->message), "the reference failed: %s",
		         R->ref->v->last_error(R->ref->ctx));
	else if (cand_st)
		snprintf(res->message, sizeof(res->message), "%s: %s", q4kh_status_name(cand_st),
		         R->cand->v->last_error(R->cand->ctx));
	else
		compare(R, out, res);
	report(R, res);
}

static void skip(struct run *R, struct q4kh_conf_result *res, const char *why)
{
	res->skipped = 1;
	snprintf(res->message, sizeof(res->message), "%s", why);
	report(R, res);
}

static const uint32_t weight_types[] = {
	Q4KH_TYPE_F32,  Q4KH_TYPE_F16,  Q4KH_TYPE_BF16, Q4KH_TYPE_Q4_0,   Q4KH_TYPE_Q4_1,
	Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q2_K,   Q4KH_TYPE_Q3_K,
	Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS,
};

static int both_support(struct run *R, uint32_t type)
{
	return R->ref->v->supports_type(R->ref->ctx, type) &&
	       R->cand->v->supports_type(R->cand->ctx, type);
}

static void case_get_rows(struct run *R, uint32_t type)
{
	static const int32_t ids[5] = { 0, 18, 5, 5, 11 };
	struct q4kh_conf_result res = begin("get_rows", LIMIT_F32, "%s {256, 19}, 5 ids, scale 1.5",
	                                    q4kh_type_name(type));
	struct pair t, o;

	if (!both_support(R, type))
		return skip(R, &res, "type not supported");
	if (make(R, &t, type, 256, 19, 1, 0, NULL, 0) || make(R, &o, Q4KH_TYPE_F32, 256, 5, 1, 16, NULL, 1))
		return;
	judge(R, &res, R->ref->v->get_rows(R->ref->dev, &t.r, ids, 5, 1.5f, &o.r),
	      R->cand->v->get_rows(R->cand->dev, &t.c, ids, 5, 1.5f, &o.c), &o);
	drop(R, &t);
	drop(R, &o);
}

static void case_mul_mat(struct run *R, uint32_t type, int64_t cols)
{
	int quant = q4kh_type_block_elems(type) > 1;
	struct q4kh_conf_result res = begin("mul_mat", quant ? LIMIT_QUANT : LIMIT_F32,
	                                    "%s {512, 37} x {512, %lld}, strided x and y",
	                                    q4kh_type_name(type), (long long)cols);
	struct pair w, x, y;

	if (!both_support(R, type))
		return skip(R, &res, "type not supported");
	if (make(R, &w, type, 512, 37, 1, 0, NULL, 0) ||
	    make(R, &x, Q4KH_TYPE_F32, 512, cols, 1, 32, NULL, 0) ||
	    make(R, &y, Q4KH_TYPE_F32, 37, cols, 1, 12, NULL, 1))
		return;
	judge(R, &res, R->ref->v->mul_mat(R->ref->dev, &w.r, &x.r, &y.r),
	      R->cand->v->mul_mat(R->cand->dev, &w.c, &x.c, &y.c), &y);
	drop(R, &w);
	drop(R, &x);
	drop(R, &y);
}

static void case_rms_norm(struct run *R, int weighted, int in_place)
{
	struct q4kh_conf_result res = begin("rms_norm", LIMIT_F32, "{100, 7}%s%s",
	                                    weighted ? ", weighted" : "", in_place ? ", in place" : "");
	struct pair x, w, o;
	const struct pair *out;

	if (make(R, &x, Q4KH_TYPE_F32, 100, 7, 1, 8, NULL, 0) ||
	    make(R, &w, Q4KH_TYPE_F32, 100, 1, 1, 0, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 100, 7, 1, 8, NULL, 1))
		return;
	out = in_place ? &x : &o;
	judge(R, &res,
	      R->ref->v->rms_norm(R->ref->dev, &x.r, weighted ? &w.r : NULL, 1e-6f, &out->r),
	      R->cand->v->rms_norm(R->cand->dev, &x.c, weighted ? &w.c : NULL, 1e-6f, &out->c),
	      out);
	drop(R, &x);
	drop(R, &w);
	drop(R, &o);
}

static void case_rope(struct run *R, q4kh_rope_mode mode)
{
	static const int32_t pos[5] = { 3, 4, 9, 100, 0 };
	struct q4kh_conf_result res = begin("rope", LIMIT_F32, "%s, {64, 3, 5}, 32 of 64 rotated",
	                                    mode == Q4KH_ROPE_NEOX ? "NEOX" : "NORM");
	struct pair x, o;

	if (make(R, &x, Q4KH_TYPE_F32, 64, 3, 5, 0, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 64, 3, 5, 0, NULL, 1))
		return;
	judge(R, &res,
	      R->ref->v->rope(R->ref->dev, &x.r, pos, 32, mode, 10000.0f, 0.5f, &o.r),
	      R->cand->v->rope(R->cand->dev, &x.c, pos, 32, mode, 10000.0f, 0.5f, &o.c), &o);
	drop(R, &x);
	drop(R, &o);
}

/* add or mul with b broadcast over rows; one NaN in a must stay put. */
static void case_binary(struct run *R, int mul, int with_nan)
{
	struct q4kh_conf_result res = begin(mul ? "mul" : "add", LIMIT_F32,
	                                    "{70, 6} by {70, 1}%s", with_nan ? ", a NaN in a" : "");
	double av[70 * 6];
	struct pair a, b, o;

	for (int i = 0; i < 70 * 6; i++)
		av[i] = uniform(R);
	if (with_nan)
		av[3 * 70 + 17] = NAN;
	if (make(R, &a, Q4KH_TYPE_F32, 70, 6, 1, 4, av, 0) ||
	    make(R, &b, Q4KH_TYPE_F32, 70, 1, 1, 0, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 70, 6, 1, 4, NULL, 1))
		return;
	judge(R, &res,
	      (mul ? R->ref->v->mul : R->ref->v->add)(R->ref->dev, &a.r, &b.r, &o.r),
	      (mul ? R->cand->v->mul : R->cand->v->add)(R->cand->dev, &a.c, &b.c, &o.c), &o);
	drop(R, &a);
	drop(R, &b);
	drop(R, &o);
}

static void case_scale(struct run *R)
{
	struct q4kh_conf_result res = begin("scale", LIMIT_F32, "{70, 6} by -0.75");
	struct pair x, o;

	if (make(R, &x, Q4KH_TYPE_F32, 70, 6, 1, 4, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 70, 6, 1, 4, NULL, 1))
		return;
	judge(R, &res, R->ref->v->scale(R->ref->dev, &x.r, -0.75f, &o.r),
	      R->cand->v->scale(R->cand->dev, &x.c, -0.75f, &o.c), &o);
	drop(R, &x);
	drop(R, &o);
}

static void case_glu(struct run *R, q4kh_glu_kind kind)
{
	struct q4kh_conf_result res = begin("glu", LIMIT_F32, "%s, {96, 5}",
	                                    kind == Q4KH_GLU_SILU ? "SiLU" : "GELU (tanh)");
	double gv[96 * 5];
	struct pair g, u, o;

	for (int i = 0; i < 96 * 5; i++)
		gv[i] = 4.0 * uniform(R);
	if (make(R, &g, Q4KH_TYPE_F32, 96, 5, 1, 0, gv, 0) ||
	    make(R, &u, Q4KH_TYPE_F32, 96, 5, 1, 0, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 96, 5, 1, 0, NULL, 1))
		return;
	judge(R, &res, R->ref->v->glu(R->ref->dev, kind, &g.r, &u.r, &o.r),
	      R->cand->v->glu(R->cand->dev, kind, &g.c, &u.c, &o.c), &o);
	drop(R, &g);
	drop(R, &u);
	drop(R, &o);
}

static void case_copy(struct run *R, uint32_t from, uint32_t to)
{
	struct q4kh_conf_result res = begin("copy", LIMIT_F32, "%s to %s, {48, 3, 2}, strided",
	                                    q4kh_type_name(from), q4kh_type_name(to));
	struct pair s, d;

	if (make(R, &s, from, 48, 3, 2, 8, NULL, 0) || make(R, &d, to, 48, 3, 2, 4, NULL, 1))
		return;
	judge(R, &res, R->ref->v->copy(R->ref->dev, &s.r, &d.r),
	      R->cand->v->copy(R->cand->dev, &s.c, &d.c), &d);
	drop(R, &s);
	drop(R, &d);
}

static void case_attention(struct run *R, uint32_t cache, int32_t window, float softcap)
{
	struct q4kh_attn_params p = { .struct_size = sizeof(p), .window = window, .pos0 = 9,
		                      .scale = 0.125f, .softcap = softcap };
	struct q4kh_conf_result res = begin("attention", LIMIT_QUANT,
	                                    "%s cache {64, 2, 20}, q {64, 4, 3} at 9, window %d, softcap %g",
	                                    q4kh_type_name(cache), window, (double)softcap);
	struct pair q, k, v, o;

	if (make(R, &q, Q4KH_TYPE_F32, 64, 4, 3, 0, NULL, 0) ||
	    make(R, &k, cache, 64, 2, 20, 0, NULL, 0) || make(R, &v, cache, 64, 2, 20, 0, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 64, 4, 3, 0, NULL, 1))
		return;
	judge(R, &res, R->ref->v->attention(R->ref->dev, &q.r, &k.r, &v.r, &p, &o.r),
	      R->cand->v->attention(R->cand->dev, &q.c, &k.c, &v.c, &p, &o.c), &o);
	drop(R, &q);
	drop(R, &k);
	drop(R, &v);
	drop(R, &o);
}

/* --- ABI 1.2: per-step values in device memory --- */

/* Both sides have the optional entry of ABI 1.MINOR; else the case is
 * skipped, saying which side lacks it. */
static int has_ext(struct run *R, struct q4kh_conf_result *res, int minor, int has_ref,
                   int has_cand)
{
	if (!has_cand) {
		char why[32];

		snprintf(why, sizeof(why), "no such entry (ABI 1.%d)", minor);
		skip(R, res, why);
		return 0;
	}
	if (!has_ref) {
		skip(R, res, "the reference lacks it");
		return 0;
	}
	return 1;
}

static void case_get_rows_ext(struct run *R)
{
	static const double ids[4] = { 7, 0, 18, 7 };
	struct q4kh_conf_result res = begin("get_rows_ext", LIMIT_F32, "Q4_K {256, 19}, 4 ids");
	struct pair t, i, o;

	if (!has_ext(R, &res, 2, Q4KH_BACKEND_HAS(R->ref->v, get_rows_ext),
	             Q4KH_BACKEND_HAS(R->cand->v, get_rows_ext)))
		return;
	if (!both_support(R, Q4KH_TYPE_Q4_K))
		return skip(R, &res, "type not supported");
	if (make(R, &t, Q4KH_TYPE_Q4_K, 256, 19, 1, 0, NULL, 0) ||
	    make(R, &i, Q4KH_TYPE_I32, 4, 1, 1, 0, ids, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 256, 4, 1, 0, NULL, 1))
		return;
	judge(R, &res, R->ref->v->get_rows_ext(R->ref->dev, &t.r, &i.r, 0.5f, &o.r),
	      R->cand->v->get_rows_ext(R->cand->dev, &t.c, &i.c, 0.5f, &o.c), &o);
	drop(R, &t);
	drop(R, &i);
	drop(R, &o);
}

static void case_rope_ext(struct run *R, int scaled)
{
	static const double pos[5] = { 300, 2, 4095, 17, 1 };
	struct q4kh_conf_result res = begin("rope_ext", LIMIT_F32, "NEOX {64, 3, 5}%s",
	                                    scaled ? ", YaRN and frequency factors" : "");
	struct q4kh_rope_params p = { .struct_size = sizeof(p), .n_rot = 64,
		                      .mode = Q4KH_ROPE_NEOX, .base = 1000000.0f,
		                      .freq_scale = 1.0f, .attn_factor = 1.0f };
	double ff[32];
	struct pair x, ps, f, o;

	if (!has_ext(R, &res, 2, Q4KH_BACKEND_HAS(R->ref->v, rope_ext),
	             Q4KH_BACKEND_HAS(R->cand->v, rope_ext)))
		return;
	for (int i = 0; i < 32; i++)
		ff[i] = 1.0 + 3.5 * (uniform(R) + 1.0);
	if (make(R, &x, Q4KH_TYPE_F32, 64, 3, 5, 0, NULL, 0) ||
	    make(R, &ps, Q4KH_TYPE_I32, 5, 1, 1, 0, pos, 0) ||
	    make(R, &f, Q4KH_TYPE_F32, 32, 1, 1, 0, ff, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 64, 3, 5, 0, NULL, 1))
		return;
	if (scaled) {
		p.freq_scale = 0.25f;
		p.ext_factor = 1.0f;
		p.attn_factor = 0.9f;
		p.beta_fast = 32.0f;
		p.beta_slow = 1.0f;
		p.n_ctx_orig = 1024;
	}
	p.freq_factors = scaled ? &f.r : NULL;
	{
		q4kh_status rs = R->ref->v->rope_ext(R->ref->dev, &x.r, &ps.r, &p, &o.r);

		p.freq_factors = scaled ? &f.c : NULL;
		judge(R, &res, rs, R->cand->v->rope_ext(R->cand->dev, &x.c, &ps.c, &p, &o.c), &o);
	}
	drop(R, &x);
	drop(R, &ps);
	drop(R, &f);
	drop(R, &o);
}

static void case_set_rows(struct run *R)
{
	static const double rows[3] = { 5, 1, 3 };
	struct q4kh_conf_result res = begin("set_rows", LIMIT_F32, "{64, 2, 3} into F16 {64, 2, 8}");
	struct pair s, r, d;

	if (!has_ext(R, &res, 2, Q4KH_BACKEND_HAS(R->ref->v, set_rows),
	             Q4KH_BACKEND_HAS(R->cand->v, set_rows)))
		return;
	/* the rows not written stay NaN on both sides */
	if (make(R, &s, Q4KH_TYPE_F32, 64, 2, 3, 0, NULL, 0) ||
	    make(R, &r, Q4KH_TYPE_I32, 3, 1, 1, 0, rows, 0) ||
	    make(R, &d, Q4KH_TYPE_F16, 64, 2, 8, 0, NULL, 1))
		return;
	judge(R, &res, R->ref->v->set_rows(R->ref->dev, &s.r, &r.r, &d.r),
	      R->cand->v->set_rows(R->cand->dev, &s.c, &r.c, &d.c), &d);
	drop(R, &s);
	drop(R, &r);
	drop(R, &d);
}

/*
 * attention_ext of 4 queries at 19, 2, 11, 11 over an F16 cache of 20
 * positions; with PAGED (ABI 1.8, attention_paged) the same positions over
 * pools of six pages of 4 tokens through a block table that names five of
 * them out of order (the sixth, page 3, never read).
 */
static void case_attention_ext(struct run *R, int32_t window, int paged)
{
	static const double pos[4] = { 19, 2, 11, 11 }, pages[5] = { 4, 0, 5, 2, 1 };
	struct q4kh_attn_params p = { .struct_size = sizeof(p), .window = window, .pos0 = 12345,
		                      .scale = 0.125f };
	struct q4kh_conf_result res =
		paged ? begin("attention_paged", LIMIT_QUANT,
		              "F16 pools {64, 2, 24} in pages of 4, table 4 0 5 2 1, 4 queries at 19, 2, 11, 11, window %d",
		              window)
		      : begin("attention_ext", LIMIT_QUANT,
		              "F16 cache {64, 2, 20}, 4 queries at 19, 2, 11, 11, window %d", window);
	const struct q4kh_backend_v1 *r = R->ref->v, *c = R->cand->v;
	struct pair q, k, v, ps, pg = { 0 }, o;

	if (!(paged ? has_ext(R, &res, 8, Q4KH_BACKEND_HAS(r, attention_paged),
	                      Q4KH_BACKEND_HAS(c, attention_paged))
	            : has_ext(R, &res, 2, Q4KH_BACKEND_HAS(r, attention_ext),
	                      Q4KH_BACKEND_HAS(c, attention_ext))))
		return;
	if (make(R, &q, Q4KH_TYPE_F32, 64, 4, 4, 0, NULL, 0) ||
	    make(R, &k, Q4KH_TYPE_F16, 64, 2, paged ? 24 : 20, 0, NULL, 0) ||
	    make(R, &v, Q4KH_TYPE_F16, 64, 2, paged ? 24 : 20, 0, NULL, 0) ||
	    make(R, &ps, Q4KH_TYPE_I32, 4, 1, 1, 0, pos, 0) ||
	    (paged && make(R, &pg, Q4KH_TYPE_I32, 5, 1, 1, 0, pages, 0)) ||
	    make(R, &o, Q4KH_TYPE_F32, 64, 4, 4, 0, NULL, 1))
		return;
	if (paged)
		judge(R, &res,
		      r->attention_paged(R->ref->dev, &q.r, &k.r, &v.r, &ps.r, &pg.r, 4, &p, &o.r),
		      c->attention_paged(R->cand->dev, &q.c, &k.c, &v.c, &ps.c, &pg.c, 4, &p, &o.c),
		      &o);
	else
		judge(R, &res, r->attention_ext(R->ref->dev, &q.r, &k.r, &v.r, &ps.r, &p, &o.r),
		      c->attention_ext(R->cand->dev, &q.c, &k.c, &v.c, &ps.c, &p, &o.c), &o);
	drop(R, &q);
	drop(R, &k);
	drop(R, &v);
	drop(R, &ps);
	drop(R, &pg);
	drop(R, &o);
}

/* --- ABI 1.2: linear-attention layers --- */

static void case_unary(struct run *R, q4kh_unary_kind kind)
{
	static const char *const names[] = { "sigmoid", "softplus", "SiLU" };
	struct q4kh_conf_result res = begin("unary", LIMIT_F32, "%s, {70, 6}, in place",
	                                    names[kind]);
	double xv[70 * 6];
	struct pair x;

	if (!has_ext(R, &res, 2, Q4KH_BACKEND_HAS(R->ref->v, unary),
	             Q4KH_BACKEND_HAS(R->cand->v, unary)))
		return;
	for (int i = 0; i < 70 * 6; i++)
		xv[i] = 8.0 * uniform(R);
	if (make(R, &x, Q4KH_TYPE_F32, 70, 6, 1, 4, xv, 0))
		return;
	judge(R, &res, R->ref->v->unary(R->ref->dev, kind, &x.r, &x.r),
	      R->cand->v->unary(R->cand->dev, kind, &x.c, &x.c), &x);
	drop(R, &x);
}

/* A case whose op also updates a state: the state is judged as a second
 * case of the same op. */
static void judge_state(struct run *R, const char *op, const char *what, double limit,
                        q4kh_status ref_st, q4kh_status cand_st, const struct pair *out,
                        const struct pair *state)
{
	struct q4kh_conf_result res = begin(op, limit, "%s: output", what);

	judge(R, &res, ref_st, cand_st, out);
	res = begin(op, limit, "%s: state after", what);
	judge(R, &res, ref_st, cand_st, state);
}

static void case_ssm_conv(struct run *R)
{
	struct q4kh_conf_result res = begin("ssm_conv", LIMIT_F32, "x {24, 5}, 4 taps");
	struct pair x, w, st, o;

	if (!has_ext(R, &res, 2, Q4KH_BACKEND_HAS(R->ref->v, ssm_conv),
	             Q4KH_BACKEND_HAS(R->cand->v, ssm_conv)))
		return;
	if (make(R, &x, Q4KH_TYPE_F32, 24, 5, 1, 8, NULL, 0) ||
	    make(R, &w, Q4KH_TYPE_F32, 4, 24, 1, 0, NULL, 0) ||
	    make(R, &st, Q4KH_TYPE_F32, 3, 24, 1, 0, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 24, 5, 1, 0, NULL, 1))
		return;
	judge_state(R, "ssm_conv", "x {24, 5}, 4 taps", LIMIT_F32,
	            R->ref->v->ssm_conv(R->ref->dev, &x.r, &w.r, &st.r, &o.r),
	            R->cand->v->ssm_conv(R->cand->dev, &x.c, &w.c, &st.c, &o.c), &o, &st);
	drop(R, &x);
	drop(R, &w);
	drop(R, &st);
	drop(R, &o);
}

static void case_delta_net(struct run *R)
{
	struct q4kh_conf_result res = begin("delta_net", LIMIT_QUANT,
	                                    "2 key heads, 4 value heads of 16, 3 tokens");
	double gv[4 * 3], bv[4 * 3];
	struct pair q, k, v, g, b, st, o;

	if (!has_ext(R, &res, 2, Q4KH_BACKEND_HAS(R->ref->v, delta_net),
	             Q4KH_BACKEND_HAS(R->cand->v, delta_net)))
		return;
	for (int i = 0; i < 12; i++) {
		gv[i] = -0.5 * (uniform(R) + 1.0); /* log decay <= 0 */
		bv[i] = 0.5 * (uniform(R) + 1.0);  /* beta in [0, 1) */
	}
	if (make(R, &q, Q4KH_TYPE_F32, 16, 2, 3, 0, NULL, 0) ||
	    make(R, &k, Q4KH_TYPE_F32, 16, 2, 3, 0, NULL, 0) ||
	    make(R, &v, Q4KH_TYPE_F32, 16, 4, 3, 0, NULL, 0) ||
	    make(R, &g, Q4KH_TYPE_F32, 4, 3, 1, 0, gv, 0) ||
	    make(R, &b, Q4KH_TYPE_F32, 4, 3, 1, 0, bv, 0) ||
	    make(R, &st, Q4KH_TYPE_F32, 16, 16, 4, 0, NULL, 0) ||
	    make(R, &o, Q4KH_TYPE_F32, 16, 4, 3, 0, NULL, 1))
		return;
	judge_state(R, "delta_net", res.what, LIMIT_QUANT,
	            R->ref->v->delta_net(R->ref->dev, &q.r, &k.r, &v.r, &g.r, &b.r, &st.r, 0.25f,
	                                 &o.r),
	            R->cand->v->delta_net(R->cand->dev, &q.c, &k.c, &v.c, &g.c, &b.c, &st.c, 0.25f,
	                                  &o.c),
	            &o, &st);
	drop(R, &q);
	drop(R, &k);
	drop(R, &v);
	drop(R, &g);
	drop(R, &b);
	drop(R, &st);
	drop(R, &o);
}

/* --- ABI 1.7: mixture of experts --- */

/*
 * moe_route over 8 experts, 3 chosen for each of 5 tokens: the weights
 * within f32 rounding, the expert ids exactly (limit 0).
 */
static void case_moe_route(struct run *R, int32_t norm)
{
	const char *what = norm ? "8 experts, 3 a token, 5 tokens, normalised"
	                        : "8 experts, 3 a token, 5 tokens, probabilities";
	struct q4kh_conf_result res = begin("moe_route", LIMIT_F32, "%s: weights", what);
	struct pair l, ids, w;
	q4kh_status rs, cs;

	if (!has_ext(R, &res, 7, Q4KH_BACKEND_HAS(R->ref->v, moe_route),
	             Q4KH_BACKEND_HAS(R->cand->v, moe_route)))
		return;
	if (make(R, &l, Q4KH_TYPE_F32, 8, 5, 1, 8, NULL, 0) ||
	    make(R, &ids, Q4KH_TYPE_I32, 3, 5, 1, 4, NULL, 1) ||
	    make(R, &w, Q4KH_TYPE_F32, 3, 5, 1, 0, NULL, 1))
		return;
	rs = R->ref->v->moe_route(R->ref->dev, &l.r, norm, &ids.r, &w.r);
	cs = R->cand->v->moe_route(R->cand->dev, &l.c, norm, &ids.c, &w.c);
	judge(R, &res, rs, cs, &w);
	res = begin("moe_route", 0.0, "%s: expert ids", what);
	judge(R, &res, rs, cs, &ids);
	drop(R, &l);
	drop(R, &ids);
	drop(R, &w);
}

/* mul_mat_id of TYPE: 4 experts {256, 19}, 2 of them for each of 3
 * tokens, one input a token (X = 1) or one a slot (X = 2). */
static void case_mul_mat_id(struct run *R, uint32_t type, int64_t x_slots)
{
	static const double route[6] = { 3, 0, 1, 3, 2, 1 };
	struct q4kh_conf_result res =
		begin("mul_mat_id", q4kh_type_block_elems(type) > 1 ? LIMIT_QUANT : LIMIT_F32,
		      "%s 4 x {256, 19}, 2 of them a token, %lld input(s) a token",
		      q4kh_type_name(type), (long long)x_slots);
	struct pair w, x, ids, y;

	if (!has_ext(R, &res, 7, Q4KH_BACKEND_HAS(R->ref->v, mul_mat_id),
	             Q4KH_BACKEND_HAS(R->cand->v, mul_mat_id)))
		return;
	if (!both_support(R, type))
		return skip(R, &res, "type not supported");
	if (make(R, &w, type, 256, 19, 4, 0, NULL, 0) ||
	    make(R, &x, Q4KH_TYPE_F32, 256, x_slots, 3, 16, NULL, 0) ||
	    make(R, &ids, Q4KH_TYPE_I32, 2, 3, 1, 0, route, 0) ||
	    make(R, &y, Q4KH_TYPE_F32, 19, 2, 3, 12, NULL, 1))
		return;
	judge(R, &res, R->ref->v->mul_mat_id(R->ref->dev, &w.r, &x.r, &ids.r, &y.r),
	      R->cand->v->mul_mat_id(R->cand->dev, &w.c, &x.c, &ids.c, &y.c), &y);
	drop(R, &w);
	drop(R, &x);
	drop(R, &ids);
	drop(R, &y);
}

/* --- ABI 1.6: whole steps through graph_prepare and graph_compute --- */

/*
 * The step the graph cases run: one attention layer of T = 2 tokens over
 * a residual x {256, T} (Q8_0 products of 2 query heads and 1 KV head of
 * 64, RoPE, an F16 cache of 8 rows, the output product, the residual add
 * and the next norm), whose last norm's output stands for the logits.
 * Its nodes hold the patterns backends fuse (q4khost/step.h): three
 * products of one input, rope_store's four nodes, add_rms_norm.
 */
enum { GV_IDS, GV_POS, GV_X, GV_WNORM, GV_WQ, GV_WK, GV_WV, GV_WO, GV_KC, GV_VC, GV_H, GV_Q,
       GV_K, GV_V, GV_O, GV_A, GV_OUT, GV_PAIRS, /* values with buffers of their own */
       GV_QH = GV_PAIRS, GV_KH, GV_VH, GV_AH, GV_COUNT };

#define GRAPH_T 2
#define GRAPH_RUNS 3

struct step_case {
	struct pair p[GV_PAIRS];
	struct q4kh_step_value v[2][GV_COUNT]; /* per side: 0 ref, 1 cand */
	struct q4kh_step_node n[12];
	struct q4kh_step_graph g[2];
};

/* Value V of side S: a pair's tensor, or a view of one. */
static void graph_value(struct step_case *c, int side, int v, int base, int64_t ne0,
                        int64_t ne1, int64_t ne2, uint32_t kind)
{
	const struct q4kh_tensor *t = side ? &c->p[base].c : &c->p[base].r;
	struct q4kh_step_value *o = &c->v[side][v];

	*o = (struct q4kh_step_value){ .t = *t, .kind = kind, .base = -1, .name = "" };
	if (v != base) { /* a contiguous view of base's bytes */
		o->kind = Q4KH_VAL_VIEW;
		o->base = base;
		o->t.ne[0] = ne0;
		o->t.ne[1] = ne1;
		o->t.ne[2] = ne2;
		o->t.nb[1] = o->t.nb[0] * ne0;
		o->t.nb[2] = o->t.nb[1] * ne1;
		o->t.nb[3] = o->t.nb[2] * ne2;
	}
}

static void graph_node(struct q4kh_step_node *n, q4kh_op op, int out, int a, int b, int c,
                       int d, float f0)
{
	*n = (struct q4kh_step_node){ .op = op, .out = out, .src = { a, b, c, d, -1, -1 },
		                      .f = { f0, 0.0f } };
}

/* The buffers of the step on both sides, and its graph on each. */
static int graph_make(struct run *R, struct step_case *c)
{
	static const double zeros[GRAPH_T];
	const int64_t T = GRAPH_T;
	const struct q4kh_rope_params rope = {
		.struct_size = sizeof(rope), .n_rot = 64, .mode = Q4KH_ROPE_NEOX, .base = 10000.0f,
		.freq_scale = 1.0f, .attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f,
		.n_ctx_orig = 4096,
	};
	struct { int v; uint32_t type; int64_t ne0, ne1, ne2; int output; } shapes[GV_PAIRS] = {
		{ GV_IDS, Q4KH_TYPE_I32, T, 1, 1, 0 },   { GV_POS, Q4KH_TYPE_I32, T, 1, 1, 0 },
		{ GV_X, Q4KH_TYPE_F32, 256, T, 1, 0 },   { GV_WNORM, Q4KH_TYPE_F32, 256, 1, 1, 0 },
		{ GV_WQ, Q4KH_TYPE_Q8_0, 256, 128, 1, 0 }, { GV_WK, Q4KH_TYPE_Q8_0, 256, 64, 1, 0 },
		{ GV_WV, Q4KH_TYPE_Q8_0, 256, 64, 1, 0 }, { GV_WO, Q4KH_TYPE_Q8_0, 128, 256, 1, 0 },
		{ GV_KC, Q4KH_TYPE_F16, 64, 1, 8, 1 },   { GV_VC, Q4KH_TYPE_F16, 64, 1, 8, 1 },
		{ GV_H, Q4KH_TYPE_F32, 256, T, 1, 1 },   { GV_Q, Q4KH_TYPE_F32, 128, T, 1, 1 },
		{ GV_K, Q4KH_TYPE_F32, 64, T, 1, 1 },    { GV_V, Q4KH_TYPE_F32, 64, T, 1, 1 },
		{ GV_O, Q4KH_TYPE_F32, 256, T, 1, 1 },   { GV_A, Q4KH_TYPE_F32, 64, 2, T, 1 },
		{ GV_OUT, Q4KH_TYPE_F32, 256, T, 1, 1 },
	};
	struct q4kh_step_node *n = c->n;

	for (int i = 0; i < GV_PAIRS; i++)
		if (make(R, &c->p[i], shapes[i].type, shapes[i].ne0, shapes[i].ne1, shapes[i].ne2, 0,
		         shapes[i].type == Q4KH_TYPE_I32 ? zeros : NULL, shapes[i].output))
			return -1;
	for (int side = 0; side < 2; side++) {
		for (int i = 0; i < GV_PAIRS; i++)
			graph_value(c, side, i, i, 0, 0, 0,
			            i == GV_IDS   ? Q4KH_VAL_IDS
			            : i == GV_POS ? Q4KH_VAL_POS
			            : i >= GV_H   ? Q4KH_VAL_ACT
			                          : Q4KH_VAL_FIXED);
		graph_value(c, side, GV_QH, GV_Q, 64, 2, T, 0);
		graph_value(c, side, GV_KH, GV_K, 64, 1, T, 0);
		graph_value(c, side, GV_VH, GV_V, 64, 1, T, 0);
		graph_value(c, side, GV_AH, GV_A, 128, T, 1, 0);
	}
	graph_node(&n[0], Q4KH_OP_RMS_NORM, GV_H, GV_X, GV_WNORM, -1, -1, 1e-5f);
	graph_node(&n[1], Q4KH_OP_MUL_MAT, GV_Q, GV_WQ, GV_H, -1, -1, 0.0f);
	graph_node(&n[2], Q4KH_OP_MUL_MAT, GV_K, GV_WK, GV_H, -1, -1, 0.0f);
	graph_node(&n[3], Q4KH_OP_MUL_MAT, GV_V, GV_WV, GV_H, -1, -1, 0.0f);
	graph_node(&n[4], Q4KH_OP_ROPE, GV_QH, GV_QH, GV_POS, -1, -1, 0.0f);
	graph_node(&n[5], Q4KH_OP_ROPE, GV_KH, GV_KH, GV_POS, -1, -1, 0.0f);
	n[4].rope = n[5].rope = rope;
	graph_node(&n[6], Q4KH_OP_SET_ROWS, GV_KC, GV_KH, GV_POS, -1, -1, 0.0f);
	graph_node(&n[7], Q4KH_OP_SET_ROWS, GV_VC, GV_VH, GV_POS, -1, -1, 0.0f);
	graph_node(&n[8], Q4KH_OP_ATTENTION, GV_A, GV_QH, GV_KC, GV_VC, GV_POS, 0.125f);
	graph_node(&n[9], Q4KH_OP_MUL_MAT, GV_O, GV_WO, GV_AH, -1, -1, 0.0f);
	graph_node(&n[10], Q4KH_OP_ADD, GV_X, GV_X, GV_O, -1, -1, 0.0f);
	graph_node(&n[11], Q4KH_OP_RMS_NORM, GV_OUT, GV_X, GV_WNORM, -1, -1, 1e-5f);
	for (int side = 0; side < 2; side++)
		c->g[side] = (struct q4kh_step_graph){
			.struct_size = sizeof(c->g[side]), .node_size = sizeof(c->n[0]),
			.value_size = sizeof(c->v[side][0]), .n_nodes = 12, .n_values = GV_COUNT,
			.ids = GV_IDS, .pos = GV_POS, .logits = GV_OUT, .n_tokens = T, .n_out = T,
			.n_seqs = 1, .nodes = c->n, .values = c->v[side],
		};
	return 0;
}

/* Positions 2 RUN, 2 RUN + 1 into the step's POS on both sides. */
static int graph_positions(struct run *R, struct step_case *c, int run, int32_t pos[GRAPH_T])
{
	const struct pair *p = &c->p[GV_POS];

	for (int t = 0; t < GRAPH_T; t++)
		pos[t] = GRAPH_T * run + t;
	return q4kh_backend_check(R->ref, R->ref->v->buffer_upload(R->ref->dev, p->rb, GUARD, pos,
	                                                           sizeof(int32_t) * GRAPH_T),
	                          "buffer_upload", R->err) ||
	       q4kh_backend_check(R->cand, R->cand->v->buffer_upload(R->cand->dev, p->cb, GUARD,
	                                                             pos, sizeof(int32_t) * GRAPH_T),
	                          "buffer_upload", R->err);
}

/*
 * The step GRAPH_RUNS times on both sides, the reference side node by node
 * through its own table (the host's interpreter), the candidate's through
 * its graph entry; after each run the outputs are compared under LIMIT,
 * and after the last the KV cache. AGAINST names the reference side.
 */
static void case_graph(struct run *R, const char *against, double limit)
{
	static const char *const paths[] = { "?", "node by node", "replay", "persistent kernel" };
	struct step_case *c = calloc(1, sizeof(*c));
	struct q4kh_conf_result res;
	q4kh_step *step = NULL;
	q4kh_status st;

	if (!c) {
		R->fatal = 1;
		q4kh_fail(R->err, "out of memory");
		return;
	}
	if (graph_make(R, c))
		goto out;
	st = R->cand->v->graph_prepare(R->cand->dev, &c->g[1], &step);
	if (st) {
		res = begin("graph_compute", limit, "a layer of 2 tokens, vs %s", against);
		snprintf(res.message, sizeof(res.message), "graph_prepare: %s: %s",
		         q4kh_status_name(st), R->cand->v->last_error(R->cand->ctx));
		if (st == Q4KH_ERR_UNSUPPORTED)
			skip(R, &res, res.message);
		else
			report(R, &res);
		goto out;
	}
	for (int run = 0; run < GRAPH_RUNS && !R->fatal; run++) {
		struct q4kh_step_run how = { .struct_size = sizeof(how) };
		struct q4kh_step_fail fail;
		int32_t pos[GRAPH_T];
		const struct q4kh_step_host_values hv = { NULL, pos };
		q4kh_status ref_st, cand_st;

		if (graph_positions(R, c, run, pos)) {
			R->fatal = 1;
			break;
		}
		ref_st = q4kh_step_run(R->ref->v, R->ref->dev, &c->g[0], ~0u, &hv, NULL, &fail);
		cand_st = R->cand->v->graph_compute(R->cand->dev, step, &how);
		res = begin("graph_compute", limit, "layer at %d,%d, run %d/%d (%s), vs %s", pos[0],
		            pos[1], run + 1, GRAPH_RUNS, how.path < 4 ? paths[how.path] : paths[0],
		            against);
		judge(R, &res, ref_st, cand_st, &c->p[GV_OUT]);
	}
	if (!R->fatal) {
		res = begin("graph_compute", limit, "the cache's keys after %d runs, vs %s",
		            GRAPH_RUNS, against);
		judge(R, &res, Q4KH_OK, Q4KH_OK, &c->p[GV_KC]);
	}
	R->cand->v->graph_release(R->cand->dev, step);
out:
	for (int i = 0; i < GV_PAIRS; i++)
		drop(R, &c->p[i]);
	free(c);
}

/*
 * The whole-step cases of a backend with the graph entries (ABI 1.6,
 * docs/plugin-abi.md E8): against the reference, and against the same
 * backend's own node-by-node results, which fusions must not move beyond
 * f32 rounding.
 */
static void cases_graph(struct run *R)
{
	struct run own = *R;
	struct q4kh_conf_result res;

	if (!Q4KH_BACKEND_HAS(R->cand->v, graph_prepare)) {
		res = begin("graph_compute", LIMIT_QUANT, "whole steps");
		skip(R, &res, "no graph_prepare (ABI 1.6): the host runs its steps node by node");
		return;
	}
	case_graph(R, "the reference", LIMIT_QUANT);
	if (R->fatal)
		return;
	own.ref = R->cand;
	case_graph(&own, "its own nodes", LIMIT_F32);
	R->failed = own.failed;
	R->fatal = own.fatal;
}

int q4kh_conformance_run(const struct q4kh_backend *ref, const struct q4kh_backend *cand,
                         uint64_t seed, q4kh_conf_fn fn, void *data,
                         struct q4kh_error *err)
{
	struct run R = { ref, cand, seed, fn, data, 0, err, 0 };
	static const int64_t cols[] = { 1, 7, 9, 64, 65 };

	for (size_t t = 0; t < sizeof(weight_types) / sizeof(weight_types[0]) && !R.fatal; t++)
		case_get_rows(&R, weight_types[t]);
	for (size_t t = 0; t < sizeof(weight_types) / sizeof(weight_types[0]) && !R.fatal; t++)
		for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]) && !R.fatal; c++)
			case_mul_mat(&R, weight_types[t], cols[c]);
	for (int w = 0; w < 2 && !R.fatal; w++)
		for (int ip = 0; ip < 2 && !R.fatal; ip++)
			case_rms_norm(&R, w, ip);
	if (!R.fatal)
		case_rope(&R, Q4KH_ROPE_NORM);
	if (!R.fatal)
		case_rope(&R, Q4KH_ROPE_NEOX);
	for (int m = 0; m < 2 && !R.fatal; m++)
		for (int n = 0; n < 2 && !R.fatal; n++)
			case_binary(&R, m, n);
	if (!R.fatal)
		case_scale(&R);
	if (!R.fatal)
		case_glu(&R, Q4KH_GLU_SILU);
	if (!R.fatal)
		case_glu(&R, Q4KH_GLU_GELU_TANH);
	if (!R.fatal)
		case_copy(&R, Q4KH_TYPE_F32, Q4KH_TYPE_F16);
	if (!R.fatal)
		case_copy(&R, Q4KH_TYPE_F16, Q4KH_TYPE_F32);
	if (!R.fatal) /* a KV cache's prefix into another's: serve's prefix reuse */
		case_copy(&R, Q4KH_TYPE_F16, Q4KH_TYPE_F16);
	if (!R.fatal)
		case_attention(&R, Q4KH_TYPE_F32, 0, 0.0f);
	if (!R.fatal)
		case_attention(&R, Q4KH_TYPE_F16, 4, 20.0f);
	if (!R.fatal)
		case_get_rows_ext(&R);
	for (int s = 0; s < 2 && !R.fatal; s++)
		case_rope_ext(&R, s);
	if (!R.fatal)
		case_set_rows(&R);
	for (int paged = 0; paged < 2 && !R.fatal; paged++)
		for (int w = 0; w < 2 && !R.fatal; w++)
			case_attention_ext(&R, w ? 5 : 0, paged);
	for (int u = Q4KH_UNARY_SIGMOID; u <= Q4KH_UNARY_SILU && !R.fatal; u++)
		case_unary(&R, (q4kh_unary_kind)u);
	if (!R.fatal)
		case_ssm_conv(&R);
	if (!R.fatal)
		case_delta_net(&R);
	for (int32_t norm = 0; norm < 2 && !R.fatal; norm++)
		case_moe_route(&R, norm);
	for (size_t t = 0; t < sizeof(weight_types) / sizeof(weight_types[0]) && !R.fatal; t++)
		for (int64_t xs = 1; xs <= 2 && !R.fatal; xs++)
			case_mul_mat_id(&R, weight_types[t], xs);
	if (!R.fatal)
		cases_graph(&R);
	return R.fatal ? -1 : R.failed;
}
