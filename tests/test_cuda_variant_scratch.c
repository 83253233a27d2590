/*
 * cuda-dp4a's int8 scratch (the variant context's, q4khost/cuda_variant_scratch.h) in
 * a recorded CUDA graph, and the table's warm-up, against the reference
 * cpu plugin's mul_mat (cuda_variant_rig.h: the rig, the bounds, the
 * poison).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_variant_rig.h"
#include "q4khost/cuda_tc.h"
#include "q4khost/cuda_variant.h"
#include "q4khost/quant.h"

TestSuite(cuda_variants, .timeout = 900);

/*
 * cuda-dp4a's int8 scratch (the context's, q4khost/cuda_variant_scratch.h) in a CUDA
 * graph: a gemv recorded while the scratch must grow (a longer row than
 * any before, 8 columns) replays with new activations and agrees with the
 * cpu, also after a larger product outside the recording has grown the
 * scratch again (the recording keeps the buffer it was recorded with).
 * Every product here has more int8 activations than a block's shared
 * memory takes (DP4A_SHARED_MOST, 48 KiB: K x T x 1.25 bytes), the only
 * ones that go through the scratch.
 */
Test(cuda_variants, dp4a_scratch_in_a_recorded_graph)
{
	const int64_t t = 8;
	struct q4kh_kernel k;
	struct weight small, big, bigger;
	struct view xc, xg, yc, yg;
	q4kh_graph *g = NULL;
	float *xv;
	char what[64];
	struct vrig r;

	variant_open(&r, &dp4a, 9, &k);
	weight_new(&r, &k, &dp4a, Q4KH_TYPE_Q4_K, 8192, 33, 0, &small);
	weight_new(&r, &k, &dp4a, Q4KH_TYPE_Q4_K, 16384, 97, 0, &big);
	weight_new(&r, &k, &dp4a, Q4KH_TYPE_Q4_K, 32768, 17, 0, &bigger);
	/* The scratch's first size: 5 columns of 8192 values (50 KiB). */
	xv = rvals(8192 * 5);
	multiply(&r, &k, &small, 5, xv, 1); /* before recording */
	free(xv);
	xc = put(&r.cpu, Q4KH_TYPE_F32, big.k, t, 4 * big.k, NULL);
	xg = put(&r.gpu, Q4KH_TYPE_F32, big.k, t, 4 * big.k, NULL);
	yc = put(&r.cpu, Q4KH_TYPE_F32, big.n, t, 4 * big.n, NULL);
	yg = put(&r.gpu, Q4KH_TYPE_F32, big.n, t, 4 * big.n, NULL);
	cr_assert_eq(r.gpu.v->graph_begin(r.gpu.dev), Q4KH_OK, "%s",
	             r.gpu.v->last_error(r.gpu.ctx));
	cr_assert_eq(k.v->gemv(k.ctx, &k.native, big.p, &xg.t, &yg.t), Q4KH_OK,
	             "gemv while recording: %s", k.v->last_error(k.ctx));
	cr_assert_eq(r.gpu.v->graph_end(r.gpu.dev, &g), Q4KH_OK, "%s",
	             r.gpu.v->last_error(r.gpu.ctx));
	for (int pass = 0; pass < 2; pass++) {
		const size_t bytes = sizeof(float) * (size_t)(big.k * t);

		xv = rvals((size_t)(big.k * t));
		cr_assert_eq(r.cpu.v->buffer_upload(r.cpu.dev, xc.t.buffer, POISON_LEAD, xv,
		                                    bytes),
		             Q4KH_OK);
		cr_assert_eq(r.gpu.v->buffer_upload(r.gpu.dev, xg.t.buffer, POISON_LEAD, xv,
		                                    bytes),
		             Q4KH_OK);
		cr_assert_eq(r.cpu.v->mul_mat(r.cpu.dev, &big.cpu.t, &xc.t, &yc.t),
		             Q4KH_OK, "%s", r.cpu.v->last_error(r.cpu.ctx));
		cr_assert_eq(r.gpu.v->graph_launch(r.gpu.dev, g), Q4KH_OK, "%s",
		             r.gpu.v->last_error(r.gpu.ctx));
		snprintf(what, sizeof(what), "cuda-dp4a gemv, replay %d", pass);
		agree(&r, &big, xv, t, 1, &yc, &yg, what);
		free(xv);
		if (pass == 0) {
			xv = rvals((size_t)(bigger.k * t));
			multiply(&r, &k, &bigger, t, xv, 1); /* between replays */
			free(xv);
		}
	}
	r.gpu.v->graph_free(r.gpu.dev, g);
	drop(&r.cpu, &xc);
	drop(&r.gpu, &xg);
	drop(&r.cpu, &yc);
	drop(&r.gpu, &yg);
	weight_free(&r, &k, &small);
	weight_free(&r, &k, &big);
	weight_free(&r, &k, &bigger);
	variant_close(&r, &k);
}

/* Bytes of a block of cuda-mwv's Q6_K copy (q4khost/cuda_q6k_device.cuh):
 * the 210 of the file's, then zeros. */
#define MWV_Q6K_BLOCK 224

/*
 * cuda-mwv's copy of Q6_K weight W, made by prepare alone (the stream
 * waited for, no product yet): every block of the backend's rows, byte for
 * byte, then zeros to MWV_Q6K_BLOCK.
 */
static void packed_at_prepare(struct vrig *r, const struct weight *w)
{
	const int64_t nblk = w->k / 256, row = nblk * MWV_Q6K_BLOCK;
	const uint8_t *src = w->gpu.bytes + w->gpu.t.offset;
	static const uint8_t zeros[MWV_Q6K_BLOCK];
	uint8_t *own = malloc((size_t)(row * w->n));

	cr_assert_not_null(own);
	cr_assert_eq(r->gpu.v->synchronize(r->gpu.dev), Q4KH_OK, "%s",
	             r->gpu.v->last_error(r->gpu.ctx));
	cr_assert_not_null(w->p->own, "cuda-mwv made no copy of a Q6_K weight");
	cr_assert_eq(w->p->stride, row);
	cr_assert_eq(cudaMemcpy(own, w->p->own, (size_t)(row * w->n), cudaMemcpyDeviceToHost),
	             cudaSuccess);
	for (int64_t i = 0; i < w->n; i++)
		for (int64_t b = 0; b < nblk; b++) {
			const uint8_t *got = own + i * row + b * MWV_Q6K_BLOCK;
			const size_t q6k = sizeof(struct q4kh_block_q6_k);

			cr_assert(!memcmp(got, src + i * w->gpu.t.nb[1] + b * (int64_t)q6k, q6k),
			          "row %lld, block %lld: the copy differs from the weight",
			          (long long)i, (long long)b);
			cr_assert(!memcmp(got + q6k, zeros, MWV_Q6K_BLOCK - q6k),
			          "row %lld, block %lld: the padding is not zero", (long long)i,
			          (long long)b);
		}
	free(own);
}

/*
 * The table's warm-up (q4khost/cuda_variant_scratch.h): cuda-mwv's first
 * prepare on the device starts it; prepare alone copies a Q6_K weight
 * (rows 6 bytes apart beyond their length, as no file has them); the
 * first product on tensor cores (a prompt's 64 columns through gemm)
 * joins it, takes the cuBLAS handle it made, finds the scratch that the
 * warm-up's products at Q4KH_TC_WARM_COLUMNS left (at least what a
 * prompt of that many columns needs: its fp16 activations, the weight's
 * fp16 copy and cuBLAS's workspace, q4khost/cuda_tc.h) and agrees with
 * the cpu. A context closed right after its first prepare (cuda-dp4a's),
 * the warm-up perhaps still running, joins it.
 */
Test(cuda_variants, warm_up_before_the_first_prompt)
{
	const int64_t t = 64;
	const struct q4kh_cv_scratch_dev *d;
	struct q4kh_kernel k;
	struct weight w, w6;
	struct vrig r;
	float *xv;

	variant_open(&r, &mwv, 13, &k);
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q4_K, 4096, 1024, 0, &w);
	cr_assert_gt(k.ctx->scratch.n, k.native.ordinal, "no scratch entry for device %d",
	             k.native.ordinal);
	cr_assert_eq(k.ctx->scratch.dev[k.native.ordinal].warmed, 1,
	             "the first prepare started no warm-up");
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q6_K, 4096, 1024, 6, &w6);
	packed_at_prepare(&r, &w6);
	xv = rvals((size_t)(w.k * t));
	multiply(&r, &k, &w, t, xv, 0);
	free(xv);
	d = &k.ctx->scratch.dev[k.native.ordinal];
	cr_assert_null(d->warm, "the first product on tensor cores left the warm-up running");
	cr_assert_not_null(d->blas, "no cuBLAS handle after a product on tensor cores");
	cr_assert_geq(d->size,
	              2 * (size_t)w.k * Q4KH_TC_WARM_COLUMNS + 2 * (size_t)w.k * (size_t)w.n +
	                      Q4KH_TC_WORKSPACE,
	              "the warm-up left %zu bytes of scratch", d->size);
	weight_free(&r, &k, &w6);
	weight_free(&r, &k, &w);
	variant_close(&r, &k);

	variant_open(&r, &dp4a, 14, &k);
	weight_new(&r, &k, &dp4a, Q4KH_TYPE_Q4_K, 256, 33, 0, &w);
	weight_free(&r, &k, &w);
	variant_close(&r, &k);
}
