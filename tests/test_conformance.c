/*
 * q4khost conformance through the real CLI: a backend that is the
 * reference behind a recording layer passes every case; one with three
 * planted op defects (a wrong eps, a write past the output, an element
 * left unwritten) fails exactly those cases, each with its reason, and
 * the command exits 1; with no backend but the reference it exits 4.
 * Whole steps (ABI 1.6): cpu-fast's graph entry agrees with the reference
 * and with its own nodes; a backend whose graph_compute drops a node
 * fails those cases, and only those; one whose router misroutes tokens
 * fails moe_route's expert ids (ABI 1.7), and only those; one whose copy
 * of F16 to F16 is wrong (a KV cache's prefix taken for reuse) fails that
 * case alone.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static json_t *conformance(const char *plugins, const char *args, int *rc)
{
	char *cmd = NULL, *out = NULL;
	json_error_t jerr;
	json_t *j;

	if (asprintf(&cmd, "%s/host/cli/q4khost conformance --json --plugin-path %s %s 2>/dev/null",
	             test_builddir(), plugins, args) < 0)
		cr_assert_fail("out of memory");
	*rc = test_shell(cmd, &out);
	j = json_loads(out, 0, &jerr);
	cr_assert_not_null(j, "%s: not JSON (%s): %s", cmd, jerr.text, out);
	free(cmd);
	free(out);
	return j;
}

/* Is case C a row of an entry the test plugins do not all have: the one
 * row of a backend without the graph entries (ABI 1.6), or attention_paged
 * (ABI 1.8: replay.c gives it to replay-ok and replay-page alone)? */
static int skipped_entry(json_t *c)
{
	const char *op = json_string_value(json_object_get(c, "op"));
	const char *msg = json_string_value(json_object_get(c, "message"));

	return op && msg &&
	       ((!strcmp(op, "graph_compute") && strstr(msg, "no graph_prepare")) ||
	        (!strcmp(op, "attention_paged") && !strcmp(msg, "no such entry (ABI 1.8)")));
}

/* The cases of the one device in J. */
static json_t *cases_of(json_t *j)
{
	json_t *devices = json_object_get(j, "devices");

	cr_assert_eq(json_array_size(devices), 1);
	return json_object_get(json_array_get(devices, 0), "cases");
}

static const char *str(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));
	return s ? s : "";
}

Test(conformance, the_reference_behind_a_recorder_passes_every_case, .timeout = 300)
{
	static const char *const names[] = { "replay_ok", NULL };
	json_t *j, *c;
	size_t i;
	int rc;

	j = conformance(test_plugin_dir(names), "", &rc);
	cr_expect_eq(rc, 0);
	json_array_foreach(cases_of(j), i, c)
		cr_expect_str_eq(str(c, "result"), skipped_entry(c) ? "skip" : "pass", "%s %s: %s",
		                 str(c, "op"), str(c, "case"), str(c, "message"));
	cr_expect_geq(json_array_size(cases_of(j)), 80);
	cr_expect_eq(json_integer_value(json_object_get(j, "failed")), 0);
	json_decref(j);
}

/*
 * Conformance of the test plugin FILE (backend BACKEND): exit 1, and the
 * cases whose op is OP and whose description holds WHAT fail, the others
 * pass (or skip, the graph entry's without it); how many failed.
 */
static int only_those_fail(const char *file, const char *backend, const char *op_failing,
                           const char *what_failing)
{
	const char *const names[] = { file, NULL };
	char args[256];
	json_t *j, *c;
	size_t i;
	int rc, failed = 0;

	snprintf(args, sizeof(args), "--backend %s", backend);
	j = conformance(test_plugin_dir(names), args, &rc);
	cr_expect_eq(rc, 1, "a failed case makes the exit code 1");
	json_array_foreach(cases_of(j), i, c) {
		const char *op = str(c, "op"), *what = str(c, "case");
		int bad = !strcmp(op, op_failing) && strstr(what, what_failing);

		cr_expect_str_eq(str(c, "result"), bad ? "FAIL" : skipped_entry(c) ? "skip" : "pass",
		                 "%s %s: %s", op, what, str(c, "message"));
		failed += bad;
	}
	json_decref(j);
	return failed;
}

/* replay-route misroutes tokens 1, 5, ... of each moe_route call: the
 * expert ids of both moe_route cases fail (their weights, the
 * probabilities in order, stay right), and nothing else. */
Test(conformance, a_misrouting_router_fails_the_expert_ids_and_only_those, .timeout = 300)
{
	cr_expect_eq(only_those_fail("replay_route", "replay-route", "moe_route", "expert ids"), 2);
}

/* replay-reuse writes an F16 tensor's first token into every token's rows
 * when it copies F16 to F16 (what serve's prefix reuse does between KV
 * caches): the copy case of F16 to F16 fails, and nothing else. */
Test(conformance, a_wrong_f16_copy_fails_that_case_and_only_it, .timeout = 300)
{
	cr_expect_eq(only_those_fail("replay_reuse", "replay-reuse", "copy", "F16 to F16"), 1);
}

Test(conformance, planted_op_defects_fail_their_cases_and_only_those, .timeout = 300)
{
	static const char *const names[] = { "op_defects", NULL };
	json_t *j, *c;
	size_t i;
	int rc, norms = 0, scales = 0, adds = 0;

	j = conformance(test_plugin_dir(names), "--backend op-defects", &rc);
	cr_expect_eq(rc, 1, "a failed case makes the exit code 1");
	json_array_foreach(cases_of(j), i, c) {
		const char *op = str(c, "op"), *result = str(c, "result"), *msg = str(c, "message");

		if (!strcmp(op, "rms_norm")) {
			cr_expect_str_eq(result, "FAIL", "rms_norm %s", str(c, "case"));
			cr_expect(strstr(msg, "NMSE") != NULL, "%s", msg);
			norms++;
		} else if (!strcmp(op, "scale")) {
			cr_expect_str_eq(result, "FAIL");
			cr_expect(strstr(msg, "outside the output view") != NULL, "%s", msg);
			scales++;
		} else if (!strcmp(op, "add")) {
			cr_expect_str_eq(result, "FAIL");
			cr_expect(strstr(msg, "NaN (unwritten?)") != NULL, "%s", msg);
			adds++;
		} else {
			cr_expect_str_eq(result, skipped_entry(c) ? "skip" : "pass", "%s %s: %s", op,
			                 str(c, "case"), msg);
		}
	}
	cr_expect_eq(norms, 4);
	cr_expect_eq(scales, 1);
	cr_expect_eq(adds, 2);
	json_decref(j);
}

Test(conformance, no_backend_but_the_reference_is_an_error)
{
	static const char *const names[] = { NULL };
	char *cmd = NULL, *out = NULL;

	if (asprintf(&cmd, "%s/host/cli/q4khost conformance --plugin-path %s", test_builddir(),
	             test_plugin_dir(names)) < 0)
		cr_assert_fail("out of memory");
	cr_expect_eq(test_shell(cmd, &out), 4, "%s", out);
	cr_expect(strstr(out, "no backend but the reference") != NULL, "%s", out);
	free(cmd);
	free(out);
}

/* --device N that no backend has: the message names the number and the
 * path, in that order (the arguments were once given out of order). */
Test(conformance, a_device_no_backend_has_is_named)
{
	static const char *const names[] = { NULL };
	char *cmd = NULL, *out = NULL, *want = NULL;
	const char *plugins = test_plugin_dir(names);

	if (asprintf(&cmd, "%s/host/cli/q4khost conformance --device 3 --plugin-path %s",
	             test_builddir(), plugins) < 0 ||
	    asprintf(&want, "q4khost conformance: no backend but the reference with a device 3 "
	             "(--device) on the plugin path %s\n", plugins) < 0)
		cr_assert_fail("out of memory");
	cr_expect_eq(test_shell(cmd, &out), 4, "%s", out);
	cr_expect_str_eq(out, want);
	free(cmd);
	free(out);
	free(want);
}

/* The whole-step cases of J, counted; each must be RESULT. */
static int graph_cases(json_t *j, const char *result)
{
	json_t *c;
	size_t i;
	int n = 0;

	json_array_foreach(cases_of(j), i, c) {
		if (strcmp(str(c, "op"), "graph_compute"))
			continue;
		cr_expect_str_eq(str(c, "result"), result, "%s: %s", str(c, "case"),
		                 str(c, "message"));
		n++;
	}
	return n;
}

Test(conformance, a_graph_entry_that_drops_a_node_fails_the_whole_step_cases, .timeout = 300)
{
	static const char *const names[] = { "graph_drop", NULL };
	json_t *j, *c;
	size_t i;
	int rc;

	j = conformance(test_plugin_dir(names), "--backend graph-drop", &rc);
	cr_expect_eq(rc, 1, "a failed case makes the exit code 1");
	json_array_foreach(cases_of(j), i, c)
		if (strcmp(str(c, "op"), "graph_compute"))
			cr_expect_str_eq(str(c, "result"), skipped_entry(c) ? "skip" : "pass",
			                 "%s %s: %s", str(c, "op"), str(c, "case"), str(c, "message"));
	/* 3 runs and the cache, against the reference and against its nodes:
	 * the dropped residual add changes each run's output, and the next
	 * runs' keys in the cache */
	cr_expect_eq(graph_cases(j, "FAIL"), 8);
	json_decref(j);
}

Test(conformance, cpu_fast_takes_whole_steps_as_its_nodes_compute_them, .timeout = 300)
{
	static const char *const none[] = { NULL };
	const char *dir;
	char *cmd = NULL;
	json_t *j;
	int rc;

	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		cr_skip_test("cpu-fast needs AVX2 and FMA, which this CPU lacks");
	dir = test_plugin_dir(none);
	if (asprintf(&cmd, "cp %s/plugins/cpu-fast/.libs/cpu-fast.so %s/", test_builddir(), dir) < 0)
		cr_assert_fail("out of memory");
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	free(cmd);
	j = conformance(dir, "--backend cpu-fast", &rc);
	cr_expect_eq(rc, 0);
	cr_expect_eq(graph_cases(j, "pass"), 8);
	json_decref(j);
}
