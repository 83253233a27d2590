/*
 * Device code and launch geometry shared by the CUDA variants' GEMV kernels.
 *
 * Every kernel has the same shape. A thread block of 32 * warps threads is
 * cut into groups of G threads (a power of two); a group owns R consecutive
 * weight rows and strides over the row's "pieces" (16 bytes of quantized
 * codes and the scales they need, read as one coalesced 16-byte load per
 * row), so each activation value it loads serves R rows and every weight
 * byte is read once for up to CV_MAX_COLUMNS activation columns. When a
 * row has enough pieces, G spans several warps (several warps per row).
 * The group's partial sums meet through warp shuffles and, when G spans
 * several warps, shared memory. fp32 accumulation throughout.
 */
#ifndef Q4KH_CUDA_VARIANT_DEVICE_CUH
#define Q4KH_CUDA_VARIANT_DEVICE_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "variant.h"

#define CV_FULL_MASK 0xFFFFFFFFu

/*
 * 16 bytes of weights, read once per launch: no L1 allocation, so the
 * activations that every group re-reads keep the L1.
 */
__device__ __forceinline__ uint4 cv_load_stream(const void *p)
{
	uint4 v;

	asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
	    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	    : "l"(p));
	return v;
}

/* Word I (0..3) of a 16-byte vector; I is a constant after unrolling. */
__device__ __forceinline__ uint32_t cv_word(const uint4 &v, int i)
{
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/*
 * Byte B (a constant) of v minus BIAS (an integer below 2^8) as a float,
 * exactly: one byte permute puts the byte under the exponent of 2^23, one
 * subtraction of 2^23 + BIAS (exact by Sterbenz's lemma) leaves the value.
 * Cheaper than an integer conversion, which runs at a quarter rate.
 */
__device__ __forceinline__ float cv_byte_float_less(uint32_t v, int b,
                                                    float bias)
{
	return __int_as_float((int)__byte_perm(v, 0x4B000000u, 0x7440u | b)) -
	       (8388608.0f + bias);
}

/* Byte B of v as a float, exactly. */
__device__ __forceinline__ float cv_byte_float(uint32_t v, int b)
{
	return cv_byte_float_less(v, b, 0.0f);
}

/* The fp16 in the low (HI = 0) or high half of v, as a float. */
__device__ __forceinline__ float cv_half_float(uint32_t v, int hi)
{
	return __half2float(__ushort_as_half((unsigned short)(v >> (16 * hi))));
}

/*
 * Sum acc over the G threads of each group and store row row0 + r, column
 * c at y[row0 + r + c * ldy] (rows >= n are skipped). red: shared memory
 * of warps * R * T floats. Every thread of the block must call it.
 */
template <int R, int T>
__device__ __forceinline__ void cv_reduce_store(float (&acc)[R][T], int group,
                                                float *red, int64_t row0,
                                                int64_t n, float *y,
                                                int64_t ldy)
{
	const int tid = threadIdx.x, lane = tid & 31;
	const int width = group < 32 ? group : 32;

	for (int off = width >> 1; off > 0; off >>= 1)
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < T; c++)
				acc[r][c] += __shfl_xor_sync(CV_FULL_MASK, acc[r][c], off);
	if (group <= 32) {
		const int li = tid & (group - 1);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < T; c++)
				if ((r * T + c) % group == li && row0 + r < n)
					y[row0 + r + c * ldy] = acc[r][c];
		return;
	}
	if (lane == 0)
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < T; c++)
				red[(tid >> 5) * R * T + r * T + c] = acc[r][c];
	__syncthreads();
	if ((tid & (group - 1)) < 32) {
		const int first = tid / group * (group >> 5);

		for (int i = lane; i < R * T; i += 32) {
			float s = 0.0f;

			for (int k = 0; k < group >> 5; k++)
				s += red[(first + k) * R * T + i];
			if (row0 + i / T < n)
				y[row0 + i / T + (i % T) * ldy] = s;
		}
	}
}

/* The first of the R rows of this thread's group. */
template <int R>
__device__ __forceinline__ int64_t cv_first_row(int group)
{
	return ((int64_t)blockIdx.x * (blockDim.x / group) + threadIdx.x / group) *
	       R;
}

/* How a launch cuts the work (see the top of this file). */
struct cv_geom {
	int threads;     /* per block: 32 * warps */
	int group;       /* threads per row group */
	unsigned blocks; /* grid size */
	size_t shared;   /* bytes of reduction scratch */
};

/* G: as many threads per row as the row has pieces, up to the block. */
static inline cv_geom cv_geometry(int64_t pieces, int64_t n, int warps,
                                  int rows, int cols)
{
	cv_geom g;
	int64_t per_block;

	g.threads = 32 * warps;
	g.group = 1;
	while (g.group * 2 <= g.threads && g.group * 2 <= pieces)
		g.group *= 2;
	per_block = (int64_t)rows * (g.threads / g.group);
	g.blocks = (unsigned)((n + per_block - 1) / per_block);
	g.shared = sizeof(float) * (size_t)(warps * rows * cols);
	return g;
}

/*
 * Launch L's kernel for io->cols (1 .. CV_MAX_COLUMNS) columns: with RMAX
 * rows per group when that still gives every multiprocessor two blocks,
 * else with one row per group. L has
 *   template <int T, int R> cudaError_t launch(const cv_geom &, cudaStream_t)
 * and the number of pieces per row in L::pieces.
 */
template <class L, int T, int RMAX>
static cudaError_t cv_launch_rows(const L &l, int64_t n, int warps, int sms,
                                  cudaStream_t s)
{
	cv_geom g = cv_geometry(l.pieces, n, warps, RMAX, T);

	if (RMAX > 1 && g.blocks < 2u * (unsigned)sms)
		return l.template launch<T, 1>(cv_geometry(l.pieces, n, warps, 1, T),
		                               s);
	return l.template launch<T, RMAX>(g, s);
}

/* Rows per group for T columns: activations held for R rows cost registers. */
#define CV_ROWS(T) ((T) <= 2 ? 4 : 2)

template <class L>
static cudaError_t cv_launch(const L &l, int cols, int64_t n, int warps,
                             int sms, cudaStream_t s)
{
	switch (cols) {
	case 1: return cv_launch_rows<L, 1, CV_ROWS(1)>(l, n, warps, sms, s);
	case 2: return cv_launch_rows<L, 2, CV_ROWS(2)>(l, n, warps, sms, s);
	case 3: return cv_launch_rows<L, 3, CV_ROWS(3)>(l, n, warps, sms, s);
	case 4: return cv_launch_rows<L, 4, CV_ROWS(4)>(l, n, warps, sms, s);
	case 5: return cv_launch_rows<L, 5, CV_ROWS(5)>(l, n, warps, sms, s);
	case 6: return cv_launch_rows<L, 6, CV_ROWS(6)>(l, n, warps, sms, s);
	case 7: return cv_launch_rows<L, 7, CV_ROWS(7)>(l, n, warps, sms, s);
	case 8: return cv_launch_rows<L, 8, CV_ROWS(8)>(l, n, warps, sms, s);
	default: return cudaErrorInvalidValue;
	}
}

#endif
