/*
 * cpu-simd's kernels for AVX-512 VNNI: a byte dot product is one vpdpbusd
 * (unsigned x signed byte quads summed into int32), on 256-bit registers
 * (AVX-512 VL). Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
 * (and the AVX2 flags); called only where
 * simd_isa_usable(SIMD_ISA_AVX512_VNNI).
 */
#include <immintrin.h>

#define SIMD_DOT(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define SIMD_SDOT(acc, u, s, sc) \
	_mm256_add_epi32((acc), _mm256_mullo_epi32( \
		_mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s)), (sc)))
#define SIMD_SCALES(lo, hi) _mm256_set_m128i(_mm_set1_epi32(hi), _mm_set1_epi32(lo))

#include "simd_kernels.h"

const struct simd_kernels simd_vnni_kernels = {
	.name = "avx512-vnni",
	.rows = { rows_q4_k, rows_q5_0, rows_q6_k, rows_q8_0 },
};
