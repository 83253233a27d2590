/*
 * cpu-simd's gemm for AMX-INT8 on repacked Q4_K, Q6_K and Q5_0 weights
 * (struct simd_pack_q4_k, simd_pack_q6_k, simd_pack_q5_0, the layout of
 * the AVX-512 VNNI gemm):
 * the codes of one scale block of a tile, unpacked to a byte each, are
 * 64 bytes per 4 values of its 16 rows, row r in bytes 4r .. 4r + 3, which
 * is tile B of tdpbsud as it stands; the column bytes of up to 16 columns
 * (struct simd_act hi and lo, K apart) are its tile A, a column a row. One
 * tdpbsud then gives, for 16 columns and 16 rows at once, C[c][r] = the
 * sum over the block of column c's signed bytes times row r's unsigned
 * codes: two of them (hi, then lo) per block, and 256 C_hi + C_lo is
 * exactly the int32 sum the VNNI gemm forms (codes . q, |q| <= SIMD_QMAX),
 * which the same steps (simd_packed.h) scale in the same order: the two
 * gemms agree bit for bit. Int8 columns (cpu-simd8: hi 0) take the low
 * bytes' tdpbsud alone, C_lo, as the VNNI gemm's int8 form its low
 * vpdpbusd alone. A block is 32 values for Q4_K (a sub-block)
 * and Q5_0, 16 for Q6_K (a group): the scales change there, so each
 * tdpbsud uses 32 (16) of the 64 bytes of K it could take. Built with the
 * VNNI flags and
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

static void pass_q5_0(int nc)
{
	configure(32, nc);
}

/* A block's sums for the configured columns, as the tiles leave them. */
struct amx_sums {
	int64_t k;                              /* the columns' bytes are K apart */
	alignas(64) uint8_t codes[8][64];       /* tile B */
	alignas(64) int32_t ph[PACK_MAX_COLS][16]; /* column c's sums in row c */
	alignas(64) int32_t pl[PACK_MAX_COLS][16];
};

/*
 * The block's codes W (NQ registers) as tile B, the column bytes of its
 * first value V as tiles A (a column a row, K apart): both tdpbsud, the
 * sums stored, and column c's as q[c] = 256 hi + lo, as vpdpbusd's
 * (hi << 8) + lo; with BYTES 1 (int8 columns, hi 0) the low bytes' tdpbsud
 * only, q[c] = lo.
 */
static inline __attribute__((always_inline)) void
amx_sums_of(struct amx_sums *st, const __m512i *w, int nq, const struct simd_act *a, int nc,
            int64_t v, __m512i *q, int bytes)
{
#pragma GCC unroll 8
	for (int i = 0; i < nq; i++)
		_mm512_store_si512(st->codes[i], w[i]);
	stores_done();
	_tile_loadd(T_CODES, st->codes, 64);
	_tile_loadd(T_LO, a->lo + v, st->k);
	_tile_zero(T_PLO);
	_tile_dpbsud(T_PLO, T_LO, T_CODES);
	_tile_stored(T_PLO, st->pl, 64);
	if (bytes == 2) {
		_tile_loadd(T_HI, a->hi + v, st->k);
		_tile_zero(T_PHI);
		_tile_dpbsud(T_PHI, T_HI, T_CODES);
		_tile_stored(T_PHI, st->ph, 64);
	}
	/* All PACK_MAX_COLS set, those past NC to 0: the compiler cannot
	 * follow NC from here to the steps that read q. */
#pragma GCC unroll 16
	for (int c = 0; c < PACK_MAX_COLS; c++) {
		const __m512i lo = _mm512_load_si512(st->pl[c]);

		q[c] = c >= nc ? _mm512_setzero_si512()
		       : bytes == 2 ? _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(st->ph[c]),
		                                                         8), lo)
		                    : lo;
	}
}

/* amx_sums_of() as block_sums_fn: int16 columns, and int8. */
static inline __attribute__((always_inline)) void
amx_block_sums(void *state, const __m512i *w, int nq, const struct simd_act *a, int nc, int64_t v,
               __m512i *q)
{
	amx_sums_of(state, w, nq, a, nc, v, q, 2);
}

static inline __attribute__((always_inline)) void
amx_block_sums8(void *state, const __m512i *w, int nq, const struct simd_act *a, int nc,
                int64_t v, __m512i *q)
{
	amx_sums_of(state, w, nq, a, nc, v, q, 1);
}

/* A tile against NC columns: 16 (the accumulators in registers) or fewer;
 * BV values a block, the sums from SUMS; NAME the function. */
#define TILE_COLS(name, type, bv, sums)                                                   \
	static void name(const void *p, int64_t nsb, const struct simd_act *a, int nc,        \
	                 float *out[], __mmask16 keep)                                         \
	{                                                                                     \
		struct amx_sums st;                                                           \
                                                                                              \
		st.k = nsb * (bv);                                                            \
		if (nc == PACK_MAX_COLS)                                                      \
			tile_##type(p, nsb, a, PACK_MAX_COLS, out, keep, sums, &st);          \
		else                                                                          \
			tile_##type(p, nsb, a, nc, out, keep, sums, &st);                     \
	}

/* The exported product NAME of TYPE, its tiles through COLS, configured
 * by PASS. */
#define PACKED(name, type, cols, pass, block_values)                                      \
	void name(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,                \
	          const struct simd_act *a, int ncols, float *const *y)                        \
	{                                                                                     \
		packed_tiles(cols, PACK_MAX_COLS, pass, block_values,                         \
		             sizeof(struct simd_pack_##type), p, n, k, t0, t1, a, ncols, y);  \
		_tile_release();                                                              \
	}

TILE_COLS(q4_k_cols, q4_k, Q4KH_QK_K, amx_block_sums)
TILE_COLS(q6_k_cols, q6_k, Q4KH_QK_K, amx_block_sums)
TILE_COLS(q5_0_cols, q5_0, 32, amx_block_sums)
TILE_COLS(q4_k_cols8, q4_k, Q4KH_QK_K, amx_block_sums8)
TILE_COLS(q6_k_cols8, q6_k, Q4KH_QK_K, amx_block_sums8)
TILE_COLS(q5_0_cols8, q5_0, 32, amx_block_sums8)

PACKED(simd_amx_packed_q4_k, q4_k, q4_k_cols, pass_q4_k, Q4KH_QK_K)
PACKED(simd_amx_packed_q6_k, q6_k, q6_k_cols, pass_q6_k, Q4KH_QK_K)
PACKED(simd_amx_packed_q5_0, q5_0, q5_0_cols, pass_q5_0, 32)
PACKED(simd_amx_packed8_q4_k, q4_k, q4_k_cols8, pass_q4_k, Q4KH_QK_K)
PACKED(simd_amx_packed8_q6_k, q6_k, q6_k_cols8, pass_q6_k, Q4KH_QK_K)
PACKED(simd_amx_packed8_q5_0, q5_0, q5_0_cols8, pass_q5_0, 32)
