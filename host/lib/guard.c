#include "guard.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "backend.h"
#include "buildconf.h"
#include "gguf_shared.h"
#include "isolate.h"
#include "log.h"
#include "progress.h"
#include "receipt_check.h"
#include "tokenizer.h"
#include "model.h"
#include "prompt.h"
#include "serving.h"
#include "session.h"
#include <unistd.h>

/*
 * Plain prose with digits, punctuation, code and a list: ordinary text for
 * any model, long enough that its last 64 tokens are all prose.
 */
const char q4kh_f2_probe_text[] =
	"The water cycle describes how water moves between the oceans, the air "
	"and the land. Heat from the Sun evaporates about 500,000 cubic "
	"kilometres of water every year; the vapour rises, cools and condenses "
	"into clouds. When the droplets grow heavy enough they fall as rain or "
	"snow, and rivers carry much of it back to the sea. A short program can "
	"model one step of this: for (int day = 0; day < 365; day++) { stock += "
	"rain[day] - evaporation[day]; } The three stages, in order, are "
	"evaporation, condensation and precipitation, and each of them";

int q4kh_f2_mode_parse(const char *s, enum q4kh_f2_mode *out)
{
	static const char *const names[] = { "auto", "fresh", "off", "require" };

	for (int i = 0; s && i < 4; i++)
		if (!strcasecmp(s, names[i])) {
			*out = (enum q4kh_f2_mode)i;
			return 0;
		}
	return -1;
}

const char *q4kh_f2_mode_name(enum q4kh_f2_mode m)
{
	static const char *const names[] = { "auto", "fresh", "off", "require" };
	return (unsigned)m < 4 ? names[m] : "?";
}

int q4kh_f2_probe_parse(const char *s, enum q4kh_f2_probe_kind *out)
{
	if (s && !strcasecmp(s, "builtin"))
		*out = Q4KH_F2_PROBE_BUILTIN;
	else if (s && !strcasecmp(s, "prompt"))
		*out = Q4KH_F2_PROBE_PROMPT;
	else
		return -1;
	return 0;
}

const char *q4kh_f2_probe_name(enum q4kh_f2_probe_kind k)
{
	return k == Q4KH_F2_PROBE_PROMPT ? "prompt" : k == Q4KH_F2_PROBE_DEEP ? "deep" : "builtin";
}

/*
 * The SHA-256 of a deep probe, its N token ids IDS and PLAN's flags, into
 * HEX: the same tokens judged at other positions are another probe. -1
 * with err on out of memory.
 */
static int deep_probe_sha256(const int32_t *ids, size_t n, const struct q4kh_deep_plan *plan,
                             char *hex, struct q4kh_error *err)
{
	const size_t bytes = n * sizeof(*ids);
	const size_t flags = (size_t)(plan->prefill + plan->decode_steps);
	unsigned char *all = malloc(bytes + flags);

	if (!all)
		return q4kh_fail(err, "deep probe: out of memory");
	memcpy(all, ids, bytes);
	memcpy(all + bytes, plan->judged, flags);
	q4kh_sha256_bytes(all, bytes + flags, hex);
	free(all);
	return 0;
}

int q4kh_guard_use_deep(struct q4kh_guard *g, const struct q4kh_deep_plan *plan,
                        uint32_t ctx, struct q4kh_error *err)
{
	if (deep_probe_sha256(g->probe, g->n_probe, plan, g->probe_sha256, err))
		return -1;
	g->probe_kind = Q4KH_F2_PROBE_DEEP;
	g->deep = plan;
	g->deep_ctx = ctx;
	return 0;
}

struct q4kh_f2_plan q4kh_guard_plan(const struct q4kh_guard *g, const struct q4kh_f2_rules *rules)
{
	if (g->deep)
		return (struct q4kh_f2_plan){ g->deep->prefill, g->deep->decode_steps,
			                      g->deep->judged, 0 };
	return q4kh_f2_probe_plan(g->n_probe, rules);
}

#define PROBE_FILE_MAGIC "q4khost-f2-probe 1"

/*
 * A new file of ours (mode 0600) in $TMPDIR, else /tmp, named after WHAT
 * ("probe"), for a validation child: its path into PATH and an open
 * descriptor, or -1 with err.
 */
static int child_file(const char *what, char *path, size_t cap, struct q4kh_error *err)
{
	const char *tmp = q4kh_env("TMPDIR");
	int fd;

	snprintf(path, cap, "%s/q4khost-f2-%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
	fd = mkostemp(path, O_CLOEXEC); /* no other child inherits it */
	if (fd < 0)
		q4kh_fail(err, "cannot create the F2 %s file %s for the validation child: %s (set TMPDIR to a folder this user may write)",
		          what, path, strerror(errno));
	return fd;
}

int q4kh_guard_probe_save(const int32_t *ids, size_t n, char *path, size_t cap,
                          struct q4kh_error *err)
{
	FILE *f;
	int fd = child_file("probe", path, cap, err), bad;

	if (fd < 0)
		return -1;
	if (!(f = fdopen(fd, "w"))) {
		close(fd);
		unlink(path);
		return q4kh_fail(err, "cannot write the F2 probe file %s: %s", path, strerror(errno));
	}
	bad = fprintf(f, PROBE_FILE_MAGIC " %zu\n", n) < 0;
	for (size_t i = 0; i < n && !bad; i++)
		bad = fprintf(f, "%ld\n", (long)ids[i]) < 0;
	if (fclose(f) || bad) {
		unlink(path);
		return q4kh_fail(err, "cannot write the F2 probe file %s: %s", path, strerror(errno));
	}
	return 0;
}

int q4kh_guard_probe_load(const char *path, const char *model_path, int32_t **ids,
                          size_t *n, struct q4kh_error *err)
{
	struct q4kh_gguf *g = NULL;
	struct q4kh_tokenizer *tok = NULL;
	char line[64];
	unsigned long long count;
	int32_t n_vocab;
	FILE *f;
	int rc = -1;

	*ids = NULL;
	*n = 0;
	if (q4kh_gguf_open(model_path, &g, err) || q4kh_tokenizer_load(g, &tok, err))
		goto out;
	n_vocab = q4kh_tokenizer_n_vocab(tok);
	if (!(f = fopen(path, "r"))) {
		q4kh_fail(err, "--probe-ids %s: %s", path, strerror(errno));
		goto out;
	}
	if (!fgets(line, sizeof(line), f) ||
	    sscanf(line, PROBE_FILE_MAGIC " %llu", &count) != 1 || count < 2 ||
	    count > Q4KH_F2_PROBE_FILE_MAX) {
		q4kh_fail(err, "--probe-ids %s:1: expected \"" PROBE_FILE_MAGIC " N\" with N from 2 to %u (a file that q4khost run writes)",
		          path, Q4KH_F2_PROBE_FILE_MAX);
		goto close;
	}
	*ids = malloc(sizeof(**ids) * (size_t)count);
	if (!*ids) {
		q4kh_fail(err, "--probe-ids %s: out of memory for %llu ids", path, count);
		goto close;
	}
	for (*n = 0; *n < count; ++*n) {
		long v;
		char *end;

		errno = 0;
		v = fgets(line, sizeof(line), f) ? strtol(line, &end, 10) : -1;
		if (v < 0 || v >= n_vocab || errno || end == line || (*end && *end != '\n')) {
			q4kh_fail(err, "--probe-ids %s:%zu: expected a token id from 0 to %d of the model %s, one a line (%llu of them)",
			          path, *n + 2, n_vocab - 1, model_path, count);
			free(*ids);
			*ids = NULL;
			*n = 0;
			goto close;
		}
		(*ids)[*n] = (int32_t)v;
	}
	rc = 0;
close:
	fclose(f);
out:
	q4kh_tokenizer_free(tok);
	q4kh_gguf_close(g);
	return rc;
}

int q4kh_guard_probe_with(const struct q4kh_gguf *g, const struct q4kh_tokenizer *tok,
                          const char *text, int32_t **ids, size_t *n,
                          struct q4kh_error *err)
{
	struct q4kh_prompt p;

	if (q4kh_prompt_init(&p, g, NULL, 1, err))
		return -1;
	return q4kh_prompt_tokenize(&p, tok, text ? text : q4kh_f2_probe_text, 1, ids, n, err);
}

int q4kh_guard_probe(const char *model_path, const char *text, int32_t **ids,
                     size_t *n, struct q4kh_error *err)
{
	struct q4kh_gguf *g = NULL;
	struct q4kh_tokenizer *tok = NULL;
	int rc = -1;

	if (q4kh_gguf_acquire(model_path, &g, err) || q4kh_tokenizer_load(g, &tok, err))
		goto out;
	rc = q4kh_guard_probe_with(g, tok, text, ids, n, err);
out:
	q4kh_tokenizer_free(tok);
	q4kh_gguf_release(g);
	return rc;
}

int q4kh_guard_limits_where(const struct q4kh_config *c, unsigned *timeout_s,
                            uint64_t *memory_mib, struct q4kh_f2_limit_origins *o,
                            struct q4kh_error *err)
{
	struct q4kh_f2_limit_origins none;
	uint64_t timeout = 600;

	o = o ? o : &none;
	*o = (struct q4kh_f2_limit_origins){ "default", "default" };
	*memory_mib = q4kh_isolate_default_memory_mib();
	if (q4kh_config_whole(c, "f2", "f2_timeout_s", 1, Q4KH_TIMEOUT_MAX_S, &timeout,
	                      o->timeout, sizeof(o->timeout), err) ||
	    q4kh_config_whole(c, "f2", "f2_memory_limit_mb", 0, Q4KH_MEMORY_LIMIT_MAX_MIB,
	                      memory_mib, o->memory, sizeof(o->memory), err))
		return -1;
	*timeout_s = (unsigned)timeout;
	return 0;
}

int q4kh_guard_init(struct q4kh_guard *g, const struct q4kh_registry *r,
                    const struct q4kh_config *c, const char *model_path,
                    const int32_t *probe, size_t n_probe,
                    struct q4kh_error *err)
{
	struct q4kh_gguf *held;
	char cache[4200];
	int rc;

	memset(g, 0, sizeof(*g));
	g->registry = r;
	g->config = c;
	g->model_path = model_path;
	g->probe = probe;
	g->n_probe = n_probe;
	if (q4kh_guard_limits_where(c, &g->timeout_seconds, &g->memory_limit_mib, NULL, err))
		return -1;
	g->self_exe = q4kh_self_exe();
	q4kh_receipt_dir(c, g->receipt_dir, sizeof(g->receipt_dir),
	                 &g->receipt_dir_origin);
	/* a guard keeps receipts: its folder and key, checked (and made) here,
	 * where the first receipt is needed, never by a run that needs none */
	if (q4kh_receipt_dir_check(c, &g->mac, err))
		return -1;
	snprintf(cache, sizeof(cache), "%s/hashes", g->receipt_dir);
	q4kh_sha256_bytes(probe, n_probe * sizeof(*probe), g->probe_sha256);
	/* a model this process holds is hashed from its mapping: no second open */
	if (q4kh_gguf_held(model_path, &held))
		return q4kh_sha256_file(model_path, cache, g->model_sha256, err);
	rc = q4kh_sha256_mapped(model_path, held->map, held->size, cache, g->model_sha256, err);
	q4kh_gguf_release(held);
	return rc;
}

/*
 * A number from [plugin.NAME] or [f2] (the plugin's section wins) into *v,
 * with where it came from into ORIGIN; left alone when neither sets it.
 */
static int rule_number(const struct q4kh_config *c, const char *plugin,
                       const char *key, double lo, double hi, double *v,
                       char *origin, size_t cap, struct q4kh_error *err)
{
	char section[128], where[600], shown[4 * 80 + 8];
	const char *s;
	char *end;

	s = NULL;
	if (plugin) {
		snprintf(section, sizeof(section), "plugin.%s", plugin);
		s = q4kh_config_where(c, section, key, where, sizeof(where));
	}
	if (!s)
		s = q4kh_config_where(c, "f2", key, where, sizeof(where));
	if (!s)
		return 0;
	errno = 0;
	*v = strtod(s, &end);
	if (errno || end == s || *end || !(*v >= lo && *v <= hi))
		return q4kh_fail(err, "%s: %s = \"%s\": expected a number in [%g, %g]",
		                 where, key,
		                 q4kh_show(shown, sizeof(shown), s, strlen(s), 80, 0),
		                 lo, hi);
	if (origin)
		snprintf(origin, cap, "%s", where);
	return 0;
}

int q4kh_guard_rules_where(const struct q4kh_config *c, const char *plugin, uint32_t arith,
                           struct q4kh_f2_rules *rules,
                           struct q4kh_f2_rule_origins *o, struct q4kh_error *err)
{
	double floor, steps, probe;

	q4kh_f2_rules_default(rules);
	q4kh_f2_rules_class(rules, arith);
	if (o) {
		*o = (struct q4kh_f2_rule_origins){ "default", "default", "default" };
		if (arith == Q4KH_ARITH_UNDECLARED)
			snprintf(o->floor, sizeof(o->floor), "default (no arithmetic class declared)");
		else
			snprintf(o->floor, sizeof(o->floor), "the %s arithmetic class",
			         q4kh_f2_arith_name(arith));
	}
	floor = -1;
	steps = rules->decode_steps;
	probe = rules->probe_tokens;
	/* A setting names the floor outright, above or below the class's (an
	 * operator's decision for that plugin, shown with its origin and kept
	 * in the receipt's key), never below the catastrophic one. */
	if (rule_number(c, plugin, "f2_floor", Q4KH_F2_CATASTROPHIC, 1.0, &floor,
	                o ? o->floor : NULL, sizeof(o->floor), err) ||
	    rule_number(c, plugin, "f2_decode_steps", 8, 4096, &steps,
	                o ? o->decode_steps : NULL, sizeof(o->decode_steps), err) ||
	    rule_number(c, plugin, "f2_probe_tokens", 2, 8192, &probe,
	                o ? o->probe_tokens : NULL, sizeof(o->probe_tokens), err))
		return -1;
	if (floor >= 0) {
		rules->floor = floor;
		rules->floor_set = 1;
	}
	rules->decode_steps = (uint32_t)steps;
	rules->probe_tokens = (uint32_t)probe;
	return 0;
}

int q4kh_guard_config_check(const struct q4kh_config *c, const struct q4kh_registry *r,
                            struct q4kh_error *err)
{
	struct q4kh_f2_rules rules;
	unsigned timeout;
	uint64_t memory;

	if (q4kh_guard_limits_where(c, &timeout, &memory, NULL, err) ||
	    q4kh_guard_rules_where(c, "cpu", Q4KH_ARITH_UNDECLARED, &rules, NULL, err))
		return -1;
	for (size_t i = 0; r && i < r->n_plugins; i++)
		if (r->plugins[i].state == Q4KH_PLUGIN_ACCEPTED &&
		    q4kh_guard_rules_where(c, r->plugins[i].name, Q4KH_ARITH_UNDECLARED, &rules,
		                           NULL, err))
			return -1;
	return 0;
}

/* What plugin NAME of R declares, UNDECLARED for a class unknown here. */
static uint32_t declared_arith(const struct q4kh_registry *r, const char *name)
{
	const struct q4kh_plugin *p = q4kh_registry_find(r, name);
	const uint32_t a = p ? q4kh_plugin_arith(p) : Q4KH_ARITH_UNDECLARED;

	return q4kh_f2_arith_known(a) ? a : Q4KH_ARITH_UNDECLARED;
}

uint32_t q4kh_guard_arith(const struct q4kh_registry *r, const struct q4kh_candidate *c)
{
	const uint32_t backend = declared_arith(r, c->backend);

	return c->variant ? q4kh_f2_arith_coarsest(backend, declared_arith(r, c->variant))
	                  : backend;
}

int q4kh_guard_rules(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                     struct q4kh_f2_rules *rules, struct q4kh_error *err)
{
	return q4kh_guard_rules_where(g->config, c->variant ? c->variant : c->backend,
	                              q4kh_guard_arith(g->registry, c), rules, NULL, err);
}

static void add_override(void *data, const char *section, const char *key,
                         const char *value, const char *origin)
{
	struct q4kh_guard_args *a = data;

	(void)origin;
	if (a->n_set < Q4KH_GUARD_OVERRIDES)
		snprintf(a->set[a->n_set++], sizeof(a->set[0]), "%s:%s=%s", section, key, value);
}

void q4kh_guard_child_args(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                           struct q4kh_guard_args *a)
{
	a->n = a->n_set = 0;
	snprintf(a->device, sizeof(a->device), "%u", c->device);
	a->argv[a->n++] = "q4khost";
	a->argv[a->n++] = "validate";
	a->argv[a->n++] = "--backend";
	a->argv[a->n++] = c->backend;
	a->argv[a->n++] = "--device";
	a->argv[a->n++] = a->device;
	a->argv[a->n++] = "--kernel";
	a->argv[a->n++] = c->variant ? c->variant : "none";
	a->argv[a->n++] = "-m";
	a->argv[a->n++] = g->model_path;
	a->argv[a->n++] = "--plugin-path";
	a->argv[a->n++] = g->registry->path;
	if (g->config_file) {
		a->argv[a->n++] = "--config";
		a->argv[a->n++] = g->config_file;
	}
	/* settings from the command line or the environment reach the child
	 * as they are, so both sides key the receipt alike */
	q4kh_config_each_set(g->config, add_override, a);
	for (int i = 0; i < a->n_set; i++) {
		a->argv[a->n++] = "--set";
		a->argv[a->n++] = a->set[i];
	}
	a->argv[a->n] = NULL;
}

static int plugin_entry(const struct q4kh_guard *g, struct q4kh_receipt_key *k,
                        const char *role, const char *name, struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(g->registry, name);
	struct q4kh_receipt_plugin *e = &k->plugins[k->n_plugins];
	char cache[4200], section[96], why[700];

	if (!p) {
		q4kh_registry_why_absent(g->registry, name, why, sizeof(why));
		return q4kh_fail(err, "plugin %s is not available on the plugin path %s%s%s", name,
		                 g->registry->path, why[0] ? ": " : "", why);
	}
	snprintf(cache, sizeof(cache), "%s/hashes", g->receipt_dir);
	snprintf(e->role, sizeof(e->role), "%s", role);
	snprintf(e->name, sizeof(e->name), "%s", name);
	snprintf(section, sizeof(section), "plugin.%s", name);
	/* its F2 rules (f2_*) are keyed as rules (floor, steps, probe) */
	if (q4kh_config_section_text(g->config, section, "f2_", e->settings, sizeof(e->settings)))
		return q4kh_fail(err, "[%s]: its settings are longer than the %zu bytes a receipt keeps",
		                 section, sizeof(e->settings) - 1);
	if (q4kh_sha256_file(p->path, cache, e->sha256, err))
		return -1;
	k->n_plugins++;
	return 0;
}

/*
 * Plugin settings (threads, isa, ...) name a receipt of their own: the id
 * gets a hash of them, so switching between two settings keeps both
 * receipts instead of measuring again each time. Without settings the id
 * stays what it always was.
 */
static void settings_id(const struct q4kh_receipt_key *key, char *id, size_t id_cap)
{
	char all[Q4KH_RECEIPT_PLUGINS * 320] = "", hex[Q4KH_SHA256_HEX];
	size_t used = 0, len = strlen(id);

	for (int i = 0; i < key->n_plugins; i++)
		if (key->plugins[i].settings[0])
			used += (size_t)snprintf(all + used, sizeof(all) - used, "[plugin.%s] %s\n",
			                         key->plugins[i].name, key->plugins[i].settings);
	if (!used)
		return;
	q4kh_sha256_bytes(all, used, hex);
	snprintf(id + len, id_cap - len, " settings %.16s", hex);
}

int q4kh_guard_key(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                   const struct q4kh_device_record *dev,
                   struct q4kh_receipt_key *key, char *id, size_t id_cap,
                   struct q4kh_error *err)
{
	struct q4kh_f2_rules rules;

	memset(key, 0, sizeof(*key));
	if (q4kh_guard_rules(g, c, &rules, err))
		return -1;
	memcpy(key->model_sha256, g->model_sha256, sizeof(key->model_sha256));
	memcpy(key->probe_sha256, g->probe_sha256, sizeof(key->probe_sha256));
	snprintf(key->device_uuid, sizeof(key->device_uuid), "%s", dev->uuid);
	snprintf(key->driver_version, sizeof(key->driver_version), "%s",
	         dev->driver_version);
	key->ruleset = Q4KH_F2_RULESET;
	key->floor = rules.floor;
	key->arith = rules.arith;
	key->floor_set = rules.floor_set;
	key->decode_steps = rules.decode_steps;
	key->probe_tokens = rules.probe_tokens;
	snprintf(key->probe, sizeof(key->probe), "%s", q4kh_f2_probe_name(g->probe_kind));
	if (plugin_entry(g, key, "reference", "cpu", err) ||
	    plugin_entry(g, key, "backend", c->backend, err) ||
	    (c->variant && plugin_entry(g, key, "variant", c->variant, err)))
		return -1;
	snprintf(id, id_cap, "%s %s %s %s", g->model_sha256, c->backend,
	         c->variant ? c->variant : "built-in", dev->uuid);
	settings_id(key, id, id_cap);
	if (g->probe_kind != Q4KH_F2_PROBE_BUILTIN) {
		size_t len = strlen(id);
		snprintf(id + len, id_cap - len, " probe %s", q4kh_f2_probe_name(g->probe_kind));
	}
	return 0;
}

void q4kh_guard_deep_args(const struct q4kh_guard *g, struct q4kh_guard_args *a)
{
	if (g->probe_kind == Q4KH_F2_PROBE_DEEP) {
		/* the child builds the same deep probe from the model file */
		a->argv[a->n++] = "--deep";
		if (g->deep_ctx) {
			snprintf(a->ctx, sizeof(a->ctx), "%u", g->deep_ctx);
			a->argv[a->n++] = "--ctx";
			a->argv[a->n++] = a->ctx;
		}
	}
	a->argv[a->n] = NULL;
}

/* Seconds on the monotonic clock. */
static double seconds_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/*
 * Where a deep measurement's positions go (write_progress), and how long
 * the rest takes. When the reference runs alone first, its positions
 * count, then the candidate's: out of twice the probe's. Time is work
 * (q4kh_deep_work) at the pace of this run so far, or before its first
 * chunk at the pace of a calibration (calibrate), a row of logits
 * counted as the calibration of the reference measured it.
 */
struct progress_to {
	int fd;
	const struct q4kh_deep_plan *plan;
	const char *runs_what; /* for the parent's estimate: PROGRESS_* */
	int64_t before;        /* positions counted before this run */
	int64_t runs;          /* runs of the probe in the total: 1 or 2 */
	int all_rows;          /* this run computes every row of its chunks (a candidate) */
	double t0;             /* when this run began */
	double pace;           /* its work per second; 0: not known */
	double after;          /* seconds the run after this one will take */
	double logits_row;     /* a row of logits, in work (q4kh_deep_work); -1: as counted */
};

/* What a deep measurement's child runs, as its progress file says it. */
#define PROGRESS_BOTH_IN_TURN "reference-then-candidate"
#define PROGRESS_CANDIDATE "candidate"
#define PROGRESS_SIDE_BY_SIDE "candidate-beside-reference"

/*
 * The positions a deep measurement has done and the seconds it has left
 * (-1: not known yet), as "DONE TOTAL LEFT WHAT" at the start of the file
 * of the progress_to at DATA, for the status line of the parent, which
 * reads it (show_measuring). The numbers only grow, so each line covers
 * the one before.
 */
static void write_progress(void *data, int64_t positions, int64_t total)
{
	struct progress_to *to = data;
	const double spent = seconds_now() - to->t0;
	const double done = q4kh_deep_work(to->plan, 0, positions, to->all_rows, to->logits_row);
	double left = -1;
	char line[128];
	int n;
	ssize_t w;

	if (positions > 0 && spent > 0)
		to->pace = done / spent;
	if (to->pace > 0)
		left = to->after + q4kh_deep_work(to->plan, positions, total, to->all_rows,
		                                  to->logits_row) / to->pace;
	n = snprintf(line, sizeof(line), "%lld %lld %.0f %s\n",
	             (long long)(to->before + positions), (long long)(to->runs * total), left,
	             to->runs_what);
	w = pwrite(to->fd, line, (size_t)n, 0);
	(void)w; /* a status line is not worth failing a measurement for */
}

/* Positions of the deep probe a calibration runs: all of them judged, in
 * one step, a few seconds on the reference on 2 cores. */
#define CALIBRATE_POSITIONS 32

/* The positions a calibration runs: CALIBRATE_POSITIONS, or the probe's. */
static int64_t calibrated_positions(const struct q4kh_guard *g)
{
	return g->deep->prefill < CALIBRATE_POSITIONS ? g->deep->prefill : CALIBRATE_POSITIONS;
}

/*
 * The seconds S takes for the deep probe's first positions
 * (calibrated_positions), with the logits of the rows FLAGS sets
 * computed, S reset before and after: the pace of the long work to come,
 * measured before it starts. 0 when it fails (the measurement then says
 * so itself).
 */
static double calibrate_rows(const struct q4kh_guard *g, struct q4kh_session *s,
                             const uint8_t *flags)
{
	const int64_t n = calibrated_positions(g);
	float *logits = malloc(sizeof(float) * (size_t)n * s->m->hp.n_vocab);
	struct q4kh_error e = { { 0 } };
	double t0 = seconds_now(), t = 0;

	if (!logits)
		return 0;
	q4kh_session_reset(s);
	if (q4kh_session_eval_rows(s, g->probe, n, logits, flags, 1, &e) == 0)
		t = seconds_now() - t0;
	q4kh_session_reset(s);
	free(logits);
	return t;
}

/* calibrate_rows with the judged positions' logits, as the probe runs them. */
static double calibrate(const struct q4kh_guard *g, struct q4kh_session *s)
{
	return calibrate_rows(g, s, g->deep->judged);
}

/* The pace (work per second) of a run of ALL_ROWS that took SECONDS for
 * the calibration's positions; 0 when not known. */
static double calibrated_pace(const struct q4kh_guard *g, double seconds, int all_rows)
{
	const double work = q4kh_deep_work(g->deep, 0, calibrated_positions(g), all_rows, -1);

	return seconds > 0 ? work / seconds : 0;
}

/*
 * The reference's pace on S into TO: its layers and its rows of logits
 * timed apart, from the calibration's positions with every judged row's
 * logits and with the last row's alone. The reference's output
 * projection runs several times faster per multiply-add than its layers
 * (on the default model, about 0.07 s a row of 168 M against 0.35 s a
 * position of 78 M on 2 busy cores), so one pace for both, taken where
 * nearly every row has logits, put the probe's long stretches with one
 * judged row in eight some 20 % short. TO keeps the counted cost of a
 * row when the difference does not show (a busy machine's noise).
 */
static void reference_pace(const struct q4kh_guard *g, struct q4kh_session *s,
                           struct progress_to *to)
{
	const int64_t n = calibrated_positions(g);
	uint8_t last[CALIBRATE_POSITIONS] = { 0 };
	double all, one, row, layers;
	int64_t rows = 0;

	for (int64_t p = 0; p < n; p++)
		rows += g->deep->judged[p] != 0;
	all = calibrate(g, s);
	last[n - 1] = 1;
	one = calibrate_rows(g, s, last);
	row = rows > 1 ? (all - one) / (double)(rows - 1) : 0;
	layers = one - row;
	to->logits_row = -1;
	to->pace = calibrated_pace(g, all, 0);
	if (all <= 0 || one <= 0 || row <= 0 || layers <= 0)
		return;
	to->pace = q4kh_deep_work(g->deep, 0, n, 0, 0) / layers;
	to->logits_row = row * to->pace;
}

/* What a measurement says when the reference cannot start, with its reason. */
#define REFERENCE_DOWN "not measured: the reference could not start (F2.4): %.400s"

/* A host note of LEVEL on stderr, below the threshold dropped (log.h). */
static void note(q4kh_log_level level, const char *fmt, ...)
{
	va_list ap;

	if (level < q4kh_log_threshold())
		return;
	fprintf(stderr, "q4khost: %s: ", q4kh_log_word(level));
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/*
 * What a shared reference file must have been computed for, beyond the
 * run's shape (f2_reference.h): the model, the reference plugin's file and
 * settings (KEY's entry of role reference), the reference's context N_CTX
 * and this host.
 */
static void reference_identity(const struct q4kh_guard *g, const struct q4kh_receipt_key *key,
                               uint32_t n_ctx, char *buf, size_t cap)
{
	const struct q4kh_receipt_plugin *p = &key->plugins[0];
	char settings[Q4KH_SHA256_HEX] = "none";

	if (p->settings[0])
		q4kh_sha256_bytes(p->settings, strlen(p->settings), settings);
	snprintf(buf, cap,
	         "model_sha256 %s\nreference %s sha256 %s settings %s\nn_ctx %u\nhost %s\n",
	         g->model_sha256, p->name, p->sha256, settings, n_ctx, PACKAGE_VERSION);
}

/* Open the reference on G's model for N_CTX tokens into REF; 0, or -1 with OUT
 * not measured (F2.4: a side that cannot even start is not measured). */
static int reference_open(const struct q4kh_guard *g, uint32_t n_ctx,
                          struct q4kh_serving *ref, struct q4kh_receipt *out)
{
	struct q4kh_error e = { { 0 } };

	if (q4kh_serving_open(g->registry, g->model_path,
	                      &(struct q4kh_candidate){ .backend = "cpu" }, n_ctx, ref, &e) == 0)
		return 0;
	snprintf(out->message, sizeof(out->message), REFERENCE_DOWN, e.msg);
	return -1;
}

/*
 * The first deep measurement of a command, whose shared file is not there
 * yet: the reference computes its rows alone and writes the file, and is
 * closed before the candidate starts, so that the reference's KV cache and
 * steps and the candidate's runtime never share this process's memory.
 * Before it starts, PROGRESS (-1: none) gets the estimate of both runs:
 * the reference's calibrated here, the candidate's from CAND_SECONDS (its
 * calibration, 0: not known). 1 when the file was written, *SECONDS its
 * time; 0 when not (the measurement then computes the reference beside
 * the candidate, as any would), with why in the log.
 */
static int reference_first(const struct q4kh_guard *g, uint32_t n_ctx, int progress,
                           double cand_seconds, double *seconds)
{
	const int64_t rows = g->deep->prefill + g->deep->decode_steps;
	const double cand_pace = calibrated_pace(g, cand_seconds, 1);
	struct progress_to to = { progress, g->deep, PROGRESS_BOTH_IN_TURN, 0, 2, 0, 0, 0, 0, -1 };
	struct q4kh_receipt_key key = { 0 };
	struct q4kh_receipt out = { 0 };
	struct q4kh_serving ref;
	struct q4kh_f2_ref fref = { 0 };
	struct q4kh_error e = { { 0 } };
	char identity[1024];
	int rc;

	if (plugin_entry(g, &key, "reference", "cpu", &e) ||
	    reference_open(g, n_ctx, &ref, &out)) {
		note(Q4KH_LOG_DEBUG, "F2: the reference could not run alone: %s",
		     e.msg[0] ? e.msg : out.message);
		return 0;
	}
	reference_identity(g, &key, n_ctx, identity, sizeof(identity));
	fref.s = ref.s;
	fref.n_vocab = ref.s->m->hp.n_vocab;
	fref.path = g->reference_logits;
	fref.identity = identity;
	if (progress >= 0) {
		reference_pace(g, ref.s, &to);
		to.after = cand_pace > 0 ? q4kh_deep_work(g->deep, 0, rows, 1, -1) / cand_pace : 0;
	}
	to.t0 = seconds_now();
	if (progress >= 0)
		write_progress(&to, 0, rows);
	rc = q4kh_f2_record_plan(&fref, g->probe, g->deep->prefill, g->deep->judged,
	                         g->deep->decode_steps, ref.s->p.n_batch,
	                         progress >= 0 ? write_progress : NULL, &to, &e);
	q4kh_serving_close(&ref);
	*seconds = seconds_now() - to.t0;
	if (rc)
		note(Q4KH_LOG_INFO, "F2: the reference could not run alone (%s); it runs beside the candidate", e.msg);
	return rc == 0;
}

/* The seconds candidate C takes for the calibration's positions, in a
 * session of its own, closed after; 0 when it cannot start (its
 * measurement then says why). */
static double calibrate_candidate(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                                  uint32_t n_ctx)
{
	struct q4kh_serving cand;
	struct q4kh_error e = { { 0 } };
	double t;

	if (q4kh_serving_open(g->registry, g->model_path, c, n_ctx, &cand, &e))
		return 0;
	t = calibrate(g, cand.s);
	q4kh_serving_close(&cand);
	return t;
}

int q4kh_guard_measure(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                       struct q4kh_receipt *out, struct q4kh_error *err)
{
	struct q4kh_f2_rules rules;
	struct q4kh_f2_plan plan;
	struct q4kh_f2_result res;
	struct q4kh_serving ref, cand;
	struct q4kh_f2_ref fref = { 0 };
	struct q4kh_error e = { { 0 } };
	char id[512], identity[1024];
	uint32_t n_ctx;
	int rc = -1, progress = -1, ref_open = 0, first = 0, run;
	double first_seconds = 0; /* the reference's, when it ran first */
	double cand_seconds = 0;  /* the candidate's calibration */
	struct progress_to to = { -1, g->deep, PROGRESS_CANDIDATE, 0, 1, 1, 0, 0, 0, -1 };

	memset(out, 0, sizeof(*out));
	if (q4kh_guard_rules(g, c, &rules, err))
		return -1;
	plan = q4kh_guard_plan(g, &rules);
	n_ctx = g->deep ? (uint32_t)(plan.prefill + plan.decode_steps)
	                : rules.probe_tokens + rules.decode_steps + 8;
	out->verdict = Q4KH_F2_NOT_MEASURED;
	out->min_cosine = NAN;
	if (g->deep && g->progress_file)
		progress = open(g->progress_file, O_WRONLY | O_CLOEXEC);
	to.fd = progress;
	if (g->deep && g->reference_logits && access(g->reference_logits, F_OK) != 0) {
		if (progress >= 0)
			cand_seconds = calibrate_candidate(g, c, n_ctx);
		first = reference_first(g, n_ctx, progress, cand_seconds, &first_seconds);
	}
	/* With a shared file the reference may not be needed at all. */
	if (!g->reference_logits) {
		if (reference_open(g, n_ctx, &ref, out)) {
			if (progress >= 0)
				close(progress);
			return 0;
		}
		ref_open = 1;
	}
	if (q4kh_serving_open(g->registry, g->model_path, c, n_ctx, &cand, &e)) {
		snprintf(out->message, sizeof(out->message),
		         "not measured: the candidate could not start (F2.4): %.400s", e.msg);
		if (ref_open)
			q4kh_serving_close(&ref);
		if (progress >= 0)
			close(progress);
		return 0;
	}
	if (progress >= 0) {
		if (first) {
			to.before = g->deep->prefill + g->deep->decode_steps;
			to.runs = 2;
			to.runs_what = PROGRESS_BOTH_IN_TURN;
		} else {
			cand_seconds = calibrate(g, cand.s) + (ref_open ? calibrate(g, ref.s) : 0);
			to.runs_what = ref_open ? PROGRESS_SIDE_BY_SIDE : PROGRESS_CANDIDATE;
		}
		to.pace = calibrated_pace(g, cand_seconds, 1);
		to.t0 = seconds_now();
		write_progress(&to, 0, g->deep->prefill + g->deep->decode_steps);
	}
	if (q4kh_guard_key(g, c, &cand.be.record, &out->key, id, sizeof(id), err))
		goto out;
	reference_identity(g, &out->key, n_ctx, identity, sizeof(identity));
	fref.s = ref_open ? ref.s : NULL;
	fref.n_vocab = cand.s->m->hp.n_vocab;
	fref.path = g->reference_logits;
	fref.identity = identity;
	for (;;) {
		run = g->deep ? q4kh_f2_run_plan(&fref, cand.s, g->probe, plan.prefill, plan.judged,
		                                 plan.decode_steps, &rules,
		                                 progress >= 0 ? write_progress : NULL, &to,
		                                 &res, err)
		              : q4kh_f2_run(&fref, cand.s, g->probe, g->n_probe, &rules, &res, err);
		if (run < 0)
			goto out;
		if (run == 0 && !fref.replay_failed)
			break;
		/* refused, or failed mid-run: compute the reference after all */
		if (run == 0) {
			q4kh_f2_result_free(&res);
			note(Q4KH_LOG_WARN, "F2: the shared reference file %s failed while read "
			     "(%s); computing the reference", fref.path, fref.why);
		}
		if (!ref_open) {
			if (reference_open(g, n_ctx, &ref, out)) {
				rc = 0;
				goto out;
			}
			ref_open = 1;
		}
		fref.s = ref.s;
		fref.refused = 1;
		fref.replay_failed = 0;
	}
	if (fref.path) {
		/* a file not there yet is the first measurement's: no news */
		const int absent = !strcmp(fref.why, strerror(ENOENT));

		if (fref.replaying && first)
			note(Q4KH_LOG_DEBUG,
			     "F2: the reference computed: the shared file %s is not there yet; "
			     "wrote it, the reference alone, before the candidate started",
			     fref.path);
		else if (fref.replaying)
			note(Q4KH_LOG_DEBUG, "F2: the reference's logits read from the shared file %s",
			     fref.path);
		else
			note(absent ? Q4KH_LOG_DEBUG : Q4KH_LOG_INFO,
			     "F2: the reference computed: the shared file %s %s%s; %s", fref.path,
			     absent ? "is not there yet" : "was refused: ", absent ? "" : fref.why,
			     fref.recorded ? "wrote it" : fref.unwritten);
		/* a file this measurement wrote itself, then read: computed */
		q4kh_f2_ref_note(fref.path, fref.replaying && !first ? "read" : "computed");
	}
	out->verdict = res.verdict;
	out->min_cosine = res.min_cosine;
	out->near_ties = res.near_ties;
	out->seconds = res.seconds + (first ? first_seconds : 0);
	out->worst_position = res.worst >= 0 ? res.points[res.worst].position : -1;
	out->worst_decode_step = res.worst >= 0 ? res.points[res.worst].decode_step : -1;
	snprintf(out->message, sizeof(out->message), "%s", res.message);
	rc = q4kh_receipt_set_points(out, res.points, res.n_points, err);
	q4kh_f2_result_free(&res);
	if (rc == 0 && out->verdict != Q4KH_F2_NOT_MEASURED)
		rc = q4kh_receipt_save(g->receipt_dir, id, &g->mac, out, err);
	/* else nothing measured: nothing to remember */
out:
	if (progress >= 0)
		close(progress);
	q4kh_serving_close(&cand);
	if (ref_open)
		q4kh_serving_close(&ref);
	return rc;
}

/* A log (stderr not a terminal) gets the status as a line this often. */
#define LOG_EVERY_S 60

/* What a terminal shows while a child measures, and a log a line a minute. */
struct measuring {
	char name[160];
	const char *reason;
	int progress;      /* a deep measurement's positions (write_progress); -1: none */
	unsigned limit_s;  /* the time limit it runs under */
	int estimated;     /* the deep measurement's estimate was said */
	unsigned logged_s; /* when a log got the status last (seconds in) */
	char line[128];    /* the child's last progress line */
	unsigned line_s;   /* when it was first read (seconds in) */
};

/* "6 min", "2 min 10 s", "40 s" into BUF: SECONDS, rounded to what matters. */
static const char *duration(double seconds, char *buf, size_t cap)
{
	const long s = seconds < 1 ? 1 : (long)(seconds + 0.5);

	if (s < 60)
		snprintf(buf, cap, "%ld s", s);
	else if (s < 600)
		snprintf(buf, cap, "%ld min %ld s", s / 60, s % 60 / 10 * 10);
	else
		snprintf(buf, cap, "%ld min", (s + 30) / 60);
	return buf;
}

/*
 * A deep measurement's estimate, in a line of its own, once, before its
 * long work starts: LEFT seconds for TOTAL positions, and which runs they
 * are (WHAT, write_progress), timed on a calibration of each (calibrate).
 */
static void estimate(struct measuring *m, double left, long long total, const char *what)
{
	char all[40], runs[160];

	if (m->estimated || left < 0)
		return;
	m->estimated = 1;
	if (!strcmp(what, PROGRESS_BOTH_IN_TURN))
		snprintf(runs, sizeof(runs), "the reference's %lld alone, then the candidate's %lld",
		         total / 2, total / 2);
	else if (!strcmp(what, PROGRESS_SIDE_BY_SIDE))
		snprintf(runs, sizeof(runs), "the candidate's, the reference's beside each");
	else
		snprintf(runs, sizeof(runs), "the candidate's; the reference's logits are read "
		         "from the file the first candidate wrote");
	q4kh_progress_note("F2 of %s: deep probe: about %s for %lld positions (%s), at the pace "
	                   "of their first %d on this machine",
	                   m->name, duration(left, all, sizeof(all)), total, runs,
	                   CALIBRATE_POSITIONS);
}

/*
 * Whether a deep measurement that will take LEFT more seconds from
 * FROM_S (seconds into it) ends past M's time limit, which would kill
 * it: then WHY (CAP bytes) says so, and how to give it room. The
 * estimate errs short, if anything (the machine's load grows, attention
 * reads more keys), so a measurement it puts past the limit is stopped
 * at once rather than minutes later with nothing learnt.
 */
static int past_limit(const struct measuring *m, unsigned from_s, double left, char *why,
                      size_t cap)
{
	const double all = from_s + left;
	char all_text[40];

	if (left < 0 || all <= m->limit_s)
		return 0;
	snprintf(why, cap, "validation stopped after %u s: the deep probe needs about %s here in "
	         "all, at its pace so far, past the time limit of %u s that would stop it; "
	         "--timeout %.0f (or [f2] f2_timeout_s) gives it twice that",
	         from_s, duration(all, all_text, sizeof(all_text)), m->limit_s,
	         ceil(2 * all / 60) * 60);
	return 1;
}

static int show_measuring(void *data, unsigned seconds, char *why, size_t why_cap)
{
	struct measuring *m = data;
	char line[128] = "", what[48], done[120] = "", left_text[40];
	long long positions, total;
	double left;

	if (m->progress >= 0 && pread(m->progress, line, sizeof(line) - 1, 0) > 0 &&
	    sscanf(line, "%lld %lld %lf %47s", &positions, &total, &left, what) == 4) {
		if (strcmp(line, m->line)) {
			snprintf(m->line, sizeof(m->line), "%s", line);
			m->line_s = seconds;
		}
		estimate(m, left, total, what);
		if (why && past_limit(m, m->line_s, left, why, why_cap))
			return 1;
		snprintf(done, sizeof(done), ", %lld/%lld positions", positions, total);
		/* the child's figure, less the time since it wrote it */
		left -= seconds - m->line_s;
		if (positions < total && left >= 1)
			snprintf(done + strlen(done), sizeof(done) - strlen(done), ", about %s left",
			         duration(left, left_text, sizeof(left_text)));
	}
	/* The name, then what moves, the reason last: a line too long is cut
	 * at its end, and keeps the name. */
	if (q4kh_progress_on_terminal()) {
		q4kh_progress("F2 of %s: %u s%s, against the reference (%s)", m->name, seconds,
		              done, m->reason);
	} else if (seconds >= m->logged_s + LOG_EVERY_S) {
		m->logged_s = seconds;
		q4kh_progress_note("F2 of %s: %u s%s, against the reference (%s)", m->name,
		                   seconds, done, m->reason);
	}
	return 0;
}

/*
 * Whether the reference backend is on the path but cannot start (its init
 * refuses a setting, say), with its reason in E: then nothing can be
 * measured, and a child started to try would end without a receipt and
 * without a word of why.
 */
static int reference_down(const struct q4kh_guard *g, struct q4kh_error *e)
{
	const struct q4kh_plugin *cpu = q4kh_registry_find(g->registry, "cpu");
	const struct q4kh_host_backend *b;
	uint32_t n;

	if (!cpu || !g->host)
		return cpu && q4kh_backend_devices(cpu, &n, e) != 0;
	b = q4kh_host_backend(g->host, cpu);
	if (b && !b->ctx)
		q4kh_fail(e, "%s", b->why);
	return b && !b->ctx;
}

/*
 * Run the measurement in a child: a crash, a hang or a runaway cannot take
 * us down. Its last line on stderr goes into SAID (SAID_CAP bytes) when it
 * exits with status 0, into WHY with the rest when it fails.
 */
static int measure_isolated(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                            const char *reason, char *why, size_t why_cap, char *said,
                            size_t said_cap, int *hit, struct q4kh_error *err)
{
	struct measuring m = { "", reason, -1, g->timeout_seconds, 0, 0, "", 0 };
	const struct q4kh_isolate_limits limits = { g->timeout_seconds,
		                                    g->memory_limit_mib, show_measuring, &m,
		                                    NULL, hit, said, said_cap };
	struct q4kh_guard_args a;
	char probe_file[PATH_MAX] = "", progress_file[PATH_MAX] = "";
	int rc;

	snprintf(m.name, sizeof(m.name), "%s/%s (device %u)", c->backend,
	         c->variant ? c->variant : "built-in", c->device);
	q4kh_guard_child_args(g, c, &a);
	a.argv[a.n++] = "--one";
	a.argv[a.n++] = "--quiet"; /* the verdict is ours to report */
	if (g->probe_kind == Q4KH_F2_PROBE_PROMPT) {
		if (q4kh_guard_probe_save(g->probe, g->n_probe, probe_file, sizeof(probe_file),
		                          err))
			return -1;
		a.argv[a.n++] = "--probe-ids";
		a.argv[a.n++] = probe_file;
	}
	/* A deep measurement takes minutes: the child says how far it got. */
	if (g->probe_kind == Q4KH_F2_PROBE_DEEP) {
		if ((m.progress = child_file("progress", progress_file, sizeof(progress_file),
		                             err)) < 0) {
			if (probe_file[0])
				unlink(probe_file);
			return -1;
		}
		a.argv[a.n++] = "--progress-file";
		a.argv[a.n++] = progress_file;
	}
	if (g->reference_logits) {
		a.argv[a.n++] = "--reference-logits";
		a.argv[a.n++] = g->reference_logits;
	}
	q4kh_guard_deep_args(g, &a);
	show_measuring(&m, 0, NULL, 0);
	rc = q4kh_isolate_run(g->self_exe, a.argv, &limits, why, why_cap, err);
	q4kh_progress_clear();
	if (probe_file[0])
		unlink(probe_file);
	if (m.progress >= 0) {
		close(m.progress);
		unlink(progress_file);
	}
	return rc;
}

/*
 * The plan of the deep receipt R that a guard of another probe reads
 * (deep_receipt): the deep probe of G's model that reaches R's points,
 * into *PLAN (free it), when its tokens and flags are the ones R is keyed
 * on (probe_sha256). 0, or 1 with why not in WHY.
 */
static int deep_plan_of(const struct q4kh_guard *g, const struct q4kh_receipt *r,
                        const char *path, struct q4kh_deep_plan *plan, char *why, size_t cap)
{
	struct q4kh_error e = { { 0 } };
	char hex[Q4KH_SHA256_HEX];
	int32_t *ids = NULL;
	int rc;

	/* A context of its points makes q4kh_deep_probe reach exactly as far:
	 * the prefill is the context less the decode steps, or the whole
	 * probe when that is shorter. */
	if (r->n_points > UINT32_MAX ||
	    q4kh_deep_probe(g->model_path, (uint32_t)r->n_points, &ids, plan, &e)) {
		snprintf(why, cap, "receipt %s: %lld points, which no deep probe of this model has (%s): ignored",
		         path, (long long)r->n_points, e.msg);
		return 1;
	}
	rc = deep_probe_sha256(ids, (size_t)plan->prefill, plan, hex, &e);
	free(ids);
	if (!rc && strcmp(hex, r->key.probe_sha256)) {
		snprintf(why, cap, "receipt %s: probe_sha256 %.8s… but the deep probe of its %lld points is %.8s…: ignored",
		         path, r->key.probe_sha256, (long long)r->n_points, hex);
		rc = 1;
	} else if (rc) {
		snprintf(why, cap, "%s", e.msg);
		rc = 1;
	}
	if (rc)
		q4kh_deep_plan_free(plan);
	return rc;
}

int q4kh_guard_receipt(const struct q4kh_guard *g, const struct q4kh_receipt_key *key,
                       const char *id, struct q4kh_receipt *out, char *why, size_t cap)
{
	struct q4kh_receipt_key want = *key;
	struct q4kh_deep_plan deep = { 0 };
	struct q4kh_f2_rules rules;
	struct q4kh_f2_plan plan;
	struct q4kh_error e = { { 0 } };
	char path[4096], diff[256];
	/* a deep receipt decides for another probe: whichever deep probe it
	 * ran (its tokens are the host's, its reach the context it was given) */
	const int other_deep = !g->deep && !strcmp(key->probe, q4kh_f2_probe_name(Q4KH_F2_PROBE_DEEP));
	int rc = q4kh_receipt_load(g->receipt_dir, id, &g->mac, out, &e);

	if (rc) {
		snprintf(why, cap, rc > 0 ? "%s" : "the receipt could not be read: %s", e.msg);
		return 1;
	}
	q4kh_receipt_path(g->receipt_dir, id, path, sizeof(path));
	if (other_deep)
		memcpy(want.probe_sha256, out->key.probe_sha256, sizeof(want.probe_sha256));
	if (q4kh_receipt_key_diff(&out->key, &want, diff, sizeof(diff))) {
		snprintf(why, cap, "%s", diff);
		rc = 1;
	} else if (other_deep && out->n_points &&
	           deep_plan_of(g, out, path, &deep, why, cap)) {
		rc = 2;
	} else {
		q4kh_receipt_rules(&out->key, &rules);
		plan = other_deep && out->n_points
		               ? (struct q4kh_f2_plan){ deep.prefill, deep.decode_steps, deep.judged, 0 }
		               : q4kh_guard_plan(g, &rules);
		if (q4kh_receipt_check(path, out, &plan, &e)) {
			snprintf(why, cap, "%s", e.msg);
			rc = 2;
		} else if (q4kh_guard_limit_raised(g, out, diff, sizeof(diff))) {
			snprintf(why, cap, "%s", diff);
			rc = 1;
		}
	}
	q4kh_deep_plan_free(&deep);
	if (rc)
		q4kh_receipt_free(out);
	return rc;
}

/*
 * Whether a valid deep receipt of the candidate keyed KEY (receipt ID)
 * decides for the built-in probe: the wider measurement, whichever deep
 * probe it ran, when it measured every position; a deep rejection is not
 * outvoted by a pass of 64 tokens. Fills OUT when it does.
 */
static int deep_receipt(const struct q4kh_guard *g, const struct q4kh_receipt_key *key,
                        const char *id, struct q4kh_guard_decision *out)
{
	struct q4kh_receipt_key want = *key;
	char deep_id[560], why[512];
	int rc;

	snprintf(deep_id, sizeof(deep_id), "%s probe %s", id,
	         q4kh_f2_probe_name(Q4KH_F2_PROBE_DEEP));
	snprintf(want.probe, sizeof(want.probe), "%s", q4kh_f2_probe_name(Q4KH_F2_PROBE_DEEP));
	rc = q4kh_guard_receipt(g, &want, deep_id, &out->receipt, why, sizeof(why));
	/* the decision's source will name the built-in probe's receipt */
	if (rc == 2)
		note(Q4KH_LOG_WARN, "%s", why);
	/* a crash or a timeout (no points) says nothing of the positions */
	if (rc || !out->receipt.n_points) {
		q4kh_receipt_free(&out->receipt);
		return 0;
	}
	out->verdict = out->receipt.verdict;
	snprintf(out->source, sizeof(out->source), "deep receipt of %s", out->receipt.created);
	return 1;
}

const char *q4kh_guard_limit_raised(const struct q4kh_guard *g,
                                    const struct q4kh_receipt *r, char *buf, size_t cap)
{
	if (!strcmp(r->limit, "time") && g->timeout_seconds > r->limit_value) {
		snprintf(buf, cap, "the time limit was raised (%llu -> %u s)",
		         (unsigned long long)r->limit_value, g->timeout_seconds);
		return buf;
	}
	if (!strcmp(r->limit, "memory") &&
	    (!g->memory_limit_mib || g->memory_limit_mib > r->limit_value)) {
		if (g->memory_limit_mib)
			snprintf(buf, cap, "the memory limit was raised (%llu -> %llu MiB)",
			         (unsigned long long)r->limit_value,
			         (unsigned long long)g->memory_limit_mib);
		else
			snprintf(buf, cap, "the memory limit was raised (%llu MiB -> none)",
			         (unsigned long long)r->limit_value);
		return buf;
	}
	return NULL;
}

/* Record in R the limit HIT (isolate.h) that stopped G's measurement. */
static void record_limit(const struct q4kh_guard *g, int hit, struct q4kh_receipt *r)
{
	if (hit == Q4KH_ISOLATE_HIT_TIME) {
		snprintf(r->limit, sizeof(r->limit), "time");
		r->limit_value = g->timeout_seconds;
	} else if (hit == Q4KH_ISOLATE_HIT_MEMORY) {
		snprintf(r->limit, sizeof(r->limit), "memory");
		r->limit_value = g->memory_limit_mib;
	}
}

/* OUT as a decision that measured nothing (F2.4): no cosine and no
 * position, which a table would otherwise show as 0; the message is the
 * caller's. */
static void unmeasured(struct q4kh_guard_decision *out)
{
	memset(&out->receipt, 0, sizeof(out->receipt));
	out->verdict = Q4KH_F2_NOT_MEASURED;
	out->receipt.verdict = Q4KH_F2_NOT_MEASURED;
	out->receipt.min_cosine = NAN;
	out->receipt.worst_position = -1;
	out->receipt.worst_decode_step = -1;
}

/*
 * The child exited with status 0 but left no receipt that counts (F2.4):
 * the verdict, with its reason in OUT's message. A child that measured
 * nothing says why in its last line on stderr (SAID: "not measured: the
 * candidate could not start (F2.4): ..."), which is then the reason as it
 * stands; else that line is quoted, with why the receipt found does not
 * count (ABSENT, q4kh_guard_receipt's reason), so that no F2.4 verdict
 * comes without a reason.
 */
static void not_recorded(const char *absent, const char *said, struct q4kh_guard_decision *out)
{
	char *m = out->receipt.message;
	const size_t cap = sizeof(out->receipt.message);
	int n;

	unmeasured(out);
	if (!strncmp(said, "not measured: ", strlen("not measured: "))) {
		snprintf(m, cap, "%s", said);
		return;
	}
	n = snprintf(m, cap, "not measured: the validation process exited with status 0 but "
	             "left no receipt that counts (F2.4): %.160s", absent);
	if ((size_t)n < cap)
		snprintf(m + n, cap - (size_t)n, "; %s%.300s", said[0] ? "its last line on stderr: "
		                                                    : "it wrote nothing on stderr",
		         said);
}

int q4kh_guard_receipt_decision(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                                const struct q4kh_device_record *dev,
                                struct q4kh_guard_decision *out, char *why, size_t cap,
                                struct q4kh_receipt_key *key, char *id, size_t id_cap,
                                struct q4kh_error *err)
{
	struct q4kh_receipt_key own_key;
	char own_id[512];

	key = key ? key : &own_key;
	if (!id) {
		id = own_id;
		id_cap = sizeof(own_id);
	}
	memset(out, 0, sizeof(*out));
	if (q4kh_guard_key(g, c, dev, key, id, id_cap, err))
		return -1;
	if (g->probe_kind == Q4KH_F2_PROBE_BUILTIN && deep_receipt(g, key, id, out))
		return 0;
	if (q4kh_guard_receipt(g, key, id, &out->receipt, why, cap))
		return 1;
	out->verdict = out->receipt.verdict;
	snprintf(out->source, sizeof(out->source), "receipt of %s", out->receipt.created);
	return 0;
}

int q4kh_guard_check(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                     const struct q4kh_device_record *dev, enum q4kh_f2_mode mode,
                     struct q4kh_guard_decision *out, struct q4kh_error *err)
{
	struct q4kh_receipt_key key;
	struct q4kh_error lerr = { { 0 } };
	char id[512], absent[512], why[512] = "", said[512] = "";
	const char *reason;
	struct timespec t0, t1;
	int rc, hit = Q4KH_ISOLATE_HIT_NONE;

	memset(out, 0, sizeof(*out));
	if (mode == Q4KH_F2_OFF) {
		unmeasured(out);
		snprintf(out->source, sizeof(out->source), "off");
		snprintf(out->receipt.message, sizeof(out->receipt.message),
		         "F2 is off: the candidate is unverified");
		return 0;
	}
	/* none, stale and void read alike: measured */
	if (mode != Q4KH_F2_FRESH) {
		rc = q4kh_guard_receipt_decision(g, c, dev, out, absent, sizeof(absent), &key, id,
		                                 sizeof(id), err);
		if (rc <= 0)
			return rc;
		reason = absent;
	} else if (q4kh_guard_key(g, c, dev, &key, id, sizeof(id), err)) {
		return -1;
	} else if (q4kh_guard_receipt(g, &key, id, &out->receipt, absent, sizeof(absent)) == 0) {
		reason = g->fresh_source ? g->fresh_source : "--f2 fresh";
		q4kh_receipt_free(&out->receipt);
	} else {
		reason = absent;
	}
	snprintf(out->source, sizeof(out->source), "fresh: %.240s", reason);
	if (reference_down(g, &lerr)) {
		unmeasured(out);
		snprintf(out->receipt.message, sizeof(out->receipt.message), REFERENCE_DOWN,
		         lerr.msg);
		return 0;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = measure_isolated(g, c, reason, why, sizeof(why), said, sizeof(said), &hit, err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc < 0)
		return -1;
	if (rc == 2) /* nothing learnt about the plugin: no receipt */
		return q4kh_fail(err, "%s before F2 finished; no receipt written", why);
	if (rc > 0) {
		/* Recorded, so the next run does not retry until a key changes. */
		memset(&out->receipt, 0, sizeof(out->receipt));
		out->receipt.key = key;
		out->receipt.verdict = Q4KH_F2_REJECT;
		out->receipt.min_cosine = NAN;
		out->receipt.worst_position = -1;
		out->receipt.worst_decode_step = -1;
		/* the time it ran before it was stopped, not 0 */
		out->receipt.seconds = (double)(t1.tv_sec - t0.tv_sec) +
		                       (t1.tv_nsec - t0.tv_nsec) * 1e-9;
		snprintf(out->receipt.message, sizeof(out->receipt.message), "%s", why);
		record_limit(g, hit, &out->receipt);
		out->verdict = Q4KH_F2_REJECT;
		return q4kh_receipt_save(g->receipt_dir, id, &g->mac, &out->receipt, err);
	}
	if (q4kh_guard_receipt(g, &key, id, &out->receipt, absent, sizeof(absent)) != 0) {
		/* The child ran but measured nothing (F2.4); a receipt left
		 * from before that cannot be used counts for nothing either. */
		not_recorded(absent, said, out);
		return 0;
	}
	if (said[0]) { /* not the child's reason, then: its news */
		q4kh_progress_clear();
		fprintf(stderr, "%s\n", said);
	}
	out->verdict = out->receipt.verdict;
	return 0;
}
