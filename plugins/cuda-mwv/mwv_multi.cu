/*
 * gemv_multi for cuda-mwv: up to Q4KH_GEMV_MULTI_MAX products of one
 * activation, Q4_K, Q6_K, Q5_0 and Q8_0 mixed, in one launch (Gemma 3's
 * q, k in Q5_0 with v in Q8_0). The grid is cut into one range of blocks
 * per matrix (prefix sums in the launch's argument); a block finds its
 * matrix there, branches once on its type (the branch is uniform in the
 * block) and streams that matrix's rows exactly as q4kh_cv_stream_kernel
 * does for gemv, with the same formats (mwv_q4k.cuh, mwv_q6k.cuh,
 * mwv_b32.cuh), so every row it computes has gemv's bits; the bias is
 * added as the row is stored.
 */
#include "mwv.h"
#include "mwv_b32.cuh"
#include "mwv_q4k.cuh"
#include "mwv_q6k.cuh"

namespace {

/* One matrix of the launch. */
struct mwv_multi_mat {
	const uint8_t *w; /* prepared rows (data) */
	int64_t stride;
	int64_t n;
	float *y;
	int64_t ldy;
	const float *bias; /* NULL: none */
	uint32_t type;     /* Q4_K in place, else the type of the copy */
};

/* What the kernel takes by value: every matrix and where its blocks start. */
struct mwv_multi_args {
	mwv_multi_mat m[Q4KH_GEMV_MULTI_MAX];
	unsigned first[Q4KH_GEMV_MULTI_MAX + 1]; /* matrix i: [first[i], first[i + 1]) */
	int count;
	int pieces; /* K / 32, the same for every type */
	const float *x;
	int64_t ldx;
};

/* Matrix M of A by format F, as warp WARP of the WARPS its blocks hold. */
template <int T, int R, int U, class F>
__device__ __forceinline__ void multi_rows(F f, const mwv_multi_args &a,
                                           const mwv_multi_mat &m, int64_t warp,
                                           int64_t warps)
{
	f.w = m.w;
	f.stride = m.stride;
	f.pieces = a.pieces;
	f.x = a.x;
	f.ldx = a.ldx;
	q4kh_cv_stream_rows<T, R, U>(f, warp, warps, m.n, m.y, m.ldy, m.bias);
}

template <int T, int R, int U>
__global__ void __launch_bounds__(Q4KH_CV_MAX_WARPS * 32)
mwv_multi_kernel(const mwv_multi_args a)
{
	const int64_t per_block = blockDim.x >> 5;
	unsigned begin = 0, end = a.first[1];
	int i = 0;

	/* constant indices only: the arguments stay in the constant bank */
#pragma unroll
	for (int j = 1; j < Q4KH_GEMV_MULTI_MAX; j++)
		if (j < a.count && blockIdx.x >= a.first[j]) {
			i = j;
			begin = a.first[j];
			end = a.first[j + 1];
		}
	const mwv_multi_mat m = i == 0 ? a.m[0] : i == 1 ? a.m[1] : i == 2 ? a.m[2] : a.m[3];
	const int64_t warp = (int64_t)(blockIdx.x - begin) * per_block + (threadIdx.x >> 5);
	const int64_t warps = (int64_t)(end - begin) * per_block;

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
	const mwv_multi_args &a;
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
cudaError_t multi_cols(const mwv_multi_args &a, int r, unsigned blocks, int warps, bool pdl,
                       cudaStream_t s)
{
	const multi_launcher<T> l = { a, blocks, 32 * warps, pdl, s };

	return q4kh_cv_stream_pick(l, r, a.pieces);
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
	mwv_multi_args a = {};
	int64_t rows = 0, groups[Q4KH_GEMV_MULTI_MAX], total = 0, blocks = 0;
	const int sms = w[0]->multiprocessors;
	int r;

	if (n < 1 || n > Q4KH_GEMV_MULTI_MAX)
		return cudaErrorInvalidValue;
	for (uint32_t i = 0; i < n; i++)
		rows += w[i]->n;
	/* R from all the rows the launch spreads over the SMs, as for one matrix */
	r = q4kh_cv_stream_rows_per_warp(rows, sms);
	for (uint32_t i = 0; i < n; i++) {
		groups[i] = (w[i]->n + r - 1) / r;
		total += groups[i];
	}
	/*
	 * A block per WARPS row groups of each matrix while the SMs take
	 * them all; beyond, blocks in proportion to the groups, one at least.
	 */
	const int64_t most = q4kh_cv_stream_most_blocks(warps, sms);
	int64_t want = 0;

	for (uint32_t i = 0; i < n; i++)
		want += (groups[i] + warps - 1) / warps;
	a.first[0] = 0;
	for (uint32_t i = 0; i < n; i++) {
		int64_t b = want <= most ? (groups[i] + warps - 1) / warps
		                         : most * groups[i] / total;

		b = b > 0 ? b : 1;
		blocks += b;
		a.first[i + 1] = (unsigned)blocks;
		a.m[i].w = (const uint8_t *)w[i]->data;
		a.m[i].stride = w[i]->stride;
		a.m[i].n = w[i]->n;
		a.m[i].y = io->y[i];
		a.m[i].ldy = io->ldy[i];
		a.m[i].bias = io->bias[i];
		a.m[i].type = w[i]->type;
	}
	a.count = (int)n;
	a.pieces = (int)(w[0]->k / 32);
	a.x = io->x;
	a.ldx = io->ldx;
	return q4kh_cv_for_cols(io->cols, [&](auto t) {
		return multi_cols<decltype(t)::value>(a, r, (unsigned)blocks, warps, io->pdl != 0,
		                                      s);
	});
}
