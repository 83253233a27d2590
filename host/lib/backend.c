#include "backend.h"

#include <stdio.h>
#include <string.h>

const char *q4kh_status_name(q4kh_status st)
{
	switch (st) {
	case Q4KH_OK: return "ok";
	case Q4KH_ERR_INVALID: return "invalid argument";
	case Q4KH_ERR_NOMEM: return "out of memory";
	case Q4KH_ERR_UNSUPPORTED: return "unsupported";
	case Q4KH_ERR_DEVICE: return "device error";
	case Q4KH_ERR_INTERNAL: return "internal error";
	}
	return "unknown status";
}

int q4kh_backend_check(const struct q4kh_backend *b, q4kh_status st,
                       const char *what, struct q4kh_error *err)
{
	const char *detail;
	char settings[512] = "";

	if (st == Q4KH_OK)
		return 0;
	/* Before init succeeded there is no context: last_error(NULL) then
	 * tells why init failed (plugin.h), and the settings it read may be
	 * why: the plugin names its key, we name the file and line. */
	detail = b->v->last_error(b->ctx);
	if (!b->ctx)
		q4kh_plugin_settings_read(b->plugin, 1, settings, sizeof(settings));
	return q4kh_fail(err, "%s: %s failed (%s): %s%s%s%s", b->plugin->name, what,
	                 q4kh_status_name(st), detail ? detail : "",
	                 settings[0] ? " [its settings: " : "", settings,
	                 settings[0] ? "]" : "");
}

int q4kh_backend_init(const struct q4kh_plugin *plugin, q4kh_backend_ctx **ctx,
                      q4kh_status *status, struct q4kh_error *err)
{
	struct q4kh_backend b = { .plugin = plugin, .v = plugin->desc->backend };
	q4kh_status st;

	q4kh_plugin_count_init(plugin);
	*ctx = NULL;
	st = b.v->init(&plugin->api, ctx);
	if (status)
		*status = st;
	return q4kh_backend_check(&b, st, "init", err);
}

int q4kh_backend_devices(const struct q4kh_plugin *plugin, uint32_t *n,
                         struct q4kh_error *err)
{
	struct q4kh_backend b = { .plugin = plugin };
	int rc;

	*n = 0;
	if (plugin->state != Q4KH_PLUGIN_ACCEPTED ||
	    plugin->desc->kind != Q4KH_KIND_BACKEND)
		return q4kh_fail(err, "%s (%s) is not a usable backend plugin",
		                 plugin->name, plugin->path);
	b.v = plugin->desc->backend;
	if (q4kh_backend_init(plugin, &b.ctx, NULL, err))
		return -1;
	rc = q4kh_backend_check(&b, b.v->device_count(b.ctx, n), "device_count", err);
	if (rc)
		*n = 0;
	b.v->shutdown(b.ctx);
	return rc;
}

void q4kh_backend_why_no_device(const struct q4kh_plugin *plugin, char *buf, size_t cap)
{
	struct q4kh_backend b = { .plugin = plugin, .v = plugin->desc->backend };

	buf[0] = 0;
	if (q4kh_backend_init(plugin, &b.ctx, NULL, NULL))
		return;
	q4kh_backend_why_none(b.v, b.ctx, buf, cap);
	b.v->shutdown(b.ctx);
}

void q4kh_backend_why_none(const struct q4kh_backend_v1 *v, q4kh_backend_ctx *ctx, char *buf,
                           size_t cap)
{
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
	const char *why;

	buf[0] = 0;
	if (v->device_info(ctx, 0, &rec) != Q4KH_OK && (why = v->last_error(ctx)))
		snprintf(buf, cap, "%s", why);
}

int q4kh_backend_check_types(const struct q4kh_backend *b, const uint32_t *types, size_t n,
                             struct q4kh_error *err)
{
	char has[512] = "";
	size_t used = 0;

	for (size_t i = 0; i < n; i++) {
		if (b->v->supports_type(b->ctx, types[i]))
			continue;
		for (uint32_t t = 0; t < Q4KH_TYPE_COUNT && used < sizeof(has); t++)
			if (q4kh_type_name(t) && b->v->supports_type(b->ctx, t))
				used += (size_t)snprintf(has + used, sizeof(has) - used, "%s%s",
				                         used ? ", " : "", q4kh_type_name(t));
		return q4kh_fail(err, "backend %s does not implement %s (GGUF type %u), a weight "
		                 "type of this model (it implements %s)", b->plugin->name,
		                 q4kh_type_name(types[i]) ? q4kh_type_name(types[i]) : "?",
		                 types[i], has[0] ? has : "none");
	}
	return 0;
}

int q4kh_backend_record(const struct q4kh_backend *b, uint32_t index,
                        struct q4kh_device_record *rec, struct q4kh_error *err)
{
	memset(rec, 0, sizeof(*rec));
	rec->struct_size = sizeof(*rec);
	if (q4kh_backend_check(b, b->v->device_info(b->ctx, index, rec), "device_info", err))
		return -1;
	/* A plugin's strings are fixed arrays: never trust them to be terminated. */
	rec->name[sizeof(rec->name) - 1] = 0;
	rec->uuid[sizeof(rec->uuid) - 1] = 0;
	rec->arch[sizeof(rec->arch) - 1] = 0;
	rec->driver_version[sizeof(rec->driver_version) - 1] = 0;
	return 0;
}

int q4kh_backend_open(const struct q4kh_plugin *plugin, uint32_t index,
                      struct q4kh_backend *out, struct q4kh_error *err)
{
	uint32_t count = 0;

	memset(out, 0, sizeof(*out));
	if (plugin->state != Q4KH_PLUGIN_ACCEPTED ||
	    plugin->desc->kind != Q4KH_KIND_BACKEND)
		return q4kh_fail(err, "%s (%s) is not a usable backend plugin",
		                 plugin->name, plugin->path);
	out->plugin = plugin;
	out->v = plugin->desc->backend;
	if (q4kh_backend_init(plugin, &out->ctx, NULL, err))
		goto fail;
	if (q4kh_backend_check(out, out->v->device_count(out->ctx, &count),
	                       "device_count", err))
		goto fail;
	if (index >= count) {
		q4kh_fail(err, "%s: no device %u (the backend has %u)", plugin->name,
		          index, count);
		goto fail;
	}
	if (q4kh_backend_record(out, index, &out->record, err))
		goto fail;
	if (q4kh_backend_check(out, out->v->device_open(out->ctx, index, &out->dev),
	                       "device_open", err))
		goto fail;
	return 0;
fail:
	q4kh_backend_close(out);
	return -1;
}

void q4kh_backend_close(struct q4kh_backend *b)
{
	if (b->dev && !b->borrowed)
		b->v->device_close(b->dev);
	if (b->ctx && !b->borrowed)
		b->v->shutdown(b->ctx);
	memset(b, 0, sizeof(*b));
}
