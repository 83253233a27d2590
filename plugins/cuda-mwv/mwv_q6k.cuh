/*
 * The Q6_K format of cuda-mwv's kernels (mwv_q6k_kernels.cu: gemv;
 * mwv_multi.cu: gemv_multi; mwv_glu.cu: gemv_glu), on the 224-byte blocks
 * of the copy (q4khost/cuda_q6k_device.cuh).
 */
#ifndef Q4KH_CUDA_MWV_Q6K_CUH
#define Q4KH_CUDA_MWV_Q6K_CUH

#include "q4khost/cuda_q6k_device.cuh"

namespace {

struct q6k_format : q4kh_q6k_rows {
	const float *x; /* column c at x + c * ldx */
	int64_t ldx;

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const q4kh_q6k_piece (&pc)[R],
	                                    int j) const
	{
		const int half = (j >> 2) & 1, l0 = 8 * (j & 3), is = (j & 3) >> 1;
		const float *xp = x + (int64_t)(j >> 3) * 256 + 128 * half + l0;

#pragma unroll
		for (int g = 0; g < 4; g++) {
			float part[R][T] = {};

#pragma unroll
			for (int k = 0; k < 2; k++) {
				float4 xv[T];

#pragma unroll
				for (int c = 0; c < T; c++)
					xv[c] = __ldg((const float4 *)(xp + c * ldx + 32 * g + 4 * k));
#pragma unroll
				for (int r = 0; r < R; r++)
					q4kh_cv_fma_bytes<T>(part[r], codes(pc[r], g, k), 32.0f, xv);
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				/* Scale is + 2 g of the half: bytes 0 .. 3 in .x. */
				const int sb = is + 2 * g;
				const float scale =
					pc[r].d * q4kh_cv_int8_float(sb < 4 ? pc[r].sc.x : pc[r].sc.y, sb & 3);

#pragma unroll
				for (int c = 0; c < T; c++)
					acc[r][c] = fmaf(scale, part[r][c], acc[r][c]);
			}
		}
	}
};

} // namespace

#endif
