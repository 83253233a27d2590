/*
 * q4khost op contract checks, ABI 1: what a backend op must check of its
 * arguments before it touches memory, with the messages of the reference
 * backend. Header-only (every function is static inline); link nothing.
 *
 * The in-tree backends (cpu, cuda) and the SDK's backend example make
 * every check through this header, so a vendor backend that does the same
 * refuses exactly what the reference refuses, with the same one line
 * (docs/plugin-abi.md section 12 has the rules these checks enforce).
 *
 * Three layers:
 *  - tensor checks (q4kh_check_tensor, _shape, _disjoint, _in_place,
 *    _index, _index_values): one operand, or two that may not overlap;
 *  - q4kh_check_transfer: buffer_upload's and buffer_download's range;
 *  - op checks (q4kh_check_mul_mat, _glu, _attention_ext, ...): every
 *    argument of one entry of struct q4kh_backend_v1, in the order the
 *    reference checks them, the first failure reported.
 *
 * Every check:
 *  - takes a struct q4kh_check, which says how to tell a buffer of this
 *    device context and its size, which weight types the backend
 *    multiplies, and where a message goes;
 *  - returns Q4KH_OK, or Q4KH_ERR_INVALID with ONE line in c->msg (cut to
 *    c->cap bytes, NUL-terminated) that names the operand ("mul_mat x"),
 *    what was expected and what was found: "mul_mat x: type 1 (F16),
 *    expected F32". Point c->msg at the buffer last_error() returns and
 *    return the status as it is. A check that passes writes nothing;
 *  - reads only its arguments and the tensors' fields (never tensor
 *    memory, which may be a device's; the one exception,
 *    q4kh_check_index_values and the ids of q4kh_check_get_rows, read
 *    host memory the caller names) and calls c->buffer;
 *  - is thread-safe when c->buffer is and no other thread writes c->msg
 *    (T1: one context, one thread at a time).
 *
 * What the checks leave to the backend: the values of ABI 1.2 index
 * tensors (ids, positions, rows), which live in device memory and are read
 * when the op runs (a host-memory backend checks them with
 * q4kh_check_index_values; a device checks them in its kernel and reports
 * at its next call), and limits of its own (a kernel's largest head
 * dimension: fail those with Q4KH_ERR_UNSUPPORTED).
 */
#ifndef Q4KHOST_CONTRACT_H
#define Q4KHOST_CONTRACT_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "q4khost/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bit of a type (enum q4kh_type, below 32) in a mask of accepted types. */
#define Q4KH_TYPE_BIT(type) (1u << (type))

/* Extents above 2^40 are refused, so products of them never overflow. */
#define Q4KH_CHECK_MAX_NE ((int64_t)1 << 40)

/*
 * What the checks need to know of the backend, per call. With dev NULL
 * (an op called without a device context) no buffer is dev's, so every
 * op check fails: an op needs no test of its own.
 */
struct q4kh_check {
	/* The device context the op runs on, handed to buffer(). */
	const void *dev;
	/*
	 * 1 when BUF (not NULL) is a buffer of DEV, with its size in bytes
	 * in *size; 0 when it belongs to another device context.
	 */
	int (*buffer)(const void *dev, const q4kh_buffer *buf, uint64_t *size);
	/* The types get_rows and mul_mat accept: Q4KH_TYPE_BIT()s. */
	uint32_t weight_types;
	/* Where a failed check writes its line; NULL (or cap 0): nowhere. */
	char *msg;
	size_t cap;
};

/* --- internal helpers (q4kh__: not part of the contract) --- */

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline q4kh_status q4kh__check_fail(const struct q4kh_check *c,
                                           const char *fmt, ...)
{
	va_list ap;

	if (c->msg && c->cap) {
		va_start(ap, fmt);
		vsnprintf(c->msg, c->cap, fmt, ap);
		va_end(ap);
	}
	return Q4KH_ERR_INVALID;
}

static inline const char *q4kh__type_label(uint32_t type)
{
	const char *n = q4kh_type_name(type);

	return n ? n : "unknown";
}

/* Alignment that element or block reads of TYPE need: 4 for F32 and I32
 * values, 2 for halves and for blocks (their fp16 fields). */
static inline uint64_t q4kh__type_align(uint32_t type)
{
	return type == Q4KH_TYPE_F32 || type == Q4KH_TYPE_I32 ? 4 : 2;
}

/*
 * Bytes from the first byte of T to one past its last; -1 on overflow.
 * T's type is known and its ne are at least 1.
 */
static inline int q4kh__extent(const struct q4kh_tensor *t, uint64_t *extent)
{
	uint64_t e = (uint64_t)t->ne[0] / q4kh_type_block_elems(t->type) *
	             q4kh_type_block_bytes(t->type);

	for (int i = 1; i < 4; i++) {
		uint64_t step;

		if (__builtin_mul_overflow((uint64_t)(t->ne[i] - 1),
		                           (uint64_t)t->nb[i], &step) ||
		    __builtin_add_overflow(e, step, &e))
			return -1;
	}
	*extent = e;
	return 0;
}

/* The layout of a view of a type in the mask: extents, strides, offset. */
static inline q4kh_status q4kh__check_layout(const struct q4kh_check *c,
                                             const char *what,
                                             const struct q4kh_tensor *t)
{
	const uint32_t be = q4kh_type_block_elems(t->type);
	const uint64_t align = q4kh__type_align(t->type);

	for (int i = 0; i < 4; i++) {
		if (t->ne[i] < 1 || t->ne[i] > Q4KH_CHECK_MAX_NE)
			return q4kh__check_fail(c, "%s: ne[%d] = %lld, expected 1 .. 2^40",
			                        what, i, (long long)t->ne[i]);
		if (t->nb[i] < 0 || (uint64_t)t->nb[i] % align)
			return q4kh__check_fail(c,
			                        "%s: nb[%d] = %lld, expected a non-negative "
			                        "multiple of %llu",
			                        what, i, (long long)t->nb[i],
			                        (unsigned long long)align);
	}
	if (t->ne[0] % be)
		return q4kh__check_fail(c,
		                        "%s: ne[0] = %lld is not a multiple of %s's "
		                        "block of %u values",
		                        what, (long long)t->ne[0],
		                        q4kh__type_label(t->type), be);
	if (t->nb[0] != (int64_t)q4kh_type_block_bytes(t->type))
		return q4kh__check_fail(c, "%s: nb[0] = %lld, expected %u (contiguous %s rows)",
		                        what, (long long)t->nb[0],
		                        q4kh_type_block_bytes(t->type),
		                        q4kh__type_label(t->type));
	if (t->offset % align)
		return q4kh__check_fail(c, "%s: offset %llu is not a multiple of %llu",
		                        what, (unsigned long long)t->offset,
		                        (unsigned long long)align);
	if ((double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] *
	            (double)t->ne[3] >
	    (double)Q4KH_CHECK_MAX_NE)
		return q4kh__check_fail(c,
		                        "%s: %lld x %lld x %lld x %lld elements, more "
		                        "than 2^40",
		                        what, (long long)t->ne[0], (long long)t->ne[1],
		                        (long long)t->ne[2], (long long)t->ne[3]);
	return Q4KH_OK;
}

/* --- tensor checks --- */

/*
 * T, named WHAT in the message, is a view an op may read or write: not
 * NULL, with a buffer of this device context (c->buffer), of one of the
 * types in TYPES (Q4KH_TYPE_BIT()s of types quant.h knows: the mask's
 * names make the message), every ne in 1 .. 2^40 and at most
 * 2^40 elements in all, every nb non-negative and a multiple of the
 * type's alignment (4 bytes for F32 and I32, 2 otherwise), ne[0] a
 * multiple of the type's block, nb[0] one block (rows contiguous), the
 * offset aligned, and every byte of the view inside the buffer:
 * offset + (ne[0] / block) * block_bytes + sum_{i>0} (ne[i] - 1) nb[i]
 * <= the buffer's size. Rows may be padded (nb[1] larger than a row) and
 * views strided; views whose rows overlap each other (nb[1] smaller than
 * a row) are not refused.
 */
static inline q4kh_status q4kh_check_tensor(const struct q4kh_check *c,
                                            const char *what,
                                            const struct q4kh_tensor *t,
                                            uint32_t types)
{
	char expected[128];
	uint64_t size = 0, extent, end;
	size_t used = 0;
	q4kh_status st;

	if (!t)
		return q4kh__check_fail(c, "%s: tensor is NULL", what);
	if (!t->buffer)
		return q4kh__check_fail(c, "%s: buffer is NULL", what);
	if (!c->buffer(c->dev, t->buffer, &size))
		return q4kh__check_fail(c, "%s: buffer belongs to another device context",
		                        what);
	if (t->type >= 32 || !(types & Q4KH_TYPE_BIT(t->type))) {
		expected[0] = 0;
		for (uint32_t i = 0; i < 32 && used < sizeof(expected); i++)
			if (types & Q4KH_TYPE_BIT(i))
				used += (size_t)snprintf(expected + used,
				                         sizeof(expected) - used, "%s%s",
				                         used ? " or " : "",
				                         q4kh__type_label(i));
		return q4kh__check_fail(c, "%s: type %u (%s), expected %s", what,
		                        t->type, q4kh__type_label(t->type), expected);
	}
	if ((st = q4kh__check_layout(c, what, t)))
		return st;
	if (q4kh__extent(t, &extent) || __builtin_add_overflow(t->offset, extent, &end) ||
	    end > size)
		return q4kh__check_fail(c,
		                        "%s: view {%lld, %lld, %lld, %lld} at offset "
		                        "%llu ends past its %llu-byte buffer",
		                        what, (long long)t->ne[0], (long long)t->ne[1],
		                        (long long)t->ne[2], (long long)t->ne[3],
		                        (unsigned long long)t->offset,
		                        (unsigned long long)size);
	return Q4KH_OK;
}

/*
 * T->ne is {NE0, NE1, NE2, NE3}; a negative entry is not checked (shown
 * as * in the message: "shape {8, 2, 1, 1}, expected {8, 3, 1, 1}").
 */
static inline q4kh_status q4kh_check_shape(const struct q4kh_check *c,
                                           const char *what,
                                           const struct q4kh_tensor *t,
                                           int64_t ne0, int64_t ne1,
                                           int64_t ne2, int64_t ne3)
{
	const int64_t want[4] = { ne0, ne1, ne2, ne3 };
	char shown[4][24];
	int same = 1;

	for (int i = 0; i < 4; i++)
		same &= want[i] < 0 || t->ne[i] == want[i];
	if (same)
		return Q4KH_OK;
	for (int i = 0; i < 4; i++)
		if (want[i] >= 0)
			snprintf(shown[i], sizeof(shown[i]), "%lld", (long long)want[i]);
		else
			snprintf(shown[i], sizeof(shown[i]), "*");
	return q4kh__check_fail(c,
	                        "%s: shape {%lld, %lld, %lld, %lld}, expected {%s, "
	                        "%s, %s, %s}",
	                        what, (long long)t->ne[0], (long long)t->ne[1],
	                        (long long)t->ne[2], (long long)t->ne[3],
	                        shown[0], shown[1], shown[2], shown[3]);
}

/*
 * OUT and IN, both checked by q4kh_check_tensor, share no byte: they are
 * in different buffers, or their byte ranges [offset, offset + extent)
 * do not meet. For an output that must not alias an input.
 */
static inline q4kh_status q4kh_check_disjoint(const struct q4kh_check *c,
                                              const char *out_name,
                                              const struct q4kh_tensor *out,
                                              const char *in_name,
                                              const struct q4kh_tensor *in)
{
	uint64_t eo = 0, ei = 0;

	if (out->buffer != in->buffer)
		return Q4KH_OK;
	q4kh__extent(out, &eo);
	q4kh__extent(in, &ei);
	if (out->offset >= in->offset + ei || in->offset >= out->offset + eo)
		return Q4KH_OK;
	return q4kh__check_fail(c, "%s (offset %llu) overlaps %s (offset %llu) in one buffer",
	                        out_name, (unsigned long long)out->offset, in_name,
	                        (unsigned long long)in->offset);
}

/*
 * OUT is exactly the view IN (same buffer, offset, type, ne and nb: the
 * op runs in place, element by element) or shares no byte with it. For
 * the ops that may run in place (docs/plugin-abi.md rule A1).
 */
static inline q4kh_status q4kh_check_in_place(const struct q4kh_check *c,
                                              const char *out_name,
                                              const struct q4kh_tensor *out,
                                              const char *in_name,
                                              const struct q4kh_tensor *in)
{
	if (out->buffer == in->buffer && out->offset == in->offset &&
	    out->type == in->type && !memcmp(out->ne, in->ne, sizeof(out->ne)) &&
	    !memcmp(out->nb, in->nb, sizeof(out->nb)))
		return Q4KH_OK;
	return q4kh_check_disjoint(c, out_name, out, in_name, in);
}

/*
 * T is an ABI 1.2 index tensor of N values: q4kh_check_tensor with type
 * I32, and shape {N, 1, 1, 1}. Its values are not read (see the top of
 * this file).
 */
static inline q4kh_status q4kh_check_index(const struct q4kh_check *c,
                                           const char *what,
                                           const struct q4kh_tensor *t,
                                           int64_t n)
{
	q4kh_status st = q4kh_check_tensor(c, what, t, Q4KH_TYPE_BIT(Q4KH_TYPE_I32));

	return st ? st : q4kh_check_shape(c, what, t, n, 1, 1, 1);
}

/*
 * Every one of the N values at V (host memory) lies in [0, LIMIT):
 * "set_rows rows[0] = 5, expected 0 .. 4". WHAT names the array.
 */
static inline q4kh_status q4kh_check_index_values(const struct q4kh_check *c,
                                                  const char *what,
                                                  const int32_t *v, int64_t n,
                                                  int64_t limit)
{
	for (int64_t i = 0; i < n; i++)
		if (v[i] < 0 || v[i] >= limit)
			return q4kh__check_fail(c, "%s[%lld] = %d, expected 0 .. %lld", what,
			                        (long long)i, v[i], (long long)limit - 1);
	return Q4KH_OK;
}

/* --- transfer checks --- */

/*
 * buffer_upload's and buffer_download's arguments, WHAT naming the entry:
 * BUF a buffer of this device context, HOST not NULL unless SIZE is 0,
 * and bytes [OFFSET, OFFSET + SIZE) inside the buffer.
 */
static inline q4kh_status q4kh_check_transfer(const struct q4kh_check *c,
                                              const char *what,
                                              const q4kh_buffer *buf,
                                              uint64_t offset, const void *host,
                                              uint64_t size)
{
	uint64_t have = 0;

	if (!buf)
		return q4kh__check_fail(c, "%s: buffer is NULL", what);
	if (!c->buffer(c->dev, buf, &have))
		return q4kh__check_fail(c, "%s: buffer belongs to another device context",
		                        what);
	if (!host && size)
		return q4kh__check_fail(c, "%s: host pointer is NULL", what);
	if (offset > have || size > have - offset)
		return q4kh__check_fail(c,
		                        "%s: %llu bytes at offset %llu do not fit in "
		                        "the %llu-byte buffer",
		                        what, (unsigned long long)size,
		                        (unsigned long long)offset,
		                        (unsigned long long)have);
	return Q4KH_OK;
}

/* --- op checks: one per entry of struct q4kh_backend_v1 --- */

#define Q4KH__F32 Q4KH_TYPE_BIT(Q4KH_TYPE_F32)
#define Q4KH__F32_F16 (Q4KH_TYPE_BIT(Q4KH_TYPE_F32) | Q4KH_TYPE_BIT(Q4KH_TYPE_F16))

/* get_rows' and get_rows_ext's table {K, V} (a weight type) and out {K, N}. */
static inline q4kh_status q4kh__check_rows(const struct q4kh_check *c,
                                           const struct q4kh_tensor *table,
                                           int64_t n,
                                           const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "get_rows table", table, c->weight_types)) ||
	    (st = q4kh_check_shape(c, "get_rows table", table, -1, -1, 1, 1)) ||
	    (st = q4kh_check_tensor(c, "get_rows out", out, Q4KH__F32)) ||
	    (st = q4kh_check_disjoint(c, "get_rows out", out, "table", table)))
		return st;
	return q4kh_check_shape(c, "get_rows out", out, table->ne[0], n, 1, 1);
}

/* get_rows: N >= 1 ids in host memory, each in [0, V). */
static inline q4kh_status q4kh_check_get_rows(const struct q4kh_check *c,
                                              const struct q4kh_tensor *table,
                                              const int32_t *ids, int64_t n,
                                              const struct q4kh_tensor *out)
{
	q4kh_status st;

	if (n < 1 || !ids)
		return q4kh__check_fail(c, "get_rows: %lld ids at %p, expected at least one",
		                        (long long)n, (const void *)ids);
	if ((st = q4kh__check_rows(c, table, n, out)))
		return st;
	return q4kh_check_index_values(c, "get_rows: ids", ids, n, table->ne[1]);
}

/* get_rows_ext: ids I32 {N}; its values, in [0, V), are the backend's. */
static inline q4kh_status q4kh_check_get_rows_ext(const struct q4kh_check *c,
                                                  const struct q4kh_tensor *table,
                                                  const struct q4kh_tensor *ids,
                                                  const struct q4kh_tensor *out)
{
	const int64_t n = ids ? ids->ne[0] : 1;
	q4kh_status st;

	if ((st = q4kh__check_rows(c, table, n, out)))
		return st;
	return q4kh_check_index(c, "get_rows_ext ids", ids, n);
}

/* mul_mat: w {K, N} (a weight type), x {K, T}, y {N, T}; y apart from both. */
static inline q4kh_status q4kh_check_mul_mat(const struct q4kh_check *c,
                                             const struct q4kh_tensor *w,
                                             const struct q4kh_tensor *x,
                                             const struct q4kh_tensor *y)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "mul_mat w", w, c->weight_types)) ||
	    (st = q4kh_check_shape(c, "mul_mat w", w, -1, -1, 1, 1)) ||
	    (st = q4kh_check_tensor(c, "mul_mat x", x, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "mul_mat x", x, w->ne[0], -1, 1, 1)) ||
	    (st = q4kh_check_tensor(c, "mul_mat y", y, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "mul_mat y", y, w->ne[1], x->ne[1], 1, 1)) ||
	    (st = q4kh_check_disjoint(c, "mul_mat y", y, "x", x)))
		return st;
	return q4kh_check_disjoint(c, "mul_mat y", y, "w", w);
}

/* rms_norm: out x's shape, in place or apart; w {ne0} or NULL; eps >= 0. */
static inline q4kh_status q4kh_check_rms_norm(const struct q4kh_check *c,
                                              const struct q4kh_tensor *x,
                                              const struct q4kh_tensor *w,
                                              float eps,
                                              const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "rms_norm x", x, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, "rms_norm out", out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "rms_norm out", out, x->ne[0], x->ne[1],
	                           x->ne[2], x->ne[3])) ||
	    (st = q4kh_check_in_place(c, "rms_norm out", out, "x", x)))
		return st;
	if (w && ((st = q4kh_check_tensor(c, "rms_norm w", w, Q4KH__F32)) ||
	          (st = q4kh_check_shape(c, "rms_norm w", w, x->ne[0], 1, 1, 1)) ||
	          (st = q4kh_check_disjoint(c, "rms_norm out", out, "w", w))))
		return st;
	if (!(eps >= 0.0f) || isinf(eps))
		return q4kh__check_fail(c, "rms_norm: eps = %g, expected a finite value >= 0",
		                        (double)eps);
	return Q4KH_OK;
}

/* rope's and rope_ext's x {head_dim, n_heads, T} and out, in place or apart. */
static inline q4kh_status q4kh__check_rope_tensors(const struct q4kh_check *c,
                                                   const struct q4kh_tensor *x,
                                                   const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "rope x", x, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "rope x", x, -1, -1, -1, 1)) ||
	    (st = q4kh_check_tensor(c, "rope out", out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "rope out", out, x->ne[0], x->ne[1], x->ne[2], 1)))
		return st;
	return q4kh_check_in_place(c, "rope out", out, "x", x);
}

/* The rotation's parameters for heads of HD values (plugin.h's formula). */
static inline q4kh_status q4kh__check_rope_params(const struct q4kh_check *c,
                                                  const struct q4kh_rope_params *p,
                                                  int64_t hd)
{
	if (p->mode != Q4KH_ROPE_NORM && p->mode != Q4KH_ROPE_NEOX)
		return q4kh__check_fail(c, "rope: mode %u, expected %d (NORM) or %d (NEOX)",
		                        p->mode, Q4KH_ROPE_NORM, Q4KH_ROPE_NEOX);
	if (p->n_rot < 2 || p->n_rot % 2 || p->n_rot > hd)
		return q4kh__check_fail(c,
		                        "rope: n_rot = %d, expected an even number from "
		                        "2 to the head dimension %lld",
		                        p->n_rot, (long long)hd);
	if (!(p->base > 0.0f) || isinf(p->base) || !isfinite(p->freq_scale) ||
	    !(p->freq_scale > 0.0f))
		return q4kh__check_fail(c,
		                        "rope: base %g and freq_scale %g, expected a "
		                        "finite base > 0 and a finite scale > 0",
		                        (double)p->base, (double)p->freq_scale);
	if (!isfinite(p->ext_factor) || !isfinite(p->attn_factor) ||
	    !isfinite(p->beta_fast) || !isfinite(p->beta_slow) ||
	    (p->ext_factor != 0.0f &&
	     (p->n_ctx_orig < 1 || !(p->beta_fast > 0.0f) || !(p->beta_slow > 0.0f))))
		return q4kh__check_fail(c,
		                        "rope: ext_factor %g, attn_factor %g, beta_fast "
		                        "%g, beta_slow %g, n_ctx_orig %d: expected "
		                        "finite values, and with ext_factor betas > 0 "
		                        "and n_ctx_orig > 0",
		                        (double)p->ext_factor, (double)p->attn_factor,
		                        (double)p->beta_fast, (double)p->beta_slow,
		                        p->n_ctx_orig);
	return Q4KH_OK;
}

/* rope: pos (host memory, x->ne[2] values, any int32) not NULL. */
static inline q4kh_status q4kh_check_rope(const struct q4kh_check *c,
                                          const struct q4kh_tensor *x,
                                          const int32_t *pos, int32_t n_rot,
                                          q4kh_rope_mode mode, float base,
                                          float freq_scale,
                                          const struct q4kh_tensor *out)
{
	struct q4kh_rope_params p;
	q4kh_status st;

	memset(&p, 0, sizeof(p));
	p.struct_size = sizeof(p);
	p.n_rot = n_rot;
	p.mode = (uint32_t)mode;
	p.base = base;
	p.freq_scale = freq_scale;
	p.attn_factor = 1.0f;
	if (!pos)
		return q4kh__check_fail(c, "rope: pos is NULL");
	if ((st = q4kh__check_rope_tensors(c, x, out)))
		return st;
	return q4kh__check_rope_params(c, &p, x->ne[0]);
}

/*
 * rope_ext: params of at least ABI 1.2's size, pos I32 {T} (its values,
 * non-negative, are the backend's), freq_factors F32 {n_rot / 2} or NULL.
 */
static inline q4kh_status q4kh_check_rope_ext(const struct q4kh_check *c,
                                              const struct q4kh_tensor *x,
                                              const struct q4kh_tensor *pos,
                                              const struct q4kh_rope_params *p,
                                              const struct q4kh_tensor *out)
{
	const size_t need = offsetof(struct q4kh_rope_params, freq_factors) +
	                    sizeof(p->freq_factors);
	q4kh_status st;

	if (!p || p->struct_size < need)
		return q4kh__check_fail(c,
		                        "rope_ext: params %s, expected a struct of at "
		                        "least %zu bytes",
		                        p ? "too small" : "NULL", need);
	if ((st = q4kh__check_rope_tensors(c, x, out)) ||
	    (st = q4kh__check_rope_params(c, p, x->ne[0])) ||
	    (st = q4kh_check_index(c, "rope_ext pos", pos, x->ne[2])))
		return st;
	if (!p->freq_factors)
		return Q4KH_OK;
	if ((st = q4kh_check_tensor(c, "rope_ext freq_factors", p->freq_factors,
	                            Q4KH__F32)))
		return st;
	return q4kh_check_shape(c, "rope_ext freq_factors", p->freq_factors,
	                        p->n_rot / 2, 1, 1, 1);
}

/*
 * add and mul (OP names the entry: "add", "mul"): out a's shape, in place
 * on a or b or apart; b broadcasts where its ne is 1.
 */
static inline q4kh_status q4kh_check_binary(const struct q4kh_check *c,
                                            const char *op,
                                            const struct q4kh_tensor *a,
                                            const struct q4kh_tensor *b,
                                            const struct q4kh_tensor *out)
{
	char na[32], nb[32], no[32];
	q4kh_status st;

	snprintf(na, sizeof(na), "%s a", op);
	snprintf(nb, sizeof(nb), "%s b", op);
	snprintf(no, sizeof(no), "%s out", op);
	if ((st = q4kh_check_tensor(c, na, a, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, nb, b, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, no, out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, no, out, a->ne[0], a->ne[1], a->ne[2], a->ne[3])) ||
	    (st = q4kh_check_in_place(c, no, out, "a", a)) ||
	    (st = q4kh_check_in_place(c, no, out, "b", b)))
		return st;
	for (int i = 0; i < 4; i++)
		if (b->ne[i] != 1 && b->ne[i] != a->ne[i])
			return q4kh__check_fail(c,
			                        "%s: b->ne[%d] = %lld, expected 1 or "
			                        "a->ne[%d] = %lld",
			                        op, i, (long long)b->ne[i], i,
			                        (long long)a->ne[i]);
	return Q4KH_OK;
}

/* scale: out x's shape, in place or apart. */
static inline q4kh_status q4kh_check_scale(const struct q4kh_check *c,
                                           const struct q4kh_tensor *x,
                                           const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "scale x", x, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, "scale out", out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "scale out", out, x->ne[0], x->ne[1], x->ne[2],
	                           x->ne[3])))
		return st;
	return q4kh_check_in_place(c, "scale out", out, "x", x);
}

/* glu: a known kind; up and out gate's shape, out in place on either. */
static inline q4kh_status q4kh_check_glu(const struct q4kh_check *c,
                                         q4kh_glu_kind kind,
                                         const struct q4kh_tensor *gate,
                                         const struct q4kh_tensor *up,
                                         const struct q4kh_tensor *out)
{
	q4kh_status st;

	if (kind != Q4KH_GLU_GELU_TANH && kind != Q4KH_GLU_SILU)
		return q4kh__check_fail(c, "glu: kind %d, expected %d (GELU tanh) or %d (SiLU)",
		                        (int)kind, Q4KH_GLU_GELU_TANH, Q4KH_GLU_SILU);
	if ((st = q4kh_check_tensor(c, "glu gate", gate, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, "glu up", up, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, "glu out", out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "glu up", up, gate->ne[0], gate->ne[1],
	                           gate->ne[2], gate->ne[3])) ||
	    (st = q4kh_check_shape(c, "glu out", out, gate->ne[0], gate->ne[1],
	                           gate->ne[2], gate->ne[3])) ||
	    (st = q4kh_check_in_place(c, "glu out", out, "gate", gate)))
		return st;
	return q4kh_check_in_place(c, "glu out", out, "up", up);
}

/* copy: F32 or F16 each, one shape, in place or apart. */
static inline q4kh_status q4kh_check_copy(const struct q4kh_check *c,
                                          const struct q4kh_tensor *src,
                                          const struct q4kh_tensor *dst)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "copy src", src, Q4KH__F32_F16)) ||
	    (st = q4kh_check_tensor(c, "copy dst", dst, Q4KH__F32_F16)) ||
	    (st = q4kh_check_shape(c, "copy dst", dst, src->ne[0], src->ne[1],
	                           src->ne[2], src->ne[3])))
		return st;
	return q4kh_check_in_place(c, "copy dst", dst, "src", src);
}

/*
 * set_rows: src F32 {a, b, T}, rows I32 {T} (its values, in [0, n), are
 * the backend's), dst F32 or F16 {a, b, n}, apart from both.
 */
static inline q4kh_status q4kh_check_set_rows(const struct q4kh_check *c,
                                              const struct q4kh_tensor *src,
                                              const struct q4kh_tensor *rows,
                                              const struct q4kh_tensor *dst)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "set_rows src", src, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "set_rows src", src, -1, -1, -1, 1)) ||
	    (st = q4kh_check_tensor(c, "set_rows dst", dst, Q4KH__F32_F16)) ||
	    (st = q4kh_check_shape(c, "set_rows dst", dst, src->ne[0], src->ne[1], -1, 1)) ||
	    (st = q4kh_check_disjoint(c, "set_rows dst", dst, "src", src)) ||
	    (st = q4kh_check_index(c, "set_rows rows", rows, src->ne[2])))
		return st;
	return q4kh_check_disjoint(c, "set_rows dst", dst, "rows", rows);
}

/* attention's and attention_ext's q, caches and out. */
static inline q4kh_status q4kh__check_attn_tensors(const struct q4kh_check *c,
                                                   const struct q4kh_tensor *q,
                                                   const struct q4kh_tensor *k,
                                                   const struct q4kh_tensor *v,
                                                   const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "attention q", q, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "attention q", q, -1, -1, -1, 1)) ||
	    (st = q4kh_check_tensor(c, "attention k_cache", k, Q4KH__F32_F16)) ||
	    (st = q4kh_check_shape(c, "attention k_cache", k, q->ne[0], -1, -1, 1)) ||
	    (st = q4kh_check_tensor(c, "attention v_cache", v, Q4KH__F32_F16)) ||
	    (st = q4kh_check_shape(c, "attention v_cache", v, k->ne[0], k->ne[1],
	                           k->ne[2], 1)) ||
	    (st = q4kh_check_tensor(c, "attention out", out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "attention out", out, q->ne[0], q->ne[1],
	                           q->ne[2], 1)) ||
	    (st = q4kh_check_disjoint(c, "attention out", out, "q", q)) ||
	    (st = q4kh_check_disjoint(c, "attention out", out, "k_cache", k)) ||
	    (st = q4kh_check_disjoint(c, "attention out", out, "v_cache", v)))
		return st;
	if (q->ne[1] % k->ne[1])
		return q4kh__check_fail(c,
		                        "attention: %lld query heads is not a multiple "
		                        "of %lld KV heads",
		                        (long long)q->ne[1], (long long)k->ne[1]);
	return Q4KH_OK;
}

/* The params; pos0 (T queries from pos0 in an N_CTX cache) when POS0. */
static inline q4kh_status q4kh__check_attn_params(const struct q4kh_check *c,
                                                  const struct q4kh_attn_params *p,
                                                  int64_t T, int64_t n_ctx,
                                                  int pos0)
{
	const size_t need = offsetof(struct q4kh_attn_params, softcap) +
	                    sizeof(p->softcap);

	if (!p)
		return q4kh__check_fail(c, "attention: params is NULL");
	if (p->struct_size < need)
		return q4kh__check_fail(c, "attention: params struct_size %u, expected at least %zu",
		                        p->struct_size, need);
	if (pos0 && (p->pos0 < 0 || p->pos0 > n_ctx - T))
		return q4kh__check_fail(c,
		                        "attention: positions %lld .. %lld, expected "
		                        "inside the %lld-position cache",
		                        (long long)p->pos0, (long long)(p->pos0 + T - 1),
		                        (long long)n_ctx);
	if (p->window < 0)
		return q4kh__check_fail(c, "attention: window %d, expected >= 0", p->window);
	if (!isfinite(p->scale) || !(p->softcap >= 0.0f) || isinf(p->softcap))
		return q4kh__check_fail(c,
		                        "attention: scale %g and softcap %g, expected "
		                        "finite values, softcap >= 0",
		                        (double)p->scale, (double)p->softcap);
	return Q4KH_OK;
}

/*
 * attention: q F32 {hd, H, T}; caches F32 or F16 {hd, H_kv, n_ctx} of one
 * shape, H a multiple of H_kv; out q's shape, apart from q and the
 * caches; positions pos0 .. pos0 + T - 1 inside the cache.
 */
static inline q4kh_status q4kh_check_attention(const struct q4kh_check *c,
                                               const struct q4kh_tensor *q,
                                               const struct q4kh_tensor *k_cache,
                                               const struct q4kh_tensor *v_cache,
                                               const struct q4kh_attn_params *params,
                                               const struct q4kh_tensor *out)
{
	q4kh_status st = q4kh__check_attn_tensors(c, q, k_cache, v_cache, out);

	return st ? st : q4kh__check_attn_params(c, params, q->ne[2], k_cache->ne[2], 1);
}

/*
 * attention_ext: as attention, with pos I32 {T} apart from out instead of
 * params->pos0; its values, in [0, n_ctx), are the backend's.
 */
static inline q4kh_status q4kh_check_attention_ext(const struct q4kh_check *c,
                                                   const struct q4kh_tensor *q,
                                                   const struct q4kh_tensor *k_cache,
                                                   const struct q4kh_tensor *v_cache,
                                                   const struct q4kh_tensor *pos,
                                                   const struct q4kh_attn_params *params,
                                                   const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh__check_attn_tensors(c, q, k_cache, v_cache, out)) ||
	    (st = q4kh__check_attn_params(c, params, q->ne[2], k_cache->ne[2], 0)) ||
	    (st = q4kh_check_index(c, "attention_ext pos", pos, q->ne[2])))
		return st;
	return q4kh_check_disjoint(c, "attention out", out, "pos", pos);
}

/*
 * attention_paged: as attention_ext, over pools {hd, H_kv, n_slots} of
 * pages of PAGE_SIZE tokens (n_slots a multiple of it) through the block
 * table pages I32 {B}; out apart from pos and pages. The values of pos
 * (in [0, B * page_size)) and of pages (in [0, n_slots / page_size)) are
 * the backend's: q4kh_check_index_values on each.
 */
static inline q4kh_status q4kh_check_attention_paged(const struct q4kh_check *c,
                                                     const struct q4kh_tensor *q,
                                                     const struct q4kh_tensor *k_pool,
                                                     const struct q4kh_tensor *v_pool,
                                                     const struct q4kh_tensor *pos,
                                                     const struct q4kh_tensor *pages,
                                                     int32_t page_size,
                                                     const struct q4kh_attn_params *params,
                                                     const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh__check_attn_tensors(c, q, k_pool, v_pool, out)) ||
	    (st = q4kh__check_attn_params(c, params, q->ne[2], k_pool->ne[2], 0)) ||
	    (st = q4kh_check_index(c, "attention_paged pos", pos, q->ne[2])) ||
	    (st = q4kh_check_tensor(c, "attention_paged pages", pages,
	                            Q4KH_TYPE_BIT(Q4KH_TYPE_I32))) ||
	    (st = q4kh_check_shape(c, "attention_paged pages", pages, -1, 1, 1, 1)) ||
	    (st = q4kh_check_disjoint(c, "attention out", out, "pos", pos)) ||
	    (st = q4kh_check_disjoint(c, "attention out", out, "pages", pages)))
		return st;
	if (page_size < 1 || k_pool->ne[2] % page_size)
		return q4kh__check_fail(c,
		                        "attention_paged: page_size %d, expected >= 1 and "
		                        "dividing the pools' %lld slots",
		                        page_size, (long long)k_pool->ne[2]);
	return Q4KH_OK;
}

/* unary: a known kind; out x's shape, in place or apart. */
static inline q4kh_status q4kh_check_unary(const struct q4kh_check *c,
                                           q4kh_unary_kind kind,
                                           const struct q4kh_tensor *x,
                                           const struct q4kh_tensor *out)
{
	q4kh_status st;

	if (kind != Q4KH_UNARY_SIGMOID && kind != Q4KH_UNARY_SOFTPLUS &&
	    kind != Q4KH_UNARY_SILU)
		return q4kh__check_fail(c,
		                        "unary: kind %d, expected %d (sigmoid), %d "
		                        "(softplus) or %d (SiLU)",
		                        (int)kind, Q4KH_UNARY_SIGMOID,
		                        Q4KH_UNARY_SOFTPLUS, Q4KH_UNARY_SILU);
	if ((st = q4kh_check_tensor(c, "unary x", x, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, "unary out", out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "unary out", out, x->ne[0], x->ne[1], x->ne[2],
	                           x->ne[3])))
		return st;
	return q4kh_check_in_place(c, "unary out", out, "x", x);
}

/*
 * ssm_conv: x {C, T}, w {K, C} with K >= 2, state {K-1, C}, out {C, T};
 * out apart from every input, state apart from x and w.
 */
static inline q4kh_status q4kh_check_ssm_conv(const struct q4kh_check *c,
                                              const struct q4kh_tensor *x,
                                              const struct q4kh_tensor *w,
                                              const struct q4kh_tensor *state,
                                              const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "ssm_conv x", x, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "ssm_conv x", x, -1, -1, 1, 1)) ||
	    (st = q4kh_check_tensor(c, "ssm_conv w", w, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "ssm_conv w", w, -1, x->ne[0], 1, 1)) ||
	    (st = q4kh_check_tensor(c, "ssm_conv state", state, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, "ssm_conv out", out, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "ssm_conv out", out, x->ne[0], x->ne[1], 1, 1)))
		return st;
	if (w->ne[0] < 2)
		return q4kh__check_fail(c, "ssm_conv: w has %lld taps, expected at least 2",
		                        (long long)w->ne[0]);
	if ((st = q4kh_check_shape(c, "ssm_conv state", state, w->ne[0] - 1, x->ne[0],
	                           1, 1)) ||
	    (st = q4kh_check_disjoint(c, "ssm_conv out", out, "x", x)) ||
	    (st = q4kh_check_disjoint(c, "ssm_conv out", out, "w", w)) ||
	    (st = q4kh_check_disjoint(c, "ssm_conv out", out, "state", state)) ||
	    (st = q4kh_check_disjoint(c, "ssm_conv state", state, "x", x)))
		return st;
	return q4kh_check_disjoint(c, "ssm_conv state", state, "w", w);
}

/*
 * delta_net: q, k {S_k, H_k, T}; v {S_v, H_v, T}; g, beta {H_v, T}; state
 * {S_k, S_v, H_v}; out {S_v, H_v, T}; H_v a multiple of H_k; out and
 * state apart from every input and from each other; scale finite.
 */
static inline q4kh_status q4kh_check_delta_net(const struct q4kh_check *c,
                                               const struct q4kh_tensor *q,
                                               const struct q4kh_tensor *k,
                                               const struct q4kh_tensor *v,
                                               const struct q4kh_tensor *g,
                                               const struct q4kh_tensor *beta,
                                               const struct q4kh_tensor *state,
                                               float scale,
                                               const struct q4kh_tensor *out)
{
	static const char *const names[] = { "delta_net q", "delta_net k", "delta_net v",
		                             "delta_net g", "delta_net beta" };
	const struct q4kh_tensor *in[] = { q, k, v, g, beta };
	int64_t sk, hk, T, sv, hv;
	q4kh_status st;

	for (int i = 0; i < 5; i++)
		if ((st = q4kh_check_tensor(c, names[i], in[i], Q4KH__F32)))
			return st;
	if ((st = q4kh_check_tensor(c, "delta_net state", state, Q4KH__F32)) ||
	    (st = q4kh_check_tensor(c, "delta_net out", out, Q4KH__F32)))
		return st;
	sk = q->ne[0];
	hk = q->ne[1];
	T = q->ne[2];
	sv = v->ne[0];
	hv = v->ne[1];
	if ((st = q4kh_check_shape(c, "delta_net q", q, -1, -1, -1, 1)) ||
	    (st = q4kh_check_shape(c, "delta_net k", k, sk, hk, T, 1)) ||
	    (st = q4kh_check_shape(c, "delta_net v", v, -1, -1, T, 1)) ||
	    (st = q4kh_check_shape(c, "delta_net g", g, hv, T, 1, 1)) ||
	    (st = q4kh_check_shape(c, "delta_net beta", beta, hv, T, 1, 1)) ||
	    (st = q4kh_check_shape(c, "delta_net state", state, sk, sv, hv, 1)) ||
	    (st = q4kh_check_shape(c, "delta_net out", out, sv, hv, T, 1)))
		return st;
	if (hv % hk)
		return q4kh__check_fail(c,
		                        "delta_net: %lld value heads is not a multiple "
		                        "of %lld key heads",
		                        (long long)hv, (long long)hk);
	for (int i = 0; i < 5; i++)
		if ((st = q4kh_check_disjoint(c, "delta_net out", out, names[i], in[i])) ||
		    (st = q4kh_check_disjoint(c, "delta_net state", state, names[i], in[i])))
			return st;
	if ((st = q4kh_check_disjoint(c, "delta_net out", out, "state", state)))
		return st;
	if (!isfinite(scale))
		return q4kh__check_fail(c, "delta_net: scale %g, expected a finite value",
		                        (double)scale);
	return Q4KH_OK;
}

/*
 * add_rms_norm (ABI 1.4): add's checks of x += a and rms_norm's of
 * rms_norm(x) into out, messages named after the part that refuses; then
 * a of x's very shape and apart from x, and out exactly a or apart from it.
 */
static inline q4kh_status q4kh_check_add_rms_norm(const struct q4kh_check *c,
                                                  const struct q4kh_tensor *x,
                                                  const struct q4kh_tensor *a,
                                                  const struct q4kh_tensor *w,
                                                  float eps,
                                                  const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_binary(c, "add", x, a, x)) ||
	    (st = q4kh_check_rms_norm(c, x, w, eps, out)) ||
	    (st = q4kh_check_shape(c, "add_rms_norm a", a, x->ne[0], x->ne[1],
	                           x->ne[2], x->ne[3])) ||
	    (st = q4kh_check_disjoint(c, "add_rms_norm a", a, "x", x)))
		return st;
	return q4kh_check_in_place(c, "add_rms_norm out", out, "a", a);
}

/*
 * norm_add_rms_norm (ABI 1.5): rms_norm's checks of a normed in place
 * with w_a, then add_rms_norm's of x += a normed into out; out apart from
 * w_a.
 */
static inline q4kh_status q4kh_check_norm_add_rms_norm(const struct q4kh_check *c,
                                                       const struct q4kh_tensor *x,
                                                       const struct q4kh_tensor *a,
                                                       const struct q4kh_tensor *w_a,
                                                       float eps_a,
                                                       const struct q4kh_tensor *w,
                                                       float eps,
                                                       const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = q4kh_check_rms_norm(c, a, w_a, eps_a, a)) ||
	    (st = q4kh_check_add_rms_norm(c, x, a, w, eps, out)))
		return st;
	return w_a ? q4kh_check_disjoint(c, "norm_add_rms_norm out", out, "w_a", w_a)
	           : Q4KH_OK;
}

/*
 * rope_set_rows (ABI 1.4): rope_ext's checks of x rotated in place at pos,
 * then set_rows' of x written to cache at rows pos (cache apart from x
 * and pos), messages named after the part that refuses.
 */
static inline q4kh_status q4kh_check_rope_set_rows(const struct q4kh_check *c,
                                                   const struct q4kh_tensor *x,
                                                   const struct q4kh_tensor *pos,
                                                   const struct q4kh_rope_params *p,
                                                   const struct q4kh_tensor *cache)
{
	q4kh_status st;

	if ((st = q4kh_check_rope_ext(c, x, pos, p, x)))
		return st;
	return q4kh_check_set_rows(c, x, pos, cache);
}

/*
 * rope_store's own rule (ABI 1.4), on tensors whose buffers are known:
 * each tensor the call writes (q, k and the caches) apart from every
 * other operand, so that its three parts may run in any order. The host
 * tests it before it fuses the three ops (graph_run.c).
 */
static inline q4kh_status q4kh_check_rope_store_apart(const struct q4kh_check *c,
                                                      const struct q4kh_tensor *q,
                                                      const struct q4kh_tensor *k,
                                                      const struct q4kh_tensor *v,
                                                      const struct q4kh_tensor *pos,
                                                      const struct q4kh_tensor *k_cache,
                                                      const struct q4kh_tensor *v_cache)
{
	static const char *const names[6] = {
		"rope_store q", "rope_store k", "rope_store k_cache", "rope_store v_cache",
		"rope_store v", "rope_store pos",
	};
	const struct q4kh_tensor *const t[6] = { q, k, k_cache, v_cache, v, pos };
	q4kh_status st;

	/* the first four are written */
	for (int i = 0; i < 4; i++)
		for (int j = i + 1; j < 6; j++)
			if ((st = q4kh_check_disjoint(c, names[i], t[i], names[j], t[j])))
				return st;
	return Q4KH_OK;
}

/*
 * rope_store (ABI 1.4): rope_ext's checks of q rotated in place at pos,
 * rope_set_rows' of k into k_cache, set_rows' of v into v_cache,
 * messages named after the part that refuses; then
 * q4kh_check_rope_store_apart.
 */
static inline q4kh_status q4kh_check_rope_store(const struct q4kh_check *c,
                                                const struct q4kh_tensor *q,
                                                const struct q4kh_tensor *k,
                                                const struct q4kh_tensor *v,
                                                const struct q4kh_tensor *pos,
                                                const struct q4kh_rope_params *p,
                                                const struct q4kh_tensor *k_cache,
                                                const struct q4kh_tensor *v_cache)
{
	q4kh_status st;

	if ((st = q4kh_check_rope_ext(c, q, pos, p, q)) ||
	    (st = q4kh_check_rope_set_rows(c, k, pos, p, k_cache)) ||
	    (st = q4kh_check_set_rows(c, v, pos, v_cache)))
		return st;
	return q4kh_check_rope_store_apart(c, q, k, v, pos, k_cache, v_cache);
}

/*
 * top2 (ABI 1.4): x F32 {N, T} with N <= INT32_MAX, idx I32 {T}, val F32
 * {2, T}; idx and val apart from x and from each other.
 */
static inline q4kh_status q4kh_check_top2(const struct q4kh_check *c,
                                          const struct q4kh_tensor *x,
                                          const struct q4kh_tensor *idx,
                                          const struct q4kh_tensor *val)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "top2 x", x, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "top2 x", x, -1, -1, 1, 1)))
		return st;
	if (x->ne[0] > INT32_MAX)
		return q4kh__check_fail(c, "top2 x: %lld rows, expected at most %d",
		                        (long long)x->ne[0], INT32_MAX);
	if ((st = q4kh_check_index(c, "top2 idx", idx, x->ne[1])) ||
	    (st = q4kh_check_tensor(c, "top2 val", val, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "top2 val", val, 2, x->ne[1], 1, 1)) ||
	    (st = q4kh_check_disjoint(c, "top2 idx", idx, "x", x)) ||
	    (st = q4kh_check_disjoint(c, "top2 val", val, "x", x)))
		return st;
	return q4kh_check_disjoint(c, "top2 val", val, "idx", idx);
}

/*
 * moe_route (ABI 1.7): logits F32 {E, T}; ids I32 {k, T} and weights F32
 * {k, T} with 1 <= k <= E; norm 0 or 1; ids and weights apart from logits
 * and from each other.
 */
static inline q4kh_status q4kh_check_moe_route(const struct q4kh_check *c,
                                               const struct q4kh_tensor *logits,
                                               int32_t norm,
                                               const struct q4kh_tensor *ids,
                                               const struct q4kh_tensor *weights)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "moe_route logits", logits, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "moe_route logits", logits, -1, -1, 1, 1)) ||
	    (st = q4kh_check_tensor(c, "moe_route ids", ids, Q4KH_TYPE_BIT(Q4KH_TYPE_I32))) ||
	    (st = q4kh_check_shape(c, "moe_route ids", ids, -1, logits->ne[1], 1, 1)) ||
	    (st = q4kh_check_tensor(c, "moe_route weights", weights, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "moe_route weights", weights, ids->ne[0], logits->ne[1],
	                           1, 1)))
		return st;
	if (ids->ne[0] > logits->ne[0] || logits->ne[0] > INT32_MAX)
		return q4kh__check_fail(c,
		                        "moe_route: %lld experts chosen of %lld, expected 1 .. "
		                        "the experts (at most %d)",
		                        (long long)ids->ne[0], (long long)logits->ne[0], INT32_MAX);
	if (norm != 0 && norm != 1)
		return q4kh__check_fail(c, "moe_route: norm %d, expected 0 or 1", (int)norm);
	if ((st = q4kh_check_disjoint(c, "moe_route ids", ids, "logits", logits)) ||
	    (st = q4kh_check_disjoint(c, "moe_route weights", weights, "logits", logits)))
		return st;
	return q4kh_check_disjoint(c, "moe_route weights", weights, "ids", ids);
}

/*
 * mul_mat_id (ABI 1.7): w {K, N, E} (a weight type), x F32 {K, X, T} with
 * X 1 or k, ids I32 {k, T}, y F32 {N, k, T}; y apart from w, x and ids.
 * The ids' values are the backend's to check when it reads them.
 */
static inline q4kh_status q4kh_check_mul_mat_id(const struct q4kh_check *c,
                                                const struct q4kh_tensor *w,
                                                const struct q4kh_tensor *x,
                                                const struct q4kh_tensor *ids,
                                                const struct q4kh_tensor *y)
{
	q4kh_status st;

	if ((st = q4kh_check_tensor(c, "mul_mat_id w", w, c->weight_types)) ||
	    (st = q4kh_check_shape(c, "mul_mat_id w", w, -1, -1, -1, 1)) ||
	    (st = q4kh_check_tensor(c, "mul_mat_id ids", ids, Q4KH_TYPE_BIT(Q4KH_TYPE_I32))) ||
	    (st = q4kh_check_shape(c, "mul_mat_id ids", ids, -1, -1, 1, 1)) ||
	    (st = q4kh_check_tensor(c, "mul_mat_id x", x, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "mul_mat_id x", x, w->ne[0], -1, ids->ne[1], 1)) ||
	    (st = q4kh_check_tensor(c, "mul_mat_id y", y, Q4KH__F32)) ||
	    (st = q4kh_check_shape(c, "mul_mat_id y", y, w->ne[1], ids->ne[0], ids->ne[1], 1)))
		return st;
	if (x->ne[1] != 1 && x->ne[1] != ids->ne[0])
		return q4kh__check_fail(c, "mul_mat_id x: ne[1] = %lld, expected 1 or the %lld slots "
		                        "of ids", (long long)x->ne[1], (long long)ids->ne[0]);
	if ((st = q4kh_check_disjoint(c, "mul_mat_id y", y, "x", x)) ||
	    (st = q4kh_check_disjoint(c, "mul_mat_id y", y, "ids", ids)))
		return st;
	return q4kh_check_disjoint(c, "mul_mat_id y", y, "w", w);
}

#undef Q4KH__F32
#undef Q4KH__F32_F16

#ifdef __cplusplus
}
#endif

#endif /* Q4KHOST_CONTRACT_H */
