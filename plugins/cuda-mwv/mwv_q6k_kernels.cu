/*
 * Q6_K GEMV with fp32 activations (cuda-mwv), in the streaming shape of
 * variant_device.cuh.
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
#include "../cuda-variant/variant_device.cuh"

#define Q6K_BYTES 210  /* sizeof(struct q4kh_block_q6_k) */
#define Q6K_PACKED 224 /* the copy's block */
#define Q6K_D 208      /* offset of d in both */
#define Q6K_SCALES 192 /* offset of the scales in both */

extern "C" int64_t mwv_q6k_row_bytes(int64_t k)
{
	return k / 256 * Q6K_PACKED;
}

/* One thread per super-block: its 210 bytes, then zero padding. */
__global__ void __launch_bounds__(256)
q6k_pack_kernel(const uint8_t *__restrict__ src, int64_t src_stride,
                int64_t nblk, int64_t total, uint8_t *__restrict__ dst)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < total; i += (int64_t)gridDim.x * blockDim.x) {
		const uint8_t *s = src + i / nblk * src_stride + i % nblk * Q6K_BYTES;
		uint8_t *d = dst + i * Q6K_PACKED;

		for (int b = 0; b < Q6K_PACKED; b++)
			d[b] = b < Q6K_BYTES ? s[b] : 0;
	}
}

extern "C" cudaError_t mwv_q6k_pack(const q4kh_prepared *w, void *dst,
                                    cudaStream_t s)
{
	const int64_t nblk = w->k / 256, total = nblk * w->n;
	const int64_t want = (total + 255) / 256;

	q6k_pack_kernel<<<(unsigned)(want < 65535 ? want : 65535), 256, 0, s>>>(
		w->src, w->src_stride, nblk, total, (uint8_t *)dst);
	return cudaGetLastError();
}

namespace {

__device__ __forceinline__ uint2 load8_stream(const void *p)
{
	uint2 v;

	asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
	    : "=r"(v.x), "=r"(v.y)
	    : "l"(p));
	return v;
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
				for (int r = 0; r < R; r++) {
					const uint32_t v = codes(pc[r], g, k);
					float q[4];

#pragma unroll
					for (int b = 0; b < 4; b++)
						q[b] = cv_byte_float_less(v, b, 32.0f);
#pragma unroll
					for (int c = 0; c < T; c++) {
						part[r][c] = fmaf(q[0], xv[c].x, part[r][c]);
						part[r][c] = fmaf(q[1], xv[c].y, part[r][c]);
						part[r][c] = fmaf(q[2], xv[c].z, part[r][c]);
						part[r][c] = fmaf(q[3], xv[c].w, part[r][c]);
					}
				}
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

extern "C" cudaError_t mwv_q6k_launch(const q4kh_prepared *w, const cv_io *io,
                                      int warps, cudaStream_t s)
{
	q6k_format f;

	f.w = (const uint8_t *)w->data;
	f.stride = w->stride;
	f.pieces = (int)(w->k / 32);
	f.x = io->x;
	f.ldx = io->ldx;
	return cv_stream_launch(f, (int)io->cols, w->n, io->y, io->ldy, warps,
	                        w->multiprocessors, s);
}
