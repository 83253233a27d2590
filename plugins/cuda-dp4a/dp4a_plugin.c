/*
 * cuda-dp4a: Q4_K weights (read in place) times activations quantised to
 * int8 on the fly, with integer dot products. Faster arithmetic than
 * cuda-mwv, less exact: int8 loses the small values of a block that holds
 * a massive activation, which on some models is enough to fail F2, so it
 * scores below cuda-mwv. dp4a needs sm_61; the loads that bypass L1 sm_70.
 */
#include "buildconf.h"

#include <stdio.h>

#include "dp4a.h"

static const uint32_t dp4a_types[] = { Q4KH_TYPE_Q4_K };

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

const struct q4kh_cv_variant q4kh_cv_self = {
	.min_sm = 70,
	.score = 50,
	.default_warps = 4,
	.probe = dp4a_probe,
	.preload = dp4a_preload,
	.prepare = q4kh_cv_prepare_aligned,
	.apply = dp4a_apply,
};

/* int8 activations per 32 values, integer dot products */
Q4KH_CV_PLUGIN("cuda-dp4a", dp4a_types, Q4KH_ARITH_INT8)
