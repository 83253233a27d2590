/*
 * What a new user meets first, through the real CLI: errors that always
 * say why (a missing reference plugin, a plugin rejected for its mode
 * named with its fix wherever it is missed, a bad [plugin.cpu] threads with
 * its file and line, a variant without its backend failing validate, an
 * F2 floor below the catastrophic one refused as a bad file, a UTF-8 BOM
 * named), reports that say what really ran (the device, where F2 was
 * turned off), and no noise: notes for empty and repeated plugin-path
 * entries, a shadowed copy never loaded, warnings for a selector that
 * matches no device and a context beyond training, info on the default
 * model, --help pointing at installed files, progress only on a terminal,
 * and no CUDA driver line on a machine without a driver.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_rig.h"
#include "helpers.h"

#define SHORT_PROBE "[f2]\nf2_probe_tokens = 16\n"

/* The same as test_q4khost on a terminal: script(1) gives it a pty. */
static int q4khost_on_a_terminal(const char *receipts, const char *args, char **out)
{
	char inner[24576], cmd[32768];

	snprintf(cmd, sizeof(cmd), "script -qec \"%s\" /dev/null",
	         test_q4khost_command("", receipts, args, inner, sizeof(inner)));
	return test_shell(cmd, out);
}

/* A plugin folder holding only the test plugins NAMES (no reference). */
static const char *folder_without_cpu(const char *const *names)
{
	const char *dir = test_tmpdir();
	char cmd[8192];

	for (; *names; names++) {
		snprintf(cmd, sizeof(cmd), "cp %s/tests/plugins/.libs/%s.so %s/", test_builddir(),
		         *names, dir);
		cr_assert_eq(system(cmd), 0, "%s", cmd);
	}
	return dir;
}

/* --- errors that say why ------------------------------------------------- */

Test(diagnostics, a_missing_reference_plugin_is_named)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = folder_without_cpu(names);
	char want[8192], *out;

	cr_expect_eq(q4khost_with("", "run -n 1", NULL, plugins, "", &out), 4, "%s", out);
	snprintf(want, sizeof(want),
	         "q4khost run: no backend plugin on the plugin path %s (from --plugin-path): "
	         "the reference cpu plugin (cpu.so) is not there",
	         plugins);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	/* A folder of the path that was skipped is why: its note says so. */
	cr_expect_eq(q4khost_with("", "run -n 1", NULL, "relative/plugins", "", &out), 4, "%s", out);
	cr_expect(strstr(out, "the reference cpu plugin (cpu.so) is not there; the path's notes: "
	                      "relative/plugins: skipped: a relative folder would depend on the "
	                      "current directory; q4khost plugins lists what is\n") != NULL,
	          "%s", out);
	free(out);
	/* There, but refused: the refusal is the reason. */
	plugins = test_plugin_dir((const char *const[]){ NULL });
	cr_assert_eq(chmod(plugins, 0757), 0);
	cr_expect_eq(q4khost_with("", "run -n 1", NULL, plugins, "", &out), 4, "%s", out);
	snprintf(want, sizeof(want),
	         "the reference cpu plugin %s/cpu.so was rejected: refused: the folder %s is "
	         "writable by others (mode 0757; fix: chmod o-w %s)",
	         plugins, plugins, plugins);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

/* A copy of the built plugin NAME (plugins/NAME/.libs/NAME.so) in DIR, mode MODE. */
static void copy_built_plugin(const char *dir, const char *name, mode_t mode)
{
	char cmd[8192], path[4200];

	snprintf(cmd, sizeof(cmd), "cp %s/plugins/%s/.libs/%s.so %s/", test_builddir(), name, name,
	         dir);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(path, sizeof(path), "%s/%s.so", dir, name);
	cr_assert_eq(chmod(path, mode), 0, "%s", path);
}

/* "P/NAME.so was rejected: refused: the file P/NAME.so is writable by
 * others (mode 0646; fix: chmod o-w P/NAME.so)" into BUF. */
static const char *rejected_for_mode(const char *dir, const char *name, char *buf, size_t cap)
{
	snprintf(buf, cap,
	         "%s/%s.so was rejected: refused: the file %s/%s.so is writable by others "
	         "(mode 0646; fix: chmod o-w %s/%s.so)",
	         dir, name, dir, name, dir, name);
	return buf;
}

/* q4khost COMMAND on PLUGINS exits with STATUS and says WANT. */
static void expect_says(const char *command, const char *plugins, int status, const char *want)
{
	char *out;

	cr_expect_eq(q4khost_with("", command, NULL, plugins, "", &out), status, "%s: %s",
	             command, out);
	cr_expect(strstr(out, want) != NULL, "%s: wanted %s in: %s", command, want, out);
	free(out);
}

Test(diagnostics, a_plugin_rejected_for_its_mode_is_named_with_the_fix_where_it_is_missed)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char cpu[4200], want[16384], why[8192];

	cr_assert_eq(chmod(plugins, 0755), 0);
	copy_built_plugin(plugins, "cpu-fast", 0755);
	copy_built_plugin(plugins, "cpu-simd", 0755);
	snprintf(cpu, sizeof(cpu), "%s/cpu.so", plugins);
	cr_assert_eq(chmod(cpu, 0646), 0);
	rejected_for_mode(plugins, "cpu", why, sizeof(why));
	/* cpu-fast serves, but F2 needs the reference */
	snprintf(want, sizeof(want), "plugin cpu is not available on the plugin path %s: %s\n",
	         plugins, why);
	expect_says("run -n 1", plugins, 4, want);
	snprintf(want, sizeof(want),
	         "the reference cpu plugin is not on the plugin path %s (from --plugin-path): "
	         "nothing can be measured against it (F2.4); %s\n",
	         plugins, why);
	expect_says("validate", plugins, 1, want);
	snprintf(want, sizeof(want),
	         "--backend cpu: no backend plugin of that name on the plugin path %s "
	         "(from --plugin-path): %s; the backends there: cpu-fast",
	         plugins, why);
	expect_says("run -n 1 --backend cpu", plugins, 4, want);
	/* a kernel variant: and the list of valid ones names the built-in once */
	cr_assert_eq(chmod(cpu, 0755), 0);
	snprintf(cpu, sizeof(cpu), "%s/cpu-simd.so", plugins);
	cr_assert_eq(chmod(cpu, 0646), 0);
	snprintf(want, sizeof(want),
	         "--kernel: 'cpu-simd' is not a kernel variant on plugin path %s (--plugin-path): "
	         "%s; valid: none, built-in\n",
	         plugins, rejected_for_mode(plugins, "cpu-simd", why, sizeof(why)));
	expect_says("run -n 1 --kernel cpu-simd", plugins, 4, want);
	/* not asked for: the report says why its kernels are not used */
	snprintf(want, sizeof(want), "q4khost: rejected plugin cpu-simd (%s/cpu-simd.so): %s\n",
	         plugins, strstr(why, "refused: "));
	expect_says("run -n 1", plugins, 0, want);
}

Test(diagnostics, validate_fails_when_a_variant_cannot_be_measured)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = folder_without_cpu(names);
	char *out;
	json_t *j;

	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, "", &out), 1,
	             "a broken install fails: %s", out);
	cr_expect(strstr(out, "cannot be measured:\n") != NULL, "%s", out);
	cr_expect(strstr(out, "the reference cpu plugin is not on the plugin path") != NULL, "%s",
	          out);
	cr_expect(strstr(out, "cpu/cpu-q8act: its backend cpu is not on the plugin path") != NULL,
	          "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "validate --json", NULL, plugins, "", &out), 1, "%s", out);
	j = parse_json(out);
	cr_expect_eq(json_array_size(json_object_get(j, "unmeasurable")), 2, "%s", out);
	json_decref(j);
	free(out);
}

Test(diagnostics, validate_one_that_measures_nothing_says_why_once_and_fails)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none);
	char *out;

	cr_expect_eq(q4khost_with("", "validate --one --backend cpu --device 3 --kernel none", NULL,
	                          plugins, "", &out),
	             1, "%s", out);
	cr_expect_str_eq(out, "q4khost validate: cpu/built-in on device 3: not measured: the "
	                      "candidate could not start (F2.4): cpu: no device 3 (the backend "
	                      "has 1); no receipt written\n");
	free(out);
	/* A guard's child: no receipt, and why as its one line on stderr,
	 * the last, which the guard takes as the verdict's message (F2.4). */
	cr_expect_eq(q4khost_with("", "validate --one --quiet --backend cpu --device 3 --kernel none",
	                          NULL, plugins, "", &out),
	             0, "%s", out);
	cr_expect_str_eq(out, "not measured: the candidate could not start (F2.4): cpu: no device "
	                      "3 (the backend has 1)\n");
	free(out);
}

Test(diagnostics, a_bad_cpu_threads_setting_names_its_file_line_and_key)
{
	static const char *const none[] = { NULL };
	static const char *const values[] = { "0", "999", "abc" };
	static const char *const commands[] = { "run -n 1", "validate", "bench -n 1" };
	const char *plugins = test_plugin_dir(none);
	char want[8192], text[64], config[4300], *out, *cfg;

	for (int i = 0; i < 3; i++) {
		snprintf(text, sizeof(text), "[plugin.cpu]\nthreads = %s\n", values[i]);
		cfg = file_with("threads.ini", text);
		snprintf(config, sizeof(config), "--config %s", cfg);
		/* Checked by the plugin, exit 3 as for a value the host checks;
		 * every command alike. */
		for (int c = 0; c < 3; c++) {
			cr_expect_eq(q4khost_with("", commands[c], NULL, plugins, config, &out), 3,
			             "%s: %s", commands[c], out);
			snprintf(want, sizeof(want),
			         "plugin cpu refuses its settings: [plugin.cpu] threads = \"%s\": ",
			         values[i]);
			cr_expect(strstr(out, want) != NULL, "%s: %s", commands[c], out);
			/* one sentence: neither the plugin's name nor the value twice */
			cr_expect_null(strstr(out, "cpu: [plugin.cpu]"), "%s: %s", commands[c], out);
			snprintf(want, sizeof(want), " (threads from %s:2 [plugin.cpu])\n", cfg);
			cr_expect(strstr(out, want) != NULL, "threads = %s: %s", values[i], out);
			free(out);
		}
		/* a plan is made of the settings run takes: explain refuses alike */
		{
			char args[8800];

			snprintf(args, sizeof(args), "plugins --explain --plugin-path %s %s", plugins,
			         config);
			cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
		}
		snprintf(want, sizeof(want),
		         "q4khost plugins: plugin cpu refuses its settings: [plugin.cpu] threads = "
		         "\"%s\": ", values[i]);
		cr_expect(strstr(out, want) != NULL, "explain: %s", out);
		snprintf(want, sizeof(want), " (threads from %s:2 [plugin.cpu])\n", cfg);
		cr_expect(strstr(out, want) != NULL, "explain: %s", out);
		cr_expect_null(strstr(out, "F2 mode"), "no plan: %s", out);
		free(out);
		free(cfg);
	}
}

Test(diagnostics, an_f2_floor_below_the_catastrophic_one_is_a_bad_file, .timeout = 120)
{
	static const char *const commands[] = { "run -n 1", "validate", "bench -n 1" };
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names);
	char *cfg = file_with("floor.ini", "[f2]\nf2_floor = 0.5\n");
	char want[8192], config[4300], *out;

	snprintf(config, sizeof(config), "--config %s", cfg);
	snprintf(want, sizeof(want), "%s:2 [f2]: f2_floor = \"0.5\": expected a number in [0.9, 1]",
	         cfg);
	for (int i = 0; i < 3; i++) {
		cr_expect_eq(q4khost_with("", commands[i], NULL, plugins, config, &out), 3, "%s: %s",
		             commands[i], out);
		cr_expect(strstr(out, want) != NULL, "%s: %s", commands[i], out);
		free(out);
	}
	free(cfg);
}
Test(diagnostics, a_receipt_folder_that_cannot_be_written_is_a_bad_setting_said_once)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names);
	char *file = file_with("not-a-folder", "x\n");
	char *cfg, env[8192], config[8192], want[8192], text[8192], *out;

	/* Set by the variable: a file, and a folder that would be under one. */
	for (int i = 0; i < 2; i++) {
		snprintf(env, sizeof(env), "Q4KHOST_F2_RECEIPT_DIR=%s%s", file, i ? "/f2/sub" : "");
		cr_expect_eq(q4khost_with(env, "run -n 1", NULL, plugins, "", &out), 3, "%s", out);
		snprintf(want, sizeof(want),
		         "q4khost run: Q4KHOST_F2_RECEIPT_DIR=%s%s: F2 cannot keep its receipts "
		         "there: %sNot a directory\n",
		         file, i ? "/f2/sub" : "", i ? "cannot create it: " : "");
		cr_expect_str_eq(out, want);
		free(out);
	}
	/* Set in a file: the file and line; validate and bench alike. */
	snprintf(text, sizeof(text), "[f2]\nreceipt_dir = %s\n", file);
	cfg = file_with("receipts.ini", text);
	snprintf(config, sizeof(config), "--config %s", cfg);
	snprintf(want, sizeof(want),
	         "%s:2 [f2]: receipt_dir = \"%s\": F2 cannot keep its receipts there: Not a directory\n",
	         cfg, file);
	for (int i = 0; i < 2; i++) {
		cr_expect_eq(q4khost_with("Q4KHOST_F2_RECEIPT_DIR=", i ? "bench -n 1" : "validate", NULL,
		                          plugins, config, &out),
		             3, "%s", out);
		cr_expect(strstr(out, want) != NULL, "%s", out);
		cr_expect_eq(count(out, "\n"), 1, "said once, alone: %s", out);
		free(out);
	}
	/* A folder not there yet, under one that may be written: fine. */
	snprintf(env, sizeof(env), "Q4KHOST_F2_RECEIPT_DIR=%s/new/f2", test_tmpdir());
	cr_expect_eq(q4khost_with(env, "run -n 1", NULL, plugins, "", &out), 0, "%s", out);
	free(out);
	free(cfg);
	free(file);
}

Test(diagnostics, a_receipt_folder_without_write_permission_is_named_with_why)
{
	char dir[4200], env[8192], want[8192], *out;
	/* a variant: the run may need a receipt */
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });

	if (geteuid() == 0)
		cr_skip_test("root may write in any folder");
	snprintf(dir, sizeof(dir), "%s/read-only", test_tmpdir());
	cr_assert_eq(mkdir(dir, 0555), 0);
	snprintf(env, sizeof(env), "Q4KHOST_F2_RECEIPT_DIR=%s/f2", dir);
	cr_expect_eq(q4khost_with(env, "run -n 1", NULL, plugins, "", &out), 3, "%s", out);
	snprintf(want, sizeof(want),
	         "q4khost run: Q4KHOST_F2_RECEIPT_DIR=%s/f2: F2 cannot keep its receipts there: "
	         "cannot create it: Permission denied\n",
	         dir);
	cr_expect_str_eq(out, want);
	free(out);
}

Test(diagnostics, a_utf8_bom_is_named_not_quoted)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none), *receipts = test_tmpdir();
	char *cfg = file_with("bom.ini", "\xef\xbb\xbf[plugin.cpu]\nthreads = 2\n");
	char args[8192], want[8192], *out;

	snprintf(args, sizeof(args), "plugins --plugin-path %s --config %s", plugins, cfg);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 3, "%s", out);
	snprintf(want, sizeof(want),
	         "%s:1: the file starts with a UTF-8 byte order mark (bytes EF BB BF)", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_null(strstr(out, "\xef\xbb\xbf"), "no invisible bytes in the message");
	free(out);
	free(cfg);
}

/* --- the report says what really ran ------------------------------------ */

Test(diagnostics, a_device_no_backend_has_is_refused)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none);
	char *out;
	json_t *j;

	cr_expect_eq(q4khost_with("", "run -n 1 --device 3", NULL, plugins, "", &out), 4, "%s", out);
	cr_expect(strstr(out, "no backend has a device 3; cpu has 1 device; q4khost plugins lists "
	                      "the devices\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, "device 3:"), "nothing ran on, or is reported as, device 3");
	free(out);
	cr_assert_eq(q4khost_with("", "run -n 1 --json", NULL, plugins, "", &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "device"), "index")), 0);
	json_decref(j);
	free(out);
}

/* The commands that filter by --device refuse a device no backend has as
 * run does, and bench on a path without the reference says what run says. */
Test(diagnostics, every_command_refuses_a_device_no_backend_has_as_run_does)
{
	static const char *const none[] = { NULL }, *const q8act[] = { "cpu_q8act", NULL };
	static const char *const commands[] = { "qa --cases %s/tests/fixtures/qa-cases.jsonl",
		                                "validate", "bench -n 2 -r 1" };
	const char *plugins = test_plugin_dir(none);
	char command[4200], args[4600], *out;

	for (size_t i = 0; i < sizeof(commands) / sizeof(*commands); i++) {
		snprintf(command, sizeof(command), commands[i], test_srcdir());
		snprintf(args, sizeof(args), "%s --device 3", command);
		cr_expect_eq(q4khost_with("", args, NULL, plugins, "", &out), 4, "%s: %s", args, out);
		cr_expect(strstr(out, "no backend has a device 3; cpu has 1 device; q4khost plugins "
		                      "lists the devices\n") != NULL, "%s: %s", args, out);
		cr_expect_null(strstr(out, "passed"), "%s: %s", args, out);
		free(out);
		snprintf(args, sizeof(args), "%s --device 3 --backend cpu", command);
		cr_expect_eq(q4khost_with("", args, NULL, plugins, "", &out), 4, "%s: %s", args, out);
		cr_expect(strstr(out, "backend cpu has no device 3 (it has 1)") != NULL, "%s: %s", args,
		          out);
		free(out);
	}
	plugins = folder_without_cpu(q8act);
	cr_expect_eq(q4khost_with("", "bench -n 2", NULL, plugins, "", &out), 4, "%s", out);
	snprintf(args, sizeof(args),
	         "q4khost bench: no backend plugin on the plugin path %s (from --plugin-path): "
	         "the reference cpu plugin (cpu.so) is not there; q4khost plugins lists what is\n",
	         plugins);
	cr_expect(strstr(out, args) != NULL, "%s", out);
	free(out);
}

Test(diagnostics, f2_off_names_where_it_was_turned_off)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names);
	const char *model = test_model_path(); /* Q4_K weights, for cpu-q8act */
	char *cfg = file_with("off.ini", "[f2]\nmode = off\n");
	char want[8192], config[4300], *out;
	json_t *j;

	cr_assert_eq(q4khost_with("Q4KHOST_F2=off", "run -n 1 --kernel cpu-q8act", model, plugins, "",
	                          &out),
	             0, "%s", out);
	cr_expect(strstr(out, "F2: off (Q4KHOST_F2=off): F2 IS OFF: cpu/cpu-q8act serves unverified") != NULL,
	          "%s", out);
	cr_expect_null(strstr(out, "--f2 off"), "%s", out);
	free(out);
	snprintf(config, sizeof(config), "--config %s", cfg);
	cr_assert_eq(q4khost_with("", "run -n 1 --json --kernel cpu-q8act", model, plugins, config,
	                          &out),
	             0, "%s", out);
	j = parse_json(out);
	snprintf(want, sizeof(want), "mode = off at %s:2 [f2]", cfg);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(j, "f2"), "source")), want);
	json_decref(j);
	free(out);
	free(cfg);
}

Test(diagnostics, counts_of_one_are_singular_and_no_driver_is_named_as_none)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none);
	char args[8192], *out;

	cr_assert_eq(q4khost_with("", "run -n 1 -p a --threads 1", NULL, plugins, "", &out), 0, "%s",
	             out);
	cr_expect(strstr(out, "q4khost: device 0: cpu (1 thread), uuid cpu") != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost: steps: op by op (1 step, 0 replays of 0 recordings)") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "; decode 1 token in ") != NULL, "%s", out);
	free(out);
	cr_assert_eq(q4khost_with("", "run -n 2 -p a --threads 2", NULL, plugins, "", &out), 0, "%s",
	             out);
	cr_expect(strstr(out, "cpu (2 threads)") != NULL && strstr(out, "(2 steps, ") != NULL &&
	                  strstr(out, "; decode 2 tokens in ") != NULL,
	          "%s", out);
	free(out);
	/* The cpu backend has no driver version: the line names none. */
	snprintf(args, sizeof(args),
	         "bench-kernels --backend cpu --shapes gemma3-270m --types Q4_K --max-batch 1 "
	         "--min-mib 1 --repeat 1 --kernels '' --plugin-path %s",
	         plugins);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "device cpu (") != NULL && strstr(out, ", uuid cpu, arch ") != NULL &&
	                  strstr(out, "; timing: ") != NULL,
	          "%s", out);
	cr_expect_null(strstr(out, "driver"), "%s", out);
	/* one column: no empty range of batches in the header */
	cr_expect_null(strstr(out, "batch 2..1"), "%s", out);
	cr_expect(strstr(out, "| no batches (--max-batch 1) | b1/b1 NMSE\n") != NULL, "%s", out);
	free(out);
}

/* --- no noise, and no silence ---------------------------------------------- */

Test(diagnostics, a_selector_for_no_device_is_warned_about)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names);
	char args[8192], *out;

	snprintf(args, sizeof(args), "plugins --explain --kernel 5=cpu-q8act,cpu=none --plugin-path %s",
	         plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost plugins: warning: kernel selectors that match no device here, "
	                      "their entries ignored: --kernel: '5'") != NULL,
	          "%s", out);
	cr_expect_null(strstr(out, "'cpu'"), "a selector that matches is no mistake: %s", out);
	free(out);
	cr_expect_eq(q4khost_with("Q4KHOST_Q4K_KERNEL=5=cpu-q8act Q4KHOST_F2=off", "run -n 1",
	                          test_model_path(), plugins, "", &out),
	             0, "%s", out);
	cr_expect(strstr(out, "q4khost run: warning: kernel selectors that match no device here, "
	                      "their entries ignored: Q4KHOST_Q4K_KERNEL: '5'") != NULL,
	          "%s", out);
	free(out);
}

Test(diagnostics, a_context_beyond_training_is_warned_about)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none);
	char *out;

	cr_expect_eq(q4khost_with("", "run -n 1 -c 4096", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost run: warning: --ctx 4096 is above the 2048 tokens the model "
	                      "was trained on (llama.context_length)") != NULL,
	          "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "run -n 1 -c 2048", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect_null(strstr(out, "warning"), "%s", out);
	free(out);
}

/*
 * A name ending in .so that is no plugin file is listed as skipped with
 * why, not passed over without a word: a symbolic link whose target is
 * gone, and a folder.
 */
Test(diagnostics, a_dangling_link_in_the_plugin_folder_is_listed_as_skipped)
{
	const char *dir = test_plugin_dir((const char *const[]){ NULL }), *gone = test_tmpdir();
	char cmd[8192], args[8192], want[8192], *out;
	json_t *j;

	snprintf(cmd, sizeof(cmd), "ln -s %s/gone/cuda.so %s/cuda.so && mkdir %s/odd.so", gone,
	         dir, dir);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(want, sizeof(want),
	         "%s/cuda.so: skipped: a symbolic link to %s/gone/cuda.so, which does not exist\n"
	         "%s/odd.so: skipped: not a regular file\n",
	         dir, gone, dir);
	snprintf(args, sizeof(args), "plugins --json --plugin-path %s", dir);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(json_string_value(json_object_get(j, "path_notes")), want);
	json_decref(j);
	free(out);
	snprintf(args, sizeof(args), "plugins --plugin-path %s", dir);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	snprintf(want, sizeof(want), "  note:      %s/cuda.so: skipped: a symbolic link to ", dir);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
}

Test(diagnostics, the_plugin_path_notes_empty_and_repeated_entries)
{
	const char *top = test_tmpdir(), *receipts = test_tmpdir();
	char a[1024], b[1024], link[1024], loads[1024], cmd[16384], args[8192], want[8192];
	char env[1100], *out, *count;
	json_t *j, *p;
	size_t i;

	snprintf(a, sizeof(a), "%s/a", top);
	snprintf(b, sizeof(b), "%s/b", top);
	snprintf(link, sizeof(link), "%s/link", top);
	snprintf(loads, sizeof(loads), "%s/loads.txt", top);
	/* kernel_ok.so in a, a copy in b, and in b a link to a's by another name. */
	snprintf(cmd, sizeof(cmd),
	         "mkdir -m 755 %s %s && cp %s/tests/plugins/.libs/kernel_ok.so %s/ && "
	         "cp %s/kernel_ok.so %s/ && ln -s %s/kernel_ok.so %s/other.so && ln -s %s %s",
	         a, b, test_builddir(), a, a, b, a, b, a, link);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(args, sizeof(args), "plugins --json --plugin-path '%s::%s/:%s:%s:'", a, a, link, b);
	snprintf(env, sizeof(env), "Q4KH_TEST_LOADS=%s", loads);
	cr_assert_eq(test_q4khost(env, receipts, args, &out), 0, "%s", out);
	j = parse_json(out);
	snprintf(want, sizeof(want),
	         "entry 2 (empty): skipped: an empty entry never means the current folder\n"
	         "%s/: skipped: the same folder as %s, listed earlier in the path\n"
	         "%s: skipped: the same folder as %s, listed earlier in the path\n"
	         "entry 6 (empty): skipped: an empty entry never means the current folder\n",
	         a, a, link, a);
	cr_expect_str_eq(json_string_value(json_object_get(j, "path_notes")), want);
	cr_expect_eq(json_array_size(json_object_get(j, "plugins")), 3, "%s", out);
	json_array_foreach(json_object_get(j, "plugins"), i, p) {
		const char *state = json_string_value(json_object_get(p, "state"));
		cr_expect_str_eq(state, i == 0 ? "accepted" : "shadowed", "%s",
		                 json_string_value(json_object_get(p, "path")));
	}
	json_decref(j);
	free(out);
	/* Only the plugin that serves was loaded: copies ran no constructor. */
	snprintf(cmd, sizeof(cmd), "grep -c loaded %s", loads);
	test_shell(cmd, &count);
	cr_expect_str_eq(count, "1\n", "dlopen()s of kernel_ok.so");
	free(count);
}

Test(diagnostics, info_without_a_file_reads_the_default_model)
{
	const char *receipts = test_tmpdir(), *empty = test_tmpdir();
	char env[8192], *out;

	snprintf(env, sizeof(env), "Q4KHOST_MODEL=%s", tiny_model());
	cr_expect_eq(test_q4khost(env, receipts, "info", &out), 0, "%s", out);
	cr_expect(strstr(out, "llama.context_length") != NULL, "%s", out);
	free(out);
	snprintf(env, sizeof(env), "Q4KHOST_MODEL= XDG_CACHE_HOME=%s", empty); /* empty: unset */
	cr_expect_eq(test_q4khost(env, receipts, "info", &out), 3, "%s", out);
	/* The hint names a script that is there by its absolute path (a
	 * command to paste anywhere): the installed one, or the source tree's
	 * when this build was not installed. */
	{
		char script[4200];
		const char *hint = strstr(out, "no such file (the default model: fetch it with ");

		cr_assert_not_null(hint, "%s", out);
		hint += strlen("no such file (the default model: fetch it with ");
		snprintf(script, sizeof(script), "%.*s", (int)strcspn(hint, ","), hint);
		cr_expect_eq(script[0], '/', "%s", out);
		cr_expect_eq(access(script, X_OK), 0, "%s: %s", script, out);
	}
	free(out);
	/* A model named by the variable is no default model to fetch. */
	snprintf(env, sizeof(env), "Q4KHOST_MODEL=%s/none.gguf", empty);
	for (int i = 0; i < 2; i++) {
		char want[8192];

		cr_expect_eq(test_q4khost(env, receipts, i ? "run -n 1" : "info", &out), 3, "%s", out);
		snprintf(want, sizeof(want), "%s/none.gguf (from Q4KHOST_MODEL): No such file or directory\n",
		         empty);
		cr_expect(strstr(out, want) != NULL, "%s", out);
		cr_expect_null(strstr(out, "default model"), "%s", out);
		free(out);
	}
}

Test(diagnostics, run_help_says_its_exit_codes)
{
	const char *receipts = test_tmpdir();
	char *out;

	cr_expect_eq(test_q4khost("", receipts, "run --help", &out), 0, "%s", out);
	cr_expect(strstr(out, "130 stopped by SIGINT, 143 stopped by SIGTERM") != NULL, "%s", out);
	cr_expect_null(strstr(out, "docs/"), "%s", out);
	free(out);
}

Test(diagnostics, the_man_page_gives_the_kernel_default_run_uses)
{
	char path[4200], *page;
	size_t len;

	snprintf(path, sizeof(path), "%s/man/q4khost.1", test_builddir());
	page = test_read_file(path, &len);
	cr_assert_not_null(page, "%s", path);
	cr_expect(strstr(page, ".BI \\-\\-kernel \" LIST\"") != NULL, "--kernel takes a list");
	cr_expect(strstr(page, "else every variant that can run on the device, highest score\nfirst") !=
	                  NULL,
	          "the default is the config, then score order, not the built-in kernels");
	free(page);
}

Test(diagnostics, validate_says_where_the_minimum_is_and_where_it_was_decided, .timeout = 240)
{
	static const char *const names[] = { "defect_flip", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *cfg = file_with("short.ini", SHORT_PROBE);
	char args[8192], want[256], *out, *row;
	long min_at, decided;
	json_t *j, *c;

	plugins = test_plugin_dir(names);
	snprintf(args, sizeof(args), "validate --json -m %s --plugin-path %s --config %s",
	         tiny_model(), plugins, cfg);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 1, "%s", out);
	j = parse_json(out);
	c = json_array_get(json_object_get(j, "candidates"), 0);
	min_at = (long)json_integer_value(json_object_get(c, "min_cosine_position"));
	decided = (long)json_integer_value(json_object_get(c, "worst_position"));
	cr_expect_neq(min_at, decided, "F2.3 fires at a high cosine, elsewhere than the minimum");
	json_decref(j);
	free(out);
	/* The table says which is which (from the receipt, this time). */
	snprintf(args, sizeof(args), "validate -m %s --plugin-path %s --config %s", tiny_model(),
	         plugins, cfg);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 1, "%s", out);
	cr_expect(strstr(out, " min cos ") != NULL && strstr(out, " decided at ") != NULL, "%s", out);
	row = strstr(out, " defect-flip ");
	cr_assert_not_null(row, "%s", out);
	snprintf(want, sizeof(want), " at %ld (", min_at);
	cr_expect(strstr(row, want) != NULL, "%s", row);
	snprintf(want, sizeof(want), "  %ld (", decided);
	cr_expect(strstr(row, want) != NULL, "%s", row);
	free(out);
	free(cfg);
}

/* --- progress: on a terminal only ---------------------------------------- */

/* On the tiny llama model: the progress line, not the model, is under test. */
Test(diagnostics, long_work_shows_progress_on_a_terminal_only, .timeout = 240)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *cfg = file_with("short.ini", SHORT_PROBE);
	char args[8192], *out;

	plugins = test_plugin_dir(names);
	snprintf(args, sizeof(args), "run -n 1 -m %s --kernel cpu-q8act --plugin-path %s --config %s",
	         tiny_model(), plugins, cfg);
	cr_assert_eq(q4khost_on_a_terminal(receipts, args, &out), 0, "%s", out);
	/* Cut to the terminal's width (80 here) at a word: the candidate and
	 * the seconds come first, so that they stay, and the reason last. */
	cr_expect(strstr(out, "\rq4khost run: F2 of cpu/cpu-q8act (device 0): 0 s, against the "
	                      "reference (no...\033[K") != NULL,
	          "%s", out);
	cr_expect_null(strstr(out, "q4khost validate:"), "the child's own line: %s", out);
	free(out);
	/* Not a terminal: the same work, not a byte of progress. */
	snprintf(args, sizeof(args), "run -n 1 -m %s --f2 fresh --kernel cpu-q8act --plugin-path %s "
	         "--config %s", tiny_model(), plugins, cfg);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: --f2 fresh)") != NULL, "%s", out);
	cr_expect_null(strchr(out, '\r'), "%s", out);
	cr_expect_null(strstr(out, "\033["), "%s", out);
	cr_expect_null(strstr(out, ": checking"), "%s", out);
	cr_expect_null(strstr(out, "q4khost validate:"), "%s", out);
	free(out);
	/* fresh from the environment: the report names it, not --f2 */
	snprintf(args, sizeof(args), "run -n 1 -m %s --kernel cpu-q8act --plugin-path %s --config %s",
	         tiny_model(), plugins, cfg);
	cr_assert_eq(test_q4khost("Q4KHOST_F2=fresh", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: Q4KHOST_F2=fresh)") != NULL, "%s", out);
	free(out);
	free(cfg);
}

Test(diagnostics, a_long_prefill_and_a_bench_show_progress_on_a_terminal, .timeout = 240)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none), *receipts = test_tmpdir();
	char args[8192], prompt[2048] = "", *out;

	/* more than one of the reference's steps of 256 tokens */
	for (int i = 0; i < 160; i++)
		strcat(prompt, "one two ");
	snprintf(args, sizeof(args), "run -n 1 -m %s -p '%s' --plugin-path %s", tiny_model(), prompt,
	         plugins);
	cr_assert_eq(q4khost_on_a_terminal(receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "\rq4khost run: prefill: 256 of ") != NULL, "%s", out);
	free(out);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect_null(strstr(out, "prefill: 256 of"), "%s", out);
	free(out);
	snprintf(args, sizeof(args), "bench -n 2 -m %s --plugin-path %s", tiny_model(), plugins);
	cr_assert_eq(q4khost_on_a_terminal(receipts, args, &out), 0, "%s", out);
	/* the row's candidate first, then each pass and the seconds: a line
	 * that moves during a long row, and keeps the name when cut */
	cr_expect(strstr(out, "\rq4khost bench: row 1 of 1, cpu/built-in: warm-up pass, 0 s: a ") !=
	          NULL, "%s", out);
	cr_expect(strstr(out, "\rq4khost bench: row 1 of 1, cpu/built-in: pass 3 of 3, ") != NULL,
	          "%s", out);
	free(out);
}

/* validate --deep takes minutes on a real model: its line says how far the
 * measurement got, the positions done of the probe's, not only seconds
 * (the child keeps the count in a file that goes with it). */
Test(diagnostics, a_deep_measurement_shows_the_positions_done, .timeout = 240)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "cpu_q8act", NULL });
	char args[8192], *out;

	snprintf(args, sizeof(args), "validate --deep --ctx 1024 --kernel cpu-q8act -m %s "
	         "--plugin-path %s", tiny_model(), plugins);
	cr_assert_eq(q4khost_on_a_terminal(test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "\rq4khost validate: F2 of cpu/cpu-q8act (device 0): 0 s, against "
	                      "the") != NULL, "%s", out);
	/* cut at the terminal's 80 columns: the name and what moves come
	 * first; the reference alone first, then the candidate, so out of
	 * twice the probe's 1024 positions */
	cr_expect(strstr(out, "\rq4khost validate: F2 of cpu/cpu-q8act (device 0): ") != NULL &&
	          strstr(out, "/2048 positions,...\033[K") != NULL, "%s", out);
	free(out);
	/* the child's option, refused anywhere else */
	cr_expect_eq(test_q4khost("", test_tmpdir(), "validate --deep --progress-file x", &out), 2,
	             "%s", out);
	cr_expect(strstr(out, "q4khost validate: --progress-file x needs --one and --deep") != NULL,
	          "%s", out);
	free(out);
	cr_expect_eq(test_q4khost("", test_tmpdir(), "validate --reference-logits x", &out), 2,
	             "%s", out);
	cr_expect(strstr(out, "q4khost validate: --reference-logits x needs --one") != NULL, "%s",
	          out);
	free(out);
}

/* --- a machine without an NVIDIA driver ---------------------------------- */

Test(diagnostics, without_a_driver_the_cuda_plugin_says_nothing)
{
	const char *plugins, *receipts = test_tmpdir();
	char so[4200], cmd[8192], args[8192], *out;
	void *dl;

	snprintf(so, sizeof(so), "%s/plugins/cuda/.libs/cuda.so", test_builddir());
	if (access(so, R_OK) != 0)
		cr_skip_test("the cuda plugin was not built here");
	dl = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
	if (dl) {
		dlclose(dl);
		cr_skip_test("an NVIDIA driver is installed here");
	}
	plugins = test_plugin_dir((const char *const[]){ NULL });
	snprintf(cmd, sizeof(cmd), "cp %s %s/", so, plugins);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect_null(strstr(out, "insufficient"), "%s", out);
	cr_expect_null(strstr(out, "[plugin cuda]"), "%s", out);
	free(out);
	snprintf(args, sizeof(args), "plugins --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_LOG=debug", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "backend cuda: 0 devices") != NULL, "%s", out);
	cr_expect(strstr(out, "cuda: no devices: no NVIDIA driver is installed") != NULL,
	          "the reason, for who asks: %s", out);
	free(out);
	/* the listing says why without being asked: the CUDA error (35 is
	 * cudaErrorInsufficientDriver in CUDA's driver_types.h) and the fix */
	cr_expect_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "backend cuda: 0 devices\n  why none: device_info: no device 0 (the "
	                      "cuda backend has 0: no NVIDIA driver is installed: neither "
	                      "libcuda.so.1 nor libnvidia-ml.so.1 loads (cudaErrorInsufficientDriver, "
	                      "CUDA error 35); install the NVIDIA driver on a machine with an NVIDIA "
	                      "GPU, else the cpu backends serve)\n") != NULL, "%s", out);
	free(out);
}


/* One of something is singular: bench -n 1 -r 1's header. */
Test(diagnostics, bench_says_one_pass_and_one_token_in_the_singular)
{
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char *out;

	cr_expect_eq(q4khost_with("", "bench -n 1 -r 1", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, " greedy decode token, 1 timed pass; ") != NULL, "%s", out);
	free(out);
}
