/*
 * The reference cpu plugin's softmax attention (grouped queries, window,
 * soft cap, positions per query, over pages through a block table)
 * against float64, and the ops an attention layer feeds its cache with
 * (set_rows, rope_ext, get_rows_ext).
 * Shared set-up and the attention workload: tests/cpu_ops_helpers.h.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops_helpers.h"

/* --- attention ------------------------------------------------------------ */

Test(cpu_ops, attention_gqa_window_softcap)
{
	struct env *e = env_open("3");
	const struct attn_params_case {
		int32_t window;
		int64_t pos0;
		float softcap;
		uint32_t type;
	} cases[] = {
		{ 0, 6, 0.0f, Q4KH_TYPE_F32 }, { 4, 6, 0.0f, Q4KH_TYPE_F32 },
		{ 0, 0, 30.0f, Q4KH_TYPE_F16 }, { 3, 11, 0.0f, Q4KH_TYPE_F16 },
		{ 1, 2, 0.0f, Q4KH_TYPE_F32 },
	};

	rng_state = 31;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct attn_case c = {
			.hd = 64, .nh = 4, .nkv = 2, .T = 5, .n_ctx = 16,
			.p = { .struct_size = sizeof(struct q4kh_attn_params),
			       .window = cases[i].window, .pos0 = cases[i].pos0,
			       .scale = 0.125f, .softcap = cases[i].softcap },
			.kv_type = cases[i].type,
		};
		float *got;
		double *want;
		char what[64];

		run_attention(e, &c, &got, &want);
		snprintf(what, sizeof(what), "attention case %zu", i);
		expect_close(what, got, want, (size_t)(c.hd * c.nh * c.T), 1e-6, 1e-7);
		free(got);
		free(want);
	}
	env_close(e);
}

/*
 * The blocking's edges: three blocks of 16 query tokens, more keys than a
 * block of 64, three heads to a KV head (between register tiles), head
 * dimensions past the last 8.
 */
Test(cpu_ops, attention_blocks_and_tails)
{
	struct env *e = env_open("2");
	const int32_t windows[] = { 0, 50 };

	rng_state = 33;
	for (size_t i = 0; i < 2; i++) {
		struct attn_case c = {
			.hd = 20, .nh = 6, .nkv = 2, .T = 37, .n_ctx = 160,
			.p = { .struct_size = sizeof(struct q4kh_attn_params),
			       .window = windows[i], .pos0 = 100, .scale = 0.25f,
			       .softcap = i ? 20.0f : 0.0f },
			.kv_type = i ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
		};
		float *got;
		double *want;

		run_attention(e, &c, &got, &want);
		expect_close("attention blocks", got, want, (size_t)(c.hd * c.nh * c.T), 1e-6,
		             1e-7);
		free(got);
		free(want);
	}
	env_close(e);
}

/*
 * Bit for bit, the order of sums the plugin's header states (which
 * run_attention's reference follows), on inputs where another order
 * shows in float (cancel_pairs): Gemma 3's heads (256 dimensions, four
 * queries to a KV head) over more keys than a block of 64, and head
 * dimensions that end in vectors of four and a tail, with a window and a
 * soft cap. Each vector width of the plugin's tiles must give the same
 * bits; a tolerance would let another order through.
 */
Test(cpu_ops, attention_sums_in_its_stated_order)
{
	struct env *e = env_open("2");
	const struct attn_case cases[] = {
		{ .hd = 256, .nh = 4, .nkv = 1, .T = 19, .n_ctx = 120,
		  .p = { .struct_size = sizeof(struct q4kh_attn_params), .pos0 = 100,
		         .scale = 0.0625f },
		  .kv_type = Q4KH_TYPE_F32, .cancel = 1 },
		{ .hd = 44, .nh = 6, .nkv = 2, .T = 37, .n_ctx = 160,
		  .p = { .struct_size = sizeof(struct q4kh_attn_params), .window = 50,
		         .pos0 = 100, .scale = 0.25f, .softcap = 20.0f },
		  .kv_type = Q4KH_TYPE_F32, .cancel = 1 },
	};

	rng_state = 35;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct attn_case *c = &cases[i];
		float *got;
		double *want;

		run_attention(e, c, &got, &want);
		for (int64_t j = 0; j < c->hd * c->nh * c->T; j++)
			cr_assert(got[j] == (float)want[j],
			          "case %zu out[%lld] = %.9g, expected %.9g (the stated order)", i,
			          (long long)j, (double)got[j], (double)(float)want[j]);
		free(got);
		free(want);
	}
	env_close(e);
}

/* ABI 1.2: one position per query, in device memory, in any order. */
Test(cpu_ops, attention_ext_positions_per_query)
{
	struct env *e = env_open("2");
	static const int32_t pos[][5] = { { 9, 2, 15, 0, 7 }, { 4, 5, 6, 7, 8 } };

	rng_state = 37;
	for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++) {
		struct attn_case c = {
			.hd = 32, .nh = 4, .nkv = 1, .T = 5, .n_ctx = 16,
			.p = { .struct_size = sizeof(struct q4kh_attn_params),
			       .window = i ? 3 : 0, .pos0 = 1000, /* ignored */
			       .scale = 0.2f },
			.kv_type = i ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
			.pos = pos[i],
		};
		float *got;
		double *want;

		run_attention(e, &c, &got, &want);
		expect_close("attention_ext", got, want, (size_t)(c.hd * c.nh * c.T), 1e-6,
		             1e-7);
		free(got);
		free(want);
	}
	env_close(e);
}

/*
 * ABI 1.8: attention over pages gives the contiguous cache's bits (run_attention
 * asserts it) and the stated order's float64 sums. Block tables out of
 * order in pools with pages no table names (NaN, so that a read shows);
 * pages of 16 with the last half full (Gemma 3's heads, 8 pages), of 7
 * (key blocks of 64 straddle pages; 23 pages, a window and a soft cap), of
 * 1 (each key its own page, positions per query, f16) and of 64 (one page
 * holding less than a page).
 */
Test(cpu_ops, attention_paged_gives_the_contiguous_bits)
{
	struct env *e = env_open("2");
	static const int32_t table16[8] = { 9, 2, 7, 0, 10, 4, 1, 5 };
	static const int32_t table7[23] = { 22, 3, 17, 0, 25, 8, 13, 1, 29, 20, 6, 11,
		                            27, 2, 15, 9, 24, 4, 18, 12, 28, 7, 16 };
	static const int32_t table1[16] = { 19, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0 };
	static const int32_t table64[1] = { 2 };
	static const int32_t pos[5] = { 9, 2, 15, 0, 7 };
	const struct attn_case cases[] = {
		{ .hd = 256, .nh = 4, .nkv = 1, .T = 19, .n_ctx = 120,
		  .p = { .struct_size = sizeof(struct q4kh_attn_params), .pos0 = 100,
		         .scale = 0.0625f },
		  .kv_type = Q4KH_TYPE_F32, .cancel = 1,
		  .page_size = 16, .pool_pages = 11, .n_pages = 8, .pages = table16 },
		{ .hd = 44, .nh = 6, .nkv = 2, .T = 37, .n_ctx = 160,
		  .p = { .struct_size = sizeof(struct q4kh_attn_params), .window = 50,
		         .pos0 = 100, .scale = 0.25f, .softcap = 20.0f },
		  .kv_type = Q4KH_TYPE_F32, .cancel = 1,
		  .page_size = 7, .pool_pages = 30, .n_pages = 23, .pages = table7 },
		{ .hd = 32, .nh = 4, .nkv = 1, .T = 5, .n_ctx = 16,
		  .p = { .struct_size = sizeof(struct q4kh_attn_params), .window = 3,
		         .pos0 = 1000, .scale = 0.2f },
		  .kv_type = Q4KH_TYPE_F16, .pos = pos,
		  .page_size = 1, .pool_pages = 20, .n_pages = 16, .pages = table1 },
		{ .hd = 64, .nh = 4, .nkv = 2, .T = 5, .n_ctx = 16,
		  .p = { .struct_size = sizeof(struct q4kh_attn_params), .window = 4,
		         .pos0 = 11, .scale = 0.125f, .softcap = 30.0f },
		  .kv_type = Q4KH_TYPE_F16,
		  .page_size = 64, .pool_pages = 3, .n_pages = 1, .pages = table64 },
	};

	rng_state = 39;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct attn_case *c = &cases[i];
		const int64_t n = c->hd * c->nh * c->T;
		float *got;
		double *want;
		char what[64];

		run_attention(e, c, &got, &want);
		snprintf(what, sizeof(what), "attention_paged case %zu", i);
		if (c->cancel)
			for (int64_t j = 0; j < n; j++)
				cr_assert(got[j] == (float)want[j],
				          "case %zu out[%lld] = %.9g, expected %.9g (the stated order)",
				          i, (long long)j, (double)got[j], (double)(float)want[j]);
		else
			expect_close(what, got, want, (size_t)n, 1e-6, 1e-7);
		free(got);
		free(want);
	}
	env_close(e);
}

/* ABI 1.8: a page outside the pool, a position past the table, a page size
 * that does not divide the pools: refused with what was expected. */
Test(cpu_ops, attention_paged_refuses_what_its_table_cannot_hold)
{
	struct env *e = env_open("2");
	static const int32_t pos[2] = { 3, 8 }, pages[3] = { 1, 5, 0 }, far[2] = { 3, 12 };
	struct q4kh_attn_params p = { .struct_size = sizeof(p), .scale = 0.5f };
	struct q4kh_tensor q = f32_tensor(e, 8, 2, 2, NULL);
	struct q4kh_tensor k = make_tensor(e, Q4KH_TYPE_F16, 8, 1, 24, NULL, 0);
	struct q4kh_tensor v = make_tensor(e, Q4KH_TYPE_F16, 8, 1, 24, NULL, 0);
	struct q4kh_tensor out = f32_tensor(e, 8, 2, 2, NULL);
	struct q4kh_tensor pt = make_tensor(e, Q4KH_TYPE_I32, 2, 1, 1, pos, 0);
	struct q4kh_tensor ft = make_tensor(e, Q4KH_TYPE_I32, 2, 1, 1, far, 0);
	struct q4kh_tensor pg = make_tensor(e, Q4KH_TYPE_I32, 3, 1, 1, pages, 0);

	/* 24 slots in pages of 4: pages 0 .. 5 */
	expect_status(e, e->b->attention_paged(e->dev, &q, &k, &v, &pt, &pg, 5, &p, &out),
	              "attention_paged: page_size 5, expected >= 1 and dividing the pools' 24 slots");
	expect_status(e, e->b->attention_paged(e->dev, &q, &k, &v, &pt, &pg, 6, &p, &out),
	              "attention_paged pages[1] = 5, expected 0 .. 3");
	expect_status(e, e->b->attention_paged(e->dev, &q, &k, &v, &ft, &pg, 4, &p, &out),
	              "attention_paged pos[1] = 12, expected 0 .. 11");
	expect_status(e, e->b->attention_paged(e->dev, &q, &k, &v, &pt, &pg, 4, &p, &pg),
	              "attention out");
	drop(e, &q);
	drop(e, &k);
	drop(e, &v);
	drop(e, &out);
	drop(e, &pt);
	drop(e, &ft);
	drop(e, &pg);
	env_close(e);
}

/* ABI 1.2: the KV-cache write at rows from device memory, f32 to f16. */
Test(cpu_ops, set_rows_writes_exactly_the_rows_named)
{
	struct env *e = env_open("2");
	static const int32_t rows[3] = { 5, 1, 3 };
	float *src;
	uint16_t *got;
	struct q4kh_tensor s, r, d, bad;

	rng_state = 43;
	src = random_floats(8 * 2 * 3);
	s = f32_tensor(e, 8, 2, 3, src);
	r = make_tensor(e, Q4KH_TYPE_I32, 3, 1, 1, rows, 0);
	d = make_tensor(e, Q4KH_TYPE_F16, 8, 2, 6, NULL, 0);
	cr_assert_eq(e->b->set_rows(e->dev, &s, &r, &d), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = malloc(2 * 8 * 2 * 6);
	cr_assert_not_null(got);
	cr_assert_eq(e->b->buffer_download(e->dev, d.buffer, 0, got, 2 * 8 * 2 * 6), Q4KH_OK);
	for (int64_t j = 0; j < 6; j++) {
		int64_t t = j == 5 ? 0 : j == 1 ? 1 : j == 3 ? 2 : -1;

		for (int64_t i = 0; i < 16; i++) {
			uint16_t want = t < 0 ? 0xFFFF : ref_to_half(src[t * 16 + i]);

			cr_expect_eq(got[j * 16 + i], want, "row %lld value %lld: %04x, expected %04x",
			             (long long)j, (long long)i, got[j * 16 + i], want);
		}
	}
	bad = r;
	bad.ne[0] = 2;
	expect_status(e, e->b->set_rows(e->dev, &s, &bad, &d),
	              "set_rows rows: shape {2, 1, 1, 1}, expected {3, 1, 1, 1}");
	drop(e, &d);
	d = make_tensor(e, Q4KH_TYPE_F16, 8, 2, 5, NULL, 0);
	expect_status(e, e->b->set_rows(e->dev, &s, &r, &d),
	              "set_rows rows[0] = 5, expected 0 .. 4");
	free(src);
	free(got);
	drop(e, &s);
	drop(e, &r);
	drop(e, &d);
	env_close(e);
}

/* ABI 1.2: rope_ext and get_rows_ext read ids and positions from tensors
 * and give the 1.0 entries' bits. */
Test(cpu_ops, rope_ext_and_get_rows_ext_match_the_host_memory_forms)
{
	struct env *e = env_open("2");
	static const int32_t pos[3] = { 17, 3, 250 }, ids[2] = { 6, 2 };
	struct q4kh_rope_params rp = { .struct_size = sizeof(rp), .n_rot = 16,
		                       .mode = Q4KH_ROPE_NEOX, .base = 10000.0f,
		                       .freq_scale = 0.5f, .attn_factor = 1.0f };
	double *exact;
	float *x = random_floats(32 * 2 * 3), *a, *b;
	struct q4kh_tensor xt, o1, o2, pt, it, w;

	rng_state = 47;
	xt = f32_tensor(e, 32, 2, 3, x);
	o1 = f32_tensor(e, 32, 2, 3, NULL);
	o2 = f32_tensor(e, 32, 2, 3, NULL);
	pt = make_tensor(e, Q4KH_TYPE_I32, 3, 1, 1, pos, 0);
	cr_assert_eq(e->b->rope(e->dev, &xt, pos, 16, Q4KH_ROPE_NEOX, 10000.0f, 0.5f, &o1),
	             Q4KH_OK);
	cr_assert_eq(e->b->rope_ext(e->dev, &xt, &pt, &rp, &o2), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	a = fetch(e, &o1);
	b = fetch(e, &o2);
	cr_expect_eq(memcmp(a, b, sizeof(float) * 32 * 2 * 3), 0, "rope_ext differs from rope");
	free(a);
	free(b);
	expect_status(e, e->b->rope_ext(e->dev, &xt, &pt, NULL, &o2), "rope_ext: params NULL");

	w = make_weight(e, Q4KH_TYPE_Q4_K, 256, 8, &exact);
	it = make_tensor(e, Q4KH_TYPE_I32, 2, 1, 1, ids, 0);
	drop(e, &o1);
	drop(e, &o2);
	o1 = f32_tensor(e, 256, 2, 1, NULL);
	o2 = f32_tensor(e, 256, 2, 1, NULL);
	cr_assert_eq(e->b->get_rows(e->dev, &w, ids, 2, 0.5f, &o1), Q4KH_OK);
	cr_assert_eq(e->b->get_rows_ext(e->dev, &w, &it, 0.5f, &o2), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	a = fetch(e, &o1);
	b = fetch(e, &o2);
	cr_expect_eq(memcmp(a, b, sizeof(float) * 256 * 2), 0,
	             "get_rows_ext differs from get_rows");
	free(a);
	free(b);
	free(x);
	free(exact);
	drop(e, &xt);
	drop(e, &o1);
	drop(e, &o2);
	drop(e, &pt);
	drop(e, &it);
	drop(e, &w);
	env_close(e);
}
