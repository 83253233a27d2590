/*
 * The ops that work on whole rows: rms_norm (one block per row, the sum of
 * squares in double) and rope (angles in double, as the cpu reference),
 * and their ABI 1.4 fusions, one kernel each: add_rms_norm (the residual
 * add done by the norm's kernel as it loads the row), rope_set_rows (the
 * rotated values also written to the KV cache) and rope_store (an
 * attention layer's queries rotated, its keys rotated and cached and its
 * values cached; through the graph entry, after the per-head q and k
 * norms of Gemma 3 and Qwen3, cuda_graph.c's match_head_norms).
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_rope.cuh"
#include "cuda_kernels.h"
#include "q4khost/quant.h"

#define RMS_THREADS 512
#define RMS_HELD 8 /* values of a row each thread keeps in registers */
#define ROPE_THREADS 128

/*
 * One block per row, of as many warps as the row needs (up to
 * RMS_THREADS threads). Each thread loads its RMS_HELD values of the row
 * (and of the weight) at once and keeps them for the second pass, so that
 * a row of up to RMS_THREADS * RMS_HELD values costs one memory latency,
 * not one per value a thread reads; longer rows loop over the rest. With ADD
 * (add_rms_norm) each value is x + a, add's sum, written back to x by the
 * thread that later reads it again; without, a is not read. With NORM_A
 * too (norm_add_rms_norm) a is first normed in place with wa and eps_a,
 * the same arithmetic (its own block sum), and that a is added. Each
 * thread reads and writes only its own elements of x and a, so out may be
 * either.
 */
template <bool ADD, bool NORM_A>
static __global__ void __launch_bounds__(RMS_THREADS)
rms_norm_kernel(struct cuda_view x, struct cuda_view a, const float *wa, float eps_a,
                const float *w, float eps, struct cuda_view out)
{
	__shared__ double part[32];
	const int64_t n = x.ne[0], rows = x.ne[1] * x.ne[2] * x.ne[3];
	const int64_t held = (int64_t)RMS_HELD * blockDim.x;

	q4kh_pdl_release();
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		float *xr = (float *)view_row(x, r);
		float *ar = ADD ? (float *)view_row(a, r) : NULL;
		float *o = (float *)view_row(out, r);
		float v[RMS_HELD], u[RMS_HELD], wv[RMS_HELD], wav[RMS_HELD];
		double ss = 0.0;
		float s_a = 1.0f;

		/* The weights too: the scale's wait is the reduction's only.
		 * They are no kernel's output: loaded before the wait. */
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;

			wv[k] = w && i < n ? w[i] : 0.0f;
			wav[k] = NORM_A && wa && i < n ? wa[i] : 0.0f;
		}
		q4kh_pdl_wait();
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;

			v[k] = i < n ? xr[i] : 0.0f;
			u[k] = ADD && i < n ? ar[i] : 0.0f;
		}
		if (NORM_A) {
			double sa = 0.0;

#pragma unroll
			for (int k = 0; k < RMS_HELD; k++)
				sa += (double)u[k] * (double)u[k];
			for (int64_t i = held + threadIdx.x; i < n; i += blockDim.x)
				sa += (double)ar[i] * (double)ar[i];
			sa = block_sum(sa, part);
			s_a = (float)(1.0 / sqrt(sa / (double)n + (double)eps_a));
#pragma unroll
			for (int k = 0; k < RMS_HELD; k++)
				u[k] = wa ? u[k] * s_a * wav[k] : u[k] * s_a;
		}
		/* The sums are stored after every load is issued (a store
		 * to x could alias a later load, and would hold it back). */
		if (ADD) {
#pragma unroll
			for (int k = 0; k < RMS_HELD; k++) {
				const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;

				v[k] += u[k];
				if (i < n) {
					xr[i] = v[k];
					if (NORM_A)
						ar[i] = u[k];
				}
			}
		}
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++)
			ss += (double)v[k] * (double)v[k];
		for (int64_t i = held + threadIdx.x; i < n; i += blockDim.x) {
			float xi = xr[i];

			if (ADD) {
				float ai = ar[i];

				if (NORM_A) {
					ai = wa ? ai * s_a * wa[i] : ai * s_a;
					ar[i] = ai;
				}
				xi += ai;
				xr[i] = xi;
			}
			ss += (double)xi * (double)xi;
		}
		/* Every read of the row (of a too) is done once the sum is
		 * known, so out may be x or a. */
		ss = block_sum(ss, part);
		const float s = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;

			if (i < n)
				o[i] = w ? v[k] * s * wv[k] : v[k] * s;
		}
		for (int64_t i = held + threadIdx.x; i < n; i += blockDim.x)
			o[i] = w ? xr[i] * s * w[i] : xr[i] * s;
	}
}

/*
 * rope_freq_of(p, i) for item I of a head: items past the pairs
 * (i >= n_rot/2) rotate nothing, and get what no rotation reads.
 */
static __device__ __forceinline__ struct rope_freq item_freq(const struct cuda_rope &p, int64_t i)
{
	const struct rope_freq none = { 0.0, 1.0f };

	return i < p.n_rot / 2 ? rope_freq_of(p, i) : none;
}

/* The values item i of a head reads, *A and *B (rope_item). NORM
 * rotates neighbours, NEOX the two halves; an item past the pairs copies
 * value n_rot + (i - n_rot/2) (*B unused). */
static __device__ __forceinline__ void item_at(const struct cuda_rope &p, int64_t i, int64_t *a,
                                               int64_t *b)
{
	const int64_t half = p.n_rot / 2;

	*a = i >= half ? p.n_rot + (i - half) : p.neox ? i : 2 * i;
	*b = p.neox ? i + half : 2 * i + 1;
}

/* A head norm's weights of item i's two values, 1 where there is no
 * weight W (x s 1 is x s, bit for bit). */
struct item_w {
	float a, b;
};

static __device__ __forceinline__ struct item_w item_weights(const struct cuda_rope &p, int64_t i,
                                                             const float *w)
{
	struct item_w v = { 1.0f, 1.0f };
	int64_t a, b;

	item_at(p, i, &a, &b);
	if (w) {
		v.a = w[a];
		v.b = i < p.n_rot / 2 ? w[b] : 1.0f;
	}
	return v;
}

/*
 * Item i of head h of token t at position PT (pos[t], its load issued by
 * the caller), F its item_freq: i < n_rot/2 rotates pair
 * i; the others copy value n_rot + (i - n_rot/2), which passes through.
 * Each item reads before it writes, and only its own values, so out may
 * be x. The item's values are loaded before the position is checked, so
 * that both loads wait together: one memory latency, not two. A negative
 * position is a fault: the token's values are left as they are. With a
 * cache (cache.data not NULL: rope_set_rows, values of type C) each value
 * of out also goes to the cache's row pos[t], as set_rows writes it; a
 * position beyond the cache is set_rows' fault and writes no cache value.
 * With NORMED each value is first x s w, rms_norm's value for the head
 * whose scale head_scale gave as S, W the item's item_weights.
 */
template <typename C>
static __device__ __forceinline__ void
rope_item(const struct cuda_view &x, int32_t pt, const struct cuda_rope &p,
          const struct cuda_view &out, const struct cuda_view &cache, int32_t *fault,
          int64_t i, int64_t h, int64_t t, const struct rope_freq &f, bool normed = false,
          float s = 1.0f, struct item_w w = { 1.0f, 1.0f })
{
	const int64_t half = p.n_rot / 2;
	int64_t a, b;

	item_at(p, i, &a, &b);
	const float *xr = (const float *)(x.data + h * x.nb[1] + t * x.nb[2]);
	float *o = (float *)(out.data + h * out.nb[1] + t * out.nb[2]);
	float va = xr[a];
	float vb = i < half ? xr[b] : 0.0f;

	if (normed) {
		va = va * s * w.a;
		vb = vb * s * w.b;
	}

	if (!index_ok(fault, CUDA_FAULT_ROPE_POS, t, pt, INT32_MAX))
		return;
	C *c = cache.data && index_ok(fault, CUDA_FAULT_SET_ROWS_ROWS, t, pt, cache.ne[2])
	               ? (C *)(cache.data + h * cache.nb[1] + pt * cache.nb[2])
	               : NULL;
	if (i < half) {
		float ra, rb;

		rope_pair(p, pt, i, f, va, vb, &ra, &rb);
		o[a] = ra;
		o[b] = rb;
		if (c) {
			c[a] = from_f32<C>(ra);
			c[b] = from_f32<C>(rb);
		}
	} else {
		o[a] = va;
		if (c)
			c[a] = from_f32<C>(va);
	}
}

/* rope_item over every item of x, one thread an item; the thread's first
 * item's frequency computed before the wait. */
template <typename C>
static __global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(struct cuda_view x, const int32_t *pos, struct cuda_rope p,
            struct cuda_view out, struct cuda_view cache, int32_t *fault)
{
	const int64_t per_head = x.ne[0] - p.n_rot / 2, nh = x.ne[1];
	const int64_t items = per_head * nh * x.ne[2];
	const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	q4kh_pdl_release();
	const struct rope_freq f0 = item_freq(p, first < items ? first % per_head : 0);
	q4kh_pdl_wait();
	for (int64_t it = first; it < items; it += (int64_t)gridDim.x * blockDim.x) {
		const int64_t i = it % per_head;

		const int64_t t = it / (per_head * nh);

		rope_item<C>(x, pos[t], p, out, cache, fault, i, (it / per_head) % nh, t,
		             it == first ? f0 : item_freq(p, i));
	}
}

/*
 * The scale rms_norm_kernel gives a row XR of N <= CUDA_HEAD_NORM_MAX
 * values with EPS: its block for such a row is one warp (rms_threads),
 * whose lane l sums the squares of values l + 32 k in double, k in order,
 * then the warp's sum (block_sum's second step adds only zeros). Every
 * warp that calls it computes the whole row, so every lane of the block
 * gets the same bits with no shared memory; the block's threads then
 * wait for each other before any writes the row in place.
 */
static __device__ __forceinline__ float head_scale(const float *xr, int64_t n, float eps)
{
	const int lane = threadIdx.x % 32;
	float v[RMS_HELD];
	double ss = 0.0;

#pragma unroll
	for (int k = 0; k < RMS_HELD; k++)
		v[k] = lane + 32 * k < n ? xr[lane + 32 * k] : 0.0f;
#pragma unroll
	for (int k = 0; k < RMS_HELD; k++)
		ss += (double)v[k] * (double)v[k];
	ss = warp_sum(ss);
	__syncthreads();
	return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}

static_assert(CUDA_HEAD_NORM_MAX == 32 * RMS_HELD, "a head norm is one warp's row");

/*
 * Head h of token t of v {hd_v, heads_v, T} into its cache (type V) at
 * row PT (pos[t], its load issued by the caller), after the checks of
 * its position that rope_ext (which runs first when the ops are issued
 * alone) and set_rows make. Where the row, the cache's rows and hd_v
 * allow, each thread moves 16 bytes of cache (8 f16 values or 4 f32) a
 * step; its first values are loaded before the position is checked.
 */
template <typename V>
static __device__ __forceinline__ void store_v(const struct cuda_view &v, int32_t pt,
                                               const struct cuda_view &vc, int32_t *fault,
                                               int64_t h, int64_t t)
{
	constexpr int VEC = 16 / sizeof(V);
	const float *vr = (const float *)(v.data + h * v.nb[1] + t * v.nb[2]);
	const int64_t n = v.ne[0];
	const bool wide = n % VEC == 0 && (uintptr_t)vr % 16 == 0 && (uintptr_t)vc.data % 16 == 0 &&
	                  vc.nb[1] % 16 == 0 && vc.nb[2] % 16 == 0;
	const int64_t step = wide ? (int64_t)blockDim.x * VEC : blockDim.x;
	const int64_t i0 = wide ? (int64_t)threadIdx.x * VEC : threadIdx.x;
	float4 held[VEC / 4];

	if (wide && i0 < n) {
#pragma unroll
		for (int j = 0; j < VEC / 4; j++)
			held[j] = *(const float4 *)(vr + i0 + 4 * j);
	}
	if (!index_ok(fault, CUDA_FAULT_ROPE_POS, t, pt, INT32_MAX) ||
	    !index_ok(fault, CUDA_FAULT_SET_ROWS_ROWS, t, pt, vc.ne[2]))
		return;
	V *c = (V *)(vc.data + h * vc.nb[1] + pt * vc.nb[2]);
	for (int64_t i = i0; i < n; i += step) {
		if (!wide) {
			c[i] = from_f32<V>(vr[i]);
			continue;
		}
		V o[VEC];
		uint4 u;

		if (i != i0) {
#pragma unroll
			for (int j = 0; j < VEC / 4; j++)
				held[j] = *(const float4 *)(vr + i + 4 * j);
		}
#pragma unroll
		for (int j = 0; j < VEC / 4; j++) {
			o[4 * j] = from_f32<V>(held[j].x);
			o[4 * j + 1] = from_f32<V>(held[j].y);
			o[4 * j + 2] = from_f32<V>(held[j].z);
			o[4 * j + 3] = from_f32<V>(held[j].w);
		}
		memcpy(&u, o, sizeof(u));
		*(uint4 *)(c + i) = u;
	}
}

/*
 * Head h of token t of x {hd, heads, T} (rope_store's q, or its k with
 * CACHE of type C) rotated in place at position PT, the block's threads
 * sharing its items, F0 the item_freq of each thread's first; with NORM
 * first normed as rms_norm norms it with W (or none) and EPS.
 */
template <typename C, bool NORM>
static __device__ __forceinline__ void rope_head(const struct cuda_view &x, int32_t pt,
                                                 const struct cuda_rope &p,
                                                 const struct cuda_view &cache, int32_t *fault,
                                                 int64_t h, int64_t t,
                                                 const struct rope_freq &f0, const float *w,
                                                 float eps)
{
	const int64_t items = x.ne[0] - p.n_rot / 2;
	/* the first item's weights loaded with the row (no kernel's output) */
	const struct item_w w0 = item_weights(p, threadIdx.x < items ? threadIdx.x : 0,
	                                      NORM ? w : NULL);
	const float s = NORM ? head_scale((const float *)(x.data + h * x.nb[1] + t * x.nb[2]),
	                                  x.ne[0], eps)
	                     : 1.0f;

	for (int64_t i = threadIdx.x; i < items; i += blockDim.x)
		rope_item<C>(x, pt, p, x, cache, fault, i, h, t,
		             i == threadIdx.x ? f0 : item_freq(p, i), NORM, s,
		             i == threadIdx.x ? w0 : item_weights(p, i, NORM ? w : NULL));
}

/*
 * rope_store: a block per head slot of a token, a token's q heads first,
 * then its k heads, then its v heads; the block's threads share the
 * slot's items. q and k go through rope_item (k with its cache, of type
 * K), so their bits are rope_ext's and rope_set_rows'; a v row goes to
 * its cache through store_v, as set_rows writes it. The pow of a thread's
 * first pair is computed before the wait, while the kernel before still
 * runs; after it, only the sincos of the angle follows the loads. With
 * NORM (cuda_launch_rope_store given norms) each q and k head is first
 * normed as rms_norm norms it (head_scale), with HN's weight and eps: the
 * bits of the norm's node, then rope_store's.
 */
template <typename K, typename V, bool NORM>
static __global__ void __launch_bounds__(ROPE_THREADS)
rope_store_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
                  const int32_t *pos, struct cuda_rope p, struct cuda_view kc,
                  struct cuda_view vc, struct cuda_head_norms hn, int32_t *fault)
{
	const int64_t hq = q.ne[1], hk = k.ne[1];
	const int64_t per_token = hq + hk + v.ne[1], slots = per_token * q.ne[2];
	const struct cuda_view no_cache = { NULL, 0, { 0 }, { 0 } };

	q4kh_pdl_release();
	const struct rope_freq f0 = item_freq(p, threadIdx.x);
	q4kh_pdl_wait();
	for (int64_t b = blockIdx.x; b < slots; b += gridDim.x) {
		const int64_t t = b / per_token;
		const int32_t pt = pos[t]; /* waited for after the head's loads */
		int64_t h = b % per_token;

		if (h < hq)
			rope_head<float, NORM>(q, pt, p, no_cache, fault, h, t, f0, hn.q_w, hn.q_eps);
		else if ((h -= hq) < hk)
			rope_head<K, NORM>(k, pt, p, kc, fault, h, t, f0, hn.k_w, hn.k_eps);
		else
			store_v<V>(v, pt, vc, fault, h - hk, t);
	}
}

/* Threads of a norm's block: enough warps to hold a row of N values, at
 * most RMS_THREADS (a row of 640 values, or a head of 256, is not summed
 * over 16 idle warps). */
static unsigned rms_threads(int64_t n)
{
	const int64_t need = (n + RMS_HELD - 1) / RMS_HELD;

	return need >= RMS_THREADS ? RMS_THREADS : (unsigned)(need + 31) / 32 * 32;
}

/* The view of no tensor: a kernel's optional operand left out. */
static const struct cuda_view none = { NULL, 0, { 0 }, { 0 } };

/* rms_norm_kernel over x's rows: after x += a when A is not NULL, and
 * after a's own norm (wa, which may be NULL, and eps_a) when NORM_A. */
extern "C" cudaError_t cuda_launch_norm(const struct cuda_view *x, const struct cuda_view *a,
                                        int norm_a, const struct cuda_view *wa, float eps_a,
                                        const struct cuda_view *w, float eps,
                                        const struct cuda_view *out, int pdl, cudaStream_t s)
{
	const int64_t rows = view_rows(x);
	const unsigned g = (unsigned)(rows < 65535 ? rows : 65535);
	const unsigned threads = rms_threads(x->ne[0]);
	const float *wad = wa ? (const float *)wa->data : NULL;
	const float *wd = w ? (const float *)w->data : NULL;

	if (norm_a)
		return q4kh_pdl_launch(pdl, rms_norm_kernel<true, true>, g, threads, 0, s, *x, *a,
		                       wad, eps_a, wd, eps, *out);
	if (a)
		return q4kh_pdl_launch(pdl, rms_norm_kernel<true, false>, g, threads, 0, s, *x, *a,
		                       (const float *)NULL, 0.0f, wd, eps, *out);
	return q4kh_pdl_launch(pdl, rms_norm_kernel<false, false>, g, threads, 0, s, *x, none,
	                       (const float *)NULL, 0.0f, wd, eps, *out);
}

extern "C" cudaError_t cuda_launch_rope_set_rows(const struct cuda_view *x,
                                                 const int32_t *pos,
                                                 const struct cuda_rope *p,
                                                 const struct cuda_view *out,
                                                 const struct cuda_view *cache,
                                                 int32_t *fault, int pdl,
                                                 cudaStream_t s)
{
	const int64_t items = (x->ne[0] - p->n_rot / 2) * x->ne[1] * x->ne[2];
	const unsigned g = grid_for(items, ROPE_THREADS);
	const bool c16 = cache && cache->type == Q4KH_TYPE_F16;

	return q4kh_pdl_launch(pdl != 0, c16 ? rope_kernel<__half> : rope_kernel<float>, g,
	                       ROPE_THREADS, 0, s, *x, pos, *p, *out, cache ? *cache : none,
	                       fault);
}

extern "C" cudaError_t cuda_launch_rope(const struct cuda_view *x,
                                        const int32_t *pos,
                                        const struct cuda_rope *p,
                                        const struct cuda_view *out,
                                        int32_t *fault, int pdl, cudaStream_t s)
{
	return cuda_launch_rope_set_rows(x, pos, p, out, NULL, fault, pdl, s);
}

/* rope_store_kernel with the cache types and NORM as template arguments. */
template <typename K, bool NORM>
static void launch_rope_store(const struct cuda_view *q, const struct cuda_view *k,
                              const struct cuda_view *v, const int32_t *pos,
                              const struct cuda_rope *p, const struct cuda_view *kc,
                              const struct cuda_view *vc, const struct cuda_head_norms *hn,
                              int32_t *fault, unsigned g, int pdl, cudaStream_t s)
{
	if (vc->type == Q4KH_TYPE_F16)
		q4kh_pdl_launch(pdl, rope_store_kernel<K, __half, NORM>, g, ROPE_THREADS, 0, s, *q,
		                *k, *v, pos, *p, *kc, *vc, *hn, fault);
	else
		q4kh_pdl_launch(pdl, rope_store_kernel<K, float, NORM>, g, ROPE_THREADS, 0, s, *q,
		                *k, *v, pos, *p, *kc, *vc, *hn, fault);
}

extern "C" cudaError_t cuda_launch_rope_store(const struct cuda_view *q,
                                              const struct cuda_view *k,
                                              const struct cuda_view *v,
                                              const int32_t *pos,
                                              const struct cuda_rope *p,
                                              const struct cuda_view *k_cache,
                                              const struct cuda_view *v_cache,
                                              const struct cuda_head_norms *norms,
                                              int32_t *fault, int pdl, cudaStream_t s)
{
	const int64_t slots = (q->ne[1] + k->ne[1] + v->ne[1]) * q->ne[2];
	const unsigned g = (unsigned)(slots < (1 << 30) ? slots : 1 << 30);
	const struct cuda_head_norms none = { NULL, NULL, 0.0f, 0.0f };

	if (k_cache->type == Q4KH_TYPE_F16 && norms)
		launch_rope_store<__half, true>(q, k, v, pos, p, k_cache, v_cache, norms, fault, g,
		                                pdl, s);
	else if (k_cache->type == Q4KH_TYPE_F16)
		launch_rope_store<__half, false>(q, k, v, pos, p, k_cache, v_cache, &none, fault, g,
		                                 pdl, s);
	else if (norms)
		launch_rope_store<float, true>(q, k, v, pos, p, k_cache, v_cache, norms, fault, g,
		                               pdl, s);
	else
		launch_rope_store<float, false>(q, k, v, pos, p, k_cache, v_cache, &none, fault, g,
		                                pdl, s);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_rowwise_preload(void)
{
	return q4kh_preload(rms_norm_kernel<true, true>, rms_norm_kernel<true, false>,
	                    rms_norm_kernel<false, false>, rope_kernel<__half>, rope_kernel<float>,
	                    rope_store_kernel<__half, __half, false>,
	                    rope_store_kernel<__half, float, false>,
	                    rope_store_kernel<float, __half, false>,
	                    rope_store_kernel<float, float, false>,
	                    rope_store_kernel<__half, __half, true>,
	                    rope_store_kernel<__half, float, true>,
	                    rope_store_kernel<float, __half, true>,
	                    rope_store_kernel<float, float, true>);
}
