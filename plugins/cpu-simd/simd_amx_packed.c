/*
 * cpu-simd's gemm for AMX-INT8 on repacked Q4_K and Q6_K weights (struct
 * simd_pack_q4_k, simd_pack_q6_k, the layout of the AVX-512 VNNI gemm):
 * the codes of one scale block of a tile, unpacked to a byte each, are
 * 64 bytes per 4 values of its 16 rows, row r in bytes 4r .. 4r + 3, which
 * is tile B of tdpbsud as it stands; the column bytes of up to 16 columns
 * (struct simd_act hi and lo, K apart) are its tile A, a column a row. One
 * tdpbsud then gives, for 16 columns and 16 rows at once, C[c][r] = the
 * sum over the block of column c's signed bytes times row r's unsigned
 * codes: two of them (hi, then lo) per block, and 256 C_hi + C_lo is
 * exactly the int32 sum the VNNI gemm forms (codes . q, |q| <= SIMD_QMAX),
 * which the same steps (simd_packed.h) scale in the same order: the two
 * gemms agree bit for bit. A block is 32 values for Q4_K (a sub-block),
 * 16 for Q6_K (a group): the scales change there, so each tdpbsud uses 32
 * (16) of the 64 bytes of K it could take. Built with the VNNI flags and
 * -mamx-tile -mamx-int8; called only where
 * q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AMX_INT8), which has asked Linux for
 * the tile data.
 */
#include <immintrin.h>
#include <stdalign.h>
#include <string.h>

#include "simd_packed.h"

/* The tiles, by number: the intrinsics paste it into the instruction. */
#define T_CODES 0 /* B: K/4 rows of 64 bytes, 4 codes of each of 16 rows */
#define T_HI 1    /* A: a column a row, the block's K high bytes */
#define T_LO 2    /* the same for the low bytes */
#define T_PHI 3   /* C: a column a row, 16 int32 sums against T_HI */
#define T_PLO 4   /* and against T_LO */

/* ldtilecfg's 64 bytes (palette 1). */
struct tile_config {
	uint8_t palette, start_row;
	uint8_t reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

/* The compiler is not told what the tile instructions read: stores meant
 * for them must be done first. */
static inline void stores_done(void)
{
	__asm__ volatile("" ::: "memory");
}

/* The tiles for blocks of KV values (32 or 16) and NC columns. */
static void configure(int kv, int nc)
{
	struct tile_config c;

	memset(&c, 0, sizeof(c));
	c.palette = 1;
	c.rows[T_CODES] = (uint8_t)(kv / 4);
	c.colsb[T_CODES] = 64;
	c.rows[T_HI] = c.rows[T_LO] = c.rows[T_PHI] = c.rows[T_PLO] = (uint8_t)nc;
	c.colsb[T_HI] = c.colsb[T_LO] = (uint16_t)kv;
	c.colsb[T_PHI] = c.colsb[T_PLO] = 64;
	stores_done();
	_tile_loadconfig(&c);
}

static void pass_q4_k(int nc)
{
	configure(32, nc);
}

static void pass_q6_k(int nc)
{
	configure(16, nc);
}

/*
 * One block's sums for the configured columns: the unpacked CODES
 * against the column bytes at HI and LO (column c at + c K), row c of PH
 * and PL column c's sums for the 16 rows.
 */
static inline void block_sums(const uint8_t *codes, const int8_t *hi, const int8_t *lo,
                              int64_t k, int32_t ph[][16], int32_t pl[][16])
{
	stores_done();
	_tile_loadd(T_CODES, codes, 64);
	_tile_loadd(T_HI, hi, k);
	_tile_loadd(T_LO, lo, k);
	_tile_zero(T_PHI);
	_tile_zero(T_PLO);
	_tile_dpbsud(T_PHI, T_HI, T_CODES);
	_tile_dpbsud(T_PLO, T_LO, T_CODES);
	_tile_stored(T_PHI, ph, 64);
	_tile_stored(T_PLO, pl, 64);
}

/* 256 hi + lo: the int16 product's sums, as vpdpbusd's (hi << 8) + lo. */
static inline __m512i sums(const int32_t ph[16], const int32_t pl[16])
{
	return _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ph), 8),
	                        _mm512_load_si512(pl));
}

/*
 * One tile of Q4_K (NSB super-blocks at P) against NC columns, as the
 * VNNI gemm's tile_q4_k: per sub-block j, acc += (d sc_j) d_b (codes . q)
 * - (dmin m_j) ds_b.
 */
static inline __attribute__((always_inline)) void
tile_q4_k(const struct simd_pack_q4_k *p, int64_t nsb, const struct simd_act *a, int nc,
          float *out[], __mmask16 keep)
{
	const int64_t k = nsb * Q4KH_QK_K;
	alignas(64) uint8_t codes[8][64];
	alignas(64) int32_t ph[PACK_MAX_COLS][16], pl[PACK_MAX_COLS][16];
	__m512 acc[PACK_MAX_COLS];

#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		acc[c] = _mm512_setzero_ps();
	for (int64_t sb = 0; sb < nsb; sb++) {
		const struct simd_pack_q4_k *b = &p[sb];
		const __m512 d = _mm512_load_ps(b->d), dmin = _mm512_load_ps(b->dmin);

		for (int j = 0; j < 8; j++) {
			const int64_t blk = 8 * sb + j;
			const __m512 s = _mm512_mul_ps(u8_ps(b->sc[j]), d);
			const __m512 m = _mm512_mul_ps(u8_ps(b->m[j]), dmin);

#pragma GCC unroll 4
			for (int o = 0; o < 4; o++) {
				__m512i lo4, hi4;

				octet(b->qs[4 * j + o][0], &lo4, &hi4);
				_mm512_store_si512(codes[2 * o], lo4);
				_mm512_store_si512(codes[2 * o + 1], hi4);
			}
			block_sums(codes[0], a->hi + 32 * blk, a->lo + 32 * blk, k, ph, pl);
#pragma GCC unroll 16
			for (int c = 0; c < nc; c++)
				acc[c] = q4_k_step(acc[c], sums(ph[c], pl[c]), s, m, &a[c], blk);
		}
	}
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		_mm512_mask_storeu_ps(out[c], keep, acc[c]);
}

/*
 * One tile of Q6_K against NC columns, as the VNNI gemm's tile_q6_k: per
 * group g of 16 values, acc += (d sc_g) d_b (codes . q - 32 sum of q).
 */
static inline __attribute__((always_inline)) void
tile_q6_k(const struct simd_pack_q6_k *p, int64_t nsb, const struct simd_act *a, int nc,
          float *out[], __mmask16 keep)
{
	const int64_t k = nsb * Q4KH_QK_K;
	alignas(64) uint8_t codes[4][64];
	alignas(64) int32_t ph[PACK_MAX_COLS][16], pl[PACK_MAX_COLS][16];
	__m512 acc[PACK_MAX_COLS];

#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		acc[c] = _mm512_setzero_ps();
	for (int64_t sb = 0; sb < nsb; sb++) {
		const struct simd_pack_q6_k *b = &p[sb];
		const __m512 d = _mm512_load_ps(b->d);

		for (int g = 0; g < 16; g++) {
			const int64_t v = Q4KH_QK_K * sb + 16 * g;
			const __m512 s = _mm512_mul_ps(i8_ps(b->sc[g]), d);
			__m512i w[4];

			q6_k_group(b, g, w);
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++)
				_mm512_store_si512(codes[i], w[i]);
			block_sums(codes[0], a->hi + v, a->lo + v, k, ph, pl);
#pragma GCC unroll 16
			for (int c = 0; c < nc; c++)
				acc[c] = q6_k_step(acc[c], sums(ph[c], pl[c]), s, &a[c], v);
		}
	}
#pragma GCC unroll 16
	for (int c = 0; c < nc; c++)
		_mm512_mask_storeu_ps(out[c], keep, acc[c]);
}

/* A tile against NC columns: 16 (the accumulators in registers) or fewer. */
static void q4_k_cols(const void *p, int64_t nsb, const struct simd_act *a, int nc,
                      float *out[], __mmask16 keep)
{
	if (nc == PACK_MAX_COLS)
		tile_q4_k(p, nsb, a, PACK_MAX_COLS, out, keep);
	else
		tile_q4_k(p, nsb, a, nc, out, keep);
}

static void q6_k_cols(const void *p, int64_t nsb, const struct simd_act *a, int nc,
                      float *out[], __mmask16 keep)
{
	if (nc == PACK_MAX_COLS)
		tile_q6_k(p, nsb, a, PACK_MAX_COLS, out, keep);
	else
		tile_q6_k(p, nsb, a, nc, out, keep);
}

void simd_amx_packed_q4_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                          const struct simd_act *a, int ncols, float *const *y)
{
	packed_tiles(q4_k_cols, PACK_MAX_COLS, pass_q4_k, sizeof(struct simd_pack_q4_k), p, n, k,
	             t0, t1, a, ncols, y);
	_tile_release();
}

void simd_amx_packed_q6_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                          const struct simd_act *a, int ncols, float *const *y)
{
	packed_tiles(q6_k_cols, PACK_MAX_COLS, pass_q6_k, sizeof(struct simd_pack_q6_k), p, n, k,
	             t0, t1, a, ncols, y);
	_tile_release();
}
