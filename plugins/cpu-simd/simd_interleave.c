/*
 * Quantised columns into the interleaved groups of gemm (struct
 * simd_group). Plain C: it moves K values per column against the weight's
 * N x K products.
 */
#include <stddef.h>

#include "simd.h"

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
