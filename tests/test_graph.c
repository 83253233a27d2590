/*
 * The step graph (host/lib/graph.h, graph_run.h, session.c):
 *  - the planner never lets two activations that are alive at once share
 *    a byte, on every architecture's real step graphs (a batched decode
 *    step of three sequences among them), and still reuses memory;
 *  - the builders refuse misuse with a message instead of a bad graph;
 *  - through the real CLI, a backend that records and replays steps gives
 *    the reference's text with most steps replayed; a 1.1 backend (no
 *    per-step values in device memory) is never replayed and gives the
 *    same text; F2 rejects a backend that is right op by op and wrong
 *    when replayed, at a decode step;
 *  - on the hybrid qwen35, replayed steps advance the recurrent states as
 *    the reference's do; a backend without its ops is refused by name
 *    before any step; F2 rejects a backend whose one-token delta rule
 *    reads the state in another layout than its prompt form writes, at
 *    the first decode step after the prompt;
 *  - the interpreter's peephole: cpu-fast with its fused entries (ABI
 *    1.4) gives the logits it gives without them, bit for bit, on every
 *    architecture's fixture and on Gemma 3 (the default model), and
 *    fuses every pair a decode step has, every attention layer's rope
 *    and cache writes as one rope_store (Gemma's too: its scale of q is
 *    the attention's);
 *  - greedy generation with the pick made on the device (top2, ABI 1.4,
 *    one call a token) gives the tokens and margins of the host's pick
 *    from downloaded logits (the entry NULL, or a table that ends before
 *    it), on cpu-fast and the fixtures.
 *  - mul_mat nodes that share their input go to a kernel variant's
 *    gemv_multi (ABI 1.4) as one call: on tiny-qwen2 through cpu-simd,
 *    q, k, v (with their biases) and ffn gate, up are one call each, and
 *    the logits of a prompt and decode steps are bit for bit those of
 *    the same variant seen as ABI 1.3 (one gemv per node, then the
 *    backend's add) and of a variant that refuses the combination.
 *  - ffn gate, up and their GLU go to a variant's gemv_glu (ABI 1.4) as
 *    one call a layer: on tiny-qwen2 through cpu-simd, with the logits,
 *    bit for bit, of the variant without the entry and of one that
 *    refuses it (tests/test_cuda_graph.c: both on cuda through cuda-mwv,
 *    on the GPU machine; graph_products.c holds what the two share).
 *  - Gemma 3 (q/k norms, post-norms, tanh-GELU FFN; Q5_0 and Q8_0)
 *    through cpu-simd: q, k, v one gemv_multi and gate, up, GLU one
 *    gemv_glu a layer, with the logits of the variant as ABI 1.3.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "graph.h"
#include "graph_products.h"
#include "greedy.h"
#include "helpers.h"
#include "kernel.h"
#include "model.h"
#include "policy.h"
#include "registry.h"
#include "session.h"

/* Do activations A and B of G live at once (planner's lifetimes)? */
static int alive_together(const struct q4kh_value *a, const struct q4kh_value *b)
{
	return a->first <= b->last && b->first <= a->last;
}

/* Every pair of activations that live at once is disjoint; memory is
 * reused (the plan is smaller than the sum of the activations). */
static void check_plan(const struct q4kh_graph *g, const char *what)
{
	uint64_t sum = 0;
	int32_t n_act = 0;

	for (int32_t i = 0; i < g->n_vals; i++) {
		const struct q4kh_value *a = &g->vals[i];
		uint64_t a_end = a->offset + (uint64_t)a->t.nb[3] * (uint64_t)a->t.ne[3];

		if (a->kind != Q4KH_VAL_ACT)
			continue;
		n_act++;
		sum += a_end - a->offset;
		cr_expect_leq(a_end, g->scratch_bytes, "%s: %s ends past the plan", what,
		              a->name);
		cr_expect_eq(a->offset % 256, 0, "%s: %s at %llu", what, a->name,
		             (unsigned long long)a->offset);
		for (int32_t j = i + 1; j < g->n_vals; j++) {
			const struct q4kh_value *b = &g->vals[j];
			uint64_t b_end = b->offset + (uint64_t)b->t.nb[3] * (uint64_t)b->t.ne[3];

			if (b->kind != Q4KH_VAL_ACT || !alive_together(a, b))
				continue;
			cr_expect(a_end <= b->offset || b_end <= a->offset,
			          "%s: %s [%llu, %llu) and %s [%llu, %llu) are alive at once and overlap",
			          what, a->name, (unsigned long long)a->offset,
			          (unsigned long long)a_end, b->name,
			          (unsigned long long)b->offset, (unsigned long long)b_end);
		}
	}
	cr_expect_gt(n_act, 10, "%s: %d activations", what, n_act);
	cr_expect_lt(g->scratch_bytes, sum, "%s: plan of %llu bytes reuses nothing of %llu",
	             what, (unsigned long long)g->scratch_bytes, (unsigned long long)sum);
}

/* Lifetimes cover every node that reads or writes an activation. */
static void check_lifetimes(const struct q4kh_graph *g, const char *what)
{
	for (int32_t n = 0; n < g->n_nodes; n++) {
		const struct q4kh_node *node = &g->nodes[n];
		int32_t used[Q4KH_GRAPH_SRC + 1];

		memcpy(used, node->src, sizeof(node->src));
		used[Q4KH_GRAPH_SRC] = node->out;
		for (int k = 0; k <= Q4KH_GRAPH_SRC; k++) {
			int32_t v = used[k];

			if (v < 0)
				continue;
			while (g->vals[v].kind == Q4KH_VAL_VIEW)
				v = g->vals[v].base;
			if (g->vals[v].kind != Q4KH_VAL_ACT)
				continue;
			cr_expect(g->vals[v].first <= n && n <= g->vals[v].last,
			          "%s: node %d (%s) uses %s outside its life %d .. %d", what,
			          n, q4kh_op_name(node->op), g->vals[v].name,
			          g->vals[v].first, g->vals[v].last);
		}
	}
}

/* The reference cpu backend on the tests' plugin path, and the fixture
 * FILE (graph_model_file) opened and uploaded to it. */
static void cpu_model(const char *file, struct q4kh_registry **reg, struct q4kh_backend *be,
                      struct q4kh_model **m)
{
	struct q4kh_error err = { { 0 } };
	char *path = graph_model_file(file);

	cr_assert_eq(q4kh_registry_scan(NULL, NULL, reg, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(*reg, "cpu"), 0, be, &err), 0, "%s",
	             err.msg);
	cr_assert_eq(q4kh_model_open(path, m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(*m, be, &err), 0, "%s", err.msg);
	free(path);
}

static void plan_model(const char *file)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	struct q4kh_backend be;
	struct q4kh_model *m = NULL;
	struct q4kh_session *s = NULL, *s2 = NULL, *s3 = NULL;
	struct q4kh_session_params sp = { .n_ctx = 128 };
	/* one sequence of T tokens; then a batched decode step of 3 (n 3) */
	static const int64_t shapes[][3] = {
		{ 1, 1, 1 }, { 7, 1, 1 }, { 64, 0, 1 }, { 33, 33, 1 }, { 3, 3, 3 },
	};
	const struct q4kh_session *seqs[3];

	cpu_model(file, &reg, &be, &m);
	cr_assert_eq(q4kh_session_new(m, &sp, &s, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(m, &sp, &s2, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(m, &sp, &s3, &err), 0, "%s", err.msg);
	seqs[0] = s;
	seqs[1] = s2;
	seqs[2] = s3;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		const struct q4kh_seqs seq = { .m = m, .n = (int32_t)shapes[i][2], .s = seqs };
		struct q4kh_graph *g;
		char what[128];

		if (seq.n > 1 && !q4kh_session_batchable(s))
			continue; /* recurrent layers: one sequence a step */
		g = q4kh_graph_new(shapes[i][0], shapes[i][1]);
		snprintf(what, sizeof(what), "%s, %lld tokens, %lld logits, %d sequences", file,
		         (long long)shapes[i][0], (long long)shapes[i][1], seq.n);
		cr_assert_not_null(g);
		cr_assert_eq(m->arch->build(g, &seq, &err), 0, "%s: %s", what, err.msg);
		cr_assert_eq(q4kh_graph_check(g, &err), 0, "%s: %s", what, err.msg);
		cr_assert_eq(q4kh_graph_plan(g, 256), 0);
		cr_expect_eq(g->logits >= 0, shapes[i][1] > 0, "%s: logits %d", what, g->logits);
		check_lifetimes(g, what);
		check_plan(g, what);
		q4kh_graph_free(g);
	}
	/* The logits of chosen tokens (F2's deep probe): runs and single ones. */
	{
		static const uint8_t rows[9] = { 1, 0, 0, 1, 1, 1, 0, 0, 1 };
		const struct q4kh_seqs seq = { .m = m, .n = 1, .s = seqs };
		struct q4kh_graph *g = q4kh_graph_new(9, 0);
		const char *what = file;

		cr_assert_not_null(g);
		cr_assert_eq(q4kh_graph_out_rows(g, rows), 0);
		cr_expect_eq(g->n_out, 5);
		cr_assert_eq(m->arch->build(g, &seq, &err), 0, "%s: %s", what, err.msg);
		cr_assert_eq(q4kh_graph_check(g, &err), 0, "%s: %s", what, err.msg);
		cr_assert_eq(q4kh_graph_plan(g, 256), 0);
		cr_expect_eq(g->vals[g->logits].t.ne[1], 5, "%s", what);
		check_lifetimes(g, what);
		check_plan(g, what);
		q4kh_graph_free(g);
	}
	q4kh_session_free(s);
	q4kh_session_free(s2);
	q4kh_session_free(s3);
	q4kh_model_free(m);
	q4kh_backend_close(&be);
	q4kh_registry_free(reg);
}

Test(graph, plans_of_every_architecture_never_overlap_live_activations)
{
	plan_model("tiny-llama.gguf");
	plan_model("tiny-qwen2.gguf");
	plan_model("tiny-qwen3.gguf");
	plan_model("tiny-qwen35.gguf");
}

/*
 * On the reference, the logits of flagged tokens (q4kh_session_eval_rows:
 * the output norm and projection on those columns alone) are the bits of
 * the same rows when every row's are computed: F2's deep probe records
 * them either way.
 */
static void rows_as_all(const char *file)
{
	static const uint8_t rows[40] = { 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1,
		                          0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,
		                          1, 0, 1, 0, 1, 0, 1, 1 };
	const int64_t n = sizeof(rows);
	struct q4kh_session_params sp = { .n_ctx = 64, .n_batch = 16 };
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	struct q4kh_backend be;
	struct q4kh_model *m = NULL;
	struct q4kh_session *s = NULL;
	int32_t ids[sizeof(rows)];
	float *all, *some;
	int64_t v, j = 0;

	cpu_model(file, &reg, &be, &m);
	cr_assert_eq(q4kh_session_new(m, &sp, &s, &err), 0, "%s", err.msg);
	v = m->hp.n_vocab;
	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)((i * 7 + 3) % v);
	all = malloc(sizeof(float) * (size_t)(n * v));
	some = malloc(sizeof(float) * (size_t)(n * v));
	cr_assert(all && some);
	cr_assert_eq(q4kh_session_eval(s, ids, n, all, 1, &err), 0, "%s", err.msg);
	q4kh_session_reset(s);
	cr_assert_eq(q4kh_session_eval_rows(s, ids, n, some, rows, 1, &err), 0, "%s", err.msg);
	for (int64_t i = 0; i < n; i++) {
		if (!rows[i])
			continue;
		cr_expect_eq(memcmp(all + i * v, some + j * v, sizeof(float) * (size_t)v), 0,
		             "%s: token %lld's logits differ when the flagged ones are computed "
		             "alone", file, (long long)i);
		j++;
	}
	free(all);
	free(some);
	q4kh_session_free(s);
	q4kh_model_free(m);
	q4kh_backend_close(&be);
	q4kh_registry_free(reg);
}

Test(graph, flagged_rows_logits_are_the_bits_of_every_rows_on_the_reference, .timeout = 300)
{
	rows_as_all("tiny-llama.gguf");
	rows_as_all("tiny-qwen35.gguf");
}

Test(graph, builders_refuse_misuse_with_a_message)
{
	struct q4kh_graph *g = q4kh_graph_new(4, 1);
	struct q4kh_error err = { { 0 } };
	int32_t x;

	cr_assert_not_null(g);
	x = q4kh_graph_act(g, 8, 4, 1, "x");
	cr_assert_geq(x, 0);
	cr_expect_eq(q4kh_graph_check(g, &err), 0);
	cr_expect_eq(q4kh_graph_reshape(g, x, 5, 7, 1), -1);
	cr_expect_eq(q4kh_graph_check(g, &err), -1);
	cr_expect(strstr(err.msg, "reshape of x {8, 4, 1} to {5, 7, 1}") != NULL, "%s",
	          err.msg);
	/* The first misuse is the one reported; later calls do nothing. */
	cr_expect_eq(q4kh_graph_cols(g, x, 3, 2), -1);
	cr_expect_eq(q4kh_graph_check(g, &err), -1);
	cr_expect(strstr(err.msg, "reshape") != NULL, "%s", err.msg);
	q4kh_graph_free(g);

	g = q4kh_graph_new(4, 1);
	x = q4kh_graph_act(g, 8, 4, 1, "x");
	cr_expect_eq(q4kh_graph_cols(g, x, 3, 2), -1);
	cr_expect_eq(q4kh_graph_check(g, &err), -1);
	cr_expect(strstr(err.msg, "columns 3 .. 4 of x, which has 4") != NULL, "%s", err.msg);
	q4kh_graph_free(g);

	g = q4kh_graph_new(4, 1);
	cr_expect_eq(q4kh_graph_scale(g, 99, 2.0f, 98), -1);
	cr_expect_eq(q4kh_graph_check(g, &err), -1);
	cr_expect(strstr(err.msg, "scale into value 98, which does not exist") != NULL, "%s",
	          err.msg);
	q4kh_graph_free(g);

	g = q4kh_graph_new(4, 1);
	x = q4kh_graph_act(g, 8, 4, 1, "x");
	cr_expect_geq(q4kh_graph_view(g, x, 2, 2, 4, 8, 32, 16), 0);
	cr_expect_eq(q4kh_graph_check(g, &err), 0);
	cr_expect_eq(q4kh_graph_view(g, x, 2, 2, 4, 8, 32, 28), -1);
	cr_expect_eq(q4kh_graph_check(g, &err), -1);
	cr_expect(strstr(err.msg, "view of x ends at byte 140 of its 128") != NULL, "%s",
	          err.msg);
	q4kh_graph_free(g);

	cr_expect_null(q4kh_graph_new(0, 0));
	cr_expect_null(q4kh_graph_new(4, 5));
}

/* --- the interpreter's peephole (graph_run.c) --- */

/* cpu-fast's own table, which the counting entries below call. */
static const struct q4kh_backend_v1 *fast_v;
static int64_t n_add_rms_norm, n_rope_set_rows, n_rope_store, n_norm_add_rms_norm;

static q4kh_status counted_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                        const struct q4kh_tensor *a,
                                        const struct q4kh_tensor *w, float eps,
                                        const struct q4kh_tensor *out)
{
	n_add_rms_norm++;
	return fast_v->add_rms_norm(dev, x, a, w, eps, out);
}

static q4kh_status counted_rope_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                         const struct q4kh_tensor *pos,
                                         const struct q4kh_rope_params *p,
                                         const struct q4kh_tensor *cache)
{
	n_rope_set_rows++;
	return fast_v->rope_set_rows(dev, x, pos, p, cache);
}

static q4kh_status counted_rope_store(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                      const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                                      const struct q4kh_tensor *pos,
                                      const struct q4kh_rope_params *p,
                                      const struct q4kh_tensor *k_cache,
                                      const struct q4kh_tensor *v_cache)
{
	n_rope_store++;
	return fast_v->rope_store(dev, q, k, v, pos, p, k_cache, v_cache);
}

/* norm_add_rms_norm (ABI 1.5) as its ops, which cpu-fast has: the host's
 * operands for it are checked by the logits they give. */
static q4kh_status counted_norm_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                             const struct q4kh_tensor *a,
                                             const struct q4kh_tensor *w_a, float eps_a,
                                             const struct q4kh_tensor *w, float eps,
                                             const struct q4kh_tensor *out)
{
	q4kh_status st = fast_v->rms_norm(dev, a, w_a, eps_a, a);

	n_norm_add_rms_norm++;
	return st ? st : fast_v->add_rms_norm(dev, x, a, w, eps, out);
}

/* What peephole_logits leaves in cpu-fast's table. */
enum fused_set {
	FUSED_NONE,  /* no fused entry: every op alone */
	FUSED_PAIRS, /* add_rms_norm and rope_set_rows */
	FUSED_ALL,   /* and rope_store, norm_add_rms_norm */
};

/*
 * cpu-fast with a copy of its table that a test may edit, and a model and
 * session on it: fast_open, edit f->table, fast_session, fast_close.
 */
struct fast_rig {
	struct q4kh_registry *reg;
	struct q4kh_backend be;
	struct q4kh_backend_v1 table; /* be.v points here */
	struct q4kh_model *m;
	struct q4kh_session *s;
};

/* cpu-fast's backend, its table copied into f->table (fast_v: its own);
 * a skip where cpu-fast was not built or this CPU does not run it. */
static void fast_open(struct fast_rig *f)
{
	struct q4kh_error err = { { 0 } };
	char *dir = NULL;

	test_need_cpu_fast();
	memset(f, 0, sizeof(*f));
	if (asprintf(&dir, "%s/plugins/cpu-fast/.libs", test_builddir()) < 0)
		cr_assert_fail("out of memory");
	cr_assert_eq(q4kh_registry_scan(dir, NULL, &f->reg, &err), 0, "%s", err.msg);
	free(dir);
	cr_assert_not_null(q4kh_registry_find(f->reg, "cpu-fast"), "cpu-fast not found on %s",
	                   f->reg->path);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(f->reg, "cpu-fast"), 0, &f->be, &err), 0,
	             "%s", err.msg);
	fast_v = f->be.v;
	f->table = *f->be.v;
	f->be.v = &f->table;
}

/* The model FILE (graph_model_file) uploaded through f->table and a
 * session of SP on it. */
static void fast_session(struct fast_rig *f, const char *file,
                         const struct q4kh_session_params *sp)
{
	struct q4kh_error err = { { 0 } };
	char *path = graph_model_file(file);

	cr_assert_eq(q4kh_model_open(path, &f->m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(f->m, &f->be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(f->m, sp, &f->s, &err), 0, "%s", err.msg);
	free(path);
}

static void fast_close(struct fast_rig *f)
{
	q4kh_session_free(f->s);
	q4kh_model_free(f->m);
	f->be.v = fast_v;
	q4kh_backend_close(&f->be);
	q4kh_registry_free(f->reg);
}

/*
 * The logits of every token of a fixed sequence on FILE (graph_model_file)
 * through cpu-fast with a KV cache of KV, with the fused entries of FUSED
 * (counted) and the others taken out of its table: a prompt of 6 tokens
 * in steps of 4 and 2, then 3 one-token steps, in each of which every
 * residual add must be fused with the norm after it (the last with the
 * output norm), and with the post-norm before it too where the model has
 * POST_NORMS (FUSED_ALL: norm_add_rms_norm), and every attention layer's
 * inputs go through one rope_store call (FUSED_ALL) or its keys through
 * one rope_set_rows (FUSED_PAIRS). A skip where cpu-fast was not built
 * or this CPU does not run it.
 */
static float *peephole_logits(const char *file, enum q4kh_kv_choice kv, enum fused_set fused,
                              int post_norms, int64_t *n_vocab)
{
	static const int32_t ids[] = { 1, 5, 9, 2, 7, 3, 4, 8, 6 };
	const int64_t n = sizeof(ids) / sizeof(ids[0]), prompt = 6;
	struct q4kh_session_params sp = { .n_ctx = 64, .n_batch = 4, .kv = kv };
	struct q4kh_error err = { { 0 } };
	struct fast_rig f;
	uint32_t attn_layers = 0;
	float *lg;

	fast_open(&f);
	cr_assert(Q4KH_BACKEND_HAS(f.be.v, add_rms_norm) &&
	          Q4KH_BACKEND_HAS(f.be.v, rope_set_rows) && Q4KH_BACKEND_HAS(f.be.v, rope_store));
	/* the host's interpreter groups the nodes here, not cpu-fast's own
	 * graph entry (ABI 1.6), which never calls through this table */
	f.table.graph_prepare = NULL;
	f.table.graph_compute = NULL;
	f.table.graph_release = NULL;
	f.table.add_rms_norm = fused != FUSED_NONE ? counted_add_rms_norm : NULL;
	f.table.rope_set_rows = fused != FUSED_NONE ? counted_rope_set_rows : NULL;
	f.table.rope_store = fused == FUSED_ALL ? counted_rope_store : NULL;
	f.table.norm_add_rms_norm = fused == FUSED_ALL ? counted_norm_add_rms_norm : NULL;
	fast_session(&f, file, &sp);
	*n_vocab = f.m->hp.n_vocab;
	cr_assert_gt(*n_vocab, 9);
	for (uint32_t il = 0; il < f.m->hp.n_layer; il++)
		attn_layers += !f.m->layers[il].recurrent;
	lg = malloc(sizeof(float) * (size_t)(n * *n_vocab));
	cr_assert_not_null(lg);
	cr_assert_eq(q4kh_session_eval(f.s, ids, prompt, lg, 1, &err), 0, "%s", err.msg);
	for (int64_t t = prompt; t < n; t++) {
		const int64_t adds = 2 * (int64_t)f.m->hp.n_layer;
		const int64_t with_norm = fused == FUSED_ALL && post_norms ? adds : 0;

		n_add_rms_norm = n_rope_set_rows = n_rope_store = n_norm_add_rms_norm = 0;
		cr_assert_eq(q4kh_session_eval(f.s, ids + t, 1, lg + t * *n_vocab, 1, &err), 0,
		             "%s", err.msg);
		cr_expect_eq(n_add_rms_norm, fused != FUSED_NONE ? adds - with_norm : 0,
		             "%s: add_rms_norm called %lld times in a decode step, %u layers",
		             file, (long long)n_add_rms_norm, f.m->hp.n_layer);
		cr_expect_eq(n_norm_add_rms_norm, with_norm,
		             "%s: norm_add_rms_norm called %lld times in a decode step, %u layers",
		             file, (long long)n_norm_add_rms_norm, f.m->hp.n_layer);
		cr_expect_eq(n_rope_set_rows, fused == FUSED_PAIRS ? (int64_t)attn_layers : 0,
		             "%s: rope_set_rows called %lld times in a decode step, %u attention layers",
		             file, (long long)n_rope_set_rows, attn_layers);
		cr_expect_eq(n_rope_store, fused == FUSED_ALL ? (int64_t)attn_layers : 0,
		             "%s: rope_store called %lld times in a decode step, %u attention layers",
		             file, (long long)n_rope_store, attn_layers);
	}
	fast_close(&f);
	return lg;
}

Test(peephole, fused_entries_give_the_logits_of_the_ops_they_stand_for, .timeout = 300)
{
	static const char *const files[] = {
		"tiny-llama.gguf", "tiny-llama-ropefreqs.gguf", "tiny-qwen2-yarn.gguf",
		"tiny-qwen3.gguf", "tiny-qwen35.gguf",
	};

	for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++)
		for (int kv = Q4KH_KV_F32; kv <= Q4KH_KV_F16; kv++) {
			int64_t n_vocab = 0, n_vocab2 = 0;
			float *plain = peephole_logits(files[f], kv, FUSED_NONE, 0, &n_vocab), *fused;

			/* the fused entries are their ops' arithmetic: bit for bit */
			for (enum fused_set set = FUSED_PAIRS; set <= FUSED_ALL; set++) {
				fused = peephole_logits(files[f], kv, set, 0, &n_vocab2);
				cr_expect_eq(memcmp(plain, fused, sizeof(float) * 9 * (size_t)n_vocab), 0,
				             "%s, %s cache: logits differ with the fused entries%s",
				             files[f], kv == Q4KH_KV_F16 ? "f16" : "f32",
				             set == FUSED_ALL ? " and rope_store" : "");
				free(fused);
			}
			free(plain);
		}
}

/*
 * Gemma 3 (the default model): q/k norms before RoPE, its scale of q in
 * the attention, post-norms before each residual add. Every decode step
 * reaches rope_store once a layer and add_rms_norm twice, or
 * norm_add_rms_norm twice where the backend has it, with the logits of
 * the ops one by one.
 */
Test(peephole, gemma3_reaches_rope_store_and_the_fused_norms, .timeout = 300)
{
	const char *model = test_model_path();
	int64_t n_vocab = 0, n_vocab2 = 0;
	float *plain = peephole_logits(model, Q4KH_KV_F16, FUSED_NONE, 1, &n_vocab), *fused;

	for (enum fused_set set = FUSED_PAIRS; set <= FUSED_ALL; set++) {
		fused = peephole_logits(model, Q4KH_KV_F16, set, 1, &n_vocab2);
		cr_expect_eq(memcmp(plain, fused, sizeof(float) * 9 * (size_t)n_vocab), 0,
		             "gemma3: logits differ with the fused entries%s",
		             set == FUSED_ALL ? ", rope_store and norm_add_rms_norm" : "");
		free(fused);
	}
	free(plain);
}

/* --- greedy selection on the device (top2, ABI 1.4) --- */

static int64_t n_top2;

static q4kh_status counted_top2(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                const struct q4kh_tensor *idx,
                                const struct q4kh_tensor *val)
{
	n_top2++;
	return fast_v->top2(dev, x, idx, val);
}

/*
 * Greedy generation of 8 tokens after a prompt of 6 on FILE through
 * cpu-fast (n_batch 4: a prompt of two steps): with its top2 entry
 * (counted: one call a token) when MODE is 0, with the entry NULL when 1,
 * with a table that ends before it (1.4 before top2) when 2. A skip where
 * cpu-fast was not built or this CPU does not run it.
 */
static void greedy_on_fast(const char *file, int mode, struct q4kh_greedy *out)
{
	static const int32_t ids[] = { 1, 5, 9, 2, 7, 3 };
	struct q4kh_session_params sp = { .n_ctx = 64, .n_batch = 4 };
	struct q4kh_error err = { { 0 } };
	struct fast_rig f;

	fast_open(&f);
	cr_assert(Q4KH_BACKEND_HAS(f.be.v, top2));
	if (mode == 0)
		f.table.top2 = counted_top2;
	else if (mode == 1)
		f.table.top2 = NULL;
	else
		f.table.struct_size = offsetof(struct q4kh_backend_v1, top2);
	fast_session(&f, file, &sp);
	n_top2 = 0;
	cr_assert_eq(q4kh_greedy_run(f.s, NULL, ids, 6, 8, out, &err), 0, "%s", err.msg);
	cr_expect_eq(out->n, 8);
	cr_expect_eq(n_top2, mode == 0 ? 8 : 0, "%s: top2 called %lld times for 8 tokens",
	             file, (long long)n_top2);
	fast_close(&f);
}

Test(greedy, the_device_pick_gives_the_hosts_tokens_and_margins, .timeout = 300)
{
	static const char *const files[] = {
		"tiny-llama.gguf", "tiny-qwen2-yarn.gguf", "tiny-qwen3.gguf", "tiny-qwen35.gguf",
	};

	for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
		struct q4kh_greedy g[3];

		for (int mode = 0; mode < 3; mode++)
			greedy_on_fast(files[f], mode, &g[mode]);
		for (int mode = 1; mode < 3; mode++) {
			cr_expect_eq(memcmp(g[0].tokens, g[mode].tokens, sizeof(int32_t) * 8), 0,
			             "%s: tokens differ without top2 (%s)", files[f],
			             mode == 1 ? "entry NULL" : "table before it");
			cr_expect_eq(memcmp(g[0].margins, g[mode].margins, sizeof(double) * 8), 0,
			             "%s: margins differ without top2 (%s)", files[f],
			             mode == 1 ? "entry NULL" : "table before it");
		}
		for (int mode = 0; mode < 3; mode++)
			q4kh_greedy_free(&g[mode]);
	}
}

/* q4khost run ... --json on the default model; the parsed object. */
static json_t *run_json(const char *plugins, const char *args)
{
	char *cmd = NULL, *out = NULL;
	json_error_t jerr;
	json_t *j;
	int rc;

	if (asprintf(&cmd, "%s/host/cli/q4khost run --json --plugin-path %s -m %s "
	                   "-p 'The capital of France is' -n 12 %s 2>/dev/null",
	             test_builddir(), plugins, test_model_path(), args) < 0)
		cr_assert_fail("out of memory");
	rc = test_shell(cmd, &out);
	cr_assert_eq(rc, 0, "%s: exit %d: %s", cmd, rc, out);
	j = json_loads(out, 0, &jerr);
	cr_assert_not_null(j, "%s: not JSON (%s): %s", cmd, jerr.text, out);
	free(cmd);
	free(out);
	return j;
}

static const char *text_of(json_t *j)
{
	return json_string_value(json_object_get(j, "text"));
}

static json_int_t steps_of(json_t *j, const char *key)
{
	return json_integer_value(json_object_get(json_object_get(j, "steps"), key));
}

static const char *steps_str(json_t *j, const char *key)
{
	const char *s = json_string_value(json_object_get(json_object_get(j, "steps"), key));
	return s ? s : "";
}

Test(replay, recorded_steps_give_the_references_text, .timeout = 600)
{
	static const char *const names[] = { "replay_ok", "replay_v1_1", NULL };
	const char *plugins;
	json_t *ref, *ok, *old;

	test_model_path();
	plugins = test_plugin_dir(names);
	ref = run_json(plugins, "--backend cpu --kernel none");
	ok = run_json(plugins, "--backend replay-ok --f2 off");
	old = run_json(plugins, "--backend replay-v1-1 --f2 off");

	cr_expect_str_eq(steps_str(ref, "mode"), "op by op");
	cr_expect(strstr(steps_str(ref, "why_not"),
	                 "cpu does not record steps for replay (it has no graph_begin)") != NULL,
	          "%s", steps_str(ref, "why_not"));

	/* 1 prefill step, 11 decode steps: the 2nd decode step is recorded,
	 * the 2nd to the 11th are replays. */
	cr_expect_str_eq(text_of(ok), text_of(ref));
	cr_expect_str_eq(steps_str(ok, "mode"), "graph replay");
	cr_expect_eq(steps_of(ok, "steps"), 12);
	cr_expect_eq(steps_of(ok, "recordings"), 1);
	cr_expect_eq(steps_of(ok, "replays"), 10);

	cr_expect_str_eq(text_of(old), text_of(ref));
	cr_expect_str_eq(steps_str(old, "mode"), "op by op");
	cr_expect_eq(steps_of(old, "replays"), 0);
	cr_expect(strstr(steps_str(old, "why_not"),
	                 "replay-v1-1 does not record steps for replay (it has no get_rows_ext)") !=
	                  NULL,
	          "%s", steps_str(old, "why_not"));
	json_decref(ref);
	json_decref(ok);
	json_decref(old);
}

/*
 * q4khost validate --json on MODEL with the test plugins NAMES: every
 * candidate must be judged; *ok gets replay-ok's message (which must
 * pass) and *bad the other backend's verdict and message (which must
 * not); the exit status is 1, for the rejected one.
 */
static json_t *validate_pair(const char *const *names, const char *model, const char *bad_name,
                             const char **ok, const char **bad)
{
	const char *plugins = test_plugin_dir(names), *receipts;
	char *cmd = NULL, *out = NULL;
	json_error_t jerr;
	json_t *root, *c;
	size_t i;
	int rc;

	*ok = *bad = NULL;
	receipts = test_tmpdir(); /* and the receipt key's folder (XDG_CONFIG_HOME) */
	if (asprintf(&cmd, "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost "
	                   "validate --json --plugin-path %s -m %s 2>/dev/null",
	             receipts, receipts, test_builddir(), plugins, model) < 0)
		cr_assert_fail("out of memory");
	rc = test_shell(cmd, &out);
	cr_expect_eq(rc, 1, "a rejected candidate makes the exit code 1: %s", out);
	root = json_loads(out, 0, &jerr);
	cr_assert_not_null(root, "not JSON (%s): %s", jerr.text, out);
	json_array_foreach(json_object_get(root, "candidates"), i, c) {
		const char *be = json_string_value(json_object_get(c, "backend"));
		const char *verdict = json_string_value(json_object_get(c, "verdict"));
		const char *msg = json_string_value(json_object_get(c, "message"));

		if (!strcmp(be, "replay-ok")) {
			cr_expect_str_eq(verdict, "pass", "%s", msg);
			*ok = msg;
		} else if (!strcmp(be, bad_name)) {
			cr_expect(strcmp(verdict, "pass"), "%s passed: %s", bad_name, msg);
			*bad = msg;
		}
	}
	cr_assert(*ok && *bad, "both candidates measured: %s", out);
	free(cmd);
	free(out);
	return root;
}

/* On the tiny llama model: the replay's positions, not the model, are
 * under test. */
Test(replay, f2_rejects_a_backend_wrong_only_when_replayed, .timeout = 300)
{
	static const char *const names[] = { "replay_ok", "replay_stale", NULL };
	const char *ok, *msg;
	char model[4200];
	json_t *root;

	snprintf(model, sizeof(model), "%s/tests/fixtures/tiny-llama.gguf", test_srcdir());
	root = validate_pair(names, model, "replay-stale", &ok, &msg);

	/* decode steps 0 and 1 run op by op and as the recording */
	cr_expect(strstr(msg, "(decode step ") != NULL, "%s", msg);
	cr_expect(strstr(msg, "(decode step 0)") == NULL && strstr(msg, "(decode step 1)") == NULL,
	          "rejected before any replay: %s", msg);
	json_decref(root);
}

/* q4khost run ... --json on tiny-qwen35.gguf: the exit status, the
 * parsed object (NULL when stdout holds none) and in *text stdout, or with
 * STDERR set stdout and stderr. */
static json_t *run_qwen35(const char *plugins, const char *args, int stderr_too, int *rc,
                          char **text)
{
	char *cmd = NULL, *out = NULL, *model = NULL;
	json_t *j;

	if (asprintf(&model, "%s/tests/fixtures/tiny-qwen35.gguf", test_srcdir()) < 0 ||
	    asprintf(&cmd, "%s/host/cli/q4khost run --json --plugin-path %s -m %s --raw "
	                   "-p 'The capital of France is' -n 12 %s %s",
	             test_builddir(), plugins, model, args,
	             stderr_too ? "2>&1" : "2>/dev/null") < 0)
		cr_assert_fail("out of memory");
	*rc = test_shell(cmd, &out);
	j = json_loads(out, 0, NULL);
	*text = out;
	free(cmd);
	free(model);
	return j;
}

Test(replay, qwen35_replays_advance_the_recurrent_states, .timeout = 600)
{
	static const char *const names[] = { "replay_ok", "replay_v1_1", NULL };
	const char *plugins = test_plugin_dir(names);
	char *out_ref, *out_ok, *out_old;
	int rc;
	json_t *ref = run_qwen35(plugins, "--backend cpu --kernel none", 0, &rc, &out_ref);
	json_t *ok;

	cr_assert_eq(rc, 0, "%s", out_ref);
	cr_assert_not_null(ref, "%s", out_ref);
	ok = run_qwen35(plugins, "--backend replay-ok --f2 off", 0, &rc, &out_ok);
	cr_assert_eq(rc, 0, "%s", out_ok);
	cr_assert_not_null(ok, "%s", out_ok);
	cr_expect_str_eq(text_of(ok), text_of(ref));
	cr_expect_str_eq(steps_str(ok, "mode"), "graph replay");
	cr_expect_geq(steps_of(ok, "replays"), 8, "%s", out_ok);

	cr_expect_null(run_qwen35(plugins, "--backend replay-v1-1 --f2 off", 1, &rc, &out_old));
	cr_expect_neq(rc, 0, "%s", out_old);
	cr_expect(strstr(out_old, "backend replay-v1-1 cannot run qwen35: it has no unary") != NULL,
	          "%s", out_old);
	json_decref(ref);
	json_decref(ok);
	free(out_ref);
	free(out_ok);
	free(out_old);
}

Test(replay, f2_rejects_a_decode_form_that_misreads_the_recurrent_state, .timeout = 600)
{
	static const char *const names[] = { "replay_ok", "replay_decode_state", NULL };
	const char *ok, *msg;
	char *model = NULL;
	json_t *root;

	if (asprintf(&model, "%s/tests/fixtures/tiny-qwen35.gguf", test_srcdir()) < 0)
		cr_assert_fail("out of memory");
	root = validate_pair(names, model, "replay-decode-state", &ok, &msg);
	/* every prompt position is right; the first decode step is not */
	cr_expect(strstr(msg, "(decode step 0)") != NULL, "%s", msg);
	json_decref(root);
	free(model);
}

Test(replay, f2_rejects_a_prompt_form_that_pairs_a_token_with_the_last_key, .timeout = 600)
{
	static const char *const names[] = { "replay_ok", "replay_prompt_key", NULL };
	const char *ok, *msg;
	char *model = NULL;
	json_t *root;

	if (asprintf(&model, "%s/tests/fixtures/tiny-qwen35.gguf", test_srcdir()) < 0)
		cr_assert_fail("out of memory");
	root = validate_pair(names, model, "replay-prompt-key", &ok, &msg);
	/* position 0 is right (no key before it); position 1 of the prompt is not */
	cr_expect(strstr(msg, "position 1 ") != NULL || strstr(msg, "position 1:") != NULL,
	          "%s", msg);
	cr_expect(strstr(msg, "decode step") == NULL, "%s", msg);
	json_decref(root);
	free(model);
}

/*
 * The milder prompt-form defect docs/f2.md records as having passed:
 * every token of a step decayed by the first token's gate. Its lowest
 * cosine stays above 0.95, the floor before arithmetic classes; the f16
 * class it declares (the cache the host gives it) rejects it in prefill.
 */
Test(replay, f2_rejects_a_prompt_form_that_decays_every_token_by_the_first_gate,
     .timeout = 600)
{
	static const char *const names[] = { "replay_ok", "replay_prompt_gate", NULL };
	const char *ok, *msg;
	char *model = NULL;
	json_t *root, *c;
	size_t i;

	if (asprintf(&model, "%s/tests/fixtures/tiny-qwen35.gguf", test_srcdir()) < 0)
		cr_assert_fail("out of memory");
	root = validate_pair(names, model, "replay-prompt-gate", &ok, &msg);
	cr_expect(strstr(msg, "acceptance floor (f16 arithmetic)") != NULL, "%s", msg);
	cr_expect(strstr(msg, "(prefill)") != NULL, "%s", msg);
	json_array_foreach(json_object_get(root, "candidates"), i, c) {
		if (strcmp(json_string_value(json_object_get(c, "backend")), "replay-prompt-gate"))
			continue;
		cr_expect_str_eq(json_string_value(json_object_get(c, "verdict")), "reject");
		cr_expect_gt(json_real_value(json_object_get(c, "min_cosine")), 0.95,
		             "the defect the old floor passed: %s", msg);
	}
	json_decref(root);
	free(model);
}

/* --- gemv_multi and gemv_glu (graph_products.h) ------------------------ */

/* EXPECT on the reference cpu through cpu-simd: CI without a GPU runs it. */
static void on_cpu_simd(expect_fn expect)
{
	const char *b = test_builddir();
	char *path = NULL;
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;

	test_need_cpu_fast();
	cr_assert_geq(asprintf(&path, "%s/plugins/cpu/.libs:%s/plugins/cpu-simd/.libs", b, b), 0);
	cr_assert_eq(q4kh_registry_scan(path, NULL, &reg, &err), 0, "%s", err.msg);
	expect(reg, "cpu", "cpu-simd", 1);
	q4kh_registry_free(reg);
	free(path);
}

/* On the reference cpu through cpu-simd: CI without a GPU runs this. */
Test(gemv_multi, groups_shared_input_products_with_the_same_logits, .timeout = 300)
{
	on_cpu_simd(expect_grouping);
}

/* On the reference cpu through cpu-simd: CI without a GPU runs this. */
Test(gemv_glu, fuses_gate_up_and_glu_with_the_same_logits, .timeout = 300)
{
	on_cpu_simd(expect_glu);
}

/* On the reference cpu through cpu-simd (every type of the file). */
Test(gemv_glu, gemma3_groups_qkv_and_fuses_its_gelu_ffn, .timeout = 300)
{
	on_cpu_simd(expect_gemma3_products);
}
