#include "buildconf.h"

#include "serve_api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "serve_prompt.h"
#include "serve_text.h"

#define MAX_MESSAGES 4096

__attribute__((format(printf, 4, 5)))
static int refuse(struct serve_api_error *e, int status, const char *param,
                  const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	e->param = param;
	e->code = NULL;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -1;
}

static const char *type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	default: return "null";
	}
}

/* KEY of O as a number in [lo, hi] into *out when present and not null. */
static int number(const json_t *o, const char *key, double lo, double hi, double *out,
                  struct serve_api_error *e)
{
	const json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return refuse(e, 400, key, "'%s' must be a number from %g to %g, got %s", key, lo,
		              hi, type_name(v));
	*out = json_number_value(v);
	if (!(*out >= lo && *out <= hi))
		return refuse(e, 400, key, "'%s' must be a number from %g to %g, got %g", key, lo,
		              hi, *out);
	return 0;
}

/* KEY of O as a whole number in [lo, hi] into *out when present and not null. */
static int whole(const json_t *o, const char *key, json_int_t lo, json_int_t hi,
                 json_int_t *out, struct serve_api_error *e)
{
	const json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v))
		return refuse(e, 400, key, "'%s' must be a whole number from %lld to %lld, got %s",
		              key, (long long)lo, (long long)hi, type_name(v));
	*out = json_integer_value(v);
	if (*out < lo || *out > hi)
		return refuse(e, 400, key, "'%s' must be a whole number from %lld to %lld, got %lld",
		              key, (long long)lo, (long long)hi, (long long)*out);
	return 0;
}

static int boolean(const json_t *o, const char *key, int *out, struct serve_api_error *e)
{
	const json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return refuse(e, 400, key, "'%s' must be true or false, got %s", key, type_name(v));
	*out = json_is_true(v);
	return 0;
}

/*
 * Message K's content C: a string, or an array of {"type": "text", "text":
 * ...}. As OpenAI's API, only an assistant's (ROLE) may be missing or
 * null (a message that only called tools), read as empty.
 */
static int content_text(const json_t *c, size_t k, const char *role, char **out,
                        struct serve_api_error *e)
{
	size_t len = 0, i;
	const json_t *part;
	char *s;

	if ((!c || json_is_null(c)) && strcmp(role, "assistant"))
		return refuse(e, 400, "messages",
		              "messages[%zu].content is required for a %s message, got %s: expected "
		              "a string or an array of text parts",
		              k, role, c ? "null" : "nothing");
	if (!c || json_is_null(c)) {
		*out = strdup("");
	} else if (json_is_string(c)) {
		*out = strndup(json_string_value(c), json_string_length(c));
	} else if (json_is_array(c)) {
		json_array_foreach(c, i, part) {
			const json_t *t = json_object_get(part, "text");
			if (!json_is_object(part) ||
			    !json_is_string(json_object_get(part, "type")) ||
			    strcmp(json_string_value(json_object_get(part, "type")), "text") ||
			    !json_is_string(t))
				return refuse(e, 400, "messages",
				              "a message's content parts must be {\"type\": \"text\", \"text\": STRING}; this server takes text only");
			len += json_string_length(t);
		}
		s = malloc(len + 1);
		if (!s)
			return refuse(e, 500, NULL, "out of memory");
		len = 0;
		json_array_foreach(c, i, part) {
			const json_t *t = json_object_get(part, "text");
			memcpy(s + len, json_string_value(t), json_string_length(t));
			len += json_string_length(t);
		}
		s[len] = 0;
		*out = s;
	} else {
		return refuse(e, 400, "messages",
		              "a message's 'content' must be a string or an array of text parts, got %s",
		              type_name(c));
	}
	return *out ? 0 : refuse(e, 500, NULL, "out of memory");
}

/* The chat request's messages to token ids. */
static int chat_ids(const struct serve *srv, const json_t *root, struct serve_job *j,
                    struct serve_api_error *e)
{
	static const char *const roles[] = { "system", "developer", "user", "assistant" };
	const json_t *msgs = json_object_get(root, "messages"), *m;
	struct q4kh_chat_msg *cm;
	struct q4kh_error err = { { 0 } };
	char **texts;
	size_t n, i;
	int rc = -1;

	if (!json_is_array(msgs) || json_array_size(msgs) == 0)
		return refuse(e, 400, "messages", "'messages' must be a non-empty array, got %s",
		              !msgs                ? "nothing"
		              : json_is_array(msgs) ? "an empty array"
		                                    : type_name(msgs));
	n = json_array_size(msgs);
	if (n > MAX_MESSAGES)
		return refuse(e, 400, "messages", "'messages' holds %zu messages; at most %d", n,
		              MAX_MESSAGES);
	cm = calloc(n, sizeof(*cm));
	texts = calloc(n, sizeof(*texts));
	if (!cm || !texts) {
		refuse(e, 500, NULL, "out of memory");
		goto out;
	}
	json_array_foreach(msgs, i, m) {
		const json_t *role = json_object_get(m, "role");
		size_t r = 0;

		if (!json_is_object(m)) {
			refuse(e, 400, "messages", "messages[%zu] must be an object, got %s", i,
			       type_name(m));
			goto out;
		}
		while (r < 4 && (!json_is_string(role) ||
		                 strcmp(json_string_value(role), roles[r])))
			r++;
		if (r == 4) {
			refuse(e, 400, "messages",
			       "messages[%zu].role must be \"system\", \"developer\", \"user\" or \"assistant\"",
			       i);
			goto out;
		}
		if (content_text(json_object_get(m, "content"), i, roles[r], &texts[i], e))
			goto out;
		/* A developer message is OpenAI's newer name for a system one. */
		cm[i] = (struct q4kh_chat_msg){ roles[r == 1 ? 0 : r], texts[i] };
	}
	if (serve_prompt_chat(srv->gguf, srv->tok, cm, n, &j->ids, &j->n_ids, &err)) {
		refuse(e, 400, "messages", "the messages cannot be tokenized: %s", err.msg);
		goto out;
	}
	rc = 0;
out:
	for (i = 0; texts && i < n; i++)
		free(texts[i]);
	free(texts);
	free(cm);
	return rc;
}

static int completion_ids(const struct serve *srv, const json_t *root, struct serve_job *j,
                          struct serve_api_error *e)
{
	const json_t *p = json_object_get(root, "prompt");
	struct q4kh_error err = { { 0 } };

	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	if (!json_is_string(p))
		return refuse(e, 400, "prompt",
		              "'prompt' must be a string (or an array of one string), got %s",
		              p ? type_name(p) : "nothing");
	if (serve_prompt_text(srv->tok, json_string_value(p), json_string_length(p), &j->ids,
	                      &j->n_ids, &err))
		return refuse(e, 400, "prompt", "the prompt cannot be tokenized: %s", err.msg);
	return 0;
}

static int stops(const json_t *root, struct serve_job *j, struct serve_api_error *e)
{
	const json_t *s = json_object_get(root, "stop"), *v;
	size_t i;

	if (!s || json_is_null(s))
		return 0;
	if (json_is_string(s)) {
		j->stop[j->n_stop++] = strdup(json_string_value(s));
	} else if (json_is_array(s) && json_array_size(s) <= SERVE_MAX_STOP) {
		json_array_foreach(s, i, v) {
			if (!json_is_string(v))
				return refuse(e, 400, "stop", "'stop' must hold strings, got %s",
				              type_name(v));
			j->stop[j->n_stop++] = strdup(json_string_value(v));
		}
	} else {
		return refuse(e, 400, "stop", "'stop' must be a string or an array of at most %d strings",
		              SERVE_MAX_STOP);
	}
	for (i = 0; i < j->n_stop; i++) {
		if (!j->stop[i])
			return refuse(e, 500, NULL, "out of memory");
		if (!j->stop[i][0])
			return refuse(e, 400, "stop", "a stop string must not be empty");
	}
	return 0;
}

/* Sampling and limits, each field checked. */
static int settings(const struct serve *srv, const json_t *root, struct serve_job *j,
                    struct serve_api_error *e)
{
	const json_t *so = json_object_get(root, "stream_options");
	double temp = srv->o.defaults.temperature, top_p = srv->o.defaults.top_p;
	json_int_t top_k = srv->o.defaults.top_k, seed = (json_int_t)srv->o.defaults.seed,
	           n = 1, max = srv->o.max_tokens;
	int logprobs = 0, echo = 0;

	if (!srv->o.seed_set && getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
		seed = (json_int_t)serve_now();
	if (number(root, "temperature", 0, Q4KH_TEMPERATURE_MAX, &temp, e) || number(root, "top_p", 0, 1, &top_p, e) ||
	    whole(root, "top_k", 0, INT32_MAX, &top_k, e) ||
	    whole(root, "seed", INT64_MIN, INT64_MAX, &seed, e) ||
	    whole(root, "n", 1, 1, &n, e) ||
	    whole(root, "max_tokens", 1, srv->o.max_tokens, &max, e) ||
	    whole(root, "max_completion_tokens", 1, srv->o.max_tokens, &max, e) ||
	    boolean(root, "stream", &j->stream, e) || boolean(root, "logprobs", &logprobs, e) ||
	    boolean(root, "ignore_eos", &j->ignore_eos, e) ||
	    boolean(root, "echo", &echo, e) || stops(root, j, e))
		return -1;
	if (logprobs)
		return refuse(e, 400, "logprobs", "'logprobs' is not supported by this server");
	if (echo)
		return refuse(e, 400, "echo", "'echo' is not supported by this server");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so))
			return refuse(e, 400, "stream_options", "'stream_options' must be an object, got %s",
			              type_name(so));
		if (boolean(so, "include_usage", &j->include_usage, e))
			return -1;
	}
	j->sp = (struct q4kh_sampler_params){ (float)temp, (int32_t)top_k, (float)top_p,
		                              (uint64_t)seed };
	j->max_tokens = max;
	return 0;
}

/*
 * The column where the token of jansson's error E starts: jansson gives
 * that of the token's last byte ("'[' or '{' expected near 'not'" at
 * column 3 for a body "not..."), the token quoted at the end of its text.
 */
static int token_column(const json_error_t *e)
{
	const char *near = strstr(e->text, " near '");
	size_t len = strlen(e->text);

	if (!near || e->text[len - 1] != '\'' || e->column < 1)
		return e->column;
	len = (size_t)(e->text + len - 1 - (near + 7)); /* the token's bytes */
	return (size_t)e->column > len ? e->column - (int)len + 1 : 1;
}

int serve_api_parse(const struct serve *srv, enum serve_kind kind, const char *body,
                    size_t len, struct serve_job **out, struct serve_api_error *e)
{
	json_error_t jerr;
	json_t *root = json_loadb(body, len, 0, &jerr);
	const json_t *model;
	struct serve_job *j = NULL;
	size_t limit = srv->o.max_prompt > 0 && (size_t)srv->o.max_prompt < srv->n_ctx
	                       ? (size_t)srv->o.max_prompt
	                       : srv->n_ctx;
	int rc = -1;

	*out = NULL;
	if (!root && json_error_code(&jerr) == json_error_null_character) {
		/* jansson's text names its own flag (JSON_ALLOW_NUL) */
		refuse(e, 400, NULL, "a string in the body holds \\u0000, a NUL character, which "
		       "no prompt or field may contain (line %d, column %d)", jerr.line,
		       jerr.column);
		return -1;
	}
	if (!root) {
		refuse(e, 400, NULL, "the body is not JSON: %s (line %d, column %d)", jerr.text,
		       jerr.line, token_column(&jerr));
		return -1;
	}
	if (!json_is_object(root)) {
		refuse(e, 400, NULL, "the body must be a JSON object, got %s", type_name(root));
		goto out;
	}
	model = json_object_get(root, "model");
	if (model && !json_is_null(model) && !json_is_string(model)) {
		refuse(e, 400, "model", "'model' must be a string, got %s", type_name(model));
		goto out;
	}
	j = serve_job_new();
	if (!j) {
		refuse(e, 500, NULL, "out of memory");
		goto out;
	}
	j->kind = kind;
	if (settings(srv, root, j, e) ||
	    (kind == SERVE_CHAT ? chat_ids(srv, root, j, e) : completion_ids(srv, root, j, e)))
		goto out;
	if (j->n_ids == 0) {
		refuse(e, 400, kind == SERVE_CHAT ? "messages" : "prompt",
		       "the prompt tokenized to nothing");
		goto out;
	}
	if (j->n_ids > limit) {
		refuse(e, 400, kind == SERVE_CHAT ? "messages" : "prompt",
		       "the prompt is %zu tokens, more than the %zu this server takes", j->n_ids,
		       limit);
		e->code = "context_length_exceeded";
		goto out;
	}
	if (srv->o.kv_pages > 0 && serve_job_pages(srv, j) > srv->o.kv_pages) {
		/* it would wait for ever: the pool never holds it (auto's pool
		 * holds a whole context per slot, so any request) */
		refuse(e, 400, "max_tokens",
		       "this request needs %lld KV pages of %d tokens (its prompt's %zu tokens and "
		       "max_tokens %lld, at most the context's %u), more than the %ld this server "
		       "has (q4khost serve --kv-pages N raises it; a smaller max_tokens needs "
		       "fewer)", (long long)serve_job_pages(srv, j), Q4KH_PREFIX_BLOCK, j->n_ids,
		       (long long)j->max_tokens, srv->n_ctx, srv->o.kv_pages);
		e->code = "context_length_exceeded";
		goto out;
	}
	*out = j;
	j = NULL;
	rc = 0;
out:
	if (j) {
		j->refs = 1;
		serve_job_release(j);
	}
	json_decref(root);
	return rc;
}

static char *dump(json_t *o)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

char *serve_api_error_body(const char *message, const char *type, const char *param,
                           const char *code)
{
	return dump(json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", message, "type",
	                      type, "param", param ? json_string(param) : json_null(), "code",
	                      code ? json_string(code) : json_null()));
}

static json_t *usage(const struct serve_job *j)
{
	return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)j->n_ids,
	                 "completion_tokens", (json_int_t)j->n_gen, "total_tokens",
	                 (json_int_t)(j->n_ids + (size_t)j->n_gen));
}

/* What every body and event of J starts with; q4khost_f2 is its
 * X-Q4KHost-F2 header's value, so that a client that keeps bodies alone
 * still sees an answer F2 did not verify ("off; ... serves UNVERIFIED"). */
static json_t *head(const struct serve *srv, const struct serve_job *j, const char *object)
{
	char fp[300];

	snprintf(fp, sizeof(fp), "q4khost-%s %s", PACKAGE_VERSION, j->path_name);
	return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id", j->id, "object", object,
	                 "created", (json_int_t)j->created, "model", srv->model_id,
	                 "system_fingerprint", fp, "q4khost_f2", j->f2);
}

char *serve_api_response(const struct serve *srv, const struct serve_job *j)
{
	size_t len;
	char *text = serve_utf8_clean(j->text ? j->text : "", j->len, &len);
	json_t *o, *choice;

	if (!text)
		return NULL;
	if (j->kind == SERVE_CHAT) {
		o = head(srv, j, "chat.completion");
		choice = json_pack("{s:i, s:{s:s, s:s%}, s:n, s:s}", "index", 0, "message", "role",
		                   "assistant", "content", text, len, "logprobs", "finish_reason",
		                   j->finish);
	} else {
		o = head(srv, j, "text_completion");
		choice = json_pack("{s:s%, s:i, s:n, s:s}", "text", text, len, "index", 0,
		                   "logprobs", "finish_reason", j->finish);
	}
	free(text);
	if (o) {
		json_object_set_new(o, "choices", json_pack("[o]", choice));
		json_object_set_new(o, "usage", usage(j));
	} else {
		json_decref(choice);
	}
	return dump(o);
}

static char *event(json_t *o)
{
	char *body = dump(o), *ev = NULL;

	if (body && asprintf(&ev, "data: %s\n\n", body) < 0)
		ev = NULL;
	free(body);
	return ev;
}

char *serve_api_event(const struct serve *srv, const struct serve_job *j, int role,
                      const char *text, size_t len, const char *finish)
{
	json_t *o, *choice;

	if (j->kind == SERVE_CHAT) {
		json_t *delta = role ? json_pack("{s:s, s:s}", "role", "assistant", "content", "")
		                : finish ? json_object()
		                         : json_pack("{s:s%}", "content", text, len);
		o = head(srv, j, "chat.completion.chunk");
		choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", delta, "logprobs",
		                   "finish_reason", finish ? json_string(finish) : json_null());
	} else {
		o = head(srv, j, "text_completion");
		choice = json_pack("{s:s%, s:i, s:n, s:o}", "text", finish ? "" : text,
		                   finish ? 0 : len, "index", 0, "logprobs", "finish_reason",
		                   finish ? json_string(finish) : json_null());
	}
	if (!o) {
		json_decref(choice);
		return NULL;
	}
	json_object_set_new(o, "choices", json_pack("[o]", choice));
	return event(o);
}

char *serve_api_error_event(const char *message)
{
	return event(json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", message, "type",
	                       "server_error", "param", "code"));
}

char *serve_api_usage_event(const struct serve *srv, const struct serve_job *j)
{
	json_t *o = head(srv, j, j->kind == SERVE_CHAT ? "chat.completion.chunk" : "text_completion");

	if (!o)
		return NULL;
	json_object_set_new(o, "choices", json_array());
	json_object_set_new(o, "usage", usage(j));
	return event(o);
}

char *serve_api_models(const struct serve *srv)
{
	return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id",
	                      srv->model_id, "object", "model", "created",
	                      (json_int_t)srv->started, "owned_by", "q4khost"));
}
