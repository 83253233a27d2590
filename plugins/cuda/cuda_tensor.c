/*
 * Validation of tensor views on the host, before anything is enqueued: a
 * kernel given a bad view would fault asynchronously, far from the call
 * that caused it. Messages name the op's operand and what was expected.
 */
#include <stdio.h>
#include <string.h>

#include "cuda.h"

/* Larger extents are refused, so products of them never overflow. */
#define MAX_NE ((int64_t)1 << 40)

uint32_t cuda_weight_types(void)
{
	uint32_t m = 0;

	for (uint32_t t = 0; t < 32; t++)
		if (cuda_type_supported(t))
			m |= CUDA_T(t);
	return m;
}

static const char *type_label(uint32_t type)
{
	const char *n = q4kh_type_name(type);

	return n ? n : "unknown";
}

/* f32 loads need 4-byte alignment; halves and block fields 2. */
static int64_t type_align(uint32_t type)
{
	return type == Q4KH_TYPE_F32 ? 4 : 2;
}

/* Bytes from the first byte of a checked view to one past its last. */
static int view_extent(const struct q4kh_tensor *t, uint64_t *extent)
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

static q4kh_status check_layout(q4kh_device_ctx *dev, const char *what,
                                const struct q4kh_tensor *t)
{
	const int64_t align = type_align(t->type);
	const uint32_t be = q4kh_type_block_elems(t->type);
	const uint32_t bb = q4kh_type_block_bytes(t->type);
	uint64_t extent, end;

	for (int i = 0; i < 4; i++) {
		if (t->ne[i] < 1 || t->ne[i] > MAX_NE)
			return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
			                 "%s: ne[%d] = %lld, expected 1 .. 2^40", what, i,
			                 (long long)t->ne[i]);
		if (t->nb[i] < 0 || t->nb[i] % align)
			return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
			                 "%s: nb[%d] = %lld, expected a non-negative "
			                 "multiple of %lld",
			                 what, i, (long long)t->nb[i], (long long)align);
	}
	if (t->ne[0] % be)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "%s: ne[0] = %lld is not a multiple of %s's block "
		                 "of %u values",
		                 what, (long long)t->ne[0], type_label(t->type), be);
	if (t->nb[0] != (int64_t)bb)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "%s: nb[0] = %lld, expected %u (contiguous %s rows)",
		                 what, (long long)t->nb[0], bb, type_label(t->type));
	if (t->offset % (uint64_t)align)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "%s: offset %llu is not a multiple of %lld", what,
		                 (unsigned long long)t->offset, (long long)align);
	if ((double)t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] > (double)MAX_NE)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "%s: more than 2^40 elements", what);
	if (view_extent(t, &extent) ||
	    __builtin_add_overflow(t->offset, extent, &end) ||
	    end > t->buffer->size)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "%s: view {%lld, %lld, %lld, %lld} at offset %llu "
		                 "ends past its %llu-byte buffer",
		                 what, (long long)t->ne[0], (long long)t->ne[1],
		                 (long long)t->ne[2], (long long)t->ne[3],
		                 (unsigned long long)t->offset,
		                 (unsigned long long)t->buffer->size);
	return Q4KH_OK;
}

q4kh_status cuda_tensor_check(q4kh_device_ctx *dev, const char *what,
                              const struct q4kh_tensor *t, uint32_t types)
{
	char expected[128] = "";
	size_t used = 0;

	if (!t)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID, "%s: tensor is NULL",
		                 what);
	if (!t->buffer)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID, "%s: buffer is NULL",
		                 what);
	if (t->buffer->dev != dev)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "%s: buffer belongs to another device context", what);
	if (t->type < 32 && (types & CUDA_T(t->type)))
		return check_layout(dev, what, t);
	for (uint32_t i = 0; i < 32 && used < sizeof(expected); i++)
		if (types & CUDA_T(i))
			used += (size_t)snprintf(expected + used,
			                         sizeof(expected) - used, "%s%s",
			                         used ? " or " : "", type_label(i));
	return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
	                 "%s: type %u (%s), expected %s", what, t->type,
	                 type_label(t->type), expected);
}

q4kh_status cuda_tensor_shape(q4kh_device_ctx *dev, const char *what,
                              const struct q4kh_tensor *t, int64_t ne0,
                              int64_t ne1, int64_t ne2, int64_t ne3)
{
	const int64_t want[4] = { ne0, ne1, ne2, ne3 };
	char shown[4][24];

	for (int i = 0; i < 4; i++) {
		if (want[i] >= 0 && t->ne[i] != want[i])
			break;
		if (i == 3)
			return Q4KH_OK;
	}
	for (int i = 0; i < 4; i++)
		if (want[i] >= 0)
			snprintf(shown[i], sizeof(shown[i]), "%lld", (long long)want[i]);
		else
			snprintf(shown[i], sizeof(shown[i]), "*");
	return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
	                 "%s: shape {%lld, %lld, %lld, %lld}, expected {%s, %s, "
	                 "%s, %s}",
	                 what, (long long)t->ne[0], (long long)t->ne[1],
	                 (long long)t->ne[2], (long long)t->ne[3], shown[0],
	                 shown[1], shown[2], shown[3]);
}

q4kh_status cuda_tensor_apart(q4kh_device_ctx *dev, const char *out_name,
                              const struct q4kh_tensor *out,
                              const char *in_name,
                              const struct q4kh_tensor *in, int inplace)
{
	uint64_t eo, ei;

	if (inplace && out->buffer == in->buffer && out->offset == in->offset &&
	    out->type == in->type && !memcmp(out->ne, in->ne, sizeof(out->ne)) &&
	    !memcmp(out->nb, in->nb, sizeof(out->nb)))
		return Q4KH_OK;
	/* Both are checked views: their extents are known to fit. */
	view_extent(out, &eo);
	view_extent(in, &ei);
	if (out->buffer != in->buffer || out->offset >= in->offset + ei ||
	    in->offset >= out->offset + eo)
		return Q4KH_OK;
	return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
	                 "%s (offset %llu) overlaps %s (offset %llu) in one buffer",
	                 out_name, (unsigned long long)out->offset, in_name,
	                 (unsigned long long)in->offset);
}

struct cuda_view cuda_view_of(const struct q4kh_tensor *t)
{
	struct cuda_view v;

	v.data = t->buffer->ptr + t->offset;
	v.type = t->type;
	memcpy(v.ne, t->ne, sizeof(v.ne));
	memcpy(v.nb, t->nb, sizeof(v.nb));
	return v;
}
