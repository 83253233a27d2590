/*
 * Building struct q4kh_tensor views for the forward graph. Activations are
 * contiguous f32 matrices {ne0, ne1} (ne1 = tokens) or {ne0, ne1, ne2}
 * (head_dim, heads, tokens); views select columns or reshape without
 * copying. Pure functions, thread-safe.
 */
#ifndef Q4KH_TENSOR_H
#define Q4KH_TENSOR_H

#include "q4khost/plugin.h"

/* A contiguous tensor of TYPE (f32/f16 or quantized rows) at buf+offset. */
static inline struct q4kh_tensor q4kh_tensor_make(q4kh_buffer *buf,
                                                  uint64_t offset, uint32_t type,
                                                  int64_t ne0, int64_t ne1,
                                                  int64_t ne2)
{
	struct q4kh_tensor t = { 0 };
	uint32_t be = q4kh_type_block_elems(type);

	t.buffer = buf;
	t.offset = offset;
	t.type = type;
	t.ne[0] = ne0;
	t.ne[1] = ne1;
	t.ne[2] = ne2;
	t.ne[3] = 1;
	t.nb[0] = q4kh_type_block_bytes(type);
	t.nb[1] = ne0 / be * (int64_t)q4kh_type_block_bytes(type);
	t.nb[2] = t.nb[1] * ne1;
	t.nb[3] = t.nb[2] * ne2;
	return t;
}

/* Bytes a contiguous tensor occupies. */
static inline uint64_t q4kh_tensor_bytes(const struct q4kh_tensor *t)
{
	return (uint64_t)t->nb[3] * (uint64_t)t->ne[3];
}

/* The same memory seen as {ne0, ne1, ne2}; the element count must match. */
static inline struct q4kh_tensor q4kh_tensor_reshape(const struct q4kh_tensor *t,
                                                     int64_t ne0, int64_t ne1,
                                                     int64_t ne2)
{
	return q4kh_tensor_make(t->buffer, t->offset, t->type, ne0, ne1, ne2);
}

/* Columns [c0, c0 + n) of the outermost used dimension (tokens). */
static inline struct q4kh_tensor q4kh_tensor_cols(const struct q4kh_tensor *t,
                                                  int64_t c0, int64_t n)
{
	struct q4kh_tensor v = *t;
	int d = t->ne[2] > 1 ? 2 : 1;

	v.offset += (uint64_t)(c0 * t->nb[d]);
	v.ne[d] = n;
	for (int i = d + 1; i < 4; i++)
		v.nb[i] = v.nb[d] * v.ne[d];
	return v;
}

#endif
