/*
 * Batched decode (session.h, q4kh_session_eval_batch): several sessions
 * of one model decode one token each in one step, and each sequence gets
 * the logits, bit for bit (and greedy pick), it gets when its session runs
 * alone, one token a step, on the exact reference cpu backend; while sequences
 * finish, join, and a finished one's session is reset and takes a new
 * prompt (what serve's slots do), and in mixed steps where some sequences
 * bring a prompt's chunk instead of one token (serve's continuous
 * batching). On tiny-llama, tiny-qwen2, tiny-qwen3
 * and Gemma 3 (the default model, its sliding window shrunk so that the
 * sequences pass it); on tiny-llama also through a backend that records
 * the batched step and replays it, and through one without the ABI 1.2
 * entries (positions from host memory, one sequence's per node); qwen35
 * (recurrent layers) is refused by name. On cpu-fast (alone and with
 * cpu-simd) and on cuda the same schedule is held to a bound on 1 -
 * cosine derived from their arithmetic (arch_oracle.h), as those paths
 * round their sums in an order that may follow the step's columns; and
 * replay-batched, wrong only in steps of several sequences (its planted
 * defect, tests/plugins/replay.c), must fail it.
 *
 * Prefix reuse across requests (suite prefix): a session that takes the
 * first blocks of its prompt from another session's cache
 * (q4kh_session_take_prefix) gets the logits of the prompt computed whole,
 * bit for bit on the exact cpu and within the bound on cpu-fast, and
 * replay-reuse, wrong only in that copy, fails; the index of what the
 * caches hold (kv_prefix.h) on holders built for the purpose.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch_oracle.h"
#include "backend.h"
#include "buildconf.h"
#include "helpers.h"
#include "hidden_fixture.h"
#include "kernel.h"
#include "kv_paged.h"
#include "kv_prefix.h"
#include "model.h"
#include "policy.h"
#include "registry.h"
#include "session.h"

#define N_SLOTS 5
#define N_ROUNDS 9
#define N_CTX 64

/*
 * One sequence of the schedule: its slot (session) in the batched run,
 * its prompt's length, and the rounds it decodes in (first .. last): 2 to
 * 5 sequences a round; slot 1's first sequence finishes after round 2
 * and a new one takes the slot (reset) at round 4.
 */
static const struct seq_plan {
	int slot, prompt, first, last;
} plan[] = {
	{ 0, 5, 0, 8 }, { 1, 17, 0, 2 }, { 2, 30, 0, 8 },
	{ 1, 9, 4, 8 }, { 3, 3, 5, 8 },  { 4, 40, 7, 8 },
};
#define N_SEQ (sizeof(plan) / sizeof(plan[0]))

/* Token I of sequence K's stream: its prompt, then what it is fed. */
static int32_t token(size_t k, int i, int64_t n_vocab)
{
	return (int32_t)(((uint64_t)k * 7919u + (uint64_t)i * 104729u + 13u) %
	                 (uint64_t)(n_vocab < 4000 ? n_vocab : 4000));
}

struct rig {
	struct q4kh_registry *reg;
	struct q4kh_backend be;
	struct q4kh_kernel k;
	struct q4kh_model *m;
	struct q4kh_kv_paged *paged; /* the pools of session(), or NULL */
	int64_t n_vocab;
};

/*
 * A path to hold the schedule on: its backend, its kernel variant (NULL:
 * built-in kernels), and what it is held to: EXACT, each sequence's
 * logits bit for bit its logits alone (the reference, which sums in one
 * order whatever the step's columns: cpu_lanes.h), else 1 - cosine
 * within the bound below for the ARITH flags (arch_oracle.h).
 */
struct path {
	const char *plugins; /* plugin folders; NULL: the test's path */
	const char *backend, *variant;
	int exact;
	unsigned arith;
	int32_t page; /* > 0: session() on a paged cache, pages of PAGE tokens
	                 (what it is compared with keeps a cache of its own) */
};

/* Pages of the paged rig's pool: six sessions' contexts. */
#define POOL_SESSIONS 6

/* MODEL on P's backend and kernel variant. */
static void rig_open(struct rig *r, const char *path, uint32_t window, const struct path *pa)
{
	const char *plugins = pa->plugins, *backend = pa->backend;
	struct q4kh_error err = { { 0 } };
	const struct q4kh_plugin *p;

	cr_assert_eq(q4kh_registry_scan(plugins, NULL, &r->reg, &err), 0, "%s", err.msg);
	p = q4kh_registry_find(r->reg, backend);
	cr_assert_not_null(p, "backend %s is not in %s", backend, plugins ? plugins : "the path");
	cr_assert_eq(q4kh_backend_open(p, 0, &r->be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_open(path, &r->m, &err), 0, "%s", err.msg);
	if (window)
		r->m->hp.n_swa = window; /* read when a step graph is built */
	cr_assert_eq(q4kh_model_upload(r->m, &r->be, &err), 0, "%s", err.msg);
	memset(&r->k, 0, sizeof(r->k));
	if (pa->variant)
		cr_assert_eq(q4kh_policy_use_kernel(r->reg, &r->be, r->m, pa->variant, &r->k, &err),
		             0, "%s", err.msg);
	r->n_vocab = r->m->hp.n_vocab;
	r->paged = NULL;
	if (pa->page)
		cr_assert_eq(q4kh_kv_paged_new(r->m, POOL_SESSIONS * ((N_CTX + pa->page - 1) / pa->page),
		                               pa->page,
		                               q4kh_session_kv_type(Q4KH_KV_DEFAULT, &r->be),
		                               &r->paged, &err),
		             0, "%s", err.msg);
}

/* Every session freed first: a paged rig's pages must all be back. */
static void rig_close(struct rig *r)
{
	if (r->paged)
		cr_expect_eq(r->paged->pool.n_free, r->paged->pool.n_pages,
		             "%d of %d pages still held after every session was freed",
		             r->paged->pool.n_pages - r->paged->pool.n_free, r->paged->pool.n_pages);
	q4kh_kv_paged_free(r->paged);
	q4kh_model_free(r->m);
	q4kh_kernel_close(&r->k);
	q4kh_backend_close(&r->be);
	q4kh_registry_free(r->reg);
}

/* A session on R's pools when it has them and PAGED, else with a cache of
 * its own. */
static struct q4kh_session *session_on(struct rig *r, int paged)
{
	const struct q4kh_session_params sp = { .n_ctx = N_CTX, .paged = paged ? r->paged : NULL };
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *s = NULL;

	cr_assert_eq(q4kh_session_new(r->m, &sp, &s, &err), 0, "%s", err.msg);
	return s;
}

static struct q4kh_session *session(struct rig *r)
{
	return session_on(r, 1);
}

/* Reset S and run sequence K's prompt in it. */
static void prompt(struct rig *r, struct q4kh_session *s, size_t k)
{
	struct q4kh_error err = { { 0 } };
	int32_t ids[64];

	for (int i = 0; i < plan[k].prompt; i++)
		ids[i] = token(k, i, r->n_vocab);
	q4kh_session_reset(s);
	cr_assert_eq(q4kh_session_eval(s, ids, plan[k].prompt, NULL, 0, &err), 0, "%s",
	             err.msg);
}

/* The largest |a - b| over row B's largest |value|. */
static double rel_diff(const float *a, const float *b, int64_t n)
{
	double d = 0.0, top = 0.0;

	for (int64_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - (double)b[i]));
		top = fmax(top, fabs((double)b[i]));
	}
	return top > 0.0 ? d / top : d;
}

/*
 * The bound on 1 - cosine between a sequence's logits batched and alone
 * on a path of the ARITH flags: each is within arch_exact_bound (B) of
 * the exact logits, an angle of at most sqrt(2 B) to second order, so the
 * two are at most twice that angle apart: 1 - cosine <= 4 B. Their
 * roundings are the same but for the order of float32 sums, so they
 * measure far inside it (2026-12-06, AVX2: cpu-fast 0, its batched logits
 * are alone's bits; with cpu-simd 4.9e-9 of 1.4e-6 on the tiny models,
 * 2.2e-7 of 6.4e-6 on Gemma 3 270M); a wrong batched step is far outside
 * (replay-batched: 0.21 on tiny-llama).
 */
static double batched_bound(const struct q4kh_model *m, unsigned arith)
{
	return 4.0 * arch_exact_bound(m, arith);
}

/*
 * How far GOT (batched) is from ALONE for path PA: 1 when they differ
 * past what PA allows, with what in *D (the relative difference on an
 * exact path, 1 - cosine on another).
 */
static int differs(const struct path *pa, const struct q4kh_model *m, const float *got,
                   const float *alone, int64_t n, double *d)
{
	if (pa->exact) {
		*d = rel_diff(got, alone, n);
		return memcmp(got, alone, sizeof(float) * (size_t)n) != 0;
	}
	*d = 1.0 - test_cosine(got, alone, n);
	return !(*d <= batched_bound(m, pa->arith));
}

/*
 * Run the schedule batched, then each sequence alone, and compare every
 * decode step's logits (or, on an exact path, greedy pick: odd sequences
 * on odd rounds ask for the pick only; a rounding path may pick the other
 * of two near-tied tokens, so it gives its logits). Returns the largest
 * difference (differs), and in *WRONG how many steps differed past it:
 * each is a failed expectation unless WRONG is set.
 */
static double batched_against_alone(const char *path, uint32_t window, const struct path *pa,
                                    int *wrong)
{
	struct rig r;
	struct q4kh_session *slot[N_SLOTS];
	struct q4kh_error err = { { 0 } };
	float *got[N_SEQ][N_ROUNDS] = { { NULL } };
	int32_t pick[N_SEQ][N_ROUNDS];
	double worst = 0.0;

	rig_open(&r, path, window, pa);
	for (int i = 0; i < N_SLOTS; i++)
		slot[i] = session(&r);
	for (int round = 0; round < N_ROUNDS; round++) {
		struct q4kh_batch_seq b[N_SLOTS];
		size_t who[N_SLOTS];
		int n = 0;

		/* in slot order, as serve's engine batches its slots */
		for (int sl = 0; sl < N_SLOTS; sl++)
			for (size_t k = 0; k < N_SEQ; k++) {
				const int step = round - plan[k].first;

				if (plan[k].slot != sl || round < plan[k].first || round > plan[k].last)
					continue;
				if (step == 0)
					prompt(&r, slot[sl], k);
				got[k][step] = malloc(sizeof(float) * (size_t)r.n_vocab);
				cr_assert_not_null(got[k][step]);
				b[n] = (struct q4kh_batch_seq){
					.s = slot[sl],
					.id = token(k, plan[k].prompt + step, r.n_vocab),
					.logits = pa->exact && (k & 1) && (round & 1) ? NULL
					                                               : got[k][step],
				};
				who[n++] = k;
			}
		cr_assert_geq(n, 2, "round %d batches %d sequences", round, n);
		cr_assert_eq(q4kh_session_eval_batch(b, n, &err), 0, "%s: round %d: %s", path,
		             round, err.msg);
		for (int j = 0; j < n; j++) {
			const size_t k = who[j];

			pick[k][round - plan[k].first] = b[j].logits ? -2 : b[j].token;
			cr_expect_eq(slot[plan[k].slot]->n_past,
			             plan[k].prompt + round - plan[k].first + 1,
			             "%s: sequence %zu's position after round %d", path, k, round);
		}
	}
	/* slot 0 runs every round: the batched graphs are its */
	if (!strcmp(pa->backend, "replay-ok"))
		cr_expect_gt(slot[0]->stats.replayed, 0, "no batched step was replayed");
	for (int i = 0; i < N_SLOTS; i++)
		q4kh_session_free(slot[i]);

	/* each sequence alone, one token a step, in a session of its own */
	for (size_t k = 0; k < N_SEQ; k++) {
		struct q4kh_session *s = session_on(&r, 0);
		float *alone = malloc(sizeof(float) * (size_t)r.n_vocab);

		cr_assert_not_null(alone);
		prompt(&r, s, k);
		for (int step = 0; step <= plan[k].last - plan[k].first; step++) {
			const int32_t id = token(k, plan[k].prompt + step, r.n_vocab);
			float top[2];

			cr_assert_eq(q4kh_session_eval(s, &id, 1, alone, 0, &err), 0, "%s", err.msg);
			if (pick[k][step] == -2) {
				double d;
				const int off = differs(pa, r.m, got[k][step], alone, r.n_vocab, &d);

				if (wrong)
					*wrong += off;
				else
					cr_expect(!off, "%s on %s/%s: sequence %zu, decode step %d: batched "
					          "logits %s (%g; bound %g)", path, pa->backend,
					          pa->variant ? pa->variant : "built-in", k, step,
					          pa->exact ? "are not alone's bits, relative difference"
					                    : "are not alone's, 1 - cosine",
					          d, pa->exact ? 0.0 : batched_bound(r.m, pa->arith));
				worst = fmax(worst, d);
			} else {
				cr_expect_eq(pick[k][step], q4kh_top2(alone, r.n_vocab, top),
				             "%s: sequence %zu, decode step %d: batched greedy pick", path,
				             k, step);
			}
			free(got[k][step]);
		}
		free(alone);
		q4kh_session_free(s);
	}
	rig_close(&r);
	return worst;
}

static void fixture_case(const char *file, const struct path *pa)
{
	char *path = fixture(file);
	double d = batched_against_alone(path, 0, pa, NULL);

	cr_log_info("%s on %s/%s: batched against alone: max %s %g", file, pa->backend,
	            pa->variant ? pa->variant : "built-in",
	            pa->exact ? "relative difference" : "1 - cosine", d);
	free(path);
}

/* The exact reference BACKEND (or a backend around it) of PLUGINS. */
static void exact_case(const char *file, const char *plugins, const char *backend)
{
	fixture_case(file, &(const struct path){ plugins, backend, NULL, 1, 0, 0 });
}

Test(batch, tiny_llama_sequences_get_their_logits_alone, .timeout = 120)
{
	exact_case("tiny-llama.gguf", NULL, "cpu");
}

/*
 * Paged sessions (ABI 1.8, attention_paged): the slots of the schedule on
 * one pool of pages of 5 tokens (pages never full at a step's end but
 * every fifth; the 40-token prompt spans 9), a finished sequence's pages
 * given back by its reset and taken by the next; each sequence's logits
 * are those of a session with a contiguous cache of its own, bit for bit
 * on the exact cpu (tiny-llama, tiny-qwen3) and through replay-ok, which
 * records the paged steps and replays them with their slots and tables
 * rewritten (G1), within the batched bound on cpu-fast (pages of 16).
 */
Test(batch, paged_sequences_get_their_logits_alone, .timeout = 300)
{
	static const char *const files[] = { "tiny-llama.gguf", "tiny-qwen3.gguf" };
	static const char *const names[] = { "replay_ok", NULL };
	char *plugins = test_fast_plugin_path();

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		fixture_case(files[i], &(const struct path){ NULL, "cpu", NULL, 1, 0, 5 });
	fixture_case("tiny-llama.gguf",
	             &(const struct path){ test_plugin_dir(names), "replay-ok", NULL, 1, 0, 5 });
	fixture_case("tiny-llama.gguf",
	             &(const struct path){ plugins, "cpu-fast", NULL, 0, 0, 16 });
	free(plugins);
}

/* The batched steps of a stable set recorded and replayed (replay-ok),
 * and run through the 1.0 entries (replay-v1-1: no set_rows or
 * attention_ext, positions from host memory). */
Test(batch, replayed_and_without_step_entries, .timeout = 120)
{
	static const char *const names[] = { "replay_ok", "replay_v1_1", NULL };
	const char *plugins = test_plugin_dir(names);

	exact_case("tiny-llama.gguf", plugins, "replay-ok");
	exact_case("tiny-llama.gguf", plugins, "replay-v1-1");
}

/* Rounds of each set of swap_case. */
#define SWAP_ROUNDS 3

/*
 * Batched steps of three sessions A, B, C (sequences 0, 1, 2 of plan)
 * through replay-ok, which records a step's graph on its second run and
 * replays it; then B is freed and a new session D (sequence 3) takes its
 * place: steps of A, D, C. Over pages of 5 (PAGED) the graph names no
 * session's cache, only the pools, so the second set's steps replay the
 * first set's recording at once, D's table (B's pages, given back) and
 * every position rewritten before each; over caches of their own the
 * second set's graph is built and recorded anew. Either way each
 * sequence's logits are those of a session with a cache of its own, one
 * token a step, bit for bit.
 */
static void swap_case(int paged)
{
	static const char *const names[] = { "replay_ok", NULL };
	const struct path pa = { test_plugin_dir(names), "replay-ok", NULL, 1, 0, paged ? 5 : 0 };
	static const size_t sets[2][3] = { { 0, 1, 2 }, { 0, 3, 2 } };
	char *path = fixture("tiny-llama.gguf");
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *s[4];
	float *got[4][2 * SWAP_ROUNDS] = { { NULL } };
	int steps[4] = { 0 };
	uint64_t recorded = 0, replayed = 0;
	struct rig r;

	rig_open(&r, path, 0, &pa);
	for (size_t k = 0; k < 3; k++) {
		s[k] = session(&r);
		prompt(&r, s[k], k);
	}
	for (int set = 0; set < 2; set++) {
		if (set) {
			recorded = s[0]->stats.recorded;
			replayed = s[0]->stats.replayed;
			q4kh_session_free(s[1]);
			s[3] = session(&r);
			prompt(&r, s[3], 3);
		}
		for (int round = 0; round < SWAP_ROUNDS; round++) {
			struct q4kh_batch_seq b[3];

			for (int j = 0; j < 3; j++) {
				const size_t k = sets[set][j];

				got[k][steps[k]] = malloc(sizeof(float) * (size_t)r.n_vocab);
				cr_assert_not_null(got[k][steps[k]]);
				b[j] = (struct q4kh_batch_seq){
					.s = s[k],
					.id = token(k, plan[k].prompt + steps[k], r.n_vocab),
					.logits = got[k][steps[k]],
				};
				steps[k]++;
			}
			cr_assert_eq(q4kh_session_eval_batch(b, 3, &err), 0, "set %d, round %d: %s", set,
			             round, err.msg);
		}
	}
	/* A holds the batched graphs: over pages the second set made none */
	cr_expect_eq(s[0]->stats.recorded - recorded, paged ? 0u : 1u,
	             "%s: recordings made for the second set", paged ? "paged" : "contiguous");
	cr_expect_eq(s[0]->stats.replayed - replayed, paged ? SWAP_ROUNDS : SWAP_ROUNDS - 1,
	             "%s: the second set's steps replayed", paged ? "paged" : "contiguous");
	for (size_t k = 0; k < 4; k++)
		if (k != 1)
			q4kh_session_free(s[k]);

	for (size_t k = 0; k < 4; k++) {
		struct q4kh_session *alone = session_on(&r, 0);
		float *row = malloc(sizeof(float) * (size_t)r.n_vocab);

		cr_assert_not_null(row);
		prompt(&r, alone, k);
		for (int step = 0; step < steps[k]; step++) {
			const int32_t id = token(k, plan[k].prompt + step, r.n_vocab);

			cr_assert_eq(q4kh_session_eval(alone, &id, 1, row, 0, &err), 0, "%s", err.msg);
			cr_expect_eq(memcmp(got[k][step], row, sizeof(float) * (size_t)r.n_vocab), 0,
			             "%s: sequence %zu, decode step %d: not alone's bits (relative "
			             "difference %g)", paged ? "paged" : "contiguous", k, step,
			             rel_diff(got[k][step], row, r.n_vocab));
			free(got[k][step]);
		}
		free(row);
		q4kh_session_free(alone);
	}
	rig_close(&r);
	free(path);
}

Test(batch, paged_steps_keep_their_graph_for_other_sessions, .timeout = 120)
{
	swap_case(1);
	swap_case(0);
}

Test(batch, tiny_qwen2_sequences_get_their_logits_alone, .timeout = 120)
{
	exact_case("tiny-qwen2.gguf", NULL, "cpu");
}

Test(batch, tiny_qwen3_sequences_get_their_logits_alone, .timeout = 120)
{
	exact_case("tiny-qwen3.gguf", NULL, "cpu");
}

/*
 * Gemma 3 with its window shrunk from 512 to 16 keys: sequences past 16
 * positions attend to their own last 16 keys in the sliding layers and
 * to all in the global ones, in the batched step as alone.
 */
Test(batch, gemma3_sequences_get_their_logits_alone_past_the_window, .timeout = 600)
{
	const char *model = test_model_path();
	double d = batched_against_alone(model, 16, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 },
	                                 NULL);

	cr_log_info("gemma3: batched against alone: max relative difference %g", d);
}

/*
 * cpu-fast, alone (its F16 cache) and with cpu-simd (int16 activations
 * too), on tiny-llama, tiny-qwen3 and Gemma 3 (its window shrunk to 16,
 * as above): every batched step within the bound of its arithmetic.
 */
Test(batch, cpu_fast_and_cpu_simd_sequences_within_their_arithmetic, .timeout = 600)
{
	static const char *const files[] = { "tiny-llama.gguf", "tiny-qwen3.gguf" };
	char *plugins = test_fast_plugin_path();
	const struct path fast = { plugins, "cpu-fast", NULL, 0, 0, 0 };
	const struct path simd = { plugins, "cpu-fast", "cpu-simd", 0, ARITH_INT16, 0 };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		fixture_case(files[i], &fast);
		fixture_case(files[i], &simd);
	}
	cr_log_info("gemma3 on cpu-fast: max 1 - cosine %g",
	            batched_against_alone(test_model_path(), 16, &fast, NULL));
	cr_log_info("gemma3 on cpu-fast/cpu-simd: max 1 - cosine %g",
	            batched_against_alone(test_model_path(), 16, &simd, NULL));
	free(plugins);
}

/*
 * The check can fail: replay-batched, exact alone, attends with the first
 * sequence's queries in a step of several, and the bound of the f16
 * arithmetic it declares does not hide it.
 */
Test(batch, a_backend_wrong_only_in_batched_steps_fails_the_bound, .timeout = 120)
{
	static const char *const names[] = { "replay_batched", NULL };
	const struct path pa = { test_plugin_dir(names), "replay-batched", NULL, 0, 0, 0 };
	char *path = fixture("tiny-llama.gguf");
	int wrong = 0;
	double d = batched_against_alone(path, 0, &pa, &wrong);

	cr_expect_gt(wrong, 0, "no batched step differed (max 1 - cosine %g)", d);
	cr_log_info("replay-batched on tiny-llama: %d batched steps past the bound, max 1 - cosine %g",
	            wrong, d);
	free(path);
}

/*
 * cuda (its F16 cache and fp16 tensor-core products, ARITH_FP16) on
 * tiny-llama and Gemma 3. Skips where this build has no CUDA plugins or
 * the system shows no NVIDIA GPU (test_no_cuda_device).
 */

Test(batch, cuda_sequences_within_their_arithmetic, .timeout = 300)
{
#ifdef Q4KH_CUDA_ARCHS
	const struct path cuda = { NULL, "cuda", NULL, 0, ARITH_FP16, 0 };
	char model[4096];

	test_need_cuda_device("batched decode on cuda");
	fixture_case("tiny-llama.gguf", &cuda);
	/* over pages of 16 (ABI 1.8, attention_paged) */
	fixture_case("tiny-llama.gguf",
	             &(const struct path){ NULL, "cuda", NULL, 0, ARITH_FP16, 16 });
	/* the default model where the machine has it: a GPU machine often
	 * has not, and tiny-llama's verdict stands without it */
	q4kh_default_model_path(model, sizeof(model));
	if (access(model, R_OK) == 0)
		cr_log_info("gemma3 on cuda: max 1 - cosine %g",
		            batched_against_alone(model, 16, &cuda, NULL));
	else
		cr_log_info("gemma3 on cuda not run: no default model at %s", model);
#else
	cr_skip_test("this build has no CUDA plugins");
#endif
}

/* qwen35's recurrent states hold one sequence: refused by name. */
Test(batch, recurrent_layers_are_refused)
{
	struct rig r;
	char *path = NULL;
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *s[2];
	struct q4kh_batch_seq b[2];

	if (asprintf(&path, "%s/tests/fixtures/tiny-qwen35.gguf", test_srcdir()) < 0)
		cr_assert_fail("out of memory");
	rig_open(&r, path, 0, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 });
	for (int i = 0; i < 2; i++) {
		s[i] = session(&r);
		b[i] = (struct q4kh_batch_seq){ .s = s[i], .id = 1 };
	}
	cr_expect_eq(q4kh_session_batchable(s[0]), 0);
	cr_expect_eq(q4kh_session_eval_batch(b, 2, &err), -1);
	cr_expect(strstr(err.msg, "recurrent layers") != NULL, "%s", err.msg);
	cr_expect_eq(s[0]->n_past, 0);
	for (int i = 0; i < 2; i++)
		q4kh_session_free(s[i]);
	rig_close(&r);
	free(path);
}

/* One session twice in a step would write two rows of one cache. */
Test(batch, a_session_twice_is_refused)
{
	struct rig r;
	char *path = NULL;
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *s;
	struct q4kh_batch_seq b[2];

	if (asprintf(&path, "%s/tests/fixtures/tiny-llama.gguf", test_srcdir()) < 0)
		cr_assert_fail("out of memory");
	rig_open(&r, path, 0, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 });
	s = session(&r);
	b[0] = (struct q4kh_batch_seq){ .s = s, .id = 1 };
	b[1] = b[0];
	cr_expect_eq(q4kh_session_eval_batch(b, 2, &err), -1);
	cr_expect(strstr(err.msg, "are one session") != NULL, "%s", err.msg);
	cr_expect_eq(s->n_past, 0);
	q4kh_session_free(s);
	rig_close(&r);
	free(path);
}

/* The logits of S's next N tokens IDS into OUT (NULL: none wanted). */
static void eval_alone(struct q4kh_session *s, const int32_t *ids, int64_t n, float *out)
{
	struct q4kh_error err = { { 0 } };

	cr_assert_eq(q4kh_session_eval(s, ids, n, out, 0, &err), 0, "%s", err.msg);
}

/*
 * Mixed steps (serve's continuous batching): in two steps, sequence 0
 * decodes a token each, sequence 1's whole prompt runs beside it and then
 * decodes, and sequence 2's prompt runs in two chunks, the first one's
 * result skipped; every logit is, bit for bit on the exact cpu backend,
 * what each session gets running the same tokens alone.
 */
Test(batch, prompt_chunks_beside_decoded_tokens_get_their_logits_alone, .timeout = 120)
{
	struct rig r;
	char *path = fixture("tiny-llama.gguf");
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *s[3], *alone;
	struct q4kh_batch_seq b[3];
	int32_t ids[3][40];
	float *got[2][3], *want;
	size_t bytes;

	rig_open(&r, path, 0, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 });
	bytes = sizeof(float) * (size_t)r.n_vocab;
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < 40; i++)
			ids[k][i] = token((size_t)k, i, r.n_vocab);
		s[k] = session(&r);
		got[0][k] = malloc(bytes);
		got[1][k] = malloc(bytes);
		cr_assert(got[0][k] && got[1][k]);
	}
	want = malloc(bytes);
	cr_assert_not_null(want);
	eval_alone(s[0], ids[0], 12, NULL);
	eval_alone(s[2], ids[2], 7, NULL);
	b[0] = (struct q4kh_batch_seq){ .s = s[0], .id = ids[0][12], .logits = got[0][0] };
	b[1] = (struct q4kh_batch_seq){ .s = s[1], .ids = ids[1], .n_ids = 20,
		                        .logits = got[0][1] };
	b[2] = (struct q4kh_batch_seq){ .s = s[2], .ids = ids[2] + 7, .n_ids = 10, .skip = 1 };
	cr_assert_eq(q4kh_session_eval_batch(b, 3, &err), 0, "%s", err.msg);
	b[0] = (struct q4kh_batch_seq){ .s = s[0], .id = ids[0][13], .logits = got[1][0] };
	b[1] = (struct q4kh_batch_seq){ .s = s[1], .id = ids[1][20], .logits = got[1][1] };
	b[2] = (struct q4kh_batch_seq){ .s = s[2], .ids = ids[2] + 17, .n_ids = 5,
		                        .logits = got[1][2] };
	cr_assert_eq(q4kh_session_eval_batch(b, 3, &err), 0, "%s", err.msg);
	cr_expect_eq(s[0]->n_past, 14);
	cr_expect_eq(s[1]->n_past, 21);
	cr_expect_eq(s[2]->n_past, 22);

	alone = session(&r);
	eval_alone(alone, ids[0], 12, NULL);
	eval_alone(alone, ids[0] + 12, 1, want);
	cr_expect(!memcmp(want, got[0][0], bytes), "sequence 0's decoded token, step 1");
	eval_alone(alone, ids[0] + 13, 1, want);
	cr_expect(!memcmp(want, got[1][0], bytes), "sequence 0's decoded token, step 2");
	q4kh_session_reset(alone);
	eval_alone(alone, ids[1], 20, want);
	cr_expect(!memcmp(want, got[0][1], bytes), "sequence 1's prompt of 20, step 1");
	eval_alone(alone, ids[1] + 20, 1, want);
	cr_expect(!memcmp(want, got[1][1], bytes), "sequence 1's decoded token, step 2");
	q4kh_session_reset(alone);
	eval_alone(alone, ids[2], 7, NULL);
	eval_alone(alone, ids[2] + 7, 10, NULL);
	eval_alone(alone, ids[2] + 17, 5, want);
	cr_expect(!memcmp(want, got[1][2], bytes), "sequence 2's last prompt chunk, step 2");

	q4kh_session_free(alone);
	for (int k = 0; k < 3; k++) {
		q4kh_session_free(s[k]);
		free(got[0][k]);
		free(got[1][k]);
	}
	free(want);
	rig_close(&r);
	free(path);
}

/* --- prefix reuse across requests (kv_prefix.h, q4kh_session_take_prefix) --- */

#define PREFIX_PROMPT 45 /* two whole blocks and 13 tokens */
#define PREFIX_STEPS 6   /* decode steps after it */
#define PREFIX_TAKEN 32  /* the whole blocks of the prompt another session holds */

/* Token I of the prefix tests' prompt and what follows it. */
static int32_t prefix_token(int i, int64_t n_vocab)
{
	return token(11, i, n_vocab);
}

/*
 * S's logits of the prompt's tokens from S->n_past on, then of
 * PREFIX_STEPS decode steps, into OUT (1 + PREFIX_STEPS rows): the prompt's
 * rest in one step, its last token's logits first.
 */
static void prefix_rest(struct rig *r, struct q4kh_session *s, float *out)
{
	struct q4kh_error err = { { 0 } };
	int32_t ids[PREFIX_PROMPT + PREFIX_STEPS];
	const int64_t from = s->n_past;

	for (int i = 0; i < PREFIX_PROMPT + PREFIX_STEPS; i++)
		ids[i] = prefix_token(i, r->n_vocab);
	cr_assert_eq(q4kh_session_eval(s, ids + from, PREFIX_PROMPT - from, out, 0, &err), 0,
	             "%s", err.msg);
	for (int k = 0; k < PREFIX_STEPS; k++)
		cr_assert_eq(q4kh_session_eval(s, ids + PREFIX_PROMPT + k, 1,
		                               out + (k + 1) * r->n_vocab, 0, &err),
		             0, "%s", err.msg);
}

/* Do S's and T's key and value rows [0, n) hold the same bytes, every
 * layer? On a paged cache: are they the same pages? */
static int same_kv_rows(struct rig *r, const struct q4kh_session *s,
                        const struct q4kh_session *t, int64_t n)
{
	const struct q4kh_backend_v1 *v = r->be.v;
	int same = 1;

	if (s->p.paged) {
		const int32_t pages = q4kh_kv_pool_pages_for(&s->p.paged->pool, n);

		return s->table.n >= pages && t->table.n >= pages &&
		       !memcmp(s->table.pages, t->table.pages, sizeof(int32_t) * (size_t)pages);
	}

	for (uint32_t il = 0; il < r->m->hp.n_layer && same; il++)
		for (int kv = 0; kv < 2 && same; kv++) {
			const struct q4kh_tensor *a = kv ? &s->v_cache[il] : &s->k_cache[il];
			const struct q4kh_tensor *b = kv ? &t->v_cache[il] : &t->k_cache[il];
			const uint64_t bytes = (uint64_t)a->nb[2] * (uint64_t)n;
			unsigned char *x = malloc(bytes), *y = malloc(bytes);

			cr_assert(x && y);
			cr_assert_eq(v->buffer_download(r->be.dev, a->buffer, a->offset, x, bytes), 0);
			cr_assert_eq(v->buffer_download(r->be.dev, b->buffer, b->offset, y, bytes), 0);
			same = !memcmp(x, y, bytes);
			free(x);
			free(y);
		}
	return same;
}

/*
 * On path PA, the prompt's logits and decode steps of a session that
 * computed all of it (the request without reuse) against three that take
 * its first PREFIX_TAKEN tokens from a session that computed them for
 * another request (the same start, then other tokens), as serve's prefix
 * reuse does: copied into an empty session, copied past the block the
 * session holds already, and kept in place in that other session. Each
 * held to alone's bits on an exact path, else to the batched bound. The
 * rows copied must be the source's bytes. Returns the largest difference
 * (differs), with *WRONG counting the rows past it and *BYTES the
 * sessions whose copied rows differ (each a failed expectation unless
 * WRONG is set).
 */
static double reused_against_whole(const char *path, const struct path *pa, int *wrong,
                                   int *bytes)
{
	const int64_t rows = 1 + PREFIX_STEPS;
	struct rig r;
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *whole, *other, *into[3];
	float *want, *got;
	int32_t ids[PREFIX_PROMPT];
	double worst = 0.0;

	rig_open(&r, path, 0, pa);
	want = malloc(sizeof(float) * (size_t)(rows * r.n_vocab));
	got = malloc(sizeof(float) * (size_t)(rows * r.n_vocab));
	cr_assert(want && got);
	whole = session_on(&r, 0);
	prefix_rest(&r, whole, want);
	/* another request: the prompt's first 37 tokens, then 5 others */
	other = session(&r);
	for (int i = 0; i < PREFIX_PROMPT; i++)
		ids[i] = i < 37 ? prefix_token(i, r.n_vocab) : token(12, i, r.n_vocab);
	cr_assert_eq(q4kh_session_eval(other, ids, 42, NULL, 0, &err), 0, "%s", err.msg);
	into[0] = session(&r);
	cr_assert_eq(q4kh_session_take_prefix(into[0], other, 0, PREFIX_TAKEN, &err), 0, "%s",
	             err.msg);
	into[1] = session(&r);
	cr_assert_eq(q4kh_session_eval(into[1], ids, 20, NULL, 0, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_take_prefix(into[1], other, Q4KH_PREFIX_BLOCK, PREFIX_TAKEN,
	                                      &err),
	             0, "%s", err.msg);
	for (int k = 0; k < 2; k++)
		if (!same_kv_rows(&r, into[k], other, PREFIX_TAKEN)) {
			if (bytes)
				++*bytes;
			else
				cr_expect_fail("%s on %s: session %d: the rows taken are not the source's bytes",
				               path, pa->backend, k);
		}
	into[2] = other;
	cr_assert_eq(q4kh_session_take_prefix(other, other, PREFIX_TAKEN, PREFIX_TAKEN, &err), 0,
	             "%s", err.msg);
	for (int k = 0; k < 3; k++) {
		cr_expect_eq(into[k]->n_past, PREFIX_TAKEN);
		prefix_rest(&r, into[k], got);
		for (int64_t row = 0; row < rows; row++) {
			double d;
			const int off = differs(pa, r.m, got + row * r.n_vocab, want + row * r.n_vocab,
			                        r.n_vocab, &d);

			if (wrong)
				*wrong += off;
			else
				cr_expect(!off, "%s on %s: reuse %d, row %lld: the logits %s (%g)", path,
				          pa->backend, k, (long long)row,
				          pa->exact ? "are not the whole prompt's bits"
				                    : "are past the bound from the whole prompt's",
				          d);
			worst = isnan(d) || isnan(worst) ? NAN : fmax(worst, d);
		}
	}
	for (int k = 0; k < 3; k++)
		q4kh_session_free(into[k]);
	q4kh_session_free(whole);
	free(want);
	free(got);
	rig_close(&r);
	return worst;
}

/*
 * On the exact cpu, a prompt whose first two blocks come from another
 * session's cache gives the logits, bit for bit, of the prompt computed
 * whole, and so do the decode steps after it: the keys and values of a
 * token depend on the tokens up to it alone. tiny-llama and tiny-qwen3
 * (its q and k norms).
 */
Test(prefix, reused_blocks_give_the_whole_prompts_bits_on_cpu, .timeout = 120)
{
	static const char *const files[] = { "tiny-llama.gguf", "tiny-qwen3.gguf" };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char *path = fixture(files[i]);

		reused_against_whole(path, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 }, NULL,
		                     NULL);
		free(path);
	}
}

/*
 * On pools of pages of 5 tokens (paged sessions; the whole prompt's in a
 * cache of its own): the prefix of 32 tokens is mapped, its 7th page,
 * shared and partly filled, copied by each session at its first write
 * (the first difference), and the logits are still the whole prompt's
 * bits on the exact cpu; within the bound on cpu-fast (pages of 16). Every
 * page is back in the pool when the sessions are freed (rig_close).
 */
Test(prefix, paged_reuse_maps_pages_and_copies_them_on_write, .timeout = 120)
{
	char *plugins = test_fast_plugin_path();
	char *path = fixture("tiny-llama.gguf");

	reused_against_whole(path, &(const struct path){ NULL, "cpu", NULL, 1, 0, 5 }, NULL, NULL);
	cr_log_info("tiny-llama on cpu-fast, pages of 16: reused against whole: max 1 - cosine %g",
	            reused_against_whole(path,
	                                 &(const struct path){ plugins, "cpu-fast", NULL, 0, 0, 16 },
	                                 NULL, NULL));
	free(path);
	free(plugins);
}

/* N tokens of stream K at S's n_past on, their last logits (or the last
 * step's) into OUT. */
static void stream(struct rig *r, struct q4kh_session *s, size_t k, int n, float *out)
{
	struct q4kh_error err = { { 0 } };
	int32_t ids[64];
	const int64_t at = s->n_past;

	for (int i = 0; i < n; i++)
		ids[i] = token(k, (int)at + i, r->n_vocab);
	cr_assert_eq(q4kh_session_eval(s, ids, n, out, 0, &err), 0, "%s", err.msg);
}

/*
 * Copy on write at the first difference, on path PA (pages of 8): A holds
 * 42 tokens of stream 21; B takes its first 36 (pages 0 .. 4, the 5th
 * holding A's tokens 32 .. 39, of which B keeps 4), then goes on with
 * stream 22's tokens from 36 (B's first write copies the 5th page and
 * nothing else); A then decodes 3 more of its own. Each is compared with
 * a session of a contiguous cache of its own that ran its tokens whole
 * (stream 22 is stream 21's first 36 tokens, then its own): without the
 * copy, B's writes would land in A's rows 36 .. 39.
 */
static void paged_cow(const char *path, const struct path *pa)
{
	struct rig r;
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *a, *b, *c;
	float *want, *got;
	int32_t ids[48];
	double d;

	rig_open(&r, path, 0, pa);
	want = malloc(sizeof(float) * (size_t)r.n_vocab);
	got = malloc(sizeof(float) * (size_t)r.n_vocab);
	cr_assert(want && got);
	a = session(&r);
	stream(&r, a, 21, 42, NULL);
	b = session(&r);
	cr_assert_eq(q4kh_session_take_prefix(b, a, 0, 36, &err), 0, "%s", err.msg);
	cr_expect(same_kv_rows(&r, a, b, 36), "B's first 5 pages are not A's");
	cr_expect_eq(r.paged->pool.refs[a->table.pages[4]], 2);
	/* B: stream 21's first 36 tokens, then 8 of its own */
	for (int i = 0; i < 44; i++)
		ids[i] = i < 36 ? token(21, i, r.n_vocab) : token(22, i, r.n_vocab);
	cr_assert_eq(q4kh_session_eval(b, ids + 36, 8, got, 0, &err), 0, "%s", err.msg);
	cr_expect(same_kv_rows(&r, a, b, 32), "B's first 4 pages are no longer A's");
	cr_expect_neq(b->table.pages[4], a->table.pages[4], "B wrote into A's 5th page");
	c = session_on(&r, 0);
	cr_assert_eq(q4kh_session_eval(c, ids, 44, want, 0, &err), 0, "%s", err.msg);
	cr_expect(!differs(pa, r.m, got, want, r.n_vocab, &d),
	          "%s on %s: B after the copy: %g from its tokens computed whole", path,
	          pa->backend, d);
	q4kh_session_free(c);
	/* A: 3 more of its own, over its rows 36 .. 39 */
	stream(&r, a, 21, 3, got);
	c = session_on(&r, 0);
	stream(&r, c, 21, 45, want);
	cr_expect(!differs(pa, r.m, got, want, r.n_vocab, &d),
	          "%s on %s: A after B's copy: %g from its tokens computed whole", path,
	          pa->backend, d);
	q4kh_session_free(c);
	q4kh_session_free(a);
	q4kh_session_free(b);
	free(want);
	free(got);
	rig_close(&r);
}

/* paged_cow on the exact cpu (bits) and on cpu-fast (the bound). */
Test(prefix, paged_copy_on_write_keeps_two_sequences_apart, .timeout = 120)
{
	char *plugins = test_fast_plugin_path();
	char *path = fixture("tiny-llama.gguf");

	paged_cow(path, &(const struct path){ NULL, "cpu", NULL, 1, 0, 8 });
	paged_cow(path, &(const struct path){ plugins, "cpu-fast", NULL, 0, 0, 8 });
	free(path);
	free(plugins);
}

/* cpu-fast (its F16 cache): the rows taken are the source's bytes, and the
 * logits within the bound of its arithmetic. */
Test(prefix, reused_blocks_on_cpu_fast_within_its_arithmetic, .timeout = 120)
{
	char *plugins = test_fast_plugin_path();
	char *path = fixture("tiny-llama.gguf");

	cr_log_info("tiny-llama on cpu-fast: reused against whole: max 1 - cosine %g",
	            reused_against_whole(path, &(const struct path){ plugins, "cpu-fast", NULL, 0, 0, 0 },
	                                 NULL, NULL));
	free(path);
	free(plugins);
}

/* cuda (its F16 cache, its copy kernel between caches): as cpu-fast.
 * Skips as the batched case above does. */
Test(prefix, reused_blocks_on_cuda_within_its_arithmetic, .timeout = 120)
{
#ifdef Q4KH_CUDA_ARCHS
	char *path = fixture("tiny-llama.gguf");

	test_need_cuda_device("prefix reuse on cuda");
	cr_log_info("tiny-llama on cuda: reused against whole: max 1 - cosine %g",
	            reused_against_whole(path,
	                                 &(const struct path){ NULL, "cuda", NULL, 0, ARITH_FP16, 0 },
	                                 NULL, NULL));
	free(path);
#else
	cr_skip_test("this build has no CUDA plugins");
#endif
}

/* replay-reuse copies an F16 tensor's first token into every token's rows
 * (its planted defect, tests/plugins/replay.c): exact in every step, the
 * keys and values reused are wrong, and the check fails. */
Test(prefix, a_backend_wrong_only_in_reuse_fails, .timeout = 120)
{
	static const char *const names[] = { "replay_reuse", NULL };
	const struct path pa = { test_plugin_dir(names), "replay-reuse", NULL, 0, 0, 0 };
	char *path = fixture("tiny-llama.gguf");
	int wrong = 0, bytes = 0;
	double d = reused_against_whole(path, &pa, &wrong, &bytes);

	cr_expect_eq(bytes, 2, "the rows taken differed in %d of 2 sessions", bytes);
	cr_expect_gt(wrong, 0, "no row differed (max 1 - cosine %g)", d);
	cr_log_info("replay-reuse on tiny-llama: %d rows past the bound, max 1 - cosine %g", wrong,
	            d);
	free(path);
}

/* A session of another model, or a prefix longer than the source holds,
 * is refused by name; on a model with recurrent layers, any. */
Test(prefix, what_cannot_be_taken_is_refused)
{
	struct rig r;
	char *path = fixture("tiny-llama.gguf");
	struct q4kh_error err = { { 0 } };
	struct q4kh_session *a, *b;
	const int32_t ids[4] = { 1, 2, 3, 4 };

	rig_open(&r, path, 0, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 });
	a = session(&r);
	b = session(&r);
	cr_assert_eq(q4kh_session_eval(a, ids, 4, NULL, 0, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_session_take_prefix(b, a, 0, 5, &err), -1);
	cr_expect(strstr(err.msg, "[0, 5) taken from a session of 4 cached tokens") != NULL, "%s",
	          err.msg);
	q4kh_session_free(a);
	q4kh_session_free(b);
	rig_close(&r);
	free(path);
	path = fixture("tiny-qwen35.gguf");
	rig_open(&r, path, 0, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 });
	a = session(&r);
	cr_expect_eq(q4kh_session_take_prefix(a, a, 0, 0, &err), -1);
	cr_expect(strstr(err.msg, "recurrent layers") != NULL, "%s", err.msg);
	q4kh_session_free(a);
	rig_close(&r);
	free(path);
}

/*
 * What a paged KV cache refuses, by name: a model with recurrent layers, a
 * backend without attention_paged, a prefix between a paged session and
 * one of its own cache, a batched step of both kinds; and a pool too small
 * for a prompt fails that eval, the session and the pool as they were.
 */
Test(prefix, what_pages_cannot_hold_is_refused)
{
	static const char *const names[] = { "replay_batched", NULL };
	const struct path paged = { NULL, "cpu", NULL, 1, 0, 16 };
	struct rig r;
	char *path = fixture("tiny-llama.gguf"), *hybrid = fixture("tiny-qwen35.gguf");
	struct q4kh_error err = { { 0 } };
	struct q4kh_kv_paged *k = NULL, *small = NULL;
	struct q4kh_session *a, *b, *c, *d;
	struct q4kh_batch_seq two[2];
	int32_t ids[40];

	rig_open(&r, hybrid, 0, &(const struct path){ NULL, "cpu", NULL, 1, 0, 0 });
	cr_expect_eq(q4kh_kv_paged_new(r.m, 8, 16, Q4KH_TYPE_F32, &k, &err), -1);
	cr_expect(strstr(err.msg, "recurrent layers") != NULL, "%s", err.msg);
	rig_close(&r);
	rig_open(&r, path, 0, &(const struct path){ test_plugin_dir(names), "replay-batched", NULL,
	                                            0, 0, 0 });
	cr_expect_eq(q4kh_kv_paged_new(r.m, 8, 16, Q4KH_TYPE_F16, &k, &err), -1);
	cr_expect_str_eq(err.msg,
	                 "backend replay-batched has no paged KV cache: it has no attention_paged (ABI 1.8)");
	rig_close(&r);

	rig_open(&r, path, 0, &paged);
	for (int i = 0; i < 40; i++)
		ids[i] = token(3, i, r.n_vocab);
	a = session_on(&r, 1);
	b = session_on(&r, 0);
	cr_assert_eq(q4kh_session_eval(a, ids, 20, NULL, 0, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_eval(b, ids, 20, NULL, 0, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_session_take_prefix(b, a, 0, 16, &err), -1);
	cr_expect(strstr(err.msg, "paged KV cache") != NULL, "%s", err.msg);
	two[0] = (struct q4kh_batch_seq){ .s = a, .id = ids[20] };
	two[1] = (struct q4kh_batch_seq){ .s = b, .id = ids[20] };
	cr_expect_eq(q4kh_session_eval_batch(two, 2, &err), -1);
	cr_expect_str_eq(err.msg, "sequence 1 of a batched step is on another model, backend or KV cache than sequence 0");
	/* a pool of 3 pages of 16 tokens: c's 20 tokens and d's 10 fit, c's
	 * next 20 do not; past the pool's 48 tokens, no table fits */
	cr_assert_eq(q4kh_kv_paged_new(r.m, 3, 16, Q4KH_TYPE_F32, &small, &err), 0, "%s", err.msg);
	{
		const struct q4kh_session_params sp = { .n_ctx = N_CTX, .paged = small };

		cr_assert_eq(q4kh_session_new(r.m, &sp, &c, &err), 0, "%s", err.msg);
		cr_assert_eq(q4kh_session_new(r.m, &sp, &d, &err), 0, "%s", err.msg);
	}
	cr_assert_eq(q4kh_session_eval(c, ids, 20, NULL, 0, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_eval(d, ids, 10, NULL, 0, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_session_eval(c, ids + 20, 20, NULL, 0, &err), -1);
	cr_expect_str_eq(err.msg, "KV pool full: 0 of its 3 pages free, 1 needed");
	cr_expect_eq(c->n_past, 20);
	cr_expect_eq(c->table.n, 2);
	q4kh_session_free(d);
	cr_expect_eq(q4kh_session_eval(c, ids + 20, 20, NULL, 0, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_session_eval(c, ids, 10, NULL, 0, &err), -1);
	cr_expect_str_eq(err.msg, "KV block table of 50 tokens, expected 0 .. 48 (the pool's 3 pages of 16)");
	q4kh_session_free(c);
	cr_expect_eq(small->pool.n_free, 3);
	q4kh_kv_paged_free(small);
	q4kh_session_free(a);
	q4kh_session_free(b);
	rig_close(&r);
	free(path);
	free(hybrid);
}

/* The tokens of a test holder: stream K's first N, with token AT changed
 * when AT >= 0. */
static void holder_tokens(int32_t *ids, int k, int n, int at)
{
	for (int i = 0; i < n; i++)
		ids[i] = token((size_t)k, i, 32000) + (i == at);
}

/*
 * The index of what holders computed, on holders built for the purpose:
 * the longest run of whole blocks, a block that differs ending it, equal
 * tokens after a different start not matching (the hashes chain), the
 * limit, truncation, least recently used on ties and for eviction.
 */
Test(prefix, the_index_finds_the_longest_run_of_whole_blocks)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_prefix *p;
	int32_t a[100], b[100], c[100];
	int64_t mine[3];
	uint64_t ha[6], hb[6], hc[6];
	int h, lru[3] = { 1, 1, 1 };

	holder_tokens(a, 1, 100, -1);
	holder_tokens(b, 1, 100, 50); /* block 3 (tokens 48 .. 63) differs */
	holder_tokens(c, 2, 100, -1);
	memcpy(c + 16, a + 16, sizeof(int32_t) * 32); /* a's blocks 1 and 2, after another 0 */
	q4kh_prefix_hashes(a, 100, ha);
	q4kh_prefix_hashes(b, 100, hb);
	q4kh_prefix_hashes(c, 100, hc);
	cr_expect(ha[0] == hb[0] && ha[2] == hb[2] && ha[3] != hb[3] && ha[5] != hb[5]);
	cr_expect(ha[1] != hc[1] && ha[2] != hc[2], "the hashes of equal blocks after other ones");

	cr_assert_eq(q4kh_prefix_new(3, 128, &p, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_prefix_find(p, a, 100, 99, &h, mine), 0);
	cr_expect_eq(h, -1);
	q4kh_prefix_append(p, 0, a, 40);
	q4kh_prefix_append(p, 1, b, 30);
	q4kh_prefix_append(p, 1, b + 30, 40); /* in two pieces, as steps append */
	q4kh_prefix_append(p, 2, c, 64);
	q4kh_prefix_keep(p, 1, 70);
	q4kh_prefix_keep(p, 0, 40);
	cr_expect_eq(q4kh_prefix_find(p, a, 100, 99, &h, mine), 48);
	cr_expect_eq(h, 1);
	cr_expect(mine[0] == 32 && mine[1] == 48 && mine[2] == 0, "%lld %lld %lld",
	          (long long)mine[0], (long long)mine[1], (long long)mine[2]);
	/* at most 40 tokens: holders 0 and 1 both have 32; 1 is used less lately */
	cr_expect_eq(q4kh_prefix_find(p, a, 100, 40, &h, NULL), 32);
	cr_expect_eq(h, 1);
	cr_expect_eq(q4kh_prefix_find(p, a, 31, 99, &h, NULL), 16);
	/* holder 1 keeps its first 20 tokens: its one whole block */
	q4kh_prefix_keep(p, 1, 20);
	cr_expect_eq(q4kh_prefix_find(p, a, 100, 99, &h, mine), 32);
	cr_expect(h == 0 && mine[1] == 16, "holder %d, holder 1's %lld", h, (long long)mine[1]);
	/* holder 2 is used least lately; without it, holder 0 (holder 1 was
	 * kept after it) */
	cr_expect_eq(q4kh_prefix_lru(p, lru), 2);
	lru[2] = 0;
	cr_expect_eq(q4kh_prefix_lru(p, lru), 0);
	/* past the cap, tokens are not kept */
	q4kh_prefix_append(p, 0, a, 100);
	cr_expect_eq(q4kh_prefix_find(p, a, 100, 99, &h, mine), 32);
	q4kh_prefix_free(p);
}
