/*
 * cuda-gemv-iq: IQ4_NL and IQ4_XS weights times fp32 activations on CUDA
 * devices. IQ4_NL's 18-byte and IQ4_XS's 136-byte blocks leave codes at
 * 2- and 8-byte alignment, so prepare repacks each weight once, on the
 * device, into 16-byte pieces of codes plus scales (1.5 % more bytes than
 * IQ4_XS, as many as IQ4_NL); the host's copy stays untouched.
 */
#include "buildconf.h"

#include "iq.h"

static const uint32_t iq_types[] = { Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS };

static q4kh_status iq_prepare(q4kh_kernel_ctx *ctx, q4kh_prepared *w,
                              cudaStream_t s)
{
	q4kh_status st;

	/* stride: bytes of codes per row */
	if ((st = q4kh_cv_prepare_own(ctx, w, iq_repacked_bytes(w->type, w->k, w->n),
	                              w->k / 2)))
		return st;
	return q4kh_cv_cuda(ctx, iq_repack(w, w->own, s), "prepare: repack kernel");
}

static q4kh_status iq_apply(q4kh_kernel_ctx *ctx, const q4kh_prepared *w,
                            const struct q4kh_cv_io *io, cudaStream_t s)
{
	return q4kh_cv_launched(ctx, iq_launch(w, io, ctx->warps, s), "cuda-gemv-iq",
	                        w, io);
}

const struct q4kh_cv_variant q4kh_cv_self = {
	.min_sm = 70,
	.score = 100,
	.default_warps = 4,
	.probe = iq_probe,
	.preload = iq_preload,
	.prepare = iq_prepare,
	.apply = iq_apply,
};

/* f32 activations in its GEMV, fp16 tensor cores for a prompt (q4kh_cv_gemm) */
Q4KH_CV_PLUGIN("cuda-gemv-iq", iq_types, Q4KH_ARITH_F16)
