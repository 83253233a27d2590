/*
 * Kernel variants through the real loader, policy and session: a variant
 * for the cpu backend (tests/plugins/cpu_q8act.c, int8 activations) takes
 * over every Q4_K weight of the default model, its logits stay close to the
 * reference's, releasing it restores the reference bit for bit, and every
 * request that cannot be honoured fails with a reason. The per-device
 * kernel setting (policy.h) is resolved for GPU-like device records from
 * the command line, Q4KHOST_Q4K_KERNEL and [gpu.*] config sections.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
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
	cr_expect_str_eq(err.msg, "kernel variant kernel-ok targets backends of kind 'cuda', not cpu (kind 'cpu')");
	cr_assert_eq(q4kh_policy_use_kernel(r.reg, &r.be, r.m, "cpu", &k, &err), -1,
	             "a backend is no kernel variant");
	cr_assert_null(q4kh_model_kernel_for(r.m, Q4KH_TYPE_Q4_K), "failures leave the built-in");
	rig_close(&r);
}

/* Two GPU-like device records of a "cuda" backend (kernel-ok targets it). */
static const struct q4kh_device_record h200 = { .index = 0, .name = "NVIDIA H200",
	                                        .uuid = "GPU-aaaa", .arch = "sm_90" };
static const struct q4kh_device_record l4 = { .index = 1, .name = "NVIDIA L4",
	                                      .uuid = "GPU-bbbb", .arch = "sm_89" };
static const struct q4kh_device_record a100 = { .index = 2, .name = "NVIDIA A100",
	                                        .uuid = "GPU-cccc", .arch = "sm_80" };

static struct q4kh_registry *variants_registry(void)
{
	char path[8192];
	struct q4kh_registry *reg;
	struct q4kh_error err = { { 0 } };

	snprintf(path, sizeof(path), "%s/plugins/cpu/.libs:%s/tests/plugins/.libs",
	         test_builddir(), test_builddir());
	cr_assert_eq(q4kh_registry_scan(path, NULL, &reg, &err), 0, "%s", err.msg);
	return reg;
}

/* The config of FILE alone (no system or user files). */
static struct q4kh_config *config_of(const char *text)
{
	const char *dir = test_tmpdir();
	char file[4200];
	struct q4kh_config *c;
	struct q4kh_error err = { { 0 } };

	setenv("XDG_CONFIG_HOME", dir, 1);
	snprintf(file, sizeof(file), "%s/q.ini", dir);
	test_write_file(file, text, strlen(text));
	cr_assert_eq(q4kh_config_load(dir, file, &c, &err), 0, "%s", err.msg);
	return c;
}

static struct q4kh_kernel_choice choose(struct q4kh_registry *reg, struct q4kh_config *c,
                                        const char *cli, const char *backend,
                                        const struct q4kh_device_record *dev)
{
	struct q4kh_kernel_choice ch;
	struct q4kh_error err = { { 0 } };

	cr_assert_eq(q4kh_policy_kernel_choice(reg, c, cli, NULL, backend, dev, &ch, &err), 0,
	             "%s", err.msg);
	return ch;
}

Test(kernel, config_sections_match_from_most_to_least_specific)
{
	struct q4kh_registry *reg = variants_registry();
	struct q4kh_config *c = config_of("[gpu]\nq4k_kernel = none\n"
	                                  "[gpu.sm_89]\nq4k_kernel = kernel-ok\n"
	                                  "[gpu.NVIDIA H200]\nq4k_kernel = kernel-ok, none\n"
	                                  "[gpu.1]\nq4k_kernel = built-in\n"
	                                  "[gpu.GPU-cccc]\n\n q4k_kernel = kernel-ok\n");
	struct q4kh_kernel_choice ch;

	unsetenv("Q4KHOST_Q4K_KERNEL");
	ch = choose(reg, c, NULL, "cuda", &h200);
	cr_expect_eq(ch.source, Q4KH_KERNEL_CONFIG);
	cr_expect_eq(ch.n, 2, "a list keeps its order");
	cr_expect_str_eq(ch.names[0], "kernel-ok");
	cr_expect_null(ch.names[1], "none: the built-in kernels");
	cr_expect(strstr(ch.origin, "q.ini:6 [gpu.nvidia h200]") != NULL, "the name, with its line: %s",
	          ch.origin);
	ch = choose(reg, c, NULL, "cuda", &l4);
	cr_expect(strstr(ch.origin, "q.ini:8 [gpu.1]") != NULL, "the index beats the arch: %s",
	          ch.origin);
	cr_expect(ch.n == 1 && !ch.names[0]);
	ch = choose(reg, c, NULL, "cuda", &a100);
	cr_expect(strstr(ch.origin, "q.ini:11 [gpu.gpu-cccc]") != NULL, "the UUID: %s", ch.origin);
	ch = choose(reg, c, NULL, "cuda", &(struct q4kh_device_record){ .index = 5, .uuid = "x",
	                                                                .name = "y", .arch = "sm_89" });
	cr_expect(strstr(ch.origin, "q.ini:4 [gpu.sm_89]") != NULL, "the arch: %s", ch.origin);
	ch = choose(reg, c, NULL, "cuda", &(struct q4kh_device_record){ .index = 7, .uuid = "x",
	                                                                .name = "y", .arch = "z" });
	cr_expect(strstr(ch.origin, "q.ini:2 [gpu]") != NULL, "[gpu] last: %s", ch.origin);
	/* A section naming only another backend's variant does not hold for the
	 * cpu backend's device: [gpu] (none) does. */
	ch = choose(reg, c, NULL, "cpu", &(struct q4kh_device_record){ .index = 3, .uuid = "cpu",
	                                                               .name = "cpu", .arch = "sm_89" });
	cr_expect(strstr(ch.origin, "[gpu]") != NULL && ch.n == 1 && !ch.names[0], "%s", ch.origin);
	q4kh_config_free(c);
	q4kh_registry_free(reg);
}

Test(kernel, environment_lists_are_parsed_per_device_and_the_cli_wins)
{
	struct q4kh_registry *reg = variants_registry();
	struct q4kh_config *c = config_of("[gpu]\nq4k_kernel = none\n");
	struct q4kh_kernel_choice ch;

	setenv("Q4KHOST_Q4K_KERNEL", "0=kernel-ok,sm_89=none", 1);
	ch = choose(reg, c, NULL, "cuda", &h200);
	cr_expect_eq(ch.source, Q4KH_KERNEL_ENV);
	cr_expect_str_eq(ch.origin, "Q4KHOST_Q4K_KERNEL");
	cr_expect(ch.n == 1 && ch.names[0] && !strcmp(ch.names[0], "kernel-ok"));
	ch = choose(reg, c, NULL, "cuda", &l4);
	cr_expect(ch.source == Q4KH_KERNEL_ENV && ch.n == 1 && !ch.names[0], "sm_89=none");
	ch = choose(reg, c, NULL, "cuda", &a100);
	cr_expect_eq(ch.source, Q4KH_KERNEL_CONFIG, "no entry holds for device 2: the config");
	setenv("Q4KHOST_Q4K_KERNEL", "kernel-ok,GPU-AAAA=none", 1);
	ch = choose(reg, c, NULL, "cuda", &h200);
	cr_expect(ch.n == 1 && !ch.names[0], "a UUID (any case) beats an entry for every device");
	ch = choose(reg, c, NULL, "cuda", &l4);
	cr_expect(ch.n == 1 && ch.names[0] && !strcmp(ch.names[0], "kernel-ok"));
	/* Parsed, not tested for presence: 0 alone means the built-in kernels. */
	setenv("Q4KHOST_Q4K_KERNEL", "0", 1);
	ch = choose(reg, c, NULL, "cuda", &l4);
	cr_expect(ch.source == Q4KH_KERNEL_ENV && ch.n == 1 && !ch.names[0]);
	/* A variant for another backend claims the device but names nothing
	 * the cpu backend can run: an explicit request that no one honours. */
	setenv("Q4KHOST_Q4K_KERNEL", "kernel-ok", 1);
	ch = choose(reg, c, NULL, "cpu", &(struct q4kh_device_record){ .uuid = "cpu" });
	cr_expect_eq(ch.source, Q4KH_KERNEL_ENV);
	cr_expect_eq(ch.n, 0);
	cr_assert_eq(ch.n_others, 1);
	cr_expect_str_eq(ch.others[0]->name, "kernel-ok");
	ch = choose(reg, c, "cpu-q8act", "cpu", &(struct q4kh_device_record){ .uuid = "cpu" });
	cr_expect_eq(ch.source, Q4KH_KERNEL_CLI, "the command line outranks the environment");
	cr_expect_str_eq(ch.names[0], "cpu-q8act");
	setenv("Q4KHOST_Q4K_KERNEL", "", 1);
	ch = choose(reg, c, NULL, "cuda", &h200);
	cr_expect_eq(ch.source, Q4KH_KERNEL_CONFIG, "an empty variable counts as unset");
	unsetenv("Q4KHOST_Q4K_KERNEL");
	q4kh_config_free(c);
	q4kh_registry_free(reg);
}

Test(kernel, bad_kernel_values_are_errors_that_say_where_and_what_is_valid)
{
	static const char *const bad[][2] = {
		{ "nosuch", "Q4KHOST_Q4K_KERNEL: 'nosuch' is not a kernel variant" },
		{ "=kernel-ok", "an entry has '=' but no device before it" },
		{ "0=", "an empty kernel name" },
		{ "kernel-ok,,none", "an empty kernel name" },
	};
	struct q4kh_registry *reg = variants_registry();
	struct q4kh_config *c = config_of("[gpu.0]\nq4k_kernel = 0=kernel-ok\n");
	struct q4kh_kernel_choice ch;
	struct q4kh_error err = { { 0 } };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("Q4KHOST_Q4K_KERNEL", bad[i][0], 1);
		cr_expect_eq(q4kh_policy_kernel_choice(reg, NULL, NULL, NULL, "cuda", &h200, &ch, &err), -1,
		             "%s", bad[i][0]);
		cr_expect(strstr(err.msg, bad[i][1]) != NULL, "%s: %s", bad[i][0], err.msg);
	}
	setenv("Q4KHOST_Q4K_KERNEL", "nosuch", 1);
	q4kh_policy_kernel_choice(reg, NULL, NULL, NULL, "cuda", &h200, &ch, &err);
	cr_expect(strstr(err.msg, "valid: none, built-in, ") != NULL, "%s", err.msg);
	cr_expect(strstr(err.msg, "cpu-q8act (for cpu)") != NULL, "%s", err.msg);
	cr_expect(strstr(err.msg, "kernel-ok (for cuda)") != NULL, "%s", err.msg);
	unsetenv("Q4KHOST_Q4K_KERNEL");
	cr_expect_eq(q4kh_policy_kernel_choice(reg, c, NULL, NULL, "cuda", &h200, &ch, &err), -1);
	cr_expect(strstr(err.msg, "q.ini:2 [gpu.0]: \"0=kernel-ok\": a config value lists kernel names only") != NULL,
	          "%s", err.msg);
	q4kh_config_free(c);
	q4kh_registry_free(reg);
}
