/*
 * The cuda backend's GEMV (mul_mat with 1 to 8 activation columns per
 * pass), device side: the block's walk over rows (cuda_gemv.cu launches
 * it), through the format of each weight type (cuda_gemv_formats.cuh:
 * the units of 256 values, what each lane loads and computes, and the
 * F:: interface used below).
 *
 * gv_walk issues a step's loads before it computes the step before, so
 * two steps of loads per lane are in flight; every address is a pointer
 * kept per row and column plus constants.
 */
#ifndef Q4KH_CUDA_GEMV_CUH
#define Q4KH_CUDA_GEMV_CUH

#include "cuda_gemv_formats.cuh"

/* --- the block ---------------------------------------------------------- */

/* Rows per task for C columns: 2 for up to 2 (each activation load then
 * serves 2 rows), 4 for more (the activations' L1 traffic, C times the
 * weights' and more, limits those). */
static constexpr __host__ __device__ int gv_rows(int cols)
{
	return cols <= 2 ? 2 : 4;
}

/* Units per step (two steps are in flight): at one column, as many as
 * keep a step's loads near 8 words a row and lane (fewer for the wide
 * F32, F16, BF16, Q8_0, Q3_K and Q6_K units); half that at two columns; 1
 * beyond, where registers are short. */
static constexpr __host__ __device__ int gv_units(uint32_t type, int cols)
{
	return cols > 2 ? 1
	       : type == Q4KH_TYPE_F32 ? 1
	       : type == Q4KH_TYPE_F16 || type == Q4KH_TYPE_BF16 || type == Q4KH_TYPE_Q8_0 ||
	                       type == Q4KH_TYPE_Q3_K || type == Q4KH_TYPE_Q6_K
	               ? 3 - cols
	               : 8 / (2 * cols);
}

/* A walk's position: unit u of the rows b[r] and the lane's run 0 of it
 * in the columns x[c]; steps STRIDE units apart; whole units below FULL. */
template <int C, int R>
struct gv_pos {
	const uint8_t *b[R];
	const float *x[C];
	int u, stride, units, full;
	int64_t bstep, xstep;
};

/*
 * One whole step of a walk at P: issue the loads of the next step into
 * NEXT when it is whole too, compute CUR, move on. True while the next
 * step is whole (and so loaded).
 */
template <uint32_t TYPE, int C, int R, int U, class Raw>
static __device__ __forceinline__ bool gv_step(float (&acc)[R][C], gv_pos<C, R> &p,
                                               const Raw &cur, Raw &next,
                                               const typename gv_fmt<TYPE>::lane_t &L,
                                               int lane)
{
	typedef gv_fmt<TYPE> F;

#pragma unroll
	for (int r = 0; r < R; r++)
		p.b[r] += p.bstep;
	if (p.u + p.stride + U <= p.full)
		F::template load<false, R, U>(next, p.b, p.u + p.stride, p.units, L);
	F::template compute<false, C, R, U>(acc, cur, p.x, p.u, p.units, L, lane);
#pragma unroll
	for (int c = 0; c < C; c++)
		p.x[c] += p.xstep;
	p.u += p.stride;
	return p.u + U <= p.full;
}

/*
 * Units u, u + stride, ... (U at a time) of the rows into acc, each step's
 * loads issued before the step before it is computed, so two steps of
 * loads are in flight. Whole steps skip every check; the last, partial
 * step of a row, if any, is checked. A row of one whole step and a
 * partial one (640 values, two units a step) loads both at once: one
 * memory latency, not two; only formats whose rows need not be whole
 * units (32-value blocks and the float types; not the super-blocks) carry
 * that path.
 */
template <uint32_t TYPE, int C, int R, int U>
static __device__ __forceinline__ void gv_walk(float (&acc)[R][C], gv_pos<C, R> &p,
                                               const typename gv_fmt<TYPE>::lane_t &L,
                                               int lane)
{
	typedef gv_fmt<TYPE> F;
	typename F::template raw<R, U> p0, p1;
	const int whole = p.u + U <= p.full ? (p.full - U - p.u) / p.stride + 1 : 0;

	constexpr bool ragged = TYPE != Q4KH_TYPE_Q2_K && TYPE != Q4KH_TYPE_Q3_K &&
	                       TYPE != Q4KH_TYPE_Q4_K && TYPE != Q4KH_TYPE_Q5_K &&
	                       TYPE != Q4KH_TYPE_Q6_K && TYPE != Q4KH_TYPE_IQ4_XS;

	if (ragged && whole == 1 && p.u + p.stride < p.units) {
		const uint8_t *bt[R];

#pragma unroll
		for (int r = 0; r < R; r++)
			bt[r] = p.b[r] + p.bstep;
		F::template load<false, R, U>(p0, p.b, p.u, p.units, L);
		F::template load<true, R, U>(p1, bt, p.u + p.stride, p.units, L);
		F::template compute<false, C, R, U>(acc, p0, p.x, p.u, p.units, L, lane);
#pragma unroll
		for (int c = 0; c < C; c++)
			p.x[c] += p.xstep;
		F::template compute<true, C, R, U>(acc, p1, p.x, p.u + p.stride, p.units, L,
		                                   lane);
		return;
	}
	if (whole) {
		F::template load<false, R, U>(p0, p.b, p.u, p.units, L);
		while (gv_step<TYPE, C, R, U>(acc, p, p0, p1, L, lane) &&
		       gv_step<TYPE, C, R, U>(acc, p, p1, p0, L, lane))
			;
	}
	if (p.u < p.units) {
		F::template load<true, R, U>(p0, p.b, p.u, p.units, L);
		F::template compute<true, C, R, U>(acc, p0, p.x, p.u, p.units, L, lane);
	}
}

/* One launch: y {n, t} = w {k, n} x {k, t}; strides in bytes (w) and floats. */
struct gv_args {
	const uint8_t *w;
	const float *x;
	float *y;
	int64_t w_row, x_col, y_col;
	int64_t n, k, t;
	int units; /* (k + 255) / 256 */
	int ks;    /* warps that share a row: 1, 2 or 4 */
};

/*
 * Block BLOCK of BLOCKS, thread TID. The block's warps form GV_WARPS / ks
 * slots of ks warps; a slot takes R consecutive rows and C consecutive
 * columns at a time (a task), its warps take units 0 .. U - 1, U .. 2U - 1,
 * ... in turn, and the block walks tasks BLOCK, BLOCK + BLOCKS, ... (column
 * tiles fastest, so neighbouring blocks share rows in L2). With ks > 1 the
 * warps' sums meet in PART (GV_WARPS * R * C floats of shared memory) and
 * are added in warp order; SYNC() is __syncthreads(). Launched as a
 * programmatic dependent (q4khost/cuda_pdl.cuh), the block lets the next
 * kernel in at once and asks L2 for its first task's first step of
 * weights before it waits for the kernels before it (x is theirs).
 */
template <uint32_t TYPE, int C, int R, int U, class Sync>
static __device__ __forceinline__ void gv_block(const gv_args &g, int64_t block,
                                                int64_t blocks, int tid,
                                                float *part, Sync sync)
{
	typedef gv_fmt<TYPE> F;
	const int lane = tid % 32, warp = tid / 32;
	const int slots = GV_WARPS / g.ks, slot = warp / g.ks, kp = warp % g.ks;
	const int64_t groups = (g.n + R - 1) / R, tiles = (g.t + C - 1) / C;
	const int64_t tasks = (groups + slots - 1) / slots * tiles;
	const typename F::lane_t L = F::lane_init(lane, g.k, g.units);
	bool waiting = true; /* q4kh_pdl_wait not yet called */

	q4kh_pdl_release();
	for (int64_t task = block; task < tasks; task += blocks) {
		const int64_t grp = task / tiles * slots + slot;
		const int64_t row0 = grp * R, t0 = task % tiles * C;
		gv_pos<C, R> p;
		float acc[R][C];

		p.u = kp * U;
		p.stride = g.ks * U;
		p.units = g.units;
		p.full = (int)(g.k / GV_UNIT);
		p.bstep = (int64_t)p.stride * F::UB;
		p.xstep = (int64_t)p.stride * GV_UNIT;
#pragma unroll
		for (int r = 0; r < R; r++)
			p.b[r] = g.w + (row0 + r < g.n ? row0 + r : g.n - 1) * g.w_row +
			         (int64_t)p.u * F::UB;
		if (waiting) {
			if (grp < groups && p.u + U <= p.full)
#pragma unroll
				for (int r = 0; r < R; r++)
					q4kh_pdl_prefetch(p.b[r], U * F::UB, lane);
			q4kh_pdl_wait();
			waiting = false;
		}
#pragma unroll
		for (int c = 0; c < C; c++) {
			p.x[c] = g.x + (t0 + c < g.t ? t0 + c : g.t - 1) * g.x_col +
			         (int64_t)p.u * GV_UNIT + L.x0;
#pragma unroll
			for (int r = 0; r < R; r++)
				acc[r][c] = 0.0f;
		}
		if (grp < groups)
			gv_walk<TYPE, C, R, U>(acc, p, L, lane);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < C; c++)
				acc[r][c] = warp_sum(acc[r][c]);
		if (g.ks > 1) {
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int c = 0; c < C; c++)
					if (r * C + c == lane)
						part[warp * R * C + lane] = acc[r][c];
			sync();
			if (kp == 0 && lane < R * C) {
				float s = 0.0f;

				for (int w = 0; w < g.ks; w++)
					s += part[(warp + w) * R * C + lane];
#pragma unroll
				for (int r = 0; r < R; r++)
#pragma unroll
					for (int c = 0; c < C; c++)
						if (r * C + c == lane)
							acc[r][c] = s;
			}
			sync();
		}
		if (kp == 0 && grp < groups)
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int c = 0; c < C; c++)
					if (r * C + c == lane && row0 + r < g.n && t0 + c < g.t)
						g.y[(t0 + c) * g.y_col + row0 + r] = acc[r][c];
	}
	if (waiting)
		q4kh_pdl_wait();
}

#endif
