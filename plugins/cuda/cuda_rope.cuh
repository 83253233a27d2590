/*
 * RoPE's arithmetic, shared by the rope kernels (cuda_rowwise.cu) and the
 * persistent decode kernel (cuda_persist.cu), so that both rotate every
 * pair to the same bits: angles in double, as the cpu reference computes
 * them.
 */
#ifndef Q4KH_CUDA_ROPE_CUH
#define Q4KH_CUDA_ROPE_CUH

#include <math.h>
#include <stdint.h>

#include "cuda_kernels.h"

/*
 * What pair i's angle takes from no position: base^(-2i / n_rot), the
 * costly part (a pow in double), and the pair's frequency factor (1 where
 * there are none). Both come from no kernel's output (the factors are
 * weights), so a kernel launched as a PDL dependent computes them before
 * its wait (cuda_rowwise.cu).
 */
struct rope_freq {
	double pw;
	float ff;
};

static __device__ __forceinline__ struct rope_freq rope_freq_of(const struct cuda_rope &p,
                                                                int64_t i)
{
	struct rope_freq f;

	f.pw = pow(p.base, -2.0 * (double)i / p.n_rot);
	f.ff = p.freq_factors ? p.freq_factors[i] : 1.0f;
	return f;
}

/*
 * The angle of pair i at position pos, from F = rope_freq_of(p, i): the
 * formula of plugin.h (struct q4kh_rope_params) in double, as the cpu
 * reference computes it, with YaRN's ramp between p.lo and p.hi.
 */
static __device__ __forceinline__ double rope_theta(const struct cuda_rope &p, int32_t pos,
                                                    int64_t i, const struct rope_freq &f)
{
	double extrap = (double)pos * f.pw;
	double theta;

	if (p.freq_factors)
		extrap /= (double)f.ff;
	theta = p.freq_scale * extrap;
	if (p.ext_factor != 0.0) {
		const double y = ((double)i - p.lo) / fmax(0.001, p.hi - p.lo);
		const double r = p.ext_factor * (1.0 - fmin(1.0, fmax(0.0, y)));

		theta = theta * (1.0 - r) + extrap * r;
	}
	return theta;
}

/* The same, F computed here. */
static __device__ __forceinline__ double rope_theta(const struct cuda_rope &p, int32_t pos,
                                                    int64_t i)
{
	return rope_theta(p, pos, i, rope_freq_of(p, i));
}

/*
 * Pair i (i < n_rot / 2) of a head at position POS, F its rope_freq_of:
 * the values VA and VB of the pair (NORM: neighbours 2i and 2i + 1; NEOX:
 * i and i + n_rot / 2) rotated by the pair's angle, into *RA and *RB.
 */
static __device__ __forceinline__ void rope_pair(const struct cuda_rope &p, int32_t pos,
                                                 int64_t i, const struct rope_freq &f,
                                                 double va, double vb, float *ra, float *rb)
{
	double sn, cs;

	sincos(rope_theta(p, pos, i, f), &sn, &cs);
	sn *= p.mscale;
	cs *= p.mscale;
	*ra = (float)(va * cs - vb * sn);
	*rb = (float)(va * sn + vb * cs);
}

/* The same, F computed here. */
static __device__ __forceinline__ void rope_pair(const struct cuda_rope &p, int32_t pos,
                                                 int64_t i, double va, double vb, float *ra,
                                                 float *rb)
{
	rope_pair(p, pos, i, rope_freq_of(p, i), va, vb, ra, rb);
}

#endif
