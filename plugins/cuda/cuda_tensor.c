/*
 * The op contract as the cuda backend applies it: every op checks its
 * arguments on the host through q4khost/contract.h before anything is
 * enqueued (a kernel given a bad view would fault asynchronously, far from
 * the call that caused it), and the kernels' view of a checked tensor.
 */
#include <string.h>

#include "cuda.h"

uint32_t cuda_weight_types(void)
{
	uint32_t m = 0;

	for (uint32_t t = 0; t < 32; t++)
		if (cuda_type_supported(t))
			m |= CUDA_T(t);
	return m;
}

/* A buffer is device memory of one device context. */
static int own_buffer(const void *dev, const q4kh_buffer *buf, uint64_t *size)
{
	*size = buf->size;
	return buf->dev == dev;
}

struct q4kh_check cuda_contract(q4kh_device_ctx *dev)
{
	struct q4kh_check c = {
		.dev = dev,
		.buffer = own_buffer,
		.weight_types = cuda_weight_types(),
		.msg = dev ? dev->ctx->error : NULL,
		.cap = dev ? sizeof(dev->ctx->error) : 0,
	};

	return c;
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
