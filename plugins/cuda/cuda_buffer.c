/*
 * Device buffers. Uploads and downloads go through the device context's
 * stream, so they are ordered after every op issued before them; the
 * host's memory is free (upload) or filled (download) when they return.
 * A download waits for its copy. An upload from pinned memory waits for
 * its copy; one from pageable memory (the model file's mapping, a step's
 * inputs) returns once its bytes are in staging memory, and a fault of
 * the copy shows at the next synchronisation.
 *
 * Large uploads from pageable memory (a model's weights) go through a
 * ring of pinned staging slots: a few threads copy the next chunk of the
 * source into a free slot (faulting the file's pages in) while the
 * chunks before it are on their way to the device, so reading the file
 * and the bus overlap (llama.cpp's loader does the same with four pinned
 * buffers when it reads the file instead of mapping it). The ring lasts
 * as long as the device context.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "q4khost/pool.h"

/* Pinned slots of the ring and the bytes of each: 4 x 16 MiB keep the
 * bus busy while the next chunk is read (an H100's x16 link takes a slot
 * in under a millisecond). */
#define RING_SLOTS 4
#define RING_CHUNK ((size_t)16 << 20)
/* Uploads from pageable memory below this go through the driver's own
 * staging, with no wait (a step's inputs): the ring's events and threads
 * would cost more than they save. */
#define RING_MIN ((uint64_t)256 << 10)
/* Threads that fill a slot (the uploading one among them), and the bytes
 * each claims at a time. */
#define RING_THREADS 4u
#define RING_PART ((size_t)256 << 10)

struct cuda_ring {
	char *slots;                  /* RING_SLOTS x RING_CHUNK, pinned */
	cudaEvent_t sent[RING_SLOTS]; /* each slot's last copy to the device */
	int used[RING_SLOTS];         /* sent[i] has been recorded */
	int next;                     /* the slot the next chunk takes */
	struct q4kh_pool *pool;
};

/* One chunk's copy into its slot, in parts of RING_PART bytes. */
struct ring_fill {
	char *slot;
	const char *src;
	size_t size;
};

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

/* Is P ordinary (pageable) host memory, not pinned or registered? */
static int pageable(const void *p)
{
	struct cudaPointerAttributes a;

	if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return a.type == cudaMemoryTypeUnregistered;
}

/*
 * An upload from pageable memory: the driver has copied SRC to staging
 * memory when cudaMemcpyAsync returns, so the caller may reuse it at once,
 * and the stream orders the copy before every later op. No wait, then: a
 * decode step's inputs go up without a round trip to the device (a fault
 * of the copy shows at the next synchronisation).
 */
static q4kh_status upload_staged(q4kh_device_ctx *dev, void *dst,
                                 const void *src, uint64_t size)
{
	if (!size)
		return Q4KH_OK;
	return cuda_check(dev, cudaMemcpyAsync(dst, src, (size_t)size,
	                                       cudaMemcpyHostToDevice, dev->stream),
	                  "buffer_upload");
}

void cuda_ring_free(struct cuda_ring *ring)
{
	if (!ring)
		return;
	for (int i = 0; i < RING_SLOTS; i++)
		if (ring->sent[i])
			cudaEventDestroy(ring->sent[i]);
	cudaFreeHost(ring->slots);
	q4kh_pool_destroy(ring->pool);
	free(ring);
}

/* dev->ring, made on first use. */
static q4kh_status ring_of(q4kh_device_ctx *dev, struct cuda_ring **out)
{
	const size_t bytes = RING_SLOTS * RING_CHUNK;
	unsigned threads = q4kh_threads_online();
	struct cuda_ring *r;
	char what[96];
	sigset_t old;
	q4kh_status st = Q4KH_OK;
	int rc;

	if ((*out = dev->ring))
		return Q4KH_OK;
	r = calloc(1, sizeof(*r));
	if (!r)
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                 "buffer_upload: out of host memory (staging ring)");
	snprintf(what, sizeof(what),
	         "buffer_upload: cudaHostAlloc of %zu bytes (staging ring)", bytes);
	st = cuda_check(dev, cudaHostAlloc((void **)&r->slots, bytes,
	                                   cudaHostAllocDefault),
	                what);
	for (int i = 0; !st && i < RING_SLOTS; i++)
		st = cuda_check(dev, cudaEventCreateWithFlags(&r->sent[i],
		                                              cudaEventDisableTiming),
		                "buffer_upload: cudaEventCreateWithFlags (staging ring)");
	if (!st) {
		cuda_signals_block(&old);
		rc = q4kh_pool_create(threads < RING_THREADS ? threads : RING_THREADS,
		                      0, &r->pool);
		cuda_signals_restore(&old);
		if (rc)
			st = cuda_fail(dev->ctx, Q4KH_ERR_NOMEM,
			               "buffer_upload: the staging ring's threads: %s",
			               strerror(errno));
	}
	if (st) {
		cuda_ring_free(r);
		return st;
	}
	dev->ring = *out = r;
	return Q4KH_OK;
}

static void ring_fill_part(void *arg, unsigned thread, int64_t begin,
                           int64_t end)
{
	const struct ring_fill *f = arg;
	const size_t from = (size_t)begin * RING_PART;
	size_t to = (size_t)end * RING_PART;

	(void)thread;
	if (to > f->size)
		to = f->size;
	memcpy(f->slot + from, f->src + from, to - from);
}

/*
 * SIZE bytes from pageable SRC to device DST, a chunk at a time through
 * the ring: a slot is filled once its previous chunk has left (its
 * event), then copied on the stream. Returns when SRC has been read.
 */
static q4kh_status upload_ring(q4kh_device_ctx *dev, char *dst,
                               const char *src, uint64_t size)
{
	struct cuda_ring *r;
	q4kh_status st;

	if ((st = ring_of(dev, &r)))
		return st;
	for (uint64_t off = 0; off < size; off += RING_CHUNK) {
		const size_t n = size - off < RING_CHUNK ? (size_t)(size - off)
		                                         : RING_CHUNK;
		const int s = r->next;
		struct ring_fill f = { r->slots + (size_t)s * RING_CHUNK, src + off, n };

		if (r->used[s] &&
		    (st = cuda_check(dev, cudaEventSynchronize(r->sent[s]),
		                     "buffer_upload: waiting for a staging slot")))
			return st;
		q4kh_pool_run(r->pool, (int64_t)((n + RING_PART - 1) / RING_PART), 1,
		              ring_fill_part, &f);
		if ((st = cuda_check(dev, cudaMemcpyAsync(dst + off, f.slot, n,
		                                          cudaMemcpyHostToDevice,
		                                          dev->stream),
		                     "buffer_upload")) ||
		    (st = cuda_check(dev, cudaEventRecord(r->sent[s], dev->stream),
		                     "buffer_upload: cudaEventRecord (staging ring)")))
			return st;
		r->used[s] = 1;
		r->next = (s + 1) % RING_SLOTS;
	}
	return Q4KH_OK;
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
	if (pageable(src))
		return size >= RING_MIN
		               ? upload_ring(dev, buf->ptr + offset, src, size)
		               : upload_staged(dev, buf->ptr + offset, src, size);
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
