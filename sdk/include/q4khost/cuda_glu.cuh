/*
 * The gated activation of the cuda backend's glu (cuda_elementwise.cu),
 * shared with the kernel variants' gemv_glu (ABI 1.4, cuda-mwv) so that
 * both compute act(g) * u with the same float expression, compiled with
 * the same flags: the same bits.
 */
#ifndef Q4KH_CUDA_GLU_CUH
#define Q4KH_CUDA_GLU_CUH

/*
 * act(g) * u, act g / (1 + exp(-g)) (SiLU) with SILU, else the tanh GELU
 * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), in float (expf, tanhf).
 */
static __device__ __forceinline__ float cuda_glu_value(bool silu, float g, float u)
{
	const float k = 0.7978845608028654f; /* sqrt(2/pi) */
	const float act = silu ? g / (1.0f + expf(-g))
	                       : 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));

	return act * u;
}

#endif
