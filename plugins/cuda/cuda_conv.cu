/*
 * ssm_conv (plugin.h): the short causal convolution of a linear-attention
 * layer with the K-1 inputs it keeps between steps, as llama.cpp's
 * ggml_ssm_conv defines it (out[c, t] = sum_j w[j, c] u_c[t + j] over the
 * kept values followed by the step's inputs; the cpu reference,
 * plugins/cpu/cpu_recurrent.c, in double). Here in float, the taps summed
 * in the same order (j ascending).
 *
 * One thread per channel and tile of CONV_TILE (at least K-1) tokens, so
 * a prompt spreads over the device and a decode step is one tile. Only
 * the first tile reads the kept values (its tokens are the only ones
 * whose windows reach back past the step); the same thread then writes
 * the new kept values, after its last read of the old ones, so no other
 * thread ever sees them change.
 */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

#define CONV_THREADS 128
#define CONV_TILE 32 /* tokens a thread computes, at least K-1 */

/* u_c[p]: kept value p of channel c, or input p - (K-1) of the step. */
static __device__ __forceinline__ float window(const struct cuda_view &x,
                                               const float *kept, int64_t c,
                                               int64_t p, int64_t held)
{
	return p < held ? kept[p] : ((const float *)(x.data + (p - held) * x.nb[1]))[c];
}

static __global__ void __launch_bounds__(CONV_THREADS)
conv_kernel(struct cuda_view x, struct cuda_view w, struct cuda_view state,
            struct cuda_view out, int64_t tile)
{
	const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	const int64_t k = w.ne[0], held = k - 1, T = x.ne[1];
	const int64_t t0 = (int64_t)blockIdx.y * tile;
	const int64_t t1 = t0 + tile < T ? t0 + tile : T;

	if (c >= x.ne[0])
		return;
	const float *wc = (const float *)(w.data + c * w.nb[1]);
	float *kept = (float *)(state.data + c * state.nb[1]);

	for (int64_t t = t0; t < t1; t++) {
		float sum = 0.0f;

		for (int64_t j = 0; j < k; j++)
			sum += wc[j] * window(x, kept, c, t + j, held);
		((float *)(out.data + t * out.nb[1]))[c] = sum;
	}
	/* The new kept values u_c[T .. T+K-1), in ascending order: value i
	 * comes from kept value T + i (a step shorter than K-1), which has
	 * not been overwritten yet, or from the step's inputs. */
	if (blockIdx.y == 0)
		for (int64_t i = 0; i < held; i++)
			kept[i] = window(x, kept, c, T + i, held);
}

extern "C" cudaError_t cuda_launch_ssm_conv(const struct cuda_view *x,
                                            const struct cuda_view *w,
                                            const struct cuda_view *state,
                                            const struct cuda_view *out,
                                            cudaStream_t s)
{
	const int64_t tile = w->ne[0] - 1 > CONV_TILE ? w->ne[0] - 1 : CONV_TILE;
	const dim3 grid(grid_for(x->ne[0], CONV_THREADS),
	                (unsigned)((x->ne[1] + tile - 1) / tile));

	conv_kernel<<<grid, CONV_THREADS, 0, s>>>(*x, *w, *state, *out, tile);
	return cudaGetLastError();
}
