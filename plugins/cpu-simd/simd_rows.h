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
 *   typedef vf; vf_zero(), vf_fma(p, s, acc) = acc + p * s,
 *   vf_sum(a, b, c, d) = the sum of all their lanes,
 *   prod_i8(w, q), prod_u8(w, q): 32 weight bytes, signed or unsigned,
 *   times 32 int16 values q, summed into int32 lanes and converted,
 *
 * the vectors of the direct products below (a single column straight from
 * the weight's blocks: no decoded row to write and read back; Q4_1 and
 * Q5_1 add their mins through the column's block sums, as dot subtracts
 * the offsets o);
 *
 *   static void tile(const struct simd_row *w, const struct simd_group *g,
 *                    int64_t k, float *out)
 *
 * the same for SIMD_ROWS decoded rows w[0 .. R) and the SIMD_WIDTH columns
 * of a group, row r into out[r * W .. r * W + W); and SIMD_TABLE and
 * SIMD_NAME, the struct simd_kernels to define and its name. A file with
 * products of its own for one column defines SIMD_DIRECT_Q4_K and
 * SIMD_DIRECT_Q6_K (functions as direct_fn below) and SIMD_SPLIT (struct
 * simd_kernels, split) before it includes this one; a file with gemm
 * products on repacked weights, SIMD_PACKED_Q4_K, SIMD_PACKED_Q6_K and
 * SIMD_PACKED_Q5_0 (simd_packed_fn) and their int8 forms SIMD_PACKED8_Q4_K,
 * SIMD_PACKED8_Q6_K and SIMD_PACKED8_Q5_0.
 */
#ifndef Q4KH_SIMD_ROWS_H
#define Q4KH_SIMD_ROWS_H

#include "simd.h"

/*
 * How far ahead the one-column products prefetch: a row's cache lines are
 * asked for when the row this many before it is multiplied, across the 4
 * KiB pages where the hardware's own prefetch stops (the LM head, Q8_0
 * 262144 x 640 from DRAM on two threads: 5.7-6.4 ms a product without,
 * 4.5-4.7 with; 16 rows did no better), but never more than
 * SIMD_PREFETCH_BYTES ahead: 8 long rows (Q4_K 1536 x 8960, 5 KiB each)
 * pushed the column out of L1 (one thread, Zen 4: 785-806 us a product
 * 8 rows ahead, 703-708 at 2 KiB).
 */
#define SIMD_PREFETCH_ROWS 8
#define SIMD_PREFETCH_BYTES 2048

typedef void (*decode_fn)(const void *row, int64_t k, const struct simd_row *out);
typedef float (*direct_fn)(const void *row, const struct simd_act *a, int64_t k);

/* One column times a Q8_0 or Q5_0 row: four independent chains. */
static inline __attribute__((always_inline)) vf
direct_block(bytes_fn bytes, const void *row, const struct simd_act *a, int64_t b, vf acc)
{
	float d;
	const __m256i w = bytes(row, b, &d);

	return vf_fma(prod_i8(w, a->q + 32 * b), d * a->d[b], acc);
}

static inline __attribute__((always_inline)) float
direct(bytes_fn bytes, const void *row, const struct simd_act *a, int64_t k)
{
	vf acc0 = vf_zero(), acc1 = vf_zero(), acc2 = vf_zero(), acc3 = vf_zero();
	const int64_t nb = k / 32;
	int64_t b = 0;

	for (; b + 4 <= nb; b += 4) {
		acc0 = direct_block(bytes, row, a, b, acc0);
		acc1 = direct_block(bytes, row, a, b + 1, acc1);
		acc2 = direct_block(bytes, row, a, b + 2, acc2);
		acc3 = direct_block(bytes, row, a, b + 3, acc3);
	}
	for (; b < nb; b++)
		acc0 = direct_block(bytes, row, a, b, acc0);
	return vf_sum(acc0, acc1, acc2, acc3);
}

static float direct_q8_0(const void *row, const struct simd_act *a, int64_t k)
{
	return direct(bytes_q8_0, row, a, k);
}

static float direct_q5_0(const void *row, const struct simd_act *a, int64_t k)
{
	return direct(bytes_q5_0, row, a, k);
}

static float direct_q4_0(const void *row, const struct simd_act *a, int64_t k)
{
	return direct(bytes_q4_0, row, a, k);
}

/*
 * One column times a Q4_1 or Q5_1 row: d q + m per value, so each block
 * adds d d_b (q . a) and m ds_b (the column's scaled block sum).
 */
static inline __attribute__((always_inline)) float
direct_min(bytes_min_fn bytes, const void *row, const struct simd_act *a, int64_t k)
{
	vf acc0 = vf_zero(), acc1 = vf_zero();
	const int64_t nb = k / 32;
	float off = 0;

	for (int64_t b = 0; b < nb; b++) {
		float d, m;
		const __m256i w = bytes(row, b, &d, &m);

		if (b % 2)
			acc1 = vf_fma(prod_u8(w, a->q + 32 * b), d * a->d[b], acc1);
		else
			acc0 = vf_fma(prod_u8(w, a->q + 32 * b), d * a->d[b], acc0);
		off += m * a->ds[b];
	}
	return vf_sum(acc0, acc1, vf_zero(), vf_zero()) + off;
}

static float direct_q4_1(const void *row, const struct simd_act *a, int64_t k)
{
	return direct_min(bytes_q4_1, row, a, k);
}

static float direct_q5_1(const void *row, const struct simd_act *a, int64_t k)
{
	return direct_min(bytes_q5_1, row, a, k);
}

/*
 * One column times a Q4_K or Q5_K row of super-blocks BLOCK_BYTES long:
 * the codes built in registers, each sub-block scaled by d sc_j and the
 * mins taken off through the column's block sums.
 */
static inline __attribute__((always_inline)) float
direct_k(k_pair_fn pair, k_scales_fn scales, size_t block_bytes, const void *row,
         const struct simd_act *a, int64_t k)
{
	vf acc[4] = { vf_zero(), vf_zero(), vf_zero(), vf_zero() };
	__m256 offv = _mm256_setzero_ps();

	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const uint8_t *block = (const uint8_t *)row + block_bytes * (size_t)sb;
		float s[8];
		__m256 sc, m;

		scales(block, &sc, &m);
		_mm256_storeu_ps(s, _mm256_mul_ps(sc, _mm256_loadu_ps(a->d + sb * 8)));
		offv = _mm256_fmadd_ps(m, _mm256_loadu_ps(a->ds + sb * 8), offv);
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++) {
			const int64_t j = sb * 8 + 2 * c;
			__m256i lo, hi;

			pair(block, c, &lo, &hi);
			acc[c] = vf_fma(prod_u8(lo, a->q + 32 * j), s[2 * c], acc[c]);
			acc[c] = vf_fma(prod_u8(hi, a->q + 32 * (j + 1)), s[2 * c + 1], acc[c]);
		}
	}
	return vf_sum(acc[0], acc[1], acc[2], acc[3]) - hsum8(offv);
}

static float direct_q5_k(const void *row, const struct simd_act *a, int64_t k)
{
	return direct_k(q5_k_pair, q5_k_scales, sizeof(struct q4kh_block_q5_k), row, a, k);
}

#ifndef SIMD_DIRECT_Q4_K
#define SIMD_DIRECT_Q4_K direct_q4_k
#define SIMD_DIRECT_Q6_K direct_q6_k
#define SIMD_SPLIT NULL

/*
 * One column times a Q6_K row (AVX2): each block of 32 values built in
 * registers (q6_k_block), its two groups of 16 multiplied apart, each
 * with its own scale.
 */
static float direct_q6_k(const void *row, const struct simd_act *a, int64_t k)
{
	const struct q4kh_block_q6_k *w = row;
	__m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
		          _mm256_setzero_ps() };

	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const int8_t *sc = w[sb].scales;
		const float d = fp16(w[sb].d);

#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++) {
				const int blk = 4 * h + i;
				const int64_t j = sb * 8 + blk;
				const __m256i q = q6_k_block(&w[sb], blk);
				const __m256i *aq = (const __m256i *)(a->q + 32 * j);
				const float sd = d * a->d[j];
				const __m256i p0 = _mm256_madd_epi16(
					_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_loadu_si256(aq));
				const __m256i p1 = _mm256_madd_epi16(
					_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)),
					_mm256_loadu_si256(aq + 1));

				acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),
				                         _mm256_set1_ps(sd * sc[2 * blk]), acc[i]);
				acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),
				                         _mm256_set1_ps(sd * sc[2 * blk + 1]), acc[i]);
			}
		}
	}
	return hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

/* One column times a Q4_K row: nibbles widened in registers. */
static float direct_q4_k(const void *row, const struct simd_act *a, int64_t k)
{
	return direct_k(q4_k_pair, q4_k_scales, sizeof(struct q4kh_block_q4_k), row, a, k);
}
#endif

/* Rows outside, columns inside: a row is read from memory and decoded
 * once, then served from L1 to every column. With one column and a DIRECT
 * product for the type, the row is not decoded at all. */
static inline __attribute__((always_inline)) void
rows_of(decode_fn decode, direct_fn direct1, const uint8_t *w, int64_t row_bytes,
        int64_t r0, int64_t r1, int64_t k, const struct simd_act *a, int ncols,
        float *const *y, const struct simd_row *row)
{
	if (direct1 && ncols == 1) {
		const int64_t ahead = SIMD_PREFETCH_ROWS * row_bytes < SIMD_PREFETCH_BYTES
		                              ? SIMD_PREFETCH_ROWS * row_bytes
		                              : SIMD_PREFETCH_BYTES;
		const char *end = (const char *)w + r1 * row_bytes;

		for (int64_t r = r0; r < r1; r++) {
			const char *p = (const char *)w + r * row_bytes + ahead;

			for (int64_t o = 0; o < row_bytes && p + o < end; o += 64)
				_mm_prefetch(p + o, _MM_HINT_T0);
			y[0][r] = direct1(w + r * row_bytes, a, k);
		}
		return;
	}
	for (int64_t r = r0; r < r1; r++) {
		decode(w + r * row_bytes, k, row);
		for (int c = 0; c < ncols; c++)
			y[c][r] = dot(row, &a[c], k);
	}
}

/* Rows r .. r + n of the group of columns c0 .. from a tile's OUT. */
static inline void store_tile(const float *out, int n, int64_t r, int c0, int ncols,
                              float *const *y)
{
	for (int i = 0; i < n; i++)
		for (int c = c0; c < ncols && c < c0 + SIMD_WIDTH; c++)
			y[c][r + i] = out[i * SIMD_WIDTH + c - c0];
}

/* The same against groups of SIMD_WIDTH columns, SIMD_ROWS rows at a
 * time (gemm); row[0 .. SIMD_ROWS) are this part's decoded rows. With
 * SIMD_TILE2 (a tile() of two groups), two groups at a time where K is at
 * least SIMD_TILE2_MIN_K. */
static inline __attribute__((always_inline)) void
tiles_of(decode_fn decode, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1,
         int64_t k, const struct simd_group *g, int ncols, float *const *y,
         const struct simd_row *row)
{
	float out[2 * SIMD_ROWS * SIMD_WIDTH];
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
#ifdef SIMD_TILE2
			if (c0 + SIMD_WIDTH < ncols && k >= SIMD_TILE2_MIN_K) {
				SIMD_TILE2(rows, &g[c0 / SIMD_WIDTH], &g[c0 / SIMD_WIDTH + 1], k, out,
				           out + SIMD_ROWS * SIMD_WIDTH);
				store_tile(out, n, r, c0, ncols, y);
				c0 += SIMD_WIDTH;
				store_tile(out + SIMD_ROWS * SIMD_WIDTH, n, r, c0, ncols, y);
				continue;
			}
#endif
			tile(rows, &g[c0 / SIMD_WIDTH], k, out);
			store_tile(out, n, r, c0, ncols, y);
		}
	}
}

#define SIMD_ROWS_FN(type, direct1)                                                \
	static void rows_##type(const uint8_t *w, int64_t row_bytes, int64_t r0,   \
	                        int64_t r1, int64_t k, const struct simd_act *a,   \
	                        int ncols, float *const *y, const struct simd_row *row) \
	{                                                                          \
		rows_of(decode_##type, direct1, w, row_bytes, r0, r1, k, a, ncols, y, row); \
	}                                                                          \
	static void tiles_##type(const uint8_t *w, int64_t row_bytes, int64_t r0,  \
	                         int64_t r1, int64_t k, const struct simd_group *g, \
	                         int ncols, float *const *y, const struct simd_row *row) \
	{                                                                          \
		tiles_of(decode_##type, w, row_bytes, r0, r1, k, g, ncols, y, row); \
	}

SIMD_ROWS_FN(q4_k, SIMD_DIRECT_Q4_K)
SIMD_ROWS_FN(q5_0, direct_q5_0)
SIMD_ROWS_FN(q6_k, SIMD_DIRECT_Q6_K)
SIMD_ROWS_FN(q8_0, direct_q8_0)
SIMD_ROWS_FN(q4_0, direct_q4_0)
SIMD_ROWS_FN(q4_1, direct_q4_1)
SIMD_ROWS_FN(q5_1, direct_q5_1)
SIMD_ROWS_FN(q5_k, direct_q5_k)

#ifndef SIMD_PACKED_Q4_K
#define SIMD_PACKED_Q4_K NULL
#define SIMD_PACKED_Q6_K NULL
#define SIMD_PACKED_Q5_0 NULL
#define SIMD_PACKED8_Q4_K NULL
#define SIMD_PACKED8_Q6_K NULL
#define SIMD_PACKED8_Q5_0 NULL
#endif

/* In the order of enum simd_wtype. */
const struct simd_kernels SIMD_TABLE = {
	.name = SIMD_NAME,
	.width = SIMD_WIDTH,
	.tile_rows = SIMD_ROWS,
	.quantize = quantize,
	.quantize8 = quantize8,
	.split = SIMD_SPLIT,
	.rows = { rows_q4_k, rows_q5_0, rows_q6_k, rows_q8_0, rows_q4_0, rows_q4_1, rows_q5_1,
	          rows_q5_k },
	.tiles = { tiles_q4_k, tiles_q5_0, tiles_q6_k, tiles_q8_0, tiles_q4_0, tiles_q4_1,
	           tiles_q5_1, tiles_q5_k },
	.packed = { [SIMD_Q4_K] = SIMD_PACKED_Q4_K, [SIMD_Q6_K] = SIMD_PACKED_Q6_K,
	            [SIMD_Q5_0] = SIMD_PACKED_Q5_0 },
	.packed_gemv = { [SIMD_Q4_K] = SIMD_PACKED_Q4_K, [SIMD_Q5_0] = SIMD_PACKED_Q5_0 },
	.packed8 = { [SIMD_Q4_K] = SIMD_PACKED8_Q4_K, [SIMD_Q6_K] = SIMD_PACKED8_Q6_K,
	             [SIMD_Q5_0] = SIMD_PACKED8_Q5_0 },
};

#endif
