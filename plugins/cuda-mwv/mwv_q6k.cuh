/*
 * The Q6_K format of cuda-mwv's kernels (mwv_q6k_kernels.cu: the copy and
 * gemv; mwv_multi.cu: gemv_multi), on the 224-byte blocks of the copy.
 * See mwv_q6k_kernels.cu for the layout.
 */
#ifndef Q4KH_CUDA_MWV_Q6K_CUH
#define Q4KH_CUDA_MWV_Q6K_CUH

#include "q4khost/cuda_variant_device.cuh"

#define Q6K_BYTES 210  /* sizeof(struct q4kh_block_q6_k) */
#define Q6K_PACKED 224 /* the copy's block */
#define Q6K_D 208      /* offset of d in both */
#define Q6K_SCALES 192 /* offset of the scales in both */

namespace {

__device__ __forceinline__ uint2 load8_stream(const void *p)
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

struct q6k_piece {
	uint2 lo, hi, qh; /* ql + l0, ql + 32 + l0, qh + l0 of one half */
	uint2 sc;         /* that half's 8 scales */
	float d;
};

/* Byte B (a constant) of v as a signed 8-bit integer, as a float. */
__device__ __forceinline__ float int8_float(uint32_t v, int b)
{
	return (float)(int8_t)(v >> (8 * b));
}

struct q6k_format {
	typedef q6k_piece piece_t;
	const uint8_t *w;
	int64_t stride;
	int pieces; /* K / 32 */
	const float *x; /* column c at x + c * ldx */
	int64_t ldx;

	__device__ __forceinline__ q6k_piece load(int64_t row, int j) const
	{
		const uint8_t *blk = w + row * stride + (int64_t)(j >> 3) * Q6K_PACKED;
		const int half = (j >> 2) & 1, l0 = 8 * (j & 3);
		q6k_piece p;

		p.lo = load8_stream(blk + 64 * half + l0);
		p.hi = load8_stream(blk + 64 * half + 32 + l0);
		p.qh = load8_stream(blk + 128 + 32 * half + l0);
		p.sc = __ldg((const uint2 *)(blk + Q6K_SCALES + 8 * half));
		p.d = __half2float(__ushort_as_half(__ldg((const unsigned short *)(blk + Q6K_D))));
		return p;
	}

	/* 6-bit codes (bytes 0 .. 63) of group G's four values in word K. */
	static __device__ __forceinline__ uint32_t codes(const q6k_piece &p, int g, int k)
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

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const q6k_piece (&pc)[R],
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
					pc[r].d * int8_float(sb < 4 ? pc[r].sc.x : pc[r].sc.y, sb & 3);

#pragma unroll
				for (int c = 0; c < T; c++)
					acc[r][c] = fmaf(scale, part[r][c], acc[r][c]);
			}
		}
	}
};

} // namespace

#endif
