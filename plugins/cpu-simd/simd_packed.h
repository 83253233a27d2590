/*
 * What the gemms on repacked Q4_K, Q6_K and Q5_0 weights (struct
 * simd_pack_q4_k, simd_pack_q6_k, simd_pack_q5_0) share, AVX-512 VNNI's
 * (simd_vnni_packed.c) and AMX's (simd_amx_packed.c): the codes of a tile
 * unpacked to bytes, the
 * float steps that scale a block's integer sum into a column's 16 rows,
 * and the walk over tiles and columns. Both products compute the same
 * exact int32 sum per block and give it to the same steps in the same
 * order, so they agree bit for bit. Include where the AVX-512 flags are.
 */
#ifndef Q4KH_SIMD_PACKED_H
#define Q4KH_SIMD_PACKED_H

#include <immintrin.h>

#include "simd.h"

/* A block of tiles' codes and a pass's columns stay in L2 (1 to 2 MiB per
 * core on the server parts): every column pass runs over the same tiles. */
#define PACK_L2_BYTES (256 * 1024)
/* The most columns a pass takes (AMX: the 16 rows of a tile). */
#define PACK_MAX_COLS 16

/* The two halves of an octet of codes (struct simd_pack_q4_k qs): values
 * 8p .. 8p + 3 of each row into *a, 8p + 4 .. 8p + 7 into *b. */
static inline void octet(const uint8_t *qs, __m512i *a, __m512i *b)
{
	const __m512i low = _mm512_set1_epi8(0x0F), v = _mm512_load_si512(qs);

	*a = _mm512_and_si512(v, low);
	*b = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
}

/* Group g's 16 codes of each row (struct simd_pack_q6_k), 6 bits, before
 * the - 32: values 16g + 4s .. 16g + 4s + 3 into w[s]. */
static inline void q6_k_group(const struct simd_pack_q6_k *b, int g, __m512i w[4])
{
	const __m512i top = _mm512_set1_epi8(0x30);
	const __m512i h = _mm512_load_si512(b->qh[g][0]);

	octet(b->ql[2 * g][0], &w[0], &w[1]);
	octet(b->ql[2 * g + 1][0], &w[2], &w[3]);
	w[0] = _mm512_or_si512(w[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
	w[1] = _mm512_or_si512(w[1], _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
	w[2] = _mm512_or_si512(w[2], _mm512_and_si512(h, top));
	w[3] = _mm512_or_si512(w[3], _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
}

/* A Q5_0 block's 32 codes of each row (struct simd_pack_q5_0), 5 bits:
 * values 4s .. 4s + 3 into w[s], bit 4 from bit s of qh (16-bit shifts
 * by at most 4 keep each byte's bit 4 within its byte). */
static inline void q5_0_block(const struct simd_pack_q5_0 *b, __m512i w[8])
{
	const __m512i top = _mm512_set1_epi8(0x10);
	const __m512i h = _mm512_load_si512(b->qh[0]);

#pragma GCC unroll 4
	for (int o = 0; o < 4; o++)
		octet(b->qs[o][0], &w[2 * o], &w[2 * o + 1]);
	w[0] = _mm512_or_si512(w[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
	w[1] = _mm512_or_si512(w[1], _mm512_and_si512(_mm512_slli_epi16(h, 3), top));
	w[2] = _mm512_or_si512(w[2], _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
	w[3] = _mm512_or_si512(w[3], _mm512_and_si512(_mm512_slli_epi16(h, 1), top));
	w[4] = _mm512_or_si512(w[4], _mm512_and_si512(h, top));
	w[5] = _mm512_or_si512(w[5], _mm512_and_si512(_mm512_srli_epi16(h, 1), top));
	w[6] = _mm512_or_si512(w[6], _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
	w[7] = _mm512_or_si512(w[7], _mm512_and_si512(_mm512_srli_epi16(h, 3), top));
}

/* 16 unsigned or signed bytes to float lanes. */
static inline __m512 u8_ps(const uint8_t *p)
{
	return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)p)));
}

static inline __m512 i8_ps(const int8_t *p)
{
	return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)p)));
}

/*
 * Q4_K, sub-block blk of column A, its 16 rows' int32 sums Q (codes .
 * column): acc + (d sc_j) d_b Q - (dmin m_j) ds_b, S = d sc_j and M = dmin
 * m_j of the 16 rows. Q5_0's block blk the same, with S = d and M = 16 d.
 */
static inline __m512 q4_k_step(__m512 acc, __m512i q, __m512 s, __m512 m,
                               const struct simd_act *a, int64_t blk)
{
	acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_mul_ps(s, _mm512_set1_ps(a->d[blk])),
	                      acc);
	return _mm512_fnmadd_ps(m, _mm512_set1_ps(a->ds[blk]), acc);
}

/*
 * Q6_K, group V / 16 (V its first value) of column A: acc + (d sc_g) d_b
 * (Q - 32 sum of the column over the group), S = d sc_g.
 */
static inline __m512 q6_k_step(__m512 acc, __m512i q, __m512 s, const struct simd_act *a,
                               int64_t v)
{
	const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(a->d[v / 32]));

	acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), sd, acc);
	return _mm512_fnmadd_ps(sd, _mm512_set1_ps(32.0f * a->s16[v / 16]), acc);
}

/*
 * How a packed product forms a block's exact int32 sums (codes . q, the
 * column's int16 values): for the block's codes unpacked in W (NQ
 * registers of 4 codes of each of 16 rows), V its first value, the 16
 * rows' sums of each column c < NC into q[c]. STATE is the product's own.
 * All columns at once, so that a product may interleave their
 * instructions.
 */
typedef void (*block_sums_fn)(void *state, const __m512i *w, int nq, const struct simd_act *a,
                              int nc, int64_t v, __m512i *q);

/* A tile's NC accumulators: zeroed, then stored to out[c] for the rows
 * KEEP selects. */
static inline __attribute__((always_inline)) void accs_zero(__m512 *acc, int nc)
{
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		acc[c] = _mm512_setzero_ps();
}

static inline __attribute__((always_inline)) void
accs_store(const __m512 *acc, int nc, float *out[], __mmask16 keep)
{
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		_mm512_mask_storeu_ps(out[c], keep, acc[c]);
}

/* A block of 32 values (a Q4_K sub-block, a Q5_0 block), its codes in W,
 * BLK its index: the NC columns' sums, then q4_k_step() with S and M into
 * each of ACC. */
static inline __attribute__((always_inline)) void
block_steps(__m512 *acc, const __m512i *w, __m512 s, __m512 m, const struct simd_act *a, int nc,
            int64_t blk, block_sums_fn sums, void *state)
{
	__m512i q[PACK_MAX_COLS];

	sums(state, w, 8, a, nc, 32 * blk, q);
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		acc[c] = q4_k_step(acc[c], q[c], s, m, &a[c], blk);
}

/*
 * One tile of Q4_K (NSB super-blocks at P) against NC columns A, results
 * into out[c] for the rows KEEP selects: per sub-block j of 32 values,
 * acc += (d sc_j) d_b (codes . q) - (dmin m_j) ds_b, the same operations
 * per column in the same order whatever NC (so a column's result does not
 * depend on the batch) and whatever forms the sums.
 */
static inline __attribute__((always_inline)) void
tile_q4_k(const struct simd_pack_q4_k *p, int64_t nsb, const struct simd_act *a, int nc,
          float *out[], __mmask16 keep, block_sums_fn sums, void *state)
{
	__m512 acc[PACK_MAX_COLS];

	accs_zero(acc, nc);
	for (int64_t sb = 0; sb < nsb; sb++) {
		const struct simd_pack_q4_k *b = &p[sb];
		const __m512 d = _mm512_load_ps(b->d), dmin = _mm512_load_ps(b->dmin);

		for (int j = 0; j < 8; j++) {
			const int64_t blk = 8 * sb + j;
			const __m512 s = _mm512_mul_ps(u8_ps(b->sc[j]), d);
			const __m512 m = _mm512_mul_ps(u8_ps(b->m[j]), dmin);
			__m512i w[8];

#pragma GCC unroll 4
			for (int o = 0; o < 4; o++)
				octet(b->qs[4 * j + o][0], &w[2 * o], &w[2 * o + 1]);
			block_steps(acc, w, s, m, a, nc, blk, sums, state);
		}
	}
	accs_store(acc, nc, out, keep);
}

/*
 * The same for Q6_K: per group g of 16 values, acc += (d sc_g) d_b (codes
 * . q - 32 sum of q over g).
 */
static inline __attribute__((always_inline)) void
tile_q6_k(const struct simd_pack_q6_k *p, int64_t nsb, const struct simd_act *a, int nc,
          float *out[], __mmask16 keep, block_sums_fn sums, void *state)
{
	__m512 acc[PACK_MAX_COLS];

	accs_zero(acc, nc);
	for (int64_t sb = 0; sb < nsb; sb++) {
		const struct simd_pack_q6_k *b = &p[sb];
		const __m512 d = _mm512_load_ps(b->d);

		for (int g = 0; g < 16; g++) {
			const int64_t v = Q4KH_QK_K * sb + 16 * g;
			const __m512 s = _mm512_mul_ps(i8_ps(b->sc[g]), d);
			__m512i w[4], q[PACK_MAX_COLS];

			q6_k_group(b, g, w);
			sums(state, w, 4, a, nc, v, q);
#pragma GCC unroll 16
			for (int c = 0; c < nc; c++)
				acc[c] = q6_k_step(acc[c], q[c], s, &a[c], v);
		}
	}
	accs_store(acc, nc, out, keep);
}

/*
 * The same for Q5_0: per block b of 32 values, acc += d d_b (codes . q) -
 * 16 d ds_b.
 */
static inline __attribute__((always_inline)) void
tile_q5_0(const struct simd_pack_q5_0 *p, int64_t nb, const struct simd_act *a, int nc,
          float *out[], __mmask16 keep, block_sums_fn sums, void *state)
{
	__m512 acc[PACK_MAX_COLS];

	accs_zero(acc, nc);
	for (int64_t b = 0; b < nb; b++) {
		const __m512 d = _mm512_load_ps(p[b].d);
		const __m512 m = _mm512_mul_ps(d, _mm512_set1_ps(16.0f));
		__m512i w[8];

		q5_0_block(&p[b], w);
		block_steps(acc, w, d, m, a, nc, b, sums, state);
	}
	accs_store(acc, nc, out, keep);
}

/* One tile (NSB blocks at P) against NC columns A, results into out[c]
 * for the rows KEEP selects. */
typedef void (*packed_cols_fn)(const void *p, int64_t nsb, const struct simd_act *a, int nc,
                               float *out[], __mmask16 keep);

/*
 * Tiles [t0, t1), of blocks of BLOCK_VALUES values and BLOCK_BYTES bytes,
 * in groups whose codes fit PACK_L2_BYTES; within a group, columns COLS
 * (<= PACK_MAX_COLS) at a time, each pass over every tile of the group,
 * PASS(nc) called before each pass (NULL: nothing).
 */
static inline __attribute__((always_inline)) void
packed_tiles(packed_cols_fn cols, int per_pass, void (*pass)(int nc), int64_t block_values,
             size_t block_bytes, const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
             const struct simd_act *a, int ncols, float *const *y)
{
	const int64_t nsb = k / block_values, tile_bytes = nsb * (int64_t)block_bytes;
	const int64_t per = tile_bytes < PACK_L2_BYTES ? PACK_L2_BYTES / tile_bytes : 1;

	for (int64_t b0 = t0; b0 < t1; b0 += per)
		for (int c0 = 0; c0 < ncols; c0 += per_pass) {
			const int nc = ncols - c0 < per_pass ? ncols - c0 : per_pass;

			if (pass)
				pass(nc);
			for (int64_t t = b0; t < t1 && t < b0 + per; t++) {
				const int64_t r0 = t * SIMD_PACK_ROWS;
				const int64_t left = n - r0;
				const __mmask16 keep = left >= SIMD_PACK_ROWS
				                               ? (__mmask16)0xFFFF
				                               : (__mmask16)((1u << left) - 1);
				float *out[PACK_MAX_COLS];

				for (int c = 0; c < nc; c++)
					out[c] = y[c0 + c] + r0;
				cols((const uint8_t *)p + t * tile_bytes, nsb, a + c0, nc, out, keep);
			}
		}
}

#endif
