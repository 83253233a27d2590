/*
 * cpu-simd: a kernel variant for the "cpu" backend. Weights stay in the
 * backend's memory as GGUF blocks; activations are quantised to int8 blocks
 * (simd_quant.c) and every block product is an integer dot product
 * (simd_kernels.h), built once per instruction set (simd_avx2.c,
 * simd_vnni.c) and chosen at run time from what the CPU and the OS support
 * (simd_cpu.c).
 */
#ifndef Q4KH_SIMD_H
#define Q4KH_SIMD_H

#include <stdint.h>

#include "q4khost/plugin.h"

/* The weight types, as indices of a kernel table. */
enum simd_wtype {
	SIMD_Q4_K,
	SIMD_Q5_0,
	SIMD_Q6_K,
	SIMD_Q8_0,
	SIMD_NTYPES
};

/* The instruction sets with kernels, in order of preference. */
enum simd_isa {
	SIMD_ISA_NONE = 0,
	SIMD_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C: maddubs/madd */
	SIMD_ISA_AVX512_VNNI = 2  /* plus AVX-512 F/BW/VL/VNNI: vpdpbusd */
};

/*
 * One activation column quantised for one weight type: q[i] = round(x[i] /
 * d[b]) with d[b] = max |x| over block b of 32 values / 127, so |q| <=
 * 127. Blocks of 32, not ggml's 256 of Q8_K for the K-quants: one large
 * channel then coarsens 31 neighbours instead of 255, which the parity
 * guard sees (docs/perf.md). sum[s] is the sum of q over group s of 16
 * values (K-quants, whose Q6_K scales change every 16) or over block s
 * (Q5_0, Q8_0). A column with a value that is not finite gets d = NaN, so
 * its products are NaN too.
 */
struct simd_act {
	const int8_t *q;    /* K values */
	const float *d;     /* K / block scales */
	const int16_t *sum; /* K / 16 or K / 32 sums */
};

#define SIMD_KQUANT(type) ((type) == SIMD_Q4_K || (type) == SIMD_Q6_K)
#define SIMD_ACT_BLOCK 32
#define SIMD_ACT_GROUP(type) (SIMD_KQUANT(type) ? 16 : 32)

/*
 * y[c][r] = dot(weight row r, activation column c) for r0 <= r < r1 and
 * c < ncols. w points to row 0; rows are row_bytes apart; k values each.
 */
typedef void (*simd_rows_fn)(const uint8_t *w, int64_t row_bytes, int64_t r0,
                             int64_t r1, int64_t k, const struct simd_act *a,
                             int ncols, float *const *y);

/* One instruction set's kernels, indexed by enum simd_wtype. */
struct simd_kernels {
	const char *name;
	simd_rows_fn rows[SIMD_NTYPES];
};

/* simd_avx2.c and simd_vnni.c; call only on a CPU that simd_isa_usable()
 * reports for them. */
extern const struct simd_kernels simd_avx2_kernels;
extern const struct simd_kernels simd_vnni_kernels;

/* 1 when the CPU has ISA and the OS saves its register state (simd_cpu.c). */
int simd_isa_usable(enum simd_isa isa);

/*
 * Quantise the K f32 values x for weight type TYPE into q (K bytes), d
 * and sum, laid out as struct simd_act says (simd_quant.c). Pure.
 */
void simd_quantize(enum simd_wtype type, const float *x, int64_t k,
                   int8_t *q, float *d, int16_t *sum);

#endif
