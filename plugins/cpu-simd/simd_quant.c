/*
 * Activations to int16 blocks (struct simd_act). Plain C: it touches K
 * values per column against the weight's N x K, so it is not worth an
 * instruction set of its own.
 */
#include <math.h>

#include "simd.h"

void simd_quantize(const float *x, int64_t k, int16_t *q, float *d, float *ds)
{
	for (int64_t b = 0; b < k / SIMD_BLOCK; b++) {
		const float *xb = x + b * SIMD_BLOCK;
		int16_t *qb = q + b * SIMD_BLOCK;
		float amax = 0;
		int finite = 1;
		int32_t sum = 0;

		for (int i = 0; i < SIMD_BLOCK; i++) {
			finite &= isfinite(xb[i]);
			amax = fmaxf(amax, fabsf(xb[i]));
		}
		d[b] = !finite ? NAN : amax / 32767;
		for (int i = 0; i < SIMD_BLOCK; i++) {
			long v = finite && amax > 0 ? lrintf(xb[i] / d[b]) : 0;

			qb[i] = (int16_t)(v > 32767 ? 32767 : v < -32767 ? -32767 : v);
			sum += qb[i];
		}
		ds[b] = d[b] * (float)sum;
	}
}

void simd_interleave(const struct simd_act *a, int64_t k, int w, int c,
                     int16_t *q, float *d, float *ds)
{
	for (int64_t i = 0; i < k; i++)
		q[(i / 2) * 2 * w + 2 * c + i % 2] = a ? a->q[i] : 0;
	for (int64_t b = 0; b < k / SIMD_BLOCK; b++) {
		d[b * w + c] = a ? a->d[b] : 0;
		ds[b * w + c] = a ? a->ds[b] : 0;
	}
}
