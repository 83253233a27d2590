#include "report.h"

#include <stdlib.h>
#include <string.h>

#include "kernel.h"

/* Whether TOKENS in SECONDS make a rate: none from no time or no tokens
 * (one generated token is prefill's; decode timed none). */
static int has_rate(int64_t tokens, double seconds)
{
	return tokens > 0 && seconds > 0;
}

/* "12.3 tokens/s", or "rate n/a" where there is no rate; in BUF. */
static const char *rate_text(char *buf, size_t cap, int64_t tokens, double seconds)
{
	if (!has_rate(tokens, seconds))
		return "rate n/a";
	snprintf(buf, cap, "%.1f tokens/s", (double)tokens / seconds);
	return buf;
}

/* The same for JSON: a number, or null. */
static json_t *rate_json(int64_t tokens, double seconds)
{
	return has_rate(tokens, seconds) ? json_real((double)tokens / seconds) : json_null();
}

/* Tokens decode timed: every generated one but the first, which prefill gave. */
static int64_t decoded(const struct q4kh_report *r)
{
	return r->generated_tokens > 0 ? r->generated_tokens - 1 : 0;
}

/* The plural's "s" of a count: "1 token", "2 tokens", "0 tokens". */
static const char *plural(unsigned long long n)
{
	return n == 1 ? "" : "s";
}

/* The path most steps took (the later one on a tie: decode's, which
 * outnumbers the prompt's steps); "op by op" before any step. */
static enum q4kh_step_way step_way(const struct q4kh_session_stats *st)
{
	enum q4kh_step_way best = Q4KH_WAY_OP_BY_OP;

	for (int w = 0; w < Q4KH_WAY_COUNT; w++)
		if (st->ways[w] && st->ways[w] >= st->ways[best])
			best = (enum q4kh_step_way)w;
	return best;
}

static const char *step_mode(const struct q4kh_session_stats *st)
{
	return q4kh_step_way_name(step_way(st));
}

/* How the steps ran and, when not all could take the backend's graph
 * entry or be replays, why. */
static void print_steps(FILE *f, const struct q4kh_session_stats *st)
{
	unsigned long long steps = st->steps, replays = st->replayed, recordings = st->recorded;
	const char *sep = "";

	if (!st->ways[Q4KH_WAY_GRAPH_NODES] && !st->ways[Q4KH_WAY_GRAPH_REPLAY] &&
	    !st->ways[Q4KH_WAY_GRAPH_PERSISTENT]) {
		fprintf(f, "q4khost: steps: %s (%llu step%s, %llu replay%s of %llu recording%s), "
		           "KV cache %s%s%s\n",
		        step_mode(st), steps, plural(steps), replays, plural(replays),
		        recordings, plural(recordings), q4kh_type_name(st->kv_type),
		        st->why_not[0] ? "; " : "", st->why_not);
		return;
	}
	fprintf(f, "q4khost: steps: %s (%llu step%s:", step_mode(st), steps, plural(steps));
	for (int w = 0; w < Q4KH_WAY_COUNT; w++) {
		if (!st->ways[w])
			continue;
		fprintf(f, "%s %llu %s", sep, (unsigned long long)st->ways[w],
		        q4kh_step_way_name((enum q4kh_step_way)w));
		sep = ",";
	}
	if (st->launches)
		fprintf(f, "; %u launches a step", st->launches);
	fprintf(f, "), KV cache %s%s%s\n", q4kh_type_name(st->kv_type),
	        st->why_not[0] ? "; " : "", st->why_not);
}

/* Steps by path, as {"graph_replay": 128, ...}: the paths taken only. */
static json_t *ways_json(const struct q4kh_session_stats *st)
{
	json_t *o = json_object();

	for (int w = 0; o && w < Q4KH_WAY_COUNT; w++)
		if (st->ways[w])
			json_object_set_new(o, q4kh_step_way_token((enum q4kh_step_way)w),
			                    json_integer((json_int_t)st->ways[w]));
	return o;
}

/* A float as the shortest decimal that reads back as it (0.8, not
 * 0.800000011920929), for JSON that a reader passes back to --temp. */
static double shortest(float v)
{
	char buf[32];

	for (int digits = 6;; digits++) {
		snprintf(buf, sizeof(buf), "%.*g", digits, (double)v);
		if (digits == 9 || strtof(buf, NULL) == v)
			return strtod(buf, NULL);
	}
}

static json_t *sampling_json(const struct q4kh_sampler_params *s)
{
	if (q4kh_sampler_greedy(s))
		return json_pack("{s:s}", "mode", "greedy");
	return json_pack("{s:s, s:f, s:i, s:f, s:I}", "mode", "sampled", "temperature",
	                 shortest(s->temperature), "top_k", (int)s->top_k, "top_p",
	                 shortest(s->top_p), "seed", (json_int_t)s->seed);
}

static double startup_seconds(const struct q4kh_startup *s)
{
	return s->plugins + s->model + s->choice + s->session;
}

void q4kh_report_print(FILE *f, const struct q4kh_report *r)
{
	const struct q4kh_plugin *p = r->backend->plugin;
	const struct q4kh_device_record *d = &r->backend->record;
	uint32_t types[Q4KH_TYPE_COUNT];
	size_t nt = q4kh_model_matrix_types(r->model, types, Q4KH_TYPE_COUNT);
	char prefill_rate[48], decode_rate[48], of[40] = "";

	fprintf(f, "q4khost: model %s (%s, %u layers)\n", r->model_path,
	        r->model->arch->name, r->model->hp.n_layer);
	fprintf(f, "q4khost: backend %s %s (build %s) from %s\n", p->name,
	        p->desc->version, p->desc->build_id, p->path);
	fprintf(f, "q4khost: device %u: %s, uuid %s, arch %s\n", r->device_index,
	        d->name, d->uuid, d->arch);
	fprintf(f, "q4khost: kernels:");
	for (size_t i = 0; i < nt; i++) {
		const struct q4kh_kernel *k = q4kh_model_kernel_for(r->model, types[i]);
		if (k)
			fprintf(f, "%s %s=%s", i ? "," : "", q4kh_type_name(types[i]),
			        k->plugin->name);
		else
			fprintf(f, "%s %s=%s built-in", i ? "," : "",
			        q4kh_type_name(types[i]), p->name);
	}
	fputc('\n', f);
	fprintf(f, "q4khost: kernel choice: %s\n", r->selection->kernel_choice);
	for (size_t i = 0; i < nt; i++) {
		const struct q4kh_kernel *k = q4kh_model_kernel_for(r->model, types[i]);
		if (k) {
			fprintf(f, "q4khost: kernel variant %s %s (build %s) from %s\n",
			        k->plugin->name, k->plugin->desc->version,
			        k->plugin->desc->build_id, k->plugin->path);
			break;
		}
	}
	fprintf(f, "q4khost: F2: %s%s%s%s: %s\n", r->selection->f2_verdict,
	        r->selection->f2_source[0] ? " (" : "", r->selection->f2_source,
	        r->selection->f2_source[0] ? ")" : "", r->selection->f2_message);
	/* A pass says nothing of what the probe did not reach: say where it ends. */
	if (r->selection->f2_probe[0])
		fprintf(f, "q4khost: F2 probe: %s; positions %lld and later not checked\n",
		        r->selection->f2_probe, (long long)r->selection->f2_probe_positions);
	for (const char *s = r->selection->steps; *s;) {
		size_t len = strcspn(s, "\n");
		fprintf(f, "q4khost: F2 rejected first: %.*s\n", (int)len, s);
		s += len + (s[len] == '\n');
	}
	for (size_t i = 0; r->registry && i < r->registry->n_plugins; i++) {
		const struct q4kh_plugin *b = &r->registry->plugins[i];

		if (b->state == Q4KH_PLUGIN_REFUSED)
			fprintf(f, "q4khost: refused backend %s (%s): %s\n", b->name, b->path,
			        b->reason);
		else if (b->state == Q4KH_PLUGIN_REJECTED)
			fprintf(f, "q4khost: rejected plugin %s (%s): %s\n", b->name, b->path,
			        b->reason);
	}
	if (r->selection->not_applicable[0])
		fprintf(f, "q4khost: not applicable to this model (none of their types): %s\n",
		        r->selection->not_applicable);
	fprintf(f, "q4khost: chat template: %s\n", r->chat_template);
	if (r->sampling && q4kh_sampler_greedy(r->sampling))
		fprintf(f, "q4khost: sampling: greedy\n");
	else if (r->sampling)
		fprintf(f, "q4khost: sampling: temperature %g, top-k %d, top-p %g, seed %llu\n",
		        shortest(r->sampling->temperature), (int)r->sampling->top_k,
		        shortest(r->sampling->top_p), (unsigned long long)r->sampling->seed);
	if (r->steps)
		print_steps(f, r->steps);
	if (r->startup)
		fprintf(f, "q4khost: time to first token %.3f s: start-up %.3f s (plugins %.3f, "
		        "model %.3f, choice and F2 %.3f, session %.3f), prefill %.3f s\n",
		        r->startup->first_token, startup_seconds(r->startup), r->startup->plugins,
		        r->startup->model, r->startup->choice, r->startup->session,
		        r->prefill_seconds);
	/* a prefill stopped part way says how far it got */
	if (r->prompt_tokens < r->prompt_total)
		snprintf(of, sizeof(of), " of %lld", (long long)r->prompt_total);
	fprintf(f, "q4khost: prefill %lld%s token%s in %.3f s (%s); "
	           "decode %lld token%s in %.3f s (%s); stop: %s\n",
	        (long long)r->prompt_tokens, of,
	        plural((unsigned long long)(of[0] ? r->prompt_total : r->prompt_tokens)),
	        r->prefill_seconds,
	        rate_text(prefill_rate, sizeof(prefill_rate), r->prompt_tokens, r->prefill_seconds),
	        (long long)r->generated_tokens, plural((unsigned long long)r->generated_tokens),
	        r->decode_seconds,
	        rate_text(decode_rate, sizeof(decode_rate), decoded(r), r->decode_seconds),
	        r->stop_reason);
}

json_t *q4kh_report_json(const struct q4kh_report *r)
{
	const struct q4kh_plugin *p = r->backend->plugin;
	const struct q4kh_device_record *d = &r->backend->record;
	uint32_t types[Q4KH_TYPE_COUNT];
	size_t nt = q4kh_model_matrix_types(r->model, types, Q4KH_TYPE_COUNT);
	json_t *kernels = json_object(), *fallbacks = json_array(), *refused = json_array();
	json_t *rejected = json_array();

	for (const char *s = r->selection->steps; *s;) {
		size_t len = strcspn(s, "\n");
		json_array_append_new(fallbacks, json_stringn(s, len));
		s += len + (s[len] == '\n');
	}
	for (size_t i = 0; r->registry && i < r->registry->n_plugins; i++) {
		const struct q4kh_plugin *b = &r->registry->plugins[i];

		if (b->state == Q4KH_PLUGIN_REFUSED || b->state == Q4KH_PLUGIN_REJECTED)
			json_array_append_new(b->state == Q4KH_PLUGIN_REFUSED ? refused : rejected,
			                      json_pack("{s:s, s:s, s:s}", "name", b->name, "file",
			                                b->path, "reason", b->reason));
	}
	for (size_t i = 0; i < nt; i++) {
		const struct q4kh_kernel *k = q4kh_model_kernel_for(r->model, types[i]);
		json_object_set_new(kernels, q4kh_type_name(types[i]),
		                    k ? json_pack("{s:s, s:s, s:s, s:s}", "plugin",
		                                  k->plugin->name, "version",
		                                  k->plugin->desc->version, "build_id",
		                                  k->plugin->desc->build_id, "file",
		                                  k->plugin->path)
		                      : json_pack("{s:s, s:s}", "plugin", p->name,
		                                  "kernel", "built-in"));
	}
	json_t *o = json_pack(
		"{s:s, s:s, s:{s:s, s:s, s:s, s:s}, s:{s:i, s:s, s:s, s:s, s:s, s:I}, "
		"s:o, s:s, s:{s:s, s:s, s:s, s:o}, s:o, s:o, s:s, "
		"s:{s:I, s:I, s:f, s:o}, s:{s:I, s:f, s:o}, s:s}",
		"model", r->model_path, "architecture", r->model->arch->name,
		"backend", "name", p->name, "version", p->desc->version, "build_id",
		p->desc->build_id, "file", p->path,
		"device", "index", (int)r->device_index, "name", d->name, "uuid",
		d->uuid, "arch", d->arch, "driver_version", d->driver_version, "memory_bytes",
		(json_int_t)d->memory_bytes,
		"kernels", kernels, "kernel_choice", r->selection->kernel_choice,
		"f2", "verdict", r->selection->f2_verdict, "source", r->selection->f2_source,
		"message", r->selection->f2_message, "rejected_first", fallbacks,
		"refused_backends", refused, "rejected_plugins", rejected,
		"chat_template", r->chat_template,
		"prefill", "tokens", (json_int_t)r->prompt_tokens, "of",
		(json_int_t)r->prompt_total, "seconds",
		r->prefill_seconds, "tokens_per_second",
		rate_json(r->prompt_tokens, r->prefill_seconds),
		"decode", "tokens", (json_int_t)r->generated_tokens, "seconds",
		r->decode_seconds, "tokens_per_second", rate_json(decoded(r), r->decode_seconds),
		"stop", r->stop_reason);

	/* Which probe the verdicts came from: none when no F2 decision was made. */
	if (o && r->selection->f2_probe[0])
		json_object_set_new(json_object_get(o, "f2"), "probe",
		                    json_pack("{s:s, s:I, s:I, s:s}", "kind",
		                              q4kh_f2_probe_name(r->selection->f2_probe_kind),
		                              "tokens", (json_int_t)r->selection->f2_probe_tokens,
		                              "positions",
		                              (json_int_t)r->selection->f2_probe_positions,
		                              "text", r->selection->f2_probe));
	if (o && r->sampling)
		json_object_set_new(o, "sampling", sampling_json(r->sampling));
	if (o && r->startup)
		json_object_set_new(
			o, "time_to_first_token",
			json_pack("{s:f, s:f, s:f, s:{s:f, s:f, s:f, s:f}}", "seconds",
			          r->startup->first_token, "startup_seconds",
			          startup_seconds(r->startup), "prefill_seconds", r->prefill_seconds,
			          "startup", "plugins_seconds", r->startup->plugins, "model_seconds",
			          r->startup->model, "choice_seconds", r->startup->choice,
			          "session_seconds", r->startup->session));
	if (o && r->selection->not_applicable[0])
		json_object_set_new(o, "not_applicable",
		                    json_string(r->selection->not_applicable));
	if (o && r->steps)
		json_object_set_new(
			o, "steps",
			json_pack("{s:s, s:s, s:o, s:I, s:I, s:I, s:I, s:s, s:s}", "mode",
			          step_mode(r->steps), "path",
			          q4kh_step_way_token(step_way(r->steps)), "paths",
			          ways_json(r->steps), "launches", (json_int_t)r->steps->launches,
			          "steps", (json_int_t)r->steps->steps, "replays",
			          (json_int_t)r->steps->replayed, "recordings",
			          (json_int_t)r->steps->recorded, "why_not",
			          r->steps->why_not, "kv_cache",
			          q4kh_type_name(r->steps->kv_type)));
	return o;
}
