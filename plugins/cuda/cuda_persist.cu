/*
 * The persistent decode kernel: cuda_persist.h says what a launch does.
 *
 * Products. A warp takes R rows at a time over every warp of the grid (a
 * grid-stride loop over row groups of all the stage's matrices), lane l
 * the pieces l, l + 32, ... of each row (a piece: 32 values), the next
 * piece of all R rows loaded before any is used. The activations are in the
 * block's shared memory, laid out for the weights' type:
 *  - Q4_K (q4khost/cuda_q4k_device.cuh's pieces, cuda-mwv's arithmetic:
 *    the codes' sum through q4kh_q4k_half_plus and the run's sum of x):
 *    x permuted so that chunk c (4 values) of piece p of super-block sb
 *    sits at sb 256 + 32 c + 4 p, where the eight lanes that read one
 *    super-block hit 32 different banks;
 *  - Q6_K, in the file's 210-byte blocks: x as it is; each 8-byte field a
 *    lane reads lies at a 2-byte boundary, so it is read as 4-byte words
 *    and funnel-shifted into place.
 * Sums in fp32; a row's lanes are summed in a fixed butterfly, so the
 * result does not depend on timing.
 *
 * Grid barrier: a counter in device memory whose top bit flips when every
 * block has arrived (grid_sync). The grid is no larger
 * than what is resident at once (cuda_persist_shape), and the launch waits
 * for the kernels before it, so every block reaches every barrier.
 */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_common.cuh"
#include "cuda_persist.h"
#include "cuda_rope.cuh"
#include "cuda_split.cuh"
#include "q4khost/cuda_glu.cuh"
#include "q4khost/cuda_q4k_device.cuh"
#include "q4khost/quant.h"

#define PK_WARPS (CUDA_PERSIST_THREADS / 32)
#define PK_TEAMS (CUDA_PERSIST_THREADS / SPLIT_TEAM)

/*
 * A launch's shape: the blocks a multiprocessor it is built to hold
 * (MINB, its launch bounds: 2 leaves a thread 128 registers), the rows a
 * warp takes at once in a product (R) and of gate and of up each in the
 * GLU (G), and the pieces of each row a lane loads before it uses any
 * (U). Measured on an H100 (docs/perf.md, 2026-12-07): one block of 8
 * warps a multiprocessor with twice the pieces in flight, or half the
 * rows with four pieces, was no faster.
 */
template <int MINB, int R, int G, int U>
struct pk_shape {
	static constexpr int minb = MINB, r = R, g = G, u = U;
};

typedef pk_shape<2, 4, 2, 1> pk_shape_used;
#define Q6K_BYTES 210

/* Device code for compute capability 9.0 and later only (bulk prefetch,
 * and the only devices cuda_persist_plan takes); earlier targets get an
 * empty kernel. */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

/* --- the grid barrier --- */

/* The device's clock in ns. */
static __device__ __forceinline__ unsigned long long global_ns(void)
{
	unsigned long long t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/*
 * Every block of the grid arrives before any goes on. Block 0 adds
 * 2^31 - (blocks - 1), every other block 1, so that the counter's top bit
 * flips when the last one arrives (the scheme of cooperative groups' grid
 * barrier); each block's thread 0 waits for the flip, reading past L1.
 * Writes before it are visible to reads past L1 after. With STAMPS (the
 * profile), every block's arrival goes into stamps[2 k + 1] (the latest)
 * and block 0's departure into stamps[2 k + 2], k the barrier's index
 * *K.
 */
static __device__ __forceinline__ void grid_sync(unsigned *barrier, unsigned *k,
                                                 unsigned long long *stamps)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
		unsigned old;

		if (stamps)
			atomicMax(&stamps[2 * *k + 1], global_ns());
		__threadfence();
		old = atomicAdd(barrier, add);
		while (((old ^ *(volatile unsigned *)barrier) & 0x80000000u) == 0)
			;
		__threadfence();
		if (stamps && blockIdx.x == 0)
			stamps[2 * *k + 2] = global_ns();
	}
	++*k;
	__syncthreads();
}

/* --- activations into shared memory --- */

/* Where value i of a row goes in the Q4_K layout (see the top). */
static __device__ __forceinline__ int64_t q4k_slot(int64_t i)
{
	const int64_t sb = i / 256, r = i % 256;
	const int64_t p = (r >> 6) * 2 + ((r >> 4) & 1), c = ((r >> 5) & 1) * 4 + ((r >> 2) & 3);

	return sb * 256 + c * 32 + p * 4 + (r & 3);
}

/* What a stage's products need of x in shared memory: the plain layout
 * (Q6_K) from float 0, the Q4_K layout after it (from K on when both). */
struct x_layouts {
	bool plain, q4k;
	int64_t q4k_at;
};

static __device__ __forceinline__ struct x_layouts layouts_for(const struct cuda_pmat *m,
                                                               int n)
{
	struct x_layouts l = { false, false, 0 };

	for (int i = 0; i < n; i++) {
		if (m[i].type == Q4KH_TYPE_Q4_K)
			l.q4k = true;
		else
			l.plain = true;
	}
	l.q4k_at = l.plain ? m[0].k : 0;
	return l;
}

/* Value V of x at I into the layouts L of XS. */
static __device__ __forceinline__ void put_x(float *xs, const struct x_layouts &l, int64_t i,
                                             float v)
{
	if (l.plain)
		xs[i] = v;
	if (l.q4k)
		xs[l.q4k_at + q4k_slot(i)] = v;
}

/* xs = rms_norm(x) * w over N values (the backend's arithmetic: the sum
 * of squares in double, each value (x s) w). */
static __device__ __noinline__ void norm_into(const float *x, const float *w, float eps, int64_t n,
                                 float *xs, const struct x_layouts &l)
{
	__shared__ double part[32];
	double ss = 0.0;

	for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
		const double v = __ldcg(x + i);

		ss += v * v;
	}
	ss = block_sum(ss, part);
	const float s = (float)(1.0 / sqrt(ss / (double)n + (double)eps));

	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		put_x(xs, l, i, __ldcg(x + i) * s * __ldg(w + i));
	__syncthreads();
}

/* xs = x over N values. */
static __device__ __noinline__ void copy_into(const float *x, int64_t n, float *xs,
                                 const struct x_layouts &l)
{
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		put_x(xs, l, i, __ldcg(x + i));
	__syncthreads();
}

/* --- prefetching into L2 --- */

/* Ask for BYTES (a multiple of 16) from P (16-byte aligned) in L2, with
 * no wait and no register written (sm_90's bulk prefetch; elsewhere
 * nothing). */
static __device__ __forceinline__ void prefetch_l2(const void *p, uint32_t bytes)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
	(void)p;
	(void)bytes;
#endif
}

/* A row's bytes of M that a bulk prefetch may ask for: whole 16-byte
 * units from the row's first aligned one. */
static __device__ __forceinline__ void prefetch_row(const struct cuda_pmat &m, int64_t row)
{
	const uintptr_t a = (uintptr_t)(m.w + row * m.stride), b = a + (uintptr_t)m.stride;
	const uintptr_t a16 = (a + 15) & ~(uintptr_t)15, b16 = b & ~(uintptr_t)15;

	if (b16 > a16)
		prefetch_l2((const void *)a16, (uint32_t)(b16 - a16));
}

/* The rows of group G of glu_products (lanes below S::g gate's, the next
 * S::g up's), into L2. */
template <class S>
static __device__ __forceinline__ void prefetch_glu(const struct cuda_pmat &gate,
                                                    const struct cuda_pmat &up, int64_t g)
{
	const int lane = threadIdx.x & 31;
	const int64_t row = g * S::g + lane % S::g;

	if (lane < 2 * S::g && row < gate.n)
		prefetch_row(lane < S::g ? gate : up, row);
}

/* --- products --- */

/* Q4_K rows ROW[r] (R of them, K values) times x in the Q4_K layout XP:
 * each lane's share of the sums into acc. */
template <int R, int U>
static __device__ __noinline__ void dot_q4k(const uint8_t *const (&row)[R], int64_t k,
                                               const float *xp, float (&acc)[R])
{
	const int lane = threadIdx.x & 31, pieces = (int)(k / 32);

	for (int j0 = lane; j0 < pieces; j0 += 32 * U) {
		q4kh_q4k_piece pc[U][R];

#pragma unroll
		for (int u = 0; u < U; u++)
			if (j0 + 32 * u < pieces)
#pragma unroll
				for (int r = 0; r < R; r++) {
					const int j = j0 + 32 * u;
					const uint8_t *blk = row[r] + (int64_t)(j >> 3) * Q4KH_Q4K_BLOCK_BYTES;

					pc[u][r].q = q4kh_cv_load_stream(blk + 16 + 16 * (j & 7));
					pc[u][r].h = __ldg((const uint4 *)blk);
				}
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int j = j0 + 32 * u;

			if (j >= pieces)
				break;
			const int p = j & 7;
			const float *xc = xp + (int64_t)(j >> 3) * 256 + 4 * p;
			float a[R][2], b[R][2], lo[R] = {}, hi[R] = {}, sl = 0.0f, sh = 0.0f;

#pragma unroll
			for (int r = 0; r < R; r++) {
				float dl[2], ml[2];

				q4kh_q4k_scales(pc[u][r].h, p >> 1, dl, ml);
#pragma unroll
				for (int s = 0; s < 2; s++) {
					a[r][s] = 32.0f * dl[s];
					b[r][s] = -fmaf(16.0f, dl[s], ml[s]);
				}
			}
#pragma unroll
			for (int c = 0; c < 4; c++) {
				const float4 xl = *(const float4 *)(xc + 32 * c);
				const float4 xh = *(const float4 *)(xc + 32 * (c + 4));

				sl += (xl.x + xl.y) + (xl.z + xl.w);
				sh += (xh.x + xh.y) + (xh.z + xh.w);
#pragma unroll
				for (int r = 0; r < R; r++) {
					const uint32_t v = q4kh_cv_word(pc[u][r].q, c);
					const uint32_t l8 = (v << 3) & 0x78787878u;
					const uint32_t h8 = (v >> 1) & 0x78787878u;

					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 0), xl.x, lo[r]);
					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 1), xl.y, lo[r]);
					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 2), xl.z, lo[r]);
					lo[r] = fmaf(q4kh_q4k_half_plus(l8, 3), xl.w, lo[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 0), xh.x, hi[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 1), xh.y, hi[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 2), xh.z, hi[r]);
					hi[r] = fmaf(q4kh_q4k_half_plus(h8, 3), xh.w, hi[r]);
				}
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				acc[r] = fmaf(a[r][0], lo[r], fmaf(b[r][0], sl, acc[r]));
				acc[r] = fmaf(a[r][1], hi[r], fmaf(b[r][1], sh, acc[r]));
			}
		}
	}
}

/* The 8 bytes at A (2-byte aligned, inside a Q6_K block with at least 2
 * bytes after them) through 4-byte loads. */
static __device__ __forceinline__ uint2 load8_at2(const uint8_t *a)
{
	const uintptr_t at = (uintptr_t)a;
	const uint32_t *w = (const uint32_t *)(at & ~(uintptr_t)3);
	const unsigned shift = (unsigned)(at & 3) * 8;
	const uint32_t w0 = __ldg(w), w1 = __ldg(w + 1), w2 = shift ? __ldg(w + 2) : 0u;

	return make_uint2(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift));
}

/* What one Q6_K piece's loads bring: 32 values of one half of a block. */
struct q6k_piece {
	uint2 lo, hi, qh; /* ql + l0, ql + 32 + l0, qh + l0 of the half */
	uint2 sc;         /* the half's 8 scales */
	float d;
};

/* The 6-bit codes of group G's four values in word K (quant.h's layout:
 * group g of a half is values 32 g + l, low or high nibbles of ql or
 * ql + 32, with bits 2 g, 2 g + 1 of qh). */
static __device__ __forceinline__ uint32_t q6k_codes(const q6k_piece &p, int g, int k)
{
	const uint32_t a = k ? p.lo.y : p.lo.x, b = k ? p.hi.y : p.hi.x;
	const uint32_t h = k ? p.qh.y : p.qh.x;

	switch (g) {
	case 0: return (a & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u);
	case 1: return (b & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u);
	case 2: return ((a >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u);
	default: return ((b >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u);
	}
}

/* Q6_K rows ROW[r] times x in the plain layout XS, as dot_q4k. Piece j:
 * block j / 8, half (j / 4) % 2, lane bytes l0 = 8 (j % 4) .. + 7. */
template <int R, int U>
static __device__ __noinline__ void dot_q6k(const uint8_t *const (&row)[R], int64_t k,
                                               const float *xs, float (&acc)[R])
{
	const int lane = threadIdx.x & 31, pieces = (int)(k / 32);

	for (int j0 = lane; j0 < pieces; j0 += 32 * U) {
		q6k_piece pc[U][R];

#pragma unroll
		for (int u = 0; u < U; u++)
			if (j0 + 32 * u < pieces)
#pragma unroll
				for (int r = 0; r < R; r++) {
					const int j = j0 + 32 * u, half = (j >> 2) & 1, l0 = 8 * (j & 3);
					const uint8_t *blk = row[r] + (int64_t)(j >> 3) * Q6K_BYTES;

					pc[u][r].lo = load8_at2(blk + 64 * half + l0);
					pc[u][r].hi = load8_at2(blk + 64 * half + 32 + l0);
					pc[u][r].qh = load8_at2(blk + 128 + 32 * half + l0);
					pc[u][r].sc = load8_at2(blk + 192 + 8 * half);
					pc[u][r].d = __half2float(
						__ushort_as_half(__ldg((const unsigned short *)(blk + 208))));
				}
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int j = j0 + 32 * u;

			if (j >= pieces)
				break;
			const int half = (j >> 2) & 1, l0 = 8 * (j & 3), is = (j & 3) >> 1;
			const float *xp = xs + (int64_t)(j >> 3) * 256 + 128 * half + l0;

#pragma unroll
			for (int g = 0; g < 4; g++) {
				float part[R] = {};

#pragma unroll
				for (int h = 0; h < 2; h++) {
					const float4 xv = *(const float4 *)(xp + 32 * g + 4 * h);

#pragma unroll
					for (int r = 0; r < R; r++) {
						const uint32_t v = q6k_codes(pc[u][r], g, h);

						part[r] = fmaf(q4kh_cv_byte_float_less(v, 0, 32.0f), xv.x, part[r]);
						part[r] = fmaf(q4kh_cv_byte_float_less(v, 1, 32.0f), xv.y, part[r]);
						part[r] = fmaf(q4kh_cv_byte_float_less(v, 2, 32.0f), xv.z, part[r]);
						part[r] = fmaf(q4kh_cv_byte_float_less(v, 3, 32.0f), xv.w, part[r]);
					}
				}
#pragma unroll
				for (int r = 0; r < R; r++) {
					const int sb = is + 2 * g; /* the scale: byte sb of the 8 */
					const uint32_t sw = sb < 4 ? pc[u][r].sc.x : pc[u][r].sc.y;
					const float scale = pc[u][r].d * (float)(int8_t)(sw >> (8 * (sb & 3)));

					acc[r] = fmaf(scale, part[r], acc[r]);
				}
			}
		}
	}
}

/* The R rows ROW[r] of type TYPE (all one type) times x, U pieces a lane
 * at once. */
template <int R, int U>
static __device__ __forceinline__ void dot_rows(uint32_t type, const uint8_t *const (&row)[R],
                                                int64_t k, const float *xs,
                                                const struct x_layouts &l, float (&acc)[R])
{
#pragma unroll
	for (int r = 0; r < R; r++)
		acc[r] = 0.0f;
	if (type == Q4KH_TYPE_Q4_K)
		dot_q4k<R, U>(row, k, xs + l.q4k_at, acc);
	else
		dot_q6k<R, U>(row, k, xs, acc);
#pragma unroll
	for (int r = 0; r < R; r++)
		acc[r] = warp_sum(acc[r]);
}

/* The global warp index and count of the grid. */
static __device__ __forceinline__ int64_t warp_id(void)
{
	return (int64_t)blockIdx.x * PK_WARPS + threadIdx.x / 32;
}

static __device__ __forceinline__ int64_t warp_count(void)
{
	return (int64_t)gridDim.x * PK_WARPS;
}

/* Rows of the next groups a warp asks into L2 before it needs them. */
#define PK_AHEAD 2

/* Matrix *I and row group *AT of group G of the N products M (S::r rows a
 * group, each matrix's groups after the last one's); false past the end. */
template <class S>
static __device__ __forceinline__ bool group_of(const struct cuda_pmat *m, int n, int64_t g,
                                                int *i, int64_t *at)
{
	for (int k = 0; k < n; k++) {
		const int64_t c = (m[k].n + S::r - 1) / S::r;

		if (g < c) {
			*i = k;
			*at = g;
			return true;
		}
		g -= c;
	}
	return false;
}

/* Group G's rows into L2, lane r row r. */
template <class S>
static __device__ __forceinline__ void prefetch_group(const struct cuda_pmat *m, int n,
                                                      int64_t g)
{
	const int lane = threadIdx.x & 31;
	int64_t at;
	int i;

	if (lane < S::r && group_of<S>(m, n, g, &i, &at) && at * S::r + lane < m[i].n)
		prefetch_row(m[i], at * S::r + lane);
}

/*
 * The N products M (one K) over x in XS: y = w x + bias, or with ADD
 * y += w x (y is then x, the residual, and no block reads it this stage
 * but for its own rows).
 */
template <class S>
static __device__ __noinline__ void products(const struct cuda_pmat *m, int n, bool add,
                                             const float *xs, const struct x_layouts &l)
{
	const int lane = threadIdx.x & 31;
	int64_t groups = 0;

	for (int i = 0; i < n; i++)
		groups += (m[i].n + S::r - 1) / S::r;
	for (int d = 0; d < PK_AHEAD; d++)
		prefetch_group<S>(m, n, warp_id() + d * warp_count());
	for (int64_t g = warp_id(); g < groups; g += warp_count()) {
		int i = 0;
		int64_t at = g;

		prefetch_group<S>(m, n, g + PK_AHEAD * warp_count());
		group_of<S>(m, n, g, &i, &at);
		const struct cuda_pmat &w = m[i];
		const int64_t row0 = at * S::r;
		const uint8_t *row[S::r];
		float acc[S::r];

#pragma unroll
		for (int r = 0; r < S::r; r++)
			row[r] = w.w + (row0 + r < w.n ? row0 + r : w.n - 1) * w.stride;
		dot_rows<S::r, S::u>(w.type, row, w.k, xs, l, acc);
#pragma unroll
		for (int r = 0; r < S::r; r++)
			if (lane == r && row0 + r < w.n) {
				const int64_t o = row0 + r;

				if (add)
					w.y[o] = __ldcg(w.y + o) + acc[r];
				else
					w.y[o] = w.bias ? acc[r] + __ldg(w.bias + o) : acc[r];
			}
	}
}

/* gate's y = act(gate x) * (up x), gate's rows and up's (one type, one
 * shape) loaded together. */
template <class S>
static __device__ __noinline__ void glu_products(const struct cuda_pmat &gate, const struct cuda_pmat &up,
                                    bool silu, const float *xs, const struct x_layouts &l)
{
	const int lane = threadIdx.x & 31;

	for (int d = 0; d < PK_AHEAD; d++)
		prefetch_glu<S>(gate, up, warp_id() + d * warp_count());
	for (int64_t g = warp_id(); g * S::g < gate.n; g += warp_count()) {
		const int64_t row0 = g * S::g;

		prefetch_glu<S>(gate, up, g + PK_AHEAD * warp_count());
		const uint8_t *row[2 * S::g];
		float acc[2 * S::g];

#pragma unroll
		for (int r = 0; r < S::g; r++) {
			const int64_t i = row0 + r < gate.n ? row0 + r : gate.n - 1;

			row[r] = gate.w + i * gate.stride;
			row[S::g + r] = up.w + i * up.stride;
		}
		dot_rows<2 * S::g, S::u>(gate.type, row, gate.k, xs, l, acc);
#pragma unroll
		for (int r = 0; r < S::g; r++)
			if (lane == r && row0 + r < gate.n)
				gate.y[row0 + r] = q4kh_cuda_glu_value(silu, acc[r], acc[S::g + r]);
	}
}

/* --- RoPE and the caches --- */

/* Stage 2 (rope_store's arithmetic, cuda_rowwise.cu): q and k rotated in
 * place, k and v written to the caches at the step's position; the
 * angles' cosines and sines from CS and SN when every layer shares them
 * (else NULL: computed here). */
template <typename KV>
static __device__ __noinline__ void rope_store(const struct cuda_player &L, int32_t *fault,
                                               const double *cs, const double *sn)
{
	const int64_t hq = L.qh.ne[1], hk = L.kh.ne[1], slots = hq + 2 * hk;
	const int64_t half = L.rope.n_rot / 2;
	const int32_t pos = __ldg(L.attn.pos);

	if (!index_ok(fault, CUDA_FAULT_ROPE_POS, 0, pos, INT32_MAX) ||
	    !index_ok(fault, CUDA_FAULT_SET_ROWS_ROWS, 0, pos, L.kc.ne[2]))
		return;
	for (int64_t b = blockIdx.x; b < slots; b += gridDim.x) {
		if (b >= hq + hk) { /* a v head into its cache */
			const int64_t h = b - hq - hk;
			const float *vr = (const float *)(L.vh.data + h * L.vh.nb[1]);
			KV *c = (KV *)(L.vc.data + h * L.vc.nb[1] + pos * L.vc.nb[2]);

			for (int64_t i = threadIdx.x; i < L.vh.ne[0]; i += blockDim.x)
				c[i] = from_f32<KV>(__ldcg(vr + i));
			continue;
		}
		const bool is_q = b < hq;
		const int64_t h = is_q ? b : b - hq;
		const struct cuda_view &x = is_q ? L.qh : L.kh;
		float *xr = (float *)(x.data + h * x.nb[1]);
		KV *c = is_q ? NULL : (KV *)(L.kc.data + h * L.kc.nb[1] + pos * L.kc.nb[2]);

		for (int64_t i = threadIdx.x; i < x.ne[0] - half; i += blockDim.x) {
			if (i < half) {
				const int64_t a = L.rope.neox ? i : 2 * i;
				const int64_t bb = L.rope.neox ? i + half : 2 * i + 1;
				float ra, rb;

				if (cs) { /* the step's angles, as rope_pair turns them */
					const double va = __ldcg(xr + a), vb = __ldcg(xr + bb);

					ra = (float)(va * cs[i] - vb * sn[i]);
					rb = (float)(va * sn[i] + vb * cs[i]);
				} else {
					rope_pair(L.rope, pos, i, __ldcg(xr + a), __ldcg(xr + bb), &ra,
					          &rb);
				}
				xr[a] = ra;
				xr[bb] = rb;
				if (c) {
					c[a] = from_f32<KV>(ra);
					c[bb] = from_f32<KV>(rb);
				}
			} else {
				const int64_t j = L.rope.n_rot + (i - half);
				const float v = __ldcg(xr + j);

				if (c)
					c[j] = from_f32<KV>(v);
			}
		}
	}
}

/* --- attention --- */

/* Stage 3: flash-decoding's items (KV head, range) of the step's query,
 * a team an item (cuda_split.cuh, within the kernel's 128 registers a
 * thread), the last team of a KV head merging. */
template <typename KV, int HD>
static __device__ __noinline__ void attend(const struct cuda_persist &P,
                                           const struct cuda_player &L,
                                           struct split_shared<HD> *teams)
{
	const int team = threadIdx.x / SPLIT_TEAM;
	const int64_t items = L.kc.ne[1] * (int64_t)P.ranges;

	for (int64_t it = (int64_t)blockIdx.x * PK_TEAMS + team; it < items;
	     it += (int64_t)gridDim.x * PK_TEAMS)
		split_block<KV, HD, false, 0>(L.qh, L.kc, L.vc, L.attn, P.group, P.ml, P.part,
		                              P.count, L.att, P.fault, it / P.ranges,
		                              it % P.ranges, 0, P.ranges, &teams[team]);
}

#endif /* compute capability 9.0 */

/* --- the kernel --- */

template <int HD, class S>
static __global__ void __launch_bounds__(CUDA_PERSIST_THREADS, S::minb)
persist_kernel(struct cuda_persist P)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
	typedef __half KV; /* the caches (cuda_persist_plan takes f16 only) */
	extern __shared__ float4 shm4[];
	float *xs = (float *)shm4;
	struct split_shared<HD> *teams = (struct split_shared<HD> *)shm4;
	unsigned k = 0; /* barriers passed */

	/* RoPE's angles at the step's position, once for every layer that
	 * shares them (cuda_rope.cuh's arithmetic) */
	__shared__ double rope_cs[CUDA_PERSIST_MAX_PAIRS], rope_sn[CUDA_PERSIST_MAX_PAIRS];
	const double *cs = NULL, *sn = NULL;

	if (P.stamps && blockIdx.x == 0 && threadIdx.x == 0)
		P.stamps[0] = global_ns();
	if (P.rope_once) {
		const struct cuda_rope &r = P.layers[0].rope;
		const int32_t pos = __ldg(P.layers[0].attn.pos);

		for (int i = threadIdx.x; i < r.n_rot / 2; i += blockDim.x) {
			double a, b;

			sincos(rope_theta(r, pos < 0 ? 0 : pos, i), &a, &b);
			rope_sn[i] = a * r.mscale;
			rope_cs[i] = b * r.mscale;
		}
		cs = rope_cs;
		sn = rope_sn;
		__syncthreads();
	}

	for (int il = 0; il < P.n_layer; il++) {
		const struct cuda_player &L = P.layers[il];
		const struct cuda_pmat qkv[3] = { L.q, L.k, L.v };
		struct x_layouts l = layouts_for(qkv, 3);

		/* 1: q, k, v of the normed x */
		norm_into(P.x, L.attn_norm, L.attn_eps, P.n_embd, xs, l);
		products<S>(qkv, 3, false, xs, l);
		grid_sync(P.barrier, &k, P.stamps);
		/* 2: RoPE, the caches; the output projection on its way to L2 */
		for (int64_t g = warp_id(); g * S::r < L.o.n; g += warp_count())
			prefetch_group<S>(&L.o, 1, g);
		rope_store<KV>(L, P.fault, cs, sn);
		grid_sync(P.barrier, &k, P.stamps);
		/* 3: attention */
		attend<KV, HD>(P, L, teams);
		grid_sync(P.barrier, &k, P.stamps);
		/* 4: x += o att (from L2); gate and up's first rows on their way */
		for (int d = 0; d < PK_AHEAD; d++)
			prefetch_glu<S>(L.gate, L.up, warp_id() + d * warp_count());
		l = layouts_for(&L.o, 1);
		copy_into((const float *)L.att.data, L.o.k, xs, l);
		products<S>(&L.o, 1, true, xs, l);
		grid_sync(P.barrier, &k, P.stamps);
		/* 5: the GLU of gate and up of the normed x */
		l = layouts_for(&L.gate, 1);
		norm_into(P.x, L.ffn_norm, L.ffn_eps, P.n_embd, xs, l);
		glu_products<S>(L.gate, L.up, L.silu != 0, xs, l);
		grid_sync(P.barrier, &k, P.stamps);
		/* 6: x += down h */
		l = layouts_for(&L.down, 1);
		copy_into(L.gate.y, L.down.k, xs, l);
		products<S>(&L.down, 1, true, xs, l);
		grid_sync(P.barrier, &k, P.stamps);
	}
#else
	(void)P; /* cuda_persist_plan takes compute capability 9.0 and later */
#endif
}

typedef void (*persist_fn)(struct cuda_persist);

static persist_fn kernel_for(const struct cuda_persist *p)
{
	if (p->head_dim == 64)
		return persist_kernel<64, pk_shape_used>;
	if (p->head_dim == 128)
		return persist_kernel<128, pk_shape_used>;
	return NULL;
}

/* Shared memory of the attention stage's teams. */
static size_t teams_bytes(int head_dim)
{
	return head_dim == 64 ? PK_TEAMS * sizeof(struct split_shared<64>)
	                      : PK_TEAMS * sizeof(struct split_shared<128>);
}

extern "C" cudaError_t cuda_persist_shape(struct cuda_persist *p, int dev, int sms)
{
	const persist_fn k = kernel_for(p);
	const size_t teams = teams_bytes(p->head_dim);
	int per_sm = 0;
	cudaError_t e;

	if (!k)
		return cudaErrorNotSupported;
	if (p->smem < teams)
		p->smem = teams;
	if ((e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                              (int)p->smem)) != cudaSuccess)
		return e;
	if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, CUDA_PERSIST_THREADS,
	                                                       p->smem)) != cudaSuccess)
		return e;
	(void)dev;
	if (per_sm < 1)
		return cudaErrorNotSupported;
	p->blocks = per_sm * sms;
	return cudaSuccess;
}

extern "C" int cuda_persist_ranges(const struct cuda_view *q, const struct cuda_view *k,
                                   const struct cuda_view *v, int sms, int32_t *group)
{
	const struct split_plan sp = plan_split(q, k, v, sms);

	*group = sp.group;
	return sp.s;
}

extern "C" cudaError_t cuda_persist_launch(const struct cuda_persist *p, cudaStream_t s)
{
	const persist_fn k = kernel_for(p);
	cudaError_t e;

	if (!k)
		return cudaErrorNotSupported;
	if ((e = cudaMemsetAsync(p->barrier, 0, sizeof(unsigned), s)) != cudaSuccess ||
	    (p->stamps && (e = cudaMemsetAsync(p->stamps, 0,
	                                       sizeof(unsigned long long) *
	                                               (2 * (size_t)p->n_layer * CUDA_PERSIST_STAGES + 1),
	                                       s)) != cudaSuccess))
		return e;
	k<<<(unsigned)p->blocks, CUDA_PERSIST_THREADS, p->smem, s>>>(*p);
	return cudaGetLastError();
}
