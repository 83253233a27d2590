/*
 * The forward passes of the tiny architecture fixtures against llama.cpp's
 * recorded hidden states (arch_oracle.h), on any backend: what
 * tests/test_archs.c checks on the cpu backends and
 * tests/test_cuda_archs.c on cuda.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_oracle.h"
#include "backend.h"
#include "helpers.h"
#include "kernel.h"
#include "model.h"
#include "policy.h"
#include "registry.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"

void load_oracle(const char *arch, struct hidden_fixture *o)
{
	char name[64];

	snprintf(name, sizeof(name), "arch-%s", arch);
	hidden_fixture_load(name, o);
}

static int32_t *json_ids(json_t *a)
{
	int32_t *ids = malloc(sizeof(int32_t) * (json_array_size(a) + 1));

	cr_assert_not_null(ids);
	for (size_t i = 0; i < json_array_size(a); i++)
		ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
	return ids;
}

/* Our prompt ids must be llama.cpp's (BOS as the vocabulary asks, text
 * not parsed for special tokens). */
static void expect_prompt_ids(const struct q4kh_tokenizer *t, json_t *c)
{
	const char *prompt = json_string_value(json_object_get(c, "prompt"));
	json_t *want = json_object_get(c, "tokens");
	struct q4kh_error err = { { 0 } };
	int32_t *ids;
	size_t n;

	cr_assert_eq(q4kh_tokenize(t, prompt, strlen(prompt), 1, 0, &ids, &n, &err), 0,
	             "%s", err.msg);
	cr_expect_eq(n, json_array_size(want), "\"%s\": %zu ids, llama.cpp %zu",
	             prompt, n, json_array_size(want));
	for (size_t i = 0; i < n && i < json_array_size(want); i++)
		cr_expect_eq(ids[i], json_integer_value(json_array_get(want, i)),
		             "\"%s\": id %zu", prompt, i);
	free(ids);
}

/* One prompt: prefill, then STEPS decode steps on llama.cpp's tokens. */
static double check_case(struct q4kh_session *s, const struct hidden_fixture *o,
                         const char *arch, size_t ci, json_t *c)
{
	json_t *pos = json_object_get(c, "positions");
	int32_t *ids = json_ids(json_object_get(c, "tokens"));
	int32_t *greedy = json_ids(json_object_get(c, "greedy"));
	int64_t np = (int64_t)json_array_size(json_object_get(c, "tokens"));
	int64_t rows = np + STEPS, first_row;
	float *ours = malloc(sizeof(float) * rows * o->n_vocab);
	float *ref = malloc(sizeof(float) * rows * o->n_vocab);
	struct q4kh_error err = { { 0 } };
	double worst = 1.0;
	int same = 0;

	cr_assert_eq(json_array_size(json_object_get(c, "greedy")), STEPS);
	cr_assert_eq((int64_t)json_array_size(pos), rows);
	q4kh_session_reset(s);
	cr_assert_eq(q4kh_session_eval(s, ids, np, ours, 1, &err), 0, "%s", err.msg);
	for (int64_t i = 0; i < STEPS; i++) {
		int32_t tok = q4kh_argmax(ours + (np - 1 + i) * o->n_vocab, (int32_t)o->n_vocab);

		cr_expect_eq(tok, greedy[i], "%s case %zu greedy step %lld: we pick %d, llama.cpp %d",
		             arch, ci, (long long)i, tok, greedy[i]);
		same += tok == greedy[i];
		cr_assert_eq(q4kh_session_eval(s, &greedy[i], 1, ours + (np + i) * o->n_vocab, 1,
		                               &err),
		             0, "%s", err.msg);
	}
	first_row = json_integer_value(json_object_get(json_array_get(pos, 0), "hidden_row"));
	test_q8_0_logits(s->m->output.src, o->hidden + first_row * o->n_embd, rows, ref);
	for (int64_t r = 0; r < rows; r++) {
		double cs = test_cosine(ours + r * o->n_vocab, ref + r * o->n_vocab, o->n_vocab);
		const char *where = r < np ? "prefill position" : "decode step";

		cr_expect_geq(cs, MIN_COSINE, "%s case %zu %s %lld: cosine %.6f < %.3f", arch, ci,
		              where, (long long)(r < np ? r : r - np), cs, MIN_COSINE);
		if (cs < worst)
			worst = cs;
	}
	fprintf(stderr, "%s case %zu: %lld prompt tokens + %d decode steps, min cosine %.6f, "
	                "greedy tokens identical %d/%d\n",
	        arch, ci, (long long)np, STEPS, worst, same, STEPS);
	free(ids);
	free(greedy);
	free(ours);
	free(ref);
	return worst;
}

void check_on(const char *name_, const char *arch, const char *plugin_path,
                     const char *backend, const char *variant)
{
	char name[64];
	char *path;
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	struct q4kh_backend be;
	struct q4kh_kernel k = { 0 };
	struct q4kh_model *m = NULL;
	struct q4kh_tokenizer *tok = NULL;
	struct q4kh_session *s = NULL;
	struct q4kh_session_params sp = { .n_ctx = 256, .kv = Q4KH_KV_F16 };
	struct hidden_fixture o;
	json_t *c;
	size_t ci;
	double worst = 1.0;

	load_oracle(name_, &o);
	snprintf(name, sizeof(name), "tiny-%s.gguf", name_);
	path = fixture(name);
	cr_assert_eq(q4kh_registry_scan(plugin_path, NULL, &reg, &err), 0, "%s", err.msg);
	cr_assert_not_null(q4kh_registry_find(reg, backend), "%s not found on %s", backend,
	                   reg->path);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(reg, backend), 0, &be, &err), 0, "%s",
	             err.msg);
	cr_assert_eq(q4kh_model_open(path, &m, &err), 0, "%s", err.msg);
	cr_assert_str_eq(m->arch->name, arch);
	cr_assert_eq(m->hp.n_vocab, o.n_vocab);
	cr_assert_eq(q4kh_tokenizer_load(m->gguf, &tok, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(m, &be, &err), 0, "%s", err.msg);
	if (variant)
		cr_assert_eq(q4kh_policy_use_kernel(reg, &be, m, variant, &k, &err), 0, "%s",
		             err.msg);
	cr_assert_eq(q4kh_session_new(m, &sp, &s, &err), 0, "%s", err.msg);
	json_array_foreach(json_object_get(o.root, "cases"), ci, c) {
		double w;
		expect_prompt_ids(tok, c);
		w = check_case(s, &o, name_, ci, c);
		if (w < worst)
			worst = w;
	}
	cr_assert_geq(ci, 3, "%s: %zu cases", arch, ci);
	fprintf(stderr, "%s on %s/%s: minimum cosine over every position of every case: %.6f\n",
	        name_, backend, variant ? variant : "built-in", worst);
	q4kh_session_free(s);
	q4kh_tokenizer_free(tok);
	q4kh_model_free(m);
	q4kh_kernel_close(&k);
	q4kh_backend_close(&be);
	q4kh_registry_free(reg);
	hidden_fixture_free(&o);
	free(path);
}

