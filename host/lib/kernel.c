#include "kernel.h"

#include <stdio.h>
#include <string.h>

int q4kh_kernel_check(const struct q4kh_kernel *k, q4kh_status st,
                      const char *what, struct q4kh_error *err)
{
	const char *detail;

	if (st == Q4KH_OK)
		return 0;
	detail = k->v->last_error(k->ctx); /* NULL ctx: why init failed */
	return q4kh_fail(err, "%s: %s failed (%s): %s", k->plugin->name, what,
	                 q4kh_status_name(st), detail ? detail : "");
}

/* PLUGIN's context from SPARES (NULL: none), taken out of it; NULL when
 * it holds none. */
static q4kh_kernel_ctx *take_spare(struct q4kh_kernel_spares *spares,
                                   const struct q4kh_plugin *plugin)
{
	q4kh_kernel_ctx *ctx;

	for (size_t i = 0; spares && i < spares->n; i++) {
		if (spares->plugin[i] != plugin)
			continue;
		ctx = spares->ctx[i];
		spares->plugin[i] = spares->plugin[--spares->n];
		spares->ctx[i] = spares->ctx[spares->n];
		return ctx;
	}
	return NULL;
}

/* Open PLUGIN (checked) on B's device into OUT: native handles, then init
 * (or the context SPARES holds for it, NULL: none). */
static int open_on(const struct q4kh_plugin *plugin, const struct q4kh_backend *b,
                   struct q4kh_kernel_spares *spares, struct q4kh_kernel *out,
                   struct q4kh_error *err)
{
	out->plugin = plugin;
	out->v = plugin->desc->kernel;
	out->native.struct_size = sizeof(out->native);
	if (q4kh_backend_check(b, b->v->native_device(b->dev, &out->native),
	                       "native_device", err))
		goto fail;
	if ((out->ctx = take_spare(spares, plugin)))
		return 0;
	q4kh_plugin_count_init(plugin);
	if (q4kh_kernel_check(out, out->v->init(&plugin->api, &out->ctx), "init", err))
		goto fail;
	return 0;
fail:
	q4kh_kernel_close(out);
	return -1;
}

q4kh_status q4kh_kernel_spare_init(struct q4kh_kernel_spares *s, const struct q4kh_plugin *p,
                                   char *why, size_t cap)
{
	const struct q4kh_kernel_v1 *v = p->desc->kernel;
	q4kh_kernel_ctx *ctx = NULL;
	const char *detail;
	q4kh_status st;

	why[0] = 0;
	if (s->n == Q4KH_KERNEL_CACHE) { /* more than any path holds: not kept */
		snprintf(why, cap, "more than %d kernel variants", Q4KH_KERNEL_CACHE);
		return Q4KH_ERR_NOMEM;
	}
	q4kh_plugin_count_init(p);
	st = v->init(&p->api, &ctx);
	if (st != Q4KH_OK) {
		detail = v->last_error(NULL);
		snprintf(why, cap, "%s", detail ? detail : "");
		return st;
	}
	s->plugin[s->n] = p;
	s->ctx[s->n++] = ctx;
	return Q4KH_OK;
}

void q4kh_kernel_spares_close(struct q4kh_kernel_spares *s)
{
	for (size_t i = 0; i < s->n; i++)
		s->plugin[i]->desc->kernel->shutdown(s->ctx[i]);
	s->n = 0;
}

/* PLUGIN from B's cache, opened there at the first call, into OUT, borrowed. */
static int open_cached(const struct q4kh_plugin *plugin, const struct q4kh_backend *b,
                       struct q4kh_kernel *out, struct q4kh_error *err)
{
	struct q4kh_kernel_cache *c = b->kernels;
	struct q4kh_error e = { { 0 } };
	size_t i = 0;

	while (i < c->n && c->k[i].plugin != plugin)
		i++;
	if (i == c->n) {
		if (c->n == Q4KH_KERNEL_CACHE) /* more than any path holds */
			return open_on(plugin, b, c->spares, out, err);
		if (open_on(plugin, b, c->spares, &c->k[i], &e))
			snprintf(c->why[i], sizeof(c->why[i]), "%s", e.msg);
		c->k[i].plugin = plugin;
		c->n++;
	}
	if (c->why[i][0])
		return q4kh_fail(err, "%s", c->why[i]);
	*out = c->k[i];
	out->borrowed = 1;
	return 0;
}

void q4kh_kernel_cache_close(struct q4kh_kernel_cache *c)
{
	for (size_t i = 0; i < c->n; i++)
		q4kh_kernel_close(&c->k[i]);
	c->n = 0;
}

int q4kh_kernel_open(const struct q4kh_plugin *plugin,
                     const struct q4kh_backend *b, struct q4kh_kernel *out,
                     struct q4kh_error *err)
{
	const struct q4kh_kernel_v1 *v;

	memset(out, 0, sizeof(*out));
	if (plugin->state != Q4KH_PLUGIN_ACCEPTED ||
	    plugin->desc->kind != Q4KH_KIND_KERNEL)
		return q4kh_fail(err, "%s (%s) is not a usable kernel-variant plugin",
		                 plugin->name, plugin->path);
	v = plugin->desc->kernel;
	if (strcmp(v->backend, q4kh_backend_kind(b->plugin)) != 0)
		return q4kh_fail(err, "kernel variant %s targets backends of kind '%s', not %s (kind '%s')",
		                 plugin->name, v->backend, b->plugin->name,
		                 q4kh_backend_kind(b->plugin));
	if (!b->v->native_device)
		return q4kh_fail(err, "backend %s lends no native handles, so kernel variant %s cannot run on it",
		                 b->plugin->name, plugin->name);
	return b->kernels ? open_cached(plugin, b, out, err) : open_on(plugin, b, NULL, out, err);
}

void q4kh_kernel_close(struct q4kh_kernel *k)
{
	if (k->ctx && !k->borrowed)
		k->v->shutdown(k->ctx);
	memset(k, 0, sizeof(*k));
}

int q4kh_kernel_implements(const struct q4kh_kernel *k, uint32_t type)
{
	for (uint32_t i = 0; i < k->v->n_types; i++)
		if (k->v->types[i] == type)
			return 1;
	return 0;
}
