/*
 * The AVX-512 intrinsics cpu-simd's packed gemm uses
 * (plugins/cpu-simd/simd_vnni_packed.c), in plain C, lane by lane as
 * Intel's intrinsics guide defines them: test_cpu_simd compiles that file
 * against this header (it stands first on the test's include path), so
 * the kernel's own code runs on a CPU without AVX-512. Only the test
 * program sees it; the plugin is built with the compiler's <immintrin.h>.
 * Loads that the hardware wants aligned check their alignment.
 */
#ifndef Q4KH_TEST_AVX512_EMU_H
#define Q4KH_TEST_AVX512_EMU_H

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef union {
	int8_t i8[64];
	uint8_t u8[64];
	int16_t i16[32];
	uint16_t u16[32];
	int32_t i32[16];
} __m512i;

typedef struct {
	float f[16];
} __m512;

typedef struct {
	uint8_t u8[16];
} __m128i;

typedef uint16_t __mmask16;

static inline __m512i _mm512_setzero_si512(void)
{
	__m512i r;

	memset(&r, 0, sizeof(r));
	return r;
}

static inline __m512 _mm512_setzero_ps(void)
{
	__m512 r;

	memset(&r, 0, sizeof(r));
	return r;
}

static inline __m512i _mm512_set1_epi32(int a)
{
	__m512i r;

	for (int i = 0; i < 16; i++)
		r.i32[i] = a;
	return r;
}

static inline __m512i _mm512_set1_epi8(char a)
{
	__m512i r;

	memset(r.u8, (uint8_t)a, 64);
	return r;
}

static inline __m512 _mm512_set1_ps(float a)
{
	__m512 r;

	for (int i = 0; i < 16; i++)
		r.f[i] = a;
	return r;
}

static inline __m512i _mm512_load_si512(const void *p)
{
	__m512i r;

	assert((uintptr_t)p % 64 == 0);
	memcpy(&r, p, 64);
	return r;
}

static inline __m512 _mm512_load_ps(const void *p)
{
	__m512 r;

	assert((uintptr_t)p % 64 == 0);
	memcpy(&r, p, 64);
	return r;
}

static inline __m128i _mm_load_si128(const __m128i *p)
{
	__m128i r;

	assert((uintptr_t)p % 16 == 0);
	memcpy(&r, p, 16);
	return r;
}

static inline void _mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 a)
{
	for (int i = 0; i < 16; i++)
		if (k >> i & 1)
			memcpy((float *)p + i, &a.f[i], sizeof(float));
}

static inline __m512i _mm512_and_si512(__m512i a, __m512i b)
{
	for (int i = 0; i < 16; i++)
		a.i32[i] &= b.i32[i];
	return a;
}

static inline __m512i _mm512_or_si512(__m512i a, __m512i b)
{
	for (int i = 0; i < 16; i++)
		a.i32[i] |= b.i32[i];
	return a;
}

/* Shifts of 16- and 32-bit lanes by N < 16 (or 32): zeros shifted in. */
static inline __m512i _mm512_slli_epi16(__m512i a, unsigned n)
{
	for (int i = 0; i < 32; i++)
		a.u16[i] = (uint16_t)(a.u16[i] << n);
	return a;
}

static inline __m512i _mm512_srli_epi16(__m512i a, unsigned n)
{
	for (int i = 0; i < 32; i++)
		a.u16[i] = (uint16_t)(a.u16[i] >> n);
	return a;
}

static inline __m512i _mm512_slli_epi32(__m512i a, unsigned n)
{
	for (int i = 0; i < 16; i++)
		a.i32[i] = (int32_t)((uint32_t)a.i32[i] << n);
	return a;
}

/* Lane i: src + the 4 products of unsigned bytes of A with signed bytes
 * of B, 4i .. 4i + 3, in 32 bits (no saturation). */
static inline __m512i _mm512_dpbusd_epi32(__m512i src, __m512i a, __m512i b)
{
	for (int i = 0; i < 16; i++) {
		int32_t s = 0;

		for (int j = 0; j < 4; j++)
			s += (int32_t)a.u8[4 * i + j] * b.i8[4 * i + j];
		src.i32[i] = (int32_t)((uint32_t)src.i32[i] + (uint32_t)s);
	}
	return src;
}

static inline __m512i _mm512_cvtepu8_epi32(__m128i a)
{
	__m512i r;

	for (int i = 0; i < 16; i++)
		r.i32[i] = a.u8[i];
	return r;
}

static inline __m512i _mm512_cvtepi8_epi32(__m128i a)
{
	__m512i r;

	for (int i = 0; i < 16; i++)
		r.i32[i] = (int8_t)a.u8[i];
	return r;
}

/* To float, rounded to nearest even (MXCSR's default, as C's cast). */
static inline __m512 _mm512_cvtepi32_ps(__m512i a)
{
	__m512 r;

	for (int i = 0; i < 16; i++)
		r.f[i] = (float)a.i32[i];
	return r;
}

static inline __m512 _mm512_mul_ps(__m512 a, __m512 b)
{
	for (int i = 0; i < 16; i++)
		a.f[i] *= b.f[i];
	return a;
}

/* a b + c and -(a b) + c, each rounded once. */
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c)
{
	for (int i = 0; i < 16; i++)
		c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]);
	return c;
}

static inline __m512 _mm512_fnmadd_ps(__m512 a, __m512 b, __m512 c)
{
	for (int i = 0; i < 16; i++)
		c.f[i] = fmaf(-a.f[i], b.f[i], c.f[i]);
	return c;
}

#endif
