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

/*
 * acc[r * ld + c] += the lanes of row r of W times row c of X over
 * i in [0, n), n a multiple of CPU_LANES, for r < NR <= 4, c < NC <= 4
 * (rows LDW and LDX doubles apart; ACC 64-byte aligned). Inline it with
 * constant NR and NC so the tile lives in registers.
 */
static inline __attribute__((always_inline)) void
cpu_lanes_tile(const double *w, int64_t ldw, const double *x, int64_t ldx, int64_t n,
               int nr, int nc, cpu_v8d *acc, int64_t ld)
{
	cpu_v8d a[4][4];

	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			a[r][c] = acc[r * ld + c];
	for (int64_t i = 0; i < n; i += CPU_LANES) {
		cpu_v8d wv[4];

		for (int r = 0; r < nr; r++)
			memcpy(&wv[r], w + r * ldw + i, sizeof(cpu_v8d));
		for (int c = 0; c < nc; c++) {
			cpu_v8d xv;

			memcpy(&xv, x + c * ldx + i, sizeof(cpu_v8d));
			for (int r = 0; r < nr; r++)
				a[r][c] += wv[r] * xv;
		}
	}
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			acc[r * ld + c] = a[r][c];
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
