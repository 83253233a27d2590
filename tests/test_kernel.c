/*
 * Kernel variants through the real loader, policy and session: a variant
 * for the cpu backend (tests/plugins/cpu_q8act.c, int8 activations) takes
 * over every Q4_K weight of the default model, its logits stay close to the
 * reference's, releasing it restores the reference bit for bit, and every
 * request that cannot be honoured fails with a reason.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "kernel.h"
#include "model.h"
#include "policy.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"

/* 12 tokens: more than max_gemv_columns, so prefill takes gemm, decode gemv. */
#define PROMPT "Water boils at one hundred degrees Celsius at sea level, and"

struct rig {
	struct q4kh_registry *reg;
	struct q4kh_backend be;
	struct q4kh_model *m;
	struct q4kh_session *s;
	int32_t *ids;
	size_t n;
};

static void rig_open(struct rig *r)
{
	char path[8192];
	struct q4kh_error err = { { 0 } };
	struct q4kh_session_params sp = { .n_ctx = 64 };
	struct q4kh_tokenizer *tok;
	const char *model = test_model_path();

	memset(r, 0, sizeof(*r));
	snprintf(path, sizeof(path), "%s/plugins/cpu/.libs:%s/tests/plugins/.libs",
	         test_builddir(), test_builddir());
	cr_assert_eq(q4kh_registry_scan(path, NULL, &r->reg, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(r->reg, "cpu"), 0, &r->be, &err),
	             0, "%s", err.msg);
	cr_assert_eq(q4kh_model_open(model, &r->m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(r->m, &r->be, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(r->m, &sp, &r->s, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(r->m->gguf, &tok, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenize(tok, PROMPT, strlen(PROMPT), 1, 0, &r->ids, &r->n, &err),
	             0, "%s", err.msg);
	q4kh_tokenizer_free(tok);
	cr_assert_gt(r->n, 8, "the prompt must exceed max_gemv_columns");
}

static void rig_close(struct rig *r)
{
	q4kh_session_free(r->s);
	q4kh_model_free(r->m);
	q4kh_backend_close(&r->be);
	q4kh_registry_free(r->reg);
	free(r->ids);
}

/* Prefill (batched) then two decode steps; logits of every position. */
static float *run(struct rig *r)
{
	const int64_t v = r->m->hp.n_vocab, n = (int64_t)r->n;
	float *logits = malloc(sizeof(float) * v * (n + 2));
	struct q4kh_error err = { { 0 } };

	q4kh_session_reset(r->s);
	cr_assert_eq(q4kh_session_eval(r->s, r->ids, n - 2, logits, 1, &err), 0, "%s", err.msg);
	for (int64_t i = n - 2; i < n; i++)
		cr_assert_eq(q4kh_session_eval(r->s, &r->ids[i], 1, logits + i * v, 1, &err),
		             0, "%s", err.msg);
	return logits;
}

Test(kernel, variant_serves_q4k_and_releases_to_reference, .timeout = 300)
{
	struct rig r;
	struct q4kh_kernel k;
	struct q4kh_error err = { { 0 } };
	float *ref, *var, *back;
	int64_t v, n;
	double worst = 1;

	rig_open(&r);
	v = r.m->hp.n_vocab;
	n = (int64_t)r.n;
	ref = run(&r);
	cr_assert_eq(q4kh_policy_use_kernel(r.reg, &r.be, r.m, "cpu-q8act", &k, &err), 0,
	             "%s", err.msg);
	cr_assert_eq(q4kh_model_kernel_for(r.m, Q4KH_TYPE_Q4_K), &k);
	cr_assert_null(q4kh_model_kernel_for(r.m, Q4KH_TYPE_Q8_0),
	               "the variant implements only Q4_K");
	var = run(&r);
	for (int64_t p = 1; p < n; p++) {
		double c = test_cosine(ref + p * v, var + p * v, v);
		worst = c < worst ? c : worst;
		cr_expect_geq(c, 0.999, "position %lld: cosine %.6f", (long long)p, c);
	}
	fprintf(stderr, "cpu-q8act vs reference: min cosine %.6f over positions 1..%lld\n",
	        worst, (long long)n - 1);
	cr_expect_neq(memcmp(ref, var, sizeof(float) * v * n), 0,
	              "int8 activations must change the logits, or the variant did not run");

	q4kh_model_release_kernels(r.m);
	cr_assert_null(q4kh_model_kernel_for(r.m, Q4KH_TYPE_Q4_K));
	back = run(&r);
	cr_expect_eq(memcmp(ref, back, sizeof(float) * v * n), 0,
	             "after release the reference logits must come back bit for bit");
	q4kh_kernel_close(&k);
	free(ref);
	free(var);
	free(back);
	rig_close(&r);
}

Test(kernel, requests_that_cannot_be_honoured_fail_with_reasons)
{
	struct rig r;
	struct q4kh_kernel k;
	struct q4kh_error err = { { 0 } };

	rig_open(&r);
	cr_assert_eq(q4kh_policy_use_kernel(r.reg, &r.be, r.m, "nosuch", &k, &err), -1);
	cr_expect(strstr(err.msg, "kernel variant 'nosuch' was not found") != NULL, "%s", err.msg);
	cr_expect(strstr(err.msg, "cpu-q8act (for cpu)") != NULL, "lists what exists: %s", err.msg);
	cr_assert_eq(q4kh_policy_use_kernel(r.reg, &r.be, r.m, "kernel-ok", &k, &err), -1);
	cr_expect_str_eq(err.msg, "kernel variant kernel-ok targets backend 'cuda', not 'cpu'");
	cr_assert_eq(q4kh_policy_use_kernel(r.reg, &r.be, r.m, "cpu", &k, &err), -1,
	             "a backend is no kernel variant");
	cr_assert_null(q4kh_model_kernel_for(r.m, Q4KH_TYPE_Q4_K), "failures leave the built-in");
	rig_close(&r);
}

Test(kernel, environment_value_is_parsed_not_tested_for_presence)
{
	const char *origin;

	unsetenv("Q4KHOST_Q4K_KERNEL");
	cr_expect_null(q4kh_policy_kernel_name(NULL, &origin));
	cr_expect_str_eq(origin, "default");
	setenv("Q4KHOST_Q4K_KERNEL", "0", 1);
	cr_expect_null(q4kh_policy_kernel_name(NULL, &origin), "0 means the built-in");
	setenv("Q4KHOST_Q4K_KERNEL", "none", 1);
	cr_expect_null(q4kh_policy_kernel_name(NULL, &origin));
	setenv("Q4KHOST_Q4K_KERNEL", "cuda-mwv", 1);
	cr_expect_str_eq(q4kh_policy_kernel_name(NULL, &origin), "cuda-mwv");
	cr_expect_str_eq(origin, "Q4KHOST_Q4K_KERNEL");
	cr_expect_str_eq(q4kh_policy_kernel_name("cuda-dp4a", &origin), "cuda-dp4a");
	cr_expect_str_eq(origin, "--kernel", "the CLI outranks the environment");
	cr_expect_null(q4kh_policy_kernel_name("built-in", &origin));
}
