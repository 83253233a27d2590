/*
 * The AVX-512 and AMX intrinsics cpu-simd's packed gemms use
 * (plugins/cpu-simd/simd_vnni_packed.c, simd_amx_packed.c), in plain C,
 * lane by lane as Intel's intrinsics guide and the SDM's pseudocode
 * define them: test_cpu_simd compiles those files against this header (it
 * stands first on the test's include path), so the kernels' own code runs
 * on a CPU without AVX-512 or AMX. Only the test program sees it; the
 * plugin is built with the compiler's <immintrin.h>. Loads that the
 * hardware wants aligned check their alignment; the tile instructions
 * check what the hardware would fault on (#UD, #GP): a configuration
 * outside palette 1, a tile used unconfigured, and tdpbsud's shapes.
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

static inline void _mm512_store_si512(void *p, __m512i a)
{
	assert((uintptr_t)p % 64 == 0);
	memcpy(p, &a, 64);
}

static inline __m512i _mm512_add_epi32(__m512i a, __m512i b)
{
	for (int i = 0; i < 16; i++)
		a.i32[i] = (int32_t)((uint32_t)a.i32[i] + (uint32_t)b.i32[i]);
	return a;
}

/*
 * AMX: palette 1's 8 tiles of up to 16 rows of 64 bytes, per thread, as
 * ldtilecfg configures them (64 bytes: palette, start_row, 14 reserved,
 * colsb[16] of 16 bits, rows[16] of 8 bits). Tiles are numbered by
 * constants, as the real intrinsics take them.
 */
static _Thread_local struct {
	int configured;
	uint16_t colsb[8];
	uint8_t rows[8];
	uint8_t t[8][16][64];
} emu_amx;

static inline void emu_tile_check(int t)
{
	assert(emu_amx.configured && t >= 0 && t < 8);
	assert(emu_amx.rows[t] > 0 && emu_amx.colsb[t] > 0);
}

/* ldtilecfg: every tile zeroed. */
static inline void _tile_loadconfig(const void *config)
{
	const uint8_t *c = config;

	assert(c[0] == 1 && c[1] == 0); /* palette 1, start_row 0 */
	for (int i = 2; i < 16; i++)
		assert(c[i] == 0);
	memset(&emu_amx, 0, sizeof(emu_amx));
	for (int t = 0; t < 16; t++) {
		uint16_t colsb;

		memcpy(&colsb, c + 16 + 2 * t, 2);
		if (t >= 8) {
			assert(colsb == 0 && c[48 + t] == 0);
			continue;
		}
		assert(colsb <= 64 && c[48 + t] <= 16);
		assert((colsb == 0) == (c[48 + t] == 0));
		emu_amx.colsb[t] = colsb;
		emu_amx.rows[t] = c[48 + t];
	}
	emu_amx.configured = 1;
}

static inline void _tile_release(void)
{
	memset(&emu_amx, 0, sizeof(emu_amx));
}

static inline void emu_tile_loadd(int t, const void *base, long stride)
{
	emu_tile_check(t);
	memset(emu_amx.t[t], 0, sizeof(emu_amx.t[t]));
	for (int r = 0; r < emu_amx.rows[t]; r++)
		memcpy(emu_amx.t[t][r], (const uint8_t *)base + r * stride, emu_amx.colsb[t]);
}

static inline void emu_tile_stored(int t, void *base, long stride)
{
	emu_tile_check(t);
	for (int r = 0; r < emu_amx.rows[t]; r++)
		memcpy((uint8_t *)base + r * stride, emu_amx.t[t][r], emu_amx.colsb[t]);
}

static inline void emu_tile_zero(int t)
{
	emu_tile_check(t);
	memset(emu_amx.t[t], 0, sizeof(emu_amx.t[t]));
}

/*
 * tdpbsud DST, A, B: DST[m] dword n += the 4 products of A[m]'s signed
 * bytes 4k .. 4k + 3 with B[k]'s unsigned bytes 4n .. 4n + 3, over k <
 * A's colsb / 4, in 32 bits (no saturation); #UD unless A's colsb / 4 is
 * B's rows, DST's rows A's and DST's colsb B's.
 */
static inline void emu_tile_dpbsud(int dst, int a, int b)
{
	emu_tile_check(dst);
	emu_tile_check(a);
	emu_tile_check(b);
	assert(emu_amx.colsb[a] % 4 == 0 && emu_amx.colsb[a] / 4 == emu_amx.rows[b]);
	assert(emu_amx.rows[dst] == emu_amx.rows[a] && emu_amx.colsb[dst] == emu_amx.colsb[b]);
	assert(emu_amx.colsb[dst] % 4 == 0);
	for (int m = 0; m < emu_amx.rows[dst]; m++)
		for (int n = 0; n < emu_amx.colsb[dst] / 4; n++) {
			int32_t acc;

			memcpy(&acc, &emu_amx.t[dst][m][4 * n], 4);
			for (int k = 0; k < emu_amx.colsb[a] / 4; k++)
				for (int i = 0; i < 4; i++)
					acc = (int32_t)((uint32_t)acc +
					                (uint32_t)((int8_t)emu_amx.t[a][m][4 * k + i] *
					                           emu_amx.t[b][k][4 * n + i]));
			memcpy(&emu_amx.t[dst][m][4 * n], &acc, 4);
		}
}

#define _tile_loadd(t, base, stride) emu_tile_loadd(t, base, (long)(stride))
#define _tile_stored(t, base, stride) emu_tile_stored(t, base, (long)(stride))
#define _tile_zero(t) emu_tile_zero(t)
#define _tile_dpbsud(dst, a, b) emu_tile_dpbsud(dst, a, b)

#endif
