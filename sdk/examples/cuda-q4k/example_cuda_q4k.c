/*
 * example-cuda-q4k: a Q4_K kernel variant for q4khost's "cuda" backend,
 * built out of tree against the installed SDK (Makefile beside this file,
 * docs/plugin-abi.md). This half is plain C: the descriptor, the table and
 * the argument checks; the kernel is in example_cuda_q4k_kernels.cu.
 *
 * The backend lends what the variant needs through struct
 * q4kh_native_device: the CUDA device ordinal, the stream to enqueue on
 * (work stays in the backend's order, no synchronisation here) and
 * address(), the device pointer of a backend buffer. Weights are used in
 * place: prepare() only records where they are.
 *
 * gemm, a prompt's product, goes to the SDK's tensor-core products
 * (q4khost/cuda_tc.h, pkg-config q4khost-plugin-cuda) from
 * Q4KH_TC_MIN_COLUMNS columns on: one cuBLAS handle and one scratch buffer
 * per device, kept until shutdown. Outgrown scratch goes on the SDK's
 * retired list (q4khost/cuda_retired.h), since a CUDA graph the backend
 * recorded may still point at it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include <q4khost/cuda_retired.h>
#include <q4khost/cuda_tc.h>
#include <q4khost/plugin.h>

#include "example_cuda_q4k.h"

#define NAME "example-cuda-q4k"
#define ERROR_LEN 512
/* CUDA devices whose gemm may use tensor cores (ordinals 0 .. 15). */
#define TC_DEVICES 16

#ifndef PLUGIN_VERSION
#define PLUGIN_VERSION "0"
#endif
#ifndef BUILD_ID
#define BUILD_ID "unknown"
#endif

/* What gemm keeps per device for the tensor cores. */
struct tc_device {
	void *blas;                   /* q4kh_tc_open's handle, or NULL */
	void *scratch;                /* device memory, or NULL */
	size_t size;                  /* bytes at scratch */
	struct q4kh_retired *retired; /* outgrown scratch, freed at shutdown */
};

struct q4kh_kernel_ctx {
	char error[ERROR_LEN];
	struct tc_device tc[TC_DEVICES];
};

struct q4kh_prepared {
	const uint8_t *rows; /* device address of row 0 */
	int64_t k, n, row_bytes;
};

static _Thread_local char init_error[ERROR_LEN];

/* Keep the message for last_error() and return st: plugins never print. */
__attribute__((format(printf, 3, 4))) static q4kh_status
fail(q4kh_kernel_ctx *ctx, q4kh_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ctx ? ctx->error : init_error, ERROR_LEN, fmt, ap);
	va_end(ap);
	return st;
}

static q4kh_status k_init(const struct q4kh_host_api *host,
                          q4kh_kernel_ctx **out)
{
	if (!host || !out)
		return fail(NULL, Q4KH_ERR_INVALID, "init: %s is NULL",
		            host ? "out" : "host");
	*out = NULL;
	if (host->abi_major != Q4KH_ABI_MAJOR)
		return fail(NULL, Q4KH_ERR_UNSUPPORTED,
		            "init: host ABI major %u, plugin built for %d",
		            host->abi_major, Q4KH_ABI_MAJOR);
	*out = calloc(1, sizeof(**out));
	return *out ? Q4KH_OK : fail(NULL, Q4KH_ERR_NOMEM, "init: out of memory");
}

static void k_shutdown(q4kh_kernel_ctx *ctx)
{
	if (!ctx)
		return;
	for (int i = 0; i < TC_DEVICES; i++) {
		struct tc_device *d = &ctx->tc[i];

		if (!d->blas && !d->scratch)
			continue;
		cudaSetDevice(i);
		q4kh_tc_close(d->blas);
		cudaFree(d->scratch);
		for (void *p; (p = q4kh_retired_pop(&d->retired));)
			cudaFree(p);
	}
	free(ctx);
}

static const char *k_last_error(q4kh_kernel_ctx *ctx)
{
	return ctx ? ctx->error : init_error;
}

/*
 * Q4_K on compute capability 7.5 and later (warp shuffles with masks and
 * the GPUs the Makefile builds for); a low score, so the tuned in-tree
 * variants stay preferred. dev->arch is "sm_XY".
 */
static uint32_t k_score(q4kh_kernel_ctx *ctx,
                        const struct q4kh_device_record *dev, uint32_t type)
{
	unsigned cc;

	(void)ctx;
	if (type != Q4KH_TYPE_Q4_K || sscanf(dev->arch, "sm_%u", &cc) != 1)
		return 0;
	return cc >= 75 ? 1 : 0;
}

static q4kh_status k_prepare(q4kh_kernel_ctx *ctx,
                             const struct q4kh_native_device *dev,
                             const struct q4kh_tensor *w, q4kh_prepared **out)
{
	struct q4kh_prepared *p;

	if (w->type != Q4KH_TYPE_Q4_K || w->ne[0] <= 0 || w->ne[0] % Q4KH_QK_K ||
	    w->ne[1] <= 0 || w->ne[2] != 1 || w->ne[3] != 1)
		return fail(ctx, Q4KH_ERR_UNSUPPORTED,
		            "prepare: type %u {%lld, %lld, %lld, %lld}: only 2-D Q4_K "
		            "weights with K a multiple of 256",
		            w->type, (long long)w->ne[0], (long long)w->ne[1],
		            (long long)w->ne[2], (long long)w->ne[3]);
	if (!dev || !dev->address)
		return fail(ctx, Q4KH_ERR_INVALID,
		            "prepare: the backend lends no buffer addresses");
	p = malloc(sizeof(*p));
	if (!p)
		return fail(ctx, Q4KH_ERR_NOMEM, "prepare: out of memory");
	p->rows = (const uint8_t *)dev->address(w->buffer) + w->offset;
	p->k = w->ne[0];
	p->n = w->ne[1];
	p->row_bytes = w->nb[1];
	*out = p;
	return Q4KH_OK;
}

/* Is t an f32 matrix of ROWS values per column, columns nb[1] apart? */
static int f32_columns(const struct q4kh_tensor *t, int64_t rows)
{
	return t->type == Q4KH_TYPE_F32 && t->ne[0] == rows && t->ne[1] >= 1 &&
	       t->ne[2] == 1 && t->ne[3] == 1 && t->nb[0] == 4 &&
	       t->nb[1] >= rows * 4 && t->nb[1] % 4 == 0;
}

static q4kh_status k_apply(q4kh_kernel_ctx *ctx,
                           const struct q4kh_native_device *dev,
                           q4kh_prepared *w, const struct q4kh_tensor *x,
                           const struct q4kh_tensor *y)
{
	const uint8_t *xb, *yb;

	if (!f32_columns(x, w->k) || !f32_columns(y, w->n) || y->ne[1] != x->ne[1])
		return fail(ctx, Q4KH_ERR_INVALID,
		            "gemv/gemm: expected f32 x {%lld, T} and y {%lld, T} with "
		            "contiguous columns; found x type %u {%lld, %lld}, y type %u "
		            "{%lld, %lld}",
		            (long long)w->k, (long long)w->n, x->type,
		            (long long)x->ne[0], (long long)x->ne[1], y->type,
		            (long long)y->ne[0], (long long)y->ne[1]);
	xb = (const uint8_t *)dev->address(x->buffer) + x->offset;
	yb = (const uint8_t *)dev->address(y->buffer) + y->offset;
	if (ex_q4k_launch(dev->ordinal, dev->stream, w->rows, w->k, w->n,
	                  w->row_bytes, (const float *)xb, x->nb[1] / 4,
	                  (float *)yb, y->nb[1] / 4, x->ne[1], ctx->error,
	                  sizeof(ctx->error)))
		return Q4KH_ERR_DEVICE;
	return Q4KH_OK;
}

/*
 * D's scratch grown to BYTES for work on stream S. The old buffer is
 * retired, not freed. cudaMalloc is no stream operation, but the backend
 * records its steps in the capture's thread-local mode, which refuses it:
 * while S is capturing, the thread allocates in the relaxed mode.
 */
static q4kh_status tc_scratch(q4kh_kernel_ctx *ctx, struct tc_device *d, size_t bytes,
                              cudaStream_t s)
{
	enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
	enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	struct q4kh_retired *node;
	void *p = NULL;
	cudaError_t e;

	if (d->size >= bytes)
		return Q4KH_OK;
	if (q4kh_retired_reserve(d->scratch, &node))
		return fail(ctx, Q4KH_ERR_NOMEM, "gemm: out of host memory");
	cudaStreamIsCapturing(s, &capture);
	if (capture == cudaStreamCaptureStatusActive)
		cudaThreadExchangeStreamCaptureMode(&mode);
	e = cudaMalloc(&p, bytes);
	if (capture == cudaStreamCaptureStatusActive)
		cudaThreadExchangeStreamCaptureMode(&mode);
	if (e != cudaSuccess) {
		free(node);
		return fail(ctx, e == cudaErrorMemoryAllocation ? Q4KH_ERR_NOMEM : Q4KH_ERR_DEVICE,
		            "gemm: %zu bytes of scratch: cudaMalloc: %s (%s)", bytes,
		            cudaGetErrorName(e), cudaGetErrorString(e));
	}
	q4kh_retire(&d->retired, node, d->scratch);
	d->scratch = p;
	d->size = bytes;
	return Q4KH_OK;
}

/* y = W x on the tensor cores of the lent device, with its handle and
 * scratch; x and y checked by the caller. */
static q4kh_status tc_gemm(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                           q4kh_prepared *w, const struct q4kh_tensor *x,
                           const struct q4kh_tensor *y)
{
	struct tc_device *d = &ctx->tc[dev->ordinal];
	const int64_t t = x->ne[1];
	const uint8_t *xb = (const uint8_t *)dev->address(x->buffer) + x->offset;
	uint8_t *yb = (uint8_t *)dev->address(y->buffer) + y->offset;
	char why[256];
	cudaError_t e = cudaSetDevice(dev->ordinal);
	q4kh_status st;

	if (e != cudaSuccess)
		return fail(ctx, Q4KH_ERR_DEVICE, "gemm: cudaSetDevice(%d): %s", dev->ordinal,
		            cudaGetErrorName(e));
	if (!d->blas && q4kh_tc_open(&d->blas, why, sizeof(why)))
		return fail(ctx, Q4KH_ERR_DEVICE, "gemm: %s", why);
	st = tc_scratch(ctx, d, q4kh_tc_scratch_bytes(w->k, w->n, t), (cudaStream_t)dev->stream);
	if (st)
		return st;
	if (q4kh_tc_gemm(d->blas, Q4KH_TYPE_Q4_K, w->rows, w->row_bytes, w->k, w->n,
	                 (const float *)xb, x->nb[1] / 4, (float *)yb, y->nb[1] / 4, t,
	                 d->scratch, (cudaStream_t)dev->stream, why, sizeof(why)))
		return fail(ctx, Q4KH_ERR_DEVICE, "gemm: %s", why);
	return Q4KH_OK;
}

/* A prompt's many columns on tensor cores, fewer through gemv's kernel. */
static q4kh_status k_gemm(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                          q4kh_prepared *w, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *y)
{
	if (dev->ordinal < 0 || dev->ordinal >= TC_DEVICES ||
	    !q4kh_tc_wanted(Q4KH_TYPE_Q4_K, x->ne[1], Q4KH_TC_MIN_COLUMNS) ||
	    !f32_columns(x, w->k) || !f32_columns(y, w->n) || y->ne[1] != x->ne[1])
		return k_apply(ctx, dev, w, x, y);
	return tc_gemm(ctx, dev, w, x, y);
}

static void k_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w)
{
	(void)ctx;
	free(w);
}

static const uint32_t types[] = { Q4KH_TYPE_Q4_K };

static const struct q4kh_kernel_v1 table = {
	.struct_size = sizeof(table),
	.n_types = 1,
	.backend = "cuda",
	.types = types,
	.max_gemv_columns = 8,
	.init = k_init,
	.shutdown = k_shutdown,
	.last_error = k_last_error,
	.score = k_score,
	.prepare = k_prepare,
	.gemv = k_apply,
	.gemm = k_gemm,
	.release = k_release,
	/* The arithmetic F2 holds it to (docs/plugin-abi.md): gemv in
	 * float, but a prompt's gemm with fp16 activations and weights. */
	.arith = Q4KH_ARITH_F16,
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_KERNEL,
	.name = NAME,
	.version = PLUGIN_VERSION,
	.vendor = "q4khost SDK example",
	.license = "MIT",
	.build_id = BUILD_ID,
	.kernel = &table,
};

/* The one symbol the plugin exports (-fvisibility=hidden hides the rest). */
Q4KH_PLUGIN_ENTRY(desc)
