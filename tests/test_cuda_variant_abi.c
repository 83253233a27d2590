/*
 * What the CUDA kernel variants declare and how they fail
 * (cuda_variant_rig.h: the rig). Everywhere (variant_plugin): each loads
 * and declares its backend, types and entries, exports nothing but its
 * entry point, scores only sm_70 and newer and only its own types,
 * validates its warps setting, and fails cleanly without a device. On a
 * GPU (cuda_variants): each scores the real device, and bad arguments to
 * prepare, gemv and gemm fail with reasons.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_variant_rig.h"

/* --- on a GPU ------------------------------------------------------------- */

TestSuite(cuda_variants, .timeout = 900);

/* The real device's record: every variant runs on it (sm_70 and newer). */
Test(cuda_variants, score_of_the_device)
{
	struct vrig r;

	vrig_open(&r, NULL);
	for (size_t v = 0; v < N_VARIANTS; v++) {
		const struct q4kh_kernel_v1 *kt =
			find_plugin(r.reg, variants[v]->name)->desc->kernel;
		int sm = atoi(r.gpu.record.arch + 3);

		cr_assert_eq(strncmp(r.gpu.record.arch, "sm_", 3), 0, "%s",
		             r.gpu.record.arch);
		for (uint32_t i = 0; i < variants[v]->n_types; i++)
			if (sm >= 70)
				cr_assert_gt(kt->score(NULL, &r.gpu.record,
				                       variants[v]->types[i]),
				             0, "%s on %s (%s)", variants[v]->name,
				             r.gpu.record.name, r.gpu.record.arch);
	}
	vrig_close(&r);
}

Test(cuda_variants, bad_arguments_fail_with_reasons)
{
	struct q4kh_native_device other;
	struct q4kh_tensor bad;
	struct q4kh_kernel k;
	struct weight w;
	struct view x, x9, y, y9, f32w;
	q4kh_prepared *p = (q4kh_prepared *)&bad;
	float *xv;
	struct vrig r;

	variant_open(&r, &mwv, 8, &k);
	weight_new(&r, &k, &mwv, Q4KH_TYPE_Q4_K, 512, 16, 0, &w);
	xv = rvals(512 * 9);
	x = put(&r.gpu, Q4KH_TYPE_F32, 512, 2, 4 * 512, xv);
	x9 = put(&r.gpu, Q4KH_TYPE_F32, 512, 9, 4 * 512, xv);
	y = put(&r.gpu, Q4KH_TYPE_F32, 16, 2, 4 * 16, NULL);
	y9 = put(&r.gpu, Q4KH_TYPE_F32, 16, 9, 4 * 16, NULL);
	f32w = put(&r.gpu, Q4KH_TYPE_F32, 512, 16, 4 * 512, NULL);

	/* prepare */
	expect_error(&k, k.v->prepare(k.ctx, &k.native, &f32w.t, &p),
	             Q4KH_ERR_UNSUPPORTED, "type 0 (F32) is not one cuda-mwv "
	                                   "implements");
	cr_assert_null(p, "a failed prepare leaves *out NULL");
	bad = w.gpu.t;
	bad.ne[0] = 384;
	expect_error(&k, k.v->prepare(k.ctx, &k.native, &bad, &p),
	             Q4KH_ERR_INVALID, "ne[0] = 384, expected a multiple of Q4_K's "
	                               "block of 256");
	bad = w.gpu.t;
	bad.nb[1] = 100;
	expect_error(&k, k.v->prepare(k.ctx, &k.native, &bad, &p),
	             Q4KH_ERR_INVALID, "nb[1] = 100");
	bad = w.gpu.t;
	bad.ne[2] = 2;
	expect_error(&k, k.v->prepare(k.ctx, &k.native, &bad, &p),
	             Q4KH_ERR_INVALID, "shape {512, 16, 2, 1}");
	expect_error(&k, k.v->prepare(k.ctx, NULL, &w.gpu.t, &p),
	             Q4KH_ERR_INVALID, "native device is NULL");
	expect_error(&k, k.v->prepare(k.ctx, &k.native, NULL, &p),
	             Q4KH_ERR_INVALID, "w is NULL");

	/* gemv and gemm */
	expect_error(&k, k.v->gemv(k.ctx, &k.native, w.p, &x9.t, &y9.t),
	             Q4KH_ERR_INVALID, "gemv x: shape {512, 9, 1, 1}, expected "
	                               "{512, 1 .. 8, 1, 1}");
	cr_assert_eq(k.v->gemm(k.ctx, &k.native, w.p, &x9.t, &y9.t), Q4KH_OK,
	             "gemm takes 9 columns: %s", k.v->last_error(k.ctx));
	expect_error(&k, k.v->gemv(k.ctx, &k.native, w.p, &x.t, &y9.t),
	             Q4KH_ERR_INVALID, "gemv y: shape {16, 9, 1, 1}, expected "
	                               "{16, as x, 1, 1}");
	bad = x.t;
	bad.ne[0] = 256;
	expect_error(&k, k.v->gemv(k.ctx, &k.native, w.p, &bad, &y.t),
	             Q4KH_ERR_INVALID, "gemv x: shape {256, 2, 1, 1}");
	bad = x.t;
	bad.type = Q4KH_TYPE_F16;
	expect_error(&k, k.v->gemm(k.ctx, &k.native, w.p, &bad, &y.t),
	             Q4KH_ERR_INVALID, "gemm x: type 1 (F16), expected F32");
	bad = x.t;
	bad.offset += 4;
	bad.ne[1] = 1;
	expect_error(&k, k.v->gemv(k.ctx, &k.native, w.p, &bad, &y.t),
	             Q4KH_ERR_INVALID, "offset and nb[1] multiples of 16");
	bad = y.t;
	bad.buffer = x.t.buffer;
	expect_error(&k, k.v->gemv(k.ctx, &k.native, w.p, &x.t, &bad),
	             Q4KH_ERR_INVALID, "gemv: y overlaps x");
	bad = y.t;
	bad.buffer = w.gpu.t.buffer;
	expect_error(&k, k.v->gemv(k.ctx, &k.native, w.p, &x.t, &bad),
	             Q4KH_ERR_INVALID, "gemv: y overlaps w");
	expect_error(&k, k.v->gemv(k.ctx, &k.native, NULL, &x.t, &y.t),
	             Q4KH_ERR_INVALID, "gemv: w is NULL");
	expect_error(&k, k.v->gemv(k.ctx, &k.native, w.p, NULL, &y.t),
	             Q4KH_ERR_INVALID, "gemv x: tensor is NULL");
	other = k.native;
	other.ordinal += 1;
	expect_error(&k, k.v->gemv(k.ctx, &other, w.p, &x.t, &y.t),
	             Q4KH_ERR_INVALID, "prepared on CUDA device 0, called for 1");
	other = k.native;
	other.struct_size = 8;
	expect_error(&k, k.v->gemv(k.ctx, &other, w.p, &x.t, &y.t),
	             Q4KH_ERR_INVALID, "lacks address()");
	/* After all that, a good call still succeeds (its results are checked
	 * against the reference by test_cuda_variant_gemv). */
	expect_good_call(&r, &k, k.v->gemv(k.ctx, &k.native, w.p, &x.t, &y.t));

	drop(&r.gpu, &x);
	drop(&r.gpu, &x9);
	drop(&r.gpu, &y);
	drop(&r.gpu, &y9);
	drop(&r.gpu, &f32w);
	weight_free(&r, &k, &w);
	free(xv);
	variant_close(&r, &k);
}

/* --- everywhere: loading, identity, score, config, init ------------------ */

Test(variant_plugin, each_loads_and_declares_its_backend_and_types)
{
	struct vrig r;

	vrig_scan(&r, NULL);
	for (size_t v = 0; v < N_VARIANTS; v++) {
		const struct q4kh_plugin *p = find_plugin(r.reg, variants[v]->name);
		const struct q4kh_kernel_v1 *kt = p->desc->kernel;

		cr_assert_eq(p->state, Q4KH_PLUGIN_ACCEPTED);
		cr_assert_eq(p->desc->kind, Q4KH_KIND_KERNEL, "%s", p->name);
		cr_assert_eq(p->desc->abi_minor, Q4KH_ABI_MINOR);
		cr_assert_null(p->desc->backend);
		cr_assert_str_eq(p->desc->license, "MIT");
		cr_assert(strstr(p->desc->build_id, "nvcc") &&
		          strstr(p->desc->build_id, "sm_"),
		          "%s: build id \"%s\" names nvcc and the GPU code",
		          p->name, p->desc->build_id);
		cr_assert_not_null(kt);
		cr_assert_eq(kt->struct_size, sizeof(struct q4kh_kernel_v1));
		/* ABI 1.4: cuda-mwv and cuda-dp4a fuse products of one input,
		 * and gate, up with their GLU; cuda-gemv-iq not */
		cr_assert_eq(Q4KH_KERNEL_HAS(kt, gemv_multi), variants[v] != &iq, "%s",
		             p->name);
		cr_assert_eq(Q4KH_KERNEL_HAS(kt, gemv_glu), variants[v] != &iq, "%s",
		             p->name);
		cr_assert_str_eq(kt->backend, "cuda", "%s", p->name);
		/* ABI 1.6: int8 activations in cuda-dp4a; every variant's gemm
		 * on fp16 tensor cores, so f16 at the finest (docs/f2.md) */
		cr_assert_eq(kt->arith, variants[v] == &dp4a ? Q4KH_ARITH_INT8 : Q4KH_ARITH_F16,
		             "%s", p->name);
		cr_assert_eq(kt->max_gemv_columns, 8, "%s", p->name);
		cr_assert_eq(kt->n_types, variants[v]->n_types, "%s", p->name);
		for (uint32_t i = 0; i < kt->n_types; i++)
			cr_assert_eq(kt->types[i], variants[v]->types[i], "%s type %u",
			             p->name, i);
		/* Hidden visibility: only the entry point is exported. */
		cr_assert_not_null(dlsym(p->dl, Q4KH_ENTRY_SYMBOL));
		cr_assert_null(dlsym(p->dl, "q4kh_cv_init"), "%s exports q4kh_cv_init",
		               p->name);
		cr_assert_null(dlsym(p->dl, "q4kh_cv_self"), "%s exports q4kh_cv_self",
		               p->name);
	}
	vrig_close(&r);
}

static struct q4kh_device_record record(const char *arch)
{
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };

	snprintf(rec.arch, sizeof(rec.arch), "%s", arch);
	snprintf(rec.name, sizeof(rec.name), "test record");
	return rec;
}

Test(variant_plugin, score_needs_sm_70_and_its_own_types)
{
	static const char *const runs[] = { "sm_70", "sm_75", "sm_90", "sm_100",
		                            "sm_120a" };
	static const char *const never[] = { "sm_61", "sm_52", "x86_64", "sm_",
		                             "", "gfx942" };
	uint32_t score[N_VARIANTS];
	struct vrig r;

	vrig_scan(&r, NULL);
	for (size_t v = 0; v < N_VARIANTS; v++) {
		const struct q4kh_plugin *p = find_plugin(r.reg, variants[v]->name);
		const struct q4kh_kernel_v1 *kt = p->desc->kernel;
		struct q4kh_device_record rec = record("sm_90");
		q4kh_kernel_ctx *ctx;

		cr_assert_eq(kt->init(&p->api, &ctx), Q4KH_OK, "%s: %s", p->name,
		             kt->last_error(NULL));
		score[v] = kt->score(ctx, &rec, variants[v]->types[0]);
		for (size_t i = 0; i < N_OF(runs); i++) {
			rec = record(runs[i]);
			for (uint32_t t = 0; t < variants[v]->n_types; t++)
				cr_assert_gt(kt->score(ctx, &rec, variants[v]->types[t]), 0,
				             "%s on %s", p->name, runs[i]);
			/* Types it does not implement score 0 everywhere. */
			cr_assert_eq(kt->score(ctx, &rec, Q4KH_TYPE_F32), 0);
			cr_assert_eq(kt->score(ctx, &rec, Q4KH_TYPE_Q5_K), 0);
			cr_assert_eq(kt->score(ctx, &rec,
			                       variants[v]->types[0] == Q4KH_TYPE_Q4_K
			                               ? Q4KH_TYPE_IQ4_XS
			                               : Q4KH_TYPE_Q4_K),
			             0, "%s", p->name);
		}
		for (size_t i = 0; i < N_OF(never); i++) {
			rec = record(never[i]);
			cr_assert_eq(kt->score(ctx, &rec, variants[v]->types[0]), 0,
			             "%s on \"%s\"", p->name, never[i]);
		}
		/* A record too short to hold arch, and none at all. */
		rec = record("sm_90");
		rec.struct_size = 8;
		cr_assert_eq(kt->score(ctx, &rec, variants[v]->types[0]), 0);
		cr_assert_eq(kt->score(ctx, NULL, variants[v]->types[0]), 0);
		kt->shutdown(ctx);
	}
	/* fp32 activations are preferred over int8 for the same type. */
	cr_assert_gt(score[0], score[1], "cuda-mwv %u, cuda-dp4a %u", score[0],
	             score[1]);
	vrig_close(&r);
}

Test(variant_plugin, warps_setting_is_validated)
{
	static const char *const bad[] = { "3", "0", "16", "04", "four", "4 ", "-4" };
	/* "warps =" with nothing counts as unset, as every empty value. */
	static const char *const good[] = { "1", "2", "4", "8", "" };

	for (size_t i = 0; i < N_OF(good) + N_OF(bad); i++) {
		int ok = i < N_OF(good);
		const char *w = ok ? good[i] : bad[i - N_OF(good)];
		struct vrig r;

		vrig_scan(&r, w);
		for (size_t v = 0; v < N_VARIANTS; v++) {
			const struct q4kh_plugin *p = find_plugin(r.reg, variants[v]->name);
			const struct q4kh_kernel_v1 *kt = p->desc->kernel;
			q4kh_kernel_ctx *ctx = (q4kh_kernel_ctx *)&r;
			char want[96];

			if (ok) {
				cr_assert_eq(kt->init(&p->api, &ctx), Q4KH_OK,
				             "%s: warps = \"%s\": %s", p->name, w,
				             kt->last_error(NULL));
				kt->shutdown(ctx);
				continue;
			}
			cr_assert_eq(kt->init(&p->api, &ctx), Q4KH_ERR_INVALID,
			             "%s: warps = \"%s\" accepted", p->name, w);
			cr_assert_null(ctx);
			snprintf(want, sizeof(want),
			         "%s: init: [plugin.%s] warps = \"%s\": expected 1, 2, 4 "
			         "or 8",
			         p->name, p->name, w);
			cr_assert(strstr(kt->last_error(NULL), want),
			          "last_error(NULL) \"%s\" lacks \"%s\"",
			          kt->last_error(NULL), want);
		}
		vrig_close(&r);
	}
}

Test(variant_plugin, init_and_calls_without_a_device_fail_cleanly)
{
	struct vrig r;

	vrig_scan(&r, NULL);
	for (size_t v = 0; v < N_VARIANTS; v++) {
		const struct q4kh_plugin *p = find_plugin(r.reg, variants[v]->name);
		const struct q4kh_kernel_v1 *kt = p->desc->kernel;
		struct q4kh_host_api api = p->api;
		struct q4kh_tensor t = { .type = variants[v]->types[0] };
		q4kh_kernel_ctx *ctx = (q4kh_kernel_ctx *)&r;
		q4kh_prepared *w = (q4kh_prepared *)&r;

		cr_assert_eq(kt->init(NULL, &ctx), Q4KH_ERR_INVALID);
		cr_assert_null(ctx);
		cr_assert(strstr(kt->last_error(NULL), "host API is NULL"), "%s",
		          kt->last_error(NULL));
		api.abi_major = Q4KH_ABI_MAJOR + 1;
		cr_assert_eq(kt->init(&api, &ctx), Q4KH_ERR_INVALID);
		cr_assert(strstr(kt->last_error(NULL), "host ABI major 2, plugin "
		                                       "built for 1"),
		          "%s", kt->last_error(NULL));
		cr_assert_eq(kt->init(&p->api, NULL), Q4KH_ERR_INVALID);
		cr_assert_eq(kt->init(&p->api, &ctx), Q4KH_OK, "%s",
		             kt->last_error(NULL));
		cr_assert_str_eq(kt->last_error(ctx), "");
		cr_assert_eq(kt->prepare(ctx, NULL, &t, &w), Q4KH_ERR_INVALID);
		cr_assert_null(w);
		cr_assert_str_eq(kt->last_error(ctx), "prepare: native device is NULL");
		cr_assert_eq(kt->gemv(ctx, NULL, NULL, &t, &t), Q4KH_ERR_INVALID);
		cr_assert_str_eq(kt->last_error(ctx), "gemv: native device is NULL");
		if (Q4KH_KERNEL_HAS(kt, gemv_glu)) {
			cr_assert_eq(kt->gemv_glu(ctx, NULL, Q4KH_GLU_SILU, w, w, &t, &t),
			             Q4KH_ERR_INVALID);
			cr_assert_str_eq(kt->last_error(ctx), "gemv_glu: native device is NULL");
		}
		cr_assert_eq(kt->gemm(NULL, NULL, NULL, &t, &t), Q4KH_ERR_INVALID);
		kt->release(ctx, NULL);
		kt->shutdown(ctx);
	}
	vrig_close(&r);
}
