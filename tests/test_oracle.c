/*
 * The whole forward pass against an independent implementation: llama.cpp
 * on the same GGUF file, recorded by scripts/gen-oracle-fixture.py.
 *
 * For every prompt the cpu plugin runs a batched prefill (logits at every
 * position) and then 32 teacher-forced decode steps on llama.cpp's greedy
 * tokens through the KV cache. llama.cpp's full logits at each position are
 * rebuilt from its recorded final hidden state h as W h in double, W being
 * the Q8_0 LM head dequantized here from the file's blocks (the script
 * records that the rebuild matches llama.cpp's own logits to a cosine of
 * >= 0.9998). Checks at every position (issue: foundation):
 *   - cosine(ours, llama.cpp) >= 0.99;
 *   - an argmax disagreement only where llama.cpp's top-2 margin < 0.5;
 *   - greedy decoding identical to llama.cpp's up to the first near-tie step
 *     (so all 32 steps on prompts whose margins are wide): teacher-forced on
 *     llama.cpp's tokens, our argmax must equal its next token at each step,
 *     which makes our free-running greedy sequence the same sequence.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "backend.h"
#include "model.h"
#include "registry.h"
#include "sampler.h"
#include "session.h"

#define NEAR_TIE 0.5   /* llama.cpp top-2 margin, logits */
#define MIN_COSINE 0.99

struct oracle {
	json_t *root;
	float *hidden; /* rows x n_embd */
	size_t rows;
	int64_t n_embd, n_vocab;
};

static void load_oracle(struct oracle *o)
{
	char path[4096];
	json_error_t jerr;
	size_t len;

	snprintf(path, sizeof(path), "%s/tests/fixtures/oracle-gemma3.json", test_srcdir());
	o->root = json_load_file(path, 0, &jerr);
	cr_assert_not_null(o->root, "%s:%d: %s", path, jerr.line, jerr.text);
	o->n_embd = json_integer_value(json_object_get(o->root, "n_embd"));
	o->n_vocab = json_integer_value(json_object_get(o->root, "n_vocab"));
	o->rows = (size_t)json_integer_value(json_object_get(o->root, "hidden_rows"));
	snprintf(path, sizeof(path), "%s/tests/fixtures/oracle-gemma3.bin", test_srcdir());
	o->hidden = test_read_file(path, &len);
	cr_assert_not_null(o->hidden, "cannot read %s", path);
	cr_assert_eq(len, o->rows * o->n_embd * sizeof(float), "%s: size %zu", path, len);
}

Test(oracle, gemma3_matches_llama_cpp, .timeout = 900)
{
	const char *model_path = test_model_path();
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	struct q4kh_backend be;
	struct q4kh_model *m = NULL;
	struct q4kh_session *s = NULL;
	struct q4kh_session_params sp = { .n_ctx = 256 };
	struct oracle o;
	json_t *cases;
	size_t ci;
	json_t *c;
	double worst = 1.0;

	load_oracle(&o);
	cr_assert_eq(q4kh_registry_scan(NULL, NULL, &reg, &err), 0, "%s", err.msg);
	cr_assert_not_null(q4kh_registry_find(reg, "cpu"), "cpu plugin not found on %s", reg->path);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(reg, "cpu"), 0, &be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_open(model_path, &m, &err), 0, "%s", err.msg);
	cr_assert_eq(m->hp.n_vocab, o.n_vocab);
	cr_assert_eq(q4kh_model_upload(m, &be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(m, &sp, &s, &err), 0, "%s", err.msg);

	cases = json_object_get(o.root, "cases");
	json_array_foreach(cases, ci, c) {
		json_t *jt = json_object_get(c, "tokens"), *jg = json_object_get(c, "greedy");
		json_t *pos = json_object_get(c, "positions");
		int64_t np = json_array_size(jt), ng = json_array_size(jg);
		int64_t rows = np + ng, first_row;
		int32_t *ids = malloc(sizeof(int32_t) * rows);
		float *ours = malloc(sizeof(float) * rows * o.n_vocab);
		float *ref = malloc(sizeof(float) * rows * o.n_vocab);
		double case_min = 1.0;
		int near_ties = 0, diverged = 0, same_steps = 0;

		cr_assert_eq((int64_t)json_array_size(pos), rows);
		for (int64_t i = 0; i < np; i++)
			ids[i] = (int32_t)json_integer_value(json_array_get(jt, i));
		for (int64_t i = 0; i < ng; i++)
			ids[np + i] = (int32_t)json_integer_value(json_array_get(jg, i));

		q4kh_session_reset(s);
		cr_assert_eq(q4kh_session_eval(s, ids, np, ours, 1, &err), 0, "%s", err.msg);
		for (int64_t i = 0; i < ng; i++)
			cr_assert_eq(q4kh_session_eval(s, &ids[np + i], 1,
			                               ours + (np + i) * o.n_vocab, 1, &err),
			             0, "%s", err.msg);
		first_row = json_integer_value(json_object_get(json_array_get(pos, 0), "hidden_row"));
		test_q8_0_logits(m->tok_embd.src, o.hidden + first_row * o.n_embd, rows, ref);

		for (int64_t r = 0; r < rows; r++) {
			json_t *p = json_array_get(pos, r);
			double margin = json_real_value(json_object_get(p, "margin"));
			int32_t ref_top = (int32_t)json_integer_value(
				json_array_get(json_object_get(p, "top_ids"), 0));
			int32_t our_top = q4kh_argmax(ours + r * o.n_vocab, (int32_t)o.n_vocab);
			double cs = test_cosine(ours + r * o.n_vocab, ref + r * o.n_vocab, o.n_vocab);
			const char *where = r < np ? "prefill position" : "decode step";
			int64_t at = r < np ? r : r - np;

			cr_expect_geq(cs, MIN_COSINE, "case %zu %s %lld: cosine %.5f < %.2f",
			              ci, where, (long long)at, cs, MIN_COSINE);
			if (cs < case_min)
				case_min = cs;
			if (our_top != ref_top) {
				near_ties++;
				cr_expect_lt(margin, NEAR_TIE,
				             "case %zu %s %lld: argmax %d vs llama.cpp %d with its margin %.3f >= %.1f",
				             ci, where, (long long)at, our_top, ref_top, margin, NEAR_TIE);
			}
			/* Rows np-1 .. rows-2 predict greedy token r - np + 1. */
			if (r >= np - 1 && r < rows - 1)
				same_steps += our_top == ids[r + 1];
			if (r >= np - 1 && r < rows - 1 && !diverged) {
				if (margin < NEAR_TIE)
					diverged = 1; /* a near-tie may legitimately flip greedy */
				else
					cr_expect_eq(our_top, ids[r + 1],
					             "case %zu greedy step %lld: we pick %d, llama.cpp %d (margin %.3f)",
					             ci, (long long)(r - np + 1), our_top, ids[r + 1], margin);
			}
		}
		fprintf(stderr, "oracle case %zu: %lld prompt tokens + %lld decode steps, min cosine %.6f, "
		                "argmax disagreements %d (all near-ties), greedy tokens identical %d/%lld%s\n",
		        ci, (long long)np, (long long)ng, case_min, near_ties, same_steps,
		        (long long)ng, diverged ? " (a near-tie on the path)" : " (wide margins)");
		if (case_min < worst)
			worst = case_min;
		free(ids);
		free(ours);
		free(ref);
	}
	fprintf(stderr, "oracle: minimum cosine over every position of every case: %.6f\n", worst);
	q4kh_session_free(s);
	q4kh_model_free(m);
	q4kh_backend_close(&be);
	q4kh_registry_free(reg);
	json_decref(o.root);
	free(o.hidden);
}
