/*
 * The gated activations of the glu op (plugin.h, q4kh_glu_kind) as the
 * reference cpu backend computes them, header-only (static inline; link
 * nothing but libm). The reference's glu and unary silu and cpu-simd's
 * fused gemv_glu (ABI 1.4) all call these, so they give the same bits:
 * the activation in double through libm, its product with up in double,
 * one rounding to float. Compile the including file with
 * -ffp-contract=off, so that no fused multiply-add changes a rounding.
 * Pure: thread-safe.
 */
#ifndef Q4KHOST_GLU_H
#define Q4KHOST_GLU_H

#include <math.h>

#include "q4khost/plugin.h"

/* 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), in double. */
static inline double q4kh_gelu_tanh(double g)
{
	const double k = 0.79788456080286535587989211986876; /* sqrt(2/pi) */

	return 0.5 * g * (1.0 + tanh(k * (g + 0.044715 * g * g * g)));
}

/* g / (1 + exp(-g)), in double. */
static inline double q4kh_silu(double g)
{
	return g / (1.0 + exp(-g));
}

/*
 * act(G) * U as the reference's glu stores it: KIND's act (SiLU for
 * Q4KH_GLU_SILU, the tanh GELU for any other kind), the product in
 * double, rounded once to float.
 */
static inline float q4kh_glu_value(q4kh_glu_kind kind, float g, float u)
{
	const double a = kind == Q4KH_GLU_SILU ? q4kh_silu(g) : q4kh_gelu_tanh(g);

	return (float)(a * (double)u);
}

#endif
