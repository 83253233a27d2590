#include "select.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candidates.h"
#include "decide.h"
#include "interrupt.h"
#include "policy.h"

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
 * the variants its setting named for other backends go to OTHERS (*N_OTHERS,
 * each once). A device that
 * does not open, or a backend without one of the model's types, adds
 * nothing but a line in SKIPPED.
 */
static int add_backend(const struct q4kh_select_request *rq, const struct q4kh_plugin *p, uint32_t device,
                       struct q4kh_candidate *list, int *n, int *explicit_request,
                       const struct q4kh_plugin **others, size_t *n_others, char *skipped,
                       size_t skipped_cap, struct q4kh_error *err)
{
	struct q4kh_host *h = rq->host;
	struct q4kh_policy_order o;
	struct q4kh_backend b;
	struct q4kh_device_record record;
	struct q4kh_error e = { { 0 } };
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
	q4kh_policy_others_add(&o.choice, others, n_others, Q4KH_KERNEL_LIST);
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

/* Backend P of H lacks device DEVICE: "has no device: WHY" when it has
 * none at all, in its own words (the cuda plugin on a machine without a
 * GPU), else "has no device D (it has N)", into BUF. Its device count. */
static uint32_t lacks_device(struct q4kh_host *h, const struct q4kh_plugin *p, uint32_t device,
                             char *buf, size_t cap)
{
	uint32_t n = q4kh_host_devices(h, p, NULL, 0);
	char why[512] = "";

	if (n == 0 && q4kh_host_backend(h, p)->ctx)
		q4kh_backend_why_no_device(p, why, sizeof(why));
	if (n == 0)
		snprintf(buf, cap, "has no device%s%s", why[0] ? ": " : "", why);
	else
		snprintf(buf, cap, "has no device %u (it has %u)", device, n);
	return n;
}

/* The backend named is loaded, but lacks the device asked for. */
static int no_such_device(const struct q4kh_select_request *rq, const struct q4kh_plugin *p,
                          struct q4kh_error *err)
{
	char lacks[700];
	uint32_t n = lacks_device(rq->host, p, rq->device, lacks, sizeof(lacks));

	return q4kh_fail(err, "backend %s %s%s; q4khost plugins lists the devices", rq->backend,
	                 n ? "" : "is loaded but ", lacks);
}

void q4kh_select_elsewhere(struct q4kh_host *h, uint32_t device,
                           const struct q4kh_plugin *const *variants, size_t n, char *buf,
                           size_t cap)
{
	buf[0] = 0;
	for (size_t i = 0; i < n; i++) {
		const char *kind = variants[i]->desc->kernel->backend;
		const struct q4kh_plugin *b = q4kh_registry_backend_of_kind(h->registry, kind);
		char lacks[700] = "";

		if (!b)
			snprintf(lacks, sizeof(lacks), "is not on the plugin path");
		else if (q4kh_host_devices(h, b, NULL, 0) > device)
			snprintf(lacks, sizeof(lacks), "does not serve device %u here", device);
		else
			lacks_device(h, b, device, lacks, sizeof(lacks));
		append(buf, cap, "%s%s is a kernel variant for backend %s, which %s", i ? "; " : "",
		       variants[i]->name, kind, lacks);
	}
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
	const struct q4kh_plugin *others[Q4KH_KERNEL_LIST];
	char own[2048], elsewhere[2048];
	size_t n_others = 0;
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
		                &n_others, skipped, skipped_cap, err))
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
				                &n_others, skipped, skipped_cap, err))
					return -1;
			}
		/* The reference last: its one device stands in for a device of
		 * another backend, but a device no backend has is a mistake. */
		if (cpu && (n > 0 || q4kh_host_devices(h, cpu, skipped, skipped_cap) > rq->device) &&
		    add_backend(rq, cpu, 0, list, &n, &explicit_request, others, &n_others,
		                skipped, skipped_cap, err))
			return -1;
	}
	if (!explicit_request)
		return n ? n : nothing_to_try(rq, skipped, err);
	/* An explicit request: only what it named, nothing to fall back to. */
	for (int i = 0; i < n; i++)
		if (list[i].explicit_request)
			list[kept++] = list[i];
	if (!kept) {
		const char *origin = rq->kernel ? "--kernel" : "Q4KHOST_Q4K_KERNEL";

		q4kh_select_elsewhere(h, rq->device, others, n_others, elsewhere, sizeof(elsewhere));
		return q4kh_fail(err, "the kernel request (%s) names nothing that device %u of %s can "
		                 "run%s%s; without %s, q4khost chooses what runs here (q4khost "
		                 "plugins --explain shows it)", origin, rq->device,
		                 rq->backend ? rq->backend : "an available backend",
		                 elsewhere[0] ? ": " : "", elsewhere, origin);
	}
	return kept;
}

int q4kh_select_needs_receipts(const struct q4kh_select_request *rq)
{
	struct q4kh_candidate list[Q4KH_SELECT_MAX];
	struct q4kh_error e = { { 0 } };
	int n = rq->mode == Q4KH_F2_OFF ? 0 : q4kh_select_plan(rq, list, NULL, 0, &e);

	/* a plan that fails is q4kh_select's error to report, before any receipt */
	for (int i = 0; i < n; i++)
		if (!q4kh_candidate_is_reference(&list[i]))
			return 1;
	return 0;
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
	    q4kh_policy_upload(h->registry, &out->backend, out->model, c->variant,
	                       &out->kernel, err)) {
		q4kh_selection_close(out);
		return -1;
	}
	out->device = c->device;
	return 0;
}

int q4kh_select(const struct q4kh_select_request *rq, struct q4kh_selection *out,
                struct q4kh_error *err)
{
	struct q4kh_candidate list[Q4KH_SELECT_MAX];
	struct q4kh_decide_guard dg = { 0 };
	const struct q4kh_decide_how how = { rq->mode, rq->mode_origin, 0, rq };
	const struct q4kh_host *h = rq->host;
	int n, rc = -1;
	char name[160];
	size_t len;

	memset(out, 0, sizeof(*out));
	n = q4kh_select_plan(rq, list, out->steps, sizeof(out->steps), err);
	if (n < 0) {
		out->explicit_failure = 1;
		return -1;
	}
	for (int i = 0; i < n; i++) {
		struct q4kh_decision d;
		struct q4kh_error e = { { 0 } };
		const struct q4kh_candidate *c = &list[i];
		const int reference = q4kh_candidate_is_reference(c);
		int decided;

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
		decided = q4kh_decide(&how, &dg, c, &out->backend.record, &d, &e);
		if (decided == -2) { /* no guard: nothing can be judged */
			q4kh_selection_close(out);
			q4kh_fail(err, "%s", e.msg);
			goto out;
		}
		if (decided < 0) {
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
		q4kh_receipt_free(&d.d.receipt); /* its points: not needed here */
		q4kh_decision_record(&d, out);
		if (d.outcome == Q4KH_SERVES) {
			if (reference && out->steps[0])
				append(out->f2_message, sizeof(out->f2_message),
				       " (every other candidate was rejected)");
			rc = 0;
			goto out;
		}
		q4kh_decision_step(&d, name, out->steps, sizeof(out->steps));
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
	q4kh_decide_guard_close(&dg);
	return rc;
}
