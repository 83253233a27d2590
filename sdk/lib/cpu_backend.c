/*
 * Buffers, per-thread scratch and native handles of a backend of kind
 * "cpu" (q4khost/cpu_backend.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/backend_base.h"
#include "q4khost/cpu_backend.h"

/* The backend's device context, as the check names it. */
static q4kh_device_ctx *device_of(const struct q4kh_check *c)
{
	return (q4kh_device_ctx *)(uintptr_t)c->dev;
}

int q4kh_cpu_buffer_owned(const void *dev, const q4kh_buffer *buf, uint64_t *size)
{
	*size = buf->size;
	return dev && buf->dev == dev;
}

struct q4kh_check q4kh_cpu_check(q4kh_device_ctx *dev, uint32_t weight_types, char *msg,
                                 size_t cap)
{
	struct q4kh_check c = { dev, q4kh_cpu_buffer_owned, weight_types, msg, cap };

	return c;
}

q4kh_status q4kh_cpu_index_values(const struct q4kh_check *c, const char *what,
                                  const struct q4kh_tensor *t, int64_t limit)
{
	return q4kh_check_index_values(c, what, (const int32_t *)q4kh_cpu_at(t, 0, 0, 0), t->ne[0],
	                               limit);
}

q4kh_status q4kh_cpu_attention_paged_args(const struct q4kh_check *c, const struct q4kh_tensor *q,
                                          const struct q4kh_tensor *k_pool,
                                          const struct q4kh_tensor *v_pool,
                                          const struct q4kh_tensor *pos,
                                          const struct q4kh_tensor *pages, int32_t page_size,
                                          const struct q4kh_attn_params *params,
                                          const struct q4kh_tensor *out,
                                          const int32_t **pos_at, const int32_t **pages_at,
                                          int64_t *last)
{
	q4kh_status st;

	if ((st = q4kh_check_attention_paged(c, q, k_pool, v_pool, pos, pages, page_size, params,
	                                     out)) ||
	    (st = q4kh_cpu_index_values(c, "attention_paged pages", pages,
	                                k_pool->ne[2] / page_size)) ||
	    (st = q4kh_cpu_index_values(c, "attention_paged pos", pos, pages->ne[0] * page_size)))
		return st;
	*pos_at = (const int32_t *)q4kh_cpu_at(pos, 0, 0, 0);
	*pages_at = (const int32_t *)q4kh_cpu_at(pages, 0, 0, 0);
	*last = 0;
	for (int64_t t = 0; t < q->ne[2]; t++)
		*last = (*pos_at)[t] > *last ? (*pos_at)[t] : *last;
	return Q4KH_OK;
}

/* A buffer struct for DATA, or Q4KH_ERR_NOMEM with WHAT's line. */
static q4kh_status new_buffer(const struct q4kh_check *c, const char *what, uint64_t size,
                              unsigned char *data, int wrapped, q4kh_buffer **out)
{
	q4kh_buffer *buf = data ? calloc(1, sizeof(*buf)) : NULL;

	if (!buf)
		return q4kh_backend_fail(c->msg, c->cap, Q4KH_ERR_NOMEM,
		                         "%s: cannot allocate %llu bytes", what,
		                         (unsigned long long)size);
	*buf = (q4kh_buffer){ device_of(c), size, data, wrapped };
	*out = buf;
	return Q4KH_OK;
}

q4kh_status q4kh_cpu_buffer_alloc(const struct q4kh_check *c, uint64_t size,
                                  q4kh_buffer **out)
{
	unsigned char *data;
	q4kh_status st;

	if (!c->dev)
		return Q4KH_ERR_INVALID;
	if (!out)
		return q4kh_backend_fail(c->msg, c->cap, Q4KH_ERR_INVALID,
		                         "buffer_alloc: out is NULL");
	*out = NULL;
	/* aligned_alloc wants a multiple of the alignment, and at least one. */
	if (size > UINT64_MAX - Q4KH_CPU_ALIGN || size + Q4KH_CPU_ALIGN > SIZE_MAX)
		return q4kh_backend_fail(c->msg, c->cap, Q4KH_ERR_NOMEM,
		                         "buffer_alloc: %llu bytes is more than this host can "
		                         "address",
		                         (unsigned long long)size);
	data = aligned_alloc(Q4KH_CPU_ALIGN,
	                     (size_t)((size + Q4KH_CPU_ALIGN) / Q4KH_CPU_ALIGN * Q4KH_CPU_ALIGN));
	st = new_buffer(c, "buffer_alloc", size, data, 0, out);
	if (st)
		free(data);
	return st;
}

q4kh_status q4kh_cpu_buffer_wrap(const struct q4kh_check *c, const void *host, uint64_t size,
                                 q4kh_buffer **out)
{
	if (!c->dev)
		return Q4KH_ERR_INVALID;
	if (!out || !host || (uintptr_t)host % 32)
		return q4kh_backend_fail(c->msg, c->cap, Q4KH_ERR_INVALID,
		                         "buffer_wrap: out %p, host %p: expected an out pointer "
		                         "and host memory aligned to 32 bytes",
		                         (void *)out, host);
	*out = NULL;
	return new_buffer(c, "buffer_wrap", size, (unsigned char *)(uintptr_t)host, 1, out);
}

void q4kh_cpu_buffer_free(q4kh_buffer *buf)
{
	if (!buf)
		return;
	if (!buf->wrapped)
		free(buf->data);
	free(buf);
}

q4kh_status q4kh_cpu_buffer_upload(const struct q4kh_check *c, q4kh_buffer *buf,
                                   uint64_t offset, const void *src, uint64_t size)
{
	q4kh_status st = q4kh_check_transfer(c, "buffer_upload", buf, offset, src, size);

	if (st)
		return st;
	if (buf->wrapped)
		return q4kh_backend_fail(c->msg, c->cap, Q4KH_ERR_INVALID,
		                         "buffer_upload: the buffer wraps read-only host memory "
		                         "(buffer_wrap)");
	if (size)
		memcpy(buf->data + offset, src, (size_t)size);
	return Q4KH_OK;
}

q4kh_status q4kh_cpu_buffer_download(const struct q4kh_check *c, q4kh_buffer *buf,
                                     uint64_t offset, void *dst, uint64_t size)
{
	q4kh_status st = q4kh_check_transfer(c, "buffer_download", buf, offset, dst, size);

	if (!st && size)
		memcpy(dst, buf->data + offset, (size_t)size);
	return st;
}

void *q4kh_cpu_buffer_address(const q4kh_buffer *buf)
{
	return buf ? buf->data : NULL;
}

q4kh_status q4kh_cpu_native_device(const struct q4kh_check *c, struct q4kh_native_device *out)
{
	const size_t v1_0 = offsetof(struct q4kh_native_device, address) + sizeof(out->address);

	if (!c->dev)
		return Q4KH_ERR_INVALID;
	if (!out || out->struct_size < v1_0)
		return q4kh_backend_fail(c->msg, c->cap, Q4KH_ERR_INVALID,
		                         "native_device: record of %u bytes, expected at least %zu",
		                         out ? out->struct_size : 0, v1_0);
	out->ordinal = -1;
	out->stream = NULL;
	out->address = q4kh_cpu_buffer_address;
	return Q4KH_OK;
}

int q4kh_cpu_scratch_init(struct q4kh_cpu_scratch *s, unsigned threads)
{
	*s = (struct q4kh_cpu_scratch){ calloc(threads, sizeof(*s->part)), threads, 0 };
	if (!s->part) {
		s->threads = 0;
		return -1;
	}
	return 0;
}

/* Free every part, keeping the slots. */
static void free_parts(struct q4kh_cpu_scratch *s)
{
	for (unsigned i = 0; i < s->threads; i++) {
		free(s->part[i]);
		s->part[i] = NULL;
	}
	s->size = 0;
}

q4kh_status q4kh_cpu_scratch_reserve(const struct q4kh_check *c, struct q4kh_cpu_scratch *s,
                                     uint64_t bytes)
{
	uint64_t size = (bytes + Q4KH_CPU_ALIGN - 1) / Q4KH_CPU_ALIGN * Q4KH_CPU_ALIGN;

	if (bytes <= s->size)
		return Q4KH_OK;
	free_parts(s);
	for (unsigned i = 0; i < s->threads; i++) {
		s->part[i] = aligned_alloc(Q4KH_CPU_ALIGN, size);
		if (!s->part[i]) {
			free_parts(s);
			return q4kh_backend_fail(c->msg, c->cap, Q4KH_ERR_NOMEM,
			                         "cannot allocate %u x %llu bytes of scratch",
			                         s->threads, (unsigned long long)size);
		}
	}
	s->size = size;
	return Q4KH_OK;
}

void q4kh_cpu_scratch_free(struct q4kh_cpu_scratch *s)
{
	if (s->part)
		free_parts(s);
	free(s->part);
	*s = (struct q4kh_cpu_scratch){ 0 };
}
