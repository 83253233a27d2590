/*
 * Causal, windowed, grouped-query attention over the KV cache, in two
 * forms.
 *
 * Decode (a few queries, split_plan): flash-decoding (Dao et al. 2023,
 * "Flash-Decoding for long-context inference"). The visible keys of a
 * query are cut into S equal ranges; block (KV head, range, token) reads
 * its range of K and V once for every query head of the group, each warp
 * a quarter of the keys with a running softmax of its own, lanes splitting
 * the head dimension. The block folds its warps together and writes one
 * partial result per query head (m, l and the unnormalised sum) to
 * scratch memory; a second kernel merges the partials. Ranges hold at
 * least SPLIT_MIN_KEYS keys, so a short context leaves most of them empty
 * and the merge reads only those in use. The grid is
 * fixed by the shapes, the ranges by the position read on the device, so
 * one recorded launch serves every later token.
 *
 * Otherwise (prompts): a block takes one query (head h, token t) at a
 * time: grid.x is the head, grid.y strides over the tokens. The visible keys are taken in chunks of
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
/*
 * The position of query t in *POS: pos[t] from the device, checked
 * against the cache's length, or pos0 + t. 0 on a fault.
 */
static __device__ __forceinline__ bool query_pos(const struct cuda_attn &p,
                                                 const struct cuda_view &k,
                                                 int64_t t, int32_t *fault,
                                                 int64_t *pos)
{
	if (!p.pos) {
		*pos = p.pos0 + t;
		return true;
	}
	*pos = p.pos[t];
	return index_ok(fault, CUDA_FAULT_ATTENTION_POS, t, p.pos[t], k.ne[2]);
}

/* The first key that a query at POS sees. */
static __device__ __forceinline__ int64_t first_key(const struct cuda_attn &p,
                                                    int64_t pos)
{
	return p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
}

/* A score as the model defines it: scaled, then capped when softcap > 0. */
static __device__ __forceinline__ float score(const struct cuda_attn &p,
                                              float dot)
{
	const float s = dot * p.scale;

	return p.softcap > 0.0f ? p.softcap * tanhf(s / p.softcap) : s;
}

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
			                          (j0 + c) * k.nb[2]);
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
				                          (j0 + c) * v.nb[2]);
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
#define SPLIT_MIN_KEYS 64  /* keys of a range, unless the query sees fewer */
#define SPLIT_BATCH 4      /* keys a warp loads before it uses them */

/* How a split launch cuts the work: S ranges per query. */
struct split_plan {
	int s;     /* 0: the shapes do not take the split form */
	int group; /* query heads per KV head */
};

static struct split_plan plan_split(const struct cuda_view *q,
                                    const struct cuda_view *k, int sms)
{
	struct split_plan sp = { 0, 0 };
	const int64_t hd = q->ne[0], hkv = k->ne[1], t = q->ne[2];
	int64_t s;

	if (t > SPLIT_MAX_T || (hd != 64 && hd != 128 && hd != 256) ||
	    q->ne[1] / hkv > SPLIT_MAX_GROUP)
		return sp;
	/* About four blocks per multiprocessor over the KV heads and queries. */
	s = (4 * (int64_t)sms + hkv * t - 1) / (hkv * t);
	sp.s = (int)(s < 1 ? 1 : s > SPLIT_MAX_S ? SPLIT_MAX_S : s);
	sp.group = (int)(q->ne[1] / hkv);
	return sp;
}

/* D consecutive values of a cache row from element 32-aligned lane * D,
 * as float. */
template <int D>
static __device__ __forceinline__ void load_row(const float *row, int lane,
                                                float *out)
{
#pragma unroll
	for (int i = 0; i < D; i += 2) {
		const float2 v = *(const float2 *)(row + lane * D + i);

		out[i] = v.x;
		out[i + 1] = v.y;
	}
}

template <int D>
static __device__ __forceinline__ void load_row(const __half *row, int lane,
                                                float *out)
{
#pragma unroll
	for (int i = 0; i < D; i += 2) {
		const float2 v = __half22float2(*(const __half2 *)(row + lane * D + i));

		out[i] = v.x;
		out[i + 1] = v.y;
	}
}

/*
 * The keys [*j0, *j1) of range s of S for a query at POS: the visible keys
 * cut into S ranges of at least SPLIT_MIN_KEYS, so that a short context
 * uses few ranges and the rest are empty. Returns the ranges in use.
 */
static __device__ __forceinline__ int64_t split_range(const struct cuda_attn &p,
                                                      int64_t pos, int64_t s,
                                                      int64_t S, int64_t *j0,
                                                      int64_t *j1)
{
	const int64_t first = first_key(p, pos), n = pos - first + 1;
	int64_t chunk = (n + S - 1) / S;

	if (chunk < SPLIT_MIN_KEYS)
		chunk = SPLIT_MIN_KEYS;
	*j0 = first + s * chunk;
	*j1 = *j0 + chunk < pos + 1 ? *j0 + chunk : pos + 1;
	return (n + chunk - 1) / chunk;
}

/*
 * One range of keys of one query for the G query heads of KV head
 * blockIdx.x. Partials: ml[(t H + h) S + s] = (m, l), acc at the same
 * index times hd. D = hd / 32 values per lane. A warp loads SPLIT_BATCH
 * keys' rows before it uses any, so that several loads are in flight.
 */
template <typename KV, int D>
static __global__ void __launch_bounds__(32 * SPLIT_WARPS)
split_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
             struct cuda_attn p, int group, float2 *ml, float *part,
             int32_t *fault)
{
	__shared__ float sm[SPLIT_WARPS][SPLIT_MAX_GROUP][2];
	__shared__ float sacc[SPLIT_WARPS][SPLIT_MAX_GROUP][32 * D];
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int64_t kh = blockIdx.x, s = blockIdx.y, t = blockIdx.z;
	const int64_t S = gridDim.y, H = q.ne[1], hd = 32 * D;
	float qr[SPLIT_MAX_GROUP][D], acc[SPLIT_MAX_GROUP][D];
	float m[SPLIT_MAX_GROUP], l[SPLIT_MAX_GROUP];
	int64_t pos, j0 = 0, j1 = 0;

	if (query_pos(p, k, t, fault, &pos))
		split_range(p, pos, s, S, &j0, &j1);
	if (j0 >= j1) { /* an empty range: the merge does not read it */
		return;
	}
#pragma unroll
	for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
#pragma unroll
		for (int i = 0; i < D; i++) {
			acc[g][i] = 0.0f;
			qr[g][i] = 0.0f;
		}
		if (g < group) {
			const float *qh = (const float *)(q.data + (kh * group + g) * q.nb[1] +
			                                  t * q.nb[2]);

			load_row<D>(qh, lane, qr[g]);
		}
	}
	for (int64_t jb = j0 + warp * SPLIT_BATCH; jb < j1;
	     jb += SPLIT_WARPS * SPLIT_BATCH) {
		float kf[SPLIT_BATCH][D], vf[SPLIT_BATCH][D];

#pragma unroll
		for (int b = 0; b < SPLIT_BATCH; b++) {
			const int64_t j = jb + b < j1 ? jb + b : j1 - 1;

			load_row<D>((const KV *)(k.data + kh * k.nb[1] + j * k.nb[2]), lane, kf[b]);
			load_row<D>((const KV *)(v.data + kh * v.nb[1] + j * v.nb[2]), lane, vf[b]);
		}
		/* The batch's scores for every head: the dot products first,
		 * then all their warp sums together, which keeps many
		 * shuffles in flight instead of one chain per key and head. */
		float sc[SPLIT_BATCH][SPLIT_MAX_GROUP];

#pragma unroll
		for (int b = 0; b < SPLIT_BATCH; b++)
#pragma unroll
			for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
				sc[b][g] = 0.0f;
#pragma unroll
				for (int i = 0; i < D; i++)
					sc[b][g] += qr[g][i] * kf[b][i];
			}
#pragma unroll
		for (int off = 16; off > 0; off /= 2)
#pragma unroll
			for (int b = 0; b < SPLIT_BATCH; b++)
#pragma unroll
				for (int g = 0; g < SPLIT_MAX_GROUP; g++)
					if (g < group)
						sc[b][g] += __shfl_xor_sync(0xffffffffu, sc[b][g], off);
		/* One rescale per head and batch (Milakov & Gimelshein). */
#pragma unroll
		for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
			if (g >= group)
				break;
			float mn = m[g];

#pragma unroll
			for (int b = 0; b < SPLIT_BATCH; b++) {
				sc[b][g] = jb + b < j1 ? score(p, sc[b][g]) : -INFINITY;
				mn = fmaxf(mn, sc[b][g]);
			}
			const float c = expf(m[g] - mn);

			l[g] *= c;
#pragma unroll
			for (int i = 0; i < D; i++)
				acc[g][i] *= c;
#pragma unroll
			for (int b = 0; b < SPLIT_BATCH; b++) {
				const float e = expf(sc[b][g] - mn); /* 0 past j1 */

				l[g] += e;
#pragma unroll
				for (int i = 0; i < D; i++)
					acc[g][i] += e * vf[b][i];
			}
			m[g] = mn;
		}
	}
	/* Fold the warps: each keeps m, l and its sums in shared memory. */
#pragma unroll
	for (int g = 0; g < SPLIT_MAX_GROUP; g++) {
		if (g >= group)
			break;
		if (lane == 0) {
			sm[warp][g][0] = m[g];
			sm[warp][g][1] = l[g];
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
		const int64_t at = (t * H + kh * group + g) * S + s;
		for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
			float a = 0.0f;

			for (int i = 0; i < SPLIT_WARPS; i++)
				a += sacc[i][g][d] * w[i];
			part[at * hd + d] = a;
		}
		if (threadIdx.x == 0)
			ml[at] = make_float2(mx, sum);
	}
}

/*
 * out[:, h, t] from the partials of the ranges in use for (h, t): block
 * (h, t); the ranges' weights exp(m_s - max m) first, in shared memory,
 * then thread d sums its column over them.
 */
static __global__ void __launch_bounds__(256)
merge_kernel(const float2 *ml, const float *part, int S, struct cuda_attn p,
             struct cuda_view k, struct cuda_view out)
{
	__shared__ float wt[SPLIT_MAX_S];
	__shared__ float red[32];
	const int64_t h = blockIdx.x, t = blockIdx.y, H = gridDim.x;
	const int64_t hd = out.ne[0], at = (t * H + h) * S;
	float *o = (float *)(out.data + h * out.nb[1] + t * out.nb[2]);
	int64_t pos, j0, j1, used = 0;

	/* A position out of range: the split kernel kept the fault. */
	pos = p.pos ? p.pos[t] : p.pos0 + t;
	if (pos >= 0 && pos < k.ne[2])
		used = split_range(p, pos, 0, S, &j0, &j1);
	float mx = -INFINITY;
	for (int64_t s = threadIdx.x; s < used; s += blockDim.x)
		mx = fmaxf(mx, ml[at + s].x);
	/* the block's maximum */
	for (int off = 16; off > 0; off /= 2)
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
	if (threadIdx.x % 32 == 0)
		red[threadIdx.x / 32] = mx;
	__syncthreads();
	mx = -INFINITY;
	for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++)
		mx = fmaxf(mx, red[i]);
	for (int64_t s = threadIdx.x; s < used; s += blockDim.x)
		wt[s] = expf(ml[at + s].x - mx);
	__syncthreads();
	float sum = 0.0f;
	for (int64_t s = 0; s < used; s++)
		sum += ml[at + s].y * wt[s];
	for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
		float a = 0.0f;

#pragma unroll 8
		for (int64_t s = 0; s < used; s++)
			a += part[(at + s) * hd + d] * wt[s];
		o[d] = sum > 0.0f ? a / sum : 0.0f; /* 0: a fault, nothing seen */
	}
}

extern "C" size_t cuda_attention_scratch(const struct cuda_view *q,
                                         const struct cuda_view *k, int sms)
{
	const struct split_plan sp = plan_split(q, k, sms);
	const size_t rows = (size_t)q->ne[2] * (size_t)q->ne[1] * (size_t)sp.s;

	return sp.s ? rows * (sizeof(float2) + sizeof(float) * (size_t)q->ne[0]) : 0;
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
	const size_t rows = (size_t)q->ne[2] * (size_t)q->ne[1] * (size_t)sp.s;
	float2 *ml = (float2 *)scratch;
	float *part = (float *)(ml + rows);

	switch (q->ne[0]) {
	case 64:
		split_kernel<KV, 2><<<grid, 32 * SPLIT_WARPS, 0, s>>>(
			*q, *k, *v, *p, sp.group, ml, part, fault);
		break;
	case 128:
		split_kernel<KV, 4><<<grid, 32 * SPLIT_WARPS, 0, s>>>(
			*q, *k, *v, *p, sp.group, ml, part, fault);
		break;
	default:
		split_kernel<KV, 8><<<grid, 32 * SPLIT_WARPS, 0, s>>>(
			*q, *k, *v, *p, sp.group, ml, part, fault);
		break;
	}
	merge_kernel<<<dim3((unsigned)q->ne[1], (unsigned)q->ne[2]),
	               (unsigned)(q->ne[0] < 256 ? q->ne[0] : 256), 0, s>>>(
		ml, part, sp.s, *p, *k, *out);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_attention(const struct cuda_view *q,
                                             const struct cuda_view *k,
                                             const struct cuda_view *v,
                                             const struct cuda_attn *p,
                                             const struct cuda_view *out,
                                             void *scratch, int sms,
                                             int32_t *fault, cudaStream_t s)
{
	const dim3 grid((unsigned)q->ne[1],
	                (unsigned)(q->ne[2] < 65535 ? q->ne[2] : 65535));
	const size_t shm = sizeof(float) * (size_t)(2 * q->ne[0] + ATTN_CHUNK);
	const bool k16 = k->type == Q4KH_TYPE_F16, v16 = v->type == Q4KH_TYPE_F16;
	const struct split_plan sp = plan_split(q, k, sms);

	if (scratch && sp.s && k16 == v16)
		return k16 ? launch_split<__half>(q, k, v, p, out, sp, scratch, fault, s)
		           : launch_split<float>(q, k, v, p, out, sp, scratch, fault, s);
	if (k16 && v16)
		attention_kernel<__half, __half>
			<<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p, *out, fault);
	else if (k16)
		attention_kernel<__half, float>
			<<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p, *out, fault);
	else if (v16)
		attention_kernel<float, __half>
			<<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p, *out, fault);
	else
		attention_kernel<float, float>
			<<<grid, ATTN_THREADS, shm, s>>>(*q, *k, *v, *p, *out, fault);
	return cudaGetLastError();
}
