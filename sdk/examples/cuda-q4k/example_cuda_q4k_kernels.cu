/*
 * The kernel of example-cuda-q4k: Q4_K weights times float activations,
 * one warp per output row. Lane l takes 8 values of every 256-value
 * super-block (sub-block l / 4, values 8 (l % 4) .. +7), so a warp reads a
 * row's blocks front to back; the lanes' partial sums meet in a shuffle.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <q4khost/quant.h>

#include "example_cuda_q4k.h"

#define WARPS 4 /* rows per thread block */
#define MAX_GRID_Y 65535

__device__ static float fp16(uint16_t h)
{
	return __half2float(__ushort_as_half(h));
}

__global__ static void q4k_gemv(const uint8_t *w, int64_t k, int64_t n,
                                int64_t row_bytes, const float *x, int64_t ldx,
                                float *y, int64_t ldy)
{
	const int64_t row = (int64_t)blockIdx.x * WARPS + threadIdx.y;
	const int lane = threadIdx.x, j = lane / 4, i0 = 8 * (lane % 4);
	const float *a = x + (int64_t)blockIdx.y * ldx;
	float acc = 0.0f;

	if (row >= n)
		return;
	for (int64_t s = 0; s < k / Q4KH_QK_K; s++) {
		const struct q4kh_block_q4_k *b =
			(const struct q4kh_block_q4_k *)(w + row * row_bytes) + s;
		const uint8_t *q = b->qs + 32 * (j / 2) + i0;
		const float *av = a + s * Q4KH_QK_K + 32 * j + i0;
		int sc, m;
		float dot = 0.0f, sum = 0.0f;

		/* The 6-bit scale and min of sub-block j (quant.h). */
		if (j < 4) {
			sc = b->scales[j] & 63;
			m = b->scales[j + 4] & 63;
		} else {
			sc = (b->scales[j + 4] & 0xF) | ((b->scales[j - 4] >> 6) << 4);
			m = (b->scales[j + 4] >> 4) | ((b->scales[j] >> 6) << 4);
		}
		for (int i = 0; i < 8; i++) {
			dot += (float)((q[i] >> (4 * (j % 2))) & 0xF) * av[i];
			sum += av[i];
		}
		acc += fp16(b->d) * sc * dot - fp16(b->dmin) * m * sum;
	}
	for (int off = 16; off > 0; off /= 2)
		acc += __shfl_down_sync(0xffffffffu, acc, off);
	if (lane == 0)
		y[(int64_t)blockIdx.y * ldy + row] = acc;
}

extern "C" int ex_q4k_launch(int ordinal, void *stream, const void *w, int64_t k,
                             int64_t n, int64_t row_bytes, const float *x,
                             int64_t ldx, float *y, int64_t ldy, int64_t cols,
                             char *err, size_t cap)
{
	cudaError_t e = cudaSetDevice(ordinal);

	/* The grid's second dimension is the column, at most 65535 a launch. */
	for (int64_t t = 0; e == cudaSuccess && t < cols; t += MAX_GRID_Y) {
		const int64_t nc = cols - t < MAX_GRID_Y ? cols - t : MAX_GRID_Y;
		const dim3 grid((unsigned)((n + WARPS - 1) / WARPS), (unsigned)nc);
		const dim3 block(32, WARPS);

		q4k_gemv<<<grid, block, 0, (cudaStream_t)stream>>>(
			(const uint8_t *)w, k, n, row_bytes, x + t * ldx, ldx,
			y + t * ldy, ldy);
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		return 0;
	snprintf(err, cap, "device %d: %s (%s)", ordinal, cudaGetErrorString(e),
	         cudaGetErrorName(e));
	return -1;
}
