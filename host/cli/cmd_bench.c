/*
 * q4khost bench: A/B of kernel variants. One table, one row per variant
 * (named with --kernels or Q4KHOST_Q4K_KERNEL, else every variant that can
 * run on the device) and the backend's built-in kernels: prefill and
 * decode tokens per second on a fixed prompt and a fixed number of greedy
 * decode tokens, and the variant's F2 verdict, minimum cosine and
 * near-ties (from a valid receipt or a fresh measurement in a child
 * process). Only what passes F2 is timed, in this process: an unverified
 * plugin never runs here unless F2 is off.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "candidates.h"
#include "cli.h"
#include "config.h"
#include "decide.h"
#include "deep.h"
#include "greedy.h"
#include "guard.h"
#include "interrupt.h"
#include "policy.h"
#include "progress.h"
#include "registry.h"
#include "select.h"
#include "serving.h"
#include "settings.h"
#include "tokenizer.h"

struct bench_opts {
	struct q4kh_cli_common c; /* kernel: --kernels LIST */
	const char *prompt;
	long n_decode, repetitions;
	int no_built_in;
};

struct row {
	struct q4kh_candidate c;
	int reference;         /* cpu with its built-in kernels: not guarded */
	struct q4kh_guard_decision d;
	int decided;           /* F2 gave d for this row (else d is not filled) */
	int timed;             /* the speeds below were measured */
	double prefill_tps, decode_tps;
	char note[640];        /* why it was not timed */
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost bench [-m FILE] [--kernels LIST] [-n N] [OPTIONS]\n\n"
	        "Compare kernel variants: one row per variant and one for the backend's\n"
	        "built-in kernels, with prefill and decode tokens per second (one batched\n"
	        "prefill of a fixed prompt, then N greedy decode tokens; the mean of R\n"
	        "passes after a warm-up pass), and each\n"
	        "variant's F2 verdict, minimum cosine and near-ties (a valid receipt, or\n"
	        "a fresh measurement in a child process), on the deep probe when\n"
	        "[f2] require_deep or Q4KHOST_F2_REQUIRE_DEEP is true, as run judges.\n"
	        "Only what passes F2 is timed.\n\n"
	        "  -m, --model FILE      GGUF model (default: as q4khost run)\n"
	        "      --kernels LIST    variants to compare, as q4khost run --kernel\n"
	        "                        (default: $Q4KHOST_Q4K_KERNEL, else every variant\n"
	        "                        that can run on the device)\n"
	        "      --backend NAME    only this backend\n"
	        "      --device N        device index within the backend (default 0)\n"
	        "  -n, --n-decode N      greedy decode tokens to time (default 32)\n"
	        "  -r, --repetitions N   timed passes of prompt and decode, after one\n"
	        "                        untimed warm-up pass; speeds are their mean\n"
	        "                        (default 3)\n"
	        "  -p, --prompt TEXT     the prompt, raw text (default: F2's built-in\n"
	        "                        validation text)\n"
	        "      --f2 MODE         auto (default: $Q4KHOST_F2, else [f2] mode),\n"
	        "                        fresh, off (time unverified variants: loud),\n"
	        "                        require (as auto)\n"
	        "      --revalidate      the same as --f2 fresh\n"
	        "      --timeout S       seconds one F2 measurement may take (default:\n"
	        "                        [f2] f2_timeout_s, else 600)\n"
	        "      --plugin-path P   ':'-separated plugin folders\n"
	        "      --config FILE     extra INI configuration file\n"
	        "      --json            one JSON object\n"
	        "      --no-built-in     leave out the built-in kernels' row (they can\n"
	        "                        be slow: a long prompt on a large model)\n"
	        "  -h, --help            this help\n\n"
	        "SIGINT (Ctrl-C) or SIGTERM stops it: the rows done are printed, the row\n"
	        "in progress and the others say they were not timed; a second signal at least\n"
	        "half a second later ends the process at once.\n\n"
	        "exit codes: 0 every row timed, 1 a row was not timed (F2 did not pass,\n"
	        "            or it failed), 2 usage, 3 bad model or config file,\n"
	        "            4 the kernels named cannot run here, 130 or 143 stopped\n"
	        "            by SIGINT or SIGTERM\n");
}

static int parse_count(const char *s, const char *what, long lo, long hi, long *out)
{
	return q4kh_cli_parse_long("bench", s, what, lo, hi, out);
}

/* bench's options, for parse and q4kh_cli_json_asked */
enum { O_NO_BUILT_IN = Q4KH_OPT_OWN };
static const struct option longs[] = {
	Q4KH_CLI_COMMON_OPTIONS("kernels"),
	{ "n-decode", required_argument, 0, 'n' },
	{ "repetitions", required_argument, 0, 'r' },
	{ "prompt", required_argument, 0, 'p' },
	{ "no-built-in", no_argument, 0, O_NO_BUILT_IN },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};
#define SHORTS ":m:n:p:r:h"

static int parse(int argc, char **argv, struct bench_opts *o)
{
	int c;

	memset(o, 0, sizeof(*o));
	o->n_decode = 32;
	o->repetitions = 3;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, SHORTS, longs, NULL)) != -1) {
		int common = q4kh_cli_common_option("bench", c, 1023, 0, &o->c);

		if (common < 0)
			return -1;
		if (common)
			continue;
		switch (c) {
		case 'p': o->prompt = optarg; break;
		case O_NO_BUILT_IN: o->no_built_in = 1; break;
		case 'n':
			if (parse_count(optarg, "--n-decode", 1, 1 << 16, &o->n_decode))
				return -1;
			break;
		case 'r':
			if (parse_count(optarg, "--repetitions", 1, 100, &o->repetitions))
				return -1;
			break;
		case 'h': usage(stdout); return 1;
		default: q4kh_cli_bad_option("bench", argv, c); return -1;
		}
	}
	if (q4kh_cli_common_check("bench", "--kernels", &o->c))
		return -1;
	if (optind < argc) {
		q4kh_cli_extra_argument("bench", argv[optind]);
		return -1;
	}
	return 0;
}

static int push(struct row **rows, size_t *n, const struct row *r)
{
	struct row *grown = realloc(*rows, (*n + 1) * sizeof(**rows));

	if (!grown)
		return -1;
	*rows = grown;
	grown[(*n)++] = *r;
	return 0;
}

/*
 * The rows of backend P's device: the variants its setting names (or, with
 * none, every variant by score), then its built-in kernels; none when the
 * setting names only other backends' variants. Config kernel preferences
 * do not choose what is compared.
 */
static int backend_rows(struct q4kh_host *h, const struct bench_opts *o,
                        const struct q4kh_plugin *p, struct row **rows, size_t *n,
                        const struct q4kh_plugin **others, size_t *n_others,
                        struct q4kh_error *err)
{
	struct q4kh_backend b;
	struct q4kh_policy_order ord;
	struct row row = { 0 };
	size_t before = *n;

	struct q4kh_error none;

	if (q4kh_host_backend_open(h, p, (uint32_t)o->c.device, &b, &none))
		return 0; /* no such device */
	if (q4kh_policy_order(h->registry, NULL, o->c.kernel, "--kernels", &b, &ord, err)) {
		q4kh_backend_close(&b);
		return -1;
	}
	row.c.dev = b.record;
	q4kh_backend_close(&b);
	q4kh_policy_others_add(&ord.choice, others, n_others, Q4KH_KERNEL_LIST);
	for (size_t i = 0; i <= ord.n; i++) {
		const char *variant = i < ord.n ? ord.steps[i].variant : NULL;
		size_t j = before;

		if (i < ord.n && !variant)
			continue; /* the built-in kernels come last, once */
		if (!variant && o->no_built_in)
			break;
		if (ord.n == 0)
			break;    /* a request that names nothing for this backend */
		while (j < *n && (*rows)[j].c.variant != variant)
			j++;
		if (j < *n)
			continue;
		row.c.backend = p->name;
		row.c.device = (uint32_t)o->c.device;
		row.c.variant = variant;
		row.reference = !variant && !strcmp(p->name, "cpu");
		if (push(rows, n, &row))
			return q4kh_fail(err, "out of memory");
	}
	return 0;
}

/* Every row to compare, per backend of H with the device. */
static int collect(struct q4kh_host *h, const struct bench_opts *o, struct row **rows,
                   size_t *n, struct q4kh_error *err)
{
	const struct q4kh_registry *r = h->registry;
	const struct q4kh_plugin *others[Q4KH_KERNEL_LIST];
	size_t n_others = 0;
	char elsewhere[2048];

	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND ||
		    (o->c.backend && strcmp(o->c.backend, p->name)))
			continue;
		if (backend_rows(h, o, p, rows, n, others, &n_others, err))
			return -1;
	}
	q4kh_select_elsewhere(h, (uint32_t)o->c.device, others, n_others, elsewhere,
	                      sizeof(elsewhere));
	if (*n == 0)
		return q4kh_fail(err, "nothing to compare on device %ld%s%s", o->c.device,
		                 elsewhere[0] ? ": the kernels named are for other backends: " : "",
		                 elsewhere);
	return 0;
}

static const char *kernel_name(const struct row *r)
{
	return r->c.variant ? r->c.variant : "built-in";
}

/* Seconds on the monotonic clock. */
static double seconds_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Time ROW: prefill of IDS and N_DECODE greedy tokens, REPS times after a
 * warm-up pass; its speeds are the means of the passes' tokens per second
 * (as llama-bench reports avg_ts). The status line (progress.h) names the
 * row (LABEL, "row 2 of 4") and its candidate first, then the pass and the
 * seconds so far, so that a cut at the terminal's width keeps the name.
 */
static void time_row(struct q4kh_host *h, const int32_t *ids, size_t n_ids, long n_decode,
                     long reps, const char *label, struct row *row)
{
	const double t0 = seconds_now();
	struct q4kh_serving sv;
	struct q4kh_greedy gr;
	struct q4kh_error err = { { 0 } };
	double prefill = 0.0, decode = 0.0;
	long done = -1; /* the warm-up pass is -1 */

	if (q4kh_serving_open_on(h, &row->c, (uint32_t)(n_ids + (size_t)n_decode + 8), &sv,
	                         &err)) {
		snprintf(row->note, sizeof(row->note), "cannot start: %.600s", err.msg);
		return;
	}
	/* The untimed pass of the same prompt pages the weights in, sizes
	 * the scratch and loads every kernel (a backend's matrix library
	 * picks its algorithms on the first product of each shape): the
	 * timed passes measure what a later prompt costs. */
	for (; done < reps && !q4kh_interrupted(); done++) {
		char pass[48];

		if (done < 0)
			snprintf(pass, sizeof(pass), "warm-up pass");
		else
			snprintf(pass, sizeof(pass), "pass %ld of %ld", done + 1, reps);
		q4kh_progress("%s, %s/%s: %s, %.0f s: a %zu-token prefill, then %ld decode tokens",
		              label, row->c.backend, kernel_name(row), pass, seconds_now() - t0,
		              n_ids, n_decode);
		if (q4kh_greedy_run(sv.s, NULL, ids, (int64_t)n_ids, done < 0 ? 2 : n_decode,
		                    &gr, &err))
			break;
		if (done >= 0) {
			prefill += gr.prefill_seconds > 0 ? n_ids / gr.prefill_seconds : 0;
			decode += gr.decode_seconds > 0 ? (gr.n - 1) / gr.decode_seconds : 0;
		}
		q4kh_greedy_free(&gr);
	}
	if (done == reps) {
		row->timed = 1;
		row->prefill_tps = prefill / (double)reps;
		row->decode_tps = decode / (double)reps;
	} else if (q4kh_interrupted()) {
		snprintf(row->note, sizeof(row->note), "interrupted by %s after %ld of %ld passes",
		         q4kh_signal_name(q4kh_interrupted()), done < 0 ? 0 : done, reps);
	} else {
		snprintf(row->note, sizeof(row->note), "failed while timed: %.600s", err.msg);
	}
	q4kh_serving_close(&sv);
}

/* The row's F2 column; NULL when F2 was not decided for it (stopped, or
 * it could not measure). */
static const char *verdict(const struct row *r, enum q4kh_f2_mode mode)
{
	if (r->reference)
		return "reference";
	if (mode == Q4KH_F2_OFF)
		return "off";
	return r->decided ? q4kh_f2_verdict_name(r->d.verdict) : NULL;
}

/* "F2 reject: WHY" as R's note; a message that starts with its verdict's
 * name ("not measured: ...") says it once. */
static void verdict_note(struct row *r)
{
	snprintf(r->note, sizeof(r->note), "F2 %s: %.580s", q4kh_f2_verdict_name(r->d.verdict),
	         q4kh_f2_message_after_verdict(r->d.verdict, r->d.receipt.message));
}

static void print_table(const struct row *rows, size_t n, enum q4kh_f2_mode mode)
{
	printf("%-8s %-6s %-16s %13s %13s  %-12s %-8s %-9s %s\n", "backend", "device",
	       "kernel", "prefill tok/s", "decode tok/s", "F2", "min cos", "near-ties",
	       "F2 source");
	for (size_t i = 0; i < n; i++) {
		const struct row *r = &rows[i];
		char pre[32] = "-", dec[32] = "-", cos[32] = "-", ties[16] = "-";

		if (r->timed) {
			snprintf(pre, sizeof(pre), "%.1f", r->prefill_tps);
			snprintf(dec, sizeof(dec), "%.2f", r->decode_tps);
		}
		if (!r->reference && mode != Q4KH_F2_OFF && r->decided) {
			if (isfinite(r->d.receipt.min_cosine))
				snprintf(cos, sizeof(cos), "%.5f", r->d.receipt.min_cosine);
			snprintf(ties, sizeof(ties), "%d", r->d.receipt.near_ties);
		}
		printf("%-8s %-6u %-16s %13s %13s  %-12s %-8s %-9s %s\n", r->c.backend,
		       r->c.device, kernel_name(r), pre, dec,
		       verdict(r, mode) ? verdict(r, mode) : "-", cos, ties,
		       r->decided ? r->d.source : "-");
		if (r->note[0])
			printf("    not timed: %s\n", r->note);
	}
	if (mode == Q4KH_F2_OFF)
		printf("F2 IS OFF: the variants above ran unverified\n");
}

static json_t *row_json(const struct row *r, enum q4kh_f2_mode mode)
{
	json_t *f2 = json_pack("{s:s?}", "verdict", verdict(r, mode));

	if (!r->reference && mode != Q4KH_F2_OFF && r->decided) {
		json_object_set_new(f2, "min_cosine", isfinite(r->d.receipt.min_cosine)
		                                              ? json_real(r->d.receipt.min_cosine)
		                                              : json_null());
		json_object_set_new(f2, "near_ties", json_integer(r->d.receipt.near_ties));
		json_object_set_new(f2, "source", json_string(r->d.source));
		json_object_set_new(f2, "message", json_string(r->d.receipt.message));
	}
	return json_pack("{s:s, s:i, s:s, s:s, s:o, s:o, s:o, s:s?}", "backend", r->c.backend,
	                 "device", (int)r->c.device, "device_name", r->c.dev.name, "kernel",
	                 kernel_name(r), "prefill_tokens_per_second",
	                 r->timed ? json_real(r->prefill_tps) : json_null(),
	                 "decode_tokens_per_second",
	                 r->timed ? json_real(r->decode_tps) : json_null(), "f2", f2, "note",
	                 r->note[0] ? r->note : NULL);
}

/* The prompt's tokens: raw text with BOS, as the model's tokenizer TOK
 * tokenizes it. */
static int tokenize_prompt(const struct q4kh_tokenizer *tok, const char *text, int32_t **ids,
                           size_t *n, struct q4kh_error *err)
{
	int rc = q4kh_tokenize(tok, text, strlen(text), 1, 0, ids, n, err);

	if (rc == 0 && *n < 2)
		rc = q4kh_fail(err, "the prompt tokenized to fewer than 2 tokens");
	return rc;
}

int q4kh_cmd_bench(int argc, char **argv)
{
	struct bench_opts o;
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *config = NULL;
	struct q4kh_registry *reg = NULL;
	/* the model, backends and variants, each opened once (host.h) */
	struct q4kh_host h = { 0 };
	struct q4kh_guard g = { 0 };
	struct q4kh_decide_guard dg = { .g = &g };
	struct q4kh_decide_how how = { 0 };
	struct q4kh_decision d;
	struct row *rows = NULL;
	enum q4kh_f2_mode mode;
	size_t n = 0, n_ids = 0, n_probe = 0;
	int32_t *ids = NULL, *probe = NULL;
	struct q4kh_deep_plan deep = { 0 };
	char model_path[4096], origin[700], fresh_source[760], deep_why[700] = "";
	int rc = parse(argc, argv, &o), bad_file, untimed = 0, reported = 0, deep_required;

	if (rc > 0)
		return Q4KH_EXIT_OK;
	if (rc) { /* said on stderr */
		if (q4kh_cli_json_asked(argc, argv, SHORTS, longs, Q4KH_OPT_JSON))
			q4kh_cli_json_error(q4kh_cli_usage_said());
		return Q4KH_EXIT_USAGE;
	}
	q4kh_interrupt_install();
	q4kh_progress_init("bench");
	rc = Q4KH_EXIT_INPUT;
	if (!(o.c.model = q4kh_cli_model(o.c.model, model_path, sizeof(model_path), &err)) ||
	    q4kh_cli_config("bench", o.c.config_file, 0, &config, &err))
		goto out;
	if (q4kh_settings_f2_mode(config, o.c.f2, &mode, origin, sizeof(origin), &bad_file, &err) ||
	    q4kh_settings_f2_deep_probe(config, &deep_required, deep_why, sizeof(deep_why),
	                                &bad_file, &err)) {
		rc = bad_file ? Q4KH_EXIT_INPUT : Q4KH_EXIT_USAGE;
		goto out;
	}
	if ((rc = q4kh_cli_plugins("bench", o.c.plugin_path, config, 0, &h, &reg, &err)))
		goto out;
	/* The verdict a row shows is the one run would get: on the deep
	 * probe when run asks for deep receipts. */
	rc = Q4KH_EXIT_INPUT;
	if (q4kh_host_open_model(&h, o.c.model, &err) ||
	    tokenize_prompt(h.tok, o.prompt ? o.prompt : q4kh_f2_probe_text, &ids, &n_ids, &err) ||
	    (deep_required ? q4kh_deep_probe(o.c.model, 0, &probe, &deep, &err)
	                   : q4kh_guard_probe_with(h.model->gguf, h.tok, NULL, &probe, &n_probe,
	                                           &err)))
		goto out;
	if (deep_required)
		n_probe = (size_t)deep.prefill;
	rc = Q4KH_EXIT_PLUGIN;
	if (q4kh_registry_check_backend(reg, o.c.backend, "--backend", &err) ||
	    q4kh_select_check_device(&h, o.c.backend, (uint32_t)o.c.device, &err) ||
	    collect(&h, &o, &rows, &n, &err))
		goto out;
	rc = Q4KH_EXIT_FAIL;
	if (mode != Q4KH_F2_OFF &&
	    (q4kh_guard_init(&g, reg, config, o.c.model, probe, n_probe, &err) ||
	     (deep_required && q4kh_guard_use_deep(&g, &deep, 0, &err))))
		goto out;
	if (o.c.timeout)
		g.timeout_seconds = (unsigned)o.c.timeout;
	g.config_file = o.c.config_file;
	g.host = &h;
	q4kh_settings_f2_source(origin, "fresh", fresh_source, sizeof(fresh_source));
	g.fresh_source = fresh_source;
	how.mode = mode;
	how.mode_origin = origin;
	for (size_t i = 0; i < n; i++) {
		struct row *r = &rows[i];
		struct q4kh_error e = { { 0 } };
		char label[48];

		if (q4kh_interrupted()) {
			snprintf(r->note, sizeof(r->note), "stopped by %s before this row",
			         q4kh_signal_name(q4kh_interrupted()));
			untimed = 1;
			continue;
		}
		if (q4kh_decide(&how, &dg, &r->c, &r->c.dev, &d, &e)) {
			snprintf(r->note, sizeof(r->note), "F2 could not decide: %.580s", e.msg);
			untimed = 1;
			continue;
		}
		q4kh_receipt_free(&d.d.receipt); /* the summary is enough here */
		r->decided = d.judged;
		r->d = d.d;
		if (d.outcome != Q4KH_SERVES) {
			verdict_note(r);
			untimed = 1;
			continue;
		}
		snprintf(label, sizeof(label), "row %zu of %zu", i + 1, n);
		time_row(&h, ids, n_ids, o.n_decode, o.repetitions, label, r);
		q4kh_progress_clear();
		untimed |= !r->timed;
	}
	if (o.c.json) {
		json_t *arr = json_array(), *root;
		for (size_t i = 0; i < n; i++)
			json_array_append_new(arr, row_json(&rows[i], mode));
		root = json_pack("{s:s, s:i, s:i, s:i, s:s, s:s, s:o}", "model", o.c.model,
		                 "prompt_tokens", (int)n_ids, "decode_tokens", (int)o.n_decode,
		                 "repetitions", (int)o.repetitions, "f2_mode",
		                 q4kh_f2_mode_name(mode), "f2_probe",
		                 q4kh_f2_probe_name(deep_required ? Q4KH_F2_PROBE_DEEP
		                                                  : Q4KH_F2_PROBE_BUILTIN),
		                 "rows", arr);
		json_object_set_new(root, "host", q4kh_host_json(&h));
		json_dumpf(root, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(root);
	} else {
		printf("model %s; a %zu-token prompt in one batched prefill, then %ld greedy decode token%s, %ld timed pass%s; F2 %s (from %s)%s%s%s\n\n",
		       o.c.model, n_ids, o.n_decode, o.n_decode == 1 ? "" : "s", o.repetitions,
		       o.repetitions == 1 ? "" : "es", q4kh_f2_mode_name(mode), origin,
		       deep_required ? " on the deep probe (" : "", deep_why,
		       deep_required ? ")" : "");
		print_table(rows, n, mode);
	}
	rc = untimed ? Q4KH_EXIT_FAIL : Q4KH_EXIT_OK;
	err.msg[0] = 0;
	reported = 1;
	if (q4kh_interrupted()) {
		q4kh_fail(&err, "stopped by %s; the rows not timed say so",
		          q4kh_signal_name(q4kh_interrupted()));
		rc = q4kh_interrupt_exit_code(q4kh_interrupted());
	}
out:
	if (err.msg[0]) /* with --json, an object of its own unless the report's is out */
		q4kh_cli_error("bench", o.c.json && !reported, rc, err.msg);
	free(rows);
	free(ids);
	free(probe);
	q4kh_deep_plan_free(&deep);
	q4kh_host_close(&h);
	q4kh_registry_free(reg);
	q4kh_config_free(config);
	return rc;
}
