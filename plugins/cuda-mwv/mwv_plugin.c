/*
 * cuda-mwv: Q4_K weights times fp32 activations on CUDA devices, read in
 * place (Q4_K's 144-byte blocks keep the backend's rows 16-byte aligned).
 * [plugin.cuda-mwv] warps sets the thread block: 4 warps by default; the
 * warps stream their rows for the whole launch (q4k_stream.cuh), so the
 * block size matters little.
 */
#include "buildconf.h"

#include "mwv.h"

static const uint32_t mwv_types[] = { Q4KH_TYPE_Q4_K };

static q4kh_status mwv_apply(q4kh_kernel_ctx *ctx, const q4kh_prepared *w,
                             const struct cv_io *io, cudaStream_t s)
{
	return cv_launched(ctx, mwv_launch(w, io, ctx->warps, s), "cuda-mwv", w,
	                   io);
}

const struct cv_variant cv_self = {
	.min_sm = 70,
	.score = 100,
	.default_warps = 4,
	.probe = mwv_probe,
	.prepare = cv_prepare_aligned,
	.apply = mwv_apply,
};

CV_PLUGIN("cuda-mwv", mwv_types)
