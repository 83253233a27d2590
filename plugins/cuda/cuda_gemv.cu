/*
 * The cuda backend's mul_mat for weights whose rows the loads of their
 * type's format in cuda_gemv_formats.cuh can read (gv_fits: a model's
 * tensors; cudaErrorNotSupported sends the others to cuda_matmul.cu's
 * plain kernel): blocks of GV_WARPS warps that stay for the whole launch and
 * walk tasks of R rows x C columns, each row shared by ks warps of the
 * block.
 *
 * Choices per launch:
 *  - C, columns per pass: 1, 2, 4 or 8, the first at least x's columns (8,
 *    in tiles, beyond). Columns past x's are computed on its last column
 *    and not stored.
 *  - R and U (rows per task, units per step): gv_rows and gv_units.
 *  - ks, warps per row: 1, doubled up to GV_WARPS while the launch has
 *    fewer than 4 tasks per resident warp and each warp still gets 2 steps
 *    of a row (a few long rows: 4096 rows of 14336 values).
 *  - blocks: as many as are resident at once (the kernel's occupancy,
 *    asked once when a device opens, times the multiprocessors), or fewer
 *    when there are fewer tasks.
 *
 * mul_mat_id's grouped products (cuda_moe.cuh) walk the same blocks: a
 * row of blocks per tile (one expert's matrix and up to 8 columns), C 1
 * for the direct form's single columns and 8 for the grouped tiles, ks
 * chosen as above over all tiles' tasks.
 */
#include <atomic>

#include "cuda_gemv.cuh"
#include "cuda_kernels.h"
#include "cuda_moe.cuh"
#include "q4khost/cuda_quant.cuh"

namespace {

struct gv_syncthreads {
	__device__ __forceinline__ void operator()() const { __syncthreads(); }
};

/* At most 128 registers up to 2 columns (4 blocks, 16 warps a
 * multiprocessor, each with two steps of loads in flight), 255 beyond. */
template <uint32_t TYPE, int C>
__global__ void __launch_bounds__(GV_THREADS, C <= 2 ? 4 : 2) gv_kernel(gv_args g)
{
	constexpr int R = gv_rows(C), U = gv_units(TYPE, C);
	__shared__ float part[GV_WARPS * R * C];

	gv_block<TYPE, C, R, U>(g, blockIdx.x, gridDim.x, threadIdx.x, part,
	                        gv_syncthreads());
}

/* Blocks of gv_kernel<TYPE, C> resident on a multiprocessor; 0 until asked. */
template <uint32_t TYPE, int C>
std::atomic<int> gv_occupancy(0);

template <uint32_t TYPE, int C>
cudaError_t gv_ask_occupancy(void)
{
	int o = 0;
	const cudaError_t e =
		cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, gv_kernel<TYPE, C>, GV_THREADS, 0);

	if (e == cudaSuccess)
		gv_occupancy<TYPE, C>.store(o > 0 ? o : 1, std::memory_order_relaxed);
	return e;
}

/* Blocks of gv_kernel<TYPE, C> resident on the device at once, in *OUT. */
template <uint32_t TYPE, int C>
cudaError_t gv_resident(int sms, int64_t *out)
{
	int occupancy = gv_occupancy<TYPE, C>.load(std::memory_order_relaxed);

	if (occupancy <= 0) {
		/* Not asked yet (cuda_gemv_preload): ask now. */
		const cudaError_t e = gv_ask_occupancy<TYPE, C>();

		if (e != cudaSuccess)
			return e;
		occupancy = gv_occupancy<TYPE, C>.load(std::memory_order_relaxed);
	}
	*out = (int64_t)(sms > 0 ? sms : 1) * occupancy;
	return cudaSuccess;
}

/* Warps per row (ks) for TASKS tasks of rows of UNITS units on RESIDENT
 * blocks: doubled while the launch has fewer than 4 tasks per resident
 * warp and each warp still gets 2 steps of a row. */
template <uint32_t TYPE, int C>
int gv_split(int64_t tasks, int units, int64_t resident)
{
	constexpr int U = gv_units(TYPE, C);
	int ks = 1;

	while (ks < GV_WARPS && tasks * ks < 4 * resident * GV_WARPS && units >= 2 * U * (2 * ks))
		ks *= 2;
	return ks;
}

template <uint32_t TYPE, int C>
cudaError_t gv_launch(gv_args g, int sms, bool pdl, cudaStream_t s)
{
	constexpr int R = gv_rows(C);
	const int64_t groups = (g.n + R - 1) / R, tiles = (g.t + C - 1) / C;
	int64_t resident, blocks;
	const cudaError_t e = gv_resident<TYPE, C>(sms, &resident);

	if (e != cudaSuccess)
		return e;
	g.ks = gv_split<TYPE, C>(groups * tiles, g.units, resident);
	blocks = (groups + GV_WARPS / g.ks - 1) / (GV_WARPS / g.ks) * tiles;
	if (blocks > resident)
		blocks = resident;
	return q4kh_pdl_launch(pdl, gv_kernel<TYPE, C>, (unsigned)blocks, GV_THREADS, 0, s, g);
}

/* mul_mat_id's tiles (cuda_moe.cuh): block (i, b) walks tile i's tasks
 * b, b + gridDim.y, ... as gv_kernel walks a product's. */
template <uint32_t TYPE, int C>
__global__ void __launch_bounds__(GV_THREADS, C <= 2 ? 4 : 2)
gv_grouped_kernel(gv_args g, moe_tiles m)
{
	constexpr int R = gv_rows(C), U = gv_units(TYPE, C);
	__shared__ float part[GV_WARPS * R * C];
	moe_tile o;

	if (!moe_tile_at(m, blockIdx.x, o))
		return;
	g.w = o.w;
	g.x = o.x;
	g.y = o.y;
	g.x_col = o.x_col;
	g.y_col = o.y_col;
	g.t = o.t;
	gv_block<TYPE, C, R, U>(g, blockIdx.y, gridDim.y, threadIdx.x, part, gv_syncthreads());
}

template <uint32_t TYPE, int C>
cudaError_t gv_grouped(gv_args g, const moe_tiles &m, int64_t tiles, int sms, cudaStream_t s)
{
	constexpr int R = gv_rows(C);
	const int64_t groups = (g.n + R - 1) / R;
	int64_t resident, per;
	const cudaError_t e = gv_resident<TYPE, C>(sms, &resident);

	if (e != cudaSuccess)
		return e;
	g.ks = gv_split<TYPE, C>(groups * tiles, g.units, resident);
	per = (groups + GV_WARPS / g.ks - 1) / (GV_WARPS / g.ks);
	const dim3 grid((unsigned)tiles, (unsigned)(per < 65535 ? per : 65535));

	gv_grouped_kernel<TYPE, C><<<grid, GV_THREADS, 0, s>>>(g, m);
	return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t cuda_gemv_launch(const struct cuda_view *w,
                                        const struct cuda_view *x,
                                        const struct cuda_view *y, int sms, int pdl,
                                        cudaStream_t s)
{
	const uintptr_t xa = (uintptr_t)x->data | (uintptr_t)(x->ne[1] > 1 ? x->nb[1] : 0);
	const uintptr_t wa = (uintptr_t)w->data | (uintptr_t)(w->ne[1] > 1 ? w->nb[1] : 0);
	gv_args g;

	g.w = (const uint8_t *)w->data;
	g.x = (const float *)x->data;
	g.y = (float *)y->data;
	g.w_row = w->nb[1];
	g.x_col = x->nb[1] / 4;
	g.y_col = y->nb[1] / 4;
	g.n = w->ne[1];
	g.k = w->ne[0];
	g.t = x->ne[1];
	g.units = (int)((g.k + GV_UNIT - 1) / GV_UNIT);
	g.ks = 1;
	return q4kh_for_type(w->type, [&](auto type) {
		constexpr uint32_t T = decltype(type)::value;

		if (!gv_fits<T>(wa, xa, g.k))
			return cudaErrorNotSupported;
		return g.t == 1   ? gv_launch<T, 1>(g, sms, pdl, s)
		       : g.t == 2 ? gv_launch<T, 2>(g, sms, pdl, s)
		       : g.t <= 4 ? gv_launch<T, 4>(g, sms, pdl, s)
		                  : gv_launch<T, 8>(g, sms, pdl, s);
	});
}

cudaError_t cuda_gemv_grouped_launch(const moe_tiles &m, uint32_t type, int64_t tiles, int c,
                                     uintptr_t xa, int sms, cudaStream_t s)
{
	const uintptr_t wa = (uintptr_t)m.w | (uintptr_t)(m.n > 1 ? m.w_row : 0) |
	                     (uintptr_t)(m.e > 1 ? m.w_exp : 0);
	gv_args g;

	g.w_row = m.w_row;
	g.n = m.n;
	g.k = m.k;
	g.units = (int)((g.k + GV_UNIT - 1) / GV_UNIT);
	g.ks = 1;
	return q4kh_for_type(type, [&](auto ty) {
		constexpr uint32_t T = decltype(ty)::value;

		static_assert(CUDA_MOE_TILE == 8, "the grouped tiles take gv_kernel's 8 columns");
		if (!gv_fits<T>(wa, xa, g.k))
			return cudaErrorNotSupported;
		return c == 1 ? gv_grouped<T, 1>(g, m, tiles, sms, s)
		              : gv_grouped<T, CUDA_MOE_TILE>(g, m, tiles, sms, s);
	});
}

cudaError_t cuda_gemv_grouped_split(uint32_t type, int64_t n, int64_t k, int64_t tiles, int sms,
                                    int *ks)
{
	return q4kh_for_type(type, [&](auto ty) {
		constexpr uint32_t T = decltype(ty)::value;
		constexpr int R = gv_rows(1);
		int64_t resident;
		const cudaError_t e = gv_resident<T, 1>(sms, &resident);

		if (e == cudaSuccess)
			*ks = gv_split<T, 1>((n + R - 1) / R * tiles, (int)((k + GV_UNIT - 1) / GV_UNIT),
			                     resident);
		return e;
	});
}

extern "C" cudaError_t cuda_gemv_preload(void)
{
	return cuda_for_each_type([](auto type) {
		constexpr uint32_t T = decltype(type)::value;
		cudaError_t r = gv_ask_occupancy<T, 1>();

		if (r == cudaSuccess)
			r = gv_ask_occupancy<T, 2>();
		if (r == cudaSuccess)
			r = gv_ask_occupancy<T, 4>();
		if (r == cudaSuccess)
			r = gv_ask_occupancy<T, 8>();
		return r;
	});
}
