/*
 * cpu-simd's kernels for AVX2 (+ FMA, F16C): a byte dot product is
 * maddubs (unsigned x signed byte pairs to int16) then madd (int16 pairs to
 * int32, by 1 or by the block scale). Built with -mavx2 -mfma -mf16c;
 * called only where simd_isa_usable(SIMD_ISA_AVX2).
 */
#include <immintrin.h>

#define SIMD_DOT(acc, u, s)                                                  \
	_mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), \
	                                          _mm256_set1_epi16(1)))
#define SIMD_SDOT(acc, u, s, sc) \
	_mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), (sc)))
#define SIMD_SCALES(lo, hi) \
	_mm256_set_m128i(_mm_set1_epi16((short)(hi)), _mm_set1_epi16((short)(lo)))

#include "simd_kernels.h"

const struct simd_kernels simd_avx2_kernels = {
	.name = "avx2",
	.rows = { rows_q4_k, rows_q5_0, rows_q6_k, rows_q8_0 },
};
