#include "select.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candidates.h"
#include "interrupt.h"
#include "policy.h"
#include "settings.h"

void q4kh_selection_close(struct q4kh_selection *s)
{
	q4kh_model_free(s->model); /* releases what the variant prepared */
	s->model = NULL;
	q4kh_kernel_close(&s->kernel);
	q4kh_backend_close(&s->backend);
}

/* Append one line to the text buffer BUF of CAP bytes. */
__attribute__((format(printf, 3, 4)))
static void append(char *buf, size_t cap, const char *fmt, ...)
{
	size_t used = strlen(buf);
	va_list ap;

	if (used + 1 >= cap)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + used, cap - used, fmt, ap);
	va_end(ap);
}

/*
 * Append the kernel chain of backend P's device DEVICE (policy.h) to LIST;
 * what its setting named for other backends goes to OTHERS. A device that
 * does not open, or a backend without one of the model's types, adds
 * nothing but a line in SKIPPED.
 */
static int add_backend(const struct q4kh_select_request *rq, const struct q4kh_plugin *p, uint32_t device,
                       struct q4kh_candidate *list, int *n, int *explicit_request,
                       char *others, size_t others_cap, char *skipped,
                       size_t skipped_cap, struct q4kh_error *err)
{
	struct q4kh_host *h = rq->host;
	struct q4kh_policy_order o;
	struct q4kh_backend b;
	struct q4kh_device_record record;
	struct q4kh_error e = { { 0 } };
	size_t used = strlen(others);
	char why[800];

	if (q4kh_host_backend_open(h, p, device, &b, &e)) {
		append(skipped, skipped_cap, "%s\n", e.msg);
		return 0;
	}
	if (h->model && q4kh_backend_check_types(&b, h->types, h->n_types, &e)) {
		append(skipped, skipped_cap, "%s: passed over for this model: %s\n", p->name, e.msg);
		q4kh_backend_close(&b);
		return 0;
	}
	if (q4kh_policy_order(h->registry, h->config, rq->kernel, NULL, &b, &o, err)) {
		q4kh_backend_close(&b);
		return -1;
	}
	record = b.record;
	q4kh_backend_close(&b);
	*explicit_request |= o.explicit_request;
	for (size_t i = 0; i < o.n && *n < Q4KH_SELECT_MAX; i++) {
		struct q4kh_candidate *c = &list[(*n)++];

		q4kh_policy_step_why(&o, &o.steps[i], why, sizeof(why));
		*c = (struct q4kh_candidate){ p->name, device, o.steps[i].variant,
			                      o.explicit_request, "", record };
		if (c->variant)
			snprintf(c->why, sizeof(c->why), "%s, %.700s", c->variant, why);
		else
			snprintf(c->why, sizeof(c->why), "%s", why);
	}
	if (o.choice.others[0] && used < others_cap)
		snprintf(others + used, others_cap - used, "%s%s", used ? ", " : "",
		         o.choice.others);
	return 0;
}

/* "cpu has 1 device, cuda has 2" of every accepted backend of H. */
static void list_backends(struct q4kh_host *h, char *buf, size_t cap)
{
	const struct q4kh_registry *r = h->registry;

	buf[0] = 0;
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		uint32_t n;

		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND)
			continue;
		n = q4kh_host_devices(h, p, NULL, 0);
		append(buf, cap, "%s%s has %u%s", buf[0] ? ", " : "", p->name, n,
		       buf[0] ? "" : n == 1 ? " device" : " devices");
	}
}

/* "; the path's notes: A; B" of R's notes (registry.h), or "" without. */
static void path_notes(const struct q4kh_registry *r, char *buf, size_t cap)
{
	buf[0] = 0;
	if (!r->notes[0])
		return;
	append(buf, cap, "; the path's notes: ");
	for (const char *s = r->notes, *nl; (nl = strchr(s, '\n')); s = nl + 1)
		append(buf, cap, "%s%.*s", s == r->notes ? "" : "; ", (int)(nl - s), s);
}

/*
 * Why a plan for RQ came out empty, as the error: the backends that could
 * not start (SKIPPED), no backend at all (with the path's notes: a folder
 * skipped as relative or missing is why), or none with the device.
 */
static int nothing_to_try(const struct q4kh_select_request *rq, const char *skipped,
                          struct q4kh_error *err)
{
	const struct q4kh_registry *r = rq->host->registry;
	char backends[512], notes[1024], why[700];
	size_t len = strlen(skipped);

	if (len)
		return q4kh_fail(err, "no backend could start: %.*s", (int)len - 1, skipped);
	list_backends(rq->host, backends, sizeof(backends));
	if (!backends[0] && q4kh_registry_why_absent(r, "cpu", why, sizeof(why))[0])
		return q4kh_fail(err, "no backend plugin on the plugin path %s (from %s): "
		                 "the reference cpu plugin %s",
		                 r->path, r->path_origin, why);
	path_notes(r, notes, sizeof(notes));
	if (!backends[0])
		return q4kh_fail(err, "no backend plugin on the plugin path %s (from %s): "
		                 "the reference cpu plugin (cpu.so) is not there%s; "
		                 "q4khost plugins lists what is",
		                 r->path, r->path_origin, notes);
	return q4kh_fail(err, "no backend has a device %u; %s; q4khost plugins lists the devices",
	                 rq->device, backends);
}

/* The backend named is loaded, but lacks the device asked for: say why
 * when it has none at all (the cuda plugin on a machine without a GPU). */
static int no_such_device(const struct q4kh_select_request *rq, const struct q4kh_plugin *p,
                          struct q4kh_error *err)
{
	uint32_t n = q4kh_host_devices(rq->host, p, NULL, 0);
	char why[512] = "";

	if (n == 0 && q4kh_host_backend(rq->host, p)->ctx)
		q4kh_backend_why_no_device(p, why, sizeof(why));
	if (n == 0)
		return q4kh_fail(err, "backend %s is loaded but has no device%s%s; q4khost plugins "
		                 "lists the devices", rq->backend, why[0] ? ": " : "", why);
	return q4kh_fail(err, "backend %s has no device %u (it has %u); q4khost plugins lists the "
	                 "devices", rq->backend, rq->device, n);
}

int q4kh_select_check_device(struct q4kh_host *h, const char *backend, uint32_t device,
                             struct q4kh_error *err)
{
	const struct q4kh_registry *r = h->registry;
	const struct q4kh_select_request rq = { .host = h, .backend = backend, .device = device };
	const struct q4kh_plugin *named = NULL;
	char skipped[2048] = "";
	int rc = -1;

	for (size_t i = 0; rc && !named && i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];

		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND ||
		    (backend && strcmp(p->name, backend)))
			continue;
		if (q4kh_host_devices(h, p, skipped, sizeof(skipped)) > device)
			rc = 0;
		else if (backend)
			named = p;
	}
	if (rc && named && !skipped[0])
		no_such_device(&rq, named, err);
	else if (rc)
		nothing_to_try(&rq, skipped, err);
	return rc;
}

int q4kh_select_plan(const struct q4kh_select_request *rq,
                     struct q4kh_candidate *list, char *skipped, size_t skipped_cap,
                     struct q4kh_error *err)
{
	struct q4kh_host *h = rq->host;
	const struct q4kh_registry *r = h->registry;
	const struct q4kh_plugin *cpu = q4kh_registry_find(r, "cpu");
	char others[512] = "", own[2048];
	int n = 0, kept = 0, explicit_request = 0;

	if (!skipped) {
		skipped = own;
		skipped_cap = sizeof(own);
	}
	skipped[0] = 0;

	if (rq->backend) {
		const struct q4kh_plugin *p = q4kh_registry_find(r, rq->backend);
		if (!p || p->desc->kind != Q4KH_KIND_BACKEND)
			return q4kh_fail(err, "backend '%s' is not available on plugin path %s (%s); see q4khost plugins",
			                 rq->backend, r->path, r->path_origin);
		if (q4kh_host_devices(h, p, skipped, skipped_cap) <= rq->device)
			return skipped[0] ? nothing_to_try(rq, skipped, err)
			                  : no_such_device(rq, p, err);
		if (add_backend(rq, p, rq->device, list, &n, &explicit_request, others,
		                sizeof(others), skipped, skipped_cap, err))
			return -1;
	} else {
		/* Device backends first, then the other backends of the host's
		 * cores (kind "cpu"), in path order within each. */
		for (int host = 0; host < 2; host++)
			for (size_t i = 0; i < r->n_plugins; i++) {
				const struct q4kh_plugin *p = &r->plugins[i];
				if (p->state == Q4KH_PLUGIN_ACCEPTED &&
				    p->desc->kind == Q4KH_KIND_BACKEND && strcmp(p->name, "cpu") &&
				    (strcmp(q4kh_backend_kind(p), "cpu") == 0) == host &&
				    q4kh_host_devices(h, p, skipped, skipped_cap) > rq->device &&
				    add_backend(rq, p, rq->device, list, &n, &explicit_request, others,
				                sizeof(others), skipped, skipped_cap, err))
					return -1;
			}
		/* The reference last: its one device stands in for a device of
		 * another backend, but a device no backend has is a mistake. */
		if (cpu && (n > 0 || q4kh_host_devices(h, cpu, skipped, skipped_cap) > rq->device) &&
		    add_backend(rq, cpu, 0, list, &n, &explicit_request, others, sizeof(others),
		                skipped, skipped_cap, err))
			return -1;
	}
	if (!explicit_request)
		return n ? n : nothing_to_try(rq, skipped, err);
	/* An explicit request: only what it named, nothing to fall back to. */
	for (int i = 0; i < n; i++)
		if (list[i].explicit_request)
			list[kept++] = list[i];
	if (!kept)
		return q4kh_fail(err, "the kernel request (%s) names nothing that device %u of %s can run%s%s",
		                 rq->kernel ? "--kernel" : "Q4KHOST_Q4K_KERNEL", rq->device,
		                 rq->backend ? rq->backend : "an available backend",
		                 others[0] ? ": it names " : "", others);
	return kept;
}

int q4kh_select_unjudged(const struct q4kh_candidate *c, enum q4kh_f2_mode mode,
                         const char *mode_origin, struct q4kh_selection *s)
{
	char name[160];

	if (q4kh_candidate_is_reference(c)) {
		snprintf(s->f2_verdict, sizeof(s->f2_verdict), "not needed");
		s->f2_source[0] = 0; /* left by a candidate tried before */
		snprintf(s->f2_message, sizeof(s->f2_message),
		         "the reference cpu backend with its built-in kernels");
		return 1;
	}
	if (mode != Q4KH_F2_OFF)
		return 0;
	snprintf(s->f2_verdict, sizeof(s->f2_verdict), "off");
	q4kh_settings_f2_source(mode_origin, "off", s->f2_source, sizeof(s->f2_source));
	snprintf(s->f2_message, sizeof(s->f2_message), "F2 IS OFF: %s serves unverified",
	         q4kh_candidate_name(c, name, sizeof(name)));
	return 1;
}

/* Open backend, model and variant of C into OUT. */
static int open_cand(const struct q4kh_select_request *rq, const struct q4kh_candidate *c,
                     struct q4kh_selection *out, struct q4kh_error *err)
{
	struct q4kh_host *h = rq->host;
	const struct q4kh_plugin *p = q4kh_registry_find(h->registry, c->backend);

	if (!p)
		return q4kh_fail(err, "backend '%s' is not available", c->backend);
	/* the host's file, bound again for this backend: nothing is read twice */
	if (q4kh_host_backend_open(h, p, c->device, &out->backend, err) ||
	    q4kh_model_open(h->model_path, &out->model, err) ||
	    q4kh_model_upload(out->model, &out->backend, err) ||
	    (c->variant && q4kh_policy_use_kernel(h->registry, &out->backend, out->model,
	                                          c->variant, &out->kernel, err))) {
		q4kh_selection_close(out);
		return -1;
	}
	out->device = c->device;
	return 0;
}

/*
 * The guard of RQ: its probe is the deep one when RQ asks for it (its
 * plan into *DEEP), the prompt when RQ asks for it and it is long enough,
 * else the built-in one, tokenized into *probe (the caller frees both).
 */
static int guard_open(const struct q4kh_select_request *rq, struct q4kh_guard *g,
                      int32_t **probe, size_t *n_probe, struct q4kh_deep_plan *deep,
                      struct q4kh_error *err)
{
	struct q4kh_host *h = rq->host;
	const int prompt = rq->probe == Q4KH_F2_PROBE_PROMPT &&
	                   rq->n_prompt >= Q4KH_F2_PROMPT_MIN_TOKENS;

	if (rq->probe == Q4KH_F2_PROBE_DEEP) {
		if (q4kh_deep_probe(h->model_path, rq->deep_ctx, probe, deep, err) ||
		    q4kh_guard_init(g, h->registry, h->config, h->model_path, *probe,
		                    (size_t)deep->prefill, err) ||
		    q4kh_guard_use_deep(g, deep, rq->deep_ctx, err))
			return -1;
		*n_probe = (size_t)deep->prefill;
		g->config_file = rq->config_file;
		g->host = h;
		return 0;
	}
	if (!prompt &&
	    q4kh_guard_probe_with(h->model->gguf, h->tok, NULL, probe, n_probe, err))
		return -1;
	if (q4kh_guard_init(g, h->registry, h->config, h->model_path,
	                    prompt ? rq->prompt : *probe, prompt ? rq->n_prompt : *n_probe,
	                    err))
		return -1;
	g->probe_kind = prompt ? Q4KH_F2_PROBE_PROMPT : Q4KH_F2_PROBE_BUILTIN;
	g->config_file = rq->config_file;
	g->host = h;
	return 0;
}

/* Which probe judges candidate C under G, and how many of its tokens, into OUT. */
static int describe_probe(const struct q4kh_select_request *rq, const struct q4kh_guard *g,
                          const struct q4kh_candidate *c, struct q4kh_selection *out,
                          struct q4kh_error *err)
{
	struct q4kh_f2_rules rules;
	size_t judged;

	if (q4kh_guard_rules(g, c, &rules, err))
		return -1;
	out->f2_probe_kind = g->probe_kind;
	if (g->deep) {
		char text[300];

		out->f2_probe_tokens = g->deep->prefill;
		out->f2_probe_positions = g->deep->prefill + g->deep->decode_steps;
		q4kh_deep_describe(g->deep, text, sizeof(text));
		snprintf(out->f2_probe, sizeof(out->f2_probe), "%s (%.60s)", text,
		         rq->probe_origin ? rq->probe_origin : "require_deep");
		return 0;
	}
	judged = g->n_probe < rules.probe_tokens ? g->n_probe : rules.probe_tokens;
	out->f2_probe_tokens = (int64_t)judged;
	out->f2_probe_positions = (int64_t)(judged + rules.decode_steps);
	if (g->probe_kind == Q4KH_F2_PROBE_PROMPT && judged < g->n_probe)
		snprintf(out->f2_probe, sizeof(out->f2_probe),
		         "this prompt, its last %zu of %zu tokens (f2_probe_tokens)", judged,
		         g->n_probe);
	else if (g->probe_kind == Q4KH_F2_PROBE_PROMPT)
		snprintf(out->f2_probe, sizeof(out->f2_probe), "this prompt, %zu tokens", judged);
	else if (rq->probe == Q4KH_F2_PROBE_PROMPT)
		snprintf(out->f2_probe, sizeof(out->f2_probe),
		         "built-in probe, %zu tokens (%.200s asked for the prompt, but it has %zu tokens, fewer than the %d a prompt probe needs)",
		         judged, rq->probe_origin ? rq->probe_origin : "--f2-probe prompt",
		         rq->n_prompt, Q4KH_F2_PROMPT_MIN_TOKENS);
	else
		snprintf(out->f2_probe, sizeof(out->f2_probe), "built-in probe, %zu tokens", judged);
	return 0;
}

/*
 * A deep receipt decided for another probe (guard.h): the probe its
 * points say it judged, into OUT, so that the report names the probe the
 * verdict came from.
 */
static void describe_deep_receipt(const struct q4kh_receipt *r, struct q4kh_selection *out)
{
	int64_t judged = 0, steps = 0;

	for (int64_t i = 0; i < r->n_points; i++) {
		judged += r->points[i].judged;
		steps += r->points[i].decode_step >= 0;
	}
	out->f2_probe_kind = Q4KH_F2_PROBE_DEEP;
	out->f2_probe_tokens = r->n_points - steps;
	out->f2_probe_positions = r->n_points;
	snprintf(out->f2_probe, sizeof(out->f2_probe),
	         "deep probe of a deep receipt: %lld positions judged of %lld, up to position %lld, %lld decode steps",
	         (long long)judged, (long long)r->n_points, (long long)(r->n_points - 1),
	         (long long)steps);
}

int q4kh_select(const struct q4kh_select_request *rq, struct q4kh_selection *out,
                struct q4kh_error *err)
{
	struct q4kh_candidate list[Q4KH_SELECT_MAX];
	struct q4kh_guard g;
	int32_t *probe = NULL;
	struct q4kh_deep_plan deep = { 0 };
	const struct q4kh_host *h = rq->host;
	size_t n_probe = 0;
	int n, guard_ready = 0, rc = -1;
	char name[160], fresh_source[320];
	size_t len;

	memset(out, 0, sizeof(*out));
	n = q4kh_select_plan(rq, list, out->steps, sizeof(out->steps), err);
	if (n < 0) {
		out->explicit_failure = 1;
		return -1;
	}
	for (int i = 0; i < n; i++) {
		struct q4kh_guard_decision d;
		struct q4kh_error e = { { 0 } };
		const struct q4kh_candidate *c = &list[i];
		const int reference = q4kh_candidate_is_reference(c);

		q4kh_candidate_name(c, name, sizeof(name));
		/* A variant chosen by score that has none of the model's types
		 * routes nothing: not applicable, never a rejection. */
		if (c->variant && !c->explicit_request &&
		    !q4kh_candidate_applies(q4kh_registry_find(h->registry, c->variant), h->types,
		                            h->n_types)) {
			append(out->not_applicable, sizeof(out->not_applicable), "%s%s",
			       out->not_applicable[0] ? ", " : "", name);
			continue;
		}
		/* the reference needs no guard: that it cannot start is the end */
		if (open_cand(rq, c, out, reference ? err : &e)) {
			if (reference)
				goto out;
			append(out->steps, sizeof(out->steps), "%s: cannot start: %s\n", name, e.msg);
			continue;
		}
		snprintf(out->kernel_choice, sizeof(out->kernel_choice), "%s", c->why);
		if (q4kh_select_unjudged(c, rq->mode, rq->mode_origin, out)) {
			if (reference && out->steps[0])
				append(out->f2_message, sizeof(out->f2_message),
				       " (every other candidate was rejected)");
			rc = 0;
			goto out;
		}
		if (!guard_ready) {
			if (guard_open(rq, &g, &probe, &n_probe, &deep, err)) {
				q4kh_selection_close(out);
				goto out;
			}
			q4kh_settings_f2_source(rq->mode_origin, "fresh", fresh_source,
			                        sizeof(fresh_source));
			g.fresh_source = fresh_source;
			guard_ready = 1;
		}
		if (describe_probe(rq, &g, c, out, &e)) {
			q4kh_selection_close(out);
			append(out->steps, sizeof(out->steps), "%s: F2 could not decide: %s\n", name,
			       e.msg);
			continue;
		}
		if (q4kh_guard_check(&g, c, &out->backend.record, rq->mode, &d, &e)) {
			if (q4kh_interrupted()) {
				snprintf(out->measuring, sizeof(out->measuring), "%s", name);
				out->measuring_plugin = out->backend.plugin;
				out->measuring_device = out->backend.record;
			}
			q4kh_selection_close(out);
			if (q4kh_interrupted()) {
				out->interrupted = q4kh_interrupted();
				q4kh_fail(err, "F2 of %s: %s", name, e.msg);
				goto out;
			}
			append(out->steps, sizeof(out->steps), "%s: F2 could not decide: %s\n", name,
			       e.msg);
			continue;
		}
		if (g.probe_kind != Q4KH_F2_PROBE_DEEP &&
		    !strcmp(d.receipt.key.probe, q4kh_f2_probe_name(Q4KH_F2_PROBE_DEEP)))
			describe_deep_receipt(&d.receipt, out);
		q4kh_receipt_free(&d.receipt); /* its points: not needed here */
		snprintf(out->f2_verdict, sizeof(out->f2_verdict), "%s",
		         q4kh_f2_verdict_name(d.verdict));
		snprintf(out->f2_source, sizeof(out->f2_source), "%s", d.source);
		snprintf(out->f2_message, sizeof(out->f2_message), "%s", d.receipt.message);
		if (d.verdict == Q4KH_F2_PASS) {
			rc = 0;
			goto out;
		}
		/* Whether it was measured now or read from a receipt. */
		append(out->steps, sizeof(out->steps), "%s: F2 %s: %s [%s%s]\n", name,
		       q4kh_f2_verdict_name(d.verdict),
		       q4kh_f2_message_after_verdict(d.verdict, d.receipt.message), d.source,
		       strncmp(d.source, "receipt", 7) ? "" : "; --f2 fresh measures it again");
		q4kh_selection_close(out);
		if (rq->mode == Q4KH_F2_REQUIRE)
			break;
	}
	out->explicit_failure = 1;
	len = strlen(out->steps); /* every step ends in a newline */
	q4kh_fail(err, "no candidate could serve the request%s:\n%.*s",
	          rq->mode == Q4KH_F2_REQUIRE ? " (--f2 require)" : "",
	          (int)(len ? len - 1 : 0), out->steps);
out:
	free(probe);
	q4kh_deep_plan_free(&deep);
	return rc;
}
