/*
 * The block dot products of cpu-simd, written once against two integer
 * primitives that each instruction-set file defines before including this
 * header (and compiles with its own -m flags):
 *
 *   SIMD_DOT(acc, u, s)       acc + per 32-bit lane the sum of the four
 *                             products u[b] * s[b] of its bytes, u unsigned,
 *                             s signed (__m256i, 8 lanes of int32);
 *   SIMD_SDOT(acc, u, s, sc)  the same with lane m's sum multiplied by
 *                             sc's value for its 128-bit half, where sc =
 *                             SIMD_SCALES(low half, high half);
 *   SIMD_TABLE                the name of the struct simd_kernels to define.
 *
 * No primitive may saturate: u is at most 63 (Q6_K) or 128 (|Q8_0|) and
 * |s| <= 127, so a pair of products stays within int16 (2 * 128 * 127 =
 * 32512), which AVX2's maddubs needs.
 *
 * Each dot of a weight row with a quantised column (struct simd_act) sums
 * its integer products exactly per block, then scales them in float:
 *   Q8_0:  sum_b dw_b da_b sum_i w_i q_i
 *   Q5_0:  sum_b dw_b da_b (sum_i u_i q_i - 16 sum_b q), x = dw (u - 16)
 *   Q4_K:  sum_j da_j (d sc_j sum_i u_i q_i - dmin m_j sum_j q)
 *   Q6_K:  sum_j da_j d sum_{g in j} sc_g (sum_i u_i q_i - 32 sum_g q)
 * (j a block of 32 values, g a group of 16)
 * with the block layouts and formulas of quant.h.
 */
#ifndef Q4KH_SIMD_KERNELS_H
#define Q4KH_SIMD_KERNELS_H

#include <immintrin.h>
#include <string.h>

#include "simd.h"

static inline float fp16(uint16_t h)
{
	return _cvtsh_ss(h);
}

static inline float hsum_ps(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline __m256i load32(const void *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

static float dot_q8_0(const void *row, const struct simd_act *a, int64_t k)
{
	const struct q4kh_block_q8_0 *w = row;
	__m256 acc = _mm256_setzero_ps();

	for (int64_t b = 0; b < k / 32; b++) {
		const __m256i wv = load32(w[b].qs);
		/* |w| times q with w's sign: unsigned times signed. */
		const __m256i p = SIMD_DOT(_mm256_setzero_si256(), _mm256_sign_epi8(wv, wv),
		                           _mm256_sign_epi8(load32(a->q + 32 * b), wv));

		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
		                      _mm256_set1_ps(fp16(w[b].d) * a->d[b]), acc);
	}
	return hsum_ps(acc);
}

/* The 5-bit values of a Q5_0 block, value j in byte j. */
static inline __m256i q5_0_values(const struct q4kh_block_q5_0 *b)
{
	const __m128i low = _mm_set1_epi8(0x0F);
	/* Byte j selects byte j / 8 of qh, then tests bit j % 8 of it. */
	const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
	                                         0x0101010101010101, 0);
	const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201);
	const __m128i qs = _mm_loadu_si128((const __m128i *)b->qs);
	__m256i hi, nib;
	uint32_t qh;

	memcpy(&qh, b->qh, 4);
	hi = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
	hi = _mm256_cmpeq_epi8(_mm256_and_si256(hi, bit), bit);
	nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low),
	                       _mm_and_si128(qs, low));
	return _mm256_or_si256(nib, _mm256_and_si256(hi, _mm256_set1_epi8(0x10)));
}

static float dot_q5_0(const void *row, const struct simd_act *a, int64_t k)
{
	const struct q4kh_block_q5_0 *w = row;
	__m256 acc = _mm256_setzero_ps();
	float offset = 0;

	for (int64_t b = 0; b < k / 32; b++) {
		const float dd = fp16(w[b].d) * a->d[b];
		const __m256i p = SIMD_DOT(_mm256_setzero_si256(), q5_0_values(&w[b]),
		                           load32(a->q + 32 * b));

		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dd), acc);
		offset += dd * (float)(16 * a->sum[b]);
	}
	return hsum_ps(acc) - offset;
}

/* Q4_K sub-block j's 6-bit scale and min (quant.h). */
static inline void q4_k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
		*m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

static float dot_q4_k(const void *row, const struct simd_act *a, int64_t k)
{
	const struct q4kh_block_q4_k *w = row;
	const __m256i low = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
	__m256 acc = _mm256_setzero_ps();
	float mins = 0;

	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const int8_t *q = a->q + sb * Q4KH_QK_K;
		const float *da = a->d + sb * 8, d = fp16(w[sb].d), dmin = fp16(w[sb].dmin);
		const int16_t *bs = a->sum + sb * 16;

		for (int c = 0; c < 4; c++) {
			const __m256i qs = load32(w[sb].qs + 32 * c);
			const __m256i p0 = SIMD_DOT(zero, _mm256_and_si256(qs, low), load32(q + 64 * c));
			const __m256i p1 = SIMD_DOT(zero, _mm256_and_si256(_mm256_srli_epi16(qs, 4), low),
			                            load32(q + 64 * c + 32));
			int sc0, sc1, m0, m1;

			q4_k_scale_min(w[sb].scales, 2 * c, &sc0, &m0);
			q4_k_scale_min(w[sb].scales, 2 * c + 1, &sc1, &m1);
			acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),
			                      _mm256_set1_ps(d * (float)sc0 * da[2 * c]), acc);
			acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),
			                      _mm256_set1_ps(d * (float)sc1 * da[2 * c + 1]), acc);
			mins += dmin * (da[2 * c] * (float)(m0 * (bs[4 * c] + bs[4 * c + 1])) +
			                da[2 * c + 1] * (float)(m1 * (bs[4 * c + 2] + bs[4 * c + 3])));
		}
	}
	return hsum_ps(acc) - mins;
}

static float dot_q6_k(const void *row, const struct simd_act *a, int64_t k)
{
	const struct q4kh_block_q6_k *w = row;
	const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
	__m256 acc = _mm256_setzero_ps();
	float offset = 0;

	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const int8_t *q = a->q + sb * Q4KH_QK_K, *sc = w[sb].scales;
		const float *da = a->d + sb * 8, d = fp16(w[sb].d);
		const int16_t *bs = a->sum + sb * 16;

		for (int h = 0; h < 2; h++) {
			const __m256i ql0 = load32(w[sb].ql + 64 * h);
			const __m256i ql1 = load32(w[sb].ql + 64 * h + 32);
			const __m256i qh = load32(w[sb].qh + 32 * h);
			/* Bits 2i, 2i+1 of qh are bits 4, 5 of value 32i + l. */
			const __m256i v[4] = {
				_mm256_or_si256(_mm256_and_si256(ql0, low),
				                _mm256_and_si256(_mm256_slli_epi16(qh, 4), top)),
				_mm256_or_si256(_mm256_and_si256(ql1, low),
				                _mm256_and_si256(_mm256_slli_epi16(qh, 2), top)),
				_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
				                _mm256_and_si256(qh, top)),
				_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
				                _mm256_and_si256(_mm256_srli_epi16(qh, 2), top)),
			};

			for (int i = 0; i < 4; i++) {
				const int blk = 4 * h + i, g = 2 * blk;
				const float dd = d * da[blk];
				const __m256i p = SIMD_SDOT(_mm256_setzero_si256(), v[i],
				                            load32(q + 32 * blk),
				                            SIMD_SCALES(sc[g], sc[g + 1]));

				acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dd), acc);
				offset += dd * (float)(32 * (sc[g] * bs[g] + sc[g + 1] * bs[g + 1]));
			}
		}
	}
	return hsum_ps(acc) - offset;
}

typedef float (*dot_fn)(const void *row, const struct simd_act *a, int64_t k);

/* Rows outside, columns inside: a row is read from memory once and then
 * served from L1 to every column. */
static inline __attribute__((always_inline)) void
rows_of(dot_fn dot, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1,
        int64_t k, const struct simd_act *a, int ncols, float *const *y)
{
	for (int64_t r = r0; r < r1; r++)
		for (int c = 0; c < ncols; c++)
			y[c][r] = dot(w + r * row_bytes, &a[c], k);
}

#define SIMD_ROWS_FN(type)                                                       \
	static void rows_##type(const uint8_t *w, int64_t row_bytes, int64_t r0, \
	                        int64_t r1, int64_t k, const struct simd_act *a, \
	                        int ncols, float *const *y)                      \
	{                                                                        \
		rows_of(dot_##type, w, row_bytes, r0, r1, k, a, ncols, y);       \
	}

SIMD_ROWS_FN(q4_k)
SIMD_ROWS_FN(q5_0)
SIMD_ROWS_FN(q6_k)
SIMD_ROWS_FN(q8_0)

#endif
