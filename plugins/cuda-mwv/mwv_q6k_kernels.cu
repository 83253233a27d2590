/*
 * Q6_K GEMV with fp32 activations (cuda-mwv), in the streaming shape of
 * q4khost/cuda_variant_device.cuh.
 *
 * Q6_K's 210-byte super-blocks leave its rows and blocks 2-byte aligned,
 * so prepare copies each block into 224 bytes (ql 128, qh 64, scales 16,
 * d, 14 bytes of padding: 7 % more bytes read) where every field is
 * 8-byte aligned. A piece is 32 values: lane bytes l0 .. l0 + 7 of one
 * half's ql (values l0 + i and, high nibbles, l0 + 64 + i), of ql + 32
 * (values l0 + 32 + i, l0 + 96 + i) and of qh (their high two bits), as
 * quant.h's layout has them; three 8-byte loads. Each group of 8 values
 * meets its own int8 scale; q - 32 comes out of one byte permute and one
 * subtraction, exactly, and every weight d * sc * (q - 32) is applied as
 * the cpu reference does, up to fp32 accumulation.
 */
#include "mwv.h"
#include "mwv_q6k.cuh"

extern "C" int64_t mwv_q6k_row_bytes(int64_t k)
{
	return k / 256 * Q6K_PACKED;
}

/* 16-byte pieces of the copy's block; its last 14 bytes are zeros. */
#define Q6K_PIECES (Q6K_PACKED / 16)
static_assert(Q6K_PACKED % 16 == 0, "the copy's blocks are 16-byte pieces");

/* One thread per 16 bytes of the copy: byte loads from the source (2-byte
 * aligned at best; a warp reads 512 neighbouring bytes), one 16-byte
 * store. */
__global__ void __launch_bounds__(256)
q6k_pack_kernel(const uint8_t *__restrict__ src, int64_t src_stride,
                int64_t nblk, int64_t total, uint8_t *__restrict__ dst)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < total * Q6K_PIECES; i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t blk = i / Q6K_PIECES;
		const int b0 = (int)(i % Q6K_PIECES) * 16;
		const uint8_t *s = src + blk / nblk * src_stride + blk % nblk * Q6K_BYTES;
		union {
			uint4 v;
			uint8_t b[16];
		} u;

#pragma unroll
		for (int b = 0; b < 16; b++)
			u.b[b] = b0 + b < Q6K_BYTES ? s[b0 + b] : 0;
		*(uint4 *)(dst + blk * Q6K_PACKED + b0) = u.v;
	}
}

extern "C" cudaError_t mwv_q6k_pack(const q4kh_prepared *w, void *dst,
                                    cudaStream_t s)
{
	const int64_t nblk = w->k / 256, total = nblk * w->n;
	const int64_t want = (total * Q6K_PIECES + 255) / 256;

	q6k_pack_kernel<<<(unsigned)(want < 65535 ? want : 65535), 256, 0, s>>>(
		w->src, w->src_stride, nblk, total, (uint8_t *)dst);
	return cudaGetLastError();
}

extern "C" cudaError_t mwv_q6k_preload(void)
{
	const cudaError_t e = q4kh_preload(q6k_pack_kernel);

	return e != cudaSuccess ? e : q4kh_cv_stream_preload<q6k_format>();
}

extern "C" cudaError_t mwv_q6k_launch(const q4kh_prepared *w, const q4kh_cv_io *io,
                                      int warps, cudaStream_t s)
{
	return mwv_stream_gemv(q6k_format(), w, io, warps, s);
}
