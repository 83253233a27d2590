/*
 * The ops that work on whole rows: rms_norm (one block per row, the sum of
 * squares in double) and rope (angles in double, as the cpu reference).
 */
#include <math.h>

#include "cuda_common.cuh"
#include "cuda_kernels.h"

#define RMS_THREADS 512
#define RMS_HELD 8 /* values of a row each thread keeps in registers */
#define ROPE_THREADS 128

/*
 * One block per row. Each thread loads its RMS_HELD values of the row at
 * once and keeps them for the second pass, so that a row of up to
 * RMS_THREADS * RMS_HELD values costs one memory latency, not one per
 * value a thread reads; longer rows loop over the rest.
 */
static __global__ void __launch_bounds__(RMS_THREADS)
rms_norm_kernel(struct cuda_view x, const float *w, float eps,
                struct cuda_view out)
{
	__shared__ double part[32];
	const int64_t n = x.ne[0], rows = x.ne[1] * x.ne[2] * x.ne[3];
	const int64_t held = (int64_t)RMS_HELD * blockDim.x;

	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *xr = (const float *)view_row(x, r);
		float *o = (float *)view_row(out, r);
		float v[RMS_HELD];
		double ss = 0.0;

#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;

			v[k] = i < n ? xr[i] : 0.0f;
		}
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++)
			ss += (double)v[k] * (double)v[k];
		for (int64_t i = held + threadIdx.x; i < n; i += blockDim.x)
			ss += (double)xr[i] * (double)xr[i];
		/* Every read of the row is done once the sum is known, so out
		 * may be x. */
		ss = block_sum(ss, part);
		const float s = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;

			if (i < n)
				o[i] = w ? v[k] * s * w[i] : v[k] * s;
		}
		for (int64_t i = held + threadIdx.x; i < n; i += blockDim.x)
			o[i] = w ? xr[i] * s * w[i] : xr[i] * s;
	}
}

/*
 * The angle of pair i at position pos: the formula of plugin.h (struct
 * q4kh_rope_params) in double, as the cpu reference computes it, with
 * YaRN's ramp between p.lo and p.hi.
 */
static __device__ double rope_theta(const struct cuda_rope &p, int32_t pos,
                                    int64_t i)
{
	double extrap = (double)pos * pow(p.base, -2.0 * (double)i / p.n_rot);
	double theta;

	if (p.freq_factors)
		extrap /= (double)p.freq_factors[i];
	theta = p.freq_scale * extrap;
	if (p.ext_factor != 0.0) {
		const double y = ((double)i - p.lo) / fmax(0.001, p.hi - p.lo);
		const double r = p.ext_factor * (1.0 - fmin(1.0, fmax(0.0, y)));

		theta = theta * (1.0 - r) + extrap * r;
	}
	return theta;
}

/*
 * Item i of a head: i < n_rot/2 rotates pair i; the others copy value
 * n_rot + (i - n_rot/2), which passes through. Each item reads before it
 * writes, and only its own values, so out may be x. A negative position
 * is a fault: the token's values are left as they are.
 */
static __global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(struct cuda_view x, const int32_t *pos, struct cuda_rope p,
            struct cuda_view out, int32_t *fault)
{
	const int64_t hd = x.ne[0], nh = x.ne[1], half = p.n_rot / 2;
	const int64_t per_head = hd - half;
	const int64_t items = per_head * nh * x.ne[2];

	for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     it < items; it += (int64_t)gridDim.x * blockDim.x) {
		const int64_t i = it % per_head, h = (it / per_head) % nh;
		const int64_t t = it / (per_head * nh);
		const float *xr = (const float *)(x.data + h * x.nb[1] + t * x.nb[2]);
		float *o = (float *)(out.data + h * out.nb[1] + t * out.nb[2]);

		if (!index_ok(fault, CUDA_FAULT_ROPE_POS, t, pos[t], INT32_MAX))
			continue;
		if (i < half) {
			/* NORM rotates neighbours, NEOX the two halves. */
			const int64_t a = p.neox ? i : 2 * i;
			const int64_t b = p.neox ? i + half : 2 * i + 1;
			const double va = xr[a], vb = xr[b];
			double sn, cs;

			sincos(rope_theta(p, pos[t], i), &sn, &cs);
			sn *= p.mscale;
			cs *= p.mscale;
			o[a] = (float)(va * cs - vb * sn);
			o[b] = (float)(va * sn + vb * cs);
		} else {
			const int64_t j = p.n_rot + (i - half);

			o[j] = xr[j];
		}
	}
}

extern "C" cudaError_t cuda_launch_rms_norm(const struct cuda_view *x,
                                            const struct cuda_view *w,
                                            float eps,
                                            const struct cuda_view *out,
                                            cudaStream_t s)
{
	const int64_t rows = view_rows(x);

	rms_norm_kernel<<<(unsigned)(rows < 65535 ? rows : 65535), RMS_THREADS, 0,
	                  s>>>(*x, w ? (const float *)w->data : NULL, eps, *out);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_rope(const struct cuda_view *x,
                                        const int32_t *pos,
                                        const struct cuda_rope *p,
                                        const struct cuda_view *out,
                                        int32_t *fault, cudaStream_t s)
{
	const int64_t items = (x->ne[0] - p->n_rot / 2) * x->ne[1] * x->ne[2];

	rope_kernel<<<grid_for(items, ROPE_THREADS), ROPE_THREADS, 0, s>>>(
		*x, pos, *p, *out, fault);
	return cudaGetLastError();
}
