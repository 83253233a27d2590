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
 * The position of query t in *POS: pos[t] from the device, checked
 * against the cache's length, or pos0 + t. 0 on a fault.
 */
static __device__ __forceinline__ bool query_pos(const struct cuda_attn &p,
                                                 const struct cuda_view &k,
                                                 int64_t t, int32_t *fault,
                                                 int64_t *pos)
{
	if (!p.pos) {
		*pos = p.pos0 + t;
		return true;
	}
	*pos = p.pos[t];
	return index_ok(fault, CUDA_FAULT_ATTENTION_POS, t, p.pos[t], k.ne[2]);
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
