/*
 * The device code cuda-dp4a's kernels share (dp4a_kernels.cu: gemv;
 * dp4a_fused.cu: gemv_multi and gemv_glu): the int8 activations, made by
 * one quantiser, and the Q4_K format that meets them in __dp4a.
 *
 * Activations: each column is cut into blocks of 32 values (Q8_1-style):
 * d = max |x| / 127, q = round(x / d), kept with d and d * sum(q); a
 * non-finite value makes its block's pair NaN, so it reaches y instead of
 * vanishing in the max. Codes of column c at q + c * K (value order), the
 * pairs at ds + c * (K / 32). A kernel's blocks make them in shared memory
 * in their prologue (dp4a_prologue, when dp4a_shared_bytes fits
 * DP4A_SHARED_MOST), else a kernel of their own makes them in the
 * context's scratch before the product (dp4a_kernels.cu).
 *
 * Q4_K: with the streaming shape of q4khost/cuda_variant_device.cuh and the
 * pieces of q4khost/cuda_q4k_device.cuh, each 16-byte piece (32 weights of
 * two sub-blocks) meets 16 + 16 int8 activations in eight __dp4a; the Q4_K
 * mins need no per-value work: sub-block j of a super-block contributes
 *   d sc_j sum_i q_i a_i  -  dmin m_j d_a sum_i a_i
 * and the second sum is the stored block sum (the lane reading the first
 * half of a sub-block adds it). The result is the exact dot product of
 * the dequantized weights with the dequantized activations, up to fp32
 * rounding; the int8 rounding of the activations is the whole error
 * (tests/cuda_variant_rig.h bounds it).
 */
#ifndef Q4KH_CUDA_DP4A_CUH
#define Q4KH_CUDA_DP4A_CUH

#include "dp4a.h"
#include "q4khost/cuda_q4k_device.cuh"
#include "q4khost/cuda_q6k_device.cuh"

#define DP4A_QB 32 /* activation values per int8 block */

/* Bytes of int8 activations for COLS columns of K values: codes, then pairs. */
static inline size_t dp4a_shared_bytes(int64_t k, int64_t cols)
{
	return (size_t)(k * cols) + sizeof(float2) * (size_t)(k / DP4A_QB * cols);
}

/* Blocks of 32 activations a thread quantises at once (dp4a_quantize_range). */
#define DP4A_QUANT_STEP 2

namespace {

/*
 * Quantise one block of 32 activations held 8 a thread by lanes 4i ..
 * 4i + 3 of a warp (v: the thread's values, in order): the thread's 8
 * codes into *q and, from lane 4i, {d, d * sum q} into *ds; a lane with
 * OWN false (past the last block) stores nothing. Every lane of the warp
 * must call it.
 */
__device__ __forceinline__ void dp4a_quantize8(const float4 (&v)[2], bool own, uint2 *q,
                                               float2 *ds)
{
	const float f[8] = { v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w };
	float amax = 0.0f, d;
	int bad = 0, sum = 0;
	uint32_t w[2] = { 0, 0 };

#pragma unroll
	for (int i = 0; i < 8; i++) {
		amax = fmaxf(amax, fabsf(f[i]));
		bad |= !isfinite(f[i]);
	}
	for (int off = 1; off < 4; off <<= 1) {
		amax = fmaxf(amax, __shfl_xor_sync(Q4KH_CV_FULL_MASK, amax, off));
		bad |= __shfl_xor_sync(Q4KH_CV_FULL_MASK, bad, off);
	}
	d = amax / 127.0f;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		const int qi = amax > 0.0f ? __float2int_rn(f[i] / d) : 0;

		sum += qi;
		w[i >> 2] |= (uint32_t)(qi & 0xFF) << (8 * (i & 3));
	}
	for (int off = 1; off < 4; off <<= 1)
		sum += __shfl_xor_sync(Q4KH_CV_FULL_MASK, sum, off);
	if (!own)
		return;
	*q = make_uint2(w[0], w[1]);
	if ((threadIdx.x & 3) == 0)
		*ds = bad ? make_float2(__int_as_float(0x7FC00000), __int_as_float(0x7FC00000))
		          : make_float2(d, d * (float)sum);
}

/*
 * Thread I of NTHREADS (a multiple of 32, every one calling) quantises its
 * share of the BLOCKS blocks of 32 values of x (column c at x + c * ldx,
 * K values) into q and ds (the layout at the top of this file): 8 values
 * a thread, DP4A_QUANT_STEP blocks' loads of each thread in flight at once
 * (few: in a prologue the first weights' loads hold registers too).
 */
__device__ __forceinline__ void dp4a_quantize_range(const float *__restrict__ x, int64_t ldx,
                                                    int64_t k, int64_t blocks, int64_t i,
                                                    int64_t nthreads, int8_t *q, float2 *ds)
{
	enum { B = DP4A_QUANT_STEP };
	const int64_t per_col = k / DP4A_QB, step = nthreads / 4;

	for (int64_t b0 = i >> 2; b0 - (i >> 2) < blocks; b0 += B * step) {
		float4 v[B][2];

#pragma unroll
		for (int u = 0; u < B; u++) {
			const int64_t b = b0 + u * step;
			const float *p = x + b / per_col * ldx + b % per_col * DP4A_QB + (i & 3) * 8;

			v[u][0] = b < blocks ? __ldg((const float4 *)p) : make_float4(0, 0, 0, 0);
			v[u][1] = b < blocks ? __ldg((const float4 *)p + 1) : make_float4(0, 0, 0, 0);
		}
#pragma unroll
		for (int u = 0; u < B; u++) {
			const int64_t b = b0 + u * step;

			dp4a_quantize8(v[u], b < blocks,
			               (uint2 *)(q + b / per_col * k + b % per_col * DP4A_QB +
			                         (i & 3) * 8),
			               ds + b);
		}
	}
}

/*
 * The prologue of a kernel that streams with q4kh_cv_stream_each_after:
 * wait for the kernel that wrote x, quantise its T columns of K values
 * into the block's shared memory (q, ds: dp4a_shared_bytes), and
 * __syncthreads.
 */
template <int T>
struct dp4a_prologue {
	const float *x;
	int64_t ldx, k;
	int8_t *q;
	float2 *ds;

	__device__ __forceinline__ void operator()() const
	{
		q4kh_pdl_wait();
		dp4a_quantize_range(x, ldx, k, T * (k / DP4A_QB), threadIdx.x, blockDim.x, q, ds);
		__syncthreads();
	}
};

/*
 * v as a float, exactly, for |v| < 2^22 (a piece's dot product is at most
 * 16 * 15 * 127): v added to the bits of 1.5 * 2^23 lands in its mantissa,
 * and one subtraction leaves v. Two full-rate instructions where an
 * integer conversion runs at a quarter rate, once per column and row.
 */
__device__ __forceinline__ float dp4a_small_int_float(int v)
{
	return __int_as_float(v + 0x4B400000) - 12582912.0f;
}

/*
 * 16 bytes of int8 activations and a block's pair: from shared memory
 * (SHARED), else through the read-only cache from the scratch.
 */
template <bool SHARED>
__device__ __forceinline__ uint4 dp4a_x16(const int8_t *p)
{
	return SHARED ? *(const uint4 *)p : __ldg((const uint4 *)p);
}

template <bool SHARED>
__device__ __forceinline__ uint2 dp4a_x8(const int8_t *p)
{
	return SHARED ? *(const uint2 *)p : __ldg((const uint2 *)p);
}

template <bool SHARED>
__device__ __forceinline__ float2 dp4a_pair(const float2 *p)
{
	return SHARED ? *p : __ldg(p);
}

/*
 * The Q4_K format (q4kh_cv_stream_kernel's F) on int8 activations, from
 * shared memory when SHARED.
 */
template <bool SHARED>
struct dp4a_q4k : q4kh_q4k_rows {
	const int8_t *xq;  /* codes, column c at xq + c * k */
	const float2 *ds;  /* {d, d * sum}, column c at ds + c * (k / DP4A_QB) */
	int64_t k;

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const q4kh_q4k_piece (&pc)[R],
	                                    int j) const
	{
		const int sb = j >> 3, p = j & 7;
		const int64_t nb = k / DP4A_QB;
		/* Activation blocks of sub-blocks 2 (p / 2) and 2 (p / 2) + 1. */
		const int64_t b0 = (int64_t)sb * Q4KH_Q4K_PIECES + (p & ~1);
		const int8_t *xp = xq + Q4KH_Q4K_PIECE_X(sb, p);
		uint32_t lo[R][4], hi[R][4];
		float dl[R][2], ml[R][2];

#pragma unroll
		for (int r = 0; r < R; r++) {
			q4kh_q4k_scales(pc[r].h, p >> 1, dl[r], ml[r]);
			/* Each sub-block's min once: by its first half's lane. */
			if (p & 1)
				ml[r][0] = ml[r][1] = 0.0f;
#pragma unroll
			for (int i = 0; i < 4; i++) {
				lo[r][i] = q4kh_cv_word(pc[r].q, i) & 0x0F0F0F0F;
				hi[r][i] = (q4kh_cv_word(pc[r].q, i) >> 4) & 0x0F0F0F0F;
			}
		}
#pragma unroll
		for (int c = 0; c < T; c++) {
			const uint4 al = dp4a_x16<SHARED>(xp + c * k);
			const uint4 ah = dp4a_x16<SHARED>(xp + c * k + 32);
			const float2 s0 = dp4a_pair<SHARED>(ds + c * nb + b0);
			const float2 s1 = dp4a_pair<SHARED>(ds + c * nb + b0 + 1);

#pragma unroll
			for (int r = 0; r < R; r++) {
				int il = 0, ih = 0;

#pragma unroll
				for (int i = 0; i < 4; i++) {
					il = __dp4a((int)lo[r][i], (int)q4kh_cv_word(al, i), il);
					ih = __dp4a((int)hi[r][i], (int)q4kh_cv_word(ah, i), ih);
				}
				acc[r][c] = fmaf(dl[r][0] * s0.x, dp4a_small_int_float(il), acc[r][c]);
				acc[r][c] = fmaf(dl[r][1] * s1.x, dp4a_small_int_float(ih), acc[r][c]);
				acc[r][c] = fmaf(-ml[r][0], s0.y, acc[r][c]);
				acc[r][c] = fmaf(-ml[r][1], s1.y, acc[r][c]);
			}
		}
	}
};

/*
 * The Q6_K format on int8 activations, on the copy's rows
 * (q4khost/cuda_q6k_device.cuh), from shared memory when SHARED. Group g
 * of a piece (8 values, one scale, all in activation block 8 sb + 4 half
 * + g) is two __dp4a of the 6-bit codes q against the int8 codes a, from
 * -32 sum a (two __dp4a against ones, once per column for every row):
 * sum (q - 32) a exactly, scaled by d sc d_a.
 */
template <bool SHARED>
struct dp4a_q6k : q4kh_q6k_rows {
	const int8_t *xq;
	const float2 *ds;
	int64_t k;

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const q4kh_q6k_piece (&pc)[R],
	                                    int j) const
	{
		const int half = (j >> 2) & 1, l0 = 8 * (j & 3), is = (j & 3) >> 1;
		const int64_t nb = k / DP4A_QB, b0 = (int64_t)(j >> 3) * 8 + 4 * half;
		const int8_t *xp = xq + (int64_t)(j >> 3) * 256 + 128 * half + l0;

#pragma unroll
		for (int g = 0; g < 4; g++) {
			uint32_t q[R][2];
			float dsc[R];

#pragma unroll
			for (int r = 0; r < R; r++) {
				/* Scale is + 2 g of the half: bytes 0 .. 3 in .x. */
				const int sb = is + 2 * g;

				q[r][0] = q4kh_q6k_rows::codes(pc[r], g, 0);
				q[r][1] = q4kh_q6k_rows::codes(pc[r], g, 1);
				dsc[r] = pc[r].d *
				         q4kh_cv_int8_float(sb < 4 ? pc[r].sc.x : pc[r].sc.y, sb & 3);
			}
#pragma unroll
			for (int c = 0; c < T; c++) {
				const uint2 a = dp4a_x8<SHARED>(xp + c * k + 32 * g);
				const float da = dp4a_pair<SHARED>(ds + c * nb + b0 + g).x;
				const int base = -32 * __dp4a(0x01010101, (int)a.y,
				                              __dp4a(0x01010101, (int)a.x, 0));

#pragma unroll
				for (int r = 0; r < R; r++) {
					const int v = __dp4a((int)q[r][1], (int)a.y,
					                     __dp4a((int)q[r][0], (int)a.x, base));

					acc[r][c] = fmaf(dsc[r] * da, dp4a_small_int_float(v), acc[r][c]);
				}
			}
		}
	}
};

/* f's rows from prepared weight w, its activations not yet bound. */
template <class F>
inline void dp4a_bind_rows(F &f, const q4kh_prepared *w)
{
	f.w = (const uint8_t *)w->data;
	f.stride = w->stride;
	f.pieces = (int)(w->k / 32);
	f.xq = NULL;
	f.ds = NULL;
	f.k = w->k;
}

/* Point f (a format with xq, ds and k) at the int8 activations in SHM. */
template <int T, class F>
__device__ __forceinline__ dp4a_prologue<T> dp4a_bind_shared(F &f, void *shm, const float *x,
                                                             int64_t ldx)
{
	int8_t *q = (int8_t *)shm;
	float2 *ds = (float2 *)(q + T * f.k);

	f.xq = q;
	f.ds = ds;
	return dp4a_prologue<T>{ x, ldx, f.k, q, ds };
}

} // namespace

/*
 * Blocks of WARPS warps for KERNEL (SMEM bytes of shared memory each), at
 * most WANT: q4kh_cv_stream_most_blocks over SMS multiprocessors, or fewer
 * where fewer of the kernel's blocks are resident at once (its registers
 * and shared memory): the blocks stream their rows for the whole launch,
 * and one that waited for a second wave would pay its prologue again.
 */
template <class K>
static inline unsigned dp4a_blocks(K kernel, int64_t want, int warps, int sms, size_t smem)
{
	int64_t most = q4kh_cv_stream_most_blocks(warps, sms);
	int per_sm = 0;

	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * warps, smem) ==
	            cudaSuccess &&
	    per_sm > 0 && (int64_t)per_sm * (sms > 0 ? sms : 1) < most)
		most = (int64_t)per_sm * (sms > 0 ? sms : 1);
	return (unsigned)(want < most ? want : most);
}

#endif
