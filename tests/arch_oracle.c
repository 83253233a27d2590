/*
 * The forward passes of the tiny architecture fixtures against llama.cpp's
 * recorded hidden states (arch_oracle.h), on any backend: what
 * tests/test_archs.c checks on the cpu backends and
 * tests/test_cuda_archs.c on cuda.
 */
#include <criterion/criterion.h>
#include <math.h>
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

/* A backend (device 0), through kernel variant VARIANT or its built-in
 * kernels (NULL), with MODEL_PATH on it and a session of F16 cache. */
struct path_rig {
	struct q4kh_registry *reg;
	struct q4kh_backend be;
	struct q4kh_kernel k;
	struct q4kh_model *m;
	struct q4kh_session *s;
};

static void path_open(struct path_rig *p, const char *model_path, const char *plugin_path,
                      const char *backend, const char *variant)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_session_params sp = { .n_ctx = 256, .kv = Q4KH_KV_F16 };

	memset(p, 0, sizeof(*p));
	cr_assert_eq(q4kh_registry_scan(plugin_path, NULL, &p->reg, &err), 0, "%s", err.msg);
	cr_assert_not_null(q4kh_registry_find(p->reg, backend), "%s not found on %s", backend,
	                   p->reg->path);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(p->reg, backend), 0, &p->be, &err), 0,
	             "%s", err.msg);
	cr_assert_eq(q4kh_model_open(model_path, &p->m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(p->m, &p->be, &err), 0, "%s", err.msg);
	if (variant)
		cr_assert_eq(q4kh_policy_use_kernel(p->reg, &p->be, p->m, variant, &p->k, &err), 0,
		             "%s", err.msg);
	cr_assert_eq(q4kh_session_new(p->m, &sp, &p->s, &err), 0, "%s", err.msg);
}

static void path_close(struct path_rig *p)
{
	q4kh_session_free(p->s);
	q4kh_model_free(p->m);
	q4kh_kernel_close(&p->k);
	q4kh_backend_close(&p->be);
	q4kh_registry_free(p->reg);
}

void check_on(const char *name_, const char *arch, const char *plugin_path,
              const char *backend, const char *variant)
{
	char name[64];
	char *path;
	struct q4kh_error err = { { 0 } };
	struct path_rig p;
	struct q4kh_tokenizer *tok = NULL;
	struct hidden_fixture o;
	json_t *c;
	size_t ci;
	double worst = 1.0;

	load_oracle(name_, &o);
	snprintf(name, sizeof(name), "tiny-%s.gguf", name_);
	path = fixture(name);
	path_open(&p, path, plugin_path, backend, variant);
	cr_assert_str_eq(p.m->arch->name, arch);
	cr_assert_eq(p.m->hp.n_vocab, o.n_vocab);
	cr_assert_eq(q4kh_tokenizer_load(p.m->gguf, &tok, &err), 0, "%s", err.msg);
	json_array_foreach(json_object_get(o.root, "cases"), ci, c) {
		double w;
		expect_prompt_ids(tok, c);
		w = check_case(p.s, &o, name_, ci, c);
		if (w < worst)
			worst = w;
	}
	cr_assert_geq(ci, 3, "%s: %zu cases", arch, ci);
	fprintf(stderr, "%s on %s/%s: minimum cosine over every position of every case: %.6f\n",
	        name_, backend, variant ? variant : "built-in", worst);
	q4kh_tokenizer_free(tok);
	path_close(&p);
	hidden_fixture_free(&o);
	free(path);
}

/* One case of a float64 fixture: its prompt in one batched prefill, then
 * a decode step on each of its greedy tokens; each row's 1 - cosine
 * against the exact logits within MAX_DISTANCE; the largest. */
static double exact_case(struct q4kh_session *s, const struct hidden_fixture *x,
                         const char *what, size_t ci, json_t *c, double max_distance)
{
	json_t *rows = json_object_get(c, "rows");
	int32_t *ids = json_ids(json_object_get(c, "tokens"));
	int32_t *greedy = json_ids(json_object_get(c, "greedy"));
	int64_t np = (int64_t)json_array_size(json_object_get(c, "tokens"));
	int64_t nx = (int64_t)json_array_size(rows), V = x->n_vocab;
	int64_t first = json_integer_value(json_object_get(json_array_get(rows, 0), "hidden_row"));
	float *ours = malloc(sizeof(float) * (size_t)(nx * V));
	float *z = malloc(sizeof(float) * (size_t)(nx * V));
	struct q4kh_error err = { { 0 } };
	double worst = 0.0;

	cr_assert(ours && z);
	cr_assert_geq(nx, np + 1, "%s case %zu: %lld rows for %lld prompt tokens", what, ci,
	              (long long)nx, (long long)np);
	cr_assert_geq((int64_t)json_array_size(json_object_get(c, "greedy")), nx - np);
	q4kh_session_reset(s);
	cr_assert_eq(q4kh_session_eval(s, ids, np, ours, 1, &err), 0, "%s", err.msg);
	for (int64_t r = np; r < nx; r++)
		cr_assert_eq(q4kh_session_eval(s, &greedy[r - np], 1, ours + r * V, 1, &err), 0,
		             "%s", err.msg);
	test_q8_0_logits(s->m->output.src, x->hidden + first * x->n_embd, nx, z);
	for (int64_t r = 0; r < nx; r++) {
		double d = 1.0 - test_cosine(ours + r * V, z + r * V, V);

		cr_expect_leq(d, max_distance,
		              "%s case %zu %s %lld: 1 - cosine(ours, exact float64) %.3g > %.1e", what,
		              ci, r < np ? "prefill position" : "decode step",
		              (long long)(r < np ? r : r - np), d, max_distance);
		worst = fmax(worst, d);
	}
	free(ids);
	free(greedy);
	free(ours);
	free(z);
	return worst;
}

double arch_exact_bound(const struct q4kh_model *m, unsigned arith)
{
	const double u16_sq = ldexp(1.0, -22), int16 = 32639.0;
	const double products = 8.0 * m->hp.n_layer + 1.0;
	const double l_att = (double)(m->hp.n_layer - m->hp.n_recurrent);
	double b = 2.0 * l_att * u16_sq / 3.0 / 2.0;

	if (arith & ARITH_INT16)
		b += products * (8.0 / 3.0) / (int16 * int16) / 2.0;
	if (arith & ARITH_FP16)
		b += (2.0 * products + 2.0 * l_att) * u16_sq / 3.0 / 2.0;
	return b;
}

void check_exact_on(const char *model_path, const char *name, const char *plugin_path,
                    const char *backend, const char *variant, unsigned arith)
{
	char fx[64], what[160];
	struct path_rig p;
	struct hidden_fixture x;
	json_t *c;
	size_t ci;
	double worst = 0.0, bound;

	snprintf(fx, sizeof(fx), "oracle-f64-%s", name);
	hidden_fixture_load(fx, &x);
	path_open(&p, model_path, plugin_path, backend, variant);
	cr_assert_eq(p.m->hp.n_vocab, x.n_vocab, "%s: n_vocab %lld, %s.json says %lld",
	             model_path, (long long)p.m->hp.n_vocab, fx, (long long)x.n_vocab);
	bound = arch_exact_bound(p.m, arith);
	snprintf(what, sizeof(what), "%s on %s/%s", name, backend, variant ? variant : "built-in");
	json_array_foreach(json_object_get(x.root, "cases"), ci, c)
		worst = fmax(worst, exact_case(p.s, &x, what, ci, c, bound));
	cr_assert_geq(ci, 3, "%s: %zu cases", fx, ci);
	fprintf(stderr, "%s: largest 1 - cosine from the exact float64 result over %zu cases "
	                "%.2g, bound %.2g\n",
	        what, ci, worst, bound);
	path_close(&p);
	hidden_fixture_free(&x);
}
