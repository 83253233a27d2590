/*
 * A/B and QA through the real CLI and loader, with the cpu-targeting test
 * variants (tests/plugins): `q4khost validate --plot` draws one series per
 * candidate from the measurement (and the same image again from receipts
 * alone), with no text past the image's edge and none over other text, `q4khost bench` compares a variant with the built-in kernels,
 * `q4khost bench-kernels` checks and times each kernel's GEMV,
 * and `q4khost qa` judges golden cases on every path that passes F2 and
 * refuses a knife-edge case (tests/fixtures/qa-cases.jsonl, margins from
 * llama.cpp). A short probe (16 tokens) keeps the measurements quick.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_rig.h"
#include "helpers.h"

#define SHORT_PROBE "[f2]\nf2_probe_tokens = 16\n"

struct rig {
	const char *plugins, *receipts;
	char cfg[4200];
	char model[4300]; /* "-m PATH", or empty: the default model */
};

/* The rig on MODEL (NULL: the default model) with plugins NAMES. */
static void rig_open(struct rig *r, const char *const *names, const char *model)
{
	if (model) {
		snprintf(r->model, sizeof(r->model), "-m %s", model);
	} else {
		r->model[0] = 0;
		test_model_path();
	}
	r->plugins = test_plugin_dir(names);
	r->receipts = test_tmpdir();
	snprintf(r->cfg, sizeof(r->cfg), "%s/short.ini", r->receipts);
	test_write_file(r->cfg, SHORT_PROBE, strlen(SHORT_PROBE));
}

/* q4khost COMMAND ARGS with the rig's plugins, receipts and config. */
static int q4khost(const struct rig *r, const char *env, const char *command,
                   const char *args, char **out)
{
	char cmd[16384];

	snprintf(cmd, sizeof(cmd),
	         "env -u Q4KHOST_Q4K_KERNEL -u Q4KHOST_F2 -u Q4KHOST_BACKEND XDG_CONFIG_HOME=%s "
	         "Q4KHOST_F2_RECEIPT_DIR=%s %s %s/host/cli/q4khost %s %s --plugin-path %s --config %s %s",
	         r->receipts, r->receipts, env, test_builddir(), command, r->model, r->plugins, r->cfg,
	         args);
	return test_shell(cmd, out);
}

/*
 * What the SVG at PATH holds, read by an XML parser (Python's): per
 * data-candidate, its series count, its line's pen-downs, its marks by
 * class and their positions; the floor lines and boundaries.
 */
static json_t *svg_summary(const char *path)
{
	static const char script[] =
		"import json, sys, xml.etree.ElementTree as E\n"
		"S = '{http://www.w3.org/2000/svg}'\n"
		"root = E.parse(sys.argv[1]).getroot()\n"
		"out = {'candidates': {}, 'floors': 0, 'boundaries': 0}\n"
		"for g in root.iter(S + 'g'):\n"
		"    if g.get('class') != 'panel':\n"
		"        continue\n"
		"    series = [p for p in g.iter(S + 'path') if p.get('data-candidate')]\n"
		"    for s in series:\n"
		"        c = out['candidates'].setdefault(s.get('data-candidate'),\n"
		"            {'series': 0, 'moves': 0, 'points': 0, 'marks': {}})\n"
		"        c['series'] += 1\n"
		"        c['moves'] += s.get('d').count('M')\n"
		"        c['points'] += s.get('d').count('M') + s.get('d').count('L')\n"
		"        for m in g.iter():\n"
		"            cls = (m.get('class') or '').split()\n"
		"            if 'mark' in cls:\n"
		"                c['marks'].setdefault(cls[1], []).append(int(m.get('data-position')))\n"
		"    for l in g.iter(S + 'line'):\n"
		"        cls = l.get('class') or ''\n"
		"        out['floors'] += cls.startswith('floor')\n"
		"        out['boundaries'] += cls == 'boundary'\n"
		"# Every line of text as a box, its width estimated from its length:\n"
		"# none may leave the image or overlap another.\n"
		"parent = {c: p for p in root.iter() for c in p}\n"
		"def size(e):\n"
		"    while e is not None and e.get('font-size') is None:\n"
		"        e = parent.get(e)\n"
		"    return float(e.get('font-size')) if e is not None else 16.0\n"
		"boxes = []\n"
		"for t in root.iter(S + 'text'):\n"
		"    fs, x, y = size(t), float(t.get('x')), float(t.get('y'))\n"
		"    bold = t.get('font-weight') == 'bold'\n"
		"    lines = [(s.text or '', float(s.get('dy') or 0)) for s in t.iter(S + 'tspan')]\n"
		"    for text, dy in lines or [(t.text or '', 0.0)]:\n"
		"        y += dy\n"
		"        w = len(text) * fs * (0.6 if bold else 0.55)\n"
		"        x0 = x - (w if t.get('text-anchor') == 'end' else w / 2 if t.get('text-anchor') == 'middle' else 0)\n"
		"        boxes.append((x0, y - 0.8 * fs, x0 + w, y + 0.2 * fs, text))\n"
		"W = float(root.get('width'))\n"
		"out['overflow'] = [b[4] for b in boxes if b[0] < 0 or b[2] > W]\n"
		"out['overlaps'] = [a[4] + ' | ' + b[4] for i, a in enumerate(boxes) for b in boxes[i + 1:]\n"
		"                   if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]]\n"
		"print(json.dumps(out))\n";
	char cmd[8192], *out, *script_path = NULL;
	json_t *j;
	int rc;

	script_path = malloc(4200);
	snprintf(script_path, 4200, "%s/svg.py", test_tmpdir());
	test_write_file(script_path, script, strlen(script));
	snprintf(cmd, sizeof(cmd), "python3 %s %s", script_path, path);
	rc = test_shell(cmd, &out);
	cr_assert_eq(rc, 0, "the SVG does not parse as XML: %s", out);
	j = parse_json(out);
	free(out);
	free(script_path);
	return j;
}

static json_t *candidate(json_t *summary, const char *name)
{
	json_t *c = json_object_get(json_object_get(summary, "candidates"), name);

	cr_assert_not_null(c, "no series for %s", name);
	return c;
}

static size_t n_marks(json_t *c, const char *cls)
{
	return json_array_size(json_object_get(json_object_get(c, "marks"), cls));
}

Test(ab, validate_plot_draws_one_series_per_candidate_from_receipts, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", "defect_kv", "defect_nan",
		                             "defect_abort", NULL };
	struct rig r;
	char *out, args[4400], first[4200], second[4200], *a, *b;
	const char *key;
	size_t la, lb, i;
	json_t *s, *c, *v;

	test_skip_under_sanitizers("four F2 measurements on the default model before the plot, "
	                           "which reads receipts only");
	rig_open(&r, names, NULL);
	snprintf(first, sizeof(first), "%s/fresh.svg", r.receipts);
	snprintf(second, sizeof(second), "%s/receipts.svg", r.receipts);
	snprintf(args, sizeof(args), "--plot %s", first);
	cr_expect_eq(q4khost(&r, "", "validate", args, &out), 1, "defects fail: %s", out);
	free(out);
	s = svg_summary(first);
	cr_expect_eq(json_object_size(json_object_get(s, "candidates")), 4);
	json_object_foreach(json_object_get(s, "candidates"), key, v)
		cr_expect_eq(json_integer_value(json_object_get(v, "series")), 1, "%s", key);
	cr_expect_eq(json_integer_value(json_object_get(s, "floors")), 8,
	             "both floors in every panel");
	cr_expect_eq(json_integer_value(json_object_get(s, "boundaries")), 3,
	             "the prefill/decode boundary wherever positions were measured");
	cr_expect_eq(json_array_size(json_object_get(s, "overflow")), 0, "text past the edge: %s",
	             json_dumps(json_object_get(s, "overflow"), 0));
	cr_expect_eq(json_array_size(json_object_get(s, "overlaps")), 0, "text over text: %s",
	             json_dumps(json_object_get(s, "overlaps"), 0));

	/* 16 prefill positions, 8 decode steps and the batched steps' 4 x 4
	 * points (docs/f2.md), position 0 not judged. */
	c = candidate(s, "cpu/cpu-q8act on device 0");
	cr_expect_eq(json_integer_value(json_object_get(c, "points")), 40);
	cr_expect_eq(json_integer_value(json_object_get(c, "moves")), 1, "one unbroken line");
	cr_expect_eq(n_marks(c, "rejected"), 0);
	cr_expect_eq(n_marks(c, "unjudged"), 1);

	/* The KV defect: marked from decode step 4 (position 20) on, and only there. */
	c = candidate(s, "cpu/defect-kv on device 0");
	cr_expect_geq(n_marks(c, "rejected"), 1);
	json_array_foreach(json_object_get(json_object_get(c, "marks"), "rejected"), i, v)
		cr_expect_geq(json_integer_value(v), 20, "a rejected mark in prefill");

	/* NaN everywhere: marked at every position, no line drawn. */
	c = candidate(s, "cpu/defect-nan on device 0");
	cr_expect_eq(json_integer_value(json_object_get(c, "points")), 0);
	cr_expect_eq(n_marks(c, "nonfinite"), 40);

	/* A crash measured nothing: an empty series, still one per candidate. */
	c = candidate(s, "cpu/defect-abort on device 0");
	cr_expect_eq(json_integer_value(json_object_get(c, "points")), 0);
	json_decref(s);

	/* The second run decides from receipts alone and draws the same image. */
	snprintf(args, sizeof(args), "--plot %s", second);
	cr_expect_eq(q4khost(&r, "", "validate", args, &out), 1, "%s", out);
	cr_expect(strstr(out, "receipt of ") != NULL, "%s", out);
	cr_expect_null(strstr(out, "fresh ("), "%s", out);
	free(out);
	a = test_read_file(first, &la);
	b = test_read_file(second, &lb);
	cr_assert(a && b);
	cr_expect(la == lb && !memcmp(a, b, la), "the plot from receipts differs from the fresh one");
	free(a);
	free(b);
}

/*
 * bench on the tiny llama model (what is under test is bench's rows, its
 * F2 gate and its options, not the model): the variant and the built-in
 * kernels timed, the variant alone, a list from the environment whose
 * rejected member is never timed, and bad options.
 */
Test(ab, bench_compares_a_variant_with_the_built_in_kernels, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", "defect_nan", NULL };
	struct rig r;
	char *out;
	json_t *j, *row;
	size_t i;

	rig_open(&r, names, tiny_model());
	cr_assert_eq(q4khost(&r, "", "bench", "--kernels cpu-q8act -n 3 -p 'The water cycle' --json",
	                     &out),
	             0, "%s", out);
	j = parse_json(out);
	cr_expect_eq(json_integer_value(json_object_get(j, "decode_tokens")), 3);
	cr_expect_eq(json_integer_value(json_object_get(j, "repetitions")), 3, "the default");
	cr_assert_eq(json_array_size(json_object_get(j, "rows")), 2, "the variant and built-in");
	json_array_foreach(json_object_get(j, "rows"), i, row) {
		json_t *f2 = json_object_get(row, "f2");
		const char *k = json_string_value(json_object_get(row, "kernel"));

		cr_expect_gt(json_number_value(json_object_get(row, "prefill_tokens_per_second")), 0, "%s", k);
		cr_expect_gt(json_number_value(json_object_get(row, "decode_tokens_per_second")), 0, "%s", k);
		if (i == 0) {
			cr_expect_str_eq(k, "cpu-q8act");
			cr_expect_str_eq(json_string_value(json_object_get(f2, "verdict")), "pass");
			cr_expect_geq(json_number_value(json_object_get(f2, "min_cosine")), 0.99);
			cr_expect(json_is_integer(json_object_get(f2, "near_ties")));
			cr_expect(strstr(json_string_value(json_object_get(f2, "source")), "fresh") != NULL);
		} else {
			cr_expect_str_eq(k, "built-in");
			cr_expect_str_eq(json_string_value(json_object_get(f2, "verdict")), "reference");
		}
	}
	json_decref(j);
	free(out);
	cr_assert_eq(q4khost(&r, "", "bench",
	                     "--kernels cpu-q8act --no-built-in -n 2 -r 1 -p 'The water cycle' --json",
	                     &out),
	             0, "%s", out);
	j = parse_json(out);
	cr_expect_eq(json_integer_value(json_object_get(j, "repetitions")), 1);
	cr_assert_eq(json_array_size(json_object_get(j, "rows")), 1, "the variant alone");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "rows"), 0),
	                                                   "kernel")),
	                 "cpu-q8act");
	json_decref(j);
	free(out);

	/* The list from the environment; a rejected variant is never timed. */
	cr_expect_eq(q4khost(&r, "Q4KHOST_Q4K_KERNEL=cpu-q8act,defect-nan", "bench",
	                     "-n 2 -p 'The water cycle'", &out),
	             1, "%s", out);
	cr_expect(strstr(out, "cpu-q8act") != NULL && strstr(out, "receipt of ") != NULL,
	          "the receipt of the first run decides: %s", out);
	cr_expect(strstr(out, "not timed: F2 reject: position 1 (prefill)") != NULL, "%s", out);
	cr_expect(strstr(out, "built-in") != NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost(&r, "", "bench", "--kernels cpu-q8act -r 0", &out), 2, "%s", out);
	cr_expect(strstr(out, "--repetitions") != NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost(&r, "", "bench", "--kernels cpu-q8", &out), 4, "%s", out);
	cr_expect(strstr(out, "--kernels: 'cpu-q8' is not a kernel variant") != NULL, "%s", out);
	free(out);
}

/*
 * A row F2 could not measure (defect-fail fails every product, F2.4) has
 * no cosine, in the table or the JSON, and its note says "not measured"
 * once, with the child's reason.
 */
Test(ab, bench_row_not_measured_has_no_cosine_and_says_so_once, .timeout = 300)
{
	static const char *const names[] = { "defect_fail", NULL };
	const char *args = "--kernels defect-fail --no-built-in -n 2 -r 1 -p 'The water cycle'";
	struct rig r;
	char *out, json_args[256];
	const char *row, *note;
	json_t *j, *f2;

	rig_open(&r, names, tiny_model());
	cr_assert_eq(q4khost(&r, "", "bench", args, &out), 1, "%s", out);
	row = strstr(out, "\ncpu ");
	cr_assert_not_null(row, "%s", out);
	note = strstr(row, "not timed: F2 not measured: the candidate failed in prefill (F2.4): ");
	cr_expect_not_null(note, "%s", out);
	cr_expect_null(strstr(row, "0.0000"), "a cosine on a row that measured none: %s", out);
	cr_expect_null(strstr(out, "not measured: not measured"), "%s", out);
	cr_expect(strstr(row, " not measured -") != NULL, "the min cos column is empty: %s", out);
	free(out);
	snprintf(json_args, sizeof(json_args), "%s --json", args);
	cr_assert_eq(q4khost(&r, "", "bench", json_args, &out), 1, "%s", out);
	j = parse_json(out);
	f2 = json_object_get(json_array_get(json_object_get(j, "rows"), 0), "f2");
	cr_expect_str_eq(json_string_value(json_object_get(f2, "verdict")), "not measured");
	cr_expect(json_is_null(json_object_get(f2, "min_cosine")), "%s", out);
	json_decref(j);
	free(out);
}

/*
 * bench-kernels on the cpu backend, which has none of ABI 1.1's entries:
 * timed by the host clock, no ceiling, every row checked against the
 * built-in before it is timed.
 */
Test(ab, bench_kernels_checks_then_times_each_kernel, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	struct rig r;
	char *out;
	json_t *j, *row;
	size_t i, variant = 0;

	rig_open(&r, names, NULL);
	cr_assert_eq(q4khost(&r, "", "bench-kernels",
	                     "--backend cpu --shapes gemma3-270m --types Q4_K --max-batch 2 "
	                     "--min-mib 2 --repeat 1 --json",
	                     &out),
	             0, "%s", out);
	j = parse_json(out);
	cr_expect(json_is_null(json_object_get(j, "read_ceiling_gbps")));
	cr_expect_str_eq(json_string_value(json_object_get(j, "clock")), "host");
	cr_assert_eq(json_array_size(json_object_get(j, "rows")), 4,
	             "built-in and cpu-q8act on two shapes: %s", out);
	json_array_foreach(json_object_get(j, "rows"), i, row) {
		const char *k = json_string_value(json_object_get(row, "kernel"));
		json_t *us = json_object_get(row, "us");

		cr_expect_str_eq(json_string_value(json_object_get(row, "type")), "Q4_K");
		cr_expect_eq(json_array_size(us), 2);
		cr_expect_gt(json_number_value(json_array_get(us, 0)), 0, "%s", k);
		cr_expect_gt(json_number_value(json_array_get(us, 1)), 0, "%s", k);
		/* int8 activations: near 1e-5 (cuda_variant_rig.h), under 5e-4 */
		cr_expect_lt(json_number_value(json_object_get(row, "nmse")), 5e-4, "%s", k);
		variant += !strcmp(k, "cpu-q8act");
	}
	cr_expect_eq(variant, 2);
	json_decref(j);
	free(out);
	cr_expect_eq(q4khost(&r, "", "bench-kernels", "--backend cpu --kernels nothing", &out), 4,
	             "%s", out);
	cr_expect(strstr(out, "no accepted variant 'nothing'") != NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost(&r, "", "bench-kernels", "--types Q8_K", &out), 2, "%s", out);
	free(out);
	/* without --backend: the one run tries first, here the reference */
	cr_expect_eq(q4khost(&r, "", "bench-kernels",
	                     "--shapes gemma3-270m --types Q4_K --max-batch 1 --min-mib 2 "
	                     "--repeat 1 --kernels ''",
	                     &out),
	             0, "%s", out);
	cr_expect(strstr(out, "q4khost bench-kernels: backend cpu, the one q4khost run tries first "
	                      "here (--backend NAME times another)\n") != NULL,
	          "%s", out);
	free(out);
}

Test(ab, qa_judges_golden_cases_and_refuses_knife_edges, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	static const char wrong[] =
		"{\"prompt\": \"1, 2, 3, 4, 5, 6,\", \"accept\": [\" 8\"], \"max_tokens\": 2}\n";
	static const char misspelt[] = "\n{\"prompt\": \"x\", \"acept\": [\"y\"]}\n";
	struct rig r;
	char *out, args[8400], cases[4200];
	json_t *j, *c;

	rig_open(&r, names, NULL);
	snprintf(args, sizeof(args), "--cases %s/tests/fixtures/qa-cases.jsonl --json",
	         test_srcdir());
	cr_assert_eq(q4khost(&r, "", "qa", args, &out), 0, "%s", out);
	j = parse_json(out);
	cr_expect_eq(json_array_size(json_object_get(j, "paths")), 2, "the reference and cpu-q8act");
	c = json_array_get(json_object_get(j, "cases"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(c, "name")), "counting");
	cr_expect(json_is_false(json_object_get(c, "knife_edge")));
	cr_expect_eq(json_array_size(json_object_get(c, "results")), 2);
	cr_expect(json_is_true(json_object_get(json_array_get(json_object_get(c, "results"), 1), "pass")),
	          "on cpu-q8act too");
	/* llama.cpp: margins 0.33 then 0.20 logits; the smaller one names it. */
	c = json_array_get(json_object_get(j, "cases"), 1);
	cr_expect(json_is_true(json_object_get(c, "knife_edge")));
	cr_expect_eq(json_integer_value(json_object_get(c, "min_margin_step")), 1);
	cr_expect(fabs(json_number_value(json_object_get(c, "min_margin")) - 0.20) < 0.05,
	          "margin %f", json_number_value(json_object_get(c, "min_margin")));
	cr_expect_eq(json_array_size(json_object_get(c, "results")), 1,
	             "a knife edge is not judged on the candidates");
	cr_expect_eq(json_integer_value(json_object_get(j, "passed")), 1);
	cr_expect_eq(json_integer_value(json_object_get(j, "knife_edge")), 1);
	json_decref(j);
	free(out);

	/* A wrong golden fails the gate, on every path it names. */
	snprintf(cases, sizeof(cases), "%s/wrong.jsonl", r.receipts);
	test_write_file(cases, wrong, strlen(wrong));
	snprintf(args, sizeof(args), "--cases %s", cases);
	cr_expect_eq(q4khost(&r, "", "qa", args, &out), 1, "%s", out);
	cr_expect(strstr(out, "cpu/built-in                     FAIL") != NULL, "%s", out);
	cr_expect(strstr(out, "cpu/cpu-q8act on device 0        FAIL") != NULL, "%s", out);
	cr_expect(strstr(out, "0 golden cases passed on every path, 1 failed") != NULL, "%s", out);
	free(out);

	/* A misspelt key is an error naming the line. */
	test_write_file(cases, misspelt, strlen(misspelt));
	cr_expect_eq(q4khost(&r, "", "qa", args, &out), 3, "%s", out);
	cr_expect(strstr(out, "wrong.jsonl:2: unknown key \"acept\"") != NULL, "%s", out);
	free(out);
}

/*
 * scripts/bench-engines.sh's table (the GPU comparison with llama.cpp),
 * built from recorded JSON files without a GPU: llama-bench's (in the
 * schema its README shows) and q4khost bench's own, where one row was not
 * timed (a variant the model has none of the types of: bench exits 1 and
 * writes every row), as on the H100 run whose table came out empty.
 */
Test(ab, bench_engines_builds_its_table_from_recorded_json)
{
	char cmd[4200], *out;

	snprintf(cmd, sizeof(cmd), "bash %s/scripts/bench-engines.sh --self-check", test_srcdir());
	cr_expect_eq(test_shell(cmd, &out), 0, "%s", out);
	free(out);
}
