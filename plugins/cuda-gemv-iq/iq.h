/*
 * cuda-gemv-iq: GEMV for the 4-bit i-quants IQ4_NL and IQ4_XS with fp32
 * activations (iq_kernels.cu), behind the shared variant table
 * (q4khost/cuda_variant.h). Weights are repacked once by prepare into 16-byte code
 * pieces and separate scales.
 */
#ifndef Q4KH_CUDA_IQ_H
#define Q4KH_CUDA_IQ_H

#include "q4khost/cuda_variant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaSuccess when this build has code for the current device. */
cudaError_t iq_probe(void);

/*
 * Load iq_repack's and iq_launch's kernels (both formats) on the current
 * device, for the variant's preload (q4khost/cuda_variant.h). The first
 * error, or cudaSuccess.
 */
cudaError_t iq_preload(void);

/* Device bytes the repacked copy of a {K, N} weight of TYPE takes. */
size_t iq_repacked_bytes(uint32_t type, int64_t k, int64_t n);

/*
 * Enqueue on stream s the repacking of w's rows (w->src, w->src_stride)
 * into DST (iq_repacked_bytes, 16-byte aligned). Returns the launch error.
 */
cudaError_t iq_repack(const q4kh_prepared *w, void *dst, cudaStream_t s);

/*
 * Enqueue y = W x for io->cols (1 .. Q4KH_CV_MAX_COLUMNS) columns on stream s,
 * with WARPS warps per block; w->data is the repacked copy. Returns the
 * launch error.
 */
cudaError_t iq_launch(const q4kh_prepared *w, const struct q4kh_cv_io *io,
                      int warps, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
