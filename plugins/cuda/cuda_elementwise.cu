/*
 * Element-wise ops: add and mul with broadcasting, scale, the gated
 * activations, the unary functions of linear-attention layers (sigmoid,
 * softplus, SiLU), the f32/f16 copy and the KV-cache write (set_rows).
 * One thread per element, over the four
 * dimensions of the output with each operand's own strides. Every element
 * is read and written by one thread, so in-place use is safe. Launched as
 * programmatic dependents when the launch says so (PDL, cuda_kernels.h).
 */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_common.cuh"
#include "q4khost/cuda_glu.cuh"
#include "cuda_kernels.h"
#include "q4khost/plugin.h"
#include "q4khost/quant.h"

#define EW_THREADS 256

/* Element (i0, i1, i2, i3) of a view of E values; a dimension of extent 1
 * (broadcast) always takes index 0. */
template <typename E>
static __device__ __forceinline__ E *at(const struct cuda_view &v,
                                        const int64_t i[4])
{
	char *p = v.data;

	for (int d = 1; d < 4; d++)
		p += (v.ne[d] == 1 ? 0 : i[d]) * v.nb[d];
	return (E *)p + (v.ne[0] == 1 ? 0 : i[0]);
}

/* Index of flat element e of shape ne, ne[0] fastest. */
static __device__ __forceinline__ void unflatten(const int64_t ne[4],
                                                 int64_t e, int64_t i[4])
{
	for (int d = 0; d < 4; d++) {
		i[d] = e % ne[d];
		e /= ne[d];
	}
}

static int64_t elements(const struct cuda_view *v)
{
	return v->ne[0] * v->ne[1] * v->ne[2] * v->ne[3];
}

/*
 * First in every kernel here, which reads only earlier kernels' output:
 * let the next kernel in, then wait for the earlier ones
 * (q4khost/cuda_pdl.cuh; nothing unless launched as a dependent).
 */
static __device__ __forceinline__ void ew_begin(void)
{
	q4kh_pdl_release();
	q4kh_pdl_wait();
}

#define FOR_EACH_ELEMENT(e, shape)                                             \
	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,          \
	             e##_n = (shape).ne[0] * (shape).ne[1] * (shape).ne[2] *      \
	                     (shape).ne[3];                                       \
	     e < e##_n; e += (int64_t)gridDim.x * blockDim.x)

template <bool MUL>
static __global__ void __launch_bounds__(EW_THREADS)
binary_kernel(struct cuda_view a, struct cuda_view b, struct cuda_view out)
{
	ew_begin();
	FOR_EACH_ELEMENT(e, a) {
		int64_t i[4];

		unflatten(a.ne, e, i);
		const float x = *at<float>(a, i), y = *at<float>(b, i);
		*at<float>(out, i) = MUL ? x * y : x + y;
	}
}

static __global__ void __launch_bounds__(EW_THREADS)
scale_kernel(struct cuda_view x, float v, struct cuda_view out)
{
	ew_begin();
	FOR_EACH_ELEMENT(e, x) {
		int64_t i[4];

		unflatten(x.ne, e, i);
		*at<float>(out, i) = *at<float>(x, i) * v;
	}
}

/* act(gate) * up, as q4khost/cuda_glu.cuh computes it (the variants' gemv_glu too). */
template <bool SILU>
static __global__ void __launch_bounds__(EW_THREADS)
glu_kernel(struct cuda_view gate, struct cuda_view up, struct cuda_view out)
{
	ew_begin();
	FOR_EACH_ELEMENT(e, gate) {
		int64_t i[4];

		unflatten(gate.ne, e, i);
		*at<float>(out, i) =
			q4kh_cuda_glu_value(SILU, *at<float>(gate, i), *at<float>(up, i));
	}
}

/* The unary functions in float (expf, log1pf), as the reference computes
 * them in double: softplus as x + log1p(exp(-x)) above 0, so that exp
 * never overflows. */
template <int KIND>
static __device__ __forceinline__ float unary_value(float x)
{
	if (KIND == Q4KH_UNARY_SIGMOID)
		return 1.0f / (1.0f + expf(-x));
	if (KIND == Q4KH_UNARY_SOFTPLUS)
		return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
	return x / (1.0f + expf(-x));
}

template <int KIND>
static __global__ void __launch_bounds__(EW_THREADS)
unary_kernel(struct cuda_view x, struct cuda_view out)
{
	ew_begin();
	FOR_EACH_ELEMENT(e, x) {
		int64_t i[4];

		unflatten(x.ne, e, i);
		*at<float>(out, i) = unary_value<KIND>(*at<float>(x, i));
	}
}

template <typename S, typename D>
static __global__ void __launch_bounds__(EW_THREADS)
copy_kernel(struct cuda_view src, struct cuda_view dst)
{
	ew_begin();
	FOR_EACH_ELEMENT(e, src) {
		int64_t i[4];

		unflatten(src.ne, e, i);
		*at<D>(dst, i) = from_f32<D>(to_f32(*at<S>(src, i)));
	}
}

/* The KV-cache write: element i of src goes to row rows[i[2]] of dst. */
template <typename D>
static __global__ void __launch_bounds__(EW_THREADS)
set_rows_kernel(struct cuda_view src, const int32_t *rows,
                struct cuda_view dst, int32_t *fault)
{
	ew_begin();
	FOR_EACH_ELEMENT(e, src) {
		int64_t i[4];

		unflatten(src.ne, e, i);
		const int32_t r = rows[i[2]];
		if (!index_ok(fault, CUDA_FAULT_SET_ROWS_ROWS, i[2], r, dst.ne[2]))
			continue;
		const float v = *at<float>(src, i);
		i[2] = r;
		*at<D>(dst, i) = from_f32<D>(v);
	}
}

static unsigned grid_of(const struct cuda_view *v)
{
	return grid_for(elements(v), EW_THREADS);
}

extern "C" cudaError_t cuda_launch_binary(int mul, const struct cuda_view *a,
                                          const struct cuda_view *b,
                                          const struct cuda_view *out, int pdl,
                                          cudaStream_t s)
{
	return q4kh_pdl_launch(pdl != 0, mul ? binary_kernel<true> : binary_kernel<false>,
	                       grid_of(a), EW_THREADS, 0, s, *a, *b, *out);
}

extern "C" cudaError_t cuda_launch_scale(const struct cuda_view *x, float v,
                                         const struct cuda_view *out, int pdl,
                                         cudaStream_t s)
{
	return q4kh_pdl_launch(pdl != 0, scale_kernel, grid_of(x), EW_THREADS, 0, s, *x, v,
	                       *out);
}

extern "C" cudaError_t cuda_launch_glu(int silu, const struct cuda_view *gate,
                                       const struct cuda_view *up,
                                       const struct cuda_view *out, int pdl,
                                       cudaStream_t s)
{
	return q4kh_pdl_launch(pdl != 0, silu ? glu_kernel<true> : glu_kernel<false>,
	                       grid_of(gate), EW_THREADS, 0, s, *gate, *up, *out);
}

extern "C" cudaError_t cuda_launch_unary(int kind, const struct cuda_view *x,
                                         const struct cuda_view *out, int pdl,
                                         cudaStream_t s)
{
	return q4kh_pdl_launch(pdl != 0,
	                       kind == Q4KH_UNARY_SIGMOID    ? unary_kernel<Q4KH_UNARY_SIGMOID>
	                       : kind == Q4KH_UNARY_SOFTPLUS ? unary_kernel<Q4KH_UNARY_SOFTPLUS>
	                                                     : unary_kernel<Q4KH_UNARY_SILU>,
	                       grid_of(x), EW_THREADS, 0, s, *x, *out);
}

extern "C" cudaError_t cuda_launch_copy(const struct cuda_view *src,
                                        const struct cuda_view *dst, int pdl,
                                        cudaStream_t s)
{
	const bool from16 = src->type == Q4KH_TYPE_F16;
	const bool to16 = dst->type == Q4KH_TYPE_F16;

	return q4kh_pdl_launch(pdl != 0,
	                       from16 && to16 ? copy_kernel<__half, __half>
	                       : from16       ? copy_kernel<__half, float>
	                       : to16         ? copy_kernel<float, __half>
	                                      : copy_kernel<float, float>,
	                       grid_of(src), EW_THREADS, 0, s, *src, *dst);
}

extern "C" cudaError_t cuda_launch_set_rows(const struct cuda_view *src,
                                            const int32_t *rows,
                                            const struct cuda_view *dst,
                                            int32_t *fault, int pdl, cudaStream_t s)
{
	return q4kh_pdl_launch(pdl != 0,
	                       dst->type == Q4KH_TYPE_F16 ? set_rows_kernel<__half>
	                                                  : set_rows_kernel<float>,
	                       grid_of(src), EW_THREADS, 0, s, *src, rows, *dst, fault);
}

extern "C" cudaError_t cuda_elementwise_preload(void)
{
	return q4kh_preload(binary_kernel<true>, binary_kernel<false>, scale_kernel,
	                    glu_kernel<true>, glu_kernel<false>,
	                    unary_kernel<Q4KH_UNARY_SIGMOID>, unary_kernel<Q4KH_UNARY_SOFTPLUS>,
	                    unary_kernel<Q4KH_UNARY_SILU>, copy_kernel<__half, __half>,
	                    copy_kernel<__half, float>, copy_kernel<float, __half>,
	                    copy_kernel<float, float>, set_rows_kernel<__half>,
	                    set_rows_kernel<float>);
}
