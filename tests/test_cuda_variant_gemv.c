/*
 * The CUDA kernel variants' gemv and gemm against the reference cpu
 * plugin's mul_mat (cuda_variant_rig.h: the rig, the bounds, the poison).
 * For each weight, prepared once: gemv with T = 1 .. 8 columns and gemm
 * with T = 1, 7, 8, 9, 16, 17, 63, 64, 65, 511, 513 (around the 8-column tiles,
 * the tensor-core hand-over and 512), on fresh random activations in +-[0.1, 1), at
 * shapes whose row count is no multiple of any rows-per-block and whose
 * row length runs from one block to 8192, including the default model's
 * (cuda-mwv's Q5_0 and Q8_0 among them: rows of 640 values, 20 blocks);
 * every warp count the config accepts; activations with massive channels,
 * where cuda-dp4a's int8 rounding does worse (measured, logged); and a NaN
 * activation, which must reach y.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_variant_rig.h"

/* gemv for T = 1 .. 8 and gemm for the prompt sizes of gemm_t on fresh
 * activations. */
static void sweep(struct vrig *r, struct q4kh_kernel *k, const struct weight *w)
{
	static const int64_t gemm_t[] = { 1, 7, 8, 9, 16, 17, 63, 64, 65, 511, 513 };
	const int n_gemm = (int)(sizeof(gemm_t) / sizeof(gemm_t[0]));
	double worst = 0, ratio = 0;

	for (int i = 0; i < 8 + n_gemm; i++) {
		int gemv = i < 8;
		int64_t t = gemv ? i + 1 : gemm_t[i - 8];
		float *xv = rvals((size_t)(w->k * t));
		struct agreement a = multiply(r, k, w, t, xv, gemv);

		worst = fmax(worst, a.nmse);
		ratio = fmax(ratio, a.worst);
		free(xv);
	}
	cr_log_info("%s %s {%lld, %lld}: worst NMSE %.3g, largest error %.3g of its bound, "
	            "over T = 1..8 (gemv), 1 .. 513 (gemm)",
	            w->v->name, q4kh_type_name(w->type), (long long)w->k,
	            (long long)w->n, worst, ratio);
}

struct shape {
	int64_t k, n;
	int64_t pad; /* bytes between weight rows beyond their length */
};

static void check_shapes(const struct variant *v, uint32_t type,
                         const struct shape *shapes, size_t n_shapes,
                         const char *warps, long seed)
{
	struct q4kh_kernel k;
	struct vrig r;

	rng_seed(seed);
	vrig_open(&r, warps);
	kernel_open(&r, v, &k);
	for (size_t i = 0; i < n_shapes; i++) {
		struct weight w;

		weight_new(&r, &k, v, type, shapes[i].k, shapes[i].n, shapes[i].pad,
		           &w);
		sweep(&r, &k, &w);
		weight_free(&r, &k, &w);
	}
	variant_close(&r, &k);
}

/*
 * Q4_K shapes: one super-block to 8192 values per row, row counts that are
 * no multiple of any rows-per-block, the default model's attn_output and
 * ffn_down, and rows 2 bytes apart beyond their length (not 16-byte
 * aligned: prepare must copy them).
 */
static const struct shape q4k_shapes[] = {
	{ 256, 1, 0 },     { 256, 7, 0 },    { 512, 33, 0 },
	{ 1024, 640, 0 },  { 2048, 640, 0 }, { 4096, 257, 0 },
	{ 4352, 100, 16 }, { 8192, 45, 0 },  { 768, 129, 2 },
};

/* IQ4_NL: row lengths of one block up, the default model's 640. */
static const struct shape iq4_nl_shapes[] = {
	{ 32, 5, 0 },      { 640, 256, 0 },   { 640, 1024, 0 },
	{ 640, 2048, 0 },  { 1056, 33, 2 },   { 4096, 129, 0 },
	{ 8192, 31, 6 },
};

static const struct shape iq4_xs_shapes[] = {
	{ 256, 1, 0 },    { 512, 31, 0 },    { 1024, 640, 0 },
	{ 2048, 640, 0 }, { 4096, 255, 8 },  { 4352, 100, 0 },
	{ 8192, 45, 2 },
};

/*
 * Q5_0 and Q8_0 (cuda-mwv's copies): one block, rows of 640 values (20
 * pieces: lanes 20 .. 31 of a warp idle) at the default model's q, k,
 * gate shapes and few odd row counts, 4096 and 8192 values, rows 2 and 6
 * bytes apart beyond their length.
 */
static const struct shape b32_shapes[] = {
	{ 32, 5, 0 },      { 96, 3, 2 },     { 640, 1, 0 },   { 640, 7, 0 },
	{ 640, 257, 6 },   { 640, 1024, 0 }, { 640, 256, 0 }, { 640, 2048, 0 },
	{ 1056, 33, 2 },   { 4096, 3, 0 },   { 4096, 129, 2 }, { 8192, 45, 0 },
};

/* Fewer shapes for the other warp counts: one per group-size regime. */
static const struct shape q4k_few[] = {
	{ 256, 3, 0 }, { 2048, 65, 0 }, { 8192, 9, 0 },
};
static const struct shape iq4_nl_few[] = {
	{ 96, 3, 0 }, { 2048, 65, 0 }, { 8192, 9, 0 },
};
static const struct shape b32_few[] = {
	{ 640, 3, 0 }, { 2048, 65, 2 }, { 8192, 9, 0 },
};
static const struct shape iq4_xs_few[] = {
	{ 256, 3, 0 }, { 2048, 65, 0 }, { 8192, 9, 0 },
};

TestSuite(cuda_variants, .timeout = 900);

/*
 * The premise of the elements' bounds: no value of a group exceeds its
 * range s_g, each value as the reference cpu plugin dequantises it
 * (get_rows), for random blocks of every type; and the ranges are no
 * looser than their formats make them (some value reaches half of its
 * group's). Needs no GPU.
 */
Test(cuda_variants, every_value_within_its_groups_range)
{
	static const uint32_t types[] = { Q4KH_TYPE_Q4_K,   Q4KH_TYPE_Q6_K,  Q4KH_TYPE_Q5_0,
		                          Q4KH_TYPE_Q8_0,   Q4KH_TYPE_IQ4_NL,
		                          Q4KH_TYPE_IQ4_XS };
	const int64_t k = 1024, n = 64;
	struct q4kh_error err = { { 0 } };
	struct vrig r;
	int32_t ids[64];

	rng_seed(12);
	vrig_scan(&r, NULL);
	cr_assert_eq(q4kh_backend_open(find_plugin(r.reg, "cpu"), 0, &r.cpu, &err), 0, "%s",
	             err.msg);
	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)i;
	for (size_t t = 0; t < N_OF(types); t++) {
		uint8_t *bytes = random_blocks(types[t], k, n);
		double *s = group_ranges(types[t], bytes, k, n), reach = 0;
		struct view w = put(&r.cpu, types[t], k, n, (int64_t)row_bytes(types[t], k), bytes);
		struct view out = put(&r.cpu, Q4KH_TYPE_F32, k, n, 4 * k, NULL);
		uint8_t *raw;

		cr_assert_eq(r.cpu.v->get_rows(r.cpu.dev, &w.t, ids, n, 1.0f, &out.t), Q4KH_OK,
		             "%s", r.cpu.v->last_error(r.cpu.ctx));
		raw = fetch(&r.cpu, &out);
		for (int64_t row = 0; row < n; row++)
			for (int64_t i = 0; i < k; i++) {
				const double v = fabs(f32_at(&out, raw, i, row));
				const double sg = s[row * (k / CV_GROUP) + i / CV_GROUP];

				cr_assert_leq(v, sg * (1 + 1e-6), "%s row %lld value %lld: |%g| > its "
				              "group's range %g",
				              q4kh_type_name(types[t]), (long long)row, (long long)i, v,
				              sg);
				reach = fmax(reach, v / sg);
			}
		cr_expect_geq(reach, 0.5, "%s: no value reaches half its range (%g)",
		              q4kh_type_name(types[t]), reach);
		free(raw);
		drop(&r.cpu, &w);
		drop(&r.cpu, &out);
		free(s);
		free(bytes);
	}
	vrig_close(&r);
}

Test(cuda_variants, mwv_q4_k)
{
	check_shapes(&mwv, Q4KH_TYPE_Q4_K, q4k_shapes, N_OF(q4k_shapes), NULL, 1);
}

Test(cuda_variants, mwv_q6_k)
{
	check_shapes(&mwv, Q4KH_TYPE_Q6_K, q4k_shapes, N_OF(q4k_shapes), NULL, 5);
}

Test(cuda_variants, mwv_q5_0)
{
	check_shapes(&mwv, Q4KH_TYPE_Q5_0, b32_shapes, N_OF(b32_shapes), NULL, 8);
}

Test(cuda_variants, mwv_q8_0)
{
	check_shapes(&mwv, Q4KH_TYPE_Q8_0, b32_shapes, N_OF(b32_shapes), NULL, 9);
}

Test(cuda_variants, dp4a_q4_k)
{
	check_shapes(&dp4a, Q4KH_TYPE_Q4_K, q4k_shapes, N_OF(q4k_shapes), NULL,
	             2);
}

Test(cuda_variants, dp4a_q6_k)
{
	check_shapes(&dp4a, Q4KH_TYPE_Q6_K, q4k_shapes, N_OF(q4k_shapes), NULL, 8);
}

Test(cuda_variants, gemv_iq_iq4_nl)
{
	check_shapes(&iq, Q4KH_TYPE_IQ4_NL, iq4_nl_shapes, N_OF(iq4_nl_shapes),
	             NULL, 3);
}

Test(cuda_variants, gemv_iq_iq4_xs)
{
	check_shapes(&iq, Q4KH_TYPE_IQ4_XS, iq4_xs_shapes, N_OF(iq4_xs_shapes),
	             NULL, 4);
}

/* Every warp count the config accepts: 1 (groups within a warp) to 8. */
Test(cuda_variants, every_warp_count)
{
	static const char *const warps[] = { "1", "2", "8" };

	for (size_t i = 0; i < N_OF(warps); i++) {
		check_shapes(&mwv, Q4KH_TYPE_Q4_K, q4k_few, N_OF(q4k_few), warps[i],
		             10 + (long)i);
		check_shapes(&mwv, Q4KH_TYPE_Q5_0, b32_few, N_OF(b32_few), warps[i],
		             50 + (long)i);
		check_shapes(&mwv, Q4KH_TYPE_Q8_0, b32_few, N_OF(b32_few), warps[i],
		             60 + (long)i);
		check_shapes(&dp4a, Q4KH_TYPE_Q4_K, q4k_few, N_OF(q4k_few), warps[i],
		             20 + (long)i);
		check_shapes(&iq, Q4KH_TYPE_IQ4_NL, iq4_nl_few, N_OF(iq4_nl_few),
		             warps[i], 30 + (long)i);
		check_shapes(&iq, Q4KH_TYPE_IQ4_XS, iq4_xs_few, N_OF(iq4_xs_few),
		             warps[i], 40 + (long)i);
	}
}

/*
 * The default model's tied output projection, token_embd: 262,144 rows of
 * 640 values of TYPE (4 rows a warp), by variant V at T = 1 and 8.
 */
static void token_embd_shape(const struct variant *v, uint32_t type, long seed)
{
	struct q4kh_kernel k;
	struct weight w;
	struct vrig r;

	variant_open(&r, v, seed, &k);
	weight_new(&r, &k, v, type, 640, 262144, 0, &w);
	for (int64_t t = 1; t <= 8; t += 7) {
		float *xv = rvals((size_t)(640 * t));
		struct agreement a = multiply(&r, &k, &w, t, xv, 1);

		cr_log_info("%s %s {640, 262144} x %lld: NMSE %.3g, largest error %.3g of its "
		            "bound",
		            v->name, q4kh_type_name(type), (long long)t, a.nmse, a.worst);
		free(xv);
	}
	weight_free(&r, &k, &w);
	variant_close(&r, &k);
}

/* As an IQ4_NL matrix. */
Test(cuda_variants, gemv_iq_token_embd_shape)
{
	token_embd_shape(&iq, Q4KH_TYPE_IQ4_NL, 5);
}

/* As the default model's Q4_K_M file has it, Q8_0, through cuda-mwv's copy. */
Test(cuda_variants, mwv_q8_0_token_embd_shape)
{
	token_embd_shape(&mwv, Q4KH_TYPE_Q8_0, 13);
}

/*
 * The known failure of int8 activations: a few massive channels (here
 * 1 in 97, 60 times the rest) set the int8 scale of their blocks, and the
 * other 31 values of those blocks keep 1 to 3 bits. Measured and logged
 * for both Q4_K variants; both stay within their elements' bounds, and
 * cuda-dp4a's NMSE must come out larger than on ordinary activations.
 */
Test(cuda_variants, massive_activations)
{
	const int64_t kk = 2048, n = 640, t = 4;
	const struct variant *const q4k[] = { &mwv, &dp4a };
	float *xv;
	struct vrig r;

	rng_seed(6);
	vrig_open(&r, NULL);
	xv = rvals((size_t)(kk * t));
	for (int v = 0; v < 2; v++) {
		struct q4kh_kernel k;
		struct weight w;
		struct agreement plain, massive;
		float *xm = malloc(sizeof(float) * (size_t)(kk * t));

		cr_assert_not_null(xm);
		for (int64_t i = 0; i < kk * t; i++)
			xm[i] = i % kk % 97 == 0 ? 60.0f * xv[i] : xv[i];
		kernel_open(&r, q4k[v], &k);
		weight_new(&r, &k, q4k[v], Q4KH_TYPE_Q4_K, kk, n, 0, &w);
		plain = multiply(&r, &k, &w, t, xv, 1);
		massive = multiply(&r, &k, &w, t, xm, 1);
		cr_log_info("%s Q4_K {%lld, %lld} x %lld: NMSE %.3g plain, %.3g with "
		            "massive channels",
		            q4k[v]->name, (long long)kk, (long long)n, (long long)t,
		            plain.nmse, massive.nmse);
		fprintf(stderr, "%s: NMSE %.3g plain, %.3g with massive channels\n",
		        q4k[v]->name, plain.nmse, massive.nmse);
		if (q4k[v] == &dp4a)
			cr_assert(isfinite(massive.nmse) && massive.nmse > plain.nmse,
			          "cuda-dp4a: NMSE %.3g with massive channels, %.3g "
			          "without",
			          massive.nmse, plain.nmse);
		weight_free(&r, &k, &w);
		q4kh_kernel_close(&k);
		free(xm);
	}
	free(xv);
	vrig_close(&r);
}

/* A non-finite activation must reach y, not vanish in the int8 scale. */
Test(cuda_variants, nan_activation_reaches_y)
{
	struct vrig r;

	rng_seed(7);
	vrig_open(&r, NULL);
	for (size_t v = 0; v < N_VARIANTS; v++) {
		const int64_t kk = 512, n = 9;
		struct q4kh_kernel k;
		struct weight w;
		struct view xg, yg;
		float *xv = rvals(kk), y[9];

		xv[100] = NAN;
		kernel_open(&r, variants[v], &k);
		weight_new(&r, &k, variants[v], variants[v]->types[0], kk, n, 0, &w);
		xg = put(&r.gpu, Q4KH_TYPE_F32, kk, 1, 4 * kk, xv);
		yg = put(&r.gpu, Q4KH_TYPE_F32, n, 1, 4 * n, NULL);
		cr_assert_eq(k.v->gemv(k.ctx, &k.native, w.p, &xg.t, &yg.t), Q4KH_OK,
		             "%s", k.v->last_error(k.ctx));
		cr_assert_eq(r.gpu.v->buffer_download(r.gpu.dev, yg.t.buffer, POISON_LEAD, y,
		                                      sizeof(y)),
		             Q4KH_OK);
		for (int64_t i = 0; i < n; i++)
			cr_assert(isnan(y[i]), "%s: y[%lld] = %g from a NaN activation",
			          variants[v]->name, (long long)i, (double)y[i]);
		drop(&r.gpu, &xg);
		drop(&r.gpu, &yg);
		weight_free(&r, &k, &w);
		q4kh_kernel_close(&k);
		free(xv);
	}
	vrig_close(&r);
}
