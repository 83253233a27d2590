/*
 * The cpu backend's one order of sums for a dot product of doubles, which
 * makes its results the same bits on every machine and for any blocking:
 * the product of element i goes to lane i mod 8 of eight accumulators,
 * each lane sums in increasing i, and the lanes are combined in one fixed
 * tree (cpu_lanes_sum). A product is a multiply then an add (the build
 * says -ffp-contract=off), never a fused multiply-add.
 *
 * cpu_lanes_tile runs a register tile of such dot products; the callers
 * inline it into one function per instruction set (cpu_lanes_isa), each
 * with the tile size its vector registers hold.
 */
#ifndef Q4KH_CPU_LANES_H
#define Q4KH_CPU_LANES_H

#include <stdint.h>
#include <string.h>

#define CPU_LANES 8

/* Eight lanes; GCC lowers it to what the target has (one AVX-512
 * register, two AVX2 ones, four SSE2 ones). */
typedef double cpu_v8d __attribute__((vector_size(64)));

/* The lanes summed in the fixed tree. */
static inline double cpu_lanes_sum(const cpu_v8d *a)
{
	return (((*a)[0] + (*a)[1]) + ((*a)[2] + (*a)[3])) +
	       (((*a)[4] + (*a)[5]) + ((*a)[6] + (*a)[7]));
}

/* Four lanes, the widest vector AVX2 has: a cpu_v8d's lanes 0-3 or 4-7. */
typedef double cpu_v4d __attribute__((vector_size(32)));

/*
 * A register tile of dot products in vectors of type VT (cpu_v8d, or
 * cpu_v4d: each cpu_v8d then kept as its two halves, lanes 0-3 over all
 * of i before lanes 4-7, so that a tile's accumulators of one half fit
 * AVX2's 16 registers), as NAME; see cpu_lanes_tile. One body for both
 * widths, as C has no templates.
 */
#define CPU_LANES_TILE_OF(NAME, VT)                                                         \
	static inline __attribute__((always_inline)) void NAME(                             \
		const double *w, int64_t ldw, const double *x, int64_t ldx, int64_t n, int nr, \
		int nc, cpu_v8d *acc, int64_t ld)                                           \
	{                                                                                   \
		enum { VL = sizeof(VT) / sizeof(double), PARTS = CPU_LANES / VL };          \
		VT a[4][4][PARTS];                                                          \
                                                                                            \
		for (int r = 0; r < nr; r++)                                                \
			for (int c = 0; c < nc; c++)                                        \
				memcpy(a[r][c], &acc[r * ld + c], sizeof(cpu_v8d));         \
		_Pragma("GCC unroll 2") for (int p = 0; p < PARTS; p++)                     \
			for (int64_t i = 0; i < n; i += CPU_LANES) {                        \
				VT wv[4];                                                   \
                                                                                            \
				_Pragma("GCC unroll 4") for (int r = 0; r < nr; r++)        \
					memcpy(&wv[r], w + r * ldw + i + p * VL, sizeof(VT)); \
				_Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {      \
					VT xv;                                              \
                                                                                            \
					memcpy(&xv, x + c * ldx + i + p * VL, sizeof(VT));  \
					_Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) \
						a[r][c][p] += wv[r] * xv;                   \
				}                                                           \
			}                                                                   \
		for (int r = 0; r < nr; r++)                                                \
			for (int c = 0; c < nc; c++)                                        \
				memcpy(&acc[r * ld + c], a[r][c], sizeof(cpu_v8d));         \
	}

CPU_LANES_TILE_OF(cpu_lanes_tile8, cpu_v8d)
CPU_LANES_TILE_OF(cpu_lanes_tile4, cpu_v4d)

/*
 * acc[r * ld + c] += the lanes of row r of W times row c of X over
 * i in [0, n), n a multiple of CPU_LANES, for r < NR <= 4, c < NC <= 4
 * (rows LDW and LDX doubles apart; ACC 64-byte aligned), in vectors of
 * VW lanes: 8 where a register holds a cpu_v8d (AVX-512), else 4. GCC
 * lowers a cpu_v8d wider than the target's registers through the stack,
 * which made AVX2's tiles several times slower. Either width makes the
 * same products and sums in each lane, so the same bits. Inline it with
 * constant NR, NC and VW so the tile lives in registers.
 */
static inline __attribute__((always_inline)) void
cpu_lanes_tile(const double *w, int64_t ldw, const double *x, int64_t ldx, int64_t n,
               int nr, int nc, cpu_v8d *acc, int64_t ld, const int vw)
{
	if (vw == CPU_LANES)
		cpu_lanes_tile8(w, ldw, x, ldx, n, nr, nc, acc, ld);
	else
		cpu_lanes_tile4(w, ldw, x, ldx, n, nr, nc, acc, ld);
}

/* Which tile functions this CPU runs: 2 with AVX-512, 1 with AVX2, else 0. */
static inline int cpu_lanes_isa(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		return 2;
	if (__builtin_cpu_supports("avx2"))
		return 1;
#endif
	return 0;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_LANES_TARGETS 1
#define CPU_TARGET_AVX2 __attribute__((target("avx2")))
#define CPU_TARGET_AVX512 __attribute__((target("avx512f")))
#else
#define CPU_LANES_TARGETS 0
#endif

#endif
