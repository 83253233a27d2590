/*
 * Attention over a prompt on tensor cores: the forward pass of
 * FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with
 * Better Parallelism and Work Partitioning"), causal, windowed,
 * grouped-query, over an F16 KV cache.
 *
 * A block takes FLASH_BM consecutive queries of one query head, a warp 16
 * of them. The keys any of its queries sees are taken BN at a time: the
 * block copies the tile's K and V rows into shared memory, each warp
 * computes its 16 x BN scores S = Q K^T with mma.sync m16n8k16 (f16
 * inputs, f32 accumulation; Q rounded to f16 once, in registers for the
 * whole block), masks what its queries do not see, and folds the tile
 * into a running softmax per query row (Milakov & Gimelshein 2018: with
 * m the largest score so far, weights exp(s - m); when m grows, the sum
 * l and the output are rescaled by exp(m_old - m_new)). The weights,
 * rounded to f16, are the A operand of O += P V straight from the
 * accumulators of S (the accumulator layout of one m16n8 tile pair is the
 * A layout of m16k16); V reaches the B operand through ldmatrix.trans.
 * O, m and l stay in registers; O / l is written once.
 *
 * Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
 * g = lane / 4 and c = lane % 4: A registers 0..3 hold rows (g, g + 8,
 * g, g + 8) at columns (2c, 2c, 2c + 8, 2c + 8) and the next column; B
 * registers 0, 1 hold column g at rows 2c and 2c + 8 and the next row;
 * the accumulator holds rows g (0, 1) and g + 8 (2, 3) at columns 2c and
 * 2c + 1.
 *
 * mma.sync of this shape needs compute capability 8.0: older devices (and
 * an F32 cache, or a head dimension other than 64, 128 and 256) take the
 * kernels of cuda_attention.cu.
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda_attention.cuh"
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "q4khost/quant.h"

#define FLASH_WARPS 4
#define FLASH_BM (16 * FLASH_WARPS) /* queries a block takes */
#define FLASH_PAD 8 /* halves after each shared row: conflict-free reads */

/* Keys a tile holds: fewer for 256 dimensions, so that the output (HD / 2
 * floats a thread) and the scores fit the registers. */
template <int HD>
struct flash_tile {
	static constexpr int bn = HD > 128 ? 32 : 64;
};

static __device__ __forceinline__ uint32_t half2_bits(float a, float b)
{
	__half2 h = __floats2half2_rn(a, b);

	return *(uint32_t *)&h;
}

/* c += a b, one m16n8k16 product, f16 inputs, f32 accumulation. */
static __device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4],
                                                 uint32_t b0, uint32_t b1)
{
#if __CUDA_ARCH__ >= 800
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
	             "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
	             "{%0, %1, %2, %3};"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
	__trap(); /* the host never launches it there (flash_supported) */
#endif
}

/* Four 8 x 8 f16 matrices from shared memory, transposed: lanes 8i .. 8i + 7
 * give the rows of matrix i, register i receives its fragment. */
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __half *row)
{
#if __CUDA_ARCH__ >= 800
	const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);

	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
	             "{%0, %1, %2, %3}, [%4];"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(a)
	             : "memory");
#else
	__trap();
#endif
}

template <int HD>
static __global__ void __launch_bounds__(32 * FLASH_WARPS)
flash_kernel(struct cuda_view q, struct cuda_view k, struct cuda_view v,
             struct cuda_attn p, struct cuda_view out, int32_t *fault)
{
	constexpr int BN = flash_tile<HD>::bn, LD = HD + FLASH_PAD;
	constexpr int KS = HD / 16; /* k-steps of Q K^T */
	constexpr int NT = BN / 8;  /* n-tiles of S: 8 keys each */
	constexpr int OT = HD / 8;  /* n-tiles of O: 8 dimensions each */
	__shared__ __align__(16) __half ks[BN][LD];
	__shared__ __align__(16) __half vs[BN][LD];
	__shared__ int32_t qpos[FLASH_BM], qfirst[FLASH_BM];
	__shared__ int32_t lo, hi;
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int gr = lane / 4, gc = lane % 4;
	const int64_t h = blockIdx.x, T = q.ne[2];
	/* The last queries see the most keys: their blocks go first. */
	const int64_t t0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * FLASH_BM;
	const int64_t kv = h / (q.ne[1] / k.ne[1]);
	const char *kbase = k.data + kv * k.nb[1], *vbase = v.data + kv * v.nb[1];

	/* Where each query sits, and the keys the block's queries see: lo ..
	 * hi. A query past T, or one whose position is out of the cache,
	 * sees nothing (pos -1) and reads as zeros. */
	if (threadIdx.x == 0) {
		lo = INT32_MAX;
		hi = -1;
	}
	__syncthreads();
	if (threadIdx.x < FLASH_BM) {
		const int64_t t = t0 + threadIdx.x;
		int64_t pos = -1, first = 0;

		if (t < T && query_pos(p, k, t, fault, &pos)) {
			first = first_key(p, pos);
			atomicMin(&lo, (int32_t)first);
			atomicMax(&hi, (int32_t)pos);
		} else {
			pos = -1;
		}
		qpos[threadIdx.x] = (int32_t)pos;
		qfirst[threadIdx.x] = (int32_t)first;
	}
	__syncthreads();

	/* This lane's two query rows (g and g + 8 of the warp's 16). */
	const int w0 = warp * 16 + gr;
	const int32_t pos_r[2] = { qpos[w0], qpos[w0 + 8] };
	const int32_t first_r[2] = { qfirst[w0], qfirst[w0 + 8] };
	const float *qrow[2];
	uint32_t qf[KS][4];

	for (int r = 0; r < 2; r++)
		qrow[r] = t0 + w0 + 8 * r < T
		                  ? (const float *)(q.data + h * q.nb[1] + (t0 + w0 + 8 * r) * q.nb[2])
		                  : NULL;
#pragma unroll
	for (int s = 0; s < KS; s++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const float *row = qrow[i % 2];
			const int d = s * 16 + 2 * gc + 8 * (i / 2);
			const float2 x = row ? *(const float2 *)(row + d) : make_float2(0.0f, 0.0f);

			qf[s][i] = half2_bits(x.x, x.y);
		}

	/* The keys the warp's queries see, to skip the tiles outside them. */
	int32_t wlo = INT32_MAX, whi = -1;
	for (int r = 0; r < 2; r++)
		if (pos_r[r] >= 0) {
			wlo = min(wlo, first_r[r]);
			whi = max(whi, pos_r[r]);
		}
	for (int off = 1; off < 32; off *= 2) {
		wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, off));
		whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, off));
	}

	float o[OT][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
	for (int n = 0; n < OT; n++)
		o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

	for (int64_t j0 = lo; j0 <= hi; j0 += BN) {
		__syncthreads(); /* the last tile is read */
		/* K and V rows j0 .. j0 + BN - 1 (zeros past hi: no NaN of
		 * an unwritten row meets a zero weight), 16 bytes a load. */
		for (int i = threadIdx.x; i < BN * HD / 8; i += 32 * FLASH_WARPS) {
			const int r = i / (HD / 8), d = i % (HD / 8) * 8;
			const int64_t j = j0 + r;
			uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;

			if (j <= hi) {
				const int64_t row = key_row(p, j, fault);

				kx = *(const uint4 *)(kbase + row * k.nb[2] + 2 * d);
				vx = *(const uint4 *)(vbase + row * v.nb[2] + 2 * d);
			}
			*(uint4 *)&ks[r][d] = kx;
			*(uint4 *)&vs[r][d] = vx;
		}
		__syncthreads();
		if (j0 > whi || j0 + BN <= wlo)
			continue; /* none of the warp's queries sees these keys */

		float sc[NT][4];
#pragma unroll
		for (int n = 0; n < NT; n++) {
			sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
			for (int s = 0; s < KS; s++) {
				const __half *kr = &ks[n * 8 + gr][s * 16 + 2 * gc];

				mma_16816(sc[n], qf[s], *(const uint32_t *)kr,
				          *(const uint32_t *)(kr + 8));
			}
		}
		/* Scores, masked; the rows' new maxima over the quad. */
		float mx[2] = { m[0], m[1] };
#pragma unroll
		for (int n = 0; n < NT; n++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int r = e / 2;
				const int64_t j = j0 + n * 8 + 2 * gc + e % 2;
				const bool seen = j >= first_r[r] && j <= pos_r[r];

				sc[n][e] = seen ? score(p, sc[n][e]) : -INFINITY;
				mx[r] = fmaxf(mx[r], sc[n][e]);
			}
		float base[2], alpha[2];
#pragma unroll
		for (int r = 0; r < 2; r++) {
			mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
			mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
			/* A row that has seen nothing yet keeps zeros. */
			base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
			alpha[r] = __expf(m[r] - base[r]);
			m[r] = mx[r];
			l[r] *= alpha[r];
		}
#pragma unroll
		for (int n = 0; n < OT; n++) {
			o[n][0] *= alpha[0];
			o[n][1] *= alpha[0];
			o[n][2] *= alpha[1];
			o[n][3] *= alpha[1];
		}
		/* The weights as the A operand of P V: key tiles 2s and 2s + 1
		 * are k-step s. */
		uint32_t pa[BN / 16][4];
#pragma unroll
		for (int n = 0; n < NT; n++) {
			const float e0 = __expf(sc[n][0] - base[0]), e1 = __expf(sc[n][1] - base[0]);
			const float e2 = __expf(sc[n][2] - base[1]), e3 = __expf(sc[n][3] - base[1]);

			l[0] += e0 + e1;
			l[1] += e2 + e3;
			pa[n / 2][2 * (n % 2)] = half2_bits(e0, e1);
			pa[n / 2][2 * (n % 2) + 1] = half2_bits(e2, e3);
		}
		/* O += P V: matrix i of an ldmatrix is keys 16s + 8 (i % 2)
		 * .. + 7, dimensions 16n + 8 (i / 2) .. + 7. */
		const int mi = lane / 8, mr = lane % 8;
#pragma unroll
		for (int s = 0; s < BN / 16; s++)
#pragma unroll
			for (int n = 0; n < HD / 16; n++) {
				uint32_t b[4];

				ldmatrix_x4_trans(b, &vs[s * 16 + 8 * (mi % 2) + mr][n * 16 + 8 * (mi / 2)]);
				mma_16816(o[2 * n], pa[s], b[0], b[1]);
				mma_16816(o[2 * n + 1], pa[s], b[2], b[3]);
			}
	}

	/* Each row's sum over its quad, then O / l. */
#pragma unroll
	for (int r = 0; r < 2; r++) {
		l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
		l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
	}
	for (int r = 0; r < 2; r++) {
		const int64_t t = t0 + w0 + 8 * r;
		const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;

		if (t >= T)
			continue;
		float *orow = (float *)(out.data + h * out.nb[1] + t * out.nb[2]);
#pragma unroll
		for (int n = 0; n < OT; n++)
			*(float2 *)(orow + n * 8 + 2 * gc) =
				make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
	}
}

static bool aligned(const struct cuda_view *v, uintptr_t a)
{
	return (((uintptr_t)v->data | (uintptr_t)v->nb[1] | (uintptr_t)v->nb[2]) & (a - 1)) == 0;
}

/* Can a device of compute capability CC_MAJOR.x run the kernel on these
 * views? */
static bool flash_supported(const struct cuda_view *q, const struct cuda_view *k,
                            const struct cuda_view *v, const struct cuda_view *out,
                            int cc_major)
{
	if (k->type != Q4KH_TYPE_F16 || v->type != Q4KH_TYPE_F16 ||
	    (q->ne[0] != 64 && q->ne[0] != 128 && q->ne[0] != 256) ||
	    !aligned(q, 8) || !aligned(out, 8) || !aligned(k, 16) || !aligned(v, 16))
		return false;
	return cc_major >= 8;
}

extern "C" cudaError_t cuda_launch_flash(const struct cuda_view *q,
                                         const struct cuda_view *k,
                                         const struct cuda_view *v,
                                         const struct cuda_attn *p,
                                         const struct cuda_view *out,
                                         int cc_major, int32_t *fault,
                                         cudaStream_t s)
{
	const int64_t tiles = (q->ne[2] + FLASH_BM - 1) / FLASH_BM;
	const dim3 grid((unsigned)q->ne[1], (unsigned)tiles);

	if (tiles > 65535 || !flash_supported(q, k, v, out, cc_major))
		return cudaErrorNotSupported;
	switch (q->ne[0]) {
	case 64:
		flash_kernel<64><<<grid, 32 * FLASH_WARPS, 0, s>>>(*q, *k, *v, *p, *out, fault);
		break;
	case 128:
		flash_kernel<128><<<grid, 32 * FLASH_WARPS, 0, s>>>(*q, *k, *v, *p, *out, fault);
		break;
	default:
		flash_kernel<256><<<grid, 32 * FLASH_WARPS, 0, s>>>(*q, *k, *v, *p, *out, fault);
		break;
	}
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_flash_preload(void)
{
	return q4kh_preload(flash_kernel<64>, flash_kernel<128>, flash_kernel<256>);
}
