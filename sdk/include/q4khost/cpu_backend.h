/*
 * What a backend of kind "cpu" (one that computes in the host's memory on
 * its cores, plugin.h's backend_kind) shares with every other, in the
 * SDK's static library (libq4khost_sdk.a, pkg-config q4khost-plugin;
 * cpu_backend.c): its buffers (host memory, or the host's own read-only
 * memory through buffer_wrap), each worker thread's scratch, and the
 * native handles it lends to kernel variants for "cpu". The in-tree
 * backends cpu and cpu-fast use it.
 *
 * Including this header defines struct q4kh_buffer (plugin.h leaves it
 * to the backend): include it in a backend whose buffers are these, and
 * only there. A backend keeps its own struct q4kh_device_ctx; every
 * function here names it through a struct q4kh_check (contract.h: the
 * device context, which buffers are its, and the line a failure writes,
 * the backend's last error), so a failure reads as the contract's do.
 *
 * Threads: T1 (one thread per device context at a time); the functions
 * keep no state of their own.
 */
#ifndef Q4KHOST_CPU_BACKEND_H
#define Q4KHOST_CPU_BACKEND_H

#include <stdint.h>

#include "q4khost/contract.h"
#include "q4khost/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Alignment of a buffer's data and of each thread's scratch: a cache line,
 * and every AVX-512 load's. */
#define Q4KH_CPU_ALIGN 64

/* A buffer: SIZE bytes at DATA, of device context DEV. */
struct q4kh_buffer {
	q4kh_device_ctx *dev;
	uint64_t size;
	unsigned char *data; /* Q4KH_CPU_ALIGN-aligned, or the host's (wrapped) */
	int wrapped;         /* DATA is the host's, read-only (buffer_wrap) */
};

/* One scratch area per worker thread, each SIZE bytes, Q4KH_CPU_ALIGN-aligned. */
struct q4kh_cpu_scratch {
	void **part; /* THREADS of them: part[thread], NULL until reserved */
	unsigned threads;
	uint64_t size;
};

/* Address of element (0, I1, I2, I3) of T, a tensor in one of these
 * buffers (its view checked: contract.h). */
static inline unsigned char *q4kh_cpu_at(const struct q4kh_tensor *t, int64_t i1, int64_t i2,
                                         int64_t i3)
{
	return t->buffer->data + t->offset + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* Rows of T: ne[1] * ne[2] * ne[3]. */
static inline int64_t q4kh_cpu_rows(const struct q4kh_tensor *t)
{
	return t->ne[1] * t->ne[2] * t->ne[3];
}

/* Address of flat row R (0 .. q4kh_cpu_rows(T) - 1, over ne[1], ne[2],
 * ne[3] in that order) of T. */
static inline unsigned char *q4kh_cpu_flat_row(const struct q4kh_tensor *t, int64_t r)
{
	return q4kh_cpu_at(t, r % t->ne[1], (r / t->ne[1]) % t->ne[2], r / (t->ne[1] * t->ne[2]));
}

/*
 * The contract checks' view of device context DEV (NULL: every op check
 * fails, contract.h): buffers as q4kh_cpu_buffer_owned tells them, the
 * weight types WEIGHT_TYPES (Q4KH_TYPE_BIT()s), failures written to MSG
 * (CAP bytes: the backend's last error; NULL with DEV NULL).
 */
struct q4kh_check q4kh_cpu_check(q4kh_device_ctx *dev, uint32_t weight_types, char *msg,
                                 size_t cap);

/*
 * q4kh_check_index_values (contract.h) over index tensor T (I32 {n},
 * checked: its values in host memory): each of its ne[0] values in [0,
 * LIMIT), else Q4KH_ERR_INVALID with the first that is not named in
 * C->msg ("set_rows rows[0] = 5, expected 0 .. 4").
 */
q4kh_status q4kh_cpu_index_values(const struct q4kh_check *c, const char *what,
                                  const struct q4kh_tensor *t, int64_t limit);

/*
 * attention_paged's arguments (ABI 1.8) for a backend whose tensors are
 * in host memory: the contract (q4kh_check_attention_paged), then each
 * page id of PAGES below the pools' pages (k_pool->ne[2] / PAGE_SIZE) and
 * each position of POS below the table's keys (pages->ne[0] PAGE_SIZE),
 * as q4kh_cpu_index_values checks them. Q4KH_OK with *POS_AT and
 * *PAGES_AT the two index tensors' values and *LAST the latest position
 * (0 for none above it); else the failing check's status, C->msg naming
 * it. Thread-safe.
 */
q4kh_status q4kh_cpu_attention_paged_args(const struct q4kh_check *c, const struct q4kh_tensor *q,
                                          const struct q4kh_tensor *k_pool,
                                          const struct q4kh_tensor *v_pool,
                                          const struct q4kh_tensor *pos,
                                          const struct q4kh_tensor *pages, int32_t page_size,
                                          const struct q4kh_attn_params *params,
                                          const struct q4kh_tensor *out,
                                          const int32_t **pos_at, const int32_t **pages_at,
                                          int64_t *last);

/*
 * struct q4kh_check's buffer(): 1 with *SIZE its size when BUF is one of
 * DEV's buffers (as q4kh_cpu_buffer_alloc or _wrap made it for DEV), 0
 * when it belongs to another device context. Thread-safe.
 */
int q4kh_cpu_buffer_owned(const void *dev, const q4kh_buffer *buf, uint64_t *size);

/*
 * buffer_alloc: *OUT = a buffer of SIZE bytes (zero included) for the
 * device context C->dev, its data aligned to Q4KH_CPU_ALIGN and padded to
 * a multiple of it; the caller frees it with q4kh_cpu_buffer_free.
 * Returns Q4KH_OK; Q4KH_ERR_INVALID with C->dev NULL (no line: no
 * context) or OUT NULL; Q4KH_ERR_NOMEM, *OUT NULL, when SIZE is more than
 * the host can address or malloc fails, with the line in C->msg.
 */
q4kh_status q4kh_cpu_buffer_alloc(const struct q4kh_check *c, uint64_t size,
                                  q4kh_buffer **out);

/*
 * buffer_wrap: *OUT = a buffer over the host's memory HOST .. HOST + SIZE
 * (aligned to 32 bytes; read-only, and the host's until the buffer is
 * freed), copied nowhere. Errors as q4kh_cpu_buffer_alloc's, and
 * Q4KH_ERR_INVALID for HOST NULL or misaligned.
 */
q4kh_status q4kh_cpu_buffer_wrap(const struct q4kh_check *c, const void *host, uint64_t size,
                                 q4kh_buffer **out);

/* buffer_free: free BUF (NULL: nothing) and, unless wrapped, its data. */
void q4kh_cpu_buffer_free(q4kh_buffer *buf);

/*
 * buffer_upload: copy SIZE bytes from SRC to BUF at OFFSET, after
 * q4kh_check_transfer (contract.h); a wrapped buffer is read-only:
 * Q4KH_ERR_INVALID. Synchronous (M6).
 */
q4kh_status q4kh_cpu_buffer_upload(const struct q4kh_check *c, q4kh_buffer *buf,
                                   uint64_t offset, const void *src, uint64_t size);

/* buffer_download: copy SIZE bytes of BUF at OFFSET to DST, after
 * q4kh_check_transfer. Synchronous. */
q4kh_status q4kh_cpu_buffer_download(const struct q4kh_check *c, q4kh_buffer *buf,
                                     uint64_t offset, void *dst, uint64_t size);

/* struct q4kh_native_device's address(): BUF's data (NULL for NULL). */
void *q4kh_cpu_buffer_address(const q4kh_buffer *buf);

/*
 * native_device: the 1.0 handles of kind "cpu" in OUT (ordinal -1, stream
 * NULL, address q4kh_cpu_buffer_address); the caller then lends its
 * worker threads where it has them (q4kh_pool_lend, pool.h). Returns
 * Q4KH_OK; Q4KH_ERR_INVALID with C->dev NULL, or OUT NULL or with a
 * struct_size short of the 1.0 fields (the line in C->msg).
 */
q4kh_status q4kh_cpu_native_device(const struct q4kh_check *c, struct q4kh_native_device *out);

/*
 * Make S one scratch slot per thread for THREADS threads, none reserved
 * yet. Returns 0; or -1 (ENOMEM), S empty.
 */
int q4kh_cpu_scratch_init(struct q4kh_cpu_scratch *s, unsigned threads);

/*
 * Make each thread's scratch at least BYTES long (rounded up to
 * Q4KH_CPU_ALIGN); what it held is lost when it grows. Returns Q4KH_OK,
 * or Q4KH_ERR_NOMEM with every part freed and "cannot allocate T x N
 * bytes of scratch" in C->msg.
 */
q4kh_status q4kh_cpu_scratch_reserve(const struct q4kh_check *c, struct q4kh_cpu_scratch *s,
                                     uint64_t bytes);

/* Free every part of S and its slots (S zeroed; an empty S: nothing). */
void q4kh_cpu_scratch_free(struct q4kh_cpu_scratch *s);

/*
 * Define a backend's buffer entries over q4kh_cpu_buffer_*: static
 * PREFIX_buffer_alloc, PREFIX_buffer_wrap, PREFIX_buffer_free,
 * PREFIX_buffer_upload and PREFIX_buffer_download, with the table's
 * signatures, each making CONTRACT(dev) (the backend's struct q4kh_check
 * of a device context, which may be NULL) and calling its namesake.
 */
#define Q4KH_CPU_BUFFER_ENTRIES(PREFIX, CONTRACT)                                      \
	static q4kh_status PREFIX##_buffer_alloc(q4kh_device_ctx *dev, uint64_t size,  \
	                                         q4kh_buffer **out)                    \
	{                                                                              \
		const struct q4kh_check c = CONTRACT(dev);                             \
                                                                                       \
		return q4kh_cpu_buffer_alloc(&c, size, out);                           \
	}                                                                              \
	static q4kh_status PREFIX##_buffer_wrap(q4kh_device_ctx *dev, const void *host, \
	                                        uint64_t size, q4kh_buffer **out)      \
	{                                                                              \
		const struct q4kh_check c = CONTRACT(dev);                             \
                                                                                       \
		return q4kh_cpu_buffer_wrap(&c, host, size, out);                      \
	}                                                                              \
	static void PREFIX##_buffer_free(q4kh_device_ctx *dev, q4kh_buffer *buf)       \
	{                                                                              \
		(void)dev;                                                             \
		q4kh_cpu_buffer_free(buf);                                             \
	}                                                                              \
	static q4kh_status PREFIX##_buffer_upload(q4kh_device_ctx *dev, q4kh_buffer *buf, \
	                                          uint64_t offset, const void *src,    \
	                                          uint64_t size)                       \
	{                                                                              \
		const struct q4kh_check c = CONTRACT(dev);                             \
                                                                                       \
		return q4kh_cpu_buffer_upload(&c, buf, offset, src, size);             \
	}                                                                              \
	static q4kh_status PREFIX##_buffer_download(q4kh_device_ctx *dev,              \
	                                            q4kh_buffer *buf, uint64_t offset, \
	                                            void *dst, uint64_t size)          \
	{                                                                              \
		const struct q4kh_check c = CONTRACT(dev);                             \
                                                                                       \
		return q4kh_cpu_buffer_download(&c, buf, offset, dst, size);           \
	}

#ifdef __cplusplus
}
#endif

#endif
