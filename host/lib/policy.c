#include "policy.h"

#include <stdio.h>
#include <string.h>

#include "config.h"

static int means_builtin(const char *v)
{
	return !*v || !strcmp(v, "none") || !strcmp(v, "0") || !strcmp(v, "built-in");
}

const char *q4kh_policy_kernel_name(const char *cli_name, const char **origin)
{
	const char *env = q4kh_env("Q4KHOST_Q4K_KERNEL");

	if (cli_name) {
		*origin = "--kernel";
		return means_builtin(cli_name) ? NULL : cli_name;
	}
	if (env) {
		*origin = "Q4KHOST_Q4K_KERNEL";
		return means_builtin(env) ? NULL : env;
	}
	*origin = "default";
	return NULL;
}

/* "a, b" of every accepted kernel-variant plugin, for messages. */
static void list_variants(const struct q4kh_registry *r, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = 0;
	for (size_t i = 0; i < r->n_plugins && used < cap; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_KERNEL)
			continue;
		used += (size_t)snprintf(buf + used, cap - used, "%s%s (for %s)",
		                         used ? ", " : "", p->name, p->desc->kernel->backend);
	}
	if (!buf[0])
		snprintf(buf, cap, "none");
}

static int model_has_type(const struct q4kh_model *m, uint32_t type)
{
	uint32_t types[Q4KH_TYPE_COUNT];
	size_t n = q4kh_model_matrix_types(m, types, Q4KH_TYPE_COUNT);

	for (size_t i = 0; i < n; i++)
		if (types[i] == type)
			return 1;
	return 0;
}

int q4kh_policy_use_kernel(const struct q4kh_registry *r,
                           const struct q4kh_backend *b, struct q4kh_model *m,
                           const char *name, struct q4kh_kernel *k,
                           struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(r, name);
	char list[512];
	int used = 0;

	if (!p || p->desc->kind != Q4KH_KIND_KERNEL) {
		list_variants(r, list, sizeof(list));
		return q4kh_fail(err, "kernel variant '%s' was not found on plugin path %s (%s); found: %s",
		                 name, r->path, r->path_origin, list);
	}
	if (q4kh_kernel_open(p, b, k, err))
		return -1;
	for (uint32_t i = 0; i < k->v->n_types; i++) {
		uint32_t t = k->v->types[i];
		uint32_t score = k->v->score(k->ctx, &b->record, t);

		if (!model_has_type(m, t) || score == 0)
			continue;
		if (q4kh_model_use_kernel(m, k, t, err))
			goto fail;
		used++;
	}
	if (!used) {
		q4kh_fail(err, "kernel variant %s cannot serve this request: the model has none of its types, or it scores 0 for them on %s (%s)",
		          name, b->record.name, b->record.arch);
		goto fail;
	}
	return 0;
fail:
	q4kh_model_release_kernels(m);
	q4kh_kernel_close(k);
	return -1;
}
