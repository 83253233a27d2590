/*
 * The cuda backend's ABI 1.2 entries, whose per-step values (token ids,
 * positions, KV-cache rows) are I32 tensors in device memory, against the
 * reference cpu plugin (cuda_rig.h says how outputs are compared):
 * get_rows_ext, rope_ext with frequency factors and YaRN, set_rows into
 * f32 and f16 caches, attention_ext at the shapes of the models we serve
 * (the split form that decode takes, long contexts, windows), values out
 * of range reported at the next synchronisation, and a recorded step
 * replayed with rewritten positions; and the ABI 1.4 fused entries
 * add_rms_norm, rope_set_rows and rope_store, against the reference's
 * ops and bit for bit against the cuda backend's own ops; and top2, the
 * greedy pick, bit for bit against the host's q4kh_top2 (helpers.h's
 * columns), directly and replayed; and the ABI 1.8 attention_paged
 * against the reference's and bit for bit against the same queries over
 * a contiguous cache. Every test skips without a device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rig.h"
#include "helpers.h"

/* An I32 {n} tensor holding V on both sides. */
static struct twin twin_index(struct rig *r, const int32_t *v, int64_t n)
{
	return twin_new(r, Q4KH_TYPE_I32, n, 1, 1, 0, v);
}

/* Rewrite an I32 tensor's values on both sides. */
static void index_set(struct rig *r, const struct twin *t, const int32_t *v)
{
	for (int s = 0; s < 2; s++)
		cr_assert_eq(V(r, s)->buffer_upload(DEV(r, s), t->t[s].buffer,
		                                    t->t[s].offset, v,
		                                    sizeof(int32_t) * (size_t)t->t[s].ne[0]),
		             Q4KH_OK, "%s", ERR(r, s));
}

/* --- get_rows_ext ---------------------------------------------------------- */

Test(cuda_step, get_rows_ext_every_table_type)
{
	static const uint32_t types[] = { Q4KH_TYPE_F32, Q4KH_TYPE_F16,
		                          Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K,
		                          Q4KH_TYPE_Q8_0 };
	static const int32_t ids[5] = { 36, 0, 7, 7, 19 };
	struct rig *r = rig_open();

	rng_seed(41);
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		const int64_t k = 512, rows = 37;
		struct twin table = twin_weights(r, types[i], k, rows, 0);
		struct twin id = twin_index(r, ids, 5);
		struct twin out = twin_new(r, Q4KH_TYPE_F32, k, 5, 1, 12, NULL);
		char what[64];

		BOTH(r, get_rows_ext(DEV(r, s_), T(table), T(id), 0.75f, T(out)));
		snprintf(what, sizeof(what), "get_rows_ext %s",
		         q4kh_type_name(types[i]));
		expect_agree(r, what, &out, 0.0);
		twin_free(r, &table);
		twin_free(r, &id);
		twin_free(r, &out);
	}
	rig_close(r);
}

/* --- rope_ext -------------------------------------------------------------- */

Test(cuda_step, rope_ext_freq_factors_yarn_any_positions)
{
	static const int32_t pos[6] = { 5000, 0, 17, 3, 131071, 17 };
	struct rig *r = rig_open();

	rng_seed(42);
	for (int c = 0; c < 8; c++) {
		const int64_t hd = c & 1 ? 128 : 64, nh = 3;
		const int32_t n_rot = c & 2 ? (int32_t)hd : 32;
		float *xv = rvals((size_t)(hd * nh * 6));
		float *ffv = rvals((size_t)n_rot / 2);
		struct twin x = twin_f32(r, hd, nh, 6, xv);
		struct twin ps = twin_index(r, pos, 6);
		struct twin ff, out = twin_new(r, Q4KH_TYPE_F32, hd, nh, 6, 4, NULL);
		struct q4kh_rope_params p = {
			.struct_size = sizeof(p), .n_rot = n_rot,
			.mode = c & 4 ? Q4KH_ROPE_NEOX : Q4KH_ROPE_NORM,
			.base = 500000.0f, .freq_scale = c & 4 ? 0.25f : 1.0f,
			.ext_factor = c & 4 ? 1.0f : 0.0f, .attn_factor = 1.0f,
			.beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 8192,
		};
		char what[96];

		for (int i = 0; i < n_rot / 2; i++)
			ffv[i] = 1.0f + 7.0f * fabsf(ffv[i]); /* Llama 3.1's 1 .. 8 */
		ff = twin_f32(r, n_rot / 2, 1, 1, ffv);
		for (int s = 0; s < 2; s++) {
			p.freq_factors = c & 1 ? &ff.t[s] : NULL;
			cr_assert_eq(V(r, s)->rope_ext(DEV(r, s), &x.t[s], &ps.t[s], &p,
			                               &out.t[s]),
			             Q4KH_OK, "%s", ERR(r, s));
		}
		snprintf(what, sizeof(what), "rope_ext hd=%lld n_rot=%d %s%s",
		         (long long)hd, n_rot, c & 4 ? "NEOX, YaRN" : "NORM",
		         c & 1 ? ", frequency factors" : "");
		expect_agree(r, what, &out, NMSE_BOUND);
		twin_free(r, &x);
		twin_free(r, &ps);
		twin_free(r, &ff);
		twin_free(r, &out);
		free(xv);
		free(ffv);
	}
	rig_close(r);
}

/* --- set_rows -------------------------------------------------------------- */

Test(cuda_step, set_rows_into_f32_and_f16_caches)
{
	static const int32_t rows[4] = { 9, 0, 4, 5 };
	struct rig *r = rig_open();

	rng_seed(43);
	for (int f16 = 0; f16 < 2; f16++) {
		const uint32_t type = f16 ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32;
		float *sv = rvals(128 * 2 * 4);
		float *old = rvals(128 * 2 * 10);
		struct twin src = twin_f32(r, 128, 2, 4, sv);
		struct twin rs = twin_index(r, rows, 4);
		struct twin init = twin_f32(r, 128, 2, 10, old);
		struct twin dst = twin_new(r, type, 128, 2, 10, 0, NULL);

		/* Every row of the cache holds a value first: the rows not
		 * written must keep theirs. */
		BOTH(r, copy(DEV(r, s_), T(init), T(dst)));
		BOTH(r, set_rows(DEV(r, s_), T(src), T(rs), T(dst)));
		expect_agree(r, f16 ? "set_rows into F16" : "set_rows into F32", &dst,
		             0.0);
		twin_free(r, &src);
		twin_free(r, &rs);
		twin_free(r, &init);
		twin_free(r, &dst);
		free(sv);
		free(old);
	}
	rig_close(r);
}

/* --- attention_ext --------------------------------------------------------- */

struct ext_case {
	const char *name;
	int64_t hd, nh, nkv, n_ctx;
	int32_t window;
	uint32_t type;
	int64_t T;
	int32_t pos[9];
};

/* Caches filled at every row up to n_ctx (attention_ext reads only the
 * visible ones, which is what the positions test). */
static void check_attention_ext(struct rig *r, const struct ext_case *c)
{
	const size_t nq = (size_t)(c->hd * c->nh * c->T);
	const size_t nc = (size_t)(c->hd * c->nkv * c->n_ctx);
	float *qv = rvals(nq), *kv = rvals(nc), *vv = rvals(nc);
	struct twin q = twin_f32(r, c->hd, c->nh, c->T, qv);
	struct twin k32 = twin_f32(r, c->hd, c->nkv, c->n_ctx, kv);
	struct twin v32 = twin_f32(r, c->hd, c->nkv, c->n_ctx, vv);
	struct twin k = twin_new(r, c->type, c->hd, c->nkv, c->n_ctx, 0, NULL);
	struct twin v = twin_new(r, c->type, c->hd, c->nkv, c->n_ctx, 0, NULL);
	struct twin ps = twin_index(r, c->pos, c->T);
	struct twin out = twin_new(r, Q4KH_TYPE_F32, c->hd, c->nh, c->T, 8, NULL);
	struct q4kh_attn_params p = {
		.struct_size = sizeof(p), .window = c->window,
		.scale = (float)(1.0 / sqrt((double)c->hd)),
	};

	BOTH(r, copy(DEV(r, s_), T(k32), T(k)));
	BOTH(r, copy(DEV(r, s_), T(v32), T(v)));
	BOTH(r, attention_ext(DEV(r, s_), T(q), T(k), T(v), T(ps), &p, T(out)));
	expect_agree(r, c->name, &out, NMSE_BOUND);
	twin_free(r, &q);
	twin_free(r, &k32);
	twin_free(r, &v32);
	twin_free(r, &k);
	twin_free(r, &v);
	twin_free(r, &ps);
	twin_free(r, &out);
	free(qv);
	free(kv);
	free(vv);
}

Test(cuda_step, attention_ext_model_shapes_and_long_contexts)
{
	static const struct ext_case cases[] = {
		{ "Llama-3-8B decode at 4000", 128, 32, 8, 4096, 0, Q4KH_TYPE_F16, 1, { 4000 } },
		{ "Llama-3-8B decode at 0", 128, 32, 8, 4096, 0, Q4KH_TYPE_F16, 1, { 0 } },
		{ "Qwen2.5-1.5B decode at 2049", 128, 12, 2, 4096, 0, Q4KH_TYPE_F16, 1, { 2049 } },
		{ "Gemma 3 window 512 at 3000", 256, 4, 1, 3072, 512, Q4KH_TYPE_F16, 1, { 3000 } },
		{ "Gemma 3 global at 3000, F32", 256, 4, 1, 3072, 0, Q4KH_TYPE_F32, 1, { 3000 } },
		{ "four queries anywhere", 128, 8, 8, 1024, 0, Q4KH_TYPE_F16, 4, { 1000, 3, 517, 64 } },
		{ "eight queries, window 100", 64, 8, 1, 900, 100, Q4KH_TYPE_F16, 8,
		  { 899, 1, 2, 450, 451, 99, 100, 101 } },
		{ "nine queries: the prompt form", 128, 4, 2, 300, 0, Q4KH_TYPE_F16, 9,
		  { 10, 11, 12, 13, 200, 201, 202, 203, 299 } },
		{ "head dimension 96", 96, 6, 2, 700, 0, Q4KH_TYPE_F16, 2, { 650, 20 } },
	};
	struct rig *r = rig_open();

	rng_seed(44);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_attention_ext(r, &cases[i]);
	rig_close(r);
}

/* --- attention_paged (ABI 1.8) ---------------------------------------------- */

/*
 * Case C over pools of pages of PAGE tokens: the cache's rows scattered
 * through a block table that is a shuffle of the pools' pages (two more
 * than the table names, NaN in their rows and in the last page's rows
 * past n_ctx: read, they show). The cuda output against the reference's
 * attention_paged, and bit for bit against cuda's attention_ext over the
 * same rows in a contiguous cache (the same kernel, only the rows'
 * addresses differ).
 */
static void check_attention_paged(struct rig *r, const struct ext_case *c, int32_t page)
{
	const int64_t n_table = (c->n_ctx + page - 1) / page, n_pages = n_table + 2;
	const int64_t row = c->hd * c->nkv, slots = n_pages * page;
	const size_t nq = (size_t)(c->hd * c->nh * c->T), nc = (size_t)(row * c->n_ctx);
	float *qv = rvals(nq), *kv = rvals(nc), *vv = rvals(nc);
	float *kp = malloc(sizeof(float) * (size_t)(row * slots));
	float *vp = malloc(sizeof(float) * (size_t)(row * slots));
	int32_t *table = malloc(sizeof(int32_t) * (size_t)n_pages);
	struct twin q, kc, vc, k32, v32, k, v, ps, pg, out, flat;
	struct q4kh_attn_params p = {
		.struct_size = sizeof(p), .window = c->window,
		.scale = (float)(1.0 / sqrt((double)c->hd)),
	};
	double *got, *want;

	cr_assert(kp && vp && table);
	for (int64_t i = 0; i < n_pages; i++)
		table[i] = (int32_t)i;
	for (int64_t i = n_pages - 1; i > 0; i--) { /* Fisher-Yates */
		const int64_t j = irand(0, i);
		const int32_t t = table[i];

		table[i] = table[j];
		table[j] = t;
	}
	for (int64_t i = 0; i < row * slots; i++)
		kp[i] = vp[i] = NAN;
	for (int64_t j = 0; j < c->n_ctx; j++) {
		const int64_t s = (int64_t)table[j / page] * page + j % page;

		memcpy(kp + s * row, kv + j * row, sizeof(float) * (size_t)row);
		memcpy(vp + s * row, vv + j * row, sizeof(float) * (size_t)row);
	}
	q = twin_f32(r, c->hd, c->nh, c->T, qv);
	k32 = twin_f32(r, c->hd, c->nkv, slots, kp);
	v32 = twin_f32(r, c->hd, c->nkv, slots, vp);
	k = twin_new(r, c->type, c->hd, c->nkv, slots, 0, NULL);
	v = twin_new(r, c->type, c->hd, c->nkv, slots, 0, NULL);
	kc = twin_f32(r, c->hd, c->nkv, c->n_ctx, kv);
	vc = twin_f32(r, c->hd, c->nkv, c->n_ctx, vv);
	ps = twin_index(r, c->pos, c->T);
	pg = twin_index(r, table, n_table);
	out = twin_new(r, Q4KH_TYPE_F32, c->hd, c->nh, c->T, 8, NULL);
	flat = twin_new(r, Q4KH_TYPE_F32, c->hd, c->nh, c->T, 8, NULL);
	BOTH(r, copy(DEV(r, s_), T(k32), T(k)));
	BOTH(r, copy(DEV(r, s_), T(v32), T(v)));
	BOTH(r, attention_paged(DEV(r, s_), T(q), T(k), T(v), T(ps), T(pg), page, &p, T(out)));
	expect_agree(r, c->name, &out, NMSE_BOUND);
	/* the contiguous cache of the same type, on cuda */
	twin_free(r, &k);
	twin_free(r, &v);
	k = twin_new(r, c->type, c->hd, c->nkv, c->n_ctx, 0, NULL);
	v = twin_new(r, c->type, c->hd, c->nkv, c->n_ctx, 0, NULL);
	BOTH(r, copy(DEV(r, s_), T(kc), T(k)));
	BOTH(r, copy(DEV(r, s_), T(vc), T(v)));
	BOTH(r, attention_ext(DEV(r, s_), T(q), T(k), T(v), T(ps), &p, T(flat)));
	got = twin_values(r, &out, GPU);
	want = twin_values(r, &flat, GPU);
	for (size_t i = 0; i < nq; i++)
		cr_expect(!memcmp(&got[i], &want[i], sizeof(double)),
		          "%s, pages of %d: out[%zu] = %.9g over pages, %.9g contiguous", c->name,
		          page, i, got[i], want[i]);
	free(got);
	free(want);
	twin_free(r, &q);
	twin_free(r, &kc);
	twin_free(r, &vc);
	twin_free(r, &k32);
	twin_free(r, &v32);
	twin_free(r, &k);
	twin_free(r, &v);
	twin_free(r, &ps);
	twin_free(r, &pg);
	twin_free(r, &out);
	twin_free(r, &flat);
	free(qv);
	free(kv);
	free(vv);
	free(kp);
	free(vp);
	free(table);
}

/* Decode (the split form), a window, an F32 pool, several queries anywhere
 * and a prompt's (the tensor-core form on an F16 pool), pages of 16 (vLLM's)
 * and of 7 (key batches straddling pages, the last page part full). */
Test(cuda_step, attention_paged_model_shapes)
{
	static const struct ext_case cases[] = {
		{ "Llama-3-8B decode at 4000", 128, 32, 8, 4096, 0, Q4KH_TYPE_F16, 1, { 4000 } },
		{ "Gemma 3 window 512 at 3000", 256, 4, 1, 3072, 512, Q4KH_TYPE_F16, 1, { 3000 } },
		{ "Gemma 3 global at 3000, F32", 256, 4, 1, 3072, 0, Q4KH_TYPE_F32, 1, { 3000 } },
		{ "four queries anywhere", 128, 8, 8, 1024, 0, Q4KH_TYPE_F16, 4, { 1000, 3, 517, 64 } },
		{ "nine queries: the prompt form", 128, 4, 2, 300, 0, Q4KH_TYPE_F16, 9,
		  { 10, 11, 12, 13, 200, 201, 202, 203, 299 } },
		{ "head dimension 96", 96, 6, 2, 700, 0, Q4KH_TYPE_F16, 2, { 650, 20 } },
	};
	struct rig *r = rig_open();

	rng_seed(45);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		check_attention_paged(r, &cases[i], 16);
		check_attention_paged(r, &cases[i], 7);
	}
	rig_close(r);
}

/* --- values out of range ----------------------------------------------------- */

/* The op is enqueued; the next synchronisation reports NEEDLE, once. */
static void expect_fault(struct rig *r, q4kh_status enqueued, const char *needle)
{
	const struct q4kh_backend_v1 *b = V(r, GPU);
	q4kh_status st;

	cr_assert_eq(enqueued, Q4KH_OK, "the op itself: %s", ERR(r, GPU));
	st = b->synchronize(DEV(r, GPU));
	cr_assert_eq(st, Q4KH_ERR_INVALID, "synchronize after a bad index: %d", st);
	cr_assert(strstr(ERR(r, GPU), needle), "\"%s\" lacks \"%s\"", ERR(r, GPU),
	          needle);
	cr_assert_eq(b->synchronize(DEV(r, GPU)), Q4KH_OK,
	             "the fault is reported once: %s", ERR(r, GPU));
}

#define G(tw) (&(tw).t[GPU])

Test(cuda_step, index_values_out_of_range_fail_at_the_next_synchronisation)
{
	static const int32_t bad_ids[3] = { 1, 37, 2 };
	static const int32_t bad_rows[2] = { 3, -1 };
	static const int32_t bad_pos[1] = { 64 };
	static const int32_t far_rows[2] = { 3, 64 };
	static const int32_t mid_rows[2] = { 3, 40 };
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	q4kh_device_ctx *dev = DEV(r, GPU);
	struct twin table = twin_new(r, Q4KH_TYPE_F32, 64, 37, 1, 0, NULL);
	struct twin ids = twin_index(r, bad_ids, 3);
	struct twin rows = twin_index(r, bad_rows, 2);
	struct twin ps = twin_index(r, bad_pos, 1);
	struct twin out = twin_new(r, Q4KH_TYPE_F32, 64, 3, 1, 0, NULL);
	struct twin src = twin_new(r, Q4KH_TYPE_F32, 64, 1, 2, 0, NULL);
	struct twin cache = twin_new(r, Q4KH_TYPE_F16, 64, 1, 64, 0, NULL);
	struct twin q = twin_new(r, Q4KH_TYPE_F32, 64, 1, 1, 0, NULL);
	struct twin o1 = twin_new(r, Q4KH_TYPE_F32, 64, 1, 1, 0, NULL);
	struct twin far = twin_index(r, far_rows, 2);
	struct twin mid = twin_index(r, mid_rows, 2);
	struct twin sq = twin_new(r, Q4KH_TYPE_F32, 64, 2, 2, 0, NULL);
	struct twin sv = twin_new(r, Q4KH_TYPE_F32, 64, 1, 2, 0, NULL);
	struct twin small = twin_new(r, Q4KH_TYPE_F32, 64, 1, 32, 0, NULL);
	struct q4kh_attn_params ap = { .struct_size = sizeof(ap), .scale = 0.125f };
	const struct q4kh_rope_params rp = {
		.struct_size = sizeof(rp), .n_rot = 64, .mode = Q4KH_ROPE_NEOX,
		.base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f,
	};

	expect_fault(r, b->get_rows_ext(dev, G(table), G(ids), 1.0f, G(out)),
	             "get_rows_ext ids[1] = 37, expected 0 .. 36");
	expect_fault(r, b->set_rows(dev, G(src), G(rows), G(cache)),
	             "set_rows rows[1] = -1, expected 0 .. 63");
	expect_fault(r, b->attention_ext(dev, G(q), G(cache), G(cache), G(ps), &ap,
	                                 G(o1)),
	             "attention_ext pos[0] = 64, expected 0 .. 63");
	/* attention_paged: a position past its table of 3 pages of 16, then a
	 * table entry past the pools' 4 pages that the query reads */
	{
		static const int32_t pages[3] = { 1, 3, 9 }, at40[1] = { 40 };
		struct twin pg = twin_index(r, pages, 3), p40 = twin_index(r, at40, 1);

		expect_fault(r, b->attention_paged(dev, G(q), G(cache), G(cache), G(ps), G(pg), 16,
		                                   &ap, G(o1)),
		             "attention_ext pos[0] = 64, expected 0 .. 47");
		expect_fault(r, b->attention_paged(dev, G(q), G(cache), G(cache), G(p40), G(pg), 16,
		                                   &ap, G(o1)),
		             "attention_paged pages[2] = 9, expected 0 .. 3");
		twin_free(r, &pg);
		twin_free(r, &p40);
	}
	/* rope_set_rows checks its positions as rope_ext and set_rows do */
	expect_fault(r, b->rope_set_rows(dev, G(src), G(rows), &rp, G(cache)),
	             "rope_ext pos[1] = -1");
	expect_fault(r, b->rope_set_rows(dev, G(src), G(far), &rp, G(cache)),
	             "set_rows rows[1] = 64, expected 0 .. 63");
	/* rope_store as rope_ext and the two set_rows do, whichever cache a
	 * position misses */
	expect_fault(r, b->rope_store(dev, G(sq), G(src), G(sv), G(rows), &rp, G(cache),
	                              G(small)),
	             "rope_ext pos[1] = -1");
	expect_fault(r, b->rope_store(dev, G(sq), G(src), G(sv), G(mid), &rp, G(small),
	                              G(cache)),
	             "set_rows rows[1] = 40, expected 0 .. 31");
	expect_fault(r, b->rope_store(dev, G(sq), G(src), G(sv), G(mid), &rp, G(cache),
	                              G(small)),
	             "set_rows rows[1] = 40, expected 0 .. 31");
	/* A download reports it too (the host's logits are its sync point). */
	cr_assert_eq(b->get_rows_ext(dev, G(table), G(ids), 1.0f, G(out)), Q4KH_OK);
	{
		float f[64];

		cr_assert_eq(b->buffer_download(dev, out.t[GPU].buffer, POISON_LEAD, f,
		                                sizeof(f)),
		             Q4KH_ERR_INVALID);
		cr_assert(strstr(ERR(r, GPU), "get_rows_ext ids[1] = 37"), "%s",
		          ERR(r, GPU));
	}
	twin_free(r, &table);
	twin_free(r, &ids);
	twin_free(r, &rows);
	twin_free(r, &ps);
	twin_free(r, &far);
	twin_free(r, &mid);
	twin_free(r, &sq);
	twin_free(r, &sv);
	twin_free(r, &small);
	twin_free(r, &out);
	twin_free(r, &src);
	twin_free(r, &cache);
	twin_free(r, &q);
	twin_free(r, &o1);
	rig_close(r);
}

/* --- add_rms_norm, rope_set_rows, rope_store (ABI 1.4) ----------------------- */

/* The whole buffer of T's cuda side (poison lead and guard included);
 * free() it. */
static uint8_t *gpu_bytes(struct rig *r, const struct twin *t)
{
	uint8_t *raw = malloc((size_t)t->size);

	cr_assert_not_null(raw);
	cr_assert_eq(V(r, GPU)->buffer_download(DEV(r, GPU), t->t[GPU].buffer, 0, raw,
	                                        t->size),
	             Q4KH_OK, "%s", ERR(r, GPU));
	return raw;
}

/* The cuda sides of A and B hold the same bytes, view and poison alike. */
static void expect_same_gpu_bytes(struct rig *r, const char *what, const struct twin *a,
                                  const struct twin *b)
{
	uint8_t *ra = gpu_bytes(r, a), *rb = gpu_bytes(r, b);

	cr_assert_eq(a->size, b->size);
	cr_expect_eq(memcmp(ra, rb, (size_t)a->size), 0,
	             "%s: the fused entry's bytes differ from its two ops'", what);
	free(ra);
	free(rb);
}

/* One add_rms_norm case: rows of n values, out apart (0), x (1) or a (2). */
struct arn_case {
	int64_t n, rows;
	int with_w, out_at;
};

/*
 * Case C of add_rms_norm (x += a, then out = rmsnorm(x) w), or with
 * NORM_A of norm_add_rms_norm (a = rmsnorm(a) wa first): the cpu runs the
 * ops one by one, the cuda side the one fused kernel, and a second set of
 * cuda tensors the cuda ops one by one, which the fused kernel must match
 * bit for bit (x, a and out).
 */
static void check_norm_case(struct rig *r, const struct arn_case *c, int norm_a)
{
	const size_t nv = (size_t)(c->n * c->rows);
	float *xv = rvals(nv), *av = rvals(nv), *wv = rvals((size_t)c->n),
	      *wav = rvals((size_t)c->n);
	struct twin x = twin_f32(r, c->n, c->rows, 1, xv);
	struct twin a = twin_new(r, Q4KH_TYPE_F32, c->n, c->rows, 1, 8, av);
	struct twin w = twin_f32(r, c->n, 1, 1, wv);
	struct twin wa = twin_f32(r, c->n, 1, 1, wav);
	struct twin o = twin_new(r, Q4KH_TYPE_F32, c->n, c->rows, 1, 16, NULL);
	struct twin x2 = twin_f32(r, c->n, c->rows, 1, xv);
	struct twin a2 = twin_new(r, Q4KH_TYPE_F32, c->n, c->rows, 1, 8, av);
	struct twin o2 = twin_new(r, Q4KH_TYPE_F32, c->n, c->rows, 1, 16, NULL);
	struct twin *out = c->out_at == 1 ? &x : c->out_at == 2 ? &a : &o;
	struct twin *out2 = c->out_at == 1 ? &x2 : c->out_at == 2 ? &a2 : &o2;
	const struct q4kh_tensor *wr = c->with_w ? &w.t[REF] : NULL;
	const struct q4kh_tensor *wg = c->with_w ? &w.t[GPU] : NULL;
	const struct q4kh_tensor *war = c->with_w ? &wa.t[REF] : NULL;
	const struct q4kh_tensor *wag = c->with_w ? &wa.t[GPU] : NULL;
	const char *op = norm_a ? "norm_add_rms_norm" : "add_rms_norm";
	char what[96];

	if (norm_a) {
		cr_assert_eq(V(r, REF)->rms_norm(DEV(r, REF), &a.t[REF], war, 1e-5f, &a.t[REF]),
		             Q4KH_OK, "%s", ERR(r, REF));
		cr_assert_eq(V(r, GPU)->rms_norm(DEV(r, GPU), &a2.t[GPU], wag, 1e-5f, &a2.t[GPU]),
		             Q4KH_OK, "%s", ERR(r, GPU));
		cr_assert_eq(V(r, GPU)->norm_add_rms_norm(DEV(r, GPU), &x.t[GPU], &a.t[GPU], wag,
		                                          1e-5f, wg, 1e-6f, &out->t[GPU]),
		             Q4KH_OK, "%s", ERR(r, GPU));
	} else {
		cr_assert_eq(V(r, GPU)->add_rms_norm(DEV(r, GPU), &x.t[GPU], &a.t[GPU], wg,
		                                     1e-6f, &out->t[GPU]),
		             Q4KH_OK, "%s", ERR(r, GPU));
	}
	cr_assert_eq(V(r, REF)->add(DEV(r, REF), &x.t[REF], &a.t[REF], &x.t[REF]),
	             Q4KH_OK, "%s", ERR(r, REF));
	cr_assert_eq(V(r, REF)->rms_norm(DEV(r, REF), &x.t[REF], wr, 1e-6f, &out->t[REF]),
	             Q4KH_OK, "%s", ERR(r, REF));
	cr_assert_eq(V(r, GPU)->add(DEV(r, GPU), &x2.t[GPU], &a2.t[GPU], &x2.t[GPU]),
	             Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(V(r, GPU)->rms_norm(DEV(r, GPU), &x2.t[GPU], wg, 1e-6f, &out2->t[GPU]),
	             Q4KH_OK, "%s", ERR(r, GPU));
	snprintf(what, sizeof(what), "%s n=%lld rows=%lld w=%d out=%d", op, (long long)c->n,
	         (long long)c->rows, c->with_w, c->out_at);
	if (c->out_at != 1) /* the sum, rounded once (of a normed value: close) */
		expect_agree(r, what, &x, norm_a ? NMSE_BOUND : 0.0);
	expect_agree(r, what, out, NMSE_BOUND);
	expect_same_gpu_bytes(r, what, &x, &x2);
	expect_same_gpu_bytes(r, what, &a, &a2);
	expect_same_gpu_bytes(r, what, out, out2);
	twin_free(r, &x);
	twin_free(r, &a);
	twin_free(r, &w);
	twin_free(r, &wa);
	twin_free(r, &o);
	twin_free(r, &x2);
	twin_free(r, &a2);
	twin_free(r, &o2);
	free(xv);
	free(av);
	free(wv);
	free(wav);
}

Test(cuda_step, add_rms_norm_is_add_then_rms_norm)
{
	static const struct arn_case cases[] = {
		{ 4096, 1, 1, 0 }, /* Llama-3-8B decode */
		{ 1536, 7, 1, 1 }, /* Qwen2.5-1.5B prompt, out = x */
		{ 5000, 3, 1, 2 }, /* past the values a thread holds, out = a */
		{ 37, 5, 0, 0 },   /* short rows, no weight */
	};
	struct rig *r = rig_open();

	rng_seed(46);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_norm_case(r, &cases[i], 0);
	rig_close(r);
}

/* ABI 1.5: a block's output norm, the residual add and the next norm. */
Test(cuda_step, norm_add_rms_norm_is_rms_norm_add_rms_norm)
{
	static const struct arn_case cases[] = {
		{ 640, 1, 1, 0 },  /* Gemma 3 270M decode */
		{ 640, 9, 1, 1 },  /* a prompt, out = x */
		{ 5000, 3, 1, 2 }, /* past the values a thread holds, out = a */
		{ 37, 5, 0, 0 },   /* short rows, no weights */
	};
	struct rig *r = rig_open();

	rng_seed(47);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_norm_case(r, &cases[i], 1);
	rig_close(r);
}

/*
 * The rope of the fused-entry cases in *P: N_ROT of MODE at base 500000,
 * YaRN (a quarter of the frequencies) when YARN; returned, n_rot / 2
 * frequency factors in [1, 8), which each side's p.freq_factors names
 * where a case has them (without YaRN).
 */
static struct twin case_rope(struct rig *r, int32_t n_rot, uint32_t mode, int yarn,
                             struct q4kh_rope_params *p)
{
	float *ffv = rvals((size_t)n_rot / 2);
	struct twin ff;

	*p = (struct q4kh_rope_params){
		.struct_size = sizeof(*p), .n_rot = n_rot, .mode = mode,
		.base = 500000.0f, .freq_scale = yarn ? 0.25f : 1.0f,
		.ext_factor = yarn ? 1.0f : 0.0f, .attn_factor = 1.0f,
		.beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 8192,
	};
	for (int j = 0; j < n_rot / 2; j++)
		ffv[j] = 1.0f + 7.0f * fabsf(ffv[j]);
	ff = twin_f32(r, n_rot / 2, 1, 1, ffv);
	free(ffv);
	return ff;
}

/* One rope_set_rows case: keys {hd, nkv, T} at POS into a cache of TYPE. */
struct rsr_case {
	const char *name;
	int64_t hd, nkv, n_ctx;
	int32_t n_rot;
	uint32_t mode, type;
	int yarn;
	int64_t T;
	int32_t pos[5];
};

/*
 * The keys rotated and written to the cache: the cpu runs rope_ext then
 * set_rows, the cuda side the one kernel of rope_set_rows, and a second
 * set of cuda tensors the two cuda ops, matched bit for bit. The cache is
 * filled first: rows not written keep their values.
 */
Test(cuda_step, rope_set_rows_is_rope_ext_then_set_rows)
{
	static const struct rsr_case cases[] = {
		{ "Llama-3-8B decode, frequency factors", 128, 8, 1024, 128, Q4KH_ROPE_NORM,
		  Q4KH_TYPE_F16, 0, 1, { 700 } },
		{ "Qwen2.5 decode, YaRN", 128, 2, 1024, 128, Q4KH_ROPE_NEOX, Q4KH_TYPE_F16, 1, 1,
		  { 1023 } },
		{ "a prompt into F32, partial rotation", 64, 4, 64, 32, Q4KH_ROPE_NEOX,
		  Q4KH_TYPE_F32, 0, 5, { 0, 1, 2, 3, 4 } },
		{ "positions anywhere, F16", 256, 1, 300, 256, Q4KH_ROPE_NORM, Q4KH_TYPE_F16, 1, 3,
		  { 299, 7, 150 } },
	};
	struct rig *r = rig_open();

	rng_seed(47);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct rsr_case *c = &cases[i];
		const size_t nx = (size_t)(c->hd * c->nkv * c->T);
		const size_t nc = (size_t)(c->hd * c->nkv * c->n_ctx);
		float *xv = rvals(nx), *old = rvals(nc);
		struct twin x = twin_f32(r, c->hd, c->nkv, c->T, xv);
		struct twin x2 = twin_f32(r, c->hd, c->nkv, c->T, xv);
		struct twin ps = twin_index(r, c->pos, c->T);
		struct twin init = twin_f32(r, c->hd, c->nkv, c->n_ctx, old);
		struct twin kc = twin_new(r, c->type, c->hd, c->nkv, c->n_ctx, 0, NULL);
		struct twin kc2 = twin_new(r, c->type, c->hd, c->nkv, c->n_ctx, 0, NULL);
		struct q4kh_rope_params p;
		struct twin ff = case_rope(r, c->n_rot, c->mode, c->yarn, &p);

		BOTH(r, copy(DEV(r, s_), T(init), T(kc)));
		BOTH(r, copy(DEV(r, s_), T(init), T(kc2)));
		for (int s = 0; s < 2; s++) {
			p.freq_factors = c->yarn ? NULL : &ff.t[s];
			if (s == REF) {
				cr_assert_eq(V(r, s)->rope_ext(DEV(r, s), &x.t[s], &ps.t[s], &p,
				                               &x.t[s]),
				             Q4KH_OK, "%s", ERR(r, s));
				cr_assert_eq(V(r, s)->set_rows(DEV(r, s), &x.t[s], &ps.t[s], &kc.t[s]),
				             Q4KH_OK, "%s", ERR(r, s));
				continue;
			}
			cr_assert_eq(V(r, s)->rope_set_rows(DEV(r, s), &x.t[s], &ps.t[s], &p,
			                                    &kc.t[s]),
			             Q4KH_OK, "%s", ERR(r, s));
			cr_assert_eq(V(r, s)->rope_ext(DEV(r, s), &x2.t[s], &ps.t[s], &p, &x2.t[s]),
			             Q4KH_OK, "%s", ERR(r, s));
			cr_assert_eq(V(r, s)->set_rows(DEV(r, s), &x2.t[s], &ps.t[s], &kc2.t[s]),
			             Q4KH_OK, "%s", ERR(r, s));
		}
		expect_agree(r, c->name, &x, NMSE_BOUND);
		expect_agree(r, c->name, &kc, NMSE_BOUND);
		expect_same_gpu_bytes(r, c->name, &x, &x2);
		expect_same_gpu_bytes(r, c->name, &kc, &kc2);
		twin_free(r, &x);
		twin_free(r, &x2);
		twin_free(r, &ps);
		twin_free(r, &init);
		twin_free(r, &kc);
		twin_free(r, &kc2);
		twin_free(r, &ff);
		free(xv);
		free(old);
	}
	rig_close(r);
}

/* One rope_store case: q {hd, nq, T}, k {hd, nkv, T}, v {hd_v, nkv, T}
 * at POS into caches of KTYPE and VTYPE. */
struct rs_case {
	const char *name;
	int64_t hd, hd_v, nq, nkv, n_ctx;
	int32_t n_rot;
	uint32_t mode, ktype, vtype;
	int yarn;
	int64_t T;
	int32_t pos[5];
};

/*
 * An attention layer's inputs: the cpu runs rope_ext of q, rope_ext and
 * set_rows of k and set_rows of v, the cuda side the one kernel of
 * rope_store, and a second set of cuda tensors the cuda backend's own
 * four ops, matched bit for bit. The caches are filled first: rows not
 * written keep their values.
 */
Test(cuda_step, rope_store_is_rope_ext_rope_set_rows_and_set_rows)
{
	static const struct rs_case cases[] = {
		{ "Llama-3-8B decode, frequency factors", 128, 128, 32, 8, 1024, 128,
		  Q4KH_ROPE_NORM, Q4KH_TYPE_F16, Q4KH_TYPE_F16, 0, 1, { 700 } },
		{ "Qwen2.5-1.5B decode, YaRN", 128, 128, 12, 2, 1024, 128, Q4KH_ROPE_NEOX,
		  Q4KH_TYPE_F16, Q4KH_TYPE_F16, 1, 1, { 1023 } },
		{ "a prompt into F32, partial rotation", 64, 64, 8, 4, 64, 32, Q4KH_ROPE_NEOX,
		  Q4KH_TYPE_F32, Q4KH_TYPE_F32, 0, 5, { 0, 1, 2, 3, 4 } },
		{ "positions anywhere, F16 keys, F32 values of another width", 256, 96, 4, 1,
		  300, 256, Q4KH_ROPE_NORM, Q4KH_TYPE_F16, Q4KH_TYPE_F32, 1, 3,
		  { 299, 7, 150 } },
		{ "F32 keys, F16 values, one KV head per query head", 64, 64, 3, 3, 40, 64,
		  Q4KH_ROPE_NORM, Q4KH_TYPE_F32, Q4KH_TYPE_F16, 0, 2, { 39, 12 } },
	};
	struct rig *r = rig_open();

	rng_seed(48);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct rs_case *c = &cases[i];
		const size_t nq = (size_t)(c->hd * c->nq * c->T);
		const size_t nk = (size_t)(c->hd * c->nkv * c->T);
		const size_t nv = (size_t)(c->hd_v * c->nkv * c->T);
		float *qv = rvals(nq), *kv = rvals(nk), *vv = rvals(nv);
		float *kold = rvals((size_t)(c->hd * c->nkv * c->n_ctx));
		float *vold = rvals((size_t)(c->hd_v * c->nkv * c->n_ctx));
		struct twin q = twin_f32(r, c->hd, c->nq, c->T, qv);
		struct twin q2 = twin_f32(r, c->hd, c->nq, c->T, qv);
		struct twin k = twin_f32(r, c->hd, c->nkv, c->T, kv);
		struct twin k2 = twin_f32(r, c->hd, c->nkv, c->T, kv);
		struct twin v = twin_f32(r, c->hd_v, c->nkv, c->T, vv);
		struct twin ps = twin_index(r, c->pos, c->T);
		struct twin kinit = twin_f32(r, c->hd, c->nkv, c->n_ctx, kold);
		struct twin vinit = twin_f32(r, c->hd_v, c->nkv, c->n_ctx, vold);
		struct twin kc = twin_new(r, c->ktype, c->hd, c->nkv, c->n_ctx, 0, NULL);
		struct twin kc2 = twin_new(r, c->ktype, c->hd, c->nkv, c->n_ctx, 0, NULL);
		struct twin vc = twin_new(r, c->vtype, c->hd_v, c->nkv, c->n_ctx, 0, NULL);
		struct twin vc2 = twin_new(r, c->vtype, c->hd_v, c->nkv, c->n_ctx, 0, NULL);
		struct q4kh_rope_params p;
		struct twin ff = case_rope(r, c->n_rot, c->mode, c->yarn, &p);

		BOTH(r, copy(DEV(r, s_), T(kinit), T(kc)));
		BOTH(r, copy(DEV(r, s_), T(kinit), T(kc2)));
		BOTH(r, copy(DEV(r, s_), T(vinit), T(vc)));
		BOTH(r, copy(DEV(r, s_), T(vinit), T(vc2)));
		for (int s = 0; s < 2; s++) {
			const struct q4kh_backend_v1 *b = V(r, s);
			q4kh_device_ctx *dev = DEV(r, s);
			/* the cpu's four ops into the compared set, cuda's into
			 * the second */
			struct twin *qs = s == REF ? &q : &q2, *ks = s == REF ? &k : &k2;
			struct twin *kcs = s == REF ? &kc : &kc2, *vcs = s == REF ? &vc : &vc2;

			p.freq_factors = c->yarn ? NULL : &ff.t[s];
			cr_assert_eq(b->rope_ext(dev, &qs->t[s], &ps.t[s], &p, &qs->t[s]), Q4KH_OK,
			             "%s", ERR(r, s));
			cr_assert_eq(b->rope_ext(dev, &ks->t[s], &ps.t[s], &p, &ks->t[s]), Q4KH_OK,
			             "%s", ERR(r, s));
			cr_assert_eq(b->set_rows(dev, &ks->t[s], &ps.t[s], &kcs->t[s]), Q4KH_OK,
			             "%s", ERR(r, s));
			cr_assert_eq(b->set_rows(dev, &v.t[s], &ps.t[s], &vcs->t[s]), Q4KH_OK,
			             "%s", ERR(r, s));
			if (s == GPU)
				cr_assert_eq(b->rope_store(dev, &q.t[s], &k.t[s], &v.t[s], &ps.t[s],
				                           &p, &kc.t[s], &vc.t[s]),
				             Q4KH_OK, "%s", ERR(r, s));
		}
		expect_agree(r, c->name, &q, NMSE_BOUND);
		expect_agree(r, c->name, &k, NMSE_BOUND);
		expect_agree(r, c->name, &kc, NMSE_BOUND);
		expect_agree(r, c->name, &vc, 0.0); /* v rounded once, as set_rows does */
		expect_same_gpu_bytes(r, c->name, &q, &q2);
		expect_same_gpu_bytes(r, c->name, &k, &k2);
		expect_same_gpu_bytes(r, c->name, &kc, &kc2);
		expect_same_gpu_bytes(r, c->name, &vc, &vc2);
		twin_free(r, &q);
		twin_free(r, &q2);
		twin_free(r, &k);
		twin_free(r, &k2);
		twin_free(r, &v);
		twin_free(r, &ps);
		twin_free(r, &kinit);
		twin_free(r, &vinit);
		twin_free(r, &kc);
		twin_free(r, &kc2);
		twin_free(r, &vc);
		twin_free(r, &vc2);
		twin_free(r, &ff);
		free(qv);
		free(kv);
		free(vv);
		free(kold);
		free(vold);
	}
	rig_close(r);
}

/* --- a recorded step, replayed ------------------------------------------------ */

/* The operands of the decode step's attention half. */
struct half_step {
	struct twin kc, vc, ps, q, kn, vn, out;
	struct q4kh_rope_params rp;
	struct q4kh_attn_params ap;
};

/* Issue the half step on side S: the new key and value rotated and
 * written at row pos, q rotated at pos, attention up to pos. */
static void issue_half_step(struct rig *r, int s, struct half_step *h)
{
	const struct q4kh_backend_v1 *b = V(r, s);
	q4kh_device_ctx *dev = DEV(r, s);

	cr_assert_eq(b->rope_ext(dev, &h->q.t[s], &h->ps.t[s], &h->rp, &h->q.t[s]),
	             Q4KH_OK, "%s", ERR(r, s));
	cr_assert_eq(b->rope_ext(dev, &h->kn.t[s], &h->ps.t[s], &h->rp, &h->kn.t[s]),
	             Q4KH_OK, "%s", ERR(r, s));
	cr_assert_eq(b->set_rows(dev, &h->kn.t[s], &h->ps.t[s], &h->kc.t[s]), Q4KH_OK,
	             "%s", ERR(r, s));
	cr_assert_eq(b->set_rows(dev, &h->vn.t[s], &h->ps.t[s], &h->vc.t[s]), Q4KH_OK,
	             "%s", ERR(r, s));
	cr_assert_eq(b->attention_ext(dev, &h->q.t[s], &h->kc.t[s], &h->vc.t[s],
	                              &h->ps.t[s], &h->ap, &h->out.t[s]),
	             Q4KH_OK, "%s", ERR(r, s));
}

/* Fresh random values of T's {ne0, ne1} f32 view on both sides. */
static void refill(struct rig *r, const struct twin *t)
{
	const size_t n = (size_t)(t->t[0].ne[0] * t->t[0].ne[1]);
	float *v = rvals(n);

	for (int s = 0; s < 2; s++)
		cr_assert_eq(V(r, s)->buffer_upload(DEV(r, s), t->t[s].buffer,
		                                    t->t[s].offset, v, sizeof(float) * n),
		             Q4KH_OK, "%s", ERR(r, s));
	free(v);
}

/*
 * The decode step's attention half, as the host's step graph issues it:
 * run once op by op on both sides, then recorded on the cuda side and
 * replayed for positions the recording never saw, each time after only
 * the position tensor (and the step's inputs) were rewritten; the cpu runs
 * the same ops directly every time.
 */
Test(cuda_step, a_recorded_step_replays_with_rewritten_positions)
{
	static const int32_t steps[6] = { 0, 1, 2, 700, 1023, 5 };
	const int64_t hd = 128, nh = 8, nkv = 2, n_ctx = 1024;
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	float *kv0;
	struct twin fill;
	struct half_step h;
	q4kh_graph *g = NULL;

	rng_seed(45);
	kv0 = rvals((size_t)(hd * nkv * n_ctx));
	fill = twin_f32(r, hd, nkv, n_ctx, kv0);
	h = (struct half_step){
		.kc = twin_new(r, Q4KH_TYPE_F16, hd, nkv, n_ctx, 0, NULL),
		.vc = twin_new(r, Q4KH_TYPE_F16, hd, nkv, n_ctx, 0, NULL),
		.ps = twin_index(r, steps, 1),
		.q = twin_new(r, Q4KH_TYPE_F32, hd, nh, 1, 0, NULL),
		.kn = twin_new(r, Q4KH_TYPE_F32, hd, nkv, 1, 0, NULL),
		.vn = twin_new(r, Q4KH_TYPE_F32, hd, nkv, 1, 0, NULL),
		.out = twin_new(r, Q4KH_TYPE_F32, hd, nh, 1, 0, NULL),
		.rp = { .struct_size = sizeof(h.rp), .n_rot = (int32_t)hd,
		        .mode = Q4KH_ROPE_NEOX, .base = 1000000.0f,
		        .freq_scale = 1.0f, .attn_factor = 1.0f },
		.ap = { .struct_size = sizeof(h.ap),
		        .scale = (float)(1.0 / sqrt((double)hd)) },
	};
	BOTH(r, copy(DEV(r, s_), T(fill), T(h.kc)));
	BOTH(r, copy(DEV(r, s_), T(fill), T(h.vc)));
	for (int i = 0; i < 6; i++) {
		char what[64];

		index_set(r, &h.ps, &steps[i]);
		refill(r, &h.q);
		refill(r, &h.kn);
		refill(r, &h.vn);
		issue_half_step(r, REF, &h);
		if (i == 0) {
			issue_half_step(r, GPU, &h);
		} else {
			if (!g) {
				cr_assert_eq(b->graph_begin(DEV(r, GPU)), Q4KH_OK, "%s",
				             ERR(r, GPU));
				issue_half_step(r, GPU, &h);
				cr_assert_eq(b->graph_end(DEV(r, GPU), &g), Q4KH_OK, "%s",
				             ERR(r, GPU));
			}
			cr_assert_eq(b->graph_launch(DEV(r, GPU), g), Q4KH_OK, "%s",
			             ERR(r, GPU));
		}
		snprintf(what, sizeof(what), "%s step at position %d",
		         i ? "replayed" : "direct", steps[i]);
		expect_agree(r, what, &h.out, NMSE_BOUND);
	}
	expect_agree(r, "the K cache after the replays", &h.kc, 0.0);
	expect_agree(r, "the V cache after the replays", &h.vc, 0.0);
	b->graph_free(DEV(r, GPU), g);
	twin_free(r, &fill);
	twin_free(r, &h.kc);
	twin_free(r, &h.vc);
	twin_free(r, &h.ps);
	twin_free(r, &h.q);
	twin_free(r, &h.kn);
	twin_free(r, &h.vn);
	twin_free(r, &h.out);
	free(kv0);
	rig_close(r);
}

/* --- top2 (ABI 1.4) ------------------------------------------------------------ */

/* A cuda buffer of 12 T bytes and a poisoned guard after them: idx I32
 * {T} first, then val F32 {2, T}, as the session places them. */
struct top2_out {
	q4kh_buffer *buf;
	struct q4kh_tensor idx, val;
	int64_t T;
};

static struct top2_out top2_out_new(struct rig *r, int64_t T)
{
	struct top2_out o = { .T = T };
	uint8_t *poison = malloc((size_t)(12 * T + GUARD));

	cr_assert_not_null(poison);
	memset(poison, POISON, (size_t)(12 * T + GUARD));
	cr_assert_eq(V(r, GPU)->buffer_alloc(DEV(r, GPU), (uint64_t)(12 * T + GUARD), &o.buf),
	             Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(V(r, GPU)->buffer_upload(DEV(r, GPU), o.buf, 0, poison,
	                                      (uint64_t)(12 * T + GUARD)),
	             Q4KH_OK, "%s", ERR(r, GPU));
	o.idx = (struct q4kh_tensor){ .buffer = o.buf, .type = Q4KH_TYPE_I32,
		                      .ne = { T, 1, 1, 1 },
		                      .nb = { 4, 4 * T, 4 * T, 4 * T } };
	o.val = (struct q4kh_tensor){ .buffer = o.buf, .offset = (uint64_t)(4 * T),
		                      .type = Q4KH_TYPE_F32, .ne = { 2, T, 1, 1 },
		                      .nb = { 4, 8, 8 * T, 8 * T } };
	free(poison);
	return o;
}

/* The T columns of X (rows packed, N values each, of kinds KINDS) against
 * the host's pick, and the guard after the record still poison. */
static void top2_expect(struct rig *r, const struct top2_out *o, const float *x, int64_t n,
                        const char *const *kinds, const char *how)
{
	uint8_t *raw = malloc((size_t)(12 * o->T + GUARD));
	char what[160];

	cr_assert_not_null(raw);
	cr_assert_eq(V(r, GPU)->buffer_download(DEV(r, GPU), o->buf, 0, raw,
	                                        (uint64_t)(12 * o->T + GUARD)),
	             Q4KH_OK, "%s", ERR(r, GPU));
	for (int64_t t = 0; t < o->T; t++) {
		int32_t i;
		float v[2];

		memcpy(&i, raw + 4 * t, sizeof(i));
		memcpy(v, raw + 4 * o->T + 8 * t, sizeof(v));
		snprintf(what, sizeof(what), "%s top2 n %lld column %lld of %lld (%s)", how,
		         (long long)n, (long long)t, (long long)o->T, kinds[t]);
		test_expect_top2(x + t * n, n, i, v, what);
	}
	for (int64_t b = 12 * o->T; b < 12 * o->T + GUARD; b++)
		cr_assert_eq(raw[b], POISON, "%s top2 n %lld: byte %lld past the record written",
		             how, (long long)n, (long long)(b - 12 * o->T));
	free(raw);
}

/* Columns of kinds FIRST, FIRST + 1, ... into X (T of N values). */
static void top2_fill(float *x, int64_t n, int64_t T, int first, const char **kinds)
{
	for (int64_t t = 0; t < T; t++)
		kinds[t] = test_top2_column((first + (int)t) % TEST_TOP2_KINDS, x + t * n, n,
		                            (uint64_t)(n * 7919 + first * 31 + t));
}

/*
 * top2 against the host's q4kh_top2, bit for bit: every kind of column
 * (ties, NaN, +-Inf, -0 and +0, a single finite value, ...) at lengths
 * from 1 to the vocabularies of Qwen2.5 (151936) and Llama 3 (128256),
 * one column (split over blocks) and several, padded rows, and more
 * columns than the split form counts (a block per column).
 */
Test(cuda_step, top2_is_the_hosts_pick, .timeout = 300)
{
	static const int64_t lens[] = { 1, 2, 33, 2048, 2049, 100003, 128256, 151936 };
	static const int64_t cols[] = { 1, 3, 64 };
	struct rig *r = rig_open();

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (size_t ci = 0; ci < sizeof(cols) / sizeof(cols[0]); ci++)
			for (int k = 0; k < TEST_TOP2_KINDS; k += (int)cols[ci]) {
				const int64_t n = lens[li], T = cols[ci];
				float *x = malloc(sizeof(float) * (size_t)(n * T));
				const char *kinds[64];
				struct twin xt;
				struct top2_out o;

				cr_assert_not_null(x);
				top2_fill(x, n, T, k, kinds);
				xt = twin_new(r, Q4KH_TYPE_F32, n, T, 1, 16 * (T > 1), x);
				o = top2_out_new(r, T);
				cr_assert_eq(V(r, GPU)->top2(DEV(r, GPU), &xt.t[GPU], &o.idx, &o.val),
				             Q4KH_OK, "%s", ERR(r, GPU));
				top2_expect(r, &o, x, n, kinds, "direct");
				V(r, GPU)->buffer_free(DEV(r, GPU), o.buf);
				twin_free(r, &xt);
				free(x);
			}
	{ /* more columns than counters: a block per column */
		const int64_t n = 1000, T = 1100;
		float *x = malloc(sizeof(float) * (size_t)(n * T));
		const char **kinds = malloc(sizeof(*kinds) * (size_t)T);
		struct twin xt;
		struct top2_out o;

		cr_assert(x && kinds);
		top2_fill(x, n, T, 0, kinds);
		xt = twin_f32(r, n, T, 1, x);
		o = top2_out_new(r, T);
		cr_assert_eq(V(r, GPU)->top2(DEV(r, GPU), &xt.t[GPU], &o.idx, &o.val), Q4KH_OK,
		             "%s", ERR(r, GPU));
		top2_expect(r, &o, x, n, kinds, "1100 columns");
		V(r, GPU)->buffer_free(DEV(r, GPU), o.buf);
		twin_free(r, &xt);
		free(kinds);
		free(x);
	}
	rig_close(r);
}

/*
 * top2 of a decode step's logits (one column of 151936: the split form,
 * whose last block sets its counter back to 0) recorded once and replayed
 * over new logits of every kind: each replay must count from 0 again.
 */
Test(cuda_step, top2_recorded_replays_over_new_logits)
{
	const int64_t n = 151936;
	const struct q4kh_backend_v1 *b;
	struct rig *r = rig_open();
	float *x = malloc(sizeof(float) * (size_t)n);
	const char *kind[1];
	struct twin xt;
	struct top2_out o;
	q4kh_graph *g = NULL;

	cr_assert_not_null(x);
	b = V(r, GPU);
	top2_fill(x, n, 1, 0, kind);
	xt = twin_f32(r, n, 1, 1, x);
	o = top2_out_new(r, 1);
	/* the first call sizes the scratch, which a recording cannot */
	cr_assert_eq(b->top2(DEV(r, GPU), &xt.t[GPU], &o.idx, &o.val), Q4KH_OK, "%s",
	             ERR(r, GPU));
	top2_expect(r, &o, x, n, kind, "direct");
	cr_assert_eq(b->graph_begin(DEV(r, GPU)), Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(b->top2(DEV(r, GPU), &xt.t[GPU], &o.idx, &o.val), Q4KH_OK, "%s",
	             ERR(r, GPU));
	cr_assert_eq(b->graph_end(DEV(r, GPU), &g), Q4KH_OK, "%s", ERR(r, GPU));
	for (int k = 1; k <= TEST_TOP2_KINDS; k++) {
		top2_fill(x, n, 1, k, kind);
		cr_assert_eq(b->buffer_upload(DEV(r, GPU), xt.t[GPU].buffer, xt.t[GPU].offset, x,
		                              sizeof(float) * (size_t)n),
		             Q4KH_OK, "%s", ERR(r, GPU));
		cr_assert_eq(b->graph_launch(DEV(r, GPU), g), Q4KH_OK, "%s", ERR(r, GPU));
		top2_expect(r, &o, x, n, kind, "replayed");
	}
	b->graph_free(DEV(r, GPU), g);
	b->buffer_free(DEV(r, GPU), o.buf);
	twin_free(r, &xt);
	free(x);
	rig_close(r);
}
