/*
 * Choosing kernels per device through the real CLI and loader: `q4khost
 * plugins --explain` names every setting's value and where it came from
 * (FILE:LINE, variable, flag, default), unknown config keys are warned
 * about with file, line and section, and `q4khost run` serves the kernel
 * chosen for its device: a config choice is a preference that falls back
 * when F2 rejects it, an environment or command-line choice an explicit
 * request that fails instead. The cpu backend's device stands in for a
 * GPU: [gpu.*] sections match it too (docs/config.md).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_rig.h"
#include "helpers.h"

static const char *jget(json_t *j, const char *path)
{
	char buf[256], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *k = strtok_r(buf, ".", &save); k && j; k = strtok_r(NULL, ".", &save))
		j = json_is_array(j) ? json_array_get(j, strtoul(k, NULL, 10))
		                     : json_object_get(j, k);
	cr_assert_not_null(j, "%s missing", path);
	return json_is_string(j) ? json_string_value(j) : json_is_true(j) ? "true" : "false";
}

/*
 * Skip the test unless cpu-simd and cpu-fast were built here (configure:
 * HAVE_CPU_SIMD builds both) and, when RUN, this CPU runs them (AVX2, FMA).
 */
static void need_cpu_simd(int run)
{
	char so[4200];

	if (run) {
		test_need_cpu_fast();
		return;
	}
	snprintf(so, sizeof(so), "%s/plugins/cpu-simd/.libs/cpu-simd.so", test_builddir());
	if (access(so, R_OK) != 0)
		cr_skip_test("cpu-simd and cpu-fast were not built here (configure: HAVE_CPU_SIMD)");
}

/* Copy the plugin NAME built here (cpu-simd, cpu-fast) into the folder DIR. */
static void add_built_plugin(const char *dir, const char *name)
{
	char cmd[8192];

	snprintf(cmd, sizeof(cmd), "cp %s/plugins/%s/.libs/%s.so %s/", test_builddir(), name, name,
	         dir);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
}

Test(select, plugins_explain_names_where_every_setting_came_from)
{
	static const char *const names[] = { "cpu_q8act", "defect_nan", NULL };
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char *out, args[8192], want[8192];
	char *cfg = file_with("q.ini", "[f2]\nmode = fresh\n\n"
	                               "[gpu.0]\nq4k_kernel = cpu-q8act\n\n"
	                               "[plugin.cpu-q8act]\nf2_floor = 0.93\n");
	json_t *j;

	snprintf(args, sizeof(args), "plugins --explain --json --plugin-path %s --config %s",
	         plugins, cfg);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(jget(j, "settings.plugin_path.origin"), "--plugin-path");
	cr_expect_str_eq(jget(j, "settings.receipt_dir.origin"), "Q4KHOST_F2_RECEIPT_DIR");
	cr_expect_str_eq(jget(j, "settings.f2_mode.value"), "fresh");
	snprintf(want, sizeof(want), "%s:2 [f2]", cfg);
	cr_expect_str_eq(jget(j, "settings.f2_mode.origin"), want);
	cr_expect_str_eq(jget(j, "settings.backend.origin"), "default");
	cr_expect_str_eq(jget(j, "devices.0.kernel_setting.value"), "cpu-q8act");
	snprintf(want, sizeof(want), "%s:5 [gpu.0]", cfg);
	cr_expect_str_eq(jget(j, "devices.0.kernel_setting.origin"), want);
	cr_expect_str_eq(jget(j, "devices.0.kernel_setting.explicit"), "false");
	cr_expect_str_eq(jget(j, "devices.0.chain.0.kernel"), "cpu/cpu-q8act");
	snprintf(want, sizeof(want), "%s:8 [plugin.cpu-q8act]", cfg);
	cr_expect_str_eq(jget(j, "devices.0.chain.0.f2.floor.origin"), want);
	cr_expect_str_eq(jget(j, "devices.0.chain.0.f2.decode_steps.origin"), "default");
	/* Variants for cpu follow by score, as for any backend; the reference last. */
	cr_expect_str_eq(jget(j, "devices.0.chain.1.kernel"), "cpu/defect-nan");
	cr_expect_str_eq(jget(j, "devices.0.chain.2.kernel"), "cpu/built-in");
	cr_expect_str_eq(jget(j, "devices.0.types.0.type"), "Q4_K");
	cr_expect_str_eq(jget(j, "devices.0.types.0.first"), "cpu/cpu-q8act");
	cr_expect_str_eq(jget(j, "devices.0.types.0.runner_up"), "cpu/built-in");
	cr_expect_str_eq(jget(j, "run.0.tries.0"), "cpu/cpu-q8act");
	cr_expect_str_eq(jget(j, "run.0.tries.1"), "cpu/defect-nan");
	cr_expect_str_eq(jget(j, "run.0.tries.2"), "cpu/built-in");
	json_decref(j);
	free(out);

	/* The environment outranks the config, and is an explicit request. */
	cr_assert_eq(test_q4khost("Q4KHOST_Q4K_KERNEL=0=defect-nan Q4KHOST_F2=off", receipts, args, &out),
	             0, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(jget(j, "devices.0.kernel_setting.origin"), "Q4KHOST_Q4K_KERNEL");
	cr_expect_str_eq(jget(j, "devices.0.kernel_setting.explicit"), "true");
	cr_expect_str_eq(jget(j, "settings.f2_mode.origin"), "Q4KHOST_F2");
	cr_expect_str_eq(jget(j, "run.0.tries.0"), "cpu/defect-nan");
	cr_expect_null(json_array_get(json_object_get(json_array_get(json_object_get(j, "run"), 0),
	                                              "tries"), 1),
	               "no fall-back after an explicit request");
	json_decref(j);
	free(out);

	/* The flag outranks the environment; text names the origin too. */
	snprintf(args, sizeof(args), "plugins --explain --kernel none --plugin-path %s --config %s",
	         plugins, cfg);
	cr_assert_eq(test_q4khost("Q4KHOST_Q4K_KERNEL=defect-nan", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "kernel setting: built-in (from --kernel; an explicit request: no fall-back)") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "q4khost run --device 0 tries: cpu/built-in\n") != NULL, "%s", out);
	free(out);

	/* Values are parsed: an unknown name is an error listing the valid ones. */
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_Q4K_KERNEL=cpu-q8ac", receipts, args, &out), 4, "%s", out);
	cr_expect(strstr(out, "Q4KHOST_Q4K_KERNEL: 'cpu-q8ac' is not a kernel variant") != NULL, "%s", out);
	cr_expect(strstr(out, "valid: none, built-in, cpu-q8act (for cpu), defect-nan (for cpu)") != NULL,
	          "%s", out);
	free(out);
	free(cfg);
}

Test(select, unknown_config_keys_are_warnings_naming_file_line_and_section)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none), *receipts = test_tmpdir();
	char *out, args[8192], want[8192];
	char *cfg = file_with("q.ini", "[plugins]\npaht = /x\n"
	                               "[f2]\nmode = auto\nf2_flor = 0.9\n"
	                               "[gpu.sm_90]\nq4k_kernal = cuda-mwv\n"
	                               "[plugin.cpu]\nthreads = 2\nf2_decode_step = 9\n"
	                               "[plugin.cuda-mwv]\nwarps = 4\n"
	                               "[gpus]\nq4k_kernel = none\n");

	snprintf(args, sizeof(args), "plugins --plugin-path %s --config %s", plugins, cfg);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "a warning is no error: %s", out);
	snprintf(want, sizeof(want),
	         "q4khost plugins: warning: %s:2: unknown key 'paht' in section [plugins] (known there: path, enumerate_timeout_s); ignored",
	         cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want),
	         "%s:5: unknown key 'f2_flor' in section [f2] (known there: mode, probe, require_deep, receipt_dir, f2_floor, f2_decode_steps, f2_probe_tokens, f2_timeout_s, f2_memory_limit_mb)",
	         cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want), "%s:7: unknown key 'q4k_kernal' in section [gpu.sm_90]", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want),
	         "%s:10: unknown F2 key 'f2_decode_step' in section [plugin.cpu]", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want), "%s:14: unknown section [gpus]", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_null(strstr(out, "'threads'"), "a plugin's own keys are free-form: %s", out);
	cr_expect_null(strstr(out, "'warps'"), "%s", out);
	cr_expect_null(strstr(out, "'mode'"), "%s", out);
	free(out);
	free(cfg);
}

/* So is a Q4KHOST_ variable that q4khost does not read (a misspelt
 * Q4KHOST_Q4K_KERNEL), once, by the command the user ran. */
Test(select, unknown_q4khost_variables_are_warnings)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none);
	char *out, args[8192];
	int n = 0;

	snprintf(args, sizeof(args), "plugins --plugin-path %s", plugins);
	cr_assert_eq(test_q4khost("Q4KHOST_KERNEL=nonsense Q4KHOST_F2=off", test_tmpdir(), args,
	                          &out),
	             0, "a warning is no error: %s", out);
	cr_expect(strstr(out, "q4khost plugins: warning: unknown environment variable "
	                      "Q4KHOST_KERNEL (known: Q4KHOST_API_KEY, Q4KHOST_BACKEND, "
	                      "Q4KHOST_CONFIG, Q4KHOST_F2, Q4KHOST_F2_RECEIPT_DIR, "
	                      "Q4KHOST_F2_REQUIRE_DEEP, Q4KHOST_LOG, "
	                      "Q4KHOST_MODEL, Q4KHOST_PLUGIN_PATH, Q4KHOST_Q4K_KERNEL, "
	                      "Q4KHOST_RECEIPT_KEY); "
	                      "ignored\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, "Q4KHOST_F2 ("), "a variable it reads: %s", out);
	for (const char *p = out; (p = strstr(p, "unknown environment variable")); p++)
		n++;
	cr_expect_eq(n, 1, "once: %s", out);
	free(out);
}

/*
 * On the tiny llama model (the choice, not the model, is under test; the
 * planted defect acts on its LM head as on the default model's): the
 * plugin path is followed by -m and its file.
 */
Test(select, run_serves_the_kernel_chosen_for_its_device, .timeout = 240)
{
	static const char *const names[] = { "cpu_q8act", "defect_nan", "kernel_ok", NULL };
	char *out, args[16384], want[8192], plugins[8192];
	const char *receipts;

	snprintf(plugins, sizeof(plugins), "%s -m %s", test_plugin_dir(names), tiny_model());
	receipts = test_tmpdir();
	/* A short probe keeps the measurements quick; both configs share it. */
	char *chosen = file_with("q.ini",
	                         "[f2]\nf2_probe_tokens = 16\n\n[gpu.cpu]\nq4k_kernel = cpu-q8act\n");
	char *broken = file_with("q.ini",
	                         "[f2]\nf2_probe_tokens = 16\n\n[gpu.0]\nq4k_kernel = defect-nan\n");

	snprintf(args, sizeof(args), "run -n 2 -p Hello --plugin-path %s --config %s", plugins,
	         chosen);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "Q4_K=cpu-q8act") != NULL, "%s", out);
	snprintf(want, sizeof(want), "kernel choice: cpu-q8act, named by %s:5 [gpu.cpu]", chosen);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: no receipt)") != NULL, "%s", out);
	free(out);

	/* A config choice that F2 rejects is a preference: the next by score
	 * serves (its receipt from the first run decides). */
	snprintf(args, sizeof(args), "run -n 2 -p Hello --plugin-path %s --config %s", plugins,
	         broken);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2 rejected first: cpu/defect-nan: F2 reject: position 1 (prefill)") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "kernel choice: cpu-q8act, by score (1)\n") != NULL, "%s", out);
	cr_expect(strstr(out, "F2: pass (receipt of ") != NULL, "%s", out);
	free(out);

	/* With the built-in kernels named after it, the reference serves. */
	free(broken);
	broken = file_with("q.ini",
	                   "[f2]\nf2_probe_tokens = 16\n\n[gpu.0]\nq4k_kernel = defect-nan, none\n");
	snprintf(args, sizeof(args), "run -n 2 -p Hello --plugin-path %s --config %s", plugins,
	         broken);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2 rejected first: cpu/defect-nan: F2 reject: position 1 (prefill)") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "kernel choice: the built-in kernels, named by ") != NULL, "%s", out);
	cr_expect(strstr(out, "F2: not needed: the reference cpu backend") != NULL, "%s", out);
	free(out);

	/* The same choice from the environment is explicit: it fails. */
	cr_expect_eq(test_q4khost("Q4KHOST_Q4K_KERNEL=defect-nan", receipts, args, &out), 4, "%s", out);
	cr_expect(strstr(out, "cpu/defect-nan: F2 reject") != NULL, "%s", out);
	free(out);

	/* The flag outranks the environment; the receipt decides this time. */
	snprintf(args, sizeof(args), "run -n 2 -p Hello --plugin-path %s --config %s --kernel cpu-q8act",
	         plugins, broken);
	cr_assert_eq(test_q4khost("Q4KHOST_Q4K_KERNEL=defect-nan", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "kernel choice: cpu-q8act, named by --kernel") != NULL, "%s", out);
	cr_expect(strstr(out, "F2: pass (receipt of ") != NULL, "%s", out);
	free(out);

	/* A request naming only another backend's variant cannot be honoured. */
	snprintf(args, sizeof(args), "run -n 2 -p Hello --plugin-path %s --kernel kernel-ok", plugins);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 4, "%s", out);
	cr_expect(strstr(out, "names nothing that device 0 of an available backend can run: "
	                      "kernel-ok is a kernel variant for backend cuda, which is not on the "
	                      "plugin path; without --kernel, ") != NULL,
	          "%s", out);
	free(out);
	free(chosen);
	free(broken);
}

/* A request that names only another backend's variant says so once, however
 * many backends were asked (cpu and cpu-fast here), why that backend cannot
 * serve, and what to do. */
Test(select, a_variant_for_a_missing_backend_is_named_once_with_why)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "kernel_ok", NULL });
	char cmd[8192], args[8192], *out, *at;
	int times = 0;

	snprintf(cmd, sizeof(cmd), "cp %s/plugins/cpu-fast/.libs/cpu-fast.so %s/", test_builddir(),
	         plugins);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(args, sizeof(args), "run -n 1 -p Hello -m %s --plugin-path %s --kernel kernel-ok",
	         tiny_model(), plugins);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 4, "%s", out);
	cr_expect(strstr(out, "q4khost run: the kernel request (--kernel) names nothing that device "
	                      "0 of an available backend can run: kernel-ok is a kernel variant for "
	                      "backend cuda, which is not on the plugin path; without --kernel, "
	                      "q4khost chooses what runs here (q4khost plugins --explain shows "
	                      "it)\n") != NULL, "%s", out);
	for (at = out; (at = strstr(at, "kernel-ok")); at++)
		times++;
	cr_expect_eq(times, 1, "%s", out);
	free(out);
}

/*
 * Without any kernel setting, a variant for the cpu backend is a candidate
 * like any other: cpu-simd (where it was built and this CPU runs it) serves
 * every weight type it implements once F2 passes, and the report says so.
 */
Test(select, a_cpu_variant_serves_by_score_after_f2, .timeout = 240)
{
	static const char *const none[] = { NULL };
	const char *plugins, *receipts;
	char *out, args[8192];
	char *cfg = file_with("q.ini", "[f2]\nf2_probe_tokens = 16\n");
	json_t *j;

	test_model_path();
	need_cpu_simd(1);
	plugins = test_plugin_dir(none);
	receipts = test_tmpdir();
	add_built_plugin(plugins, "cpu-simd");
	snprintf(args, sizeof(args), "run -n 2 -p Hello --threads 2 --json --plugin-path %s --config %s",
	         plugins, cfg);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(jget(j, "backend.name"), "cpu");
	for (size_t i = 0; i < 4; i++) {
		static const char *const types[] = { "Q4_K", "Q5_0", "Q6_K", "Q8_0" };
		char path[64];

		snprintf(path, sizeof(path), "kernels.%s.plugin", types[i]);
		cr_expect_str_eq(jget(j, path), "cpu-simd", "%s", path);
	}
	cr_expect(strncmp(jget(j, "kernel_choice"), "cpu-simd, by score (", 20) == 0, "%s",
	          jget(j, "kernel_choice"));
	cr_expect_str_eq(jget(j, "f2.verdict"), "pass");
	json_decref(j);
	free(out);
	free(cfg);
}

/*
 * The fast cpu path: cpu-fast, a backend of kind "cpu" (ABI 1.3), is tried
 * after the backends of other kinds (here replay-ok, a backend of its own
 * kind standing in for a GPU) and before the reference, cpu-simd by score
 * on it first; without the other backend, cpu-fast with cpu-simd serves
 * after F2 and the report names its instruction set and threads.
 */
Test(select, the_fast_cpu_backend_serves_after_gpu_kinds_and_before_the_reference,
     .timeout = 240)
{
	static const char *const gpu[] = { "replay_ok", NULL }, *const none[] = { NULL };
	const char *receipts = test_tmpdir(), *plugins;
	char *out, args[8192];
	char *cfg = file_with("q.ini", "[f2]\nf2_probe_tokens = 16\n");
	json_t *j;

	test_model_path();
	need_cpu_simd(1);
	for (int pass = 0; pass < 2; pass++) {
		plugins = test_plugin_dir(pass ? none : gpu);
		add_built_plugin(plugins, "cpu-fast");
		add_built_plugin(plugins, "cpu-simd");
		if (!pass) {
			snprintf(args, sizeof(args), "plugins --explain --plugin-path %s", plugins);
			cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
			cr_expect(strstr(out, "q4khost run --device 0 tries: replay-ok/built-in -> "
			                      "cpu-fast/cpu-simd -> cpu-fast/built-in -> "
			                      "cpu/cpu-simd -> cpu/built-in") != NULL,
			          "%s", out);
			free(out);
			continue;
		}
		snprintf(args, sizeof(args),
		         "run -n 2 -p Hello --threads 2 --json --plugin-path %s --config %s", plugins,
		         cfg);
		cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
		j = parse_json(out);
		cr_expect_str_eq(jget(j, "backend.name"), "cpu-fast");
		cr_expect(strstr(jget(j, "device.name"), "float32, 2 threads") != NULL, "%s",
		          jget(j, "device.name"));
		cr_expect_str_eq(jget(j, "kernels.Q4_K.plugin"), "cpu-simd");
		cr_expect(strncmp(jget(j, "kernel_choice"), "cpu-simd, by score (", 20) == 0, "%s",
		          jget(j, "kernel_choice"));
		cr_expect_str_eq(jget(j, "f2.verdict"), "pass");
		cr_expect_str_eq(jget(j, "steps.kv_cache"), "F16");
		json_decref(j);
		free(out);
	}
	free(cfg);
}

/* A variant that refuses the value of its own setting is a bad
 * configuration, as a bad value the host checks is: exit 3 before any
 * work, naming the setting, its file and line. An empty "threads ="
 * counts as unset. */
Test(select, a_variant_that_refuses_its_settings_is_a_bad_configuration, .timeout = 240)
{
	static const char *const none[] = { NULL };
	const char *plugins;
	char *out, args[8192];
	char *cfg = file_with("q.ini", "[plugin.cpu-simd]\nisa = sse9\n[plugin.cpu]\nthreads =\n");
	char want[8192];

	test_model_path();
	need_cpu_simd(0);
	plugins = test_plugin_dir(none);
	add_built_plugin(plugins, "cpu-simd");
	snprintf(args, sizeof(args), "run -n 1 -p Hello --plugin-path %s --config %s", plugins, cfg);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
	cr_expect(strstr(out, "q4khost run: plugin cpu-simd refuses its settings: ") != NULL, "%s",
	          out);
	cr_expect(strstr(out, "isa = \"sse9\": expected auto, avx2, avx512-vnni or amx") != NULL,
	          "%s", out);
	snprintf(want, sizeof(want), "or amx (isa from %s:2 [plugin.cpu-simd])\n", cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_null(strstr(out, "q4khost: kernels:"), "no work was done: %s", out);
	free(out);
	free(cfg);
}

/* A variant that would not start (init() fails for a reason other than
 * a bad value: here isa = amx, which no machine runs with repack = off)
 * stays in the chain, and plugins --explain says why, in the variant's
 * words. */
Test(select, the_explanation_says_why_a_variant_would_not_start)
{
	static const char *const none[] = { NULL };
	const char *plugins;
	char *out, args[8192];
	char *cfg = file_with("q.ini", "[plugin.cpu-simd]\nisa = amx\nrepack = off\n");

	need_cpu_simd(1);
	plugins = test_plugin_dir(none);
	add_built_plugin(plugins, "cpu-simd");
	snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s", plugins, cfg);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "1. cpu/cpu-simd               would not start: cpu-simd: init "
	                      "failed (unsupported): [plugin.cpu-simd] isa = amx: ") != NULL,
	          "%s", out);
	free(out);
	free(cfg);
}

/* A plugin key set to nothing ("isa =") counts as unset, as docs/config.md
 * says of every empty value: the plugin starts with its default instead of
 * refusing "". Here cpu-simd's isa and every key cpu-fast reads. */
Test(select, an_empty_plugin_key_is_its_default)
{
	static const char *const none[] = { NULL };
	const char *plugins;
	char *out, args[8192];
	char *cfg = file_with("q.ini", "[plugin.cpu-simd]\nisa =\n"
	                               "[plugin.cpu-fast]\nisa =\nthreads =\nspin_us =\n");
	json_t *j;

	need_cpu_simd(1);
	plugins = test_plugin_dir(none);
	add_built_plugin(plugins, "cpu-fast");
	add_built_plugin(plugins, "cpu-simd");
	snprintf(args, sizeof(args), "plugins --explain --json --plugin-path %s --config %s",
	         plugins, cfg);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(jget(j, "devices.0.backend"), "cpu-fast", "%s", out);
	cr_expect_str_eq(jget(j, "devices.0.chain.0.kernel"), "cpu-fast/cpu-simd", "%s", out);
	cr_expect(strncmp(jget(j, "devices.0.chain.0.why"), "by score (", 10) == 0, "%s", out);
	cr_expect_str_eq(jget(j, "devices.1.backend"), "cpu", "%s", out);
	cr_expect_str_eq(jget(j, "devices.1.chain.0.kernel"), "cpu/cpu-simd", "%s", out);
	cr_expect(strncmp(jget(j, "devices.1.chain.0.why"), "by score (", 10) == 0, "%s", out);
	json_decref(j);
	free(out);
	free(cfg);
}

/*
 * A backend that refuses the value of its own setting is a bad
 * configuration: run exits 3 before any work with the plugin's reason, its
 * file and line (the reference's too, which would leave F2 nothing to
 * measure), and plugins --explain, whose plan run would refuse, refuses
 * it alike.
 */
Test(select, a_backend_that_will_not_start_is_named_with_its_reason)
{
	static const char *const none[] = { NULL };
	static const char *const cases[][3] = {
		{ "[plugin.cpu-fast]\nthreads = abc\n",
		  "q4khost run: plugin cpu-fast refuses its settings: "
		  "[plugin.cpu-fast] threads = \"abc\": expected an integer from 1 to 256 "
		  "(threads from %s:2 [plugin.cpu-fast])\n",
		  "  left out, could not start: cpu-fast: init failed" },
		{ "[plugin.cpu]\nthreads = 0\n",
		  "q4khost run: plugin cpu refuses its settings: "
		  "[plugin.cpu] threads = \"0\": expected an integer from 1 to 256 "
		  "(threads from %s:2 [plugin.cpu])\n",
		  "q4khost run --device 0 tries: cpu-fast/built-in\n" },
	};
	const char *plugins;
	char *out, *cfg, args[8192], want[8192];

	test_model_path();
	need_cpu_simd(1);
	plugins = test_plugin_dir(none);
	add_built_plugin(plugins, "cpu-fast");
	for (int i = 0; i < 2; i++) {
		cfg = file_with("q.ini", cases[i][0]);
		snprintf(want, sizeof(want), cases[i][1], cfg);
		snprintf(args, sizeof(args),
		         "run -n 1 -p Hello --kernel none --plugin-path %s --config %s", plugins, cfg);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
		cr_expect_str_eq(out, want);
		cr_expect(strstr(out, "wrote no receipt") == NULL, "%s", out);
		free(out);
		snprintf(args, sizeof(args), "plugins --explain --plugin-path %s --config %s",
		         plugins, cfg);
		cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
		cr_expect(strstr(out, want + strlen("q4khost run: ")) != NULL, "%s", out);
		cr_expect(strncmp(out, "q4khost plugins: ", 17) == 0, "%s", out);
		cr_expect(strstr(out, cases[i][2]) == NULL, "no plan: %s", out);
		free(out);
		free(cfg);
	}
}

Test(select, f2_mode_values_are_parsed_wherever_they_are_set)
{
	static const char *const none[] = { NULL };
	const char *plugins = test_plugin_dir(none), *receipts = test_tmpdir();
	char *out, args[8192], want[8192];
	char *cfg = file_with("q.ini", "[f2]\nmode = sometimes\n");

	snprintf(args, sizeof(args), "run -n 1 -p Hello --plugin-path %s --config %s", plugins, cfg);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 3, "a bad config file: %s", out);
	snprintf(want, sizeof(want), "%s:2 [f2]: 'sometimes' is not one of auto, fresh, off, require",
	         cfg);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	snprintf(args, sizeof(args), "run -n 1 -p Hello --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("Q4KHOST_F2=0", receipts, args, &out), 3, "%s", out);
	cr_expect(strstr(out, "Q4KHOST_F2: '0' is not one of auto, fresh, off, require") != NULL,
	          "%s", out);
	free(out);
	free(cfg);
}

/*
 * A variant none of whose types the model has routes nothing: run leaves
 * it out in one quiet line, never as an F2 rejection, and validate lists it
 * apart without failing (cpu-iq4nl lists only IQ4_NL; the default model has
 * none).
 */
Test(select, a_variant_with_none_of_the_models_types_is_not_applicable, .timeout = 240)
{
	static const char *const names[] = { "cpu_iq4nl", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *out, args[8192];
	json_t *j;

	test_model_path();
	plugins = test_plugin_dir(names);
	snprintf(args, sizeof(args), "run -n 2 -p Hello --plugin-path %s", plugins);
	cr_assert_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "not applicable to this model (none of their types): cpu/cpu-iq4nl") !=
	                  NULL,
	          "%s", out);
	cr_expect(strstr(out, "rejected") == NULL, "%s", out);
	cr_expect(strstr(out, "F2: not needed") != NULL, "the reference serves: %s", out);
	free(out);

	snprintf(args, sizeof(args), "validate --json --plugin-path %s", plugins);
	cr_expect_eq(test_q4khost("", receipts, args, &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_str_eq(jget(j, "not_applicable"), "cpu/cpu-iq4nl");
	cr_expect_eq(json_array_size(json_object_get(j, "candidates")), 0);
	json_decref(j);
	free(out);
}

/*
 * How many openat() lines of the strace -f log LOG name PATH in the
 * traced command's own process (the log's first pid), failed ones aside;
 * -1 when the log holds no line.
 */
static int parent_opens(const char *log, const char *path)
{
	char line[8192];
	long first = -1;
	int n = 0;
	FILE *f = fopen(log, "r");

	cr_assert_not_null(f, "%s", log);
	while (fgets(line, sizeof(line), f)) {
		long pid = strtol(line, NULL, 10);

		if (first < 0)
			first = pid;
		n += pid == first && strstr(line, "openat(") && strstr(line, path) &&
		     !strstr(line, "= -1 ");
	}
	fclose(f);
	return first < 0 ? -1 : n;
}

/*
 * Where strace runs here, the command line prefix that logs openat() of a
 * command and its children into LOG (CAP bytes, in RECEIPTS); "" without.
 */
static const char *traced_env(const char *receipts, char *log, size_t log_cap, char *env,
                              size_t cap)
{
	static int traced = -1;

	if (traced < 0) {
#ifdef __SANITIZE_ADDRESS__
		traced = 0; /* LeakSanitizer stops any process that runs under ptrace */
#else
		traced = system("strace -f -o /dev/null true >/dev/null 2>&1") == 0;
#endif
		if (!traced)
			cr_log_info("no strace here (or a sanitizer build): the model's opens are "
			            "counted by --json alone");
	}
	snprintf(log, log_cap, "%s/openat.log", receipts);
	snprintf(env, cap, "%s%s", traced ? "strace -f -e trace=openat -o " : "",
	         traced ? log : "");
	return env;
}

/*
 * J, a command's --json with its host context's counts ("host", host.h),
 * and the openat() log LOG (its ENV from traced_env; "" when not traced):
 * the command's own process opened the tiny model once and initialised
 * the backends cpu and cpu-fast once each, and the kernel variant
 * cpu-simd VARIANT_INITS times (once per device it ran on). WHAT names
 * the command in a failure.
 */
static void expect_opened_once(json_t *j, const char *env, const char *log, const char *what,
                               long variant_inits)
{
	json_t *host = json_object_get(j, "host");
	json_t *inits = json_object_get(host, "backend_inits");

	cr_assert_not_null(host, "%s: no \"host\" in its --json", what);
	cr_expect_eq(json_integer_value(json_object_get(host, "model_opens")), 1,
	             "%s: %lld opens of the model", what,
	             (long long)json_integer_value(json_object_get(host, "model_opens")));
	for (int b = 0; b < 2; b++) {
		const char *name = b ? "cpu-fast" : "cpu";

		cr_expect_eq(json_integer_value(json_object_get(inits, name)), 1,
		             "%s: %s initialised %lld times", what, name,
		             (long long)json_integer_value(json_object_get(inits, name)));
	}
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(host, "variant_inits"),
	                                                "cpu-simd")),
	             variant_inits, "%s: cpu-simd initialised %lld times, expected %ld", what,
	             (long long)json_integer_value(json_object_get(
	                     json_object_get(host, "variant_inits"), "cpu-simd")),
	             variant_inits);
	if (env[0])
		cr_expect_eq(parent_opens(log, tiny_model()), 1, "%s opened %s %d times (log %s)",
		             what, tiny_model(), parent_opens(log, tiny_model()), log);
}

/* A plugin folder of cpu, cpu-fast and cpu-simd, when this CPU runs them. */
static const char *fast_plugins(void)
{
	static const char *const none[] = { NULL };
	const char *plugins;

	need_cpu_simd(1);
	plugins = test_plugin_dir(none);
	add_built_plugin(plugins, "cpu-fast");
	add_built_plugin(plugins, "cpu-simd");
	return plugins;
}

/*
 * One host context for the command (docs/architecture.md section 7):
 * run on the tiny model, with cpu-fast and cpu-simd to judge, maps the
 * model file once and initialises each backend once in its own process,
 * and the variant once per device whose chain asks its score (cpu-fast's
 * and the reference's), whether F2 measures in a child (no receipt yet)
 * or reads the receipt; the child is another process and opens its own.
 * --threads sets every cpu plugin's threads, so the settings check
 * starts each of them: in the host context, its first init. The counts
 * come from run --json's "host"; where strace runs here it counts the
 * openat() calls of the model file too.
 */
Test(select, run_opens_the_model_once_and_starts_each_backend_once, .timeout = 240)
{
	const char *plugins = fast_plugins(), *receipts = test_tmpdir();
	char *out, args[8192], env[4400], log[4200];

	traced_env(receipts, log, sizeof(log), env, sizeof(env));
	snprintf(args, sizeof(args), "run -n 2 -p Hello --threads 2 --json -m %s --plugin-path %s",
	         tiny_model(), plugins);
	for (int pass = 0; pass < 2; pass++) {
		json_t *j;

		cr_assert_eq(test_q4khost(env, receipts, args, &out), 0, "%s", out);
		j = parse_json(out);
		cr_expect_str_eq(jget(j, "backend.name"), "cpu-fast");
		cr_expect_str_eq(jget(j, "kernels.Q4_K.plugin"), "cpu-simd");
		cr_expect_str_eq(jget(j, "f2.verdict"), "pass");
		cr_expect(strncmp(jget(j, "f2.source"), pass ? "receipt" : "fresh", 5) == 0,
		          "pass %d: %s", pass, jget(j, "f2.source"));
		expect_opened_once(j, env, log, pass ? "run (receipt)" : "run (F2 measures)", 2);
		json_decref(j);
		free(out);
	}
}

/*
 * validate, bench and qa hold one host context too: the model opened once
 * in the command's process, each backend started once, each variant
 * opened once per device (bench and qa time and run cpu-simd on cpu-fast's
 * device and on cpu's), whatever candidates they judge, time or run; a
 * validation child is another process.
 */
Test(select, validate_bench_and_qa_open_the_model_once_and_each_plugin_once, .timeout = 240)
{
	const char *plugins = fast_plugins(), *receipts = test_tmpdir();
	char *cases = file_with("cases.jsonl", "{\"name\": \"counting\", \"prompt\": \"1, 2, 3,\", "
	                                       "\"accept\": [\" 4\"], \"max_tokens\": 2}\n");
	char *out, args[8192], env[4400], log[4200];
	static const struct {
		const char *command, *extra;
		long variant_inits;
	} commands[] = {
		{ "validate", "", 0 }, /* the variant runs only in F2's children */
		{ "bench", "-n 2 -r 1", 2 },
		{ "qa", "--cases", 2 },
	};

	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		json_t *j;
		int rc;

		traced_env(receipts, log, sizeof(log), env, sizeof(env));
		snprintf(args, sizeof(args), "%s --json %s%s%s -m %s --plugin-path %s",
		         commands[i].command, commands[i].extra, strcmp(commands[i].command, "qa") ? "" : " ",
		         strcmp(commands[i].command, "qa") ? "" : cases, tiny_model(), plugins);
		rc = test_q4khost(env, receipts, args, &out);
		/* qa's case may fail on a model this small: its counts are the point */
		cr_assert(rc == 0 || (rc == 1 && !strcmp(commands[i].command, "qa")),
		          "%s: exit %d: %s", args, rc, out);
		j = parse_json(out);
		expect_opened_once(j, env, log, commands[i].command, commands[i].variant_inits);
		json_decref(j);
		free(out);
	}
	free(cases);
}
