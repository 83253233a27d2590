/*
 * The first ten minutes of a new user (issue 19), through the real CLI
 * (cli_rig.h): output into a reader that goes away or a full disk, said
 * once and naming the command; unknown options and extra arguments
 * pointing at help; help and info naming every variable, a missing config
 * and unknown variables; keys set twice, bad settings and numbers named
 * with their real constraint; an unknown backend or kernel, a prompt
 * longer than the context and an unwritable plot refused before any work;
 * a backend without a device named with why; rates never made up from no
 * time; logits with no finite value named; receipts kept across settings
 * and their folder judged alike everywhere; the man pages free of control
 * characters; the quickstart showing its prompt.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_rig.h"
#include "gguf.h"
#include "helpers.h"

/* --- issue 19: the first ten minutes of a new user ----------------------- */

/* q4khost ARGS with stdout into SINK (a shell redirection or "| CMD"):
 * its status and stderr ("rc=N" last), for who reads stdout no more. */
static int q4khost_into(const char *env, const char *args, const char *sink, char **out)
{
	char inner[16384], cmd[20000];

	snprintf(cmd, sizeof(cmd), "{ %s; echo \"rc=$?\" >&2; } %s",
	         test_q4khost_command(env, test_tmpdir(), args, inner, sizeof(inner)), sink);
	return test_shell(cmd, out);
}

Test(first_run, a_reader_that_goes_away_is_no_error)
{
	char env[8192], *out;

	snprintf(env, sizeof(env), "Q4KHOST_MODEL=%s", tiny_model());
	/* head reads one byte and leaves: the rest of the report meets EPIPE */
	q4khost_into(env, "info --all --json", "| head -c 1 >/dev/null", &out);
	cr_expect(strstr(out, "rc=0\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, "cannot write"), "%s", out);
	free(out);
}

Test(first_run, a_full_disk_is_one_error_naming_the_command)
{
	static const char *const args[] = { "--help", "--version", "info", "info --json",
	                                    "run --help" };
	static const char *const who[] = { "q4khost: ", "q4khost: ", "q4khost info: ",
	                                   "q4khost info: ", "q4khost run: " };
	char env[8192], want[256], *out;

	if (access("/dev/full", W_OK) != 0)
		cr_skip_test("no /dev/full here");
	snprintf(env, sizeof(env), "Q4KHOST_MODEL=%s", tiny_model());
	for (size_t i = 0; i < sizeof(args) / sizeof(args[0]); i++) {
		q4khost_into(env, args[i], ">/dev/full", &out);
		snprintf(want, sizeof(want), "%scannot write to standard output: No space left on device\nrc=1\n",
		         who[i]);
		cr_expect(strstr(out, want) != NULL, "%s: %s", args[i], out);
		cr_expect_eq(count(out, "cannot write"), 1, "%s: said once: %s", args[i], out);
		free(out);
	}
}

Test(first_run, options_are_named_as_unknown_or_lacking_a_value)
{
	static const char *const args[] = { "--bogus", "run --bogus", "run -p", "run --json=1",
	                                    "run -x", "info --model" };
	static const char *const want[] = {
		"q4khost: unknown option '--bogus': options go after the command",
		"q4khost run: unknown option '--bogus' (try q4khost run --help)",
		"q4khost run: option '-p' needs a value (try q4khost run --help)",
		"q4khost run: option '--json' takes no value (try q4khost run --help)",
		"q4khost run: unknown option '-x' (try q4khost run --help)",
		"q4khost info: unknown option '--model' (try q4khost info --help)",
	};
	char *out;

	for (size_t i = 0; i < sizeof(args) / sizeof(args[0]); i++) {
		cr_expect_eq(test_q4khost("", test_tmpdir(), args[i], &out), 2, "%s: %s", args[i], out);
		cr_expect(strstr(out, want[i]) != NULL, "%s: %s", args[i], out);
		free(out);
	}
}

Test(first_run, info_warns_about_a_missing_config_and_unknown_variables)
{
	char env[8192], want[8192], *out;
	const char *missing = test_tmpdir();

	snprintf(env, sizeof(env), "Q4KHOST_MODEL=%s Q4KHOST_CONFIG=%s/none.ini Q4KHOST_MODLE=x",
	         tiny_model(), missing);
	cr_expect_eq(test_q4khost(env, test_tmpdir(), "info", &out), 0, "%s", out);
	snprintf(want, sizeof(want), "q4khost info: warning: %s/none.ini: No such file or directory "
	         "(from Q4KHOST_CONFIG)", missing);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost info: warning: unknown environment variable Q4KHOST_MODLE "
	                      "(known: ") != NULL, "%s", out);
	cr_expect(strstr(out, "llama.context_length") != NULL, "the work goes on: %s", out);
	free(out);
}

Test(first_run, help_names_every_variable_and_a_file_that_exists)
{
	static const char *const vars[] = { "Q4KHOST_MODEL", "Q4KHOST_PLUGIN_PATH", "Q4KHOST_BACKEND",
	                                    "Q4KHOST_CONFIG", "Q4KHOST_Q4K_KERNEL", "Q4KHOST_F2,",
	                                    "Q4KHOST_F2_RECEIPT_DIR", "Q4KHOST_LOG", "Q4KHOST_API_KEY" };
	char *out, *doc;

	cr_expect_eq(test_q4khost("", test_tmpdir(), "--help", &out), 0, "%s", out);
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		cr_expect(strstr(out, vars[i]) != NULL, "%s: %s", vars[i], out);
	doc = strstr(out, "see man q4khost.ini, or\n");
	cr_assert_not_null(doc, "%s", out);
	doc += strlen("see man q4khost.ini, or\n");
	doc[strcspn(doc, "\n")] = 0;
	cr_expect_eq(doc[0], '/', "an absolute path: %s", doc);
	cr_expect_eq(access(doc, R_OK), 0, "%s is there", doc);
	free(out);
}

Test(first_run, switching_threads_back_keeps_each_receipt, .timeout = 240)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL }), *receipts = test_tmpdir();
	static const char *const threads[] = { "1", "2", "1", "2" };
	char cmd[8192], args[8192], *out;

	snprintf(cmd, sizeof(cmd), "cp %s/plugins/cpu-simd/.libs/cpu-simd.so %s/", test_builddir(),
	         plugins);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	for (int i = 0; i < 4; i++) {
		snprintf(args, sizeof(args), "run -n 1 -m %s --plugin-path %s --threads %s",
		         tiny_model(), plugins, threads[i]);
		cr_expect_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
		if (i == 0 && !strstr(out, "F2: pass (fresh: no receipt)")) {
			free(out);
			cr_skip_test("cpu-simd does not pass F2 on this machine");
		}
		/* the first time each setting measures; coming back reads its receipt */
		cr_expect(strstr(out, i < 2 ? "F2: pass (fresh: no receipt)"
		                            : "F2: pass (receipt of ") != NULL,
		          "--threads %s, run %d: %s", threads[i], i + 1, out);
		free(out);
	}
}

Test(first_run, a_backend_without_a_device_is_named_as_loaded_with_why)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "no_device", NULL });
	char args[8192], want[8192], *out;

	snprintf(args, sizeof(args), "conformance -b no-device --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 4, "%s", out);
	snprintf(want, sizeof(want), "q4khost conformance: backend no-device (%s/no_device.so) is "
	         "loaded but has no device, so there is nothing to check; it says: device_info: "
	         "no device 0 (no-device has 0: this test backend never has one)\n", plugins);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_null(strstr(out, "no backend no-device"), "%s", out);
	free(out);
	/* run, asked for it, says the same */
	cr_expect_eq(q4khost_with("", "run -n 1 --backend no-device", NULL, plugins, "", &out), 4,
	             "%s", out);
	cr_expect(strstr(out, "q4khost run: backend no-device is loaded but has no device: "
	                      "device_info: no device 0 (no-device has 0: this test backend never "
	                      "has one); q4khost plugins lists the devices\n") != NULL, "%s", out);
	free(out);
}

Test(first_run, an_unknown_backend_or_kernel_is_refused_before_any_output)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "no_device", NULL });
	static const char *const cases[][3] = {
		/* env, arguments, what the error starts with */
		{ "", "plugins --explain --backend nope", "q4khost plugins: --backend nope: no backend plugin of that name" },
		{ "", "plugins --explain --kernel nope", "q4khost plugins: --kernel: 'nope' is not a kernel variant" },
		{ "Q4KHOST_BACKEND=nope", "plugins --explain", "q4khost plugins: Q4KHOST_BACKEND=nope: no backend plugin of that name" },
		{ "Q4KHOST_BACKEND=nope", "run -n 1", "q4khost run: Q4KHOST_BACKEND=nope: no backend plugin of that name" },
		{ "", "conformance -b nope", "q4khost conformance: --backend nope: no backend plugin of that name" },
		/* a typo in a CI job that checks an install must not pass green */
		{ "", "validate --backend nope", "q4khost validate: --backend nope: no backend plugin of that name" },
		{ "", "validate --kernel nope", "q4khost validate: --kernel: 'nope' is not a kernel variant" },
		{ "Q4KHOST_Q4K_KERNEL=nope", "validate", "q4khost validate: Q4KHOST_Q4K_KERNEL: 'nope' is not a kernel variant" },
		{ "", "validate --device 9", "q4khost validate: no backend on the plugin path" },
	};
	char args[8192], *out;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(args, sizeof(args), "%s -m %s --plugin-path %s", cases[i][1], tiny_model(),
		         plugins);
		if (!strncmp(cases[i][1], "plugins", 7) || !strncmp(cases[i][1], "conformance", 11))
			snprintf(args, sizeof(args), "%s --plugin-path %s", cases[i][1], plugins);
		cr_expect_eq(test_q4khost(cases[i][0], test_tmpdir(), args, &out), 4, "%s: %s", args, out);
		/* the error is all there is: nothing printed before it */
		cr_expect_eq(strncmp(out, cases[i][2], strlen(cases[i][2])), 0, "%s: %s", args, out);
		if (strstr(cases[i][2], "backend plugin"))
			cr_expect(strstr(out, "; the backends there: cpu, no-device (") != NULL, "%s: %s",
			          args, out);
		free(out);
	}
	snprintf(args, sizeof(args), "qa --cases %s/tests/fixtures/qa-cases.jsonl --kernel nope -m %s "
	         "--plugin-path %s", test_srcdir(), tiny_model(), plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 4, "%s: %s", args, out);
	cr_expect(strstr(out, "q4khost qa: --kernel: 'nope' is not a kernel variant") != NULL,
	          "%s: %s", args, out);
	free(out);
}

Test(first_run, numbers_and_names_say_the_real_constraint)
{
	static const char *const cases[][3] = {
		{ "validate --timeout 0", "2",
		  "q4khost validate: --timeout (seconds) must be a whole number in [1, 86400], got '0'\n" },
		{ "qa --timeout 0", "2",
		  "q4khost qa: --timeout (seconds) must be a whole number in [1, 86400], got '0'\n" },
		{ "run -n 0", "2", "q4khost run: --n-predict must be a whole number in [1, " },
		{ "run --raw --chat-template chatml", "2",
		  "q4khost run: --raw and --chat-template chatml contradict each other" },
		{ "run -n 1 -m ''", "3",
		  "q4khost run: the model file name is empty: expected the path of a GGUF file" },
		{ "validate -m ''", "3",
		  "q4khost validate: the model file name is empty: expected the path of a GGUF file" },
		{ "run -n 1 --config ''", "3",
		  "q4khost run: --config: the value is empty; expected the path of an INI file" },
	};
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(args, sizeof(args), "%s --plugin-path %s", cases[i][0], plugins);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), atoi(cases[i][1]), "%s: %s",
		             args, out);
		cr_expect(strstr(out, cases[i][2]) != NULL, "%s: %s", args, out);
		free(out);
	}
	/* an empty --plugin-path is no path, not "every plugin missing" */
	cr_expect_eq(test_q4khost("", test_tmpdir(), "run -n 1 --plugin-path ''", &out), 2, "%s",
	             out);
	cr_expect(strstr(out, "q4khost run: --plugin-path: the value is empty") != NULL, "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("Q4KHOST_LOG=loud", test_tmpdir(), "run -n 1", &out), 2, "%s",
	             out);
	cr_expect(strstr(out, "q4khost run: Q4KHOST_LOG='loud' is not one of debug, info, "
	                      "warning, error") != NULL, "%s", out);
	free(out);
}

Test(first_run, the_log_variable_takes_the_four_names_in_any_case_and_says_what_it_sets)
{
	static const char *const good[] = { "ERROR", "Warning", "debug" };
	char env[64], args[4200], *out;

	/* a model named: make distcheck runs without the default one */
	snprintf(args, sizeof(args), "info %s", tiny_model());
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		snprintf(env, sizeof(env), "Q4KHOST_LOG=%s", good[i]);
		cr_expect_eq(test_q4khost(env, test_tmpdir(), args, &out), 0, "%s: %s", env, out);
		free(out);
	}
	/* an abbreviation is no documented name */
	cr_expect_eq(test_q4khost("Q4KHOST_LOG=warn", test_tmpdir(), "info", &out), 2, "%s", out);
	cr_expect(strstr(out, "q4khost info: Q4KHOST_LOG='warn' is not one of debug, info, warning, "
	                      "error (any case): the threshold of plugin log lines\n") != NULL,
	          "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("", test_tmpdir(), "--help", &out), 0, "%s", out);
	cr_expect(strstr(out, "Q4KHOST_LOG (which plugin log lines are shown: debug, info, warning\n"
	                      "or error, any case; q4khost's own messages are always shown),\n")
	                  != NULL, "%s", out);
	free(out);
}

Test(first_run, a_key_set_twice_in_a_file_names_both_lines)
{
	char *cfg = file_with("twice.ini", "[f2]\nmode = auto\n[plugin.cpu]\nthreads = 2\n"
	                                   "[F2]\nMode = off\n");
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], want[8192], *out;

	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "q4khost plugins: warning: %s:6: key 'mode' in section [f2] is "
	         "set again (first on line 2); this later line wins\n", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	/* and it does win, as said */
	snprintf(want, sizeof(want), "F2 mode              off");
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	free(cfg);
}

Test(first_run, a_rate_from_no_time_is_not_made_up)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *out;
	json_t *j;

	/* one token: prefill gave it, decode timed nothing */
	cr_expect_eq(q4khost_with("", "run -n 1", NULL, plugins, "", &out), 0, "%s", out);
	/* the time is that of sampling and printing it: only its form is known */
	cr_expect(strstr(out, "; decode 1 token in 0.") != NULL, "%s", out);
	cr_expect(strstr(out, " s (rate n/a); stop: token limit\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, "(0.0 tokens/s)"), "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "run -n 1 --json", NULL, plugins, "2>/dev/null", &out), 0,
	             "%s", out);
	j = parse_json(out);
	cr_expect(json_is_null(json_object_get(json_object_get(j, "decode"), "tokens_per_second")),
	          "%s", out);
	cr_expect_gt(json_number_value(json_object_get(json_object_get(j, "prefill"),
	                                               "tokens_per_second")), 0, "%s", out);
	json_decref(j);
	free(out);
}

Test(first_run, json_always_carries_the_prompt_and_the_text)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *out;
	json_t *j;

	/* 0xe9 alone (Latin-1 é) and 0xff are no UTF-8: each becomes U+FFFD */
	cr_expect_eq(q4khost_with("", "run -n 4 --json -p \"$(printf 'caf\\351 \\377 ok')\"", NULL, plugins,
	                          "2>/dev/null", &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(json_string_value(json_object_get(j, "prompt")),
	                 "caf\xef\xbf\xbd \xef\xbf\xbd ok", "%s", out);
	cr_expect(json_is_string(json_object_get(j, "text")), "%s", out);
	json_decref(j);
	free(out);
}

Test(first_run, an_unwritable_plot_is_refused_before_any_work)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char folder[4096], args[4200], want[4400], *out;

	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, "--plot /nonexistent-dir/f2.svg",
	                          &out), 1, "%s", out);
	cr_expect(strstr(out, "q4khost validate: --plot /nonexistent-dir/f2.svg: cannot create it in "
	                      "/nonexistent-dir: No such file or directory (checked before any "
	                      "measurement)\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, "receipts in"), "no work was done: %s", out);
	free(out);
	snprintf(folder, sizeof(folder), "%s/plot-folder.svg", test_tmpdir());
	cr_assert(mkdir(folder, 0700) == 0 || errno == EEXIST, "%s: %s", folder, strerror(errno));
	snprintf(args, sizeof(args), "--plot %s", folder);
	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, args, &out), 1, "%s", out);
	snprintf(want, sizeof(want), "--plot %s: is a folder, expected a file to write", folder);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

Test(first_run, a_plot_not_named_svg_is_a_usage_error)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *out;

	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, "--plot /tmp/x.png", &out), 2,
	             "%s", out);
	cr_expect(strstr(out, "q4khost validate: --plot '/tmp/x.png': expected a file name ending in "
	                      ".svg (the plot is written as SVG)\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, "receipts in"), "no work was done: %s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, "--plot ''", &out), 2, "%s", out);
	cr_expect(strstr(out, "--plot '': expected a file name ending in .svg") != NULL, "%s", out);
	free(out);
}

Test(first_run, a_receipt_folder_is_judged_alike_everywhere)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	static const char *const why =
		"Q4KHOST_F2_RECEIPT_DIR=relative/f2: F2 cannot keep its receipts there: a relative "
		"folder would depend on the current directory; give an absolute path";
	char want[1024], *out;

	/* refused by what may need a receipt, even on the reference backend */
	cr_expect_eq(q4khost_with("Q4KHOST_F2_RECEIPT_DIR=relative/f2", "run -n 1 --backend cpu", NULL,
	                          plugins, "", &out), 3, "%s", out);
	snprintf(want, sizeof(want), "q4khost run: %s\n", why);
	cr_expect_str_eq(out, want);
	free(out);
	/* explained, with the consequence, by what diagnoses */
	snprintf(want, sizeof(want), "plugins --explain --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2_RECEIPT_DIR=relative/f2", test_tmpdir(), want, &out), 0,
	             "%s", out);
	snprintf(want, sizeof(want), "q4khost plugins: warning: %s; so run, validate, bench, qa, "
	         "serve and conformance refuse to start (exit 3), whatever backend they would use\n",
	         why);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

Test(first_run, a_receipt_folder_that_cannot_be_created_is_refused_before_any_work)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cfg = file_with("proc.ini", "[f2]\nreceipt_dir = /proc/nope\n");
	char args[4200], want[4400], *out;

	if (access("/proc/self", F_OK) != 0)
		cr_skip_test("no /proc here");
	/* /proc exists and may look writable (to root), but takes no folder */
	cr_expect_eq(q4khost_with("Q4KHOST_F2_RECEIPT_DIR=/proc/nope", "run -p hi -n 3", NULL,
	                          plugins, "", &out), 3, "%s", out);
	cr_expect(strstr(out, "q4khost run: Q4KHOST_F2_RECEIPT_DIR=/proc/nope: F2 cannot keep its "
	                      "receipts there: cannot create it: ") != NULL, "%s", out);
	cr_expect_eq(count(out, "\n"), 1, "said once, before any work: %s", out);
	free(out);
	snprintf(args, sizeof(args), "--config %s", cfg);
	cr_expect_eq(q4khost_with("Q4KHOST_F2_RECEIPT_DIR=", "run -p hi -n 3", NULL, plugins, args,
	                          &out), 3, "%s", out);
	snprintf(want, sizeof(want), "q4khost run: %s:2 [f2]: receipt_dir = \"/proc/nope\": F2 "
	         "cannot keep its receipts there: cannot create it: ", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_eq(count(out, "\n"), 1, "said once, before any work: %s", out);
	free(out);
	free(cfg);
}

Test(first_run, a_missing_receipt_folder_is_made_by_the_check_for_this_user_alone)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char dir[4200], env[4300], args[4300], *out;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s/made/f2", test_tmpdir());
	snprintf(env, sizeof(env), "Q4KHOST_F2_RECEIPT_DIR=%s", dir);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
	/* plugins --explain measures nothing, yet its check made the folder */
	cr_expect_eq(test_q4khost(env, test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect_null(strstr(out, "cannot keep"), "%s", out);
	free(out);
	cr_assert_eq(stat(dir, &st), 0, "%s: %s", dir, strerror(errno));
	cr_expect(S_ISDIR(st.st_mode), "%s", dir);
	cr_expect_eq(st.st_mode & 0777, 0700, "%s: %o", dir, st.st_mode & 0777);
}

/* --- issue 19b: a fresh user's trial of main ------------------------------ */

/* A run into a full disk says so once (not again from main), and the
 * report still goes to stderr. */
Test(first_run, a_run_into_a_full_disk_says_so_once_with_its_report)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out;

	if (access("/dev/full", W_OK) != 0)
		cr_skip_test("no /dev/full here");
	snprintf(args, sizeof(args), "run -n 4 -m %s --plugin-path %s", tiny_model(), plugins);
	q4khost_into("", args, ">/dev/full", &out);
	cr_expect_eq(count(out, "cannot write to standard output"), 1, "said once: %s", out);
	cr_expect(strstr(out, "q4khost run: cannot write to standard output: No space left on "
	                      "device\nrc=1\n") != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost: backend cpu") != NULL, "the report: %s", out);
	cr_expect(strstr(out, "; stop: error\n") != NULL, "%s", out);
	free(out);
}

/* A prompt longer than the context is refused before the prefill. */
Test(first_run, a_prompt_longer_than_the_context_is_refused_before_the_prefill)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *out;

	cr_expect_eq(q4khost_with("", "run --ctx 4 -p 'one two three four five six seven'", NULL,
	                          plugins, "", &out), 2, "%s", out);
	cr_expect(strstr(out, "q4khost run: the prompt is ") != NULL, "%s", out);
	cr_expect(strstr(out, " tokens; the context holds 4 (--ctx)") != NULL, "%s", out);
	cr_expect_null(strstr(out, "context full"), "%s", out);
	cr_expect_null(strstr(out, "q4khost: prefill"), "no prefill, no report: %s", out);
	/* A context exactly the prompt's length still gives one token: the
	 * first comes from the prompt's last logits and needs no row. */
	{
		const char *at = strstr(out, "the prompt is ");
		unsigned n = 0;
		char ctx[128];

		cr_assert(at && sscanf(at, "the prompt is %u tokens", &n) == 1, "%s", out);
		free(out);
		snprintf(ctx, sizeof(ctx), "run --ctx %u -n 3 -p 'one two three four five six seven'",
		         n);
		cr_expect_eq(q4khost_with("", ctx, NULL, plugins, "", &out), 0, "%s: %s", ctx, out);
		cr_expect(strstr(out, "stop: context full") != NULL, "%s: %s", ctx, out);
	}
	free(out);
}

/* Weights that make every logit NaN: named as such, with the model file
 * and the backend, after the report (not "token -1 is outside the
 * vocabulary"). */
Test(first_run, logits_with_no_finite_value_are_named_with_the_report)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	const struct q4kh_gguf_tensor *t;
	struct q4kh_gguf *g = NULL;
	struct q4kh_error err = { { 0 } };
	char *model, *want, *out;
	uint64_t offset, size;
	FILE *f;

	cr_assert_geq(asprintf(&model, "%s/nan.gguf", test_tmpdir()), 0);
	cr_assert_geq(asprintf(&want, "cp %s %s", tiny_model(), model), 0);
	cr_assert_eq(system(want), 0);
	free(want);
	cr_assert_eq(q4kh_gguf_open(model, &g, &err), 0, "%s", err.msg);
	t = q4kh_gguf_tensor(g, "output_norm.weight");
	cr_assert_not_null(t);
	offset = t->offset;
	size = t->size;
	q4kh_gguf_close(g);
	f = fopen(model, "r+b");
	cr_assert_not_null(f);
	cr_assert_eq(fseek(f, (long)offset, SEEK_SET), 0);
	for (uint64_t i = 0; i < size / sizeof(float); i++)
		cr_assert_eq(fwrite(&(float){ NAN }, sizeof(float), 1, f), 1);
	cr_assert_eq(fclose(f), 0);
	for (int sampled = 0; sampled < 2; sampled++) {
		cr_expect_eq(q4khost_with("", sampled ? "run -n 2 --temp 0.8" : "run -n 2", model,
		                          plugins, "", &out), 1, "%s", out);
		cr_assert_geq(asprintf(&want, "q4khost run: the logits of step 0 have no finite "
		                       "value (model data or backend): model %s, backend cpu "
		                       "device 0\n", model), 0);
		cr_expect(strstr(out, want) != NULL, "%s", out);
		cr_expect(strstr(out, "; stop: error\n") != NULL, "the report: %s", out);
		cr_expect_null(strstr(out, "outside the vocabulary"), "%s", out);
		free(want);
		free(out);
	}
	free(model);
}

Test(first_run, an_extra_argument_points_at_help)
{
	char *out;

	cr_expect_eq(test_q4khost("", test_tmpdir(), "run extra", &out), 2, "%s", out);
	cr_expect(strstr(out, "q4khost run: unexpected argument 'extra': the prompt goes after "
	                      "-p (try q4khost run --help)\n") != NULL, "%s", out);
	free(out);
}

/* A bad Q4KHOST_F2 is named by plain `plugins` too, as a bad [f2] mode. */
Test(first_run, a_bad_f2_mode_in_the_environment_is_named_by_plugins)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out;

	snprintf(args, sizeof(args), "plugins --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2=bogus", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost plugins: warning: Q4KHOST_F2: 'bogus' is not one of auto, "
	                      "fresh, off, require; run, bench and plugins --explain refuse it "
	                      "(exit 2)\n") != NULL, "%s", out);
	free(out);
}

/* The man pages hold no raw control characters (a form feed where \f was
 * meant ran the SERVE options together). */
Test(first_run, the_man_pages_hold_no_control_characters)
{
	static const char *const pages[] = { "q4khost.1", "q4khost.ini.5", "q4khost-plugin.7" };
	char path[4200], *page;
	size_t len;

	for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++) {
		snprintf(path, sizeof(path), "%s/man/%s", test_builddir(), pages[i]);
		page = test_read_file(path, &len);
		cr_assert_not_null(page, "%s", path);
		for (size_t k = 0; k < len; k++)
			cr_expect(page[k] == '\n' || page[k] == '\t' || (unsigned char)page[k] >= 0x20,
			          "%s: byte %zu is %#x", pages[i], k, (unsigned char)page[k]);
		free(page);
	}
}

/* validate --set is judged as a file's keys are: unknown ones warned
 * about and ignored, a bad value refused with exit 3. */
Test(first_run, validate_set_is_judged_as_a_file_is)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out;

	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s --set bogus:x=1 "
	         "--set f2:nokey=1 --set f2:mode=bogus", tiny_model(), plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
	cr_expect(strstr(out, "q4khost validate: warning: --set bogus:x=1: unknown section "
	                      "[bogus] (known: ") != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost validate: warning: --set f2:nokey=1: unknown key 'nokey' "
	                      "in section [f2] (known there: mode, ") != NULL, "%s", out);
	/* the --set argument that is wrong is named as given */
	cr_expect(strstr(out, "q4khost validate: --set f2:mode=bogus: 'bogus' is not one of auto, "
	                      "fresh, off, require\n") != NULL, "%s", out);
	free(out);
	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s --set f2:f2_floor=0.1",
	         tiny_model(), plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
	cr_expect(strstr(out, "q4khost validate: --set f2:f2_floor=0.1: f2_floor = \"0.1\": "
	                      "expected a number in [0.9, 1]\n") != NULL, "%s", out);
	free(out);
	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s --set plugin.cpu:threads=abc",
	         tiny_model(), plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
	cr_expect(strstr(out, "(threads from --set plugin.cpu:threads=abc)\n") != NULL, "%s", out);
	free(out);
}

/* A relative XDG_CACHE_HOME is ignored alike for the default model and
 * the receipt folder (the XDG spec), with one warning. */
Test(first_run, a_relative_cache_home_is_ignored_for_the_model_and_the_receipts)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	const char *home = test_tmpdir();
	char env[8192], args[8192], want[8192], *out;

	snprintf(env, sizeof(env), "Q4KHOST_F2_RECEIPT_DIR= Q4KHOST_MODEL= XDG_CACHE_HOME=rel "
	         "HOME=%s", home);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost(env, test_tmpdir(), args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "q4khost plugins: warning: XDG_CACHE_HOME=rel is a relative path, "
	         "which the XDG base directory spec says to ignore: using %s/.cache\n", home);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_eq(count(out, "XDG_CACHE_HOME=rel"), 1, "once: %s", out);
	snprintf(want, sizeof(want), "%s/.cache/q4khost/f2", home);
	cr_expect(strstr(out, want) != NULL, "the receipts: %s", out);
	free(out);
	test_q4khost(env, test_tmpdir(), "info", &out);
	snprintf(want, sizeof(want), "%s/.cache/q4khost/models/", home);
	cr_expect(strstr(out, want) != NULL, "the model: %s", out);
	free(out);
}

/* Backend names: bench lists the backends as run does, and bench-kernels
 * says how to leave its cuda default. */
Test(first_run, backend_errors_say_what_is_there)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	static const char *const cases[][2] = {
		{ "bench --backend bogus", "q4khost bench: --backend bogus: no backend plugin of that "
		                           "name on the plugin path " },
		{ "bench-kernels", "; cuda is the default: --backend NAME times another (cpu-fast: "
		                   "the CPU's variants)\n" },
	};
	char args[8192], *out;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(args, sizeof(args), "%s -m %s --plugin-path %s", cases[i][0], tiny_model(),
		         plugins);
		if (!strcmp(cases[i][0], "bench-kernels"))
			snprintf(args, sizeof(args), "bench-kernels --plugin-path %s", plugins);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 4, "%s: %s", args, out);
		cr_expect(strstr(out, cases[i][1]) != NULL, "%s: %s", args, out);
		cr_expect(strstr(out, "cpu") != NULL, "the backends there: %s", out);
		free(out);
	}
}

/* More --threads than CPUs is said in one line; --top-k 0 is explained. */
Test(first_run, threads_beyond_the_cpus_are_warned_about_and_top_k_0_explained)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *out;

	cr_expect_eq(q4khost_with("", "run -n 1 --threads 256", NULL, plugins, "", &out), 0, "%s",
	             out);
	cr_expect(strstr(out, "q4khost run: warning: --threads 256 is more than the ") != NULL,
	          "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("", test_tmpdir(), "run --help", &out), 0, "%s", out);
	cr_expect(strstr(out, "0 = every token") != NULL, "%s", out);
	free(out);
}

/* --- issue 19c: a third trial ---------------------------------------------- */

/* plugins --explain names the F2 probe, the child's limits and every
 * [plugin.NAME] setting, each with where it came from, as it names the
 * other settings. */
Test(first_run, plugins_explain_names_the_f2_probe_and_plugin_settings_with_their_origins)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cfg = file_with("explain.ini", "[f2]\nprobe = prompt\n\n[plugin.cpu]\nthreads = 2\n"
	                                     "[f2]\nf2_timeout_s = 30\n");
	char args[8192], want[8192], *out;
	json_t *j, *set;

	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "  F2 probe             prompt                               "
	         "from %s:2 [f2]\n", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want), "  cpu threads          2                                    "
	         "from %s:5 [plugin.cpu]\n", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want), "  F2 timeout           30 s                                 "
	         "from %s:7 [f2]\n", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	snprintf(args, sizeof(args), "plugins --explain --json --plugin-path %s --config %s", plugins,
	         cfg);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	j = parse_json(out);
	set = json_object_get(j, "settings");
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(set, "f2_probe"), "value")),
	                 "prompt");
	set = json_object_get(json_object_get(json_object_get(set, "plugins"), "cpu"), "threads");
	cr_expect_str_eq(json_string_value(json_object_get(set, "value")), "2");
	snprintf(want, sizeof(want), "%s:5 [plugin.cpu]", cfg);
	cr_expect_str_eq(json_string_value(json_object_get(set, "origin")), want);
	json_decref(j);
	free(out);
	/* nothing set: the probe's default, and no plugin setting to name */
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "  F2 probe             builtin                              from default\n")
	          != NULL, "%s", out);
	cr_expect(strstr(out, "):\n  none set\n") != NULL, "%s", out);
	free(out);
	free(cfg);
}

/* q4khost ARGS with ENV before it exits 0 and prints WANT. */
static void prints(const char *env, const char *args, const char *want)
{
	char *out;

	cr_assert_eq(test_q4khost(env, test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, want) != NULL, "no '%s' in: %s", want, out);
	free(out);
}

/* [f2] require_deep is shown with where it came from; the environment's
 * Q4KHOST_F2_REQUIRE_DEEP wins over the file, as Q4KHOST_F2 does; a value
 * other than true or false is refused naming the file and line. */
Test(first_run, plugins_explain_names_require_deep_and_its_origin)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cfg = file_with("deep.ini", "[f2]\nrequire_deep = true\n");
	char *bad = file_with("bad.ini", "[f2]\n\nrequire_deep = yes\n");
	char args[8192], want[8192], *out;
	json_t *j;

	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	snprintf(want, sizeof(want), "  %-20s %-36s from %s:2 [f2]\n", "F2 require deep", "true",
	         cfg);
	prints("", args, want);
	prints("Q4KHOST_F2_REQUIRE_DEEP=false", args,
	       "  F2 require deep      false                                "
	       "from Q4KHOST_F2_REQUIRE_DEEP\n");
	strcat(args, " --json");
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect(json_is_true(json_object_get(
	                  json_object_get(json_object_get(j, "settings"), "f2_require_deep"),
	                  "value")),
	          "%s", out);
	json_decref(j);
	free(out);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, bad);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
	snprintf(want, sizeof(want), "%s:3 [f2]: require_deep 'yes' is not one of true", bad);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	free(bad);
	free(cfg);
}
