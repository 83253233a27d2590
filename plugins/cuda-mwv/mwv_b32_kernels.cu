/*
 * Q5_0 and Q8_0 GEMV with fp32 activations (cuda-mwv), in the streaming
 * shape of q4khost/cuda_variant_device.cuh, on the copy that prepare
 * makes (mwv_b32.cuh: its planes, the arithmetic).
 *
 * Gemma 3's rows of 640 values are 20 blocks: 20 lanes of a warp take a
 * piece of each row and the other 12 none (q4kh_cv_stream_each skips
 * pieces past the row), which costs issue slots, not bytes; the default
 * model's Q4_K_M file keeps q, k, v, gate and up in Q5_0 and its tied
 * output in Q8_0, since no k-quant's 256-value block divides 640.
 */
#include "mwv.h"
#include "mwv_b32.cuh"

extern "C" int64_t mwv_b32_row_bytes(uint32_t type, int64_t k)
{
	const int64_t bytes = k / 32 * (type == Q4KH_TYPE_Q8_0 ? 34 : 22);

	return (bytes + 15) / 16 * 16;
}

/*
 * One thread a block of the source (SRC rows SRC_STRIDE bytes apart, NBLK
 * blocks a row; 2-byte aligned at best, so byte loads: a warp reads 32
 * neighbouring blocks), its planes stored into DST's rows of STRIDE
 * bytes. The rows' padding is never read.
 */
template <bool Q8>
__global__ void __launch_bounds__(256)
b32_pack_kernel(const uint8_t *__restrict__ src, int64_t src_stride, int64_t nblk,
                int64_t total, uint8_t *__restrict__ dst, int64_t stride)
{
	constexpr int bytes = Q8 ? 34 : 22;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t j = i % nblk;
		const uint8_t *s = src + i / nblk * src_stride + j * bytes;
		uint8_t *row = dst + i / nblk * stride;
		union {
			uint4 v[2];
			uint8_t b[32];
			uint32_t w[8];
		} u;

#pragma unroll
		for (int b = 0; b < bytes - 2; b++)
			u.b[b] = s[2 + b];
		*(unsigned short *)(row + (Q8 ? B32_Q8_SCALES(nblk) : B32_Q5_SCALES(nblk)) + 2 * j) =
			(unsigned short)(s[0] | s[1] << 8);
		if (Q8) {
			*(uint4 *)(row + 32 * j) = u.v[0];
			*(uint4 *)(row + 32 * j + 16) = u.v[1];
		} else {
			/* the block: d, qh[4], qs[16] */
			*(uint32_t *)(row + B32_Q5_HIGH(nblk) + 4 * j) = u.w[0];
			*(uint4 *)(row + 16 * j) =
				make_uint4(u.w[1], u.w[2], u.w[3], u.w[4]);
		}
	}
}

extern "C" cudaError_t mwv_b32_pack(const q4kh_prepared *w, void *dst, cudaStream_t s)
{
	const int64_t nblk = w->k / 32, total = nblk * w->n;
	const int64_t want = (total + 255) / 256;
	const unsigned blocks = (unsigned)(want < 65535 ? want : 65535);
	const int64_t stride = mwv_b32_row_bytes(w->type, w->k);

	if (w->type == Q4KH_TYPE_Q8_0)
		b32_pack_kernel<true><<<blocks, 256, 0, s>>>(w->src, w->src_stride, nblk, total,
		                                             (uint8_t *)dst, stride);
	else
		b32_pack_kernel<false><<<blocks, 256, 0, s>>>(w->src, w->src_stride, nblk, total,
		                                              (uint8_t *)dst, stride);
	return cudaGetLastError();
}

extern "C" cudaError_t mwv_b32_preload(void)
{
	cudaError_t e = q4kh_preload(b32_pack_kernel<true>, b32_pack_kernel<false>);

	if (e == cudaSuccess)
		e = q4kh_cv_stream_preload<q8_0_format>();
	return e != cudaSuccess ? e : q4kh_cv_stream_preload<q5_0_format>();
}

extern "C" cudaError_t mwv_b32_launch(const q4kh_prepared *w, const q4kh_cv_io *io,
                                      int warps, cudaStream_t s)
{
	if (w->type == Q4KH_TYPE_Q8_0)
		return mwv_stream_gemv(q8_0_format(), w, io, warps, s);
	return mwv_stream_gemv(q5_0_format(), w, io, warps, s);
}
