/*
 * Device code and launch geometry of the CUDA kernel variants' GEMV
 * kernels (header-only, for nvcc; with cuda_variant.h, whose context and
 * limits it uses): the in-tree variants' shape, for a variant of the SDK's
 * table (cuda_variant.h) to build its kernels on.
 *
 * Every kernel has one streaming shape (q4kh_cv_stream_kernel). A warp owns R
 * consecutive weight rows at a time and walks a grid-stride loop over row
 * groups, so blocks live for the whole launch: no block launches, no
 * __syncthreads, and the sum over a row is a warp shuffle. Along the rows,
 * lane l takes pieces l, l + 32, ... (a piece: 16 bytes of codes and the
 * scales they need); each step first issues every load of U pieces for all
 * R rows, then computes, so R * U independent 16-byte loads per lane are in
 * flight, which with a few warps per multiprocessor covers the memory
 * latency (one-pass blocks that loaded once and then reduced through shared
 * memory reached about 45 % of the read ceiling). Each activation value a
 * lane loads serves R rows, and every weight byte is read once for up to
 * Q4KH_CV_MAX_COLUMNS columns. fp32 accumulation throughout.
 *
 * What differs between the variants is a format F:
 *   F::piece_t                      what one piece's loads bring
 *   int F::pieces                   pieces per row
 *   F::piece_t F::load(row, j)      issue the loads of piece j of a row
 *   F::dot<R, T>(acc, p[R], j)      acc[r][c] += piece j of row r . x[:, c]
 */
#ifndef Q4KHOST_CUDA_VARIANT_DEVICE_CUH
#define Q4KHOST_CUDA_VARIANT_DEVICE_CUH

#include <cuda_fp16.h>
#ifndef Q4KH_EMU_H /* tests/emu/emu.h stands in for the runtime's device API */
#include <cuda_runtime.h>
#endif
#include <stdint.h>

#include <type_traits>

#include "q4khost/cuda_glu.cuh"
#include "q4khost/cuda_pdl.cuh"
#include "q4khost/cuda_preload.cuh"
#include "q4khost/cuda_variant.h"

#define Q4KH_CV_FULL_MASK 0xFFFFFFFFu

/*
 * 16 bytes of weights, read once per launch: no L1 allocation, so the
 * activations that every group re-reads keep the L1.
 */
__device__ __forceinline__ uint4 q4kh_cv_load_stream(const void *p)
{
#ifdef Q4KH_EMU_H
	/* tests/emu: a plain load that checks its alignment */
	return __ldg((const uint4 *)p);
#else
	uint4 v;

	asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
	    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	    : "l"(p));
	return v;
#endif
}

/* Word I (0..3) of a 16-byte vector; I is a constant after unrolling. */
__device__ __forceinline__ uint32_t q4kh_cv_word(const uint4 &v, int i)
{
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/*
 * Byte B (a constant) of v minus BIAS (an integer below 2^8) as a float,
 * exactly: one byte permute puts the byte under the exponent of 2^23, one
 * subtraction of 2^23 + BIAS (exact by Sterbenz's lemma) leaves the value.
 * Cheaper than an integer conversion, which runs at a quarter rate.
 */
__device__ __forceinline__ float q4kh_cv_byte_float_less(uint32_t v, int b,
                                                         float bias)
{
	return __int_as_float((int)__byte_perm(v, 0x4B000000u, 0x7440u | b)) -
	       (8388608.0f + bias);
}

/* Byte B of v as a float, exactly. */
__device__ __forceinline__ float q4kh_cv_byte_float(uint32_t v, int b)
{
	return q4kh_cv_byte_float_less(v, b, 0.0f);
}

/*
 * part[c] += the four codes of v (bytes 0 .. 3, each q + BIAS, taken as
 * the floats q exactly) times xv[c].x .. .w, four fmas in order, for
 * each of T columns: the inner step of a format's dot whose codes are
 * bytes.
 */
template <int T>
__device__ __forceinline__ void q4kh_cv_fma_bytes(float (&part)[T], uint32_t v, float bias,
                                                  const float4 (&xv)[T])
{
	float q[4];

#pragma unroll
	for (int b = 0; b < 4; b++)
		q[b] = q4kh_cv_byte_float_less(v, b, bias);
#pragma unroll
	for (int c = 0; c < T; c++) {
		part[c] = fmaf(q[0], xv[c].x, part[c]);
		part[c] = fmaf(q[1], xv[c].y, part[c]);
		part[c] = fmaf(q[2], xv[c].z, part[c]);
		part[c] = fmaf(q[3], xv[c].w, part[c]);
	}
}

/* The fp16 in the low (HI = 0) or high half of v, as a float. */
__device__ __forceinline__ float q4kh_cv_half_float(uint32_t v, int hi)
{
	return __half2float(__ushort_as_half((unsigned short)(v >> (16 * hi))));
}

/*
 * Sum acc over the 32 lanes of the warp: a butterfly, after which every
 * lane holds the same sums, bit for bit (each addition's two operands
 * meet in both lanes, and a + b is b + a). Every lane must call it.
 */
template <int R, int T>
__device__ __forceinline__ void q4kh_cv_warp_sum(float (&acc)[R][T])
{
	for (int off = 16; off > 0; off >>= 1)
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < T; c++)
				acc[r][c] += __shfl_xor_sync(Q4KH_CV_FULL_MASK, acc[r][c], off);
}

/*
 * Sum acc over the 32 lanes of the warp and store row row0 + r, column c
 * at y[row0 + r + c * ldy] (rows >= n are skipped), one value per lane,
 * plus bias[row0 + r] when bias is not NULL (one float addition, as the
 * backend's add). Every lane of the warp must call it.
 */
template <int R, int T>
__device__ __forceinline__ void q4kh_cv_warp_store(float (&acc)[R][T], int64_t row0,
                                                   int64_t n, float *y, int64_t ldy,
                                                   const float *bias)
{
	const int lane = threadIdx.x & 31;

	q4kh_cv_warp_sum<R, T>(acc);
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int c = 0; c < T; c++)
			if ((r * T + c) % 32 == lane && row0 + r < n)
				y[row0 + r + c * ldy] =
					bias ? acc[r][c] + bias[row0 + r] : acc[r][c];
}

/* q4kh_cv_stream_each's store of plain rows: q4kh_cv_warp_store's. */
struct q4kh_cv_row_store {
	float *y;
	int64_t ldy;
	const float *bias; /* NULL: none */

	template <int R, int T>
	__device__ __forceinline__ void store(float (&acc)[R][T], int64_t row0,
	                                      int64_t n) const
	{
		q4kh_cv_warp_store<R, T>(acc, row0, n, y, ldy, bias);
	}
};

/*
 * The rows of an N-row matrix with format F, by warp WARP of WARPS that
 * share them: R rows at a time, each row's lane partial sums in acc,
 * handed to s.store<R, T>(acc, row0, n) (which sums over the warp and
 * stores rows row0 .. row0 + R - 1 below n). The body of q4kh_cv_stream_kernel
 * (see the top of this file); a row's arithmetic does not depend on R or
 * U, so every store sees gemv's sums.
 */
template <int T, int R, int U, class F, class S>
__device__ __forceinline__ void q4kh_cv_stream_each(const F &f, int64_t warp,
                                                    int64_t warps, int64_t n,
                                                    const S &s)
{
	const int lane = threadIdx.x & 31;
	bool waiting = true; /* q4kh_pdl_wait not yet called */

	q4kh_pdl_release();
	for (int64_t g = warp; g * R < n; g += warps) {
		const int64_t row0 = g * R;
		int64_t rows[R];
		float acc[R][T] = {};

#pragma unroll
		for (int r = 0; r < R; r++)
			rows[r] = row0 + r < n ? row0 + r : n - 1;
		for (int j0 = lane; j0 < f.pieces; j0 += 32 * U) {
			typename F::piece_t p[U][R];

#pragma unroll
			for (int u = 0; u < U; u++)
				if (j0 + 32 * u < f.pieces)
#pragma unroll
					for (int r = 0; r < R; r++)
						p[u][r] = f.load(rows[r], j0 + 32 * u);
			/* The first weights are on their way; x is the last kernel's. */
			if (waiting) {
				q4kh_pdl_wait();
				waiting = false;
			}
#pragma unroll
			for (int u = 0; u < U; u++)
				if (j0 + 32 * u < f.pieces)
					f.template dot<R, T>(acc, p[u], j0 + 32 * u);
		}
		if (waiting) {
			q4kh_pdl_wait();
			waiting = false;
		}
		s.template store<R, T>(acc, row0, n);
	}
	if (waiting)
		q4kh_pdl_wait();
}

/*
 * q4kh_cv_stream_each for a kernel whose blocks first fill shared memory
 * from what earlier kernels wrote (cuda-dp4a: the activations as int8):
 * every thread of the block issues the loads of its first step (weights
 * only), then calls prologue() once, whether or not it has rows (the
 * prologue waits for the earlier kernels, q4kh_pdl_wait, and may end
 * with __syncthreads), then streams its rows as q4kh_cv_stream_each does,
 * each row's arithmetic in the same order. q4kh_cv_stream_each keeps its
 * own loop, the code measured for cuda-mwv (docs/perf.md).
 */
template <int T, int R, int U, class F, class S, class P>
__device__ __forceinline__ void q4kh_cv_stream_each_after(const F &f, int64_t warp,
                                                          int64_t warps, int64_t n,
                                                          const S &s, const P &prologue)
{
	const int lane = threadIdx.x & 31;
	typename F::piece_t p[U][R];
	/* Issue the loads of the step at pieces j0 + 32 u of the R rows from row0. */
	const auto load = [&](int64_t row0, int j0) {
#pragma unroll
		for (int u = 0; u < U; u++)
			if (j0 + 32 * u < f.pieces)
#pragma unroll
				for (int r = 0; r < R; r++)
					p[u][r] = f.load(row0 + r < n ? row0 + r : n - 1, j0 + 32 * u);
	};

	q4kh_pdl_release();
	if (warp * R < n)
		load(warp * R, lane);
	prologue();
	for (int64_t g = warp; g * R < n; g += warps) {
		const int64_t row0 = g * R;
		float acc[R][T] = {};

		for (int j0 = lane; j0 < f.pieces; j0 += 32 * U) {
			if (g != warp || j0 != lane)
				load(row0, j0);
#pragma unroll
			for (int u = 0; u < U; u++)
				if (j0 + 32 * u < f.pieces)
					f.template dot<R, T>(acc, p[u], j0 + 32 * u);
		}
		s.template store<R, T>(acc, row0, n);
	}
}

/*
 * y {N, T} = W x (+ bias) with format F, by warp WARP of WARPS that share
 * the rows: q4kh_cv_stream_each with q4kh_cv_warp_store, also run by kernels that
 * give each of several matrices its own blocks.
 */
template <int T, int R, int U, class F>
__device__ __forceinline__ void q4kh_cv_stream_rows(const F &f, int64_t warp,
                                                    int64_t warps, int64_t n,
                                                    float *__restrict__ y,
                                                    int64_t ldy, const float *bias)
{
	const q4kh_cv_row_store s = { y, ldy, bias };

	q4kh_cv_stream_each<T, R, U>(f, warp, warps, n, s);
}

/*
 * Two matrices of format F with the same K and N as one of 2N rows for
 * q4kh_cv_stream_each: row 2i is row i of gate, row 2i + 1 row i of up, so
 * that a warp with an even R loads and reduces the same R / 2 rows of
 * both (every load of both issued before the dots), and its store finds
 * a gate row's sums next to its up row's. Both share x (dot() is gate's).
 */
template <class F>
struct q4kh_cv_pair {
	typedef typename F::piece_t piece_t;
	F gate, up;
	int pieces;

	__device__ __forceinline__ piece_t load(int64_t row, int j) const
	{
		return (row & 1 ? up : gate).load(row >> 1, j);
	}

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const piece_t (&pc)[R],
	                                    int j) const
	{
		gate.template dot<R, T>(acc, pc, j);
	}
};

/*
 * q4kh_cv_stream_each's store for a q4kh_cv_pair (gemv_glu, ABI 1.4): the
 * sums over the warp, then y[i + c * ldy] = act(gate row i) * (up row i)
 * through the cuda backend's expression (q4khost/cuda_glu.cuh), SiLU with
 * silu, else the tanh GELU; R even.
 */
struct q4kh_cv_glu_store {
	float *y; /* column c at y + c * ldy */
	int64_t ldy;
	bool silu;

	template <int R, int T>
	__device__ __forceinline__ void store(float (&acc)[R][T], int64_t row0,
	                                      int64_t n) const
	{
		const int lane = threadIdx.x & 31;

		q4kh_cv_warp_sum<R, T>(acc);
#pragma unroll
		for (int q = 0; q < R / 2; q++)
#pragma unroll
			for (int c = 0; c < T; c++)
				if ((q * T + c) % 32 == lane && row0 + 2 * q < n)
					y[(row0 >> 1) + q + c * ldy] = q4kh_cuda_glu_value(
						silu, acc[2 * q][c], acc[2 * q + 1][c]);
	}
};

/*
 * The matrix of gemv_multi's block BLOCK among COUNT (q4kh_cv_multi_split's
 * FIRST), and its blocks [*begin, *end): constant indices only, so that
 * a kernel's arguments stay in the constant bank.
 */
__device__ __forceinline__ int q4kh_cv_multi_which(const unsigned (&first)[Q4KH_GEMV_MULTI_MAX + 1],
                                                   int count, unsigned block, unsigned *begin,
                                                   unsigned *end)
{
	int i = 0;

	*begin = 0;
	*end = first[1];
#pragma unroll
	for (int j = 1; j < Q4KH_GEMV_MULTI_MAX; j++)
		if (j < count && block >= first[j]) {
			i = j;
			*begin = first[j];
			*end = first[j + 1];
		}
	return i;
}

/* One matrix of a gemv_multi launch, as its kernel takes it. */
struct q4kh_cv_multi_mat {
	const uint8_t *w; /* the prepared rows (q4kh_prepared's data) */
	int64_t stride;
	int64_t n;
	float *y;
	int64_t ldy;
	const float *bias; /* NULL: none */
	uint32_t type;     /* q4kh_prepared's type */
};

/*
 * What a gemv_multi kernel takes by value: every matrix, where its blocks
 * start (q4kh_cv_multi_split) and the activations they all read.
 */
struct q4kh_cv_multi_args {
	q4kh_cv_multi_mat m[Q4KH_GEMV_MULTI_MAX];
	unsigned first[Q4KH_GEMV_MULTI_MAX + 1]; /* matrix i: [first[i], first[i + 1]) */
	int count;
	int64_t k; /* the same for every matrix */
	const float *x;
	int64_t ldx;
};

/*
 * The matrix of A this block streams (q4kh_cv_multi_which), and this
 * warp's index *WARP among the *WARPS of that matrix's blocks.
 */
__device__ __forceinline__ q4kh_cv_multi_mat q4kh_cv_multi_block(const q4kh_cv_multi_args &a,
                                                                 int64_t *warp, int64_t *warps)
{
	static_assert(Q4KH_GEMV_MULTI_MAX == 4, "one constant index a matrix");
	const int64_t per_block = blockDim.x >> 5;
	unsigned begin, end;
	const int i = q4kh_cv_multi_which(a.first, a.count, blockIdx.x, &begin, &end);

	*warp = (int64_t)(blockIdx.x - begin) * per_block + (threadIdx.x >> 5);
	*warps = (int64_t)(end - begin) * per_block;
	return i == 0 ? a.m[0] : i == 1 ? a.m[1] : i == 2 ? a.m[2] : a.m[3];
}

/* y {N, T} = W x with format F; see the top of this file. */
template <int T, int R, int U, class F>
__global__ void __launch_bounds__(Q4KH_CV_MAX_WARPS * 32)
q4kh_cv_stream_kernel(F f, int64_t n, float *__restrict__ y, int64_t ldy)
{
	q4kh_cv_stream_rows<T, R, U, F>(
		f, (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5),
		(int64_t)gridDim.x * (blockDim.x >> 5), n, y, ldy, NULL);
}

/* Rows per warp for N rows over SMS multiprocessors (see q4kh_cv_stream_cols). */
static inline int q4kh_cv_stream_rows_per_warp(int64_t n, int sms)
{
	const int64_t per_sm = n / (sms > 0 ? sms : 1);

	return per_sm >= 64 ? 4 : per_sm >= 16 ? 2 : 1;
}

/* Blocks of WARPS warps that keep SMS multiprocessors full: 64 warps each. */
static inline int64_t q4kh_cv_stream_most_blocks(int warps, int sms)
{
	return (int64_t)(sms > 0 ? sms : 1) * (64 / warps);
}

/*
 * L.run<R, U>() for R_WANTED (4, 2 or 1) rows per warp and the pieces per
 * lane and step U that suit rows of PIECES pieces: 4 when a lane has more
 * than 2 pieces of a row, else 2; always 2 with 4 rows, whose loads fill
 * the registers already.
 */
template <class L>
static cudaError_t q4kh_cv_stream_pick(const L &l, int r_wanted, int pieces)
{
	if (r_wanted == 4)
		return l.template run<4, 2>();
	if (r_wanted == 2)
		return pieces > 64 ? l.template run<2, 4>() : l.template run<2, 2>();
	return pieces > 64 ? l.template run<1, 4>() : l.template run<1, 2>();
}

/*
 * Rows per warp for the 2N rows of a q4kh_cv_pair over SMS
 * multiprocessors: as q4kh_cv_stream_rows_per_warp, but at least one pair.
 */
static inline int q4kh_cv_pair_rows_per_warp(int64_t rows, int sms)
{
	return q4kh_cv_stream_rows_per_warp(rows, sms) == 4 ? 4 : 2;
}

/*
 * q4kh_cv_stream_pick for the 2N rows of a q4kh_cv_pair:
 * L.run<R, U>() for R_WANTED 4 or 2 (q4kh_cv_pair_rows_per_warp), U as
 * q4kh_cv_stream_pick takes it for rows of PIECES pieces.
 */
template <class L>
static cudaError_t q4kh_cv_pair_pick(const L &l, int r_wanted, int pieces)
{
	if (r_wanted == 4)
		return l.template run<4, 2>();
	return pieces > 64 ? l.template run<2, 4>() : l.template run<2, 2>();
}

/*
 * gemv_multi's grid: the blocks of WARPS warps each of the N matrices w
 * streams (matrix i: blocks [first[i], first[i + 1])), with rows per warp
 * R (returned) from all the rows the launch spreads over the
 * multiprocessors, as for one matrix: a block per WARPS row groups of each
 * matrix while MOST blocks take them all; beyond, MOST blocks in
 * proportion to the groups, one at least.
 */
static inline int q4kh_cv_multi_split(uint32_t n, const q4kh_prepared *const w[], int warps,
                                      int64_t most, unsigned first[])
{
	int64_t rows = 0, groups[Q4KH_GEMV_MULTI_MAX], total = 0, want = 0, blocks = 0;
	int r;

	for (uint32_t i = 0; i < n; i++)
		rows += w[i]->n;
	r = q4kh_cv_stream_rows_per_warp(rows, w[0]->multiprocessors);
	for (uint32_t i = 0; i < n; i++) {
		groups[i] = (w[i]->n + r - 1) / r;
		total += groups[i];
		want += (groups[i] + warps - 1) / warps;
	}
	first[0] = 0;
	for (uint32_t i = 0; i < n; i++) {
		int64_t b = want <= most ? (groups[i] + warps - 1) / warps : most * groups[i] / total;

		blocks += b > 0 ? b : 1;
		first[i + 1] = (unsigned)blocks;
	}
	return r;
}

/*
 * *A's matrices, count, k and activations for the N (1 ..
 * Q4KH_GEMV_MULTI_MAX) matrices w, of one k, and IO; its blocks are
 * q4kh_cv_multi_split's to cut.
 */
static inline void q4kh_cv_multi_bind(q4kh_cv_multi_args *a, uint32_t n,
                                      const q4kh_prepared *const w[],
                                      const q4kh_cv_multi_io *io)
{
	for (uint32_t i = 0; i < n; i++) {
		a->m[i].w = (const uint8_t *)w[i]->data;
		a->m[i].stride = w[i]->stride;
		a->m[i].n = w[i]->n;
		a->m[i].y = io->y[i];
		a->m[i].ldy = io->ldy[i];
		a->m[i].bias = io->bias[i];
		a->m[i].type = w[i]->type;
	}
	a->count = (int)n;
	a->k = w[0]->k;
	a->x = io->x;
	a->ldx = io->ldx;
}

/* q4kh_cv_stream_kernel's launch for q4kh_cv_stream_pick. */
template <int T, class F>
struct q4kh_cv_stream_launcher {
	const F &f;
	int64_t n;
	float *y;
	int64_t ldy;
	unsigned blocks;
	int threads;
	bool pdl;
	cudaStream_t s;

	template <int R, int U>
	cudaError_t run() const
	{
		return q4kh_pdl_launch(pdl, q4kh_cv_stream_kernel<T, R, U, F>, blocks, threads, 0,
		                       s, f, n, y, ldy);
	}
};

/* q4kh_cv_stream_kernel's load, for q4kh_cv_stream_pick. */
template <int T, class F>
struct q4kh_cv_stream_loader {
	template <int R, int U>
	cudaError_t run() const
	{
		return q4kh_preload(q4kh_cv_stream_kernel<T, R, U, F>);
	}
};

/*
 * Launch F's kernel for T columns of an N-row matrix: rows per warp by how
 * many row groups there are to spread over the SMS multiprocessors (4 when
 * each still gets 16 warps), pieces per lane and step by the row's length;
 * as a programmatic dependent when PDL (q4kh_pdl_launch: the io's pdl).
 */
template <int T, class F>
static cudaError_t q4kh_cv_stream_cols(const F &f, int64_t n, float *y, int64_t ldy,
                                       int warps, int sms, bool pdl, cudaStream_t s)
{
	const int r = q4kh_cv_stream_rows_per_warp(n, sms);
	const int64_t groups = (n + r - 1) / r;
	const int64_t want = (groups + warps - 1) / warps;
	const int64_t most = q4kh_cv_stream_most_blocks(warps, sms);
	const q4kh_cv_stream_launcher<T, F> l = {
		f, n, y, ldy, (unsigned)(want < most ? want : most), 32 * warps, pdl, s
	};

	return q4kh_cv_stream_pick(l, r, f.pieces);
}

/*
 * l(std::integral_constant<int, T>()) for T = COLS (1 .. Q4KH_CV_MAX_COLUMNS):
 * from a run-time column count to the kernels' template parameter, for a
 * generic lambda that reads T as decltype(t)::value.
 */
template <class L>
static cudaError_t q4kh_cv_for_cols(int64_t cols, const L &l)
{
	switch (cols) {
#define Q4KH_CV_COLS(T) \
	case T: return l(std::integral_constant<int, T>())
	Q4KH_CV_COLS(1);
	Q4KH_CV_COLS(2);
	Q4KH_CV_COLS(3);
	Q4KH_CV_COLS(4);
	Q4KH_CV_COLS(5);
	Q4KH_CV_COLS(6);
	Q4KH_CV_COLS(7);
	Q4KH_CV_COLS(8);
#undef Q4KH_CV_COLS
	default: return cudaErrorInvalidValue;
	}
}

/* The same for COLS (1 .. Q4KH_CV_MAX_COLUMNS) columns. */
template <class F>
static cudaError_t q4kh_cv_stream_launch(const F &f, int cols, int64_t n, float *y,
                                         int64_t ldy, int warps, int sms, bool pdl,
                                         cudaStream_t s)
{
	return q4kh_cv_for_cols(cols, [&](auto t) {
		return q4kh_cv_stream_cols<decltype(t)::value, F>(f, n, y, ldy, warps, sms, pdl,
		                                                  s);
	});
}

/*
 * For each column count T (1 .. Q4KH_CV_MAX_COLUMNS), every run<R, U>()
 * that q4kh_cv_stream_pick may call on MAKE(std::integral_constant<int,
 * T>()): for a variant's preload (cuda_variant.h), with a loader whose
 * run<R, U>() loads its kernel for T, R and U (q4kh_preload). The first
 * error, or cudaSuccess.
 */
template <class M>
static cudaError_t q4kh_cv_pick_all(const M &make)
{
	cudaError_t e = cudaSuccess;

	for (int cols = 1; cols <= Q4KH_CV_MAX_COLUMNS && e == cudaSuccess; cols++)
		e = q4kh_cv_for_cols(cols, [&](auto t) {
			const auto l = make(t);
			cudaError_t e = cudaSuccess;

			/* rows per warp 4, 2, 1; pieces 64 and 65: both U */
			for (int r = 4; r >= 1 && e == cudaSuccess; r /= 2)
				for (int pieces = 64; pieces <= 65 && e == cudaSuccess; pieces++)
					e = q4kh_cv_stream_pick(l, r, pieces);
			return e;
		});
	return e;
}

/* Load every kernel q4kh_cv_stream_launch may launch for format F. */
template <class F>
static cudaError_t q4kh_cv_stream_preload(void)
{
	return q4kh_cv_pick_all(
		[](auto t) { return q4kh_cv_stream_loader<decltype(t)::value, F>(); });
}

#endif
