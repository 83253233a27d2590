/*
 * Q4_K as the CUDA variants read it (the layout is quant.h's): pieces for
 * the streaming shape of cuda_variant_device.cuh, header-only device code
 * for nvcc, the in-tree cuda-mwv's and cuda-dp4a's.
 *
 * A piece is 16 bytes of a super-block's qs: piece p (0..7) of super-block
 * sb holds values 16 (p % 2) .. +15 of sub-block 2 (p / 2) in its low
 * nibbles and the same values of sub-block 2 (p / 2) + 1 in its high
 * nibbles, so eight lanes read a super-block's 128 code bytes in one
 * coalesced sweep, plus the 16-byte header (d, dmin, scales) all eight
 * share. Activation value i of a piece's low nibbles is at
 * Q4KH_Q4K_PIECE_X(sb, p) + i, of its high nibbles 32 further.
 */
#ifndef Q4KHOST_CUDA_Q4K_DEVICE_CUH
#define Q4KHOST_CUDA_Q4K_DEVICE_CUH

#include "q4khost/cuda_variant_device.cuh"

#define Q4KH_Q4K_VALUES 256      /* per super-block */
#define Q4KH_Q4K_BLOCK_BYTES 144 /* sizeof(struct q4kh_block_q4_k) */
#define Q4KH_Q4K_PIECES 8        /* per super-block */

#define Q4KH_Q4K_PIECE_X(sb, p) ((sb) * Q4KH_Q4K_VALUES + ((p) >> 1) * 64 + ((p) & 1) * 16)

/* What q4kh_cv_stream_kernel loads for one piece: codes and header. */
struct q4kh_q4k_piece {
	uint4 q, h;
};

/*
 * The Q4_K half of a q4kh_cv_stream_kernel format: rows of super-blocks STRIDE
 * bytes apart, 16-byte aligned. A variant's format derives from it and
 * adds dot().
 */
struct q4kh_q4k_rows {
	typedef q4kh_q4k_piece piece_t;
	const uint8_t *w;
	int64_t stride;
	int pieces; /* K / 32 */

	__device__ __forceinline__ q4kh_q4k_piece load(int64_t row, int j) const
	{
		const uint8_t *blk = w + row * stride + (int64_t)(j >> 3) * Q4KH_Q4K_BLOCK_BYTES;
		q4kh_q4k_piece p;

		p.q = q4kh_cv_load_stream(blk + 16 + 16 * (j & 7));
		p.h = __ldg((const uint4 *)blk);
		return p;
	}
};

/*
 * d * sc and dmin * m of sub-blocks 2 pair and 2 pair + 1 from a header
 * h = {d | dmin << 16, scales[0..3], scales[4..7], scales[8..11]}, with
 * quant.h's 6-bit packing. Every product is exact.
 */
__device__ __forceinline__ void q4kh_q4k_scales(const uint4 &h, int pair,
                                                float (&dl)[2], float (&ml)[2])
{
	const int shift = 16 * (pair & 1);
	const uint32_t a = h.y >> shift, b = h.z >> shift, c = h.w >> shift;
	/* The two sub-blocks' 6-bit values, one per byte. */
	const uint32_t sc = pair < 2 ? a & 0x3F3F
	                             : (c & 0x0F0F) | ((a >> 2) & 0x3030);
	const uint32_t m = pair < 2 ? b & 0x3F3F
	                            : ((c >> 4) & 0x0F0F) | ((b >> 2) & 0x3030);
	const float d = q4kh_cv_half_float(h.x, 0), dmin = q4kh_cv_half_float(h.x, 1);

	dl[0] = d * q4kh_cv_byte_float(sc, 0);
	dl[1] = d * q4kh_cv_byte_float(sc, 1);
	ml[0] = dmin * q4kh_cv_byte_float(m, 0);
	ml[1] = dmin * q4kh_cv_byte_float(m, 1);
}

/*
 * 0.5 + q / 32 for the 4-bit code q held as q << 3 in byte B (a constant)
 * of v, exactly: one byte permute puts the code under the exponent of
 * 0.5. With S = sum x, sum q x = 32 sum (0.5 + q / 32) x - 16 S.
 */
__device__ __forceinline__ float q4kh_q4k_half_plus(uint32_t v, int b)
{
	return __int_as_float((int)__byte_perm(v, 0x3F000000u, 0x7044u | (b << 8)));
}

#endif
