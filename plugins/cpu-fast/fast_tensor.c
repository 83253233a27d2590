/*
 * What every op checks before it touches memory (fast.h): a bad view is
 * one precise error line, never a read outside a buffer.
 */
#include <stdio.h>
#include <string.h>

#include "fast.h"

#define MAX_NE ((int64_t)1 << 40)

/* Bytes from the first byte of checked tensor t to one past its last. */
static uint64_t extent(const struct q4kh_tensor *t)
{
	uint64_t e = (uint64_t)t->ne[0] / q4kh_type_block_elems(t->type) *
	             q4kh_type_block_bytes(t->type);

	for (int i = 1; i < 4; i++)
		e += (uint64_t)(t->ne[i] - 1) * (uint64_t)t->nb[i];
	return e;
}

static const char *type_label(uint32_t type)
{
	const char *n = q4kh_type_name(type);

	return n ? n : "unknown";
}

q4kh_status fast_check(q4kh_device_ctx *dev, const char *what,
                       const struct q4kh_tensor *t, uint64_t types, int64_t ne0,
                       int64_t ne1, int64_t ne2, int64_t ne3)
{
	const int64_t want[4] = { ne0, ne1, ne2, ne3 };
	q4kh_backend_ctx *c = dev->ctx;
	uint64_t align, span = 0, step, end;

	if (!t || !t->buffer)
		return fast_fail(c, Q4KH_ERR_INVALID, "%s: %s is NULL", what,
		                 t ? "buffer" : "tensor");
	if (t->buffer->dev != dev)
		return fast_fail(c, Q4KH_ERR_INVALID,
		                 "%s: buffer belongs to another device context", what);
	if (t->type >= 64 || !(types & FAST_T(t->type)))
		return fast_fail(c, Q4KH_ERR_INVALID, "%s: type %u (%s) is not accepted here",
		                 what, t->type, type_label(t->type));
	align = t->type == Q4KH_TYPE_F32 || t->type == Q4KH_TYPE_I32 ? 4 : 2;
	for (int i = 0; i < 4; i++) {
		if (t->ne[i] < 1 || t->ne[i] > MAX_NE || t->nb[i] < 0 ||
		    (uint64_t)t->nb[i] % align || t->nb[i] > MAX_NE)
			return fast_fail(c, Q4KH_ERR_INVALID,
			                 "%s: ne[%d] = %lld, nb[%d] = %lld: expected 1 .. 2^40 "
			                 "values and a stride that is a multiple of %llu",
			                 what, i, (long long)t->ne[i], i, (long long)t->nb[i],
			                 (unsigned long long)align);
		if (want[i] >= 0 && t->ne[i] != want[i])
			return fast_fail(c, Q4KH_ERR_INVALID,
			                 "%s: shape {%lld, %lld, %lld, %lld}: ne[%d] should be %lld",
			                 what, (long long)t->ne[0], (long long)t->ne[1],
			                 (long long)t->ne[2], (long long)t->ne[3], i,
			                 (long long)want[i]);
		if (i && (__builtin_mul_overflow((uint64_t)(t->ne[i] - 1), (uint64_t)t->nb[i],
		                                 &step) ||
		          __builtin_add_overflow(span, step, &span)))
			return fast_fail(c, Q4KH_ERR_INVALID, "%s: its extent overflows", what);
	}
	if (t->ne[0] % q4kh_type_block_elems(t->type) ||
	    t->nb[0] != (int64_t)q4kh_type_block_bytes(t->type) || t->offset % align)
		return fast_fail(c, Q4KH_ERR_INVALID,
		                 "%s: ne[0] = %lld, nb[0] = %lld, offset %llu: expected "
		                 "contiguous rows of whole %s blocks, aligned",
		                 what, (long long)t->ne[0], (long long)t->nb[0],
		                 (unsigned long long)t->offset, type_label(t->type));
	if (__builtin_add_overflow(t->offset, extent(t), &end) || end > t->buffer->size)
		return fast_fail(c, Q4KH_ERR_INVALID,
		                 "%s: view {%lld, %lld, %lld, %lld} at offset %llu ends past "
		                 "its %llu-byte buffer",
		                 what, (long long)t->ne[0], (long long)t->ne[1],
		                 (long long)t->ne[2], (long long)t->ne[3],
		                 (unsigned long long)t->offset,
		                 (unsigned long long)t->buffer->size);
	return Q4KH_OK;
}

q4kh_status fast_apart(q4kh_device_ctx *dev, const char *what,
                       const struct q4kh_tensor *out, const struct q4kh_tensor *in,
                       int same_ok)
{
	if (same_ok && out->buffer == in->buffer && out->offset == in->offset &&
	    out->type == in->type && !memcmp(out->ne, in->ne, sizeof(out->ne)) &&
	    !memcmp(out->nb, in->nb, sizeof(out->nb)))
		return Q4KH_OK;
	if (out->buffer != in->buffer || out->offset >= in->offset + extent(in) ||
	    in->offset >= out->offset + extent(out))
		return Q4KH_OK;
	return fast_fail(dev->ctx, Q4KH_ERR_INVALID,
	                 "%s: the output (offset %llu) overlaps an input (offset %llu)%s",
	                 what, (unsigned long long)out->offset,
	                 (unsigned long long)in->offset,
	                 same_ok ? " without being the same view" : "");
}

q4kh_status fast_index(q4kh_device_ctx *dev, const char *what,
                       const struct q4kh_tensor *t, int64_t n, int64_t limit)
{
	q4kh_status st = fast_check(dev, what, t, FAST_T(Q4KH_TYPE_I32), n, 1, 1, 1);
	const int32_t *v;

	if (st)
		return st;
	v = (const int32_t *)fast_at(t, 0, 0, 0);
	for (int64_t i = 0; i < n; i++)
		if (v[i] < 0 || v[i] >= limit)
			return fast_fail(dev->ctx, Q4KH_ERR_INVALID,
			                 "%s[%lld] = %d, expected 0 .. %lld", what, (long long)i,
			                 v[i], (long long)limit - 1);
	return Q4KH_OK;
}
