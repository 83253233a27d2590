/*
 * cpu-simd's gemm for AVX-512 VNNI on repacked Q4_K, Q6_K and Q5_0
 * weights (struct simd_pack_q4_k, simd_pack_q6_k, simd_pack_q5_0): rows in the 16 lanes, 4 codes
 * each, against 4 bytes of one column broadcast, so the codes of a tile are
 * loaded and unpacked once for up to PACK_COLS columns and each column's 16
 * results leave in one store. The column's int16 values go in as their
 * high and low bytes (q = 256 hi + lo, struct simd_act): two vpdpbusd per 4
 * values, the high sum shifted by 8 before the low one joins it, give
 * exactly the int16 product, scaled by simd_packed.h's steps. Built with
 * the VNNI flags; called only where
 * q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX512_VNNI).
 */
#include <immintrin.h>
#include <string.h>

#include "simd_packed.h"

/* Columns per pass over a tile's codes: 8 accumulators of floats, 8 of
 * codes and the unpacked codes of a sub-block fit the 32 registers. */
#define PACK_COLS 8

/* 4 bytes of a column, broadcast to the 16 lanes (vpdpbusd's {1to16}). */
static inline __m512i bcast4(const int8_t *p)
{
	int32_t v;

	memcpy(&v, p, 4);
	return _mm512_set1_epi32(v);
}

/*
 * Each column c's sums: over quads s < nq, codes w[s] times its bytes at
 * hi + 4s, then lo + 4s, as the int16 product, (w . hi) * 256 + w . lo.
 * Quad by quad across the columns, so that the columns' vpdpbusd, each
 * column a chain of its own, overlap.
 */
static inline __attribute__((always_inline)) void
vnni_sums(void *state, const __m512i *w, int nq, const struct simd_act *a, int nc, int64_t v,
          __m512i *q)
{
	(void)state;
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		q[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
	for (int s = 0; s < nq; s++)
#pragma GCC unroll 16
		for (int c = 0; c < nc; c++)
			q[c] = _mm512_dpbusd_epi32(q[c], w[s], bcast4(a[c].hi + v + 4 * s));
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		q[c] = _mm512_slli_epi32(q[c], 8);
#pragma GCC unroll 8
	for (int s = 0; s < nq; s++)
#pragma GCC unroll 16
		for (int c = 0; c < nc; c++)
			q[c] = _mm512_dpbusd_epi32(q[c], w[s], bcast4(a[c].lo + v + 4 * s));
}

/* A tile against 1 .. PACK_COLS columns, each count its own unrolled copy. */
#define TILE_COLS(type)                                                                   \
	static void type##_cols(const void *p, int64_t nsb, const struct simd_act *a, int nc, \
	                        float *out[], __mmask16 keep)                                  \
	{                                                                                     \
		const struct simd_pack_##type *t = p;                                         \
		switch (nc) {                                                                 \
		case 1: tile_##type(t, nsb, a, 1, out, keep, vnni_sums, NULL); break;         \
		case 2: tile_##type(t, nsb, a, 2, out, keep, vnni_sums, NULL); break;         \
		case 3: tile_##type(t, nsb, a, 3, out, keep, vnni_sums, NULL); break;         \
		case 4: tile_##type(t, nsb, a, 4, out, keep, vnni_sums, NULL); break;         \
		case 5: tile_##type(t, nsb, a, 5, out, keep, vnni_sums, NULL); break;         \
		case 6: tile_##type(t, nsb, a, 6, out, keep, vnni_sums, NULL); break;         \
		case 7: tile_##type(t, nsb, a, 7, out, keep, vnni_sums, NULL); break;         \
		default:                                                                      \
			tile_##type(t, nsb, a, PACK_COLS, out, keep, vnni_sums, NULL);        \
			break;                                                                \
		}                                                                             \
	}

TILE_COLS(q4_k)
TILE_COLS(q6_k)
TILE_COLS(q5_0)

void simd_vnni_packed_q4_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y)
{
	packed_tiles(q4_k_cols, PACK_COLS, NULL, Q4KH_QK_K, sizeof(struct simd_pack_q4_k), p, n, k,
	             t0, t1, a, ncols, y);
}

void simd_vnni_packed_q6_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y)
{
	packed_tiles(q6_k_cols, PACK_COLS, NULL, Q4KH_QK_K, sizeof(struct simd_pack_q6_k), p, n, k,
	             t0, t1, a, ncols, y);
}

void simd_vnni_packed_q5_0(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y)
{
	packed_tiles(q5_0_cols, PACK_COLS, NULL, 32, sizeof(struct simd_pack_q5_0), p, n, k, t0,
	             t1, a, ncols, y);
}
