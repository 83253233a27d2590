/*
 * The mixture-of-experts ops of ABI 1.7 (plugin.h: moe_route,
 * mul_mat_id), shared by the reference cpu backend and cpu-fast: both
 * keep their buffers in host memory, so one routing and one grouping of
 * columns by expert serve both, each backend's own mul_mat doing the
 * products (cpu_moe.c). A backend hands its parts in a struct
 * cpu_moe_backend; the calls are as thread-safe as those parts.
 */
#ifndef Q4KH_CPU_MOE_H
#define Q4KH_CPU_MOE_H

#include <stdint.h>

#include "q4khost/contract.h"
#include "q4khost/plugin.h"

/* What the shared code needs of a backend in host memory. */
struct cpu_moe_backend {
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
 * float. Checks with q4kh_check_moe_route first.
 */
q4kh_status cpu_moe_route(const struct cpu_moe_backend *b, const struct q4kh_tensor *logits,
                          int32_t norm, const struct q4kh_tensor *ids,
                          const struct q4kh_tensor *weights);

/*
 * mul_mat_id (plugin.h), after q4kh_check_mul_mat_id and a check of every
 * id: for each expert that some column chose, in increasing order, its
 * columns of x gathered into a buffer of the backend's, one mul_mat of
 * the expert's matrix over them, the products scattered into y. Each
 * column's product is thus the backend's mul_mat of that column. An id
 * outside [0, E) fails before anything is written.
 */
q4kh_status cpu_moe_mul_mat_id(const struct cpu_moe_backend *b, const struct q4kh_tensor *w,
                               const struct q4kh_tensor *x, const struct q4kh_tensor *ids,
                               const struct q4kh_tensor *y);

/*
 * The backend entries moe_route and mul_mat_id, as static functions named
 * ROUTE and MUL_MAT_ID, over a backend in host memory: its contract
 * (CONTRACT(dev), a struct q4kh_check), its MUL_MAT, BUFFER_ALLOC and
 * BUFFER_FREE entries, and ROW(t, i1, i2, i3), the host address of
 * element (0, i1, i2, i3) of a tensor. What such a backend puts in its
 * table; it also defines ROUTE##_at and ROUTE##_backend.
 */
#define CPU_MOE_ENTRIES(ROUTE, MUL_MAT_ID, CONTRACT, MUL_MAT, BUFFER_ALLOC, BUFFER_FREE, ROW) \
	static unsigned char *ROUTE##_at(const struct q4kh_tensor *t, int64_t i1, int64_t i2)      \
	{                                                                                          \
		return ROW(t, i1, i2, 0);                                                          \
	}                                                                                          \
	static struct cpu_moe_backend ROUTE##_backend(q4kh_device_ctx *dev)                        \
	{                                                                                          \
		const struct cpu_moe_backend b = { dev, CONTRACT(dev), MUL_MAT, BUFFER_ALLOC,      \
			                           BUFFER_FREE, ROUTE##_at };                      \
                                                                                                   \
		return b;                                                                          \
	}                                                                                          \
	static q4kh_status ROUTE(q4kh_device_ctx *dev, const struct q4kh_tensor *logits,           \
	                         int32_t norm, const struct q4kh_tensor *ids,                      \
	                         const struct q4kh_tensor *weights)                                \
	{                                                                                          \
		const struct cpu_moe_backend b = ROUTE##_backend(dev);                             \
                                                                                                   \
		return cpu_moe_route(&b, logits, norm, ids, weights);                              \
	}                                                                                          \
	static q4kh_status MUL_MAT_ID(q4kh_device_ctx *dev, const struct q4kh_tensor *w,           \
	                              const struct q4kh_tensor *x,                                 \
	                              const struct q4kh_tensor *ids,                               \
	                              const struct q4kh_tensor *y)                                 \
	{                                                                                          \
		const struct cpu_moe_backend b = ROUTE##_backend(dev);                             \
                                                                                                   \
		return cpu_moe_mul_mat_id(&b, w, x, ids, y);                                       \
	}

#endif
