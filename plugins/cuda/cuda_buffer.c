/*
 * Device buffers. Uploads and downloads go through the device context's
 * stream, so they are ordered after every op issued before them, and wait
 * for their own copy: the host's memory is free (upload) or filled
 * (download) when they return.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda.h"

q4kh_status cuda_buffer_alloc(q4kh_device_ctx *dev, uint64_t size,
                              q4kh_buffer **out)
{
	q4kh_buffer *buf;
	q4kh_status st;
	char what[96];

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!out)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "buffer_alloc: out is NULL");
	*out = NULL;
	if ((st = cuda_enter(dev, "buffer_alloc")))
		return st;
	buf = calloc(1, sizeof(*buf));
	if (!buf)
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                 "buffer_alloc: out of host memory");
	snprintf(what, sizeof(what), "buffer_alloc: cudaMalloc of %llu bytes",
	         (unsigned long long)size);
	/* cudaMalloc(0) gives no pointer; a 0-byte buffer still needs one. */
	if (size > SIZE_MAX)
		st = cuda_check(dev, cudaErrorMemoryAllocation, what);
	else
		st = cuda_check(dev, cudaMalloc((void **)&buf->ptr,
		                                size ? (size_t)size : 1),
		                what);
	if (st) {
		free(buf);
		return st;
	}
	buf->dev = dev;
	buf->size = size;
	*out = buf;
	return Q4KH_OK;
}

void cuda_buffer_free(q4kh_device_ctx *dev, q4kh_buffer *buf)
{
	if (!buf)
		return;
	/* Queued ops may still use the memory. */
	if (dev && cudaSetDevice(dev->ordinal) == cudaSuccess &&
	    cudaStreamSynchronize(dev->stream) == cudaSuccess)
		cudaFree(buf->ptr);
	cudaGetLastError();
	free(buf);
}

/* The checks shared by upload and download. */
static q4kh_status check_transfer(q4kh_device_ctx *dev, const char *what,
                                  q4kh_buffer *buf, uint64_t offset,
                                  const void *host, uint64_t size)
{
	const struct q4kh_check c = cuda_contract(dev);
	q4kh_status st;

	if ((st = cuda_not_recording(dev, what)) ||
	    (st = q4kh_check_transfer(&c, what, buf, offset, host, size)))
		return st;
	return cuda_enter(dev, what);
}

/* Copy on the stream and wait for it (and so for every op before it). */
static q4kh_status transfer(q4kh_device_ctx *dev, const char *what, void *dst,
                            const void *src, uint64_t size,
                            enum cudaMemcpyKind kind)
{
	q4kh_status st;

	if (size && (st = cuda_check(dev,
	                             cudaMemcpyAsync(dst, src, (size_t)size, kind,
	                                             dev->stream),
	                             what)))
		return st;
	return cuda_wait(dev, what);
}

q4kh_status cuda_buffer_upload(q4kh_device_ctx *dev, q4kh_buffer *buf,
                               uint64_t offset, const void *src,
                               uint64_t size)
{
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = check_transfer(dev, "buffer_upload", buf, offset, src, size)))
		return st;
	return transfer(dev, "buffer_upload", buf->ptr + offset, src, size,
	                cudaMemcpyHostToDevice);
}

q4kh_status cuda_buffer_download(q4kh_device_ctx *dev, q4kh_buffer *buf,
                                 uint64_t offset, void *dst, uint64_t size)
{
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = check_transfer(dev, "buffer_download", buf, offset, dst, size)))
		return st;
	return transfer(dev, "buffer_download", dst, buf->ptr + offset, size,
	                cudaMemcpyDeviceToHost);
}
