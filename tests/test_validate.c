/*
 * The F2 guard through the real CLI: `q4khost validate` loads the planted
 * defect plugins (tests/plugins/cpu_defect.c) and a correct variant through
 * the real loader, measures each in a child process and must name what
 * fired; receipts make the second run free and a changed key (a lowered
 * floor in the config, a rewritten plugin file) invalidates them; a plugin
 * that aborts, hangs or eats memory rejects itself while the host carries
 * on; the run's own prompt as the probe (--f2-probe prompt) sees a defect
 * the built-in probe cannot, and its receipt vouches for that prompt only;
 * the deep probe (validate --deep) sees defects past position 600 and past
 * 8 decode steps, and [f2] require_deep serves on deep receipts only.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "cli_rig.h"
#include "guard.h"
#include "helpers.h"
#include "isolate.h"

/* Run q4khost validate ARGS --json; the parsed output and the exit code. */
static json_t *validate(const char *plugins, const char *receipts, const char *args,
                        int *status)
{
	char cmd[8192];
	json_error_t jerr;
	json_t *j;
	FILE *p;

	snprintf(cmd, sizeof(cmd),
	         "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost validate --json "
	         "--plugin-path %s %s",
	         receipts, receipts, test_builddir(), plugins, args);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	j = json_loadf(p, 0, &jerr);
	*status = pclose(p);
	return j;
}

/* The candidate whose FIELD ("kernel", "backend") is VALUE. */
static json_t *find_by(json_t *root, const char *field, const char *value)
{
	size_t i;
	json_t *c;

	json_array_foreach(json_object_get(root, "candidates"), i, c)
		if (!strcmp(json_string_value(json_object_get(c, field)), value))
			return c;
	cr_assert_fail("no candidate with %s %s in the output", field, value);
	return NULL;
}

static json_t *find(json_t *root, const char *kernel)
{
	return find_by(root, "kernel", kernel);
}

static const char *str(json_t *c, const char *key)
{
	const char *s = json_string_value(json_object_get(c, key));
	return s ? s : "";
}

static void expect_candidate(json_t *c, const char *verdict, const char *message_part)
{
	const char *name = str(c, "kernel");

	if (!strcmp(name, "built-in"))
		name = str(c, "backend");
	cr_expect_str_eq(str(c, "verdict"), verdict, "%s: %s", name, str(c, "message"));
	cr_expect(strstr(str(c, "message"), message_part) != NULL, "%s: '%s' lacks '%s'",
	          name, str(c, "message"), message_part);
}

static void expect(json_t *root, const char *kernel, const char *verdict,
                   const char *message_part)
{
	expect_candidate(find(root, kernel), verdict, message_part);
}

/*
 * The folder PLUGINS, then -m and the tiny llama fixture: what the tests of
 * host logic pass as their plugin path, so that they measure on it in a
 * second, not on the default model in minutes. The planted defects act on
 * its LM head (Q8_0, 4107 rows) as on the default model's. The text is
 * overwritten by the next call.
 */
static const char *on_tiny(const char *plugins)
{
	static char both[8192];

	snprintf(both, sizeof(both), "%s -m %s", plugins, tiny_model());
	return both;
}

/* The tiny llama fixture's kernels line when variant K serves its Q4_K
 * weights: its types in its file's order (token_embd Q4_K, output Q8_0,
 * then the layers' Q6_K), the others on the built-in kernels. */
#define TINY_Q4K_SERVED_BY(k) "Q4_K=" k ", Q8_0=cpu built-in, Q6_K=cpu built-in"

/* How many tokens F2's prompt probe makes of TEXT on the tiny llama fixture. */
static size_t tiny_tokens(const char *text)
{
	struct q4kh_error err = { { 0 } };
	int32_t *ids;
	size_t n;

	cr_assert_eq(q4kh_guard_probe(tiny_model(), text, &ids, &n, &err), 0, "%s", err.msg);
	free(ids);
	return n;
}

/* Seven F2 measurements on the tiny llama model, then the same from
 * receipts, then one again under a changed floor: seconds. */
Test(validate, every_planted_defect_is_caught_by_the_cli, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", "defect_biased", "defect_noisy",
		                             "defect_nan", "defect_flip", "defect_abort", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char cfg[4200], args[4400];
	json_t *root, *c;
	size_t i;
	int status;

	plugins = on_tiny(test_plugin_dir(names));
	root = validate(plugins, receipts, "--timeout 300", &status);
	cr_assert_not_null(root, "validate printed no JSON");
	cr_expect_eq(WEXITSTATUS(status), 1, "a rejected candidate makes the exit code 1");
	/* each judged at its class's floor, named with the class */
	expect(root, "cpu-q8act", "pass", "at the 0.99 acceptance floor (int8 arithmetic)");
	expect(root, "defect-biased", "broken", "< 0.90 catastrophic floor");
	expect(root, "defect-noisy", "reject", "< 0.99999 acceptance floor (f32 arithmetic)");
	expect(root, "defect-nan", "reject", "NaN or Inf (F2.1)");
	/* its flip costs cosine 0.9999: under the f32 floor before F2.3 fires
	 * (test_f2.c shows F2.3 at 0.95) */
	expect(root, "defect-flip", "reject", "< 0.99999 acceptance floor (f32 arithmetic)");
	expect(root, "defect-abort", "reject", "killed by signal 6");
	json_array_foreach(json_object_get(root, "candidates"), i, c)
		cr_expect(strstr(str(c, "source"), "fresh: no receipt") == str(c, "source"),
		          "%s: %s", str(c, "kernel"), str(c, "source"));
	json_decref(root);

	/* A second run decides from the receipts alone. */
	root = validate(plugins, receipts, "", &status);
	json_array_foreach(json_object_get(root, "candidates"), i, c)
		cr_expect(!strncmp(str(c, "source"), "receipt of ", 11), "%s: %s",
		          str(c, "kernel"), str(c, "source"));
	json_decref(root);

	/* Lowering one plugin's floor is a new key: measured again, and passes
	 * at the floor set, which wins over the class's. */
	snprintf(cfg, sizeof(cfg), "%s/lower.ini", receipts);
	test_write_file(cfg, "[plugin.defect-noisy]\nf2_floor = 0.92\n", 37);
	snprintf(args, sizeof(args), "--config %s --kernel defect-noisy", cfg);
	root = validate(plugins, receipts, args, &status);
	expect(root, "defect-noisy", "pass", "at the 0.92 acceptance floor (set by f2_floor)");
	cr_expect(strstr(str(find(root, "defect-noisy"), "source"), "the F2 settings changed") != NULL,
	          "%s", str(find(root, "defect-noisy"), "source"));
	cr_expect_eq(WEXITSTATUS(status), 0);
	json_decref(root);
}

/*
 * defect-kv spoils the default model's Q8_0 value projections after the
 * fourth decode step (the tiny fixtures have no Q8_0 layer matrix): the
 * CLI names the decode step where F2 found it broken. One measurement on
 * the default model.
 */
Test(validate, a_kv_cache_defect_is_caught_by_the_cli, .timeout = 600)
{
	static const char *const names[] = { "defect_kv", NULL };
	json_t *root;
	int status;

	test_skip_under_sanitizers("an F2 measurement on the default model; test_f2 checks "
	                           "the same defect through the library");
	test_model_path();
	root = validate(test_plugin_dir(names), test_tmpdir(), "--timeout 300", &status);
	cr_assert_not_null(root, "validate printed no JSON");
	cr_expect_eq(WEXITSTATUS(status), 1, "a rejected candidate makes the exit code 1");
	expect(root, "defect-kv", "broken", "(decode step 4)");
	json_decref(root);
}

/* The floor in RECEIPTS' receipt of backend BACKEND (its key's "floor"). */
static double receipt_floor(const char *receipts, const char *backend)
{
	struct dirent *e;
	double floor = -1;
	DIR *d = opendir(receipts);

	cr_assert_not_null(d, "%s", receipts);
	while ((e = readdir(d)) && floor < 0) {
		char path[8192];
		json_t *r, *p;
		size_t i;

		if (!strstr(e->d_name, ".json"))
			continue;
		snprintf(path, sizeof(path), "%s/%s", receipts, e->d_name);
		r = json_load_file(path, 0, NULL);
		json_array_foreach(json_object_get(json_object_get(r, "key"), "plugins"), i, p)
			if (!strcmp(str(p, "role"), "backend") && !strcmp(str(p, "name"), backend))
				floor = json_real_value(json_object_get(json_object_get(r, "key"),
				                                        "floor"));
		json_decref(r);
	}
	closedir(d);
	cr_assert_geq(floor, 0, "no receipt of %s in %s", backend, receipts);
	return floor;
}

/*
 * A plugin that declares no arithmetic class (replay-v1-1, built for ABI
 * 1.1) keeps the floor of plugins before classes, 0.95, beside one of the
 * same code that declares f16 (replay-ok); each message names the floor
 * and its source, and each receipt's key records it.
 */
Test(validate, an_undeclared_plugin_keeps_the_default_floor, .timeout = 300)
{
	static const char *const names[] = { "replay_v1_1", "replay_ok", NULL };
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char args[4400];
	json_t *root;
	int status;

	snprintf(args, sizeof(args), "-m %s/tests/fixtures/tiny-llama.gguf", test_srcdir());
	root = validate(plugins, receipts, args, &status);
	cr_assert_not_null(root, "validate printed no JSON");
	cr_expect_eq(WEXITSTATUS(status), 0);
	expect_candidate(find_by(root, "backend", "replay-v1-1"), "pass",
	                 "at the 0.95 acceptance floor (no arithmetic class declared)");
	expect_candidate(find_by(root, "backend", "replay-ok"), "pass",
	                 "at the 0.9999 acceptance floor (f16 arithmetic)");
	cr_expect_eq(receipt_floor(receipts, "replay-v1-1"), 0.95);
	cr_expect_eq(receipt_floor(receipts, "replay-ok"), 0.9999);
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
	         "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost validate --plugin-path %s %s 2>&1 | grep -q 'f2_floor = \"0.5\": expected a number in \\[0.9, 1\\]'",
	         receipts, receipts, test_builddir(), plugins, args);
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
	/* the time it ran, not 0.0 */
	cr_expect_geq(json_real_value(json_object_get(json_array_get(json_object_get(root,
	                                                                              "candidates"),
	                                                             0),
	                                              "seconds")),
	              5.0, "seconds");
	json_decref(root);
}

/*
 * What a failing child says reaches its parent's reason (F2.4): the
 * child's last line on stderr is kept back and quoted, whatever ended it;
 * the lines before it are passed on as they come.
 */
static int child(const char *script, char *why, char *said)
{
	const char *const argv[] = { "sh", "-c", script, NULL };
	const struct q4kh_isolate_limits limits = { 30, 0, NULL, NULL, NULL, NULL, said, 256 };
	struct q4kh_error err = { { 0 } };
	int rc;

	why[0] = said[0] = 0;
	rc = q4kh_isolate_run("/bin/sh", argv, &limits, why, 512, &err);
	cr_assert_geq(rc, 0, "%s", err.msg);
	fflush(stderr);
	return rc;
}

Test(validate, a_childs_last_line_is_its_reason, .init = cr_redirect_stderr)
{
	char why[512], said[256];

	cr_expect_eq(child("echo first >&2; echo 'the reason' >&2; exit 3", why, said), 1);
	cr_expect_str_eq(why, "validation failed: the process exited with status 3; its last "
	                      "line on stderr: the reason");
	cr_expect_eq(child("echo 'a signal next' >&2; kill -SEGV $$", why, said), 1);
	cr_expect_str_eq(why, "validation crashed: killed by signal 11 (Segmentation fault); its "
	                      "last line on stderr: a signal next");
	cr_expect_eq(child("exit 4", why, said), 1);
	cr_expect_str_eq(why, "validation failed: the process exited with status 4");
	/* exit 0: the caller decides what the last line is (guard.c: F2.4) */
	cr_expect_eq(child("echo 'not measured: why' >&2", why, said), 0);
	cr_expect_str_eq(said, "not measured: why");
	cr_expect_eq(child("true", why, said), 0);
	cr_expect_str_eq(said, "");
	cr_assert_stderr_eq_str("first\n");
}

/*
 * A deep measurement with stderr in a log (no terminal) says, before its
 * long work starts, how long it will take and what it counts: on the tiny
 * llama model the reference runs alone first (validate shares it), then
 * the candidate, each timed first on the probe's first positions. No
 * terminal's carriage returns. The candidate is defect-slow (right, but
 * 100 ms a row of logits: about 25 s for 200 positions), since the parent
 * reads the child's estimate once a second and a measurement over in
 * less says none (cpu-q8act's took 0.9 s on 2 cores).
 */
Test(validate, a_deep_measurement_gives_a_log_its_estimate_before_it_starts, .timeout = 200)
{
	static const char *const names[] = { "defect_slow", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names));
	char args[8400], *out;

	snprintf(args, sizeof(args),
	         "validate --deep --ctx 200 --kernel defect-slow --timeout 150 --plugin-path %s",
	         plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost validate: F2 of cpu/defect-slow (device 0): deep probe: about ") !=
	                  NULL,
	          "%s", out);
	cr_expect(strstr(out, " for 400 positions (the reference's 200 alone, then the candidate's "
	                      "200), at the pace of their first 32 on this machine\n") != NULL,
	          "%s", out);
	cr_expect_null(strchr(out, '\r'), "%s", out);
	free(out);
}

/*
 * The status as a line a minute in a log: defect-hang hangs in its first
 * product, the one that times its pace, until the time limit.
 */
Test(validate, a_deep_measurement_gives_a_log_a_line_a_minute, .timeout = 200)
{
	static const char *const names[] = { "defect_hang", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names));
	char args[8400], *out;
	const char *minute;

	snprintf(args, sizeof(args),
	         "validate --deep --ctx 200 --kernel defect-hang --timeout 65 --plugin-path %s",
	         plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 1, "%s", out);
	/* a minute in, give or take a poll on a busy machine */
	minute = strstr(out, "q4khost validate: F2 of cpu/defect-hang (device 0): 6");
	cr_expect_not_null(minute, "%s", out);
	cr_expect(minute && strstr(minute, " s, against the reference (no receipt)\n"), "%s", out);
	cr_expect_null(strchr(out, '\r'), "%s", out);
	free(out);
}

/*
 * A deep measurement whose estimate puts it past its time limit is
 * stopped then, not at the limit with nothing learnt: defect-slow takes
 * 0.1 s a column of the LM head, some 23 s for the 232 rows of the deep
 * probe to 200 positions (its calibration alone takes 3.2 s), against a
 * limit of 10 s. It ends as a timeout does, a verdict that a raised
 * limit measures again, and says how to give it room.
 */
Test(validate, a_deep_measurement_its_estimate_puts_past_the_limit_stops_at_once, .timeout = 120)
{
	static const char *const names[] = { "defect_slow", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names));
	char args[8400], *out;

	snprintf(args, sizeof(args),
	         "validate --deep --ctx 200 --kernel defect-slow --timeout 10 --plugin-path %s",
	         plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 1, "%s", out);
	cr_expect(strstr(out, "    validation stopped after ") != NULL, "%s", out);
	cr_expect(strstr(out, " s: the deep probe needs about ") != NULL, "%s", out);
	cr_expect(strstr(out, " here in all, at its pace so far, past the time limit of 10 s that "
	                      "would stop it; --timeout ") != NULL,
	          "%s", out);
	cr_expect_null(strstr(out, "timed out"), "%s", out);
	free(out);
}

/* q4khost run through the guard: what serves, and what a named request gets. */
static int run_cli(const char *plugins, const char *receipts, const char *args,
                   char *out, size_t cap)
{
	char cmd[8192];
	size_t got;
	FILE *p;

	snprintf(cmd, sizeof(cmd),
	         "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost run -n 2 -p Hello "
	         "--plugin-path %s %s 2>&1",
	         receipts, receipts, test_builddir(), plugins, args);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	got = fread(out, 1, cap - 1, p);
	out[got] = 0;
	return WEXITSTATUS(pclose(p));
}

/*
 * On the tiny llama model: run serves a variant that passed, the second
 * time from its receipt; a variant named on the command line that fails F2
 * is an error, not a fall-back, unless F2 is off, which the report shouts.
 */
Test(validate, run_serves_only_what_passed_and_fails_closed_when_named, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", "defect_nan", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char out[16384];

	plugins = on_tiny(test_plugin_dir(names));
	cr_expect_eq(run_cli(plugins, receipts, "--kernel cpu-q8act", out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "kernels: " TINY_Q4K_SERVED_BY("cpu-q8act")) != NULL,
	          "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: no receipt)") != NULL, "%s", out);
	cr_expect_eq(run_cli(plugins, receipts, "--kernel cpu-q8act", out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (receipt of ") != NULL, "the second run uses the receipt: %s", out);
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

/*
 * A measurement that ends without a verdict (F2.4) says why in the
 * child's own words: defect-fail fails every product, so the candidate's
 * prefill fails in the validation child, which exits 0 without a receipt.
 */
Test(validate, a_measurement_without_a_verdict_carries_the_childs_reason, .timeout = 120)
{
	static const char *const names[] = { "defect_fail", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names)), *receipts = test_tmpdir();
	char out[16384];

	cr_expect_eq(run_cli(plugins, receipts, "--kernel defect-fail", out, sizeof(out)), 4,
	             "%s", out);
	cr_expect(strstr(out, "cpu/defect-fail: F2 not measured: the candidate failed in prefill "
	                      "(F2.4): ") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "defect-fail: the planted failure of every product") != NULL, "%s",
	          out);
	cr_expect_null(strstr(out, "wrote no receipt"), "%s", out);
}

/* The " [SOURCE]" that ends the report's line about candidate NAME. */
static const char *rejection_source(const char *out, const char *name)
{
	char want[256];
	const char *line, *end, *open;

	snprintf(want, sizeof(want), "F2 rejected first: %s: ", name);
	line = strstr(out, want);
	cr_assert_not_null(line, "no rejection of %s: %s", name, out);
	end = strchr(line, '\n');
	cr_assert_not_null(end);
	for (open = end; open > line && open[-1] != '['; open--)
		;
	cr_assert(open > line && end[-1] == ']', "no [source] on: %.*s", (int)(end - line), line);
	return open;
}

static int from_receipt(const char *out, const char *name)
{
	return !strncmp(rejection_source(out, name), "receipt of ", 11);
}

/*
 * A plugin that crashes, one that hangs and one that eats memory each
 * reject themselves in the child process, with the limit they broke named;
 * q4khost run carries on to the next preference and says what served. The
 * rejections are recorded: the next run reads them, a touched file (same
 * bytes, same SHA-256) changes nothing, a rewritten file is measured again.
 * On the tiny llama model: the limits, not the model, are under test.
 */
/* The children's time limit there: the hanging plugin waits it out once,
 * and cpu-q8act's measurement must fit in it, which took over 30 s in the
 * sanitizer build on CI's 2 cores. */
#ifdef __SANITIZE_ADDRESS__
#define LIMITS_TIMEOUT "150"
#else
#define LIMITS_TIMEOUT "30"
#endif

Test(validate, crash_hang_and_memory_hog_fall_back_and_are_remembered, .timeout = 700)
{
	static const char *const names[] = { "defect_abort", "defect_hang", "defect_hog",
		                             "cpu_q8act", NULL };
	static const char cfg_text[] = "[f2]\nf2_probe_tokens = 16\n"
	                               "f2_timeout_s = " LIMITS_TIMEOUT "\n"
	                               "f2_memory_limit_mb = 1024\n\n[gpu.cpu]\n"
	                               "q4k_kernel = defect-abort, defect-hang, defect-hog, cpu-q8act\n";
	const char *dir, *plugins, *receipts = test_tmpdir();
	char cfg[4200], args[4400], abort_so[4200], out[16384];
	const char *hog;
	unsigned long long resident;
	FILE *f;

	dir = test_plugin_dir(names);
	plugins = on_tiny(dir);
	snprintf(cfg, sizeof(cfg), "%s/limits.ini", receipts);
	test_write_file(cfg, cfg_text, strlen(cfg_text));
	snprintf(args, sizeof(args), "--config %s", cfg);

	cr_assert_eq(run_cli(plugins, receipts, args, out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "kernels: " TINY_Q4K_SERVED_BY("cpu-q8act")) != NULL,
	          "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: no receipt)") != NULL, "%s", out);
	/* its last line on stderr is the reason's end (F2.4 carries the child's word) */
	cr_expect(strstr(out, "F2 rejected first: cpu/defect-abort: F2 reject: validation crashed: "
	                      "killed by signal 6 (Aborted); its last line on stderr: "
	                      "defect-abort: the planted abort in its first product "
	                      "[fresh: no receipt]") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "F2 rejected first: cpu/defect-hang: F2 reject: validation timed out "
	                      "after " LIMITS_TIMEOUT " s and was killed [fresh: no receipt]") !=
	                  NULL,
	          "%s", out);
	hog = strstr(out, "F2 rejected first: cpu/defect-hog: F2 reject: validation exceeded the "
	                  "memory limit: ");
	cr_assert_not_null(hog, "%s", out);
	cr_expect_eq(sscanf(strchr(hog, ':') + 1, " cpu/defect-hog: F2 reject: validation exceeded "
	                                       "the memory limit: %llu MiB resident > 1024 MiB",
	                    &resident), 1, "%s", hog);
	cr_expect_gt(resident, 1024, "%s", hog);
	cr_expect(!from_receipt(out, "cpu/defect-hog"), "%s", out);

	/* The second run decides from the receipts alone. */
	cr_assert_eq(run_cli(plugins, receipts, args, out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (receipt of ") != NULL, "%s", out);
	cr_expect(from_receipt(out, "cpu/defect-abort"), "%s", out);
	cr_expect(from_receipt(out, "cpu/defect-hang"), "%s", out);
	cr_expect(from_receipt(out, "cpu/defect-hog"), "%s", out);
	/* A rejection for a limit stays until asked again: how to ask is said. */
	cr_expect(strstr(out, "; --f2 fresh measures it again]\n") != NULL, "%s", out);

	/* Touched: the same bytes, so the same key. */
	snprintf(abort_so, sizeof(abort_so), "%s/defect_abort.so", dir);
	cr_assert_eq(utimensat(AT_FDCWD, abort_so, NULL, 0), 0);
	cr_assert_eq(run_cli(plugins, receipts, args, out, sizeof(out)), 0, "%s", out);
	cr_expect(from_receipt(out, "cpu/defect-abort"), "%s", out);

	/* Rewritten (a byte appended after the ELF data): measured again. */
	f = fopen(abort_so, "ab");
	cr_assert_not_null(f);
	cr_assert_eq(fputc(0, f), 0);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(run_cli(plugins, receipts, args, out, sizeof(out)), 0, "%s", out);
	cr_expect(!strncmp(rejection_source(out, "cpu/defect-abort"), "fresh: ", 7),
	          "%s", out);
	cr_expect(strstr(out, "cpu/defect-abort: F2 reject: validation crashed: killed by signal 6") != NULL,
	          "%s", out);
	cr_expect(from_receipt(out, "cpu/defect-hang"), "%s", out);
	cr_expect(from_receipt(out, "cpu/defect-hog"), "%s", out);
	cr_expect(strstr(out, "Q4_K=cpu-q8act") != NULL, "%s", out);
}

Test(validate, memory_limits_are_parsed_wherever_they_are_set)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char cfg[4200], cmd[9000], *out;

	test_model_path();
	plugins = test_plugin_dir(names);
	snprintf(cfg, sizeof(cfg), "%s/bad.ini", receipts);
	test_write_file(cfg, "[f2]\nf2_memory_limit_mb = 1e3\n", 29);
	snprintf(cmd, sizeof(cmd),
	         "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost validate "
	         "--plugin-path %s --config %s",
	         receipts, receipts, test_builddir(), plugins, cfg);
	cr_expect_eq(test_shell(cmd, &out), 3, "a bad config file: %s", out);
	cr_expect(strstr(out, ":2 [f2]: f2_memory_limit_mb = \"1e3\": expected a whole number from 0 to 1073741824") != NULL,
	          "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s/host/cli/q4khost validate --memory-limit -5", test_builddir());
	cr_expect_eq(test_shell(cmd, &out), 2, "%s", out);
	cr_expect(strstr(out, "--memory-limit (MiB; 0: no limit) must be a whole number in [0, 1073741824], got '-5'") != NULL,
	          "%s", out);
	free(out);
}

/* A prompt of code: " return" (id 994 in the default model) at position 11. */
#define CODE_PROMPT "int add(int a, int b) { return a + b; }"

/* What the report says of the built-in probe's reach: 64 tokens, 8 steps. */
#define NOT_PAST_72 "positions 72 and later not checked\n"

/* Whether token id ID is among the probe tokens of TEXT (NULL: the built-in). */
static int probe_holds(const char *text, int32_t id)
{
	struct q4kh_error err = { { 0 } };
	int32_t *ids;
	size_t n;
	int found = 0;

	cr_assert_eq(q4kh_guard_probe(test_model_path(), text, &ids, &n, &err), 0, "%s", err.msg);
	for (size_t i = 0; i < n; i++)
		found |= ids[i] == id;
	free(ids);
	return found;
}

/*
 * q4khost run -n 1 -p 'PROMPT' MORE with the plugins and receipts given:
 * expect exit code STATUS and each string of WANT (NULL-terminated) in
 * what it printed (stdout and stderr).
 */
static void expect_run(const char *plugins, const char *receipts, const char *prompt,
                       const char *more, int status, const char *const *want)
{
	char args[8192], *out;

	snprintf(args, sizeof(args), "run -n 1 -p '%s' --plugin-path %s %s", prompt, plugins, more);
	cr_expect_eq(test_q4khost("", receipts, args, &out), status, "%s: %s", args, out);
	for (; *want; want++)
		cr_expect(strstr(out, *want) != NULL, "%s: no '%s' in: %s", args, *want, out);
	free(out);
}

/*
 * replay-code-token (tests/plugins/replay.c) negates the embedding row of
 * " return": the built-in probe has no such token, passes it, and run
 * serves it, saying which probe vouched; with --f2-probe prompt on a
 * prompt holding " return" F2 finds it broken at that position, and run
 * falls back to the reference, naming the check that fired.
 */
Test(validate, the_prompt_as_probe_sees_what_the_built_in_probe_cannot, .timeout = 300)
{
	static const char *const names[] = { "replay_code_token", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char args[8192], *out;
	json_t *root, *f2, *probe;
	json_error_t jerr;
	const char *first;

	cr_assert(!probe_holds(NULL, 994), "the built-in probe must not hold \" return\"");
	cr_assert(probe_holds(CODE_PROMPT, 994), "the prompt must hold \" return\"");
	plugins = test_plugin_dir(names);
	expect_run(plugins, receipts, CODE_PROMPT, "", 0,
	           (const char *const[]){ "q4khost: backend replay-code-token ",
	                                  "q4khost: F2: pass (fresh: no receipt)",
	                                  "q4khost: F2 probe: built-in probe, 64 tokens; " NOT_PAST_72, NULL });

	snprintf(args, sizeof(args),
	         "run -n 2 -p '" CODE_PROMPT "' --f2-probe prompt --json --plugin-path %s 2>/dev/null",
	         plugins);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	root = json_loads(out, 0, &jerr);
	cr_assert_not_null(root, "%s: %s", jerr.text, out);
	f2 = json_object_get(root, "f2");
	probe = json_object_get(f2, "probe");
	cr_expect_str_eq(str(json_object_get(root, "backend"), "name"), "cpu",
	                 "rejected, so the reference serves: %s", out);
	cr_expect_str_eq(str(f2, "verdict"), "not needed");
	cr_expect_str_eq(str(probe, "kind"), "prompt");
	cr_expect_eq(json_integer_value(json_object_get(probe, "tokens")), 17);
	cr_expect_eq(json_integer_value(json_object_get(probe, "positions")), 25,
	             "17 tokens and 8 decode steps measured");
	cr_expect_str_eq(str(probe, "text"), "this prompt, 17 tokens");
	first = json_string_value(json_array_get(json_object_get(f2, "rejected_first"), 0));
	cr_assert_not_null(first, "%s", out);
	cr_expect(strstr(first, "replay-code-token/built-in: F2 broken: position 11 (prefill): ") &&
	          strstr(first, "< 0.90 catastrophic floor [fresh: no receipt]"),
	          "the check that fired, at \" return\": %s", first);
	json_decref(root);
	free(out);
}

/* run on the default model with replay plugin FILE alone beside the
 * reference: F2 rejects it with BROKEN and run falls back to cpu. */
static void expect_replay_broken(const char *file, const char *broken)
{
	const char *const names[] = { file, NULL };

	test_model_path(); /* it runs on the default model: skips without it */
	expect_run(test_plugin_dir(names), test_tmpdir(), "Once upon a time", "", 0,
	           (const char *const[]){ "q4khost: backend cpu ", broken,
	                                  "[fresh: no receipt]", NULL });
}

/*
 * replay-batched (tests/plugins/replay.c) is exact in every step of one
 * sequence, and in a step of several every sequence but the first attends
 * with the first one's queries: F2's batched steps (4 sequences at
 * lengths 60, 41, 22 and 3 of the built-in probe, docs/f2.md) catch it at
 * their first step, in sequence 1 (position 41), and run falls back to
 * the reference, naming the step, the sequence and the position.
 */
Test(validate, a_backend_wrong_only_in_batched_steps_is_rejected, .timeout = 300)
{
	expect_replay_broken("replay_batched",
	                     "replay-batched/built-in: F2 broken: batched step of 4 sequences, "
	                     "sequence 1, position 41 (its decode step 0): ");
}

/* F2's first batched step is a mixed step (docs/f2.md, item 5): a backend
 * wrong only where a sequence brings a prompt's chunk beside the others'
 * decoded tokens is rejected there, at the chunk's last token. */
Test(validate, a_backend_wrong_only_in_mixed_steps_is_rejected, .timeout = 300)
{
	expect_replay_broken("replay_mixed",
	                     "replay-mixed/built-in: F2 broken: batched step of 4 sequences, "
	                     "sequence 3, position 3 (its decode step 0, the last token of a "
	                     "prompt chunk: a mixed step): ");
}

/* F2's batched steps take their sequences' prefixes as serve's prefix
 * reuse does (docs/f2.md, item 5): a backend wrong only in the keys and
 * values a request reuses (replay-reuse: its F16 copy writes the first
 * token's keys and values into every token's) is rejected: broken in
 * sequence 2, which reused the probe's first block (sequence 1 reused two,
 * and F2 names the first position of the worst verdict). */
Test(validate, a_backend_wrong_only_in_reused_prefixes_is_rejected, .timeout = 300)
{
	expect_replay_broken("replay_reuse",
	                     "replay-reuse/built-in: F2 broken: batched step of 4 sequences, "
	                     "sequence 2, position 23 (its decode step 1): ");
}

/*
 * F2's batched steps run over pages too on a backend with attention_paged
 * (docs/f2.md, item 5, rule set 6): replay-page, right over contiguous
 * caches and wrong only in the keys past a sequence's first page of 12
 * tokens (its block table read one entry early), is rejected there, at
 * the first batched point (sequence 0 holds 60 tokens, five pages), and
 * the message says the step ran over pages.
 */
Test(validate, a_backend_wrong_only_in_its_page_table_is_rejected, .timeout = 300)
{
	expect_replay_broken("replay_page",
	                     "replay-page/built-in: F2 broken: batched step of 4 sequences over "
	                     "pages of 12 tokens, sequence 0, position 60 (its decode step 0): ");
}

/*
 * Strip the probe kind from every built-in probe's receipt in RECEIPTS, as
 * receipts written before probe kinds were, sealed again with the user's
 * key (an older host's receipt is measured again: its schema); returns
 * how many.
 */
static int strip_builtin_probe_kind(const char *receipts)
{
	DIR *d = opendir(receipts);
	struct dirent *e;
	char path[8192];
	json_error_t jerr;
	int n = 0;

	cr_assert_not_null(d, "%s", receipts);
	while ((e = readdir(d))) {
		json_t *root, *key;

		if (!strstr(e->d_name, ".json"))
			continue;
		snprintf(path, sizeof(path), "%s/%s", receipts, e->d_name);
		root = json_load_file(path, 0, &jerr);
		key = json_object_get(root, "key");
		if (!strcmp(str(key, "probe"), "builtin")) {
			unsigned char k[32];

			json_object_del(key, "probe");
			json_object_del(root, "mac");
			cr_assert_eq(json_dump_file(root, path, JSON_INDENT(1)), 0, "%s", path);
			test_receipt_key(receipts, k);
			test_receipt_seal(k, path);
			n++;
		}
		json_decref(root);
	}
	closedir(d);
	return n;
}

/*
 * A prompt receipt vouches for that prompt only: the same prompt reads
 * it, another prompt is measured again, and the built-in probe keeps a
 * receipt of its own (neither replaces the other; one without a probe kind,
 * as older receipts are, is the built-in probe's). A prompt too short to
 * judge falls back to the built-in probe and says why; a bad value is
 * refused with where it was set.
 */
Test(validate, a_prompt_receipt_vouches_for_that_prompt_only, .timeout = 300)
{
	static const char *const names[] = { "replay_code_token", NULL };
	static const char river[] = "The river carries the rain back to the sea.",
	                  snow[] = "Snow on the hills melts into the streams in spring.";
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char cfg[4200], config[4300], builtin[4400];

	test_skip_under_sanitizers("four prompt-probe measurements on the default model; "
	                           "the_prompt_as_probe_sees_what_the_built_in_probe_cannot runs "
	                           "the same path");
	test_model_path(); /* it runs on the default model: skips without it */
	snprintf(cfg, sizeof(cfg), "%s/probe.ini", receipts);
	test_write_file(cfg, "[f2]\nprobe = prompt\n", 20);
	snprintf(config, sizeof(config), "--config %s", cfg);
	snprintf(builtin, sizeof(builtin), "--config %s --f2-probe builtin", cfg);
	expect_run(plugins, receipts, river, config, 0,
	           (const char *const[]){ "F2: pass (fresh: no receipt)",
	                                  "F2 probe: this prompt, 11 tokens; positions 19 and later not checked\n", NULL });
	expect_run(plugins, receipts, river, config, 0,
	           (const char *const[]){ "F2: pass (receipt of ", NULL });
	expect_run(plugins, receipts, snow, config, 0,
	           (const char *const[]){ "F2: pass (fresh: the probe's tokens changed (sha256 ",
	                                  NULL });
	/* No prompt receipt vouches for the built-in probe, nor replaces its. */
	expect_run(plugins, receipts, river, builtin, 0,
	           (const char *const[]){ "F2: pass (fresh: no receipt)",
	                                  "F2 probe: built-in probe, 64 tokens; " NOT_PAST_72, NULL });
	expect_run(plugins, receipts, snow, config, 0,
	           (const char *const[]){ "F2: pass (receipt of ", NULL });
	/* A receipt from before probe kinds is the built-in probe's. */
	cr_expect_eq(strip_builtin_probe_kind(receipts), 1);
	expect_run(plugins, receipts, river, builtin, 0,
	           (const char *const[]){ "F2: pass (receipt of ", NULL });

	expect_run(plugins, receipts, "Hi", config, 0,
	           (const char *const[]){ "F2: pass (receipt of ",
	                                  "F2 probe: built-in probe, 64 tokens (",
	                                  "probe.ini:2 [f2] asked for the prompt, but it has 2 tokens, fewer than the 8 a prompt probe needs); "
	                                  NOT_PAST_72,
	                                  NULL });
	expect_run(plugins, receipts, "Hi", "--f2-probe code", 2,
	           (const char *const[]){ "--f2-probe: probe 'code' is not one of builtin (F2's own text), prompt (the run's prompt)",
	                                  NULL });
}

/*
 * A prompt longer than f2_probe_tokens is judged on its last tokens, as
 * the report says: with 8, " return" at position 11 of 32 tokens is
 * outside them and the defect passes; with 32 it is inside, and rejected.
 */
Test(validate, a_long_prompt_is_judged_on_its_last_f2_probe_tokens, .timeout = 300)
{
	static const char *const names[] = { "replay_code_token", NULL };
	static const char prompt[] = CODE_PROMPT " The sum of two numbers comes back from "
	                             "this short function in one line.";
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char cfg[4200], more[4300];

	test_skip_under_sanitizers("long prompt probes on the default model; "
	                           "the_prompt_as_probe_sees_what_the_built_in_probe_cannot runs "
	                           "the same path");
	test_model_path(); /* it runs on the default model: skips without it */
	snprintf(cfg, sizeof(cfg), "%s/short.ini", receipts);
	test_write_file(cfg, "[f2]\nf2_probe_tokens = 8\n", 24);
	snprintf(more, sizeof(more), "--f2-probe prompt --config %s", cfg);
	expect_run(plugins, receipts, prompt, more, 0,
	           (const char *const[]){ "q4khost: backend replay-code-token ",
	                                  "F2 probe: this prompt, its last 8 of 32 tokens (f2_probe_tokens); "
	                                  "positions 16 and later not checked\n",
	                                  NULL });
	test_write_file(cfg, "[f2]\nf2_probe_tokens = 32\n", 25);
	expect_run(plugins, receipts, prompt, more, 0,
	           (const char *const[]){ "q4khost: backend cpu ",
	                                  "F2 probe: this prompt, 32 tokens; positions 40 and later not checked\n",
	                                  "replay-code-token/built-in: F2 broken: position 11 (prefill)",
	                                  NULL });
}

/*
 * Issue 16: what each probe sees, each shown through q4khost run on a
 * planted defect (tests/plugins/cpu_defect.c) that it must not miss, or,
 * where no probe yet sees it, the gap made visible.
 */

/* "Hi": too short to be a probe, so the built-in one judges. */
#define SHORT_PROMPT "Hi"
#define RIVER "The river carries the rain back to the sea."

/*
 * Run SHORT_PROMPT: the built-in probe passes variant KERNEL, run serves
 * it, and the report says where the probe's sight ends.
 */
static void served_on_the_built_in_probe(const char *plugins, const char *receipts,
                                         const char *kernel)
{
	char serves[128];

	snprintf(serves, sizeof(serves), "Q8_0=%s", kernel);
	expect_run(plugins, receipts, SHORT_PROMPT, "", 0,
	           (const char *const[]){ serves, "F2: pass (fresh: no receipt)",
	                                  "F2 probe: built-in probe, 64 tokens; " NOT_PAST_72,
	                                  NULL });
}

/*
 * Run PROMPT with MORE and, unless CFG_TEXT is NULL, a config file of
 * CFG_TEXT: F2 rejects the variant with REJECTION (a part of its line) on
 * the probe PROBE (a part of the report's line), and the reference serves.
 */
static void rejected(const char *plugins, const char *receipts, const char *prompt,
                     const char *more, const char *cfg_text, const char *probe,
                     const char *rejection)
{
	char cfg[4200], args[4400];

	snprintf(args, sizeof(args), "%s", more);
	if (cfg_text) {
		snprintf(cfg, sizeof(cfg), "%s/f2.ini", receipts);
		test_write_file(cfg, cfg_text, strlen(cfg_text));
		snprintf(args, sizeof(args), "%s --config %s", more, cfg);
	}
	expect_run(plugins, receipts, prompt, args, 0,
	           (const char *const[]){ "q4khost: backend cpu ", "Q8_0=cpu built-in", probe,
	                                  rejection, NULL });
}

/*
 * defect-late is right below position 600 and broken from 600 on. The
 * built-in probe measures positions 0 to 71: it passes it, and run serves
 * it, saying where the probe's sight ends. A prompt probe with the default
 * f2_probe_tokens (64) judges the prompt's last 64 tokens, prefilled from
 * position 0: it passes it too. Only a prompt probe of more than 600
 * tokens, every one judged (f2_probe_tokens raised past the prompt), sees
 * it, at position 600, and run falls back to the reference. On the tiny
 * llama model (a context of 2048), whose LM head the defect spoils as the
 * default model's: the probe's reach, not the model, is under test.
 */
Test(validate, a_defect_past_position_600_needs_a_prompt_probe_that_long, .timeout = 300)
{
	static const char *const names[] = { "defect_late", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names)), *receipts = test_tmpdir();
	char prompt[4096] = "";
	size_t n;

	for (int i = 0; i < 64; i++)
		strcat(prompt, RIVER " ");
	n = tiny_tokens(prompt);
	cr_assert_gt(n, 600, "the prompt must reach position 600: %zu tokens", n);
	cr_assert_lt(n, 1000, "%zu tokens", n);

	served_on_the_built_in_probe(plugins, receipts, "defect-late");
	expect_run(plugins, receipts, prompt, "--f2-probe prompt", 0,
	           (const char *const[]){ "Q8_0=defect-late", "F2: pass (fresh: ",
	                                  "F2 probe: this prompt, its last 64 of ",
	                                  "tokens (f2_probe_tokens); " NOT_PAST_72, NULL });
	rejected(plugins, receipts, prompt, "--f2-probe prompt", "[f2]\nf2_probe_tokens = 1000\n",
	         "F2 probe: this prompt, ",
	         "F2 rejected first: cpu/defect-late: F2 broken: position 600 (prefill): ");
}

/*
 * defect-decode9 is right in prefill and in the first 8 decode steps,
 * broken from the 9th (decode step 8) on. F2 runs 8 decode steps after
 * either probe (f2_decode_steps), so the built-in probe and the prompt
 * probe both pass it and run serves it: nothing catches it by default.
 * That gap is asserted here on purpose: the default probes do not see it,
 * so that a deeper default shows up here as a change. Raising
 * f2_decode_steps sees it (with 16 steps it is broken at decode step 8),
 * and so does the deep probe with its 32 decode steps (the tests after
 * this one: validate --deep, [f2] require_deep). On the tiny llama model.
 */
Test(validate, a_defect_past_eight_decode_steps_needs_more_decode_steps, .timeout = 300)
{
	static const char *const names[] = { "defect_decode9", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names)), *receipts = test_tmpdir();
	char river_probe[128];
	size_t n = tiny_tokens(RIVER);

	/* the prompt's N tokens judged, then 8 decode steps: positions 0 to N + 7 */
	snprintf(river_probe, sizeof(river_probe),
	         "F2 probe: this prompt, %zu tokens; positions %zu and later not checked\n", n,
	         n + 8);
	served_on_the_built_in_probe(plugins, receipts, "defect-decode9");
	expect_run(plugins, receipts, RIVER, "--f2-probe prompt", 0,
	           (const char *const[]){ "Q8_0=defect-decode9", "F2: pass (fresh: no receipt)",
	                                  river_probe, NULL });
	rejected(plugins, receipts, SHORT_PROMPT, "", "[f2]\nf2_decode_steps = 16\n",
	         "F2 probe: built-in probe, 64 tokens; positions 80 and later not checked\n",
	         "F2 rejected first: cpu/defect-decode9: F2 broken: position 72 (decode step 8): ");
}

/*
 * defect-batched is right with one column (every decode step) and broken
 * with more (the batched prefill): the built-in probe's prefill of 64
 * columns sees it at its first judged position, and run falls back to the
 * reference. On the tiny llama model.
 */
Test(validate, a_defect_of_the_batched_kernel_only_is_caught_in_prefill, .timeout = 300)
{
	static const char *const names[] = { "defect_batched", NULL };

	rejected(on_tiny(test_plugin_dir(names)), test_tmpdir(), SHORT_PROMPT, "", NULL,
	         "F2 probe: built-in probe, 64 tokens; " NOT_PAST_72,
	         "F2 rejected first: cpu/defect-batched: F2 broken: position 1 (prefill): ");
}

/*
 * The deep probe (validate --deep, [f2] require_deep: host/lib/deep.h) on a
 * context of 200 positions (--ctx): 32 decode steps after a prefill of 168
 * = 200 - 32 tokens, so its decode step 8 is position 176. Judged: every
 * position from 1 to 128 (128), every 8th after (136, 144, 152, 160: 4),
 * 128 + 1 and + 2 (the edge of the length 128: 2), the last prefill
 * position 167 (1) and the 32 decode steps: 167 of 200. The deep probe's
 * tests run on the tiny llama model: its positions follow --ctx, not the
 * model.
 */
#define DEEP_CTX "--ctx 200"

/*
 * validate --deep ARGS --json: exit code EXIT and KERNEL's row with
 * VERDICT; the row, in *ROOT (the caller frees it), and the probe into
 * *PROBE.
 */
static json_t *deep_row(const char *plugins, const char *receipts, const char *args, int exit,
                        const char *kernel, const char *verdict, json_t **root,
                        json_t **probe)
{
	char all[1024];
	json_t *c;
	int status;

	snprintf(all, sizeof(all), "--deep %s", args);
	*root = validate(plugins, receipts, all, &status);
	cr_assert_not_null(*root);
	cr_expect_eq(WEXITSTATUS(status), exit);
	*probe = json_object_get(*root, "probe");
	c = find(*root, kernel);
	cr_expect_str_eq(str(c, "verdict"), verdict, "%s", str(c, "message"));
	return c;
}
#define DEEP_200 "deep probe: 167 positions judged of 200, up to position 199, 32 decode steps"

/*
 * defect-decode9: the built-in probe passes it and run serves it (its
 * shallow pass receipt is written). With require_deep (the environment's
 * Q4KHOST_F2_REQUIRE_DEEP) that receipt does not count: run measures the
 * deep probe, which sees decode step 8, and falls back to the reference.
 * validate --deep then reads that deep receipt; and a run without
 * require_deep takes the deep verdict over its shallow pass: the wider
 * measurement decides.
 */
Test(validate, the_deep_probe_sees_decode_step_8_and_require_deep_wants_it, .timeout = 300)
{
	static const char *const names[] = { "defect_decode9", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names)), *receipts = test_tmpdir();
	char args[8400], *out;
	json_t *root, *c, *probe;

	served_on_the_built_in_probe(plugins, receipts, "defect-decode9");

	snprintf(args, sizeof(args), "run -n 1 -p '%s' " DEEP_CTX " --plugin-path %s",
	         SHORT_PROMPT, plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2_REQUIRE_DEEP=true", receipts, args, &out), 0,
	             "%s", out);
	cr_expect(strstr(out, "q4khost: F2 probe: " DEEP_200) != NULL, "%s", out);
	cr_expect(strstr(out, "require_deep = true at Q4KHOST_F2_REQUIRE_DEEP") != NULL, "%s",
	          out);
	cr_expect(strstr(out, "Q8_0=cpu built-in") != NULL, "the reference serves: %s", out);
	cr_expect(strstr(out, "F2 rejected first: cpu/defect-decode9: F2 broken: "
	                      "position 176 (decode step 8): ") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "[fresh: no receipt]") != NULL,
	          "the shallow receipt must not count: %s", out);
	free(out);

	c = deep_row(plugins, receipts, DEEP_CTX, 1, "defect-decode9", "broken", &root, &probe);
	cr_expect_str_eq(str(probe, "kind"), "deep");
	cr_expect_eq(json_integer_value(json_object_get(probe, "judged")), 167);
	cr_expect_eq(json_integer_value(json_object_get(probe, "positions")), 200);
	cr_expect_eq(json_integer_value(json_object_get(probe, "last_position")), 199);
	cr_expect_eq(json_integer_value(json_object_get(probe, "decode_steps")), 32);
	cr_expect_eq(json_integer_value(json_object_get(c, "worst_position")), 176);
	cr_expect_eq(json_integer_value(json_object_get(c, "worst_decode_step")), 8);
	cr_expect(!strncmp(str(c, "source"), "receipt of ", 11), "%s", str(c, "source"));
	json_decref(root);

	expect_run(plugins, receipts, SHORT_PROMPT, "", 0,
	           (const char *const[]){ "Q8_0=cpu built-in",
	                                  "F2 rejected first: cpu/defect-decode9: F2 broken: "
	                                  "position 176 (decode step 8): ",
	                                  "[deep receipt of ",
	                                  "F2 probe: deep probe of a deep receipt: 167 positions "
	                                  "judged of 200, up to position 199, 32 decode steps",
	                                  NULL });
}

/*
 * defect-late is right below position 600 and broken from 600 on; the
 * built-in probe passes it. The deep probe on a context of 680 positions
 * (a prefill of 648, then 32 decode steps) judges every 8th position past
 * 128, 600 among them: broken there, in prefill (on the tiny llama model).
 */
Test(validate, the_deep_probe_sees_a_defect_past_position_600, .timeout = 300)
{
	static const char *const names[] = { "defect_late", NULL };
	const char *plugins = on_tiny(test_plugin_dir(names)), *receipts = test_tmpdir();
	json_t *root, *c, *probe;

	served_on_the_built_in_probe(plugins, receipts, "defect-late");
	c = deep_row(plugins, receipts, "--ctx 680", 1, "defect-late", "broken", &root, &probe);
	cr_expect_eq(json_integer_value(json_object_get(probe, "positions")), 680);
	cr_expect_eq(json_integer_value(json_object_get(c, "worst_position")), 600);
	cr_expect_eq(json_integer_value(json_object_get(c, "worst_decode_step")), -1);
	cr_expect(strstr(str(c, "message"), "position 600 (prefill): ") != NULL, "%s",
	          str(c, "message"));
	json_decref(root);
}

/*
 * On the tiny llama model, cpu-fast passes the deep probe of 300 positions
 * to 128, every 8th after (136 to 264: 17), 128 + 1 and + 2, the last
 * prefill position 267 and the 32 decode steps: 180 judged). A shallow
 * pass receipt does not satisfy require_deep: run measures the deep probe
 * although one is there; the next run with require_deep reads the deep
 * receipt, and so does validate --deep.
 */
Test(validate, require_deep_accepts_deep_receipts_only, .timeout = 300)
{
	const char *b = test_builddir(), *receipts = test_tmpdir();
	char plugins[2048], args[4096], *out;
	json_t *root, *c, *probe;

	test_need_cpu_fast();
	snprintf(plugins, sizeof(plugins), "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs -m %s/tests/fixtures/tiny-llama.gguf",
	         b, b, test_srcdir());
	expect_run(plugins, receipts, SHORT_PROMPT, "", 0,
	           (const char *const[]){ "backend cpu-fast ", "F2: pass (fresh: no receipt)",
	                                  "F2 probe: built-in probe, ", NULL });
	snprintf(args, sizeof(args), "run -n 1 -p '%s' --ctx 300 --plugin-path %s", SHORT_PROMPT,
	         plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2_REQUIRE_DEEP=true", receipts, args, &out), 0, "%s",
	             out);
	cr_expect(strstr(out, "backend cpu-fast ") != NULL, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: no receipt)") != NULL,
	          "the shallow receipt must not count: %s", out);
	cr_expect(strstr(out, "F2 probe: deep probe: 180 positions judged of 300, up to position "
	                      "299, 32 decode steps") != NULL,
	          "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("Q4KHOST_F2_REQUIRE_DEEP=true", receipts, args, &out), 0, "%s",
	             out);
	cr_expect(strstr(out, "F2: pass (receipt of ") != NULL, "%s", out);
	free(out);

	c = deep_row(plugins, receipts, "--ctx 300", 0, "built-in", "pass", &root, &probe);
	cr_expect_eq(json_integer_value(json_object_get(probe, "judged")), 180);
	cr_expect(!strncmp(str(c, "source"), "receipt of ", 11), "%s", str(c, "source"));
	json_decref(root);
}

/*
 * A verdict of a limit the user set is no verdict on the plugin: the
 * receipt keeps the limit (1 MiB here, which no process fits), is
 * remembered under the same limit, and a run under the default limit
 * measures again, saying why. The unmeasured row has no near-ties.
 */
Test(validate, a_limit_verdict_is_stale_under_a_larger_limit, .timeout = 300)
{
	const char *b = test_builddir(), *receipts = test_tmpdir();
	char plugins[2048], args[4096], *out;
	json_t *root, *c;
	int status;

	test_need_cpu_fast();
	snprintf(plugins, sizeof(plugins), "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs -m %s/tests/fixtures/tiny-llama.gguf",
	         b, b, test_srcdir());
	for (int i = 0; i < 2; i++) {
		root = validate(plugins, receipts,
		                "--f2 auto --backend cpu-fast --kernel none --memory-limit 1",
		                &status);
		cr_assert_not_null(root);
		c = find(root, "built-in");
		cr_expect_str_eq(str(c, "verdict"), "reject", "%s", str(c, "message"));
		cr_expect(strstr(str(c, "message"), "exceeded the memory limit: ") != NULL, "%s",
		          str(c, "message"));
		cr_expect(strstr(str(c, "message"), " > 1 MiB") != NULL, "%s", str(c, "message"));
		cr_expect(json_is_null(json_object_get(c, "near_ties")),
		          "a stopped measurement has no near-ties");
		cr_expect(!strncmp(str(c, "source"), i ? "receipt of " : "fresh: no receipt", 11),
		          "run %d: %s", i, str(c, "source"));
		json_decref(root);
	}
	snprintf(args, sizeof(args), "validate --backend cpu-fast --kernel none --memory-limit 1 "
	         "--plugin-path %s", plugins);
	test_q4khost("", receipts, args, &out);
	cr_expect(strstr(out, "reject        -                              -                    "
	                      "-         ") != NULL, "near-ties '-' in the text: %s", out);
	free(out);
	snprintf(args, sizeof(args), "run -n 1 -p '%s' --backend cpu-fast --kernel none "
	         "--plugin-path %s", SHORT_PROMPT, plugins);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: the memory limit was raised (1 -> ") != NULL,
	          "%s", out);
	free(out);
}

/*
 * The same for the time limit: defect-hang stopped after 1 s is remembered
 * under --timeout 1 and measured again under --timeout 2.
 */
Test(validate, a_timeout_verdict_is_stale_under_a_longer_timeout, .timeout = 120)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "defect_hang", NULL });
	const char *receipts = test_tmpdir();
	static const char *const sources[] = { "fresh: no receipt", "receipt of ",
		                               "fresh: the time limit was raised (1 -> 2 s)" };
	char args[8400];
	json_t *root, *c;
	int status;

	for (int i = 0; i < 3; i++) {
		snprintf(args, sizeof(args), "-m %s/tests/fixtures/tiny-llama.gguf --kernel "
		         "defect-hang --timeout %d", test_srcdir(), i < 2 ? 1 : 2);
		root = validate(plugins, receipts, args, &status);
		cr_assert_not_null(root);
		c = find(root, "defect-hang");
		cr_expect_str_eq(str(c, "verdict"), "reject", "%s", str(c, "message"));
		cr_expect(strstr(str(c, "message"), i < 2 ? "timed out after 1 s" : "timed out after 2 s"),
		          "%s", str(c, "message"));
		cr_expect(!strncmp(str(c, "source"), sources[i], strlen(sources[i])), "run %d: %s", i,
		          str(c, "source"));
		cr_expect(json_is_null(json_object_get(c, "near_ties")));
		json_decref(root);
	}
}

/*
 * defect-narrow is right with one column and with more than 8, broken with
 * 2 to 8: the probe's wide prefill (64 columns) and its one-column decode
 * steps pass it, so only F2's narrow steps see it, at the first judged
 * position of the first, 2 tokens wide, and its batched steps (4 columns),
 * after which the narrow steps' points come; run falls back to the
 * reference. A short prompt's chunk or a batched decode step of 2 to 8
 * sequences in serve takes that path. On the tiny llama model.
 */
Test(validate, a_defect_of_narrow_steps_only_is_caught_by_them, .timeout = 300)
{
	static const char *const names[] = { "defect_narrow", NULL };

	rejected(on_tiny(test_plugin_dir(names)), test_tmpdir(), SHORT_PROMPT, "", NULL,
	         "F2 probe: built-in probe, 64 tokens; " NOT_PAST_72,
	         "F2 rejected first: cpu/defect-narrow: F2 broken: position 1 (prefill in a "
	         "step of 2 tokens): ");
}

/*
 * The reference, computed once (docs/f2.md): the children of one validate
 * share its logits through a file; the receipts (but for their seconds
 * and dates) are those of children that each compute it (validate --one
 * without --reference-logits). On the tiny llama model with three
 * candidates, the built-in probe and the deep one.
 */

/* Every receipt JSON in DIR by file name, less what differs between two
 * runs of one measurement (seconds, date). */
static json_t *receipts_in(const char *dir)
{
	json_t *all = json_object();
	struct dirent *d;
	DIR *dp = opendir(dir);

	cr_assert_not_null(dp, "%s", dir);
	while ((d = readdir(dp))) {
		char path[4400];
		json_error_t jerr;
		json_t *j;
		size_t len = strlen(d->d_name);

		if (len < 6 || strcmp(d->d_name + len - 5, ".json"))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
		j = json_load_file(path, 0, &jerr);
		cr_assert_not_null(j, "%s: %s", path, jerr.text);
		json_object_del(j, "seconds");
		json_object_del(j, "created");
		/* sealed with each folder's own key, over the two above */
		json_object_del(j, "mac");
		json_object_set_new(all, d->d_name, j);
	}
	closedir(dp);
	return all;
}

/* The entries of folder DIR but . and .. */
static int entries(const char *dir)
{
	DIR *dp = opendir(dir);
	struct dirent *d;
	int n = 0;

	cr_assert_not_null(dp, "%s", dir);
	while ((d = readdir(dp)))
		n += strcmp(d->d_name, ".") && strcmp(d->d_name, "..");
	closedir(dp);
	return n;
}

/* One that passes, two that F2 rejects on the tiny model (validate's exit
 * code 1): the shared reference must change no verdict either way. */
static const struct {
	const char *kernel;
	int exit;
} SHARED_KERNELS[] = { { "cpu-q8act", 0 }, { "defect-noisy", 1 }, { "defect-nan", 1 } };

/* validate --one of each of SHARED_KERNELS on the tiny model, each child
 * computing the reference, receipts in RECEIPTS. */
static void measure_each_alone(const char *plugins, const char *receipts, const char *probe)
{
	for (size_t i = 0; i < sizeof(SHARED_KERNELS) / sizeof(SHARED_KERNELS[0]); i++) {
		char args[8192], *out;

		snprintf(args, sizeof(args),
		         "validate --one --backend cpu --kernel %s -m %s --plugin-path %s %s",
		         SHARED_KERNELS[i].kernel, tiny_model(), plugins, probe);
		cr_expect_eq(test_q4khost("", receipts, args, &out), SHARED_KERNELS[i].exit, "%s",
		             out);
		free(out);
	}
}

Test(validate, the_reference_runs_once_per_command_and_changes_no_receipt, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", "defect_noisy", "defect_nan", NULL };
	static const char *const probes[] = { "", "--deep --ctx 300" };
	const char *plugins = test_plugin_dir(names);

	for (int i = 0; i < 2; i++) {
		const char *shared = test_tmpdir(), *alone = test_tmpdir(), *tmp = test_tmpdir();
		char args[8192], env[4200], *out;
		json_t *a, *b, *root, *ref;

		snprintf(args, sizeof(args), "validate -m %s --plugin-path %s %s", tiny_model(),
		         plugins, probes[i]);
		cr_expect_eq(test_q4khost("Q4KHOST_LOG=debug", shared, args, &out), 1, "%s", out);
		/* the first child computed it, the other two read it: no forward */
		cr_expect_eq(count(out, "F2: the reference computed: the shared file "), 1, "%s", out);
		/* on the deep probe, alone, before its candidate started */
		cr_expect_eq(count(out, "wrote it, the reference alone, before the candidate started"),
		             i, "%s", out);
		cr_expect_eq(count(out, "F2: the reference's logits read from the shared file "), 2,
		             "%s", out);
		cr_expect(strstr(out, "; the reference ran once for 3 measurements\n") != NULL, "%s",
		          out);
		free(out);
		measure_each_alone(plugins, alone, probes[i]);
		a = receipts_in(shared);
		b = receipts_in(alone);
		cr_expect_eq(json_object_size(a), 3);
		cr_expect(json_equal(a, b), "%s: the shared reference changed a receipt",
		          probes[i][0] ? probes[i] : "built-in probe");
		json_decref(a);
		json_decref(b);

		/* --json counts them; the folder is gone afterwards */
		snprintf(args, sizeof(args), "validate --json --f2 fresh -m %s --plugin-path %s %s",
		         tiny_model(), plugins, probes[i]);
		snprintf(env, sizeof(env), "TMPDIR=%s", tmp);
		cr_expect_eq(test_q4khost(env, shared, args, &out), 1, "%s", out);
		cr_expect_eq(entries(tmp), 0, "the shared folder in %s outlives the command", tmp);
		root = parse_json(out);
		ref = json_object_get(root, "reference");
		cr_expect_eq(json_integer_value(json_object_get(ref, "computed")), 1, "%s", out);
		cr_expect_eq(json_integer_value(json_object_get(ref, "read")), 2, "%s", out);
		json_decref(root);
		free(out);
	}
}

/* validate --one of cpu-q8act on the tiny model with --reference-logits
 * FILE (NULL: without) and EXTRA; all it printed into *out, receipts in
 * RECEIPTS. */
static void one_with_file(const char *plugins, const char *receipts, const char *file,
                          const char *extra, char **out)
{
	char args[8192];

	snprintf(args, sizeof(args),
	         "validate --one --backend cpu --kernel cpu-q8act -m %s --plugin-path %s %s%s %s",
	         tiny_model(), plugins, file ? "--reference-logits " : "", file ? file : "",
	         extra);
	cr_expect_eq(test_q4khost("", receipts, args, out), 0, "%s", *out);
}

/* The receipts of RECEIPTS are those of ALONE's. */
static void same_receipts(const char *receipts, const char *alone, const char *what)
{
	json_t *a = receipts_in(receipts), *b = receipts_in(alone);

	cr_expect(json_equal(a, b), "%s: a receipt differs from the one computed alone", what);
	json_decref(a);
	json_decref(b);
}

/*
 * A shared file is untrusted: one cut short, one with a changed row, one
 * with a header cut short and one made for other rules (12 decode steps)
 * are each refused with the reason said (on stderr at the default log
 * level), and the child computes the reference itself: the same receipt
 * as without the file. A good file is read. (test_first_run and
 * test_diagnostics check the option's usage errors.)
 */
Test(validate, a_bad_shared_reference_file_is_refused_and_the_reference_computed,
     .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	static const struct {
		const char *what, *sh, *reason;
	} bad[] = {
		{ "cut short", "truncate -s -100 %s", "bytes where " },
		{ "a changed row", "printf '\\377\\377\\377\\377' | dd of=%s bs=1 seek=2000 conv=notrunc 2>/dev/null",
		  "its rows do not match their SHA-256 (corrupt)" },
		{ "a header cut short", "truncate -s 40 %s", "inside its header (short)" },
	};
	const char *plugins = test_plugin_dir(names), *dir = test_tmpdir();
	const char *alone = test_tmpdir();
	char good[4200], file[4200], cmd[9000], *out;

	one_with_file(plugins, alone, NULL, "", &out);
	free(out);
	snprintf(good, sizeof(good), "%s/good", dir);
	one_with_file(plugins, test_tmpdir(), good, "", &out);
	cr_expect(strstr(out, "was refused") == NULL, "a file not there is no refusal: %s", out);
	free(out);
	cr_assert_eq(access(good, R_OK), 0, "the first child writes the file");

	{
		const char *receipts = test_tmpdir();

		one_with_file(plugins, receipts, good, "", &out);
		cr_expect(strstr(out, "refused") == NULL, "%s", out);
		free(out);
		same_receipts(receipts, alone, "a good file");
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *receipts = test_tmpdir();

		snprintf(file, sizeof(file), "%s/bad%zu", dir, i);
		snprintf(cmd, sizeof(cmd), "cp %s %s && ", good, file);
		snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), bad[i].sh, file);
		cr_assert_eq(system(cmd), 0, "%s", cmd);
		one_with_file(plugins, receipts, file, "", &out);
		cr_expect(strstr(out, "F2: the reference computed: the shared file ") != NULL &&
		                  strstr(out, " was refused: ") != NULL &&
		                  strstr(out, bad[i].reason) != NULL,
		          "%s: the refusal and its reason '%s' are said: %s", bad[i].what,
		          bad[i].reason, out);
		free(out);
		same_receipts(receipts, alone, bad[i].what);
	}
	/* made for 12 decode steps, read for 8: another header */
	snprintf(file, sizeof(file), "%s/other", dir);
	one_with_file(plugins, test_tmpdir(), file, "--set f2:f2_decode_steps=12", &out);
	free(out);
	{
		const char *receipts = test_tmpdir();

		one_with_file(plugins, receipts, file, "", &out);
		cr_expect(strstr(out, " was refused: its header differs: ") != NULL, "%s", out);
		free(out);
		same_receipts(receipts, alone, "a file of other rules");
	}
}
