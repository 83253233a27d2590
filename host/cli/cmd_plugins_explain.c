/*
 * q4khost plugins --explain: for every device of every backend, the kernel
 * chain that q4khost run walks (policy.h), the kernel chosen first and the
 * runner-up per tensor type, the F2 rules each candidate is judged by, and
 * for every setting its value and where it came from (the command line,
 * an environment variable, FILE:LINE of a config file, or the default).
 * Choices are shown before F2: each candidate still has to pass the guard.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "config.h"
#include "guard.h"
#include "policy.h"
#include "receipt.h"
#include "select.h"
#include "settings.h"

/* One setting: its value and where it came from. */
static json_t *setting(const char *value, const char *origin)
{
	return json_pack("{s:s?, s:s}", "value", value, "origin", origin);
}

static void print_setting(const char *name, const char *value, const char *origin)
{
	printf("  %-20s %-36s from %s\n", name, value, origin);
}

/*
 * Every key each accepted plugin's [plugin.NAME] section sets (the
 * plugin's own settings and its F2 rules), with its value and where it
 * came from, into OUT ({NAME: {KEY: setting}}) or as text; a key no file
 * sets has the plugin's own default. A key the plugin does not read is
 * shown as such (in JSON "unknown": true, and "did_you_mean" when a key
 * it reads is close), never as a setting.
 */
static void plugin_settings(const struct q4kh_registry *r, const struct q4kh_config *c,
                            json_t *out, int json)
{
	char section[160], origin[700], name[256], near[128], text[1024];
	const char *keys[256];
	size_t shown = 0;

	if (!json)
		printf("plugin settings ([plugin.NAME] of the config; a key not set takes the "
		       "plugin's default):\n");
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		json_t *jp = json ? json_object() : NULL;
		size_t n;

		if (p->state != Q4KH_PLUGIN_ACCEPTED)
			continue;
		snprintf(section, sizeof(section), "plugin.%s", p->name);
		n = q4kh_config_section_keys(c, section, NULL, keys, 256);
		for (size_t k = 0; k < n; k++) {
			const char *v = q4kh_config_where(c, section, keys[k], origin, sizeof(origin));
			int unread = q4kh_plugin_key_unread(p, keys[k], near, sizeof(near));
			json_t *js;

			snprintf(name, sizeof(name), "%s %s", p->name, keys[k]);
			if (json) {
				js = setting(v, origin);
				if (unread)
					json_object_set_new(js, "unknown", json_true());
				if (near[0])
					json_object_set_new(js, "did_you_mean", json_string(near));
				json_object_set_new(jp, keys[k], js);
				continue;
			}
			/* "key =" counts as unset: say so, not a blank */
			snprintf(text, sizeof(text), "%s", *v ? v : "(empty: the plugin's default)");
			if (unread)
				snprintf(text, sizeof(text), "%.200s (unknown key, ignored%s%s%s)", v,
				         near[0] ? ": did you mean " : "", near, near[0] ? "?" : "");
			print_setting(name, text, origin);
		}
		shown += n;
		if (json && n)
			json_object_set_new(out, p->name, jp);
		else
			json_decref(jp);
	}
	if (!json && !shown)
		printf("  none set\n");
}

/* The settings that hold for every device. */
static int settings(const struct q4kh_registry *r, const struct q4kh_config *c,
                    const char *backend_cli, json_t *out, int json)
{
	char mode_origin[700], probe_origin[700], deep_origin[640], backend_origin[64], dir[4096];
	const char *dir_origin, *backend;
	enum q4kh_f2_mode mode;
	enum q4kh_f2_probe_kind probe;
	struct q4kh_f2_limit_origins limits;
	struct q4kh_error err = { { 0 } };
	json_t *jplugins = json ? json_object() : NULL;
	char timeout_text[32], memory_text[48];
	unsigned timeout;
	uint64_t memory;
	int bad_file, deep;

	if (q4kh_settings_f2_mode(c, NULL, &mode, mode_origin, sizeof(mode_origin),
	                          &bad_file, &err) ||
	    q4kh_settings_f2_probe(c, NULL, &probe, probe_origin, sizeof(probe_origin),
	                           &bad_file, &err) ||
	    q4kh_settings_f2_require_deep(c, &deep, deep_origin, sizeof(deep_origin), &bad_file,
	                                  &err)) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		json_decref(jplugins);
		return bad_file ? Q4KH_EXIT_INPUT : Q4KH_EXIT_USAGE;
	}
	if (q4kh_guard_limits_where(c, &timeout, &memory, &limits, &err)) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		json_decref(jplugins);
		return Q4KH_EXIT_INPUT;
	}
	snprintf(timeout_text, sizeof(timeout_text), "%u s", timeout);
	snprintf(memory_text, sizeof(memory_text), memory ? "%llu MiB" : "none",
	         (unsigned long long)memory);
	backend = q4kh_settings_backend(backend_cli, backend_origin, sizeof(backend_origin));
	q4kh_receipt_dir(c, dir, sizeof(dir), &dir_origin);
	/* explained, not refused: this command diagnoses */
	if (q4kh_receipt_dir_check(c, NULL, &err))
		fprintf(stderr, "q4khost plugins: warning: %s; so validate, bench, qa, conformance, "
		        "and every run or serve that may need a receipt (F2 not off, a "
		        "candidate besides the reference) refuse to start (exit 3)\n",
		        err.msg);
	if (json) {
		json_object_set_new(out, "plugin_path", setting(r->path, r->path_origin));
		json_object_set_new(out, "backend", setting(backend ? backend : "automatic",
		                                            backend_origin));
		json_object_set_new(out, "f2_mode", setting(q4kh_f2_mode_name(mode), mode_origin));
		json_object_set_new(out, "f2_probe", setting(q4kh_f2_probe_name(probe),
		                                             probe_origin));
		json_object_set_new(out, "f2_require_deep",
		                    json_pack("{s:b, s:s}", "value", deep, "origin", deep_origin));
		json_object_set_new(out, "receipt_dir", setting(dir, dir_origin));
		json_object_set_new(out, "f2_timeout_s",
		                    json_pack("{s:i, s:s}", "value", (int)timeout, "origin",
		                              limits.timeout));
		json_object_set_new(out, "f2_memory_limit_mb",
		                    json_pack("{s:I, s:s}", "value", (json_int_t)memory, "origin",
		                              limits.memory));
		json_object_set_new(out, "catastrophic_floor",
		                    json_pack("{s:f, s:s}", "value", Q4KH_F2_CATASTROPHIC,
		                              "origin", "the fixed rule F2.2"));
		plugin_settings(r, c, jplugins, json);
		json_object_set_new(out, "plugins", jplugins);
		return 0;
	}
	printf("settings:\n");
	print_setting("plugin path", r->path, r->path_origin);
	print_setting("backend", backend ? backend : "automatic", backend_origin);
	print_setting("F2 mode", q4kh_f2_mode_name(mode), mode_origin);
	print_setting("F2 probe", q4kh_f2_probe_name(probe), probe_origin);
	print_setting("F2 require deep", deep ? "true" : "false", deep_origin);
	print_setting("receipt folder", dir, dir_origin);
	print_setting("F2 timeout", timeout_text, limits.timeout);
	print_setting("F2 memory limit", memory_text, limits.memory);
	print_setting("catastrophic floor", "0.90", "the fixed rule F2.2");
	plugin_settings(r, c, NULL, json);
	return 0;
}

static const char *kernel_label(const struct q4kh_backend *b, const char *variant,
                                char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/%s", b->plugin->name, variant ? variant : "built-in");
	return buf;
}

/* The setting as written for this device: "a, b" or "built-in". */
static void choice_text(const struct q4kh_kernel_choice *ch, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = 0;
	for (size_t i = 0; i < ch->n && used < cap; i++)
		used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "",
		                         ch->names[i] ? ch->names[i] : "built-in");
	if (!ch->n)
		snprintf(buf, cap, ch->source == Q4KH_KERNEL_DEFAULT ? "automatic"
		                                                      : "nothing for this backend");
}

/* F2's rules for the candidate at step S (none for the reference). */
static int rules(const struct q4kh_registry *r, const struct q4kh_config *c,
                 const struct q4kh_backend *b, const struct q4kh_policy_step *s,
                 json_t *jstep, int json)
{
	const struct q4kh_candidate cand = { .backend = b->plugin->name, .variant = s->variant };
	const uint32_t arith = q4kh_guard_arith(r, &cand);
	struct q4kh_f2_rules ru;
	struct q4kh_f2_rule_origins o;
	struct q4kh_error err = { { 0 } };

	if (!s->variant && !strcmp(b->plugin->name, "cpu")) {
		if (json)
			json_object_set_new(jstep, "f2", json_string("the reference: not guarded"));
		else
			printf("        F2: the reference, not guarded\n");
		return 0;
	}
	if (q4kh_guard_rules_where(c, s->variant ? s->variant : b->plugin->name, arith, &ru, &o,
	                           &err)) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		return Q4KH_EXIT_INPUT;
	}
	if (json) {
		json_object_set_new(jstep, "f2",
		                    json_pack("{s:s, s:{s:f, s:s}, s:{s:i, s:s}, s:{s:i, s:s}}",
		                              "arith", q4kh_f2_arith_name(arith), "floor", "value",
		                              ru.floor, "origin", o.floor,
		                              "decode_steps", "value", (int)ru.decode_steps,
		                              "origin", o.decode_steps, "probe_tokens", "value",
		                              (int)ru.probe_tokens, "origin", o.probe_tokens));
		return 0;
	}
	printf("        F2 acceptance floor %s (from %s), %u decode steps (from %s),\n"
	       "        %u probe tokens (from %s)\n",
	       q4kh_f2_threshold(ru.floor).s, o.floor, ru.decode_steps, o.decode_steps, ru.probe_tokens,
	       o.probe_tokens);
	return 0;
}

/* Per tensor type a variant of the chain implements: the first step that
 * can serve it, and the next one. */
static void by_type(const struct q4kh_policy_order *o, const struct q4kh_backend *b,
                    json_t *jtypes, int json)
{
	int shown[Q4KH_TYPE_COUNT] = { 0 };
	char a[160], c[160];

	for (size_t i = 0; i < o->n; i++) {
		for (uint32_t t = 0; o->steps[i].variant && t < Q4KH_TYPE_COUNT; t++) {
			const struct q4kh_policy_step *first = NULL, *next = NULL;

			if (!o->steps[i].scores[t] || shown[t])
				continue;
			shown[t] = 1;
			for (size_t j = 0; j < o->n && !next; j++) {
				if (!o->steps[j].scores[t])
					continue;
				if (!first)
					first = &o->steps[j];
				else
					next = &o->steps[j];
			}
			kernel_label(b, first->variant, a, sizeof(a));
			kernel_label(b, next ? next->variant : NULL, c, sizeof(c));
			if (json)
				json_array_append_new(jtypes,
				                      json_pack("{s:s, s:s, s:s?}", "type",
				                                q4kh_type_name(t), "first", a,
				                                "runner_up", next ? c : NULL));
			else
				printf("    %-8s %-28s runner-up: %s\n", q4kh_type_name(t), a,
				       next ? c : "none");
		}
	}
	/* Every type no variant of the chain takes stays on the built-in. */
	for (size_t i = 0; i < o->n; i++) {
		if (o->steps[i].variant)
			continue;
		kernel_label(b, NULL, a, sizeof(a));
		if (json)
			json_array_append_new(jtypes, json_pack("{s:s, s:s, s:n}", "type", "other",
			                                        "first", a, "runner_up"));
		else
			printf("    %-8s %-28s runner-up: none\n", "other", a);
		return;
	}
}

/* One device: its kernel setting, chain, choices per type and F2 rules. */
static int device(const struct q4kh_registry *r, const struct q4kh_config *c,
                  const char *kernel_cli, const struct q4kh_plugin *p, uint32_t d,
                  json_t *jdevices, int json)
{
	struct q4kh_backend b;
	struct q4kh_policy_order o;
	struct q4kh_error err = { { 0 } };
	json_t *jdev = NULL, *jchain = NULL, *jtypes = NULL;
	char setting_text[512], why[800], label[160], others[512];
	int rc = 0;

	if (q4kh_backend_open(p, d, &b, &err)) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		return Q4KH_EXIT_FAIL;
	}
	if (q4kh_policy_order(r, c, kernel_cli, NULL, &b, &o, &err)) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		q4kh_backend_close(&b);
		return Q4KH_EXIT_PLUGIN;
	}
	choice_text(&o.choice, setting_text, sizeof(setting_text));
	q4kh_policy_others_text(&o.choice, others, sizeof(others));
	if (json) {
		jchain = json_array();
		jtypes = json_array();
		jdev = json_pack("{s:s, s:i, s:s, s:s, s:s, s:{s:s, s:s, s:b, s:s?}, s:o, s:o}",
		                 "backend", p->name, "device", (int)d, "name", b.record.name,
		                 "uuid", b.record.uuid, "arch", b.record.arch, "kernel_setting",
		                 "value", setting_text, "origin", o.choice.origin, "explicit",
		                 o.explicit_request, "for_other_backends",
		                 others[0] ? others : NULL, "chain", jchain,
		                 "types", jtypes);
		json_array_append_new(jdevices, jdev);
	} else {
		/* as the run report says it; a device name may hold parentheses */
		printf("\nbackend %s, device %u: %s, uuid %s, arch %s\n", p->name, d,
		       b.record.name, b.record.uuid, b.record.arch);
		printf("  kernel setting: %s (from %s%s)\n", setting_text, o.choice.origin,
		       o.explicit_request ? "; an explicit request: no fall-back"
		       : o.choice.source == Q4KH_KERNEL_CONFIG ? "; a preference" : "");
		if (others[0])
			printf("  also named there for other backends: %s\n", others);
		printf("  chain, tried in order until one passes F2:\n");
	}
	for (size_t i = 0; i < o.n && rc == 0; i++) {
		const struct q4kh_policy_step *s = &o.steps[i];
		json_t *jstep = NULL;

		q4kh_policy_step_why(&o, s, why, sizeof(why));
		kernel_label(&b, s->variant, label, sizeof(label));
		if (json) {
			jstep = json_pack("{s:s, s:s, s:i}", "kernel", label, "why", why, "score",
			                  (int)s->score);
			json_array_append_new(jchain, jstep);
		} else {
			printf("    %zu. %-26s %s\n", i + 1, label, why);
		}
		rc = rules(r, c, &b, s, jstep, json);
	}
	if (!json)
		printf("  by tensor type (first choice before F2, and the runner-up):\n");
	if (rc == 0)
		by_type(&o, &b, jtypes, json);
	q4kh_backend_close(&b);
	return rc;
}

/* What q4khost run --device N tries, for every device index in use. */
static int run_plans(const struct q4kh_registry *r, const struct q4kh_config *c,
                     const char *kernel_cli, const char *backend_cli, uint32_t n_index,
                     json_t *jruns, int json)
{
	struct q4kh_candidate *list = calloc(Q4KH_SELECT_MAX, sizeof(*list));
	char origin[64], name[160], skipped[2048];
	struct q4kh_host h;
	struct q4kh_error herr = { { 0 } };

	if (!list || q4kh_host_open(&h, r, c, NULL, &herr)) {
		free(list);
		return Q4KH_EXIT_FAIL;
	}
	for (uint32_t d = 0; d < n_index; d++) {
		struct q4kh_select_request rq = { .host = &h, .device = d, .kernel = kernel_cli };
		struct q4kh_error err = { { 0 } };
		json_t *tries = json ? json_array() : NULL, *left_out = json ? json_array() : NULL;
		int n;

		rq.backend = q4kh_settings_backend(backend_cli, origin, sizeof(origin));
		n = q4kh_select_plan(&rq, list, skipped, sizeof(skipped), &err);
		if (!json)
			printf("\nq4khost run --device %u tries: ", d);
		for (int i = 0; i < n; i++) {
			snprintf(name, sizeof(name), "%s/%s", list[i].backend,
			         list[i].variant ? list[i].variant : "built-in");
			if (json)
				json_array_append_new(tries, json_string(name));
			else
				printf("%s%s", i ? " -> " : "", name);
		}
		if (!json)
			printf("%s\n", n < 0 ? err.msg : "");
		/* A backend that could not start is named, not silently missing
		 * (when nothing could be tried, the error has said it). */
		for (const char *s = skipped, *nl; n >= 0 && (nl = strchr(s, '\n')); s = nl + 1) {
			if (json)
				json_array_append_new(left_out, json_stringn(s, (size_t)(nl - s)));
			else
				printf("  left out, could not start: %.*s\n", (int)(nl - s), s);
		}
		if (json)
			json_array_append_new(jruns, json_pack("{s:i, s:o, s:o, s:s?}", "device",
			                                       (int)d, "tries", tries, "left_out",
			                                       left_out, "error",
			                                       n < 0 ? err.msg : NULL));
	}
	q4kh_host_close(&h);
	free(list);
	return 0;
}

int q4kh_plugins_explain(const struct q4kh_registry *r, const struct q4kh_config *c,
                         const char *kernel_cli, const char *backend_cli, int json)
{
	json_t *root = json_object(), *jset = json_object(), *jdevices = json_array();
	json_t *jruns = json_array();
	struct q4kh_error err = { { 0 } };
	uint32_t n_index = 0;
	int rc;

	json_object_set_new(root, "settings", jset);
	json_object_set_new(root, "devices", jdevices);
	json_object_set_new(root, "run", jruns);
	rc = q4kh_cli_check_names(r, kernel_cli, backend_cli, &err);
	if (rc)
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
	else
		q4kh_cli_warn_selectors("plugins", r, kernel_cli);
	if (rc == 0)
		rc = settings(r, c, backend_cli, jset, json);
	for (size_t i = 0; rc == 0 && i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		uint32_t n;

		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND)
			continue;
		q4kh_backend_devices(p, &n, NULL);
		n_index = n > n_index ? n : n_index;
		for (uint32_t d = 0; rc == 0 && d < n; d++)
			rc = device(r, c, kernel_cli, p, d, jdevices, json);
	}
	if (rc == 0)
		rc = run_plans(r, c, kernel_cli, backend_cli, n_index, jruns, json);
	if (rc == 0 && json) {
		if (json_dumpf(root, stdout, JSON_INDENT(2)) != 0)
			rc = Q4KH_EXIT_FAIL;
		putchar('\n');
	}
	json_decref(root);
	return rc;
}
