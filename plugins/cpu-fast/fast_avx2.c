/*
 * cpu-fast's loops for AVX2 + FMA + F16C, 8 lanes (fast_kernels.h). Built
 * with -mavx2 -mfma -mf16c; used only where the CPU and XCR0 allow it.
 */
#include <immintrin.h>
#include <stdint.h>

#define FAST_W 8
typedef __m256 vf;

static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vset(float x) { return _mm256_set1_ps(x); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vfnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf vswap_pairs(vf v) { return _mm256_permute_ps(v, 0xB1); }

static inline vf vload_h(const uint16_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void vstore_h(uint16_t *p, vf v)
{
	_mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

static inline float vhsum(vf v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline vf vround(vf v)
{
	return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* p 2^n by the exponent's bits; n in [-126, 127] (vexp's range). */
static inline vf vscale2(vf p, vf n)
{
	const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
	                                                     _mm256_set1_epi32(127)), 23);

	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#define FAST_TABLE fast_avx2_kernels
#define FAST_NAME "avx2"
#include "fast_kernels.h"
