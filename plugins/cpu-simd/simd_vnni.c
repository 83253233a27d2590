/*
 * cpu-simd's product for AVX-512 VNNI: per block of 32, one vpdpwssd (int16
 * pairs summed into int32) on a 512-bit register, scaled in float. Built
 * with the AVX2 flags and -mavx512f -mavx512bw -mavx512vl -mavx512vnni;
 * called only where q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX512_VNNI).
 */
#include <immintrin.h>

#include "simd_decode.h"

#define SIMD_WIDTH 16
#define SIMD_ROWS 4

static inline __m512 block(const struct simd_row *w, const struct simd_act *a, int64_t b,
                           __m512 acc)
{
	const __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
	                                      _mm512_loadu_si512(w->u + 32 * b),
	                                      _mm512_loadu_si512(a->q + 32 * b));

	return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(w->s[b] * a->d[b]), acc);
}

/* Four accumulators: one would wait on the latency of every FMA. */
static float dot(const struct simd_row *w, const struct simd_act *a, int64_t k)
{
	__m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
	__m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
	const int64_t nb = k / 32;
	int64_t b = 0;

	for (; b + 4 <= nb; b += 4) {
		acc0 = block(w, a, b, acc0);
		acc1 = block(w, a, b + 1, acc1);
		acc2 = block(w, a, b + 2, acc2);
		acc3 = block(w, a, b + 3, acc3);
	}
	for (; b < nb; b++)
		acc0 = block(w, a, b, acc0);
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1),
	                                          _mm512_add_ps(acc2, acc3))) -
	       offsets(w->o, a->ds, nb);
}


/* The primitives of simd_rows.h's direct products: float vectors, and
 * 32 weight bytes (signed or not) times 32 int16 values, summed in int32
 * lanes and converted. */
typedef __m512 vf;

static inline vf vf_zero(void)
{
	return _mm512_setzero_ps();
}

static inline vf vf_fma(vf p, float s, vf acc)
{
	return _mm512_fmadd_ps(p, _mm512_set1_ps(s), acc);
}

static inline float vf_sum(vf a, vf b, vf c, vf d)
{
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

static inline vf prod_i8(__m256i w, const int16_t *q)
{
	return _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(_mm512_setzero_si512(),
	                                              _mm512_cvtepi8_epi16(w),
	                                              _mm512_loadu_si512(q)));
}

static inline vf prod_u8(__m256i w, const int16_t *q)
{
	return _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(_mm512_setzero_si512(),
	                                              _mm512_cvtepu8_epi16(w),
	                                              _mm512_loadu_si512(q)));
}

/*
 * Columns in lanes, rows in registers: each pair of a group's 16 columns
 * is loaded once and multiplied with that pair of weights (broadcast) of
 * SIMD_ROWS rows. A lane sums at most 8 products of |u| <= 4096 and |q|
 * <= SIMD_QMAX before it goes to float: under 2^31. Per block and row, the
 * two halves' sums are scaled into the accumulator and the weight's
 * offset taken off, in that order: tile2() does the same, so a column's
 * result does not depend on how many columns the batch has.
 */
static inline __m512 tile_block(__m512 acc, __m512i p0, __m512i p1, __m512 sd, float o,
                                __m512 ds)
{
	acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), sd, acc);
	acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), sd, acc);
	return _mm512_fnmadd_ps(_mm512_set1_ps(o), ds, acc);
}

static void tile(const struct simd_row *w, const struct simd_group *g, int64_t k,
                 float *out)
{
	__m512 acc[SIMD_ROWS];

#pragma GCC unroll 4
	for (int r = 0; r < SIMD_ROWS; r++)
		acc[r] = _mm512_setzero_ps();
	for (int64_t b = 0; b < k / 32; b++) {
		const int16_t *q = g->q + b * 32 * 16;
		const __m512 d = _mm512_loadu_ps(g->d + b * 16);
		const __m512 ds = _mm512_loadu_ps(g->ds + b * 16);
		__m512i p[SIMD_ROWS][2];

#pragma GCC unroll 4
		for (int r = 0; r < SIMD_ROWS; r++)
			p[r][0] = p[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 16
		for (int j = 0; j < 16; j++) {
			const __m512i a = _mm512_loadu_si512(q + j * 32);

#pragma GCC unroll 4
			for (int r = 0; r < SIMD_ROWS; r++)
				p[r][j / 8] = _mm512_dpwssd_epi32(
					p[r][j / 8], _mm512_set1_epi32(((const int32_t *)w[r].u)[16 * b + j]), a);
		}
#pragma GCC unroll 4
		for (int r = 0; r < SIMD_ROWS; r++)
			acc[r] = tile_block(acc[r], p[r][0], p[r][1],
			                    _mm512_mul_ps(_mm512_set1_ps(w[r].s[b]), d), w[r].o[b], ds);
	}
#pragma GCC unroll 4
	for (int r = 0; r < SIMD_ROWS; r++)
		_mm512_storeu_ps(out + 16 * r, acc[r]);
}

/*
 * tile() for two groups (32 columns) at once: each weight pair is loaded
 * and broadcast once for both, so a product costs 0.75 loads instead of
 * 1.25. Measured on Zen 5, one thread: 10 to 35 % faster than two tile()
 * calls for K of 1536 to 8960, as fast at 1024, slower below (28 % at
 * 640, 70 % at 256; why is not understood), hence SIMD_TILE2_MIN_K.
 */
static void tile2(const struct simd_row *w, const struct simd_group *g0,
                  const struct simd_group *g1, int64_t k, float *out0, float *out1)
{
	__m512 acc[SIMD_ROWS][2];

#pragma GCC unroll 4
	for (int r = 0; r < SIMD_ROWS; r++)
		acc[r][0] = acc[r][1] = _mm512_setzero_ps();
	for (int64_t b = 0; b < k / 32; b++) {
		const int16_t *q0 = g0->q + b * 32 * 16, *q1 = g1->q + b * 32 * 16;
		const __m512 d0 = _mm512_loadu_ps(g0->d + b * 16), d1 = _mm512_loadu_ps(g1->d + b * 16);
		__m512i p[SIMD_ROWS][2][2];

#pragma GCC unroll 4
		for (int r = 0; r < SIMD_ROWS; r++)
			p[r][0][0] = p[r][0][1] = p[r][1][0] = p[r][1][1] = _mm512_setzero_si512();
#pragma GCC unroll 16
		for (int j = 0; j < 16; j++) {
			const __m512i a0 = _mm512_loadu_si512(q0 + j * 32);
			const __m512i a1 = _mm512_loadu_si512(q1 + j * 32);

#pragma GCC unroll 4
			for (int r = 0; r < SIMD_ROWS; r++) {
				const __m512i wp =
					_mm512_set1_epi32(((const int32_t *)w[r].u)[16 * b + j]);

				p[r][0][j / 8] = _mm512_dpwssd_epi32(p[r][0][j / 8], wp, a0);
				p[r][1][j / 8] = _mm512_dpwssd_epi32(p[r][1][j / 8], wp, a1);
			}
		}
#pragma GCC unroll 4
		for (int r = 0; r < SIMD_ROWS; r++) {
			const __m512 s = _mm512_set1_ps(w[r].s[b]);

			acc[r][0] = tile_block(acc[r][0], p[r][0][0], p[r][0][1], _mm512_mul_ps(s, d0),
			                       w[r].o[b], _mm512_loadu_ps(g0->ds + b * 16));
			acc[r][1] = tile_block(acc[r][1], p[r][1][0], p[r][1][1], _mm512_mul_ps(s, d1),
			                       w[r].o[b], _mm512_loadu_ps(g1->ds + b * 16));
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < SIMD_ROWS; r++) {
		_mm512_storeu_ps(out0 + 16 * r, acc[r][0]);
		_mm512_storeu_ps(out1 + 16 * r, acc[r][1]);
	}
}

#define SIMD_TILE2 tile2
#define SIMD_TILE2_MIN_K 1536

/*
 * One column times a Q4_K or Q6_K row, the weight bytes multiplied as
 * they are: vpdpbusd takes 64 unsigned weights against 64 of the column's
 * high bytes, then against its low bytes (both signed); 256 hi + lo is
 * exactly the int16 product. Each lane sums 4 values of one block, so a
 * register holds two blocks of 32 (Q4_K) or four groups of 16 (Q6_K),
 * scaled in float by a vector of their scales picked with one permute.
 */
static inline __m512 bytes_dot(__m512i w, const int8_t *hi, const int8_t *lo)
{
	const __m512i ph = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(hi));
	const __m512i pl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(lo));

	return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ph, 8), pl));
}

/*
 * Q4_K, 128 values per step: 64 bytes of qs hold sub-blocks 2c and 2c + 2
 * in their low nibbles and 2c + 1 and 2c + 3 in their high ones, which
 * are multiplied in place (16 times the value, taken off in the scale):
 * the column's bytes come in that order of blocks (split()).
 */
static float direct_q4_k_bytes(const void *row, const struct simd_act *a, int64_t k)
{
	const struct q4kh_block_q4_k *w = row;
	const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
	/* Lanes 0-7 and 8-15 of the four registers of a block: sub-blocks
	 * 0, 2 | 1, 3 | 4, 6 | 5, 7 (the high nibbles' scales are 8 .. 15:
	 * divided by 16). */
	const __m512i pick[4] = {
		_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
		_mm512_set_epi32(11, 11, 11, 11, 11, 11, 11, 11, 9, 9, 9, 9, 9, 9, 9, 9),
		_mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4),
		_mm512_set_epi32(15, 15, 15, 15, 15, 15, 15, 15, 13, 13, 13, 13, 13, 13, 13, 13),
	};
	__m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
	__m256 off = _mm256_setzero_ps();

	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const int8_t *hi = a->hi + sb * Q4KH_QK_K, *lo = a->lo + sb * Q4KH_QK_K;
		__m256 sc, m, s8;
		__m512 s;

		q4_k_scales(&w[sb], &sc, &m);
		s8 = _mm256_mul_ps(sc, _mm256_loadu_ps(a->d + 8 * sb));
		s = _mm512_castsi512_ps(_mm512_inserti64x4(
			_mm512_castsi256_si512(_mm256_castps_si256(s8)),
			_mm256_castps_si256(_mm256_mul_ps(s8, _mm256_set1_ps(1.0f / 16))), 1));
		off = _mm256_fmadd_ps(m, _mm256_loadu_ps(a->ds + 8 * sb), off);
#pragma GCC unroll 2
		for (int half = 0; half < 2; half++) {
			const __m512i qs = _mm512_loadu_si512(w[sb].qs + 64 * half);

			acc0 = _mm512_fmadd_ps(bytes_dot(_mm512_and_si512(qs, low), hi + 128 * half,
			                                 lo + 128 * half),
			                       _mm512_permutexvar_ps(pick[2 * half], s), acc0);
			acc1 = _mm512_fmadd_ps(bytes_dot(_mm512_and_si512(qs, high), hi + 128 * half + 64,
			                                 lo + 128 * half + 64),
			                       _mm512_permutexvar_ps(pick[2 * half + 1], s), acc1);
		}
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) -
	       _mm512_reduce_add_ps(_mm512_zextps256_ps512(off));
}

/*
 * Q6_K: a value is d sc_g (q - 32), q of 6 bits, one signed scale per
 * group g of 16; the 32 is taken off through the column's sums per 16.
 */
static float direct_q6_k_bytes(const void *row, const struct simd_act *a, int64_t k)
{
	const struct q4kh_block_q6_k *w = row;
	const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
	/* Bits 4, 5 of values 0-31 and 32-63 of a half are bits 0, 1 and 2, 3
	 * of its qh bytes; of values 64-95 and 96-127, bits 4, 5 and 6, 7. */
	const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
	const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
	/* Column scales per group: d[0] d[0] d[1] d[1] .. d[7] d[7]. */
	const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
	/* Lanes 4i .. 4i + 3 take group 4p + i's scale, for part p. */
	const __m512i pick[4] = {
		_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
		_mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4),
		_mm512_set_epi32(11, 11, 11, 11, 10, 10, 10, 10, 9, 9, 9, 9, 8, 8, 8, 8),
		_mm512_set_epi32(15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12),
	};
	__m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
	__m512 off = _mm512_setzero_ps();

	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const int64_t base = sb * Q4KH_QK_K;
		const __m512 s = _mm512_mul_ps(
			_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
				_mm_loadu_si128((const __m128i *)w[sb].scales))),
			_mm512_mul_ps(_mm512_set1_ps(fp16(w[sb].d)),
			              _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(
				                                          _mm256_loadu_ps(a->d + 8 * sb)))));

		off = _mm512_fmadd_ps(s, _mm512_loadu_ps(a->s16 + 16 * sb), off);
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const __m512i ql = _mm512_loadu_si512(w[sb].ql + 64 * h);
			const __m512i qh = _mm512_broadcast_i64x4(load32(w[sb].qh + 32 * h));
			const __m512i v0 = _mm512_or_si512(_mm512_and_si512(ql, low),
			                                   _mm512_and_si512(_mm512_sllv_epi16(qh, up), top));
			const __m512i v1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
			                                   _mm512_and_si512(_mm512_srlv_epi16(qh, down), top));
			const int64_t at = base + 128 * h;

			acc0 = _mm512_fmadd_ps(bytes_dot(v0, a->hi + at, a->lo + at),
			                       _mm512_permutexvar_ps(pick[2 * h], s), acc0);
			acc1 = _mm512_fmadd_ps(bytes_dot(v1, a->hi + at + 64, a->lo + at + 64),
			                       _mm512_permutexvar_ps(pick[2 * h + 1], s), acc1);
		}
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) -
	       32.0f * _mm512_reduce_add_ps(off);
}

/*
 * q's signed high and low bytes (q = 256 hi + lo) and its sums per 16
 * (struct simd_act); for Q4_K the blocks of each 256 go in the order its
 * product reads them, 0 2 1 3 4 6 5 7.
 */
static void split(const int16_t *q, int64_t k, int type, int8_t *hi, int8_t *lo, float *s16)
{
	static const int q4_k_order[8] = { 0, 2, 1, 3, 4, 6, 5, 7 };
	const __m512i one = _mm512_set1_epi16(1), half = _mm512_set1_epi16(128);

	for (int64_t i = 0; i < k; i += 32) {
		const __m512i v = _mm512_loadu_si512(q + i);
		const __m512i pairs = _mm512_madd_epi16(v, one);
		/* Where block i / 32 goes among the bytes. */
		const int64_t at = type == SIMD_Q4_K
		                           ? i / 256 * 256 + 32 * q4_k_order[i / 32 % 8]
		                           : i;

		_mm256_storeu_si256((__m256i *)(hi + at),
		                    _mm512_cvtepi16_epi8(_mm512_srai_epi16(_mm512_add_epi16(v, half), 8)));
		_mm256_storeu_si256((__m256i *)(lo + at), _mm512_cvtepi16_epi8(v));
		s16[i / 16] = (float)_mm512_mask_reduce_add_epi32(0x00FF, pairs);
		s16[i / 16 + 1] = (float)_mm512_mask_reduce_add_epi32(0xFF00, pairs);
	}
}

#define SIMD_DIRECT_Q4_K direct_q4_k_bytes
#define SIMD_DIRECT_Q6_K direct_q6_k_bytes
#define SIMD_SPLIT split
#define SIMD_PACKED_Q4_K simd_vnni_packed_q4_k
#define SIMD_PACKED_Q6_K simd_vnni_packed_q6_k
#define SIMD_PACKED_Q5_0 simd_vnni_packed_q5_0
#define SIMD_PACKED8_Q4_K simd_vnni_packed8_q4_k
#define SIMD_PACKED8_Q6_K simd_vnni_packed8_q6_k
#define SIMD_PACKED8_Q5_0 simd_vnni_packed8_q5_0

#define SIMD_TABLE simd_vnni_kernels
#define SIMD_NAME "avx512-vnni"
#include "simd_rows.h"
