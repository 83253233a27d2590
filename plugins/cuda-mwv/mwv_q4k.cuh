/*
 * The Q4_K format of cuda-mwv's kernels (mwv_kernels.cu: gemv;
 * mwv_multi.cu: gemv_multi), so that both compute every row alike. See
 * mwv_kernels.cu for the arithmetic.
 */
#ifndef Q4KH_CUDA_MWV_Q4K_CUH
#define Q4KH_CUDA_MWV_Q4K_CUH

#include "q4khost/cuda_q4k_device.cuh"

namespace {

struct mwv_dot : q4kh_q4k_rows {
	const float *x; /* column c at x + c * ldx */
	int64_t ldx;

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const q4kh_q4k_piece (&pc)[R],
	                                    int j) const
	{
		const int sb = j >> 3, p = j & 7;
		const float *xp = x + Q4KH_Q4K_PIECE_X(sb, p);
		/* Per row and sub-block: 32 d sc and -(16 d sc + dmin m). */
		float a[R][2], b[R][2];

#pragma unroll
		for (int r = 0; r < R; r++) {
			float dl[2], ml[2];

			q4kh_q4k_scales(pc[r].h, p >> 1, dl, ml);
#pragma unroll
			for (int s = 0; s < 2; s++) {
				a[r][s] = 32.0f * dl[s];
				b[r][s] = -fmaf(16.0f, dl[s], ml[s]);
			}
		}
#pragma unroll
		for (int c = 0; c < T; c++) {
			float lo[R] = {}, hi[R] = {}, sl = 0.0f, sh = 0.0f;

#pragma unroll
			for (int k = 0; k < 4; k++) {
				const float4 xl = __ldg((const float4 *)(xp + c * ldx + 4 * k));
				const float4 xh =
					__ldg((const float4 *)(xp + c * ldx + 32 + 4 * k));

				sl += (xl.x + xl.y) + (xl.z + xl.w);
				sh += (xh.x + xh.y) + (xh.z + xh.w);
#pragma unroll
				for (int r = 0; r < R; r++) {
					const uint32_t v = q4kh_cv_word(pc[r].q, k);
					const uint32_t l8 = (v << 3) & 0x78787878u;
					const uint32_t h8 = (v >> 1) & 0x78787878u;

					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 0), xl.x, lo[r]);
					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 1), xl.y, lo[r]);
					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 2), xl.z, lo[r]);
					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 3), xl.w, lo[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 0), xh.x, hi[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 1), xh.y, hi[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 2), xh.z, hi[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 3), xh.w, hi[r]);
				}
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				acc[r][c] = fmaf(a[r][0], lo[r], fmaf(b[r][0], sl, acc[r][c]));
				acc[r][c] = fmaf(a[r][1], hi[r], fmaf(b[r][1], sh, acc[r][c]));
			}
		}
	}
};

} // namespace

#endif
