/*
 * Q6_K GEMV with fp32 activations (cuda-mwv), in the streaming shape of
 * q4khost/cuda_variant_device.cuh.
 *
 * The copy of prepare (q4khost/cuda_q6k_device.cuh) gives each piece its
 * three 8-byte loads. Each group of 8 values meets its own int8 scale;
 * q - 32 comes out of one byte permute and one
 * subtraction, exactly, and every weight d * sc * (q - 32) is applied as
 * the cpu reference does, up to fp32 accumulation.
 */
#include "mwv.h"
#include "mwv_q6k.cuh"

extern "C" int64_t mwv_q6k_row_bytes(int64_t k)
{
	return q4kh_q6k_row_bytes(k);
}

extern "C" cudaError_t mwv_q6k_pack(const q4kh_prepared *w, void *dst,
                                    cudaStream_t s)
{
	return q4kh_q6k_copy(w, dst, s);
}

extern "C" cudaError_t mwv_q6k_preload(void)
{
	const cudaError_t e = q4kh_preload(q4kh_q6k_copy_kernel);

	return e != cudaSuccess ? e : q4kh_cv_stream_preload<q6k_format>();
}

extern "C" cudaError_t mwv_q6k_launch(const q4kh_prepared *w, const q4kh_cv_io *io,
                                      int warps, cudaStream_t s)
{
	return mwv_stream_gemv(q6k_format(), w, io, warps, s);
}
