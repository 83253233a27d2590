/*
 * The reference cpu backend's gated activations (cpu_ops.c: glu, and
 * silu for unary), shared with cpu-simd's gemv_glu (ABI 1.4) so that both
 * give the same bits: the activation in double through libm, its product
 * with up in double, one rounding to float. Both build it with
 * -ffp-contract=off, so no fused multiply-add changes a rounding.
 */
#ifndef Q4KH_CPU_GLU_H
#define Q4KH_CPU_GLU_H

#include <math.h>

#include "q4khost/plugin.h"

/* 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), in double. */
static inline double cpu_gelu_tanh(double g)
{
	const double k = 0.79788456080286535587989211986876; /* sqrt(2/pi) */

	return 0.5 * g * (1.0 + tanh(k * (g + 0.044715 * g * g * g)));
}

/* g / (1 + exp(-g)), in double. */
static inline double cpu_silu(double g)
{
	return g / (1.0 + exp(-g));
}

/* act(g) * u as the reference's glu stores it: KIND's act (SiLU, else the
 * tanh GELU), the product in double, rounded once. */
static inline float cpu_glu_value(q4kh_glu_kind kind, float g, float u)
{
	const double a = kind == Q4KH_GLU_SILU ? cpu_silu(g) : cpu_gelu_tanh(g);

	return (float)(a * (double)u);
}

#endif
