/*
 * Q6_K as the CUDA variants read it (header-only, for nvcc; the in-tree
 * cuda-mwv's and cuda-dp4a's): the 16-byte-aligned copy prepare makes,
 * its copy kernel, and pieces for the streaming shape of
 * cuda_variant_device.cuh.
 *
 * Q6_K's 210-byte super-blocks leave its rows and blocks 2-byte aligned,
 * so prepare copies each block into 224 bytes (ql 128, qh 64, scales 16,
 * d, 14 bytes of padding: 7 % more bytes read) where every field is
 * 8-byte aligned. A piece is 32 values: lane bytes l0 .. l0 + 7 of one
 * half's ql (values l0 + i and, high nibbles, l0 + 64 + i), of ql + 32
 * (values l0 + 32 + i, l0 + 96 + i) and of qh (their high two bits), as
 * quant.h's layout has them; three 8-byte loads. Piece j of a row is
 * half (j / 4) % 2 of super-block j / 8, l0 = 8 (j % 4); its group g
 * (0 .. 3, q4kh_q6k_rows::codes) holds values 128 half + 32 g + l0 .. + 7
 * of the super-block, all of scale is + 2 g of the half, is = (j % 4) / 2.
 */
#ifndef Q4KHOST_CUDA_Q6K_DEVICE_CUH
#define Q4KHOST_CUDA_Q6K_DEVICE_CUH

#include "q4khost/cuda_variant_device.cuh"

#define Q4KH_Q6K_BYTES 210  /* sizeof(struct q4kh_block_q6_k) */
#define Q4KH_Q6K_PACKED 224 /* the copy's block */
#define Q4KH_Q6K_D 208      /* offset of d in both */
#define Q4KH_Q6K_SCALES 192 /* offset of the scales in both */

/* 16-byte pieces of the copy's block; its last 14 bytes are zeros. */
#define Q4KH_Q6K_COPY_PIECES (Q4KH_Q6K_PACKED / 16)
static_assert(Q4KH_Q6K_PACKED % 16 == 0, "the copy's blocks are 16-byte pieces");

/* 8 bytes of weights, read once per launch (as q4kh_cv_load_stream). */
__device__ __forceinline__ uint2 q4kh_cv_load8_stream(const void *p)
{
#ifdef Q4KH_EMU_H
	/* tests/emu: a plain load that checks its alignment */
	emu_check_align(p, 8);
	return *(const uint2 *)p;
#else
	uint2 v;

	asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
	    : "=r"(v.x), "=r"(v.y)
	    : "l"(p));
	return v;
#endif
}

/* What q4kh_cv_stream_kernel loads for one piece. */
struct q4kh_q6k_piece {
	uint2 lo, hi, qh; /* ql + l0, ql + 32 + l0, qh + l0 of one half */
	uint2 sc;         /* that half's 8 scales */
	float d;
};

/*
 * The Q6_K half of a q4kh_cv_stream_kernel format, on the copy's rows
 * STRIDE bytes apart: a variant's format derives from it and adds dot().
 */
struct q4kh_q6k_rows {
	typedef q4kh_q6k_piece piece_t;
	const uint8_t *w;
	int64_t stride;
	int pieces; /* K / 32 */

	__device__ __forceinline__ q4kh_q6k_piece load(int64_t row, int j) const
	{
		const uint8_t *blk = w + row * stride + (int64_t)(j >> 3) * Q4KH_Q6K_PACKED;
		const int half = (j >> 2) & 1, l0 = 8 * (j & 3);
		q4kh_q6k_piece p;

		p.lo = q4kh_cv_load8_stream(blk + 64 * half + l0);
		p.hi = q4kh_cv_load8_stream(blk + 64 * half + 32 + l0);
		p.qh = q4kh_cv_load8_stream(blk + 128 + 32 * half + l0);
		p.sc = __ldg((const uint2 *)(blk + Q4KH_Q6K_SCALES + 8 * half));
		p.d = __half2float(
			__ushort_as_half(__ldg((const unsigned short *)(blk + Q4KH_Q6K_D))));
		return p;
	}

	/* 6-bit codes (bytes 0 .. 63) of group G's four values in word K. */
	static __device__ __forceinline__ uint32_t codes(const q4kh_q6k_piece &p, int g, int k)
	{
		const uint32_t a = k ? p.lo.y : p.lo.x, b = k ? p.hi.y : p.hi.x;
		const uint32_t h = k ? p.qh.y : p.qh.x;

		switch (g) {
		case 0: return (a & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u);
		case 1: return (b & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u);
		case 2: return ((a >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u);
		default: return ((b >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u);
		}
	}
};

/* Byte B (a constant) of v as a signed 8-bit integer, as a float. */
__device__ __forceinline__ float q4kh_cv_int8_float(uint32_t v, int b)
{
	return (float)(int8_t)(v >> (8 * b));
}

/*
 * One thread per 16 bytes of the copy: byte loads from the source (2-byte
 * aligned at best; a warp reads 512 neighbouring bytes), one 16-byte
 * store. NBLK blocks a row, TOTAL in all.
 */
static __global__ void __launch_bounds__(256)
q4kh_q6k_copy_kernel(const uint8_t *__restrict__ src, int64_t src_stride, int64_t nblk,
                     int64_t total, uint8_t *__restrict__ dst)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < total * Q4KH_Q6K_COPY_PIECES; i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t blk = i / Q4KH_Q6K_COPY_PIECES;
		const int b0 = (int)(i % Q4KH_Q6K_COPY_PIECES) * 16;
		const uint8_t *s = src + blk / nblk * src_stride + blk % nblk * Q4KH_Q6K_BYTES;
		union {
			uint4 v;
			uint8_t b[16];
		} u;

#pragma unroll
		for (int b = 0; b < 16; b++)
			u.b[b] = b0 + b < Q4KH_Q6K_BYTES ? s[b0 + b] : 0;
		*(uint4 *)(dst + blk * Q4KH_Q6K_PACKED + b0) = u.v;
	}
}

/* Bytes of one row of K values in the copy (224 per 256 values). */
static inline int64_t q4kh_q6k_row_bytes(int64_t k)
{
	return k / 256 * Q4KH_Q6K_PACKED;
}

/*
 * Enqueue on stream s the copy of Q6_K weight w (w->src, w->src_stride)
 * into DST (q4kh_q6k_row_bytes(w->k) * w->n bytes). Returns the launch's
 * error.
 */
static inline cudaError_t q4kh_q6k_copy(const q4kh_prepared *w, void *dst, cudaStream_t s)
{
	const int64_t nblk = w->k / 256, total = nblk * w->n;
	const int64_t want = (total * Q4KH_Q6K_COPY_PIECES + 255) / 256;

	return q4kh_pdl_launch(false, q4kh_q6k_copy_kernel,
	                       (unsigned)(want < 65535 ? want : 65535), 256, 0, s, w->src,
	                       w->src_stride, nblk, total, (uint8_t *)dst);
}

#endif
