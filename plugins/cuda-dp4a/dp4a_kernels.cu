/*
 * Q4_K GEMV with int8 activations.
 *
 * First each activation column is quantised in blocks of 32 values
 * (Q8_1-style): d = max |x| / 127, q = round(x / d), kept with d and
 * d * sum(q). Then, with the streaming shape of q4khost/cuda_variant_device.cuh and the
 * pieces of q4khost/cuda_q4k_device.cuh, each 16-byte piece (32 weights of two
 * sub-blocks) meets 16 + 16 int8 activations in eight __dp4a; the Q4_K
 * mins need no per-value work: sub-block j of a super-block contributes
 *   d sc_j sum_i q_i a_i  -  dmin m_j d_a sum_i a_i
 * and the second sum is the stored block sum (the lane reading the first
 * half of a sub-block adds it). The result is the exact dot product of
 * the dequantized weights with the dequantized activations, up to fp32
 * rounding; the int8 rounding of the activations is the whole error
 * (tests/cuda_variant_rig.h bounds it).
 */
#include "dp4a.h"
#include "q4khost/cuda_q4k_device.cuh"

#define QB 32 /* activation values per int8 block */

/* Where the two parts of the scratch start. */
static size_t codes_bytes(int64_t k, int64_t cols)
{
	return (size_t)(k * cols); /* a multiple of 256 */
}

extern "C" size_t dp4a_scratch_bytes(int64_t k, int64_t cols)
{
	return codes_bytes(k, cols) + sizeof(float2) * (size_t)(k / QB * cols);
}

/*
 * One warp per block of 32 values: q[c * k + i], and ds[c * (k / 32) + b]
 * = {d, d * sum q}. A non-finite value makes its block's d NaN, so it
 * reaches y instead of vanishing in the max.
 */
__global__ void __launch_bounds__(256)
quantize_kernel(const float *__restrict__ x, int64_t ldx, int64_t k,
                int64_t blocks, int8_t *__restrict__ q,
                float2 *__restrict__ ds)
{
	const int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;
	const int64_t per_col = k / QB;
	float v, amax, d;
	int bad, qi, sum;

	q4kh_pdl_release();
	q4kh_pdl_wait();
	if (b >= blocks)
		return;
	v = x[b / per_col * ldx + b % per_col * QB + lane];
	amax = fabsf(v);
	bad = !isfinite(v);
	for (int off = 16; off > 0; off >>= 1)
		amax = fmaxf(amax, __shfl_xor_sync(Q4KH_CV_FULL_MASK, amax, off));
	bad = __any_sync(Q4KH_CV_FULL_MASK, bad);
	d = amax / 127.0f;
	qi = amax > 0.0f ? __float2int_rn(v / d) : 0;
	q[b / per_col * k + b % per_col * QB + lane] = (int8_t)qi;
	sum = qi;
	for (int off = 16; off > 0; off >>= 1)
		sum += __shfl_xor_sync(Q4KH_CV_FULL_MASK, sum, off);
	if (lane == 0)
		ds[b] = bad ? make_float2(__int_as_float(0x7FC00000),
		                          __int_as_float(0x7FC00000))
		            : make_float2(d, d * (float)sum);
}

namespace {

/*
 * v as a float, exactly, for |v| < 2^22 (a piece's dot product is at most
 * 16 * 15 * 127): v added to the bits of 1.5 * 2^23 lands in its mantissa,
 * and one subtraction leaves v. Two full-rate instructions where an
 * integer conversion runs at a quarter rate, once per column and row.
 */
__device__ __forceinline__ float small_int_float(int v)
{
	return __int_as_float(v + 0x4B400000) - 12582912.0f;
}

/* The int8 arithmetic of one piece, for q4kh_cv_stream_kernel. */
struct dp4a_dot : q4kh_q4k_rows {
	const int8_t *xq;  /* codes, column c at xq + c * k */
	const float2 *ds;  /* {d, d * sum}, column c at ds + c * (k / QB) */
	int64_t k;

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const q4kh_q4k_piece (&pc)[R],
	                                    int j) const
	{
		const int sb = j >> 3, p = j & 7;
		const int64_t nb = k / QB;
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
			const uint4 al = __ldg((const uint4 *)(xp + c * k));
			const uint4 ah = __ldg((const uint4 *)(xp + c * k + 32));
			const float2 s0 = __ldg(ds + c * nb + b0);
			const float2 s1 = __ldg(ds + c * nb + b0 + 1);

#pragma unroll
			for (int r = 0; r < R; r++) {
				int il = 0, ih = 0;

#pragma unroll
				for (int i = 0; i < 4; i++) {
					il = __dp4a((int)lo[r][i], (int)q4kh_cv_word(al, i), il);
					ih = __dp4a((int)hi[r][i], (int)q4kh_cv_word(ah, i), ih);
				}
				acc[r][c] = fmaf(dl[r][0] * s0.x, small_int_float(il), acc[r][c]);
				acc[r][c] = fmaf(dl[r][1] * s1.x, small_int_float(ih), acc[r][c]);
				acc[r][c] = fmaf(-ml[r][0], s0.y, acc[r][c]);
				acc[r][c] = fmaf(-ml[r][1], s1.y, acc[r][c]);
			}
		}
	}
};

} // namespace

extern "C" cudaError_t dp4a_probe(void)
{
	cudaFuncAttributes a;

	return cudaFuncGetAttributes(&a, quantize_kernel);
}

extern "C" cudaError_t dp4a_preload(void)
{
	const cudaError_t e = q4kh_preload(quantize_kernel);

	return e != cudaSuccess ? e : q4kh_cv_stream_preload<dp4a_dot>();
}

extern "C" cudaError_t dp4a_launch(const q4kh_prepared *w, const q4kh_cv_io *io,
                                   void *scratch, int warps, cudaStream_t s)
{
	const int64_t blocks = w->k / QB * io->cols;
	dp4a_dot dot;
	cudaError_t e;

	dot.w = (const uint8_t *)w->data;
	dot.stride = w->stride;
	dot.pieces = (int)(w->k / (Q4KH_Q4K_VALUES / Q4KH_Q4K_PIECES));
	dot.xq = (const int8_t *)scratch;
	dot.ds = (const float2 *)((uint8_t *)scratch + codes_bytes(w->k, io->cols));
	dot.k = w->k;
	if ((e = q4kh_pdl_launch(io->pdl != 0, quantize_kernel, (unsigned)((blocks + 7) / 8),
	                         256, 0, s, io->x, io->ldx, w->k, blocks, (int8_t *)dot.xq,
	                         (float2 *)dot.ds)) != cudaSuccess)
		return e;
	return q4kh_cv_stream_launch(dot, (int)io->cols, w->n, io->y, io->ldy, warps,
	                             w->multiprocessors, io->pdl != 0, s);
}
