/*
 * Bounds on the error of a GPU product y = w x against its exact value,
 * derived from the kernels' arithmetic, for the suites that judge the
 * cuda backend's and the CUDA kernel variants' products element by
 * element (tests/test_cuda_weight_types.c, tests/cuda_variant_rig.c).
 *
 * For an element of row r and column x, let s_g be the largest magnitude
 * a value of group g (32 consecutive values) of row r can take in its
 * format (group_ranges), S = sum_g s_g sum_{i in g} |x_i| (at least
 * sum_i |w_i x_i|, and at least a quarter of what the parts any kernel
 * sums add up to: cuda-mwv's Q4_K sums 32 d sc (1/2 + q/32) and
 * 16 d sc + dmin m, at most 3.2 s_g), u = 2^-24. Then
 *  - the fp32 GEMV kernels (the backend's built-in ones, and a variant's
 *    gemv and gemm below its tensor-core columns): a term passes at most
 *    h = 41 + 4 ceil(K / 1024) roundings (32 fmas within its piece of 32
 *    values, 4 a piece into its lane's sum for ceil(K / 1024) pieces, 5
 *    levels of the warp's butterfly, 4 products of scales or the rounding
 *    of a min), each within u of a partial sum of magnitude at most 4 S,
 *    and the reference's double sum rounds once: (1 + 4 h) u S;
 *  - the tensor-core product (q4khost/cuda_tc.h) dequantises each weight in fp32
 *    (u s_g) and rounds it and the activations to fp16 (2^-11 of each, or
 *    2^-25 for a weight below fp16's normal range), multiplies exactly and
 *    sums in fp32 whose additions may truncate (2u each), in an order
 *    cuBLAS does not document, so up to K of them:
 *    (2^-10 + 2^-22 + 2u + 2u K) S + 2^-25 sum |x|.
 */
#ifndef Q4KH_TEST_PRODUCT_BOUNDS_H
#define Q4KH_TEST_PRODUCT_BOUNDS_H

#include <stdint.h>

#define BOUND_GROUP 32 /* values of a group of the bounds */

/*
 * s_g of every group of 32 values of N packed rows W of K values of TYPE
 * (any weight type q4khost runs; K a multiple of 32), row by row; for
 * F32, F16 and BF16 the largest |value| of the group. free() them; fails
 * the test (Criterion) for another type.
 */
double *group_ranges(uint32_t type, const uint8_t *w, int64_t k, int64_t n);

/* The fp32 GEMV's bound (above) for rows of K values and S. */
double gemv_bound(int64_t k, double s);

/* The tensor cores' bound (above) for K, S and XSUM = sum |x| of the column. */
double tc_bound(int64_t k, double s, double xsum);

#endif
