/*
 * The mixture-of-experts ops of ABI 1.7 (plugin.h: moe_route and
 * mul_mat_id) for a backend that keeps its buffers in host memory, in the
 * SDK's static library (libq4khost_sdk.a, pkg-config q4khost-plugin;
 * moe.c). The reference cpu backend and cpu-fast both use it: one routing
 * and one grouping of columns by expert, each backend's own mul_mat doing
 * the products, so a backend whose mul_mat matches the reference's
 * routes and multiplies as the reference does. A backend hands its parts
 * in a struct q4kh_moe_backend, or puts Q4KH_MOE_ENTRIES in its table.
 *
 * Errors: the plugin.h statuses; the failing check's line goes to the
 * contract's msg buffer (contract.h, struct q4kh_check), for the backend's
 * last_error. Threads: as thread-safe as the backend's parts (the host
 * calls a device from one thread at a time, T1).
 */
#ifndef Q4KHOST_MOE_H
#define Q4KHOST_MOE_H

#include <stdint.h>

#include "q4khost/contract.h"
#include "q4khost/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the shared code needs of a backend in host memory. */
struct q4kh_moe_backend {
	q4kh_device_ctx *dev;
	struct q4kh_check check; /* its contract; failures' lines go to check.msg */
	/* its mul_mat, buffer_alloc and buffer_free entries (plugin.h) */
	q4kh_status (*mul_mat)(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
	                       const struct q4kh_tensor *x, const struct q4kh_tensor *y);
	q4kh_status (*buffer_alloc)(q4kh_device_ctx *dev, uint64_t size, q4kh_buffer **out);
	void (*buffer_free)(q4kh_device_ctx *dev, q4kh_buffer *buf);
	/* The host address of element (0, i1, i2) of T. */
	unsigned char *(*at)(const struct q4kh_tensor *t, int64_t i1, int64_t i2);
};

/*
 * moe_route (plugin.h), every column in double: p = softmax(logits) with
 * the largest logit subtracted, the k largest chosen one by one (the
 * lower index first among equal values), their weights p (over max(sum,
 * 2^-14) with norm, the sum and quotient in double) rounded once to
 * float. Shapes and types as plugin.h's moe_route says (logits F32
 * {E, T}, ids I32 and weights F32 {k, T}, in B's memory). Checks with
 * q4kh_check_moe_route first. Returns Q4KH_OK; the check's status; or
 * Q4KH_ERR_NOMEM when a column's scratch (malloc, freed before return)
 * cannot be had.
 */
q4kh_status q4kh_moe_route(const struct q4kh_moe_backend *b, const struct q4kh_tensor *logits,
                           int32_t norm, const struct q4kh_tensor *ids,
                           const struct q4kh_tensor *weights);

/*
 * mul_mat_id (plugin.h), after q4kh_check_mul_mat_id and a check of every
 * id: for each expert that some column chose, in increasing order, its
 * columns of x gathered into a buffer of the backend's, one mul_mat of
 * the expert's matrix over them, the products scattered into y. Each
 * column's product is thus the backend's mul_mat of that column. Shapes
 * and types as plugin.h's mul_mat_id says (w {K, N, E}, x F32 {K, X, T},
 * ids I32 {k, T}, y F32 {N, k, T}). An id outside [0, E) fails with
 * Q4KH_ERR_INVALID before anything is written; the gather buffer comes
 * from B's buffer_alloc (its status on failure) and is freed before
 * return; a failing mul_mat's status is returned as it is.
 */
q4kh_status q4kh_moe_mul_mat_id(const struct q4kh_moe_backend *b, const struct q4kh_tensor *w,
                                const struct q4kh_tensor *x, const struct q4kh_tensor *ids,
                                const struct q4kh_tensor *y);

#ifdef __cplusplus
}
#endif

/*
 * The backend entries moe_route and mul_mat_id, as static functions named
 * ROUTE and MUL_MAT_ID, over a backend in host memory: its contract
 * (CONTRACT(dev), a struct q4kh_check), its MUL_MAT, BUFFER_ALLOC and
 * BUFFER_FREE entries, and ROW(t, i1, i2, i3), the host address of
 * element (0, i1, i2, i3) of a tensor. What such a backend puts in its
 * table; it also defines ROUTE##_at and ROUTE##_backend.
 */
#define Q4KH_MOE_ENTRIES(ROUTE, MUL_MAT_ID, CONTRACT, MUL_MAT, BUFFER_ALLOC, BUFFER_FREE, ROW)     \
	static unsigned char *ROUTE##_at(const struct q4kh_tensor *t, int64_t i1, int64_t i2)      \
	{                                                                                          \
		return ROW(t, i1, i2, 0);                                                          \
	}                                                                                          \
	static struct q4kh_moe_backend ROUTE##_backend(q4kh_device_ctx *dev)                       \
	{                                                                                          \
		const struct q4kh_moe_backend b = { dev, CONTRACT(dev), MUL_MAT, BUFFER_ALLOC,     \
			                            BUFFER_FREE, ROUTE##_at };                     \
                                                                                                   \
		return b;                                                                          \
	}                                                                                          \
	static q4kh_status ROUTE(q4kh_device_ctx *dev, const struct q4kh_tensor *logits,           \
	                         int32_t norm, const struct q4kh_tensor *ids,                      \
	                         const struct q4kh_tensor *weights)                                \
	{                                                                                          \
		const struct q4kh_moe_backend b = ROUTE##_backend(dev);                            \
                                                                                                   \
		return q4kh_moe_route(&b, logits, norm, ids, weights);                             \
	}                                                                                          \
	static q4kh_status MUL_MAT_ID(q4kh_device_ctx *dev, const struct q4kh_tensor *w,           \
	                              const struct q4kh_tensor *x,                                 \
	                              const struct q4kh_tensor *ids,                               \
	                              const struct q4kh_tensor *y)                                 \
	{                                                                                          \
		const struct q4kh_moe_backend b = ROUTE##_backend(dev);                            \
                                                                                                   \
		return q4kh_moe_mul_mat_id(&b, w, x, ids, y);                                      \
	}

#endif
