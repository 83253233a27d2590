/*
 * Batched products on tensor cores, in the SDK's CUDA library
 * (libq4khost_sdk_cuda.a, pkg-config q4khost-plugin-cuda; sdk/lib/cuda_tc.cu),
 * for a prompt's many columns: the in-tree cuda backend's built-in
 * mul_mat and every CUDA kernel variant's gemm use it, and a vendor's
 * variant may too (sdk/examples/cuda-q4k):
 *
 *   y {N, T} = w {K, N} x {K, T}
 *
 * The weight's rows are dequantised to fp16, a slice of Q4KH_TC_SLICE
 * bytes at a time, the activations rounded to fp16 once per call, and
 * cuBLAS (cublasGemmEx, fp16 inputs, fp32 accumulation and output) forms
 * each slice's rows of y. The weight's values are the format's (the same
 * floats as q4khost/cuda_quant.cuh's q4kh_load_group), rounded once to fp16; an
 * activation larger than fp16's 65504 becomes infinite, which F2 sees as
 * a failed check. Fewer columns than the caller's hand-over stay on the
 * GEMV kernels: there the fp16 copy of the weight costs more than reading
 * the packed weight once per tile of columns.
 *
 * Memory: the caller lends q4kh_tc_scratch_bytes() of device scratch
 * (the fp16 activations, one fp16 slice of the weight and cuBLAS's
 * workspace); nothing is allocated per call, so a call can be recorded
 * into a CUDA graph once the handle exists. The handle is one cuBLAS
 * context per device, made by q4kh_tc_open() on that device. Both the
 * handle (cuBLAS's start) and the kernels' first loads cost a first call
 * far more than a later one: a caller that can calls q4kh_tc_warm() on a
 * thread of its own before its first prompt (the cuda backend's
 * device_open, the variant table's first prepare).
 *
 * Threads: a handle is used by one thread at a time (the plugins' T1
 * rule); every call is enqueued on the stream it is given.
 *
 * The library holds GPU code for the architectures q4khost was built for
 * (pkg-config --variable=cuda_archs q4khost-plugin-cuda); on another
 * device q4kh_tc_gemm fails with cudaErrorNoKernelImageForDevice in WHY.
 * Link -lcublas -lcudart -lstdc++ after the library.
 */
#ifndef Q4KHOST_CUDA_TC_H
#define Q4KHOST_CUDA_TC_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Columns from which the built-in kernels' products go to tensor cores,
 * and a variant's unless it sets its own (q4kh_cv_variant.tc_min_columns):
 * measured on an H200 (docs/perf.md, 2026-12-03), a prompt of 16 tokens
 * costs the same either way on the Llama-3-8B and Qwen2.5-1.5B shapes,
 * one of 17 to 31 less on tensor cores. A model's probe of 64 tokens
 * passes it, so F2 judges this path. */
#define Q4KH_TC_MIN_COLUMNS 17

/* Bytes of fp16 weight dequantised per cuBLAS call (at least one row). */
#define Q4KH_TC_SLICE ((size_t)64 << 20)

/* Scratch of cuBLAS per call; the size NVIDIA advises for Hopper. */
#define Q4KH_TC_WORKSPACE ((size_t)32 << 20)

/* 1 when TYPE's rows can be dequantised here: every quantised type of
 * q4khost/cuda_quant.cuh. F32, F16 and BF16 weights stay on the fp32 kernels:
 * their products are held to fp32 accuracy (conformance's 1e-7), which
 * fp16 activations would not meet (nor fp16 BF16's range). */
int q4kh_tc_supports(uint32_t type);

/* 1 when a product of T columns of TYPE goes to tensor cores, for a
 * caller whose hand-over is MIN_COLUMNS (T >= MIN_COLUMNS). */
int q4kh_tc_wanted(uint32_t type, int64_t t, int64_t min_columns);

/* Bytes of scratch q4kh_tc_gemm needs for K, N and T (256-aligned parts). */
size_t q4kh_tc_scratch_bytes(int64_t k, int64_t n, int64_t t);

/*
 * *HANDLE = a cuBLAS context for the current device, on which calls may
 * later be recorded into graphs. Safe while the calling thread captures a
 * stream: it leaves capture's thread-local mode for the allocations.
 * 0 on success; else -1 and WHY (CAP bytes) reads "cublasCreate: ...".
 */
int q4kh_tc_open(void **handle, char *why, size_t cap);

/*
 * A warm-up thread's share of this library: make CUDA device ORDINAL the
 * calling thread's current device, then *HANDLE = q4kh_tc_open's handle
 * (NULL when it could not be made: the first product makes it, or names
 * why not), then load this library's kernels (the activations' rounding
 * and the dequantiser of every type q4kh_tc_supports; q4khost/
 * cuda_preload.cuh), so that a first q4kh_tc_gemm waits for no module
 * load; the thread's CUDA error is cleared. Thread-safe.
 * 0, or -1 when the device could not be made current (*HANDLE NULL,
 * nothing loaded).
 */
int q4kh_tc_warm(int ordinal, void **handle);

/* Columns of a warm-up's products (q4kh_tc_warm_gemm): a prompt's chunk
 * on a GPU, the batch a host session takes by default on a backend that
 * is not of kind "cpu" (host/lib/session.c). */
#define Q4KH_TC_WARM_COLUMNS 512

/* Bytes of device scratch q4kh_tc_warm_gemm needs for K, N and T: what
 * q4kh_tc_gemm needs, then one slice's rows of y. */
size_t q4kh_tc_warm_bytes(int64_t k, int64_t n, int64_t t);

/*
 * A warm-up thread's product for one weight shape: the cuBLAS products
 * q4kh_tc_gemm would run for a weight {K, N} times T columns (one per
 * height of its slices: a full slice and the last one), enqueued on
 * stream S with HANDLE, on SCRATCH (q4kh_tc_warm_bytes(K, N, T) bytes of
 * device memory, whatever they hold; the results are not kept), then S
 * synchronised. cuBLAS chooses and loads its kernels for a shape at its
 * first call; after this call a product of that shape, and of nearly
 * that many columns, waits for neither. 0, or -1 and WHY as q4kh_tc_gemm.
 */
int q4kh_tc_warm_gemm(void *handle, int64_t k, int64_t n, int64_t t,
                      void *scratch, cudaStream_t s, char *why, size_t cap);

/* Free a handle of q4kh_tc_open (NULL: nothing), on its device. */
void q4kh_tc_close(void *handle);

/*
 * Enqueue y = w x on stream S. w: N rows of K values of TYPE, row r at
 * w + r W_ROW (device memory, the GGUF block layout); x: T columns of K
 * floats, column t at x + t LDX (floats); y: column t at y + t LDY
 * (floats), overlapping neither. SCRATCH: q4kh_tc_scratch_bytes(K, N, T)
 * bytes of device memory, 256-aligned, not used by other work until this
 * call's work is done. 0 on success; else -1 and WHY names the step and
 * the CUDA or cuBLAS status.
 */
int q4kh_tc_gemm(void *handle, uint32_t type, const uint8_t *w, int64_t w_row,
                 int64_t k, int64_t n, const float *x, int64_t ldx, float *y,
                 int64_t ldy, int64_t t, void *scratch, cudaStream_t s,
                 char *why, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
