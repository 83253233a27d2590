/*
 * The Q5_0 and Q8_0 formats of cuda-mwv's kernels (mwv_b32_kernels.cu:
 * the copy and gemv; mwv_multi.cu: gemv_multi; mwv_glu.cu: gemv_glu), on
 * the rows of the copy that prepare makes.
 *
 * Both types have blocks of 32 values with an fp16 scale d in front (Q5_0
 * 22 bytes: d, 4 bytes of fifth bits qh, 16 bytes of nibbles qs; Q8_0 34
 * bytes: d, 32 int8), so neither keeps its fields 16-byte aligned. The
 * copy splits each row into planes, a block's share of each at the same
 * index: Q8_0 the 32 codes of every block (32 j), then the scales (32
 * pieces + 2 j); Q5_0 the nibbles (16 j), the fifth bits (16 pieces +
 * 4 j), the scales (20 pieces + 2 j). A row is its bytes rounded up to
 * 16 (Q8_0 rows of 640 values: 688 bytes for 680; of 4096: 4352, as
 * many). A piece is a block: 16-byte loads of codes, a 4-byte one of
 * fifth bits, a 2-byte one of the scale, a warp's 32 pieces reading
 * neighbouring bytes in each plane.
 */
#ifndef Q4KH_CUDA_MWV_B32_CUH
#define Q4KH_CUDA_MWV_B32_CUH

#include "q4khost/cuda_variant_device.cuh"

/* Offsets in a row of the copy, for rows of PIECES blocks. */
#define B32_Q8_SCALES(pieces) (32 * (int64_t)(pieces))
#define B32_Q5_HIGH(pieces) (16 * (int64_t)(pieces))
#define B32_Q5_SCALES(pieces) (20 * (int64_t)(pieces))

namespace {

/* The fp16 at P (2-byte aligned) as a float. */
__device__ __forceinline__ float b32_scale(const uint8_t *p)
{
	return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
}

/*
 * A format of the copy (q4kh_cv_stream_each's F): the fields, and the dot
 * of a piece for codes that are bytes q + BIAS, F::codes(p, k) the four
 * of values 4 k .. 4 k + 3 (k = 0 .. 7) of piece p.
 */
template <class F, class P, int BIAS>
struct b32_format {
	typedef P piece_t;
	const uint8_t *w; /* the copy's rows */
	int64_t stride;
	int pieces; /* K / 32 */
	const float *x; /* column c at x + c * ldx */
	int64_t ldx;

	/*
	 * acc[r][c] += d_r sum_i q_ri x[32 j + i, c]: per row its 32 codes
	 * (exact floats) times x in fp32 fmas, in order, then one fma with
	 * its scale, as the cpu reference's d q up to fp32 rounding.
	 */
	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const P (&pc)[R], int j) const
	{
		const float *xp = x + 32 * (int64_t)j;
		float part[R][T] = {};

#pragma unroll
		for (int k = 0; k < 8; k++) {
			float4 xv[T];

#pragma unroll
			for (int c = 0; c < T; c++)
				xv[c] = __ldg((const float4 *)(xp + c * ldx + 4 * k));
#pragma unroll
			for (int r = 0; r < R; r++)
				q4kh_cv_fma_bytes<T>(part[r], F::codes(pc[r], k), (float)BIAS, xv);
		}
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < T; c++)
				acc[r][c] = fmaf(pc[r].d, part[r][c], acc[r][c]);
	}
};

struct q8_0_piece {
	uint4 lo, hi; /* codes 0 .. 15, 16 .. 31 */
	float d;
};

/* Q8_0: q + 128 is the code with its sign bit flipped. */
struct q8_0_format : b32_format<q8_0_format, q8_0_piece, 128> {
	__device__ __forceinline__ q8_0_piece load(int64_t row, int j) const
	{
		const uint8_t *base = w + row * stride;
		q8_0_piece p;

		p.lo = q4kh_cv_load_stream(base + 32 * (int64_t)j);
		p.hi = q4kh_cv_load_stream(base + 32 * (int64_t)j + 16);
		p.d = b32_scale(base + B32_Q8_SCALES(pieces) + 2 * j);
		return p;
	}

	static __device__ __forceinline__ uint32_t codes(const q8_0_piece &p, int k)
	{
		return q4kh_cv_word(k < 4 ? p.lo : p.hi, k & 3) ^ 0x80808080u;
	}
};

struct q5_0_piece {
	uint4 qs;    /* nibbles: value i low in byte i, value 16 + i high */
	uint32_t qh; /* bit i: fifth bit of value i */
	float d;
};

/* Bits 0 .. 3 of H at bit 4 of bytes 0 .. 3 (the products do not overlap). */
__device__ __forceinline__ uint32_t q5_0_spread(uint32_t h)
{
	return ((h & 0xFu) * 0x00204081u & 0x01010101u) << 4;
}

/* Q5_0: q + 16 is the nibble with its fifth bit. */
struct q5_0_format : b32_format<q5_0_format, q5_0_piece, 16> {
	__device__ __forceinline__ q5_0_piece load(int64_t row, int j) const
	{
		const uint8_t *base = w + row * stride;
		q5_0_piece p;

		p.qs = q4kh_cv_load_stream(base + 16 * (int64_t)j);
		p.qh = __ldg((const unsigned *)(base + B32_Q5_HIGH(pieces) + 4 * j));
		p.d = b32_scale(base + B32_Q5_SCALES(pieces) + 2 * j);
		return p;
	}

	/* values 4 k ..: low nibbles of word k (k < 4), else high ones of k - 4 */
	static __device__ __forceinline__ uint32_t codes(const q5_0_piece &p, int k)
	{
		const uint32_t v = q4kh_cv_word(p.qs, k & 3);

		return ((k < 4 ? v : v >> 4) & 0x0F0F0F0Fu) | q5_0_spread(p.qh >> 4 * k);
	}
};

} // namespace

#endif
