/*
 * Dequantization of one row, block by block, following the layouts in
 * q4khost/quant.h. Every product below is exact in f32 (an fp16 scale has
 * 11 significant bits, the integer factors at most 13 together), so the
 * only rounding is the addition of the min in Q4_1 and Q5_1 and its
 * subtraction in Q2_K, Q4_K and Q5_K, as in ggml and gguf-py.
 */
/* Vectorising these loops needs -O3; the build's CFLAGS say -O2. */
#pragma GCC optimize("O3")

#include <stddef.h>
#include <string.h>

#include "q4khost/contract.h"
#include "q4khost/dequant.h"
#include "q4khost/quant.h"

/*
 * The hot loops are also built for AVX2 where GCC can (the CPU picks at
 * load time), as the cpu backend's are. AVX2 brings no FMA and contraction
 * is off, so every build rounds alike.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DEQUANT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DEQUANT_CLONES
#endif

/* Block fields may sit at any even address: read them bytewise. */
static float half_at(const uint8_t *p)
{
	return q4kh_fp16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static void dequant_f32(const uint8_t *row, float *out, int64_t k)
{
	memcpy(out, row, (size_t)k * sizeof(float));
}

DEQUANT_CLONES
static void dequant_f16(const uint8_t *row, float *out, int64_t k)
{
	for (int64_t i = 0; i < k; i++)
		out[i] = half_at(row + 2 * i);
}

DEQUANT_CLONES
static void dequant_bf16(const uint8_t *row, float *out, int64_t k)
{
	for (int64_t i = 0; i < k; i++)
		out[i] = q4kh_bf16_to_f32((uint16_t)(row[2 * i] | row[2 * i + 1] << 8));
}

DEQUANT_CLONES
static void dequant_q8_0(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q8_0);

	for (int64_t b = 0; b < k / Q4KH_QK; b++, row += bs, out += Q4KH_QK) {
		const int8_t *qs =
			(const int8_t *)(row + offsetof(struct q4kh_block_q8_0, qs));
		float d = half_at(row);

		for (int j = 0; j < Q4KH_QK; j++)
			out[j] = d * (float)qs[j];
	}
}

DEQUANT_CLONES
static void dequant_q4_0(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q4_0);

	for (int64_t b = 0; b < k / Q4KH_QK; b++, row += bs, out += Q4KH_QK) {
		const uint8_t *qs = row + offsetof(struct q4kh_block_q4_0, qs);
		float d = half_at(row);

		for (int j = 0; j < Q4KH_QK / 2; j++) {
			out[j] = d * (float)((qs[j] & 0xF) - 8);
			out[j + 16] = d * (float)((qs[j] >> 4) - 8);
		}
	}
}

DEQUANT_CLONES
static void dequant_q4_1(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q4_1);

	for (int64_t b = 0; b < k / Q4KH_QK; b++, row += bs, out += Q4KH_QK) {
		const uint8_t *qs = row + offsetof(struct q4kh_block_q4_1, qs);
		float d = half_at(row), m = half_at(row + 2);

		for (int j = 0; j < Q4KH_QK / 2; j++) {
			out[j] = d * (float)(qs[j] & 0xF) + m;
			out[j + 16] = d * (float)(qs[j] >> 4) + m;
		}
	}
}

/*
 * The 32 5-bit codes of a Q5_0 or Q5_1 block: value j < 16 takes the low
 * nibble of qs[j] and bit j of qh, value j + 16 the high nibble and bit
 * j + 16.
 */
static inline __attribute__((always_inline)) void
q5_codes(const uint8_t *qh, const uint8_t *qs, int *q)
{
	uint32_t hi = qh[0] | qh[1] << 8 | qh[2] << 16 | (uint32_t)qh[3] << 24;

	for (int j = 0; j < Q4KH_QK / 2; j++) {
		q[j] = (qs[j] & 0xF) | ((hi >> j) & 1) << 4;
		q[j + 16] = (qs[j] >> 4) | ((hi >> (j + 16)) & 1) << 4;
	}
}

DEQUANT_CLONES
static void dequant_q5_0(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q5_0);

	for (int64_t b = 0; b < k / Q4KH_QK; b++, row += bs, out += Q4KH_QK) {
		int q[Q4KH_QK];
		float d = half_at(row);

		q5_codes(row + offsetof(struct q4kh_block_q5_0, qh),
		         row + offsetof(struct q4kh_block_q5_0, qs), q);
		for (int j = 0; j < Q4KH_QK; j++)
			out[j] = d * (float)(q[j] - 16);
	}
}

DEQUANT_CLONES
static void dequant_q5_1(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q5_1);

	for (int64_t b = 0; b < k / Q4KH_QK; b++, row += bs, out += Q4KH_QK) {
		int q[Q4KH_QK];
		float d = half_at(row), m = half_at(row + 2);

		q5_codes(row + offsetof(struct q4kh_block_q5_1, qh),
		         row + offsetof(struct q4kh_block_q5_1, qs), q);
		for (int j = 0; j < Q4KH_QK; j++)
			out[j] = d * (float)q[j] + m;
	}
}

/*
 * Q2_K: value v = 128h + 32j + l takes bits 2j, 2j+1 of qs[32h + l] and
 * the scale and min nibbles of sub-block v / 16.
 */
DEQUANT_CLONES
static void dequant_q2_k(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q2_k);

	for (int64_t b = 0; b < k / Q4KH_QK_K; b++, row += bs, out += Q4KH_QK_K) {
		const uint8_t *sc = row + offsetof(struct q4kh_block_q2_k, scales);
		const uint8_t *qs = row + offsetof(struct q4kh_block_q2_k, qs);
		float d = half_at(row + offsetof(struct q4kh_block_q2_k, d));
		float dmin = half_at(row + offsetof(struct q4kh_block_q2_k, dmin));

		for (int s = 0; s < Q4KH_QK_K / 16; s++) {
			const uint8_t *q = qs + 32 * (s / 8) + 16 * (s % 2);
			int shift = 2 * ((s % 8) / 2);
			float dl = d * (float)(sc[s] & 0xF), ml = dmin * (float)(sc[s] >> 4);

			for (int l = 0; l < 16; l++)
				out[16 * s + l] = dl * (float)((q[l] >> shift) & 3) - ml;
		}
	}
}

/* The signed 6-bit scale of sub-block s of a Q3_K super-block. */
static int q3_k_scale(const uint8_t *scales, int s)
{
	int lo = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
	int hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;

	return (lo | hi << 4) - 32;
}

/*
 * Q3_K: value v = 128h + 32j + l takes bits 2j, 2j+1 of qs[32h + l], bit
 * 4h + j of hmask[l] (clear: minus 4) and the scale of sub-block v / 16.
 */
DEQUANT_CLONES
static void dequant_q3_k(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q3_k);

	for (int64_t b = 0; b < k / Q4KH_QK_K; b++, row += bs, out += Q4KH_QK_K) {
		const uint8_t *hm = row + offsetof(struct q4kh_block_q3_k, hmask);
		const uint8_t *qs = row + offsetof(struct q4kh_block_q3_k, qs);
		const uint8_t *sc = row + offsetof(struct q4kh_block_q3_k, scales);
		float d = half_at(row + offsetof(struct q4kh_block_q3_k, d));

		for (int s = 0; s < Q4KH_QK_K / 16; s++) {
			const int h = s / 8, j = (s % 8) / 2, l0 = 16 * (s % 2);
			float dl = d * (float)q3_k_scale(sc, s);

			for (int l = l0; l < l0 + 16; l++) {
				int q = ((qs[32 * h + l] >> (2 * j)) & 3) -
				        (((hm[l] >> (4 * h + j)) & 1) ? 0 : 4);

				out[16 * s + l - l0] = dl * (float)q;
			}
		}
	}
}

/* The 6-bit scale and min of sub-block j of a Q4_K or Q5_K super-block. */
static void k_scale_min(const uint8_t *scales, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = scales[j] & 63;
		*m = scales[j + 4] & 63;
	} else {
		*sc = (scales[j + 4] & 0xF) | (scales[j - 4] >> 6) << 4;
		*m = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4;
	}
}

/*
 * Q4_K and Q5_K share everything but the fifth bit: QH is NULL for Q4_K.
 * Sub-blocks 2c and 2c+1 take the low and high nibbles of qs[32c ..].
 */
static inline __attribute__((always_inline)) void
dequant_k_super(const uint8_t *scales, const uint8_t *qh,
                            const uint8_t *qs, float d, float dmin, float *out)
{
	for (int j = 0; j < 8; j++) {
		const uint8_t *q = qs + 32 * (j / 2);
		int shift = 4 * (j % 2);
		int sc, m;
		float dl, ml;

		k_scale_min(scales, j, &sc, &m);
		dl = d * (float)sc;
		ml = dmin * (float)m;
		for (int i = 0; i < 32; i++) {
			int v = (q[i] >> shift) & 0xF;

			if (qh)
				v |= ((qh[i] >> j) & 1) << 4;
			out[32 * j + i] = dl * (float)v - ml;
		}
	}
}

DEQUANT_CLONES
static void dequant_q4_k(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q4_k);

	for (int64_t b = 0; b < k / Q4KH_QK_K; b++, row += bs, out += Q4KH_QK_K)
		dequant_k_super(row + offsetof(struct q4kh_block_q4_k, scales), NULL,
		                row + offsetof(struct q4kh_block_q4_k, qs),
		                half_at(row), half_at(row + 2), out);
}

DEQUANT_CLONES
static void dequant_q5_k(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q5_k);

	for (int64_t b = 0; b < k / Q4KH_QK_K; b++, row += bs, out += Q4KH_QK_K)
		dequant_k_super(row + offsetof(struct q4kh_block_q5_k, scales),
		                row + offsetof(struct q4kh_block_q5_k, qh),
		                row + offsetof(struct q4kh_block_q5_k, qs),
		                half_at(row), half_at(row + 2), out);
}

DEQUANT_CLONES
static void dequant_q6_k(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_q6_k);

	for (int64_t b = 0; b < k / Q4KH_QK_K; b++, row += bs, out += Q4KH_QK_K) {
		const uint8_t *ql = row + offsetof(struct q4kh_block_q6_k, ql);
		const uint8_t *qh = row + offsetof(struct q4kh_block_q6_k, qh);
		const int8_t *sc =
			(const int8_t *)(row + offsetof(struct q4kh_block_q6_k, scales));
		float d = half_at(row + offsetof(struct q4kh_block_q6_k, d));

		/* Value 128h + 32s + i: the low nibble (s < 2) or high nibble of
		 * ql[64h + 32(s % 2) + i], bits 2s and 2s+1 of qh[32h + i], the
		 * scale of its 16 values. */
		for (int h = 0; h < 2; h++)
			for (int s = 0; s < 4; s++)
				for (int half = 0; half < 2; half++) {
					const uint8_t *l = ql + 64 * h + 32 * (s % 2) + 16 * half;
					const uint8_t *hb = qh + 32 * h + 16 * half;
					float *o = out + 128 * h + 32 * s + 16 * half;
					float dl = d * (float)sc[8 * h + 2 * s + half];

					for (int i = 0; i < 16; i++) {
						int q = ((l[i] >> (4 * (s / 2))) & 0xF) |
						        ((hb[i] >> (2 * s)) & 3) << 4;

						o[i] = dl * (float)(q - 32);
					}
				}
	}
}

/* IQ4_NL: one fp16 scale per 32 values, codes laid out as in Q4_0. */
DEQUANT_CLONES
static void dequant_iq4_nl(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_iq4_nl);

	for (int64_t b = 0; b < k / Q4KH_QK; b++, row += bs, out += Q4KH_QK) {
		const uint8_t *qs = row + offsetof(struct q4kh_block_iq4_nl, qs);
		float d = half_at(row);

		for (int j = 0; j < Q4KH_QK / 2; j++) {
			out[j] = d * (float)q4kh_kvalues_iq4nl[qs[j] & 0xF];
			out[j + 16] = d * (float)q4kh_kvalues_iq4nl[qs[j] >> 4];
		}
	}
}

/*
 * IQ4_XS: sub-block j of 32 takes the 6-bit scale ls_j (4 low bits in
 * scales_l, 2 high bits in scales_h); d * (ls_j - 32) has at most 17
 * significant bits and a code 7, so both products are exact.
 */
DEQUANT_CLONES
static void dequant_iq4_xs(const uint8_t *row, float *out, int64_t k)
{
	const size_t bs = sizeof(struct q4kh_block_iq4_xs);

	for (int64_t b = 0; b < k / Q4KH_QK_K; b++, row += bs) {
		const uint8_t *sl = row + offsetof(struct q4kh_block_iq4_xs, scales_l);
		const uint8_t *qs = row + offsetof(struct q4kh_block_iq4_xs, qs);
		unsigned sh = (unsigned)(row[2] | row[3] << 8);
		float d = half_at(row);

		for (int j = 0; j < 8; j++, qs += 16, out += Q4KH_QK) {
			int ls = ((sl[j / 2] >> 4 * (j % 2)) & 0xF) |
			         (int)((sh >> 2 * j) & 3) << 4;
			float dl = d * (float)(ls - 32);

			for (int i = 0; i < 16; i++) {
				out[i] = dl * (float)q4kh_kvalues_iq4nl[qs[i] & 0xF];
				out[i + 16] = dl * (float)q4kh_kvalues_iq4nl[qs[i] >> 4];
			}
		}
	}
}

typedef void (*dequant_fn)(const uint8_t *row, float *out, int64_t k);

static dequant_fn dequant_for(uint32_t type)
{
	switch (type) {
	case Q4KH_TYPE_F32: return dequant_f32;
	case Q4KH_TYPE_F16: return dequant_f16;
	case Q4KH_TYPE_BF16: return dequant_bf16;
	case Q4KH_TYPE_Q8_0: return dequant_q8_0;
	case Q4KH_TYPE_Q4_0: return dequant_q4_0;
	case Q4KH_TYPE_Q4_1: return dequant_q4_1;
	case Q4KH_TYPE_Q5_0: return dequant_q5_0;
	case Q4KH_TYPE_Q5_1: return dequant_q5_1;
	case Q4KH_TYPE_Q2_K: return dequant_q2_k;
	case Q4KH_TYPE_Q3_K: return dequant_q3_k;
	case Q4KH_TYPE_Q4_K: return dequant_q4_k;
	case Q4KH_TYPE_Q5_K: return dequant_q5_k;
	case Q4KH_TYPE_Q6_K: return dequant_q6_k;
	case Q4KH_TYPE_IQ4_NL: return dequant_iq4_nl;
	case Q4KH_TYPE_IQ4_XS: return dequant_iq4_xs;
	default: return NULL;
	}
}

int q4kh_dequant_supported(uint32_t type)
{
	return dequant_for(type) != NULL;
}

uint32_t q4kh_dequant_types(void)
{
	uint32_t m = 0;

	for (uint32_t t = 0; t < 32; t++)
		if (q4kh_dequant_supported(t))
			m |= Q4KH_TYPE_BIT(t);
	return m;
}

void q4kh_dequant_row(uint32_t type, const void *row, float *out, int64_t k)
{
	dequant_for(type)((const uint8_t *)row, out, k);
}
