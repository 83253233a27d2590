/*
 * cuda-mwv: Q4_K, Q6_K, Q5_0 and Q8_0 GEMV with fp32 activations, warps
 * streaming rows (mwv_kernels.cu, mwv_q6k_kernels.cu, mwv_b32_kernels.cu;
 * several matrices in one launch: mwv_multi.cu; gate, up and their
 * activation: mwv_glu.cu), behind the shared variant table
 * (q4khost/cuda_variant.h).
 */
#ifndef Q4KH_CUDA_MWV_H
#define Q4KH_CUDA_MWV_H

#include "q4khost/cuda_variant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaSuccess when this build has code for the current device. */
cudaError_t mwv_probe(void);

/*
 * Load on the current device the kernels of mwv_launch (mwv_kernels.cu),
 * of mwv_q6k_pack and mwv_q6k_launch (mwv_q6k_kernels.cu), of
 * mwv_b32_pack and mwv_b32_launch (mwv_b32_kernels.cu), of
 * mwv_multi_launch (mwv_multi.cu) and of mwv_glu_launch (mwv_glu.cu), for
 * the variant's preload (q4khost/cuda_variant.h). The first error, or
 * cudaSuccess.
 */
cudaError_t mwv_q4k_preload(void);
cudaError_t mwv_q6k_preload(void);
cudaError_t mwv_b32_preload(void);
cudaError_t mwv_multi_preload(void);
cudaError_t mwv_glu_preload(void);

/*
 * Enqueue y = W x for io->cols (1 .. Q4KH_CV_MAX_COLUMNS) columns on stream s,
 * with WARPS warps per block. w->data: Q4_K rows w->stride bytes apart,
 * both 16-byte aligned. Returns the launch's error.
 */
cudaError_t mwv_launch(const q4kh_prepared *w, const struct q4kh_cv_io *io,
                       int warps, cudaStream_t s);

/* Bytes of one row of K values in the Q6_K copy (224 per 256 values). */
int64_t mwv_q6k_row_bytes(int64_t k);

/*
 * Enqueue on stream s the copy of Q6_K weight w (w->src, w->src_stride)
 * into DST (mwv_q6k_row_bytes(w->k) * w->n bytes). Returns the launch's
 * error.
 */
cudaError_t mwv_q6k_pack(const q4kh_prepared *w, void *dst, cudaStream_t s);

/* As mwv_launch for the Q6_K copy (w->data, w->stride from prepare). */
cudaError_t mwv_q6k_launch(const q4kh_prepared *w, const struct q4kh_cv_io *io,
                           int warps, cudaStream_t s);

/* Bytes of one row of K values of TYPE (Q5_0 or Q8_0) in the copy. */
int64_t mwv_b32_row_bytes(uint32_t type, int64_t k);

/*
 * Enqueue on stream s the copy of Q5_0 or Q8_0 weight w (w->src,
 * w->src_stride) into DST (mwv_b32_row_bytes(w->type, w->k) * w->n bytes,
 * 16-byte aligned). Returns the launch's error.
 */
cudaError_t mwv_b32_pack(const q4kh_prepared *w, void *dst, cudaStream_t s);

/* As mwv_launch for the copy of a Q5_0 or Q8_0 weight. */
cudaError_t mwv_b32_launch(const q4kh_prepared *w, const struct q4kh_cv_io *io,
                           int warps, cudaStream_t s);

/*
 * Enqueue gemv_multi's N (1 .. Q4KH_GEMV_MULTI_MAX) products io on stream
 * s as one launch of WARPS warps per block: w[i] Q4_K (rows in place),
 * Q6_K, Q5_0 or Q8_0 (the copies), types mixed, all of one K, prepared on
 * one device; io->cols 1 .. Q4KH_CV_MAX_COLUMNS. Returns the launch's
 * error.
 */
cudaError_t mwv_multi_launch(uint32_t n, const q4kh_prepared *const w[],
                             const struct q4kh_cv_multi_io *io, int warps,
                             cudaStream_t s);

/*
 * Enqueue gemv_glu's y = act(gate x) * (up x) (io->y {N, cols}, cols 1 ..
 * Q4KH_CV_MAX_COLUMNS) on stream s as one launch of WARPS warps per block, act
 * SiLU with SILU, else the tanh GELU (q4khost/cuda_glu.cuh): gate and up of one
 * type, Q4_K (rows in place), Q6_K, Q5_0 or Q8_0 (the copies), one K and
 * N, prepared on one device. cudaErrorInvalidValue for mixed types or
 * shapes.
 */
cudaError_t mwv_glu_launch(int silu, const q4kh_prepared *gate,
                           const q4kh_prepared *up, const struct q4kh_cv_io *io,
                           int warps, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus /* the kernels' files */
#include "q4khost/cuda_variant_device.cuh"

/*
 * gemv of io on stream s through format F (its fields w, stride, pieces
 * = K / 32, x, ldx set here from w->data, w->stride and io): the body of
 * mwv_launch, mwv_q6k_launch and mwv_b32_launch.
 */
template <class F>
static cudaError_t mwv_stream_gemv(F f, const q4kh_prepared *w, const struct q4kh_cv_io *io,
                                   int warps, cudaStream_t s)
{
	f.w = (const uint8_t *)w->data;
	f.stride = w->stride;
	f.pieces = (int)(w->k / 32);
	f.x = io->x;
	f.ldx = io->ldx;
	return q4kh_cv_stream_launch(f, (int)io->cols, w->n, io->y, io->ldy, warps,
	                             w->multiprocessors, io->pdl != 0, s);
}
#endif

#endif
