/*
 * Validation of tensor views before an op touches memory: every op checks
 * its tensors here and fails with one precise line instead of crashing.
 */
#include <stdio.h>
#include <string.h>

#include "cpu.h"

/* Larger extents are refused, so products of them never overflow. */
#define CPU_MAX_NE ((int64_t)1 << 40)

static const char *type_label(uint32_t type)
{
	const char *n = q4kh_type_name(type);

	return n ? n : "unknown";
}

/* "F32 or F16" for a mask of types. */
static void type_list(uint32_t types, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = 0;
	for (uint32_t t = 0; t < 32 && used < len; t++) {
		if (!(types & CPU_T(t)))
			continue;
		used += (size_t)snprintf(buf + used, len - used, "%s%s",
		                         used ? " or " : "", type_label(t));
	}
}

/* Alignment that element or block reads of TYPE need. */
static uint64_t type_align(uint32_t type)
{
	return type == Q4KH_TYPE_F32 || type == Q4KH_TYPE_I32 ? 4 : 2;
}

/* Bytes from the first byte of t to one past its last. */
static int tensor_extent(const struct q4kh_tensor *t, uint64_t *extent)
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

static q4kh_status check_dims(q4kh_device_ctx *dev, const char *what,
                              const struct q4kh_tensor *t)
{
	uint32_t be = q4kh_type_block_elems(t->type);
	uint64_t align = type_align(t->type);

	for (int i = 0; i < 4; i++) {
		if (t->ne[i] < 1 || t->ne[i] > CPU_MAX_NE)
			return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
			                "%s: ne[%d] = %lld, expected 1 .. 2^40", what, i,
			                (long long)t->ne[i]);
		if (t->nb[i] < 0 || (uint64_t)t->nb[i] % align)
			return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
			                "%s: nb[%d] = %lld, expected a non-negative "
			                "multiple of %llu",
			                what, i, (long long)t->nb[i],
			                (unsigned long long)align);
	}
	if (t->ne[0] % be)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "%s: ne[0] = %lld is not a multiple of %s's block "
		                "of %u values",
		                what, (long long)t->ne[0], type_label(t->type), be);
	if (t->nb[0] != (int64_t)q4kh_type_block_bytes(t->type))
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "%s: nb[0] = %lld, expected %u (contiguous %s rows)",
		                what, (long long)t->nb[0],
		                q4kh_type_block_bytes(t->type), type_label(t->type));
	if (t->offset % align)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "%s: offset %llu is not a multiple of %llu", what,
		                (unsigned long long)t->offset,
		                (unsigned long long)align);
	if ((double)t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] > (double)CPU_MAX_NE)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "%s: %lld x %lld x %lld x %lld elements, more than "
		                "2^40",
		                what, (long long)t->ne[0], (long long)t->ne[1],
		                (long long)t->ne[2], (long long)t->ne[3]);
	return Q4KH_OK;
}

q4kh_status cpu_tensor_check(q4kh_device_ctx *dev, const char *what,
                             const struct q4kh_tensor *t, uint32_t types)
{
	char expected[128];
	uint64_t extent, end;
	q4kh_status st;

	if (!t)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID, "%s: tensor is NULL",
		                what);
	if (!t->buffer)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID, "%s: buffer is NULL",
		                what);
	if (t->buffer->dev != dev)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "%s: buffer belongs to another device context", what);
	if (t->type >= 32 || !(types & CPU_T(t->type))) {
		type_list(types, expected, sizeof(expected));
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "%s: type %u (%s), expected %s", what, t->type,
		                type_label(t->type), expected);
	}
	st = check_dims(dev, what, t);
	if (st)
		return st;
	if (tensor_extent(t, &extent) ||
	    __builtin_add_overflow(t->offset, extent, &end) ||
	    end > t->buffer->size)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "%s: view {%lld, %lld, %lld, %lld} at offset %llu "
		                "ends past its %llu-byte buffer",
		                what, (long long)t->ne[0], (long long)t->ne[1],
		                (long long)t->ne[2], (long long)t->ne[3],
		                (unsigned long long)t->offset,
		                (unsigned long long)t->buffer->size);
	return Q4KH_OK;
}

q4kh_status cpu_tensor_shape(q4kh_device_ctx *dev, const char *what,
                             const struct q4kh_tensor *t, int64_t ne0,
                             int64_t ne1, int64_t ne2, int64_t ne3)
{
	const int64_t want[4] = { ne0, ne1, ne2, ne3 };
	char buf[128];
	size_t used = 0;

	for (int i = 0; i < 4; i++)
		if (want[i] >= 0 && t->ne[i] != want[i])
			goto mismatch;
	return Q4KH_OK;
mismatch:
	for (int i = 0; i < 4; i++) {
		if (want[i] >= 0)
			used += (size_t)snprintf(buf + used, sizeof(buf) - used, "%s%lld",
			                         i ? ", " : "", (long long)want[i]);
		else
			used += (size_t)snprintf(buf + used, sizeof(buf) - used, "%s*",
			                         i ? ", " : "");
	}
	return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
	                "%s: shape {%lld, %lld, %lld, %lld}, expected {%s}", what,
	                (long long)t->ne[0], (long long)t->ne[1],
	                (long long)t->ne[2], (long long)t->ne[3], buf);
}

/* Checked tensors only: their extents fit in their buffers. */
static int tensors_overlap(const struct q4kh_tensor *a,
                           const struct q4kh_tensor *b)
{
	uint64_t ea, eb;

	if (a->buffer != b->buffer)
		return 0;
	tensor_extent(a, &ea);
	tensor_extent(b, &eb);
	return a->offset < b->offset + eb && b->offset < a->offset + ea;
}

q4kh_status cpu_tensor_disjoint(q4kh_device_ctx *dev, const char *out_name,
                                const struct q4kh_tensor *out,
                                const char *in_name,
                                const struct q4kh_tensor *in)
{
	if (!tensors_overlap(out, in))
		return Q4KH_OK;
	return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
	                "%s (offset %llu) overlaps %s (offset %llu) in one buffer",
	                out_name, (unsigned long long)out->offset, in_name,
	                (unsigned long long)in->offset);
}

q4kh_status cpu_tensor_inplace(q4kh_device_ctx *dev, const char *out_name,
                               const struct q4kh_tensor *out,
                               const char *in_name,
                               const struct q4kh_tensor *in)
{
	if (out->buffer == in->buffer && out->offset == in->offset &&
	    out->type == in->type && !memcmp(out->ne, in->ne, sizeof(out->ne)) &&
	    !memcmp(out->nb, in->nb, sizeof(out->nb)))
		return Q4KH_OK;
	return cpu_tensor_disjoint(dev, out_name, out, in_name, in);
}

q4kh_status cpu_index_check(q4kh_device_ctx *dev, const char *what,
                            const struct q4kh_tensor *t, int64_t n,
                            int64_t limit)
{
	q4kh_status st;
	const int32_t *v;

	if ((st = cpu_tensor_check(dev, what, t, CPU_T(Q4KH_TYPE_I32))) ||
	    (st = cpu_tensor_shape(dev, what, t, n, 1, 1, 1)))
		return st;
	v = (const int32_t *)cpu_row(t, 0, 0, 0);
	for (int64_t i = 0; i < n; i++)
		if (v[i] < 0 || v[i] >= limit)
			return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
			                "%s[%lld] = %d, expected 0 .. %lld", what,
			                (long long)i, v[i], (long long)limit - 1);
	return Q4KH_OK;
}
