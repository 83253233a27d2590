/*
 * cpu-simd's gemm for AVX-512 VNNI on repacked Q4_K, Q6_K and Q5_0
 * weights (struct simd_pack_q4_k, simd_pack_q6_k, simd_pack_q5_0): rows in the 16 lanes, 4 codes
 * each, against 4 bytes of one column broadcast, so the codes of a tile are
 * loaded and unpacked once for up to PACK_COLS columns and each column's 16
 * results leave in one store. The column's int16 values go in as their
 * high and low bytes (q = 256 hi + lo, struct simd_act): two vpdpbusd per 4
 * values, the high sum shifted by 8 before the low one joins it, give
 * exactly the int16 product, scaled by simd_packed.h's steps; int8
 * columns (cpu-simd8) go in as their low bytes alone, one vpdpbusd per 4
 * values. Built with
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
 * hi + 4s, then lo + 4s, as the int16 product, (w . hi) * 256 + w . lo;
 * with BYTES 1 (int8 columns, hi 0) the low bytes only. Quad by quad
 * across the columns, so that the columns' vpdpbusd, each column a chain
 * of its own, overlap.
 */
static inline __attribute__((always_inline)) void
vnni_sums_of(const __m512i *w, int nq, const struct simd_act *a, int nc, int64_t v, __m512i *q,
             int bytes)
{
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		q[c] = _mm512_setzero_si512();
	if (bytes == 2) {
#pragma GCC unroll 8
		for (int s = 0; s < nq; s++)
#pragma GCC unroll 16
			for (int c = 0; c < nc; c++)
				q[c] = _mm512_dpbusd_epi32(q[c], w[s], bcast4(a[c].hi + v + 4 * s));
#pragma GCC unroll 16
		for (int c = 0; c < nc; c++)
			q[c] = _mm512_slli_epi32(q[c], 8);
	}
#pragma GCC unroll 8
	for (int s = 0; s < nq; s++)
#pragma GCC unroll 16
		for (int c = 0; c < nc; c++)
			q[c] = _mm512_dpbusd_epi32(q[c], w[s], bcast4(a[c].lo + v + 4 * s));
}

/* vnni_sums_of() as block_sums_fn: int16 columns, and int8. */
static inline __attribute__((always_inline)) void
vnni_sums(void *state, const __m512i *w, int nq, const struct simd_act *a, int nc, int64_t v,
          __m512i *q)
{
	(void)state;
	vnni_sums_of(w, nq, a, nc, v, q, 2);
}

static inline __attribute__((always_inline)) void
vnni_sums8(void *state, const __m512i *w, int nq, const struct simd_act *a, int nc, int64_t v,
           __m512i *q)
{
	(void)state;
	vnni_sums_of(w, nq, a, nc, v, q, 1);
}

/* A tile against 1 .. PACK_COLS columns, each count its own unrolled
 * copy, the sums from SUMS; NAME the function. */
#define TILE_COLS(name, type, sums)                                                       \
	static void name(const void *p, int64_t nsb, const struct simd_act *a, int nc,        \
	                 float *out[], __mmask16 keep)                                         \
	{                                                                                     \
		const struct simd_pack_##type *t = p;                                         \
		switch (nc) {                                                                 \
		case 1: tile_##type(t, nsb, a, 1, out, keep, sums, NULL); break;              \
		case 2: tile_##type(t, nsb, a, 2, out, keep, sums, NULL); break;              \
		case 3: tile_##type(t, nsb, a, 3, out, keep, sums, NULL); break;              \
		case 4: tile_##type(t, nsb, a, 4, out, keep, sums, NULL); break;              \
		case 5: tile_##type(t, nsb, a, 5, out, keep, sums, NULL); break;              \
		case 6: tile_##type(t, nsb, a, 6, out, keep, sums, NULL); break;              \
		case 7: tile_##type(t, nsb, a, 7, out, keep, sums, NULL); break;              \
		default: tile_##type(t, nsb, a, PACK_COLS, out, keep, sums, NULL); break;     \
		}                                                                             \
	}

/* The exported product NAME of TYPE, its tiles through COLS. */
#define PACKED(name, type, cols, block_values)                                            \
	void name(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,                \
	          const struct simd_act *a, int ncols, float *const *y)                        \
	{                                                                                     \
		packed_tiles(cols, PACK_COLS, NULL, block_values, sizeof(struct simd_pack_##type), \
		             p, n, k, t0, t1, a, ncols, y);                                   \
	}

TILE_COLS(q4_k_cols, q4_k, vnni_sums)
TILE_COLS(q6_k_cols, q6_k, vnni_sums)
TILE_COLS(q5_0_cols, q5_0, vnni_sums)
TILE_COLS(q4_k_cols8, q4_k, vnni_sums8)
TILE_COLS(q6_k_cols8, q6_k, vnni_sums8)
TILE_COLS(q5_0_cols8, q5_0, vnni_sums8)

PACKED(simd_vnni_packed_q4_k, q4_k, q4_k_cols, Q4KH_QK_K)
PACKED(simd_vnni_packed_q6_k, q6_k, q6_k_cols, Q4KH_QK_K)
PACKED(simd_vnni_packed_q5_0, q5_0, q5_0_cols, 32)
PACKED(simd_vnni_packed8_q4_k, q4_k, q4_k_cols8, Q4KH_QK_K)
PACKED(simd_vnni_packed8_q6_k, q6_k, q6_k_cols8, Q4KH_QK_K)
PACKED(simd_vnni_packed8_q5_0, q5_0, q5_0_cols8, 32)
