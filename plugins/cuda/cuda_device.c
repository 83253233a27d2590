/*
 * Devices: their records, the device context (one stream, a staging
 * buffer for ids and positions), synchronisation, and the native handles
 * lent to kernel variants. Device index i is CUDA device ordinal i (after
 * CUDA_VISIBLE_DEVICES).
 */
#include "buildconf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"

/* Int32 values the staging buffer first holds (a long prompt's ids). */
#define STAGE_FIRST 4096

q4kh_status cuda_device_count(q4kh_backend_ctx *ctx, uint32_t *count)
{
	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!count)
		return cuda_fail(ctx, Q4KH_ERR_INVALID, "device_count: count is NULL");
	*count = (uint32_t)ctx->n_devices;
	return Q4KH_OK;
}

static q4kh_status no_device(q4kh_backend_ctx *ctx, const char *what,
                             uint32_t index)
{
	if (ctx->n_devices == 0)
		return cuda_fail(ctx, Q4KH_ERR_INVALID,
		                 "%s: no device %u (the cuda backend has 0: %s)", what,
		                 index, ctx->no_devices);
	return cuda_fail(ctx, Q4KH_ERR_INVALID,
	                 "%s: no device %u (the cuda backend has %d)", what, index,
	                 ctx->n_devices);
}

/* nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
static void format_uuid(const unsigned char b[16], char *out, size_t size)
{
	static const int dash_after[] = { 3, 5, 7, 9 };
	size_t used = (size_t)snprintf(out, size, "GPU-");

	for (int i = 0, d = 0; i < 16 && used < size; i++) {
		used += (size_t)snprintf(out + used, size - used, "%02x", b[i]);
		if (d < 4 && i == dash_after[d] && used < size) {
			used += (size_t)snprintf(out + used, size - used, "-");
			d++;
		}
	}
}

q4kh_status cuda_device_info(q4kh_backend_ctx *ctx, uint32_t index,
                             struct q4kh_device_record *out)
{
	struct q4kh_device_record rec;
	struct cudaDeviceProp prop;
	cudaError_t e;
	uint32_t size;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!out)
		return cuda_fail(ctx, Q4KH_ERR_INVALID, "device_info: out is NULL");
	if (index >= (uint32_t)ctx->n_devices)
		return no_device(ctx, "device_info", index);
	if (out->struct_size < sizeof(rec.struct_size))
		return cuda_fail(ctx, Q4KH_ERR_INVALID,
		                 "device_info: out->struct_size %u is too small",
		                 out->struct_size);
	e = cudaGetDeviceProperties(&prop, (int)index);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return cuda_fail(ctx, Q4KH_ERR_DEVICE,
		                 "device_info: cudaGetDeviceProperties(%u): %s (%s)",
		                 index, cudaGetErrorString(e), cudaGetErrorName(e));
	}
	memset(&rec, 0, sizeof(rec));
	rec.index = index;
	snprintf(rec.name, sizeof(rec.name), "%.127s", prop.name);
	format_uuid((const unsigned char *)prop.uuid.bytes, rec.uuid,
	            sizeof(rec.uuid));
	snprintf(rec.arch, sizeof(rec.arch), "sm_%d%d", prop.major, prop.minor);
	cuda_driver_version(rec.driver_version, sizeof(rec.driver_version));
	rec.memory_bytes = prop.totalGlobalMem;
	rec.multiprocessors = (uint32_t)prop.multiProcessorCount;
	/* Write no byte beyond what the host's record holds. */
	size = out->struct_size < sizeof(rec) ? out->struct_size : sizeof(rec);
	rec.struct_size = size;
	memcpy(out, &rec, size);
	return Q4KH_OK;
}

q4kh_status cuda_enter(q4kh_device_ctx *dev, const char *what)
{
	char where[64];

	snprintf(where, sizeof(where), "%s: cudaSetDevice(%d)", what,
	         dev->ordinal);
	return cuda_check(dev, cudaSetDevice(dev->ordinal), where);
}

void cuda_device_close(q4kh_device_ctx *dev)
{
	if (!dev)
		return;
	if (cudaSetDevice(dev->ordinal) == cudaSuccess) {
		if (dev->stream) {
			if (dev->recording) {
				cudaGraph_t g = NULL;

				if (cudaStreamEndCapture(dev->stream, &g) == cudaSuccess)
					cudaGraphDestroy(g);
			}
			cudaStreamSynchronize(dev->stream);
			cudaStreamDestroy(dev->stream);
		}
		for (int i = 0; i < 2; i++)
			if (dev->timer[i])
				cudaEventDestroy(dev->timer[i]);
		cudaFree(dev->stage);
	}
	cudaGetLastError();
	free(dev);
}

q4kh_status cuda_device_open(q4kh_backend_ctx *ctx, uint32_t index,
                             q4kh_device_ctx **out)
{
	q4kh_device_ctx *dev;
	cudaError_t e;
	q4kh_status st;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!out)
		return cuda_fail(ctx, Q4KH_ERR_INVALID, "device_open: out is NULL");
	*out = NULL;
	if (index >= (uint32_t)ctx->n_devices)
		return no_device(ctx, "device_open", index);
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return cuda_fail(ctx, Q4KH_ERR_NOMEM, "device_open: out of memory");
	dev->ctx = ctx;
	dev->ordinal = (int)index;
	if ((st = cuda_enter(dev, "device_open")))
		goto fail;
	e = cuda_kernels_runnable();
	if (e != cudaSuccess) {
		struct q4kh_device_record rec = { .struct_size = sizeof(rec) };

		cudaGetLastError();
		cuda_device_info(ctx, index, &rec);
		st = cuda_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		               "device_open: device %u (%s, %s) cannot run this "
		               "build's kernels, built for %s: %s (%s)",
		               index, rec.name, rec.arch, Q4KH_CUDA_ARCHS,
		               cudaGetErrorString(e), cudaGetErrorName(e));
		goto fail;
	}
	if ((st = cuda_check(dev, cudaDeviceGetAttribute(&dev->sms,
	                                                 cudaDevAttrMultiProcessorCount,
	                                                 dev->ordinal),
	                     "device_open: cudaDeviceGetAttribute")) ||
	    (st = cuda_check(dev, cudaStreamCreateWithFlags(&dev->stream,
	                                                    cudaStreamNonBlocking),
	                     "device_open: cudaStreamCreateWithFlags")) ||
	    (st = cuda_check(dev, cudaMalloc((void **)&dev->stage,
	                                     STAGE_FIRST * sizeof(int32_t)),
	                     "device_open: cudaMalloc (staging)")))
		goto fail;
	dev->stage_n = STAGE_FIRST;
	cuda_log(ctx, Q4KH_LOG_DEBUG, "cuda: device %u open", index);
	*out = dev;
	return Q4KH_OK;
fail:
	cuda_device_close(dev);
	return st;
}

q4kh_status cuda_stage(q4kh_device_ctx *dev, const char *what,
                       const int32_t *values, int64_t n)
{
	char where[64];
	q4kh_status st;

	/* A recording would replay these values, not the next call's. */
	if ((st = cuda_not_recording(dev, what)))
		return st;
	if (n > dev->stage_n) {
		int64_t want = n > 2 * dev->stage_n ? n : 2 * dev->stage_n;

		/* Ops already enqueued may still read the old buffer. */
		snprintf(where, sizeof(where), "%s: growing the staging buffer", what);
		if ((st = cuda_check(dev, cudaStreamSynchronize(dev->stream), where)))
			return st;
		cudaFree(dev->stage);
		dev->stage = NULL;
		dev->stage_n = 0;
		if ((st = cuda_check(dev,
		                     cudaMalloc((void **)&dev->stage,
		                                (size_t)want * sizeof(int32_t)),
		                     where)))
			return st;
		dev->stage_n = want;
	}
	snprintf(where, sizeof(where), "%s: cudaMemcpyAsync (staging)", what);
	return cuda_check(dev,
	                  cudaMemcpyAsync(dev->stage, values,
	                                  (size_t)n * sizeof(int32_t),
	                                  cudaMemcpyHostToDevice, dev->stream),
	                  where);
}

q4kh_status cuda_synchronize(q4kh_device_ctx *dev)
{
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_not_recording(dev, "synchronize")) ||
	    (st = cuda_enter(dev, "synchronize")))
		return st;
	return cuda_check(dev, cudaStreamSynchronize(dev->stream),
	                  "synchronize: an op failed on the device");
}

static void *cuda_address(const q4kh_buffer *buf)
{
	return buf ? buf->ptr : NULL;
}

q4kh_status cuda_native_device(q4kh_device_ctx *dev,
                               struct q4kh_native_device *out)
{
	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!out || out->struct_size < sizeof(*out))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "native_device: record of %u bytes, expected %zu",
		                 out ? out->struct_size : 0, sizeof(*out));
	out->ordinal = dev->ordinal;
	out->stream = dev->stream;
	out->address = cuda_address;
	return Q4KH_OK;
}
