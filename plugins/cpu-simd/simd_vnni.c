/*
 * cpu-simd's product for AVX-512 VNNI: per block of 32, one vpdpwssd (int16
 * pairs summed into int32) on a 512-bit register, scaled in float. Built
 * with the AVX2 flags and -mavx512f -mavx512bw -mavx512vl -mavx512vnni;
 * called only where simd_isa_usable(SIMD_ISA_AVX512_VNNI).
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
 * SIMD_ROWS rows. A lane sums at most 16 products of |u| <= 4096 and |q|
 * <= 32767 before it goes to float: under 2^31.
 */
static void tile(const struct simd_row *w, const struct simd_group *g, int64_t k,
                 float *out)
{
	__m512 acc[SIMD_ROWS], off[SIMD_ROWS];

#pragma GCC unroll 4
	for (int r = 0; r < SIMD_ROWS; r++)
		acc[r] = off[r] = _mm512_setzero_ps();
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
		for (int r = 0; r < SIMD_ROWS; r++) {
			const __m512 sd = _mm512_mul_ps(_mm512_set1_ps(w[r].s[b]), d);

			acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[r][0]), sd, acc[r]);
			acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[r][1]), sd, acc[r]);
			off[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r].o[b]), ds, off[r]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < SIMD_ROWS; r++)
		_mm512_storeu_ps(out + 16 * r, _mm512_sub_ps(acc[r], off[r]));
}

#define SIMD_TABLE simd_vnni_kernels
#define SIMD_NAME "avx512-vnni"
#include "simd_rows.h"
