#include "select.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candidates.h"
#include "policy.h"

void q4kh_selection_close(struct q4kh_selection *s)
{
	q4kh_model_free(s->model); /* releases what the variant prepared */
	s->model = NULL;
	q4kh_kernel_close(&s->kernel);
	q4kh_backend_close(&s->backend);
}

__attribute__((format(printf, 2, 3)))
static void step(struct q4kh_selection *s, const char *fmt, ...)
{
	size_t used = strlen(s->steps);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->steps + used, sizeof(s->steps) - used, fmt, ap);
	va_end(ap);
}

/* Devices of an accepted backend plugin; 0 when it cannot say. */
static uint32_t device_count(const struct q4kh_plugin *p)
{
	uint32_t n;

	q4kh_backend_devices(p, &n, NULL);
	return n;
}

/*
 * Append the kernel chain of backend P's device DEVICE (policy.h) to LIST;
 * what its setting named for other backends goes to OTHERS. A device that
 * does not open adds nothing.
 */
static int add_backend(const struct q4kh_select_request *rq,
                       const struct q4kh_plugin *p, uint32_t device,
                       struct q4kh_select_cand *list, int *n, int *explicit_request,
                       char *others, size_t others_cap, struct q4kh_error *err)
{
	struct q4kh_policy_order o;
	struct q4kh_backend b;
	size_t used = strlen(others);
	char why[800];

	if (q4kh_backend_open(p, device, &b, NULL))
		return 0;
	if (q4kh_policy_order(rq->registry, rq->config, rq->kernel, NULL, &b, &o, err)) {
		q4kh_backend_close(&b);
		return -1;
	}
	q4kh_backend_close(&b);
	*explicit_request |= o.explicit_request;
	for (size_t i = 0; i < o.n && *n < Q4KH_SELECT_MAX; i++) {
		struct q4kh_select_cand *c = &list[(*n)++];

		q4kh_policy_step_why(&o, &o.steps[i], why, sizeof(why));
		*c = (struct q4kh_select_cand){ p->name, device, o.steps[i].variant,
			                        o.explicit_request, "" };
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

int q4kh_select_plan(const struct q4kh_select_request *rq,
                     struct q4kh_select_cand *list, struct q4kh_error *err)
{
	const struct q4kh_registry *r = rq->registry;
	char others[512] = "";
	int n = 0, kept = 0, explicit_request = 0;

	if (rq->backend) {
		const struct q4kh_plugin *p = q4kh_registry_find(r, rq->backend);
		if (!p || p->desc->kind != Q4KH_KIND_BACKEND)
			return q4kh_fail(err, "backend '%s' is not available on plugin path %s (%s); see q4khost plugins",
			                 rq->backend, r->path, r->path_origin);
		if (device_count(p) <= rq->device)
			return q4kh_fail(err, "backend %s has no device %u; see q4khost plugins",
			                 rq->backend, rq->device);
		if (add_backend(rq, p, rq->device, list, &n, &explicit_request, others,
		                sizeof(others), err))
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
				    device_count(p) > rq->device &&
				    add_backend(rq, p, rq->device, list, &n, &explicit_request,
				                others, sizeof(others), err))
					return -1;
			}
		/* The reference last: its one device serves any request. */
		if (q4kh_registry_find(r, "cpu") &&
		    add_backend(rq, q4kh_registry_find(r, "cpu"), 0, list, &n,
		                &explicit_request, others, sizeof(others), err))
			return -1;
	}
	if (!explicit_request)
		return n;
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

/* Open backend, model and variant of C into OUT. */
static int open_cand(const struct q4kh_select_request *rq, const struct q4kh_select_cand *c,
                     struct q4kh_selection *out, struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(rq->registry, c->backend);

	if (!p)
		return q4kh_fail(err, "backend '%s' is not available", c->backend);
	if (q4kh_backend_open(p, c->device, &out->backend, err) ||
	    q4kh_model_open(rq->model_path, &out->model, err) ||
	    q4kh_model_upload(out->model, &out->backend, err) ||
	    (c->variant && q4kh_policy_use_kernel(rq->registry, &out->backend, out->model,
	                                          c->variant, &out->kernel, err))) {
		q4kh_selection_close(out);
		return -1;
	}
	return 0;
}

int q4kh_select(const struct q4kh_select_request *rq, struct q4kh_selection *out,
                struct q4kh_error *err)
{
	struct q4kh_select_cand list[Q4KH_SELECT_MAX];
	struct q4kh_guard g;
	int32_t *probe = NULL;
	size_t n_probe = 0;
	int n, guard_ready = 0, rc = -1;
	char name[160];

	memset(out, 0, sizeof(*out));
	n = q4kh_select_plan(rq, list, err);
	if (n < 0) {
		out->explicit_failure = 1;
		return -1;
	}
	for (int i = 0; i < n; i++) {
		struct q4kh_guard_decision d;
		struct q4kh_error e = { { 0 } };
		const struct q4kh_select_cand *c = &list[i];
		struct q4kh_candidate cc = { c->backend, c->device, c->variant };

		q4kh_candidate_name(&cc, name, sizeof(name));
		if (!strcmp(c->backend, "cpu") && !c->variant) {
			/* The reference needs no guard. */
			if (open_cand(rq, c, out, err))
				goto out;
			snprintf(out->f2_verdict, sizeof(out->f2_verdict), "not needed");
			out->f2_source[0] = 0; /* left by a candidate tried before */
			snprintf(out->f2_message, sizeof(out->f2_message),
			         "the reference cpu backend with its built-in kernels%s",
			         out->steps[0] ? " (every other candidate was rejected)" : "");
			snprintf(out->kernel_choice, sizeof(out->kernel_choice), "%s", c->why);
			rc = 0;
			goto out;
		}
		if (open_cand(rq, c, out, &e)) {
			step(out, "%s: cannot start: %s\n", name, e.msg);
			continue;
		}
		snprintf(out->kernel_choice, sizeof(out->kernel_choice), "%s", c->why);
		if (rq->mode == Q4KH_F2_OFF) {
			snprintf(out->f2_verdict, sizeof(out->f2_verdict), "off");
			snprintf(out->f2_source, sizeof(out->f2_source), "--f2 off");
			snprintf(out->f2_message, sizeof(out->f2_message),
			         "F2 IS OFF: %s serves unverified", name);
			rc = 0;
			goto out;
		}
		if (!guard_ready) {
			if (q4kh_guard_probe(rq->model_path, NULL, &probe, &n_probe, err) ||
			    q4kh_guard_init(&g, rq->registry, rq->config, rq->model_path, probe,
			                    n_probe, err)) {
				q4kh_selection_close(out);
				goto out;
			}
			g.config_file = rq->config_file;
			guard_ready = 1;
		}
		if (q4kh_guard_check(&g, &cc, &out->backend.record, rq->mode, &d, &e)) {
			step(out, "%s: F2 could not decide: %s\n", name, e.msg);
			q4kh_selection_close(out);
			continue;
		}
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
		step(out, "%s: F2 %s: %s [%s]\n", name, q4kh_f2_verdict_name(d.verdict),
		     d.receipt.message, d.source);
		q4kh_selection_close(out);
		if (rq->mode == Q4KH_F2_REQUIRE)
			break;
	}
	out->explicit_failure = 1;
	q4kh_fail(err, "no candidate could serve the request%s:\n%s",
	          rq->mode == Q4KH_F2_REQUIRE ? " (--f2 require)" : "", out->steps);
out:
	free(probe);
	return rc;
}
