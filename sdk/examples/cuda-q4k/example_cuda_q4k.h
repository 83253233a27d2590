/*
 * What the CUDA half of example-cuda-q4k (example_cuda_q4k_kernels.cu)
 * offers its C half (example_cuda_q4k.c).
 */
#ifndef EXAMPLE_CUDA_Q4K_H
#define EXAMPLE_CUDA_Q4K_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * y[:, t] = W x[:, t] for t < cols, enqueued on STREAM (the cudaStream_t
 * the backend lends) of CUDA device ORDINAL; returns before the work ends.
 * W: n rows of k / 256 Q4_K blocks (quant.h), row_bytes apart, in device
 * memory; x: column t at x + t * ldx floats; y: column t at y + t * ldy
 * floats. Returns 0, or -1 with CUDA's error text in err (cap bytes).
 */
int ex_q4k_launch(int ordinal, void *stream, const void *w, int64_t k,
                  int64_t n, int64_t row_bytes, const float *x, int64_t ldx,
                  float *y, int64_t ldy, int64_t cols, char *err, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
