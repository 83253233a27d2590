/*
 * Whole steps on the cuda backend.
 *
 * Through its graph entry (ABI 1.6, plugins/cuda/cuda_graph.c): prompt
 * steps of 32 columns, one-token decode steps and batched decode steps of
 * three sessions, each shape run eagerly, then recorded into a CUDA graph
 * and replayed, give the logits, bit for bit, of the host's interpreter
 * on the same backend (the backend's table without the entry, nor the
 * host's own recording), on tiny-llama and tiny-qwen2, with the backend's
 * own products and through cuda-mwv, and on tiny-qwen3moe, whose routing
 * and experts' products (grouped for the prompt, direct for decode) stay
 * on the device, and whose decode steps (one token, and the batched three)
 * run each block of experts as the two fused launches of cuda_graph.c's
 * match_moe; and on tiny-qwen3, whose per-head q and k norms go inside
 * rope_store's launch (match_head_norms), against the interpreter and
 * against the plan without that group ([plugin.cuda] fuse = 0), with two
 * launches fewer a layer. With the persistent kernel on ([plugin.cuda]
 * persistent = 1), the
 * one-token steps of tiny-llama and tiny-qwen2 run it and give the
 * interpreter's logits up to fp32 rounding, and q4khost run reports the
 * decode steps as persistent.
 *
 * Through the cuda-mwv kernel variant, recorded into the replayed CUDA
 * graph (graph_products.h): on tiny-qwen2, mul_mat nodes of one input go
 * to gemv_multi as one launch (Q4_K and Q6_K, with q, k, v's biases) and
 * gate, up and their GLU to gemv_glu, with the logits, bit for bit, of the
 * variant without the entries and of one that refuses them.
 * tests/test_graph.c checks the same on the reference cpu through
 * cpu-simd.
 *
 * Every test skips where the system shows no NVIDIA GPU
 * (test_no_cuda_device) and fails where the CUDA plugins it was built
 * with are not on its path.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "graph_products.h"
#include "helpers.h"
#include "kernel.h"
#include "kv_paged.h"
#include "model.h"
#include "policy.h"
#include "registry.h"
#include "session.h"

/*
 * The plugin path's registry, with the cuda and cuda-mwv plugins on it
 * (the test fails without them) and a CUDA device (the test WHAT skips
 * without one).
 */
static struct q4kh_registry *cuda_registry_with(const char *what, struct q4kh_config *config)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	uint32_t n = 0;

	cr_assert_eq(q4kh_registry_scan(NULL, config, &reg, &err), 0, "%s", err.msg);
	/* built with the CUDA plugins: they must be on the test's path */
	cr_assert(q4kh_registry_find(reg, "cuda") && q4kh_registry_find(reg, "cuda-mwv"),
	          "the cuda and cuda-mwv plugins are not on the plugin path %s", reg->path);
	if (q4kh_backend_devices(q4kh_registry_find(reg, "cuda"), &n, &err) || n == 0) {
		q4kh_registry_free(reg);
		test_no_cuda_device(what, err.msg[0] ? err.msg : "the cuda backend has 0 devices");
	}
	return reg;
}

static struct q4kh_registry *cuda_registry(const char *what)
{
	return cuda_registry_with(what, NULL);
}

/*
 * A config with [plugin.cuda] KEY = ON, read from empty folders so no
 * file of this machine leaks in; q4kh_config_free it after the registry.
 */
static struct q4kh_config *cuda_config(const char *key, const char *on)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *c;
	const char *dir = test_tmpdir();

	setenv("XDG_CONFIG_HOME", dir, 1);
	cr_assert_eq(q4kh_config_load(dir, NULL, &c, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_config_set(c, "plugin.cuda", key, on, "test", &err), 0, "%s", err.msg);
	return c;
}

/*
 * EXPECT on cuda through cuda-mwv, recorded into the replayed CUDA graph
 * (not exact: replayed steps do not run the interpreter). Skips without
 * the CUDA plugins or a device.
 */
static void on_cuda_mwv(expect_fn expect)
{
	struct q4kh_registry *reg = cuda_registry("the recorded steps on cuda-mwv");

	expect(reg, "cuda", "cuda-mwv", 0);
	q4kh_registry_free(reg);
}

/* gemv_multi: one launch for Q4_K and Q6_K with the biases. */
Test(gemv_multi, cuda_mwv_groups_with_the_same_logits, .timeout = 300)
{
	on_cuda_mwv(expect_grouping);
}

/* gemv_glu (tiny-qwen2's gate and up are both Q4_K). */
Test(gemv_glu, cuda_mwv_fuses_with_the_same_logits, .timeout = 300)
{
	on_cuda_mwv(expect_glu);
}

/* --- the graph entry against the host's interpreter ----------------------- */

#define N_BATCH 32              /* prompt steps of 32 columns: tensor cores, gemm */
#define PROMPT (3 * N_BATCH)    /* three steps of one shape */
#define DECODE 4                /* one-token steps */
#define SEQS 3                  /* sessions of the batched decode steps */
#define SEQ_PROMPT 5            /* tokens the other sessions start with */
#define BATCHED 4               /* batched decode steps */
#define ROWS (PROMPT + DECODE + (SEQS - 1) * SEQ_PROMPT + SEQS * BATCHED)

/* What one pass of the steps gave. */
struct pass {
	float *logits; /* ROWS rows of n_vocab: every step's, in order */
	/* the first session's steps by path after its prompt, its decode
	 * steps and the batched steps (whose graph it holds) */
	uint64_t ways[3][Q4KH_WAY_COUNT];
	uint32_t launches; /* its last step's, as the backend reported them */
	uint32_t decode_launches; /* its last one-token step's */
};

/* Token I of a stream that stays inside a vocabulary of N_VOCAB. */
static int32_t token(int64_t i, int64_t n_vocab)
{
	return (int32_t)((i * 7919 + 13) % n_vocab);
}

/*
 * On M: the first session's prompt (PROMPT tokens, every row's logits)
 * and DECODE one-token steps, two more sessions' prompts, then BATCHED
 * decode steps of the three in one graph (q4kh_session_eval_batch).
 */
static struct pass run_pass(struct q4kh_model *m)
{
	const int64_t nv = m->hp.n_vocab;
	struct q4kh_session_params sp = { .n_ctx = 256, .n_batch = N_BATCH };
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *s[SEQS];
	struct pass p = { .logits = calloc((size_t)(nv * ROWS), sizeof(float)) };
	float *row = p.logits;
	int32_t ids[PROMPT];
	int64_t next = 0;

	cr_assert_not_null(p.logits);
	for (int j = 0; j < SEQS; j++)
		cr_assert_eq(q4kh_session_new(m, &sp, &s[j], &err), 0, "%s", err.msg);
	for (int i = 0; i < PROMPT; i++)
		ids[i] = token(next++, nv);
	cr_assert_eq(q4kh_session_eval(s[0], ids, PROMPT, row, 1, &err), 0, "%s", err.msg);
	row += PROMPT * nv;
	memcpy(p.ways[0], s[0]->stats.ways, sizeof(p.ways[0]));
	for (int i = 0; i < DECODE; i++, row += nv) {
		int32_t id = token(next++, nv);

		cr_assert_eq(q4kh_session_eval(s[0], &id, 1, row, 0, &err), 0, "%s", err.msg);
	}
	memcpy(p.ways[1], s[0]->stats.ways, sizeof(p.ways[1]));
	p.decode_launches = s[0]->stats.launches;
	for (int j = 1; j < SEQS; j++, row += SEQ_PROMPT * nv) {
		for (int i = 0; i < SEQ_PROMPT; i++)
			ids[i] = token(next++, nv);
		cr_assert_eq(q4kh_session_eval(s[j], ids, SEQ_PROMPT, row, 1, &err), 0, "%s",
		             err.msg);
	}
	for (int b = 0; b < BATCHED; b++) {
		struct q4kh_batch_seq seq[SEQS];

		for (int j = 0; j < SEQS; j++, row += nv)
			seq[j] = (struct q4kh_batch_seq){ .s = s[j], .id = token(next++, nv),
				                          .logits = row };
		cr_assert_eq(q4kh_session_eval_batch(seq, SEQS, &err), 0, "%s", err.msg);
	}
	memcpy(p.ways[2], s[0]->stats.ways, sizeof(p.ways[2]));
	p.launches = s[0]->stats.launches;
	for (int j = 0; j < SEQS; j++)
		q4kh_session_free(s[j]);
	return p;
}

/* Steps of the first session that took path W, by the end of phase K. */
#define WAYS(p, k, w) ((p).ways[k][Q4KH_WAY_##w])

/* A fixture on cuda device 0, and what it was opened with. */
struct cuda_model {
	struct q4kh_config *config;
	struct q4kh_registry *reg;
	struct q4kh_backend be;
	struct q4kh_kernel k;
	struct q4kh_model *m;
	char *path;
};

/*
 * The model FILE (a fixture) uploaded to cuda device 0 with [plugin.cuda]
 * KEY = VALUE, its products VARIANT's (NULL: the backend's own); skips as
 * the test of WHAT without a device. Close with cuda_model_close.
 */
static void cuda_model_open(struct cuda_model *c, const char *what, const char *key,
                            const char *value, const char *file, const char *variant)
{
	struct q4kh_error err = { { 0 } };

	memset(c, 0, sizeof(*c));
	c->config = cuda_config(key, value);
	c->reg = cuda_registry_with(what, c->config);
	c->path = graph_model_file(file);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(c->reg, "cuda"), 0, &c->be, &err), 0,
	             "%s", err.msg);
	cr_assert_eq(q4kh_model_open(c->path, &c->m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(c->m, &c->be, &err), 0, "%s", err.msg);
	if (variant)
		cr_assert_eq(q4kh_policy_use_kernel(c->reg, &c->be, c->m, variant, &c->k, &err), 0,
		             "%s", err.msg);
}

static void cuda_model_close(struct cuda_model *c)
{
	q4kh_model_free(c->m);
	q4kh_kernel_close(&c->k);
	q4kh_backend_close(&c->be);
	q4kh_registry_free(c->reg);
	q4kh_config_free(c->config);
	free(c->path);
}

/* REAL's table without the graph entry nor the host's recording: the
 * interpreter on every step. */
static struct q4kh_backend_v1 interpreter_of(const struct q4kh_backend_v1 *real)
{
	struct q4kh_backend_v1 t = *real;

	t.graph_prepare = NULL;
	t.graph_compute = NULL;
	t.graph_release = NULL;
	t.graph_begin = NULL;
	return t;
}

/*
 * The model FILE (a fixture) on cuda, its products the backend's own
 * (VARIANT NULL) or VARIANT's: the steps through the graph entry give
 * the interpreter's logits bit for bit, and each shape runs eagerly once,
 * is recorded on its second run and replayed from then on.
 */
static void entry_against_interpreter(const char *file, const char *variant)
{
	struct cuda_model c;
	struct q4kh_backend_v1 interp;
	struct q4kh_model *m;
	const struct q4kh_backend_v1 *real;
	struct pass entry, host;
	size_t bytes;

	cuda_model_open(&c, "the cuda graph entry", "persistent", "0", file, variant);
	m = c.m;
	real = c.be.v;
	cr_assert(Q4KH_BACKEND_HAS(real, graph_prepare) && Q4KH_BACKEND_HAS(real, graph_compute) &&
	          Q4KH_BACKEND_HAS(real, graph_release), "cuda has no graph entry");
	bytes = sizeof(float) * (size_t)m->hp.n_vocab * ROWS;

	entry = run_pass(m);
	interp = interpreter_of(real);
	c.be.v = &interp;
	host = run_pass(m);
	c.be.v = real;

	cr_expect_eq(memcmp(entry.logits, host.logits, bytes), 0,
	             "%s%s%s: the graph entry's logits differ from the interpreter's", file,
	             variant ? " through " : "", variant ? variant : "");
	for (int64_t r = 0; r < ROWS; r++) {
		const size_t at = (size_t)(r * m->hp.n_vocab), n = (size_t)m->hp.n_vocab;

		if (memcmp(entry.logits + at, host.logits + at, n * sizeof(float))) {
			cr_log_error("%s: first differing row %lld of %d", file, (long long)r, ROWS);
			break;
		}
	}
	/* prompt: eager, recorded, replayed; decode and batched steps: eager,
	 * recorded, then replayed twice */
	cr_expect_eq(WAYS(entry, 0, GRAPH_NODES), 1);
	cr_expect_eq(WAYS(entry, 0, GRAPH_REPLAY), 2);
	cr_expect_eq(WAYS(entry, 1, GRAPH_NODES), 2);
	cr_expect_eq(WAYS(entry, 1, GRAPH_REPLAY), 2 + DECODE - 1);
	cr_expect_eq(WAYS(entry, 2, GRAPH_NODES), 3);
	cr_expect_eq(WAYS(entry, 2, GRAPH_REPLAY), 2 + DECODE - 1 + BATCHED - 1);
	cr_expect_eq(WAYS(entry, 2, OP_BY_OP) + WAYS(entry, 2, REPLAY), 0);
	cr_expect_gt(entry.launches, 0, "a replay of the batched step: %u launches",
	             entry.launches);
	cr_expect_eq(WAYS(host, 2, OP_BY_OP), 3 + DECODE + BATCHED);
	cr_expect_eq(WAYS(host, 2, GRAPH_NODES) + WAYS(host, 2, GRAPH_REPLAY) +
	                     WAYS(host, 2, REPLAY),
	             0);

	free(entry.logits);
	free(host.logits);
	cuda_model_close(&c);
}

/*
 * The passes of run_pass on the model FILE (a fixture) on cuda with
 * [plugin.cuda] pdl = ON, its products the backend's own (VARIANT NULL)
 * or VARIANT's: the logits, and the decode steps replayed from graphs.
 */
static struct pass pdl_pass(const char *file, const char *variant, const char *on)
{
	struct cuda_model c;
	struct pass p;

	cuda_model_open(&c, "programmatic dependent launch", "pdl", on, file, variant);
	p = run_pass(c.m);
	cr_expect_eq(WAYS(p, 2, GRAPH_REPLAY), 2 + DECODE - 1 + BATCHED - 1,
	             "%s with pdl = %s: the decode steps are not replayed", file, on);
	cuda_model_close(&c);
	return p;
}

/*
 * Programmatic dependent launch changes when a step's kernels start, not
 * what they compute: FILE's prompt, decode and batched decode steps,
 * recorded and replayed, give the same logits bit for bit with
 * [plugin.cuda] pdl = 1 and pdl = 0 (on a device before compute
 * capability 9.0 both launch the plain way, and agree trivially).
 */
static void pdl_changes_no_bit(const char *file, const char *variant)
{
	struct pass on = pdl_pass(file, variant, "1"), off = pdl_pass(file, variant, "0");
	char *model = graph_model_file(file);
	struct q4kh_error err = { { 0 } };
	struct q4kh_model *m = NULL;
	int64_t nv;

	cr_assert_eq(q4kh_model_open(model, &m, &err), 0, "%s", err.msg);
	nv = m->hp.n_vocab;
	q4kh_model_free(m);
	for (int64_t r = 0; r < ROWS; r++)
		if (memcmp(on.logits + r * nv, off.logits + r * nv, (size_t)nv * sizeof(float))) {
			cr_expect_fail("%s%s%s: row %lld of %d of the logits differs with pdl = 1 "
			               "and pdl = 0",
			               file, variant ? " through " : "", variant ? variant : "",
			               (long long)r, ROWS);
			break;
		}
	free(on.logits);
	free(off.logits);
	free(model);
}

Test(graph_entry, pdl_changes_no_bit_cuda_mwv, .timeout = 600)
{
	pdl_changes_no_bit("tiny-llama.gguf", "cuda-mwv");
	pdl_changes_no_bit("tiny-qwen2.gguf", "cuda-mwv");
}

Test(graph_entry, pdl_changes_no_bit_builtin, .timeout = 600)
{
	pdl_changes_no_bit("tiny-llama.gguf", NULL);
}

/*
 * The model FILE (a fixture) on cuda with the backend's own products and
 * the persistent kernel on: its one-token steps run the persistent
 * kernel (the prompt's and the batched steps do not), and every row of
 * logits is the interpreter's up to fp32 rounding: a normalised mean
 * squared error below 1e-6 and no logit further than 1e-3 of the row's
 * largest magnitude from the interpreter's.
 */
static void persistent_against_interpreter(const char *file)
{
	struct cuda_model c;
	struct q4kh_backend_v1 interp;
	struct q4kh_model *m;
	const struct q4kh_backend_v1 *real;
	struct pass entry, host;

	cuda_model_open(&c, "the persistent decode kernel", "persistent", "1", file, NULL);
	m = c.m;
	real = c.be.v;
	entry = run_pass(m);
	interp = interpreter_of(real);
	c.be.v = &interp;
	host = run_pass(m);
	c.be.v = real;

	for (int64_t r = 0; r < ROWS; r++) {
		const float *a = entry.logits + r * m->hp.n_vocab, *b = host.logits + r * m->hp.n_vocab;
		double num = 0.0, den = 0.0, worst = 0.0, top = 0.0;

		for (int64_t i = 0; i < m->hp.n_vocab; i++) {
			const double d = (double)a[i] - (double)b[i];

			num += d * d;
			den += (double)b[i] * (double)b[i];
			worst = fabs(d) > worst ? fabs(d) : worst;
			top = fabs((double)b[i]) > top ? fabs((double)b[i]) : top;
		}
		cr_expect(num <= 1e-6 * den && worst <= 1e-3 * top,
		          "%s: row %lld of %d: NMSE %.3g, largest difference %.3g of %.3g", file,
		          (long long)r, ROWS, den > 0.0 ? num / den : num, worst, top);
	}
	/* the prompt's steps as before; every one-token step persistent */
	cr_expect_eq(WAYS(entry, 0, GRAPH_NODES), 1);
	cr_expect_eq(WAYS(entry, 0, GRAPH_REPLAY), 2);
	cr_expect_eq(WAYS(entry, 1, GRAPH_PERSISTENT), DECODE);
	cr_expect_eq(WAYS(entry, 1, GRAPH_NODES) + WAYS(entry, 1, GRAPH_REPLAY), 3);
	cr_expect_eq(WAYS(entry, 2, GRAPH_PERSISTENT), DECODE);
	cr_expect_eq(WAYS(entry, 2, GRAPH_NODES) + WAYS(entry, 2, GRAPH_REPLAY), 3 + BATCHED);

	free(entry.logits);
	free(host.logits);
	cuda_model_close(&c);
}

Test(graph_entry, tiny_llama_persistent_as_the_interpreter, .timeout = 300)
{
	persistent_against_interpreter("tiny-llama.gguf");
}

Test(graph_entry, tiny_qwen2_persistent_as_the_interpreter, .timeout = 300)
{
	persistent_against_interpreter("tiny-qwen2.gguf");
}

Test(graph_entry, tiny_llama_as_the_interpreter, .timeout = 300)
{
	entry_against_interpreter("tiny-llama.gguf", NULL);
}

Test(graph_entry, tiny_qwen2_as_the_interpreter, .timeout = 300)
{
	entry_against_interpreter("tiny-qwen2.gguf", NULL);
}

/* the routing and the experts' products on the device, recorded and
 * replayed with the rest of the step; a decode's blocks of experts fused */
Test(graph_entry, tiny_qwen3moe_as_the_interpreter, .timeout = 300)
{
	entry_against_interpreter("tiny-qwen3moe.gguf", NULL);
}

/* the per-head q and k norms inside rope_store's launch (cuda_graph.c's
 * match_head_norms), against the interpreter's norm nodes */
Test(graph_entry, tiny_qwen3_as_the_interpreter, .timeout = 300)
{
	entry_against_interpreter("tiny-qwen3.gguf", NULL);
}

/*
 * tiny-qwen3, whose layers norm q's and k's heads, through the graph
 * entry: the same logits, bit for bit, with the heads' norms inside
 * rope_store's launch and without ([plugin.cuda] fuse = 0), and two launches
 * fewer a layer in a replayed decode step.
 */
Test(graph_entry, tiny_qwen3_norms_heads_in_rope_store, .timeout = 300)
{
	struct cuda_model c;
	struct pass fused, apart;

	cuda_model_open(&c, "the cuda graph entry", "fuse", "0", "tiny-qwen3.gguf", NULL);
	apart = run_pass(c.m);
	cuda_model_close(&c);
	cuda_model_open(&c, "the cuda graph entry", "fuse", "1", "tiny-qwen3.gguf", NULL);
	fused = run_pass(c.m);
	cr_expect_eq(memcmp(fused.logits, apart.logits,
	                    sizeof(float) * (size_t)c.m->hp.n_vocab * ROWS),
	             0, "the heads' norms inside rope_store change the logits");
	cr_expect_eq(fused.decode_launches + 2 * c.m->hp.n_layer, apart.decode_launches,
	             "a decode step: %u launches fused, %u apart, %u layers",
	             fused.decode_launches, apart.decode_launches, c.m->hp.n_layer);
	free(fused.logits);
	free(apart.logits);
	cuda_model_close(&c);
}

Test(graph_entry, tiny_llama_through_cuda_mwv_as_the_interpreter, .timeout = 300)
{
	entry_against_interpreter("tiny-llama.gguf", "cuda-mwv");
}

Test(graph_entry, tiny_qwen2_through_cuda_mwv_as_the_interpreter, .timeout = 300)
{
	entry_against_interpreter("tiny-qwen2.gguf", "cuda-mwv");
}

/* --- steps over a paged KV cache ------------------------------------------ */

#define PAGE 4        /* tokens a page: a sequence's table grows every 4 steps */
#define PAGED_STEPS 5 /* batched steps of each set of sequences */
#define PAGED_ROWS (4 + 2 * 3 * PAGED_STEPS)

/* The prompts' lengths: sessions 0, 1 and 2, then 3 in 1's place. */
static const int paged_prompt[4] = { 6, 3, 9, 7 };

/* What one pass of paged_pass gave. */
struct paged_pass {
	float *logits; /* PAGED_ROWS rows of n_vocab: every step's, in order */
	/* the first session's steps by path after the first set's batched
	 * steps, and after the second's */
	uint64_t ways[2][Q4KH_WAY_COUNT];
};

/*
 * On M, sessions on KV's pages (NULL: caches of their own): three
 * prompts (the last row's logits of each), PAGED_STEPS batched decode
 * steps of the three, then session 1 freed and a fourth session's prompt
 * (over pages, on the pages 1 gave back, out of the order they were
 * taken in) and PAGED_STEPS batched steps of 0, 3 and 2 in the same
 * graph: its positions and, every PAGE steps of a sequence, its block
 * table change between runs.
 */
static struct paged_pass paged_pass(struct q4kh_model *m, struct q4kh_kv_paged *kv)
{
	const int64_t nv = m->hp.n_vocab;
	const struct q4kh_session_params sp = { .n_ctx = 64, .n_batch = N_BATCH, .paged = kv };
	static const int sets[2][3] = { { 0, 1, 2 }, { 0, 3, 2 } };
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *s[4];
	struct paged_pass p = { .logits = calloc((size_t)(nv * PAGED_ROWS), sizeof(float)) };
	float *row = p.logits;
	int32_t ids[16];
	int64_t next = 0;

	cr_assert_not_null(p.logits);
	for (int k = 0; k < 4; k++) {
		if (k == 3)
			q4kh_session_free(s[1]);
		cr_assert_eq(q4kh_session_new(m, &sp, &s[k], &err), 0, "%s", err.msg);
		for (int i = 0; i < paged_prompt[k]; i++)
			ids[i] = token(next++, nv);
		cr_assert_eq(q4kh_session_eval(s[k], ids, paged_prompt[k], row, 0, &err), 0, "%s",
		             err.msg);
		row += nv;
		if (k < 2)
			continue;
		for (int b = 0; b < PAGED_STEPS; b++) {
			struct q4kh_batch_seq seq[3];

			for (int j = 0; j < 3; j++, row += nv)
				seq[j] = (struct q4kh_batch_seq){ .s = s[sets[k - 2][j]],
					                          .id = token(next++, nv), .logits = row };
			cr_assert_eq(q4kh_session_eval_batch(seq, 3, &err), 0, "%s", err.msg);
		}
		memcpy(p.ways[k - 2], s[0]->stats.ways, sizeof(p.ways[0]));
	}
	for (int k = 0; k < 4; k++)
		if (k != 1)
			q4kh_session_free(s[k]);
	return p;
}

/* Rows of A and B that differ: a failed expectation naming the first. */
static void paged_rows_equal(const float *a, const float *b, int64_t nv, const char *what)
{
	for (int64_t r = 0; r < PAGED_ROWS; r++)
		if (memcmp(a + r * nv, b + r * nv, sizeof(float) * (size_t)nv)) {
			cr_expect_fail("tiny-llama: %s: row %lld of %d differs (first of them)", what,
			               (long long)r, PAGED_ROWS);
			return;
		}
}

/*
 * tiny-llama on cuda over pages of PAGE tokens (ABI 1.8): the graph
 * entry takes the steps (op 16, attention_paged), records the batched
 * step on its second run and replays it from then on, for the second set
 * of sequences too, with the block tables and positions the host
 * rewrites between runs; every row of logits is, bit for bit, the
 * interpreter's over the same pages and the interpreter's over caches of
 * the sessions' own (the paged kernels read a key's row through the
 * table, in the same order: tests/emu/attention_emu.cpp).
 */
Test(graph_entry, paged_steps_replay_with_new_tables, .timeout = 300)
{
	struct cuda_model c;
	struct q4kh_backend_v1 interp;
	struct q4kh_error err = { { 0 } };
	struct q4kh_kv_paged *kv = NULL;
	const struct q4kh_backend_v1 *real;
	struct paged_pass entry, host, flat;
	int64_t nv;

	cuda_model_open(&c, "paged steps on the cuda graph entry", "persistent", "0",
	                "tiny-llama.gguf", NULL);
	nv = c.m->hp.n_vocab;
	cr_assert_eq(q4kh_kv_paged_new(c.m, 3 * 64 / PAGE, PAGE,
	                               q4kh_session_kv_type(Q4KH_KV_DEFAULT, &c.be), &kv, &err),
	             0, "%s", err.msg);
	real = c.be.v;
	entry = paged_pass(c.m, kv);
	interp = interpreter_of(real);
	c.be.v = &interp;
	host = paged_pass(c.m, kv);
	flat = paged_pass(c.m, NULL);
	c.be.v = real;
	cr_expect_eq(kv->pool.n_free, kv->pool.n_pages, "pages still held after the passes");

	paged_rows_equal(entry.logits, host.logits, nv,
	                 "the graph entry over pages against the interpreter over pages");
	paged_rows_equal(entry.logits, flat.logits, nv,
	                 "the graph entry over pages against the interpreter over caches of "
	                 "their own");
	/* session 0's prompt, then the first batched step eager; the second
	 * recorded, and every later one, the second set's too, replayed */
	cr_expect_eq(entry.ways[0][Q4KH_WAY_GRAPH_NODES], 2);
	cr_expect_eq(entry.ways[0][Q4KH_WAY_GRAPH_REPLAY], PAGED_STEPS - 1);
	cr_expect_eq(entry.ways[1][Q4KH_WAY_GRAPH_NODES], 2);
	cr_expect_eq(entry.ways[1][Q4KH_WAY_GRAPH_REPLAY], 2 * PAGED_STEPS - 1);
	cr_expect_eq(entry.ways[1][Q4KH_WAY_OP_BY_OP] + entry.ways[1][Q4KH_WAY_REPLAY], 0);
	cr_expect_eq(host.ways[1][Q4KH_WAY_OP_BY_OP], 1 + 2 * PAGED_STEPS);

	free(entry.logits);
	free(host.logits);
	free(flat.logits);
	q4kh_kv_paged_free(kv);
	cuda_model_close(&c);
}

/* q4khost run --json on cuda with the built-in kernels and the persistent
 * kernel on: the prompt's step runs call by call, every decode step
 * through the persistent kernel. */
Test(graph_entry, run_reports_the_persistent_kernel, .timeout = 300)
{
	struct q4kh_registry *reg = cuda_registry("q4khost run on the cuda graph entry");
	char *model = graph_model_file("tiny-llama.gguf"), *cmd = NULL, *out = NULL, *cfg = NULL;
	json_t *j, *steps, *paths;
	FILE *f;
	json_error_t jerr;
	json_int_t n;
	int rc;

	q4kh_registry_free(reg);
	if (asprintf(&cfg, "%s/persistent.ini", test_tmpdir()) < 0 || !(f = fopen(cfg, "w")))
		cr_assert_fail("cannot write %s", cfg ? cfg : "a config file");
	fputs("[plugin.cuda]\npersistent = 1\n", f);
	fclose(f);
	if (asprintf(&cmd, "%s/host/cli/q4khost run --json --backend cuda --kernel none --f2 off "
	                   "--config %s -m %s -p 'The capital of France is' -n 12 2>/dev/null",
	             test_builddir(), cfg, model) < 0)
		cr_assert_fail("out of memory");
	rc = test_shell(cmd, &out);
	cr_assert_eq(rc, 0, "%s: exit %d: %s", cmd, rc, out);
	j = json_loads(out, 0, &jerr);
	cr_assert_not_null(j, "not JSON (%s): %s", jerr.text, out);
	steps = json_object_get(j, "steps");
	paths = json_object_get(steps, "paths");
	n = json_integer_value(json_object_get(steps, "steps"));
	cr_assert_geq(n, 4, "%lld steps: %s", (long long)n, out);
	cr_expect_str_eq(json_string_value(json_object_get(steps, "path")), "graph_persistent",
	                 "%s", out);
	cr_expect_eq(json_integer_value(json_object_get(paths, "graph_nodes")), 1, "%s", out);
	cr_expect_eq(json_integer_value(json_object_get(paths, "graph_persistent")), n - 1, "%s",
	             out);
	cr_expect_gt(json_integer_value(json_object_get(steps, "launches")), 0, "%s", out);
	json_decref(j);
	free(cmd);
	free(out);
	free(model);
	free(cfg);
}
