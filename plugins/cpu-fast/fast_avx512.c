/*
 * cpu-fast's loops for AVX-512 (F, BW, VL), 16 lanes (fast_kernels.h).
 * Built with the AVX2 flags and the AVX-512 ones; used only where the CPU
 * has them and XCR0 says the OS saves the ZMM state.
 */
#include <immintrin.h>
#include <stdint.h>

#define FAST_W 16
typedef __m512 vf;

static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset(float x) { return _mm512_set1_ps(x); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vfnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline vf vswap_pairs(vf v) { return _mm512_permute_ps(v, 0xB1); }
static inline float vhsum(vf v) { return _mm512_reduce_add_ps(v); }

static inline vf vload_h(const uint16_t *p)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline void vstore_h(uint16_t *p, vf v)
{
	_mm256_storeu_si256((__m256i *)p,
	                    _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline vf vround(vf v)
{
	return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline vf vscale2(vf p, vf n)
{
	return _mm512_scalef_ps(p, n);
}

#define FAST_TABLE fast_avx512_kernels
#define FAST_NAME "avx512"
#include "fast_kernels.h"
