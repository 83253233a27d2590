/*
 * Q4_K and Q6_K GEMV with int8 activations (the arithmetic: dp4a.cuh).
 *
 * One launch when the block's int8 activations fit DP4A_SHARED_MOST bytes
 * of shared memory (every decode shape of the models we run): each block
 * issues its first weight loads, then quantises the columns into its
 * shared memory (dp4a_prologue), then streams its rows
 * (q4kh_cv_stream_each_after). Every block quantises the whole of x, a
 * few kilobytes read through L2 against the megabytes of weights it
 * streams, which costs less than a second launch and the wait between
 * the two. Beyond (long rows of many columns) quantize_kernel writes the
 * int8 activations into the scratch first and the product reads them
 * there.
 */
#include "dp4a.cuh"

/* Where the two parts of the scratch start. */
static size_t codes_bytes(int64_t k, int64_t cols)
{
	return (size_t)(k * cols); /* a multiple of 256 */
}

extern "C" size_t dp4a_scratch_bytes(int64_t k, int64_t cols)
{
	return dp4a_shared_bytes(k, cols);
}

extern "C" int dp4a_one_launch(int64_t k, int64_t cols)
{
	return dp4a_shared_bytes(k, cols) <= DP4A_SHARED_MOST;
}

/* x's BLOCKS blocks of 32 values (dp4a.cuh's layout) into q and ds, 8
 * values a thread. */
__global__ void __launch_bounds__(256)
quantize_kernel(const float *__restrict__ x, int64_t ldx, int64_t k,
                int64_t blocks, int8_t *__restrict__ q,
                float2 *__restrict__ ds)
{
	q4kh_pdl_release();
	q4kh_pdl_wait();
	dp4a_quantize_range(x, ldx, k, blocks, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
	                    (int64_t)gridDim.x * blockDim.x, q, ds);
}

/* y {N, T} = W x: x quantised into shared memory by each block first. */
template <int T, int R, int U, class F>
__global__ void __launch_bounds__(Q4KH_CV_MAX_WARPS * 32)
dp4a_gemv_kernel(F f, const float *__restrict__ x, int64_t ldx, int64_t n,
                 float *__restrict__ y, int64_t ldy)
{
	extern __shared__ uint4 dp4a_shm[];
	const q4kh_cv_row_store s = { y, ldy, NULL };
	const dp4a_prologue<T> pro = dp4a_bind_shared<T>(f, dp4a_shm, x, ldx);

	q4kh_cv_stream_each_after<T, R, U>(
		f, (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5),
		(int64_t)gridDim.x * (blockDim.x >> 5), n, s, pro);
}

namespace {

/* dp4a_gemv_kernel's launch for q4kh_cv_stream_pick. */
template <int T, class F>
struct gemv_launcher {
	const F &f;
	const q4kh_cv_io *io;
	int64_t n;
	int64_t want; /* blocks */
	int warps, sms;
	size_t smem;
	cudaStream_t s;

	template <int R, int U>
	cudaError_t run() const
	{
		const auto k = dp4a_gemv_kernel<T, R, U, F>;

		return q4kh_pdl_launch(io->pdl != 0, k, dp4a_blocks(k, want, warps, sms, smem),
		                       32 * warps, smem, s, f, io->x, io->ldx, n, io->y, io->ldy);
	}
};

/* dp4a_gemv_kernel's load for q4kh_cv_pick_all. */
template <int T, class F>
struct gemv_loader {
	template <int R, int U>
	cudaError_t run() const
	{
		return q4kh_preload(dp4a_gemv_kernel<T, R, U, F>);
	}
};

/* The one-launch product of w (format F) and io with WARPS warps a block. */
template <class F>
cudaError_t gemv_one(const q4kh_prepared *w, const q4kh_cv_io *io, int warps, cudaStream_t s)
{
	const int sms = w->multiprocessors;
	const int r = q4kh_cv_stream_rows_per_warp(w->n, sms);
	const int64_t groups = (w->n + r - 1) / r;
	const size_t smem = dp4a_shared_bytes(w->k, io->cols);
	F f;

	dp4a_bind_rows(f, w); /* x: the kernel's shared memory */
	return q4kh_cv_for_cols(io->cols, [&](auto t) {
		const gemv_launcher<decltype(t)::value, F> l = {
			f, io, w->n, (groups + warps - 1) / warps, warps, sms, smem, s
		};

		return q4kh_cv_stream_pick(l, r, f.pieces);
	});
}

/* Every kernel dp4a_launch may launch for formats F (shared) and G. */
template <class F, class G>
cudaError_t preload_format(void)
{
	const cudaError_t e = q4kh_cv_stream_preload<G>();

	return e != cudaSuccess
		? e
		: q4kh_cv_pick_all([](auto t) { return gemv_loader<decltype(t)::value, F>(); });
}

/* y = W x with formats F (shared) and G (scratch) of the same rows. */
template <class F, class G>
cudaError_t launch_format(const q4kh_prepared *w, const q4kh_cv_io *io, void *scratch,
                          int warps, cudaStream_t s)
{
	const int64_t blocks = w->k / DP4A_QB * io->cols;
	G dot;
	cudaError_t e;

	if (dp4a_one_launch(w->k, io->cols))
		return gemv_one<F>(w, io, warps, s);
	dp4a_bind_rows(dot, w);
	dot.xq = (const int8_t *)scratch;
	dot.ds = (const float2 *)((uint8_t *)scratch + codes_bytes(w->k, io->cols));
	/* 4 threads a block of 32 values, DP4A_QUANT_STEP blocks each */
	if ((e = q4kh_pdl_launch(io->pdl != 0, quantize_kernel,
	                         (unsigned)((blocks * 4 / DP4A_QUANT_STEP + 255) / 256),
	                         256, 0, s, io->x, io->ldx, w->k, blocks, (int8_t *)dot.xq,
	                         (float2 *)dot.ds)) != cudaSuccess)
		return e;
	return q4kh_cv_stream_launch(dot, (int)io->cols, w->n, io->y, io->ldy, warps,
	                             w->multiprocessors, io->pdl != 0, s);
}

} // namespace

extern "C" cudaError_t dp4a_probe(void)
{
	cudaFuncAttributes a;

	return cudaFuncGetAttributes(&a, quantize_kernel);
}

extern "C" cudaError_t dp4a_preload(void)
{
	cudaError_t e = q4kh_preload(quantize_kernel, q4kh_q6k_copy_kernel);

	e = e != cudaSuccess ? e : preload_format<dp4a_q4k<true>, dp4a_q4k<false> >();
	return e != cudaSuccess ? e : preload_format<dp4a_q6k<true>, dp4a_q6k<false> >();
}

extern "C" cudaError_t dp4a_q6k_copy(const q4kh_prepared *w, void *dst, cudaStream_t s)
{
	return q4kh_q6k_copy(w, dst, s);
}

extern "C" int64_t dp4a_q6k_row_bytes(int64_t k)
{
	return q4kh_q6k_row_bytes(k);
}

extern "C" cudaError_t dp4a_launch(const q4kh_prepared *w, const q4kh_cv_io *io,
                                   void *scratch, int warps, cudaStream_t s)
{
	if (w->type == Q4KH_TYPE_Q6_K)
		return launch_format<dp4a_q6k<true>, dp4a_q6k<false> >(w, io, scratch, warps, s);
	return launch_format<dp4a_q4k<true>, dp4a_q4k<false> >(w, io, scratch, warps, s);
}
