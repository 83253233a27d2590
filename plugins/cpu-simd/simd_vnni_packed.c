/*
 * cpu-simd's gemm for AVX-512 VNNI on repacked Q4_K and Q6_K weights
 * (struct simd_pack_q4_k, simd_pack_q6_k): rows in the 16 lanes, 4 codes
 * each, against 4 bytes of one column broadcast, so the codes of a tile are
 * loaded and unpacked once for up to PACK_COLS columns and each column's 16
 * results leave in one store. The column's int16 values go in as their
 * high and low bytes (q = 256 hi + lo, struct simd_act): two vpdpbusd per 4
 * values, the high sum shifted by 8 before the low one joins it, give
 * exactly the int16 product. Built with the VNNI flags; called only where
 * q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX512_VNNI).
 */
#include <immintrin.h>
#include <string.h>

#include "simd.h"

/* Columns per pass over a tile's codes: 8 accumulators of floats, 8 of
 * codes and the unpacked codes of a sub-block fit the 32 registers. */
#define PACK_COLS 8
/* A block of tiles' codes and a pass's columns stay in L2 (1 to 2 MiB per
 * core on the server parts): every column block runs over the same tiles. */
#define PACK_L2_BYTES (256 * 1024)

/* 4 bytes of a column, broadcast to the 16 lanes (vpdpbusd's {1to16}). */
static inline __m512i bcast4(const int8_t *p)
{
	int32_t v;

	memcpy(&v, p, 4);
	return _mm512_set1_epi32(v);
}

/*
 * sum over quads s < nq of codes w[s] times column bytes at hi + 4s, then
 * lo + 4s, as the int16 product: (w . hi) * 256 + w . lo.
 */
static inline __attribute__((always_inline)) __m512i
codes_dot(const __m512i *w, int nq, const int8_t *hi, const int8_t *lo)
{
	__m512i p = _mm512_setzero_si512();

#pragma GCC unroll 8
	for (int s = 0; s < nq; s++)
		p = _mm512_dpbusd_epi32(p, w[s], bcast4(hi + 4 * s));
	p = _mm512_slli_epi32(p, 8);
#pragma GCC unroll 8
	for (int s = 0; s < nq; s++)
		p = _mm512_dpbusd_epi32(p, w[s], bcast4(lo + 4 * s));
	return p;
}

/* The two halves of an octet of codes (struct simd_pack_q4_k qs): values
 * 8p .. 8p + 3 of each row into *a, 8p + 4 .. 8p + 7 into *b. */
static inline void octet(const uint8_t *qs, __m512i *a, __m512i *b)
{
	const __m512i low = _mm512_set1_epi8(0x0F), v = _mm512_load_si512(qs);

	*a = _mm512_and_si512(v, low);
	*b = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
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
 * One tile of Q4_K (NSB super-blocks at P) against NC columns: per
 * sub-block j of 32 values, acc += (d sc_j) d_b (codes . q) - (dmin m_j)
 * ds_b. The same operations per column in the same order whatever NC, so a
 * column's result does not depend on the batch.
 */
static inline __attribute__((always_inline)) void
tile_q4_k(const struct simd_pack_q4_k *p, int64_t nsb, const struct simd_act *a, int nc,
          float *acc_out[], __mmask16 keep)
{
	__m512 acc[PACK_COLS];

#pragma GCC unroll 8
	for (int c = 0; c < nc; c++)
		acc[c] = _mm512_setzero_ps();
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
#pragma GCC unroll 8
			for (int c = 0; c < nc; c++) {
				const __m512i q = codes_dot(w, 8, a[c].hi + 32 * blk, a[c].lo + 32 * blk);

				acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q),
				                         _mm512_mul_ps(s, _mm512_set1_ps(a[c].d[blk])), acc[c]);
				acc[c] = _mm512_fnmadd_ps(m, _mm512_set1_ps(a[c].ds[blk]), acc[c]);
			}
		}
	}
#pragma GCC unroll 8
	for (int c = 0; c < nc; c++)
		_mm512_mask_storeu_ps(acc_out[c], keep, acc[c]);
}

/*
 * One tile of Q6_K against NC columns: per group g of 16 values, acc +=
 * (d sc_g) d_b (codes . q - 32 sum of q over g).
 */
static inline __attribute__((always_inline)) void
tile_q6_k(const struct simd_pack_q6_k *p, int64_t nsb, const struct simd_act *a, int nc,
          float *acc_out[], __mmask16 keep)
{
	const __m512i top = _mm512_set1_epi8(0x30);
	__m512 acc[PACK_COLS];

#pragma GCC unroll 8
	for (int c = 0; c < nc; c++)
		acc[c] = _mm512_setzero_ps();
	for (int64_t sb = 0; sb < nsb; sb++) {
		const struct simd_pack_q6_k *b = &p[sb];
		const __m512 d = _mm512_load_ps(b->d);

		for (int g = 0; g < 16; g++) {
			const int64_t blk = 8 * sb + g / 2, v = Q4KH_QK_K * sb + 16 * g;
			const __m512 s = _mm512_mul_ps(i8_ps(b->sc[g]), d);
			const __m512i h = _mm512_load_si512(b->qh[g][0]);
			__m512i w[4];

			octet(b->ql[2 * g][0], &w[0], &w[1]);
			octet(b->ql[2 * g + 1][0], &w[2], &w[3]);
			w[0] = _mm512_or_si512(w[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
			w[1] = _mm512_or_si512(w[1], _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
			w[2] = _mm512_or_si512(w[2], _mm512_and_si512(h, top));
			w[3] = _mm512_or_si512(w[3], _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
#pragma GCC unroll 8
			for (int c = 0; c < nc; c++) {
				const __m512i q = codes_dot(w, 4, a[c].hi + v, a[c].lo + v);
				const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(a[c].d[blk]));

				acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), sd, acc[c]);
				acc[c] = _mm512_fnmadd_ps(sd, _mm512_set1_ps(32.0f * a[c].s16[v / 16]),
				                          acc[c]);
			}
		}
	}
#pragma GCC unroll 8
	for (int c = 0; c < nc; c++)
		_mm512_mask_storeu_ps(acc_out[c], keep, acc[c]);
}

/* A tile against 1 .. PACK_COLS columns, each count its own unrolled copy. */
#define TILE_COLS(type)                                                                   \
	static void type##_cols(const void *p, int64_t nsb, const struct simd_act *a, int nc, \
	                        float *out[], __mmask16 keep)                                  \
	{                                                                                     \
		const struct simd_pack_##type *t = p;                                         \
		switch (nc) {                                                                 \
		case 1: tile_##type(t, nsb, a, 1, out, keep); break;                          \
		case 2: tile_##type(t, nsb, a, 2, out, keep); break;                          \
		case 3: tile_##type(t, nsb, a, 3, out, keep); break;                          \
		case 4: tile_##type(t, nsb, a, 4, out, keep); break;                          \
		case 5: tile_##type(t, nsb, a, 5, out, keep); break;                          \
		case 6: tile_##type(t, nsb, a, 6, out, keep); break;                          \
		case 7: tile_##type(t, nsb, a, 7, out, keep); break;                          \
		default: tile_##type(t, nsb, a, PACK_COLS, out, keep); break;                 \
		}                                                                             \
	}

TILE_COLS(q4_k)
TILE_COLS(q6_k)

typedef void (*cols_fn)(const void *p, int64_t nsb, const struct simd_act *a, int nc,
                        float *out[], __mmask16 keep);

/*
 * Tiles [t0, t1) in blocks whose codes fit PACK_L2_BYTES; within a block,
 * columns PACK_COLS at a time, each pass over every tile of the block.
 */
static inline __attribute__((always_inline)) void
packed(cols_fn cols, size_t block_bytes, const void *p, int64_t n, int64_t k, int64_t t0,
       int64_t t1, const struct simd_act *a, int ncols, float *const *y)
{
	const int64_t nsb = k / Q4KH_QK_K, tile_bytes = nsb * (int64_t)block_bytes;
	const int64_t per = tile_bytes < PACK_L2_BYTES ? PACK_L2_BYTES / tile_bytes : 1;

	for (int64_t b0 = t0; b0 < t1; b0 += per)
		for (int c0 = 0; c0 < ncols; c0 += PACK_COLS) {
			const int nc = ncols - c0 < PACK_COLS ? ncols - c0 : PACK_COLS;

			for (int64_t t = b0; t < t1 && t < b0 + per; t++) {
				const int64_t r0 = t * SIMD_PACK_ROWS;
				const int64_t left = n - r0;
				const __mmask16 keep = left >= SIMD_PACK_ROWS
				                               ? (__mmask16)0xFFFF
				                               : (__mmask16)((1u << left) - 1);
				float *out[PACK_COLS];

				for (int c = 0; c < nc; c++)
					out[c] = y[c0 + c] + r0;
				cols((const uint8_t *)p + t * tile_bytes, nsb, a + c0, nc, out, keep);
			}
		}
}

void simd_vnni_packed_q4_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y)
{
	packed(q4_k_cols, sizeof(struct simd_pack_q4_k), p, n, k, t0, t1, a, ncols, y);
}

void simd_vnni_packed_q6_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y)
{
	packed(q6_k_cols, sizeof(struct simd_pack_q6_k), p, n, k, t0, t1, a, ncols, y);
}
