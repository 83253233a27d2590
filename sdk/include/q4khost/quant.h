/*
 * GGUF tensor types and block layouts, as ggml defines them
 * (ggml/include/ggml.h enum ggml_type; ggml/src/ggml-common.h blocks; the
 * value formulas are ggml's dequantize_row_* in ggml/src/ggml-quants.c).
 * The numeric values are GGUF's on-disk type ids.
 *
 * A quantized row of K values is K / block_elems blocks stored back to back.
 * fp16 fields are IEEE 754 binary16, little-endian, like every field here.
 *
 * Every type ggml stores in files has an id, a name and a size here, so
 * that a file holding one parses and the host can name it when it refuses
 * it; the layouts below are those of the types q4khost multiplies
 * (docs/architecture.md "Weight types").
 */
#ifndef Q4KHOST_QUANT_H
#define Q4KHOST_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum q4kh_type {
	Q4KH_TYPE_F32 = 0,
	Q4KH_TYPE_F16 = 1,
	Q4KH_TYPE_Q4_0 = 2,
	Q4KH_TYPE_Q4_1 = 3,
	Q4KH_TYPE_Q5_0 = 6,
	Q4KH_TYPE_Q5_1 = 7,
	Q4KH_TYPE_Q8_0 = 8,
	Q4KH_TYPE_Q8_1 = 9,
	Q4KH_TYPE_Q2_K = 10,
	Q4KH_TYPE_Q3_K = 11,
	Q4KH_TYPE_Q4_K = 12,
	Q4KH_TYPE_Q5_K = 13,
	Q4KH_TYPE_Q6_K = 14,
	Q4KH_TYPE_Q8_K = 15,
	Q4KH_TYPE_IQ2_XXS = 16,
	Q4KH_TYPE_IQ2_XS = 17,
	Q4KH_TYPE_IQ3_XXS = 18,
	Q4KH_TYPE_IQ1_S = 19,
	Q4KH_TYPE_IQ4_NL = 20,
	Q4KH_TYPE_IQ3_S = 21,
	Q4KH_TYPE_IQ2_S = 22,
	Q4KH_TYPE_IQ4_XS = 23,
	Q4KH_TYPE_I8 = 24,
	Q4KH_TYPE_I16 = 25,
	Q4KH_TYPE_I32 = 26, /* int32 values: token ids, positions (ABI 1.2) */
	Q4KH_TYPE_I64 = 27,
	Q4KH_TYPE_F64 = 28,
	Q4KH_TYPE_IQ1_M = 29,
	Q4KH_TYPE_BF16 = 30,
	Q4KH_TYPE_TQ1_0 = 34,
	Q4KH_TYPE_TQ2_0 = 35,
	Q4KH_TYPE_MXFP4 = 39,
	Q4KH_TYPE_NVFP4 = 40,
	Q4KH_TYPE_Q1_0 = 41,
	Q4KH_TYPE_Q2_0 = 42,
	/* One past the largest GGUF id: every id of gguf-py's
	 * GGMLQuantizationType has a name and a size here (ids 4, 5, 31 to
	 * 33 and 36 to 38 were removed from GGUF files and are unknown). */
	Q4KH_TYPE_COUNT = 43
};

#define Q4KH_QK 32   /* values per block of the legacy and i-quant types */
#define Q4KH_QK_K 256 /* values per super-block of the K-quants */

/*
 * The float types store one value per element: F32 an IEEE 754 binary32,
 * F16 a binary16 (q4kh_fp16_to_f32), BF16 the high 16 bits of a binary32
 * (q4kh_bf16_to_f32: x has those bits over 16 zero bits).
 */

/* Q5_0: x = d * (q - 16), q 5-bit: low 4 bits in qs, 5th bit in qh.
 * Value j < 16 uses the low nibble of qs[j] and bit j of qh; value j + 16
 * the high nibble of qs[j] and bit j + 16 of qh (qh little-endian). */
struct q4kh_block_q5_0 {
	uint16_t d; /* fp16 scale */
	uint8_t qh[4];
	uint8_t qs[Q4KH_QK / 2];
};

/* Q8_0: x = d * q, q signed 8-bit. */
struct q4kh_block_q8_0 {
	uint16_t d; /* fp16 scale */
	int8_t qs[Q4KH_QK];
};

/* Q4_0: x = d * (q - 8); value j < 16 low nibble of qs[j], j + 16 high. */
struct q4kh_block_q4_0 {
	uint16_t d;
	uint8_t qs[Q4KH_QK / 2];
};

/* Q4_1: x = d * q + m, q the 4-bit code laid out as in Q4_0. */
struct q4kh_block_q4_1 {
	uint16_t d; /* fp16 scale */
	uint16_t m; /* fp16 min (added) */
	uint8_t qs[Q4KH_QK / 2];
};

/* Q5_1: x = d * q + m, q the 5-bit code laid out as in Q5_0. */
struct q4kh_block_q5_1 {
	uint16_t d; /* fp16 scale */
	uint16_t m; /* fp16 min (added) */
	uint8_t qh[4];
	uint8_t qs[Q4KH_QK / 2];
};

/*
 * Q2_K: a 256-value super-block of 16 sub-blocks of 16. Value v =
 * 128h + 32j + l (h < 2, j < 4, l < 32) has the 2-bit code
 * q = (qs[32h + l] >> 2j) & 3 and sub-block s = v / 16, whose byte
 * scales[s] holds a 4-bit scale (low nibble) and a 4-bit min (high):
 *   x = d * (scales[s] & 0xF) * q - dmin * (scales[s] >> 4).
 */
struct q4kh_block_q2_k {
	uint8_t scales[Q4KH_QK_K / 16];
	uint8_t qs[Q4KH_QK_K / 4];
	uint16_t d;    /* fp16 super-block scale of the scales */
	uint16_t dmin; /* fp16 super-block scale of the mins */
};

/*
 * Q3_K: a 256-value super-block of 16 sub-blocks of 16 with signed 6-bit
 * scales. Value v = 128h + 32j + l (h < 2, j < 4, l < 32) has the 2-bit
 * code q2 = (qs[32h + l] >> 2j) & 3 and the high bit
 * b = (hmask[l] >> (4h + j)) & 1, q = q2 - (b ? 0 : 4), in sub-block
 * s = v / 16 with the scale
 *   sc_s = ((s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4)
 *           | ((scales[8 + s % 4] >> 2 (s / 4)) & 3) << 4) - 32,
 *   x = d * sc_s * q.
 */
struct q4kh_block_q3_k {
	uint8_t hmask[Q4KH_QK_K / 8];
	uint8_t qs[Q4KH_QK_K / 4];
	uint8_t scales[12];
	uint16_t d; /* fp16 */
};

/*
 * Q4_K: a 256-value super-block of 8 sub-blocks of 32.
 * Sub-block j has a 6-bit scale sc_j and 6-bit min m_j packed in scales[12]:
 *   j < 4: sc = scales[j] & 63, m = scales[j + 4] & 63
 *   j >= 4: sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
 *           m  = (scales[j + 4] >> 4)  | ((scales[j]     >> 6) << 4)
 * Value i of sub-block j: x = d * sc_j * q - dmin * m_j, with q a 4-bit
 * nibble: sub-blocks 2c and 2c+1 share qs[32c .. 32c+31], low nibbles for
 * 2c and high nibbles for 2c+1.
 */
struct q4kh_block_q4_k {
	uint16_t d;    /* fp16 super-block scale of the scales */
	uint16_t dmin; /* fp16 super-block scale of the mins */
	uint8_t scales[12];
	uint8_t qs[Q4KH_QK_K / 2];
};

/*
 * Q5_K: as Q4_K plus a fifth bit per value in qh[32]: bit (j) of qh[i] is
 * the high bit of value i of sub-block j. x = d * sc_j * q - dmin * m_j.
 */
struct q4kh_block_q5_k {
	uint16_t d;
	uint16_t dmin;
	uint8_t scales[12];
	uint8_t qh[Q4KH_QK_K / 8];
	uint8_t qs[Q4KH_QK_K / 2];
};

/*
 * Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; q 6-bit,
 * x = d * scales[s] * (q - 32). For each half h (128 values), with
 * ql' = ql + 64h, qh' = qh + 32h and l < 32:
 *   q(l)      = (ql'[l]      & 0xF) | ((qh'[l] >> 0) & 3) << 4
 *   q(l + 32) = (ql'[l + 32] & 0xF) | ((qh'[l] >> 2) & 3) << 4
 *   q(l + 64) = (ql'[l]      >> 4)  | ((qh'[l] >> 4) & 3) << 4
 *   q(l + 96) = (ql'[l + 32] >> 4)  | ((qh'[l] >> 6) & 3) << 4
 * and value v of the super-block uses scales[v / 16].
 */
struct q4kh_block_q6_k {
	uint8_t ql[Q4KH_QK_K / 2];
	uint8_t qh[Q4KH_QK_K / 4];
	int8_t scales[Q4KH_QK_K / 16];
	uint16_t d; /* fp16 */
};

/*
 * IQ4_NL: 32 values, x = d * kvalues_iq4nl[q], q a 4-bit index laid out as
 * in Q4_0. The codebook is non-linear (ggml-common.h kvalues_iq4nl).
 */
struct q4kh_block_iq4_nl {
	uint16_t d;
	uint8_t qs[Q4KH_QK / 2];
};

/*
 * IQ4_XS: a 256-value super-block of 8 sub-blocks of 32 with 6-bit scales
 * ls_j = ((scales_l[j/2] >> 4*(j%2)) & 0xF) | (((scales_h >> 2j) & 3) << 4),
 * x = d * (ls_j - 32) * kvalues_iq4nl[q]; qs as in IQ4_NL per sub-block.
 */
struct q4kh_block_iq4_xs {
	uint16_t d;
	uint16_t scales_h;
	uint8_t scales_l[Q4KH_QK_K / 64];
	uint8_t qs[Q4KH_QK_K / 2];
};

/* The 16 IQ4_NL / IQ4_XS code values (ggml-common.h). */
static const int8_t q4kh_kvalues_iq4nl[16] = {
	-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/*
 * Values per block and bytes per block of a type; 0 for types unknown to
 * this SDK. A row of K values of type t takes
 * K / q4kh_type_block_elems(t) * q4kh_type_block_bytes(t) bytes, and K must be
 * a multiple of the block size. Pure, thread-safe.
 */
static inline uint32_t q4kh_type_block_elems(uint32_t t)
{
	switch (t) {
	case Q4KH_TYPE_F32:
	case Q4KH_TYPE_F16:
	case Q4KH_TYPE_BF16:
	case Q4KH_TYPE_F64:
	case Q4KH_TYPE_I8:
	case Q4KH_TYPE_I16:
	case Q4KH_TYPE_I32:
	case Q4KH_TYPE_I64:
		return 1;
	case Q4KH_TYPE_Q4_0:
	case Q4KH_TYPE_Q4_1:
	case Q4KH_TYPE_Q5_0:
	case Q4KH_TYPE_Q5_1:
	case Q4KH_TYPE_Q8_0:
	case Q4KH_TYPE_IQ4_NL:
	case Q4KH_TYPE_MXFP4:
	case Q4KH_TYPE_Q8_1:
		return Q4KH_QK;
	case Q4KH_TYPE_NVFP4:
	case Q4KH_TYPE_Q2_0:
		return 64;
	case Q4KH_TYPE_Q1_0:
		return 128;
	case Q4KH_TYPE_Q2_K:
	case Q4KH_TYPE_Q3_K:
	case Q4KH_TYPE_Q8_K:
	case Q4KH_TYPE_Q4_K:
	case Q4KH_TYPE_Q5_K:
	case Q4KH_TYPE_Q6_K:
	case Q4KH_TYPE_IQ4_XS:
	case Q4KH_TYPE_IQ2_XXS:
	case Q4KH_TYPE_IQ2_XS:
	case Q4KH_TYPE_IQ2_S:
	case Q4KH_TYPE_IQ3_XXS:
	case Q4KH_TYPE_IQ3_S:
	case Q4KH_TYPE_IQ1_S:
	case Q4KH_TYPE_IQ1_M:
	case Q4KH_TYPE_TQ1_0:
	case Q4KH_TYPE_TQ2_0:
		return Q4KH_QK_K;
	default:
		return 0;
	}
}

static inline uint32_t q4kh_type_block_bytes(uint32_t t)
{
	switch (t) {
	case Q4KH_TYPE_F32: return 4;
	case Q4KH_TYPE_F16: return 2;
	case Q4KH_TYPE_BF16: return 2;
	case Q4KH_TYPE_F64: return 8;
	case Q4KH_TYPE_I8: return 1;
	case Q4KH_TYPE_I16: return 2;
	case Q4KH_TYPE_I32: return 4;
	case Q4KH_TYPE_I64: return 8;
	case Q4KH_TYPE_Q4_0: return sizeof(struct q4kh_block_q4_0);
	case Q4KH_TYPE_Q4_1: return sizeof(struct q4kh_block_q4_1);
	case Q4KH_TYPE_Q5_0: return sizeof(struct q4kh_block_q5_0);
	case Q4KH_TYPE_Q5_1: return sizeof(struct q4kh_block_q5_1);
	case Q4KH_TYPE_Q8_0: return sizeof(struct q4kh_block_q8_0);
	case Q4KH_TYPE_IQ4_NL: return sizeof(struct q4kh_block_iq4_nl);
	case Q4KH_TYPE_Q2_K: return sizeof(struct q4kh_block_q2_k);
	case Q4KH_TYPE_Q3_K: return sizeof(struct q4kh_block_q3_k);
	case Q4KH_TYPE_Q4_K: return sizeof(struct q4kh_block_q4_k);
	case Q4KH_TYPE_Q5_K: return sizeof(struct q4kh_block_q5_k);
	case Q4KH_TYPE_Q6_K: return sizeof(struct q4kh_block_q6_k);
	case Q4KH_TYPE_IQ4_XS: return sizeof(struct q4kh_block_iq4_xs);
	/* Sizes of types without a layout here, so files holding them parse
	 * (ggml-common.h's static_asserts on each block; gguf-py's
	 * GGML_QUANT_SIZES). */
	case Q4KH_TYPE_Q8_K: return 292;
	case Q4KH_TYPE_IQ2_XXS: return 66;
	case Q4KH_TYPE_IQ2_XS: return 74;
	case Q4KH_TYPE_IQ2_S: return 82;
	case Q4KH_TYPE_IQ3_XXS: return 98;
	case Q4KH_TYPE_IQ3_S: return 110;
	case Q4KH_TYPE_IQ1_S: return 50;
	case Q4KH_TYPE_IQ1_M: return 56;
	case Q4KH_TYPE_TQ1_0: return 54;
	case Q4KH_TYPE_TQ2_0: return 66;
	case Q4KH_TYPE_MXFP4: return 17;
	case Q4KH_TYPE_Q8_1: return 36;  /* d, s (binary16 each), 32 int8 */
	case Q4KH_TYPE_NVFP4: return 36; /* 4 UE4M3 scales, 64 E2M1 values */
	case Q4KH_TYPE_Q1_0: return 18;
	case Q4KH_TYPE_Q2_0: return 18;
	default: return 0;
	}
}

/* IEEE 754 binary16 to float, exactly (every half is a float). Pure. */
static inline float q4kh_fp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1F;
	uint32_t man = h & 0x3FF;
	uint32_t bits;
	union { uint32_t u; float f; } v;

	if (exp == 0x1F) {
		bits = sign | 0x7F800000u | (man << 13); /* inf, NaN */
	} else if (exp != 0) {
		bits = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man == 0) {
		bits = sign; /* +-0 */
	} else { /* subnormal: normalise */
		exp = 113;
		while (!(man & 0x400)) {
			man <<= 1;
			exp--;
		}
		bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
	}
	v.u = bits;
	return v.f;
}

/* bfloat16 to float, exactly: the bits over 16 zero bits. Pure. */
static inline float q4kh_bf16_to_f32(uint16_t h)
{
	union { uint32_t u; float f; } v = { (uint32_t)h << 16 };

	return v.f;
}

/* float to binary16, round to nearest even; overflow gives inf. Pure. */
static inline uint16_t q4kh_f32_to_fp16(float f)
{
	union { float f; uint32_t u; } v = { f };
	uint32_t sign = (v.u >> 16) & 0x8000;
	uint32_t exp = (v.u >> 23) & 0xFF;
	uint32_t man = v.u & 0x7FFFFF;
	int32_t e;

	if (exp == 0xFF)
		return (uint16_t)(sign | 0x7C00 | (man ? 0x200 : 0));
	e = (int32_t)exp - 127 + 15;
	if (e >= 0x1F)
		return (uint16_t)(sign | 0x7C00);
	if (e <= 0) {
		uint32_t shift, half, rest, r;
		if (e < -10)
			return (uint16_t)sign;
		man |= 0x800000;
		shift = (uint32_t)(14 - e);
		half = 1u << (shift - 1);
		rest = man & ((1u << shift) - 1);
		r = man >> shift;
		if (rest > half || (rest == half && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	{
		uint32_t r = ((uint32_t)e << 10) | (man >> 13);
		uint32_t rest = man & 0x1FFF;
		if (rest > 0x1000 || (rest == 0x1000 && (r & 1)))
			r++; /* may carry into the exponent, up to inf: correct */
		return (uint16_t)(sign | r);
	}
}

/* GGUF's name of a type ("Q4_K"), or NULL when unknown. */
static inline const char *q4kh_type_name(uint32_t t)
{
	switch (t) {
	case Q4KH_TYPE_F32: return "F32";
	case Q4KH_TYPE_F16: return "F16";
	case Q4KH_TYPE_BF16: return "BF16";
	case Q4KH_TYPE_Q4_0: return "Q4_0";
	case Q4KH_TYPE_Q4_1: return "Q4_1";
	case Q4KH_TYPE_Q5_0: return "Q5_0";
	case Q4KH_TYPE_Q5_1: return "Q5_1";
	case Q4KH_TYPE_Q8_0: return "Q8_0";
	case Q4KH_TYPE_Q8_1: return "Q8_1";
	case Q4KH_TYPE_Q2_K: return "Q2_K";
	case Q4KH_TYPE_Q3_K: return "Q3_K";
	case Q4KH_TYPE_Q4_K: return "Q4_K";
	case Q4KH_TYPE_Q5_K: return "Q5_K";
	case Q4KH_TYPE_Q6_K: return "Q6_K";
	case Q4KH_TYPE_Q8_K: return "Q8_K";
	case Q4KH_TYPE_IQ2_XXS: return "IQ2_XXS";
	case Q4KH_TYPE_IQ2_XS: return "IQ2_XS";
	case Q4KH_TYPE_IQ2_S: return "IQ2_S";
	case Q4KH_TYPE_IQ3_XXS: return "IQ3_XXS";
	case Q4KH_TYPE_IQ3_S: return "IQ3_S";
	case Q4KH_TYPE_IQ1_S: return "IQ1_S";
	case Q4KH_TYPE_IQ1_M: return "IQ1_M";
	case Q4KH_TYPE_IQ4_NL: return "IQ4_NL";
	case Q4KH_TYPE_IQ4_XS: return "IQ4_XS";
	case Q4KH_TYPE_TQ1_0: return "TQ1_0";
	case Q4KH_TYPE_TQ2_0: return "TQ2_0";
	case Q4KH_TYPE_MXFP4: return "MXFP4";
	case Q4KH_TYPE_NVFP4: return "NVFP4";
	case Q4KH_TYPE_Q1_0: return "Q1_0";
	case Q4KH_TYPE_Q2_0: return "Q2_0";
	case Q4KH_TYPE_I8: return "I8";
	case Q4KH_TYPE_I16: return "I16";
	case Q4KH_TYPE_I32: return "I32";
	case Q4KH_TYPE_I64: return "I64";
	case Q4KH_TYPE_F64: return "F64";
	default: return NULL;
	}
}

#ifdef __cplusplus
}
#endif

#endif /* Q4KHOST_QUANT_H */
