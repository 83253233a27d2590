/*
 * cuda-dp4a: Q4_K GEMV with activations quantised to int8 blocks of 32 and
 * __dp4a integer dot products (dp4a_kernels.cu), behind the shared variant
 * table (q4khost/cuda_variant.h).
 */
#ifndef Q4KH_CUDA_DP4A_H
#define Q4KH_CUDA_DP4A_H

#include "q4khost/cuda_variant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaSuccess when this build has code for the current device. */
cudaError_t dp4a_probe(void);

/*
 * Load dp4a_launch's kernels on the current device, for the variant's
 * preload (q4khost/cuda_variant.h). The first error, or cudaSuccess.
 */
cudaError_t dp4a_preload(void);

/*
 * 1 when dp4a_launch multiplies K x COLS in one launch, its blocks making
 * the int8 activations in their shared memory (dp4a.cuh); 0 when it needs
 * scratch for them (dp4a_scratch_bytes).
 */
int dp4a_one_launch(int64_t k, int64_t cols);

/*
 * Device bytes of scratch for io->cols columns of K values: the int8
 * codes, then one {scale, scale * sum of codes} float pair per 32 values.
 */
size_t dp4a_scratch_bytes(int64_t k, int64_t cols);

/*
 * Enqueue on stream s y = W x with WARPS warps per block: in one launch
 * when dp4a_one_launch, else quantising io's columns into SCRATCH
 * (dp4a_scratch_bytes; unused, may be NULL, in one launch) first.
 * w->data: Q4_K rows w->stride bytes apart, both 16-byte aligned. Returns
 * the first launch error.
 */
cudaError_t dp4a_launch(const q4kh_prepared *w, const struct q4kh_cv_io *io,
                        void *scratch, int warps, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
