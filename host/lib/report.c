#include "report.h"

#include <string.h>

/* Distinct matmul weight types of the model, in first-seen order. */
static size_t matmul_types(const struct q4kh_model *m, uint32_t *types, size_t cap)
{
	size_t n = 0;
	const struct q4kh_weight *ws[8];

	for (int64_t il = -1; il < (int64_t)m->hp.n_layer; il++) {
		size_t nw = 0;
		if (il < 0) {
			ws[nw++] = &m->output;
		} else {
			const struct q4kh_layer *l = &m->layers[il];
			ws[nw++] = &l->wq;
			ws[nw++] = &l->wk;
			ws[nw++] = &l->wv;
			ws[nw++] = &l->wo;
			ws[nw++] = &l->w_gate;
			ws[nw++] = &l->w_up;
			ws[nw++] = &l->w_down;
		}
		for (size_t i = 0; i < nw; i++) {
			size_t j;
			if (!ws[i]->src)
				continue;
			for (j = 0; j < n && types[j] != ws[i]->src->type; j++)
				;
			if (j == n && n < cap)
				types[n++] = ws[i]->src->type;
		}
	}
	return n;
}

static double rate(int64_t tokens, double seconds)
{
	return seconds > 0 ? (double)tokens / seconds : 0.0;
}

void q4kh_report_print(FILE *f, const struct q4kh_report *r)
{
	const struct q4kh_plugin *p = r->backend->plugin;
	const struct q4kh_device_record *d = &r->backend->record;
	uint32_t types[16];
	size_t nt = matmul_types(r->model, types, 16);

	fprintf(f, "q4khost: model %s (%s, %u layers)\n", r->model_path,
	        r->model->arch->name, r->model->hp.n_layer);
	fprintf(f, "q4khost: backend %s %s (build %s) from %s\n", p->name,
	        p->desc->version, p->desc->build_id, p->path);
	fprintf(f, "q4khost: device %u: %s, uuid %s, arch %s\n", r->device_index,
	        d->name, d->uuid, d->arch);
	fprintf(f, "q4khost: kernels:");
	for (size_t i = 0; i < nt; i++)
		fprintf(f, "%s %s=%s built-in", i ? "," : "", q4kh_type_name(types[i]),
		        p->name);
	fprintf(f, "\nq4khost: F2: not needed (%s is the reference backend)\n",
	        p->name);
	fprintf(f, "q4khost: chat template: %s\n", r->chat_template);
	fprintf(f, "q4khost: prefill %lld tokens in %.3f s (%.1f tokens/s); "
	           "decode %lld tokens in %.3f s (%.1f tokens/s); stop: %s\n",
	        (long long)r->prompt_tokens, r->prefill_seconds,
	        rate(r->prompt_tokens, r->prefill_seconds),
	        (long long)r->generated_tokens, r->decode_seconds,
	        rate(r->generated_tokens > 0 ? r->generated_tokens - 1 : 0,
	             r->decode_seconds),
	        r->stop_reason);
}

json_t *q4kh_report_json(const struct q4kh_report *r)
{
	const struct q4kh_plugin *p = r->backend->plugin;
	const struct q4kh_device_record *d = &r->backend->record;
	uint32_t types[16];
	size_t nt = matmul_types(r->model, types, 16);
	json_t *kernels = json_object();

	for (size_t i = 0; i < nt; i++)
		json_object_set_new(kernels, q4kh_type_name(types[i]),
		                    json_pack("{s:s, s:s}", "plugin", p->name, "kernel",
		                              "built-in"));
	return json_pack(
		"{s:s, s:s, s:{s:s, s:s, s:s, s:s}, s:{s:i, s:s, s:s, s:s, s:s, s:I}, "
		"s:o, s:{s:s, s:s}, s:s, "
		"s:{s:I, s:f, s:f}, s:{s:I, s:f, s:f}, s:s}",
		"model", r->model_path, "architecture", r->model->arch->name,
		"backend", "name", p->name, "version", p->desc->version, "build_id",
		p->desc->build_id, "file", p->path,
		"device", "index", (int)r->device_index, "name", d->name, "uuid",
		d->uuid, "arch", d->arch, "driver", d->driver_version, "memory_bytes",
		(json_int_t)d->memory_bytes,
		"kernels", kernels,
		"f2", "verdict", "not needed", "reason", "reference backend",
		"chat_template", r->chat_template,
		"prefill", "tokens", (json_int_t)r->prompt_tokens, "seconds",
		r->prefill_seconds, "tokens_per_second",
		rate(r->prompt_tokens, r->prefill_seconds),
		"decode", "tokens", (json_int_t)r->generated_tokens, "seconds",
		r->decode_seconds, "tokens_per_second",
		rate(r->generated_tokens > 0 ? r->generated_tokens - 1 : 0,
		     r->decode_seconds),
		"stop", r->stop_reason);
}
