/*
 * cuda-mwv: Q4_K and Q6_K weights times fp32 activations on CUDA devices.
 * Q4_K is read in place (its 144-byte blocks keep the backend's rows
 * 16-byte aligned); Q6_K's 210-byte blocks are copied once, on the device,
 * into 224-byte ones (mwv_q6k_kernels.cu).
 * [plugin.cuda-mwv] warps sets the thread block: 4 warps by default; the
 * warps stream their rows for the whole launch (variant_device.cuh), so the
 * block size matters little.
 */
#include "buildconf.h"

#include "mwv.h"

static const uint32_t mwv_types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K };

static q4kh_status mwv_prepare(q4kh_kernel_ctx *ctx, q4kh_prepared *w,
                               cudaStream_t s)
{
	const int64_t row = mwv_q6k_row_bytes(w->k);
	q4kh_status st;

	if (w->type == Q4KH_TYPE_Q4_K)
		return cv_prepare_aligned(ctx, w, s);
	if ((st = cv_prepare_own(ctx, w, (size_t)(row * w->n), row)))
		return st;
	return cv_cuda(ctx, mwv_q6k_pack(w, w->own, s), "prepare: Q6_K copy kernel");
}

static q4kh_status mwv_apply(q4kh_kernel_ctx *ctx, const q4kh_prepared *w,
                             const struct cv_io *io, cudaStream_t s)
{
	return cv_launched(ctx,
	                   w->type == Q4KH_TYPE_Q6_K ? mwv_q6k_launch(w, io, ctx->warps, s)
	                                             : mwv_launch(w, io, ctx->warps, s),
	                   "cuda-mwv", w, io);
}

const struct cv_variant cv_self = {
	.min_sm = 70,
	.score = 100,
	.default_warps = 4,
	.probe = mwv_probe,
	.prepare = mwv_prepare,
	.apply = mwv_apply,
};

CV_PLUGIN("cuda-mwv", mwv_types)
