/*
 * The mixture-of-experts ops (cuda_kernels.h: moe_route, mul_mat_id) as
 * llama.cpp's build_moe_ffn computes them with softmax gating, on the
 * device from the router's logits to the experts' products: nothing is
 * read back to the host, so a step that holds them records and replays
 * as a CUDA graph.
 *
 * mul_mat_id's grouping (more columns than a decode's): one block counts
 * each expert's columns (a warp per expert, a ballot over 32 columns at a
 * time, so the order within an expert is the columns' order), lays the
 * experts' runs and tiles out by a prefix sum, and writes each column's
 * place; the columns of x are gathered into those places, each tile runs
 * through its expert's matrix (cuda_moe.cuh), and the products go back to
 * y's columns. Every launch is sized by the most tiles the routing can
 * make; the blocks past the count the grouping wrote return at once.
 */
#include "cuda_common.cuh"
#include "cuda_gemv.cuh"
#include "cuda_kernels.h"
#include "cuda_moe.cuh"
#include "q4khost/cuda_glu.cuh"
#include "q4khost/cuda_pdl.cuh"
#include "q4khost/cuda_quant.cuh"

#define RT_WARPS 4        /* moe_route: columns per block, up to 512 experts */
#define SORT_THREADS 1024 /* the grouping's one block */
#define MOVE_THREADS 256  /* gathering and scattering columns */

/* The better of two candidates (value, index): a valid one (index >= 0)
 * over none, the larger value, the lower index among equal values. */
static __device__ __forceinline__ bool rt_better(double v, int i, double bv, int bi)
{
	return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

/*
 * The warp's best candidate, as rt_better picks it, into every lane's BV
 * and BI. From sm_80 by the warp's 32-bit reductions: a valid value is a
 * probability, a non-negative double, which orders as its bits; the high
 * halves (plus 1, 0 for none), then the low halves of the lanes with the
 * largest high half, then the lowest index with both. Before, by
 * exchanges of candidates.
 */
static __device__ __forceinline__ void rt_warp_best(double &bv, int &bi)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
	const unsigned long long bits = (unsigned long long)__double_as_longlong(bv);
	const unsigned hi = bi >= 0 ? (unsigned)(bits >> 32) + 1u : 0u, lo = (unsigned)bits;
	const unsigned mh = __reduce_max_sync(0xffffffffu, hi);
	const unsigned ml = __reduce_max_sync(0xffffffffu, hi == mh ? lo : 0u);
	const unsigned mi =
		__reduce_min_sync(0xffffffffu, hi == mh && lo == ml ? (unsigned)bi : 0xffffffffu);

	bi = mh ? (int)mi : -1;
	bv = __longlong_as_double((long long)((unsigned long long)(mh - 1u) << 32 | ml));
#else
	for (int o = 16; o > 0; o /= 2) {
		const double ov = __shfl_xor_sync(0xffffffffu, bv, o);
		const int oi = __shfl_xor_sync(0xffffffffu, bi, o);

		if (rt_better(ov, oi, bv, bi)) {
			bv = ov;
			bi = oi;
		}
	}
#endif
}

/*
 * One column's route, by one warp (LANE its lane): logits L of E experts
 * into the K chosen ids and their weights; P holds the probabilities (E
 * doubles, -1 once chosen) and W the chosen ones (K doubles), in shared
 * memory.
 */
static __device__ void route_column(const float *l, int64_t e, int64_t k, int norm, double *p,
                                    double *w, int32_t *ids, float *wts, int lane)
{
	double max = -INFINITY, sum = 0.0, chosen = 0.0;

	/* the reference's running max: logits[0] first, NaNs never taken
	 * after it (a NaN there stays) */
	for (int64_t i = lane; i < e; i += 32)
		max = (double)l[i] > max ? (double)l[i] : max;
	for (int o = 16; o > 0; o /= 2) {
		const double m = __shfl_xor_sync(0xffffffffu, max, o);

		max = m > max ? m : max;
	}
	if (l[0] != l[0])
		max = l[0];
	for (int64_t i = lane; i < e; i += 32) {
		p[i] = exp((double)l[i] - max);
		sum += p[i];
	}
	sum = warp_sum(sum);
	for (int64_t i = lane; i < e; i += 32)
		p[i] /= sum;
	__syncwarp();
	for (int64_t j = 0; j < k; j++) {
		double bv = 0.0;
		int bi = -1;

		for (int64_t i = lane; i < e; i += 32)
			if (p[i] >= 0.0 && rt_better(p[i], (int)i, bv, bi)) {
				bv = p[i];
				bi = (int)i;
			}
		rt_warp_best(bv, bi);
		if (bi < 0) { /* NaN logits: the lowest index not yet chosen */
			int lo = (int)e;

			for (int64_t i = lane; i < e && lo == (int)e; i += 32)
				if (p[i] != -1.0)
					lo = (int)i;
			for (int o = 16; o > 0; o /= 2) {
				const int ol = __shfl_xor_sync(0xffffffffu, lo, o);

				lo = ol < lo ? ol : lo;
			}
			bi = lo;
			bv = p[bi];
		}
		chosen += bv; /* every lane, in slot order */
		__syncwarp();
		if (lane == 0) {
			w[j] = bv;
			p[bi] = -1.0;
			ids[j] = bi;
		}
		__syncwarp();
	}
	for (int64_t j = lane; j < k; j += 32)
		wts[j] = (float)(norm ? w[j] / (chosen > 0x1p-14 ? chosen : 0x1p-14) : w[j]);
}

/*
 * moe_route: warp w of the block takes column t = blockIdx.x RT_WARPS + w,
 * its probabilities and chosen ones in dynamic shared memory.
 */
static __global__ void __launch_bounds__(32 * RT_WARPS)
moe_route_kernel(struct cuda_view logits, int norm, struct cuda_view ids, struct cuda_view wts,
                 int warps)
{
	extern __shared__ double rt_shared[];
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const int64_t t = (int64_t)blockIdx.x * warps + warp, e = logits.ne[0], k = ids.ne[0];

	if (t >= logits.ne[1])
		return; /* the whole warp */
	route_column((const float *)(logits.data + t * logits.nb[1]), e, k, norm,
	             rt_shared + warp * (e + k), rt_shared + warp * (e + k) + e,
	             (int32_t *)(ids.data + t * ids.nb[1]), (float *)(wts.data + t * wts.nb[1]),
	             lane);
}

/* Warps of moe_route's block for E experts and K chosen: RT_WARPS while
 * their shared memory stays within 48 KiB, else 1. */
static int rt_warps(int64_t e, int64_t k)
{
	return (e + k) * 8 * RT_WARPS <= (48 << 10) ? RT_WARPS : 1;
}

extern "C" cudaError_t cuda_launch_moe_route(const struct cuda_view *logits, int norm,
                                             const struct cuda_view *ids,
                                             const struct cuda_view *weights, cudaStream_t s)
{
	const int warps = rt_warps(logits->ne[0], ids->ne[0]);
	const size_t shm = (size_t)(logits->ne[0] + ids->ne[0]) * 8 * (size_t)warps;

	moe_route_kernel<<<grid_for(logits->ne[1], warps), 32 * warps, shm, s>>>(
		*logits, norm, *ids, *weights, warps);
	return cudaGetLastError();
}

/* --- mul_mat_id ------------------------------------------------------------ */

/* Where the grouping lives in the scratch (each part 256-aligned). */
struct moe_layout {
	size_t head, tiles, perm, xs, ys, bytes;
	int64_t n, max_tiles;
};

static size_t align256(size_t v)
{
	return (v + 255) / 256 * 256;
}

/* The direct form for K T columns of E experts: fewer than two columns
 * an expert on average, where grouping shares too few weight reads to
 * pay for its three launches. */
extern "C" int cuda_mul_mat_id_direct(int64_t cols, int64_t e)
{
	return cols < 2 * e;
}

static moe_layout moe_layout_of(const struct cuda_view *w, const struct cuda_view *ids)
{
	moe_layout l;

	l.n = ids->ne[0] * ids->ne[1];
	/* a tile per CUDA_MOE_TILE columns, and one part-filled per expert */
	l.max_tiles = l.n / CUDA_MOE_TILE + (w->ne[2] < l.n ? w->ne[2] : l.n);
	l.head = 0;
	l.tiles = align256(2 * sizeof(int32_t));
	l.perm = l.tiles + align256((size_t)l.max_tiles * 3 * sizeof(int32_t));
	l.xs = l.perm + align256((size_t)l.n * sizeof(int32_t));
	l.ys = l.xs + align256((size_t)(l.n * w->ne[0]) * sizeof(float));
	l.bytes = l.ys + align256((size_t)(l.n * w->ne[1]) * sizeof(float));
	return l;
}

/* Column i's expert: ids {S, T}, column i = t S + j at row t, slot j. */
static __device__ __forceinline__ int32_t sort_id(const int32_t *ids, int64_t ids_col, int64_t s,
                                                  int64_t i)
{
	return ids[i / s * ids_col + i % s];
}

/*
 * The grouping, one block of SORT_THREADS: head[0] the tiles, head[1] the
 * columns placed (those with a valid id); tiles as cuda_moe.cuh's grouped
 * form; perm[place] = column. Shared: three E ints (counts, first place,
 * first tile). An id outside [0, E) is kept as the stream's fault and its
 * column placed nowhere.
 */
static __global__ void __launch_bounds__(SORT_THREADS)
moe_sort_kernel(const int32_t *ids, int64_t ids_col, int64_t s, int64_t n, int32_t e,
                int32_t *head, int32_t *tiles, int32_t *perm, int32_t *fault)
{
	extern __shared__ int32_t sort_shared[];
	int32_t *cnt = sort_shared, *first = cnt + e, *tile0 = first + e;
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		index_ok(fault, CUDA_FAULT_MUL_MAT_ID_IDS, i, sort_id(ids, ids_col, s, i), e);
	for (int32_t x = warp; x < e; x += warps) {
		int32_t c = 0;

		for (int64_t i0 = 0; i0 < n; i0 += 32) {
			const int64_t i = i0 + lane;

			c += __popc(__ballot_sync(0xffffffffu,
			                          i < n && sort_id(ids, ids_col, s, i) == x));
		}
		if (lane == 0)
			cnt[x] = c;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t col = 0, tile = 0;

		for (int32_t x = 0; x < e; x++) {
			first[x] = col;
			tile0[x] = tile;
			col += cnt[x];
			tile += (cnt[x] + CUDA_MOE_TILE - 1) / CUDA_MOE_TILE;
		}
		head[0] = tile;
		head[1] = col;
	}
	__syncthreads();
	for (int32_t x = warp; x < e; x += warps) {
		int32_t at = first[x];

		if (!cnt[x])
			continue; /* the whole warp */
		for (int32_t c = lane; c * CUDA_MOE_TILE < cnt[x]; c += 32) {
			int32_t *d = tiles + 3 * (tile0[x] + c);
			const int32_t left = cnt[x] - c * CUDA_MOE_TILE;

			d[0] = x;
			d[1] = first[x] + c * CUDA_MOE_TILE;
			d[2] = left < CUDA_MOE_TILE ? left : CUDA_MOE_TILE;
		}
		for (int64_t i0 = 0; i0 < n; i0 += 32) {
			const int64_t i = i0 + lane;
			const unsigned m = __ballot_sync(0xffffffffu,
			                                 i < n && sort_id(ids, ids_col, s, i) == x);

			if (m >> lane & 1)
				perm[at + __popc(m & ((1u << lane) - 1))] = (int32_t)i;
			at += __popc(m);
		}
	}
}

/*
 * Columns between x's places and the gathered ones: place p < head[1]
 * holds column perm[p] = t S + j, which is x's (j % X, t) (GATHER) or y's
 * (j, t) (else); the gathered columns are ROWS floats apart.
 */
static __global__ void __launch_bounds__(MOVE_THREADS)
moe_move_kernel(bool gather, const int32_t *head, const int32_t *perm, int64_t n, int64_t rows,
                struct cuda_view v, int64_t s, float *packed)
{
	for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < n * rows;
	     it += (int64_t)gridDim.x * blockDim.x) {
		const int64_t p = it / rows, r = it % rows;

		if (p >= head[1])
			break; /* every later item of this thread is past it too */
		const int64_t i = perm[p], t = i / s, j = i % s;
		float *col = (float *)(v.data + (gather ? j % v.ne[1] : j) * v.nb[1] + t * v.nb[2]);

		if (gather)
			packed[p * rows + r] = col[r];
		else
			col[r] = packed[p * rows + r];
	}
}

extern "C" size_t cuda_mul_mat_id_scratch(const struct cuda_view *w,
                                          const struct cuda_view *ids)
{
	return cuda_mul_mat_id_direct(ids->ne[0] * ids->ne[1], w->ne[2]) ? 0 : moe_layout_of(w, ids).bytes;
}

/* The products of tile list M (TILES of at most C columns, x's address
 * bits XA): the GEMV formats where they take w and x, else the plain
 * kernel. */
static cudaError_t moe_products(const moe_tiles &m, uint32_t type, int64_t tiles, int c,
                                uintptr_t xa, int sms, cudaStream_t s)
{
	const cudaError_t e = cuda_gemv_grouped_launch(m, type, tiles, c, xa, sms, s);

	return e != cudaErrorNotSupported ? e : cuda_mm_grouped_launch(m, type, tiles, s);
}

extern "C" cudaError_t cuda_launch_mul_mat_id(const struct cuda_view *w,
                                              const struct cuda_view *x,
                                              const struct cuda_view *ids,
                                              const struct cuda_view *y, void *scratch,
                                              int sms, int32_t *fault, cudaStream_t s)
{
	const int64_t S = ids->ne[0], T = ids->ne[1], n = S * T;
	moe_tiles m = {};
	cudaError_t e;

	m.w = (const uint8_t *)w->data;
	m.w_exp = w->nb[2];
	m.w_row = w->nb[1];
	m.n = w->ne[1];
	m.k = w->ne[0];
	m.e = w->ne[2];
	m.ids = (const int32_t *)ids->data;
	m.ids_col = ids->nb[1] / 4;
	m.s = S;
	m.fault = fault;
	if (cuda_mul_mat_id_direct(n, m.e)) {
		m.x = (const float *)x->data;
		m.y = (float *)y->data;
		m.xs = x->ne[1];
		m.x_slot = x->nb[1] / 4;
		m.x_tok = x->nb[2] / 4;
		m.y_slot = y->nb[1] / 4;
		m.y_tok = y->nb[2] / 4;
		return moe_products(m, w->type, n, 1,
		                    (uintptr_t)x->data | (uintptr_t)(x->ne[1] > 1 ? x->nb[1] : 0) |
		                            (uintptr_t)(T > 1 ? x->nb[2] : 0),
		                    sms, s);
	}
	const moe_layout l = moe_layout_of(w, ids);
	char *base = (char *)scratch;
	int32_t *head = (int32_t *)(base + l.head), *perm = (int32_t *)(base + l.perm);
	float *xs = (float *)(base + l.xs), *ys = (float *)(base + l.ys);

	m.tiles = (const int32_t *)(base + l.tiles);
	m.count = head;
	m.x = xs;
	m.y = ys;
	moe_sort_kernel<<<1, SORT_THREADS, 3 * sizeof(int32_t) * (size_t)m.e, s>>>(
		m.ids, m.ids_col, S, n, (int32_t)m.e, head, (int32_t *)m.tiles, perm, fault);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	moe_move_kernel<<<grid_for(n * m.k, MOVE_THREADS), MOVE_THREADS, 0, s>>>(
		true, head, perm, n, m.k, *x, S, xs);
	if ((e = cudaGetLastError()) != cudaSuccess ||
	    (e = moe_products(m, w->type, l.max_tiles, CUDA_MOE_TILE,
	                      (uintptr_t)xs | (uintptr_t)(m.k * 4), sms, s)) != cudaSuccess)
		return e;
	moe_move_kernel<<<grid_for(n * m.n, MOVE_THREADS), MOVE_THREADS, 0, s>>>(
		false, head, perm, n, m.n, *y, S, ys);
	return cudaGetLastError();
}

/* --- a decode's block, fused ---------------------------------------------- */

/*
 * cuda_launch_moe_fused's arguments on the device (cuda_kernels.h): the
 * route, the experts' stacks (expert e at w + e exp, rows row bytes apart)
 * and the columns, strides in floats (int32s for ids).
 */
struct moe_fused {
	const float *logits;
	int32_t *ids;
	float *wts;
	const float *x;
	float *h, *out;
	const uint8_t *wg, *wu, *wd;
	int64_t l_tok, ids_tok, wts_tok, x_tok, h_slot, h_tok, out_tok;
	int64_t g_exp, g_row, u_exp, u_row, d_exp, d_row;
	int64_t e, k, f, n;      /* experts, chosen, rows of gate and up, of down */
	int64_t bpt_glu, bpt_down; /* blocks a token */
	int norm, ks_glu, ks_down;
};

/* Rows of a matrix a warp task takes: gv_block's for one column. */
#define FUSED_ROWS gv_rows(1)

/*
 * A walk of ks warps (KP this warp's place) over rows b[0 .. R - 1] of K
 * values times column X, summed as gv_block sums a row: each lane's
 * products in unit order, the warp's lanes in warp_sum's tree, then the
 * ks warps' sums in warp order through PART (GV_WARPS R floats; SYNC
 * reached by every warp of the block). Lane r < R of the slot's first
 * warp returns row r's sum.
 */
template <uint32_t TYPE, int R, int U>
static __device__ __forceinline__ float fused_rows(const uint8_t *const (&b)[R], const float *x,
                                                   int64_t k, int ks, int kp, bool walk,
                                                   float *part)
{
	typedef gv_fmt<TYPE> F;
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const int units = (int)((k + GV_UNIT - 1) / GV_UNIT);
	const typename F::lane_t L = F::lane_init(lane, k, units);
	gv_pos<1, R> p;
	float acc[R][1], mine = 0.0f;

	p.u = kp * U;
	p.stride = ks * U;
	p.units = units;
	p.full = (int)(k / GV_UNIT);
	p.bstep = (int64_t)p.stride * F::UB;
	p.xstep = (int64_t)p.stride * GV_UNIT;
#pragma unroll
	for (int r = 0; r < R; r++) {
		p.b[r] = b[r] + (int64_t)p.u * F::UB;
		acc[r][0] = 0.0f;
	}
	p.x[0] = x + (int64_t)p.u * GV_UNIT + L.x0;
	if (walk)
		gv_walk<TYPE, 1, R, U>(acc, p, L, lane);
#pragma unroll
	for (int r = 0; r < R; r++) {
		acc[r][0] = warp_sum(acc[r][0]);
		if (r == lane)
			mine = acc[r][0];
	}
	if (ks > 1) {
		if (lane < R)
			part[warp * R + lane] = mine;
		__syncthreads();
		if (kp == 0 && lane < R) {
			float s = 0.0f;

			for (int w = 0; w < ks; w++)
				s += part[(warp + w) * R + lane];
			mine = s;
		}
		__syncthreads();
	}
	return mine;
}

/*
 * Route, gate, up and their GLU of token t = blockIdx.x / bpt_glu: warp 0
 * routes the token into shared memory (block 0 of the token writes its ids
 * and weights), then slots of ks_glu warps take tasks (slot j, R rows of
 * gate and up of expert ids[j]) and write act(gate) up into h (j, t).
 * U units a step: with ks_glu > 1 mul_mat_id's (it decides which units
 * each warp sums); with 1, any (each lane sums every unit in order), and
 * the launch takes the fewer registers of 2 columns' (2 R rows a step).
 * Dynamic shared memory: E + k doubles, k ints, k floats; at most 128
 * registers a thread, 4 blocks a multiprocessor, as gv_kernel.
 */
template <uint32_t TYPE, int U>
static __global__ void __launch_bounds__(GV_THREADS, 4) moe_glu_kernel(moe_fused f)
{
	extern __shared__ double fu_shared[];
	constexpr int R = FUSED_ROWS;
	__shared__ float part[GV_WARPS * 2 * R];
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const int64_t t = blockIdx.x / f.bpt_glu, b0 = blockIdx.x % f.bpt_glu;
	int32_t *ids = (int32_t *)(fu_shared + f.e + f.k);
	float *wts = (float *)(ids + f.k);

	q4kh_pdl_release();
	q4kh_pdl_wait(); /* the router's logits, x */
	if (warp == 0)
		route_column(f.logits + t * f.l_tok, f.e, f.k, f.norm, fu_shared, fu_shared + f.e, ids,
		             wts, lane);
	__syncthreads();
	if (b0 == 0)
		for (int64_t j = threadIdx.x; j < f.k; j += blockDim.x) {
			f.ids[t * f.ids_tok + j] = ids[j];
			f.wts[t * f.wts_tok + j] = wts[j];
		}
	const int slots = GV_WARPS / f.ks_glu, slot = warp / f.ks_glu, kp = warp % f.ks_glu;
	const int64_t groups = (f.f + R - 1) / R, tasks = f.k * groups;

	for (int64_t tb = b0; tb * slots < tasks; tb += f.bpt_glu) {
		const int64_t task = tb * slots + slot, j = task / groups, row0 = task % groups * R;
		const bool walk = task < tasks;
		const uint8_t *b[2 * R];

#pragma unroll
		for (int r = 0; r < R; r++) {
			const int64_t row = row0 + r < f.f ? row0 + r : f.f - 1, ex = walk ? ids[j] : 0;

			b[r] = f.wg + ex * f.g_exp + row * f.g_row;
			b[R + r] = f.wu + ex * f.u_exp + row * f.u_row;
		}
		const float v = fused_rows<TYPE, 2 * R, U>(b, f.x + t * f.x_tok, f.n, f.ks_glu, kp,
		                                           walk, part);
		/* lane r holds gate row r, lane R + r up row r */
		const float up = __shfl_sync(0xffffffffu, v, lane + R);

		if (walk && kp == 0 && lane < R && row0 + lane < f.f)
			f.h[t * f.h_tok + j * f.h_slot + row0 + lane] = q4kh_cuda_glu_value(true, v, up);
	}
}

/*
 * Down and the weighted sum of the slots of token t = blockIdx.x /
 * bpt_down: a block takes R rows at a time, its slots of ks_down warps the
 * k chosen experts' rows in turn (column h (j, t)), and lane r of the
 * block's first warp adds row r's products times their weights in slot
 * order, as the unfused mul and adds do. Dynamic shared memory: k ints, k
 * floats, k R floats.
 */
template <uint32_t TYPE>
static __global__ void __launch_bounds__(GV_THREADS) moe_down_kernel(moe_fused f)
{
	extern __shared__ double fu_shared[];
	constexpr int R = FUSED_ROWS, U = gv_units(TYPE, 1);
	__shared__ float part[GV_WARPS * R];
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const int64_t t = blockIdx.x / f.bpt_down, b0 = blockIdx.x % f.bpt_down;
	int32_t *ids = (int32_t *)fu_shared;
	float *wts = (float *)(ids + f.k), *prod = wts + f.k;
	const int slots = GV_WARPS / f.ks_down, slot = warp / f.ks_down, kp = warp % f.ks_down;
	const int64_t groups = (f.n + R - 1) / R;

	q4kh_pdl_release();
	q4kh_pdl_wait(); /* moe_glu_kernel's ids, weights and h */
	for (int64_t j = threadIdx.x; j < f.k; j += blockDim.x) {
		ids[j] = f.ids[t * f.ids_tok + j];
		wts[j] = f.wts[t * f.wts_tok + j];
	}
	__syncthreads();
	for (int64_t g = b0; g < groups; g += f.bpt_down) {
		const int64_t row0 = g * R;

		for (int64_t j0 = 0; j0 < f.k; j0 += slots) {
			const int64_t j = j0 + slot;
			const bool walk = j < f.k;
			const uint8_t *b[R];

#pragma unroll
			for (int r = 0; r < R; r++)
				b[r] = f.wd + (walk ? ids[j] : 0) * f.d_exp +
				       (row0 + r < f.n ? row0 + r : f.n - 1) * f.d_row;
			const float v = fused_rows<TYPE, R, U>(
				b, f.h + t * f.h_tok + (walk ? j : 0) * f.h_slot, f.f, f.ks_down, kp, walk,
				part);

			if (walk && kp == 0 && lane < R)
				prod[j * R + lane] = v;
		}
		__syncthreads();
		if (threadIdx.x < R && row0 + threadIdx.x < f.n) {
			float s = __fmul_rn(prod[threadIdx.x], wts[0]);

			for (int64_t j = 1; j < f.k; j++)
				s = __fadd_rn(s, __fmul_rn(prod[j * R + threadIdx.x], wts[j]));
			f.out[t * f.out_tok + row0 + threadIdx.x] = s;
		}
		__syncthreads();
	}
}

/*
 * Blocks a token for TASKS of SLOTS a block, for T tokens of KERNEL
 * (SHM bytes of dynamic shared memory) on SMS multiprocessors: at most
 * one wave of the blocks the device holds at once (the grid then walks
 * the tasks), since every block pays its prologue (moe_glu_kernel's
 * route) once, before any weight moves. In *OUT; the occupancy query's
 * error, or cudaSuccess.
 */
template <typename K>
static cudaError_t fused_blocks(K kernel, size_t shm, int sms, int64_t T, int64_t tasks,
                                int slots, int64_t *out)
{
	const int64_t b = (tasks + slots - 1) / slots;
	int per_sm = 0;
	const cudaError_t e =
		cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GV_THREADS, shm);
	int64_t wave = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1) / T;

	wave = wave > 0 ? wave : 1;
	*out = b < wave ? b : wave;
	return e;
}

extern "C" cudaError_t cuda_launch_moe_fused(const struct cuda_moe_fused_views *v, int norm,
                                             int sms, int pdl, cudaStream_t s)
{
	const int64_t T = v->logits.ne[1];
	const uintptr_t xa = (uintptr_t)v->x.data | (uintptr_t)(T > 1 ? v->x.nb[2] : 0);
	const uintptr_t ha = (uintptr_t)v->h.data | (uintptr_t)v->h.nb[1] |
	                     (uintptr_t)(T > 1 ? v->h.nb[2] : 0);
	moe_fused f;
	cudaError_t e;

	if (v->gate.type != v->up.type || !cuda_mul_mat_id_direct(v->ids.ne[0] * T, v->gate.ne[2]))
		return cudaErrorNotSupported;
	f.logits = (const float *)v->logits.data;
	f.ids = (int32_t *)v->ids.data;
	f.wts = (float *)v->weights.data;
	f.x = (const float *)v->x.data;
	f.h = (float *)v->h.data;
	f.out = (float *)v->out.data;
	f.wg = (const uint8_t *)v->gate.data;
	f.wu = (const uint8_t *)v->up.data;
	f.wd = (const uint8_t *)v->down.data;
	f.l_tok = v->logits.nb[1] / 4;
	f.ids_tok = v->ids.nb[1] / 4;
	f.wts_tok = v->weights.nb[1] / 4;
	f.x_tok = v->x.nb[2] / 4;
	f.h_slot = v->h.nb[1] / 4;
	f.h_tok = v->h.nb[2] / 4;
	f.out_tok = v->out.nb[1] / 4;
	f.g_exp = v->gate.nb[2];
	f.g_row = v->gate.nb[1];
	f.u_exp = v->up.nb[2];
	f.u_row = v->up.nb[1];
	f.d_exp = v->down.nb[2];
	f.d_row = v->down.nb[1];
	f.e = v->logits.ne[0];
	f.k = v->ids.ne[0];
	f.f = v->gate.ne[1];
	f.n = v->gate.ne[0];
	f.norm = norm;
	/* the rows split as mul_mat_id's direct form splits them */
	if ((e = cuda_gemv_grouped_split(v->gate.type, f.f, f.n, f.k * T, sms, &f.ks_glu)) ||
	    (e = cuda_gemv_grouped_split(v->down.type, f.n, f.f, f.k * T, sms, &f.ks_down)))
		return e;
	const size_t shm_glu = (size_t)(f.e + f.k) * 8 + (size_t)f.k * 8;
	const size_t shm_down = (size_t)f.k * (8 + 4 * FUSED_ROWS);

	e = q4kh_for_type(v->gate.type, [&](auto ty) {
		constexpr uint32_t TY = decltype(ty)::value;
		const uintptr_t wa = (uintptr_t)f.wg | (uintptr_t)f.wu | (uintptr_t)f.g_row |
		                     (uintptr_t)f.u_row | (uintptr_t)f.g_exp | (uintptr_t)f.u_exp;

		return gv_fits<TY>(wa, xa, f.n) ? cudaSuccess : cudaErrorNotSupported;
	});
	if (e == cudaSuccess)
		e = q4kh_for_type(v->down.type, [&](auto ty) {
			constexpr uint32_t TY = decltype(ty)::value;
			const uintptr_t wa = (uintptr_t)f.wd | (uintptr_t)f.d_row | (uintptr_t)f.d_exp;

			return gv_fits<TY>(wa, ha, f.f) ? cudaSuccess : cudaErrorNotSupported;
		});
	if (e != cudaSuccess || shm_glu > (48 << 10) || shm_down > (48 << 10))
		return e != cudaSuccess ? e : cudaErrorNotSupported;
	/* checked: both launch from here on, each at most one wave; both
	 * grids are sized before the first launch, which takes f by value */
	const int64_t glu_tasks = f.k * ((f.f + FUSED_ROWS - 1) / FUSED_ROWS);
	auto glu = [&](auto kernel) {
		return fused_blocks(kernel, shm_glu, sms, T, glu_tasks, GV_WARPS / f.ks_glu,
		                    &f.bpt_glu);
	};
	e = q4kh_for_type(v->gate.type, [&](auto ty) {
		constexpr uint32_t TY = decltype(ty)::value;
		constexpr int U1 = gv_units(TY, 1), U2 = gv_units(TY, 2);

		return f.ks_glu == 1 ? glu(moe_glu_kernel<TY, U2>) : glu(moe_glu_kernel<TY, U1>);
	});
	if (e == cudaSuccess)
		e = q4kh_for_type(v->down.type, [&](auto ty) {
			constexpr uint32_t TY = decltype(ty)::value;

			return fused_blocks(moe_down_kernel<TY>, shm_down, sms, T,
			                    (f.n + FUSED_ROWS - 1) / FUSED_ROWS, 1, &f.bpt_down);
		});
	if (e != cudaSuccess)
		return e;
	e = q4kh_for_type(v->gate.type, [&](auto ty) {
		constexpr uint32_t TY = decltype(ty)::value;
		constexpr int U1 = gv_units(TY, 1), U2 = gv_units(TY, 2);
		const unsigned grid = (unsigned)(f.bpt_glu * T);

		return f.ks_glu == 1
		               ? q4kh_pdl_launch(pdl != 0, moe_glu_kernel<TY, U2>, grid, GV_THREADS,
		                                 shm_glu, s, f)
		               : q4kh_pdl_launch(pdl != 0, moe_glu_kernel<TY, U1>, grid, GV_THREADS,
		                                 shm_glu, s, f);
	});
	if (e != cudaSuccess)
		return e;
	return q4kh_for_type(v->down.type, [&](auto ty) {
		constexpr uint32_t TY = decltype(ty)::value;

		return q4kh_pdl_launch(pdl != 0, moe_down_kernel<TY>, (unsigned)(f.bpt_down * T),
		                       GV_THREADS, shm_down, s, f);
	});
}
