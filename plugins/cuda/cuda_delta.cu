/*
 * delta_net (plugin.h): the gated delta rule of Yang, Kautz & Hatamizadeh
 * 2024 ("Gated Delta Networks": S_t = S_{t-1} a_t (I - b_t k_t k_t^T) +
 * b_t v_t k_t^T, o_t = S_t q_t), in the per-token order of llama.cpp's
 * recurrent (one token at a time) delta-net and of the cpu reference
 * (plugins/cpu/cpu_recurrent.c, in double): decay S by exp(g), the
 * correction d = beta (v - S k), S += d k^T, out = scale S q. Here the
 * state is float32 and so is the arithmetic.
 *
 * Row i of a head's state S depends on v[i] alone (d[i] is v[i] minus
 * row i times k), so rows are independent work: one warp per row, each
 * lane holding NV of its S_k values in registers (S_k up to
 * CUDA_DELTA_MAX_KEYS), the two dot products reduced across the warp.
 * Two forms, one arithmetic (delta_token):
 *   - one token (decode): a warp reads its row, k, q, v and the gates
 *     from global memory, updates and writes back;
 *   - a prompt (T > 1): the recurrence over the whole step in one launch,
 *     the row staying in registers from the first token to the last,
 *     each block staging its head's keys and queries for up to
 *     DELTA_CHUNK tokens in shared memory, and each lane of a warp one
 *     token's v, gates and output.
 * The chunked-parallel form (WY representation) is a later optimisation.
 */
#include <math.h>

#include "cuda_common.cuh"
#include "cuda_kernels.h"

#define DELTA_WARPS 8 /* rows of a head's state per block, a warp each */
#define DELTA_CHUNK 32 /* tokens staged at once, at most a warp's lanes */
#define DELTA_SHARED 49152 /* bytes of staged keys and queries, at most */

/* Element (i0, i1, i2) of an f32 view. */
static __device__ __forceinline__ float *f32_at(const struct cuda_view &v,
                                                int64_t i0, int64_t i1,
                                                int64_t i2)
{
	return (float *)(v.data + i1 * v.nb[1] + i2 * v.nb[2]) + i0;
}

/*
 * One token for one row of S: s, k, q the lane's NV values of the row,
 * the key and the query (S_k values spread c = lane + 32 j; zero past
 * S_k, where they change nothing). Returns scale (S q)[row] in every lane.
 */
template <int NV>
static __device__ __forceinline__ float delta_token(float (&s)[NV],
                                                    const float (&k)[NV],
                                                    const float (&q)[NV],
                                                    float v, float decay,
                                                    float beta, float scale)
{
	float sk = 0.0f, sq = 0.0f;

#pragma unroll
	for (int j = 0; j < NV; j++) {
		s[j] *= decay;
		sk += s[j] * k[j];
	}
	const float d = beta * (v - warp_sum(sk));
#pragma unroll
	for (int j = 0; j < NV; j++) {
		s[j] += d * k[j];
		sq += s[j] * q[j];
	}
	return scale * warp_sum(sq);
}

/* The lane's NV values of an S_k vector at p (zero past n). */
template <int NV>
static __device__ __forceinline__ void lane_values(float (&dst)[NV],
                                                   const float *p, int64_t n)
{
	const int lane = threadIdx.x % 32;

#pragma unroll
	for (int j = 0; j < NV; j++)
		dst[j] = lane + 32 * j < n ? p[lane + 32 * j] : 0.0f;
}

/* The row back to the state: the lane's values below n. */
template <int NV>
static __device__ __forceinline__ void lane_store(float *p, const float (&src)[NV],
                                                  int64_t n)
{
	const int lane = threadIdx.x % 32;

#pragma unroll
	for (int j = 0; j < NV; j++)
		if (lane + 32 * j < n)
			p[lane + 32 * j] = src[j];
}

/* One token: warp = row blockIdx.x * DELTA_WARPS + warp of head blockIdx.y. */
template <int NV>
static __global__ void __launch_bounds__(DELTA_WARPS * 32)
delta_step_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
                  struct cuda_view g, struct cuda_view beta,
                  struct cuda_view state, float scale, struct cuda_view out)
{
	const int64_t i = (int64_t)blockIdx.x * DELTA_WARPS + threadIdx.x / 32;
	const int64_t h = blockIdx.y, kh = h % q.ne[1], sk = q.ne[0];
	float s[NV], kv[NV], qv[NV];

	if (i >= v.ne[0]) /* the whole warp */
		return;
	float *row = f32_at(state, 0, i, h);
	lane_values<NV>(s, row, sk);
	lane_values<NV>(kv, f32_at(k, 0, kh, 0), sk);
	lane_values<NV>(qv, f32_at(q, 0, kh, 0), sk);
	const float o = delta_token<NV>(s, kv, qv, *f32_at(v, i, h, 0),
	                                expf(*f32_at(g, h, 0, 0)),
	                                *f32_at(beta, h, 0, 0), scale);
	lane_store<NV>(row, s, sk);
	if (threadIdx.x % 32 == 0)
		*f32_at(out, i, h, 0) = o;
}

/*
 * Every token of the step in order, the rows as delta_step_kernel's;
 * CHUNK (at most DELTA_CHUNK) tokens' keys and queries staged at a time
 * in 2 CHUNK S_k floats of dynamic shared memory.
 */
template <int NV>
static __global__ void __launch_bounds__(DELTA_WARPS * 32)
delta_seq_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
                 struct cuda_view g, struct cuda_view beta,
                 struct cuda_view state, float scale, struct cuda_view out,
                 int chunk)
{
	extern __shared__ float staged[];
	const int lane = threadIdx.x % 32;
	const int64_t i = (int64_t)blockIdx.x * DELTA_WARPS + threadIdx.x / 32;
	const int64_t h = blockIdx.y, kh = h % q.ne[1], sk = q.ne[0], T = q.ne[2];
	const bool live = i < v.ne[0];
	float *ks = staged, *qs = staged + chunk * sk;
	float *row = live ? f32_at(state, 0, i, h) : NULL;
	float s[NV];

	if (live)
		lane_values<NV>(s, row, sk);
	for (int64_t t0 = 0; t0 < T; t0 += chunk) {
		const int n = (int)(T - t0 < chunk ? T - t0 : chunk);
		float vl = 0.0f, dl = 0.0f, bl = 0.0f, ol = 0.0f;

		__syncthreads(); /* the last chunk's keys are read */
		for (int64_t e = threadIdx.x; e < n * sk; e += blockDim.x) {
			ks[e] = *f32_at(k, e % sk, kh, t0 + e / sk);
			qs[e] = *f32_at(q, e % sk, kh, t0 + e / sk);
		}
		__syncthreads();
		if (!live)
			continue;
		/* lane t: token t0 + t's value, decay and beta, then output */
		if (lane < n) {
			vl = *f32_at(v, i, h, t0 + lane);
			dl = expf(*f32_at(g, h, t0 + lane, 0));
			bl = *f32_at(beta, h, t0 + lane, 0);
		}
		for (int t = 0; t < n; t++) {
			float kv[NV], qv[NV];

			lane_values<NV>(kv, ks + t * sk, sk);
			lane_values<NV>(qv, qs + t * sk, sk);
			const float o = delta_token<NV>(s, kv, qv,
			                                __shfl_sync(0xffffffffu, vl, t),
			                                __shfl_sync(0xffffffffu, dl, t),
			                                __shfl_sync(0xffffffffu, bl, t), scale);
			if (lane == t)
				ol = o;
		}
		if (lane < n)
			*f32_at(out, i, h, t0 + lane) = ol;
	}
	if (live)
		lane_store<NV>(row, s, sk);
}

template <int NV>
static cudaError_t delta_launch(const struct cuda_view *q, const struct cuda_view *k,
                                const struct cuda_view *v, const struct cuda_view *g,
                                const struct cuda_view *beta,
                                const struct cuda_view *state, float scale,
                                const struct cuda_view *out, cudaStream_t s)
{
	const dim3 grid((unsigned)((v->ne[0] + DELTA_WARPS - 1) / DELTA_WARPS),
	                (unsigned)v->ne[1]);
	const int64_t sk = q->ne[0];
	int64_t chunk = DELTA_SHARED / (2 * (int64_t)sizeof(float) * sk);

	if (q->ne[2] == 1) {
		delta_step_kernel<NV><<<grid, DELTA_WARPS * 32, 0, s>>>(
			*q, *k, *v, *g, *beta, *state, scale, *out);
		return cudaGetLastError();
	}
	chunk = chunk < DELTA_CHUNK ? chunk : DELTA_CHUNK;
	delta_seq_kernel<NV><<<grid, DELTA_WARPS * 32,
	                       2 * sizeof(float) * (size_t)(chunk * sk), s>>>(
		*q, *k, *v, *g, *beta, *state, scale, *out, (int)chunk);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_delta_net(const struct cuda_view *q,
                                             const struct cuda_view *k,
                                             const struct cuda_view *v,
                                             const struct cuda_view *g,
                                             const struct cuda_view *beta,
                                             const struct cuda_view *state,
                                             float scale,
                                             const struct cuda_view *out,
                                             cudaStream_t s)
{
	/* the forms by the values a lane holds, NV = 1, 2, 4 .. 32 */
	static cudaError_t (*const forms[])(
		const struct cuda_view *, const struct cuda_view *, const struct cuda_view *,
		const struct cuda_view *, const struct cuda_view *, const struct cuda_view *,
		float, const struct cuda_view *, cudaStream_t) = {
		delta_launch<1>, delta_launch<2>,  delta_launch<4>,
		delta_launch<8>, delta_launch<16>, delta_launch<32>,
	};
	const int64_t lanes = (q->ne[0] + 31) / 32;

	for (int f = 0; f < (int)(sizeof(forms) / sizeof(forms[0])); f++)
		if (lanes <= 1 << f)
			return forms[f](q, k, v, g, beta, state, scale, out, s);
	return cudaErrorNotSupported;
}
