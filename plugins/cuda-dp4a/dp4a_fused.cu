/*
 * cuda-dp4a's fused entries (ABI 1.4), each one launch whose blocks first
 * quantise x into their shared memory (dp4a_prologue), once for all the
 * matrices they stream:
 *  - gemv_multi: up to Q4KH_GEMV_MULTI_MAX products of one activation,
 *    Q4_K and Q6_K mixed, the grid cut into one range of blocks per matrix
 *    (q4kh_cv_multi_split); a block branches once on its matrix's type
 *    (uniform in the block) and streams its rows as gemv does, with the same format, so every row has gemv's bits, the bias
 *    added as the row is stored;
 *  - gemv_glu: y = act(gate x) * (up x), gate and up of one type, the
 *    two matrices streamed as one
 *    of 2N interleaved rows (q4kh_cv_pair), each row summed as gemv sums
 *    it, the gated value stored through the cuda backend's expression
 *    (q4kh_cv_glu_store).
 * Both need x's int8 activations to fit DP4A_SHARED_MOST (dp4a_one_launch);
 * the plugin falls back to its products one by one beyond.
 */
#include "dp4a.cuh"

namespace {

/* Matrix M of A by format F, as warp WARP of the WARPS its blocks hold. */
template <int T, int R, int U, class F>
__device__ __forceinline__ void multi_rows(F f, const q4kh_cv_multi_args &a,
                                           const q4kh_cv_multi_mat &m, int64_t warp,
                                           int64_t warps, void *shm)
{
	const q4kh_cv_row_store s = { m.y, m.ldy, m.bias };

	f.w = m.w;
	f.stride = m.stride;
	f.pieces = (int)(a.k / 32);
	f.k = a.k;
	q4kh_cv_stream_each_after<T, R, U>(f, warp, warps, m.n, s,
	                                   dp4a_bind_shared<T>(f, shm, a.x, a.ldx));
}

template <int T, int R, int U>
__global__ void __launch_bounds__(Q4KH_CV_MAX_WARPS * 32)
dp4a_multi_kernel(const q4kh_cv_multi_args a)
{
	extern __shared__ uint4 dp4a_shm[];
	int64_t warp, warps;
	const q4kh_cv_multi_mat m = q4kh_cv_multi_block(a, &warp, &warps);

	if (m.type == Q4KH_TYPE_Q6_K)
		multi_rows<T, R, U>(dp4a_q6k<true>(), a, m, warp, warps, dp4a_shm);
	else
		multi_rows<T, R, U>(dp4a_q4k<true>(), a, m, warp, warps, dp4a_shm);
}

/*
 * dp4a_multi_kernel's launch for q4kh_cv_stream_pick: A with its grid cut
 * for the N matrices w (q4kh_cv_multi_split, at most the kernel's
 * resident blocks).
 */
template <int T>
struct multi_launcher {
	const q4kh_cv_multi_args &a;
	uint32_t n;
	const q4kh_prepared *const *w;
	int warps;
	size_t smem;
	bool pdl;
	cudaStream_t s;

	template <int R, int U>
	cudaError_t run() const
	{
		const auto k = dp4a_multi_kernel<T, R, U>;
		q4kh_cv_multi_args cut = a;

		q4kh_cv_multi_split(n, w, warps,
		                    dp4a_blocks(k, INT64_MAX, warps, w[0]->multiprocessors, smem),
		                    cut.first);
		return q4kh_pdl_launch(pdl, k, cut.first[n], 32 * warps, smem, s, cut);
	}
};

/* dp4a_multi_kernel's load for q4kh_cv_pick_all. */
template <int T>
struct multi_loader {
	template <int R, int U>
	cudaError_t run() const
	{
		return q4kh_preload(dp4a_multi_kernel<T, R, U>);
	}
};

template <int T, int R, int U, class F>
__global__ void __launch_bounds__(Q4KH_CV_MAX_WARPS * 32)
dp4a_glu_kernel(q4kh_cv_pair<F> f, const float *__restrict__ x, int64_t ldx,
                int64_t n, const q4kh_cv_glu_store s)
{
	static_assert(R % 2 == 0, "a warp takes whole pairs of rows");
	extern __shared__ uint4 dp4a_shm[];
	/* the pair's dot is gate's: its activations are the block's */
	const dp4a_prologue<T> pro = dp4a_bind_shared<T>(f.gate, dp4a_shm, x, ldx);

	q4kh_cv_stream_each_after<T, R, U>(
		f, (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5),
		(int64_t)gridDim.x * (blockDim.x >> 5), n, s, pro);
}

/* dp4a_glu_kernel's launch for q4kh_cv_pair_pick. */
template <int T, class F>
struct glu_launcher {
	const q4kh_cv_pair<F> &f;
	const q4kh_cv_io *io;
	int64_t n;
	q4kh_cv_glu_store st;
	int64_t want; /* blocks */
	int warps, sms;
	size_t smem;
	cudaStream_t s;

	template <int R, int U>
	cudaError_t run() const
	{
		const auto k = dp4a_glu_kernel<T, R, U, F>;

		return q4kh_pdl_launch(io->pdl != 0, k, dp4a_blocks(k, want, warps, sms, smem),
		                       32 * warps, smem, s, f, io->x, io->ldx, n, st);
	}
};

/* dp4a_glu_kernel's load for q4kh_cv_pair_pick. */
template <int T, class F>
struct glu_loader {
	template <int R, int U>
	cudaError_t run() const
	{
		return q4kh_preload(dp4a_glu_kernel<T, R, U, F>);
	}
};

/* Every kernel glu_launch may launch for format F. */
template <class F>
cudaError_t glu_preload(void)
{
	cudaError_t e = cudaSuccess;

	/* rows per warp 4 and 2; pieces 64 and 65: both U */
	for (int cols = 1; cols <= Q4KH_CV_MAX_COLUMNS && e == cudaSuccess; cols++)
		e = q4kh_cv_for_cols(cols, [](auto t) {
			const glu_loader<decltype(t)::value, F> l;
			cudaError_t e = q4kh_cv_pair_pick(l, 4, 64);

			e = e != cudaSuccess ? e : q4kh_cv_pair_pick(l, 2, 64);
			return e != cudaSuccess ? e : q4kh_cv_pair_pick(l, 2, 65);
		});
	return e;
}

/* gemv_glu of gate and up, both of format F. */
template <class F>
cudaError_t glu_launch(bool silu, const q4kh_prepared *gate, const q4kh_prepared *up,
                       const q4kh_cv_io *io, int warps, cudaStream_t s)
{
	const int64_t n = 2 * gate->n;
	const int sms = gate->multiprocessors;
	const int r = q4kh_cv_pair_rows_per_warp(n, sms);
	const int64_t groups = (n + r - 1) / r;
	const size_t smem = dp4a_shared_bytes(gate->k, io->cols);
	q4kh_cv_pair<F> f;

	dp4a_bind_rows(f.gate, gate);
	dp4a_bind_rows(f.up, up);
	f.pieces = f.gate.pieces;
	return q4kh_cv_for_cols(io->cols, [&](auto t) {
		const glu_launcher<decltype(t)::value, F> l = {
			f, io, n, { io->y, io->ldy, silu }, (groups + warps - 1) / warps, warps, sms,
			smem, s
		};

		return q4kh_cv_pair_pick(l, r, f.pieces);
	});
}

} // namespace

extern "C" cudaError_t dp4a_fused_preload(void)
{
	cudaError_t e = q4kh_cv_pick_all([](auto t) { return multi_loader<decltype(t)::value>(); });

	e = e != cudaSuccess ? e : glu_preload<dp4a_q4k<true> >();
	return e != cudaSuccess ? e : glu_preload<dp4a_q6k<true> >();
}

extern "C" cudaError_t dp4a_multi_launch(uint32_t n, const q4kh_prepared *const w[],
                                         const q4kh_cv_multi_io *io, int warps,
                                         cudaStream_t s)
{
	const size_t smem = dp4a_shared_bytes(w[0]->k, io->cols);
	q4kh_cv_multi_args a = {};
	int64_t rows = 0;

	if (n < 1 || n > Q4KH_GEMV_MULTI_MAX || !dp4a_one_launch(w[0]->k, io->cols))
		return cudaErrorInvalidValue;
	for (uint32_t i = 0; i < n; i++)
		rows += w[i]->n;
	q4kh_cv_multi_bind(&a, n, w, io);
	return q4kh_cv_for_cols(io->cols, [&](auto t) {
		const multi_launcher<decltype(t)::value> l = { a, n, w, warps, smem, io->pdl != 0, s };

		/* R as q4kh_cv_multi_split takes it */
		return q4kh_cv_stream_pick(l, q4kh_cv_stream_rows_per_warp(rows, w[0]->multiprocessors),
		                           (int)(a.k / 32));
	});
}

extern "C" cudaError_t dp4a_glu_launch(int silu, const q4kh_prepared *gate,
                                       const q4kh_prepared *up, const q4kh_cv_io *io,
                                       int warps, cudaStream_t s)
{
	if (gate->type != up->type || gate->k != up->k || gate->n != up->n ||
	    !dp4a_one_launch(gate->k, io->cols))
		return cudaErrorInvalidValue;
	if (gate->type == Q4KH_TYPE_Q6_K)
		return glu_launch<dp4a_q6k<true> >(silu != 0, gate, up, io, warps, s);
	return glu_launch<dp4a_q4k<true> >(silu != 0, gate, up, io, warps, s);
}
