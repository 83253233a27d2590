/*
 * Activations to int8 blocks (struct simd_act). Plain C: it touches K
 * values per column against the weight's N x K, so it is not worth an
 * instruction set of its own.
 */
#include <math.h>

#include "simd.h"

/* One block of N values: its scale, and q = round(x / d) in [-127, 127]. */
static float quantize_block(const float *x, int n, int8_t *q)
{
	float amax = 0, d;
	int finite = 1;

	for (int i = 0; i < n; i++) {
		finite &= isfinite(x[i]);
		amax = fmaxf(amax, fabsf(x[i]));
	}
	if (!finite || amax == 0) {
		for (int i = 0; i < n; i++)
			q[i] = 0;
		return finite ? 0 : NAN;
	}
	d = amax / 127;
	for (int i = 0; i < n; i++) {
		long v = lrintf(x[i] / d);

		q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
	}
	return d;
}

void simd_quantize(enum simd_wtype type, const float *x, int64_t k,
                   int8_t *q, float *d, int16_t *sum)
{
	const int block = SIMD_ACT_BLOCK, group = SIMD_ACT_GROUP(type);

	for (int64_t b = 0; b < k / block; b++)
		d[b] = quantize_block(x + b * block, block, q + b * block);
	for (int64_t g = 0; g < k / group; g++) {
		int s = 0;

		for (int i = 0; i < group; i++)
			s += q[g * group + i];
		sum[g] = (int16_t)s;
	}
}
