/*
 * example-backend: the weight types it reads, each row decoded to floats
 * by the formula in q4khost/quant.h. These are the types of the usual
 * Q4_K_M files (Q4_K, with Q6_K, Q5_0 and Q8_0 where the quantizer keeps
 * more bits, F32 norms); a model holding another type cannot run here.
 * A type is one case here and one bit in example_weight_types().
 */
#include "backend.h"

uint32_t example_weight_types(void)
{
	return Q4KH_TYPE_BIT(Q4KH_TYPE_F32) | Q4KH_TYPE_BIT(Q4KH_TYPE_F16) |
	       Q4KH_TYPE_BIT(Q4KH_TYPE_Q5_0) | Q4KH_TYPE_BIT(Q4KH_TYPE_Q8_0) |
	       Q4KH_TYPE_BIT(Q4KH_TYPE_Q4_K) | Q4KH_TYPE_BIT(Q4KH_TYPE_Q6_K);
}

/* Q5_0: x = d (q - 16), q's fifth bit j in qh (little-endian). */
static void q5_0(const struct q4kh_block_q5_0 *b, float *out)
{
	const float d = q4kh_fp16_to_f32(b->d);
	const uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 |
	                    (uint32_t)b->qh[2] << 16 | (uint32_t)b->qh[3] << 24;

	for (int j = 0; j < 16; j++) {
		int lo = (b->qs[j] & 0xF) | ((qh >> j) & 1) << 4;
		int hi = (b->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;

		out[j] = d * (float)(lo - 16);
		out[j + 16] = d * (float)(hi - 16);
	}
}

/* Q8_0: x = d q. */
static void q8_0(const struct q4kh_block_q8_0 *b, float *out)
{
	const float d = q4kh_fp16_to_f32(b->d);

	for (int j = 0; j < Q4KH_QK; j++)
		out[j] = d * (float)b->qs[j];
}

/* Q4_K: sub-block j of 32 values, x = d sc_j q - dmin m_j. */
static void q4_k(const struct q4kh_block_q4_k *b, float *out)
{
	const float d = q4kh_fp16_to_f32(b->d), dmin = q4kh_fp16_to_f32(b->dmin);
	const uint8_t *s = b->scales;

	for (int j = 0; j < 8; j++) {
		/* 6-bit scale and min, packed as quant.h says */
		int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
		int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
		/* sub-blocks 2c and 2c+1: low and high nibbles of qs[32c ..] */
		const uint8_t *qs = b->qs + 32 * (j / 2);
		const int shift = 4 * (j % 2);

		for (int i = 0; i < 32; i++)
			out[32 * j + i] = d * (float)sc * (float)((qs[i] >> shift) & 0xF) -
			                  dmin * (float)m;
	}
}

/* Q6_K: x = d scales[v / 16] (q - 32), q from ql's nibble and qh's pair. */
static void q6_k(const struct q4kh_block_q6_k *b, float *out)
{
	const float d = q4kh_fp16_to_f32(b->d);

	for (int h = 0; h < 2; h++) {
		const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
		float *o = out + 128 * h;

		for (int l = 0; l < 32; l++) {
			const int q[4] = {
				(ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4,
				(ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
				(ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
				(ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4,
			};

			for (int k = 0; k < 4; k++) {
				const int v = 128 * h + l + 32 * k;

				o[l + 32 * k] = d * (float)b->scales[v / 16] * (float)(q[k] - 32);
			}
		}
	}
}

void example_row_to_f32(uint32_t type, const void *row, float *out, int64_t n)
{
	const int64_t blocks = n / q4kh_type_block_elems(type);

	for (int64_t i = 0; i < blocks; i++) {
		switch (type) {
		case Q4KH_TYPE_F32:
			out[i] = ((const float *)row)[i];
			break;
		case Q4KH_TYPE_F16:
			out[i] = q4kh_fp16_to_f32(((const uint16_t *)row)[i]);
			break;
		case Q4KH_TYPE_Q5_0:
			q5_0((const struct q4kh_block_q5_0 *)row + i, out + Q4KH_QK * i);
			break;
		case Q4KH_TYPE_Q8_0:
			q8_0((const struct q4kh_block_q8_0 *)row + i, out + Q4KH_QK * i);
			break;
		case Q4KH_TYPE_Q4_K:
			q4_k((const struct q4kh_block_q4_k *)row + i, out + Q4KH_QK_K * i);
			break;
		case Q4KH_TYPE_Q6_K:
			q6_k((const struct q4kh_block_q6_k *)row + i, out + Q4KH_QK_K * i);
			break;
		}
	}
}
