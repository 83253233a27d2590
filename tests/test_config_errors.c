/*
 * Leftovers of issue 19 (the first ten minutes of a new user: errors
 * always say why), through the real CLI (cli_rig.h): a config file or
 * variable whose mistake, or whose origin, was not named.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_rig.h"
#include "helpers.h"

Test(config_errors, a_missing_config_file_names_who_gave_it)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char extra[4400], env[4400], want[4400], *out;
	const char *dir = test_tmpdir();

	snprintf(extra, sizeof(extra), "-n 1 --config %s/none.ini", dir);
	cr_expect_eq(q4khost_with("", "run", NULL, plugins, extra, &out), 3, "%s", out);
	snprintf(want, sizeof(want),
	         "q4khost run: %s/none.ini: No such file or directory (from --config)\n", dir);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);

	snprintf(env, sizeof(env), "Q4KHOST_CONFIG=%s/none.ini", dir);
	cr_expect_eq(q4khost_with(env, "run", NULL, plugins, "-n 1", &out), 3, "%s", out);
	snprintf(want, sizeof(want),
	         "q4khost run: %s/none.ini: No such file or directory (from Q4KHOST_CONFIG)\n",
	         dir);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

/* A kernel list without the form of one is a bad setting (3), as any bad
 * environment value; a well-formed one naming nothing there is a request
 * no plugin can honour (4). */
Test(config_errors, a_malformed_kernel_variable_is_a_bad_setting)
{
	static const char *const commands[] = { "run -n 1", "validate" };
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char args[4400], *out;

	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		cr_expect_eq(q4khost_with("Q4KHOST_Q4K_KERNEL=,,", commands[i], NULL, plugins, "",
		                          &out), 3, "%s: %s", commands[i], out);
		cr_expect(strstr(out, ": Q4KHOST_Q4K_KERNEL: \",,\": an empty kernel name (expected "
		                      "a kernel variant, or none or built-in for the built-in "
		                      "kernels)\n") != NULL, "%s: %s", commands[i], out);
		free(out);
	}
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_Q4K_KERNEL==cpu-simd", test_tmpdir(), args, &out), 3,
	             "%s", out);
	cr_expect(strstr(out, "q4khost plugins: Q4KHOST_Q4K_KERNEL: \"=cpu-simd\": an entry has "
	                      "'=' but no device before it") != NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("Q4KHOST_Q4K_KERNEL=nope", "run -n 1", NULL, plugins, "", &out),
	             4, "%s", out);
	cr_expect(strstr(out, "q4khost run: Q4KHOST_Q4K_KERNEL: 'nope' is not a kernel variant on "
	                      "plugin path ") != NULL, "%s", out);
	free(out);
}

/* A key of [plugin.NAME] that plugin NAME never reads (a typo) is named
 * with the keys it does read and the one it is a slip of; its own keys and
 * the F2 rules are not. */
Test(config_errors, a_plugin_key_the_plugin_never_reads_is_warned_about)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cfg = file_with("typo.ini",
	                      "[plugin.cpu]\nthreads = 1\nthreds = 2\nf2_floor = 0.99\n");
	char extra[4400], args[8800], want[4400], *out;

	snprintf(want, sizeof(want), "%s:3: key 'threds' in section [plugin.cpu] is not read by "
	         "plugin cpu (it reads: threads); ignored; did you mean 'threads'?\n", cfg);
	snprintf(extra, sizeof(extra), "-n 1 --config %s", cfg);
	cr_expect_eq(q4khost_with("", "run", NULL, plugins, extra, &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost run: warning: ") != NULL && strstr(out, want) != NULL,
	          "%s", out);
	cr_expect_eq(count(out, "is not read by"), 1, "threads and f2_floor are read: %s", out);
	free(out);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost plugins: warning: ") != NULL && strstr(out, want) != NULL,
	          "%s", out);
	free(out);
	free(cfg);
}

/* "threads =" counts as unset, as docs/config.md says of every key: no
 * error, and plugins --explain says the default holds, not a blank. */
Test(config_errors, an_empty_value_is_the_default_and_explain_says_so)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *cfg = file_with("empty.ini", "[plugin.cpu]\nthreads =\n");
	char extra[4400], args[8800], want[4400], *out;

	snprintf(extra, sizeof(extra), "-n 1 --config %s", cfg);
	cr_expect_eq(q4khost_with("", "run", NULL, plugins, extra, &out), 0, "%s", out);
	cr_expect_null(strstr(out, "warning"), "%s", out);
	free(out);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "  cpu threads          (empty: the plugin's default)        "
	         "from %s:2 [plugin.cpu]\n", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	free(cfg);
}

/* validate and bench read Q4KHOST_F2_REQUIRE_DEEP as run and serve do: a
 * bad value is a bad setting (3); true makes validate measure the deep
 * probe, and bench judge its rows on it (with the receipt validate
 * wrote). */
Test(config_errors, validate_and_bench_take_require_deep_as_run_does, .timeout = 300)
{
	static const char *const commands[] = { "validate", "bench" };
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });
	const char *receipts = test_tmpdir(); /* one folder: bench finds validate's receipt */
	char want[1024], args[8800], *out;

	test_skip_under_sanitizers("two deep probes' arithmetic; test_validate's deep cases run "
	                           "the deep probe's code under the sanitizers");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		cr_expect_eq(q4khost_with("Q4KHOST_F2_REQUIRE_DEEP=maybe", commands[i], NULL, plugins,
		                          "", &out), 3, "%s: %s", commands[i], out);
		snprintf(want, sizeof(want), "q4khost %s: Q4KHOST_F2_REQUIRE_DEEP: require_deep "
		         "'maybe': expected 1, on, true, yes or 0, off, false, no (any case)",
		         commands[i]);
		cr_expect(strstr(out, want) != NULL, "%s", out);
		free(out);
	}
	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s --kernel cpu-q8act",
	         tiny_model(), plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2_REQUIRE_DEEP=true", receipts, args, &out), 0, "%s",
	             out);
	cr_expect(strstr(out, "F2 probe: deep probe: ") != NULL, "%s", out);
	cr_expect(strstr(out, " (require_deep = true at Q4KHOST_F2_REQUIRE_DEEP)\n") != NULL, "%s",
	          out);
	free(out);
	snprintf(args, sizeof(args), "bench -m %s --plugin-path %s --kernels cpu-q8act -n 2 -r 1 "
	         "--no-built-in", tiny_model(), plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2_REQUIRE_DEEP=true", receipts, args, &out), 0, "%s",
	             out);
	cr_expect(strstr(out, "; F2 auto (from default) on the deep probe (require_deep = true at "
	                      "Q4KHOST_F2_REQUIRE_DEEP)\n") != NULL, "%s", out);
	/* the deep probe's own receipt, not a deep one standing in for the
	 * built-in probe's ("deep receipt of"), nor a fresh measurement */
	cr_expect(strstr(out, "  receipt of ") != NULL, "%s", out);
	cr_expect_null(strstr(out, "fresh"), "%s", out);
	free(out);
}

/* An F2 floor is shown as it was set, never rounded: 0.995 is not 0.99
 * (below what was set), 0.9999 not 1.00; two decimals stay two. */
Test(config_errors, an_f2_floor_is_shown_as_set)
{
	/* a variant to be judged, for the explanation's floor line */
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });
	static const char *const floors[] = { "0.995", "0.9999", "0.95" };
	char text[64], args[8800], want[128], *cfg, *out;

	for (size_t i = 0; i < sizeof(floors) / sizeof(*floors); i++) {
		snprintf(text, sizeof(text), "[f2]\nf2_floor = %s\n", floors[i]);
		cfg = file_with("floor.ini", text);
		snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins,
		         cfg);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
		snprintf(want, sizeof(want), "F2 acceptance floor %s (from ", floors[i]);
		cr_expect(strstr(out, want) != NULL, "%s", out);
		free(out);
		free(cfg);
	}
}

/* The "F2 acceptance floor" line plugins --explain prints under chain step
 * LABEL ("cpu/cpu-q8act"), up to its comma, into BUF. */
static const char *floor_line(const char *out, const char *label, char *buf, size_t cap)
{
	const char *at = strstr(out, label), *line = at ? strstr(at, "F2 acceptance floor ") : NULL;

	cr_assert_not_null(line, "no floor under %s: %s", label, out);
	snprintf(buf, cap, "%.*s", (int)strcspn(line, ",\n"), line);
	return buf;
}

/* docs/f2.md, "Floors that follow the arithmetic": a path is judged at
 * its class's floor, from the plugins' own declarations, unless f2_floor
 * names one ([plugin.NAME] over [f2]), above or below the class's. */
Test(config_errors, a_path_is_judged_at_its_class_floor_unless_a_setting_names_one)
{
	const char *plugins =
		test_plugin_dir((const char *const[]){ "cpu_q8act", "defect_noisy", NULL });
	char *cfg = file_with("floors.ini", "[f2]\nf2_floor = 0.97\n[plugin.cpu-q8act]\n"
	                                    "f2_floor = 0.95\n");
	char args[8800], line[256], want[4400], *out;

	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect_str_eq(floor_line(out, "cpu/cpu-q8act", line, sizeof(line)),
	                 "F2 acceptance floor 0.99 (from the int8 arithmetic class)");
	cr_expect_str_eq(floor_line(out, "cpu/defect-noisy", line, sizeof(line)),
	                 "F2 acceptance floor 0.99999 (from the f32 arithmetic class)");
	free(out);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins,
	         cfg);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "F2 acceptance floor 0.95 (from %s:4 [plugin.cpu-q8act])",
	         cfg);
	cr_expect_str_eq(floor_line(out, "cpu/cpu-q8act", line, sizeof(line)), want);
	snprintf(want, sizeof(want), "F2 acceptance floor 0.97 (from %s:2 [f2])", cfg);
	cr_expect_str_eq(floor_line(out, "cpu/defect-noisy", line, sizeof(line)), want);
	free(out);
	free(cfg);
}

/* A [plugin.NAME] section whose NAME is no plugin on the path (a typo) is
 * named with file, line, the plugins there and the nearest name; a
 * warning only, once per section, as another machine's path may have it. */
Test(config_errors, a_plugin_section_no_plugin_has_is_warned_about)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });
	char *cfg = file_with("sections.ini", "[plugin.cpu_q8act]\nx = 1\ny = 2\n"
	                                      "[plugin.nosuchplugin]\nz = 3\n[plugin.cpu]\nthreads = 1\n");
	char extra[4400], want[8800], *out;

	snprintf(extra, sizeof(extra), "-n 1 --config %s", cfg);
	cr_expect_eq(q4khost_with("", "run", NULL, plugins, extra, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "q4khost run: warning: %s:2: section [plugin.cpu_q8act] names no "
	         "plugin on the plugin path %s, so its keys are not read here (plugins there: ",
	         cfg, plugins);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect(strstr(out, "); did you mean [plugin.cpu-q8act]?\n") != NULL, "%s", out);
	snprintf(want, sizeof(want), "%s:5: section [plugin.nosuchplugin] names no plugin", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_eq(count(out, "names no plugin"), 2, "once per section: %s", out);
	cr_expect_eq(count(out, "did you mean"), 1, "nosuchplugin is near nothing: %s", out);
	free(out);
	free(cfg);
}

/* validate reads Q4KHOST_F2 as run and bench do when --f2 is not given:
 * fresh measures again past a valid receipt (and says the variable asked),
 * --f2 wins over it, and off, which would have validate not measure, is
 * a bad setting that names the variable. */
Test(config_errors, validate_takes_its_mode_from_q4khost_f2)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });
	const char *receipts = test_tmpdir();
	char args[8800], *out;

	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s", tiny_model(), plugins);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("Q4KHOST_F2=fresh", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "fresh: Q4KHOST_F2=fresh") != NULL, "measured again: %s", out);
	free(out);
	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s --f2 auto", tiny_model(),
	         plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2=fresh", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "receipt of ") != NULL, "--f2 wins: %s", out);
	free(out);
	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s", tiny_model(), plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2=off", receipts, args, &out), 3, "%s", out);
	cr_expect(strstr(out, "q4khost validate: Q4KHOST_F2=off: validate measures F2 and takes "
	                      "auto (use valid receipts) or fresh (measure again)") != NULL,
	          "%s", out);
	free(out);
}
