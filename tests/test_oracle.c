/*
 * The whole forward pass of the cpu reference against two independent
 * implementations:
 *   - its own oracle, an exact float64 forward pass in NumPy (gguf-py's
 *     dequantizers, llama.cpp's graphs) recorded by scripts/oracle-f64.py
 *     as tests/fixtures/oracle-f64-NAME.json and .bin;
 *   - llama.cpp on the same GGUF file, recorded by
 *     scripts/gen-oracle-fixture.py (the default model: five prompts, and
 *     with --new six prompts no other fixture uses) and
 *     scripts/gen-arch-fixtures.py (the tiny model of every architecture),
 *     whose token ids both oracles and this test share.
 * For every case the cpu plugin runs a batched prefill of the prompt
 * (logits at every position) and then teacher-forced decode steps on
 * llama.cpp's greedy tokens through its KV cache (F32, the reference's).
 * Both oracles' full logits are rebuilt from their recorded final hidden
 * state h as W h in double, W the Q8_0 LM head dequantized here from the
 * file's blocks; the exact fixture's own top-8 logits and sum of squares
 * confirm the rebuild. At every row the exact oracle covers:
 *   - 1 - cosine(reference, exact) <= 1e-9 (float64 against the
 *     reference's double arithmetic: about 1e-12), the same argmax;
 *   - llama.cpp is judged by its own distance from the exact result (int8
 *     activations, an F16 cache: up to about 1.4e-2 on Gemma 3 270M): the
 *     angle between the reference and llama.cpp may not exceed llama.cpp's
 *     angle from the exact result plus the reference's allowance, so no
 *     prompt fails on llama.cpp's rounding;
 *   - the exact oracle itself agrees with llama.cpp as an implementation
 *     written from the same graphs must: 1 - cosine <= 0.05, and the same
 *     argmax wherever llama.cpp's top-2 margin is 0.5 or more (a misread
 *     model, a wrong RoPE or scale, is far past both).
 * At every row (the default model's 32 decode steps go past the exact
 * fixture's 8): an argmax disagreement with llama.cpp only where its
 * top-2 margin < 0.5, and greedy decoding identical to llama.cpp's up to
 * the first near-tie step.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "hidden_fixture.h"
#include "backend.h"
#include "model.h"
#include "registry.h"
#include "sampler.h"
#include "session.h"

#define NEAR_TIE 0.5          /* llama.cpp top-2 margin, logits */
#define MAX_EXACT_DISTANCE 1e-9 /* 1 - cosine, reference against float64 */
#define MAX_LLAMA_CPP_DISTANCE 0.05 /* 1 - cosine, llama.cpp against float64 */
#define REBUILD_TOLERANCE 1e-5 /* relative: float32 storage of h */

static int64_t int_at(json_t *a, size_t i)
{
	return json_integer_value(json_array_get(a, i));
}

/* The hidden_row of a case's first row: its rows follow one another. */
static int64_t first_row(json_t *rows)
{
	return json_integer_value(json_object_get(json_array_get(rows, 0), "hidden_row"));
}

/* The angle between two vectors whose cosine is CS. */
static double angle(double cs)
{
	return acos(fmin(1.0, fmax(-1.0, cs)));
}

/* The rebuilt exact logits Z of row R agree with the fixture's float64
 * top-8 logits and sum of squares. */
static void check_rebuild(const char *name, size_t ci, int64_t r, json_t *row,
                          const float *z, int64_t n_vocab)
{
	json_t *ids = json_object_get(row, "top_ids"), *vals = json_object_get(row, "top_logits");
	double sumsq = 0.0, want = json_real_value(json_object_get(row, "sumsq"));
	double top = fabs(json_real_value(json_array_get(vals, 0)));

	for (int64_t v = 0; v < n_vocab; v++)
		sumsq += (double)z[v] * z[v];
	cr_assert_lt(fabs(sumsq - want), 2 * REBUILD_TOLERANCE * want,
	             "%s case %zu row %lld: rebuilt exact logits have sum of squares %.9g, the fixture %.9g",
	             name, ci, (long long)r, sumsq, want);
	for (size_t i = 0; i < json_array_size(ids); i++) {
		double v = json_real_value(json_array_get(vals, i));

		cr_assert_lt(fabs(z[int_at(ids, i)] - v), REBUILD_TOLERANCE * top,
		             "%s case %zu row %lld: rebuilt exact logit of token %lld is %.7g, the fixture %.7g",
		             name, ci, (long long)r, (long long)int_at(ids, i), z[int_at(ids, i)], v);
	}
}

/*
 * The reference on MODEL_PATH over every case of llama.cpp fixture LLAMA,
 * judged against the exact fixture EXACT and against llama.cpp.
 */
static void check_fixture(const char *model_path, const char *llama, const char *exact)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	struct q4kh_backend be;
	struct q4kh_model *m = NULL;
	struct q4kh_session *s = NULL;
	struct q4kh_session_params sp = { .n_ctx = 256 };
	struct hidden_fixture lo, ex;
	json_t *c;
	size_t ci;
	double worst_ref = 0.0, worst_llama = 0.0;

	hidden_fixture_load(llama, &lo);
	hidden_fixture_load(exact, &ex);
	cr_assert_eq(q4kh_registry_scan(NULL, NULL, &reg, &err), 0, "%s", err.msg);
	cr_assert_not_null(q4kh_registry_find(reg, "cpu"), "cpu plugin not found on %s", reg->path);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(reg, "cpu"), 0, &be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_open(model_path, &m, &err), 0, "%s", err.msg);
	cr_assert_eq(m->hp.n_vocab, lo.n_vocab, "%s: n_vocab %lld, %s.json says %lld", model_path,
	             (long long)m->hp.n_vocab, llama, (long long)lo.n_vocab);
	cr_assert_eq(ex.n_vocab, lo.n_vocab, "%s.json and %s.json disagree on n_vocab", exact, llama);
	cr_assert_eq(q4kh_model_upload(m, &be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(m, &sp, &s, &err), 0, "%s", err.msg);
	cr_assert_eq(json_array_size(json_object_get(ex.root, "cases")),
	             json_array_size(json_object_get(lo.root, "cases")),
	             "%s.json and %s.json hold different numbers of cases: regenerate with scripts/oracle-f64.py",
	             exact, llama);
	cr_assert_eq(s->stats.kv_type, Q4KH_TYPE_F32, "the reference's KV cache is F32");

	json_array_foreach(json_object_get(lo.root, "cases"), ci, c) {
		json_t *xc = json_array_get(json_object_get(ex.root, "cases"), ci);
		json_t *jt = json_object_get(c, "tokens"), *jg = json_object_get(c, "greedy");
		json_t *pos = json_object_get(c, "positions"), *xrows = json_object_get(xc, "rows");
		int64_t np = json_array_size(jt), ng = json_array_size(jg);
		int64_t rows = np + ng, nx = json_array_size(xrows), V = lo.n_vocab;
		int32_t *ids = malloc(sizeof(int32_t) * rows);
		float *ours = malloc(sizeof(float) * rows * V);
		float *ref = malloc(sizeof(float) * rows * V);
		float *z = malloc(sizeof(float) * nx * V);
		double case_ref = 0.0, case_llama = 0.0;
		int near_ties = 0, diverged = 0, same_steps = 0;

		cr_assert(json_equal(jt, json_object_get(xc, "tokens")),
		          "%s.json case %zu: not the prompt ids of %s.json", exact, ci, llama);
		cr_assert_eq((int64_t)json_array_size(pos), rows);
		cr_assert_leq(nx, rows);
		for (int64_t i = 0; i < np; i++)
			ids[i] = (int32_t)int_at(jt, i);
		for (int64_t i = 0; i < ng; i++)
			ids[np + i] = (int32_t)int_at(jg, i);
		for (int64_t i = np; i < nx; i++)
			cr_assert_eq(int_at(json_object_get(xc, "greedy"), i - np), ids[i],
			             "%s.json case %zu: greedy token %lld is not %s.json's", exact, ci,
			             (long long)(i - np), llama);

		q4kh_session_reset(s);
		cr_assert_eq(q4kh_session_eval(s, ids, np, ours, 1, &err), 0, "%s", err.msg);
		for (int64_t i = 0; i < ng; i++)
			cr_assert_eq(q4kh_session_eval(s, &ids[np + i], 1, ours + (np + i) * V, 1, &err),
			             0, "%s", err.msg);
		test_q8_0_logits(m->output.src, lo.hidden + first_row(pos) * lo.n_embd, rows, ref);
		test_q8_0_logits(m->output.src, ex.hidden + first_row(xrows) * ex.n_embd, nx, z);

		for (int64_t r = 0; r < rows; r++) {
			json_t *p = json_array_get(pos, r);
			double margin = json_real_value(json_object_get(p, "margin"));
			int32_t llama_top = (int32_t)int_at(json_object_get(p, "top_ids"), 0);
			int32_t our_top = q4kh_argmax(ours + r * V, (int32_t)V);
			const char *where = r < np ? "prefill position" : "decode step";
			int64_t at = r < np ? r : r - np;

			if (r < nx) {
				json_t *x = json_array_get(xrows, r);
				int32_t exact_top = (int32_t)int_at(json_object_get(x, "top_ids"), 0);
				double d_ref = 1.0 - test_cosine(ours + r * V, z + r * V, V);
				double cs_llama = test_cosine(ref + r * V, z + r * V, V);
				double cs_ours = test_cosine(ours + r * V, ref + r * V, V);

				check_rebuild(exact, ci, r, x, z + r * V, V);
				cr_expect_leq(d_ref, MAX_EXACT_DISTANCE,
				              "%s case %zu %s %lld: 1 - cosine(reference, exact float64) %.3g > %.0e",
				              llama, ci, where, (long long)at, d_ref, MAX_EXACT_DISTANCE);
				cr_expect_eq(our_top, exact_top,
				             "%s case %zu %s %lld: reference argmax %d, exact float64 %d (its margin %.6f)",
				             llama, ci, where, (long long)at, our_top, exact_top,
				             json_real_value(json_object_get(x, "margin")));
				cr_expect_leq(angle(cs_ours),
				              angle(cs_llama) + angle(1.0 - MAX_EXACT_DISTANCE),
				              "%s case %zu %s %lld: the reference is %.3g from llama.cpp (1 - cosine), farther than llama.cpp is from the exact result (%.3g) plus the reference's 1e-9",
				              llama, ci, where, (long long)at, 1.0 - cs_ours, 1.0 - cs_llama);
				cr_expect_leq(1.0 - cs_llama, MAX_LLAMA_CPP_DISTANCE,
				              "%s case %zu %s %lld: llama.cpp is %.3g from the exact float64 result (1 - cosine) > %.2f: does scripts/oracle-f64.py read the model as llama.cpp does?",
				              llama, ci, where, (long long)at, 1.0 - cs_llama, MAX_LLAMA_CPP_DISTANCE);
				if (margin >= NEAR_TIE)
					cr_expect_eq(llama_top, exact_top,
					             "%s case %zu %s %lld: llama.cpp's argmax %d (margin %.3f) is not the exact result's %d",
					             llama, ci, where, (long long)at, llama_top, margin, exact_top);
				case_ref = fmax(case_ref, d_ref);
				case_llama = fmax(case_llama, 1.0 - cs_llama);
			}
			if (our_top != llama_top) {
				near_ties++;
				cr_expect_lt(margin, NEAR_TIE,
				             "%s case %zu %s %lld: argmax %d vs llama.cpp %d with its margin %.3f >= %.1f",
				             llama, ci, where, (long long)at, our_top, llama_top, margin, NEAR_TIE);
			}
			/* Rows np-1 .. rows-2 predict greedy token r - np + 1. */
			if (r >= np - 1 && r < rows - 1)
				same_steps += our_top == ids[r + 1];
			if (r >= np - 1 && r < rows - 1 && !diverged) {
				if (margin < NEAR_TIE)
					diverged = 1; /* a near-tie may legitimately flip greedy */
				else
					cr_expect_eq(our_top, ids[r + 1],
					             "%s case %zu greedy step %lld: we pick %d, llama.cpp %d (margin %.3f)",
					             llama, ci, (long long)(r - np + 1), our_top, ids[r + 1], margin);
			}
		}
		fprintf(stderr, "%s case %zu: %lld prompt tokens + %lld decode steps (%lld rows exact): "
		                "reference 1 - cosine %.3g from the exact result, llama.cpp %.3g; "
		                "argmax disagreements with llama.cpp %d (near-ties), greedy tokens identical %d/%lld%s\n",
		        llama, ci, (long long)np, (long long)ng, (long long)nx, case_ref, case_llama,
		        near_ties, same_steps, (long long)ng,
		        diverged ? " (a near-tie on the path)" : " (wide margins)");
		worst_ref = fmax(worst_ref, case_ref);
		worst_llama = fmax(worst_llama, case_llama);
		free(ids);
		free(ours);
		free(ref);
		free(z);
	}
	fprintf(stderr, "%s: largest 1 - cosine from the exact float64 result: reference %.3g, llama.cpp %.3g\n",
	        llama, worst_ref, worst_llama);
	q4kh_session_free(s);
	q4kh_model_free(m);
	q4kh_backend_close(&be);
	q4kh_registry_free(reg);
	hidden_fixture_free(&lo);
	hidden_fixture_free(&ex);
}

Test(oracle, gemma3_matches_exact_and_llama_cpp, .timeout = 900)
{
	test_skip_under_sanitizers("the default model through the whole forward pass, "
	                           "as several F2 tests of this build run it");
	check_fixture(test_model_path(), "oracle-gemma3", "oracle-f64-gemma3");
}

Test(oracle, gemma3_new_prompts, .timeout = 900)
{
	test_skip_under_sanitizers("the default model through the whole forward pass, "
	                           "as several F2 tests of this build run it");
	check_fixture(test_model_path(), "oracle-gemma3-new", "oracle-f64-gemma3-new");
}

/* One tiny model per architecture (scripts/gen-tiny-models.py). */
static void check_tiny(const char *name)
{
	char model[4096], llama[64], exact[64];

	snprintf(model, sizeof(model), "%s/tests/fixtures/tiny-%s.gguf", test_srcdir(), name);
	snprintf(llama, sizeof(llama), "arch-%s", name);
	snprintf(exact, sizeof(exact), "oracle-f64-%s", name);
	check_fixture(model, llama, exact);
}

Test(oracle, llama) { check_tiny("llama"); }
Test(oracle, llama_ropefreqs) { check_tiny("llama-ropefreqs"); }
Test(oracle, qwen2) { check_tiny("qwen2"); }
Test(oracle, qwen2_yarn) { check_tiny("qwen2-yarn"); }
Test(oracle, qwen3) { check_tiny("qwen3"); }
Test(oracle, qwen35) { check_tiny("qwen35"); }
Test(oracle, qwen3moe) { check_tiny("qwen3moe"); }
