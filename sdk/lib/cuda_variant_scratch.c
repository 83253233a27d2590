/*
 * Device scratch for the variants' apply(): one buffer per CUDA device in
 * the variant context, grown by doubling, outgrown buffers kept until
 * shutdown (q4khost/cuda_variant_scratch.h says why); each device's
 * cuBLAS handle, made with its kernels' loads and its weights' first
 * products by a warm-up thread.
 */
#include "buildconf.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/cuda_tc.h"
#include "q4khost/cuda_variant.h"

/* Allocations are rounded up to this many bytes. */
#define Q4KH_CV_SCRATCH_ROUND 256

q4kh_status q4kh_cv_scratch_init(q4kh_kernel_ctx *ctx)
{
	int e = pthread_mutex_init(&ctx->scratch.lock, NULL);

	ctx->scratch.dev = NULL;
	ctx->scratch.n = 0;
	if (e)
		return q4kh_cv_fail(ctx, Q4KH_ERR_NOMEM, "scratch: pthread_mutex_init: %s",
		                    strerror(e));
	return Q4KH_OK;
}

/* The entry of device ORDINAL, the table grown to hold it; NULL when out
 * of memory. The caller holds the lock. */
static struct q4kh_cv_scratch_dev *entry(struct q4kh_cv_scratch *sc, int ordinal)
{
	struct q4kh_cv_scratch_dev *d;

	if (ordinal < sc->n)
		return &sc->dev[ordinal];
	d = realloc(sc->dev, (size_t)(ordinal + 1) * sizeof(*d));
	if (!d)
		return NULL;
	memset(d + sc->n, 0, (size_t)(ordinal + 1 - sc->n) * sizeof(*d));
	sc->dev = d;
	sc->n = ordinal + 1;
	return &d[ordinal];
}

/*
 * cudaMalloc of BYTES, in the relaxed capture mode while S is capturing;
 * *CALL names the CUDA call that failed. A failure's error is cleared
 * from the runtime, so that the next launch check does not report it.
 */
static cudaError_t alloc(void **p, size_t bytes, cudaStream_t s,
                         const char **call)
{
	enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
	enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	cudaError_t e;

	*call = "cudaStreamIsCapturing";
	if ((e = cudaStreamIsCapturing(s, &cs)) != cudaSuccess)
		goto out;
	if (cs != cudaStreamCaptureStatusNone) {
		*call = "cudaThreadExchangeStreamCaptureMode";
		if ((e = cudaThreadExchangeStreamCaptureMode(&mode)) != cudaSuccess)
			goto out;
	}
	*call = "cudaMalloc";
	e = cudaMalloc(p, bytes);
	if (cs != cudaStreamCaptureStatusNone) {
		/* Back to the thread's own mode. */
		cudaError_t r = cudaThreadExchangeStreamCaptureMode(&mode);

		if (e == cudaSuccess && r != cudaSuccess) {
			cudaFree(*p);
			*call = "cudaThreadExchangeStreamCaptureMode (restoring)";
			e = r;
		}
	}
out:
	if (e != cudaSuccess) {
		*p = NULL;
		cudaGetLastError();
	}
	return e;
}

/* Grow D to at least BYTES: twice its size or BYTES, whichever is more,
 * or BYTES alone when that much more does not fit. */
static q4kh_status grow(q4kh_kernel_ctx *ctx, struct q4kh_cv_scratch_dev *d,
                        int ordinal, size_t bytes, cudaStream_t s,
                        const char *what)
{
	size_t want = bytes, round = Q4KH_CV_SCRATCH_ROUND;
	struct q4kh_retired *r;
	const char *call;
	char where[256];
	size_t got;
	cudaError_t e;
	void *p;

	if (d->size <= (SIZE_MAX - round) / 2 && 2 * d->size > want)
		want = 2 * d->size;
	if (want <= SIZE_MAX - round)
		want = (want + round - 1) / round * round;
	snprintf(where, sizeof(where),
	         "%s: %zu bytes of scratch on CUDA device %d (%zu held)", what,
	         bytes, ordinal, d->size);
	if (q4kh_retired_reserve(d->ptr, &r))
		return q4kh_cv_fail(ctx, Q4KH_ERR_NOMEM, "%s: out of host memory", where);
	got = want;
	e = alloc(&p, got, s, &call);
	if (e == cudaErrorMemoryAllocation && want > bytes) {
		got = bytes;
		e = alloc(&p, got, s, &call);
	}
	if (e != cudaSuccess) {
		free(r);
		snprintf(where + strlen(where), sizeof(where) - strlen(where),
		         ": %s", call);
		return q4kh_cv_cuda(ctx, e, where);
	}
	q4kh_retire(&d->retired, r, d->ptr);
	d->ptr = p;
	d->size = got;
	return Q4KH_OK;
}

q4kh_status q4kh_cv_scratch_get(q4kh_kernel_ctx *ctx, int ordinal, size_t bytes,
                                cudaStream_t s, const char *what, void **out)
{
	struct q4kh_cv_scratch *sc = &ctx->scratch;
	struct q4kh_cv_scratch_dev *d;
	q4kh_status st = Q4KH_OK;

	*out = NULL;
	if (ordinal < 0 || bytes == 0)
		return q4kh_cv_fail(ctx, Q4KH_ERR_INVALID,
		                    "%s: %zu bytes of scratch on CUDA device %d", what,
		                    bytes, ordinal);
	pthread_mutex_lock(&sc->lock);
	d = entry(sc, ordinal);
	if (!d)
		st = q4kh_cv_fail(ctx, Q4KH_ERR_NOMEM,
		                  "%s: scratch of CUDA device %d: out of host memory",
		                  what, ordinal);
	else if (d->size < bytes)
		st = grow(ctx, d, ordinal, bytes, s, what);
	if (!st)
		*out = d->ptr;
	pthread_mutex_unlock(&sc->lock);
	return st;
}

/* Distinct weight shapes one warm-up takes; a model has a handful. */
#define Q4KH_CV_WARM_SHAPES 32

/* A device's warm-up: its thread, the handle it makes, the weight shapes
 * prepare queued for it and the device memory of their products. */
struct q4kh_cv_warm {
	pthread_t thread;
	int ordinal;
	void *blas;           /* q4kh_tc_open's handle, or NULL when it failed */
	pthread_mutex_t lock; /* guards shape, n_shapes and stop */
	pthread_cond_t more;  /* a shape was queued, or stop set */
	struct {
		int64_t k, n;
	} shape[Q4KH_CV_WARM_SHAPES];
	int n_shapes;
	int stop;      /* the joiner waits: run what is queued, then end */
	void *scratch; /* the products' device memory (the thread's), or NULL */
	size_t size;   /* bytes at scratch */
};

/* The products of weight {K, N} at Q4KH_TC_WARM_COLUMNS on stream S, the
 * thread's scratch grown for them (S is idle between shapes); -1 when
 * something failed, which the first product of that shape reports. */
static int warm_shape(struct q4kh_cv_warm *w, int64_t k, int64_t n,
                      cudaStream_t s)
{
	const size_t bytes = q4kh_tc_warm_bytes(k, n, Q4KH_TC_WARM_COLUMNS);
	char why[256];

	if (bytes > w->size) {
		cudaFree(w->scratch);
		w->size = 0;
		if (cudaMalloc(&w->scratch, bytes) != cudaSuccess) {
			w->scratch = NULL;
			return -1;
		}
		w->size = bytes;
	}
	return q4kh_tc_warm_gemm(w->blas, k, n, Q4KH_TC_WARM_COLUMNS, w->scratch,
	                         s, why, sizeof(why));
}

/* Each shape as prepare queues it, until the joiner sets stop and the
 * queue is done, or until one fails. */
static void warm_shapes(struct q4kh_cv_warm *w)
{
	cudaStream_t s;
	int done = 0, failed = 0;

	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
		return;
	pthread_mutex_lock(&w->lock);
	while (!failed) {
		int64_t k, n;

		while (done == w->n_shapes && !w->stop)
			pthread_cond_wait(&w->more, &w->lock);
		if (done == w->n_shapes)
			break;
		k = w->shape[done].k;
		n = w->shape[done].n;
		done++;
		pthread_mutex_unlock(&w->lock);
		failed = warm_shape(w, k, n, s);
		pthread_mutex_lock(&w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	cudaStreamDestroy(s);
}

/* The warm-up thread: the handle, the tensor-core kernels and the
 * variant's, then the products of the weights' shapes; their errors come
 * again at first use. */
static void *warm_main(void *arg)
{
	struct q4kh_cv_warm *w = arg;

	if (q4kh_tc_warm(w->ordinal, &w->blas) == 0) {
		if (q4kh_cv_self.preload)
			q4kh_cv_self.preload();
		if (w->blas)
			warm_shapes(w);
	}
	cudaGetLastError();
	return NULL;
}

/* Device ORDINAL's warm-up, its thread started with every signal blocked;
 * NULL when it could not be. */
static struct q4kh_cv_warm *warm_start(int ordinal)
{
	struct q4kh_cv_warm *w = calloc(1, sizeof(*w));
	sigset_t all, old;
	int e;

	if (!w)
		return NULL;
	w->ordinal = ordinal;
	if (pthread_mutex_init(&w->lock, NULL)) {
		free(w);
		return NULL;
	}
	if (pthread_cond_init(&w->more, NULL)) {
		pthread_mutex_destroy(&w->lock);
		free(w);
		return NULL;
	}
	/* the host's signals stay with the host's threads */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	e = pthread_create(&w->thread, NULL, warm_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e) {
		pthread_cond_destroy(&w->more);
		pthread_mutex_destroy(&w->lock);
		free(w);
		return NULL;
	}
	return w;
}

/* Queue weight {K, N} on W, unless it is there or the queue is full. */
static void warm_queue(struct q4kh_cv_warm *w, int64_t k, int64_t n)
{
	int i;

	pthread_mutex_lock(&w->lock);
	for (i = 0; i < w->n_shapes && (w->shape[i].k != k || w->shape[i].n != n); i++)
		;
	if (i == w->n_shapes && i < Q4KH_CV_WARM_SHAPES) {
		w->shape[i].k = k;
		w->shape[i].n = n;
		w->n_shapes++;
		pthread_cond_signal(&w->more);
	}
	pthread_mutex_unlock(&w->lock);
}

void q4kh_cv_scratch_warm(q4kh_kernel_ctx *ctx, int ordinal, int64_t k, int64_t n)
{
	struct q4kh_cv_scratch *sc = &ctx->scratch;
	struct q4kh_cv_scratch_dev *d;

	pthread_mutex_lock(&sc->lock);
	d = ordinal >= 0 ? entry(sc, ordinal) : NULL;
	if (d && !d->warmed) {
		d->warmed = 1;
		d->warm = warm_start(ordinal);
	}
	if (d && d->warm && k > 0)
		warm_queue(d->warm, k, n);
	pthread_mutex_unlock(&sc->lock);
}

/*
 * Wait for D's warm-up, if one runs (it runs what is queued first), and
 * keep its handle; its device memory becomes D's scratch when larger,
 * else is freed. The caller holds the table's lock, which the warm-up
 * thread never takes.
 */
static void warm_join(struct q4kh_cv_scratch_dev *d)
{
	struct q4kh_cv_warm *w = d->warm;
	struct q4kh_retired *r;

	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = 1;
	pthread_cond_signal(&w->more);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	d->blas = w->blas;
	if (w->scratch && w->size > d->size && q4kh_retired_reserve(d->ptr, &r) == 0) {
		q4kh_retire(&d->retired, r, d->ptr);
		d->ptr = w->scratch;
		d->size = w->size;
	} else if (w->scratch) {
		cudaFree(w->scratch);
		cudaGetLastError();
	}
	pthread_cond_destroy(&w->more);
	pthread_mutex_destroy(&w->lock);
	free(w);
	d->warm = NULL;
}

q4kh_status q4kh_cv_scratch_blas(q4kh_kernel_ctx *ctx, int ordinal, const char *what,
                                 void **out)
{
	struct q4kh_cv_scratch *sc = &ctx->scratch;
	struct q4kh_cv_scratch_dev *d;
	q4kh_status st = Q4KH_OK;
	char why[256];

	*out = NULL;
	pthread_mutex_lock(&sc->lock);
	d = ordinal >= 0 ? entry(sc, ordinal) : NULL;
	if (!d)
		st = q4kh_cv_fail(ctx, Q4KH_ERR_NOMEM,
		                  "%s: cuBLAS handle of CUDA device %d: out of host memory",
		                  what, ordinal);
	else {
		warm_join(d);
		if (!d->blas && q4kh_tc_open(&d->blas, why, sizeof(why)))
			st = q4kh_cv_fail(ctx, Q4KH_ERR_DEVICE, "%s: %s", what, why);
	}
	if (!st)
		*out = d->blas;
	pthread_mutex_unlock(&sc->lock);
	return st;
}

/* cudaFree P on the current device; a failure is logged with ORDINAL. */
static void free_logged(q4kh_kernel_ctx *ctx, int ordinal, void *p)
{
	cudaError_t e = cudaFree(p);
	char msg[256];

	if (e == cudaSuccess || !ctx->host || !Q4KH_HOST_HAS(ctx->host, log))
		return;
	snprintf(msg, sizeof(msg),
	         "%s: shutdown: cudaFree of scratch on CUDA device %d: %s (%s)",
	         q4kh_cv_name, ordinal, cudaGetErrorName(e), cudaGetErrorString(e));
	ctx->host->log(ctx->host->host_data, Q4KH_LOG_WARN, msg);
}

void q4kh_cv_scratch_free(q4kh_kernel_ctx *ctx)
{
	struct q4kh_cv_scratch *sc = &ctx->scratch;
	int prev = -1;

	for (int i = 0; i < sc->n; i++)
		warm_join(&sc->dev[i]);
	if (sc->n > 0 && cudaGetDevice(&prev) != cudaSuccess)
		prev = -1;
	for (int i = 0; i < sc->n; i++) {
		struct q4kh_cv_scratch_dev *d = &sc->dev[i];
		const int on = (d->ptr || d->blas) && cudaSetDevice(i) == cudaSuccess;

		if (on && d->ptr)
			free_logged(ctx, i, d->ptr);
		if (on)
			q4kh_tc_close(d->blas);
		for (void *p; (p = q4kh_retired_pop(&d->retired));)
			if (on)
				free_logged(ctx, i, p);
	}
	if (prev >= 0)
		cudaSetDevice(prev);
	cudaGetLastError();
	free(sc->dev);
	sc->dev = NULL;
	sc->n = 0;
	pthread_mutex_destroy(&sc->lock);
}
