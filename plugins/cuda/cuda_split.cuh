/*
 * Flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context
 * inference"), the decode form of cuda_attention.cu (see its top comment):
 * split_block is the work of one block, (KV head, range of keys, query),
 * run by cuda_attention.cu's split_kernel, a block each, and by the
 * persistent decode kernel (cuda_persist.cu), which walks the same items
 * with the blocks it has. Queries are read past L1 (the persistent kernel
 * writes them in the same launch); the cache by plain loads, its rows at
 * the query's position written before any block of the launch reads them.
 *
 * The critical path of an item, in dependent memory round trips: the
 * position (before q4kh_pdl_wait, as the host writes it), then the
 * queries with the first keys, each warp's next keys in flight while it
 * scores the last ones; then, where the query has more than one range, the
 * partials, a fence and the counter, and the merge's loads, its (m, l)
 * pairs and the first partials together.
 */
#ifndef Q4KH_CUDA_SPLIT_CUH
#define Q4KH_CUDA_SPLIT_CUH

#include <cuda_fp16.h>
#include <math.h>

#include "cuda_attention.cuh"
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "q4khost/quant.h"


#define SPLIT_WARPS 4
#define SPLIT_MAX_T 8      /* queries a split launch takes */
#define SPLIT_MAX_GROUP 8  /* query heads per KV head */
#define SPLIT_MAX_S 128    /* ranges per query */
#define SPLIT_WAVE 2       /* blocks per multiprocessor a launch has */
#define SPLIT_KEYS 8       /* keys a warp scores at once, 4 lanes a key */
#define SPLIT_MIN_KEYS (SPLIT_WARPS * SPLIT_KEYS) /* one batch a warp */
#define MERGE_LOADS 8      /* partials a merging thread has in flight, */
#define MERGE_LOADS_ROOM 32 /* with registers to spare (split_block's ROOM) */

/* Threads of a team: the SPLIT_WARPS warps that run one item. A block
 * holds one team (split_kernel) or several (the persistent kernel), team
 * k of threads [128 k, 128 k + 128), each with its own named barrier. */
#define SPLIT_TEAM (32 * SPLIT_WARPS)

/* The team's thread index and its barrier (1 + team: 0 is the block's). */
static __device__ __forceinline__ int team_tid(void) { return threadIdx.x % SPLIT_TEAM; }

static __device__ __forceinline__ void team_sync(void)
{
#ifdef Q4KH_EMU_H
	__syncthreads(); /* tests/emu runs one team a block */
#else
	asm volatile("bar.sync %0, %1;" ::"r"(1 + (int)threadIdx.x / SPLIT_TEAM), "n"(SPLIT_TEAM)
	             : "memory");
#endif
}

/* How a split launch cuts the work: S ranges per query. */
struct split_plan {
	int s;     /* 0: the shapes do not take the split form */
	int group; /* query heads per KV head */
};

static inline bool aligned16(const struct cuda_view *v)
{
	return (((uintptr_t)v->data | (uintptr_t)v->nb[1] | (uintptr_t)v->nb[2]) & 15) == 0;
}

static inline struct split_plan plan_split(const struct cuda_view *q,
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
	/* SPLIT_WAVE blocks per multiprocessor over the KV heads and
	 * queries: one wave, every block resident at once (128 threads of at
	 * most 255 registers, at most 41 KiB of shared memory), so that a
	 * long context is streamed by blocks that each walk many batches,
	 * with the next in flight, and a short one leaves the ranges it does
	 * not use empty at the cost of a position read. */
	s = (SPLIT_WAVE * (int64_t)sms + hkv * t - 1) / (hkv * t);
	sp.s = (int)(s < 1 ? 1 : s > SPLIT_MAX_S ? SPLIT_MAX_S : s);
	sp.group = (int)(q->ne[1] / hkv);
	return sp;
}

/* N consecutive values of a cache row as loaded (16-byte aligned when
 * they are 16 bytes or more, else aligned to their size), kept so until
 * they are used: a warp's next batch waits in these while it scores the
 * last one. */
template <typename KV, int N>
struct alignas(sizeof(KV) * N < 16 ? sizeof(KV) * N : 16) raw_vals {
	KV x[N];
};

template <typename KV, int N>
static __device__ __forceinline__ void unpack(const raw_vals<KV, N> &r, float *out)
{
#pragma unroll
	for (int e = 0; e < N; e++)
		out[e] = to_f32(r.x[e]);
}

/*
 * What one lane loads of a warp's batch of SPLIT_KEYS keys: its key's
 * pieces of 8 values, HD / 32 of them 32 apart (lanes 4c .. 4c+3 take key
 * c, each a quarter of the head dimension, the four reading 64 contiguous
 * bytes), and its HD / 32 consecutive dimensions of every key's value.
 */
template <typename KV, int HD>
struct split_batch {
	raw_vals<KV, 8> k[HD / 32];
	raw_vals<KV, HD / 32> v[SPLIT_KEYS];
};

/* The batch of keys [JB, JB + SPLIT_KEYS) of KV head KH, the keys from J1
 * on replaced by key J1 - 1 (loaded, never weighed). */
template <typename KV, int HD>
static __device__ __forceinline__ void fetch_batch(const struct cuda_view &k,
                                                   const struct cuda_view &v,
                                                   const struct cuda_attn &p, int64_t kh,
                                                   int64_t jb, int64_t j1, int32_t *fault,
                                                   struct split_batch<KV, HD> *b)
{
	constexpr int D = HD / 32;
	const int lane = team_tid() % 32, key = lane / 4, sub = lane % 4;
	const int64_t j = jb + key < j1 ? jb + key : j1 - 1;
	const KV *kr = (const KV *)(k.data + kh * k.nb[1] + key_row(p, j, fault) * k.nb[2]);

#pragma unroll
	for (int c = 0; c < D; c++)
		b->k[c] = *(const raw_vals<KV, 8> *)(kr + c * 32 + sub * 8);
#pragma unroll
	for (int e = 0; e < SPLIT_KEYS; e++) {
		const int64_t jv = jb + e < j1 ? jb + e : j1 - 1;

		b->v[e] = *(const raw_vals<KV, D> *)(v.data + kh * v.nb[1] +
		                                      key_row(p, jv, fault) * v.nb[2] +
		                                      lane * D * sizeof(KV));
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

/* A team's shared memory: its queries, its warps' (m, l), the pool of
 * split_pool and the merge's sums. */
template <int HD>
struct split_shared {
	__align__(16) float qs[SPLIT_MAX_GROUP][HD];
	float sm[SPLIT_WARPS][SPLIT_MAX_GROUP][2];
	__align__(16) float pool[split_pool<HD>::size];
	float lsum[SPLIT_MAX_GROUP];
	int last;
};

/* The partials of ranges [S0, S0 + N) below USED of column block I (head
 * I / (HD / 4), four dimensions) into V, zero past USED: written by other
 * blocks, read past L1. */
template <int HD, int N>
static __device__ __forceinline__ void merge_fetch(const float *part, int64_t at, int64_t S,
                                                   int i, int s0, int used, float4 *v)
{
	const float4 *pp = (const float4 *)(part + (at + i / (HD / 4) * S) * HD) + i % (HD / 4);

#pragma unroll
	for (int u = 0; u < N; u++)
		v[u] = s0 + u < used ? __ldcg(pp + (s0 + u) * (HD / 4))
		                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/*
 * out[:, h0 + g, t], g < G, from the USED partials of each head (head
 * h0 + g, range s at AT + g S + s), N at a time. The partials were written
 * by other blocks: read past L1. The loads of a phase are independent of
 * each other, and each thread's first partials are in flight with the pairs,
 * so that the merge costs about one memory latency, not one per range:
 * the pairs (m, l) into shared memory; a warp per head turns them into
 * the weights exp(m_s - max m) and their sum with l; then each thread
 * sums four columns of a head over the ranges.
 */
template <int HD, int N>
static __device__ void merge_group(const float2 *ml, const float *part,
                                   int64_t at, int64_t S, int G, int used, const struct cuda_view &out,
                                   int64_t h0, int64_t t, float *pool,
                                   float *lsum)
{
	float2 *mls = (float2 *)pool;                      /* [G][used] */
	float *wt = pool + 2 * SPLIT_MAX_GROUP * SPLIT_MAX_S; /* [G][used] */
	const int warp = team_tid() / 32, lane = team_tid() % 32;
	const int cols = G * HD / 4;

	constexpr int R = SPLIT_MAX_GROUP * SPLIT_MAX_S / (32 * SPLIT_WARPS);
	float2 pair[R];
	float4 v[N];

	if (team_tid() < cols)
		merge_fetch<HD, N>(part, at, S, team_tid(), 0, used, v);
#pragma unroll
	for (int r = 0; r < R; r++) {
		const int i = team_tid() + r * SPLIT_TEAM;

		if (i < G * used)
			pair[r] = __ldcg(&ml[at + i / used * S + i % used]);
	}
#pragma unroll
	for (int r = 0; r < R; r++) {
		const int i = team_tid() + r * SPLIT_TEAM;

		if (i < G * used)
			mls[i] = pair[r];
	}
	team_sync();
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
	team_sync();
	for (int i = team_tid(); i < cols; i += SPLIT_TEAM) {
		const int g = i / (HD / 4), d = i % (HD / 4) * 4;
		const float *w = wt + g * used;
		float *o = (float *)(out.data + (h0 + g) * out.nb[1] + t * out.nb[2]);
		float a[4] = { 0.0f, 0.0f, 0.0f, 0.0f };

		for (int s0 = 0;;) {
#pragma unroll
			for (int u = 0; u < N; u++) {
				const float wu = s0 + u < used ? w[s0 + u] : 0.0f;

				a[0] += v[u].x * wu;
				a[1] += v[u].y * wu;
				a[2] += v[u].z * wu;
				a[3] += v[u].w * wu;
			}
			if ((s0 += N) >= used)
				break;
			merge_fetch<HD, N>(part, at, S, i, s0, used, v);
		}
#pragma unroll
		for (int e = 0; e < 4; e++)
			o[d + e] = a[e] / lsum[g];
		if (i + SPLIT_TEAM < cols)
			merge_fetch<HD, N>(part, at, S, i + SPLIT_TEAM, 0, used, v);
	}
}

/* Whether a warp has the registers to keep its next batch in flight
 * (split_block's ROOM): the batch's raw values, at most 64 registers, and
 * the GM heads' sums (GM HD / 32) within 80. */
template <typename KV, int HD, int GM>
struct split_ahead {
	static constexpr int regs = sizeof(split_batch<KV, HD>) / 4;
	static constexpr bool value = regs <= 64 && regs + GM * HD / 32 <= 80;
};

/*
 * Item (KH, S of the S ranges, T), run by a team (SPLIT_TEAM threads,
 * SHARED its own): one range of keys of query T for the G query heads of
 * KV head KH. A query whose keys fit one range (the short contexts) is
 * finished by its one team; else the last team of (KV head, query) to
 * finish merges the ranges (a counter per pair in COUNT, back to 0 after
 * the merge, so the next launch finds it clear). Partials: ml[part_at] =
 * (m, l), part at the same index times HD.
 *
 * It reads the position, then calls q4kh_pdl_wait (nothing in a kernel
 * not launched with PDL, as the persistent one), then everything else.
 *
 * A warp scores SPLIT_KEYS keys at once (split_batch's layout): two
 * shuffles finish a dot product. For the values each lane owns HD / 32
 * consecutive dimensions and takes the weights of the batch's keys from
 * the lanes that scored them.
 *
 * G: GROUP when known as the kernel is compiled, so that the heads'
 * shuffles and exponentials interleave without branches between them;
 * 0: any group up to SPLIT_MAX_GROUP, each head behind a branch.
 *
 * ROOM: the thread has registers to spare (up to 255, split_kernel's);
 * without, as in the persistent kernel (128), it keeps no more in flight
 * than it uses at once. With, the next batch's loads are issued before
 * the warp scores the last one where they are few (split_ahead), and the
 * merge has MERGE_LOADS_ROOM partials in flight instead of MERGE_LOADS.
 */
template <typename KV, int HD, bool ROOM, int G>
static __device__ void split_block(const struct cuda_view &q, const struct cuda_view &k,
                                   const struct cuda_view &v, const struct cuda_attn &p,
                                   int group, float2 *ml, float *part, int *count,
                                   const struct cuda_view &out, int32_t *fault,
                                   int64_t kh, int64_t s, int64_t t, int64_t S,
                                   struct split_shared<HD> *shared)
{
	constexpr int D = HD / 32; /* values a lane owns; also its 8-pieces */
	constexpr int GM = G ? G : SPLIT_MAX_GROUP; /* heads in registers */
	constexpr bool ahead = ROOM && split_ahead<KV, HD, GM>::value;
	struct split_shared<HD> &sh = *shared;
	float(*qs)[HD] = sh.qs;
	float(*sm)[SPLIT_MAX_GROUP][2] = sh.sm;
	float *pool = sh.pool, *lsum = sh.lsum;
	int &last = sh.last;
	float(*sacc)[SPLIT_MAX_GROUP][HD] = (float(*)[SPLIT_MAX_GROUP][HD])pool;
	const int warp = team_tid() / 32, lane = team_tid() % 32;
	const int key = lane / 4, sub = lane % 4;
	const int64_t H = q.ne[1], step = SPLIT_WARPS * SPLIT_KEYS;
	const int64_t pos = query_pos_raw(p, t);
	float acc[GM][D], m[GM], l[GM];
	int64_t j0, j1, used;

	/* The range from the position alone (a position out of the cache
	 * gives some range, never used: the check below refuses it). */
	used = split_range(p, pos < 0 ? 0 : pos, s, S, &j0, &j1);
	team_sync(); /* the team's last item has left shared memory */
	q4kh_pdl_wait();
	if (!query_pos_ok(p, k, t, pos, fault)) { /* the query sees nothing */
		if (s == 0)
			for (int64_t i = team_tid(); i < group * HD; i += SPLIT_TEAM)
				((float *)(out.data + (kh * group + i / HD) * out.nb[1] +
				           t * out.nb[2]))[i % HD] = 0.0f;
		return;
	}
	if (j0 >= j1) /* a range not in use: nobody waits for it */
		return;

	/* The group's queries and the warp's first keys, all in flight at
	 * once. */
	constexpr int RQ = SPLIT_MAX_GROUP * HD / 4 / (32 * SPLIT_WARPS);
	float4 qv[RQ];
	struct split_batch<KV, HD> cur, next; /* next: with ahead only */
	int64_t jb = j0 + warp * SPLIT_KEYS;

#pragma unroll
	for (int r = 0; r < RQ; r++) {
		const int i = team_tid() + r * SPLIT_TEAM;

		if (i < group * HD / 4)
			qv[r] = __ldcg((const float4 *)(q.data + (kh * group + i / (HD / 4)) * q.nb[1] +
			                                t * q.nb[2] + i % (HD / 4) * 16));
	}
	if (jb < j1)
		fetch_batch<KV, HD>(k, v, p, kh, jb, j1, fault, &cur);
#pragma unroll
	for (int r = 0; r < RQ; r++) {
		const int i = team_tid() + r * SPLIT_TEAM;

		if (i < group * HD / 4)
			*(float4 *)&qs[i / (HD / 4)][i % (HD / 4) * 4] = qv[r];
	}
#pragma unroll
	for (int g = 0; g < GM; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
#pragma unroll
		for (int i = 0; i < D; i++)
			acc[g][i] = 0.0f;
	}
	team_sync();
	for (; jb < j1; jb += step) {
		float kf[D][8], vf[SPLIT_KEYS][D], sc[GM], x[GM], mn[GM];

		if (ahead && jb + step < j1)
			fetch_batch<KV, HD>(k, v, p, kh, jb + step, j1, fault, &next);
#pragma unroll
		for (int c = 0; c < D; c++)
			unpack(cur.k[c], kf[c]);
#pragma unroll
		for (int b = 0; b < SPLIT_KEYS; b++)
			unpack(cur.v[b], vf[b]);
#pragma unroll
		for (int g = 0; g < GM; g++) {
			sc[g] = 0.0f;
			if (!G && g >= group)
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
		/* Each step over every head before the next, so that the
		 * heads' shuffles are in flight together. */
#pragma unroll
		for (int off = 1; off < 4; off *= 2)
#pragma unroll
			for (int g = 0; g < GM; g++)
				if (G || g < group)
					sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], off);
#pragma unroll
		for (int g = 0; g < GM; g++)
			x[g] = mn[g] = jb + key < j1 ? score(p, sc[g]) : -INFINITY;
#pragma unroll
		for (int off = 4; off < 32; off *= 2)
#pragma unroll
			for (int g = 0; g < GM; g++)
				if (G || g < group)
					mn[g] = fmaxf(mn[g], __shfl_xor_sync(0xffffffffu, mn[g], off));
		/* One rescale per head and batch (Milakov & Gimelshein). */
#pragma unroll
		for (int g = 0; g < GM; g++) {
			if (!G && g >= group)
				break;
			mn[g] = fmaxf(mn[g], m[g]); /* finite: key jb is in the range */
			const float c = expf(m[g] - mn[g]);

			x[g] = expf(x[g] - mn[g]);
			l[g] = l[g] * c + (sub == 0 ? x[g] : 0.0f);
			m[g] = mn[g];
#pragma unroll
			for (int i = 0; i < D; i++)
				acc[g][i] *= c;
		}
#pragma unroll
		for (int b = 0; b < SPLIT_KEYS; b++)
#pragma unroll
			for (int g = 0; g < GM; g++)
				if (G || g < group) {
					const float eb = __shfl_sync(0xffffffffu, x[g], 4 * b);

#pragma unroll
					for (int i = 0; i < D; i++)
						acc[g][i] += eb * vf[b][i];
				}
		if (ahead)
			cur = next;
		else if (jb + step < j1) /* once the last batch's registers are free */
			fetch_batch<KV, HD>(k, v, p, kh, jb + step, j1, fault, &cur);
	}
	/* Fold the warps: each keeps m, l and its sums in shared memory
	 * (each step of the sums over every head before the next). */
#pragma unroll
	for (int off = 16; off > 0; off /= 2)
#pragma unroll
		for (int g = 0; g < GM; g++)
			if (G || g < group)
				l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
	for (int g = 0; g < GM; g++) {
		if (!G && g >= group)
			break;
		if (lane == 0) {
			sm[warp][g][0] = m[g];
			sm[warp][g][1] = l[g];
		}
#pragma unroll
		for (int i = 0; i < D; i++)
			sacc[warp][g][lane * D + i] = acc[g][i];
	}
	team_sync();
	/* Warp 0's lane SPLIT_WARPS g + i weighs warp i's sums of head g,
	 * exp(m_i - max m), 0 for a warp with no key, in place of its m; the
	 * head's sum of l into lsum and, for the merge, (max m, sum). */
	static_assert(SPLIT_WARPS * SPLIT_MAX_GROUP == 32, "a lane a (head, warp)");
	if (warp == 0) {
		const int g = lane / SPLIT_WARPS, i = lane % SPLIT_WARPS;
		const float mi = g < group ? sm[i][g][0] : 0.0f;
		const float li = g < group ? sm[i][g][1] : 0.0f;
		float mx = mi, sum;

		for (int off = 1; off < SPLIT_WARPS; off *= 2)
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
		const float w = li > 0.0f ? expf(mi - mx) : 0.0f;

		sum = li * w;
		for (int off = 1; off < SPLIT_WARPS; off *= 2)
			sum += __shfl_xor_sync(0xffffffffu, sum, off);
		if (g < group) {
			sm[i][g][0] = w;
			if (i == 0) {
				lsum[g] = sum;
				if (used > 1)
					ml[part_at(t, H, kh * group + g, S, s)] = make_float2(mx, sum);
			}
		}
	}
	team_sync();
	for (int i = team_tid(); i < group * HD; i += SPLIT_TEAM) {
		const int g = i / HD, d = i % HD;
		float a = 0.0f;

		for (int w = 0; w < SPLIT_WARPS; w++)
			a += sacc[w][g][d] * sm[w][g][0];
		if (used == 1) /* the query's only range: the result */
			((float *)(out.data + (kh * group + g) * out.nb[1] + t * out.nb[2]))[d] =
				a / lsum[g];
		else
			part[part_at(t, H, kh * group + g, S, s) * HD + d] = a;
	}
	if (used == 1)
		return;
	/* The last block of the query's ranges merges them (the partials
	 * are visible device-wide before the counter moves). */
	__threadfence();
	team_sync();
	if (team_tid() == 0) {
		int *c = &count[kh * q.ne[2] + t];

		last = atomicAdd(c, 1) == used - 1;
		if (last)
			*c = 0; /* every other block of the pair has counted */
	}
	team_sync();
	if (!last)
		return;
	__threadfence();
	merge_group<HD, ROOM ? MERGE_LOADS_ROOM : MERGE_LOADS>(ml, part, part_at(t, H, kh * group, S, 0), S, group,
	                (int)used, out, kh * group, t, pool, lsum);
}

/* The scratch: CUDA_SCRATCH_COUNTERS counters (zero between launches), the
 * partial sums of every range (16-byte aligned), then their (m, l). */
static inline size_t split_rows(const struct cuda_view *q, const struct split_plan &sp)
{
	return (size_t)q->ne[2] * (size_t)q->ne[1] * (size_t)sp.s;
}

#endif
