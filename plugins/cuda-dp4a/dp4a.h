/*
 * cuda-dp4a: Q4_K and Q6_K GEMV with activations quantised to int8 blocks
 * of 32 and __dp4a integer dot products (dp4a_kernels.cu; several matrices
 * in one launch, and gate, up and their activation: dp4a_fused.cu), behind
 * the shared variant table (q4khost/cuda_variant.h).
 */
#ifndef Q4KH_CUDA_DP4A_H
#define Q4KH_CUDA_DP4A_H

#include "q4khost/cuda_variant.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The most shared memory a block's int8 activations take (the default
 * limit of a launch, with no opt-in): K = 4096 up to 8 columns, K = 14336
 * up to 2 (Llama-3-8B's ffn_down in a decode step).
 */
#define DP4A_SHARED_MOST (48 << 10)

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

/* Bytes of one row of K values in the Q6_K copy (224 per 256 values). */
int64_t dp4a_q6k_row_bytes(int64_t k);

/*
 * Enqueue on stream s the copy of Q6_K weight w (w->src, w->src_stride)
 * into DST (dp4a_q6k_row_bytes(w->k) * w->n bytes): the layout its
 * kernels read (q4khost/cuda_q6k_device.cuh). Returns the launch's error.
 */
cudaError_t dp4a_q6k_copy(const q4kh_prepared *w, void *dst, cudaStream_t s);

/*
 * Enqueue on stream s y = W x with WARPS warps per block: in one launch
 * when dp4a_one_launch, else quantising io's columns into SCRATCH
 * (dp4a_scratch_bytes; unused, may be NULL, in one launch) first.
 * w->data: Q4_K rows w->stride bytes apart, both 16-byte aligned, or the
 * Q6_K copy (dp4a_q6k_copy). Returns
 * the first launch error.
 */
cudaError_t dp4a_launch(const q4kh_prepared *w, const struct q4kh_cv_io *io,
                        void *scratch, int warps, cudaStream_t s);

/*
 * Load dp4a_multi_launch's and dp4a_glu_launch's kernels on the current
 * device (dp4a_fused.cu). The first error, or cudaSuccess.
 */
cudaError_t dp4a_fused_preload(void);

/*
 * Enqueue gemv_multi's N (1 .. Q4KH_GEMV_MULTI_MAX) products io on stream
 * s as one launch of WARPS warps per block: w[i] Q4_K (rows in place) or
 * Q6_K (the copy, dp4a_q6k_copy), all of one K,
 * prepared on one device, io->cols 1 .. Q4KH_CV_MAX_COLUMNS.
 * cudaErrorInvalidValue, enqueuing nothing, unless dp4a_one_launch(K,
 * io->cols); else the launch's error.
 */
cudaError_t dp4a_multi_launch(uint32_t n, const q4kh_prepared *const w[],
                              const struct q4kh_cv_multi_io *io, int warps,
                              cudaStream_t s);

/*
 * Enqueue gemv_glu's y = act(gate x) * (up x) (io->y {N, cols}, cols 1 ..
 * Q4KH_CV_MAX_COLUMNS) on stream s as one launch of WARPS warps per block,
 * act SiLU with SILU, else the tanh GELU (q4khost/cuda_glu.cuh): gate and
 * up of one type, Q4_K or Q6_K (the copy), one K and N, prepared on one device. cudaErrorInvalidValue,
 * enqueuing nothing, for mixed types or shapes or unless
 * dp4a_one_launch(K, io->cols); else the launch's error.
 */
cudaError_t dp4a_glu_launch(int silu, const q4kh_prepared *gate,
                            const q4kh_prepared *up, const struct q4kh_cv_io *io,
                            int warps, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
