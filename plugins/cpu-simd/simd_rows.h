/*
 * cpu-simd's row loop and kernel table, included by each instruction-set
 * file after simd_decode.h and after it defines
 *
 *   static float dot(const struct simd_row *w, const struct simd_act *a,
 *                    int64_t k)
 *
 * = sum_b (s_b d_b sum_{i in b} u_i q_i - o_b ds_b), the product of one
 * decoded weight row with one quantised column (simd.h), and SIMD_TABLE and
 * SIMD_NAME, the struct simd_kernels to define and its name.
 */
#ifndef Q4KH_SIMD_ROWS_H
#define Q4KH_SIMD_ROWS_H

#include "simd.h"

typedef void (*decode_fn)(const void *row, int64_t k, const struct simd_row *out);

/* Rows outside, columns inside: a row is read from memory and decoded
 * once, then served from L1 to every column. */
static inline __attribute__((always_inline)) void
rows_of(decode_fn decode, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1,
        int64_t k, const struct simd_act *a, int ncols, float *const *y,
        const struct simd_row *row)
{
	for (int64_t r = r0; r < r1; r++) {
		decode(w + r * row_bytes, k, row);
		for (int c = 0; c < ncols; c++)
			y[c][r] = dot(row, &a[c], k);
	}
}

#define SIMD_ROWS_FN(type)                                                         \
	static void rows_##type(const uint8_t *w, int64_t row_bytes, int64_t r0,   \
	                        int64_t r1, int64_t k, const struct simd_act *a,   \
	                        int ncols, float *const *y, const struct simd_row *row) \
	{                                                                          \
		rows_of(decode_##type, w, row_bytes, r0, r1, k, a, ncols, y, row); \
	}

SIMD_ROWS_FN(q4_k)
SIMD_ROWS_FN(q5_0)
SIMD_ROWS_FN(q6_k)
SIMD_ROWS_FN(q8_0)

const struct simd_kernels SIMD_TABLE = {
	.name = SIMD_NAME,
	.rows = { rows_q4_k, rows_q5_0, rows_q6_k, rows_q8_0 },
};

#endif
