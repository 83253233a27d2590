/*
 * Causal, windowed, grouped-query attention over the KV cache, in two
 * forms.
 *
 * Decode (a few queries, split_plan): flash-decoding (Dao et al. 2023,
 * "Flash-Decoding for long-context inference"). The visible keys of a
 * query are cut into S ranges of at least SPLIT_MIN_KEYS, S such that the
 * grid is one wave of SPLIT_WAVE blocks a multiprocessor; block (KV head,
 * range, token) reads its range of K and V once for every query head of
 * the group, each warp eight keys at a time with a running softmax of its
 * own and its next eight keys in flight. The block folds its warps
 * together; a query whose keys fit one range (a short context) is then
 * done, else the block writes one partial result per query head (m, l and
 * the unnormalised sum) to scratch memory and the last block of a (KV
 * head, token) to finish merges the partials, so a decode step's
 * attention is one launch. A short context leaves most ranges empty: such
 * a block reads the position and ends. The grid is fixed by the shapes,
 * the ranges by the position read on the device, so one recorded launch
 * serves every later token; the position is read before the launch waits
 * for the kernel before it (PDL), the queries with the first keys after.
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
#include "cuda_split.cuh"
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

/* --- flash-decoding (cuda_split.cuh): a block per item --- */

template <typename KV, int HD, int G>
static __global__ void __launch_bounds__(32 * SPLIT_WARPS)
split_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
             struct cuda_attn p, int group, float2 *ml, float *part,
             int *count, struct cuda_view out, int32_t *fault)
{
	__shared__ struct split_shared<HD> sh;

	q4kh_pdl_release();
	split_block<KV, HD, true, G>(q, k, v, p, group, ml, part, count, out, fault, blockIdx.x,
	                             blockIdx.y, blockIdx.z, gridDim.y, &sh);
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

/* split_kernel of head dimension HD for a group of GROUP heads: its
 * instance for that group where it has one (1, 2, 4, 8), else the one for
 * any group. */
template <typename KV, int HD, typename... A>
static cudaError_t launch_split_hd(int group, int pdl, dim3 grid, cudaStream_t s, A... args)
{
#define SPLIT(G) q4kh_pdl_launch(pdl, split_kernel<KV, HD, G>, grid, 32 * SPLIT_WARPS, 0, s, args...)
	switch (group) {
	case 1: return SPLIT(1);
	case 2: return SPLIT(2);
	case 4: return SPLIT(4);
	case 8: return SPLIT(8);
	default: return SPLIT(0);
	}
#undef SPLIT
}

template <typename KV>
static cudaError_t launch_split(const struct cuda_view *q,
                                const struct cuda_view *k,
                                const struct cuda_view *v,
                                const struct cuda_attn *p,
                                const struct cuda_view *out,
                                const struct split_plan &sp, void *scratch,
                                int32_t *fault, int pdl, cudaStream_t s)
{
	const dim3 grid((unsigned)k->ne[1], (unsigned)sp.s, (unsigned)q->ne[2]);
	int *count = (int *)scratch;
	float *part = (float *)(count + CUDA_SCRATCH_COUNTERS);
	float2 *ml = (float2 *)(part + split_rows(q, sp) * (size_t)q->ne[0]);

#define SPLIT(HD)                                                                      \
	launch_split_hd<KV, HD>(sp.group, pdl, grid, s, *q, *k, *v, *p, sp.group, ml, part, \
	                        count, *out, fault)
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
                                             int32_t *fault, int pdl, cudaStream_t s)
{
	const dim3 grid((unsigned)q->ne[1],
	                (unsigned)(q->ne[2] < 65535 ? q->ne[2] : 65535));
	const size_t shm = sizeof(float) * (size_t)(2 * q->ne[0] + ATTN_CHUNK);
	const bool k16 = k->type == Q4KH_TYPE_F16, v16 = v->type == Q4KH_TYPE_F16;
	const struct split_plan sp = plan_split(q, k, v, sms);

	cudaError_t e;

	if (scratch && sp.s)
		return k16 ? launch_split<__half>(q, k, v, p, out, sp, scratch, fault, pdl, s)
		           : launch_split<float>(q, k, v, p, out, sp, scratch, fault, pdl, s);
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

/* The split kernels of one cache type and head dimension, every group. */
#define SPLIT_KERNELS(KV, HD)                                                  \
	split_kernel<KV, HD, 1>, split_kernel<KV, HD, 2>, split_kernel<KV, HD, 4>, \
		split_kernel<KV, HD, 8>, split_kernel<KV, HD, 0>

extern "C" cudaError_t cuda_attention_preload(void)
{
	return q4kh_preload(attention_kernel<__half, __half>, attention_kernel<__half, float>,
	                    attention_kernel<float, __half>, attention_kernel<float, float>,
	                    SPLIT_KERNELS(__half, 64), SPLIT_KERNELS(__half, 128),
	                    SPLIT_KERNELS(__half, 256), SPLIT_KERNELS(float, 64),
	                    SPLIT_KERNELS(float, 128), SPLIT_KERNELS(float, 256));
}
