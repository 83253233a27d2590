/*
 * cpu-simd's row loops and kernel table, included by each instruction-set
 * file after simd_decode.h and after it defines
 *
 *   static float dot(const struct simd_row *w, const struct simd_act *a,
 *                    int64_t k)
 *
 * = sum_b (s_b d_b sum_{i in b} u_i q_i - o_b ds_b), the product of one
 * decoded weight row with one quantised column (simd.h);
 *
 *   static float direct(bytes_fn bytes, const void *row,
 *                       const struct simd_act *a, int64_t k)
 *
 * the same straight from a Q8_0 or Q5_0 row (simd_decode.h), for a single
 * column: no decoded row to write and read back;
 *
 *   static void tile(const struct simd_row *w, const struct simd_group *g,
 *                    int64_t k, float *out)
 *
 * the same for SIMD_ROWS decoded rows w[0 .. R) and the SIMD_WIDTH columns
 * of a group, row r into out[r * W .. r * W + W); and SIMD_TABLE and
 * SIMD_NAME, the struct simd_kernels to define and its name.
 */
#ifndef Q4KH_SIMD_ROWS_H
#define Q4KH_SIMD_ROWS_H

#include "simd.h"

typedef void (*decode_fn)(const void *row, int64_t k, const struct simd_row *out);

/* Rows outside, columns inside: a row is read from memory and decoded
 * once, then served from L1 to every column. With one column and a DIRECT
 * product for the type, the row is not decoded at all. */
static inline __attribute__((always_inline)) void
rows_of(decode_fn decode, bytes_fn bytes, const uint8_t *w, int64_t row_bytes, int64_t r0,
        int64_t r1, int64_t k, const struct simd_act *a, int ncols, float *const *y,
        const struct simd_row *row)
{
	if (bytes && ncols == 1) {
		for (int64_t r = r0; r < r1; r++)
			y[0][r] = direct(bytes, w + r * row_bytes, a, k);
		return;
	}
	for (int64_t r = r0; r < r1; r++) {
		decode(w + r * row_bytes, k, row);
		for (int c = 0; c < ncols; c++)
			y[c][r] = dot(row, &a[c], k);
	}
}

/* The same against groups of SIMD_WIDTH columns, SIMD_ROWS rows at a
 * time (gemm); row[0 .. SIMD_ROWS) are this part's decoded rows. */
static inline __attribute__((always_inline)) void
tiles_of(decode_fn decode, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1,
         int64_t k, const struct simd_group *g, int ncols, float *const *y,
         const struct simd_row *row)
{
	float out[SIMD_ROWS * SIMD_WIDTH];
	struct simd_row rows[SIMD_ROWS];

	for (int64_t r = r0; r < r1; r += SIMD_ROWS) {
		const int n = r1 - r < SIMD_ROWS ? (int)(r1 - r) : SIMD_ROWS;

		/* A short last step repeats its last row and drops the copies. */
		for (int i = 0; i < SIMD_ROWS; i++) {
			rows[i] = row[i < n ? i : n - 1];
			if (i < n)
				decode(w + (r + i) * row_bytes, k, &row[i]);
		}
		for (int c0 = 0; c0 < ncols; c0 += SIMD_WIDTH) {
			tile(rows, &g[c0 / SIMD_WIDTH], k, out);
			for (int i = 0; i < n; i++)
				for (int c = c0; c < ncols && c < c0 + SIMD_WIDTH; c++)
					y[c][r + i] = out[i * SIMD_WIDTH + c - c0];
		}
	}
}

#define SIMD_ROWS_FN(type, bytes)                                                  \
	static void rows_##type(const uint8_t *w, int64_t row_bytes, int64_t r0,   \
	                        int64_t r1, int64_t k, const struct simd_act *a,   \
	                        int ncols, float *const *y, const struct simd_row *row) \
	{                                                                          \
		rows_of(decode_##type, bytes, w, row_bytes, r0, r1, k, a, ncols, y, row); \
	}                                                                          \
	static void tiles_##type(const uint8_t *w, int64_t row_bytes, int64_t r0,  \
	                         int64_t r1, int64_t k, const struct simd_group *g, \
	                         int ncols, float *const *y, const struct simd_row *row) \
	{                                                                          \
		tiles_of(decode_##type, w, row_bytes, r0, r1, k, g, ncols, y, row); \
	}

SIMD_ROWS_FN(q4_k, NULL)
SIMD_ROWS_FN(q5_0, bytes_q5_0)
SIMD_ROWS_FN(q6_k, NULL)
SIMD_ROWS_FN(q8_0, bytes_q8_0)

const struct simd_kernels SIMD_TABLE = {
	.name = SIMD_NAME,
	.width = SIMD_WIDTH,
	.tile_rows = SIMD_ROWS,
	.quantize = quantize,
	.rows = { rows_q4_k, rows_q5_0, rows_q6_k, rows_q8_0 },
	.tiles = { tiles_q4_k, tiles_q5_0, tiles_q6_k, tiles_q8_0 },
};

#endif
