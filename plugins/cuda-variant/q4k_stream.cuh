/*
 * The streaming shape of the Q4_K GEMV kernels (cuda-mwv, cuda-dp4a).
 *
 * A warp owns R consecutive weight rows at a time and walks a grid-stride
 * loop over row groups, so blocks live for the whole launch: no block
 * launches, no __syncthreads, and the sum over a row is a warp shuffle.
 * Along the rows, lane l takes pieces (q4k_device.cuh) l, l + 32, ...; each
 * step first issues every load of U pieces for all R rows (16 bytes of
 * codes and the 16-byte header each), then computes, so R * U independent
 * 16-byte loads per lane are in flight: with a few warps per
 * multiprocessor that covers the memory latency, which the old one-pass
 * blocks of variant_device.cuh did not (about 45 % of the read ceiling).
 * Each activation value a lane loads serves the R rows, and every weight
 * byte is read once for all T columns.
 *
 * The arithmetic is the variant's: D::piece<R, T>(acc, q, h, j) adds
 * piece j's 32 weights of each row r (codes q[r], header h[r]) times the
 * activations to acc[r][c].
 */
#ifndef Q4KH_CUDA_Q4K_STREAM_CUH
#define Q4KH_CUDA_Q4K_STREAM_CUH

#include "q4k_device.cuh"

template <int T, int R, int U, class D>
__global__ void __launch_bounds__(CV_MAX_WARPS * 32)
q4k_stream_kernel(const uint8_t *__restrict__ w, int64_t stride, int pieces,
                  int64_t n, D dot, float *__restrict__ y, int64_t ldy)
{
	const int lane = threadIdx.x & 31;
	const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);

	for (int64_t g = (int64_t)blockIdx.x * (blockDim.x >> 5) +
	                 (threadIdx.x >> 5);
	     g * R < n; g += warps) {
		const int64_t row0 = g * R;
		const uint8_t *rows[R];
		float acc[R][T] = {};

#pragma unroll
		for (int r = 0; r < R; r++)
			rows[r] = w + (row0 + r < n ? row0 + r : n - 1) * stride;
		for (int j0 = lane; j0 < pieces; j0 += 32 * U) {
			uint4 q[U][R], h[U][R];

#pragma unroll
			for (int u = 0; u < U; u++) {
				const int j = j0 + 32 * u;

				if (j < pieces)
#pragma unroll
					for (int r = 0; r < R; r++) {
						const uint8_t *blk = q4k_block(rows[r], j >> 3);

						q[u][r] = cv_load_stream(blk + 16 + 16 * (j & 7));
						h[u][r] = __ldg((const uint4 *)blk);
					}
			}
#pragma unroll
			for (int u = 0; u < U; u++)
				if (j0 + 32 * u < pieces)
					dot.template piece<R, T>(acc, q[u], h[u], j0 + 32 * u);
		}
		cv_reduce_store<R, T>(acc, 32, nullptr, row0, n, y, ldy);
	}
}

/*
 * Launch D's kernel for COLS (1 .. CV_MAX_COLUMNS) columns of a {K, N}
 * Q4_K matrix (rows STRIDE bytes apart): rows per warp by how many row
 * groups there are to spread over the multiprocessors (SMS), pieces per
 * lane and step by the length of a row.
 */
template <int T, class D>
static cudaError_t q4k_stream_cols(const uint8_t *w, int64_t stride,
                                   int64_t k, int64_t n, const D &dot,
                                   float *y, int64_t ldy, int warps, int sms,
                                   cudaStream_t s)
{
	const int pieces = (int)(k / (Q4K_VALUES / Q4K_PIECES));
	const int64_t per_sm = n / (sms > 0 ? sms : 1);
	/* Rows per warp: 4 when every multiprocessor still gets 16 warps. */
	const int r = per_sm >= 64 ? 4 : per_sm >= 16 ? 2 : 1;
	const int64_t groups = (n + r - 1) / r;
	const int64_t want = (groups + warps - 1) / warps;
	const int64_t most = (int64_t)(sms > 0 ? sms : 1) * (64 / warps);
	const unsigned blocks = (unsigned)(want < most ? want : most);
	const int threads = 32 * warps;

#define Q4K_STREAM(R, U)                                                       \
	q4k_stream_kernel<T, R, U, D><<<blocks, threads, 0, s>>>(              \
		w, stride, pieces, n, dot, y, ldy)
	if (r == 4)
		Q4K_STREAM(4, 2);
	else if (r == 2 && pieces > 64)
		Q4K_STREAM(2, 4);
	else if (r == 2)
		Q4K_STREAM(2, 2);
	else if (pieces > 64)
		Q4K_STREAM(1, 4);
	else
		Q4K_STREAM(1, 2);
#undef Q4K_STREAM
	return cudaGetLastError();
}

template <class D>
static cudaError_t q4k_stream_launch(const uint8_t *w, int64_t stride,
                                     int64_t k, int64_t n, const D &dot,
                                     int cols, float *y, int64_t ldy,
                                     int warps, int sms, cudaStream_t s)
{
	switch (cols) {
#define Q4K_COLS(T)                                                            \
	case T:                                                                \
		return q4k_stream_cols<T, D>(w, stride, k, n, dot, y, ldy, warps, \
		                             sms, s)
	Q4K_COLS(1);
	Q4K_COLS(2);
	Q4K_COLS(3);
	Q4K_COLS(4);
	Q4K_COLS(5);
	Q4K_COLS(6);
	Q4K_COLS(7);
	Q4K_COLS(8);
#undef Q4K_COLS
	default: return cudaErrorInvalidValue;
	}
}

#endif
