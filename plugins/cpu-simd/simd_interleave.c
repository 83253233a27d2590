/*
 * Quantised columns into the interleaved groups of gemm (struct
 * simd_group). Plain C: it moves K values per column against the weight's
 * N x K products, a pair of int16 (the unit the products take) at a time.
 */
#include <stddef.h>
#include <string.h>

#include "simd.h"

void simd_interleave(const struct simd_act *a, int64_t k, int w, int c,
                     int16_t *q, float *d, float *ds)
{
	int16_t *dst = q + 2 * c;

	if (a)
		for (int64_t i = 0; i < k; i += 2)
			memcpy(dst + i * w, a->q + i, 2 * sizeof(*q));
	else
		for (int64_t i = 0; i < k; i += 2)
			memset(dst + i * w, 0, 2 * sizeof(*q));
	for (int64_t b = 0; b < k / SIMD_BLOCK; b++) {
		d[b * w + c] = a ? a->d[b] : 0;
		ds[b * w + c] = a ? a->ds[b] : 0;
	}
}
