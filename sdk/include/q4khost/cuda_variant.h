/*
 * A kernel variant for the cuda backend, less its kernels: the
 * q4kh_kernel_v1 table and its argument checks, error text, device
 * bookkeeping and the [plugin.NAME] warps setting, and the per-device
 * scratch an apply() may need (cuda_variant_scratch.h), in the SDK's CUDA
 * library (libq4khost_sdk_cuda.a, pkg-config q4khost-plugin-cuda;
 * cuda_variant.c). The in-tree variants (cuda-mwv, cuda-dp4a,
 * cuda-gemv-iq) are built on it. A plugin links the library and defines
 * q4kh_cv_self, the one struct q4kh_cv_variant that says what differs:
 * its types and score, how it prepares a weight and how it multiplies;
 * Q4KH_CV_PLUGIN below defines its name, table and entry point. A gemm
 * of tc_min_columns columns or more (Q4KH_TC_MIN_COLUMNS by default) runs
 * on the SDK's tensor-core products (q4khost/cuda_tc.h).
 *
 * Warm-up: a device's first prepare starts a thread that makes the
 * device's cuBLAS handle, loads the tensor-core kernels and the
 * variant's (its preload below) and runs one tensor-core product of each
 * prepared weight's shape, so that the first prompt waits for neither
 * cuBLAS's start, nor lazy module loading, nor cuBLAS's first choice of
 * a shape's kernels (cuda_variant_scratch.h, q4kh_cv_scratch_warm). The first product on
 * tensor cores and shutdown join it; its failures are reported as
 * without it, by the first call that needs what it could not make.
 *
 * The library is built with hidden visibility: linked into a plugin, its
 * q4kh_cv_ names stay inside the module, and only the entry symbol is
 * exported. Threads: as the kernel table's rules (docs/plugin-abi.md, T1);
 * cuda_variant_scratch.h says how the scratch is shared.
 */
#ifndef Q4KHOST_CUDA_VARIANT_H
#define Q4KHOST_CUDA_VARIANT_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "q4khost/plugin.h"

#include "q4khost/cuda_variant_scratch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Warps per thread block: the choices [plugin.NAME] warps accepts. */
#define Q4KH_CV_MAX_WARPS 8

/* Activation columns one kernel launch takes (gemv's limit too). */
#define Q4KH_CV_MAX_COLUMNS 8

struct q4kh_kernel_ctx {
	const struct q4kh_host_api *host;
	int warps;         /* threads per block / 32, from the config */
	struct q4kh_cv_scratch scratch; /* apply()'s device memory, per device */
	char error[1024];
};

/*
 * A prepared weight {K, N}. The scaffolding fills everything above `data`;
 * the variant's prepare() sets data and stride, and own when it allocates.
 */
struct q4kh_prepared {
	int ordinal;              /* CUDA device it lives on */
	int multiprocessors;      /* of that device */
	uint32_t type;
	int64_t k, n;
	const q4kh_buffer *buffer; /* the host's weight, for overlap checks */
	uint64_t begin, end;      /* its bytes [begin, end) in buffer */
	const uint8_t *src;       /* device address of its row 0 */
	int64_t src_stride;       /* bytes from one of its rows to the next */
	const void *data;         /* what the kernels read */
	int64_t stride;           /* bytes between rows of data (variant's own
	                             meaning when it repacks) */
	void *own;                /* device memory this handle frees, or NULL */
};

/* One multiplication y[:, t] = W x[:, t], t < cols, on device pointers. */
struct q4kh_cv_io {
	const float *x; /* column t starts at x + t * ldx; 16-byte aligned */
	int64_t ldx;    /* floats, a multiple of 4 */
	float *y;       /* column t starts at y + t * ldy */
	int64_t ldy;    /* floats */
	int64_t cols;   /* >= 1 */
	const char *call; /* "gemv" or "gemm": for error messages */
	int pdl;        /* 1: the backend launches on this stream as
	                   programmatic dependents (Q4KH_NATIVE_CUDA_PDL), and
	                   so may the variant (q4khost/cuda_pdl.cuh) */
};

/*
 * gemv_multi's products (ABI 1.4) on device pointers: y[i][:, t] =
 * W[i] x[:, t] (+ bias[i]) for i < n, t < cols, x as in struct q4kh_cv_io.
 */
struct q4kh_cv_multi_io {
	const float *x;
	int64_t ldx;
	int64_t cols;                                /* 1 .. Q4KH_CV_MAX_COLUMNS */
	float *y[Q4KH_GEMV_MULTI_MAX];               /* column t at y + t * ldy */
	int64_t ldy[Q4KH_GEMV_MULTI_MAX];            /* floats */
	const float *bias[Q4KH_GEMV_MULTI_MAX];      /* {N_i}, or NULL for none */
	int pdl;                                     /* as struct q4kh_cv_io's */
};

/* What differs between the variants. */
struct q4kh_cv_variant {
	uint32_t min_sm;   /* oldest architecture it runs on, 75 = sm_75 */
	uint32_t score;    /* score() on devices it runs on */
	int default_warps; /* when [plugin.NAME] warps is unset */
	/* gemm's columns from which a product goes to tensor cores
	 * (q4khost/cuda_tc.h); 0: Q4KH_TC_MIN_COLUMNS. Measured: docs/perf.md. */
	int64_t tc_min_columns;
	/*
	 * cudaSuccess when this build holds code for the current device
	 * (cudaFuncGetAttributes of one of its kernels).
	 */
	cudaError_t (*probe)(void);
	/*
	 * Load the kernels prepare, apply, apply_multi and apply_glu launch on
	 * the current device (q4kh_preload of each, q4khost/cuda_preload.cuh;
	 * q4kh_cv_stream_preload for q4kh_cv_stream_launch's), or NULL for
	 * none: called once per device on the device's warm-up thread
	 * (q4kh_cv_scratch_warm), beside the host's calls; what it returns is
	 * ignored, a kernel's launch reporting its error as before.
	 */
	cudaError_t (*preload)(void);
	/*
	 * Make w ready on the current device (w->src holds the host's rows):
	 * set w->data and w->stride, and w->own if it allocates. Work goes on
	 * stream s; no host synchronisation.
	 */
	q4kh_status (*prepare)(q4kh_kernel_ctx *ctx, q4kh_prepared *w,
	                       cudaStream_t s);
	/* Enqueue io (1 .. Q4KH_CV_MAX_COLUMNS columns) on stream s. */
	q4kh_status (*apply)(q4kh_kernel_ctx *ctx, const q4kh_prepared *w,
	                     const struct q4kh_cv_io *io, cudaStream_t s);
	/*
	 * For a plugin declared with Q4KH_CV_PLUGIN_MULTI (NULL otherwise):
	 * enqueue io's N products (1 .. Q4KH_GEMV_MULTI_MAX, weights of one
	 * K, arguments checked) on stream s as one launch, or return
	 * Q4KH_ERR_UNSUPPORTED having enqueued nothing.
	 */
	q4kh_status (*apply_multi)(q4kh_kernel_ctx *ctx, uint32_t n,
	                           const q4kh_prepared *const w[],
	                           const struct q4kh_cv_multi_io *io, cudaStream_t s);
	/*
	 * For a plugin declared with Q4KH_CV_PLUGIN_FUSED (NULL otherwise):
	 * enqueue io->y = act(gate io->x) * (up io->x) (gemv_glu, ABI 1.4;
	 * gate and up of one K and N, arguments checked, 1 .. Q4KH_CV_MAX_COLUMNS
	 * columns) on stream s as one launch, act as the cuda backend's glu,
	 * or return Q4KH_ERR_UNSUPPORTED having enqueued nothing.
	 */
	q4kh_status (*apply_glu)(q4kh_kernel_ctx *ctx, q4kh_glu_kind kind,
	                         const q4kh_prepared *gate, const q4kh_prepared *up,
	                         const struct q4kh_cv_io *io, cudaStream_t s);
};

/* Defined by each plugin: its behaviour, and through Q4KH_CV_PLUGIN below its
 * name and kernel table. */
extern const struct q4kh_cv_variant q4kh_cv_self;
extern const char q4kh_cv_name[];
extern const struct q4kh_kernel_v1 q4kh_cv_table;

/*
 * For a prepare() that makes its own copy: BYTES of device memory that
 * release() frees, as w->own and w->data, rows STRIDE bytes apart.
 */
q4kh_status q4kh_cv_prepare_own(q4kh_kernel_ctx *ctx, q4kh_prepared *w, size_t bytes,
                                int64_t stride);

/*
 * A prepare() for weights read in place: w->data = w->src when its rows
 * are 16-byte aligned, else a copy in aligned device memory of w's own
 * (one asynchronous copy on s).
 */
q4kh_status q4kh_cv_prepare_aligned(q4kh_kernel_ctx *ctx, q4kh_prepared *w,
                                    cudaStream_t s);

/*
 * Q4KH_OK after a launch that returned cudaSuccess; else the last error
 * names KERNEL, w's shape and the column count.
 */
q4kh_status q4kh_cv_launched(q4kh_kernel_ctx *ctx, cudaError_t e, const char *kernel,
                             const q4kh_prepared *w, const struct q4kh_cv_io *io);

/* The kernel table's functions (cuda_variant.c). */
q4kh_status q4kh_cv_init(const struct q4kh_host_api *host, q4kh_kernel_ctx **out);
void q4kh_cv_shutdown(q4kh_kernel_ctx *ctx);
const char *q4kh_cv_last_error(q4kh_kernel_ctx *ctx);
uint32_t q4kh_cv_score(q4kh_kernel_ctx *ctx, const struct q4kh_device_record *dev,
                       uint32_t type);
q4kh_status q4kh_cv_prepare(q4kh_kernel_ctx *ctx,
                            const struct q4kh_native_device *dev,
                            const struct q4kh_tensor *w, q4kh_prepared **out);
q4kh_status q4kh_cv_gemv(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                         q4kh_prepared *w, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *y);
q4kh_status q4kh_cv_gemm(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                         q4kh_prepared *w, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *y);
void q4kh_cv_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w);
/*
 * gemv_multi for a variant with apply_multi: checks every argument as gemv
 * does, that the products write nothing another reads or writes and every
 * bias (F32 {N_i}), then one apply_multi.
 */
q4kh_status q4kh_cv_gemv_multi(q4kh_kernel_ctx *ctx,
                               const struct q4kh_native_device *dev, uint32_t n,
                               q4kh_prepared *const w[], const struct q4kh_tensor *x,
                               const struct q4kh_tensor *const y[],
                               const struct q4kh_tensor *const bias[]);
/*
 * gemv_glu for a variant with apply_glu: checks every argument as gemv
 * does (y against both weights), that gate and up share K and N, then one
 * apply_glu.
 */
q4kh_status q4kh_cv_gemv_glu(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                             q4kh_glu_kind kind, q4kh_prepared *w_gate,
                             q4kh_prepared *w_up, const struct q4kh_tensor *x,
                             const struct q4kh_tensor *y);

/* The build id: host compiler, nvcc release and the GPU code built. */
#ifdef __clang__
#define Q4KH_CV_COMPILER __VERSION__
#else
#define Q4KH_CV_COMPILER "gcc " __VERSION__
#endif
#define Q4KH_CV_BUILD_ID                                                       \
	Q4KH_CV_COMPILER ", nvcc " Q4KH_NVCC_VERSION ", " Q4KH_CUDA_ARCHS

/*
 * The plugin's name, kernel table, descriptor and entry point, from its
 * name (a string literal), its array of types, its gemv_multi and
 * gemv_glu entries (NULL, or q4kh_cv_gemv_multi and q4kh_cv_gemv_glu when q4kh_cv_self
 * has apply_multi and apply_glu) and the q4kh_arith class of its
 * products (ARITH; F16 at the finest, since every variant's gemm, a
 * prompt's, runs on fp16 tensor cores: q4kh_cv_gemm): through
 * Q4KH_CV_PLUGIN or Q4KH_CV_PLUGIN_FUSED below. The plugin defines, as
 * string literals, PACKAGE_VERSION (its version), Q4KH_NVCC_VERSION and
 * Q4KH_CUDA_ARCHS (for the build id), and may define Q4KH_CV_VENDOR and
 * Q4KH_CV_LICENSE (default "q4khost" and "MIT", the in-tree plugins',
 * whose buildconf.h defines the others).
 */
#ifndef Q4KH_CV_VENDOR
#define Q4KH_CV_VENDOR "q4khost"
#endif
#ifndef Q4KH_CV_LICENSE
#define Q4KH_CV_LICENSE "MIT"
#endif
#define Q4KH_CV_PLUGIN_TABLE(NAME, TYPES, MULTI, GLU, ARITH)                   \
	const char q4kh_cv_name[] = NAME;                                      \
	const struct q4kh_kernel_v1 q4kh_cv_table = {                          \
		.struct_size = sizeof(struct q4kh_kernel_v1),                  \
		.n_types = sizeof(TYPES) / sizeof((TYPES)[0]),                 \
		.backend = "cuda",                                             \
		.types = TYPES,                                                \
		.max_gemv_columns = Q4KH_CV_MAX_COLUMNS,                       \
		.init = q4kh_cv_init,                                          \
		.shutdown = q4kh_cv_shutdown,                                  \
		.last_error = q4kh_cv_last_error,                              \
		.score = q4kh_cv_score,                                        \
		.prepare = q4kh_cv_prepare,                                    \
		.gemv = q4kh_cv_gemv,                                          \
		.gemm = q4kh_cv_gemm,                                          \
		.release = q4kh_cv_release,                                    \
		.gemv_multi = MULTI,                                           \
		.gemv_glu = GLU,                                               \
		.arith = ARITH,                                                \
	};                                                                     \
	static const struct q4kh_plugin_desc q4kh_cv_desc = {                  \
		.struct_size = sizeof(struct q4kh_plugin_desc),                \
		.abi_minor = Q4KH_ABI_MINOR,                                   \
		.kind = Q4KH_KIND_KERNEL,                                      \
		.name = NAME,                                                  \
		.version = PACKAGE_VERSION,                                    \
		.vendor = Q4KH_CV_VENDOR,                                      \
		.license = Q4KH_CV_LICENSE,                                    \
		.build_id = Q4KH_CV_BUILD_ID,                                  \
		.backend = NULL,                                               \
		.kernel = &q4kh_cv_table,                                      \
	};                                                                     \
	Q4KH_PLUGIN_ENTRY(q4kh_cv_desc)

/* A variant without the fused entries (q4kh_cv_self.apply_multi, apply_glu NULL). */
#define Q4KH_CV_PLUGIN(NAME, TYPES, ARITH) Q4KH_CV_PLUGIN_TABLE(NAME, TYPES, NULL, NULL, ARITH)
/* A variant whose q4kh_cv_self.apply_multi and apply_glu fuse (ABI 1.4). */
#define Q4KH_CV_PLUGIN_FUSED(NAME, TYPES, ARITH)                               \
	Q4KH_CV_PLUGIN_TABLE(NAME, TYPES, q4kh_cv_gemv_multi, q4kh_cv_gemv_glu, ARITH)

/* Keep a formatted message as ctx's last error and return st. */
q4kh_status q4kh_cv_fail(q4kh_kernel_ctx *ctx, q4kh_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * Q4KH_OK when e is cudaSuccess, else the last error "WHAT: cudaErrorX
 * (text)" and Q4KH_ERR_NOMEM for an allocation failure, Q4KH_ERR_DEVICE
 * otherwise.
 */
q4kh_status q4kh_cv_cuda(q4kh_kernel_ctx *ctx, cudaError_t e, const char *what);

#ifdef __cplusplus
}
#endif

#endif
