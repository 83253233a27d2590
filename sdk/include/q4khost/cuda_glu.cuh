/*
 * The gated activation of the in-tree cuda backend's glu, header-only
 * device code for nvcc: a kernel variant's fused gemv_glu (ABI 1.4, as
 * cuda-mwv's) that calls it computes act(g) * u with the backend's float
 * expression, and built with the same flags (-O3, no --use_fast_math),
 * gives the backend's bits. Pure.
 */
#ifndef Q4KHOST_CUDA_GLU_CUH
#define Q4KHOST_CUDA_GLU_CUH

/*
 * act(g) * u, act g / (1 + exp(-g)) (SiLU) with SILU, else the tanh GELU
 * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), in float (expf, tanhf).
 */
static __device__ __forceinline__ float q4kh_cuda_glu_value(bool silu, float g, float u)
{
	const float k = 0.7978845608028654f; /* sqrt(2/pi) */
	const float act = silu ? g / (1.0f + expf(-g))
	                       : 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));

	return act * u;
}

#endif
