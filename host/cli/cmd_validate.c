/*
 * q4khost validate: run the F2 guard on every candidate (candidates.h) or
 * on the ones named, print the verdicts, and with --plot draw every
 * candidate's cosine per position from its receipt (plot.h). `--one` is
 * the isolated measurement a guard check starts in a child process;
 * `--enumerate FILE` the helper that tries a backend's enumeration before
 * a command trusts it (enumerate.h).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "candidates.h"
#include "cli.h"
#include "config.h"
#include "config_keys.h"
#include "enumerate.h"
#include "guard.h"
#include "interrupt.h"
#include "model.h"
#include "plot.h"
#include "progress.h"
#include "registry.h"
#include "settings.h"

struct validate_opts {
	struct q4kh_cli_common c;
	const char *plot;
	const char *probe_ids; /* --probe-ids FILE: a run's prompt as the probe */
	const char *progress_file; /* --progress-file FILE: positions done, for the parent */
	const char *reference_logits; /* --reference-logits FILE: shared by the children */
	const char *enumerate; /* --enumerate FILE: a backend's helper process */
	long ctx;
	unsigned long long memory_limit;
	int one, quiet, memory_limit_set, deep;
	const char *set[Q4KH_GUARD_OVERRIDES]; /* --set SECTION:KEY=VALUE */
	int n_set;
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost validate [-m FILE] [--backend NAME] [--kernel NAME] [OPTIONS]\n\n"
	        "Run the F2 parity guard on every candidate: each backend other than\n"
	        "the reference cpu plugin, with its built-in kernels and with each\n"
	        "kernel variant that targets it, on each of its devices (kernel\n"
	        "variants for the cpu backend included). Valid receipts are used unless\n"
	        "--f2 fresh; each measurement runs in a child process. The rules:\n"
	        "%s\n\n"
	        "  -m, --model FILE      GGUF model (default: as q4khost run)\n"
	        "      --backend NAME    only this backend\n"
	        "      --device N        only this device\n"
	        "      --kernel NAME     only this kernel variant (none = built-in only)\n"
	        "      --f2 MODE         auto (use valid receipts) or fresh; default:\n"
	        "                        Q4KHOST_F2 (auto or fresh; off is refused),\n"
	        "                        else auto\n"
	        "      --revalidate      the same as --f2 fresh\n"
	        "      --timeout S       seconds one measurement may take (default:\n"
	        "                        [f2] f2_timeout_s, else 600)\n"
	        "      --memory-limit M  MiB of private resident memory one measurement may\n"
	        "                        hold (0: no limit; default: [f2] f2_memory_limit_mb,\n"
	        "                        else half of the physical memory)\n"
	        "      --plugin-path P   ':'-separated plugin folders\n"
	        "      --config FILE     extra INI configuration file\n"
	        "      --set S:K=V       set key K of section S above every config file\n"
	        "                        (repeatable; how a run hands its command-line\n"
	        "                        settings to the validation child)\n"
	        "      --deep            judge on the deep probe: a suite of texts past every\n"
	        "                        length where kernels or the model change (chunks,\n"
	        "                        attention tiles and splits, the sliding window,\n"
	        "                        1024, 4096), in bands, then 32 decode steps; its\n"
	        "                        receipts are deep ones; the default when\n"
	        "                        [f2] require_deep or Q4KHOST_F2_REQUIRE_DEEP\n"
	        "                        is true\n"
	        "      --ctx N           with --deep: reach at most N positions, decode\n"
	        "                        steps included (default: the model's context)\n"
	        "      --json            one JSON object\n"
	        "      --plot FILE.svg   draw each candidate's cosine against position\n"
	        "                        (prefill and decode) with the floors, and mark\n"
	        "                        every rejected, near-tie and NaN position\n"
	        "      --one             measure exactly --backend/--device/--kernel in this\n"
	        "                        process and write its receipt (what a guard check\n"
	        "                        runs in its child process)\n"
	        "      --probe-ids FILE  with --one: judge on the token ids in FILE (what\n"
	        "                        q4khost run --f2-probe prompt writes for its\n"
	        "                        child: a run's prompt) instead of the built-in\n"
	        "                        probe; the receipt is the prompt probe's\n"
	        "      --progress-file FILE\n"
	        "                        with --one --deep: keep the positions measured so\n"
	        "                        far in FILE (what the parent's status line shows)\n"
	        "      --reference-logits FILE\n"
	        "                        with --one: read the reference's logits from FILE\n"
	        "                        when it holds exactly this measurement's (checked\n"
	        "                        in full), else compute them and write FILE (what\n"
	        "                        the parent hands each child, so that the\n"
	        "                        reference runs once per command)\n"
	        "      --enumerate FILE  init backend plugin FILE of the plugin path, ask\n"
	        "                        for its devices and shut it down, in this process,\n"
	        "                        saying nothing: the helper process in which a\n"
	        "                        command first tries a backend (exit 0 when the\n"
	        "                        backend returned, whatever it returned); takes\n"
	        "                        only --plugin-path, --config and --set\n"
	        "      --quiet           with --one: no verdict line, and exit code 0 once\n"
	        "                        it measured to the end (the receipt, or none\n"
	        "                        for nothing measured, is the answer; the guard\n"
	        "                        that started it reports); refused without --one\n"
	        "  -h, --help            this help\n\n"
	        "A kernel variant whose backend is not on the plugin path, or a missing\n"
	        "reference cpu plugin, is listed under \"cannot be measured\" and fails\n"
	        "the run: what cannot be measured is no pass.\n\n"
	        "exit codes: 0 every candidate passed, 1 a candidate failed or was not\n"
	        "            measured (with --one: the one measured), or the plot could\n"
	        "            not be written, 2 usage,\n"
	        "            3 bad model or config file, 4 a --backend, --kernel\n"
	        "            (or their variables) or --device that no plugin has,\n"
	        "            130 or 143 stopped by SIGINT or SIGTERM (the measuring\n"
	        "            child is stopped too)\n",
	        q4kh_cli_doc("f2.md"));
}

/* --plot's name ends in .svg, the format written (any case: F2.SVG too). */
static int has_svg_suffix(const char *path)
{
	size_t n = strlen(path);

	return n > 4 && !strcasecmp(path + n - 4, ".svg");
}

/* validate's options, for parse and q4kh_cli_json_asked */
enum { O_ONE = Q4KH_OPT_OWN, O_PLOT, O_MEMORY, O_QUIET, O_SET, O_PROBE_IDS, O_ENUMERATE,
       O_DEEP, O_CTX, O_PROGRESS, O_REFERENCE };
static const struct option longs[] = {
	Q4KH_CLI_COMMON_OPTIONS("kernel"),
	{ "memory-limit", required_argument, 0, O_MEMORY },
	{ "one", no_argument, 0, O_ONE },
	{ "quiet", no_argument, 0, O_QUIET },
	{ "probe-ids", required_argument, 0, O_PROBE_IDS },
	{ "progress-file", required_argument, 0, O_PROGRESS },
	{ "reference-logits", required_argument, 0, O_REFERENCE },
	{ "enumerate", required_argument, 0, O_ENUMERATE },
	{ "deep", no_argument, 0, O_DEEP },
	{ "ctx", required_argument, 0, O_CTX },
	{ "set", required_argument, 0, O_SET },
	{ "plot", required_argument, 0, O_PLOT },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};
#define SHORTS ":m:h"

static int parse(int argc, char **argv, struct validate_opts *o)
{
	long memory_limit;
	int c;

	memset(o, 0, sizeof(*o));
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, SHORTS, longs, NULL)) != -1) {
		int common = q4kh_cli_common_option("validate", c, INT32_MAX, 1, &o->c);

		if (common < 0)
			return -1;
		if (common)
			continue;
		switch (c) {
		case O_ONE: o->one = 1; break;
		case O_QUIET: o->quiet = 1; break;
		case O_PROBE_IDS: o->probe_ids = optarg; break;
		case O_PROGRESS: o->progress_file = optarg; break;
		case O_REFERENCE: o->reference_logits = optarg; break;
		case O_ENUMERATE: o->enumerate = optarg; break;
		case O_DEEP: o->deep = 1; break;
		case O_CTX:
			if (q4kh_cli_parse_long("validate", optarg, "--ctx", 1, 1 << 20, &o->ctx))
				return -1;
			break;
		case O_SET:
			if (o->n_set == Q4KH_GUARD_OVERRIDES || !strchr(optarg, ':') ||
			    !strchr(optarg, '=') || strchr(optarg, '=') < strchr(optarg, ':')) {
				q4kh_cli_usage("validate", "--set '%s': expected SECTION:KEY=VALUE, at most %d of them",
				        optarg, Q4KH_GUARD_OVERRIDES);
				return -1;
			}
			o->set[o->n_set++] = optarg;
			break;
		case O_PLOT: o->plot = optarg; break;
		case O_MEMORY:
			if (q4kh_cli_parse_long("validate", optarg, "--memory-limit (MiB; 0: no limit)",
			                        0, (long)Q4KH_MEMORY_LIMIT_MAX_MIB, &memory_limit))
				return -1;
			o->memory_limit = (unsigned long long)memory_limit;
			o->memory_limit_set = 1;
			break;
		case 'h': usage(stdout); return 1;
		default: q4kh_cli_bad_option("validate", argv, c); return -1;
		}
	}
	if (q4kh_cli_common_check("validate", "--kernel", &o->c))
		return -1;
	if (q4kh_cli_not_empty("validate", "--probe-ids", o->probe_ids,
	                       "the path of a file of token ids") ||
	    q4kh_cli_not_empty("validate", "--progress-file", o->progress_file,
	                       "the path of a file the parent made") ||
	    q4kh_cli_not_empty("validate", "--reference-logits", o->reference_logits,
	                       "the path of a file in a folder the parent made"))
		return -1;
	if (optind < argc) {
		q4kh_cli_extra_argument("validate", argv[optind]);
		return -1;
	}
	if (o->enumerate && (o->c.model || o->c.backend || o->c.kernel || o->c.device_set ||
	                     o->one || o->c.json || o->plot || o->probe_ids || o->c.timeout ||
	                     o->memory_limit_set || o->c.mode)) {
		q4kh_cli_usage("validate", "--enumerate takes only --plugin-path, --config and "
		               "--set: it tries one backend's enumeration, nothing else");
		return -1;
	}
	if (o->one && (!o->c.backend || !o->c.kernel)) {
		q4kh_cli_usage("validate", "--one needs --backend and --kernel");
		return -1;
	}
	if (o->quiet && !o->one) {
		q4kh_cli_usage("validate", "--quiet needs --one: it quiets the one measurement a guard's child makes; the table of every candidate has no quiet form (redirect it: the exit code alone says whether every candidate passed)");
		return -1;
	}
	if (o->plot && !has_svg_suffix(o->plot)) {
		q4kh_cli_usage("validate", "--plot '%s': expected a file name ending in .svg (the "
		               "plot is written as SVG)", o->plot);
		return -1;
	}
	if (o->ctx && !o->deep) {
		q4kh_cli_usage("validate", "--ctx %ld needs --deep: it caps the deep probe's reach",
		               o->ctx);
		return -1;
	}
	if (o->deep && o->probe_ids) {
		q4kh_cli_usage("validate", "--deep and --probe-ids %s: one probe at a time (the deep "
		               "suite, or a run's prompt)", o->probe_ids);
		return -1;
	}
	if (o->progress_file && (!o->one || !o->deep)) {
		q4kh_cli_usage("validate", "--progress-file %s needs --one and --deep: it is how a deep measurement's child tells its parent how far it got",
		               o->progress_file);
		return -1;
	}
	if (o->reference_logits && !o->one) {
		q4kh_cli_usage("validate", "--reference-logits %s needs --one: it is how the children of one validate share the reference (the parent makes the file's folder)",
		               o->reference_logits);
		return -1;
	}
	if (o->probe_ids && !o->one) {
		q4kh_cli_usage("validate", "--probe-ids %s needs --one: a prompt probe judges the one candidate a run's guard measures (q4khost run --f2-probe prompt)",
		               o->probe_ids);
		return -1;
	}
	return 0;
}

/*
 * Every --set SECTION:KEY=VALUE into C, above the config files, judged as
 * a file's keys are: an unknown section or key is warned about (unless
 * QUIET, the guard's child) and ignored, a bad [f2] mode is refused here;
 * every other value is checked with the plugins' settings
 * (q4kh_cli_plugins).
 */
static int apply_sets(const struct validate_opts *o, int quiet, struct q4kh_config *c,
                      struct q4kh_error *err)
{
	enum q4kh_f2_mode mode;
	char origin[700];
	int bad_file;

	for (int i = 0; i < o->n_set; i++) {
		const char *colon = strchr(o->set[i], ':'), *eq = strchr(colon, '=');
		char section[256], key[256], why[1536], origin_set[1100];

		snprintf(section, sizeof(section), "%.*s", (int)(colon - o->set[i]), o->set[i]);
		snprintf(key, sizeof(key), "%.*s", (int)(eq - colon - 1), colon + 1);
		if (q4kh_config_key_unknown(section, key, why, sizeof(why))) {
			if (!quiet)
				fprintf(stderr, "q4khost validate: warning: --set %s: %s\n", o->set[i],
				        why);
			continue;
		}
		/* each argument is the origin of its setting, so an error names it */
		snprintf(origin_set, sizeof(origin_set), "--set %s", o->set[i]);
		if (q4kh_config_set(c, section, key, eq + 1, origin_set, err))
			return -1;
	}
	return q4kh_settings_f2_mode(c, NULL, &mode, origin, sizeof(origin), &bad_file, err);
}

/* One row of the table. */
struct row {
	struct q4kh_candidate e;
	struct q4kh_guard_decision d;
	int failed; /* no decision could be made; message in d.receipt.message */
	int stopped; /* of those, stopped by a signal: nothing was measured */
};

/* The row's verdict: NULL when a signal stopped it (nothing measured, as
 * everything else the row did not measure), "error" when no decision
 * could be made, else F2's. */
static const char *row_verdict(const struct row *r)
{
	return r->stopped ? NULL : r->failed ? "error" : q4kh_f2_verdict_name(r->d.verdict);
}

static const char *variant_name(const struct q4kh_candidate *c)
{
	return c->variant ? c->variant : "built-in";
}

/* "27 (decode step 4)" or "5 (prefill)"; "-" for a negative position. */
static const char *position_text(int64_t pos, int32_t decode_step, char *buf, size_t cap)
{
	if (pos < 0)
		snprintf(buf, cap, "-");
	else if (decode_step >= 0)
		snprintf(buf, cap, "%lld (decode step %d)", (long long)pos, decode_step);
	else
		snprintf(buf, cap, "%lld (prefill)", (long long)pos);
	return buf;
}

/* The judged position with the lowest cosine (a NaN counts as lowest), or -1. */
static int64_t min_cosine_position(const struct q4kh_receipt *rc)
{
	int64_t at = -1;

	for (int64_t i = 0; i < rc->n_points; i++) {
		const struct q4kh_receipt_point *p = &rc->points[i];

		if (!p->judged || (at >= 0 && isnan(rc->points[at].cosine)))
			continue;
		if (at < 0 || isnan(p->cosine) || p->cosine < rc->points[at].cosine)
			at = i;
	}
	return at;
}

/*
 * One row per candidate. "min cos" is the lowest cosine over the judged
 * positions, with where; "decided at" is the position whose rule decided
 * a verdict other than pass (F2.3 can fire at a high cosine, so the two
 * differ), explained by the message under the row.
 */
static void print_table(const struct row *rows, size_t n)
{
	printf("%-10s %-16s %-6s %-13s %-30s %-20s %-9s %-7s %s\n", "backend", "kernel",
	       "device", "verdict", "min cos", "decided at", "near-ties", "seconds", "source");
	for (size_t i = 0; i < n; i++) {
		const struct q4kh_receipt *rc = &rows[i].d.receipt;
		int64_t at = min_cosine_position(rc);
		int passed = !rows[i].failed && rows[i].d.verdict == Q4KH_F2_PASS;
		char where[48], cos[64] = "-", decided[48];

		if (at >= 0)
			snprintf(cos, sizeof(cos), "%.4f at %s", rc->points[at].cosine,
			         position_text(at, rc->points[at].decode_step, where, sizeof(where)));
		char ties[16] = "-", seconds[32] = "-";

		position_text(passed || rows[i].failed ? -1 : rc->worst_position,
		              rc->worst_decode_step, decided, sizeof(decided));
		if (!rows[i].failed) {
			if (rc->n_points) /* a crash or a limit measured no position */
				snprintf(ties, sizeof(ties), "%d", rc->near_ties);
			snprintf(seconds, sizeof(seconds), "%.1f", rc->seconds);
		}
		printf("%-10s %-16s %-6u %-13s %-30s %-20s %-9s %-7s %s\n",
		       rows[i].e.backend, variant_name(&rows[i].e), rows[i].e.device,
		       row_verdict(&rows[i]) ? row_verdict(&rows[i]) : "-", cos,
		       decided, ties, seconds, rows[i].failed ? "-" : rows[i].d.source);
		if (!passed)
			printf("    %s\n", rc->message);
	}
}

/*
 * Why O's filters left no candidate on H's path, into BUF: which filter
 * removed what, and the candidates the path has without them.
 * NOT_APPLICABLE: the variants the model has none of the types of.
 */
static int why_none(struct q4kh_host *h, const struct validate_opts *o,
                    const char *not_applicable, char *buf, size_t cap, struct q4kh_error *err)
{
	const struct q4kh_registry *reg = h->registry;
	struct q4kh_candidate_filter all = { .types = h->types, .n_types = h->n_types };
	struct q4kh_candidate *list = NULL;
	size_t n = 0, used = 0;
	char flags[512] = "", name[256];
	int filtered = o->c.backend || o->c.device_set || o->c.kernel;

	if (q4kh_candidates_list(h, &all, &list, &n, err))
		return -1;
	if (o->c.backend)
		snprintf(flags + strlen(flags), sizeof(flags) - strlen(flags), " --backend %s",
		         o->c.backend);
	if (o->c.device_set)
		snprintf(flags + strlen(flags), sizeof(flags) - strlen(flags), " --device %ld",
		         o->c.device);
	if (o->c.kernel)
		snprintf(flags + strlen(flags), sizeof(flags) - strlen(flags), " --kernel %s",
		         o->c.kernel);
#define ADD(...) (used += used < cap ? (size_t)snprintf(buf + used, cap - used, __VA_ARGS__) : 0)
	if (!filtered)
		ADD("nothing to validate");
	else if (o->c.backend && !strcmp(o->c.backend, "cpu") && o->c.kernel &&
	         !strcmp(o->c.kernel, "none"))
		ADD("%s: cpu's built-in kernels are the reference F2 compares against, not a "
		    "candidate", flags + 1);
	else if (o->c.backend && !strcmp(o->c.backend, "cpu") && !o->c.kernel)
		ADD("%s: cpu is the reference F2 compares against, not a candidate, and no kernel "
		    "variant for it applies to this model", flags + 1);
	else
		ADD("%s left out every candidate", flags + 1);
	if (not_applicable[0])
		ADD("; not applicable to this model (none of their types): %s", not_applicable);
	if (n == 0)
		ADD("; the plugin path %s (from %s) has no backend other than cpu and no kernel "
		    "variant applicable to this model", reg->path, reg->path_origin);
	else
		ADD("; the candidates on this path: ");
	for (size_t i = 0; i < n; i++)
		ADD("%s%s", i ? ", " : "", q4kh_candidate_name(&list[i], name, sizeof(name)));
#undef ADD
	free(list);
	return 0;
}

/* What cannot be measured, under the table: each line fails the run. */
/* LINES (each ending in a newline) as a JSON array of strings. */
static json_t *json_lines(const char *lines)
{
	json_t *a = json_array();

	for (const char *s = lines; *s;) {
		size_t len = strcspn(s, "\n");
		json_array_append_new(a, json_stringn(s, len));
		s += len + (s[len] == '\n');
	}
	return a;
}

/* LINES (each ending in a newline) under HEADING, or nothing when "". */
static void print_lines(const char *heading, const char *lines)
{
	if (!lines[0])
		return;
	printf("\n%s:\n", heading);
	for (const char *s = lines; *s;) {
		size_t len = strcspn(s, "\n");
		printf("    %.*s\n", (int)len, s);
		s += len + (s[len] == '\n');
	}
}

/* A row with no decision (an error, a stop) has measured nothing: null. */
/* Row R as JSON; REG names the arithmetic class of its path. */
static json_t *row_json(const struct row *r, const struct q4kh_registry *reg)
{
	const struct q4kh_receipt *rc = &r->d.receipt;
	int m = !r->failed;

	return json_pack("{s:s, s:s, s:i, s:s, s:s?, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, "
	                 "s:s}",
	                 "backend", r->e.backend, "kernel", variant_name(&r->e),
	                 "device", (int)r->e.device, "device_uuid", r->e.dev.uuid,
	                 "verdict", row_verdict(r), "arith",
	                 q4kh_f2_arith_name(q4kh_guard_arith(reg, &r->e)),
	                 /* the floor it was judged by; none for a crash or timeout */
	                 "floor", m && rc->key.floor > 0 ? json_real(rc->key.floor) : json_null(),
	                 "min_cosine", m && isfinite(rc->min_cosine) ? json_real(rc->min_cosine)
	                                                            : json_null(),
	                 "min_cosine_position",
	                 m ? json_integer(min_cosine_position(rc)) : json_null(),
	                 "worst_position", m ? json_integer(rc->worst_position) : json_null(),
	                 "worst_decode_step",
	                 m ? json_integer(rc->worst_decode_step) : json_null(), "near_ties",
	                 m && rc->n_points ? json_integer(rc->near_ties) : json_null(),
	                 "seconds",
	                 m ? json_real(rc->seconds) : json_null(), "source",
	                 m ? json_string(r->d.source) : json_null(), "message", rc->message);
}

/*
 * Which probe the verdicts came from, for --json: kind "deep" with what it
 * judged (q4kh_deep_describe's TEXT and its numbers), else "builtin".
 */
/* The built-in probe as [f2] sets it; a plugin's own section may judge
 * on other numbers, which its row's receipt shows. */
static void builtin_probe_text(const struct q4kh_config *config, size_t n_probe, char *out,
                               size_t cap)
{
	struct q4kh_f2_rules rules;
	struct q4kh_error err;

	if (q4kh_guard_rules_where(config, NULL, Q4KH_ARITH_UNDECLARED, &rules, NULL, &err)) {
		snprintf(out, cap, "built-in probe (%s)", err.msg);
		return;
	}
	snprintf(out, cap,
	         "built-in probe, %zu tokens and %u decode steps (a [plugin.NAME] section may set "
	         "others); a valid deep receipt decides instead",
	         n_probe < rules.probe_tokens ? n_probe : (size_t)rules.probe_tokens,
	         (unsigned)rules.decode_steps);
}

static json_t *probe_json(const struct validate_opts *o, const struct q4kh_deep_plan *deep,
                          const char *text)
{
	if (!o->deep)
		return json_pack("{s:s}", "kind", q4kh_f2_probe_name(Q4KH_F2_PROBE_BUILTIN));
	return json_pack("{s:s, s:s, s:I, s:I, s:I, s:i}", "kind",
	                 q4kh_f2_probe_name(Q4KH_F2_PROBE_DEEP), "text", text, "judged",
	                 (json_int_t)deep->n_judged, "positions",
	                 (json_int_t)(deep->prefill + deep->decode_steps), "last_position",
	                 (json_int_t)(deep->prefill + deep->decode_steps - 1), "decode_steps",
	                 (int)deep->decode_steps);
}

/*
 * The private folder (mode 0700) in $TMPDIR, else /tmp, in which the
 * children of this command share the reference's logits: its path into
 * DIR, the shared file's into FILE. 0 (say so, and each child computes
 * the reference) when it cannot be made.
 */
static int share_dir_make(char *dir, size_t dir_cap, char *file, size_t file_cap)
{
	const char *tmp = q4kh_env("TMPDIR");

	snprintf(dir, dir_cap, "%s/q4khost-f2-reference.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		fprintf(stderr, "q4khost validate: warning: cannot create %s (%s): each measurement computes the reference itself\n",
		        dir, strerror(errno));
		dir[0] = 0;
		return 0;
	}
	snprintf(file, file_cap, "%s/reference-logits", dir);
	return 1;
}

/* Remove DIR and all share_dir_make's FILE may have left in it. */
static void share_dir_remove(const char *dir, const char *file)
{
	static const char *const ends[] = { "", ".part", ".log" };
	char path[PATH_MAX + 64];

	for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) {
		snprintf(path, sizeof(path), "%s%s", file, ends[i]);
		unlink(path);
	}
	rmdir(dir);
}

/* The probe line's clause on the reference: how many measurements
 * computed it and how many read it from the shared file; "" for one
 * measurement or none. */
static const char *reference_text(int computed, int read, char *buf, size_t cap)
{
	buf[0] = 0;
	if (computed + read < 2)
		return buf;
	if (computed == 1)
		snprintf(buf, cap, "; the reference ran once for %d measurements", computed + read);
	else
		snprintf(buf, cap, "; the reference ran %d times for %d measurements", computed,
		         computed + read);
	return buf;
}

/*
 * --one: measure in this process and write the receipt. Its exit code is
 * validate's (0 pass, 1 anything else, nothing measured included); with
 * --quiet, a guard's child, 0 whenever it measured to the end: the guard
 * reads the verdict from the receipt, or its absence, and a non-zero exit
 * would read as a crash of the plugin.
 */
static int measure_one(const struct validate_opts *o, struct q4kh_guard *g,
                       struct q4kh_error *err)
{
	struct q4kh_candidate c = { .backend = o->c.backend, .device = (uint32_t)o->c.device,
	                            .variant = strcmp(o->c.kernel, "none") ? o->c.kernel : NULL };
	struct q4kh_receipt rc;
	enum q4kh_f2_verdict v;

	if (q4kh_guard_measure(g, &c, &rc, err)) {
		q4kh_receipt_free(&rc);
		return Q4KH_EXIT_FAIL;
	}
	v = rc.verdict;
	if (!o->quiet)
		fprintf(stderr, "q4khost validate: %s/%s on device %u: %s: %s%s\n", c.backend,
		        variant_name(&c), c.device, q4kh_f2_verdict_name(v),
		        q4kh_f2_message_after_verdict(v, rc.message),
		        v == Q4KH_F2_NOT_MEASURED ? "; no receipt written" : "");
	else if (v == Q4KH_F2_NOT_MEASURED) /* no receipt: the guard's reason is this line */
		fprintf(stderr, "%s\n", rc.message);
	q4kh_receipt_free(&rc);
	return o->quiet || v == Q4KH_F2_PASS ? Q4KH_EXIT_OK : Q4KH_EXIT_FAIL;
}

/*
 * --plot PATH (a name ending in .svg, parse()) can be written (an existing
 * file this user may write, or a new one in a folder they may write), checked before any measurement so
 * that minutes of work do not end in "cannot create the plot". 0, or -1
 * with err.
 */
static int check_plot_path(const char *path, struct q4kh_error *err)
{
	char dir[4096], *slash;
	struct stat st;

	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return q4kh_fail(err, "--plot %s: is a folder, expected a file to write", path);
		if (access(path, W_OK) != 0)
			return q4kh_fail(err, "--plot %s: cannot write it: %s (checked before any "
			                 "measurement)", path, strerror(errno));
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else
		slash[slash == dir] = 0; /* "/x.svg" lies in "/" */
	if (access(dir, W_OK | X_OK) != 0)
		return q4kh_fail(err, "--plot %s: cannot create it in %s: %s (checked before any "
		                 "measurement)", path, dir, strerror(errno));
	return 0;
}

/* --plot: every row's points, from its receipt, as one SVG file. */
static int write_plot(const char *path, const char *model, const struct row *rows,
                      size_t n, struct q4kh_error *err)
{
	struct q4kh_plot_series *s = calloc(n + 1, sizeof(*s));
	char (*labels)[200] = calloc(n + 1, sizeof(*labels));
	char (*summaries)[700] = calloc(n + 1, sizeof(*summaries));
	char subtitle[4200], name[160];
	FILE *f = NULL;
	int rc = -1;

	if (!s || !labels || !summaries) {
		q4kh_fail(err, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		const struct q4kh_receipt *r = &rows[i].d.receipt;
		snprintf(labels[i], sizeof(labels[i]), "%s on device %u",
		         q4kh_candidate_name(&rows[i].e, name, sizeof(name)),
		         rows[i].e.device);
		snprintf(summaries[i], sizeof(summaries[i]), "%s: %s",
		         row_verdict(&rows[i]) ? row_verdict(&rows[i]) : "stopped", r->message);
		/* A receipt written by a crash or timeout has no key floor. */
		s[i] = (struct q4kh_plot_series){ labels[i], summaries[i],
			                          r->key.floor > 0 ? r->key.floor
			                                           : Q4KH_F2_FLOOR_DEFAULT,
			                          r->points, r->n_points };
	}
	snprintf(subtitle, sizeof(subtitle), "model %s; position 0 is not judged", model);
	f = fopen(path, "w");
	if (!f) {
		q4kh_fail(err, "%s: cannot create the plot: %s", path, strerror(errno));
		goto out;
	}
	rc = q4kh_plot_svg(f, "F2: cosine of the candidate's logits to the reference's, per position",
	                   subtitle, s, n);
	if (fclose(f) != 0 || rc != 0) {
		rc = q4kh_fail(err, "%s: cannot write the plot: %s", path, strerror(errno));
		goto out;
	}
	rc = 0;
out:
	free(s);
	free(labels);
	free(summaries);
	return rc;
}

/*
 * validate --enumerate FILE: the helper of enumerate.h, silent but for a
 * failure of its own (no accepted backend at FILE on the plugin path).
 */
static int enumerate_one(const struct validate_opts *o)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *config = NULL;
	struct q4kh_registry *reg = NULL;
	const struct q4kh_plugin *p = NULL;
	int rc = Q4KH_EXIT_INPUT;

	if (q4kh_cli_config("validate", o->c.config_file, 1, &config, &err) ||
	    apply_sets(o, 1, config, &err))
		goto out;
	rc = Q4KH_EXIT_FAIL;
	if (q4kh_registry_scan(o->c.plugin_path, config, &reg, &err))
		goto out;
	for (size_t i = 0; !p && i < reg->n_plugins; i++)
		if (!strcmp(reg->plugins[i].path, o->enumerate) &&
		    reg->plugins[i].state == Q4KH_PLUGIN_ACCEPTED &&
		    reg->plugins[i].desc->kind == Q4KH_KIND_BACKEND)
			p = &reg->plugins[i];
	if (!p) {
		q4kh_fail(&err, "--enumerate %s: no accepted backend plugin of that file on the "
		          "plugin path %s", o->enumerate, reg->path);
		goto out;
	}
	q4kh_enumerate_here(p);
	rc = Q4KH_EXIT_OK;
out:
	if (rc)
		fprintf(stderr, "q4khost validate: %s\n", err.msg);
	q4kh_registry_free(reg);
	q4kh_config_free(config);
	return rc;
}

int q4kh_cmd_validate(int argc, char **argv)
{
	struct validate_opts o;
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *config = NULL;
	struct q4kh_registry *reg = NULL;
	/* the parent's model, backends and variants, each opened once (host.h) */
	struct q4kh_host h = { 0 };
	struct q4kh_guard g;
	struct row *rows = NULL;
	struct q4kh_candidate *list = NULL;
	struct q4kh_candidate_filter filter = { 0 };
	size_t n = 0;
	int32_t *probe = NULL;
	size_t n_probe = 0;
	struct q4kh_deep_plan deep = { 0 };
	char model_path[4096], unmeasurable[4096], not_applicable[1024], probe_text[1400] = "";
	char none_why[4096] = "", deep_why[700] = "", passed_over[2048] = "";
	char shared[PATH_MAX] = "", reference[PATH_MAX + 32] = "";
	int ref_computed = 0, ref_read = 0;
	int rc = parse(argc, argv, &o), failed = 0, reported = 0, deep_required = 0, bad_file;

	if (rc > 0)
		return Q4KH_EXIT_OK;
	if (rc) { /* said on stderr */
		if (q4kh_cli_json_asked(argc, argv, SHORTS, longs, Q4KH_OPT_JSON))
			q4kh_cli_json_error(q4kh_cli_usage_said());
		return Q4KH_EXIT_USAGE;
	}
	if (o.enumerate)
		return enumerate_one(&o);
	/* The child measures until killed; its parent does the stopping. */
	if (!o.one) {
		q4kh_interrupt_install();
		q4kh_progress_init("validate");
	}
	if (o.plot && !o.one && check_plot_path(o.plot, &err)) {
		rc = Q4KH_EXIT_FAIL;
		goto out;
	}
	rc = Q4KH_EXIT_INPUT;
	if (!(o.c.model = q4kh_cli_model(o.c.model, model_path, sizeof(model_path), &err)) ||
	    q4kh_cli_config("validate", o.c.config_file, o.one, &config, &err) ||
	    apply_sets(&o, o.one, config, &err) ||
	    (!o.one && q4kh_cli_f2_measure_env("validate", &o.c, &err)))
		goto out;
	/* Deep receipts are what run and serve will ask for: make those. A
	 * child measures the probe its parent names. */
	if (!o.one && q4kh_settings_f2_deep_probe(config, &deep_required, deep_why,
	                                          sizeof(deep_why), &bad_file, &err))
		goto out;
	o.deep |= deep_required;
	if ((rc = q4kh_cli_plugins("validate", o.c.plugin_path, config, o.one, o.one ? NULL : &h,
	                           &reg, &err)) ||
	    (!o.one && (rc = q4kh_cli_check_names(reg, o.c.kernel, o.c.backend, &err))))
		goto out;
	/* A file that does not open as a model is the user's input (exit 3).
	 * The child measures in a process of its own: no host context. */
	rc = Q4KH_EXIT_INPUT;
	if ((!o.one && q4kh_host_open_model(&h, o.c.model, &err)) ||
	    (o.probe_ids ? q4kh_guard_probe_load(o.probe_ids, o.c.model, &probe, &n_probe, &err)
	     : o.deep    ? q4kh_deep_probe(o.c.model, (uint32_t)o.ctx, &probe, &deep, &err)
	     : h.model   ? q4kh_guard_probe_with(h.model->gguf, h.tok, NULL, &probe, &n_probe, &err)
	                 : q4kh_guard_probe(o.c.model, NULL, &probe, &n_probe, &err)))
		goto out;
	if (o.deep) {
		size_t len;

		n_probe = (size_t)deep.prefill;
		q4kh_deep_describe(&deep, probe_text, sizeof(probe_text));
		len = strlen(probe_text);
		if (deep_required)
			snprintf(probe_text + len, sizeof(probe_text) - len, " (%s)", deep_why);
	}
	rc = Q4KH_EXIT_FAIL;
	if (q4kh_guard_init(&g, reg, config, o.c.model, probe, n_probe, &err))
		goto out;
	if (o.probe_ids)
		g.probe_kind = Q4KH_F2_PROBE_PROMPT;
	if (o.deep && q4kh_guard_use_deep(&g, &deep, (uint32_t)o.ctx, &err))
		goto out;
	g.progress_file = o.progress_file;
	g.reference_logits = o.reference_logits;
	if (o.c.timeout)
		g.timeout_seconds = (unsigned)o.c.timeout;
	if (o.memory_limit_set)
		g.memory_limit_mib = o.memory_limit;
	g.config_file = o.c.config_file;
	g.fresh_source = o.c.fresh_source;
	g.host = o.one ? NULL : &h;
	if (o.one) {
		rc = measure_one(&o, &g, &err);
		goto out;
	}
	/* the children share the reference: without the folder, each computes it */
	if (share_dir_make(shared, sizeof(shared), reference, sizeof(reference)))
		g.reference_logits = reference;
	if ((rc = q4kh_cli_check_device(&h, &o.c, &err)))
		goto out;
	rc = Q4KH_EXIT_FAIL;
	filter = (struct q4kh_candidate_filter){ o.c.backend, o.c.device_set,
		                                 (uint32_t)o.c.device, o.c.kernel, h.types,
		                                 h.n_types, passed_over, sizeof(passed_over) };
	if (q4kh_candidates_list(&h, &filter, &list, &n, &err))
		goto out;
	q4kh_candidates_not_applicable(reg, &filter, not_applicable, sizeof(not_applicable));
	failed = q4kh_candidates_unmeasurable(reg, &filter, unmeasurable,
	                                      sizeof(unmeasurable)) > 0;
	if (n == 0 && !unmeasurable[0]) {
		/* Nothing validated is no pass: say which filter left what out. */
		if (why_none(&h, &o, not_applicable, none_why, sizeof(none_why), &err))
			goto out;
		/* filters that leave nothing validated nothing asked for; a path
		 * with nothing to judge on this model is no failure of one */
		failed = o.c.backend || o.c.device_set || o.c.kernel;
	}
	rows = calloc(n + 1, sizeof(*rows));
	if (!rows) {
		q4kh_fail(&err, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		rows[i].e = list[i];
	for (size_t i = 0; i < n; i++) {
		if (q4kh_interrupted()) {
			rows[i].failed = rows[i].stopped = 1;
			snprintf(rows[i].d.receipt.message, sizeof(rows[i].d.receipt.message),
			         "not measured: stopped by %s", q4kh_signal_name(q4kh_interrupted()));
		} else if (q4kh_guard_check(&g, &rows[i].e, &rows[i].e.dev, o.c.mode, &rows[i].d,
		                            &err)) {
			/* Nothing of an older receipt read on the way is this run's. */
			q4kh_receipt_free(&rows[i].d.receipt);
			memset(&rows[i].d, 0, sizeof(rows[i].d));
			rows[i].failed = 1;
			rows[i].stopped = q4kh_interrupted() != 0;
			snprintf(rows[i].d.receipt.message, sizeof(rows[i].d.receipt.message),
			         "%.500s", err.msg);
		}
		failed |= rows[i].failed || rows[i].d.verdict != Q4KH_F2_PASS;
	}
	if (g.reference_logits)
		q4kh_f2_ref_counts(g.reference_logits, &ref_computed, &ref_read);
	if (o.c.json) {
		json_t *arr = json_array(), *gaps = json_lines(unmeasurable), *root;
		json_t *lacking = json_lines(passed_over);

		for (size_t i = 0; i < n; i++)
			json_array_append_new(arr, row_json(&rows[i], reg));
		root = json_pack("{s:s, s:s, s:s, s:o, s:o, s:s, s:o}", "model", o.c.model,
		                 "model_sha256", g.model_sha256, "receipt_dir", g.receipt_dir,
		                 "candidates", arr, "unmeasurable", gaps, "not_applicable",
		                 none_why[0] && (failed || !not_applicable[0]) ? none_why
		                                                               : not_applicable, "probe", probe_json(&o, &deep, probe_text));
		json_object_set_new(root, "passed_over", lacking);
		json_object_set_new(root, "reference",
		                    json_pack("{s:i, s:i}", "computed", ref_computed, "read", ref_read));
		json_object_set_new(root, "host", q4kh_host_json(&h));
		json_dumpf(root, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(root);
	} else {
		char ref_line[160];

		printf("model %s (sha256 %.12s…), receipts in %s (%s)\n", o.c.model,
		       g.model_sha256, g.receipt_dir, g.receipt_dir_origin);
		if (!o.deep)
			builtin_probe_text(config, n_probe, probe_text, sizeof(probe_text));
		printf("F2 probe: %s%s\n\n", probe_text,
		       reference_text(ref_computed, ref_read, ref_line, sizeof(ref_line)));
		print_table(rows, n);
		print_lines("cannot be measured", unmeasurable);
		print_lines("passed over for this model", passed_over);
		if (none_why[0])
			printf("(no candidates: %s)\n", none_why);
		if (not_applicable[0] && !none_why[0])
			printf("not applicable to this model (none of their types): %s\n",
			       not_applicable);
	}
	rc = failed ? Q4KH_EXIT_FAIL : Q4KH_EXIT_OK;
	err.msg[0] = 0;
	reported = 1;
	if (o.plot && write_plot(o.plot, o.c.model, rows, n, &err))
		rc = Q4KH_EXIT_FAIL;
	if (q4kh_interrupted()) {
		q4kh_fail(&err, "stopped by %s; the candidates not measured have no receipt",
		          q4kh_signal_name(q4kh_interrupted()));
		rc = q4kh_interrupt_exit_code(q4kh_interrupted());
	}
out:
	if (shared[0])
		share_dir_remove(shared, reference);
	if (err.msg[0]) /* with --json, an object of its own unless the report's is out */
		q4kh_cli_error("validate", o.c.json && !reported, rc, err.msg);
	for (size_t i = 0; rows && i < n; i++)
		q4kh_receipt_free(&rows[i].d.receipt);
	free(rows);
	free(list);
	free(probe);
	q4kh_deep_plan_free(&deep);
	q4kh_host_close(&h);
	q4kh_registry_free(reg);
	q4kh_config_free(config);
	return rc;
}
