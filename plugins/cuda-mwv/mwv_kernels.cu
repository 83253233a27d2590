/*
 * Q4_K GEMV with fp32 activations: the shape is variant_device.cuh's, the
 * pieces q4k_device.cuh's.
 *
 * Each weight is dequantized as the cpu reference does it: fma(q, d sc,
 * -dmin m) rounds once, like its d*sc*q - dmin*m (the product is exact),
 * so the only difference from the reference is the fp32 accumulation.
 */
#include "mwv.h"
#include "../cuda-variant/q4k_device.cuh"

template <int T, int R>
__global__ void __launch_bounds__(CV_MAX_WARPS * 32)
mwv_kernel(const uint8_t *__restrict__ w, int64_t stride, int pieces,
           int64_t n, const float *__restrict__ x, int64_t ldx,
           float *__restrict__ y, int64_t ldy, int group)
{
	extern __shared__ float red[];
	const int64_t row0 = cv_first_row<R>(group);
	const uint8_t *rows[R];
	float acc[R][T] = {};

#pragma unroll
	for (int r = 0; r < R; r++)
		rows[r] = w + (row0 + r < n ? row0 + r : n - 1) * stride;
#pragma unroll 2
	for (int j = threadIdx.x & (group - 1); j < pieces; j += group) {
		const int sb = j >> 3, p = j & 7;
		const float *xp = x + Q4K_PIECE_X(sb, p);
		float dl[R][2], ml[R][2];
		uint4 q[R];

#pragma unroll
		for (int r = 0; r < R; r++) {
			const uint8_t *blk = q4k_block(rows[r], sb);

			q[r] = cv_load_stream(blk + 16 + 16 * p);
			q4k_scales(__ldg((const uint4 *)blk), p >> 1, dl[r], ml[r]);
		}
#pragma unroll
		for (int k = 0; k < 4; k++) {
			float4 xl[T], xh[T];

#pragma unroll
			for (int c = 0; c < T; c++) {
				xl[c] = __ldg((const float4 *)(xp + c * ldx + 4 * k));
				xh[c] = __ldg((const float4 *)(xp + c * ldx + 32 + 4 * k));
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				const uint32_t v = cv_word(q[r], k);
				const uint32_t lo = v & 0x0F0F0F0F, hi = (v >> 4) & 0x0F0F0F0F;
				float wl[4], wh[4];

#pragma unroll
				for (int b = 0; b < 4; b++) {
					wl[b] = fmaf(cv_byte_float(lo, b), dl[r][0], -ml[r][0]);
					wh[b] = fmaf(cv_byte_float(hi, b), dl[r][1], -ml[r][1]);
				}
#pragma unroll
				for (int c = 0; c < T; c++) {
					acc[r][c] = fmaf(wl[0], xl[c].x, acc[r][c]);
					acc[r][c] = fmaf(wl[1], xl[c].y, acc[r][c]);
					acc[r][c] = fmaf(wl[2], xl[c].z, acc[r][c]);
					acc[r][c] = fmaf(wl[3], xl[c].w, acc[r][c]);
					acc[r][c] = fmaf(wh[0], xh[c].x, acc[r][c]);
					acc[r][c] = fmaf(wh[1], xh[c].y, acc[r][c]);
					acc[r][c] = fmaf(wh[2], xh[c].z, acc[r][c]);
					acc[r][c] = fmaf(wh[3], xh[c].w, acc[r][c]);
				}
			}
		}
	}
	cv_reduce_store<R, T>(acc, group, red, row0, n, y, ldy);
}

namespace {

struct mwv_launcher {
	const q4kh_prepared *w;
	const cv_io *io;
	int64_t pieces;

	template <int T, int R>
	cudaError_t launch(const cv_geom &g, cudaStream_t s) const
	{
		mwv_kernel<T, R><<<g.blocks, g.threads, g.shared, s>>>(
			(const uint8_t *)w->data, w->stride, (int)pieces, w->n, io->x,
			io->ldx, io->y, io->ldy, g.group);
		return cudaGetLastError();
	}
};

} // namespace

extern "C" cudaError_t mwv_probe(void)
{
	cudaFuncAttributes a;

	return cudaFuncGetAttributes(&a, mwv_kernel<1, CV_ROWS(1)>);
}

extern "C" cudaError_t mwv_launch(const q4kh_prepared *w, const cv_io *io,
                                  int warps, cudaStream_t s)
{
	const mwv_launcher l = { w, io, w->k / (Q4K_VALUES / Q4K_PIECES) };

	return cv_launch(l, (int)io->cols, w->n, warps, w->multiprocessors, s);
}
