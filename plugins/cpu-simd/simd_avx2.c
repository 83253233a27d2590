/*
 * cpu-simd's product for AVX2 (+ FMA, F16C): per block of 32, two vpmaddwd
 * (int16 pairs to int32) on 256-bit registers, scaled in float. Built with
 * -mavx2 -mfma -mf16c; called only where q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX2).
 */
#include <immintrin.h>

#include "simd_decode.h"

#define SIMD_WIDTH 8
#define SIMD_ROWS 2

static inline __m256 block(const struct simd_row *w, const struct simd_act *a, int64_t b,
                           __m256 acc)
{
	const __m256i *u = (const __m256i *)(w->u + 32 * b);
	const __m256i *q = (const __m256i *)(a->q + 32 * b);
	const __m256i p = _mm256_add_epi32(
		_mm256_madd_epi16(_mm256_loadu_si256(u), _mm256_loadu_si256(q)),
		_mm256_madd_epi16(_mm256_loadu_si256(u + 1), _mm256_loadu_si256(q + 1)));

	return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(w->s[b] * a->d[b]), acc);
}

/* Four accumulators: one would wait on the latency of every FMA. */
static float dot(const struct simd_row *w, const struct simd_act *a, int64_t k)
{
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	__m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
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
	return hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) -
	       offsets(w->o, a->ds, nb);
}

/* The primitives of simd_rows.h's direct products: float vectors, and
 * 32 weight bytes (signed or not) times 32 int16 values, summed in int32
 * lanes and converted. */
typedef __m256 vf;

static inline vf vf_zero(void)
{
	return _mm256_setzero_ps();
}

static inline vf vf_fma(vf p, float s, vf acc)
{
	return _mm256_fmadd_ps(p, _mm256_set1_ps(s), acc);
}

static inline float vf_sum(vf a, vf b, vf c, vf d)
{
	return hsum8(_mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
}

static inline vf prod16(__m256i lo, __m256i hi, const int16_t *q)
{
	const __m256i *v = (const __m256i *)q;

	return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256(v)),
	                                           _mm256_madd_epi16(hi, _mm256_loadu_si256(v + 1))));
}

static inline vf prod_i8(__m256i w, const int16_t *q)
{
	return prod16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)),
	              _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)), q);
}

static inline vf prod_u8(__m256i w, const int16_t *q)
{
	return prod16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(w)),
	              _mm256_cvtepu8_epi16(_mm256_extracti128_si256(w, 1)), q);
}

/*
 * Columns in lanes, rows in registers: each pair of a group's 8 columns is
 * loaded once and multiplied with that pair of weights (broadcast) of
 * SIMD_ROWS rows. A lane sums at most 16 products of |u| <= 4096 and |q|
 * <= SIMD_QMAX before it goes to float: under 2^31.
 */
static void tile(const struct simd_row *w, const struct simd_group *g, int64_t k,
                 float *out)
{
	const int32_t *u0 = (const int32_t *)w[0].u, *u1 = (const int32_t *)w[1].u;
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	__m256 off0 = _mm256_setzero_ps(), off1 = _mm256_setzero_ps();

	for (int64_t b = 0; b < k / 32; b++) {
		const int16_t *q = g->q + b * 32 * 8;
		const __m256 d = _mm256_loadu_ps(g->d + b * 8);
		const __m256 ds = _mm256_loadu_ps(g->ds + b * 8);
		const __m256 sd0 = _mm256_mul_ps(_mm256_set1_ps(w[0].s[b]), d);
		const __m256 sd1 = _mm256_mul_ps(_mm256_set1_ps(w[1].s[b]), d);

		for (int h = 0; h < 2; h++) {
			__m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();

			for (int j = 8 * h; j < 8 * h + 8; j++) {
				const __m256i a = _mm256_loadu_si256((const __m256i *)(q + j * 16));

				p0 = _mm256_add_epi32(p0, _mm256_madd_epi16(_mm256_set1_epi32(u0[16 * b + j]), a));
				p1 = _mm256_add_epi32(p1, _mm256_madd_epi16(_mm256_set1_epi32(u1[16 * b + j]), a));
			}
			acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), sd0, acc0);
			acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), sd1, acc1);
		}
		off0 = _mm256_fmadd_ps(_mm256_set1_ps(w[0].o[b]), ds, off0);
		off1 = _mm256_fmadd_ps(_mm256_set1_ps(w[1].o[b]), ds, off1);
	}
	_mm256_storeu_ps(out, _mm256_sub_ps(acc0, off0));
	_mm256_storeu_ps(out + 8, _mm256_sub_ps(acc1, off1));
}

#define SIMD_TABLE simd_avx2_kernels
#define SIMD_NAME "avx2"
#include "simd_rows.h"
