/*
 * cuda-dp4a: Q4_K weights (read in place) and Q6_K weights (copied once
 * into 16-byte-aligned blocks, as cuda-mwv's) times activations quantised
 * to int8 on the fly, with integer dot products; gemv_multi and gemv_glu
 * (ABI 1.4) in one launch each. Faster arithmetic than
 * cuda-mwv, less exact: int8 loses the small values of a block that holds
 * a massive activation, which on some models is enough to fail F2, so it
 * scores below cuda-mwv. dp4a needs sm_61; the loads that bypass L1 sm_70.
 */
#include "buildconf.h"

#include <stdio.h>

#include "dp4a.h"

static const uint32_t dp4a_types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K };

/* Q4_K in place; Q6_K copied into 16-byte-aligned blocks on the device. */
static q4kh_status dp4a_prepare(q4kh_kernel_ctx *ctx, q4kh_prepared *w, cudaStream_t s)
{
	const int64_t row = dp4a_q6k_row_bytes(w->k);
	q4kh_status st;

	if (w->type == Q4KH_TYPE_Q4_K)
		return q4kh_cv_prepare_aligned(ctx, w, s);
	if ((st = q4kh_cv_prepare_own(ctx, w, (size_t)(row * w->n), row)))
		return st;
	return q4kh_cv_cuda(ctx, dp4a_q6k_copy(w, w->own, s), "prepare: Q6_K copy kernel");
}

/*
 * One launch when the int8 activations fit a block's shared memory
 * (dp4a_one_launch); else they go to the context's scratch on w's device
 * (q4khost/cuda_variant_scratch.h): allocated once, grown when a longer
 * row or more columns need more, kept until shutdown, so nothing is
 * allocated or freed per product and a recorded graph holds only the two
 * kernels.
 */
static q4kh_status dp4a_apply(q4kh_kernel_ctx *ctx, const q4kh_prepared *w,
                              const struct q4kh_cv_io *io, cudaStream_t s)
{
	char what[128];
	void *scratch = NULL;
	q4kh_status st;

	if (!dp4a_one_launch(w->k, io->cols)) {
		snprintf(what, sizeof(what), "%s: int8 activations of %lld x %lld columns",
		         io->call, (long long)w->k, (long long)io->cols);
		if ((st = q4kh_cv_scratch_get(ctx, w->ordinal,
		                              dp4a_scratch_bytes(w->k, io->cols), s, what,
		                              &scratch)))
			return st;
	}
	return q4kh_cv_launched(ctx, dp4a_launch(w, io, scratch, ctx->warps, s),
	                        "cuda-dp4a", w, io);
}

/* One launch when x's int8 activations fit a block's shared memory. */
static q4kh_status dp4a_apply_multi(q4kh_kernel_ctx *ctx, uint32_t n,
                                    const q4kh_prepared *const w[],
                                    const struct q4kh_cv_multi_io *io, cudaStream_t s)
{
	char what[112];

	if (!dp4a_one_launch(w[0]->k, io->cols))
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		                    "gemv_multi: K %lld x %lld columns: cuda-dp4a fuses up to "
		                    "%d bytes of int8 activations",
		                    (long long)w[0]->k, (long long)io->cols, DP4A_SHARED_MOST);
	snprintf(what, sizeof(what),
	         "cuda-dp4a gemv_multi kernel for %u matrices of K %lld x %lld columns", n,
	         (long long)w[0]->k, (long long)io->cols);
	return q4kh_cv_cuda(ctx, dp4a_multi_launch(n, w, io, ctx->warps, s), what);
}

/* SiLU or the tanh GELU, x's int8 activations in a block's shared memory. */
static q4kh_status dp4a_apply_glu(q4kh_kernel_ctx *ctx, q4kh_glu_kind kind,
                                  const q4kh_prepared *gate, const q4kh_prepared *up,
                                  const struct q4kh_cv_io *io, cudaStream_t s)
{
	if (gate->type != up->type)
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		                    "gemv_glu: gate %s and up %s: cuda-dp4a fuses one type only",
		                    q4kh_type_name(gate->type), q4kh_type_name(up->type));
	if (kind != Q4KH_GLU_SILU && kind != Q4KH_GLU_GELU_TANH)
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED, "gemv_glu: unknown kind %d",
		                    (int)kind);
	if (!dp4a_one_launch(gate->k, io->cols))
		return q4kh_cv_fail(ctx, Q4KH_ERR_UNSUPPORTED,
		                    "gemv_glu: K %lld x %lld columns: cuda-dp4a fuses up to "
		                    "%d bytes of int8 activations",
		                    (long long)gate->k, (long long)io->cols, DP4A_SHARED_MOST);
	return q4kh_cv_launched(ctx,
	                        dp4a_glu_launch(kind == Q4KH_GLU_SILU, gate, up, io, ctx->warps, s),
	                        "cuda-dp4a gemv_glu", gate, io);
}

/* Every kernel the functions above launch (dp4a.h). */
static cudaError_t dp4a_preload_all(void)
{
	const cudaError_t e = dp4a_preload();

	return e != cudaSuccess ? e : dp4a_fused_preload();
}

const struct q4kh_cv_variant q4kh_cv_self = {
	.min_sm = 70,
	.score = 50,
	.default_warps = 4,
	.probe = dp4a_probe,
	.preload = dp4a_preload_all,
	.prepare = dp4a_prepare,
	.apply = dp4a_apply,
	.apply_multi = dp4a_apply_multi,
	.apply_glu = dp4a_apply_glu,
};

/* int8 activations per 32 values, integer dot products */
Q4KH_CV_PLUGIN_FUSED("cuda-dp4a", dp4a_types, Q4KH_ARITH_INT8)
