/*
 * cpu-simd's weight decoders and activation quantiser, written once in
 * AVX2 intrinsics and included by each instruction-set file, which
 * compiles them with its own -m flags (then defines its product and
 * includes simd_rows.h).
 *
 * Each decoder writes a row as value = s_b * u_i - o_b per block b of 32
 * (block layouts and formulas: quant.h):
 *   Q8_0:  u = q,                 s = d
 *   Q4_0:  u = q - 8,             s = d
 *   Q5_0:  u = q - 16,            s = d
 *   Q4_1, Q5_1: u = q,            s = d, o = -m
 *   Q4_K, Q5_K: u = q,            s = d sc_j, o = dmin m_j   (j: sub-block)
 *   Q6_K:  u = sc_g (q - 32),     s = d                      (g: 16 values)
 * and o = 0 where not given.
 */
#ifndef Q4KH_SIMD_DECODE_H
#define Q4KH_SIMD_DECODE_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "simd.h"

static inline float fp16(uint16_t h)
{
	return _cvtsh_ss(h);
}

static inline __m256i load32(const void *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

/* Signed bytes v to int16 at u[0..31]. */
static inline void store_i8(int16_t *u, __m256i v)
{
	_mm256_storeu_si256((__m256i *)u, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
	_mm256_storeu_si256((__m256i *)(u + 16),
	                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
}

/* The 4-bit codes of a legacy block's 16 bytes QS, value j in byte j (j <
 * 16 the low nibble of qs[j], j + 16 the high one). */
static inline __m256i nibbles(const uint8_t *qs)
{
	const __m128i low = _mm_set1_epi8(0x0F);
	const __m128i v = _mm_loadu_si128((const __m128i *)qs);

	return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

/* The 5-bit codes of a Q5_0 or Q5_1 block (its qh and qs), value j in
 * byte j. */
static inline __m256i q5_values(const uint8_t *qh4, const uint8_t *qs)
{
	/* Byte j selects byte j / 8 of qh, then tests bit j % 8 of it. */
	const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
	                                         0x0101010101010101, 0);
	const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201);
	__m256i hi;
	uint32_t qh;

	memcpy(&qh, qh4, 4);
	hi = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
	hi = _mm256_cmpeq_epi8(_mm256_and_si256(hi, bit), bit);
	return _mm256_or_si256(nibbles(qs), _mm256_and_si256(hi, _mm256_set1_epi8(0x10)));
}

/*
 * Block b of a Q8_0 or Q5_0 row as 32 signed bytes u, with its scale in
 * *d: the two types whose blocks need no offset.
 */
static inline __m256i bytes_q8_0(const void *row, int64_t b, float *d)
{
	const struct q4kh_block_q8_0 *w = row;

	*d = fp16(w[b].d);
	return load32(w[b].qs);
}

static inline __m256i bytes_q5_0(const void *row, int64_t b, float *d)
{
	const struct q4kh_block_q5_0 *w = row;

	*d = fp16(w[b].d);
	return _mm256_sub_epi8(q5_values(w[b].qh, w[b].qs), _mm256_set1_epi8(16));
}

static inline __m256i bytes_q4_0(const void *row, int64_t b, float *d)
{
	const struct q4kh_block_q4_0 *w = row;

	*d = fp16(w[b].d);
	return _mm256_sub_epi8(nibbles(w[b].qs), _mm256_set1_epi8(8));
}

typedef __m256i (*bytes_fn)(const void *row, int64_t b, float *d);

/*
 * Block b of a Q4_1 or Q5_1 row as 32 unsigned codes q, with its scale in
 * *d and its min in *m: value = d q + m.
 */
static inline __m256i bytes_q4_1(const void *row, int64_t b, float *d, float *m)
{
	const struct q4kh_block_q4_1 *w = row;

	*d = fp16(w[b].d);
	*m = fp16(w[b].m);
	return nibbles(w[b].qs);
}

static inline __m256i bytes_q5_1(const void *row, int64_t b, float *d, float *m)
{
	const struct q4kh_block_q5_1 *w = row;

	*d = fp16(w[b].d);
	*m = fp16(w[b].m);
	return q5_values(w[b].qh, w[b].qs);
}

typedef __m256i (*bytes_min_fn)(const void *row, int64_t b, float *d, float *m);

static inline __attribute__((always_inline)) void
decode_bytes(bytes_fn bytes, const void *row, int64_t k, const struct simd_row *out)
{
	for (int64_t b = 0; b < k / 32; b++) {
		store_i8(out->u + 32 * b, bytes(row, b, &out->s[b]));
		out->o[b] = 0;
	}
}

static void decode_q8_0(const void *row, int64_t k, const struct simd_row *out)
{
	decode_bytes(bytes_q8_0, row, k, out);
}

static void decode_q5_0(const void *row, int64_t k, const struct simd_row *out)
{
	decode_bytes(bytes_q5_0, row, k, out);
}

static void decode_q4_0(const void *row, int64_t k, const struct simd_row *out)
{
	decode_bytes(bytes_q4_0, row, k, out);
}

static inline __attribute__((always_inline)) void
decode_bytes_min(bytes_min_fn bytes, const void *row, int64_t k, const struct simd_row *out)
{
	for (int64_t b = 0; b < k / 32; b++) {
		float m;

		store_i8(out->u + 32 * b, bytes(row, b, &out->s[b], &m));
		out->o[b] = -m;
	}
}

static void decode_q4_1(const void *row, int64_t k, const struct simd_row *out)
{
	decode_bytes_min(bytes_q4_1, row, k, out);
}

static void decode_q5_1(const void *row, int64_t k, const struct simd_row *out)
{
	decode_bytes_min(bytes_q5_1, row, k, out);
}

/*
 * A Q4_K or Q5_K block's 8 sub-block scales and mins (quant.h; the two
 * share d, dmin and scales), times d and dmin: the 6-bit fields unpacked
 * from the 12 bytes in four 32-bit steps (as llama.cpp does), then
 * converted 8 at a time.
 */
static inline void q4_k_scales(const void *block, __m256 *sc, __m256 *m)
{
	const struct q4kh_block_q4_k *w = block;
	const uint8_t *s = w->scales;
	uint32_t u0, u1, u2;
	uint64_t a, b;

	memcpy(&u0, s, 4);
	memcpy(&u1, s + 4, 4);
	memcpy(&u2, s + 8, 4);
	a = (uint64_t)(u0 & 0x3f3f3f3f) |
	    (uint64_t)((u2 & 0x0f0f0f0f) | ((u0 >> 2) & 0x30303030)) << 32;
	b = (uint64_t)(u1 & 0x3f3f3f3f) |
	    (uint64_t)(((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 2) & 0x30303030)) << 32;
	*sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)a))),
	                    _mm256_set1_ps(fp16(w->d)));
	*m = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)b))),
	                   _mm256_set1_ps(fp16(w->dmin)));
}

/*
 * Sub-blocks 2c and 2c + 1 of a Q4_K block as unsigned 4-bit codes, into
 * *lo and *hi: the low and high nibbles of qs[32c ..].
 */
static inline __attribute__((always_inline)) void
q4_k_pair(const void *block, int c, __m256i *lo, __m256i *hi)
{
	const struct q4kh_block_q4_k *b = block;
	const __m256i low = _mm256_set1_epi8(0x0F), qs = load32(b->qs + 32 * c);

	*lo = _mm256_and_si256(qs, low);
	*hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), low);
}

/*
 * The same of a Q5_K block as unsigned 5-bit codes: the nibbles of
 * qs[32c ..] with bits 2c and 2c + 1 of qh.
 */
static inline __attribute__((always_inline)) void
q5_k_pair(const void *block, int c, __m256i *lo, __m256i *hi)
{
	const struct q4kh_block_q5_k *b = block;
	const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
	const __m256i qs = load32(b->qs + 32 * c), qh = load32(b->qh);

	*lo = _mm256_or_si256(_mm256_and_si256(qs, low),
	                      _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
	*hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), low),
	                      _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one),
	                                        4));
}

/* The Q5_K block's scale fields, as those of a Q4_K block (same offsets). */
static inline void q5_k_scales(const void *block, __m256 *sc, __m256 *m)
{
	struct q4kh_block_q4_k head;

	memcpy(&head, block, offsetof(struct q4kh_block_q4_k, qs));
	q4_k_scales(&head, sc, m);
}

/* Sub-blocks 2c and 2c + 1 of one Q4_K or Q5_K super-block as unsigned
 * codes (q4_k_pair, q5_k_pair), and its scales and mins times d and dmin
 * (q4_k_scales, q5_k_scales). */
typedef void (*k_pair_fn)(const void *block, int c, __m256i *lo, __m256i *hi);
typedef void (*k_scales_fn)(const void *block, __m256 *sc, __m256 *m);

/* A row of Q4_K or Q5_K super-blocks of BLOCK_BYTES, decoded. */
static inline __attribute__((always_inline)) void
decode_k(k_pair_fn pair, k_scales_fn scales, size_t block_bytes, const void *row, int64_t k,
         const struct simd_row *out)
{
	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const uint8_t *block = (const uint8_t *)row + block_bytes * (size_t)sb;
		int16_t *u = out->u + sb * Q4KH_QK_K;
		__m256 sc, m;

		for (int c = 0; c < 4; c++) {
			__m256i lo, hi;

			pair(block, c, &lo, &hi);
			store_i8(u + 64 * c, lo);
			store_i8(u + 64 * c + 32, hi);
		}
		scales(block, &sc, &m);
		_mm256_storeu_ps(out->s + sb * 8, sc);
		_mm256_storeu_ps(out->o + sb * 8, m);
	}
}

static void decode_q4_k(const void *row, int64_t k, const struct simd_row *out)
{
	decode_k(q4_k_pair, q4_k_scales, sizeof(struct q4kh_block_q4_k), row, k, out);
}

static void decode_q5_k(const void *row, int64_t k, const struct simd_row *out)
{
	decode_k(q5_k_pair, q5_k_scales, sizeof(struct q4kh_block_q5_k), row, k, out);
}

/*
 * Block of 32 values BLK (0 .. 7) of a Q6_K block as signed bytes, q - 32
 * (quant.h): of half h = blk / 4, the low or high nibbles of ql bytes
 * 64h .. 64h + 31 or 64h + 32 .., and as bits 4, 5 bits 2i, 2i + 1 of its
 * qh bytes, i = blk % 4. Callers unroll over BLK; the loads are shared.
 */
static inline __attribute__((always_inline)) __m256i q6_k_block(const struct q4kh_block_q6_k *b,
                                                                  int blk)
{
	const int h = blk / 4, i = blk % 4;
	const __m256i ql = load32(b->ql + 64 * h + 32 * (i % 2));
	const __m256i qh = load32(b->qh + 32 * h);
	const __m256i nib = _mm256_and_si256(i < 2 ? ql : _mm256_srli_epi16(ql, 4),
	                                     _mm256_set1_epi8(0x0F));
	const __m256i hi = i == 0 ? _mm256_slli_epi16(qh, 4) :
	                   i == 1 ? _mm256_slli_epi16(qh, 2) :
	                   i == 2 ? qh :
	                            _mm256_srli_epi16(qh, 2);

	return _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_and_si256(hi, _mm256_set1_epi8(0x30))),
	                       _mm256_set1_epi8(32));
}

static void decode_q6_k(const void *row, int64_t k, const struct simd_row *out)
{
	const struct q4kh_block_q6_k *w = row;

	for (int64_t sb = 0; sb < k / Q4KH_QK_K; sb++) {
		const int8_t *sc = w[sb].scales;
		const float d = fp16(w[sb].d);

		for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++) {
				const int blk = 4 * h + i, g = 2 * blk;
				const __m256i q = q6_k_block(&w[sb], blk);
				int16_t *u = out->u + sb * Q4KH_QK_K + 32 * blk;

				_mm256_storeu_si256((__m256i *)u,
				                    _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
				                                       _mm256_set1_epi16(sc[g])));
				_mm256_storeu_si256((__m256i *)(u + 16),
				                    _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)),
				                                       _mm256_set1_epi16(sc[g + 1])));
				out->s[sb * 8 + blk] = d;
				out->o[sb * 8 + blk] = 0;
			}
		}
	}
}

/* The sum of v's 8 lanes. */
static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* sum_b o_b ds_b: the weights' offsets against the columns' block sums. */
static inline float offsets(const float *o, const float *ds, int64_t nb)
{
	__m256 acc = _mm256_setzero_ps();
	float tail = 0;
	int64_t b = 0;

	for (; b + 8 <= nb; b += 8)
		acc = _mm256_fmadd_ps(_mm256_loadu_ps(o + b), _mm256_loadu_ps(ds + b), acc);
	for (; b < nb; b++)
		tail += o[b] * ds[b];
	return hsum8(acc) + tail;
}

/*
 * Activations to integer blocks as struct simd_act says: per block of 32,
 * d = max |x| / QMAX and q = x * (QMAX / max |x|) rounded to nearest
 * (even); a block with a value that is not finite gets d = NaN and q = 0.
 * QMAX: SIMD_QMAX (int16) or SIMD_QMAX8 (int8).
 */
static inline __attribute__((always_inline)) void
quantize_to(const float *x, int64_t k, int16_t *q, float *d, float *ds, float qmax)
{
	const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);

	for (int64_t b = 0; b < k / SIMD_BLOCK; b++) {
		__m256 v[4], amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
		__m128 m;
		__m256i lo, hi, sum;
		float a, scale;

		for (int i = 0; i < 4; i++) {
			const __m256 abs = _mm256_andnot_ps(sign, v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i));

			amax = _mm256_max_ps(amax, abs);
			/* NaN or infinite: not less than infinity. */
			bad = _mm256_or_ps(bad, _mm256_cmp_ps(abs, inf, _CMP_NLT_UQ));
		}
		m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
		m = _mm_max_ps(m, _mm_movehl_ps(m, m));
		m = _mm_max_ss(m, _mm_movehdup_ps(m));
		a = _mm_cvtss_f32(m);
		if (_mm256_movemask_ps(bad)) {
			d[b] = ds[b] = NAN;
			memset(q + 32 * b, 0, 32 * sizeof(*q));
			continue;
		}
		d[b] = a / qmax;
		scale = a > 0 ? qmax / a : 0;
		lo = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[0], _mm256_set1_ps(scale))),
		                        _mm256_cvtps_epi32(_mm256_mul_ps(v[1], _mm256_set1_ps(scale))));
		hi = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[2], _mm256_set1_ps(scale))),
		                        _mm256_cvtps_epi32(_mm256_mul_ps(v[3], _mm256_set1_ps(scale))));
		/* packs interleaves 128-bit lanes: put the values back in order. */
		lo = _mm256_permute4x64_epi64(lo, 0xD8);
		hi = _mm256_permute4x64_epi64(hi, 0xD8);
		_mm256_storeu_si256((__m256i *)(q + 32 * b), lo);
		_mm256_storeu_si256((__m256i *)(q + 32 * b + 16), hi);
		sum = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_set1_epi16(1)),
		                       _mm256_madd_epi16(hi, _mm256_set1_epi16(1)));
		m = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(sum),
		                                  _mm256_extracti128_si256(sum, 1)));
		m = _mm_add_ps(m, _mm_movehl_ps(m, m));
		m = _mm_add_ss(m, _mm_movehdup_ps(m));
		ds[b] = d[b] * _mm_cvtss_f32(m);
	}
}

static void quantize(const float *x, int64_t k, int16_t *q, float *d, float *ds)
{
	quantize_to(x, k, q, d, ds, SIMD_QMAX);
}

static void quantize8(const float *x, int64_t k, int16_t *q, float *d, float *ds)
{
	quantize_to(x, k, q, d, ds, SIMD_QMAX8);
}

#endif
