/*
 * Packaging, end to end: the plugin SDK as a vendor meets it (a staged
 * `make install`, the example plugins built out of tree through
 * pkg-config, then listed, checked op by op, F2-validated and chosen by
 * the staged host), the release tarball (make distcheck), and the Debian
 * and RPM packages (built, lintian- or rpmlint-clean, unpacked or
 * installed into a scratch root and run from there). The shell work is in the scripts of tests/package/;
 * what came out is checked here.
 *
 * Each test builds q4khost again, so they run only when
 * Q4KH_TEST_PACKAGING=1 (scripts/test.sh sets it for CI); otherwise they
 * skip, saying so.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hash.h"
#include "helpers.h"
#include "q4khost/plugin.h"

#define CMD_MAX 8192

static void require_packaging(void)
{
	const char *v = getenv("Q4KH_TEST_PACKAGING");

	if (!v || strcmp(v, "1") != 0)
		cr_skip_test("packaging tests build q4khost again; Q4KH_TEST_PACKAGING=1 "
		             "runs them (scripts/test.sh does)");
}

/* The last (up to) 3000 bytes of a log, for a failure message. */
static const char *log_tail(const char *path)
{
	static char tail[3001];
	size_t len = 0;
	char *all = test_read_file(path, &len);

	if (!all)
		return "(no log)";
	snprintf(tail, sizeof(tail), "%s", all + (len > 3000 ? len - 3000 : 0));
	free(all);
	return tail;
}

/*
 * Run tests/package/SCRIPT.sh ARGS with its output in WORK/SCRIPT.out.
 * Exit 77 skips the test with the script's reason; anything but 0 fails it
 * with the end of the output.
 */
static void run_script(const char *work, const char *script, const char *args)
{
	char cmd[CMD_MAX], out[4096];
	int st;

	snprintf(out, sizeof(out), "%s/%s.out", work, script);
	/*
	 * Criterion marks the processes of its sandbox with BXFI_MAP: a suite
	 * started below us (make distcheck runs some) would take itself for
	 * one of ours and abort.
	 */
	snprintf(cmd, sizeof(cmd),
	         "env -u BXFI_MAP -u GMON_OUT_PREFIX bash '%s/tests/package/%s.sh' %s >'%s' 2>&1",
	         test_srcdir(), script, args, out);
	st = system(cmd);
	cr_assert(WIFEXITED(st), "%s: killed by a signal", cmd);
	if (WEXITSTATUS(st) == 77)
		cr_skip_test("%s", log_tail(out));
	cr_assert_eq(WEXITSTATUS(st), 0, "%s exited %d:\n%s", script, WEXITSTATUS(st),
	             log_tail(out));
}

/*
 * Run the q4khost at HOST with ARGS and --json, isolated from the caller's
 * configuration, receipts and plugin path; its parsed output, and its exit
 * status in *status. Its stderr goes to WORK/host.err.
 */
static json_t *host_json(const char *work, const char *host, const char *args,
                         int *status)
{
	char cmd[CMD_MAX], err[4096];
	json_error_t jerr;
	json_t *j;
	FILE *p;

	snprintf(err, sizeof(err), "%s/host.err", work);
	snprintf(cmd, sizeof(cmd),
	         "env -u Q4KHOST_PLUGIN_PATH -u Q4KHOST_Q4K_KERNEL -u Q4KHOST_BACKEND "
	         "-u Q4KHOST_F2 XDG_CONFIG_HOME='%s/config' "
	         "Q4KHOST_F2_RECEIPT_DIR='%s/receipts' '%s' %s --json 2>'%s'",
	         work, work, host, args, err);
	p = popen(cmd, "r");
	cr_assert_not_null(p, "%s", cmd);
	j = json_loadf(p, 0, &jerr);
	*status = pclose(p);
	cr_assert_not_null(j, "%s: no JSON on stdout (%s); stderr:\n%s", cmd, jerr.text,
	                   log_tail(err));
	return j;
}

static const char *str(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));
	return s ? s : "";
}

/* The entry of plugin NAME in `q4khost plugins --json`; fails when absent. */
static json_t *plugin_entry(json_t *listing, const char *name)
{
	size_t i;
	json_t *p;

	json_array_foreach(json_object_get(listing, "plugins"), i, p)
		if (!strcmp(str(p, "name"), name))
			return p;
	cr_assert_fail("plugin %s is not listed: %s", name,
	               json_dumps(listing, JSON_COMPACT));
	return NULL;
}

/* Listed from DIR, accepted, of KIND. */
static void expect_accepted(json_t *listing, const char *name, const char *kind,
                            const char *dir)
{
	json_t *p = plugin_entry(listing, name);
	char file[4096];

	snprintf(file, sizeof(file), "%s/%s.so", dir, name);
	cr_expect_str_eq(str(p, "state"), "accepted", "%s: %s", name,
	                 json_dumps(p, JSON_COMPACT));
	cr_expect_str_eq(str(p, "kind"), kind, "%s", name);
	cr_expect_str_eq(str(p, "path"), file, "%s", name);
}

/* VALUE of a "KEY: VALUE" line of a script's output. */
static void script_value(const char *work, const char *script, const char *key,
                         char *buf, size_t cap)
{
	char path[4096], *all, *at, *end;
	size_t len;

	snprintf(path, sizeof(path), "%s/%s.out", work, script);
	all = test_read_file(path, &len);
	cr_assert_not_null(all, "%s", path);
	snprintf(buf, cap, "\n%s: ", key);
	at = strstr(all, buf);
	cr_assert_not_null(at, "no '%s:' line in %s:\n%s", key, path, all);
	at += strlen(buf);
	end = strchr(at, '\n');
	snprintf(buf, cap, "%.*s", end ? (int)(end - at) : (int)strlen(at), at);
	free(all);
}

/*
 * What the installed bash completion offers for the command line WORDS
 * (the last one being completed), one candidate a line.
 */
static char *complete(const char *work, const char *completion, const char *words)
{
	char cmd[CMD_MAX], out[4096];
	size_t len;
	char *got;

	snprintf(out, sizeof(out), "%s/complete.out", work);
	snprintf(cmd, sizeof(cmd),
	         "env -u Q4KHOST_PLUGIN_PATH bash '%s/tests/package/complete.sh' '%s' %s >'%s' 2>&1",
	         test_srcdir(), completion, words, out);
	cr_assert_eq(system(cmd), 0, "%s:\n%s", cmd, log_tail(out));
	got = test_read_file(out, &len);
	cr_assert_not_null(got, "%s", out);
	return got;
}

/* Is LINE one of the lines of TEXT? */
static int has_line(const char *text, const char *line)
{
	size_t n = strlen(line);

	for (const char *at = strstr(text, line); at; at = strstr(at + 1, line))
		if ((at == text || at[-1] == '\n') && (at[n] == '\n' || !at[n]))
			return 1;
	return 0;
}

/*
 * Build the SDK example in sdk/examples/EXAMPLE the vendor's way; its
 * staged host and plugin folder.
 */
static void build_example(const char *work, const char *example, char *host,
                          char *plugins, size_t cap)
{
	char args[CMD_MAX];

	snprintf(args, sizeof(args), "%s '%s'", example, work);
	run_script(work, "sdk-example", args);
	script_value(work, "sdk-example", "host", host, cap);
	script_value(work, "sdk-example", "plugins", plugins, cap);
}

/* The user's q4khost.ini choosing the example for the cpu device. */
#define CHOICE "[gpu.cpu]\nq4k_kernel = example-cpu-q4k\n"

Test(package, sdk_cpu_example_is_listed_validated_chosen_and_completed, .timeout = 900)
{
	static const char *const commands[] = { "run", "plugins", "validate", "info" };
	const char *work;
	char *got, host[2048], plugins[2048], completion[2048], args[CMD_MAX];
	json_t *j, *c, *p, *q4k;
	size_t i;
	int st, seen = 0, fast = 0;

	require_packaging();
	test_model_path();
	work = test_tmpdir();
	build_example(work, "cpu-q4k", host, plugins, sizeof(host));

	snprintf(args, sizeof(args), "plugins --plugin-path '%s'", plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	expect_accepted(j, "cpu", "backend", plugins);
	expect_accepted(j, "example-cpu-q4k", "kernel", plugins);
	/* The listing names what a variant is for, as its table declares. */
	p = plugin_entry(j, "example-cpu-q4k");
	cr_expect_str_eq(str(p, "backend"), "cpu");
	cr_expect_eq(json_array_size(json_object_get(p, "types")), 1);
	cr_expect_str_eq(json_string_value(json_array_get(json_object_get(p, "types"), 0)), "Q4_K");
	/* and the arithmetic F2 holds it to: float activations and sums */
	cr_expect_str_eq(str(p, "arith"), "f32");
	json_decref(j);

	snprintf(args, sizeof(args),
	         "validate --plugin-path '%s' --kernel example-cpu-q4k --f2 fresh", plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	/* A variant for kind cpu runs on every backend of that kind: once on
	 * the reference, and once on cpu-fast where this CPU runs it. */
	json_array_foreach(json_object_get(j, "candidates"), i, c) {
		if (strcmp(str(c, "kernel"), "example-cpu-q4k"))
			continue;
		if (!strcmp(str(c, "backend"), "cpu"))
			seen++;
		else if (!strcmp(str(c, "backend"), "cpu-fast"))
			fast++;
		else
			cr_expect_fail("measured on backend %s", str(c, "backend"));
		cr_expect_str_eq(str(c, "verdict"), "pass", "%s", str(c, "message"));
		/* Float activations: judged at the f32 floor on cpu, at f16's on
		 * cpu-fast, whose cache rounds (docs/f2.md) */
		cr_expect_str_eq(str(c, "arith"), strcmp(str(c, "backend"), "cpu") ? "f16" : "f32");
		cr_expect_geq(json_real_value(json_object_get(c, "min_cosine")), 0.999,
		              "%s", str(c, "message"));
	}
	cr_expect_eq(seen, 1, "validate measured example-cpu-q4k on cpu %d times", seen);
	cr_expect_leq(fast, 1, "validate measured example-cpu-q4k on cpu-fast %d times", fast);
	json_decref(j);

	snprintf(args, sizeof(args),
	         "run --plugin-path '%s' --kernel example-cpu-q4k -n 8 -p 'The capital of France is'",
	         plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	q4k = json_object_get(json_object_get(j, "kernels"), "Q4_K");
	cr_expect_str_eq(str(q4k, "plugin"), "example-cpu-q4k");
	cr_expect(strstr(str(q4k, "file"), plugins) == str(q4k, "file"),
	          "Q4_K ran from %s, not from %s", str(q4k, "file"), plugins);
	cr_expect_str_eq(str(json_object_get(j, "f2"), "verdict"), "pass");
	/* validate's receipt serves the run: the same file, model and device. */
	cr_expect(!strncmp(str(json_object_get(j, "f2"), "source"), "receipt", 7),
	          "F2 source: %s", str(json_object_get(j, "f2"), "source"));
	cr_expect_neq(strlen(str(j, "text")), 0);
	json_decref(j);

	/* Chosen by the operator's configuration instead (q4khost.ini(5)). */
	snprintf(args, sizeof(args), "mkdir -p '%s/config/q4khost'", work);
	cr_assert_eq(system(args), 0, "%s", args);
	snprintf(args, sizeof(args), "%s/config/q4khost/q4khost.ini", work);
	test_write_file(args, CHOICE, strlen(CHOICE));
	snprintf(args, sizeof(args), "run --plugin-path '%s' -n 4 -p 'The capital of France is'",
	         plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	q4k = json_object_get(json_object_get(j, "kernels"), "Q4_K");
	cr_expect_str_eq(str(q4k, "plugin"), "example-cpu-q4k");
	cr_expect(strstr(str(j, "kernel_choice"), "[gpu.cpu]") != NULL, "kernel choice: %s",
	          str(j, "kernel_choice"));
	cr_expect_str_eq(str(json_object_get(j, "f2"), "verdict"), "pass");
	json_decref(j);

	/* The installed completion knows the commands and the new variant. */
	script_value(work, "sdk-example", "completion", completion, sizeof(completion));
	snprintf(args, sizeof(args), "'%s' ''", host);
	got = complete(work, completion, args);
	for (size_t k = 0; k < sizeof(commands) / sizeof(commands[0]); k++)
		cr_expect(has_line(got, commands[k]), "command %s not offered:\n%s",
		          commands[k], got);
	free(got);
	snprintf(args, sizeof(args), "'%s' run --plugin-path '%s' --kernel ''", host, plugins);
	got = complete(work, completion, args);
	cr_expect(has_line(got, "example-cpu-q4k") && has_line(got, "none"),
	          "--kernel offers:\n%s", got);
	free(got);
}

/* No GPU here: built with nvcc from the SDK alone and accepted by the host;
 * skipped where q4khost is built without CUDA (its gemm links the SDK's
 * CUDA library, installed only then). */
Test(package, sdk_cuda_example_builds_and_is_accepted, .timeout = 900)
{
	const char *work;
	char host[4096], plugins[4096], args[CMD_MAX];
	json_t *j;
	int st;

	require_packaging();
	work = test_tmpdir();
	build_example(work, "cuda-q4k", host, plugins, sizeof(host));
	snprintf(args, sizeof(args), "plugins --plugin-path '%s'", plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	expect_accepted(j, "example-cuda-q4k", "kernel", plugins);
	json_decref(j);
}

/* The ops of the step graph (ABI 1.0 and the 1.2 entries that take ids and
 * positions from device memory): each must pass at least one case. */
static const char *const graph_ops[] = { "get_rows", "mul_mat", "rms_norm", "rope",
	                                 "add", "mul", "scale", "glu", "copy",
	                                 "attention", "get_rows_ext", "rope_ext",
	                                 "set_rows", "attention_ext" };

/*
 * The backend example, built from the staged SDK alone: listed, every op it
 * offers passing conformance against the reference (only the weight types
 * it does not read and the entries it lacks skip), passed by F2 with
 * float arithmetic's margin, and serving the default model, the report
 * naming it and its step graph entries as the path every step took.
 */
Test(package, sdk_backend_example_passes_conformance_and_f2_and_serves, .timeout = 900)
{
	const char *work;
	char host[2048], plugins[2048], args[CMD_MAX], file[4096];
	size_t passed[sizeof(graph_ops) / sizeof(graph_ops[0])] = { 0 };
	json_t *j, *c, *q4k;
	size_t i;
	int st, seen = 0;

	require_packaging();
	test_model_path();
	work = test_tmpdir();
	build_example(work, "backend", host, plugins, sizeof(host));

	snprintf(args, sizeof(args), "plugins --plugin-path '%s'", plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	expect_accepted(j, "cpu", "backend", plugins);
	expect_accepted(j, "example-backend", "backend", plugins);
	cr_expect_str_eq(str(plugin_entry(j, "cpu"), "arith"), "exact");
	cr_expect_str_eq(str(plugin_entry(j, "example-backend"), "arith"), "f16");
	json_decref(j);

	snprintf(args, sizeof(args), "conformance --plugin-path '%s' --backend example-backend",
	         plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	cr_expect_eq(json_integer_value(json_object_get(j, "failed")), 0);
	json_array_foreach(json_object_get(json_array_get(json_object_get(j, "devices"), 0),
	                                   "cases"),
	                   i, c) {
		const char *op = str(c, "op"), *result = str(c, "result"), *msg = str(c, "message");

		if (!strcmp(result, "skip")) {
			cr_expect(!strcmp(msg, "type not supported") ||
			                  !strcmp(msg, "no such entry (ABI 1.2)") ||
			                  !strcmp(msg, "no such entry (ABI 1.7)") ||
			                  !strcmp(msg, "no such entry (ABI 1.8)"),
			          "%s %s skipped: %s", op, str(c, "case"), msg);
			continue;
		}
		cr_expect_str_eq(result, "pass", "%s %s: %s", op, str(c, "case"), msg);
		for (size_t k = 0; k < sizeof(graph_ops) / sizeof(graph_ops[0]); k++)
			passed[k] += !strcmp(op, graph_ops[k]) && !strcmp(result, "pass");
	}
	for (size_t k = 0; k < sizeof(graph_ops) / sizeof(graph_ops[0]); k++)
		cr_expect_gt(passed[k], 0, "conformance passed no case of %s", graph_ops[k]);
	json_decref(j);

	snprintf(args, sizeof(args),
	         "validate --plugin-path '%s' --backend example-backend --f2 fresh", plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	json_array_foreach(json_object_get(j, "candidates"), i, c) {
		seen++;
		cr_expect_str_eq(str(c, "backend"), "example-backend");
		cr_expect_str_eq(str(c, "verdict"), "pass", "%s", str(c, "message"));
		/* Float ops on the host's F16 cache: judged at the f16 floor */
		cr_expect_str_eq(str(c, "arith"), "f16");
		cr_expect_geq(json_real_value(json_object_get(c, "min_cosine")), 0.999, "%s",
		              str(c, "message"));
	}
	cr_expect_eq(seen, 1, "validate measured %d candidates", seen);
	json_decref(j);

	snprintf(args, sizeof(args),
	         "run --plugin-path '%s' --backend example-backend -n 8 -p 'The capital of France is'",
	         plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	snprintf(file, sizeof(file), "%s/example-backend.so", plugins);
	cr_expect_str_eq(str(json_object_get(j, "backend"), "name"), "example-backend");
	cr_expect_str_eq(str(json_object_get(j, "backend"), "file"), file);
	q4k = json_object_get(json_object_get(j, "kernels"), "Q4_K");
	cr_expect_str_eq(str(q4k, "plugin"), "example-backend");
	cr_expect_str_eq(str(json_object_get(j, "f2"), "verdict"), "pass");
	/* validate's receipt serves the run: the same file, model and device. */
	cr_expect(!strncmp(str(json_object_get(j, "f2"), "source"), "receipt", 7),
	          "F2 source: %s", str(json_object_get(j, "f2"), "source"));
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "decode"), "tokens")),
	             8, "%s", json_dumps(j, JSON_COMPACT));
	cr_expect_neq(strlen(str(j, "text")), 0);
	/* its graph entries (ABI 1.6), linked from the staged SDK's library,
	 * ran every step */
	cr_expect_str_eq(str(json_object_get(j, "steps"), "path"), "graph_nodes", "%s",
	                 str(json_object_get(j, "steps"), "why_not"));
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(json_object_get(j, "steps"),
	                                                                "paths"),
	                                                "graph_nodes")),
	             json_integer_value(json_object_get(json_object_get(j, "steps"), "steps")));
	json_decref(j);
}

/* The mode bits of PATH, which must exist. */
static mode_t mode_of(const char *path)
{
	struct stat sb;

	cr_assert_eq(stat(path, &sb), 0, "%s is not there", path);
	return sb.st_mode & 07777;
}

/* The SHA-256 of the file at PATH into HEX. */
static void file_sha256(const char *path, char hex[Q4KH_SHA256_HEX])
{
	size_t len;
	char *data = test_read_file(path, &len);

	cr_assert_not_null(data, "cannot read %s", path);
	q4kh_sha256_bytes(data, len, hex);
	free(data);
}

/*
 * What the quickstart does after building, under a user's umask: make
 * install (staged with DESTDIR), then the installed host runs the default
 * model. Under umask 002 make's own folders are 0775; the plugin folder
 * must still be 0755 and the plugins 0755, and the host must load them.
 * Then the plugins are the same bytes from both installs and from a build
 * of the release tree at another path (docs/packaging.md, "Reproducible").
 */
Test(package, install_under_umask_002_and_022_serves_the_same_bytes, .timeout = 1800)
{
	static const char *const masks[] = { "002", "022" };
	const char *work, *model;
	char stage[2][2048], elsewhere[2048], built[2048], args[CMD_MAX];
	char hex[3][Q4KH_SHA256_HEX], *dir, *path, *host, *so, *lib, *last;
	json_t *j;
	int st, compared = 0;

	require_packaging();
	model = test_model_path();
	work = test_tmpdir();
	run_script(work, "install", work);
	for (int m = 0; m < 2; m++) {
		char key[16];

		snprintf(key, sizeof(key), "umask-%s", masks[m]);
		script_value(work, "install", key, stage[m], sizeof(stage[m]));
		cr_assert_geq(asprintf(&dir, "%s%s", stage[m], getenv("Q4KH_TEST_PLUGINDIR")), 0);
		cr_expect_eq(mode_of(dir), 0755, "umask %s: %s has mode %04o", masks[m], dir,
		             mode_of(dir));
		cr_assert_geq(asprintf(&path, "%s/cpu.so", dir), 0);
		cr_expect_eq(mode_of(path), 0755, "umask %s: %s has mode %04o", masks[m], path,
		             mode_of(path));
		free(path);
		/* The quickstart's last stage, from this install. */
		cr_assert_geq(asprintf(&host, "%s%s/q4khost", stage[m], getenv("Q4KH_TEST_BINDIR")),
		              0);
		snprintf(args, sizeof(args),
		         "run --plugin-path '%s' -m '%s' -n 4 -p 'The three primary colors are'", dir,
		         model);
		j = host_json(work, host, args, &st);
		cr_expect_eq(st, 0, "umask %s: q4khost %s exited with status %d:\n%s", masks[m],
		             args, st, json_dumps(j, JSON_COMPACT));
		cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "decode"),
		                                                "tokens")),
		             4, "umask %s: %s", masks[m], json_dumps(j, JSON_COMPACT));
		json_decref(j);
		free(host);
		free(dir);
	}

	/* Every plugin of the second build: the same bytes as both installs'. */
	script_value(work, "install", "elsewhere", elsewhere, sizeof(elsewhere));
	script_value(work, "install", "built elsewhere", built, sizeof(built));
	for (char *t = strtok_r(built, " ", &last); t; t = strtok_r(NULL, " ", &last)) {
		/* plugins/NAME/NAME.la */
		char *name = strrchr(t, '/') + 1;

		*strrchr(name, '.') = 0;
		for (int m = 0; m < 2; m++) {
			cr_assert_geq(asprintf(&so, "%s%s/%s.so", stage[m],
			                       getenv("Q4KH_TEST_PLUGINDIR"), name), 0);
			file_sha256(so, hex[m]);
			free(so);
		}
		cr_assert_geq(asprintf(&lib, "%s/plugins/%s/.libs/%s.so", elsewhere, name, name),
		              0);
		file_sha256(lib, hex[2]);
		cr_expect_str_eq(hex[0], hex[1], "%s.so: installed twice, two files", name);
		cr_expect_str_eq(hex[0], hex[2], "%s.so differs when built in %s", name, elsewhere);
		free(lib);
		compared++;
	}
	cr_expect_geq(compared, 1, "no plugin compared");
}

Test(package, distcheck_passes, .timeout = 1800)
{
	const char *work;

	require_packaging();
	work = test_tmpdir();
	run_script(work, "distcheck", work);
}

/* The SDK's headers, in every package set (the CUDA ones too). */
static const char *const sdk_headers[] = {
	"plugin.h", "quant.h", "contract.h", "top2.h", "step.h", "pool.h", "glu.h", "moe.h",
	"dequant.h", "cpu_isa.h", "backend_base.h", "cpu_backend.h", "cuda_tc.h", "cuda_retired.h", "cuda_variant.h",
	"cuda_variant_scratch.h", "cuda_variant_device.cuh", "cuda_q4k_device.cuh",
	"cuda_q6k_device.cuh", "cuda_quant.cuh", "cuda_glu.cuh", "cuda_pdl.cuh", "cuda_preload.cuh",
};

/* FILE exists under ROOT, a regular file. */
static void expect_file(const char *root, const char *file)
{
	char path[4096];
	struct stat sb;

	snprintf(path, sizeof(path), "%s%s", root, file);
	cr_expect(stat(path, &sb) == 0 && S_ISREG(sb.st_mode), "%s is not in the packages",
	          file);
}

/* LIBDIR/NAME under ROOT (LIBDIR as the packages install it). */
static void expect_lib_file(const char *root, const char *libdir, const char *name)
{
	char *file;

	cr_assert_geq(asprintf(&file, "%s/%s", libdir, name), 0);
	expect_file(root, file);
	free(file);
}

/* Integer VALUE of a "KEY: VALUE" line of a script's output. */
static long script_number(const char *work, const char *script, const char *key)
{
	char buf[64], *end;
	long n;

	script_value(work, script, key, buf, sizeof(buf));
	n = strtol(buf, &end, 10);
	cr_assert(end != buf && !*end, "%s: '%s: %s' is not a number", script, key, buf);
	return n;
}

/*
 * What the packages of every distribution hold and do, unpacked or
 * installed into WORK/root by tests/package/SCRIPT.sh: the files of the
 * host and SDK packages (plugin-abi.md at SDK_DOC), of the CUDA bundle when
 * built, the plugin folder under LIBDIR built into the host, and from the
 * root the cpu plugins accepted and a short run of MODEL.
 *
 * The host runs from the root with this machine's libraries: the packages
 * hold no shared library of their own (libq4khost is linked into the
 * command), so no LD_LIBRARY_PATH points into the root. Its built-in
 * plugin folder is outside the root, so --plugin-path names the root's.
 */
static void check_packages(const char *work, const char *script, const char *libdir,
                           const char *sdk_doc, const char *model)
{
	char *root, *dir, *plugins, *host, *file, args[CMD_MAX], cuda[16];
	json_t *j, *q4k;
	int st, simd = 0, simd8 = 0;

	script_value(work, script, "cuda", cuda, sizeof(cuda));
	cr_assert_geq(asprintf(&root, "%s/root", work), 0);
	cr_assert_geq(asprintf(&dir, "%s/q4khost/plugins-abi%d", libdir, Q4KH_ABI_MAJOR), 0);
	cr_assert_geq(asprintf(&plugins, "%s%s", root, dir), 0);
	cr_assert_geq(asprintf(&host, "%s/usr/bin/q4khost", root), 0);

	/* The host and SDK packages: what each must hold. */
	expect_file(root, "/usr/bin/q4khost");
	cr_assert_geq(asprintf(&file, "%s/cpu.so", dir), 0);
	expect_file(root, file);
	free(file);
	cr_assert_geq(asprintf(&file, "%s/plugins/cpu-simd/.libs/cpu-simd.so", test_builddir()),
	              0);
	if (access(file, R_OK) == 0) {
		free(file);
		cr_assert_geq(asprintf(&file, "%s/cpu-simd.so", dir), 0);
		expect_file(root, file);
		free(file);
		cr_assert_geq(asprintf(&file, "%s/cpu-fast.so", dir), 0);
		expect_file(root, file);
		free(file);
		cr_assert_geq(asprintf(&file, "%s/cpu-simd8.so", dir), 0);
		expect_file(root, file);
		__builtin_cpu_init();
		simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
		simd8 = simd && __builtin_cpu_supports("avx512f") &&
		        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
		        __builtin_cpu_supports("avx512vnni");
	}
	free(file);
	expect_file(root, "/etc/q4khost/q4khost.ini");
	expect_file(root, "/usr/share/man/man1/q4khost.1.gz");
	expect_file(root, "/usr/share/man/man5/q4khost.ini.5.gz");
	expect_file(root, "/usr/share/man/man7/q4khost-plugin.7.gz");
	expect_file(root, "/usr/share/bash-completion/completions/q4khost");
	expect_file(root, "/usr/share/q4khost/fetch-model.sh"); /* the CLI's hint names it */
	for (size_t i = 0; i < sizeof(sdk_headers) / sizeof(sdk_headers[0]); i++) {
		cr_assert_geq(asprintf(&file, "/usr/include/q4khost/%s", sdk_headers[i]), 0);
		expect_file(root, file);
		free(file);
	}
	expect_lib_file(root, libdir, "pkgconfig/q4khost-plugin.pc");
	expect_lib_file(root, libdir, "libq4khost_sdk.a");
	expect_file(root, sdk_doc);

	/* The CUDA bundle, when the build tree has the CUDA plugins. */
	if (!strcmp(cuda, "yes")) {
		static const char *const bundle[] = { "cuda", "cuda-mwv", "cuda-dp4a",
			                              "cuda-gemv-iq" };

		expect_file(root, "/etc/q4khost/conf.d/50-cuda.ini");
		/* and the SDK's CUDA library (-dev-cuda, -devel-cuda) */
		expect_lib_file(root, libdir, "libq4khost_sdk_cuda.a");
		expect_lib_file(root, libdir, "pkgconfig/q4khost-plugin-cuda.pc");
		snprintf(args, sizeof(args),
		         "plugins --plugin-path '%s' --config '%s/etc/q4khost/conf.d/50-cuda.ini'",
		         plugins, root);
		j = host_json(work, host, args, &st);
		cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
		for (size_t i = 0; i < sizeof(bundle) / sizeof(bundle[0]); i++)
			expect_accepted(j, bundle[i], i ? "kernel" : "backend", plugins);
		json_decref(j);
	}

	/* The installed host looks in the packages' plugin folder by itself. */
	j = host_json(work, host, "plugins", &st);
	cr_expect_eq(st, 0, "q4khost plugins exited with status %d", st);
	cr_expect_str_eq(str(j, "plugin_path"), dir);
	cr_expect_str_eq(str(j, "path_origin"), "built-in");
	json_decref(j);

	/* The scratch root hides that folder: name it. */
	snprintf(args, sizeof(args), "plugins --plugin-path '%s'", plugins);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	expect_accepted(j, "cpu", "backend", plugins);
	if (simd) {
		expect_accepted(j, "cpu-simd", "kernel", plugins);
		expect_accepted(j, "cpu-simd8", "kernel", plugins);
	}
	json_decref(j);

	/* A short run; the packaged default configuration parses. Where
	 * cpu-simd was built and this CPU runs it, it serves Q4_K after F2;
	 * where the CPU has AVX-512 VNNI, cpu-simd8 is tried first, and on
	 * the reference F2 passes it (the default model's lowest cosine
	 * 0.993 at the int8 class's floor, 0.99). */
	snprintf(args, sizeof(args),
	         "run --plugin-path '%s' --config '%s/etc/q4khost/q4khost.ini' --backend cpu "
	         "-m '%s' -n 4 -p 'The capital of France is'",
	         plugins, root, model);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	q4k = json_object_get(json_object_get(j, "kernels"), "Q4_K");
	cr_expect_str_eq(str(q4k, "plugin"), simd8 ? "cpu-simd8" : simd ? "cpu-simd" : "cpu");
	cr_assert_geq(asprintf(&file, "%s/cpu.so", plugins), 0);
	cr_expect_str_eq(str(json_object_get(j, "backend"), "file"), file);
	free(file);
	/* Tokens, not text: a random-weight model's bytes need not be UTF-8,
	 * and --json leaves such text out. */
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "decode"), "tokens")),
	             4, "%s", json_dumps(j, JSON_COMPACT));
	json_decref(j);

	/* Without --backend and without a GPU, cpu-fast serves after F2. */
	if (simd) {
		snprintf(args, sizeof(args),
		         "run --plugin-path '%s' --config '%s/etc/q4khost/q4khost.ini' "
		         "-n 4 -p 'The capital of France is'",
		         plugins, root);
		j = host_json(work, host, args, &st);
		cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
		cr_expect_str_eq(str(json_object_get(j, "backend"), "name"), "cpu-fast");
		cr_expect_str_eq(str(json_object_get(j, "f2"), "verdict"), "pass");
		json_decref(j);
	}
	free(host);
	free(plugins);
	free(dir);
	free(root);
}

Test(package, debs_build_lint_clean_and_run_from_a_scratch_root, .timeout = 1800)
{
	const char *work, *model;
	char multiarch[256], libdir[300];

	require_packaging();
	model = test_model_path();
	work = test_tmpdir();
	run_script(work, "debs", work);
	/* Built again at the same path: the same files, byte for byte. */
	script_value(work, "debs", "reproducible", multiarch, sizeof(multiarch));
	cr_expect_str_eq(multiarch, "yes");
	script_value(work, "debs", "multiarch", multiarch, sizeof(multiarch));
	snprintf(libdir, sizeof(libdir), "/usr/lib/%s", multiarch);
	/* Debian compresses documents over 4 KiB. */
	check_packages(work, "debs", libdir, "/usr/share/doc/q4khost-dev/plugin-abi.md.gz",
	               model);
}

/*
 * The RPMs, built here with Debian's rpm in the layout of Fedora's
 * (tests/package/rpm-macros), rpmlint-clean, installed with rpm --root and
 * run from there on a tiny model; the SDK example built against the
 * installed -devel files.
 */
Test(package, rpms_build_lint_clean_and_run_from_a_scratch_root, .timeout = 1800)
{
	const char *work;
	char libdir[256], vendor[4096], args[CMD_MAX], *root, *model, *host, *out;
	json_t *j;
	long elf;
	int st;

	require_packaging();
	work = test_tmpdir();
	run_script(work, "rpms", work);
	script_value(work, "rpms", "libdir", libdir, sizeof(libdir));
	cr_assert_geq(asprintf(&model, "%s/tests/fixtures/tiny-llama.gguf", test_srcdir()), 0);
	check_packages(work, "rpms", libdir, "/usr/share/doc/q4khost-devel/plugin-abi.md",
	               model);
	free(model);

	cr_assert_geq(asprintf(&root, "%s/root", work), 0);
	expect_file(root, "/usr/share/doc/q4khost/README.md");
	expect_file(root, "/usr/share/licenses/q4khost/LICENSE");
	expect_file(root, "/usr/share/licenses/q4khost-devel/LICENSE");

	/* Every ELF file stripped, its debug information in -debuginfo, none
	 * with a RUNPATH (the script's output names them). */
	cr_assert_geq(asprintf(&out, "%s/rpms.out", work), 0);
	elf = script_number(work, "rpms", "elf");
	cr_expect_geq(elf, 2, "%ld ELF files in the packages", elf);
	cr_expect_eq(script_number(work, "rpms", "debuglink"), elf,
	             "not every ELF file is stripped with a debug link");
	cr_expect_eq(script_number(work, "rpms", "debuginfo"), elf,
	             "q4khost-debuginfo does not hold one debug file per ELF file");
	cr_expect_eq(script_number(work, "rpms", "runpath"), 0, "%s", log_tail(out));
	free(out);

	/* The example a vendor builds against q4khost-devel is a plugin the
	 * installed host accepts. */
	script_value(work, "rpms", "vendor-plugins", vendor, sizeof(vendor));
	cr_assert_geq(asprintf(&host, "%s/usr/bin/q4khost", root), 0);
	snprintf(args, sizeof(args), "plugins --plugin-path '%s%s/q4khost/plugins-abi%d:%s'",
	         root, libdir, Q4KH_ABI_MAJOR, vendor);
	j = host_json(work, host, args, &st);
	cr_expect_eq(st, 0, "q4khost %s exited with status %d", args, st);
	expect_accepted(j, "example-cpu-q4k", "kernel", vendor);
	json_decref(j);
	free(host);
	free(root);
}
