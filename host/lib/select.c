#include "select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

struct cand {
	const char *backend;
	const char *variant; /* NULL: built-in */
	uint32_t score;
};

#define MAX_CANDS 32

void q4kh_selection_close(struct q4kh_selection *s)
{
	q4kh_model_free(s->model); /* releases what the variant prepared */
	s->model = NULL;
	q4kh_kernel_close(&s->kernel);
	q4kh_backend_close(&s->backend);
}

static void step(struct q4kh_selection *s, const char *fmt, const char *a,
                 const char *b, const char *c)
{
	size_t used = strlen(s->steps);

	snprintf(s->steps + used, sizeof(s->steps) - used, fmt, a, b, c);
}

/* Devices of an accepted backend plugin, without keeping it open. */
static uint32_t device_count(const struct q4kh_plugin *p)
{
	const struct q4kh_backend_v1 *v = p->desc->backend;
	q4kh_backend_ctx *ctx = NULL;
	uint32_t n = 0;

	if (v->init(&p->api, &ctx) != Q4KH_OK)
		return 0;
	if (v->device_count(ctx, &n) != Q4KH_OK)
		n = 0;
	v->shutdown(ctx);
	return n;
}

/* The variants targeting BACKEND, best score on its device first, then the
 * built-in; appended to LIST. */
static int add_backend(const struct q4kh_select_request *rq, const char *backend,
                       struct cand *list, int n)
{
	const struct q4kh_registry *r = rq->registry;
	struct q4kh_backend b;
	int first = n;

	if (q4kh_backend_open(q4kh_registry_find(r, backend), rq->device, &b, NULL))
		return n;
	for (size_t i = 0; !rq->builtin_only && i < r->n_plugins && n < MAX_CANDS - 1; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		struct q4kh_kernel k;
		uint32_t best = 0;

		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_KERNEL ||
		    strcmp(p->desc->kernel->backend, backend) ||
		    q4kh_kernel_open(p, &b, &k, NULL))
			continue;
		for (uint32_t t = 0; t < k.v->n_types; t++) {
			uint32_t sc = k.v->score(k.ctx, &b.record, k.v->types[t]);
			best = sc > best ? sc : best;
		}
		q4kh_kernel_close(&k);
		if (!best)
			continue;
		list[n] = (struct cand){ backend, p->name, best };
		/* Insertion keeps the highest score first. */
		for (int j = n; j > first && list[j].score > list[j - 1].score; j--) {
			struct cand t = list[j];
			list[j] = list[j - 1];
			list[j - 1] = t;
		}
		n++;
	}
	q4kh_backend_close(&b);
	list[n++] = (struct cand){ backend, NULL, 0 };
	return n;
}

static int candidates(const struct q4kh_select_request *rq, struct cand *list,
                      int *allow_cpu, struct q4kh_error *err)
{
	const struct q4kh_registry *r = rq->registry;
	int n = 0;

	*allow_cpu = !rq->backend && !rq->kernel && !rq->builtin_only;
	if (rq->kernel) {
		const struct q4kh_plugin *p = q4kh_registry_find(r, rq->kernel);
		if (!p || p->desc->kind != Q4KH_KIND_KERNEL)
			return q4kh_fail(err, "kernel variant '%s' was not found on plugin path %s (%s); see q4khost plugins",
			                 rq->kernel, r->path, r->path_origin);
		if (rq->backend && strcmp(rq->backend, p->desc->kernel->backend))
			return q4kh_fail(err, "kernel variant %s targets backend '%s', not the requested '%s'",
			                 rq->kernel, p->desc->kernel->backend, rq->backend);
		list[n++] = (struct cand){ p->desc->kernel->backend, p->name, 1 };
		return n;
	}
	if (rq->backend) {
		const struct q4kh_plugin *p = q4kh_registry_find(r, rq->backend);
		if (!p || p->desc->kind != Q4KH_KIND_BACKEND)
			return q4kh_fail(err, "backend '%s' is not available on plugin path %s (%s); see q4khost plugins",
			                 rq->backend, r->path, r->path_origin);
		if (!strcmp(rq->backend, "cpu"))
			list[n++] = (struct cand){ "cpu", NULL, 0 };
		else
			n = add_backend(rq, rq->backend, list, n);
		return n;
	}
	for (size_t i = 0; i < r->n_plugins && n < MAX_CANDS - 8; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		if (p->state == Q4KH_PLUGIN_ACCEPTED && p->desc->kind == Q4KH_KIND_BACKEND &&
		    strcmp(p->name, "cpu") && device_count(p) > rq->device)
			n = add_backend(rq, p->name, list, n);
	}
	return n;
}

/* Open backend, model and variant of C into OUT. */
static int open_cand(const struct q4kh_select_request *rq, const struct cand *c,
                     uint32_t device, struct q4kh_selection *out,
                     struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(rq->registry, c->backend);

	if (!p)
		return q4kh_fail(err, "backend '%s' is not available", c->backend);
	if (q4kh_backend_open(p, device, &out->backend, err) ||
	    q4kh_model_open(rq->model_path, &out->model, err) ||
	    q4kh_model_upload(out->model, &out->backend, err) ||
	    (c->variant && q4kh_policy_use_kernel(rq->registry, &out->backend, out->model,
	                                          c->variant, &out->kernel, err))) {
		q4kh_selection_close(out);
		return -1;
	}
	return 0;
}

static const char *cand_name(const struct cand *c, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/%s", c->backend, c->variant ? c->variant : "built-in");
	return buf;
}

int q4kh_select(const struct q4kh_select_request *rq, struct q4kh_selection *out,
                struct q4kh_error *err)
{
	struct cand list[MAX_CANDS];
	struct q4kh_guard g;
	int32_t *probe = NULL;
	size_t n_probe = 0;
	int allow_cpu, n, guard_ready = 0, rc = -1;
	char name[160];

	memset(out, 0, sizeof(*out));
	n = candidates(rq, list, &allow_cpu, err);
	if (n < 0) {
		out->explicit_failure = 1;
		return -1;
	}
	for (int i = 0; i < n; i++) {
		struct q4kh_guard_decision d;
		struct q4kh_error e = { { 0 } };
		uint32_t device = rq->device;

		cand_name(&list[i], name, sizeof(name));
		if (!strcmp(list[i].backend, "cpu") && !list[i].variant) {
			/* The reference needs no guard. */
			if (open_cand(rq, &list[i], 0, out, err))
				goto out;
			snprintf(out->f2_verdict, sizeof(out->f2_verdict), "not needed");
			snprintf(out->f2_message, sizeof(out->f2_message),
			         "the reference cpu backend with its built-in kernels");
			rc = 0;
			goto out;
		}
		if (open_cand(rq, &list[i], device, out, &e)) {
			step(out, "%s: cannot start: %s\n", name, e.msg, "");
			continue;
		}
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
		if (q4kh_guard_check(&g, &(struct q4kh_candidate){ list[i].backend, device,
		                                                   list[i].variant },
		                     &out->backend.record, rq->mode, &d, &e)) {
			step(out, "%s: F2 could not decide: %s\n", name, e.msg, "");
			q4kh_selection_close(out);
			continue;
		}
		snprintf(out->f2_verdict, sizeof(out->f2_verdict), "%s",
		         q4kh_f2_verdict_name(d.verdict));
		snprintf(out->f2_source, sizeof(out->f2_source), "%s", d.source);
		snprintf(out->f2_message, sizeof(out->f2_message), "%s", d.receipt.message);
		if (d.verdict == Q4KH_F2_PASS) {
			rc = 0;
			goto out;
		}
		step(out, "%s: F2 %s: %s\n", name, q4kh_f2_verdict_name(d.verdict),
		     d.receipt.message);
		q4kh_selection_close(out);
		if (rq->mode == Q4KH_F2_REQUIRE)
			break;
	}
	if (allow_cpu && rq->mode != Q4KH_F2_REQUIRE) {
		struct cand cpu = { "cpu", NULL, 0 };
		if (open_cand(rq, &cpu, 0, out, err))
			goto out;
		snprintf(out->f2_verdict, sizeof(out->f2_verdict), "not needed");
		snprintf(out->f2_message, sizeof(out->f2_message),
		         "the reference cpu backend with its built-in kernels%s",
		         n ? " (every other candidate was rejected)" : "");
		rc = 0;
		goto out;
	}
	out->explicit_failure = 1;
	q4kh_fail(err, "no candidate could serve the request%s:\n%s",
	          rq->mode == Q4KH_F2_REQUIRE ? " (--f2 require)" : "", out->steps);
out:
	free(probe);
	return rc;
}
