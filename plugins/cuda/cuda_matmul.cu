/*
 * get_rows and mul_mat for every weight type, one plain kernel per type
 * (q4khost/cuda_quant.cuh decodes the groups of 32 values).
 *
 * mul_mat goes to cuda_gemv.cu (vector loads, many rows per block) when
 * the weights' rows and the activations are aligned for its loads, as a
 * model's tensors are. Otherwise, here: one warp per weight row and up to
 * MM_COLS activation columns. Lane l decodes groups l, l + 32, ... of the
 * row (neighbouring lanes read neighbouring blocks), dots each group with
 * the columns in fp32, and the warp sums the lanes' partial sums in a fixed
 * tree. mul_mat_id's grouped products (cuda_moe.cuh) run the same warps
 * over each tile's expert and columns.
 */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "cuda_moe.cuh"
#include "q4khost/cuda_quant.cuh"

#define MM_WARPS 4 /* weight rows per block */
#define MM_COLS 8  /* activation columns per pass */
#define GR_THREADS 128

/*
 * One warp: the row ROW of K values times columns FIRST, FIRST + STEP, ...
 * (MM_COLS at a time) of the NT columns of x (column t at x + t XC bytes),
 * each sum stored at y + t YC bytes.
 */
template <uint32_t TYPE>
static __device__ __forceinline__ void mm_row(const uint8_t *row, int64_t k, const char *x,
                                              int64_t xc, char *y, int64_t yc, int64_t nt,
                                              int64_t first, int64_t step, int lane)
{
	const int64_t groups = (k + 31) / 32;

	for (int64_t t0 = first; t0 < nt; t0 += step) {
		const int nc = nt - t0 < MM_COLS ? (int)(nt - t0) : MM_COLS;
		float acc[MM_COLS];

#pragma unroll
		for (int c = 0; c < MM_COLS; c++)
			acc[c] = 0.0f;
		for (int64_t g = lane; g < groups; g += 32) {
			float v[32];
			const int cnt = q4kh_load_group<TYPE>(row, g, k, v);

#pragma unroll
			for (int c = 0; c < MM_COLS; c++) {
				if (c >= nc)
					break;
				const float *xc_ = (const float *)(x + (t0 + c) * xc) + 32 * g;
				float s = 0.0f;

#pragma unroll
				for (int i = 0; i < 32; i++)
					if (i < cnt)
						s += v[i] * xc_[i];
				acc[c] += s;
			}
		}
#pragma unroll
		for (int c = 0; c < MM_COLS; c++)
			acc[c] = warp_sum(acc[c]);
		if (lane == 0)
			for (int c = 0; c < nc; c++)
				*(float *)(y + (t0 + c) * yc) = acc[c];
	}
}

template <uint32_t TYPE>
static __global__ void __launch_bounds__(32 * MM_WARPS)
mul_mat_kernel(struct cuda_view w, struct cuda_view x, struct cuda_view y)
{
	const int64_t n = (int64_t)blockIdx.x * MM_WARPS + threadIdx.x / 32;

	if (n >= w.ne[1])
		return; /* the whole warp: no lane is left in a shuffle */
	mm_row<TYPE>((const uint8_t *)w.data + n * w.nb[1], w.ne[0], x.data, x.nb[1],
	             y.data + n * 4, y.nb[1], x.ne[1], (int64_t)blockIdx.y * MM_COLS,
	             (int64_t)gridDim.y * MM_COLS, threadIdx.x % 32);
}

/* mul_mat_id's tiles (cuda_moe.cuh): block (i, b) takes rows b MM_WARPS ..
 * of tile i. */
template <uint32_t TYPE>
static __global__ void __launch_bounds__(32 * MM_WARPS) mm_grouped_kernel(moe_tiles m)
{
	const int64_t n = (int64_t)blockIdx.y * MM_WARPS + threadIdx.x / 32;
	moe_tile o;

	if (!moe_tile_at(m, blockIdx.x, o) || n >= m.n)
		return;
	mm_row<TYPE>(o.w + n * m.w_row, m.k, (const char *)o.x, o.x_col * 4,
	             (char *)(o.y + n), o.y_col * 4, o.t, 0, MM_COLS, threadIdx.x % 32);
}

/* One work item per (output row, group of 32 values). */
template <uint32_t TYPE>
static __global__ void __launch_bounds__(GR_THREADS)
get_rows_kernel(struct cuda_view table, const int32_t *ids, int64_t n,
                float scale, struct cuda_view out, int32_t *fault)
{
	const int64_t k = table.ne[0], groups = (k + 31) / 32;

	for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     it < n * groups; it += (int64_t)gridDim.x * blockDim.x) {
		const int64_t r = it / groups, g = it % groups;
		if (!index_ok(fault, CUDA_FAULT_GET_ROWS_IDS, r, ids[r], table.ne[1]))
			continue;
		const uint8_t *row =
			(const uint8_t *)table.data + (int64_t)ids[r] * table.nb[1];
		float *o = (float *)(out.data + r * out.nb[1]) + 32 * g;
		float v[32];
		const int cnt = q4kh_load_group<TYPE>(row, g, k, v);

		for (int i = 0; i < cnt; i++)
			o[i] = v[i] * scale;
	}
}

extern "C" int cuda_type_supported(uint32_t type)
{
	return q4kh_for_type(type, [](auto) { return cudaSuccess; }) == cudaSuccess;
}

extern "C" cudaError_t cuda_launch_mul_mat(const struct cuda_view *w,
                                           const struct cuda_view *x,
                                           const struct cuda_view *y, int sms, int pdl,
                                           cudaStream_t s)
{
	const int64_t cols = (x->ne[1] + MM_COLS - 1) / MM_COLS;
	const dim3 grid((unsigned)((w->ne[1] + MM_WARPS - 1) / MM_WARPS),
	                (unsigned)(cols < 65535 ? cols : 65535));
	const cudaError_t e = cuda_gemv_launch(w, x, y, sms, pdl, s);

	if (e != cudaErrorNotSupported)
		return e;
	return q4kh_for_type(w->type, [&](auto type) {
		constexpr uint32_t T = decltype(type)::value;

		mul_mat_kernel<T><<<grid, 32 * MM_WARPS, 0, s>>>(*w, *x, *y);
		return cudaGetLastError();
	});
}

cudaError_t cuda_mm_grouped_launch(const moe_tiles &m, uint32_t type, int64_t tiles,
                                   cudaStream_t s)
{
	const int64_t blocks = (m.n + MM_WARPS - 1) / MM_WARPS;
	const dim3 grid((unsigned)tiles, (unsigned)blocks);

	if (blocks > 65535)
		return cudaErrorNotSupported;
	return q4kh_for_type(type, [&](auto ty) {
		constexpr uint32_t T = decltype(ty)::value;

		mm_grouped_kernel<T><<<grid, 32 * MM_WARPS, 0, s>>>(m);
		return cudaGetLastError();
	});
}

extern "C" cudaError_t cuda_launch_get_rows(const struct cuda_view *table,
                                            const int32_t *ids, int64_t n,
                                            float scale,
                                            const struct cuda_view *out,
                                            int32_t *fault, cudaStream_t s)
{
	const unsigned grid = grid_for(n * ((table->ne[0] + 31) / 32), GR_THREADS);

	return q4kh_for_type(table->type, [&](auto type) {
		constexpr uint32_t T = decltype(type)::value;

		get_rows_kernel<T><<<grid, GR_THREADS, 0, s>>>(*table, ids, n, scale, *out, fault);
		return cudaGetLastError();
	});
}

extern "C" cudaError_t cuda_kernels_runnable(void)
{
	return q4kh_preload(mul_mat_kernel<Q4KH_TYPE_Q4_K>);
}

extern "C" cudaError_t cuda_matmul_preload(void)
{
	return cuda_for_each_type([](auto type) {
		constexpr uint32_t T = decltype(type)::value;

		return q4kh_preload(get_rows_kernel<T>, mul_mat_kernel<T>);
	});
}
