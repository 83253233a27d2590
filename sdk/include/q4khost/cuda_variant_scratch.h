/*
 * Device scratch for a kernel variant's apply(), in the SDK's CUDA library
 * with the table of cuda_variant.h (cuda_variant_scratch.c): one
 * buffer per CUDA device, owned by the variant context, grown only when a
 * call needs more and kept until shutdown(). A call enqueues no allocation
 * and no free, so a product recorded into a CUDA graph holds only its
 * kernels, and replays need no memory of their own.
 *
 * Lifetime: the host may record gemv and gemm into a CUDA graph (stream
 * capture) and replay it for every token; the graph keeps the scratch
 * address it was recorded with. So a buffer that a larger call outgrows
 * is never freed or reused at once: it goes on its device's retired list
 * (q4khost/cuda_retired.h), freed at shutdown, whether or not the stream is capturing (a graph
 * recorded earlier may still point at it, and kernels already enqueued may
 * still read it). A new buffer is at least twice the old, so the retired
 * ones together stay smaller than the one in use.
 *
 * Growing during a capture: cudaMalloc is no stream operation and is not
 * recorded, but the host captures in cudaStreamCaptureModeThreadLocal,
 * which refuses it on the capturing thread and invalidates the capture.
 * While cudaStreamIsCapturing says the stream is capturing, the thread
 * switches to the relaxed mode for the one cudaMalloc
 * (cudaThreadExchangeStreamCaptureMode) and back.
 *
 * Warm-up: a device's first prompt would pay for cuBLAS's start, for
 * loading each kernel it launches (CUDA_MODULE_LOADING=LAZY, the
 * default) and for cuBLAS's choice and loads of its kernels at each new
 * shape; q4kh_cv_scratch_warm does all three on a thread of its own from
 * the device's first prepare on.
 *
 * Threads: the host calls a variant context from one thread at a time
 * (docs/plugin-abi.md, T1); calls for different devices may come from
 * different threads, one per device. The table of devices is guarded by a
 * mutex, held while a device's buffer is looked up and grown. A buffer is
 * used only by calls for its device, on that device's stream, which
 * orders them: two threads calling for the same device at once (which T1
 * rules out) would share it.
 */
#ifndef Q4KHOST_CUDA_VARIANT_SCRATCH_H
#define Q4KHOST_CUDA_VARIANT_SCRATCH_H

#include <pthread.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "q4khost/cuda_retired.h"
#include "q4khost/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

struct q4kh_cv_warm;

/* One CUDA device's scratch. */
struct q4kh_cv_scratch_dev {
	void *ptr;                    /* device memory, or NULL */
	size_t size;                  /* bytes at ptr */
	struct q4kh_retired *retired; /* earlier buffers, freed at shutdown */
	void *blas;                   /* cuda_tc's cuBLAS handle, or NULL until
	                                 the first product on tensor cores
	                                 takes the warm-up's or makes one */
	struct q4kh_cv_warm *warm;    /* the running warm-up, or NULL */
	int warmed;                   /* 1 once a warm-up was started */
};

/* Every device's scratch: a member of q4kh_kernel_ctx. */
struct q4kh_cv_scratch {
	pthread_mutex_t lock;       /* guards dev and n */
	struct q4kh_cv_scratch_dev *dev; /* indexed by CUDA ordinal */
	int n;                      /* entries in dev */
};

/*
 * Set up ctx->scratch, empty. Q4KH_ERR_NOMEM (and ctx's last error) when
 * the mutex cannot be made.
 */
q4kh_status q4kh_cv_scratch_init(q4kh_kernel_ctx *ctx);

/*
 * *OUT = at least BYTES (> 0) of device memory on CUDA device ORDINAL, the
 * current device, for work enqueued on stream S; valid until shutdown.
 * Allocates only when the device's buffer is smaller (see above). On
 * failure *OUT is NULL and ctx's last error reads "WHAT: N bytes of
 * scratch on CUDA device D (M held): cudaMalloc: cudaErrorX (text)";
 * Q4KH_ERR_NOMEM for an allocation failure, Q4KH_ERR_DEVICE for another
 * CUDA error.
 */
q4kh_status q4kh_cv_scratch_get(q4kh_kernel_ctx *ctx, int ordinal, size_t bytes,
                                cudaStream_t s, const char *what, void **out);

/*
 * Start, once per device, CUDA device ORDINAL's warm-up: a thread (all
 * signals blocked) that makes the device's cuBLAS handle and loads the
 * tensor-core kernels (q4kh_tc_warm), then the variant's
 * (q4kh_cv_self.preload), then runs the tensor-core products of each
 * weight shape queued here, K > 0 by N, once, at Q4KH_TC_WARM_COLUMNS
 * (q4kh_tc_warm_gemm: cuBLAS chooses and loads its kernels for them), on
 * a stream and device memory of its own: the work a first prompt would
 * otherwise wait for. q4kh_cv_prepare calls it for every weight (K 0 for
 * a type that stays off tensor cores), so the warm-up runs while the host
 * uploads and prepares the rest. q4kh_cv_scratch_blas joins it before the
 * first product on tensor cores, after the products of the shapes queued
 * by then (its device memory becomes the device's scratch when larger,
 * so that first product allocates none), and q4kh_cv_scratch_free at
 * shutdown; other calls run beside it (CUDA loads a kernel once, whichever
 * thread asks). A shape queued after the join is not warmed; more than 32
 * distinct shapes, the rest neither. It reports nothing: what it could
 * not do is done, and its error reported, at first use as without it.
 * Takes the table's lock; no CUDA call on the calling thread.
 */
void q4kh_cv_scratch_warm(q4kh_kernel_ctx *ctx, int ordinal, int64_t k, int64_t n);

/*
 * *OUT = the cuBLAS handle (q4khost/cuda_tc.h) of CUDA device ORDINAL, the
 * current device, kept until shutdown: the warm-up's (waited for here),
 * else made now. On failure *OUT is NULL and ctx's last error reads
 * "WHAT: cublasCreate: ..." (Q4KH_ERR_DEVICE).
 */
q4kh_status q4kh_cv_scratch_blas(q4kh_kernel_ctx *ctx, int ordinal, const char *what,
                                 void **out);

/*
 * Join every device's warm-up, then free every device's buffers and
 * cuBLAS handles, retired ones included (cudaFree waits for
 * the work that uses them), and the table; for shutdown(), after which no
 * recorded graph may replay. A cudaFree that fails is logged as a warning.
 */
void q4kh_cv_scratch_free(q4kh_kernel_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
