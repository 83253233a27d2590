/*
 * The F2 guard through the real CLI: `q4khost validate` loads the planted
 * defect plugins (tests/plugins/cpu_defect.c) and a correct variant through
 * the real loader, measures each in a child process and must name what
 * fired; receipts make the second run free and a changed key (a lowered
 * floor in the config) invalidates them; a plugin that aborts or hangs
 * rejects itself while the host carries on.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

/* Run q4khost validate ARGS --json; the parsed output and the exit code. */
static json_t *validate(const char *plugins, const char *receipts, const char *args,
                        int *status)
{
	char cmd[8192];
	json_error_t jerr;
	json_t *j;
	FILE *p;

	snprintf(cmd, sizeof(cmd),
	         "Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost validate --json --plugin-path %s %s",
	         receipts, test_builddir(), plugins, args);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	j = json_loadf(p, 0, &jerr);
	*status = pclose(p);
	return j;
}

static json_t *find(json_t *root, const char *kernel)
{
	size_t i;
	json_t *c;

	json_array_foreach(json_object_get(root, "candidates"), i, c)
		if (!strcmp(json_string_value(json_object_get(c, "kernel")), kernel))
			return c;
	cr_assert_fail("no candidate %s in the output", kernel);
	return NULL;
}

static const char *str(json_t *c, const char *key)
{
	const char *s = json_string_value(json_object_get(c, key));
	return s ? s : "";
}

static void expect(json_t *root, const char *kernel, const char *verdict,
                   const char *message_part)
{
	json_t *c = find(root, kernel);

	cr_expect_str_eq(str(c, "verdict"), verdict, "%s: %s", kernel, str(c, "message"));
	cr_expect(strstr(str(c, "message"), message_part) != NULL, "%s: '%s' lacks '%s'",
	          kernel, str(c, "message"), message_part);
}

Test(validate, every_planted_defect_is_caught_by_the_cli, .timeout = 900)
{
	static const char *const names[] = { "cpu_q8act", "defect_biased", "defect_noisy",
		                             "defect_nan", "defect_flip", "defect_kv",
		                             "defect_abort", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char cfg[4200], args[4400];
	json_t *root, *c;
	size_t i;
	int status;

	test_model_path();
	plugins = test_plugin_dir(names);
	root = validate(plugins, receipts, "--timeout 300", &status);
	cr_assert_not_null(root, "validate printed no JSON");
	cr_expect_eq(WEXITSTATUS(status), 1, "a rejected candidate makes the exit code 1");
	expect(root, "cpu-q8act", "pass", "pass over");
	expect(root, "defect-biased", "broken", "< 0.90 catastrophic floor");
	expect(root, "defect-noisy", "reject", "< 0.95 acceptance floor");
	expect(root, "defect-nan", "reject", "NaN or Inf (F2.1)");
	expect(root, "defect-flip", "reject", "argmax differs beyond a near-tie (F2.3");
	expect(root, "defect-kv", "broken", "(decode step 4)");
	expect(root, "defect-abort", "reject", "killed by signal 6");
	json_array_foreach(json_object_get(root, "candidates"), i, c)
		cr_expect(strstr(str(c, "source"), "fresh (reason: no receipt)") == str(c, "source"),
		          "%s: %s", str(c, "kernel"), str(c, "source"));
	json_decref(root);

	/* A second run decides from the receipts alone. */
	root = validate(plugins, receipts, "", &status);
	json_array_foreach(json_object_get(root, "candidates"), i, c)
		cr_expect(!strncmp(str(c, "source"), "receipt (", 9), "%s: %s",
		          str(c, "kernel"), str(c, "source"));
	json_decref(root);

	/* Lowering one plugin's floor is a new key: measured again, and passes. */
	snprintf(cfg, sizeof(cfg), "%s/lower.ini", receipts);
	test_write_file(cfg, "[plugin.defect-noisy]\nf2_floor = 0.92\n", 37);
	snprintf(args, sizeof(args), "--config %s --kernel defect-noisy", cfg);
	root = validate(plugins, receipts, args, &status);
	expect(root, "defect-noisy", "pass", "pass over");
	cr_expect(strstr(str(find(root, "defect-noisy"), "source"), "the F2 settings changed") != NULL,
	          "%s", str(find(root, "defect-noisy"), "source"));
	cr_expect_eq(WEXITSTATUS(status), 0);
	json_decref(root);
}

Test(validate, a_floor_below_the_catastrophic_one_is_refused)
{
	static const char *const names[] = { "defect_noisy", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char cfg[4200], args[4400], cmd[9000];
	int status;

	test_model_path();
	plugins = test_plugin_dir(names);
	snprintf(cfg, sizeof(cfg), "%s/low.ini", receipts);
	test_write_file(cfg, "[plugin.defect-noisy]\nf2_floor = 0.5\n", 36);
	snprintf(args, sizeof(args), "--config %s", cfg);
	snprintf(cmd, sizeof(cmd),
	         "Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost validate --plugin-path %s %s 2>&1 | grep -q 'f2_floor = \"0.5\": expected a number in \\[0.9, 1\\]'",
	         receipts, test_builddir(), plugins, args);
	status = system(cmd);
	cr_expect_eq(WEXITSTATUS(status), 0, "the error names the key, its value and the range");
}

Test(validate, a_hanging_plugin_is_killed_and_rejected, .timeout = 120)
{
	static const char *const names[] = { "defect_hang", NULL };
	const char *plugins, *receipts = test_tmpdir();
	json_t *root;
	int status;

	test_model_path();
	plugins = test_plugin_dir(names);
	root = validate(plugins, receipts, "--timeout 5", &status);
	cr_assert_not_null(root);
	expect(root, "defect-hang", "reject", "timed out after 5 s");
	json_decref(root);
}

/* q4khost run through the guard: what serves, and what a named request gets. */
static int run_cli(const char *plugins, const char *receipts, const char *args,
                   char *out, size_t cap)
{
	char cmd[8192];
	size_t got;
	FILE *p;

	snprintf(cmd, sizeof(cmd),
	         "Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost run -n 2 -p Hello --plugin-path %s %s 2>&1",
	         receipts, test_builddir(), plugins, args);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	got = fread(out, 1, cap - 1, p);
	out[got] = 0;
	return WEXITSTATUS(pclose(p));
}

Test(validate, run_serves_only_what_passed_and_fails_closed_when_named, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", "defect_nan", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char out[16384];

	test_model_path();
	plugins = test_plugin_dir(names);
	cr_expect_eq(run_cli(plugins, receipts, "--kernel cpu-q8act", out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "kernels: Q8_0=cpu built-in, Q5_0=cpu built-in, Q4_K=cpu-q8act") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh (reason: no receipt))") != NULL, "%s", out);
	cr_expect_eq(run_cli(plugins, receipts, "--kernel cpu-q8act", out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (receipt (") != NULL, "the second run uses the receipt: %s", out);
	cr_expect_eq(run_cli(plugins, receipts, "--kernel defect-nan", out, sizeof(out)), 4,
	             "a named variant that fails F2 is an error, not a fall-back: %s", out);
	cr_expect(strstr(out, "cpu/defect-nan: F2 reject: position 1 (prefill)") != NULL, "%s", out);
	cr_expect_eq(run_cli(plugins, receipts, "--kernel defect-nan --f2 off", out, sizeof(out)), 0,
	             "%s", out);
	cr_expect(strstr(out, "F2: off (--f2 off): F2 IS OFF: cpu/defect-nan serves unverified") != NULL,
	          "%s", out);
	cr_expect_eq(run_cli(plugins, receipts, "--f2 maybe", out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "not one of auto, fresh, off, require") != NULL, "%s", out);
}
