/*
 * q4khost qa: the golden-output gate (docs/f2.md). Each case of a cases
 * file (qa_cases.h) is generated greedily on the reference cpu plugin and
 * on every candidate that passes F2 (candidates.h; a valid receipt or a
 * fresh measurement in a child process), and its text judged against the
 * case's accepted answers. A case whose greedy path on the reference has a
 * top-2 margin below the near-tie tolerance at any step is a knife edge:
 * correct backends may flip it, so it is reported (step and margin) and
 * refused as a golden, never judged. SIGINT or SIGTERM stops it after the
 * case in progress: the cases done are reported, the others as not run.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candidates.h"
#include "cli.h"
#include "config.h"
#include "greedy.h"
#include "guard.h"
#include "interrupt.h"
#include "model.h"
#include "progress.h"
#include "prompt.h"
#include "qa_cases.h"
#include "registry.h"
#include "serving.h"
#include "tokenizer.h"

struct qa_opts {
	struct q4kh_cli_common c;
	const char *cases;
	const char *chat_template; /* --chat-template NAME, NULL: the file's */
	int no_parse_special;
};

/* A path a case runs on: the reference, or a candidate that passed F2. */
struct path {
	struct q4kh_candidate c;
	char name[160];
	char f2[320]; /* "reference", or the verdict and its source */
};

/* What one case gave on one path. */
struct result {
	int ran, pass;
	char *text;
	char error[512];
};

struct qa_case_run {
	const struct q4kh_qa_case *qc;
	int32_t *ids;
	size_t n_ids;
	int knife_edge;
	int stopped; /* a signal stopped qa before it ran on every path */
	double min_margin;
	int64_t min_step;
	struct result *results; /* one per path */
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost qa --cases FILE [-m FILE] [OPTIONS]\n\n"
	        "The golden-output gate: generate each case greedily on the reference\n"
	        "cpu plugin and on every candidate (backend or kernel variant, per\n"
	        "device) that passes F2, and check the text against the case's accepted\n"
	        "answers. A case whose greedy path on the reference has a top-2 margin\n"
	        "below the near-tie tolerance (0.5 logits) at any step is a knife edge:\n"
	        "it is reported with the step and margin and refused as a golden.\n\n"
	        "Cases file: one JSON object per line, e.g.\n"
	        "  {\"prompt\": \"1, 2, 3, 4, 5, 6,\", \"accept\": [\" 7, 8, 9\"], \"max_tokens\": 8}\n"
	        "keys: prompt, accept (answers the text, leading white space aside, must\n"
	        "start with), max_tokens (default 16), chat (apply the chat template;\n"
	        "default false), name; '#' lines are comments\n(%s).\n\n"
	        "      --cases FILE      the golden cases (required)\n"
	        "      --chat-template NAME  the chat family of \"chat\" cases (default:\n"
	        "                        the model's own template's; as q4khost run)\n"
	        "      --no-parse-special  special tokens written in prompts stay text\n"
	        "  -m, --model FILE      GGUF model (default: as q4khost run)\n"
	        "      --backend NAME    only candidates of this backend\n"
	        "      --device N        only candidates on this device\n"
	        "      --kernel NAME     only this kernel variant (none = built-in only)\n"
	        "      --f2 MODE         auto (use valid receipts) or fresh; default:\n"
	        "                        Q4KHOST_F2 (auto or fresh; off is refused),\n"
	        "                        else auto\n"
	        "      --revalidate      the same as --f2 fresh\n"
	        "      --timeout S       seconds one F2 measurement may take (default:\n"
	        "                        [f2] f2_timeout_s, else 600)\n"
	        "      --plugin-path P   ':'-separated plugin folders\n"
	        "      --config FILE     extra INI configuration file\n"
	        "      --json            one JSON object\n"
	        "  -h, --help            this help\n\n"
	        "SIGINT or SIGTERM (Ctrl-C) stops it after the case in progress: the\n"
	        "report of the cases done is still printed, the others are not run.\n\n"
	        "exit codes: 0 every case that is not a knife edge passed on every path,\n"
	        "            1 a case failed on some path (or could not run), 2 usage,\n"
	        "            3 bad model, cases or config file, 4 a --backend,\n"
	        "            --kernel or --device (or their variables) that no plugin\n"
	        "            has, 130 or 143 stopped by SIGINT or SIGTERM\n",
	        q4kh_cli_doc("f2.md"));
}

/* qa's options, for parse and q4kh_cli_json_asked */
enum { O_CASES = Q4KH_OPT_OWN, O_CHAT_TEMPLATE, O_NO_PARSE_SPECIAL };
static const struct option longs[] = {
	Q4KH_CLI_COMMON_OPTIONS("kernel"),
	{ "cases", required_argument, 0, O_CASES },
	{ "chat-template", required_argument, 0, O_CHAT_TEMPLATE },
	{ "no-parse-special", no_argument, 0, O_NO_PARSE_SPECIAL },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};
#define SHORTS ":m:h"

static int parse(int argc, char **argv, struct qa_opts *o)
{
	struct q4kh_error err;
	enum q4kh_chat_format family;
	int c;

	memset(o, 0, sizeof(*o));
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, SHORTS, longs, NULL)) != -1) {
		int common = q4kh_cli_common_option("qa", c, INT32_MAX, 1, &o->c);

		if (common < 0)
			return -1;
		if (common)
			continue;
		switch (c) {
		case O_CASES: o->cases = optarg; break;
		case O_CHAT_TEMPLATE:
			if (q4kh_prompt_family(optarg, &family, &err)) {
				q4kh_cli_usage("qa", "%s", err.msg);
				return -1;
			}
			o->chat_template = optarg;
			break;
		case O_NO_PARSE_SPECIAL: o->no_parse_special = 1; break;
		case 'h': usage(stdout); return 1;
		default: q4kh_cli_bad_option("qa", argv, c); return -1;
		}
	}
	if (q4kh_cli_common_check("qa", "--kernel", &o->c))
		return -1;
	if (optind < argc) {
		q4kh_cli_extra_argument("qa", argv[optind]);
		return -1;
	}
	if (q4kh_cli_not_empty("qa", "--cases", o->cases, "the path of a JSON Lines file of "
	                       "cases"))
		return -1;
	if (!o->cases) {
		q4kh_cli_usage("qa", "--cases FILE is required (try q4khost qa --help)");
		return -1;
	}
	return 0;
}

/* The prompt of each case as serving tokenizes it, with H's model. */
static int tokenize_cases(const struct qa_opts *o, const struct q4kh_host *h,
                          struct qa_case_run *runs, size_t n, struct q4kh_error *err)
{
	struct q4kh_prompt p;
	char warning[512];

	if (q4kh_prompt_init(&p, h->model->gguf, o->chat_template, !o->no_parse_special, err))
		return -1;
	if (q4kh_prompt_warning(&p, warning, sizeof(warning)))
		fprintf(stderr, "q4khost qa: warning: %s\n", warning);
	for (size_t i = 0; i < n; i++)
		if (q4kh_prompt_tokenize(&p, h->tok, runs[i].qc->prompt, runs[i].qc->chat,
		                         &runs[i].ids, &runs[i].n_ids, err))
			return -1;
	return 0;
}

/* The text of TOKENS (an end-of-generation token adds nothing). */
static char *detokenize(const struct q4kh_tokenizer *tok, const struct q4kh_greedy *gr)
{
	size_t len = 0, cap = 256;
	char *text = malloc(cap), piece[256];

	for (int64_t i = 0; text && i < gr->n; i++) {
		size_t n;
		if (gr->eog && i == gr->n - 1)
			break;
		n = q4kh_token_to_piece(tok, gr->tokens[i], 0, piece, sizeof(piece));
		n = n < sizeof(piece) ? n : sizeof(piece);
		if (len + n + 1 > cap) {
			char *grown = realloc(text, (cap = (len + n + 1) * 2));
			if (!grown) {
				free(text);
				return NULL;
			}
			text = grown;
		}
		memcpy(text + len, piece, n);
		len += n;
	}
	if (text)
		text[len] = 0;
	return text;
}

/*
 * Run every case on path P (index PI): on the reference first (PI 0), which
 * also decides the knife edges; other paths skip knife-edge cases.
 */
static void run_path(struct q4kh_host *h, const struct path *p, size_t pi,
                     struct qa_case_run *runs, size_t n, double tolerance)
{
	const struct q4kh_tokenizer *tok = h->tok;
	struct q4kh_serving sv;
	struct q4kh_error err = { { 0 } };
	uint32_t n_ctx = 8;
	int opened;

	for (size_t i = 0; i < n; i++)
		if (runs[i].n_ids + (size_t)runs[i].qc->max_tokens + 8 > n_ctx)
			n_ctx = (uint32_t)(runs[i].n_ids + (size_t)runs[i].qc->max_tokens + 8);
	opened = q4kh_serving_open_on(h, &p->c, n_ctx, &sv, &err) == 0;
	for (size_t i = 0; i < n; i++) {
		struct result *res = &runs[i].results[pi];
		struct q4kh_greedy gr;

		if (pi > 0 && runs[i].knife_edge)
			continue;
		if (q4kh_interrupted()) {
			runs[i].stopped = 1;
			continue;
		}
		if (!opened) {
			snprintf(res->error, sizeof(res->error), "cannot start: %.480s", err.msg);
			continue;
		}
		q4kh_progress("%s: case %zu of %zu", p->name, i + 1, n);
		if (q4kh_greedy_run(sv.s, tok, runs[i].ids, (int64_t)runs[i].n_ids,
		                    runs[i].qc->max_tokens, &gr, &err)) {
			snprintf(res->error, sizeof(res->error), "generation failed: %.480s", err.msg);
			continue;
		}
		res->ran = 1;
		res->text = detokenize(tok, &gr);
		res->pass = res->text && q4kh_qa_accepts(runs[i].qc, res->text, strlen(res->text));
		if (pi == 0) {
			runs[i].min_margin = INFINITY;
			runs[i].min_step = -1;
			for (int64_t s = 0; s < gr.n; s++)
				if (gr.margins[s] < runs[i].min_margin) {
					runs[i].min_margin = gr.margins[s];
					runs[i].min_step = s;
				}
			runs[i].knife_edge = !(runs[i].min_margin >= tolerance);
		}
		q4kh_greedy_free(&gr);
	}
	q4kh_progress_clear();
	if (opened)
		q4kh_serving_close(&sv);
}

/* The reference first, then every candidate that passes F2; the others
 * in *skipped with their verdict. */
static int choose_paths(const struct qa_opts *o, struct q4kh_host *h, const int32_t *probe,
                        size_t n_probe, struct path **paths, size_t *n_paths,
                        json_t *skipped, struct q4kh_error *err)
{
	/* a variant with none of the model's types is not applicable */
	struct q4kh_candidate_filter f = { o->c.backend, o->c.device_set, (uint32_t)o->c.device,
		                           o->c.kernel, h->types, h->n_types, NULL, 0 };
	struct q4kh_candidate *list = NULL;
	struct q4kh_guard g = { 0 };
	size_t n = 0;

	if (q4kh_candidates_list(h, &f, &list, &n, err))
		return -1;
	*paths = calloc(n + 1, sizeof(**paths));
	if (!*paths) {
		free(list);
		return q4kh_fail(err, "out of memory");
	}
	(*paths)[0].c = (struct q4kh_candidate){ .backend = "cpu" };
	snprintf((*paths)[0].name, sizeof((*paths)[0].name), "cpu/built-in");
	snprintf((*paths)[0].f2, sizeof((*paths)[0].f2), "the reference");
	*n_paths = 1;
	if (n && q4kh_guard_init(&g, h->registry, h->config, o->c.model, probe, n_probe, err)) {
		free(list);
		return -1;
	}
	g.host = h;
	if (o->c.timeout)
		g.timeout_seconds = (unsigned)o->c.timeout;
	g.config_file = o->c.config_file;
	g.fresh_source = o->c.fresh_source;
	for (size_t i = 0; i < n; i++) {
		struct q4kh_guard_decision d;
		struct q4kh_error e = { { 0 } };
		struct path *p = &(*paths)[*n_paths];
		char name[160];

		snprintf(name, sizeof(name), "%s on device %u",
		         q4kh_candidate_name(&list[i], p->name, sizeof(p->name)), list[i].device);
		if (q4kh_interrupted()) {
			snprintf(e.msg, sizeof(e.msg), "stopped by %s before F2 measured it",
			         q4kh_signal_name(q4kh_interrupted()));
			json_array_append_new(skipped, json_pack("{s:s, s:s, s:s}", "path", name,
			                                         "verdict", "not measured", "message",
			                                         e.msg));
			continue;
		}
		if (q4kh_guard_check(&g, &list[i], &list[i].dev, o->c.mode, &d, &e)) {
			json_array_append_new(skipped, json_pack("{s:s, s:s, s:s}", "path", name,
			                                         "verdict", "error", "message", e.msg));
			continue;
		}
		q4kh_receipt_free(&d.receipt);
		if (d.verdict != Q4KH_F2_PASS) {
			json_array_append_new(skipped,
			                      json_pack("{s:s, s:s, s:s}", "path", name, "verdict",
			                                q4kh_f2_verdict_name(d.verdict), "message",
			                                d.receipt.message));
			continue;
		}
		p->c = list[i];
		snprintf(p->name, sizeof(p->name), "%s", name);
		snprintf(p->f2, sizeof(p->f2), "F2 pass, %s", d.source);
		(*n_paths)++;
	}
	free(list);
	return 0;
}

/* "interrupted by SIGINT", when a signal stopped qa. */
static const char *stop_reason(void)
{
	static char reason[64];

	snprintf(reason, sizeof(reason), "interrupted by %s", q4kh_signal_name(q4kh_interrupted()));
	return reason;
}

static json_t *report_json(const struct qa_opts *o, const struct path *paths,
                           size_t n_paths, json_t *skipped, const struct qa_case_run *runs,
                           size_t n, double tolerance, const int counts[4])
{
	json_t *jp = json_array(), *jc = json_array();

	for (size_t i = 0; i < n_paths; i++)
		json_array_append_new(jp, json_pack("{s:s, s:s}", "path", paths[i].name, "f2",
		                                    paths[i].f2));
	for (size_t i = 0; i < n; i++) {
		json_t *res = json_array();
		for (size_t p = 0; p < n_paths; p++) {
			const struct result *r = &runs[i].results[p];
			if (!r->ran && !r->error[0])
				continue;
			json_array_append_new(res, json_pack("{s:s, s:b, s:s?, s:s?}", "path",
			                                     paths[p].name, "pass", r->pass, "text",
			                                     r->text, "error",
			                                     r->error[0] ? r->error : NULL));
		}
		json_array_append_new(jc, json_pack("{s:s?, s:i, s:s, s:b, s:o, s:I, s:o}", "name",
		                                    runs[i].qc->name, "line", (int)runs[i].qc->line,
		                                    "prompt", runs[i].qc->prompt, "knife_edge",
		                                    runs[i].knife_edge, "min_margin",
		                                    isfinite(runs[i].min_margin)
		                                            ? json_real(runs[i].min_margin)
		                                            : json_null(),
		                                    "min_margin_step", (json_int_t)runs[i].min_step,
		                                    "results", res));
	}
	return json_pack("{s:s, s:s, s:f, s:o, s:O, s:o, s:i, s:i, s:i, s:i, s:s?}", "model",
	                 o->c.model, "cases_file", o->cases, "tolerance", tolerance, "paths", jp,
	                 "skipped", skipped, "cases", jc, "passed", counts[0], "failed",
	                 counts[1], "knife_edge", counts[2], "not_run", counts[3], "stopped",
	                 q4kh_interrupted() ? stop_reason() : NULL);
}

static void report_text(const struct qa_opts *o, const struct path *paths, size_t n_paths,
                        json_t *skipped, const struct qa_case_run *runs, size_t n,
                        double tolerance, const int counts[4])
{
	size_t i;
	json_t *s;

	printf("model %s\n%zu cases from %s\n"
	       "knife-edge tolerance %s: a smaller top-2 margin anywhere on the\n"
	       "reference's greedy path refuses a case as a golden\n\n",
	       o->c.model, n, o->cases, q4kh_f2_threshold(tolerance).s);
	for (i = 0; i < n_paths; i++)
		printf("path: %s (%s)\n", paths[i].name, paths[i].f2);
	json_array_foreach(skipped, i, s)
		printf("not a path: %s: F2 %s: %s\n", json_string_value(json_object_get(s, "path")),
		       json_string_value(json_object_get(s, "verdict")),
		       json_string_value(json_object_get(s, "message")));
	for (i = 0; i < n; i++) {
		const struct qa_case_run *c = &runs[i];
		char label[4400];

		/* "NAME (FILE:LINE)", or FILE:LINE alone for a case without a name */
		if (c->qc->name)
			snprintf(label, sizeof(label), "%s (%s:%u)", c->qc->name, o->cases, c->qc->line);
		else
			snprintf(label, sizeof(label), "%s:%u", o->cases, c->qc->line);
		if (c->knife_edge && c->min_step >= 0)
			printf("\ncase %s: KNIFE EDGE at step %lld (margin %.3f < %s): refused as a golden\n",
			       label, (long long)c->min_step, c->min_margin,
			       q4kh_f2_threshold(tolerance).s);
		else if (c->min_step >= 0)
			printf("\ncase %s: golden (smallest margin %.3f at step %lld)%s%s\n", label,
			       c->min_margin, (long long)c->min_step,
			       c->stopped ? "; not run on every path: " : "",
			       c->stopped ? stop_reason() : "");
		else if (c->stopped)
			printf("\ncase %s: not run: %s\n", label, stop_reason());
		else
			printf("\ncase %s: did not run on the reference\n", label);
		for (size_t p = 0; p < n_paths; p++) {
			const struct result *r = &c->results[p];
			if (r->error[0])
				printf("  %-32s ERROR %s\n", paths[p].name, r->error);
			else if (r->ran)
				printf("  %-32s %-4s \"%s\"\n", paths[p].name,
				       c->knife_edge ? "-" : r->pass ? "pass" : "FAIL", r->text);
		}
	}
	printf("\n%d golden case%s passed on every path, %d failed, %d knife-edge case%s refused",
	       counts[0], counts[0] == 1 ? "" : "s", counts[1], counts[2],
	       counts[2] == 1 ? "" : "s");
	if (q4kh_interrupted())
		printf(", %d not run (%s)", counts[3], stop_reason());
	putchar('\n');
}

int q4kh_cmd_qa(int argc, char **argv)
{
	struct qa_opts o;
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *config = NULL;
	struct q4kh_registry *reg = NULL;
	/* the model, backends and variants, each opened once (host.h) */
	struct q4kh_host h = { 0 };
	struct q4kh_qa_case *cases = NULL;
	struct qa_case_run *runs = NULL;
	struct path *paths = NULL;
	struct q4kh_f2_rules rules;
	json_t *skipped = json_array();
	size_t n = 0, n_paths = 0, n_probe = 0;
	int32_t *probe = NULL;
	char model_path[4096];
	int counts[4] = { 0, 0, 0, 0 }; /* passed, failed, knife edges, not run */
	int reported = 0, rc = parse(argc, argv, &o);

	if (rc) {
		json_decref(skipped);
		if (rc > 0)
			return Q4KH_EXIT_OK;
		/* said on stderr; with --json, as an object too */
		if (q4kh_cli_json_asked(argc, argv, SHORTS, longs, Q4KH_OPT_JSON))
			q4kh_cli_json_error(q4kh_cli_usage_said());
		return Q4KH_EXIT_USAGE;
	}
	q4kh_interrupt_install();
	q4kh_progress_init("qa");
	q4kh_f2_rules_default(&rules);
	rc = Q4KH_EXIT_INPUT;
	if (!(o.c.model = q4kh_cli_model(o.c.model, model_path, sizeof(model_path), &err)) ||
	    q4kh_cli_config("qa", o.c.config_file, 0, &config, &err) ||
	    q4kh_cli_f2_measure_env("qa", &o.c, &err) ||
	    q4kh_qa_cases_load(o.cases, &cases, &n, &err))
		goto out;
	runs = calloc(n, sizeof(*runs));
	if (!runs) {
		q4kh_fail(&err, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		runs[i] = (struct qa_case_run){ .qc = &cases[i], .min_margin = NAN, .min_step = -1 };
	if ((rc = q4kh_cli_plugins("qa", o.c.plugin_path, config, 0, &h, &reg, &err)))
		goto out;
	rc = Q4KH_EXIT_INPUT;
	if (q4kh_host_open_model(&h, o.c.model, &err) || tokenize_cases(&o, &h, runs, n, &err) ||
	    q4kh_guard_probe_with(h.model->gguf, h.tok, NULL, &probe, &n_probe, &err))
		goto out;
	if ((rc = q4kh_cli_check_names(reg, o.c.kernel, o.c.backend, &err)) ||
	    (rc = q4kh_cli_check_device(&h, &o.c, &err)))
		goto out;
	rc = Q4KH_EXIT_FAIL;
	if (choose_paths(&o, &h, probe, n_probe, &paths, &n_paths, skipped, &err))
		goto out;
	for (size_t i = 0; i < n; i++)
		if (!(runs[i].results = calloc(n_paths, sizeof(*runs[i].results)))) {
			q4kh_fail(&err, "out of memory");
			goto out;
		}
	for (size_t p = 0; p < n_paths; p++)
		run_path(&h, &paths[p], p, runs, n, rules.near_tie_logits);
	for (size_t i = 0; i < n; i++) {
		int ok = runs[i].results[0].ran;
		for (size_t p = 0; ok && !runs[i].knife_edge && p < n_paths; p++)
			ok = runs[i].results[p].pass;
		counts[runs[i].stopped ? 3 : runs[i].knife_edge ? 2 : ok ? 0 : 1]++;
	}
	if (o.c.json) {
		json_t *root = report_json(&o, paths, n_paths, skipped, runs, n,
		                           rules.near_tie_logits, counts);

		json_object_set_new(root, "host", q4kh_host_json(&h));
		json_dumpf(root, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(root);
	} else {
		report_text(&o, paths, n_paths, skipped, runs, n, rules.near_tie_logits, counts);
	}
	rc = counts[1] ? Q4KH_EXIT_FAIL : Q4KH_EXIT_OK;
	err.msg[0] = 0;
	reported = 1;
	if (q4kh_interrupted()) {
		q4kh_fail(&err, "stopped by %s; %d of %zu cases not run on every path",
		          q4kh_signal_name(q4kh_interrupted()), counts[3], n);
		rc = q4kh_interrupt_exit_code(q4kh_interrupted());
	}
out:
	if (err.msg[0]) /* with --json, an object of its own unless the report's is out */
		q4kh_cli_error("qa", o.c.json && !reported, rc, err.msg);
	for (size_t i = 0; runs && i < n; i++) {
		for (size_t p = 0; runs[i].results && p < n_paths; p++)
			free(runs[i].results[p].text);
		free(runs[i].results);
		free(runs[i].ids);
	}
	free(runs);
	free(paths);
	free(probe);
	json_decref(skipped);
	q4kh_qa_cases_free(cases, n);
	q4kh_host_close(&h);
	q4kh_registry_free(reg);
	q4kh_config_free(config);
	return rc;
}
