/*
 * cuda-mwv: Q4_K, Q6_K, Q5_0 and Q8_0 weights times fp32 activations on
 * CUDA devices. Q4_K is read in place (its 144-byte blocks keep the
 * backend's rows 16-byte aligned); Q6_K's 210-byte blocks are copied
 * once, on the device, into 224-byte ones (mwv_q6k_kernels.cu), Q5_0's
 * and Q8_0's rows into planes of codes and scales (mwv_b32_kernels.cu:
 * the default model's q, k, v, gate, up and output). gemv_multi (ABI 1.4)
 * runs up to four of them, the types mixed, in one launch (mwv_multi.cu);
 * gemv_glu (ABI 1.4) gate and up of one type with their activation
 * (mwv_glu.cu).
 * [plugin.cuda-mwv] warps sets the thread block: 4 warps by default; the
 * warps stream their rows for the whole launch (q4khost/cuda_variant_device.cuh), so the
 * block size matters little.
 */
#include "buildconf.h"

#include <stdio.h>

#include "mwv.h"

static const uint32_t mwv_types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_Q5_0,
	                                Q4KH_TYPE_Q8_0 };

/* Q4_K in place; the others into a copy of their own (w->own, freed by release). */
static q4kh_status mwv_prepare(q4kh_kernel_ctx *ctx, q4kh_prepared *w,
                               cudaStream_t s)
{
	const int q6k = w->type == Q4KH_TYPE_Q6_K;
	const int64_t row = q6k ? mwv_q6k_row_bytes(w->k) : mwv_b32_row_bytes(w->type, w->k);
	char what[48];
	q4kh_status st;

	if (w->type == Q4KH_TYPE_Q4_K)
		return q4kh_cv_prepare_aligned(ctx, w, s);
	if ((st = q4kh_cv_prepare_own(ctx, w, (size_t)(row * w->n), row)))
		return st;
	snprintf(what, sizeof(what), "prepare: %s copy kernel", q4kh_type_name(w->type));
	return q4kh_cv_cuda(ctx, q6k ? mwv_q6k_pack(w, w->own, s) : mwv_b32_pack(w, w->own, s),
	                    what);
}

static q4kh_status mwv_apply(q4kh_kernel_ctx *ctx, const q4kh_prepared *w,
                             const struct q4kh_cv_io *io, cudaStream_t s)
{
	cudaError_t e;

	switch (w->type) {
	case Q4KH_TYPE_Q4_K: e = mwv_launch(w, io, ctx->warps, s); break;
	case Q4KH_TYPE_Q6_K: e = mwv_q6k_launch(w, io, ctx->warps, s); break;
	default: e = mwv_b32_launch(w, io, ctx->warps, s);
	}
	return q4kh_cv_launched(ctx, e, "cuda-mwv", w, io);
}

static q4kh_status mwv_apply_multi(q4kh_kernel_ctx *ctx, uint32_t n,
                                   const q4kh_prepared *const w[],
                                   const struct q4kh_cv_multi_io *io, cudaStream_t s)
{
	cudaError_t e = mwv_multi_launch(n, w, io, ctx->warps, s);
	char what[96];

	if (e == cudaSuccess)
		return Q4KH_OK;
	snprintf(what, sizeof(what), "cuda-mwv gemv_multi kernel for %u matrices of K %lld x %lld columns",
	         n, (long long)w[0]->k, (long long)io->cols);
	return q4kh_cv_cuda(ctx, e, what);
}

/* Gate and up of one type, SiLU or the tanh GELU: else not fused. */
static q4kh_status mwv_apply_glu(q4kh_kernel_ctx *ctx, q4kh_glu_kind kind,
                                 const q4kh_prepared *gate, const q4kh_prepared *up,
                                 const struct q4kh_cv_io *io, cudaStream_t s)
{
	if (gate->type != up->type)
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		                    "gemv_glu: gate %s and up %s: cuda-mwv fuses one type only",
		                    q4kh_type_name(gate->type), q4kh_type_name(up->type));
	if (kind != Q4KH_GLU_SILU && kind != Q4KH_GLU_GELU_TANH)
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED, "gemv_glu: unknown kind %d",
		                    (int)kind);
	return q4kh_cv_launched(ctx,
	                        mwv_glu_launch(kind == Q4KH_GLU_SILU, gate, up, io, ctx->warps, s),
	                        "cuda-mwv gemv_glu", gate, io);
}

/* Every kernel the functions above launch (mwv.h). */
static cudaError_t mwv_preload(void)
{
	cudaError_t (*const each[])(void) = {
		mwv_q4k_preload,   mwv_q6k_preload, mwv_b32_preload,
		mwv_multi_preload, mwv_glu_preload,
	};
	cudaError_t e = cudaSuccess;

	for (size_t i = 0; i < sizeof(each) / sizeof(each[0]) && e == cudaSuccess; i++)
		e = each[i]();
	return e;
}

const struct q4kh_cv_variant q4kh_cv_self = {
	.min_sm = 70,
	.score = 100,
	.default_warps = 4,
	.tc_min_columns = 9, /* two tiles of 8 columns cost more than the fp16 copy */
	.probe = mwv_probe,
	.preload = mwv_preload,
	.prepare = mwv_prepare,
	.apply = mwv_apply,
	.apply_multi = mwv_apply_multi,
	.apply_glu = mwv_apply_glu,
};

/* f32 activations in its GEMV, fp16 tensor cores for a prompt (q4kh_cv_gemm) */
Q4KH_CV_PLUGIN_FUSED("cuda-mwv", mwv_types, Q4KH_ARITH_F16)
