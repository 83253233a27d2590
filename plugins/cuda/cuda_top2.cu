/*
 * top2 (ABI 1.4): the greedy pick of each column of the logits, in one
 * launch. A pick is the two leading (value, index) pairs of the column's
 * finite values in the order "larger value first, lower index on equal
 * values" (-0 and +0 are equal). That order is total over distinct
 * indices, so the leading two of a union are the leading two of the
 * parts' leading two: blocks, warps and threads pick from their parts
 * and merge in any order, and the result is the host's scan (q4kh_top2)
 * bit for bit, ties and the bits of the values included.
 *
 * A long column with few columns (decode: one column of 152k logits) is
 * split into slices, one block each; each block leaves its pick in the
 * scratch and counts itself on the column's counter, and the block that
 * counts last merges the slices' picks and sets the counter back to 0
 * (the pattern of attention's split form, cuda_attention.cu).
 */
#include <math.h>
#include <stdint.h>

#include "cuda_common.cuh"
#include "cuda_kernels.h"

#define TOP2_THREADS 256
#define TOP2_WARPS (TOP2_THREADS / 32)
#define TOP2_SLICE 2048 /* values a block of a split column reads, at least */
#define TOP2_NONE INT32_MAX /* the index of an empty place */

/* The two leading pairs; an empty place holds (-INFINITY, TOP2_NONE),
 * behind every finite value. */
struct top2_pick {
	float v1;
	int32_t i1;
	float v2;
	int32_t i2;
};

static __device__ __forceinline__ bool ahead(float va, int32_t ia, float vb,
                                             int32_t ib)
{
	return va > vb || (va == vb && ia < ib);
}

/* a = the leading two of a and b. */
static __device__ __forceinline__ void merge(struct top2_pick &a,
                                             const struct top2_pick &b)
{
	if (ahead(b.v1, b.i1, a.v1, a.i1)) {
		if (ahead(a.v1, a.i1, b.v2, b.i2)) {
			a.v2 = a.v1;
			a.i2 = a.i1;
		} else {
			a.v2 = b.v2;
			a.i2 = b.i2;
		}
		a.v1 = b.v1;
		a.i1 = b.i1;
	} else if (ahead(b.v1, b.i1, a.v2, a.i2)) {
		a.v2 = b.v1;
		a.i2 = b.i1;
	}
}

/* The block's pick, in thread 0 (the others' are partial). */
static __device__ struct top2_pick block_merge(struct top2_pick p)
{
	__shared__ struct top2_pick warps[TOP2_WARPS];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int off = 16; off; off >>= 1) {
		struct top2_pick o;

		o.v1 = __shfl_down_sync(0xffffffffu, p.v1, off);
		o.i1 = __shfl_down_sync(0xffffffffu, p.i1, off);
		o.v2 = __shfl_down_sync(0xffffffffu, p.v2, off);
		o.i2 = __shfl_down_sync(0xffffffffu, p.i2, off);
		merge(p, o);
	}
	if (lane == 0)
		warps[warp] = p;
	__syncthreads();
	if (threadIdx.x == 0)
		for (int w = 1; w < TOP2_WARPS; w++)
			merge(p, warps[w]);
	__syncthreads(); /* warps[] is free for the block's next call */
	return p;
}

/*
 * Grid (parts, columns): block (p, c) picks from slice p of columns c,
 * c + gridDim.y, ...; with parts > 1 (then gridDim.y is T) through
 * PART and COUNT, else it writes the column's result itself. Everything
 * it reads is an earlier kernel's: launched as a programmatic dependent, it
 * only lets the next kernel in before it waits for those.
 */
static __global__ void __launch_bounds__(TOP2_THREADS)
top2_kernel(struct cuda_view x, int32_t *idx, float *val, int64_t nb1,
            int64_t slice, struct top2_pick *part, int *count)
{
	__shared__ bool last;
	const int64_t n = x.ne[0], T = x.ne[1];
	const int parts = gridDim.x;

	q4kh_pdl_release();
	q4kh_pdl_wait();
	for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
		const float *col = (const float *)(x.data + t * x.nb[1]);
		const int64_t lo = blockIdx.x * slice;
		const int64_t hi = lo + slice < n ? lo + slice : n;
		struct top2_pick p = { -INFINITY, TOP2_NONE, -INFINITY, TOP2_NONE };

		/* a thread's indices rise, so a later equal value stays behind */
		for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
			const float v = col[i];

			if (!isfinite(v))
				continue;
			if (v > p.v1) {
				p.v2 = p.v1;
				p.i2 = p.i1;
				p.v1 = v;
				p.i1 = (int32_t)i;
			} else if (v > p.v2) {
				p.v2 = v;
				p.i2 = (int32_t)i;
			}
		}
		p = block_merge(p);
		if (parts > 1) {
			/* the slice's pick is visible device-wide before the
			 * counter moves */
			if (threadIdx.x == 0) {
				part[t * parts + blockIdx.x] = p;
				__threadfence();
				last = atomicAdd(&count[t], 1) == parts - 1;
				if (last)
					count[t] = 0; /* every other slice has counted */
			}
			__syncthreads();
			if (!last)
				continue;
			__threadfence();
			p.v1 = p.v2 = -INFINITY;
			p.i1 = p.i2 = TOP2_NONE;
			for (int j = threadIdx.x; j < parts; j += blockDim.x) {
				const struct top2_pick *q = &part[t * parts + j];
				struct top2_pick o;

				/* past L1: other blocks wrote them */
				o.v1 = __ldcg(&q->v1);
				o.i1 = __ldcg(&q->i1);
				o.v2 = __ldcg(&q->v2);
				o.i2 = __ldcg(&q->i2);
				merge(p, o);
			}
			p = block_merge(p);
		}
		if (threadIdx.x == 0) {
			idx[t] = p.i1 == TOP2_NONE ? -1 : p.i1;
			val[t * nb1] = p.v1;
			val[t * nb1 + 1] = p.v2;
		}
	}
}

/* Blocks per column: enough slices of at least TOP2_SLICE values for the
 * grid to fill the device twice over; 1 when the columns already do, or
 * when they outnumber the counters. */
static int top2_parts(const struct cuda_view *x, int sms)
{
	const int64_t n = x->ne[0], T = x->ne[1];
	const int64_t want = (2 * (int64_t)sms + T - 1) / T;
	int64_t parts = (n + TOP2_SLICE - 1) / TOP2_SLICE;

	if (T > CUDA_SCRATCH_COUNTERS)
		return 1;
	if (parts > want)
		parts = want;
	return parts > 1 ? (int)parts : 1;
}

extern "C" size_t cuda_top2_scratch(const struct cuda_view *x, int sms)
{
	const int parts = top2_parts(x, sms);

	return parts > 1 ? CUDA_SCRATCH_COUNTERS * sizeof(int) +
	                   (size_t)x->ne[1] * (size_t)parts * sizeof(struct top2_pick)
	                 : 0;
}

extern "C" cudaError_t cuda_launch_top2(const struct cuda_view *x, int32_t *idx,
                                        float *val, int64_t nb1, void *scratch,
                                        int sms, int pdl, cudaStream_t s)
{
	const int parts = scratch ? top2_parts(x, sms) : 1;
	const int64_t T = x->ne[1];
	/* slices of whole warps' loads */
	const int64_t slice = ((x->ne[0] + parts - 1) / parts + 31) / 32 * 32;
	const dim3 grid((unsigned)parts, (unsigned)(T < 65535 ? T : 65535));
	int *count = (int *)scratch;
	struct top2_pick *part =
		parts > 1 ? (struct top2_pick *)(count + CUDA_SCRATCH_COUNTERS) : NULL;

	return q4kh_pdl_launch(pdl != 0, top2_kernel, grid, TOP2_THREADS, 0, s, *x, idx, val,
	                       nb1, slice, part, count);
}

extern "C" cudaError_t cuda_top2_preload(void)
{
	return q4kh_preload(top2_kernel);
}
