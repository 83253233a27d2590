/*
 * cpu-simd's product for AVX-512 VNNI: per block of 32, one vpdpwssd (int16
 * pairs summed into int32) on a 512-bit register, scaled in float. Built
 * with the AVX2 flags and -mavx512f -mavx512bw -mavx512vl -mavx512vnni;
 * called only where simd_isa_usable(SIMD_ISA_AVX512_VNNI).
 */
#include <immintrin.h>

#include "simd_decode.h"

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
	__m512 acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
		          _mm512_setzero_ps() };
	const int64_t nb = k / 32;
	int64_t b = 0;

	for (; b + 4 <= nb; b += 4)
		for (int i = 0; i < 4; i++)
			acc[i] = block(w, a, b + i, acc[i]);
	for (; b < nb; b++)
		acc[0] = block(w, a, b, acc[0]);
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]),
	                                          _mm512_add_ps(acc[2], acc[3]))) -
	       offsets(w->o, a->ds, nb);
}

#define SIMD_TABLE simd_vnni_kernels
#define SIMD_NAME "avx512-vnni"
#include "simd_rows.h"
