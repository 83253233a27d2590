/*
 * What a new user meets first, through the real CLI: errors that always
 * say why (a missing reference plugin, a bad [plugin.cpu] threads with
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
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

static const char *tiny_model(void)
{
	static char path[4200];

	snprintf(path, sizeof(path), "%s/tests/fixtures/tiny-llama.gguf", test_srcdir());
	return path;
}

/*
 * q4khost COMMAND -m MODEL (NULL: the tiny llama fixture) --plugin-path
 * PLUGINS EXTRA, with receipts of its own and ENV before it.
 */
static int q4khost_with(const char *env, const char *command, const char *model,
                        const char *plugins, const char *extra, char **out)
{
	char args[16384];

	snprintf(args, sizeof(args), "%s -m %s --plugin-path %s %s", command,
	         model ? model : tiny_model(), plugins, extra);
	return test_q4khost(env, test_tmpdir(), args, out);
}

/* A file FILE in a fresh folder holding TEXT; its path (malloc()ed). */
static char *file_with(const char *name, const char *text)
{
	char *path;

	cr_assert_geq(asprintf(&path, "%s/%s", test_tmpdir(), name), 0);
	test_write_file(path, text, strlen(text));
	return path;
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

static json_t *parse_json(const char *text)
{
	json_error_t jerr;
	json_t *j = json_loads(strchr(text, '{') ? strchr(text, '{') : text, 0, &jerr);

	cr_assert_not_null(j, "no JSON (%s): %s", jerr.text, text);
	return j;
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
	cr_assert_eq(chmod(plugins, 0777), 0);
	cr_expect_eq(q4khost_with("", "run -n 1", NULL, plugins, "", &out), 4, "%s", out);
	snprintf(want, sizeof(want),
	         "the reference cpu plugin %s/cpu.so was rejected: refused: the folder %s is "
	         "writable by group and others (mode 0777)",
	         plugins, plugins);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
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
	/* A guard's child: the absence of a receipt is its answer. */
	cr_expect_eq(q4khost_with("", "validate --one --quiet --backend cpu --device 3 --kernel none",
	                          NULL, plugins, "", &out),
	             0, "%s", out);
	cr_expect_str_eq(out, "");
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

/* How many lines OUT holds. */
static int lines(const char *out)
{
	int n = 0;

	for (const char *s = out; (s = strchr(s, '\n')); s++)
		n++;
	return n;
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
		         "there: Not a directory\n",
		         file, i ? "/f2/sub" : "");
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
		cr_expect_eq(lines(out), 1, "said once, alone: %s", out);
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
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });

	if (geteuid() == 0)
		cr_skip_test("root may write in any folder");
	snprintf(dir, sizeof(dir), "%s/read-only", test_tmpdir());
	cr_assert_eq(mkdir(dir, 0555), 0);
	snprintf(env, sizeof(env), "Q4KHOST_F2_RECEIPT_DIR=%s/f2", dir);
	cr_expect_eq(q4khost_with(env, "run -n 1", NULL, plugins, "", &out), 3, "%s", out);
	snprintf(want, sizeof(want),
	         "q4khost run: Q4KHOST_F2_RECEIPT_DIR=%s/f2: F2 cannot keep its receipts there: "
	         "Permission denied\n",
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

	test_model_path();
	plugins = test_plugin_dir(names);
	snprintf(args, sizeof(args), "validate --json --plugin-path %s --config %s", plugins, cfg);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 1, "%s", out);
	j = parse_json(out);
	c = json_array_get(json_object_get(j, "candidates"), 0);
	min_at = (long)json_integer_value(json_object_get(c, "min_cosine_position"));
	decided = (long)json_integer_value(json_object_get(c, "worst_position"));
	cr_expect_neq(min_at, decided, "F2.3 fires at a high cosine, elsewhere than the minimum");
	json_decref(j);
	free(out);
	/* The table says which is which (from the receipt, this time). */
	snprintf(args, sizeof(args), "validate --plugin-path %s --config %s", plugins, cfg);
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

Test(diagnostics, long_work_shows_progress_on_a_terminal_only, .timeout = 240)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *cfg = file_with("short.ini", SHORT_PROBE);
	char args[8192], *out;

	test_model_path();
	plugins = test_plugin_dir(names);
	snprintf(args, sizeof(args), "run -n 1 --kernel cpu-q8act --plugin-path %s --config %s",
	         plugins, cfg);
	cr_assert_eq(q4khost_on_a_terminal(receipts, args, &out), 0, "%s", out);
	/* Cut to the terminal's width (80 here) at a word: the reason comes last. */
	cr_expect(strstr(out, "\rq4khost run: F2: checking cpu/cpu-q8act (device 0) vs the "
	                      "reference: 0 s (no...\033[K") != NULL,
	          "%s", out);
	cr_expect_null(strstr(out, "q4khost validate:"), "the child's own line: %s", out);
	free(out);
	/* Not a terminal: the same work, not a byte of progress. */
	snprintf(args, sizeof(args), "run -n 1 --f2 fresh --kernel cpu-q8act --plugin-path %s --config %s",
	         plugins, cfg);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: --f2 fresh)") != NULL, "%s", out);
	cr_expect_null(strchr(out, '\r'), "%s", out);
	cr_expect_null(strstr(out, "\033["), "%s", out);
	cr_expect_null(strstr(out, "F2: checking"), "%s", out);
	cr_expect_null(strstr(out, "q4khost validate:"), "%s", out);
	free(out);
	/* fresh from the environment: the report names it, not --f2 */
	snprintf(args, sizeof(args), "run -n 1 --kernel cpu-q8act --plugin-path %s --config %s",
	         plugins, cfg);
	cr_assert_eq(test_q4khost("Q4KHOST_F2=fresh", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: Q4KHOST_F2=fresh)") != NULL, "%s", out);
	free(out);
	free(cfg);
}

Test(diagnostics, a_long_prefill_and_a_bench_show_progress_on_a_terminal, .timeout = 240)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none), *receipts = test_tmpdir();
	char args[8192], prompt[1024] = "", *out;

	for (int i = 0; i < 100; i++)
		strcat(prompt, "one two ");
	snprintf(args, sizeof(args), "run -n 1 -m %s -p '%s' --plugin-path %s", tiny_model(), prompt,
	         plugins);
	cr_assert_eq(q4khost_on_a_terminal(receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "\rq4khost run: prefill: 64 of ") != NULL, "%s", out);
	free(out);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect_null(strstr(out, "prefill: 64 of"), "%s", out);
	free(out);
	snprintf(args, sizeof(args), "bench -n 2 -m %s --plugin-path %s", tiny_model(), plugins);
	cr_assert_eq(q4khost_on_a_terminal(receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "\rq4khost bench: timing cpu/built-in (row 1 of 1)") != NULL, "%s", out);
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
}

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

static int count(const char *text, const char *needle)
{
	int n = 0;

	for (const char *p = text; (p = strstr(p, needle)); p++)
		n++;
	return n;
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
	cr_expect(strstr(out, "; decode 1 token in 0.000 s (rate n/a); stop: token limit\n") != NULL,
	          "%s", out);
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
	char *out;

	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, "--plot /nonexistent-dir/f2.svg",
	                          &out), 1, "%s", out);
	cr_expect(strstr(out, "q4khost validate: --plot /nonexistent-dir/f2.svg: cannot create it in "
	                      "/nonexistent-dir: No such file or directory (checked before any "
	                      "measurement)\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, "receipts in"), "no work was done: %s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, "--plot /", &out), 1, "%s", out);
	cr_expect(strstr(out, "--plot /: is a folder, expected a file to write") != NULL, "%s", out);
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
		snprintf(want, sizeof(want), "q4khost %.*s: --backend '': an empty name is not allowed; "
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
		snprintf(want, sizeof(want), "q4khost %.*s: %s '': an empty name is not allowed; "
		         "expected kernel variant names, or none for the built-in kernels",
		         len, commands[i], kernel);
		cr_expect(strstr(out, want) == out, "%s: %s", args, out);
		free(out);
	}
}

/* Usage mistakes, exit 2, each saying what was wrong: a number with white
 * space around it (refused as any junk), an empty number, and validate
 * --quiet without --one, where it means nothing. */
Test(first_run, numbers_with_white_space_and_quiet_without_one_are_usage_errors)
{
	static const char *const cases[][2] = {
		{ "run --device ''", "q4khost run: --device: the value is empty; expected a whole "
		                     "number in [0, 1023]\n" },
		{ "validate --quiet", "q4khost validate: --quiet needs --one: " },
		{ "run -n ' 3'", "q4khost run: --n-predict must be a whole number in [1, 2147483647], "
		                 "got ' 3' (white space around it is not allowed)\n" },
		{ "run -n '3 '", "got '3 ' (white space around it is not allowed)\n" },
		{ "run --temp ' 0.5'", "q4khost run: --temp must be a number in [0, 100], got ' 0.5' " },
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
