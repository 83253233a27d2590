/*
 * The OpenAI API's bodies: requests of /v1/chat/completions and
 * /v1/completions into jobs, with every field checked (a wrong type or a
 * value out of range is a 4xx naming the field), and jobs into response
 * bodies and server-sent events. Thread-safe.
 */
#ifndef Q4KH_SERVE_API_H
#define Q4KH_SERVE_API_H

#include <jansson.h>
#include <stddef.h>

#include "serve.h"

/* Why a request is refused: an HTTP status and the error body's fields. */
struct serve_api_error {
	int status;
	char message[512];
	const char *param; /* the field at fault, or NULL */
	const char *code;  /* "model_not_found", ..., or NULL */
};

/*
 * BODY (LEN bytes) of a KIND request into a new job, prompt tokenized, not
 * yet queued: 0 with *out, or -1 with *e filled.
 */
int serve_api_parse(const struct serve *srv, enum serve_kind kind, const char *body,
                    size_t len, struct serve_job **out, struct serve_api_error *e);

/* The error body, malloc()ed JSON. TYPE: OpenAI's error type. */
char *serve_api_error_body(const char *message, const char *type, const char *param,
                           const char *code);

/* The whole answer of a finished job J (not streamed), malloc()ed JSON. */
char *serve_api_response(const struct serve *srv, const struct serve_job *j);

/*
 * One server-sent event of a streamed job: the opening one (ROLE set, chat
 * only), a piece of text (TEXT, LEN bytes of valid UTF-8), or the closing
 * one (FINISH set). malloc()ed "data: {...}\n\n"; NULL on out of memory.
 */
char *serve_api_event(const struct serve *srv, const struct serve_job *j, int role,
                      const char *text, size_t len, const char *finish);
/* An error event: the answer ends without a finish reason. */
char *serve_api_error_event(const char *message);
/* The usage event (stream_options.include_usage). */
char *serve_api_usage_event(const struct serve *srv, const struct serve_job *j);

/* GET /v1/models, malloc()ed JSON. */
char *serve_api_models(const struct serve *srv);

#endif
