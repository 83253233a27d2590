/*
 * The reference's dequantisation: one row of GGUF blocks to f32, exactly
 * as the in-tree cpu backend (the F2 reference) reads weights, in the
 * SDK's static library (libq4khost_sdk.a, pkg-config q4khost-plugin;
 * dequant.c). Block layouts: q4khost/quant.h. Every product is exact in
 * f32 (an fp16 scale has 11 significant bits, the integer factors at most
 * 13 together), so the only rounding is the addition of the min in Q4_1
 * and Q5_1 and its subtraction in Q2_K, Q4_K and Q5_K, as in ggml and
 * gguf-py; the library is built with -ffp-contract=off, so the values are
 * the same bits on every machine. A backend that decodes through it gives
 * the reference's weights bit for bit.
 *
 * Pure functions of their arguments: thread-safe.
 */
#ifndef Q4KHOST_DEQUANT_H
#define Q4KHOST_DEQUANT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when q4kh_dequant_row decodes TYPE (a Q4KH_TYPE_*), else 0. */
int q4kh_dequant_supported(uint32_t type);

/* The types q4kh_dequant_row decodes, as Q4KH_TYPE_BIT()s (contract.h):
 * F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K, IQ4_NL and
 * IQ4_XS. */
uint32_t q4kh_dequant_types(void);

/*
 * OUT[0..K) = the K values of one row of TYPE that starts at ROW, in the
 * GGUF block layout (K a multiple of the type's block, q4kh_type_block_elems;
 * the row is K / block * q4kh_type_block_bytes bytes, at any address: block fields are read bytewise).
 * TYPE must be one q4kh_dequant_supported accepts: there is no error
 * return, and another type is undefined behaviour. OUT must not overlap
 * ROW.
 */
void q4kh_dequant_row(uint32_t type, const void *row, float *out, int64_t k);

#ifdef __cplusplus
}
#endif

#endif
