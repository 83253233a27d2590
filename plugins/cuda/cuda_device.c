/*
 * Devices: their records, the device context (one stream, a staging
 * buffer for ids and positions, the fault words of the kernels' index
 * checks, attention's scratch), synchronisation, and the native handles
 * lent to kernel variants. Device index i is CUDA device ordinal i (after
 * CUDA_VISIBLE_DEVICES).
 *
 * A device's first prompt would pay for cuBLAS's start (its library
 * context, the handle's allocations) in its first product on tensor
 * cores, and for loading each kernel at its first launch (CUDA loads
 * modules lazily): device_open starts a thread that makes the handle and
 * loads the step's kernels while the host uploads the weights, work that
 * a bench's warm-up pass would otherwise hide. What it leaves undone, the
 * first step does as before.
 */
#include "buildconf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "q4khost/backend_base.h"
#include "q4khost/cuda_tc.h"

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

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (index >= (uint32_t)ctx->n_devices)
		return no_device(ctx, "device_info", index);
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
	/* No byte beyond what the host's record holds. */
	return q4kh_backend_put_record(&rec, out, ctx->error, sizeof(ctx->error));
}

q4kh_status cuda_enter(q4kh_device_ctx *dev, const char *what)
{
	char where[64];

	snprintf(where, sizeof(where), "%s: cudaSetDevice(%d)", what,
	         dev->ordinal);
	return cuda_check(dev, cudaSetDevice(dev->ordinal), where);
}

void cuda_signals_block(sigset_t *old)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, old);
}

void cuda_signals_restore(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* The kernels a step launches, by file (cuda_kernels.h). */
static cudaError_t (*const preloads[])(void) = {
	cuda_gemv_preload,      cuda_matmul_preload,    cuda_rowwise_preload,
	cuda_elementwise_preload, cuda_attention_preload, cuda_flash_preload,
	cuda_top2_preload,
};

/* The warm-up thread: dev->blas, or NULL when it could not be made (the
 * first product on tensor cores tries again and names the failure); then
 * the tensor-core kernels and the step's, whose errors their launches
 * report. */
static void *warm_main(void *arg)
{
	q4kh_device_ctx *dev = arg;

	if (q4kh_tc_warm(dev->ordinal, &dev->blas))
		return NULL;
	for (size_t i = 0; i < sizeof(preloads) / sizeof(preloads[0]); i++)
		preloads[i]();
	cudaGetLastError();
	return NULL;
}

/* Start the warm-up thread; without one, the handle is made when needed. */
static void warm_start(q4kh_device_ctx *dev)
{
	sigset_t old;

	cuda_signals_block(&old);
	dev->warming = pthread_create(&dev->warm, NULL, warm_main, dev) == 0;
	cuda_signals_restore(&old);
}

void cuda_warm_join(q4kh_device_ctx *dev)
{
	if (!dev->warming)
		return;
	pthread_join(dev->warm, NULL);
	dev->warming = 0;
}

void cuda_device_close(q4kh_device_ctx *dev)
{
	if (!dev)
		return;
	cuda_warm_join(dev);
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
		cuda_ring_free(dev->ring);
		for (int i = 0; i < 2; i++)
			if (dev->timer[i])
				cudaEventDestroy(dev->timer[i]);
		cudaFree(dev->stage);
		cudaFree(dev->fault);
		cudaFreeHost(dev->fault_seen);
		cudaFree(dev->scratch);
		q4kh_tc_close(dev->blas);
	}
	for (void *p; (p = q4kh_retired_pop(&dev->retired));)
		cudaFree(p);
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
	if ((st = cuda_check(dev, cudaStreamCreateWithFlags(&dev->stream,
	                                                    cudaStreamNonBlocking),
	                     "device_open: cudaStreamCreateWithFlags")) ||
	    (st = cuda_check(dev, cudaMalloc((void **)&dev->stage,
	                                     STAGE_FIRST * sizeof(int32_t)),
	                     "device_open: cudaMalloc (staging)")) ||
	    (st = cuda_check(dev, cudaMalloc((void **)&dev->fault,
	                                     CUDA_FAULT_WORDS * sizeof(int32_t)),
	                     "device_open: cudaMalloc (fault words)")) ||
	    (st = cuda_check(dev, cudaMemsetAsync(dev->fault, 0,
	                                          CUDA_FAULT_WORDS * sizeof(int32_t),
	                                          dev->stream),
	                     "device_open: cudaMemsetAsync (fault words)")) ||
	    (st = cuda_check(dev, cudaMallocHost((void **)&dev->fault_seen,
	                                         CUDA_FAULT_WORDS * sizeof(int32_t)),
	                     "device_open: cudaMallocHost (fault words)")) ||
	    (st = cuda_check(dev, cudaDeviceGetAttribute(&dev->sms,
	                                                 cudaDevAttrMultiProcessorCount,
	                                                 dev->ordinal),
	                     "device_open: cudaDeviceGetAttribute")) ||
	    (st = cuda_check(dev, cudaDeviceGetAttribute(&dev->cc_major,
	                                                 cudaDevAttrComputeCapabilityMajor,
	                                                 dev->ordinal),
	                     "device_open: cudaDeviceGetAttribute (compute capability)")))
		goto fail;
	dev->stage_n = STAGE_FIRST;
	dev->pdl = ctx->pdl && dev->cc_major >= 9;
	warm_start(dev);
	cuda_log(ctx, Q4KH_LOG_DEBUG, "cuda: device %u open, programmatic dependent launch %s",
	         index, dev->pdl ? "on" : ctx->pdl ? "off (compute capability before 9.0)"
	                                            : "off ([plugin.cuda] pdl = 0)");
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

/* What a fault code's index tensor is called in messages. */
static const char *fault_name(int32_t code)
{
	switch (code) {
	case CUDA_FAULT_GET_ROWS_IDS:
		return "get_rows_ext ids";
	case CUDA_FAULT_ROPE_POS:
		return "rope_ext pos";
	case CUDA_FAULT_SET_ROWS_ROWS:
		return "set_rows rows";
	case CUDA_FAULT_ATTENTION_POS:
		return "attention_ext pos";
	case CUDA_FAULT_MUL_MAT_ID_IDS:
		return "mul_mat_id ids";
	case CUDA_FAULT_ATTENTION_PAGES:
		return "attention_paged pages";
	default:
		return "an index tensor";
	}
}

q4kh_status cuda_wait(q4kh_device_ctx *dev, const char *what)
{
	const size_t bytes = CUDA_FAULT_WORDS * sizeof(int32_t);
	const int32_t *f = dev->fault_seen;
	char where[96];
	q4kh_status st;

	snprintf(where, sizeof(where), "%s: an op failed on the device", what);
	if ((st = cuda_check(dev, cudaMemcpyAsync(dev->fault_seen, dev->fault,
	                                          bytes, cudaMemcpyDeviceToHost,
	                                          dev->stream),
	                     where)) ||
	    (st = cuda_check(dev, cudaStreamSynchronize(dev->stream), where)))
		return st;
	if (f[0] == CUDA_FAULT_NONE)
		return Q4KH_OK;
	st = cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
	               "%s: %s[%d] = %d, expected 0 .. %d (found on the device; "
	               "the op skipped that element)",
	               what, fault_name(f[0]), f[1], f[2], f[3] - 1);
	/* On the stream: the next wait's copy reads the cleared words. */
	snprintf(where, sizeof(where), "%s: clearing the fault words", what);
	cuda_check(dev, cudaMemsetAsync(dev->fault, 0, bytes, dev->stream), where);
	dev->fault_seen[0] = CUDA_FAULT_NONE;
	return st;
}

q4kh_status cuda_scratch(q4kh_device_ctx *dev, const char *what, size_t size)
{
	struct q4kh_retired *r;
	char where[96];
	void *p;
	q4kh_status st;

	if (size <= dev->scratch_size)
		return Q4KH_OK;
	snprintf(where, sizeof(where), "%s: %zu bytes of scratch memory", what,
	         size);
	if (dev->recording) /* no allocation can be recorded */
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                 "%s: not while recording a graph", where);
	if (q4kh_retired_reserve(dev->scratch, &r))
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM, "%s: out of memory", where);
	if ((st = cuda_check(dev, cudaMalloc(&p, size), where))) {
		free(r);
		return st;
	}
	/* zero: attention keeps counters there that its launches leave at 0 */
	if ((st = cuda_check(dev, cudaMemsetAsync(p, 0, size, dev->stream), where))) {
		cudaFree(p);
		free(r);
		return st;
	}
	q4kh_retire(&dev->retired, r, dev->scratch);
	dev->scratch = p;
	dev->scratch_size = size;
	return Q4KH_OK;
}

q4kh_status cuda_synchronize(q4kh_device_ctx *dev)
{
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_not_recording(dev, "synchronize")) ||
	    (st = cuda_enter(dev, "synchronize")))
		return st;
	return cuda_wait(dev, "synchronize");
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
	/* a record up to parallel (ABI 1.3) at least; flags (1.9) where the
	 * host's record has it */
	if (!out || out->struct_size < offsetof(struct q4kh_native_device, flags))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "native_device: record of %u bytes, expected %zu or more",
		                 out ? out->struct_size : 0,
		                 offsetof(struct q4kh_native_device, flags));
	out->ordinal = dev->ordinal;
	out->stream = dev->stream;
	out->address = cuda_address;
	if (out->struct_size >= offsetof(struct q4kh_native_device, flags) + sizeof(out->flags))
		out->flags = dev->pdl ? Q4KH_NATIVE_CUDA_PDL : 0;
	return Q4KH_OK;
}
