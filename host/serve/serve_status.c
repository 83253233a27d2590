/*
 * What serve says about itself: GET /health (JSON: what serves the device,
 * every F2 verdict with its source, whether a validation runs, shadow
 * parity, slots and queue) and GET /metrics (Prometheus text format 0.0.4).
 */
#include "serve.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "report.h"

static const unsigned codes[] = { 200, 400, 401, 404, 405, 413, 415, 500, 503 };
#define N_CODES (sizeof(codes) / sizeof(codes[0]))
static const char *const endpoints[] = { "/v1/chat/completions", "/v1/completions",
	                                 "/v1/models", "/health", "/metrics", "other" };
/* q4khost_rejected_total's reasons, by enum serve_reject. */
static const char *const reject_names[SERVE_REJECT_N] = { "queue_full", "connections",
	                                                  "draining", "no_path" };
/* Upper bounds of the time-to-first-token histogram, seconds. */
static const double ttft_le[] = { 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120 };

enum serve_endpoint serve_status_endpoint(const char *path)
{
	for (int i = 0; i < SERVE_EP_OTHER; i++)
		if (!strcmp(path, endpoints[i]))
			return (enum serve_endpoint)i;
	return SERVE_EP_OTHER;
}

void serve_status_count(struct serve *srv, enum serve_endpoint ep, unsigned code)
{
	size_t c = 0;

	while (c < N_CODES && codes[c] != code)
		c++;
	pthread_mutex_lock(&srv->lock);
	srv->m.requests[ep][c]++; /* c == N_CODES: any other code */
	pthread_mutex_unlock(&srv->lock);
}

void serve_status_reject(struct serve *srv, enum serve_reject reason)
{
	srv->m.rejected[reason]++;
}

void serve_status_ttft(struct serve *srv, double seconds)
{
	for (size_t i = 0; i < sizeof(ttft_le) / sizeof(ttft_le[0]); i++)
		if (seconds <= ttft_le[i])
			srv->m.ttft_buckets[i]++;
	srv->m.ttft_count++;
	srv->m.ttft_sum += seconds;
}

static int busy_slots(const struct serve *srv)
{
	int busy = 0;

	for (int i = 0; i < srv->n_slots; i++)
		busy += srv->slots[i] != NULL;
	return busy;
}

/* What serves: run's report of the path, less the timings of a run. */
static json_t *path_json(const struct serve *srv, const struct serve_path *p)
{
	struct q4kh_report rep = { 0 };
	json_t *o;

	rep.model_path = srv->model_path;
	rep.model = p->m;
	rep.backend = p->be;
	rep.selection = &p->sel;
	rep.registry = srv->registry;
	rep.device_index = p->cand.device;
	rep.chat_template = q4kh_chat_name(q4kh_chat_detect(srv->gguf));
	rep.stop_reason = "";
	o = q4kh_report_json(&rep);
	if (!o)
		return NULL;
	json_object_del(o, "prefill");
	json_object_del(o, "decode");
	json_object_del(o, "stop");
	json_object_set_new(o, "path", json_string(p->name));
	json_object_set_new(o, "unverified", json_boolean(p->unverified));
	return o;
}

/* Why nothing serves, with srv->cur NULL (srv->lock held). */
static const char *unavailable(const struct serve *srv)
{
	return srv->unavailable[0] ? srv->unavailable : "no validated path serves";
}

/* Ready (srv->lock held): 1, or 0 with why in WHY. */
static int ready(const struct serve *srv, char *why, size_t cap)
{
	if (srv->draining)
		snprintf(why, cap, "not ready: draining");
	else if (!srv->cur)
		snprintf(why, cap, "not ready: %s", unavailable(srv));
	else if (srv->cur->unverified)
		snprintf(why, cap, "not ready: F2 is off and %s serves unverified", srv->cur->name);
	else {
		why[0] = 0;
		return 1;
	}
	return 0;
}

char *serve_status_health(struct serve *srv, char *why, size_t cap)
{
	json_t *root, *verdicts = json_array(), *switches = json_array(), *dev;
	char *out;
	int ok;

	pthread_mutex_lock(&srv->lock);
	for (int i = 0; i < srv->n_verdicts; i++) {
		const struct serve_verdict *v = &srv->verdicts[i];
		json_array_append_new(verdicts, json_pack("{s:s, s:s, s:s, s:s}", "path", v->path,
		                                          "verdict", v->verdict, "source",
		                                          v->source, "message", v->message));
	}
	for (int i = 0; i < srv->n_switches; i++) {
		const struct serve_switch *s = &srv->switches[i];
		json_array_append_new(switches, json_pack("{s:s, s:s, s:s, s:s}", "at", s->at,
		                                          "from", s->from, "to", s->to, "reason",
		                                          s->reason));
	}
	dev = json_pack("{s:s, s:i, s:o, s:o}", "backend",
	                srv->cur ? srv->cur->cand.backend : (srv->rq.backend ? srv->rq.backend : ""),
	                "device", (int)srv->rq.device, "serving",
	                srv->cur ? path_json(srv, srv->cur) : json_null(), "validation",
	                srv->validating[0] ? json_pack("{s:b, s:s}", "running", 1, "candidate",
	                                               srv->validating)
	                                   : json_pack("{s:b}", "running", 0));
	ok = ready(srv, why, cap);
	root = json_pack("{s:s, s:b, s:s, s:s, s:{s:s, s:s, s:b}, s:[o], s:o, s:o, s:o, "
	                 "s:{s:i, s:i}, s:I}",
	                 "status", srv->draining ? "draining" : srv->cur ? "ok" : "unavailable",
	                 "ready", ok, "model", srv->model_id, "model_path", srv->model_path, "f2", "mode",
	                 q4kh_f2_mode_name(srv->mode), "mode_origin", srv->mode_origin,
	                 "unverified", srv->cur && srv->cur->unverified, "devices", dev,
	                 "verdicts", verdicts, "switches", switches, "shadow",
	                 serve_shadow_json(srv), "slots", "total", srv->n_slots, "busy",
	                 busy_slots(srv), "queue_depth", (json_int_t)srv->q_len);
	/* why nothing serves and what the operator must do; null while a
	 * path serves */
	if (root)
		json_object_set_new(root, "unavailable",
		                    srv->cur ? json_null() : json_string(unavailable(srv)));
	/* the current path's KV pages; null where its slots have a cache each */
	if (root)
		json_object_set_new(root, "kv_pages",
		                    srv->pages.total ? json_pack("{s:i, s:i, s:i, s:i}", "total",
		                                                 srv->pages.total, "free",
		                                                 srv->pages.free, "shared",
		                                                 srv->pages.shared, "page_tokens",
		                                                 Q4KH_PREFIX_BLOCK)
		                                     : json_null());
	pthread_mutex_unlock(&srv->lock);
	out = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
	json_decref(root);
	return out;
}

/* A growing text buffer for the metrics page. */
struct text {
	char *s;
	size_t len, cap;
	int oom;
};

__attribute__((format(printf, 2, 3)))
static void put(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < t->cap - t->len) {
			t->len += (size_t)n;
			return;
		}
		char *s = realloc(t->s, t->cap * 2 + (size_t)n + 1);
		if (!s) {
			t->oom = 1;
			return;
		}
		t->s = s;
		t->cap = t->cap * 2 + (size_t)n + 1;
	}
}

static void metric(struct text *t, const char *name, const char *type, const char *help)
{
	put(t, "# HELP q4khost_%s %s\n# TYPE q4khost_%s %s\n", name, help, name, type);
}

char *serve_status_metrics(struct serve *srv)
{
	struct text t = { malloc(8192), 0, 8192, 0 };
	const struct serve_metrics *m = &srv->m;

	if (!t.s)
		return NULL;
	pthread_mutex_lock(&srv->lock);
	/* prefix reuse (docs/serve.md, section 5) */
	const struct {
		const char *name, *help;
		uint64_t value;
	} prefix[] = {
		{ "prefix_lookups_total",
		  "Requests whose prompt start was looked up in the slots' caches (--prefix-cache).",
		  m->prefix_lookups },
		{ "prefix_hits_total", "Of those, requests that reused at least one block of their prompt.",
		  m->prefix_hits },
		{ "prefix_blocks_reused_total", "Blocks of 16 prompt tokens reused instead of computed.",
		  m->prefix_blocks },
		{ "prefix_tokens_reused_total", "Prompt tokens reused instead of computed.",
		  m->prefix_tokens },
		{ "prefix_tokens_copied_total",
		  "Of those, tokens whose keys and values were copied from another slot's cache.",
		  m->prefix_copied },
		{ "prefix_tokens_shared_total",
		  "Of those, tokens whose pages another slot's cache holds, shared instead of copied (--kv-pages).",
		  m->prefix_shared },
	};
	/* the current path's KV pages (--kv-pages; 0 where its slots have a cache each) */
	const struct {
		const char *name, *help;
		int32_t value;
	} pages[] = {
		{ "kv_pages_total", "KV pages of 16 tokens the slots share (--kv-pages; 0: a cache per slot).",
		  srv->pages.total },
		{ "kv_pages_free", "Of those, pages no slot holds.", srv->pages.free },
		{ "kv_pages_shared", "Of those, pages more than one slot holds (a prefix, shared).",
		  srv->pages.shared },
	};
	metric(&t, "requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
	for (size_t e = 0; e < sizeof(endpoints) / sizeof(endpoints[0]); e++)
		for (size_t c = 0; c <= N_CODES; c++)
			if (m->requests[e][c]) {
				if (c < N_CODES)
					put(&t, "q4khost_requests_total{endpoint=\"%s\",code=\"%u\"} %llu\n",
					    endpoints[e], codes[c], (unsigned long long)m->requests[e][c]);
				else
					put(&t, "q4khost_requests_total{endpoint=\"%s\",code=\"other\"} %llu\n",
					    endpoints[e], (unsigned long long)m->requests[e][c]);
			}
	metric(&t, "prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
	put(&t, "q4khost_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
	metric(&t, "completion_tokens_total", "counter", "Answer tokens of finished requests.");
	put(&t, "q4khost_completion_tokens_total %llu\n", (unsigned long long)m->completion_tokens);
	metric(&t, "decode_seconds_total", "counter",
	       "Seconds from each request's first token to its end, summed.");
	put(&t, "q4khost_decode_seconds_total %.6f\n", m->decode_seconds);
	metric(&t, "tokens_per_second", "gauge",
	       "Answer tokens per second of decode, per request, over all finished requests.");
	put(&t, "q4khost_tokens_per_second %.3f\n",
	    m->decode_seconds > 0 ? (double)m->completion_tokens / m->decode_seconds : 0.0);
	metric(&t, "queue_depth", "gauge", "Requests waiting for a slot.");
	put(&t, "q4khost_queue_depth %zu\n", srv->q_len);
	metric(&t, "queue_limit", "gauge", "Requests that may wait for a slot (--max-queue).");
	put(&t, "q4khost_queue_limit %ld\n", srv->o.max_queue);
	metric(&t, "connections", "gauge",
	       "Connections open to libmicrohttpd, each a thread (at most --max-connections).");
	put(&t, "q4khost_connections %ld\n", __atomic_load_n(&srv->conns, __ATOMIC_RELAXED));
	metric(&t, "connections_limit", "gauge", "--max-connections.");
	put(&t, "q4khost_connections_limit %ld\n", srv->o.max_connections);
	metric(&t, "rejected_total", "counter",
	       "Requests answered 503 with nothing generated, by reason (no_path: without Retry-After).");
	for (int r = 0; r < SERVE_REJECT_N; r++)
		put(&t, "q4khost_rejected_total{reason=\"%s\"} %llu\n", reject_names[r],
		    (unsigned long long)m->rejected[r]);
	metric(&t, "batched_steps_total", "counter",
	       "Steps that ran several requests' tokens at once.");
	put(&t, "q4khost_batched_steps_total %llu\n", (unsigned long long)m->batched_steps);
	metric(&t, "batched_tokens_total", "counter", "Answer tokens those batched steps made.");
	put(&t, "q4khost_batched_tokens_total %llu\n", (unsigned long long)m->batched_tokens);
	metric(&t, "mixed_steps_total", "counter",
	       "Batched steps that carried prompt chunks beside other requests' tokens.");
	put(&t, "q4khost_mixed_steps_total %llu\n", (unsigned long long)m->mixed_steps);
	metric(&t, "batched_prompt_tokens_total", "counter",
	       "Prompt tokens that ran in batched steps.");
	put(&t, "q4khost_batched_prompt_tokens_total %llu\n",
	    (unsigned long long)m->batched_prompt_tokens);
	metric(&t, "steps_total", "counter",
	       "Forward steps by the path they took: op_by_op and replay (the host's interpreter "
	       "and its recording), graph_nodes, graph_replay and graph_persistent (the backend's "
	       "graph entry).");
	for (int w = 0; w < Q4KH_WAY_COUNT; w++)
		put(&t, "q4khost_steps_total{path=\"%s\"} %llu\n", q4kh_step_way_token(w),
		    (unsigned long long)m->steps_by_path[w]);
	for (size_t i = 0; i < sizeof(prefix) / sizeof(prefix[0]); i++) {
		metric(&t, prefix[i].name, "counter", prefix[i].help);
		put(&t, "q4khost_%s %llu\n", prefix[i].name, (unsigned long long)prefix[i].value);
	}
	for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++) {
		metric(&t, pages[i].name, "gauge", pages[i].help);
		put(&t, "q4khost_%s %d\n", pages[i].name, pages[i].value);
	}
	metric(&t, "kv_page_waits_total", "counter",
	       "Times the request at the queue's head waited for KV pages (--kv-pages) with a slot free.");
	put(&t, "q4khost_kv_page_waits_total %llu\n", (unsigned long long)m->page_waits);
	metric(&t, "slots_busy", "gauge", "Slots generating now.");
	put(&t, "q4khost_slots_busy %d\n", busy_slots(srv));
	metric(&t, "slots", "gauge", "Slots (requests generated at once).");
	put(&t, "q4khost_slots %d\n", srv->n_slots);
	metric(&t, "time_to_first_token_seconds", "histogram",
	       "Seconds from a request's arrival in the queue to its first token.");
	for (size_t i = 0; i < sizeof(ttft_le) / sizeof(ttft_le[0]); i++)
		put(&t, "q4khost_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n", ttft_le[i],
		    (unsigned long long)m->ttft_buckets[i]);
	put(&t, "q4khost_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n",
	    (unsigned long long)m->ttft_count);
	put(&t, "q4khost_time_to_first_token_seconds_sum %.6f\n", m->ttft_sum);
	put(&t, "q4khost_time_to_first_token_seconds_count %llu\n",
	    (unsigned long long)m->ttft_count);
	metric(&t, "f2_verdicts_total", "counter",
	       "F2 verdicts taken from receipts or measured in the background, by verdict.");
	put(&t, "q4khost_f2_verdicts_total{verdict=\"pass\"} %llu\n", (unsigned long long)m->f2_pass);
	put(&t, "q4khost_f2_verdicts_total{verdict=\"reject\"} %llu\n",
	    (unsigned long long)m->f2_reject);
	put(&t, "q4khost_f2_verdicts_total{verdict=\"other\"} %llu\n", (unsigned long long)m->f2_other);
	metric(&t, "f2_validation_running", "gauge", "1 while F2 measures a candidate in the background.");
	put(&t, "q4khost_f2_validation_running %d\n", srv->validating[0] != 0);
	metric(&t, "f2_unverified", "gauge", "1 when F2 is off and the serving path is unverified.");
	put(&t, "q4khost_f2_unverified %d\n", srv->cur && srv->cur->unverified);
	metric(&t, "fallbacks_total", "counter",
	       "Times a preferred path was rejected (a receipt, background F2, or shadow parity) and a lesser one served.");
	put(&t, "q4khost_fallbacks_total %llu\n", (unsigned long long)m->fallbacks);
	metric(&t, "path_switches_total", "counter", "Switches of the serving path.");
	put(&t, "q4khost_path_switches_total %llu\n", (unsigned long long)m->switches);
	metric(&t, "shadow_checks_total", "counter", "Shadow parity checks of served requests, by verdict.");
	put(&t, "q4khost_shadow_checks_total{verdict=\"pass\"} %llu\n",
	    (unsigned long long)m->shadow_pass);
	put(&t, "q4khost_shadow_checks_total{verdict=\"reject\"} %llu\n",
	    (unsigned long long)m->shadow_reject);
	put(&t, "q4khost_shadow_checks_total{verdict=\"not measured\"} %llu\n",
	    (unsigned long long)m->shadow_other);
	metric(&t, "shadow_dropped_total", "counter", "Sampled requests dropped because the shadow queue was full.");
	put(&t, "q4khost_shadow_dropped_total %llu\n", (unsigned long long)m->shadow_dropped);
	pthread_mutex_unlock(&srv->lock);
	if (t.oom) {
		free(t.s);
		return NULL;
	}
	return t.s;
}
