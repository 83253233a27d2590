/*
 * The ranges and bounds of GPU products (product_bounds.h).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "product_bounds.h"
#include "q4khost/quant.h"

static double half(const uint8_t *p)
{
	return fabs((double)q4kh_fp16_to_f32((uint16_t)(p[0] | p[1] << 8)));
}

/* The largest |code value| of IQ4_NL and IQ4_XS. */
static double kvalue_max(void)
{
	double m = 0;

	for (int i = 0; i < 16; i++)
		m = fmax(m, fabs((double)q4kh_kvalues_iq4nl[i]));
	return m;
}

/* The signed 6-bit scale of sub-block s of a Q3_K super-block (quant.h). */
static int q3_k_scale(const uint8_t *sc, int s)
{
	int lo = s < 8 ? sc[s] & 0xF : sc[s - 8] >> 4;

	return (lo | ((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
}

/* s_g of each group of 32 values of the quantised block of TYPE at P. */
static void block_ranges(uint32_t type, const uint8_t *p, double *s)
{
	switch (type) {
	case Q4KH_TYPE_Q4_0: s[0] = 8 * half(p); break;
	case Q4KH_TYPE_Q4_1: s[0] = 15 * half(p) + half(p + 2); break;
	case Q4KH_TYPE_Q5_0: s[0] = 16 * half(p); break;
	case Q4KH_TYPE_Q5_1: s[0] = 31 * half(p) + half(p + 2); break;
	case Q4KH_TYPE_Q8_0: s[0] = 128 * half(p); break;
	case Q4KH_TYPE_IQ4_NL: s[0] = kvalue_max() * half(p); break;
	case Q4KH_TYPE_Q2_K: {
		const uint8_t *sc = p + offsetof(struct q4kh_block_q2_k, scales);
		const double d = half(p + offsetof(struct q4kh_block_q2_k, d));
		const double dmin = half(p + offsetof(struct q4kh_block_q2_k, dmin));

		for (int g = 0; g < 8; g++)
			s[g] = fmax(3 * d * (sc[2 * g] & 15) + dmin * (sc[2 * g] >> 4),
			            3 * d * (sc[2 * g + 1] & 15) + dmin * (sc[2 * g + 1] >> 4));
		break;
	}
	case Q4KH_TYPE_Q3_K: {
		const uint8_t *sc = p + offsetof(struct q4kh_block_q3_k, scales);
		const double d = half(p + offsetof(struct q4kh_block_q3_k, d));

		/* codes q2 - 4 reach -4 */
		for (int g = 0; g < 8; g++)
			s[g] = 4 * d * fmax(abs(q3_k_scale(sc, 2 * g)), abs(q3_k_scale(sc, 2 * g + 1)));
		break;
	}
	case Q4KH_TYPE_Q4_K:
	case Q4KH_TYPE_Q5_K: {
		const uint8_t *q = p + 4;
		const double top = type == Q4KH_TYPE_Q5_K ? 31 : 15;

		for (int j = 0; j < 8; j++) {
			int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
			int m = j < 4 ? q[j + 4] & 63 : q[j + 4] >> 4 | (q[j] >> 6) << 4;

			s[j] = top * half(p) * sc + half(p + 2) * m;
		}
		break;
	}
	case Q4KH_TYPE_Q6_K: {
		const int8_t *sc = (const int8_t *)(p + offsetof(struct q4kh_block_q6_k, scales));
		const double d = half(p + offsetof(struct q4kh_block_q6_k, d));

		/* value v has scale v / 16; codes minus 32 reach -32 */
		for (int g = 0; g < 8; g++)
			s[g] = 32 * d * fmax(abs(sc[2 * g]), abs(sc[2 * g + 1]));
		break;
	}
	case Q4KH_TYPE_IQ4_XS: {
		const uint8_t *sl = p + offsetof(struct q4kh_block_iq4_xs, scales_l);
		const unsigned sh = (unsigned)(p[2] | p[3] << 8);

		for (int j = 0; j < 8; j++) {
			int ls = (sl[j / 2] >> 4 * (j % 2) & 15) | (int)(sh >> 2 * j & 3) << 4;

			s[j] = kvalue_max() * half(p) * abs(ls - 32);
		}
		break;
	}
	default: cr_assert_fail("no ranges for type %s (%u)", q4kh_type_name(type), type);
	}
}

/* |value i| of a row of F32, F16 or BF16 values at P. */
static double float_at(uint32_t type, const uint8_t *p, int64_t i)
{
	float f;

	switch (type) {
	case Q4KH_TYPE_F32: memcpy(&f, p + 4 * i, 4); return fabs((double)f);
	case Q4KH_TYPE_F16: return half(p + 2 * i);
	default: return fabs((double)q4kh_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8)));
	}
}

double *group_ranges(uint32_t type, const uint8_t *w, int64_t k, int64_t n)
{
	const size_t bb = q4kh_type_block_bytes(type);
	const int64_t be = q4kh_type_block_elems(type), groups = k / BOUND_GROUP * n;
	double *s = calloc((size_t)groups, sizeof(double));

	cr_assert(s && k % BOUND_GROUP == 0, "group_ranges: %s rows of %lld values",
	          q4kh_type_name(type), (long long)k);
	if (be == 1) {
		for (int64_t g = 0; g < groups; g++)
			for (int64_t i = 0; i < BOUND_GROUP; i++)
				s[g] = fmax(s[g], float_at(type, w, g * BOUND_GROUP + i));
		return s;
	}
	for (int64_t b = 0; b < k / be * n; b++)
		block_ranges(type, w + (size_t)b * bb, s + b * (be / BOUND_GROUP));
	return s;
}

double gemv_bound(int64_t k, double s)
{
	const double u = ldexp(1.0, -24);

	return (1.0 + 4.0 * (41.0 + 4.0 * (double)((k + 1023) / 1024))) * u * s;
}

double tc_bound(int64_t k, double s, double xsum)
{
	const double u = ldexp(1.0, -24);

	return (ldexp(1.0, -10) + ldexp(1.0, -22) + 2 * u + 2 * u * (double)k) * s +
	       ldexp(1.0, -25) * xsum;
}
