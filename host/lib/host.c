#include "host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int q4kh_host_open(struct q4kh_host *h, const struct q4kh_registry *r,
                   const struct q4kh_config *c, const char *model_path,
                   struct q4kh_error *err)
{
	memset(h, 0, sizeof(*h));
	h->registry = r;
	h->config = c;
	h->backends = calloc(r->n_plugins ? r->n_plugins : 1, sizeof(*h->backends));
	if (!h->backends)
		return q4kh_fail(err, "out of memory");
	if (model_path && q4kh_host_open_model(h, model_path, err)) {
		q4kh_host_close(h);
		return -1;
	}
	return 0;
}

int q4kh_host_open_model(struct q4kh_host *h, const char *model_path, struct q4kh_error *err)
{
	if (h->model)
		return q4kh_fail(err, "%s: the command holds a model already (%s)", model_path,
		                 h->model_path);
	if (!(h->path_copy = strdup(model_path)))
		return q4kh_fail(err, "%s: out of memory", model_path);
	if (q4kh_model_open(model_path, &h->model, err) ||
	    q4kh_tokenizer_load(h->model->gguf, &h->tok, err)) {
		q4kh_model_free(h->model);
		h->model = NULL;
		free(h->path_copy);
		h->path_copy = NULL;
		return -1;
	}
	h->model_path = h->path_copy;
	h->n_types = q4kh_model_matrix_types(h->model, h->types, Q4KH_TYPE_COUNT);
	return 0;
}

/* Start backend B (its plugin set): init, count and describe its devices. */
static void start(struct q4kh_host_backend *b)
{
	struct q4kh_backend v = { .plugin = b->plugin, .v = b->plugin->desc->backend };
	struct q4kh_error e = { { 0 } };
	const char *detail;

	b->tried = 1;
	if (q4kh_backend_init(b->plugin, &v.ctx, &b->status, &e)) {
		detail = v.v->last_error(NULL);
		snprintf(b->detail, sizeof(b->detail), "%s", detail ? detail : "");
		goto fail;
	}
	if (q4kh_backend_check(&v, v.v->device_count(v.ctx, &b->n_devices), "device_count", &e))
		goto fail;
	b->records = calloc(b->n_devices ? b->n_devices : 1, sizeof(*b->records));
	b->devs = calloc(b->n_devices ? b->n_devices : 1, sizeof(*b->devs));
	b->kernels = calloc(b->n_devices ? b->n_devices : 1, sizeof(*b->kernels));
	if (!b->records || !b->devs || !b->kernels) {
		q4kh_fail(&e, "%s: out of memory for %u devices", b->plugin->name, b->n_devices);
		goto fail;
	}
	b->ctx = v.ctx;
	return;
fail:
	if (v.ctx)
		v.v->shutdown(v.ctx);
	free(b->records);
	free(b->devs);
	free(b->kernels);
	b->records = NULL;
	b->devs = NULL;
	b->kernels = NULL;
	b->n_devices = 0;
	snprintf(b->why, sizeof(b->why), "%s", e.msg);
}

const struct q4kh_host_backend *q4kh_host_backend(struct q4kh_host *h,
                                                  const struct q4kh_plugin *p)
{
	struct q4kh_host_backend *b;
	size_t i = (size_t)(p - h->registry->plugins);

	if (i >= h->registry->n_plugins || p->state != Q4KH_PLUGIN_ACCEPTED ||
	    p->desc->kind != Q4KH_KIND_BACKEND)
		return NULL;
	b = &h->backends[i];
	if (!b->tried) {
		b->plugin = p;
		start(b);
	}
	return b;
}

uint32_t q4kh_host_devices(struct q4kh_host *h, const struct q4kh_plugin *p, char *skipped,
                           size_t cap)
{
	const struct q4kh_host_backend *b = q4kh_host_backend(h, p);
	size_t used = skipped ? strlen(skipped) : 0;

	if (b && b->ctx)
		return b->n_devices;
	if (skipped && used + 1 < cap)
		snprintf(skipped + used, cap - used, "%s\n",
		         b ? b->why : "not a usable backend plugin");
	return 0;
}

int q4kh_host_backend_open(struct q4kh_host *h, const struct q4kh_plugin *p, uint32_t index,
                           struct q4kh_backend *out, struct q4kh_error *err)
{
	struct q4kh_host_backend *b = (struct q4kh_host_backend *)q4kh_host_backend(h, p);

	memset(out, 0, sizeof(*out));
	if (!b)
		return q4kh_fail(err, "%s (%s) is not a usable backend plugin", p->name, p->path);
	if (!b->ctx)
		return q4kh_fail(err, "%s", b->why);
	if (index >= b->n_devices)
		return q4kh_fail(err, "%s: no device %u (the backend has %u)", p->name, index,
		                 b->n_devices);
	out->plugin = p;
	out->v = p->desc->backend;
	out->ctx = b->ctx;
	out->borrowed = 1;
	if (!b->records[index].struct_size &&
	    q4kh_backend_record(out, index, &b->records[index], err))
		goto fail;
	out->record = b->records[index];
	if (!b->devs[index] &&
	    q4kh_backend_check(out, out->v->device_open(b->ctx, index, &b->devs[index]),
	                       "device_open", err))
		goto fail;
	out->dev = b->devs[index];
	out->kernels = &b->kernels[index];
	out->kernels->spares = &h->spares;
	return 0;
fail:
	b->records[index].struct_size = 0;
	memset(out, 0, sizeof(*out));
	return -1;
}

void q4kh_host_close(struct q4kh_host *h)
{
	for (size_t i = 0; h->backends && i < h->registry->n_plugins; i++) {
		struct q4kh_host_backend *b = &h->backends[i];

		for (uint32_t d = 0; b->ctx && d < b->n_devices; d++) {
			q4kh_kernel_cache_close(&b->kernels[d]);
			if (b->devs[d])
				b->plugin->desc->backend->device_close(b->devs[d]);
		}
		if (b->ctx)
			b->plugin->desc->backend->shutdown(b->ctx);
		free(b->records);
		free(b->devs);
		free(b->kernels);
	}
	free(h->backends);
	q4kh_kernel_spares_close(&h->spares);
	q4kh_tokenizer_free(h->tok);
	q4kh_model_free(h->model);
	free(h->path_copy);
	memset(h, 0, sizeof(*h));
}

q4kh_status q4kh_host_start_status(void *host, const struct q4kh_plugin *p, char *why,
                                   size_t cap)
{
	struct q4kh_host *h = host;
	const struct q4kh_host_backend *b;

	if (p->desc->kind == Q4KH_KIND_KERNEL)
		return q4kh_kernel_spare_init(&h->spares, p, why, cap);
	b = q4kh_host_backend(h, p);
	snprintf(why, cap, "%s", b ? b->detail : "");
	return !b ? Q4KH_ERR_INVALID : b->ctx ? Q4KH_OK : b->status;
}

json_t *q4kh_host_json(const struct q4kh_host *h)
{
	json_t *inits[2] = { json_object(), json_object() }; /* backends, variants */

	for (size_t i = 0; inits[0] && inits[1] && i < h->registry->n_plugins; i++) {
		const struct q4kh_plugin *p = &h->registry->plugins[i];

		if (p->state == Q4KH_PLUGIN_ACCEPTED)
			json_object_set_new(inits[p->desc->kind == Q4KH_KIND_KERNEL], p->name,
			                    json_integer(q4kh_plugin_inits(p)));
	}
	return json_pack("{s:i, s:o*, s:o*}", "model_opens", (int)q4kh_gguf_opens(),
	                 "backend_inits", inits[0], "variant_inits", inits[1]);
}
