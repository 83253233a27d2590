/*
 * gemv_multi for cuda-mwv: up to Q4KH_GEMV_MULTI_MAX products of one
 * activation, Q4_K, Q6_K, Q5_0 and Q8_0 mixed, in one launch (Gemma 3's
 * q, k in Q5_0 with v in Q8_0). The grid is cut into one range of blocks
 * per matrix (q4kh_cv_multi_split, prefix sums in the launch's argument);
 * a block finds its matrix there (q4kh_cv_multi_block), branches once on
 * its type (the branch is uniform in the block) and streams that matrix's
 * rows exactly as q4kh_cv_stream_kernel does for gemv, with the same
 * formats (mwv_q4k.cuh, mwv_q6k.cuh, mwv_b32.cuh), so every row it
 * computes has gemv's bits; the bias is added as the row is stored.
 */
#include "mwv.h"
#include "mwv_b32.cuh"
#include "mwv_q4k.cuh"
#include "mwv_q6k.cuh"

namespace {

/* Matrix M of A by format F, as warp WARP of the WARPS its blocks hold. */
template <int T, int R, int U, class F>
__device__ __forceinline__ void multi_rows(F f, const q4kh_cv_multi_args &a,
                                           const q4kh_cv_multi_mat &m, int64_t warp,
                                           int64_t warps)
{
	f.w = m.w;
	f.stride = m.stride;
	f.pieces = (int)(a.k / 32);
	f.x = a.x;
	f.ldx = a.ldx;
	q4kh_cv_stream_rows<T, R, U>(f, warp, warps, m.n, m.y, m.ldy, m.bias);
}

template <int T, int R, int U>
__global__ void __launch_bounds__(Q4KH_CV_MAX_WARPS * 32)
mwv_multi_kernel(const q4kh_cv_multi_args a)
{
	int64_t warp, warps;
	const q4kh_cv_multi_mat m = q4kh_cv_multi_block(a, &warp, &warps);

	switch (m.type) {
	case Q4KH_TYPE_Q6_K: multi_rows<T, R, U>(q6k_format(), a, m, warp, warps); break;
	case Q4KH_TYPE_Q5_0: multi_rows<T, R, U>(q5_0_format(), a, m, warp, warps); break;
	case Q4KH_TYPE_Q8_0: multi_rows<T, R, U>(q8_0_format(), a, m, warp, warps); break;
	default: multi_rows<T, R, U>(mwv_dot(), a, m, warp, warps);
	}
}

/* mwv_multi_kernel's launch for q4kh_cv_stream_pick. */
template <int T>
struct multi_launcher {
	const q4kh_cv_multi_args &a;
	unsigned blocks;
	int threads;
	bool pdl;
	cudaStream_t s;

	template <int R, int U>
	cudaError_t run() const
	{
		return q4kh_pdl_launch(pdl, mwv_multi_kernel<T, R, U>, blocks, threads, 0, s, a);
	}
};

/* mwv_multi_kernel's load for q4kh_cv_pick_all. */
template <int T>
struct multi_loader {
	template <int R, int U>
	cudaError_t run() const
	{
		return q4kh_preload(mwv_multi_kernel<T, R, U>);
	}
};

/* Rows per warp R and pieces per step as q4kh_cv_stream_cols picks them. */
template <int T>
cudaError_t multi_cols(const q4kh_cv_multi_args &a, int r, unsigned blocks, int warps, bool pdl,
                       cudaStream_t s)
{
	const multi_launcher<T> l = { a, blocks, 32 * warps, pdl, s };

	return q4kh_cv_stream_pick(l, r, (int)(a.k / 32));
}

} // namespace

extern "C" cudaError_t mwv_multi_preload(void)
{
	return q4kh_cv_pick_all([](auto t) { return multi_loader<decltype(t)::value>(); });
}

extern "C" cudaError_t mwv_multi_launch(uint32_t n, const q4kh_prepared *const w[],
                                        const q4kh_cv_multi_io *io, int warps,
                                        cudaStream_t s)
{
	q4kh_cv_multi_args a = {};
	int r;

	if (n < 1 || n > Q4KH_GEMV_MULTI_MAX)
		return cudaErrorInvalidValue;
	q4kh_cv_multi_bind(&a, n, w, io);
	r = q4kh_cv_multi_split(n, w, warps,
	                        q4kh_cv_stream_most_blocks(warps, w[0]->multiprocessors), a.first);
	return q4kh_cv_for_cols(io->cols, [&](auto t) {
		return multi_cols<decltype(t)::value>(a, r, a.first[n], warps, io->pdl != 0, s);
	});
}
