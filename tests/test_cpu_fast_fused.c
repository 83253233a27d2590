/*
 * The cpu-fast backend's ABI 1.4 entries that stand for other ops, with
 * each instruction set this CPU runs (test_cpu_fast; cpu_fast_rig.h is
 * the rig):
 *   - add_rms_norm and rope_set_rows: bit for bit their two ops, and
 *     within those ops' bounds (tests/test_cpu_fast_ops.c); rope_store
 *     bit for bit its three; out-of-range positions as those ops issued
 *     one after the other (docs/plugin-abi.md U2, U4: rotated, then the
 *     cache refused); their refusals, one line each;
 *   - top2: the host's q4kh_top2 bit for bit, on random and adversarial
 *     columns (helpers.h), and its refusals.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_fast_rig.h"
#include "helpers.h"

/*
 * add_rms_norm (ABI 1.4) of x {n, rows} and a into out, which is apart
 * (OUT_AT 0), x (1) or a (2): bit for bit what add then rms_norm give,
 * the sum rounded once from float64's, the norm within rms_norm's bound.
 */
static void add_rms_norm_case(struct env *e, const char *isa, int64_t n, int with_w, int out_at)
{
	const int64_t rows = 5;
	float *x = randoms(n * rows, 3.0), *a = randoms(n * rows, 2.0), *w = randoms(n, 2.0);
	struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, n, rows, 1, x);
	struct q4kh_tensor at = tensor(e, Q4KH_TYPE_F32, n, rows, 1, a);
	struct q4kh_tensor wt = tensor(e, Q4KH_TYPE_F32, n, 1, 1, w);
	struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, n, rows, 1, NULL);
	struct q4kh_tensor *out = out_at == 1 ? &xt : out_at == 2 ? &at : &ot;
	float *sum, *norm, *want_sum, *want_norm;

	/* the two ops, then the fused entry on the same inputs */
	cr_assert_eq(e->b->add(e->dev, &xt, &at, &xt), Q4KH_OK);
	cr_assert_eq(e->b->rms_norm(e->dev, &xt, with_w ? &wt : NULL, 1e-6f, out), Q4KH_OK);
	want_sum = fetch(e, &xt);
	want_norm = fetch(e, out);
	cr_assert_eq(e->b->buffer_upload(e->dev, xt.buffer, 0, x, (uint64_t)xt.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->buffer_upload(e->dev, at.buffer, 0, a, (uint64_t)at.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->add_rms_norm(e->dev, &xt, &at, with_w ? &wt : NULL, 1e-6f, out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	sum = fetch(e, &xt);
	norm = fetch(e, out);
	if (out_at != 1)
		cr_expect_eq(memcmp(sum, want_sum, sizeof(float) * (size_t)(n * rows)), 0,
		             "%s add_rms_norm n %lld: x differs from add's", isa, (long long)n);
	cr_expect_eq(memcmp(norm, want_norm, sizeof(float) * (size_t)(n * rows)), 0,
	             "%s add_rms_norm n %lld w %d out %d: differs from add then rms_norm", isa,
	             (long long)n, with_w, out_at);
	for (int64_t r = 0; r < rows; r++) {
		double ss = 0, sc;

		for (int64_t i = 0; i < n; i++) {
			const float v = (float)((double)x[r * n + i] + a[r * n + i]);

			if (out_at != 1)
				cr_expect_eq(sum[r * n + i], v, "%s add_rms_norm sum %lld", isa,
				             (long long)i);
			ss += (double)v * v;
		}
		sc = 1.0 / sqrt(ss / n + 1e-6);
		for (int64_t i = 0; i < n; i++) {
			const float v = (float)((double)x[r * n + i] + a[r * n + i]);
			const double exact = v * sc * (with_w ? w[i] : 1.0);

			EXPECT_NEAR(norm[r * n + i], exact, (n + 8) * U * fabs(exact),
			            "%s add_rms_norm n %lld, row %lld, %lld", isa, (long long)n,
			            (long long)r, (long long)i);
		}
	}
	free(sum);
	free(norm);
	free(want_sum);
	free(want_norm);
	free(x);
	free(a);
	free(w);
	drop(e, &xt);
	drop(e, &at);
	drop(e, &wt);
	drop(e, &ot);
}

/*
 * norm_add_rms_norm (ABI 1.5): a normed in place with w_a, then
 * add_rms_norm into out (apart, x or a: OUT_AT 0, 1, 2); a, x and out bit
 * for bit what rms_norm, add and rms_norm give, out near float64's.
 */
static void norm_add_rms_norm_case(struct env *e, const char *isa, int64_t n, int with_w,
                                   int out_at)
{
	const int64_t rows = 3;
	float *x = randoms(n * rows, 3.0), *a = randoms(n * rows, 2.0), *w = randoms(n, 2.0),
	      *wa = randoms(n, 2.0);
	struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, n, rows, 1, x);
	struct q4kh_tensor at = tensor(e, Q4KH_TYPE_F32, n, rows, 1, a);
	struct q4kh_tensor wt = tensor(e, Q4KH_TYPE_F32, n, 1, 1, w);
	struct q4kh_tensor wat = tensor(e, Q4KH_TYPE_F32, n, 1, 1, wa);
	struct q4kh_tensor ot = tensor(e, Q4KH_TYPE_F32, n, rows, 1, NULL);
	struct q4kh_tensor *out = out_at == 1 ? &xt : out_at == 2 ? &at : &ot;
	const struct q4kh_tensor *wp = with_w ? &wt : NULL, *wap = with_w ? &wat : NULL;
	const size_t bytes = sizeof(float) * (size_t)(n * rows);
	float *want_x, *want_a, *want_o, *got;

	cr_assert_eq(e->b->rms_norm(e->dev, &at, wap, 1e-5f, &at), Q4KH_OK);
	cr_assert_eq(e->b->add(e->dev, &xt, &at, &xt), Q4KH_OK);
	cr_assert_eq(e->b->rms_norm(e->dev, &xt, wp, 1e-6f, out), Q4KH_OK);
	want_x = fetch(e, &xt);
	want_a = fetch(e, &at);
	want_o = fetch(e, out);
	cr_assert_eq(e->b->buffer_upload(e->dev, xt.buffer, 0, x, (uint64_t)xt.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->buffer_upload(e->dev, at.buffer, 0, a, (uint64_t)at.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->norm_add_rms_norm(e->dev, &xt, &at, wap, 1e-5f, wp, 1e-6f, out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	got = fetch(e, &xt);
	cr_expect_eq(memcmp(got, want_x, bytes), 0, "%s norm_add_rms_norm n %lld: x", isa,
	             (long long)n);
	free(got);
	got = fetch(e, &at);
	cr_expect_eq(memcmp(got, want_a, bytes), 0, "%s norm_add_rms_norm n %lld: a", isa,
	             (long long)n);
	free(got);
	got = fetch(e, out);
	cr_expect_eq(memcmp(got, want_o, bytes), 0, "%s norm_add_rms_norm n %lld w %d out %d",
	             isa, (long long)n, with_w, out_at);
	for (int64_t r = 0; r < rows; r++) {
		double sa = 0, ss = 0, v[700];

		cr_assert(n <= 700);
		for (int64_t i = 0; i < n; i++)
			sa += (double)a[r * n + i] * a[r * n + i];
		sa = 1.0 / sqrt(sa / n + 1e-5);
		for (int64_t i = 0; i < n; i++) {
			v[i] = x[r * n + i] + a[r * n + i] * sa * (with_w ? wa[i] : 1.0);
			ss += v[i] * v[i];
		}
		ss = 1.0 / sqrt(ss / n + 1e-6);
		for (int64_t i = 0; i < n; i++) {
			const double exact = v[i] * ss * (with_w ? w[i] : 1.0);

			EXPECT_NEAR(got[r * n + i], exact, 4 * (n + 8) * U * fabs(exact) + 1e-6,
			            "%s norm_add_rms_norm n %lld, row %lld, %lld", isa, (long long)n,
			            (long long)r, (long long)i);
		}
	}
	free(got);
	free(want_x);
	free(want_a);
	free(want_o);
	free(x);
	free(a);
	free(w);
	free(wa);
	drop(e, &xt);
	drop(e, &at);
	drop(e, &wt);
	drop(e, &wat);
	drop(e, &ot);
}

Test(cpu_fast, norm_add_rms_norm_is_rms_norm_add_rms_norm)
{
	static const int64_t lens[] = { 640, 37 };

	FOR_EACH_ISA(e) {
		for (int li = 0; li < 2; li++)
			for (int with_w = 0; with_w < 2; with_w++)
				for (int out_at = 0; out_at < 3; out_at++)
					norm_add_rms_norm_case(e, isas[isa_], lens[li], with_w, out_at);
	}
}

Test(cpu_fast, add_rms_norm_is_add_then_rms_norm)
{
	static const int64_t lens[] = { 640, 37 };

	FOR_EACH_ISA(e) {
		for (int li = 0; li < 2; li++)
			for (int with_w = 0; with_w < 2; with_w++)
				for (int out_at = 0; out_at < 3; out_at++)
					add_rms_norm_case(e, isas[isa_], lens[li], with_w, out_at);
	}
}

/*
 * rope_set_rows (ABI 1.4) into a cache of TYPE: x and the cache bit for
 * bit what rope_ext then set_rows give; the cache rows are x's rows
 * (rounded to f16 for an f16 cache), x within rope's bound of float64.
 */
static void rope_set_rows_case(struct env *e, const char *isa, uint32_t type, uint32_t mode,
                               int yarn)
{
	const int64_t hd = 64, heads = 3, T = 4, n = 12;
	const int32_t pos[4] = { 3, 0, 11, 7 };
	const size_t row = q4kh_type_block_bytes(type);
	float ff[24];
	float *x = randoms(hd * heads * T, 3.0), *got, *want;
	struct q4kh_tensor xt = tensor(e, Q4KH_TYPE_F32, hd, heads, T, x);
	struct q4kh_tensor pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, pos), ft;
	struct q4kh_tensor ct = tensor(e, type, hd, heads, n, NULL);
	struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 48, .mode = mode, .base = 10000.0f,
		.freq_scale = yarn ? 0.25f : 1.0f, .ext_factor = yarn ? 1.0f : 0.0f,
		.attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 4096,
	};
	unsigned char *cache, *want_cache;
	char what[96];

	for (int i = 0; i < 24; i++)
		ff[i] = 1.0f + (float)i / 3;
	ft = tensor(e, Q4KH_TYPE_F32, 24, 1, 1, ff);
	p.freq_factors = yarn ? &ft : NULL;
	cr_assert_eq(e->b->rope_ext(e->dev, &xt, &pt, &p, &xt), Q4KH_OK);
	cr_assert_eq(e->b->set_rows(e->dev, &xt, &pt, &ct), Q4KH_OK);
	want = fetch(e, &xt);
	want_cache = fetch(e, &ct);
	cr_assert_eq(e->b->buffer_upload(e->dev, xt.buffer, 0, x, (uint64_t)xt.nb[3]), Q4KH_OK);
	cr_assert_eq(e->b->rope_set_rows(e->dev, &xt, &pt, &p, &ct), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &xt);
	cache = fetch(e, &ct);
	cr_expect_eq(memcmp(got, want, sizeof(float) * (size_t)(hd * heads * T)), 0,
	             "%s rope_set_rows x differs from rope_ext's", isa);
	snprintf(what, sizeof(what), "%s rope_set_rows type %u mode %u yarn %d", isa, type, mode,
	         yarn);
	expect_rope(&p, yarn ? ff : NULL, pos, hd, heads, T, x, got, what);
	for (int64_t t = 0; t < T; t++) {
		const size_t at = (size_t)(pos[t] * heads * hd) * row;

		cr_expect_eq(memcmp(cache + at, want_cache + at, (size_t)(heads * hd) * row), 0,
		             "%s: cache row %d differs from set_rows'", what, pos[t]);
		for (int64_t h = 0; h < heads; h++) {
			const float *gr = got + (t * heads + h) * hd;

			for (int64_t i = 0; i < hd; i++) {
				const size_t ci = (size_t)((pos[t] * heads + h) * hd + i);

				if (type == Q4KH_TYPE_F16)
					cr_expect_eq(((const uint16_t *)cache)[ci], q4kh_f32_to_fp16(gr[i]),
					             "%s: cache value %lld", what, (long long)i);
				else
					cr_expect_eq(((const float *)cache)[ci], gr[i],
					             "%s: cache value %lld", what, (long long)i);
			}
		}
	}
	free(got);
	free(want);
	free(cache);
	free(want_cache);
	free(x);
	drop(e, &xt);
	drop(e, &pt);
	drop(e, &ft);
	drop(e, &ct);
}

Test(cpu_fast, rope_set_rows_is_rope_ext_then_set_rows)
{
	FOR_EACH_ISA(e) {
		for (int f16 = 0; f16 < 2; f16++)
			for (int mode = 0; mode < 2; mode++)
				for (int yarn = 0; yarn < 2; yarn++)
					rope_set_rows_case(e, isas[isa_],
					                   f16 ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
					                   mode ? Q4KH_ROPE_NEOX : Q4KH_ROPE_NORM, yarn);
	}
}

/*
 * rope_store (ABI 1.4): q, k and caches of types KT (keys) and VT
 * (values), holding the same bytes beforehand, bit for bit what
 * rope_ext of q, rope_ext and set_rows of k and set_rows of v give. T
 * tokens at arbitrary positions, grouped-query heads (6 query heads, 2 KV
 * heads), values of HD_V per head.
 */
static void rope_store_case(struct env *e, const char *isa, uint32_t kt, uint32_t vt,
                            uint32_t mode, int yarn, int64_t T, int64_t hd_v)
{
	const int64_t hd = 64, hq = 6, hkv = 2, n = 12;
	const int32_t pos[4] = { 3, 0, 11, 7 }, pos1[1] = { 9 };
	float ff[24];
	float *q = randoms(hd * hq * T, 3.0), *k = randoms(hd * hkv * T, 3.0);
	float *v = randoms(hd_v * hkv * T, 3.0);
	float *kfill = randoms(hd * hkv * n, 1.0), *vfill = randoms(hd_v * hkv * n, 1.0);
	struct q4kh_tensor pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, T == 1 ? pos1 : pos), ft;
	struct q4kh_tensor t[2][5]; /* the three ops', rope_store's: q k v k_cache v_cache */
	struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 48, .mode = mode, .base = 10000.0f,
		.freq_scale = yarn ? 0.25f : 1.0f, .ext_factor = yarn ? 1.0f : 0.0f,
		.attn_factor = yarn ? 0.75f : 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f,
		.n_ctx_orig = 4096,
	};
	static const char *const names[5] = { "q", "k", "v", "k_cache", "v_cache" };

	for (int i = 0; i < 24; i++)
		ff[i] = 1.0f + (float)i / 3;
	ft = tensor(e, Q4KH_TYPE_F32, 24, 1, 1, ff);
	p.freq_factors = yarn ? &ft : NULL;
	for (int s = 0; s < 2; s++) {
		t[s][0] = tensor(e, Q4KH_TYPE_F32, hd, hq, T, q);
		t[s][1] = tensor(e, Q4KH_TYPE_F32, hd, hkv, T, k);
		t[s][2] = tensor(e, Q4KH_TYPE_F32, hd_v, hkv, T, v);
		/* the caches' bytes beforehand: whatever the floats' bytes are */
		t[s][3] = tensor(e, kt, hd, hkv, n, NULL);
		t[s][4] = tensor(e, vt, hd_v, hkv, n, NULL);
		cr_assert_eq(e->b->buffer_upload(e->dev, t[s][3].buffer, 0, kfill,
		                                 (uint64_t)t[s][3].nb[3]), Q4KH_OK);
		cr_assert_eq(e->b->buffer_upload(e->dev, t[s][4].buffer, 0, vfill,
		                                 (uint64_t)t[s][4].nb[3]), Q4KH_OK);
	}
	cr_assert_eq(e->b->rope_ext(e->dev, &t[0][0], &pt, &p, &t[0][0]), Q4KH_OK);
	cr_assert_eq(e->b->rope_ext(e->dev, &t[0][1], &pt, &p, &t[0][1]), Q4KH_OK);
	cr_assert_eq(e->b->set_rows(e->dev, &t[0][1], &pt, &t[0][3]), Q4KH_OK);
	cr_assert_eq(e->b->set_rows(e->dev, &t[0][2], &pt, &t[0][4]), Q4KH_OK);
	cr_assert_eq(e->b->rope_store(e->dev, &t[1][0], &t[1][1], &t[1][2], &pt, &p, &t[1][3],
	                              &t[1][4]),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	for (int i = 0; i < 5; i++) {
		unsigned char *want = fetch(e, &t[0][i]), *got = fetch(e, &t[1][i]);

		cr_expect_eq(memcmp(got, want, (size_t)t[0][i].nb[3]), 0,
		             "%s rope_store %s, caches %u/%u, mode %u, yarn %d, T %lld, hd_v %lld: "
		             "differs from the three ops'",
		             isa, names[i], kt, vt, mode, yarn, (long long)T, (long long)hd_v);
		free(want);
		free(got);
	}
	for (int s = 0; s < 2; s++)
		for (int i = 0; i < 5; i++)
			drop(e, &t[s][i]);
	drop(e, &pt);
	drop(e, &ft);
	free(q);
	free(k);
	free(v);
	free(kfill);
	free(vfill);
}

Test(cpu_fast, rope_store_is_rope_ext_rope_set_rows_and_set_rows)
{
	FOR_EACH_ISA(e) {
		for (int kt = 0; kt < 2; kt++)
			for (int vt = 0; vt < 2; vt++)
				for (int mode = 0; mode < 2; mode++)
					for (int yarn = 0; yarn < 2; yarn++)
						for (int shape = 0; shape < 2; shape++)
							rope_store_case(e, isas[isa_],
							                kt ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
							                vt ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
							                mode ? Q4KH_ROPE_NEOX : Q4KH_ROPE_NORM,
							                yarn, shape ? 1 : 4, shape ? 40 : 64);
	}
}

/* The fused entries refuse what their two ops refuse, and their own
 * aliasing: a broadcast or overlapping a, a position beyond the cache;
 * rope_store a position beyond either cache, a negative one, q on k. */
Test(cpu_fast, fused_entries_refuse_with_one_line)
{
	const int32_t pos[2] = { 1, 4 }, neg[2] = { 1, -2 };
	const struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 8, .mode = Q4KH_ROPE_NORM, .base = 10000.0f,
		.freq_scale = 1.0f, .attn_factor = 1.0f,
	};
	struct q4kh_tensor x, a, b, pt, ct, kc;
	struct env *e;

	e = env_open_default();
	x = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	a = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	b = tensor(e, Q4KH_TYPE_F32, 8, 1, 1, NULL);
	cr_expect_eq(e->b->add_rms_norm(e->dev, &x, &b, NULL, 1e-6f, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "add_rms_norm a: shape {8, 1, 1, 1}, expected {8, 2, 1, 1}");
	cr_expect_eq(e->b->add_rms_norm(e->dev, &x, &x, NULL, 1e-6f, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "add_rms_norm a (offset 0) overlaps x (offset 0) in one buffer");
	drop(e, &x);
	x = tensor(e, Q4KH_TYPE_F32, 8, 1, 2, NULL);
	pt = tensor(e, Q4KH_TYPE_I32, 2, 1, 1, pos);
	ct = tensor(e, Q4KH_TYPE_F16, 8, 1, 4, NULL);
	cr_expect_eq(e->b->rope_set_rows(e->dev, &x, &pt, &p, &ct), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "set_rows rows[1] = 4, expected 0 .. 3");
	drop(e, &a);
	drop(e, &b);
	a = tensor(e, Q4KH_TYPE_F32, 8, 1, 2, NULL);
	b = tensor(e, Q4KH_TYPE_F32, 8, 1, 2, NULL);
	kc = tensor(e, Q4KH_TYPE_F16, 8, 1, 8, NULL);
	cr_expect_eq(e->b->rope_store(e->dev, &x, &a, &b, &pt, &p, &kc, &ct), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "set_rows rows[1] = 4, expected 0 .. 3");
	cr_expect_eq(e->b->rope_store(e->dev, &x, &a, &b, &pt, &p, &ct, &kc), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "set_rows rows[1] = 4, expected 0 .. 3");
	cr_expect_eq(e->b->rope_store(e->dev, &x, &x, &b, &pt, &p, &kc, &kc), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "rope_store q (offset 0) overlaps rope_store k (offset 0) in one buffer");
	drop(e, &pt);
	pt = tensor(e, Q4KH_TYPE_I32, 2, 1, 1, neg);
	cr_expect_eq(e->b->rope_store(e->dev, &x, &a, &b, &pt, &p, &kc, &ct), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "rope_ext pos[1] = -2, expected 0 .. 2147483646");
	drop(e, &kc);
	drop(e, &x);
	drop(e, &a);
	drop(e, &b);
	drop(e, &pt);
	drop(e, &ct);
	env_close(e);
}

/*
 * U2 and U4 (docs/plugin-abi.md): positions out of range fail as the ops
 * a fused entry stands for, issued one after the other, each failing
 * alone. ROPE_STORE 0: rope_set_rows of k into a cache of K_ROWS rows,
 * against rope_ext then set_rows; 1: rope_store with caches of K_ROWS
 * and V_ROWS rows, against rope_ext of q, rope_ext and set_rows of k,
 * set_rows of v. POS {1, POS1}: one past a cache leaves that cache's
 * bytes, and only that cache's, as they were (q and k rotated, the other
 * cache written); a negative one writes nothing. LINE: the one line
 * (rope_store's: k's cache first, as the ops run).
 */
static void out_of_range_case(struct env *e, const char *isa, int rope_store, int32_t pos1,
                              int64_t k_rows, int64_t v_rows, const char *line)
{
	const int64_t hd = 16, T = 2, rows[5] = { T, T, T, k_rows, v_rows };
	const int64_t heads[5] = { 2, 1, 1, 1, 1 };
	const int32_t pos[2] = { 1, pos1 };
	const struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = 8, .mode = Q4KH_ROPE_NEOX, .base = 10000.0f,
		.freq_scale = 1.0f, .attn_factor = 1.0f,
	};
	static const char *const names[5] = { "q", "k", "v", "k_cache", "v_cache" };
	struct q4kh_tensor t[2][5], pt = tensor(e, Q4KH_TYPE_I32, T, 1, 1, pos); /* q k v kc vc */
	float *vals[5];
	q4kh_status st;

	for (int i = 0; i < 5; i++)
		vals[i] = randoms(hd * heads[i] * rows[i], 2.0);
	for (int s = 0; s < 2; s++)
		for (int i = 0; i < 5; i++)
			t[s][i] = tensor(e, i == 3 ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32, hd, heads[i],
			                 rows[i], vals[i]);
	/* the ops alone, each failing or not on its own */
	if (rope_store)
		(void)e->b->rope_ext(e->dev, &t[0][0], &pt, &p, &t[0][0]);
	(void)e->b->rope_ext(e->dev, &t[0][1], &pt, &p, &t[0][1]);
	(void)e->b->set_rows(e->dev, &t[0][1], &pt, &t[0][3]);
	if (rope_store)
		(void)e->b->set_rows(e->dev, &t[0][2], &pt, &t[0][4]);
	st = rope_store ? e->b->rope_store(e->dev, &t[1][0], &t[1][1], &t[1][2], &pt, &p,
	                                   &t[1][3], &t[1][4])
	                : e->b->rope_set_rows(e->dev, &t[1][1], &pt, &p, &t[1][3]);
	cr_expect_eq(st, Q4KH_ERR_INVALID, "%s %s pos[1] %d", isa,
	             rope_store ? "rope_store" : "rope_set_rows", pos1);
	cr_expect_str_eq(e->b->last_error(e->ctx), line);
	for (int i = 0; i < 5; i++) {
		unsigned char *want = fetch(e, &t[0][i]), *got = fetch(e, &t[1][i]);

		cr_expect_eq(memcmp(got, want, (size_t)t[0][i].nb[3]), 0,
		             "%s %s pos[1] %d, caches of %lld and %lld rows: %s differs from "
		             "the ops'",
		             isa, rope_store ? "rope_store" : "rope_set_rows", pos1,
		             (long long)k_rows, (long long)v_rows, names[i]);
		free(want);
		free(got);
	}
	for (int i = 0; i < 5; i++) {
		drop(e, &t[0][i]);
		drop(e, &t[1][i]);
		free(vals[i]);
	}
	drop(e, &pt);
}

Test(cpu_fast, fused_entries_rotate_before_a_position_past_the_cache_fails)
{
	static const char past_k[] = "set_rows rows[1] = 4, expected 0 .. 3";
	static const char past_v[] = "set_rows rows[1] = 4, expected 0 .. 2";
	static const char negative[] = "rope_ext pos[1] = -2, expected 0 .. 2147483646";

	FOR_EACH_ISA(e) {
		out_of_range_case(e, isas[isa_], 0, 4, 4, 8, past_k);
		out_of_range_case(e, isas[isa_], 0, -2, 4, 8, negative);
		out_of_range_case(e, isas[isa_], 1, 4, 4, 8, past_k);
		out_of_range_case(e, isas[isa_], 1, 4, 8, 3, past_v);
		out_of_range_case(e, isas[isa_], 1, 4, 4, 3, past_k);
		out_of_range_case(e, isas[isa_], 1, -2, 8, 8, negative);
	}
}

/*
 * top2 (ABI 1.4) of T columns of N values, each column of another kind
 * (from FIRST on), against the host's q4kh_top2, bit for bit; idx and val
 * in one buffer as the session places them, idx first, val's rows here
 * padded to 16 bytes.
 */
static void top2_case(struct env *e, const char *isa, int64_t n, int64_t T, int first)
{
	float *x = malloc(sizeof(float) * (size_t)(n * T));
	const char *kinds[16];
	struct q4kh_tensor xt, idx = { .type = Q4KH_TYPE_I32 }, val = { .type = Q4KH_TYPE_F32 };
	unsigned char *out;
	char what[160];

	cr_assert_not_null(x);
	for (int64_t t = 0; t < T; t++)
		kinds[t] = test_top2_column((first + (int)t) % TEST_TOP2_KINDS, x + t * n, n,
		                            (uint64_t)(n * 131 + t));
	xt = tensor(e, Q4KH_TYPE_F32, n, T, 1, x);
	cr_assert_eq(e->b->buffer_alloc(e->dev, (uint64_t)(20 * T), &idx.buffer), Q4KH_OK);
	idx.ne[0] = T;
	idx.ne[1] = idx.ne[2] = idx.ne[3] = 1;
	idx.nb[0] = 4;
	idx.nb[1] = idx.nb[2] = idx.nb[3] = 4 * T;
	val.buffer = idx.buffer;
	val.offset = (uint64_t)(4 * T);
	val.ne[0] = 2;
	val.ne[1] = T;
	val.ne[2] = val.ne[3] = 1;
	val.nb[0] = 4;
	val.nb[1] = 16;
	val.nb[2] = val.nb[3] = 16 * T;
	cr_assert_eq(e->b->top2(e->dev, &xt, &idx, &val), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	out = malloc((size_t)(20 * T));
	cr_assert_not_null(out);
	cr_assert_eq(e->b->buffer_download(e->dev, idx.buffer, 0, out, (uint64_t)(20 * T)),
	             Q4KH_OK);
	for (int64_t t = 0; t < T; t++) {
		int32_t i;

		memcpy(&i, out + 4 * t, sizeof(i));
		snprintf(what, sizeof(what), "%s top2 n %lld column %lld of %lld (%s)", isa,
		         (long long)n, (long long)t, (long long)T, kinds[t]);
		test_expect_top2(x + t * n, n, i, (const float *)(out + 4 * T + 16 * t), what);
	}
	drop(e, &xt);
	drop(e, &idx);
	free(out);
	free(x);
}

Test(cpu_fast, top2_is_the_hosts_pick)
{
	static const int64_t lens[] = { 1, 2, 3, 33, 4096, 151936 };

	FOR_EACH_ISA(e) {
		for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
			for (int k = 0; k < TEST_TOP2_KINDS; k++)
				top2_case(e, isas[isa_], lens[li], 1, k);
		top2_case(e, isas[isa_], 1, 16, 0);
		top2_case(e, isas[isa_], 1000, TEST_TOP2_KINDS, 0);
		top2_case(e, isas[isa_], 33, 16, 5);
	}
}

/* top2 refuses outputs that overlap x or each other, and wrong shapes. */
Test(cpu_fast, top2_refuses_with_one_line)
{
	struct q4kh_tensor x, o, idx, val;
	struct env *e;

	e = env_open_default();
	x = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	o = tensor(e, Q4KH_TYPE_F32, 6, 1, 1, NULL);
	idx = o;
	idx.type = Q4KH_TYPE_I32;
	idx.ne[0] = 2;
	val = o;
	val.ne[0] = 2;
	val.ne[1] = 2;
	val.nb[1] = 8;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 val (offset 0) overlaps idx (offset 0) in one buffer");
	val.offset = 12;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 val: view {2, 2, 1, 1} at offset 12 ends past its 24-byte buffer");
	val.ne[1] = 1;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 val: shape {2, 1, 1, 1}, expected {2, 2, 1, 1}");
	idx.ne[0] = 1;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 idx: shape {1, 1, 1, 1}, expected {2, 1, 1, 1}");
	val.ne[1] = 2;
	val.offset = 8;
	idx = x;
	idx.type = Q4KH_TYPE_I32;
	idx.ne[0] = 2;
	idx.ne[1] = 1;
	cr_expect_eq(e->b->top2(e->dev, &x, &idx, &val), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "top2 idx (offset 0) overlaps x (offset 0) in one buffer");
	drop(e, &x);
	drop(e, &o);
	env_close(e);
}
