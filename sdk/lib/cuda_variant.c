/*
 * The kernel-variant table shared by the CUDA variants: init and the warps
 * setting, score, and the checks around prepare, gemv, gemm and release.
 * Every CUDA call is checked; work goes on the host's stream and nothing
 * here waits for the device (release and shutdown excepted: cudaFree).
 * The context also owns apply()'s device scratch (cuda_variant_scratch.c).
 */
#include "buildconf.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/cuda_tc.h"
#include "q4khost/cuda_variant.h"

/* Largest K and N accepted: kernel indices stay in 32 bits. */
#define Q4KH_CV_MAX_K ((int64_t)1 << 24)
#define Q4KH_CV_MAX_N ((int64_t)1 << 30)

/* Why the last init() on this thread failed (last_error(NULL)). */
static __thread char init_error[512];

q4kh_status q4kh_cv_fail(q4kh_kernel_ctx *ctx, q4kh_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ctx->error, sizeof(ctx->error), fmt, ap);
	va_end(ap);
	return st;
}

q4kh_status q4kh_cv_cuda(q4kh_kernel_ctx *ctx, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return Q4KH_OK;
	return q4kh_cv_fail(ctx,
	                    e == cudaErrorMemoryAllocation ? Q4KH_ERR_NOMEM
	                                              : Q4KH_ERR_DEVICE,
	                    "%s: %s (%s)", what, cudaGetErrorName(e),
	                    cudaGetErrorString(e));
}

__attribute__((format(printf, 2, 3)))
static q4kh_status init_fail(const struct q4kh_host_api *host, const char *fmt,
                             ...)
{
	va_list ap;
	int n;

	n = snprintf(init_error, sizeof(init_error), "%s: init: ", q4kh_cv_name);
	va_start(ap, fmt);
	vsnprintf(init_error + n, sizeof(init_error) - (size_t)n, fmt, ap);
	va_end(ap);
	if (host && Q4KH_HOST_HAS(host, log))
		host->log(host->host_data, Q4KH_LOG_ERROR, init_error);
	return Q4KH_ERR_INVALID;
}

/* [plugin.NAME] warps: 1, 2, 4 or 8, exactly as written. */
static int parse_warps(const char *s, int *out)
{
	static const char *const ok[] = { "1", "2", "4", "8" };

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (strcmp(s, ok[i]) == 0) {
			*out = 1 << i;
			return 0;
		}
	return -1;
}

q4kh_status q4kh_cv_init(const struct q4kh_host_api *host, q4kh_kernel_ctx **out)
{
	const char *warps = NULL;
	q4kh_kernel_ctx *ctx;
	int w = q4kh_cv_self.default_warps;

	if (!out)
		return init_fail(host, "out is NULL");
	*out = NULL;
	if (!host)
		return init_fail(NULL, "host API is NULL");
	if (host->abi_major != Q4KH_ABI_MAJOR)
		return init_fail(host, "host ABI major %u, plugin built for %d",
		                 host->abi_major, Q4KH_ABI_MAJOR);
	if (Q4KH_HOST_HAS(host, config_get))
		warps = host->config_get(host->host_data, "warps");
	if (warps && parse_warps(warps, &w))
		return init_fail(host,
		                 "[plugin.%s] warps = \"%s\": expected 1, 2, 4 or 8 "
		                 "(warps per thread block)",
		                 q4kh_cv_name, warps);
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		init_fail(host, "out of memory");
		return Q4KH_ERR_NOMEM;
	}
	ctx->host = host;
	ctx->warps = w;
	if (q4kh_cv_scratch_init(ctx)) {
		init_fail(host, "%s", ctx->error);
		free(ctx);
		return Q4KH_ERR_NOMEM;
	}
	*out = ctx;
	return Q4KH_OK;
}

void q4kh_cv_shutdown(q4kh_kernel_ctx *ctx)
{
	if (!ctx)
		return;
	q4kh_cv_scratch_free(ctx);
	free(ctx);
}

const char *q4kh_cv_last_error(q4kh_kernel_ctx *ctx)
{
	return ctx ? ctx->error : init_error;
}

static int implements(uint32_t type)
{
	for (uint32_t i = 0; i < q4kh_cv_table.n_types; i++)
		if (q4kh_cv_table.types[i] == type)
			return 1;
	return 0;
}

/* 90 for "sm_90", 120 for "sm_120a"; 0 for anything that is no sm_ arch. */
static uint32_t sm_of(const char *arch)
{
	uint32_t v = 0;
	const char *p;

	if (strncmp(arch, "sm_", 3) != 0)
		return 0;
	for (p = arch + 3; *p >= '0' && *p <= '9' && v < 10000; p++)
		v = v * 10 + (uint32_t)(*p - '0');
	return p == arch + 3 ? 0 : v;
}

uint32_t q4kh_cv_score(q4kh_kernel_ctx *ctx, const struct q4kh_device_record *dev,
                       uint32_t type)
{
	char arch[sizeof(dev->arch) + 1];

	(void)ctx;
	if (!dev || dev->struct_size < offsetof(struct q4kh_device_record, arch) +
	                                       sizeof(dev->arch) ||
	    !implements(type))
		return 0;
	memcpy(arch, dev->arch, sizeof(dev->arch));
	arch[sizeof(dev->arch)] = 0;
	return sm_of(arch) >= q4kh_cv_self.min_sm ? q4kh_cv_self.score : 0;
}

/* --- the device: set for the call, restored after ------------------------ */

static q4kh_status check_native(q4kh_kernel_ctx *ctx, const char *what,
                                const struct q4kh_native_device *dev)
{
	if (!dev)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "%s: native device is NULL",
		                    what);
	if (dev->struct_size < offsetof(struct q4kh_native_device, address) +
	                               sizeof(dev->address) ||
	    !dev->address)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: native device record of %u bytes lacks address()",
		                    what, dev->struct_size);
	if (dev->ordinal < 0)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: native device ordinal %d", what, dev->ordinal);
	return Q4KH_OK;
}

static q4kh_status enter(q4kh_kernel_ctx *ctx, const char *what, int ordinal,
                         int *prev)
{
	char where[96];
	q4kh_status st;

	snprintf(where, sizeof(where), "%s: cudaGetDevice", what);
	if ((st = q4kh_cv_cuda(ctx, cudaGetDevice(prev), where)))
		return st;
	snprintf(where, sizeof(where), "%s: cudaSetDevice(%d)", what, ordinal);
	return q4kh_cv_cuda(ctx, cudaSetDevice(ordinal), where);
}

static void leave(int prev)
{
	cudaSetDevice(prev);
}

/* --- prepare and release ------------------------------------------------- */

static q4kh_status check_weight(q4kh_kernel_ctx *ctx,
                                const struct q4kh_tensor *w)
{
	const char *tn;
	uint32_t be, bb;

	if (!w)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "prepare: w is NULL");
	tn = q4kh_type_name(w->type);
	if (!implements(w->type))
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		                    "prepare: w: type %u (%s) is not one %s implements",
		                    w->type, tn ? tn : "unknown", q4kh_cv_name);
	if (!w->buffer)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "prepare: w: buffer is NULL");
	be = q4kh_type_block_elems(w->type);
	bb = q4kh_type_block_bytes(w->type);
	if (w->ne[0] < be || w->ne[0] > Q4KH_CV_MAX_K || w->ne[0] % be)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "prepare: w: ne[0] = %lld, expected a multiple of %s's "
		                    "block of %u up to %lld",
		                    (long long)w->ne[0], tn, be, (long long)Q4KH_CV_MAX_K);
	if (w->ne[1] < 1 || w->ne[1] > Q4KH_CV_MAX_N || w->ne[2] != 1 ||
	    w->ne[3] != 1)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "prepare: w: shape {%lld, %lld, %lld, %lld}, expected "
		                    "{K, 1 .. 2^30, 1, 1}",
		                    (long long)w->ne[0], (long long)w->ne[1],
		                    (long long)w->ne[2], (long long)w->ne[3]);
	if (w->nb[0] != bb || w->nb[1] < w->ne[0] / be * bb)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "prepare: w: strides nb[0] = %lld, nb[1] = %lld, "
		                    "expected %u and at least %lld",
		                    (long long)w->nb[0], (long long)w->nb[1], bb,
		                    (long long)(w->ne[0] / be * bb));
	return Q4KH_OK;
}

static q4kh_status probe(q4kh_kernel_ctx *ctx, int ordinal)
{
	cudaError_t e = q4kh_cv_self.probe();

	if (e == cudaErrorNoKernelImageForDevice ||
	    e == cudaErrorInvalidDeviceFunction ||
	    e == cudaErrorUnsupportedPtxVersion) {
		cudaGetLastError();
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		                    "prepare: this build has no code for CUDA device %d "
		                    "(built for %s): %s",
		                    ordinal, Q4KH_CUDA_ARCHS, cudaGetErrorName(e));
	}
	return q4kh_cv_cuda(ctx, e, "prepare: cudaFuncGetAttributes");
}

q4kh_status q4kh_cv_prepare(q4kh_kernel_ctx *ctx,
                            const struct q4kh_native_device *dev,
                            const struct q4kh_tensor *w, q4kh_prepared **out)
{
	uint32_t be, bb;
	q4kh_prepared *p;
	q4kh_status st;
	int prev;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!out)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "prepare: out is NULL");
	*out = NULL;
	if ((st = check_native(ctx, "prepare", dev)) || (st = check_weight(ctx, w)))
		return st;
	p = calloc(1, sizeof(*p));
	if (!p)
		return q4kh_cv_fail(ctx, Q4KH_ERR_NOMEM, "prepare: out of memory");
	be = q4kh_type_block_elems(w->type);
	bb = q4kh_type_block_bytes(w->type);
	p->ordinal = dev->ordinal;
	p->type = w->type;
	p->k = w->ne[0];
	p->n = w->ne[1];
	p->buffer = w->buffer;
	p->begin = w->offset;
	p->end = w->offset + (uint64_t)((p->n - 1) * w->nb[1] + p->k / be * bb);
	p->src_stride = w->nb[1];
	p->src = dev->address(w->buffer);
	if (!p->src) {
		free(p);
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "prepare: w: the backend gives no device address "
		                    "for its buffer");
	}
	p->src += w->offset;
	if ((st = enter(ctx, "prepare", dev->ordinal, &prev))) {
		free(p);
		return st;
	}
	if (!(st = probe(ctx, dev->ordinal)))
		st = q4kh_cv_cuda(ctx,
		                  cudaDeviceGetAttribute(&p->multiprocessors,
		                                    cudaDevAttrMultiProcessorCount,
		                                    dev->ordinal),
		                  "prepare: cudaDeviceGetAttribute");
	if (!st) {
		if (q4kh_tc_supports(p->type))
			q4kh_cv_scratch_warm(ctx, dev->ordinal, p->k, p->n);
		else
			q4kh_cv_scratch_warm(ctx, dev->ordinal, 0, 0);
		st = q4kh_cv_self.prepare(ctx, p, (cudaStream_t)dev->stream);
	}
	leave(prev);
	if (st) {
		q4kh_cv_release(ctx, p);
		return st;
	}
	*out = p;
	return Q4KH_OK;
}

void q4kh_cv_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w)
{
	char msg[256];
	cudaError_t e;
	int prev;

	if (!w)
		return;
	if (w->own && cudaGetDevice(&prev) == cudaSuccess) {
		e = cudaSetDevice(w->ordinal);
		if (e == cudaSuccess)
			e = cudaFree(w->own);
		cudaSetDevice(prev);
		if (e != cudaSuccess && ctx && ctx->host && ctx->host->log) {
			snprintf(msg, sizeof(msg),
			         "release: cudaFree on device %d: %s (%s)", w->ordinal,
			         cudaGetErrorName(e), cudaGetErrorString(e));
			ctx->host->log(ctx->host->host_data, Q4KH_LOG_WARN, msg);
		}
	}
	free(w);
}

q4kh_status q4kh_cv_prepare_own(q4kh_kernel_ctx *ctx, q4kh_prepared *w, size_t bytes,
                                int64_t stride)
{
	char what[96];
	q4kh_status st;
	void *own;

	snprintf(what, sizeof(what), "prepare: cudaMalloc(%zu bytes)", bytes);
	if ((st = q4kh_cv_cuda(ctx, cudaMalloc(&own, bytes), what)))
		return st;
	w->own = own;
	w->data = own;
	w->stride = stride;
	return Q4KH_OK;
}

q4kh_status q4kh_cv_prepare_aligned(q4kh_kernel_ctx *ctx, q4kh_prepared *w,
                                    cudaStream_t s)
{
	int64_t row = w->k / q4kh_type_block_elems(w->type) *
	              q4kh_type_block_bytes(w->type);
	q4kh_status st;

	if ((uintptr_t)w->src % 16 == 0 && w->src_stride % 16 == 0) {
		w->data = w->src;
		w->stride = w->src_stride;
		return Q4KH_OK;
	}
	if (row % 16)
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		                    "prepare: rows of %lld bytes cannot be 16-byte aligned",
		                    (long long)row);
	if ((st = q4kh_cv_prepare_own(ctx, w, (size_t)(row * w->n), row)))
		return st;
	return q4kh_cv_cuda(ctx,
	                    cudaMemcpy2DAsync(w->own, (size_t)row, w->src,
	                                 (size_t)w->src_stride, (size_t)row,
	                                 (size_t)w->n, cudaMemcpyDeviceToDevice, s),
	                    "prepare: cudaMemcpy2DAsync to aligned rows");
}

q4kh_status q4kh_cv_launched(q4kh_kernel_ctx *ctx, cudaError_t e, const char *kernel,
                             const q4kh_prepared *w, const struct q4kh_cv_io *io)
{
	char what[160];

	if (e == cudaSuccess)
		return Q4KH_OK;
	snprintf(what, sizeof(what), "%s kernel for %s {%lld, %lld} x %lld columns",
	         kernel, q4kh_type_name(w->type), (long long)w->k,
	         (long long)w->n, (long long)io->cols);
	return q4kh_cv_cuda(ctx, e, what);
}

/* --- gemv and gemm -------------------------------------------------------- */

/* Bytes [begin, end) an f32 matrix {rows, cols} with column stride nb1 spans. */
static void span(const struct q4kh_tensor *t, uint64_t *begin, uint64_t *end)
{
	*begin = t->offset;
	*end = t->offset + (uint64_t)((t->ne[1] - 1) * t->nb[1] + 4 * t->ne[0]);
}

static int overlap(const q4kh_buffer *a, uint64_t a0, uint64_t a1,
                   const q4kh_buffer *b, uint64_t b0, uint64_t b1)
{
	return a == b && a0 < b1 && b0 < a1;
}

/* An f32 {rows, cols} operand: contiguous columns, stride a multiple of ALIGN. */
static q4kh_status check_f32(q4kh_kernel_ctx *ctx, const char *what,
                             const struct q4kh_tensor *t, int64_t rows,
                             int64_t cols_max, int64_t cols, int align)
{
	if (!t)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "%s: tensor is NULL", what);
	if (!t->buffer)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "%s: buffer is NULL", what);
	if (t->type != Q4KH_TYPE_F32)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "%s: type %u (%s), expected F32",
		                    what, t->type,
		                    q4kh_type_name(t->type) ? q4kh_type_name(t->type)
		                                       : "unknown");
	if (t->ne[0] != rows || t->ne[1] < 1 || t->ne[1] > cols_max ||
	    (cols && t->ne[1] != cols) || t->ne[2] != 1 || t->ne[3] != 1)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: shape {%lld, %lld, %lld, %lld}, expected {%lld, "
		                    "%s, 1, 1}",
		                    what, (long long)t->ne[0], (long long)t->ne[1],
		                    (long long)t->ne[2], (long long)t->ne[3],
		                    (long long)rows,
		                    cols ? "as x" : cols_max == Q4KH_CV_MAX_COLUMNS ? "1 .. 8"
		                                                          : ">= 1");
	if (t->nb[0] != 4 || t->nb[1] < 4 * rows || t->nb[1] % align ||
	    t->offset % (uint64_t)align)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: offset %llu, nb[0] = %lld, nb[1] = %lld: expected "
		                    "nb[0] = 4, nb[1] >= %lld, offset and nb[1] multiples "
		                    "of %d",
		                    what, (unsigned long long)t->offset, (long long)t->nb[0],
		                    (long long)t->nb[1], (long long)(4 * rows), align);
	return Q4KH_OK;
}

/* w is prepared, on dev's device. */
static q4kh_status check_prepared(q4kh_kernel_ctx *ctx, const char *what,
                                  const struct q4kh_native_device *dev,
                                  const q4kh_prepared *w)
{
	if (!w)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "%s: w is NULL", what);
	if (w->ordinal != dev->ordinal)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: w was prepared on CUDA device %d, called for %d",
		                    what, w->ordinal, dev->ordinal);
	return Q4KH_OK;
}

/* y {w->n, as x} shares no byte with x or w. */
static q4kh_status check_apart(q4kh_kernel_ctx *ctx, const char *what,
                               const q4kh_prepared *w,
                               const struct q4kh_tensor *x,
                               const struct q4kh_tensor *y)
{
	uint64_t x0, x1, y0, y1;

	span(x, &x0, &x1);
	span(y, &y0, &y1);
	if (overlap(y->buffer, y0, y1, x->buffer, x0, x1))
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "%s: y overlaps x", what);
	if (overlap(y->buffer, y0, y1, w->buffer, w->begin, w->end))
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID, "%s: y overlaps w", what);
	return Q4KH_OK;
}

/*
 * The device addresses of x (16-byte aligned: the kernels read it in
 * 16-byte vectors) and y (4-byte aligned), checked operands of dev.
 */
static q4kh_status addresses(q4kh_kernel_ctx *ctx, const char *what,
                             const struct q4kh_native_device *dev,
                             const struct q4kh_tensor *x,
                             const struct q4kh_tensor *y, const uint8_t **xa,
                             uint8_t **ya)
{
	*xa = dev->address(x->buffer);
	*ya = dev->address(y->buffer);
	if (!*xa || !*ya)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: the backend gives no device address for %s", what,
		                    *xa ? "y" : "x");
	*xa += x->offset;
	*ya += y->offset;
	if ((uintptr_t)*xa % 16 || (uintptr_t)*ya % 4)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: x at %p or y at %p is not 16- or 4-byte aligned",
		                    what, (const void *)*xa, (void *)*ya);
	return Q4KH_OK;
}

/*
 * WHAT's x {w->k, 1 .. COLS_MAX} and y {w->n, as x} checked (y apart from
 * x and w) into io, with their device addresses, all x's columns and
 * whether the backend launches as programmatic dependents (dev's flags).
 */
static q4kh_status operands(q4kh_kernel_ctx *ctx, const char *what,
                            const struct q4kh_native_device *dev,
                            const q4kh_prepared *w, const struct q4kh_tensor *x,
                            const struct q4kh_tensor *y, int64_t cols_max,
                            struct q4kh_cv_io *io)
{
	char xname[16], yname[16];
	const uint8_t *xa;
	uint8_t *ya;
	q4kh_status st;

	snprintf(xname, sizeof(xname), "%s x", what);
	snprintf(yname, sizeof(yname), "%s y", what);
	if ((st = check_f32(ctx, xname, x, w->k, cols_max, 0, 16)) ||
	    (st = check_f32(ctx, yname, y, w->n, cols_max, x->ne[1], 4)) ||
	    (st = check_apart(ctx, what, w, x, y)) ||
	    (st = addresses(ctx, what, dev, x, y, &xa, &ya)))
		return st;
	io->x = (const float *)xa;
	io->ldx = x->nb[1] / 4;
	io->y = (float *)ya;
	io->ldy = y->nb[1] / 4;
	io->cols = x->ne[1];
	io->call = what;
	io->pdl = (Q4KH_NATIVE_FLAGS(dev) & Q4KH_NATIVE_CUDA_PDL) != 0;
	return Q4KH_OK;
}

/*
 * A prompt's product on tensor cores (q4khost/cuda_tc.h), from the weight as the
 * GGUF file lays it out (w->src), whatever the variant made of it.
 */
static q4kh_status tc_run(q4kh_kernel_ctx *ctx,
                          const struct q4kh_native_device *dev,
                          const q4kh_prepared *w, const struct q4kh_cv_io *io)
{
	void *blas, *scratch;
	char why[512];
	q4kh_status st;

	if ((st = q4kh_cv_scratch_blas(ctx, dev->ordinal, io->call, &blas)) ||
	    (st = q4kh_cv_scratch_get(ctx, dev->ordinal,
	                              q4kh_tc_scratch_bytes(w->k, w->n, io->cols),
	                              (cudaStream_t)dev->stream, io->call, &scratch)))
		return st;
	if (q4kh_tc_gemm(blas, w->type, w->src, w->src_stride, w->k, w->n, io->x,
	                 io->ldx, io->y, io->ldy, io->cols, scratch,
	                 (cudaStream_t)dev->stream, why, sizeof(why)))
		return q4kh_cv_fail(ctx, Q4KH_ERR_DEVICE, "%s: %s", io->call, why);
	return Q4KH_OK;
}

static q4kh_status run(q4kh_kernel_ctx *ctx, const char *what,
                       const struct q4kh_native_device *dev, q4kh_prepared *w,
                       const struct q4kh_tensor *x, const struct q4kh_tensor *y,
                       int64_t cols_max)
{
	struct q4kh_cv_io all, io;
	q4kh_status st;
	int prev;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if ((st = check_native(ctx, what, dev)) ||
	    (st = check_prepared(ctx, what, dev, w)) ||
	    (st = operands(ctx, what, dev, w, x, y, cols_max, &all)))
		return st;
	if ((st = enter(ctx, what, dev->ordinal, &prev)))
		return st;
	if (cols_max > Q4KH_CV_MAX_COLUMNS &&
	    q4kh_tc_wanted(w->type, all.cols,
	                   q4kh_cv_self.tc_min_columns ? q4kh_cv_self.tc_min_columns
	                                               : Q4KH_TC_MIN_COLUMNS)) {
		st = tc_run(ctx, dev, w, &all);
		leave(prev);
		return st;
	}
	io = all;
	/* A batch goes through in tiles of columns, each reading w once. */
	for (int64_t c0 = 0; c0 < all.cols && !st; c0 += Q4KH_CV_MAX_COLUMNS) {
		io.x = all.x + c0 * all.ldx;
		io.y = all.y + c0 * all.ldy;
		io.cols = all.cols - c0 < Q4KH_CV_MAX_COLUMNS ? all.cols - c0 : Q4KH_CV_MAX_COLUMNS;
		st = q4kh_cv_self.apply(ctx, w, &io, (cudaStream_t)dev->stream);
	}
	leave(prev);
	return st;
}

q4kh_status q4kh_cv_gemv(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                         q4kh_prepared *w, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *y)
{
	return run(ctx, "gemv", dev, w, x, y, Q4KH_CV_MAX_COLUMNS);
}

q4kh_status q4kh_cv_gemm(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                         q4kh_prepared *w, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *y)
{
	return run(ctx, "gemm", dev, w, x, y, INT64_MAX);
}

/* --- gemv_multi (ABI 1.4) ------------------------------------------------- */

/* Bias B of product I: F32 {n}, contiguous, in a buffer of dev; its address. */
static q4kh_status check_bias(q4kh_kernel_ctx *ctx, uint32_t i,
                              const struct q4kh_native_device *dev,
                              const struct q4kh_tensor *b, int64_t n,
                              const float **out)
{
	const uint8_t *a;

	if (!b->buffer || b->type != Q4KH_TYPE_F32 || b->ne[0] != n ||
	    b->ne[1] != 1 || b->ne[2] != 1 || b->ne[3] != 1 || b->nb[0] != 4)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "gemv_multi: bias[%u]: type %u {%lld, %lld, %lld, "
		                    "%lld}, nb[0] = %lld: expected F32 {%lld} with "
		                    "nb[0] = 4 in a buffer",
		                    i, b->type, (long long)b->ne[0], (long long)b->ne[1],
		                    (long long)b->ne[2], (long long)b->ne[3],
		                    (long long)b->nb[0], (long long)n);
	a = dev->address(b->buffer);
	if (!a || (uintptr_t)(a + b->offset) % 4)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "gemv_multi: bias[%u]: no device address, or not "
		                    "4-byte aligned", i);
	*out = (const float *)(a + b->offset);
	return Q4KH_OK;
}

/* Do f32 tensors A (a vector {N}, or a matrix) and B share a byte? */
static int f32_overlaps(const struct q4kh_tensor *a, const struct q4kh_tensor *b)
{
	uint64_t a0, a1, b0, b1;

	span(a, &a0, &a1);
	span(b, &b0, &b1);
	return overlap(a->buffer, a0, a1, b->buffer, b0, b1);
}

q4kh_status q4kh_cv_gemv_multi(q4kh_kernel_ctx *ctx,
                               const struct q4kh_native_device *dev, uint32_t n,
                               q4kh_prepared *const w[], const struct q4kh_tensor *x,
                               const struct q4kh_tensor *const y[],
                               const struct q4kh_tensor *const bias[])
{
	const q4kh_prepared *cw[Q4KH_GEMV_MULTI_MAX];
	struct q4kh_cv_multi_io io;
	const uint8_t *xa = NULL;
	uint8_t *ya;
	q4kh_status st;
	int prev;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if ((st = check_native(ctx, "gemv_multi", dev)))
		return st;
	if (n < 1 || n > Q4KH_GEMV_MULTI_MAX || !w || !y)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "gemv_multi: n = %u (expected 1 .. %d), or w or y NULL",
		                    n, Q4KH_GEMV_MULTI_MAX);
	for (uint32_t i = 0; i < n; i++) {
		if ((st = check_prepared(ctx, "gemv_multi", dev, w[i])))
			return st;
		if (w[i]->k != w[0]->k)
			return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
			                    "gemv_multi: w[%u] has K = %lld, w[0] %lld", i,
			                    (long long)w[i]->k, (long long)w[0]->k);
		cw[i] = w[i];
	}
	if ((st = check_f32(ctx, "gemv_multi x", x, w[0]->k, Q4KH_CV_MAX_COLUMNS, 0, 16)))
		return st;
	for (uint32_t i = 0; i < n; i++) {
		if ((st = check_f32(ctx, "gemv_multi y", y[i], w[i]->n, Q4KH_CV_MAX_COLUMNS,
		                    x->ne[1], 4)))
			return st;
		for (uint32_t j = 0; j < n; j++) {
			if ((st = check_apart(ctx, "gemv_multi", w[j], x, y[i])))
				return st;
			if ((j < i && f32_overlaps(y[j], y[i])) ||
			    (bias && bias[j] && f32_overlaps(bias[j], y[i])))
				return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
				                    "gemv_multi: y[%u] overlaps %s[%u]", i,
				                    j < i && f32_overlaps(y[j], y[i]) ? "y" : "bias",
				                    j);
		}
		if ((st = addresses(ctx, "gemv_multi", dev, x, y[i], &xa, &ya)))
			return st;
		io.y[i] = (float *)ya;
		io.ldy[i] = y[i]->nb[1] / 4;
		io.bias[i] = NULL;
		if (bias && bias[i] &&
		    (st = check_bias(ctx, i, dev, bias[i], w[i]->n, &io.bias[i])))
			return st;
	}
	io.x = (const float *)xa;
	io.ldx = x->nb[1] / 4;
	io.cols = x->ne[1];
	io.pdl = (Q4KH_NATIVE_FLAGS(dev) & Q4KH_NATIVE_CUDA_PDL) != 0;
	if ((st = enter(ctx, "gemv_multi", dev->ordinal, &prev)))
		return st;
	st = q4kh_cv_self.apply_multi(ctx, n, cw, &io, (cudaStream_t)dev->stream);
	leave(prev);
	return st;
}

/* --- gemv_glu (ABI 1.4) --------------------------------------------------- */

q4kh_status q4kh_cv_gemv_glu(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                             q4kh_glu_kind kind, q4kh_prepared *w_gate,
                             q4kh_prepared *w_up, const struct q4kh_tensor *x,
                             const struct q4kh_tensor *y)
{
	struct q4kh_cv_io io;
	q4kh_status st;
	int prev;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if ((st = check_native(ctx, "gemv_glu", dev)) ||
	    (st = check_prepared(ctx, "gemv_glu", dev, w_gate)) ||
	    (st = check_prepared(ctx, "gemv_glu", dev, w_up)))
		return st;
	if (w_up->k != w_gate->k || w_up->n != w_gate->n)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "gemv_glu: up {%lld, %lld} and gate {%lld, %lld} differ",
		                    (long long)w_up->k, (long long)w_up->n,
		                    (long long)w_gate->k, (long long)w_gate->n);
	if ((st = operands(ctx, "gemv_glu", dev, w_gate, x, y, Q4KH_CV_MAX_COLUMNS, &io)) ||
	    (st = check_apart(ctx, "gemv_glu", w_up, x, y)))
		return st;
	if ((st = enter(ctx, "gemv_glu", dev->ordinal, &prev)))
		return st;
	st = q4kh_cv_self.apply_glu(ctx, kind, w_gate, w_up, &io, (cudaStream_t)dev->stream);
	leave(prev);
	return st;
}
