/*
 * Batched products on tensor cores (cuda_tc.h): weight slices dequantised
 * to fp16 by cuda_quant.cuh's q4kh_load_group, activations rounded to fp16, and
 * cublasGemmEx with fp32 accumulation writing y.
 */
#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "q4khost/cuda_preload.cuh"
#include "q4khost/cuda_quant.cuh"
#include "q4khost/cuda_tc.h"

#define TC_THREADS 256

static size_t align256(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

/* Rows of the weight per slice: Q4KH_TC_SLICE bytes of fp16, at least 1. */
static int64_t slice_rows(int64_t k, int64_t n)
{
	int64_t r = (int64_t)(Q4KH_TC_SLICE / (2 * (size_t)k));

	return r < 1 ? 1 : r > n ? n : r;
}

/* One thread per (row, group of 32 values): out's row r holds the K
 * values of w's row r, rounded to fp16. */
template <uint32_t TYPE>
static __global__ void __launch_bounds__(TC_THREADS)
dequant_kernel(const uint8_t *w, int64_t w_row, int64_t k, int64_t rows,
               __half *out)
{
	const int64_t groups = (k + 31) / 32;

	for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     it < rows * groups; it += (int64_t)gridDim.x * blockDim.x) {
		const int64_t r = it / groups, g = it % groups;
		__half *o = out + r * k + 32 * g;
		float v[32];
		const int cnt = q4kh_load_group<TYPE>(w + r * w_row, g, k, v);

		if (cnt == 32 && k % 8 == 0) {
			/* 16-byte stores: rows of a multiple of 8 halves */
#pragma unroll
			for (int i = 0; i < 32; i += 8) {
				__half2 h[4];

#pragma unroll
				for (int j = 0; j < 4; j++)
					h[j] = __floats2half2_rn(v[i + 2 * j], v[i + 2 * j + 1]);
				*(uint4 *)(o + i) = *(const uint4 *)h;
			}
		} else {
			for (int i = 0; i < cnt; i++)
				o[i] = __float2half_rn(v[i]);
		}
	}
}

/* out's column t (K halves, contiguous) = x's column t rounded to fp16,
 * for the T columns. */
static __global__ void __launch_bounds__(TC_THREADS)
to_half_kernel(const float *x, int64_t ldx, int64_t k, int64_t T, __half *out)
{
	for (int64_t t = blockIdx.y; t < T; t += gridDim.y)
		for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < k;
		     i += (int64_t)gridDim.x * blockDim.x)
			out[t * k + i] = __float2half_rn(x[t * ldx + i]);
}

static unsigned blocks_for(int64_t items)
{
	const int64_t b = (items + TC_THREADS - 1) / TC_THREADS;

	return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

extern "C" int q4kh_tc_supports(uint32_t type)
{
	return type != Q4KH_TYPE_F32 && type != Q4KH_TYPE_F16 && type != Q4KH_TYPE_BF16 &&
	       q4kh_for_type(type, [](auto) { return cudaSuccess; }) == cudaSuccess;
}

extern "C" int q4kh_tc_wanted(uint32_t type, int64_t t, int64_t min_columns)
{
	return t >= min_columns && q4kh_tc_supports(type);
}

extern "C" size_t q4kh_tc_scratch_bytes(int64_t k, int64_t n, int64_t t)
{
	return align256(2 * (size_t)k * (size_t)t) +
	       align256(2 * (size_t)k * (size_t)slice_rows(k, n)) + Q4KH_TC_WORKSPACE;
}

/* Load to_half_kernel and every type's dequant_kernel: the first error. */
static cudaError_t preload_all(void)
{
	cudaError_t e = q4kh_preload(to_half_kernel);

	for (uint32_t t = 0; t < Q4KH_TYPE_COUNT && e == cudaSuccess; t++)
		if (q4kh_tc_supports(t))
			e = q4kh_for_type(t, [](auto ty) {
				return q4kh_preload(dequant_kernel<decltype(ty)::value>);
			});
	return e;
}

extern "C" int q4kh_tc_open(void **handle, char *why, size_t cap)
{
	cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	cublasHandle_t h = NULL;
	cublasStatus_t st;

	/* cublasCreate allocates: not on a thread that captures thread-locally */
	cudaThreadExchangeStreamCaptureMode(&mode);
	st = cublasCreate(&h);
	cudaThreadExchangeStreamCaptureMode(&mode);
	if (st != CUBLAS_STATUS_SUCCESS) {
		snprintf(why, cap, "cublasCreate: %s", cublasGetStatusString(st));
		*handle = NULL;
		return -1;
	}
	*handle = h;
	return 0;
}

extern "C" int q4kh_tc_warm(int ordinal, void **handle)
{
	char why[256];

	*handle = NULL;
	if (cudaSetDevice(ordinal) != cudaSuccess) {
		cudaGetLastError();
		return -1;
	}
	if (q4kh_tc_open(handle, why, sizeof(why)))
		*handle = NULL;
	preload_all();
	cudaGetLastError();
	return 0;
}

extern "C" void q4kh_tc_close(void *handle)
{
	if (handle)
		cublasDestroy((cublasHandle_t)handle);
}

static int cuda_failed(cudaError_t e, const char *step, char *why, size_t cap)
{
	if (e == cudaSuccess)
		return 0;
	snprintf(why, cap, "%s: %s (%s)", step, cudaGetErrorName(e),
	         cudaGetErrorString(e));
	return -1;
}

static int blas_failed(cublasStatus_t st, const char *step, char *why, size_t cap)
{
	if (st == CUBLAS_STATUS_SUCCESS)
		return 0;
	snprintf(why, cap, "%s: %s", step, cublasGetStatusString(st));
	return -1;
}

/* The parts of SCRATCH (q4kh_tc_scratch_bytes(K, N, T)): the fp16
 * activations, one fp16 slice of the weight, cuBLAS's workspace. */
struct tc_parts {
	__half *x16, *w16;
	void *ws;
};

static struct tc_parts parts_of(void *scratch, int64_t k, int64_t n, int64_t t)
{
	struct tc_parts p;

	p.x16 = (__half *)scratch;
	p.w16 = (__half *)((char *)scratch + align256(2 * (size_t)k * (size_t)t));
	p.ws = (char *)p.w16 + align256(2 * (size_t)k * (size_t)slice_rows(k, n));
	return p;
}

/* Check the sizes against cuBLAS's ints, then give cuBLAS stream S and
 * the workspace of P. */
static int blas_begin(cublasHandle_t h, int64_t k, int64_t n, int64_t t,
                      int64_t ldy, const struct tc_parts *p, cudaStream_t s,
                      char *why, size_t cap)
{
	if (t > INT32_MAX || k > INT32_MAX || n > INT32_MAX || ldy > INT32_MAX) {
		snprintf(why, cap, "tensor-core product of %lld x %lld by %lld "
		         "columns: beyond cuBLAS's int sizes", (long long)n,
		         (long long)k, (long long)t);
		return -1;
	}
	return blas_failed(cublasSetStream(h, s), "cublasSetStream", why, cap) ||
	       blas_failed(cublasSetWorkspace(h, p->ws, Q4KH_TC_WORKSPACE),
	                   "cublasSetWorkspace", why, cap)
	               ? -1
	               : 0;
}

/* y {M, T} (column stride LDY) = the slice w16 {K, M} times x16 {K, T}. */
static int slice_gemm(cublasHandle_t h, int64_t m, int64_t t, int64_t k,
                      const struct tc_parts *p, float *y, int64_t ldy,
                      char *why, size_t cap)
{
	const float one = 1.0f, zero = 0.0f;

	return blas_failed(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)t,
	                                (int)k, &one, p->w16, CUDA_R_16F, (int)k,
	                                p->x16, CUDA_R_16F, (int)k, &zero, y,
	                                CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
	                                CUBLAS_GEMM_DEFAULT),
	                   "cublasGemmEx", why, cap);
}

extern "C" size_t q4kh_tc_warm_bytes(int64_t k, int64_t n, int64_t t)
{
	return q4kh_tc_scratch_bytes(k, n, t) +
	       align256(4 * (size_t)slice_rows(k, n) * (size_t)t);
}

extern "C" int q4kh_tc_warm_gemm(void *handle, int64_t k, int64_t n, int64_t t,
                                 void *scratch, cudaStream_t s, char *why,
                                 size_t cap)
{
	cublasHandle_t h = (cublasHandle_t)handle;
	const int64_t rows = slice_rows(k, n);
	const struct tc_parts p = parts_of(scratch, k, n, t);
	float *y = (float *)((char *)scratch + q4kh_tc_scratch_bytes(k, n, t));

	if (blas_begin(h, k, n, t, rows, &p, s, why, cap) ||
	    slice_gemm(h, rows, t, k, &p, y, rows, why, cap) ||
	    (n % rows && slice_gemm(h, n % rows, t, k, &p, y, n % rows, why, cap)))
		return -1;
	return cuda_failed(cudaStreamSynchronize(s), "cudaStreamSynchronize", why, cap);
}

extern "C" int q4kh_tc_gemm(void *handle, uint32_t type, const uint8_t *w,
                            int64_t w_row, int64_t k, int64_t n, const float *x,
                            int64_t ldx, float *y, int64_t ldy, int64_t t,
                            void *scratch, cudaStream_t s, char *why, size_t cap)
{
	cublasHandle_t h = (cublasHandle_t)handle;
	const int64_t rows = slice_rows(k, n);
	const struct tc_parts p = parts_of(scratch, k, n, t);
	__half *x16 = p.x16, *w16 = p.w16;

	if (blas_begin(h, k, n, t, ldy, &p, s, why, cap))
		return -1;
	to_half_kernel<<<dim3(blocks_for(k), (unsigned)(t < 65535 ? t : 65535)), TC_THREADS,
	                 0, s>>>(x, ldx, k, t, x16);
	if (cuda_failed(cudaGetLastError(), "activations to fp16", why, cap))
		return -1;
	for (int64_t r0 = 0; r0 < n; r0 += rows) {
		const int64_t m = n - r0 < rows ? n - r0 : rows;
		const cudaError_t e = q4kh_for_type(type, [&](auto ty) {
			constexpr uint32_t T = decltype(ty)::value;

			dequant_kernel<T><<<blocks_for(m * ((k + 31) / 32)), TC_THREADS, 0, s>>>(
				w + r0 * w_row, w_row, k, m, w16);
			return cudaGetLastError();
		});

		if (cuda_failed(e, "weight slice to fp16", why, cap) ||
		    slice_gemm(h, m, t, k, &p, y + r0, ldy, why, cap))
			return -1;
	}
	return 0;
}
