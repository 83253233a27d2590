/*
 * What every attention kernel of the cuda plugin (cuda_attention.cu,
 * cuda_flash.cu) decides the same way: where a query sits, which keys it
 * sees, and how a dot product becomes a score.
 */
#ifndef Q4KH_CUDA_ATTENTION_CUH
#define Q4KH_CUDA_ATTENTION_CUH

#include <math.h>

#include "cuda_common.cuh"
#include "cuda_kernels.h"

/*
 * The position of query t as the caller gave it: pos[t] from the device
 * (written by the host, never by a kernel, so a kernel launched with PDL
 * may read it before q4kh_pdl_wait), or pos0 + t. Unchecked.
 */
static __device__ __forceinline__ int64_t query_pos_raw(const struct cuda_attn &p, int64_t t)
{
	return p.pos ? (int64_t)p.pos[t] : p.pos0 + t;
}

/*
 * POS, query t's position from query_pos_raw, checked against the cache's
 * length (over pages, the block table's keys) when it came from the
 * device. 0 on a fault, which it records.
 */
static __device__ __forceinline__ bool query_pos_ok(const struct cuda_attn &p,
                                                    const struct cuda_view &k, int64_t t,
                                                    int64_t pos, int32_t *fault)
{
	return !p.pos || index_ok(fault, CUDA_FAULT_ATTENTION_POS, t, (int32_t)pos,
	                          p.pages ? p.n_table * p.page_size : k.ne[2]);
}

/* The position of query t in *POS, checked (query_pos_ok). 0 on a fault. */
static __device__ __forceinline__ bool query_pos(const struct cuda_attn &p,
                                                 const struct cuda_view &k,
                                                 int64_t t, int32_t *fault,
                                                 int64_t *pos)
{
	*pos = query_pos_raw(p, t);
	return query_pos_ok(p, k, t, *pos, fault);
}

/*
 * The cache row of key J: J itself, or over pages (attention_paged) its
 * slot through the block table, pages[j / page_size] * page_size +
 * j % page_size. A page outside the pools is a fault, and row 0 is read
 * instead (the call fails at the next synchronisation).
 */
static __device__ __forceinline__ int64_t key_row(const struct cuda_attn &p, int64_t j,
                                                  int32_t *fault)
{
	if (!p.pages)
		return j;
	const int64_t b = j / p.page_size;
	const int32_t page = p.pages[b];

	if (!index_ok(fault, CUDA_FAULT_ATTENTION_PAGES, b, page, p.n_pages))
		return 0;
	return (int64_t)page * p.page_size + j % p.page_size;
}

/* The first key that a query at POS sees. */
static __device__ __forceinline__ int64_t first_key(const struct cuda_attn &p,
                                                    int64_t pos)
{
	return p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
}

/* A score as the model defines it: scaled, then capped when softcap > 0. */
static __device__ __forceinline__ float score(const struct cuda_attn &p,
                                              float dot)
{
	const float s = dot * p.scale;

	return p.softcap > 0.0f ? p.softcap * tanhf(s / p.softcap) : s;
}

#endif
