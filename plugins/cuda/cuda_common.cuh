/*
 * Small device helpers shared by the cuda plugin's kernels: reductions,
 * element addressing of struct cuda_view and the f32/f16 conversions.
 */
#ifndef Q4KH_CUDA_COMMON_CUH
#define Q4KH_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "q4khost/cuda_pdl.cuh"
#include "q4khost/cuda_preload.cuh"
#include "q4khost/cuda_quant.cuh"

/* A cache value as f32, and an f32 as a cache value (f16: round to
 * nearest even). */
static __device__ __forceinline__ float to_f32(float v) { return v; }
static __device__ __forceinline__ float to_f32(__half v)
{
	return __half2float(v);
}

template <typename D>
static __device__ __forceinline__ D from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v)
{
	return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v)
{
	return __float2half_rn(v);
}

/* Sum of v over the 32 lanes of a warp, the same in every lane. */
template <typename T>
static __device__ __forceinline__ T warp_sum(T v)
{
	for (int o = 16; o > 0; o /= 2)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* Sum of v over the block (a multiple of 32 threads), the same in every
 * thread. part: 32 values of shared memory; the call synchronises. */
template <typename T>
static __device__ __forceinline__ T block_sum(T v, T *part)
{
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int warps = blockDim.x / 32;

	v = warp_sum(v);
	__syncthreads(); /* part may still be read from the last call */
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	v = lane < warps ? part[lane] : T(0);
	return warp_sum(v);
}

/*
 * 1 when 0 <= v < limit; else keep the stream's first fault (code, element
 * i, value v, limit) in FAULT (CUDA_FAULT_WORDS words, cuda_kernels.h)
 * and return 0, so that the caller skips the access.
 */
static __device__ __forceinline__ bool index_ok(int32_t *fault, int code,
                                                int64_t i, int32_t v,
                                                int64_t limit)
{
	if (v >= 0 && v < limit)
		return true;
	if (atomicCAS(fault, 0, code) == 0) {
		fault[1] = (int32_t)i;
		fault[2] = v;
		fault[3] = (int32_t)(limit < INT32_MAX ? limit : INT32_MAX);
	}
	return false;
}

/* Row r of a view, counting rows over ne[1], ne[2], ne[3]. */
static __device__ __forceinline__ char *view_row(const struct cuda_view &v,
                                                 int64_t r)
{
	const int64_t i1 = r % v.ne[1], i2 = (r / v.ne[1]) % v.ne[2];
	const int64_t i3 = r / (v.ne[1] * v.ne[2]);

	return v.data + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3];
}

static inline int64_t view_rows(const struct cuda_view *v)
{
	return v->ne[1] * v->ne[2] * v->ne[3];
}

/* Blocks for a grid-stride loop over ITEMS work items. */
static inline unsigned grid_for(int64_t items, int threads)
{
	int64_t b = (items + threads - 1) / threads;

	return b < 1 ? 1u : b > (1 << 30) ? 1u << 30 : (unsigned)b;
}

/*
 * F(std::integral_constant<uint32_t, TYPE>()) for each weight type the
 * kernels take (cuda_type_supported), in id order: the first error, or
 * cudaSuccess.
 */
template <typename F>
static cudaError_t cuda_for_each_type(F f)
{
	for (uint32_t t = 0; t < 32; t++) {
		cudaError_t e;

		if (cuda_type_supported(t) && (e = q4kh_for_type(t, f)) != cudaSuccess)
			return e;
	}
	return cudaSuccess;
}

#endif
