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
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
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
		"q4khost info: option '--model' needs a value (try q4khost info --help)",
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

	test_need_cpu_fast();
	snprintf(cmd, sizeof(cmd), "cp %s/plugins/cpu-simd/.libs/cpu-simd.so %s/", test_builddir(),
	         plugins);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	for (int i = 0; i < 4; i++) {
		snprintf(args, sizeof(args), "run -n 1 -m %s --plugin-path %s --threads %s",
		         tiny_model(), plugins, threads[i]);
		cr_expect_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
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
		{ "", "validate --device 9", "q4khost validate: no backend has a device 9; " },
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
		{ "run -n 1 -m ''", "2",
		  "q4khost run: --model '': an empty value is not allowed; expected the path of a "
		  "GGUF file (or no --model, for the default model)\n" },
		{ "validate -m ''", "2",
		  "q4khost validate: --model '': an empty value is not allowed; expected the path" },
		{ "run -n 1 --config ''", "2",
		  "q4khost run: --config '': an empty value is not allowed; expected the path of an "
		  "INI file\n" },
		{ "run -n 1 --kernel ,,", "2",
		  "q4khost run: --kernel ',,': entry 1 of the list has no name; expected kernel "
		  "variant names, NAME[,NAME...], each maybe DEVICE=NAME, or none for the built-in "
		  "kernels" },
		{ "run -n 1 --kernel 'a,0='", "2",
		  "q4khost run: --kernel 'a,0=': entry 2 of the list has no name; " },
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
	cr_expect(strstr(out, "q4khost run: --plugin-path '': an empty value is not allowed; "
	                      "expected ':'-separated plugin folders\n") != NULL, "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("Q4KHOST_LOG=loud", test_tmpdir(), "run -n 1", &out), 3, "%s",
	             out);
	cr_expect(strstr(out, "q4khost run: Q4KHOST_LOG='loud' is not one of debug, info, "
	                      "warning, error") != NULL, "%s", out);
	free(out);
}

/*
 * A hyper-parameter out of range is named by its GGUF key, with its value
 * and what was expected: the tiny llama with attention.head_count_kv one
 * more than head_count, which no head count divides.
 */
Test(first_run, a_bad_hyper_parameter_names_its_key_and_what_was_expected)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g;
	const struct q4kh_gguf_kv *kv;
	uint32_t heads, bad;
	uint64_t at;
	size_t len;
	char path[4200], want[4600], *bytes, *out;
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });

	cr_assert_eq(q4kh_gguf_open(tiny_model(), &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_gguf_get_u32(g, "llama.attention.head_count", &heads, &err), 0);
	kv = q4kh_gguf_find(g, "llama.attention.head_count_kv");
	cr_assert(kv && kv->type == Q4KH_GGUF_UINT32);
	at = kv->offset;
	q4kh_gguf_close(g);
	bytes = test_read_file(tiny_model(), &len);
	cr_assert_not_null(bytes);
	bad = heads + 1;
	memcpy(bytes + at, &bad, 4); /* GGUF is little-endian, as this machine */
	snprintf(path, sizeof(path), "%s/bad-kv-heads.gguf", test_tmpdir());
	test_write_file(path, bytes, len);
	free(bytes);
	cr_expect_eq(q4khost_with("", "run -n 1 -p hi", path, plugins, "", &out), 3, "%s", out);
	snprintf(want, sizeof(want), "%s: llama.attention.head_count_kv = %u: expected a divisor "
	         "of llama.attention.head_count %u\n", path, bad, heads);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_eq(count(out, "\n"), 1, "%s", out);
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
	cr_expect_eq(test_q4khost("Q4KHOST_LOG=warn", test_tmpdir(), "info", &out), 3, "%s", out);
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

/* Seconds on the monotonic clock. */
static double seconds_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* J's number at "OBJECT.KEY" (OBJECT "" for J itself); fails the test without. */
static double number_at(json_t *j, const char *object, const char *key)
{
	json_t *v = json_object_get(object[0] ? json_object_get(j, object) : j, key);

	cr_assert(json_is_number(v), "%s.%s is no number", object, key);
	return json_number_value(v);
}

/*
 * The time to the first token counts from the command's start
 * (docs/architecture.md section 7, "Start-up"): it holds the start-up
 * phases and the prefill, which times the prompt alone, and it is no
 * longer than the whole command took as the test saw it from outside.
 */
Test(first_run, the_time_to_the_first_token_counts_the_start_up_and_the_prefill)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	double t0, outside, first, startup, phases = 0;
	static const char *const names[] = { "plugins_seconds", "model_seconds",
		                             "choice_seconds", "session_seconds" };
	char *out;
	json_t *j, *ttft;

	cr_expect_eq(q4khost_with("", "run -n 2", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, "\nq4khost: time to first token ") != NULL &&
	          strstr(out, " s: start-up ") && strstr(out, ", choice and F2 ") &&
	          strstr(out, "), prefill "), "%s", out);
	free(out);
	t0 = seconds_now();
	cr_assert_eq(q4khost_with("", "run -n 2 --json", NULL, plugins, "2>/dev/null", &out), 0,
	             "%s", out);
	outside = seconds_now() - t0;
	j = parse_json(out);
	ttft = json_object_get(j, "time_to_first_token");
	cr_assert_not_null(ttft, "%s", out);
	first = number_at(j, "time_to_first_token", "seconds");
	startup = number_at(j, "time_to_first_token", "startup_seconds");
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		double v = number_at(ttft, "startup", names[i]);

		cr_expect_geq(v, 0, "%s: %g", names[i], v);
		phases += v;
	}
	cr_expect(fabs(phases - startup) < 1e-6, "the phases sum to %g, start-up %g", phases,
	          startup);
	cr_expect_eq(number_at(ttft, "", "prefill_seconds"), number_at(j, "prefill", "seconds"));
	cr_expect_geq(first, startup + number_at(j, "prefill", "seconds"),
	              "the first token at %g s, before the start-up %g s and the prefill %g s",
	              first, startup, number_at(j, "prefill", "seconds"));
	cr_expect_leq(first, outside, "the first token at %g s of a command of %g s", first,
	              outside);
	json_decref(j);
	free(out);
}

/* A usage error's JSON object has it as "error" alone: F2 said nothing,
 * so f2.message is null, not a copy of it. */
Test(first_run, json_of_a_usage_error_leaves_f2_out_of_it)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *out;
	json_t *j;

	cr_expect_eq(q4khost_with("", "run -n 1 --json --temp 5", NULL, plugins, "2>/dev/null",
	                          &out), 2, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(json_string_value(json_object_get(j, "error")),
	                 "--temp must be a number in [0, 2], got '5'", "%s", out);
	cr_expect(json_is_null(json_object_get(json_object_get(j, "f2"), "message")), "%s", out);
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
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });
	static const char *const why =
		"Q4KHOST_F2_RECEIPT_DIR=relative/f2: F2 cannot keep its receipts there: a relative "
		"folder would depend on the current directory; give an absolute path";
	char want[1024], *out;

	/* refused by what may need a receipt, even on the reference backend
	 * (a variant of its may be judged) */
	cr_expect_eq(q4khost_with("Q4KHOST_F2_RECEIPT_DIR=relative/f2", "run -n 1 --backend cpu", NULL,
	                          plugins, "", &out), 3, "%s", out);
	snprintf(want, sizeof(want), "q4khost run: %s\n", why);
	cr_expect_str_eq(out, want);
	free(out);
	/* a run that can need none runs: the reference alone */
	cr_expect_eq(q4khost_with("Q4KHOST_F2_RECEIPT_DIR=relative/f2",
	                          "run -n 1 --backend cpu --kernel none", NULL, plugins, "", &out),
	             0, "%s", out);
	free(out);
	/* explained, with the consequence, by what diagnoses */
	snprintf(want, sizeof(want), "plugins --explain --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2_RECEIPT_DIR=relative/f2", test_tmpdir(), want, &out), 0,
	             "%s", out);
	snprintf(want, sizeof(want), "q4khost plugins: warning: %s; so validate, bench, qa, "
	         "conformance, and every run or serve that may need a receipt (F2 not off, a "
	         "candidate besides the reference) refuse to start (exit 3)\n",
	         why);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

Test(first_run, a_receipt_folder_that_cannot_be_created_is_refused_before_any_work)
{
	/* a variant: the run may need a receipt */
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });
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

	cr_expect_eq(q4khost_with("", "run --ctx 4 -n 3 -p 'one two three four five six seven'",
	                          NULL, plugins, "", &out), 2, "%s", out);
	cr_expect(strstr(out, "q4khost run: the prompt is ") != NULL, "%s", out);
	cr_expect(strstr(out, " tokens; the context holds 4 (--ctx)") != NULL, "%s", out);
	cr_expect_null(strstr(out, "context full"), "%s", out);
	cr_expect_null(strstr(out, "q4khost: prefill"), "no prefill, no report: %s", out);
	/* A context exactly the prompt's length still gives one token: the
	 * first comes from the prompt's last logits and needs no row. */
	{
		const char *at = strstr(out, "the prompt is "), *hint = strstr(out, ", or --ctx ");
		unsigned n = 0, needed = 0;
		char ctx[128];

		cr_assert(at && sscanf(at, "the prompt is %u tokens", &n) == 1, "%s", out);
		/* the hint is for the whole request: the prompt and -n's 3 tokens,
		 * the last of which needs no row */
		cr_assert(hint && sscanf(hint, ", or --ctx %u or more for the prompt and the 3 "
		                               "tokens asked for (-n)", &needed) == 1, "%s", out);
		cr_expect_eq(needed, n + 2, "%s", out);
		free(out);
		snprintf(ctx, sizeof(ctx), "run --ctx %u -n 3 -p 'one two three four five six seven'",
		         needed);
		cr_expect_eq(q4khost_with("", ctx, NULL, plugins, "", &out), 0, "%s: %s", ctx, out);
		cr_expect(strstr(out, "stop: token limit") != NULL, "the hint is enough: %s", out);
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
	static const char *const commands[] = { "plugins", "validate", "bench", "conformance" };
	char args[64], want[256], *out;

	cr_expect_eq(test_q4khost("", test_tmpdir(), "run extra", &out), 2, "%s", out);
	cr_expect(strstr(out, "q4khost run: unexpected argument 'extra': the prompt goes after "
	                      "-p (try q4khost run --help)\n") != NULL, "%s", out);
	free(out);
	/* the others take options only: "plugins extra" is no subcommand */
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		snprintf(args, sizeof(args), "%s extra", commands[i]);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 2, "%s: %s", args, out);
		snprintf(want, sizeof(want), "q4khost %s: unexpected argument 'extra': %s takes "
		         "options only (try q4khost %s --help)\n", commands[i], commands[i],
		         commands[i]);
		cr_expect_str_eq(out, want, "%s", args);
		free(out);
	}
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
	                      "(exit 3)\n") != NULL, "%s", out);
	free(out);
}

/* A variable is a setting, as a file is: a bad value exits 3 everywhere,
 * naming the variable, the value and what it takes. */
Test(first_run, a_bad_environment_value_exits_3_naming_it)
{
	static const struct {
		const char *env, *want;
	} bad[] = {
		{ "Q4KHOST_F2=bogus", "Q4KHOST_F2: 'bogus' is not one of auto, fresh, off, require" },
		{ "Q4KHOST_LOG=loud", "Q4KHOST_LOG='loud' is not one of debug, info, warning, error" },
		{ "Q4KHOST_F2_REQUIRE_DEEP=maybe",
		  "Q4KHOST_F2_REQUIRE_DEEP: require_deep 'maybe': expected 1, on, true, yes or 0, "
		  "off, false, no (any case) (" },
	};
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out;

	snprintf(args, sizeof(args), "run -n 1 -m %s --plugin-path %s", tiny_model(), plugins);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_expect_eq(test_q4khost(bad[i].env, test_tmpdir(), args, &out), 3, "%s: %s",
		             bad[i].env, out);
		cr_expect(strstr(out, bad[i].want) != NULL, "%s: %s", bad[i].env, out);
		free(out);
	}
	cr_expect_eq(test_q4khost("", test_tmpdir(), "--help", &out), 0, "%s", out);
	cr_expect(strstr(out, "Q4KHOST_F2_REQUIRE_DEEP (on: run and serve accept deep receipts "
	                      "only,\nvalidate and bench judge on the deep probe),\n") != NULL, "%s",
	          out);
	cr_expect(strstr(out, "a setting's value in a file or the\n            environment") !=
	          NULL, "%s", out);
	free(out);
}

/*
 * Keyword values are taken in any case, in the environment as in a file
 * (docs/config.md, section 4): Q4KHOST_F2=OFF is off, as Q4KHOST_LOG=DEBUG
 * is debug; Q4KHOST_F2_REQUIRE_DEEP=TRUE and [f2] mode = Fresh too.
 */
Test(first_run, keyword_values_are_taken_in_any_case)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out, *ini = file_with("case.ini", "[f2]\nmode = Fresh\n");
	int rc;

	snprintf(args, sizeof(args), "run -n 1 -p hi -m %s --plugin-path %s", tiny_model(),
	         plugins);
	rc = test_q4khost("Q4KHOST_F2=OFF", test_tmpdir(), args, &out);
	cr_expect_eq(rc, 0, "%s", out);
	cr_expect(strstr(out, "not one of") == NULL, "%s", out);
	free(out);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins,
	         ini);
	rc = test_q4khost("Q4KHOST_F2_REQUIRE_DEEP=TRUE", test_tmpdir(), args, &out);
	cr_expect_eq(rc, 0, "%s", out);
	cr_expect(strstr(out, "  F2 mode              fresh ") != NULL, "%s", out);
	cr_expect(strstr(out, "  F2 require deep      true ") != NULL, "%s", out);
	free(out);
	free(ini);
}

/*
 * A kernel variant that no plugin is, named in the environment or in a
 * file, is no bad value (the name is well formed) but a request no plugin
 * can honour: exit 4 from both, as --help and docs/config.md say.
 */
Test(first_run, a_kernel_no_plugin_is_exits_4_from_a_file_and_the_environment)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out, *ini = file_with("gpu.ini", "[gpu]\nq4k_kernel = nope\n");

	snprintf(args, sizeof(args), "run -n 1 -p hi -m %s --plugin-path %s", tiny_model(),
	         plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_Q4K_KERNEL=nope", test_tmpdir(), args, &out), 4, "%s",
	             out);
	cr_expect(strstr(out, "'nope' is not a kernel variant") != NULL, "%s", out);
	free(out);
	snprintf(args, sizeof(args), "run -n 1 -p hi -m %s --plugin-path %s --config %s",
	         tiny_model(), plugins, ini);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 4, "%s", out);
	cr_expect(strstr(out, "'nope' is not a kernel variant") != NULL, "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("", test_tmpdir(), "--help", &out), 0, "%s", out);
	cr_expect(strstr(out, "4 no plugin could honour the request (a\n            backend or "
	                      "kernel variant named by an option, a file or\n            the "
	                      "environment that no plugin on the path is)") != NULL, "%s", out);
	free(out);
	free(ini);
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

/* Backend names: bench lists the backends as run does. (bench-kernels'
 * default, the backend run tries first, is test_ab's.) */
Test(first_run, backend_errors_say_what_is_there)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], *out;

	snprintf(args, sizeof(args), "bench --backend bogus -m %s --plugin-path %s", tiny_model(),
	         plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 4, "%s: %s", args, out);
	cr_expect(strstr(out, "q4khost bench: --backend bogus: no backend plugin of that name on "
	                      "the plugin path ") != NULL,
	          "%s: %s", args, out);
	cr_expect(strstr(out, "cpu") != NULL, "the backends there: %s", out);
	free(out);
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

/* q4khost plugins says why a backend has no device, in its words (what
 * its device_info refuses device 0 with, plugin-abi.md L6), in text and
 * in --json. */
Test(first_run, plugins_says_why_a_backend_has_no_device)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "no_device", NULL });
	static const char why[] = "device_info: no device 0 (no-device has 0: this test backend "
	                          "never has one)";
	char args[8192], want[8192], *out;
	json_t *j, *backends, *b = NULL;

	snprintf(args, sizeof(args), "plugins --plugin-path %s", plugins);
	snprintf(want, sizeof(want), "\nbackend no-device: 0 devices\n  why none: %s\n", why);
	prints("", args, want);
	strcat(args, " --json");
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	j = parse_json(out);
	backends = json_object_get(j, "backends");
	for (size_t i = 0; i < json_array_size(backends); i++)
		if (!strcmp(json_string_value(json_object_get(json_array_get(backends, i), "name")),
		            "no-device"))
			b = json_array_get(backends, i);
	cr_assert_not_null(b, "%s", out);
	cr_expect_str_eq(json_string_value(json_object_get(b, "why_no_devices")), why);
	/* a backend with devices has no reason to give */
	cr_expect_null(json_object_get(json_array_get(backends, b == json_array_get(backends, 0)),
	                               "why_no_devices"), "%s", out);
	json_decref(j);
	free(out);
}

/* A key of [plugin.NAME] that its plugin does not read is shown by
 * plugins --explain as unknown and ignored, never as a setting, with the
 * key it reads that is a slip away; run warns of it once, before any
 * work. */
Test(first_run, an_unknown_plugin_key_is_shown_as_such_and_warned_once)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cfg = file_with("typo.ini", "[plugin.cpu]\nthreds = 2\n");
	char args[8192], want[8192], *out, *at;
	json_t *j, *key;
	int times = 0;

	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	snprintf(want, sizeof(want), "  %-20s %-36s from %s:2 [plugin.cpu]\n", "cpu threds",
	         "2 (unknown key, ignored: did you mean threads?)", cfg);
	prints("", args, want);
	strcat(args, " --json");
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	j = parse_json(out);
	key = json_object_get(json_object_get(json_object_get(json_object_get(j, "settings"),
	                                                      "plugins"), "cpu"), "threds");
	cr_expect(json_is_true(json_object_get(key, "unknown")), "%s", out);
	cr_expect_str_eq(json_string_value(json_object_get(key, "did_you_mean")), "threads");
	json_decref(j);
	free(out);
	snprintf(args, sizeof(args), "--config %s", cfg);
	cr_expect_eq(q4khost_with("", "run -n 1", NULL, plugins, args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "q4khost run: warning: %s:2: key 'threds' in section "
	         "[plugin.cpu] is not read by plugin cpu (it reads: threads); ignored; did you "
	         "mean 'threads'?\n", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	for (at = out; (at = strstr(at, "'threds'")); at++)
		times++;
	cr_expect_eq(times, 1, "warned once: %s", out);
	free(out);
	free(cfg);
}

/* The installed sample configuration, every commented default written
 * out (each "; key = value" line without its "; "), is one that every
 * command reads without a word: each key is one q4khost or its plugin
 * reads, each value one it takes. */
Test(first_run, the_sample_configuration_with_its_defaults_warns_of_nothing)
{
	static const char *const so[] = { "cpu/.libs/cpu.so", "cpu-fast/.libs/cpu-fast.so",
		                          "cpu-simd/.libs/cpu-simd.so",
		                          "cpu-simd8/.libs/cpu-simd8.so", "cuda/.libs/cuda.so" };
	const char *plugins = test_tmpdir();
	char path[4200], cmd[8800], line[1100], args[8800], *out, *cfg;
	FILE *in, *ini;
	size_t keys = 0;

	for (size_t i = 0; i < sizeof(so) / sizeof(so[0]); i++) {
		snprintf(path, sizeof(path), "%s/plugins/%s", test_builddir(), so[i]);
		if (access(path, R_OK) != 0)
			cr_skip_test("%s was not built here: its section would name no plugin", path);
		snprintf(cmd, sizeof(cmd), "cp %s %s/", path, plugins);
		cr_assert_eq(system(cmd), 0, "%s", cmd);
	}
	snprintf(path, sizeof(path), "%s/data/q4khost.ini", test_srcdir());
	in = fopen(path, "r");
	cr_assert_not_null(in, "%s", path);
	cfg = file_with("defaults.ini", "");
	ini = fopen(cfg, "w");
	cr_assert_not_null(ini, "%s", cfg);
	while (fgets(line, sizeof(line), in)) {
		size_t key = strspn(line + 2, "abcdefghijklmnopqrstuvwxyz0123456789_");
		int setting = !strncmp(line, "; ", 2) && key && !strncmp(line + 2 + key, " =", 2);

		keys += setting;
		fputs(setting ? line + 2 : line, ini);
	}
	fclose(in);
	fclose(ini);
	cr_expect_geq(keys, 16, "the sample's commented keys: %zu", keys);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect_null(strstr(out, "warning"), "%s", out);
	cr_expect_null(strstr(out, "unknown key"), "%s", out);
	free(out);
	free(cfg);
}

/* [f2] require_deep is shown with where it came from; the environment's
 * Q4KHOST_F2_REQUIRE_DEEP wins over the file, as Q4KHOST_F2 does; a value
 * other than an on/off word is refused naming the file, line, key,
 * value and the words. */
Test(first_run, plugins_explain_names_require_deep_and_its_origin)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cfg = file_with("deep.ini", "[f2]\nrequire_deep = Yes\n");
	char *bad = file_with("bad.ini", "[f2]\n\nrequire_deep = maybe\n");
	char args[8192], want[8192], *out;
	json_t *j;

	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	snprintf(want, sizeof(want), "  %-20s %-36s from %s:2 [f2]\n", "F2 require deep", "true",
	         cfg);
	prints("", args, want);
	prints("Q4KHOST_F2_REQUIRE_DEEP=off", args,
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
	snprintf(want, sizeof(want), "%s:3 [f2]: require_deep 'maybe': expected 1, on, true, yes or "
	         "0, off, false, no (any case)", bad);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	free(bad);
	free(cfg);
}

/* An empty --backend or --kernel is a usage error of every command that
 * takes one, named as such before any work. */
Test(first_run, an_empty_backend_or_kernel_name_is_a_usage_error)
{
	static const char *const commands[] = { "run", "bench", "validate", "qa --cases x",
		                                "serve", "plugins --explain", "conformance",
		                                "bench-kernels" };
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], want[512], *out;

	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		const char *kernel = strncmp(commands[i], "bench", 5) ? "--kernel" : "--kernels";
		int len = (int)strcspn(commands[i], " ");

		snprintf(args, sizeof(args), "%s --backend '' --plugin-path %s", commands[i], plugins);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 2, "%s: %s", args, out);
		snprintf(want, sizeof(want), "q4khost %.*s: --backend '': an empty value is not allowed; "
		         "expected the name of a backend plugin (q4khost plugins lists them)\n", len,
		         commands[i]);
		cr_expect_str_eq(out, want, "%s", args);
		free(out);
		/* conformance takes no kernel; bench-kernels --kernels '' times the
		 * built-in alone, as its help says */
		if (!strcmp(commands[i], "conformance") || !strcmp(commands[i], "bench-kernels"))
			continue;
		snprintf(args, sizeof(args), "%s %s '' --plugin-path %s", commands[i], kernel, plugins);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 2, "%s: %s", args, out);
		snprintf(want, sizeof(want), "q4khost %.*s: %s '': an empty value is not allowed; "
		         "expected kernel variant names, NAME[,NAME...], each maybe DEVICE=NAME, or "
		         "none for the built-in kernels",
		         len, commands[i], kernel);
		cr_expect(strstr(out, want) == out, "%s: %s", args, out);
		free(out);
	}
}

/* Usage mistakes, exit 2, each saying what was wrong: a number with white
 * space around it (refused as any junk), an empty number, a hexadecimal
 * one (strtod's 0x1), and validate --quiet without --one, where it means
 * nothing. */
Test(first_run, numbers_with_white_space_and_quiet_without_one_are_usage_errors)
{
	static const char *const cases[][2] = {
		{ "run --device ''", "q4khost run: --device: the value is empty; expected a whole "
		                     "number in [0, 1023]\n" },
		{ "validate --quiet", "q4khost validate: --quiet needs --one: " },
		{ "run -n ' 3'", "q4khost run: --n-predict must be a whole number in [1, 2147483647], "
		                 "got ' 3' (white space around it is not allowed)\n" },
		{ "run -n '3 '", "got '3 ' (white space around it is not allowed)\n" },
		{ "run --temp ' 0.5'", "q4khost run: --temp must be a number in [0, 2], got ' 0.5' " },
		{ "run --temp 0x1", "q4khost run: --temp must be a number in [0, 2], got '0x1'\n" },
		{ "serve --top-p '0.5 '", "q4khost serve: --top-p must be a number in [0, 1], got '0.5 '" },
		{ "serve --port ' 80' -m /nonexistent.gguf", "q4khost serve: --port must be a whole number in [0, 65535]" },
		{ "validate --memory-limit ' 5'", "q4khost validate: --memory-limit (MiB; 0: no limit) "
		                                  "must be a whole number in [0, 1073741824], got ' 5'" },
		{ "validate --timeout '\t9'", "q4khost validate: --timeout (seconds) must be a whole " },
	};
	char *out;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_expect_eq(test_q4khost("", test_tmpdir(), cases[i][0], &out), 2, "%s: %s",
		             cases[i][0], out);
		cr_expect(strstr(out, cases[i][1]) != NULL, "%s: %s", cases[i][0], out);
		free(out);
	}
}

/* A host that does not resolve is refused before the model loads. */
Test(first_run, serve_refuses_a_host_that_does_not_resolve_before_loading)
{
	char *out;

	/* the model named does not exist: refusing it would be the late error */
	cr_expect_eq(test_q4khost("", test_tmpdir(), "serve --host no-such-host.invalid -m "
	                          "/nonexistent.gguf", &out), 2, "%s", out);
	cr_expect(strstr(out, "q4khost serve: --host 'no-such-host.invalid': cannot be resolved to "
	                      "an address to listen on: ") == out, "%s", out);
	cr_expect_null(strstr(out, "nonexistent.gguf"), "%s", out);
	free(out);
}

/* A port in use is said before the model loads, with the port asked for. */
Test(first_run, serve_refuses_a_port_in_use_before_loading)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t alen = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char args[256], want[128], *out;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) && !listen(fd, 1) &&
	          !getsockname(fd, (struct sockaddr *)&a, &alen));
	snprintf(args, sizeof(args), "serve --port %d -m /nonexistent.gguf", ntohs(a.sin_port));
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 1, "%s", out);
	snprintf(want, sizeof(want), "q4khost serve: cannot listen on 127.0.0.1 port %d: ",
	         ntohs(a.sin_port));
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_null(strstr(out, "nonexistent.gguf"), "%s", out);
	free(out);
	close(fd);
}

/* A report or message lost to a full standard error fails the command
 * (as a lost standard output does): nothing can say so but the code. */
Test(first_run, a_report_lost_to_a_full_standard_error_is_a_failure)
{
	static const char *const stderr_to[][2] = {
		{ "/dev/full", "rc=1\n" },
		{ "/dev/null", "rc=0\n" }, /* the same run with its report readable */
	};
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], inner[16384], cmd[20000], *out;

	if (access("/dev/full", W_OK) != 0)
		cr_skip_test("no /dev/full here");
	snprintf(args, sizeof(args), "run -n 2 -m %s --plugin-path %s", tiny_model(), plugins);
	for (size_t i = 0; i < 2; i++) {
		snprintf(cmd, sizeof(cmd), "%s >/dev/null 2>%s; echo rc=$?",
		         test_q4khost_command("", test_tmpdir(), args, inner, sizeof(inner)),
		         stderr_to[i][0]);
		test_shell(cmd, &out);
		cr_expect_str_eq(out, stderr_to[i][1], "2>%s", stderr_to[i][0]);
		free(out);
	}
	/* the help says so */
	cr_expect_eq(test_q4khost("", test_tmpdir(), "--help", &out), 0, "%s", out);
	cr_expect(strstr(out, "1 failure (output that cannot be written, to\n            standard "
	                      "output or standard error, included)") != NULL, "%s", out);
	free(out);
}

/* qa names a case by its file and line once, after its name if it has one. */
Test(first_run, qa_names_a_case_by_file_and_line_once)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cases = file_with("cases.jsonl",
	                        "{\"prompt\": \"a b\", \"accept\": [\"x\"], \"max_tokens\": 2}\n"
	                        "{\"name\": \"named\", \"prompt\": \"a b\", \"accept\": [\"x\"], "
	                        "\"max_tokens\": 2}\n");
	char args[8192], want[8192], *out;

	snprintf(args, sizeof(args), "qa --cases %s -m %s --plugin-path %s", cases, tiny_model(),
	         plugins);
	test_q4khost("", test_tmpdir(), args, &out);
	snprintf(want, sizeof(want), "\ncase %s:1: ", cases);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want), "\ncase named (%s:2): ", cases);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_null(strstr(out, "(line "), "%s", out);
	free(out);
	snprintf(args, sizeof(args), "qa --json --cases %s -m %s --plugin-path %s", cases,
	         tiny_model(), plugins);
	test_q4khost("", test_tmpdir(), args, &out);
	cr_expect(strstr(out, "\"name\": null") != NULL, "no made-up name: %s", out);
	free(out);
	free(cases);
}

/* run --json: an error before the prompt runs, a usage error included,
 * is still one JSON object on stdout, of the shape of any other stop,
 * with the error. */
Test(first_run, run_json_errors_before_the_prompt_are_one_object)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	static const char *const cases[][3] = {
		{ "-m /nonexistent.gguf", "3", "/nonexistent.gguf: cannot open: " },
		{ "--f2 bogus", "2", "--f2: 'bogus' is not one of auto, fresh, off, require" },
		{ "--backend nope", "4", "--backend nope: no backend plugin of that name" },
		{ "-n 0", "2", "--n-predict must be a whole number in [1, " },
		{ "--bogus", "2", "unknown option '--bogus' (try q4khost run --help)" },
		{ "--raw --chat-template chatml", "2", "--raw and --chat-template chatml contradict" },
	};
	char args[8192], inner[16384], cmd[20000], *out;
	json_error_t jerr;
	json_t *j;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(args, sizeof(args), "run --json -n 1 -m %s --plugin-path %s %s", tiny_model(),
		         plugins, cases[i][0]);
		/* stdout alone */
		snprintf(cmd, sizeof(cmd), "%s 2>/dev/null; echo rc=$? >&2",
		         test_q4khost_command("", test_tmpdir(), args, inner, sizeof(inner)));
		test_shell(cmd, &out);
		cr_expect(strstr(out, "rc=") && atoi(strstr(out, "rc=") + 3) == atoi(cases[i][1]),
		          "%s: %s", args, out);
		*strstr(out, "rc=") = 0;
		j = json_loads(out, 0, &jerr);
		cr_assert_not_null(j, "%s: stdout is one JSON object (%s): %s", args, jerr.text, out);
		cr_expect_str_eq(json_string_value(json_object_get(j, "stop")), "error", "%s", args);
		cr_expect_str_eq(json_string_value(json_object_get(j, "text")), "", "%s", args);
		cr_expect(strstr(json_string_value(json_object_get(j, "error")), cases[i][2]) != NULL,
		          "%s: %s", args, out);
		json_decref(j);
		free(out);
	}
	/* "-p --json" is a prompt, not --json: the usage error alone */
	cr_expect_eq(test_q4khost("", test_tmpdir(), "run -p --json -n 0 2>/dev/null", &out), 2,
	             "%s", out);
	cr_expect_str_eq(out, "");
	free(out);
}

/* scripts/quickstart.sh in a copy of its folder whose stages are stubs:
 * PROMPT_ARG (shell words, maybe none) given, all it printed in *out. */
static int quickstart_with_stubs(const char *prompt_arg, char **out)
{
	const char *dir = test_tmpdir();
	char cmd[8192];

	snprintf(cmd, sizeof(cmd),
	         "set -e; mkdir -p %s/scripts %s/_prefix/bin %s/bin %s/_build/main; "
	         "cp %s/scripts/quickstart.sh %s/scripts/; "
	         "for s in install-deps build fetch-model; do printf '#!/bin/sh\\n' "
	         ">%s/scripts/$s.sh; done; "
	         "printf '#!/bin/sh\\n' >%s/bin/make; "
	         "printf '#!/bin/sh\\necho the text\\n' >%s/_prefix/bin/q4khost; "
	         "chmod +x %s/scripts/*.sh %s/bin/make %s/_prefix/bin/q4khost; "
	         "PATH=%s/bin:$PATH bash %s/scripts/quickstart.sh %s",
	         dir, dir, dir, dir, test_srcdir(), dir, dir, dir, dir, dir, dir, dir, dir, dir,
	         prompt_arg);
	return test_shell(cmd, out);
}

Test(first_run, the_quickstart_shows_the_prompt_before_the_text)
{
	char *out, *prompt, *text;

	cr_assert_eq(quickstart_with_stubs("", &out), 0, "%s", out);
	prompt = strstr(out, "quickstart: [5/5] generating 48 tokens after the prompt "
	                     "\"The three primary colors are\"");
	text = strstr(out, "the text\n");
	cr_expect(prompt && text && prompt < text, "%s", out);
	free(out);
	cr_assert_eq(quickstart_with_stubs("'Once upon a time'", &out), 0, "%s", out);
	cr_expect(strstr(out, "after the prompt \"Once upon a time\"") != NULL, "%s", out);
	free(out);
}

Test(first_run, a_run_says_how_it_sampled_in_its_report_and_its_json)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	const char *sampled = "run -n 4 --temp 0.8 --top-k 5 --top-p 0.9 --seed 42";
	char command[256], *out, *again;
	json_t *j, *s, *k;

	cr_expect_eq(q4khost_with("", "run -n 1 --json", NULL, plugins, "2>/dev/null", &out), 0,
	             "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(j, "sampling"), "mode")),
	                 "greedy", "%s", out);
	json_decref(j);
	free(out);
	cr_expect_eq(q4khost_with("", "run -n 1", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost: sampling: greedy\n") != NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", sampled, NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost: sampling: temperature 0.8, top-k 5, top-p 0.9, seed 42\n")
	                  != NULL, "%s", out);
	free(out);
	snprintf(command, sizeof(command), "%s --json", sampled);
	cr_expect_eq(q4khost_with("", command, NULL, plugins, "2>/dev/null", &out), 0, "%s", out);
	j = parse_json(out);
	s = json_object_get(j, "sampling");
	cr_expect_str_eq(json_string_value(json_object_get(s, "mode")), "sampled", "%s", out);
	cr_expect_eq(json_real_value(json_object_get(s, "temperature")), 0.8, "%s", out);
	cr_expect_eq(json_integer_value(json_object_get(s, "top_k")), 5, "%s", out);
	cr_expect_eq(json_real_value(json_object_get(s, "top_p")), 0.9, "%s", out);
	cr_expect_eq(json_integer_value(json_object_get(s, "seed")), 42, "%s", out);
	/* what the JSON says makes the same text again */
	snprintf(command, sizeof(command), "run -n 4 --json --temp %g --top-k %lld --top-p %g --seed %lld",
	         json_real_value(json_object_get(s, "temperature")),
	         (long long)json_integer_value(json_object_get(s, "top_k")),
	         json_real_value(json_object_get(s, "top_p")),
	         (long long)json_integer_value(json_object_get(s, "seed")));
	cr_expect_eq(q4khost_with("", command, NULL, plugins, "2>/dev/null", &again), 0, "%s", again);
	k = parse_json(again);
	cr_expect_str_eq(json_string_value(json_object_get(k, "text")),
	                 json_string_value(json_object_get(j, "text")), "%s\n%s", out, again);
	json_decref(k);
	json_decref(j);
	free(again);
	free(out);
}

/* --- issue 19e: the fifth trial's leftovers ------------------------------- */

/* The temperature is one range for run and serve, OpenAI's [0, 2]. */
Test(first_run, run_and_serve_take_one_temperature_range)
{
	static const char *const commands[] = { "run", "serve" };
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], want[256], *out;

	for (size_t i = 0; i < 2; i++) {
		snprintf(args, sizeof(args), "%s --temp 2.5 -m /nonexistent.gguf", commands[i]);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 2, "%s: %s", args, out);
		snprintf(want, sizeof(want), "q4khost %s: --temp must be a number in [0, 2], got "
		         "'2.5'\n", commands[i]);
		cr_expect_str_eq(out, want, "%s", args);
		free(out);
	}
	/* the top of the range is taken */
	cr_expect_eq(q4khost_with("", "run -n 1 --temp 2", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost: sampling: temperature 2, ") != NULL, "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("", test_tmpdir(), "run --help", &out), 0, "%s", out);
	cr_expect(strstr(out, "--temp T          sampling temperature, 0 to 2 (OpenAI's range") !=
	          NULL, "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("", test_tmpdir(), "serve --help", &out), 0, "%s", out);
	cr_expect(strstr(out, "T\n                          from 0 to 2, OpenAI's range, as run "
	                      "takes it\n") != NULL, "%s", out);
	free(out);
}

/* info takes its file as -m FILE too, as every other command does. */
Test(first_run, info_takes_the_model_as_m_too)
{
	char args[8192], *out;

	snprintf(args, sizeof(args), "info -m %s", tiny_model());
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "general.architecture") && strstr(out, "llama.context_length"),
	          "%s", out);
	free(out);
	snprintf(args, sizeof(args), "info --model %s %s", tiny_model(), tiny_model());
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 2, "%s", out);
	cr_expect_str_eq(out, "q4khost info: expected one model file, as FILE or -m FILE, found 2 "
	                      "(try q4khost info --help)\n");
	free(out);
}

/* qa names the line and column of a case that is no JSON, counted in the
 * file's line (indentation included) as an editor counts them. */
Test(first_run, qa_names_the_line_and_column_of_bad_json)
{
	static const char *const texts[][2] = {
		/* "accept" (a missing comma before it) ends at column 25 */
		{ "  {\"prompt\": \"a\" \"accept\": [\"x\"]}\n", ":1:25: '}' expected near '\"accept\"'\n" },
		/* cut short: the error is at the line's last character, 31;
		 * jansson's "end of file" is the end of the line it read */
		{ "{\"prompt\": \"a\", \"accept\": [\"x\"]}\n{\"prompt\": \"a\", \"accept\": [\"x\"]\n",
		  ":2:31: '}' expected near the end of the line (a case is one whole JSON object on "
		  "one line)\n" },
		/* line 1 cut short, more lines after it */
		{ "{\"prompt\": \"a\"\n{\"prompt\": \"a\", \"accept\": [\"x\"]}\n",
		  ":1:14: '}' expected near the end of the line (a case is one whole JSON object on "
		  "one line)\n" },
	};
	char args[8192], want[8192], *cases, *out;

	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		cases = file_with("bad.jsonl", texts[i][0]);
		snprintf(args, sizeof(args), "qa --cases %s -m %s", cases, tiny_model());
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
		snprintf(want, sizeof(want), "q4khost qa: %s%s", cases, texts[i][1]);
		cr_expect_str_eq(out, want, "case %zu", i);
		free(out);
		free(cases);
	}
}

/* A command's own file options, given '', are usage errors naming them,
 * not "'': cannot read" (exit 3). */
Test(first_run, an_empty_file_option_is_a_usage_error)
{
	static const char *const cases[][2] = {
		{ "qa --cases ''", "q4khost qa: --cases '': an empty value is not allowed; expected "
		                   "the path of a JSON Lines file of cases\n" },
		{ "serve --api-key-file '' -m /nonexistent.gguf",
		  "q4khost serve: --api-key-file '': an empty value is not allowed; expected the path "
		  "of a file whose first line is the API key\n" },
		{ "validate --one --backend cpu --kernel none --probe-ids ''",
		  "q4khost validate: --probe-ids '': an empty value is not allowed; expected the path "
		  "of a file of token ids\n" },
		{ "validate --one --backend cpu --kernel none --reference-logits ''",
		  "q4khost validate: --reference-logits '': an empty value is not allowed; expected "
		  "the path of a file in a folder the parent made\n" },
	};
	char *out;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_expect_eq(test_q4khost("", test_tmpdir(), cases[i][0], &out), 2, "%s: %s",
		             cases[i][0], out);
		cr_expect_str_eq(out, cases[i][1], "%s", cases[i][0]);
		free(out);
	}
	/* a folder given as the cases is named as one, not as "no cases" */
	cr_expect_eq(test_q4khost("", test_tmpdir(), "qa --cases / -m /nonexistent.gguf", &out), 3,
	             "%s", out);
	cr_expect_str_eq(out, "q4khost qa: /: cannot read: Is a directory\n");
	free(out);
}

/* The completion offers both names of the built-in kernels. */
Test(first_run, bash_completion_offers_built_in)
{
	char cmd[16384], *out;

	/* bash-completion's _init_completion stubbed: "q4khost run --kernel b<TAB>" */
	snprintf(cmd, sizeof(cmd),
	         "bash -c 'source %s/data/bash-completion/q4khost; _init_completion() { cur=b; "
	         "prev=--kernel; words=(%s/host/cli/q4khost run --kernel b); cword=3; }; "
	         "_q4khost; printf \"%%s\\n\" \"${COMPREPLY[@]}\"'",
	         test_srcdir(), test_builddir());
	cr_expect_eq(test_shell(cmd, &out), 0, "%s", out);
	cr_expect_str_eq(out, "built-in\n");
	free(out);
}

/* Every kernel variant the manual's examples name is one the q4khost
 * package installs (debian/q4khost.install's plugin patterns). */
Test(first_run, the_manual_examples_name_installed_plugins)
{
	char path[4200], line[512], *text, *at;
	size_t len;
	int named = 0;

	snprintf(path, sizeof(path), "%s/man/q4khost.1", test_builddir());
	text = test_read_file(path, &len);
	cr_assert_not_null(text, "%s", path);
	at = strstr(text, ".SH EXAMPLES");
	cr_assert_not_null(at);
	while ((at = strstr(at, "\\-\\-kernel "))) {
		char name[128], so[160];
		size_t n = 0;
		int installed = 0;
		FILE *f;

		at += strlen("\\-\\-kernel ");
		for (; *at && *at != '\n' && *at != ' ' && n + 1 < sizeof(name); at++)
			if (*at != '\\') /* "\-" is a hyphen */
				name[n++] = *at;
		name[n] = 0;
		snprintf(so, sizeof(so), "%s.so", name);
		snprintf(path, sizeof(path), "%s/debian/q4khost.install", test_srcdir());
		f = fopen(path, "r");
		cr_assert_not_null(f, "%s", path);
		while (fgets(line, sizeof(line), f)) {
			line[strcspn(line, "\n")] = 0;
			if (strstr(line, "/plugins-abi") && !fnmatch(strrchr(line, '/') + 1, so, 0))
				installed = 1;
		}
		fclose(f);
		cr_expect(installed, "man q4khost's example names %s, which q4khost does not install",
		          name);
		named++;
	}
	cr_expect_gt(named, 0, "the examples name a kernel variant");
	free(text);
}

/* With --json, an error is one JSON object on stdout ({"error": ...}, the
 * key run's carries it in) and its line on stderr, for info, validate,
 * bench and qa as for run; a usage error too. */
Test(first_run, json_errors_are_one_object_on_stdout)
{
	static const char *const cases[][3] = {
		{ "info --json /nonexistent.gguf", "3", "/nonexistent.gguf: cannot open: " },
		{ "info --json --bogus", "2", "unknown option '--bogus' (try q4khost info --help)" },
		{ "validate --json -m /nonexistent.gguf", "3", "/nonexistent.gguf: cannot open: " },
		{ "validate --json --bogus", "2", "unknown option '--bogus' (try q4khost validate" },
		{ "bench --json -m /nonexistent.gguf", "3", "/nonexistent.gguf: cannot open: " },
		{ "bench --json -m ''", "2", "--model '': an empty value is not allowed" },
		{ "qa --json --cases ''", "2", "--cases '': an empty value is not allowed" },
		{ "qa --json --cases /nonexistent.jsonl -m /nonexistent.gguf", "3", "/nonexistent.jsonl: cannot read: " },
	};
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[8192], inner[16384], cmd[20000], errfile[4200], *out, *err;
	json_error_t jerr;
	json_t *j;
	size_t len;

	snprintf(errfile, sizeof(errfile), "%s/stderr", test_tmpdir());
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		/* info reads no plugin */
		snprintf(args, sizeof(args), "%s%s%s", cases[i][0],
		         strncmp(cases[i][0], "info", 4) ? " --plugin-path " : "",
		         strncmp(cases[i][0], "info", 4) ? plugins : "");
		snprintf(cmd, sizeof(cmd), "%s 2>%s",
		         test_q4khost_command("", test_tmpdir(), args, inner, sizeof(inner)), errfile);
		cr_expect_eq(test_shell(cmd, &out), atoi(cases[i][1]), "%s: %s", args, out);
		j = json_loads(out, 0, &jerr);
		cr_assert_not_null(j, "%s: stdout is one JSON object (%s): %s", args, jerr.text, out);
		cr_expect_eq(strncmp(json_string_value(json_object_get(j, "error")), cases[i][2],
		                     strlen(cases[i][2])), 0, "%s: %s", args, out);
		err = test_read_file(errfile, &len);
		cr_assert_not_null(err);
		cr_expect(strstr(err, json_string_value(json_object_get(j, "error"))) != NULL &&
		                  !strncmp(err, "q4khost ", 8),
		          "%s: the human line on stderr: %s", args, err);
		json_decref(j);
		free(err);
		free(out);
	}
}

/* Q4KHOST_MODEL naming a folder is refused naming the variable, before
 * any plugin is scanned (exit 3, a bad model). */
Test(first_run, a_model_variable_naming_a_folder_names_the_variable)
{
	const char *folder = test_tmpdir();
	char env[4200], want[4400], *out;

	snprintf(env, sizeof(env), "Q4KHOST_MODEL=%s", folder);
	cr_expect_eq(test_q4khost(env, test_tmpdir(), "run -n 1 -p hi", &out), 3, "%s", out);
	snprintf(want, sizeof(want), "q4khost run: %s (from Q4KHOST_MODEL): expected a GGUF model "
	         "file, found a directory\n", folder);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

/* Filters that leave nothing to validate are no pass: the reason names the
 * filter, what it left out, and what the path has. */
Test(first_run, a_filter_that_leaves_no_candidate_says_which_and_fails, .timeout = 120)
{
	const char *only_cpu = test_plugin_dir((const char *const[]){ NULL });
	char plugins[8300], want[9000], *out;
	json_t *j;

	snprintf(plugins, sizeof(plugins), "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs",
	         test_builddir(), test_builddir());
	cr_expect_eq(q4khost_with("", "validate --backend cpu --kernel none", NULL, plugins, "",
	                          &out), 1, "%s", out);
	cr_expect(strstr(out, "(no candidates: --backend cpu --kernel none: cpu's built-in kernels "
	                      "are the reference F2 compares against, not a candidate; the "
	                      "candidates on this path: ") != NULL, "%s", out);
	cr_expect(strstr(out, "cpu-fast/built-in") != NULL, "%s", out);
	cr_expect_null(strstr(out, "no backend other than cpu"), "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "validate --backend cpu --kernel none --json", NULL, plugins,
	                          "2>/dev/null", &out), 1, "%s", out);
	j = parse_json(out);
	cr_expect(strstr(json_string_value(json_object_get(j, "not_applicable")),
	                 "--backend cpu --kernel none: cpu's built-in kernels are the reference") !=
	          NULL, "%s", out);
	json_decref(j);
	free(out);
	/* no filter: a path with nothing to judge is said truly, no failure */
	cr_expect_eq(q4khost_with("", "validate", NULL, only_cpu, "", &out), 0, "%s", out);
	snprintf(want, sizeof(want), "(no candidates: nothing to validate; the plugin path %s ",
	         only_cpu);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

/*
 * Every script answers --help with exit 0 in an empty environment, the
 * Python ones on a Python without its site packages (no NumPy, gguf-py or
 * llama-cpp-python): the README says so. A file without "#!" is a module
 * another script imports or a test runs, and is not executable.
 */
Test(first_run, every_script_answers_help_with_nothing_installed, .timeout = 300)
{
	const char *home = test_tmpdir();
	char dir[4200], path[4500], head[3] = "", cmd[9100], *out;
	struct dirent *e;
	DIR *d;
	int scripts = 0;

	snprintf(dir, sizeof(dir), "%s/scripts", test_srcdir());
	d = opendir(dir);
	cr_assert_not_null(d, "%s", dir);
	while ((e = readdir(d))) {
		const size_t n = strlen(e->d_name);
		const int python = n > 3 && !strcmp(e->d_name + n - 3, ".py");
		struct stat st;
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (e->d_name[0] == '.' || stat(path, &st) || !S_ISREG(st.st_mode))
			continue;
		cr_assert_not_null(f = fopen(path, "r"), "%s", path);
		head[0] = 0;
		cr_expect(fgets(head, sizeof(head), f) || feof(f), "%s", path);
		fclose(f);
		if (strcmp(head, "#!")) {
			cr_expect_eq(st.st_mode & 0111, 0, "%s: executable without a #! line", path);
			continue;
		}
		cr_expect_neq(st.st_mode & 0100, 0, "%s: a #! line but not executable", path);
		snprintf(cmd, sizeof(cmd), "cd %s && env -i PATH=/usr/bin:/bin HOME=%s %s %s --help",
		         home, home, python ? "python3 -S" : "", path);
		cr_expect_eq(test_shell(cmd, &out), 0, "%s --help: %s", path, out);
		cr_expect_gt(strlen(out), 40, "%s --help says what it does: %s", path, out);
		free(out);
		scripts++;
	}
	closedir(d);
	cr_expect_geq(scripts, 35, "the scripts found: %d", scripts);
}
