/*
 * Device-side dequantization of every weight type the cuda backend takes,
 * following the block layouts of q4khost/quant.h: header-only device code
 * for nvcc (static functions; link nothing), the in-tree cuda backend's
 * and the SDK's tensor-core products' (cuda_tc.h). Pure functions of
 * their arguments. A row is read in groups
 * of 32 consecutive values: one block of the 32-value types, one sub-block
 * of 32 (two of 16 for Q2_K and Q3_K) of the 256-value super-blocks, 32
 * elements of F32, F16 and BF16 rows (the last group of such a row may be
 * shorter). Every value is computed as the cpu reference
 * (q4khost/dequant.h) computes it: the products are exact in f32,
 * and the addition or subtraction of a min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K)
 * is the only rounding, so a contracted fma gives the same float.
 */
#ifndef Q4KHOST_CUDA_QUANT_CUH
#define Q4KHOST_CUDA_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "q4khost/quant.h"

#define KV(i) q4kh_kvalues_iq4nl[i]
/* The IQ4_NL / IQ4_XS codebook, from quant.h, in constant memory. */
static __constant__ int8_t q4kh_cuda_iq4nl[16] = {
	KV(0), KV(1), KV(2),  KV(3),  KV(4),  KV(5),  KV(6),  KV(7),
	KV(8), KV(9), KV(10), KV(11), KV(12), KV(13), KV(14), KV(15),
};
#undef KV

/* Block fields sit at even addresses (blocks have even sizes, rows start
 * at even offsets: cuda_tensor.c checks), so halves load directly. */
static __device__ __forceinline__ float q4kh_ld_half(const uint8_t *p)
{
	return __half2float(*(const __half *)p);
}

/* A BF16 element: the high 16 bits of a binary32. */
static __device__ __forceinline__ float q4kh_ld_bf16(const uint8_t *p)
{
	return __uint_as_float((uint32_t)*(const uint16_t *)p << 16);
}

/* Sub-block j's 6-bit scale and min in a Q4_K / Q5_K scales[12]. */
static __device__ __forceinline__ void q4kh_k_scale_min(const uint8_t *s, int j,
                                                        int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
		*m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
	}
}

/* Values 32g .. 32g+31 of a row of K values of TYPE, into v. Returns how
 * many of them exist: 32, except at the end of an f32 or f16 row. */
template <uint32_t TYPE>
static __device__ __forceinline__ int q4kh_load_group(const uint8_t *row, int64_t g,
                                                      int64_t k, float v[32])
{
	if constexpr (TYPE == Q4KH_TYPE_F32 || TYPE == Q4KH_TYPE_F16 ||
	              TYPE == Q4KH_TYPE_BF16) {
		int64_t left = k - 32 * g;
		int n = left < 32 ? (int)left : 32;

		for (int i = 0; i < 32; i++) {
			if (i >= n)
				v[i] = 0.0f;
			else if constexpr (TYPE == Q4KH_TYPE_F32)
				v[i] = ((const float *)row)[32 * g + i];
			else if constexpr (TYPE == Q4KH_TYPE_F16)
				v[i] = q4kh_ld_half(row + 2 * (32 * g + i));
			else
				v[i] = q4kh_ld_bf16(row + 2 * (32 * g + i));
		}
		return n;
	} else if constexpr (TYPE == Q4KH_TYPE_Q8_0) {
		const uint8_t *b = row + g * sizeof(struct q4kh_block_q8_0);
		const int8_t *qs = (const int8_t *)(b + 2);
		float d = q4kh_ld_half(b);

		for (int i = 0; i < 32; i++)
			v[i] = d * (float)qs[i];
	} else if constexpr (TYPE == Q4KH_TYPE_Q4_0 || TYPE == Q4KH_TYPE_IQ4_NL) {
		constexpr size_t bs = TYPE == Q4KH_TYPE_Q4_0
		                              ? sizeof(struct q4kh_block_q4_0)
		                              : sizeof(struct q4kh_block_iq4_nl);
		const uint8_t *b = row + g * bs;
		const uint8_t *qs = b + 2;
		float d = q4kh_ld_half(b);

		for (int i = 0; i < 16; i++) {
			int lo = qs[i] & 0xF, hi = qs[i] >> 4;

			if constexpr (TYPE == Q4KH_TYPE_Q4_0) {
				v[i] = d * (float)(lo - 8);
				v[i + 16] = d * (float)(hi - 8);
			} else {
				v[i] = d * (float)q4kh_cuda_iq4nl[lo];
				v[i + 16] = d * (float)q4kh_cuda_iq4nl[hi];
			}
		}
	} else if constexpr (TYPE == Q4KH_TYPE_Q4_1) {
		const uint8_t *b = row + g * sizeof(struct q4kh_block_q4_1);
		const uint8_t *qs = b + offsetof(struct q4kh_block_q4_1, qs);
		const float d = q4kh_ld_half(b), m = q4kh_ld_half(b + 2);

		/* d q is exact: the addition of the min is the one rounding. */
		for (int i = 0; i < 16; i++) {
			v[i] = d * (float)(qs[i] & 0xF) + m;
			v[i + 16] = d * (float)(qs[i] >> 4) + m;
		}
	} else if constexpr (TYPE == Q4KH_TYPE_Q5_0 || TYPE == Q4KH_TYPE_Q5_1) {
		/* Q5_1 is Q5_0 with the fp16 min after d, and no offset 16. */
		constexpr bool one = TYPE == Q4KH_TYPE_Q5_1;
		constexpr size_t bs = one ? sizeof(struct q4kh_block_q5_1)
		                          : sizeof(struct q4kh_block_q5_0);
		const uint8_t *b = row + g * bs;
		const uint8_t *h = b + (one ? 4 : 2);
		const uint8_t *qs = h + 4;
		uint32_t qh = h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24;
		const float d = q4kh_ld_half(b), m = one ? q4kh_ld_half(b + 2) : 0.0f;

		for (int i = 0; i < 16; i++) {
			int lo = (qs[i] & 0xF) | ((qh >> i) & 1) << 4;
			int hi = (qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4;

			if constexpr (one) {
				v[i] = d * (float)lo + m;
				v[i + 16] = d * (float)hi + m;
			} else {
				v[i] = d * (float)(lo - 16);
				v[i + 16] = d * (float)(hi - 16);
			}
		}
	} else if constexpr (TYPE == Q4KH_TYPE_Q2_K || TYPE == Q4KH_TYPE_Q3_K) {
		/* Group j of a super-block is values 32j .. 32j + 31, quant.h's
		 * v = 128h + 32c + l with h = j / 4, c = j % 4: the 2-bit codes
		 * are bits 2c, 2c + 1 of qs[32h + l], the sub-blocks of 16 are
		 * 2j and 2j + 1. */
		constexpr bool three = TYPE == Q4KH_TYPE_Q3_K;
		constexpr size_t bs = three ? sizeof(struct q4kh_block_q3_k)
		                            : sizeof(struct q4kh_block_q2_k);
		const uint8_t *b = row + (g / 8) * bs;
		const int j = (int)(g % 8), h = j / 4, c = j % 4;

		if constexpr (three) {
			const uint8_t *hm = b + offsetof(struct q4kh_block_q3_k, hmask);
			const uint8_t *qs = b + offsetof(struct q4kh_block_q3_k, qs) + 32 * h;
			const uint8_t *sc = b + offsetof(struct q4kh_block_q3_k, scales);
			const float d = q4kh_ld_half(b + offsetof(struct q4kh_block_q3_k, d));

			for (int half = 0; half < 2; half++) {
				/* Sub-block s's signed 6-bit scale (quant.h's sc_s). */
				const int s = 2 * j + half;
				const int lo = s < 8 ? sc[s] & 0xF : sc[s - 8] >> 4;
				const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
				const float dl = d * (float)((lo | hi << 4) - 32);

				for (int l = 16 * half; l < 16 * half + 16; l++) {
					const int q = ((qs[l] >> (2 * c)) & 3) -
					              (((hm[l] >> (4 * h + c)) & 1) ? 0 : 4);

					v[l] = dl * (float)q;
				}
			}
		} else {
			const uint8_t *sc = b + offsetof(struct q4kh_block_q2_k, scales);
			const uint8_t *qs = b + offsetof(struct q4kh_block_q2_k, qs) + 32 * h;
			const float d = q4kh_ld_half(b + offsetof(struct q4kh_block_q2_k, d));
			const float dmin = q4kh_ld_half(b + offsetof(struct q4kh_block_q2_k, dmin));

			for (int half = 0; half < 2; half++) {
				const int s = 2 * j + half;
				const float dl = d * (float)(sc[s] & 0xF);
				const float ml = dmin * (float)(sc[s] >> 4);

				for (int l = 16 * half; l < 16 * half + 16; l++)
					v[l] = dl * (float)((qs[l] >> (2 * c)) & 3) - ml;
			}
		}
	} else if constexpr (TYPE == Q4KH_TYPE_Q4_K || TYPE == Q4KH_TYPE_Q5_K) {
		constexpr bool five = TYPE == Q4KH_TYPE_Q5_K;
		constexpr size_t bs = five ? sizeof(struct q4kh_block_q5_k)
		                           : sizeof(struct q4kh_block_q4_k);
		const uint8_t *b = row + (g / 8) * bs;
		const int j = (int)(g % 8);
		/* Sub-blocks 2c and 2c+1 share 32 bytes: low, then high nibbles. */
		const uint8_t *qs = b + (five ? 48 : 16) + 32 * (j / 2);
		const uint8_t *qh = b + 16;
		const int shift = 4 * (j % 2);
		int sc, m;

		q4kh_k_scale_min(b + 4, j, &sc, &m);
		const float dl = q4kh_ld_half(b) * (float)sc;
		const float ml = q4kh_ld_half(b + 2) * (float)m;
		for (int i = 0; i < 32; i++) {
			int q = (qs[i] >> shift) & 0xF;

			if constexpr (five)
				q |= ((qh[i] >> j) & 1) << 4;
			v[i] = dl * (float)q - ml;
		}
	} else if constexpr (TYPE == Q4KH_TYPE_Q6_K) {
		const uint8_t *b = row + (g / 8) * sizeof(struct q4kh_block_q6_k);
		const int j = (int)(g % 8);
		/* Group j is quarter s of half h: quant.h's q(l + 32 s). */
		const int h = j / 4, s = j % 4;
		const uint8_t *ql = b + 64 * h + 32 * (s & 1);
		const uint8_t *qh = b + 128 + 32 * h;
		const int8_t *scales = (const int8_t *)(b + 192);
		const float d = q4kh_ld_half(b + 208);

		for (int i = 0; i < 32; i++) {
			int lo = s < 2 ? ql[i] & 0xF : ql[i] >> 4;
			int q = lo | ((qh[i] >> (2 * s)) & 3) << 4;

			v[i] = d * (float)scales[2 * j + i / 16] * (float)(q - 32);
		}
	} else if constexpr (TYPE == Q4KH_TYPE_IQ4_XS) {
		const uint8_t *b = row + (g / 8) * sizeof(struct q4kh_block_iq4_xs);
		const int j = (int)(g % 8);
		const uint16_t sh = (uint16_t)(b[2] | b[3] << 8);
		const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) |
		               ((sh >> (2 * j)) & 3) << 4;
		const float dl = q4kh_ld_half(b) * (float)(ls - 32);
		const uint8_t *qs = b + 8 + 16 * j;

		for (int i = 0; i < 16; i++) {
			v[i] = dl * (float)q4kh_cuda_iq4nl[qs[i] & 0xF];
			v[i + 16] = dl * (float)q4kh_cuda_iq4nl[qs[i] >> 4];
		}
	} else {
		static_assert(TYPE != TYPE, "no decoder for this type");
	}
	return 32;
}

/* f(std::integral_constant<uint32_t, TYPE>()) for a supported weight type;
 * cudaErrorInvalidValue for any other. The one list of supported types. */
template <typename F>
static cudaError_t q4kh_for_type(uint32_t type, F f)
{
#define CASE(t)                                                                \
	case t: return f(std::integral_constant<uint32_t, t>())
	switch (type) {
	CASE(Q4KH_TYPE_F32);
	CASE(Q4KH_TYPE_F16);
	CASE(Q4KH_TYPE_BF16);
	CASE(Q4KH_TYPE_Q4_0);
	CASE(Q4KH_TYPE_Q4_1);
	CASE(Q4KH_TYPE_Q5_0);
	CASE(Q4KH_TYPE_Q5_1);
	CASE(Q4KH_TYPE_Q8_0);
	CASE(Q4KH_TYPE_Q2_K);
	CASE(Q4KH_TYPE_Q3_K);
	CASE(Q4KH_TYPE_Q4_K);
	CASE(Q4KH_TYPE_Q5_K);
	CASE(Q4KH_TYPE_Q6_K);
	CASE(Q4KH_TYPE_IQ4_NL);
	CASE(Q4KH_TYPE_IQ4_XS);
	}
#undef CASE
	return cudaErrorInvalidValue;
}

#endif
