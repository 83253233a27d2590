/*
 * Random weights for the harnesses of tests/emu (gemv_emu.cpp,
 * moe_emu.cpp): rows of any type the GEMV formats or the plain kernel
 * take, from one random stream per harness (rng, seeded 1; a harness may
 * seed it again).
 */
#ifndef Q4KH_EMU_ROWS_H
#define Q4KH_EMU_ROWS_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

#include <cuda_fp16.h>

#include "q4khost/quant.h"

static std::mt19937_64 rng(1);

/* Uniform in [0, 1). */
static double urand(void)
{
	return (double)(rng() >> 11) * (1.0 / 9007199254740992.0);
}

static void put_half(uint8_t *p, float f)
{
	const __half h = __float2half(f);

	memcpy(p, &h, 2);
}

/* N rows of K values STRIDE bytes apart: random codes, scales of either
 * sign in [1, 2) 2^-10 (mins positive), values in [-1, 1) for F32, F16 and
 * BF16 (truncated). */
static void random_rows(uint32_t type, int64_t k, int64_t n, int64_t stride, uint8_t *w)
{
	const size_t bb = q4kh_type_block_bytes(type);
	const size_t rb = (size_t)(k / q4kh_type_block_elems(type)) * bb;

	for (int64_t r = 0; r < n; r++) {
		uint8_t *row = w + r * stride;

		for (size_t i = 0; i < rb; i++)
			row[i] = (uint8_t)rng();
		for (int64_t i = 0; type == Q4KH_TYPE_F32 && i < k; i++) {
			const float f = (float)(urand() * 2 - 1);

			memcpy(row + 4 * i, &f, 4);
		}
		for (int64_t i = 0; type == Q4KH_TYPE_F16 && i < k; i++)
			put_half(row + 2 * i, (float)(urand() * 2 - 1));
		for (int64_t i = 0; type == Q4KH_TYPE_BF16 && i < k; i++) {
			const float f = (float)(urand() * 2 - 1);
			uint32_t u;

			memcpy(&u, &f, 4);
			row[2 * i] = (uint8_t)(u >> 16);
			row[2 * i + 1] = (uint8_t)(u >> 24);
		}
		if (q4kh_type_block_elems(type) == 1)
			continue;
		for (size_t b = 0; b < rb; b += bb) {
			const float s = (float)((1.0 + urand()) / 1024.0) * (urand() < 0.5 ? -1 : 1);

			if (type == Q4KH_TYPE_Q6_K) {
				put_half(row + b + offsetof(struct q4kh_block_q6_k, d), s);
				continue;
			}
			if (type == Q4KH_TYPE_Q3_K) {
				put_half(row + b + offsetof(struct q4kh_block_q3_k, d), s);
				continue;
			}
			if (type == Q4KH_TYPE_Q2_K) {
				put_half(row + b + offsetof(struct q4kh_block_q2_k, d), s);
				put_half(row + b + offsetof(struct q4kh_block_q2_k, dmin),
				         (float)((1.0 + urand()) / 1024.0));
				continue;
			}
			put_half(row + b, s);
			if (type == Q4KH_TYPE_Q4_K || type == Q4KH_TYPE_Q5_K ||
			    type == Q4KH_TYPE_Q4_1 || type == Q4KH_TYPE_Q5_1)
				put_half(row + b + 2, (float)((1.0 + urand()) / 1024.0));
		}
	}
}

#endif
