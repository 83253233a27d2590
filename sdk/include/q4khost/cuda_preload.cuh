/*
 * Kernels loaded ahead of their first launch, header-only host code for
 * nvcc. CUDA_MODULE_LOADING=LAZY (the default, which q4khost keeps) loads
 * each kernel at its first launch, so a device's first step waits for
 * every kernel it meets; a warm-up thread that calls q4kh_preload while
 * the weights go up takes that off the step: the cuda backend's
 * device_open and the variant table's first prepare on a device
 * (q4khost/cuda_variant.h) start one.
 */
#ifndef Q4KHOST_CUDA_PRELOAD_CUH
#define Q4KHOST_CUDA_PRELOAD_CUH

#include <cuda_runtime_api.h>

/*
 * Load each kernel K (a __global__ function, or an instance of a
 * template one) on the current device now, as its first launch would
 * (cudaFuncGetAttributes). Thread-safe: the loads may race the kernels'
 * launches on other threads. The first error, or cudaSuccess; a kernel's
 * launch reports its error again.
 */
template <typename... K>
static cudaError_t q4kh_preload(K... k)
{
	struct cudaFuncAttributes a;
	cudaError_t e = cudaSuccess;

	((e = e == cudaSuccess ? cudaFuncGetAttributes(&a, (const void *)k) : e), ...);
	return e;
}

#endif
