/*
 * Causal, windowed, grouped-query attention over the KV cache, in two
 * forms.
 *
 * Decode (a few queries, split_plan): flash-decoding (Dao et al. 2023,
 * "Flash-Decoding for long-context inference"). The visible keys of a
 * query are cut into S ranges of at least SPLIT_MIN_KEYS; block (KV head,
 * range, token) reads its range of K and V once for every query head of
 * the group, each warp eight keys at a time with a running softmax of its
 * own. The block folds its warps together and writes one partial result
 * per query head (m, l and the unnormalised sum) to scratch memory; the
 * last block of a (KV head, token) to finish merges the partials, so a
 * decode step's attention is one launch. A short context leaves most
 * ranges empty and the merge reads only those in use. The grid is fixed
 * by the shapes, the ranges by the position read on the device, so one
 * recorded launch serves every later token.
 *
 * Otherwise (prompts) on tensor cores where cuda_flash.cu can (an F16
 * cache, compute capability 8.0 or later); else a block takes one query
 * (head h, token t) at a time: grid.x is the head, grid.y strides over the tokens. The visible keys are taken in chunks of
 * ATTN_CHUNK: each warp computes the scores of some keys of the chunk (its
 * lanes split the head dimension), then the block folds the chunk into a
 * running softmax (Milakov & Gimelshein 2018, "Online normalizer
 * calculation for softmax"): with m the largest score so far, the weights
 * are exp(s - m), and when m grows, the sum and the accumulated values are
 * rescaled by exp(m_old - m_new). All in fp32.
 *
 * Shared memory: q (hd floats), the accumulator (hd floats, element d owned
 * by thread d mod ATTN_THREADS), the chunk's scores (ATTN_CHUNK floats).
 */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_attention.cuh"
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "q4khost/quant.h"

#define ATTN_THREADS 128
#define ATTN_CHUNK 64 /* at most ATTN_THREADS: one thread per score */

static __device__ __forceinline__ float cache_at(const float *row, int64_t i)
{
	return row[i];
}

static __device__ __forceinline__ float cache_at(const __half *row, int64_t i)
{
	return __half2float(row[i]);
}

/* Query t of head h: out = softmax(scores) . V over the visible keys. */
template <typename K, typename V>
static __device__ void attend(const struct cuda_view &q,
                              const struct cuda_view &k,
                              const struct cuda_view &v,
                              const struct cuda_attn &p,
                              const struct cuda_view &out, int64_t h,
                              int64_t t, float *shm, int32_t *fault)
{
	const int64_t hd = q.ne[0];
	const int64_t g = h / (q.ne[1] / k.ne[1]); /* the KV head */
	int64_t pos;
	const bool ok = query_pos(p, k, t, fault, &pos);
	const int64_t first = first_key(p, pos);
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int warps = ATTN_THREADS / 32;
	float *qs = shm, *acc = shm + hd, *sc = shm + 2 * hd;
	const float *qr = (const float *)(q.data + h * q.nb[1] + t * q.nb[2]);
	float *o = (float *)(out.data + h * out.nb[1] + t * out.nb[2]);
	float m = -INFINITY, l = 0.0f;

	if (!ok) { /* a fault: the query sees nothing */
		for (int64_t d = threadIdx.x; d < hd; d += ATTN_THREADS)
			o[d] = 0.0f;
		return;
	}
	for (int64_t d = threadIdx.x; d < hd; d += ATTN_THREADS) {
		qs[d] = qr[d];
		acc[d] = 0.0f;
	}
	__syncthreads();
	for (int64_t j0 = first; j0 <= pos; j0 += ATTN_CHUNK) {
		const int n = pos - j0 + 1 < ATTN_CHUNK ? (int)(pos - j0 + 1)
		                                        : ATTN_CHUNK;

		for (int c = warp; c < n; c += warps) {
			const K *kr = (const K *)(k.data + g * k.nb[1] +
			                          key_row(p, j0 + c, fault) * k.nb[2]);
			float s = 0.0f;

			for (int64_t d = lane; d < hd; d += 32)
				s += qs[d] * cache_at(kr, d);
			s = score(p, warp_sum(s));
			if (lane == 0)
				sc[c] = s;
		}
		__syncthreads();
		float cmax = -INFINITY;
		for (int c = 0; c < n; c++)
			cmax = fmaxf(cmax, sc[c]);
		const float m_new = fmaxf(m, cmax);
		const float rescale = expf(m - m_new); /* 0 on the first chunk */
		__syncthreads(); /* every thread has read the scores */
		if (threadIdx.x < n)
			sc[threadIdx.x] = expf(sc[threadIdx.x] - m_new);
		__syncthreads();
		float csum = 0.0f;
		for (int c = 0; c < n; c++)
			csum += sc[c];
		l = l * rescale + csum;
		m = m_new;
		for (int64_t d = threadIdx.x; d < hd; d += ATTN_THREADS) {
			float a = acc[d] * rescale;

			for (int c = 0; c < n; c++) {
				const V *vr = (const V *)(v.data + g * v.nb[1] +
				                          key_row(p, j0 + c, fault) * v.nb[2]);
				a += sc[c] * cache_at(vr, d);
			}
			acc[d] = a;
		}
		__syncthreads(); /* the scores are read before the next chunk */
	}
	for (int64_t d = threadIdx.x; d < hd; d += ATTN_THREADS)
		o[d] = acc[d] / l;
	__syncthreads(); /* q and the accumulator are free for the next query */
}

template <typename K, typename V>
static __global__ void __launch_bounds__(ATTN_THREADS)
attention_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
                 struct cuda_attn p, struct cuda_view out, int32_t *fault)
{
	extern __shared__ float shm[];

	for (int64_t t = blockIdx.y; t < q.ne[2]; t += gridDim.y)
		attend<K, V>(q, k, v, p, out, blockIdx.x, t, shm, fault);
}

/* --- flash-decoding --- */

#define SPLIT_WARPS 4
#define SPLIT_MAX_T 8      /* queries a split launch takes */
#define SPLIT_MAX_GROUP 8  /* query heads per KV head */
#define SPLIT_MAX_S 128    /* ranges per query */
#define SPLIT_KEYS 8       /* keys a warp scores at once, 4 lanes a key */
#define SPLIT_MIN_KEYS (SPLIT_WARPS * SPLIT_KEYS) /* one batch a warp */
#define MERGE_LOADS 16     /* partials a merging thread has in flight */

/* How a split launch cuts the work: S ranges per query. */
struct split_plan {
	int s;     /* 0: the shapes do not take the split form */
	int group; /* query heads per KV head */
};

static bool aligned16(const struct cuda_view *v)
{
	return (((uintptr_t)v->data | (uintptr_t)v->nb[1] | (uintptr_t)v->nb[2]) & 15) == 0;
}

static struct split_plan plan_split(const struct cuda_view *q,
                                    const struct cuda_view *k,
                                    const struct cuda_view *v, int sms)
{
	struct split_plan sp = { 0, 0 };
	const int64_t hd = q->ne[0], hkv = k->ne[1], t = q->ne[2];
	int64_t s;

	if (t > SPLIT_MAX_T || (hd != 64 && hd != 128 && hd != 256) ||
	    q->ne[1] / hkv > SPLIT_MAX_GROUP || hkv * t > CUDA_SCRATCH_COUNTERS ||
	    k->type != v->type || !aligned16(q) || !aligned16(k) || !aligned16(v))
		return sp;
	/* About eight blocks per multiprocessor over the KV heads and
	 * queries once the context is long; a short one uses fewer ranges. */
	s = (8 * (int64_t)sms + hkv * t - 1) / (hkv * t);
	sp.s = (int)(s < 1 ? 1 : s > SPLIT_MAX_S ? SPLIT_MAX_S : s);
	sp.group = (int)(q->ne[1] / hkv);
	return sp;
}

/* The 8 values of a cache row from element I on, as float; 16-byte
 * aligned. */
static __device__ __forceinline__ void load8(const __half *row, int64_t i,
                                             float *out)
{
	const uint4 u = __ldg((const uint4 *)(row + i));
	const __half2 *h = (const __half2 *)&u;

#pragma unroll
	for (int e = 0; e < 4; e++) {
		const float2 f = __half22float2(h[e]);

		out[2 * e] = f.x;
		out[2 * e + 1] = f.y;
	}
}

static __device__ __forceinline__ void load8(const float *row, int64_t i,
                                             float *out)
{
	const float4 a = __ldg((const float4 *)(row + i));
	const float4 b = __ldg((const float4 *)(row + i + 4));

	out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
	out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

/* D consecutive values of a cache row from element I on (D = 2, 4, 8;
 * I a multiple of D), as float. */
template <int D>
static __device__ __forceinline__ void loadd(const __half *row, int64_t i,
                                             float *out)
{
	if constexpr (D == 8) {
		load8(row, i, out);
	} else {
#pragma unroll
		for (int e = 0; e < D; e += 2) {
			const float2 f = __half22float2(*(const __half2 *)(row + i + e));

			out[e] = f.x;
			out[e + 1] = f.y;
		}
	}
}

template <int D>
static __device__ __forceinline__ void loadd(const float *row, int64_t i,
                                             float *out)
{
#pragma unroll
	for (int e = 0; e < D; e += 2) {
		const float2 f = *(const float2 *)(row + i + e);

		out[e] = f.x;
		out[e + 1] = f.y;
	}
}

/*
 * The keys [*j0, *j1) of range s of S for a query at POS: the visible keys
 * cut into S ranges of a multiple of SPLIT_MIN_KEYS (whole batches for
 * every warp), so that a short context uses few ranges and the rest are
 * empty. Returns the ranges in use.
 */
static __device__ __forceinline__ int64_t split_range(const struct cuda_attn &p,
                                                      int64_t pos, int64_t s,
                                                      int64_t S, int64_t *j0,
                                                      int64_t *j1)
{
	const int64_t first = first_key(p, pos), n = pos - first + 1;
	const int64_t chunk = ((n + S - 1) / S + SPLIT_MIN_KEYS - 1) /
	                      SPLIT_MIN_KEYS * SPLIT_MIN_KEYS;

	*j0 = first + s * chunk;
	*j1 = *j0 + chunk < pos + 1 ? *j0 + chunk : pos + 1;
	return (n + chunk - 1) / chunk;
}

/* The partials' index of range s of query head h, token t. */
static __device__ __forceinline__ int64_t part_at(int64_t t, int64_t H,
                                                  int64_t h, int64_t S,
                                                  int64_t s)
{
	return (t * H + h) * S + s;
}

/* Shared floats of split_kernel: the warps' sums while the block folds
 * them, then the merge's (m, l) pairs and weights. */
template <int HD>
struct split_pool {
	static constexpr int fold = SPLIT_WARPS * SPLIT_MAX_GROUP * HD;
	static constexpr int merge = 3 * SPLIT_MAX_GROUP * SPLIT_MAX_S;
	static constexpr int size = fold > merge ? fold : merge;
};

/*
 * out[:, h0 + g, t], g < G, from the USED partials of each head (head
 * h0 + g, range s at AT + g S + s). The partials were written by other
 * blocks: read past L1. All loads of a phase are independent of each
 * other, so that the merge costs a few memory latencies, not one per
 * range: the pairs (m, l) into shared memory; a warp per head turns them
 * into the weights exp(m_s - max m) and their sum with l; then each thread
 * sums four columns of a head over the ranges.
 */
template <int HD>
static __device__ void merge_group(const float2 *ml, const float *part,
                                   int64_t at, int64_t S, int G, int used, const struct cuda_view &out,
                                   int64_t h0, int64_t t, float *pool,
                                   float *lsum)
{
	float2 *mls = (float2 *)pool;                      /* [G][used] */
	float *wt = pool + 2 * SPLIT_MAX_GROUP * SPLIT_MAX_S; /* [G][used] */
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

	constexpr int R = SPLIT_MAX_GROUP * SPLIT_MAX_S / (32 * SPLIT_WARPS);
	float2 pair[R];

#pragma unroll
	for (int r = 0; r < R; r++) {
		const int i = threadIdx.x + r * 32 * SPLIT_WARPS;

		if (i < G * used)
			pair[r] = __ldcg(&ml[at + i / used * S + i % used]);
	}
#pragma unroll
	for (int r = 0; r < R; r++) {
		const int i = threadIdx.x + r * 32 * SPLIT_WARPS;

		if (i < G * used)
			mls[i] = pair[r];
	}
	__syncthreads();
	for (int g = warp; g < G; g += SPLIT_WARPS) {
		float mx = -INFINITY, sum = 0.0f;

		for (int64_t s = lane; s < used; s += 32)
			mx = fmaxf(mx, mls[g * used + s].x);
		for (int off = 16; off > 0; off /= 2)
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
		for (int64_t s = lane; s < used; s += 32) {
			const float w = expf(mls[g * used + s].x - mx);

			wt[g * used + s] = w;
			sum += mls[g * used + s].y * w;
		}
		sum = warp_sum(sum);
		if (lane == 0)
			lsum[g] = sum;
	}
	__syncthreads();
	for (int i = threadIdx.x; i < G * HD / 4; i += blockDim.x) {
		const int g = i / (HD / 4), d = i % (HD / 4) * 4;
		const float *w = wt + g * used;
		const float4 *pp = (const float4 *)(part + (at + g * S) * HD + d);
		float *o = (float *)(out.data + (h0 + g) * out.nb[1] + t * out.nb[2]);
		float a[4] = { 0.0f, 0.0f, 0.0f, 0.0f };

		for (int s0 = 0; s0 < used; s0 += MERGE_LOADS) {
			float4 v[MERGE_LOADS];

#pragma unroll
			for (int u = 0; u < MERGE_LOADS; u++)
				v[u] = s0 + u < used ? __ldcg(pp + (s0 + u) * (HD / 4))
				                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
			for (int u = 0; u < MERGE_LOADS; u++) {
				const float wu = s0 + u < used ? w[s0 + u] : 0.0f;

				a[0] += v[u].x * wu;
				a[1] += v[u].y * wu;
				a[2] += v[u].z * wu;
				a[3] += v[u].w * wu;
			}
		}
#pragma unroll
		for (int e = 0; e < 4; e++)
			o[d + e] = a[e] / lsum[g];
	}
}

/*
 * One range of keys of one query for the G query heads of KV head
 * blockIdx.x; the last block of (KV head, query) to finish merges the
 * ranges (a counter per pair in COUNT, back to 0 after the merge, so the
 * next launch finds it clear). Partials: ml[part_at] = (m, l), part at the
 * same index times HD.
 *
 * A warp scores SPLIT_KEYS keys at once: lanes 4c .. 4c+3 take key c, each
 * a quarter of the head dimension in 8-value pieces 32 apart (the four
 * lanes read 64 contiguous bytes), two shuffles finish a dot product. For
 * the values each lane owns HD / 32 consecutive dimensions and takes the
 * weights of the batch's keys from the lanes that scored them.
 */
template <typename KV, int HD>
static __global__ void __launch_bounds__(32 * SPLIT_WARPS)
split_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
             struct cuda_attn p, int group, float2 *ml, float *part,
             int *count, struct cuda_view out, int32_t *fault)
{
	constexpr int D = HD / 32; /* values a lane owns; also its 8-pieces */
	__shared__ __align__(16) float qs[SPLIT_MAX_GROUP][HD];
	__shared__ float sm[SPLIT_WARPS][SPLIT_MAX_GROUP][2];
	__shared__ __align__(16) float pool[split_pool<HD>::size];
	__shared__ float lsum[SPLIT_MAX_GROUP];
	__shared__ bool last;
	float(*sacc)[SPLIT_MAX_GROUP][HD] = (float(*)[SPLIT_MAX_GROUP][HD])pool;
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int key = lane / 4, sub = lane % 4;
	const int64_t kh = blockIdx.x, s = blockIdx.y, t = blockIdx.z;
	const int64_t S = gridDim.y, H = q.ne[1];
	float acc[SPLIT_MAX_GROUP][D], m[SPLIT_MAX_GROUP], l[SPLIT_MAX_GROUP];
	int64_t pos, j0, j1, used;

	/* The group's queries, loaded while the position is: every load
	 * issued before any is used. */
	constexpr int RQ = SPLIT_MAX_GROUP * HD / 4 / (32 * SPLIT_WARPS);
	float4 qv[RQ];

	q4kh_pdl_release();
	q4kh_pdl_wait();

#pragma unroll
	for (int r = 0; r < RQ; r++) {
		const int i = threadIdx.x + r * 32 * SPLIT_WARPS;

		if (i < group * HD / 4)
			qv[r] = *(const float4 *)(q.data + (kh * group + i / (HD / 4)) * q.nb[1] +
			                          t * q.nb[2] + i % (HD / 4) * 16);
	}
	if (!query_pos(p, k, t, fault, &pos)) { /* the query sees nothing */
		if (s == 0)
			for (int64_t i = threadIdx.x; i < group * HD; i += blockDim.x)
				((float *)(out.data + (kh * group + i / HD) * out.nb[1] +
				           t * out.nb[2]))[i % HD] = 0.0f;
		return;
	}
	used = split_range(p, pos, s, S, &j0, &j1);
	if (j0 >= j1) /* a range not in use: nobody waits for it */
		return;
#pragma unroll
	for (int r = 0; r < RQ; r++) {
		const int i = threadIdx.x + r * 32 * SPLIT_WARPS;

		if (i < group * HD / 4)
			*(float4 *)&qs[i / (HD / 4)][i % (HD / 4) * 4] = qv[r];
	}
#pragma unroll
	for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
#pragma unroll
		for (int i = 0; i < D; i++)
			acc[g][i] = 0.0f;
	}
	__syncthreads();
	for (int64_t jb = j0 + warp * SPLIT_KEYS; jb < j1;
	     jb += SPLIT_WARPS * SPLIT_KEYS) {
		const int64_t j = jb + key < j1 ? jb + key : j1 - 1;
		const KV *kr = (const KV *)(k.data + kh * k.nb[1] + key_row(p, j, fault) * k.nb[2]);
		float kf[D][8], vf[SPLIT_KEYS][D], sc[SPLIT_MAX_GROUP];

#pragma unroll
		for (int c = 0; c < D; c++)
			load8(kr, c * 32 + sub * 8, kf[c]);
#pragma unroll
		for (int b = 0; b < SPLIT_KEYS; b++) {
			const int64_t jv = jb + b < j1 ? jb + b : j1 - 1;

			loadd<D>((const KV *)(v.data + kh * v.nb[1] + key_row(p, jv, fault) * v.nb[2]),
			         lane * D, vf[b]);
		}
#pragma unroll
		for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
			sc[g] = 0.0f;
			if (g >= group)
				continue;
#pragma unroll
			for (int c = 0; c < D; c++) {
				const float4 a = *(const float4 *)&qs[g][c * 32 + sub * 8];
				const float4 b = *(const float4 *)&qs[g][c * 32 + sub * 8 + 4];

				sc[g] += a.x * kf[c][0] + a.y * kf[c][1] + a.z * kf[c][2] +
				         a.w * kf[c][3] + b.x * kf[c][4] + b.y * kf[c][5] +
				         b.z * kf[c][6] + b.w * kf[c][7];
			}
		}
#pragma unroll
		for (int g = 0; g < SPLIT_MAX_GROUP; g++)
			if (g < group) {
				sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], 1);
				sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], 2);
			}
		/* One rescale per head and batch (Milakov & Gimelshein). */
#pragma unroll
		for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
			if (g >= group)
				break;
			const float x = jb + key < j1 ? score(p, sc[g]) : -INFINITY;
			float mn = x;

			for (int off = 4; off < 32; off *= 2)
				mn = fmaxf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
			mn = fmaxf(mn, m[g]); /* finite: key jb is in the range */
			const float c = expf(m[g] - mn), e = expf(x - mn);

			l[g] = l[g] * c + (sub == 0 ? e : 0.0f);
#pragma unroll
			for (int i = 0; i < D; i++)
				acc[g][i] *= c;
#pragma unroll
			for (int b = 0; b < SPLIT_KEYS; b++) {
				const float eb = __shfl_sync(0xffffffffu, e, 4 * b);

#pragma unroll
				for (int i = 0; i < D; i++)
					acc[g][i] += eb * vf[b][i];
			}
			m[g] = mn;
		}
	}
	/* Fold the warps: each keeps m, l and its sums in shared memory. */
#pragma unroll
	for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
		if (g >= group)
			break;
		const float lw = warp_sum(l[g]);

		if (lane == 0) {
			sm[warp][g][0] = m[g];
			sm[warp][g][1] = lw;
		}
#pragma unroll
		for (int i = 0; i < D; i++)
			sacc[warp][g][lane * D + i] = acc[g][i];
	}
	__syncthreads();
	for (int g = 0; g < group; g++) {
		float mx = -INFINITY, w[SPLIT_WARPS], sum = 0.0f;

		for (int i = 0; i < SPLIT_WARPS; i++)
			mx = fmaxf(mx, sm[i][g][0]);
		for (int i = 0; i < SPLIT_WARPS; i++) { /* a warp with no key: 0 */
			w[i] = sm[i][g][1] > 0.0f ? expf(sm[i][g][0] - mx) : 0.0f;
			sum += sm[i][g][1] * w[i];
		}
		const int64_t at = part_at(t, H, kh * group + g, S, s);
		for (int d = threadIdx.x; d < HD; d += blockDim.x) {
			float a = 0.0f;

			for (int i = 0; i < SPLIT_WARPS; i++)
				a += sacc[i][g][d] * w[i];
			part[at * HD + d] = a;
		}
		if (threadIdx.x == 0)
			ml[at] = make_float2(mx, sum);
	}
	/* The last block of the query's ranges merges them (the partials
	 * are visible device-wide before the counter moves). */
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) {
		int *c = &count[kh * q.ne[2] + t];

		last = atomicAdd(c, 1) == used - 1;
		if (last)
			*c = 0; /* every other block of the pair has counted */
	}
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	merge_group<HD>(ml, part, part_at(t, H, kh * group, S, 0), S, group,
	                (int)used, out, kh * group, t, pool, lsum);
}

/* The scratch: CUDA_SCRATCH_COUNTERS counters (zero between launches), the
 * partial sums of every range (16-byte aligned), then their (m, l). */
static size_t split_rows(const struct cuda_view *q, const struct split_plan &sp)
{
	return (size_t)q->ne[2] * (size_t)q->ne[1] * (size_t)sp.s;
}

extern "C" size_t cuda_attention_scratch(const struct cuda_view *q,
                                         const struct cuda_view *k,
                                         const struct cuda_view *v, int sms)
{
	const struct split_plan sp = plan_split(q, k, v, sms);

	return sp.s ? CUDA_SCRATCH_COUNTERS * sizeof(int) +
	              split_rows(q, sp) * (sizeof(float2) + sizeof(float) * (size_t)q->ne[0])
	            : 0;
}

template <typename KV>
static cudaError_t launch_split(const struct cuda_view *q,
                                const struct cuda_view *k,
                                const struct cuda_view *v,
                                const struct cuda_attn *p,
                                const struct cuda_view *out,
                                const struct split_plan &sp, void *scratch,
                                int32_t *fault, cudaStream_t s)
{
	const dim3 grid((unsigned)k->ne[1], (unsigned)sp.s, (unsigned)q->ne[2]);
	int *count = (int *)scratch;
	float *part = (float *)(count + CUDA_SCRATCH_COUNTERS);
	float2 *ml = (float2 *)(part + split_rows(q, sp) * (size_t)q->ne[0]);

#define SPLIT(HD)                                                               \
	q4kh_pdl_launch(split_kernel<KV, HD>, grid, 32 * SPLIT_WARPS, 0, s, *q, *k, *v, \
	                *p, sp.group, ml, part, count, *out, fault)
	switch (q->ne[0]) {
	case 64: return SPLIT(64);
	case 128: return SPLIT(128);
	default: return SPLIT(256);
	}
#undef SPLIT
}

extern "C" cudaError_t cuda_launch_attention(const struct cuda_view *q,
                                             const struct cuda_view *k,
                                             const struct cuda_view *v,
                                             const struct cuda_attn *p,
                                             const struct cuda_view *out,
                                             void *scratch, int sms, int cc_major,
                                             int32_t *fault, cudaStream_t s)
{
	const dim3 grid((unsigned)q->ne[1],
	                (unsigned)(q->ne[2] < 65535 ? q->ne[2] : 65535));
	const size_t shm = sizeof(float) * (size_t)(2 * q->ne[0] + ATTN_CHUNK);
	const bool k16 = k->type == Q4KH_TYPE_F16, v16 = v->type == Q4KH_TYPE_F16;
	const struct split_plan sp = plan_split(q, k, v, sms);

	cudaError_t e;

	if (scratch && sp.s)
		return k16 ? launch_split<__half>(q, k, v, p, out, sp, scratch, fault, s)
		           : launch_split<float>(q, k, v, p, out, sp, scratch, fault, s);
	if ((e = cuda_launch_flash(q, k, v, p, out, cc_major, fault, s)) != cudaErrorNotSupported)
		return e;
	if (k16 && v16)
		attention_kernel<__half, __half><<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p,
		                                                                 *out, fault);
	else if (k16)
		attention_kernel<__half, float><<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p,
		                                                                *out, fault);
	else if (v16)
		attention_kernel<float, __half><<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p,
		                                                                *out, fault);
	else
		attention_kernel<float, float><<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p,
		                                                               *out, fault);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_attention_preload(void)
{
	return cuda_preload(attention_kernel<__half, __half>, attention_kernel<__half, float>,
	                    attention_kernel<float, __half>, attention_kernel<float, float>,
	                    split_kernel<__half, 64>, split_kernel<__half, 128>,
	                    split_kernel<__half, 256>, split_kernel<float, 64>,
	                    split_kernel<float, 128>, split_kernel<float, 256>);
}
