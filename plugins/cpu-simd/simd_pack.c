/*
 * Q4_K, Q6_K and Q5_0 weights repacked into the tiles of struct
 * simd_pack_q4_k, simd_pack_q6_k and simd_pack_q5_0 (simd.h), once at
 * prepare(). Plain C: each GGUF block
 * is unpacked to one code byte per value (quant.h's layouts), then the
 * codes of 16 rows are interleaved.
 */
#include <string.h>

#include "simd.h"

/* A Q4_K block's 8 six-bit scales and mins (ggml's get_scale_min_k4). */
static void q4_k_scale_bytes(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
	for (int j = 0; j < 4; j++) {
		sc[j] = s[j] & 63;
		m[j] = s[j + 4] & 63;
		sc[j + 4] = (uint8_t)((s[j + 8] & 0x0F) | (s[j] >> 6) << 4);
		m[j + 4] = (uint8_t)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
	}
}

/* The 256 codes of a Q4_K block, value v in q[v]. */
static void q4_k_codes(const struct q4kh_block_q4_k *b, uint8_t q[Q4KH_QK_K])
{
	for (int c = 0; c < 4; c++)
		for (int l = 0; l < 32; l++) {
			q[64 * c + l] = b->qs[32 * c + l] & 0x0F;
			q[64 * c + 32 + l] = b->qs[32 * c + l] >> 4;
		}
}

/* The 256 six-bit codes of a Q6_K block (unsigned, before the - 32). */
static void q6_k_codes(const struct q4kh_block_q6_k *b, uint8_t q[Q4KH_QK_K])
{
	for (int h = 0; h < 2; h++)
		for (int l = 0; l < 32; l++) {
			const uint8_t *ql = b->ql + 64 * h, hb = b->qh[32 * h + l];
			uint8_t *o = q + 128 * h;

			o[l] = (uint8_t)((ql[l] & 0x0F) | (hb & 3) << 4);
			o[l + 32] = (uint8_t)((ql[l + 32] & 0x0F) | (hb >> 2 & 3) << 4);
			o[l + 64] = (uint8_t)((ql[l] >> 4) | (hb >> 4 & 3) << 4);
			o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (hb >> 6 & 3) << 4);
		}
}

/* The 32 five-bit codes of a Q5_0 block (unsigned, before the - 16). */
static void q5_0_codes(const struct q4kh_block_q5_0 *b, uint8_t q[32])
{
	const uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 |
	                    (uint32_t)b->qh[2] << 16 | (uint32_t)b->qh[3] << 24;

	for (int j = 0; j < 16; j++) {
		q[j] = (uint8_t)((b->qs[j] & 0x0F) | (qh >> j & 1) << 4);
		q[j + 16] = (uint8_t)((b->qs[j] >> 4) | (qh >> (j + 16) & 1) << 4);
	}
}

/* Row R of a tile: the low 4 bits of codes Q into the OCTETS octets QS
 * (every type). */
static void put_nibbles(uint8_t qs[][SIMD_PACK_ROWS][4], int octets, int r, const uint8_t *q)
{
	for (int p = 0; p < octets; p++)
		for (int i = 0; i < 4; i++)
			qs[p][r][i] = (uint8_t)((q[8 * p + i] & 0x0F) | (q[8 * p + 4 + i] & 0x0F) << 4);
}

static void pack_q4_k(const struct q4kh_block_q4_k *b, int r, struct simd_pack_q4_k *t)
{
	uint8_t q[Q4KH_QK_K], sc[8], m[8];

	t->d[r] = q4kh_fp16_to_f32(b->d);
	t->dmin[r] = q4kh_fp16_to_f32(b->dmin);
	q4_k_scale_bytes(b->scales, sc, m);
	for (int j = 0; j < 8; j++) {
		t->sc[j][r] = sc[j];
		t->m[j][r] = m[j];
	}
	q4_k_codes(b, q);
	put_nibbles(t->qs, 32, r, q);
}

static void pack_q6_k(const struct q4kh_block_q6_k *b, int r, struct simd_pack_q6_k *t)
{
	uint8_t q[Q4KH_QK_K];

	t->d[r] = q4kh_fp16_to_f32(b->d);
	for (int g = 0; g < 16; g++)
		t->sc[g][r] = b->scales[g];
	q6_k_codes(b, q);
	put_nibbles(t->ql, 32, r, q);
	for (int g = 0; g < 16; g++)
		for (int i = 0; i < 4; i++) {
			uint8_t h = 0;

			for (int s = 0; s < 4; s++)
				h |= (uint8_t)((q[16 * g + 4 * s + i] >> 4) << 2 * s);
			t->qh[g][r][i] = h;
		}
}

static void pack_q5_0(const struct q4kh_block_q5_0 *b, int r, struct simd_pack_q5_0 *t)
{
	uint8_t q[32];

	t->d[r] = q4kh_fp16_to_f32(b->d);
	q5_0_codes(b, q);
	put_nibbles(t->qs, 4, r, q);
	for (int i = 0; i < 4; i++) {
		uint8_t h = 0;

		for (int s = 0; s < 8; s++)
			h |= (uint8_t)((q[4 * s + i] >> 4) << s);
		t->qh[r][i] = h;
	}
}

/* Bytes of one tile's block; 0 for a type without a layout. */
static size_t tile_block_bytes(int type)
{
	return type == SIMD_Q4_K ? sizeof(struct simd_pack_q4_k) :
	       type == SIMD_Q6_K ? sizeof(struct simd_pack_q6_k) :
	       type == SIMD_Q5_0 ? sizeof(struct simd_pack_q5_0) :
	                           0;
}

int64_t simd_pack_block_values(int type)
{
	return type == SIMD_Q4_K || type == SIMD_Q6_K ? Q4KH_QK_K : type == SIMD_Q5_0 ? 32 : 0;
}

size_t simd_pack_bytes(int type, int64_t n, int64_t k)
{
	const int64_t tiles = (n + SIMD_PACK_ROWS - 1) / SIMD_PACK_ROWS;
	const int64_t v = simd_pack_block_values(type);

	return v ? tile_block_bytes(type) * (size_t)(tiles * (k / v)) : 0;
}

void simd_pack_tiles(int type, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k,
                     int64_t t0, int64_t t1, void *out)
{
	const size_t bb = tile_block_bytes(type);
	const int64_t nsb = k / simd_pack_block_values(type);

	for (int64_t t = t0; t < t1; t++) {
		uint8_t *tile = (uint8_t *)out + bb * (size_t)(t * nsb);

		/* Padding rows stay zero: codes, scales and d of 0 give products of 0. */
		memset(tile, 0, bb * (size_t)nsb);
		for (int r = 0; r < SIMD_PACK_ROWS && t * SIMD_PACK_ROWS + r < n; r++) {
			const uint8_t *row = w + (t * SIMD_PACK_ROWS + r) * row_bytes;

			for (int64_t sb = 0; sb < nsb; sb++) {
				if (type == SIMD_Q4_K)
					pack_q4_k((const struct q4kh_block_q4_k *)row + sb, r,
					          (struct simd_pack_q4_k *)tile + sb);
				else if (type == SIMD_Q6_K)
					pack_q6_k((const struct q4kh_block_q6_k *)row + sb, r,
					          (struct simd_pack_q6_k *)tile + sb);
				else
					pack_q5_0((const struct q4kh_block_q5_0 *)row + sb, r,
					          (struct simd_pack_q5_0 *)tile + sb);
			}
		}
	}
}
