/*
 * gemv_glu for cuda-mwv (ABI 1.4): y = act(gate x) * (up x) in one launch.
 * The two matrices stream as one of 2N interleaved rows (q4kh_cv_pair): a warp
 * takes R / 2 rows of each, issues every load of both before the dots,
 * sums each row exactly as q4kh_cv_stream_kernel does for gemv (same format,
 * mwv_q4k.cuh, mwv_q6k.cuh or mwv_b32.cuh, same order: gemv's bits), and
 * stores the gated value of each gate row with its up row through the cuda
 * backend's own expression (q4kh_cv_glu_store, q4khost/cuda_glu.cuh). The
 * products are never stored.
 */
#include "mwv.h"
#include "mwv_b32.cuh"
#include "mwv_q4k.cuh"
#include "mwv_q6k.cuh"
#include "q4khost/cuda_glu.cuh"

namespace {

template <int T, int R, int U, class F>
__global__ void __launch_bounds__(Q4KH_CV_MAX_WARPS * 32)
mwv_glu_kernel(const q4kh_cv_pair<F> f, int64_t n, const q4kh_cv_glu_store s)
{
	static_assert(R % 2 == 0, "a warp takes whole pairs of rows");
	q4kh_cv_stream_each<T, R, U>(f,
	                             (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5),
	                             (int64_t)gridDim.x * (blockDim.x >> 5), n, s);
}

/*
 * The launch for T columns of the 2N rows: blocks as q4kh_cv_stream_cols gives
 * them; rows per warp and pieces per step as q4kh_cv_stream_pick, but at least
 * one pair of rows a warp (2 rows: 4 pieces a step on long rows); as a
 * programmatic dependent when PDL.
 */
template <int T, class F>
cudaError_t glu_cols(const q4kh_cv_pair<F> &f, int64_t n, const q4kh_cv_glu_store &s, int warps,
                     int sms, bool pdl, cudaStream_t st)
{
	const int r = q4kh_cv_stream_rows_per_warp(n, sms) == 4 ? 4 : 2;
	const int64_t groups = (n + r - 1) / r;
	const int64_t want = (groups + warps - 1) / warps;
	const int64_t most = q4kh_cv_stream_most_blocks(warps, sms);
	const unsigned blocks = (unsigned)(want < most ? want : most);

	if (r == 4)
		return q4kh_pdl_launch(pdl, mwv_glu_kernel<T, 4, 2, F>, blocks, 32 * warps, 0, st,
		                       f, n, s);
	if (f.pieces > 64)
		return q4kh_pdl_launch(pdl, mwv_glu_kernel<T, 2, 4, F>, blocks, 32 * warps, 0, st,
		                       f, n, s);
	return q4kh_pdl_launch(pdl, mwv_glu_kernel<T, 2, 2, F>, blocks, 32 * warps, 0, st, f, n,
	                       s);
}

/* Format F of gate and up (both prepared as F reads them) for IO's columns. */
template <class F>
cudaError_t glu_launch(F gate, F up, const q4kh_prepared *wg, const q4kh_prepared *wu,
                       const q4kh_cv_io *io, bool silu, int warps, cudaStream_t st)
{
	q4kh_cv_pair<F> f;
	const q4kh_cv_glu_store s = { io->y, io->ldy, silu };
	const int64_t n = 2 * wg->n;
	const int sms = wg->multiprocessors;

	gate.w = (const uint8_t *)wg->data;
	gate.stride = wg->stride;
	up.w = (const uint8_t *)wu->data;
	up.stride = wu->stride;
	gate.pieces = up.pieces = f.pieces = (int)(wg->k / 32);
	gate.x = up.x = io->x;
	gate.ldx = up.ldx = io->ldx;
	f.gate = gate;
	f.up = up;
	return q4kh_cv_for_cols(io->cols, [&](auto t) {
		return glu_cols<decltype(t)::value, F>(f, n, s, warps, sms, io->pdl != 0, st);
	});
}

/* Load the three kernels glu_cols may launch for format F, every column count. */
template <class F>
cudaError_t glu_preload(void)
{
	cudaError_t e = cudaSuccess;

	for (int cols = 1; cols <= Q4KH_CV_MAX_COLUMNS && e == cudaSuccess; cols++)
		e = q4kh_cv_for_cols(cols, [](auto t) {
			constexpr int T = decltype(t)::value;

			return q4kh_preload(mwv_glu_kernel<T, 4, 2, F>, mwv_glu_kernel<T, 2, 4, F>,
			                    mwv_glu_kernel<T, 2, 2, F>);
		});
	return e;
}

} // namespace

extern "C" cudaError_t mwv_glu_preload(void)
{
	cudaError_t e = glu_preload<mwv_dot>();

	if (e == cudaSuccess)
		e = glu_preload<q6k_format>();
	if (e == cudaSuccess)
		e = glu_preload<q5_0_format>();
	return e != cudaSuccess ? e : glu_preload<q8_0_format>();
}

extern "C" cudaError_t mwv_glu_launch(int silu, const q4kh_prepared *gate,
                                      const q4kh_prepared *up, const q4kh_cv_io *io,
                                      int warps, cudaStream_t s)
{
	if (gate->type != up->type || gate->k != up->k || gate->n != up->n)
		return cudaErrorInvalidValue;
	switch (gate->type) {
	case Q4KH_TYPE_Q6_K:
		return glu_launch(q6k_format(), q6k_format(), gate, up, io, silu != 0, warps, s);
	case Q4KH_TYPE_Q5_0:
		return glu_launch(q5_0_format(), q5_0_format(), gate, up, io, silu != 0, warps, s);
	case Q4KH_TYPE_Q8_0:
		return glu_launch(q8_0_format(), q8_0_format(), gate, up, io, silu != 0, warps, s);
	default: return glu_launch(mwv_dot(), mwv_dot(), gate, up, io, silu != 0, warps, s);
	}
}
