#include "candidates.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

const char *q4kh_candidate_name(const struct q4kh_candidate *c, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/%s", c->backend, c->variant ? c->variant : "built-in");
	return buf;
}

static int targets(const struct q4kh_plugin *k, const char *backend)
{
	return k->state == Q4KH_PLUGIN_ACCEPTED && k->desc->kind == Q4KH_KIND_KERNEL &&
	       !strcmp(k->desc->kernel->backend, backend);
}

static int push(struct q4kh_candidate_entry **list, size_t *n,
                const struct q4kh_candidate_entry *e, struct q4kh_error *err)
{
	struct q4kh_candidate_entry *grown = realloc(*list, (*n + 1) * sizeof(**list));

	if (!grown)
		return q4kh_fail(err, "out of memory");
	*list = grown;
	grown[(*n)++] = *e;
	return 0;
}

/* BE's candidates on its devices. */
static int add_backend(const struct q4kh_registry *r, const struct q4kh_plugin *be,
                       const struct q4kh_candidate_filter *f,
                       struct q4kh_candidate_entry **list, size_t *n,
                       struct q4kh_error *err)
{
	const char *kind;
	uint32_t count;

	if (q4kh_backend_devices(be, &count, err))
		return -1;
	for (uint32_t d = 0; d < count; d++) {
		struct q4kh_backend b;
		struct q4kh_candidate_entry e;

		if (f->device_set && d != f->device)
			continue;
		if (q4kh_backend_open(be, d, &b, err))
			return -1;
		kind = q4kh_backend_kind(be);
		e.dev = b.record;
		q4kh_backend_close(&b);
		/* Index n_plugins stands for the built-in kernels, listed last. */
		for (size_t i = 0; i <= r->n_plugins; i++) {
			const struct q4kh_plugin *k = i < r->n_plugins ? &r->plugins[i] : NULL;
			const char *variant = k ? k->name : NULL;

			if (k && !targets(k, kind))
				continue;
			/* The reference's own kernels are not a candidate. */
			if (!variant && !strcmp(be->name, "cpu"))
				continue;
			if (f->kernel && strcmp(f->kernel, variant ? variant : "none"))
				continue;
			e.c = (struct q4kh_candidate){ be->name, d, variant };
			if (push(list, n, &e, err))
				return -1;
		}
	}
	return 0;
}

int q4kh_candidates_list(const struct q4kh_registry *r,
                         const struct q4kh_candidate_filter *f,
                         struct q4kh_candidate_entry **out, size_t *n,
                         struct q4kh_error *err)
{
	*out = NULL;
	*n = 0;
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND ||
		    (f->backend && strcmp(f->backend, p->name)))
			continue;
		if (add_backend(r, p, f, out, n, err)) {
			free(*out);
			*out = NULL;
			*n = 0;
			return -1;
		}
	}
	return 0;
}
