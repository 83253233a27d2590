/*
 * The formats of the cuda backend's GEMV (cuda_gemv.cuh walks a block's
 * rows with them), device side: for every weight type, which bytes of a
 * row each lane of a warp loads and how it turns them into products with
 * the activations.
 *
 * A row is walked in units of 256 values: one super-block of Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K and IQ4_XS, eight blocks of 32 of Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0 and IQ4_NL, 256 elements of F32, F16 and BF16 (the last unit
 * of those nine may be partial). In a unit, lane l owns 8 values: two runs
 * of 4 consecutive values, at offsets x0 (the lane's) and x0 + X1 (the
 * format's) of the unit:
 *
 *   Q4_K, Q5_K  4-byte word l of qs: chunk c = l / 8, a = l % 8; runs at
 *               64c + 4a (low nibbles, sub-block 2c) and + 32 (high, 2c+1)
 *   Q6_K        4-byte word l of ql: h = l / 16, p = l / 8 % 2, e = l % 8;
 *               runs at 128h + 32p + 4e (low nibbles) and + 64 (high)
 *   IQ4_XS      4-byte word l of qs: j = l / 4, a = l % 4; runs at
 *               32j + 4a (low nibbles) and + 16 (high), both sub-block j
 *   Q8_0        word l % 8 of qs of blocks 2g and 2g + 1 (g = l / 8): runs
 *               at 64g + 4 (l % 8) and + 32
 *   Q4_0, Q4_1, word l % 4 of qs of block l / 4: runs at 32 (l / 4) +
 *   Q5_0, Q5_1, 4 (l % 4) (low nibbles) and + 16 (high)
 *   IQ4_NL
 *   Q2_K, Q3_K  4-byte word a = l % 8 of qs half h = l / 16 (bytes 32h + 4a
 *               ..), p = l / 8 % 2; runs at 128h + 64p + 4a (2-bit codes
 *               2p) and + 32 (codes 2p + 1); the lanes of p = 0 and 1 load
 *               the same words
 *   F16, F32,   elements 4l .. 4l + 3 and 128 + 4l .. 128 + 4l + 3
 *   BF16
 *
 * so the 32 lanes' weight loads are consecutive words of the unit, and for
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0 and the float types each 8 consecutive
 * lanes read one whole 128-byte line of an activation column (for the other
 * six, half lines: twice the L1 wavefronts for the activations). Blocks of
 * 18, 22, 34, 110 and 210 bytes sit at 2-byte boundaries: their words are
 * read as two 16-bit halves. No block of 20, 24, 84 or 110 bytes keeps a
 * 16-byte load inside one block, or its words in one lane's, without a
 * copy of the weights in another layout; consecutive words over the warp
 * read the same whole lines.
 *
 * Arithmetic, fp32 throughout, activations as they come:
 *  - F32, F16, BF16, Q4_0, Q5_0, Q8_0, IQ4_NL, Q3_K and Q6_K compute every
 *    weight as q4khost/cuda_quant.cuh's q4kh_load_group does (the same
 *    float, but that a zero may have the other sign; tests/emu/gemv_emu.cpp
 *    checks it), in one byte permute and one fma: the permute puts the
 *    code c under a float exponent, making M + c exactly (M = 128 or
 *    32768), and fma(s, M + c, -s (M + o)) = s (c - o) rounded once, the
 *    product the format defines, because s (M + o) is exact for these
 *    scales s and offsets o (at most 23 significant bits). One more fma
 *    takes the product with the activation.
 *  - Q4_1, Q5_1 (d q + m) and Q2_K (d sc q - dmin m) compute every weight
 *    as q4kh_load_group does too, in a permute, a subtraction that leaves
 *    the code c exactly and one fma, s c + o rounded once: the min has no
 *    exact term to fold into the permute's.
 *  - Q4_K and Q5_K (d sc q - dmin m) and IQ4_XS (d (ls - 32) kv) have no
 *    such exact term (the min; a 6-bit scale times 257), and a weight
 *    computed one by one would cost a fourth instruction, so they factor
 *    the run's scale out: per run of 4 values and column,
 *    A = sum (1/2 + q/32) x (the permute makes 1/2 + q/32 exactly; q/64
 *    for Q5_K's 5-bit codes) and S = sum x, and the run adds
 *    32 d sc A - (16 d sc + dmin m) S, which is d sc sum q x - dmin m S;
 *    IQ4_XS adds d (ls - 32) sum kv x. The value is the format's; only the
 *    rounding differs from summing the weights' products one by one, by a
 *    few fp32 ulps of the run's magnitude.
 *  - Each lane accumulates its products with every column in order; the
 *    warp then sums its lanes in a fixed tree, and the warps sharing a row
 *    (see gv_block) in a fixed order: the result does not depend on timing.
 *
 * A format F provides, for a step of U units u0 .. u0 + U - 1 (those below
 * units) of R rows:
 *   F::UB                           weight bytes per unit
 *   F::ALIGN                        the alignment in bytes the loads need
 *                                   of a row's address and of the stride
 *                                   between rows
 *   F::X1                           where run 1 starts in x, from run 0
 *   F::lane_t F::lane_init(lane, k, units)
 *                                   the lane's constants: byte offsets of
 *                                   its loads in a unit, x0 (run 0 in x),
 *                                   and for partial units the units below
 *                                   which each run exists
 *   F::raw<R, U>                    what a step's loads bring
 *   F::load<R, U>(raw, b, u0, units, L)
 *                                   issue them; b[r] is unit u0 of row r
 *   F::compute<C, R, U>(acc, raw, x, u0, units, L, lane)
 *                                   acc[r][c] += the step's values of row r
 *                                   times column c, x[c] its run 0 in unit
 *                                   u0 (+ 256 i for unit u0 + i)
 * (load and compute take a bool CHECK first: false where every unit of the
 * step is whole.)
 */
#ifndef Q4KH_CUDA_GEMV_FORMATS_CUH
#define Q4KH_CUDA_GEMV_FORMATS_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cuda_common.cuh"
#include "q4khost/quant.h"

#define GV_WARPS 4                 /* warps per block */
#define GV_THREADS (32 * GV_WARPS)
#define GV_UNIT 256                /* values per unit */
#define GV_FULL 0xFFFFFFFFu

/* --- loads ---------------------------------------------------------------- */

/* Weight bytes are read once per launch: no L1 allocation, so that the
 * activations every warp re-reads keep the L1. T: uint32_t, uint16_t,
 * int8_t (sign-extended), uint2 or uint4, at an address aligned for it. The
 * #else branch reads the same bytes on a host, for tests/emu/gemv_emu.cpp,
 * which runs these kernels' blocks on host threads. */
template <class T>
static __device__ __forceinline__ T gv_ld(const uint8_t *p)
{
	T v;
#ifdef __CUDA_ARCH__
#define GV_LD(type) "ld.global.nc.L1::no_allocate." type
	if constexpr (sizeof(T) == 16)
		asm(GV_LD("v4.u32") " {%0, %1, %2, %3}, [%4];"
		    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		    : "l"(p));
	else if constexpr (sizeof(T) == 8)
		asm(GV_LD("v2.u32") " {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
	else if constexpr (sizeof(T) == 4)
		asm(GV_LD("u32") " %0, [%1];" : "=r"(v) : "l"(p));
	else if constexpr (sizeof(T) == 2)
		asm(GV_LD("u16") " %0, [%1];" : "=h"(v) : "l"(p));
	else {
		int w;

		asm(GV_LD("s8") " %0, [%1];" : "=r"(w) : "l"(p));
		v = (T)w;
	}
#undef GV_LD
#else
#ifdef GV_HOST_LOAD_CHECK
	GV_HOST_LOAD_CHECK(p, sizeof(v)); /* the emulator's alignment check */
#endif
	memcpy(&v, p, sizeof(v));
#endif
	return v;
}

static __device__ __forceinline__ uint32_t gv_ld32(const uint8_t *p)
{
	return gv_ld<uint32_t>(p);
}

static __device__ __forceinline__ uint32_t gv_ld16(const uint8_t *p)
{
	return gv_ld<uint16_t>(p);
}

/* 4 bytes at a 2-byte boundary, as two halves: no byte outside them. */
static __device__ __forceinline__ uint32_t gv_ld32h(const uint8_t *p)
{
	return __byte_perm(gv_ld16(p), gv_ld16(p + 2), 0x5410);
}

/* 4 activations, 16-byte aligned, through the L1. */
static __device__ __forceinline__ float4 gv_ldx(const float *p)
{
	return __ldg((const float4 *)p);
}

/* --- codes as floats ---------------------------------------------------- */

/* 128 + byte B of v (below 128), exactly: the byte under 2^7's exponent. */
static __device__ __forceinline__ float gv_m128(uint32_t v, int b)
{
	return __int_as_float((int)__byte_perm(v, 0x43000000u, 0x7044u | (b << 8)));
}

/* 32768 + byte B of v, exactly: the byte under 2^15's exponent. */
static __device__ __forceinline__ float gv_m32768(uint32_t v, int b)
{
	return __int_as_float((int)__byte_perm(v, 0x47000000u, 0x7404u | (b << 4)));
}

/* 1/2 + (byte B of v) / 256, exactly (the byte below 128): the byte under
 * 1/2's exponent. */
static __device__ __forceinline__ float gv_half_plus(uint32_t v, int b)
{
	return __int_as_float((int)__byte_perm(v, 0x3F000000u, 0x7044u | (b << 8)));
}

/* The fp16 in the low 16 bits of v. */
static __device__ __forceinline__ float gv_half(uint32_t v)
{
	return __half2float(__ushort_as_half((unsigned short)(v & 0xFFFF)));
}

/*
 * The IQ4_NL codebook entries plus 128 (1 .. 241) of 4-bit indices, one
 * per byte. For four indices in the low 16 bits of a selector, two byte
 * permutes look bits 0-2 up in the halves 0-7 and 8-15 of the table, a
 * third takes each byte from the half that bit 3 names.
 */
static constexpr uint32_t gv_kv4(int i)
{
	uint32_t v = 0;

	for (int j = 3; j >= 0; j--)
		v = v << 8 | (uint8_t)(q4kh_kvalues_iq4nl[i + j] + 128);
	return v;
}

static constexpr uint32_t GV_KV0 = gv_kv4(0), GV_KV4 = gv_kv4(4);
static constexpr uint32_t GV_KV8 = gv_kv4(8), GV_KV12 = gv_kv4(12);

static __device__ __forceinline__ uint32_t gv_prmt(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDA_ARCH__
	/* prmt itself: __byte_perm would mask a variable selector first, and
	 * the selectors here have bit 3 of each index clear already. */
	uint32_t r;

	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(s));
	return r;
#else
	return __byte_perm(x, y, s);
#endif
}

/* The entries of the 8 4-bit indices of w (low nibble of byte 0, high
 * nibble of byte 0, low nibble of byte 1, ...), bytes 0-3 in lo, 4-7 in hi. */
static __device__ __forceinline__ void gv_iq4_bytes(uint32_t w, uint32_t *lo,
                                                    uint32_t *hi)
{
	const uint32_t m = w & 0x77777777u, m1 = m >> 16;
	const uint32_t pick = ((w >> 1) & 0x44444444u) | 0x32103210u;

	*lo = gv_prmt(gv_prmt(GV_KV0, GV_KV4, m), gv_prmt(GV_KV8, GV_KV12, m), pick);
	*hi = gv_prmt(gv_prmt(GV_KV0, GV_KV4, m1), gv_prmt(GV_KV8, GV_KV12, m1),
	              pick >> 16);
}

/* acc + v[0..3] . x0 + v[4..7] . x1, in that order. */
static __device__ __forceinline__ float gv_dot8(const float (&v)[8], float4 x0,
                                                float4 x1, float acc)
{
	acc = fmaf(v[0], x0.x, acc);
	acc = fmaf(v[1], x0.y, acc);
	acc = fmaf(v[2], x0.z, acc);
	acc = fmaf(v[3], x0.w, acc);
	acc = fmaf(v[4], x1.x, acc);
	acc = fmaf(v[5], x1.y, acc);
	acc = fmaf(v[6], x1.z, acc);
	return fmaf(v[7], x1.w, acc);
}

static __device__ __forceinline__ float gv_sum4(float4 x)
{
	return (x.x + x.y) + (x.z + x.w);
}

/* --- formats whose weights are computed one by one ---------------------- */

/* Units below which a value exists in a row of NB blocks of 32 when the
 * value is in block B of every unit of 8 blocks. */
static __device__ __forceinline__ int gv_lim(int64_t nb, int b)
{
	return nb > b ? (int)((nb - b + 7) / 8) : 0;
}

/*
 * load() and compute() of a format E that gives each lane's 8 weights of a
 * unit as floats: E::lane_raw (what the loads bring), E::lane_load(p, L,
 * ok0, ok1) (p: the unit; zeros for runs that do not exist) and
 * E::values(raw, L, v); E::lane_t has lim0 and lim1, the units below which
 * runs 0 and 1 exist.
 */
template <class E>
struct gv_exact {
	template <int R, int U>
	struct raw {
		typename E::lane_raw p[U][R];
	};

	template <bool CHECK, int R, int U, class LT>
	static __device__ __forceinline__ void load(raw<R, U> &q,
	                                            const uint8_t *const (&b)[R],
	                                            int u0, int units, const LT &L)
	{
#pragma unroll
		for (int i = 0; i < U; i++)
			if (!CHECK || u0 + i < units)
#pragma unroll
				for (int r = 0; r < R; r++)
					q.p[i][r] = E::lane_load(b[r] + i * E::UB, L,
					                         !CHECK || u0 + i < L.lim0,
					                         !CHECK || u0 + i < L.lim1);
	}

	template <bool CHECK, int C, int R, int U, class LT>
	static __device__ __forceinline__ void compute(float (&acc)[R][C],
	                                               const raw<R, U> &q,
	                                               const float *const (&x)[C],
	                                               int u0, int units, const LT &L,
	                                               int)
	{
#pragma unroll
		for (int i = 0; i < U; i++) {
			const int u = u0 + i;

			if (CHECK && u >= units)
				break;
			const bool ok0 = !CHECK || u < L.lim0, ok1 = !CHECK || u < L.lim1;
			float v[R][8];

#pragma unroll
			for (int r = 0; r < R; r++)
				E::values(q.p[i][r], L, v[r]);
#pragma unroll
			for (int c = 0; c < C; c++) {
				const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				const float *xp = x[c] + GV_UNIT * i;
				const float4 a = ok0 ? gv_ldx(xp) : z;
				const float4 d = ok1 ? gv_ldx(xp + E::X1) : z;

#pragma unroll
				for (int r = 0; r < R; r++)
					acc[r][c] = gv_dot8(v[r], a, d, acc[r][c]);
			}
		}
	}
};

/* F32 (E = 4), F16 and BF16 (E = 2, BF): elements 4l .. 4l + 3 and
 * 128 + 4l .. of the unit (k % 4 == 0). A BF16 element is the high half
 * of a binary32, so its value is one shift or mask. */
template <int E, bool BF = false>
struct gv_float : gv_exact<gv_float<E, BF> > {
	static constexpr int UB = GV_UNIT * E, X1 = 128, ALIGN = 4 * E;
	struct lane_t {
		int q, x0, lim0, lim1;
	};
	typedef typename std::conditional<E == 4, uint4, uint2>::type run_t;
	struct lane_raw {
		run_t a, b;
	};

	static __device__ __forceinline__ lane_t lane_init(int lane, int64_t k, int)
	{
		lane_t L;
		const int64_t left0 = k - 4 * lane, left1 = left0 - 128;

		L.q = E * 4 * lane;
		L.x0 = 4 * lane;
		L.lim0 = left0 > 0 ? (int)((left0 + GV_UNIT - 1) / GV_UNIT) : 0;
		L.lim1 = left1 > 0 ? (int)((left1 + GV_UNIT - 1) / GV_UNIT) : 0;
		return L;
	}
	static __device__ __forceinline__ run_t run(const uint8_t *p)
	{
		if constexpr (E == 4)
			return gv_ld<uint4>(p);
		else
			return gv_ld<uint2>(p);
	}
	static __device__ __forceinline__ lane_raw lane_load(const uint8_t *p,
	                                                     const lane_t &L, bool ok0,
	                                                     bool ok1)
	{
		lane_raw q = {};

		if (ok0)
			q.a = run(p + L.q);
		if (ok1)
			q.b = run(p + L.q + E * 128);
		return q;
	}
	static __device__ __forceinline__ void values(const lane_raw &q, const lane_t &,
	                                              float (&v)[8])
	{
		if constexpr (E == 4) {
			v[0] = __uint_as_float(q.a.x);
			v[1] = __uint_as_float(q.a.y);
			v[2] = __uint_as_float(q.a.z);
			v[3] = __uint_as_float(q.a.w);
			v[4] = __uint_as_float(q.b.x);
			v[5] = __uint_as_float(q.b.y);
			v[6] = __uint_as_float(q.b.z);
			v[7] = __uint_as_float(q.b.w);
		} else if constexpr (BF) {
			v[0] = __uint_as_float(q.a.x << 16);
			v[1] = __uint_as_float(q.a.x & 0xFFFF0000u);
			v[2] = __uint_as_float(q.a.y << 16);
			v[3] = __uint_as_float(q.a.y & 0xFFFF0000u);
			v[4] = __uint_as_float(q.b.x << 16);
			v[5] = __uint_as_float(q.b.x & 0xFFFF0000u);
			v[6] = __uint_as_float(q.b.y << 16);
			v[7] = __uint_as_float(q.b.y & 0xFFFF0000u);
		} else {
			v[0] = gv_half(q.a.x);
			v[1] = gv_half(q.a.x >> 16);
			v[2] = gv_half(q.a.y);
			v[3] = gv_half(q.a.y >> 16);
			v[4] = gv_half(q.b.x);
			v[5] = gv_half(q.b.x >> 16);
			v[6] = gv_half(q.b.y);
			v[7] = gv_half(q.b.y >> 16);
		}
	}
};

/* Q8_0: word l % 8 of qs of blocks 2g and 2g + 1 of the unit (g = l / 8);
 * run j from block 2g + j. x = d q = fma(d, 32768 + (q + 128), -32896 d). */
struct gv_q8_0 : gv_exact<gv_q8_0> {
	static constexpr int BYTES = sizeof(struct q4kh_block_q8_0);
	static constexpr int UB = 8 * BYTES, X1 = 32, ALIGN = 2;
	struct lane_t {
		int q, d, x0, lim0, lim1;
	};
	struct lane_raw {
		uint32_t q[2], d[2];
	};

	static __device__ __forceinline__ lane_t lane_init(int lane, int64_t k, int)
	{
		const int g = lane / 8, a = lane % 8;
		lane_t L;

		L.d = 2 * g * BYTES;
		L.q = L.d + 2 + 4 * a;
		L.x0 = 64 * g + 4 * a;
		L.lim0 = gv_lim(k / 32, 2 * g);
		L.lim1 = gv_lim(k / 32, 2 * g + 1);
		return L;
	}
	static __device__ __forceinline__ lane_raw lane_load(const uint8_t *p,
	                                                     const lane_t &L, bool ok0,
	                                                     bool ok1)
	{
		lane_raw q = { { 0, 0 }, { 0, 0 } };

		if (ok0) {
			q.q[0] = gv_ld32h(p + L.q);
			q.d[0] = gv_ld16(p + L.d);
		}
		if (ok1) {
			q.q[1] = gv_ld32h(p + L.q + BYTES);
			q.d[1] = gv_ld16(p + L.d + BYTES);
		}
		return q;
	}
	static __device__ __forceinline__ void values(const lane_raw &q, const lane_t &,
	                                              float (&v)[8])
	{
#pragma unroll
		for (int j = 0; j < 2; j++) {
			const float d = gv_half(q.d[j]), o = -32896.0f * d;
			const uint32_t c = q.q[j] ^ 0x80808080u;

#pragma unroll
			for (int i = 0; i < 4; i++)
				v[4 * j + i] = fmaf(d, gv_m32768(c, i), o);
		}
	}
};

/*
 * Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL: word l % 4 of qs of block l / 4 of the
 * unit; run 0 the low nibbles, run 1 the high ones. Q4_1's 20-byte blocks
 * keep their words at 4-byte boundaries, Q5_1's 24-byte blocks their
 * header (d, m, qh) in one 8-byte load; the others' words are halves.
 */
template <uint32_t TYPE>
struct gv_b32 : gv_exact<gv_b32<TYPE> > {
	static constexpr bool FIVE = TYPE == Q4KH_TYPE_Q5_0 || TYPE == Q4KH_TYPE_Q5_1;
	static constexpr bool MIN = TYPE == Q4KH_TYPE_Q4_1 || TYPE == Q4KH_TYPE_Q5_1;
	/* IQ4_NL's block is Q4_0's: d, then qs. */
	typedef typename std::conditional<
		TYPE == Q4KH_TYPE_Q4_1, struct q4kh_block_q4_1,
		typename std::conditional<
			TYPE == Q4KH_TYPE_Q5_0, struct q4kh_block_q5_0,
			typename std::conditional<TYPE == Q4KH_TYPE_Q5_1, struct q4kh_block_q5_1,
		                                  struct q4kh_block_q4_0>::type>::type>::type block;
	static constexpr int BYTES = sizeof(block), QS = offsetof(block, qs);
	static constexpr int UB = 8 * BYTES, X1 = 16;
	static constexpr int ALIGN = TYPE == Q4KH_TYPE_Q5_1 ? 8 : TYPE == Q4KH_TYPE_Q4_1 ? 4 : 2;
	struct lane_t {
		int q, d, x0, lim0, lim1, shift;
	};
	/* d (and Q4_1's, Q5_1's m above it), qs word, qh. */
	struct lane_raw {
		uint32_t q, h, d;
	};

	static __device__ __forceinline__ lane_t lane_init(int lane, int64_t k, int)
	{
		lane_t L;

		L.d = lane / 4 * BYTES;
		L.q = L.d + QS + 4 * (lane % 4);
		L.x0 = 32 * (lane / 4) + 4 * (lane % 4);
		L.lim0 = L.lim1 = gv_lim(k / 32, lane / 4);
		L.shift = 4 * (lane % 4);
		return L;
	}
	static __device__ __forceinline__ lane_raw lane_load(const uint8_t *p,
	                                                     const lane_t &L, bool ok,
	                                                     bool)
	{
		lane_raw q = { 0, 0, 0 };

		if (ok) {
			if constexpr (TYPE == Q4KH_TYPE_Q5_1) {
				const uint2 h = gv_ld<uint2>(p + L.d);

				q.d = h.x;
				q.h = h.y;
			} else if constexpr (TYPE == Q4KH_TYPE_Q4_1) {
				q.d = gv_ld32(p + L.d);
			} else {
				if constexpr (FIVE)
					q.h = gv_ld32h(p + L.d + 2);
				q.d = gv_ld16(p + L.d);
			}
			q.q = MIN ? gv_ld32(p + L.q) : gv_ld32h(p + L.q);
		}
		return q;
	}
	static __device__ __forceinline__ void values(const lane_raw &q, const lane_t &L,
	                                              float (&v)[8])
	{
		const float d = gv_half(q.d);

		if constexpr (TYPE == Q4KH_TYPE_IQ4_NL) {
			/* Bytes: values 0, 0 + 16, 1, 1 + 16 (s0), then 2, 3. */
			const float o = -32896.0f * d;
			uint32_t s0, s1;

			gv_iq4_bytes(q.q, &s0, &s1);
			v[0] = fmaf(d, gv_m32768(s0, 0), o);
			v[4] = fmaf(d, gv_m32768(s0, 1), o);
			v[1] = fmaf(d, gv_m32768(s0, 2), o);
			v[5] = fmaf(d, gv_m32768(s0, 3), o);
			v[2] = fmaf(d, gv_m32768(s1, 0), o);
			v[6] = fmaf(d, gv_m32768(s1, 1), o);
			v[3] = fmaf(d, gv_m32768(s1, 2), o);
			v[7] = fmaf(d, gv_m32768(s1, 3), o);
		} else {
			uint32_t lo = q.q & 0x0F0F0F0Fu, hi = (q.q >> 4) & 0x0F0F0F0Fu;

			if constexpr (FIVE) {
				/* Bit i of qh is the fifth bit of value i: spread the
				 * run's 4 bits to bit 4 of each byte (no carries). */
				const uint32_t h = q.h >> L.shift;

				lo |= ((h & 0xF) * 0x02040810u) & 0x10101010u;
				hi |= (((h >> 16) & 0xF) * 0x02040810u) & 0x10101010u;
			}
			if constexpr (MIN) {
				/* Q4_1, Q5_1: d q + m, q = (128 + q) - 128 exactly. */
				const float m = gv_half(q.d >> 16);

#pragma unroll
				for (int i = 0; i < 4; i++) {
					v[i] = fmaf(d, gv_m128(lo, i) - 128.0f, m);
					v[4 + i] = fmaf(d, gv_m128(hi, i) - 128.0f, m);
				}
			} else {
				/* Q4_0: d (q - 8); Q5_0: d (q - 16). */
				const float o = (FIVE ? -144.0f : -136.0f) * d;

#pragma unroll
				for (int i = 0; i < 4; i++) {
					v[i] = fmaf(d, gv_m128(lo, i), o);
					v[4 + i] = fmaf(d, gv_m128(hi, i), o);
				}
			}
		}
	}
};

/*
 * Q2_K and Q3_K: lane l (h = l / 16, p = l / 8 % 2, a = l % 8) takes qs word
 * a of half h, whose byte i holds the 2-bit codes of values 128h + 32j +
 * 4a + i (bits 2j, 2j + 1); run 0 is j = 2p, run 1 j = 2p + 1, of the
 * sub-blocks of 16 s0 = 8h + 4p + a / 4 and s0 + 2.
 *  - Q2_K: d sc q - dmin m, sc and m the nibbles of scales[s], which are
 *    bytes a / 4 and 2 + a / 4 of the lane's scales word 2h + p.
 *  - Q3_K: d (sc - 32) (q - 4 + 4 b), b bit 4h + j of hmask[4a + i] (word
 *    a of hmask); sc's low 4 bits are nibble h of scales[4p + a / 4] (and
 *    + 2), its high 2 bits 2 (2h + p) of scales[8 + a / 4] (and + 2): bytes
 *    a / 4 and 2 + a / 4 of scales words p and 2. With 3-bit codes
 *    c = q + 4b, the weight is fma(dl, 128 + c, -132 dl), 132 dl exact
 *    (dl: 17 significant bits at most).
 */
template <uint32_t TYPE>
struct gv_k2 : gv_exact<gv_k2<TYPE> > {
	static constexpr bool THREE = TYPE == Q4KH_TYPE_Q3_K;
	typedef typename std::conditional<THREE, struct q4kh_block_q3_k,
	                                  struct q4kh_block_q2_k>::type block;
	static constexpr int UB = sizeof(block), X1 = 32, ALIGN = THREE ? 2 : 4;
	static constexpr int QS = offsetof(block, qs), SC = offsetof(block, scales);
	static constexpr int D = offsetof(block, d);
	struct lane_t {
		int q, hm, sc, x0, j, hb, sb, lim0, lim1;
	};
	/* qs word; Q2_K: scales word, d | dmin << 16; Q3_K: hmask word,
	 * scales words p and 2, d. */
	struct lane_raw {
		uint32_t q, s, d, hm, s2;
	};

	static __device__ __forceinline__ lane_t lane_init(int lane, int64_t, int units)
	{
		const int h = lane / 16, p = lane / 8 % 2, a = lane % 8;
		lane_t L;

		L.q = QS + 32 * h + 4 * a;
		L.hm = 4 * a; /* Q3_K: hmask at 0 */
		L.sc = SC + 4 * (THREE ? p : 2 * h + p);
		L.x0 = 128 * h + 64 * p + 4 * a;
		L.j = 2 * p;
		L.hb = 4 * h + 2 * p; /* Q3_K: hmask bit of run 0 */
		L.sb = a / 4;
		L.lim0 = L.lim1 = units; /* whole super-blocks */
		return L;
	}
	static __device__ __forceinline__ uint32_t word(const uint8_t *p)
	{
		return THREE ? gv_ld32h(p) : gv_ld32(p);
	}
	static __device__ __forceinline__ lane_raw lane_load(const uint8_t *p,
	                                                     const lane_t &L, bool ok,
	                                                     bool)
	{
		lane_raw q = { 0, 0, 0, 0, 0 };

		if (ok) {
			q.q = word(p + L.q);
			q.s = word(p + L.sc);
			if constexpr (THREE) {
				q.hm = word(p + L.hm);
				q.s2 = word(p + SC + 8);
				q.d = gv_ld16(p + D);
			} else {
				q.d = gv_ld32(p + D);
			}
		}
		return q;
	}
	static __device__ __forceinline__ void values(const lane_raw &q, const lane_t &L,
	                                              float (&v)[8])
	{
		const float d = gv_half(q.d);

#pragma unroll
		for (int run = 0; run < 2; run++) {
			const int b = L.sb + 2 * run; /* the sub-block's scales byte */
			uint32_t c = (q.q >> (2 * (L.j + run))) & 0x03030303u;

			if constexpr (THREE) {
				const uint32_t sc = ((q.s >> (L.hb & 4)) & 0x0F0F0F0Fu) |
				                    (((q.s2 >> L.hb) & 0x03030303u) << 4);
				const float dl = d * (gv_m128(sc, b) - 160.0f);

				c |= ((q.hm >> (L.hb + run)) & 0x01010101u) << 2;
#pragma unroll
				for (int i = 0; i < 4; i++)
					v[4 * run + i] = fmaf(dl, gv_m128(c, i), -132.0f * dl);
			} else {
				const float dl = d * (gv_m128(q.s & 0x0F0F0F0Fu, b) - 128.0f);
				const float ml = gv_half(q.d >> 16) *
				                 (gv_m128((q.s >> 4) & 0x0F0F0F0Fu, b) - 128.0f);

#pragma unroll
				for (int i = 0; i < 4; i++)
					v[4 * run + i] = fmaf(dl, gv_m128(c, i) - 128.0f, -ml);
			}
		}
	}
};

/*
 * Q6_K: word l of ql (h = l / 16, p = l / 8 % 2, e = l % 8) with its qh word;
 * run 0 uses scale 8h + 2p + e / 4, run 1 that + 4. Lane l works out
 * d sc of scale l % 16 of unit l / 16 % U (U <= 2) and the lanes that use
 * it take it from there. x = d sc (q - 32) = fma(d sc, 128 + q, -160 d sc);
 * d sc is exact, as the reference has it.
 */
struct gv_q6_k {
	static constexpr int BYTES = sizeof(struct q4kh_block_q6_k);
	static constexpr int UB = BYTES, X1 = 64, ALIGN = 2;
	struct lane_t {
		int ql, qh, sc, x0, p2, s0;
	};

	template <int R, int U>
	struct raw {
		uint32_t ql[U][R], qh[U][R], d[R];
		int s[R];
	};

	static __device__ __forceinline__ lane_t lane_init(int lane, int64_t, int)
	{
		const int h = lane / 16, p = lane / 8 % 2, e = lane % 8;
		lane_t L;

		L.ql = 4 * lane;
		L.qh = 128 + 32 * h + 4 * e;
		L.sc = offsetof(struct q4kh_block_q6_k, scales) + lane % 16;
		L.x0 = 128 * h + 32 * p + 4 * e;
		L.p2 = 2 * p;
		L.s0 = 8 * h + 2 * p + e / 4;
		return L;
	}

	template <bool CHECK, int R, int U>
	static __device__ __forceinline__ void load(raw<R, U> &q,
	                                            const uint8_t *const (&b)[R],
	                                            int u0, int units, const lane_t &L)
	{
		static_assert(U <= 2, "a scale per lane covers 2 units");
		const int su = L.ql / 64 % U; /* lane / 16 % U */

#pragma unroll
		for (int i = 0; i < U; i++)
			if (!CHECK || u0 + i < units)
#pragma unroll
				for (int r = 0; r < R; r++) {
					q.ql[i][r] = gv_ld32h(b[r] + i * UB + L.ql);
					q.qh[i][r] = gv_ld32h(b[r] + i * UB + L.qh);
				}
#pragma unroll
		for (int r = 0; r < R; r++)
			if (!CHECK || u0 + su < units) {
				const uint8_t *c = b[r] + su * UB;

				q.s[r] = gv_ld<int8_t>(c + L.sc);
				q.d[r] = gv_ld16(c + offsetof(struct q4kh_block_q6_k, d));
			} else {
				q.s[r] = 0;
				q.d[r] = 0;
			}
	}

	template <bool CHECK, int C, int R, int U>
	static __device__ __forceinline__ void compute(float (&acc)[R][C],
	                                               const raw<R, U> &q,
	                                               const float *const (&x)[C],
	                                               int u0, int units,
	                                               const lane_t &L, int)
	{
		float mine[R];

#pragma unroll
		for (int r = 0; r < R; r++)
			mine[r] = gv_half(q.d[r]) * (float)q.s[r];
#pragma unroll
		for (int i = 0; i < U; i++) {
			if (CHECK && u0 + i >= units)
				break;
			float v[R][8];

#pragma unroll
			for (int r = 0; r < R; r++) {
				/* Low nibbles take qh bits 2p, 2p + 1; high ones
				 * 2p + 4, 2p + 5. */
				const uint32_t ql = q.ql[i][r], qh = q.qh[i][r];
				const uint32_t lo = (ql & 0x0F0F0F0Fu) |
				                    ((qh << (4 - L.p2)) & 0x30303030u);
				const uint32_t hi = ((ql >> 4) & 0x0F0F0F0Fu) |
				                    ((qh >> L.p2) & 0x30303030u);
				const float d0 = __shfl_sync(GV_FULL, mine[r], 16 * i + L.s0);
				const float d1 = __shfl_sync(GV_FULL, mine[r], 16 * i + L.s0 + 4);
				const float o0 = -160.0f * d0, o1 = -160.0f * d1;

#pragma unroll
				for (int k = 0; k < 4; k++) {
					v[r][k] = fmaf(d0, gv_m128(lo, k), o0);
					v[r][4 + k] = fmaf(d1, gv_m128(hi, k), o1);
				}
			}
#pragma unroll
			for (int c = 0; c < C; c++) {
				const float *xp = x[c] + GV_UNIT * i;
				const float4 a = gv_ldx(xp), d = gv_ldx(xp + X1);

#pragma unroll
				for (int r = 0; r < R; r++)
					acc[r][c] = gv_dot8(v[r], a, d, acc[r][c]);
			}
		}
	}
};

/* --- formats that factor the run's scale out ---------------------------- */

/*
 * Q4_K and Q5_K: word l of qs (chunk c = l / 8, a = l % 8); run 0 is
 * sub-block 2c, run 1 sub-block 2c + 1. Per sub-block the weights are
 * d sc q - dmin m. Each lane works out the scale pair of one (unit,
 * sub-block) of its chunk's 2 U from the unit's 16-byte header and the
 * lanes of the chunk exchange them: 32 d sc and -(16 d sc + dmin m) for
 * Q4_K, 64 d sc and -(32 d sc + dmin m) for Q5_K (codes << 3, resp. << 2,
 * in the permute: see the top of this file).
 */
template <uint32_t TYPE>
struct gv_kmin {
	static constexpr bool FIVE = TYPE == Q4KH_TYPE_Q5_K;
	static constexpr int BYTES = FIVE ? sizeof(struct q4kh_block_q5_k)
	                                  : sizeof(struct q4kh_block_q4_k);
	static constexpr int UB = BYTES, X1 = 32, ALIGN = 16;
	struct lane_t {
		int q, qh, x0, c2, a;
	};

	/* Pairs (unit i, half s) are numbered 2 i + s; lane l works out pairs
	 * l % 8 + 8 n (n < pairs<U>::n) below 2 U, or pair l % 8 % 2U when
	 * 2U < 8. */
	template <int U>
	struct pairs {
		static constexpr int n = (2 * U + 7) / 8;
	};

	template <int R, int U>
	struct raw {
		uint32_t q[U][R], qh[FIVE ? U : 1][R];
		uint4 hd[pairs<U>::n][R];
	};

	static __device__ __forceinline__ lane_t lane_init(int lane, int64_t, int)
	{
		lane_t L;

		L.q = (FIVE ? 48 : 16) + 4 * lane;
		L.qh = 16 + 4 * (lane % 8);
		L.x0 = 64 * (lane / 8) + 4 * (lane % 8);
		L.c2 = 2 * (lane / 8);
		L.a = lane % 8;
		return L;
	}

	/* The pair of sub-block j of the header h: a (times A), b (times S). */
	static __device__ __forceinline__ void scales(const uint4 &h, int j,
	                                              float *a, float *b)
	{
		/* scales[12] = h.y, h.z, h.w; 6-bit sc and m of sub-blocks 0-3,
		 * then 4-7 (quant.h), one per byte. */
		const uint32_t sc = j < 4 ? h.y & 0x3F3F3F3Fu
		                          : (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
		const uint32_t m = j < 4 ? h.z & 0x3F3F3F3Fu
		                         : ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
		const uint32_t sel = 0x7044u | ((j & 3) << 8);
		const float fsc = __int_as_float((int)__byte_perm(sc, 0x43000000u, sel)) - 128.0f;
		const float fm = __int_as_float((int)__byte_perm(m, 0x43000000u, sel)) - 128.0f;
		const float dl = gv_half(h.x) * fsc, ml = gv_half(h.x >> 16) * fm;

		*a = (FIVE ? 64.0f : 32.0f) * dl;
		*b = -fmaf(FIVE ? 32.0f : 16.0f, dl, ml);
	}

	template <bool CHECK, int R, int U>
	static __device__ __forceinline__ void load(raw<R, U> &p,
	                                            const uint8_t *const (&b)[R],
	                                            int u0, int units, const lane_t &L)
	{
#pragma unroll
		for (int i = 0; i < U; i++)
			if (!CHECK || u0 + i < units)
#pragma unroll
				for (int r = 0; r < R; r++) {
					p.q[i][r] = gv_ld32(b[r] + i * UB + L.q);
					if constexpr (FIVE)
						p.qh[i][r] = gv_ld32(b[r] + i * UB + L.qh);
				}
#pragma unroll
		for (int n = 0; n < pairs<U>::n; n++) {
			const int P = (L.a + 8 * n) % (2 * U);

#pragma unroll
			for (int r = 0; r < R; r++)
				p.hd[n][r] = !CHECK || u0 + P / 2 < units
				                     ? gv_ld<uint4>(b[r] + P / 2 * UB)
				                     : make_uint4(0, 0, 0, 0);
		}
	}

	template <bool CHECK, int C, int R, int U>
	static __device__ __forceinline__ void compute(float (&acc)[R][C],
	                                               const raw<R, U> &p,
	                                               const float *const (&x)[C],
	                                               int u0, int units,
	                                               const lane_t &L, int lane)
	{
		constexpr int NP = pairs<U>::n;
		const int chunk = lane - L.a;
		float pa[NP][R], pb[NP][R];

#pragma unroll
		for (int n = 0; n < NP; n++) {
			const int P = (L.a + 8 * n) % (2 * U);

#pragma unroll
			for (int r = 0; r < R; r++)
				scales(p.hd[n][r], L.c2 + P % 2, &pa[n][r], &pb[n][r]);
		}
#pragma unroll
		for (int i = 0; i < U; i++) {
			if (CHECK && u0 + i >= units)
				break;
			/* Pairs 2i and 2i + 1 of this lane's chunk. */
			const int src = chunk + (2 * i) % 8, n = (2 * i) / 8;
			float sa[R][2], sb[R][2], hp[R][8];

#pragma unroll
			for (int r = 0; r < R; r++) {
				uint32_t l8, h8;

				sa[r][0] = __shfl_sync(GV_FULL, pa[n][r], src);
				sb[r][0] = __shfl_sync(GV_FULL, pb[n][r], src);
				sa[r][1] = __shfl_sync(GV_FULL, pa[n][r], src + 1);
				sb[r][1] = __shfl_sync(GV_FULL, pb[n][r], src + 1);
				if constexpr (FIVE) {
					const uint32_t e = p.qh[i][r] >> L.c2;

					l8 = ((p.q[i][r] << 2) & 0x3C3C3C3Cu) | ((e << 6) & 0x40404040u);
					h8 = ((p.q[i][r] >> 2) & 0x3C3C3C3Cu) | ((e << 5) & 0x40404040u);
				} else {
					l8 = (p.q[i][r] << 3) & 0x78787878u;
					h8 = (p.q[i][r] >> 1) & 0x78787878u;
				}
#pragma unroll
				for (int k = 0; k < 4; k++) {
					hp[r][k] = gv_half_plus(l8, k);
					hp[r][4 + k] = gv_half_plus(h8, k);
				}
			}
#pragma unroll
			for (int c = 0; c < C; c++) {
				const float *xp = x[c] + GV_UNIT * i;
				const float4 xl = gv_ldx(xp), xh = gv_ldx(xp + X1);
				const float sl = gv_sum4(xl), sh = gv_sum4(xh);

#pragma unroll
				for (int r = 0; r < R; r++) {
					float al = hp[r][0] * xl.x, ah = hp[r][4] * xh.x;

					al = fmaf(hp[r][1], xl.y, al);
					al = fmaf(hp[r][2], xl.z, al);
					al = fmaf(hp[r][3], xl.w, al);
					ah = fmaf(hp[r][5], xh.y, ah);
					ah = fmaf(hp[r][6], xh.z, ah);
					ah = fmaf(hp[r][7], xh.w, ah);
					float t = fmaf(sb[r][0], sl, acc[r][c]);

					t = fmaf(sa[r][0], al, t);
					t = fmaf(sb[r][1], sh, t);
					acc[r][c] = fmaf(sa[r][1], ah, t);
				}
			}
		}
	}
};

/*
 * IQ4_XS: word l of qs, sub-block j = l / 4; both runs in sub-block j.
 * Adds d (ls_j - 32) sum kv x, kv the codebook values. Lane l works out
 * d (ls - 32) of sub-block l % 8 of unit l / 8 % U of the step (U <= 4)
 * from that unit's 8-byte header; the lanes of a sub-block take it from
 * there.
 */
struct gv_iq4_xs {
	static constexpr int BYTES = sizeof(struct q4kh_block_iq4_xs);
	static constexpr int UB = BYTES, X1 = 16, ALIGN = 8;
	struct lane_t {
		int q, x0, j, hu, sl, sh;
	};

	template <int R, int U>
	struct raw {
		uint32_t q[U][R];
		uint2 hd[R];
	};

	static __device__ __forceinline__ lane_t lane_init(int lane, int64_t, int)
	{
		lane_t L;

		L.q = 8 + 4 * lane;
		L.x0 = 32 * (lane / 4) + 4 * (lane % 4);
		L.j = lane / 4;
		L.hu = lane / 8; /* % U where used */
		L.sl = 4 * (lane % 8);
		L.sh = 16 + 2 * (lane % 8);
		return L;
	}

	template <bool CHECK, int R, int U>
	static __device__ __forceinline__ void load(raw<R, U> &p,
	                                            const uint8_t *const (&b)[R],
	                                            int u0, int units, const lane_t &L)
	{
		static_assert(U <= 4, "a header per lane covers 4 units");
		const int hu = L.hu % U;

#pragma unroll
		for (int i = 0; i < U; i++)
			if (!CHECK || u0 + i < units)
#pragma unroll
				for (int r = 0; r < R; r++)
					p.q[i][r] = gv_ld32(b[r] + i * UB + L.q);
#pragma unroll
		for (int r = 0; r < R; r++)
			p.hd[r] = !CHECK || u0 + hu < units ? gv_ld<uint2>(b[r] + hu * UB)
			                                    : make_uint2(0, 0);
	}

	template <bool CHECK, int C, int R, int U>
	static __device__ __forceinline__ void compute(float (&acc)[R][C],
	                                               const raw<R, U> &p,
	                                               const float *const (&x)[C],
	                                               int u0, int units,
	                                               const lane_t &L, int)
	{
		float mine[R];

#pragma unroll
		for (int r = 0; r < R; r++) {
			/* d | scales_h << 16, scales_l[0..3]. */
			const uint2 h = p.hd[r];
			const int ls = (int)((h.y >> L.sl) & 0xF) | (int)((h.x >> L.sh) & 3) << 4;

			mine[r] = gv_half(h.x) * (float)(ls - 32);
		}
#pragma unroll
		for (int i = 0; i < U; i++) {
			if (CHECK && u0 + i >= units)
				break;
			float kv[R][8], dl[R];

#pragma unroll
			for (int r = 0; r < R; r++) {
				uint32_t s0, s1;

				dl[r] = __shfl_sync(GV_FULL, mine[r], 8 * i + L.j);
				gv_iq4_bytes(p.q[i][r], &s0, &s1);
				/* Bytes: values 0, 0 + 16, 1, 1 + 16 (s0), then 2, 3. */
				kv[r][0] = gv_m32768(s0, 0) - 32896.0f;
				kv[r][4] = gv_m32768(s0, 1) - 32896.0f;
				kv[r][1] = gv_m32768(s0, 2) - 32896.0f;
				kv[r][5] = gv_m32768(s0, 3) - 32896.0f;
				kv[r][2] = gv_m32768(s1, 0) - 32896.0f;
				kv[r][6] = gv_m32768(s1, 1) - 32896.0f;
				kv[r][3] = gv_m32768(s1, 2) - 32896.0f;
				kv[r][7] = gv_m32768(s1, 3) - 32896.0f;
			}
#pragma unroll
			for (int c = 0; c < C; c++) {
				const float *xp = x[c] + GV_UNIT * i;
				const float4 x0 = gv_ldx(xp), x1 = gv_ldx(xp + X1);

#pragma unroll
				for (int r = 0; r < R; r++)
					acc[r][c] = fmaf(dl[r], gv_dot8(kv[r], x0, x1, 0.0f),
					                 acc[r][c]);
			}
		}
	}
};

/* The format of each weight type q4kh_for_type (q4khost/cuda_quant.cuh)
 * runs: every one has one. */
template <uint32_t TYPE> struct gv_fmt;
template <> struct gv_fmt<Q4KH_TYPE_F32> : gv_float<4> {};
template <> struct gv_fmt<Q4KH_TYPE_F16> : gv_float<2> {};
template <> struct gv_fmt<Q4KH_TYPE_BF16> : gv_float<2, true> {};
template <> struct gv_fmt<Q4KH_TYPE_Q4_0> : gv_b32<Q4KH_TYPE_Q4_0> {};
template <> struct gv_fmt<Q4KH_TYPE_Q4_1> : gv_b32<Q4KH_TYPE_Q4_1> {};
template <> struct gv_fmt<Q4KH_TYPE_Q5_0> : gv_b32<Q4KH_TYPE_Q5_0> {};
template <> struct gv_fmt<Q4KH_TYPE_Q5_1> : gv_b32<Q4KH_TYPE_Q5_1> {};
template <> struct gv_fmt<Q4KH_TYPE_IQ4_NL> : gv_b32<Q4KH_TYPE_IQ4_NL> {};
template <> struct gv_fmt<Q4KH_TYPE_Q8_0> : gv_q8_0 {};
template <> struct gv_fmt<Q4KH_TYPE_Q2_K> : gv_k2<Q4KH_TYPE_Q2_K> {};
template <> struct gv_fmt<Q4KH_TYPE_Q3_K> : gv_k2<Q4KH_TYPE_Q3_K> {};
template <> struct gv_fmt<Q4KH_TYPE_Q4_K> : gv_kmin<Q4KH_TYPE_Q4_K> {};
template <> struct gv_fmt<Q4KH_TYPE_Q5_K> : gv_kmin<Q4KH_TYPE_Q5_K> {};
template <> struct gv_fmt<Q4KH_TYPE_Q6_K> : gv_q6_k {};
template <> struct gv_fmt<Q4KH_TYPE_IQ4_XS> : gv_iq4_xs {};

/* Can the loads of TYPE's format read rows at the address bits WA (data
 * and strides) and columns at XA, of K values? */
template <uint32_t TYPE>
static inline bool gv_fits(uintptr_t wa, uintptr_t xa, int64_t k)
{
	constexpr bool floats = TYPE == Q4KH_TYPE_F32 || TYPE == Q4KH_TYPE_F16 ||
	                        TYPE == Q4KH_TYPE_BF16;

	/* units: an int, with room for a stride past the end. */
	return !(xa % 16) && k <= ((int64_t)1 << 38) && !(wa % gv_fmt<TYPE>::ALIGN) &&
	       !(floats && k % 4);
}

#endif
