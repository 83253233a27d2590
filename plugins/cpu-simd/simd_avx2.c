/*
 * cpu-simd's product for AVX2 (+ FMA, F16C): per block of 32, two vpmaddwd
 * (int16 pairs to int32) on 256-bit registers, scaled in float. Built with
 * -mavx2 -mfma -mf16c; called only where simd_isa_usable(SIMD_ISA_AVX2).
 */
#include <immintrin.h>

#include "simd_decode.h"

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
	__m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
		          _mm256_setzero_ps() };
	const int64_t nb = k / 32;
	int64_t b = 0;
	__m256 sum;
	__m128 s;

	for (; b + 4 <= nb; b += 4)
		for (int i = 0; i < 4; i++)
			acc[i] = block(w, a, b + i, acc[i]);
	for (; b < nb; b++)
		acc[0] = block(w, a, b, acc[0]);
	sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
	s = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s) - offsets(w->o, a->ds, nb);
}

#define SIMD_TABLE simd_avx2_kernels
#define SIMD_NAME "avx2"
#include "simd_rows.h"
