/*
 * Q4_K GEMV with fp32 activations: the streaming shape of q4khost/cuda_variant_device.cuh,
 * the pieces of q4khost/cuda_q4k_device.cuh.
 *
 * A weight is d sc q - dmin m with q a 4-bit code, so the 16 weights of
 * one half piece (one sub-block) times x come to
 *   d sc sum q x  -  dmin m sum x.
 * sum q x costs one byte permute and one fma per code and column: the
 * permute puts q (shifted left 3) under the exponent of 0.5, making the
 * float 0.5 + q / 32 exactly, so the fma chain gives A = S / 2 + sum q x
 * / 32 with S = sum x, and sum q x = 32 A - 16 S. S is summed once per
 * column for all R rows. Everything is fp32 and exact but for rounding
 * (the test bound is an NMSE of 1e-6; this is near 1e-11): no int8
 * activations, so massive activation channels cost nothing.
 */
#include "mwv.h"
#include "mwv_q4k.cuh"

extern "C" cudaError_t mwv_probe(void)
{
	cudaFuncAttributes a;

	return cudaFuncGetAttributes(&a, q4kh_cv_stream_kernel<1, 1, 2, mwv_dot>);
}

extern "C" cudaError_t mwv_q4k_preload(void)
{
	return q4kh_cv_stream_preload<mwv_dot>();
}

extern "C" cudaError_t mwv_launch(const q4kh_prepared *w, const q4kh_cv_io *io,
                                  int warps, cudaStream_t s)
{
	return mwv_stream_gemv(mwv_dot(), w, io, warps, s);
}
