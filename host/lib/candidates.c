#include "candidates.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static int targets(const struct q4kh_plugin *k, const char *backend)
{
	return k->state == Q4KH_PLUGIN_ACCEPTED && k->desc->kind == Q4KH_KIND_KERNEL &&
	       !strcmp(k->desc->kernel->backend, backend);
}

static int push(struct q4kh_candidate **list, size_t *n,
                const struct q4kh_candidate *e, struct q4kh_error *err)
{
	struct q4kh_candidate *grown = realloc(*list, (*n + 1) * sizeof(**list));

	if (!grown)
		return q4kh_fail(err, "out of memory");
	*list = grown;
	grown[(*n)++] = *e;
	return 0;
}

int q4kh_candidate_applies(const struct q4kh_plugin *k, const uint32_t *types, size_t n)
{
	const struct q4kh_kernel_v1 *v = k->desc->kernel;

	for (uint32_t i = 0; i < v->n_types; i++)
		for (size_t j = 0; j < n; j++)
			if (v->types[i] == types[j])
				return 1;
	return 0;
}

/* BE's candidates on its devices, as host context H started it. */
static int add_backend(struct q4kh_host *h, const struct q4kh_plugin *be,
                       const struct q4kh_candidate_filter *f,
                       struct q4kh_candidate **list, size_t *n,
                       struct q4kh_error *err)
{
	const struct q4kh_registry *r = h->registry;
	const struct q4kh_host_backend *started = q4kh_host_backend(h, be);
	struct q4kh_error lacks = { { 0 } };
	const char *kind;

	if (!started->ctx)
		return q4kh_fail(err, "%s", started->why);
	for (uint32_t d = 0; d < started->n_devices; d++) {
		struct q4kh_backend b;
		struct q4kh_candidate e = { .device = d };

		if (f->device_set && d != f->device)
			continue;
		if (q4kh_host_backend_open(h, be, d, &b, err))
			return -1;
		kind = q4kh_backend_kind(be);
		e.dev = b.record;
		if (f->types && q4kh_backend_check_types(&b, f->types, f->n_types, &lacks)) {
			q4kh_backend_close(&b);
			if (f->passed_over && strlen(f->passed_over) + 1 < f->passed_over_cap)
				snprintf(f->passed_over + strlen(f->passed_over),
				         f->passed_over_cap - strlen(f->passed_over), "%s\n", lacks.msg);
			return 0;
		}
		q4kh_backend_close(&b);
		/* Index n_plugins stands for the built-in kernels, listed last. */
		for (size_t i = 0; i <= r->n_plugins; i++) {
			const struct q4kh_plugin *k = i < r->n_plugins ? &r->plugins[i] : NULL;
			const char *variant = k ? k->name : NULL;

			if (k && (!targets(k, kind) ||
			          (f->types && !q4kh_candidate_applies(k, f->types, f->n_types))))
				continue;
			/* The reference's own kernels are not a candidate. */
			if (!variant && !strcmp(be->name, "cpu"))
				continue;
			if (f->kernel && strcmp(f->kernel, variant ? variant : "none"))
				continue;
			e.backend = be->name;
			e.variant = variant;
			if (push(list, n, &e, err))
				return -1;
		}
	}
	return 0;
}

int q4kh_candidates_list(struct q4kh_host *h, const struct q4kh_candidate_filter *f,
                         struct q4kh_candidate **out, size_t *n, struct q4kh_error *err)
{
	const struct q4kh_registry *r = h->registry;

	*out = NULL;
	*n = 0;
	if (f->passed_over && f->passed_over_cap)
		f->passed_over[0] = 0;
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND ||
		    (f->backend && strcmp(f->backend, p->name)))
			continue;
		if (add_backend(h, p, f, out, n, err)) {
			free(*out);
			*out = NULL;
			*n = 0;
			return -1;
		}
	}
	return 0;
}

/* 1 when R has an accepted backend called NAME. */
static int has_backend(const struct q4kh_registry *r, const char *name)
{
	const struct q4kh_plugin *p = q4kh_registry_find(r, name);

	return p && p->desc->kind == Q4KH_KIND_BACKEND;
}

/* The kind of the backend filter F names, or NULL for any. */
static const char *filter_kind(const struct q4kh_registry *r,
                               const struct q4kh_candidate_filter *f)
{
	const struct q4kh_plugin *p = f->backend ? q4kh_registry_find(r, f->backend) : NULL;

	return !f->backend ? NULL : p ? q4kh_backend_kind(p) : f->backend;
}

size_t q4kh_candidates_unmeasurable(const struct q4kh_registry *r,
                                    const struct q4kh_candidate_filter *f, char *buf,
                                    size_t cap)
{
	size_t used = 0, n = 0;
	char why[700];

	buf[0] = 0;
	if (!has_backend(r, "cpu")) {
		q4kh_registry_why_absent(r, "cpu", why, sizeof(why));
		used += (size_t)snprintf(buf, cap,
		                         "the reference cpu plugin is not on the plugin path %s (from %s): "
		                         "nothing can be measured against it (F2.4)%s%s\n",
		                         r->path, r->path_origin, why[0] ? "; " : "", why);
		n++;
	}
	for (size_t i = 0; i < r->n_plugins && used < cap; i++) {
		const struct q4kh_plugin *k = &r->plugins[i];
		const char *target;

		if (k->state != Q4KH_PLUGIN_ACCEPTED || k->desc->kind != Q4KH_KIND_KERNEL)
			continue;
		target = k->desc->kernel->backend;
		if (q4kh_registry_backend_of_kind(r, target) ||
		    (f->backend && strcmp(filter_kind(r, f), target)) ||
		    (f->kernel && strcmp(f->kernel, k->name)))
			continue;
		used += (size_t)snprintf(buf + used, cap - used,
		                         "%s/%s: its backend %s is not on the plugin path %s (from %s): "
		                         "it cannot be measured (F2.4)\n",
		                         target, k->name, target, r->path, r->path_origin);
		n++;
	}
	return n;
}

size_t q4kh_candidates_not_applicable(const struct q4kh_registry *r,
                                      const struct q4kh_candidate_filter *f, char *buf,
                                      size_t cap)
{
	size_t used = 0, n = 0;

	buf[0] = 0;
	for (size_t i = 0; f->types && i < r->n_plugins && used < cap; i++) {
		const struct q4kh_plugin *k = &r->plugins[i];

		if (k->state != Q4KH_PLUGIN_ACCEPTED || k->desc->kind != Q4KH_KIND_KERNEL ||
		    (f->backend && strcmp(filter_kind(r, f), k->desc->kernel->backend)) ||
		    (f->kernel && strcmp(f->kernel, k->name)) ||
		    q4kh_candidate_applies(k, f->types, f->n_types))
			continue;
		used += (size_t)snprintf(buf + used, cap - used, "%s%s/%s", n ? ", " : "",
		                         k->desc->kernel->backend, k->name);
		n++;
	}
	return n;
}
