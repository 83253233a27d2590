/*
 * The llama, qwen2 and qwen3 (issue 3), qwen35 (issue 14: the hybrid of
 * gated attention and gated delta-net layers, its decode steps through the
 * recurrent states) and qwen3moe (issue 31: a mixture of experts in every
 * layer) forward passes against llama.cpp on the tiny
 * random-weight models of scripts/gen-tiny-models.py (two of them with
 * RoPE scaling: frequency factors, YaRN), through the fixtures recorded by
 * scripts/gen-arch-fixtures.py:
 *   - our tokenizer gives llama.cpp's prompt ids;
 *   - every prompt position (one batched prefill) and every one of 16
 *     greedy decode steps (through the KV cache): cosine(ours, llama.cpp)
 *     >= 0.999, llama.cpp's logits rebuilt from its final hidden state
 *     through the Q8_0 LM head in double (test_q8_0_logits);
 *   - our greedy tokens are llama.cpp's, step for step: fed llama.cpp's
 *     tokens, our argmax is its next token at every step, so our own
 *     free-running greedy decoding gives the same sequence;
 *   - q4khost run prints llama.cpp's greedy text (up to its first
 *     end-of-generation token, where run stops);
 *   - bad files fail with an error naming the key and the value.
 * The KV cache is F16, as llama.cpp's. The same checks hold for the fast
 * cpu path, the cpu-fast backend with its built-in kernels and with the
 * cpu-simd kernel variant, which are also held to the float64 fixtures of
 * scripts/oracle-f64.py (every tiny model and the default model's two) at
 * the bound arch_oracle.h derives from their arithmetic; and F2 (q4khost
 * validate, fresh) passes both against the reference on every fixture and
 * on the default model, and rejects a backend whose router picks the
 * wrong expert for some tokens. The per-case checks are tests/arch_oracle.c's,
 * which tests/test_cuda_archs.c runs on the cuda backend.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* On the reference. */
static void check_model(const char *name, const char *arch)
{
	check_on(name, arch, NULL, "cpu", NULL);
}

/* On cpu-fast, alone and with cpu-simd (F16 cache: its default), against
 * llama.cpp and the float64 fixture. */
static void check_fast(const char *name, const char *arch)
{
	char *path = test_fast_plugin_path(), *model, file[64];

	snprintf(file, sizeof(file), "tiny-%s.gguf", name);
	model = fixture(file);
	check_on(name, arch, path, "cpu-fast", NULL);
	check_on(name, arch, path, "cpu-fast", "cpu-simd");
	check_exact_on(model, name, path, "cpu-fast", NULL, 0);
	check_exact_on(model, name, path, "cpu-fast", "cpu-simd", ARITH_INT16);
	free(model);
	free(path);
}

Test(archs, llama_matches_llama_cpp, .timeout = 300) { check_model("llama", "llama"); }
Test(archs, qwen2_matches_llama_cpp, .timeout = 300) { check_model("qwen2", "qwen2"); }
Test(archs, qwen3_matches_llama_cpp, .timeout = 300) { check_model("qwen3", "qwen3"); }
Test(archs, qwen35_matches_llama_cpp, .timeout = 300) { check_model("qwen35", "qwen35"); }
Test(archs, qwen3moe_matches_llama_cpp, .timeout = 300) { check_model("qwen3moe", "qwen3moe"); }
/* RoPE scaling: Llama 3.1's frequency factors, and YaRN. */
Test(archs, llama_rope_freqs_match_llama_cpp, .timeout = 300)
{
	check_model("llama-ropefreqs", "llama");
}
Test(archs, qwen2_yarn_matches_llama_cpp, .timeout = 300)
{
	check_model("qwen2-yarn", "qwen2");
}

Test(archs_cpu_fast, llama_matches_llama_cpp, .timeout = 300) { check_fast("llama", "llama"); }
Test(archs_cpu_fast, qwen2_matches_llama_cpp, .timeout = 300) { check_fast("qwen2", "qwen2"); }
Test(archs_cpu_fast, qwen3_matches_llama_cpp, .timeout = 300) { check_fast("qwen3", "qwen3"); }
Test(archs_cpu_fast, qwen35_matches_llama_cpp, .timeout = 300) { check_fast("qwen35", "qwen35"); }
Test(archs_cpu_fast, qwen3moe_matches_llama_cpp, .timeout = 300)
{
	check_fast("qwen3moe", "qwen3moe");
}
Test(archs_cpu_fast, llama_rope_freqs_match_llama_cpp, .timeout = 300)
{
	check_fast("llama-ropefreqs", "llama");
}
Test(archs_cpu_fast, qwen2_yarn_matches_llama_cpp, .timeout = 300)
{
	check_fast("qwen2-yarn", "qwen2");
}
/* The default model against its float64 fixtures (test_oracle holds the
 * reference to them). */
Test(archs_cpu_fast, gemma3_matches_float64, .timeout = 600)
{
	static const char *const names[] = { "gemma3", "gemma3-new" };
	char *path;

	test_skip_under_sanitizers("the default model's forward pass on cpu-fast, as the F2 "
	                           "tests of this build run it");
	path = test_fast_plugin_path();
	for (size_t i = 0; i < 2; i++) {
		check_exact_on(test_model_path(), names[i], path, "cpu-fast", NULL, 0);
		check_exact_on(test_model_path(), names[i], path, "cpu-fast", "cpu-simd",
		               ARITH_INT16);
	}
	free(path);
}

/* Prompt tokens, decode tokens and batched decode steps of a whole-step run. */
#define ENTRY_PROMPT 9
#define ENTRY_DECODE 3
#define ENTRY_BATCH 2

/*
 * The logits of whole steps of M on its backend, in one array (freed by
 * the caller): a prefill of ENTRY_PROMPT tokens (every row), ENTRY_DECODE
 * decode steps, then, when M is batchable, a second session's prefill and
 * ENTRY_BATCH decode steps of both sequences in one step. *ROWS gets the
 * rows of logits written, *WAY how many steps took each path.
 */
static float *entry_steps(struct q4kh_model *m, int64_t *rows_out,
                          uint64_t way[Q4KH_WAY_COUNT])
{
	const struct q4kh_session_params sp = { .n_ctx = 64, .kv = Q4KH_KV_F16 };
	const int64_t nv = m->hp.n_vocab;
	const int64_t rows = ENTRY_PROMPT + ENTRY_DECODE + 1 + 2 * ENTRY_BATCH;
	float *lg = calloc((size_t)(rows * nv), sizeof(float)), *at = lg;
	struct q4kh_session *s[2] = { NULL, NULL };
	struct q4kh_error err;
	int32_t ids[ENTRY_PROMPT];

	cr_assert_not_null(lg);
	for (int i = 0; i < ENTRY_PROMPT; i++)
		ids[i] = (int32_t)((i * 7919 + 11) % nv);
	for (int j = 0; j < 2; j++)
		cr_assert_eq(q4kh_session_new(m, &sp, &s[j], &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_eval(s[0], ids, ENTRY_PROMPT, at, 1, &err), 0, "%s", err.msg);
	at += ENTRY_PROMPT * nv;
	for (int i = 0; i < ENTRY_DECODE; i++, at += nv)
		cr_assert_eq(q4kh_session_eval(s[0], &ids[i], 1, at, 0, &err), 0, "%s", err.msg);
	if (q4kh_session_batchable(s[0])) {
		cr_assert_eq(q4kh_session_eval(s[1], ids + 2, 4, at, 0, &err), 0, "%s", err.msg);
		at += nv;
		for (int i = 0; i < ENTRY_BATCH; i++, at += 2 * nv) {
			struct q4kh_batch_seq b[2] = {
				{ .s = s[0], .id = ids[i + 3], .logits = at },
				{ .s = s[1], .id = ids[i + 5], .logits = at + nv },
			};

			cr_assert_eq(q4kh_session_eval_batch(b, 2, &err), 0, "%s", err.msg);
		}
	}
	*rows_out = (at - lg) / nv;
	for (int j = 0; j < 2; j++) {
		for (int w = 0; w < Q4KH_WAY_COUNT; w++)
			way[w] += s[j]->stats.ways[w];
		q4kh_session_free(s[j]);
	}
	return lg;
}

/*
 * Whole steps of MODEL_PATH on cpu-fast, through kernel variant VARIANT
 * or its built-in products (NULL), handed to its graph entries (ABI 1.6)
 * and run by the host's interpreter node by node on the same device and
 * weights (the same table without the entries): the same logits, bit for
 * bit, every step on the path it was sent.
 */
static void check_entry(const char *model_path, const char *variant)
{
	char *path = test_fast_plugin_path();
	struct q4kh_registry *reg = NULL;
	struct q4kh_backend be = { 0 };
	struct q4kh_kernel k = { 0 };
	struct q4kh_backend_v1 nodes;
	const struct q4kh_backend_v1 *whole;
	struct q4kh_model *m = NULL;
	struct q4kh_error err;
	uint64_t w_entry[Q4KH_WAY_COUNT] = { 0 }, w_nodes[Q4KH_WAY_COUNT] = { 0 };
	float *a, *b;
	int64_t n;

	if (!path)
		cr_skip_test("this build or CPU has no cpu-fast");
	cr_assert_eq(q4kh_registry_scan(path, NULL, &reg, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(reg, "cpu-fast"), 0, &be, &err), 0,
	             "%s", err.msg);
	cr_assert_eq(q4kh_model_open(model_path, &m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(m, &be, &err), 0, "%s", err.msg);
	if (variant)
		cr_assert_eq(q4kh_policy_use_kernel(reg, &be, m, variant, &k, &err), 0, "%s",
		             err.msg);
	whole = be.v;
	cr_assert(Q4KH_BACKEND_HAS(whole, graph_compute), "cpu-fast has no graph_compute");
	a = entry_steps(m, &n, w_entry);
	nodes = *whole;
	nodes.graph_prepare = NULL;
	nodes.graph_compute = NULL;
	nodes.graph_release = NULL;
	be.v = &nodes;
	b = entry_steps(m, &n, w_nodes);
	be.v = whole;
	for (int w = 0; w < Q4KH_WAY_COUNT; w++) {
		cr_expect_eq(w_entry[w], w == Q4KH_WAY_GRAPH_NODES ? w_nodes[Q4KH_WAY_OP_BY_OP] : 0,
		             "%s/%s: %llu steps took path %s through the entry", model_path,
		             variant ? variant : "built-in", (unsigned long long)w_entry[w],
		             q4kh_step_way_token((enum q4kh_step_way)w));
		cr_expect_eq(w_nodes[w], w == Q4KH_WAY_OP_BY_OP ? w_entry[Q4KH_WAY_GRAPH_NODES] : 0);
	}
	for (int64_t i = 0; i < n * m->hp.n_vocab; i++)
		if (memcmp(&a[i], &b[i], sizeof(float))) {
			cr_expect(0, "%s/%s: logit %lld of row %lld: %.9g through the entry, %.9g by nodes",
			        model_path, variant ? variant : "built-in",
			        (long long)(i % m->hp.n_vocab), (long long)(i / m->hp.n_vocab),
			        (double)a[i], (double)b[i]);
			break;
		}
	free(a);
	free(b);
	q4kh_model_free(m);
	q4kh_kernel_close(&k);
	q4kh_backend_close(&be);
	q4kh_registry_free(reg);
	free(path);
}

/* Every tiny fixture, with its built-in products and with cpu-simd. */
Test(archs_cpu_fast, graph_entry_matches_the_interpreter_bit_for_bit, .timeout = 600)
{
	static const char *const names[] = { "llama", "llama-ropefreqs", "qwen2", "qwen2-yarn",
		                             "qwen3", "qwen35", "qwen3moe" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char file[64], *p;

		snprintf(file, sizeof(file), "tiny-%s.gguf", names[i]);
		p = fixture(file);
		check_entry(p, NULL);
		check_entry(p, "cpu-simd");
		free(p);
	}
}

Test(archs_cpu_fast, graph_entry_matches_the_interpreter_on_the_default_model, .timeout = 900)
{
	check_entry(test_model_path(), "cpu-simd");
	check_entry(test_model_path(), NULL);
}

/*
 * F2 through the real CLI, fresh: every cpu-fast candidate (built-in
 * kernels, cpu-simd) of MODEL passes against the reference, and a run
 * then takes every step through cpu-fast's graph entry. The verdicts,
 * lowest cosines and near-ties go to stderr.
 */
static void f2_passes(const char *model)
{
	char *path = test_fast_plugin_path(), *cmd, *out;
	const char *receipts;
	json_t *doc, *c;
	json_error_t jerr;
	size_t i;
	int status;

	receipts = test_tmpdir(); /* and the receipt key's folder (XDG_CONFIG_HOME) */
	cr_assert_geq(asprintf(&cmd, "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s "
	                             "'%s/host/cli/q4khost' validate --json --f2 fresh "
	                             "--backend cpu-fast --plugin-path %s -m '%s' 2>/dev/null",
	                       receipts, receipts, test_builddir(), path, model), 0);
	status = test_shell(cmd, &out);
	doc = json_loads(out, 0, &jerr);
	cr_assert_not_null(doc, "q4khost validate printed no JSON (%s): %s", jerr.text, out);
	cr_expect_eq(status, 0, "%s", out);
	cr_expect_eq(json_array_size(json_object_get(doc, "candidates")), 2, "%s", out);
	json_array_foreach(json_object_get(doc, "candidates"), i, c) {
		const char *kernel = json_string_value(json_object_get(c, "kernel"));

		cr_expect_str_eq(json_string_value(json_object_get(c, "verdict")), "pass",
		                 "%s cpu-fast/%s: %s", model, kernel,
		                 json_string_value(json_object_get(c, "message")));
		fprintf(stderr, "F2 %s cpu-fast/%s: %s, min cosine %.6f, %lld near-ties\n", model,
		        kernel, json_string_value(json_object_get(c, "verdict")),
		        json_real_value(json_object_get(c, "min_cosine")),
		        (long long)json_integer_value(json_object_get(c, "near_ties")));
	}
	json_decref(doc);
	free(out);
	free(cmd);
	/* the path F2 judged serves: every step through the graph entry */
	receipts = test_tmpdir();
	cr_assert_geq(asprintf(&cmd, "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s "
	                             "'%s/host/cli/q4khost' run --json --backend cpu-fast "
	                             "--plugin-path %s -m '%s' -n 4 -p 'Hello' 2>/dev/null",
	                       receipts, receipts, test_builddir(), path, model), 0);
	status = test_shell(cmd, &out);
	doc = json_loads(out, 0, &jerr);
	cr_assert_not_null(doc, "q4khost run printed no JSON (%s): %s", jerr.text, out);
	cr_expect_eq(status, 0, "%s", out);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(doc, "steps"), "path")),
	                 "graph_nodes", "%s: %s", model, out);
	json_decref(doc);
	free(out);
	free(cmd);
	free(path);
}

Test(archs_cpu_fast, f2_passes_on_every_fixture, .timeout = 600)
{
	static const char *const names[] = { "llama", "qwen2", "qwen3", "qwen35",
		                             "llama-ropefreqs", "qwen2-yarn", "qwen3moe" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char *model = NULL;
		char name[64];

		snprintf(name, sizeof(name), "tiny-%s.gguf", names[i]);
		model = fixture(name);
		f2_passes(model);
		free(model);
	}
}

/*
 * F2 through the expert path: replay-route (tests/plugins/replay.c), a
 * backend of kind cpu tried before the reference, sends every fourth
 * token of a step, from the second on, to the wrong expert. On the tiny
 * qwen3moe model F2 rejects it at the first token it misroutes, prompt
 * position 1, and run serves with the reference.
 */
Test(archs, f2_rejects_a_router_that_picks_the_wrong_expert, .timeout = 300)
{
	static const char *const names[] = { "replay_route", NULL };
	char *model = fixture("tiny-qwen3moe.gguf"), args[8192], *out;
	static const char *const want[] = {
		"q4khost: backend cpu ",
		"q4khost: F2 rejected first: replay-route/built-in: F2 broken: position 1 (prefill): ",
		"[fresh: no receipt]",
	};

	snprintf(args, sizeof(args), "run -n 1 -p 'The capital of France is' -m %s --plugin-path %s",
	         model, test_plugin_dir(names));
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s: %s", args, out);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_expect(strstr(out, want[i]) != NULL, "%s: no '%s' in: %s", args, want[i], out);
	free(out);
	free(model);
}

Test(archs_cpu_fast, f2_passes_on_the_default_model, .timeout = 900)
{
	f2_passes(test_model_path());
}

/*
 * q4khost run, end to end: the first prompt of each architecture, raw
 * (no chat template), 16 greedy tokens; the text must be llama.cpp's
 * detokenized greedy tokens. What this adds to the logit checks above is
 * the CLI's path (tokenizer, sampler, detokenizer, stop rule): on the tied
 * qwen2 model, whose LM head maps each token to itself, the continuation
 * repeats one token with top-2 margins near 100 logits, so it says nothing
 * about the forward pass that the logit checks have not.
 */
static void check_cli(const char *arch, int batch)
{
	char name[64];
	const char *fx;
	char *model, *cmd, *out;
	struct hidden_fixture o;
	json_t *c, *doc;
	json_error_t jerr;
	FILE *f;
	size_t len = 0, cap = 1 << 16;

	load_oracle(arch, &o);
	c = json_array_get(json_object_get(o.root, "cases"), 0);
	snprintf(name, sizeof(name), "tiny-%s.gguf", arch);
	model = fixture(name);
	fx = test_tmpdir();
	cr_assert_geq(asprintf(&cmd, "'%s/host/cli/q4khost' run -m '%s' -n %d --temp 0 --raw --json "
	                             "-b %d -p '%s' 2>%s/stderr",
	                       test_builddir(), model, STEPS, batch ? batch : 512,
	                       json_string_value(json_object_get(c, "prompt")), fx), 0);
	f = popen(cmd, "r");
	cr_assert_not_null(f, "%s", cmd);
	out = malloc(cap);
	len = fread(out, 1, cap - 1, f);
	out[len] = 0;
	cr_assert_eq(pclose(f), 0, "%s failed:\n%s", cmd, out);
	doc = json_loads(out, 0, &jerr);
	cr_assert_not_null(doc, "q4khost run --json printed no JSON (%s): %s", jerr.text, out);
	cr_expect_str_eq(json_string_value(json_object_get(doc, "text")),
	                 json_string_value(json_object_get(c, "text")),
	                 "%s: q4khost run and llama.cpp differ", arch);
	cr_expect_str_eq(json_string_value(json_object_get(doc, "architecture")), arch);
	if (batch) {
		/* the prompt in chunks of BATCH tokens, then one step a token */
		json_int_t p = json_integer_value(json_object_get(json_object_get(doc, "prefill"), "tokens"));
		json_int_t d = json_integer_value(json_object_get(json_object_get(doc, "decode"), "tokens"));
		json_int_t steps = json_integer_value(json_object_get(json_object_get(doc, "steps"), "steps"));

		cr_expect_eq(steps, (p + batch - 1) / batch + d - 1,
		             "%s, --batch %d: %lld steps for %lld prompt and %lld generated tokens",
		             arch, batch, (long long)steps, (long long)p, (long long)d);
	}
	json_decref(doc);
	hidden_fixture_free(&o);
	free(out);
	free(cmd);
	free(model);
}

Test(cli, run_llama) { check_cli("llama", 0); }
Test(cli, run_qwen2) { check_cli("qwen2", 0); }
Test(cli, run_qwen3) { check_cli("qwen3", 0); }
Test(cli, run_qwen35) { check_cli("qwen35", 0); }
Test(cli, run_qwen3moe) { check_cli("qwen3moe", 0); }
/* --batch: the same text when the prompt goes through in chunks of 3 */
Test(cli, run_llama_in_chunks) { check_cli("llama", 3); }
Test(cli, run_qwen35_in_chunks) { check_cli("qwen35", 3); }

/*
 * The hybrid memory of qwen35 (issue 14), through the session: a prompt
 * runs the same whatever the steps it is cut into (the states carry the
 * rest), a reset starts a new sequence, and the file's layer list or its
 * interval say which layers are linear.
 */

struct hybrid {
	struct q4kh_registry *reg;
	struct q4kh_backend be;
	struct q4kh_model *m;
	struct q4kh_session *s;
};

static struct hidden_fixture q35; /* the qwen35 fixture, for its token ids */

static void q35_load(void)
{
	load_oracle("qwen35", &q35);
}

static void q35_free(void)
{
	hidden_fixture_free(&q35);
}

static void hybrid_open(struct hybrid *h, const char *file, uint32_t n_batch)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_session_params sp = { .n_ctx = 128, .n_batch = n_batch,
		                          .kv = Q4KH_KV_F16 };
	char *path = file[0] == '/' ? strdup(file) : fixture(file);

	memset(h, 0, sizeof(*h));
	cr_assert_eq(q4kh_registry_scan(NULL, NULL, &h->reg, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(h->reg, "cpu"), 0, &h->be, &err), 0,
	             "%s", err.msg);
	cr_assert_eq(q4kh_model_open(path, &h->m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(h->m, &h->be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(h->m, &sp, &h->s, &err), 0, "%s", err.msg);
	free(path);
}

static void hybrid_close(struct hybrid *h)
{
	q4kh_session_free(h->s);
	q4kh_model_free(h->m);
	q4kh_backend_close(&h->be);
	q4kh_registry_free(h->reg);
}

/* The logits of every token of case CI's prompt and greedy tokens. */
static float *hybrid_logits(struct hybrid *h, size_t ci, int64_t *rows)
{
	json_t *c = json_array_get(json_object_get(q35.root, "cases"), ci);
	json_t *tok = json_object_get(c, "tokens"), *gen = json_object_get(c, "greedy");
	int64_t np = (int64_t)json_array_size(tok), n = np + (int64_t)json_array_size(gen);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	float *lg = malloc(sizeof(float) * (size_t)(n * q35.n_vocab));
	struct q4kh_error err = { { 0 } };

	cr_assert(ids && lg);
	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)json_integer_value(json_array_get(i < np ? tok : gen,
		                                                    (size_t)(i < np ? i : i - np)));
	cr_assert_eq(q4kh_session_eval(h->s, ids, n, lg, 1, &err), 0, "%s", err.msg);
	free(ids);
	*rows = n;
	return lg;
}

/* Case CI from a fresh session on FILE in steps of N_BATCH tokens. */
static float *fresh_logits(const char *file, uint32_t n_batch, size_t ci, int64_t *rows)
{
	struct hybrid h;
	float *lg;

	hybrid_open(&h, file, n_batch);
	lg = hybrid_logits(&h, ci, rows);
	hybrid_close(&h);
	return lg;
}

static void expect_same_bits(const float *a, const float *b, int64_t rows, const char *what)
{
	cr_expect_eq(memcmp(a, b, sizeof(float) * (size_t)(rows * q35.n_vocab)), 0, "%s", what);
}

Test(qwen35, steps_of_any_length_give_one_result, .init = q35_load, .fini = q35_free,
     .timeout = 300)
{
	static const uint32_t batches[] = { 1, 5 };
	int64_t rows, rows2;
	/* 57 + 16 tokens: two prompt steps of 64 and 9 */
	float *ref = fresh_logits("tiny-qwen35.gguf", 64, 4, &rows);

	for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
		float *got = fresh_logits("tiny-qwen35.gguf", batches[b], 4, &rows2);

		cr_assert_eq(rows, rows2);
		for (int64_t r = 0; r < rows; r++) {
			const float *x = ref + r * q35.n_vocab, *y = got + r * q35.n_vocab;
			double cs = test_cosine(x, y, q35.n_vocab);

			/* states pass through f32 between steps, nothing else differs */
			cr_expect_geq(cs, 0.999999, "steps of %u tokens, token %lld: cosine %.9f",
			              batches[b], (long long)r, cs);
			cr_expect_eq(q4kh_argmax(x, (int32_t)q35.n_vocab),
			             q4kh_argmax(y, (int32_t)q35.n_vocab),
			             "steps of %u tokens, token %lld", batches[b], (long long)r);
		}
		free(got);
	}
	free(ref);
}

Test(qwen35, reset_starts_a_new_sequence, .init = q35_load, .fini = q35_free,
     .timeout = 300)
{
	struct hybrid used;
	int64_t rows, rows2;
	float *ref = fresh_logits("tiny-qwen35.gguf", 64, 0, &rows), *got;

	hybrid_open(&used, "tiny-qwen35.gguf", 64);
	free(hybrid_logits(&used, 2, &rows2));
	q4kh_session_reset(used.s);
	got = hybrid_logits(&used, 0, &rows2);
	cr_assert_eq(rows, rows2);
	expect_same_bits(ref, got, rows, "after a reset, the last sequence leaks in");
	free(ref);
	free(got);
	hybrid_close(&used);
}

/* Without attention.recurrent_layers, full_attention_interval (2 in the
 * file) gives the same layers, so the same bits. */
Test(qwen35, layer_list_and_interval_agree, .init = q35_load, .fini = q35_free,
     .timeout = 300)
{
	char *src = fixture("tiny-qwen35.gguf");
	char *patched = test_patch_gguf(src, "qwen35.attention.recurrent_layers", NULL,
	                                "qwen35.attention.recurrent_layer_");
	struct hybrid list;
	int64_t rows, rows2;
	float *ref, *got = fresh_logits(patched, 64, 1, &rows2);

	hybrid_open(&list, "tiny-qwen35.gguf", 64);
	cr_expect_eq(list.m->hp.n_recurrent, 2);
	cr_expect(list.m->layers[0].recurrent && !list.m->layers[1].recurrent &&
	          list.m->layers[2].recurrent && !list.m->layers[3].recurrent);
	ref = hybrid_logits(&list, 1, &rows);
	cr_assert_eq(rows, rows2);
	expect_same_bits(ref, got, rows, "the interval gives other layers than the list");
	free(ref);
	free(got);
	hybrid_close(&list);
	free(src);
	free(patched);
}

/* A copy of tiny-qwen2.gguf patched as test_patch_gguf says. */
static char *patched(const char *key, const char *from, const char *to)
{
	char *src = fixture("tiny-qwen2.gguf"), *out = test_patch_gguf(src, key, from, to);

	free(src);
	return out;
}

static void expect_model_error(const char *path, const char *a, const char *b)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_model *m = NULL;
	struct q4kh_tokenizer *t = NULL;
	int rc = q4kh_model_open(path, &m, &err);

	if (rc == 0) {
		rc = q4kh_tokenizer_load(m->gguf, &t, &err);
		q4kh_tokenizer_free(t);
		q4kh_model_free(m);
	}
	cr_assert_eq(rc, -1, "%s loaded", path);
	cr_expect(strstr(err.msg, a) && strstr(err.msg, b), "message lacks \"%s\" or \"%s\": %s",
	          a, b, err.msg);
}

Test(errors, unsupported_architecture_names_key_and_value)
{
	char *p = patched("general.architecture", "qwen2", "qwen9");

	expect_model_error(p, "general.architecture", "\"qwen9\"");
	free(p);
}

Test(errors, unsupported_pre_tokenizer_names_key_and_value)
{
	char *p = patched("tokenizer.ggml.pre", "qwen2", "qwen7");

	expect_model_error(p, "tokenizer.ggml.pre", "\"qwen7\"");
	free(p);
}

Test(errors, unsupported_tokenizer_model_names_key_and_value)
{
	char *p = patched("tokenizer.ggml.model", "gpt2", "bert");

	expect_model_error(p, "tokenizer.ggml.model", "\"bert\"");
	free(p);
}

Test(errors, missing_hyper_parameter_names_the_key)
{
	char *p = patched("qwen2.block_count", NULL, "qwen2.block_coun_");

	expect_model_error(p, "required key", "qwen2.block_count");
	free(p);
}

Test(errors, missing_merges_name_the_key)
{
	char *p = patched("tokenizer.ggml.merges", NULL, "tokenizer.ggml.merge_");

	expect_model_error(p, "tokenizer.ggml.merges", "no ");
	free(p);
}

Test(errors, missing_bias_names_the_tensor)
{
	char *p = patched("blk.1.attn_k.bias", NULL, "blk.1.attn_k.bia_");

	expect_model_error(p, "blk.1.attn_k.bias", "missing");
	free(p);
}

Test(errors, missing_linear_attention_key_names_the_key)
{
	char *src = fixture("tiny-qwen35.gguf");
	char *p = test_patch_gguf(src, "qwen35.ssm.conv_kernel", NULL, "qwen35.ssm.conv_kerne_");

	expect_model_error(p, "required key", "qwen35.ssm.conv_kernel");
	free(src);
	free(p);
}

/* Sections that give a rotated pair llama.cpp's fourth (text: position 0)
 * section are refused, not computed as if every pair rotated. */
Test(errors, rope_sections_leaving_a_pair_unrotated_are_refused)
{
	static const char key[] = "qwen35.rope.dimension_sections";
	static const int32_t sections[4] = { 6, 5, 4, 0 };
	char *src = fixture("tiny-qwen35.gguf"), *path;
	size_t len;
	char *data = test_read_file(src, &len), *p;

	cr_assert_not_null(data);
	p = memmem(data, len, key, sizeof(key) - 1);
	cr_assert_not_null(p);
	/* the value type (4 bytes), the element type (4), the count (8) */
	memcpy(p + sizeof(key) - 1 + 16, sections, sizeof(sections));
	cr_assert_geq(asprintf(&path, "%s/sections.gguf", test_tmpdir()), 0);
	test_write_file(path, data, len);
	expect_model_error(path, "rope.dimension_sections is [6, 5, 4, 0]",
	                   "each of the 16 rotated pairs");
	free(data);
	free(src);
	free(path);
}

