/*
 * HTTP through GNU libmicrohttpd, one thread per connection (the
 * connection's thread may then wait for the engine, and a stream's reader
 * may block until the next token): routing, the API key, limits on body
 * size and idle time, server-sent events, and noticing a client that
 * left (its generation is cancelled). serve_accept.c accepts the
 * connections and hands them over.
 */
#include "serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve_api.h"
#include "serve_text.h"

#define WAIT_NS (200 * 1000 * 1000) /* between looks for a client that left */
#define KEEPALIVE_S 10.0            /* an SSE comment after this much silence */
/* Open files a server needs besides its connections: the model, plugins,
 * receipts, the log, a validation child's pipes. */
#define SPARE_FILES 128
/* Connections closed for serve_accept.c's count but not yet for
 * libmicrohttpd's, which may then hold that many past --max-connections. */
#define CLOSING 64

/* One request: its body while it arrives, and its access-log line's parts. */
struct request {
	enum serve_endpoint ep;
	char *body;
	size_t len, cap;
	int too_large;
	double t0;           /* when its headers were read */
	char method[16];     /* printable, cut */
	char path[200];      /* printable, cut */
	char client[64];     /* the peer's address */
	unsigned status;     /* the status sent; 0: none yet */
	int no_retry;        /* a 503 without Retry-After: nothing serves until a
	                        restart, or /health's state, which no retry changes */
	char reason[1200];   /* why, in the log's words */
	int routed;          /* on_request has seen it */
};

/* What libmicrohttpd last said on this connection's thread (one thread a
 * connection): why it refused a request it answered itself. */
static __thread char mhd_said[300];

/* A streamed answer, owned by its MHD response. */
struct stream {
	struct serve *srv;
	struct serve_job *job;
	int fd;
	char *out;          /* event bytes not yet handed to MHD */
	size_t len, off;
	size_t sent;        /* job text turned into events */
	int64_t tokens;     /* answer tokens an event has shown */
	int opened, closed; /* the first and the last event made */
	double last;        /* when bytes were last handed over */
};

/* A client that closed its end (or reset it) reads as 0 bytes or an error. */
static int client_gone(int fd)
{
	char b;
	ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The client's address, numeric, into BUF ("?" when unknown). */
static void peer(struct MHD_Connection *c, char *buf, size_t cap)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *a = ci ? ci->client_addr : NULL;
	socklen_t len = a && a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
	                                             : sizeof(struct sockaddr_in);

	if (!a || getnameinfo(a, len, buf, cap, NULL, 0, NI_NUMERICHOST))
		snprintf(buf, cap, "?");
}

static int conn_fd(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);

	return ci ? ci->connect_fd : -1;
}

/* What RQ's access line will say: STATUS and why (printf's FMT). */
__attribute__((format(printf, 3, 4)))
static void note(struct request *rq, unsigned status, const char *fmt, ...)
{
	va_list ap;

	rq->status = status;
	va_start(ap, fmt);
	vsnprintf(rq->reason, sizeof(rq->reason), fmt, ap);
	va_end(ap);
}

/* Nothing can be sent: the access line says why; MHD closes the connection. */
static enum MHD_Result out_of_memory(struct request *rq, const char *what)
{
	note(rq, 500, "out of memory for %s; the connection was closed unanswered", what);
	return MHD_NO;
}

/*
 * Queue BODY (malloc()ed, taken) with STATUS and the headers every answer
 * has, for RQ; REASON is its access line's ("ok" when NULL).
 */
static enum MHD_Result reply(struct serve *srv, struct MHD_Connection *c, struct request *rq,
                             unsigned status, char *body, const char *type, const char *f2,
                             const char *served_by, const char *reason)
{
	const enum serve_endpoint ep = rq->ep;
	struct MHD_Response *r;
	char f2buf[400], shown[400];
	enum MHD_Result rc;

	if (!body)
		return out_of_memory(rq, "the answer");
	r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return out_of_memory(rq, "the answer");
	}
	if (!f2) {
		serve_path_current_f2(srv, f2buf, sizeof(f2buf));
		f2 = f2buf;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, "X-Q4KHost-F2", f2);
	if (served_by)
		MHD_add_response_header(r, "X-Q4KHost-Served-By",
		                        q4kh_show(shown, sizeof(shown), served_by,
		                                  strlen(served_by), 300, 1));
	if (status == 503 || status == 413)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	if (status == 503 && !rq->no_retry)
		MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, SERVE_RETRY_AFTER);
	if (status == 401)
		MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	if (status == 405)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
		                        ep == SERVE_EP_CHAT || ep == SERVE_EP_COMPLETIONS ? "POST"
		                                                                          : "GET, HEAD");
	rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	serve_status_count(srv, ep, status);
	note(rq, status, "%s%s", reason ? reason : "ok",
	     status != 503  ? ""
	     : rq->no_retry ? " (no Retry-After)"
	                    : " (Retry-After: " SERVE_RETRY_AFTER " s)");
	return rc;
}

static enum MHD_Result fail(struct serve *srv, struct MHD_Connection *c, struct request *rq,
                            unsigned status, const char *message, const char *param,
                            const char *code)
{
	const char *type = status == 401   ? "authentication_error"
	                   : status == 404 ? "not_found_error"
	                   : status >= 500 ? "server_error"
	                                   : "invalid_request_error";

	return reply(srv, c, rq, status, serve_api_error_body(message, type, param, code),
	             "application/json", NULL, NULL, message);
}

/* 413, naming the limit and the option that raises it. */
static enum MHD_Result too_large(struct serve *srv, struct MHD_Connection *c,
                                 struct request *rq)
{
	char message[160];

	snprintf(message, sizeof(message), "the body is larger than this server takes: %ld "
	         "bytes at most (q4khost serve --max-body BYTES raises the limit)", srv->o.max_body);
	return fail(srv, c, rq, 413, message, NULL, NULL);
}

/* Compare in time that does not depend on where the strings differ. */
static int same_secret(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = la != lb;

	for (size_t i = 0; i < la; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)b[i % (lb ? lb : 1)];
	return d == 0;
}

static int authorized(struct serve *srv, struct MHD_Connection *c)
{
	const char *h;

	if (!srv->api_key[0])
		return 1;
	h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncasecmp(h, "Bearer ", 7))
		return 0;
	h += 7;
	while (*h == ' ')
		h++;
	return same_secret(h, srv->api_key);
}

/*
 * The request's Content-Type when it says the body is not JSON; NULL for
 * application/json (any parameters) and for none, which is taken as JSON
 * (docs/serve.md, section 2).
 */
static const char *not_json(struct MHD_Connection *c)
{
	static const char json[] = "application/json";
	const char *t = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
	                                            MHD_HTTP_HEADER_CONTENT_TYPE);
	size_t n = t ? strcspn(t, "; \t") : 0;

	if (!n || (n == sizeof(json) - 1 && !strncasecmp(t, json, n)))
		return NULL;
	return t;
}

/* 415 for a body whose Content-Type T is not JSON, with the fix for curl -d. */
static enum MHD_Result not_json_reply(struct serve *srv, struct MHD_Connection *c,
                                      struct request *rq, const char *t)
{
	char shown[200], message[600];

	q4kh_show(shown, sizeof(shown), t, strlen(t), 120, 1);
	snprintf(message, sizeof(message),
	         "Content-Type '%s' is not JSON: expected application/json, or no Content-Type "
	         "(curl -d sends application/x-www-form-urlencoded: add -H 'Content-Type: "
	         "application/json')",
	         shown);
	return fail(srv, c, rq, 415, message, NULL, "unsupported_media_type");
}

/* Wait for news of J (srv->lock held), WAIT_NS at most. */
static void wait_a_while(struct serve_job *j, struct serve *srv)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += WAIT_NS;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_cond_timedwait(&j->cv, &srv->lock, &ts);
}

/*
 * Wait until J leaves state UNTIL's predecessors (J is QUEUED or RUNNING
 * and UNTIL is RUNNING or DONE); 0, or -1 when the client left first (J is
 * then cancelled).
 */
static int wait_for(struct serve *srv, struct serve_job *j, enum serve_state until, int fd)
{
	pthread_mutex_lock(&srv->lock);
	while (j->state < until) {
		wait_a_while(j, srv);
		if (j->state >= until)
			break;
		pthread_mutex_unlock(&srv->lock);
		if (fd >= 0 && client_gone(fd)) {
			pthread_mutex_lock(&srv->lock);
			j->cancel = 1;
			pthread_cond_signal(&srv->work);
			pthread_mutex_unlock(&srv->lock);
			return -1;
		}
		pthread_mutex_lock(&srv->lock);
	}
	pthread_mutex_unlock(&srv->lock);
	return 0;
}

static void release(struct serve *srv, struct serve_job *j)
{
	pthread_mutex_lock(&srv->lock);
	serve_job_release(j);
	pthread_mutex_unlock(&srv->lock);
}

/* Append EV (malloc()ed, taken) to S's output; -1 on out of memory. */
static int put(struct stream *s, char *ev)
{
	size_t n;
	char *out;

	if (!ev)
		return -1;
	n = strlen(ev);
	if (s->off == s->len) {
		free(s->out);
		s->out = ev;
		s->len = n;
		s->off = 0;
		return 0;
	}
	out = realloc(s->out, s->len + n + 1);
	if (!out) {
		free(ev);
		return -1;
	}
	memcpy(out + s->len, ev, n + 1);
	s->out = out;
	s->len += n;
	free(ev);
	return 0;
}

/*
 * The next events of S's job into S->out (lock held): the opening one,
 * new text, the closing ones. 1 when something was added, 0 when there is
 * nothing yet, -1 on out of memory.
 */
static int next_events(struct stream *s)
{
	struct serve_job *j = s->job;
	struct serve *srv = s->srv;

	if (!s->opened) {
		s->opened = 1;
		if (j->kind == SERVE_CHAT)
			return put(s, serve_api_event(srv, j, 1, NULL, 0, NULL)) ? -1 : 1;
	}
	/* An event whenever tokens were made since the last one, its text
	 * empty while their bytes are held back (part of a UTF-8 character,
	 * or maybe of a stop string): a client sees the answer progress, as
	 * from other OpenAI-compatible servers. */
	if (j->ready > s->sent || j->n_gen > s->tokens) {
		size_t n = 0;
		char *text = j->ready > s->sent
		                     ? serve_utf8_clean(j->text + s->sent, j->ready - s->sent, &n)
		                     : strdup("");
		int rc = text ? put(s, serve_api_event(srv, j, 0, text, n, NULL)) : -1;

		free(text);
		s->sent = j->ready;
		s->tokens = j->n_gen;
		return rc ? -1 : 1;
	}
	if (j->state != SERVE_DONE || s->closed)
		return 0;
	s->closed = 1;
	if (j->error[0])
		return put(s, serve_api_error_event(j->error)) || put(s, strdup("data: [DONE]\n\n"))
		               ? -1
		               : 1;
	if (put(s, serve_api_event(srv, j, 0, NULL, 0, j->finish)) ||
	    (j->include_usage && put(s, serve_api_usage_event(srv, j))) ||
	    put(s, strdup("data: [DONE]\n\n")))
		return -1;
	return 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *s = cls;
	struct serve *srv = s->srv;

	(void)pos;
	for (;;) {
		int rc;

		if (s->off < s->len) {
			size_t n = s->len - s->off < max ? s->len - s->off : max;
			memcpy(buf, s->out + s->off, n);
			s->off += n;
			s->last = serve_now();
			return (ssize_t)n;
		}
		if (s->closed)
			return MHD_CONTENT_READER_END_OF_STREAM;
		pthread_mutex_lock(&srv->lock);
		rc = next_events(s);
		if (rc == 0) {
			wait_a_while(s->job, srv);
			rc = next_events(s);
		}
		pthread_mutex_unlock(&srv->lock);
		if (rc < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (rc == 0 && client_gone(s->fd))
			return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free cancels */
		if (rc == 0 && serve_now() - s->last > KEEPALIVE_S &&
		    put(s, strdup(": keep-alive\n\n")))
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
}

static void stream_free(void *cls)
{
	struct stream *s = cls;

	pthread_mutex_lock(&s->srv->lock);
	if (s->job->state != SERVE_DONE) {
		s->job->cancel = 1;
		pthread_cond_signal(&s->srv->work);
	}
	serve_job_release(s->job);
	s->srv->streams--;
	pthread_mutex_unlock(&s->srv->lock);
	free(s->out);
	free(s);
}

static enum MHD_Result start_stream(struct serve *srv, struct MHD_Connection *c,
                                    struct request *rq, struct serve_job *j, int fd)
{
	struct stream *s = calloc(1, sizeof(*s));
	struct MHD_Response *r;
	char shown[400];
	enum MHD_Result rc;

	if (!s) {
		release(srv, j);
		return out_of_memory(rq, "a stream");
	}
	*s = (struct stream){ .srv = srv, .job = j, .fd = fd, .last = serve_now() };
	pthread_mutex_lock(&srv->lock);
	srv->streams++; /* stream_free counts it out */
	pthread_mutex_unlock(&srv->lock);
	r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
	if (!r) {
		stream_free(s);
		return out_of_memory(rq, "a stream");
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	MHD_add_response_header(r, "X-Q4KHost-F2", j->f2);
	MHD_add_response_header(r, "X-Q4KHost-Served-By",
	                        q4kh_show(shown, sizeof(shown), j->served_by,
	                                  strlen(j->served_by), 300, 1));
	rc = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	serve_status_count(srv, rq->ep, 200);
	note(rq, 200, "%s, streamed", j->id);
	return rc;
}

/* POST /v1/chat/completions and /v1/completions. */
static enum MHD_Result generate(struct serve *srv, struct MHD_Connection *c,
                                struct request *rq)
{
	struct serve_api_error e = { 0 };
	struct serve_job *j;
	int status, fd = conn_fd(c);
	enum MHD_Result rc;

	if (serve_api_parse(srv, rq->ep == SERVE_EP_CHAT ? SERVE_CHAT : SERVE_COMPLETION,
	                    rq->body ? rq->body : "", rq->len, &j, &e))
		return fail(srv, c, rq, (unsigned)e.status, e.message, e.param, e.code);
	status = serve_engine_submit(srv, j);
	if (status) {
		rq->no_retry = j->for_good;
		rc = fail(srv, c, rq, (unsigned)status, j->error, NULL, NULL);
		release(srv, j);
		return rc;
	}
	if (wait_for(srv, j, j->stream ? SERVE_RUNNING : SERVE_DONE, fd)) {
		/* Nobody to answer: MHD_NO closes the connection, and the
		 * access line, not MHD's "internal error", says why. */
		note(rq, 499, "the client closed the connection before the answer; %s was "
		     "cancelled", j->id);
		release(srv, j);
		serve_status_count(srv, rq->ep, 499); /* counted as "other" */
		return MHD_NO;
	}
	pthread_mutex_lock(&srv->lock);
	status = j->error[0] && j->state == SERVE_DONE ? j->http_status : 0;
	rq->no_retry = j->for_good;
	pthread_mutex_unlock(&srv->lock);
	if (status) {
		rc = fail(srv, c, rq, (unsigned)status, j->error, NULL, NULL);
		release(srv, j);
		return rc;
	}
	if (j->stream)
		return start_stream(srv, c, rq, j, fd);
	rc = reply(srv, c, rq, 200, serve_api_response(srv, j), "application/json", j->f2,
	           j->served_by, j->id);
	release(srv, j);
	return rc;
}

static enum MHD_Result route(struct serve *srv, struct MHD_Connection *c,
                             struct request *rq, const char *method)
{
	const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
	const int post = !strcmp(method, "POST");

	if (rq->ep == SERVE_EP_OTHER)
		return fail(srv, c, rq, 404, "no such endpoint", NULL, NULL);
	if ((rq->ep <= SERVE_EP_COMPLETIONS && !post) || (rq->ep > SERVE_EP_COMPLETIONS && !get))
		return fail(srv, c, rq, 405, "method not allowed here", NULL, NULL);
	if (rq->ep == SERVE_EP_HEALTH) {
		char why[1000] = "";
		char *body = serve_status_health(srv, why, sizeof(why));

		/* a balancer's and Kubernetes' readiness read the status */
		rq->no_retry = 1;
		return reply(srv, c, rq, why[0] ? 503 : 200, body, "application/json", NULL, NULL,
		             why[0] ? why : NULL);
	}
	if (!authorized(srv, c))
		return fail(srv, c, rq, 401,
		            "a valid API key is required (Authorization: Bearer KEY)", NULL,
		            "invalid_api_key");
	switch (rq->ep) {
	case SERVE_EP_METRICS:
		return reply(srv, c, rq, 200, serve_status_metrics(srv),
		             "text/plain; version=0.0.4; charset=utf-8", NULL, NULL, NULL);
	case SERVE_EP_MODELS:
		return reply(srv, c, rq, 200, serve_api_models(srv), "application/json", NULL,
		             NULL, NULL);
	default:
		break;
	}
	if (not_json(c))
		return not_json_reply(srv, c, rq, not_json(c));
	if (__atomic_load_n(&srv->draining, __ATOMIC_RELAXED)) {
		pthread_mutex_lock(&srv->lock);
		serve_status_reject(srv, SERVE_REJECT_DRAINING);
		pthread_mutex_unlock(&srv->lock);
		return fail(srv, c, rq, 503, "the server is shutting down", NULL, NULL);
	}
	return generate(srv, c, rq);
}

/* A request's record, from its first line on: on_uri makes it, so that
 * one libmicrohttpd refuses before on_request (a malformed header) still
 * gets its access line. NULL when out of memory. */
static struct request *request_new(struct MHD_Connection *c, const char *path)
{
	struct request *rq = calloc(1, sizeof(*rq));

	if (!rq)
		return NULL;
	rq->t0 = serve_now();
	snprintf(rq->method, sizeof(rq->method), "-"); /* not parsed yet */
	q4kh_show(rq->path, sizeof(rq->path), path, strlen(path), 120, 1);
	peer(c, rq->client, sizeof(rq->client));
	mhd_said[0] = 0;
	return rq;
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
	(void)cls;
	return request_new(c, uri);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **ctx)
{
	struct serve *srv = cls;
	struct request *rq = *ctx;

	(void)version;
	if (!rq || !rq->routed) {
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
		                                             MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (!rq && !(*ctx = rq = request_new(c, url))) {
			serve_log("out of memory for a request; its connection was closed");
			return MHD_NO;
		}
		rq->routed = 1;
		rq->ep = serve_status_endpoint(url);
		q4kh_show(rq->method, sizeof(rq->method), method, strlen(method), 12, 1);
		q4kh_show(rq->path, sizeof(rq->path), url, strlen(url), 120, 1);
		/* Refused before the body is read: the connection then closes. */
		if (cl && strtoull(cl, NULL, 10) > (unsigned long long)srv->o.max_body)
			return too_large(srv, c, rq);
		return MHD_YES;
	}
	if (*upload_size) {
		if (!rq->too_large && rq->len + *upload_size > (size_t)srv->o.max_body) {
			rq->too_large = 1;
			free(rq->body);
			rq->body = NULL;
			rq->len = 0;
		}
		if (!rq->too_large) {
			if (rq->len + *upload_size + 1 > rq->cap) {
				size_t cap = (rq->len + *upload_size + 1) * 2;
				char *b = realloc(rq->body, cap);
				if (!b)
					return out_of_memory(rq, "the body");
				rq->body = b;
				rq->cap = cap;
			}
			memcpy(rq->body + rq->len, upload, *upload_size);
			rq->len += *upload_size;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (rq->too_large)
		return too_large(srv, c, rq);
	return route(srv, c, rq, method);
}

/* Why a request that was never answered ended, as an access log's status
 * (nginx's 499 and 408: none of them is sent). */
static void unanswered(struct request *rq, enum MHD_RequestTerminationCode why)
{
	switch (why) {
	case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED:
		note(rq, 408, "the connection idled past --idle-timeout before the request was "
		     "complete; closed unanswered");
		break;
	case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN:
		note(rq, 503, "the server stopped before the request was complete");
		break;
	default:
		note(rq, 499, "the client closed the connection before the request was complete");
		break;
	}
}

/* One access line per request, when it ends: who, what, the status sent
 * (or why none was), how long, and why (docs/serve.md, section 6). */
static void on_completed(void *cls, struct MHD_Connection *c, void **ctx,
                         enum MHD_RequestTerminationCode why)
{
	struct request *rq = *ctx;

	(void)cls;
	if (!rq)
		return;
	if (!rq->status && MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS))
		note(rq, MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS)->http_status,
		     "malformed HTTP, refused by libmicrohttpd before q4khost read the request: %s",
		     mhd_said[0] ? mhd_said : "it said nothing");
	else if (!rq->status)
		unanswered(rq, why);
	else if (why != MHD_REQUEST_TERMINATED_COMPLETED_OK && rq->status < 400 &&
	         rq->reason[0])
		snprintf(rq->reason + strlen(rq->reason), sizeof(rq->reason) - strlen(rq->reason),
		         "; the client left before the end");
	serve_log("access: %s %s %s %u %.3f s: %s", rq->client, rq->method, rq->path, rq->status,
	          serve_now() - rq->t0, rq->reason);
	free(rq->body);
	free(rq);
	*ctx = NULL;
}

/* The text of the HTML body in libmicrohttpd's LINE about an error answer
 * of its own, without tags, into mhd_said; 0 when LINE has none. */
static int said_body(const char *line)
{
	const char *p = strstr(line, "<body>"), *end = p ? strstr(p, "</body>") : NULL;
	size_t n = 0;
	int tag = 0;

	if (!end)
		return 0;
	for (p += strlen("<body>"); p < end && n + 1 < sizeof(mhd_said); p++) {
		if (*p == '<' || *p == '>')
			tag = *p == '<';
		else if (!tag)
			mhd_said[n++] = *p;
	}
	mhd_said[n] = 0;
	return 1;
}

/*
 * libmicrohttpd's own lines. Its "Application reported internal error"
 * follows every MHD_NO of ours (out of memory, or a client that left before
 * its answer), and the request's access line already says which. When it
 * answers a malformed request itself, what it says is kept for that
 * request's access line (on_completed), its HTML body's words rather than
 * the line that quotes the HTML. A connection it refuses at its limit is
 * answered 503 by serve_accept.c, whose access line says so.
 */
static void on_log(void *cls, const char *fmt, va_list ap)
{
	static const char ours[] = "Application reported internal error";
	static const char full[] = "Server reached connection limit";
	char line[512];
	size_t n;

	(void)cls;
	vsnprintf(line, sizeof(line), fmt, ap);
	if (!strncmp(line, ours, sizeof(ours) - 1) || !strncmp(line, full, sizeof(full) - 1) ||
	    said_body(line))
		return;
	n = strlen(line);
	while (n && line[n - 1] == '\n')
		line[--n] = 0;
	snprintf(mhd_said, sizeof(mhd_said), "%s", line);
	serve_log("http: %s", line);
}

int serve_http_resolve(struct serve *srv, struct q4kh_error *err)
{
	struct addrinfo hints = { 0 }, *ai = NULL;
	char port[16];
	int rc;

	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%ld", srv->o.port);
	rc = getaddrinfo(srv->o.host, port, &hints, &ai);
	if (rc)
		return q4kh_fail(err, "--host '%s': cannot be resolved to an address to listen on: %s "
		                 "(expected an address of this machine, such as 127.0.0.1 or ::1, "
		                 "or a name that resolves to one)",
		                 srv->o.host, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
	memcpy(&srv->listen_addr, ai->ai_addr, ai->ai_addrlen);
	srv->listen_v6 = ai->ai_family == AF_INET6;
	freeaddrinfo(ai);
	return 0;
}

int serve_http_port_free(const struct serve *srv, struct q4kh_error *err)
{
	const struct sockaddr_storage *addr = &srv->listen_addr;
	const socklen_t alen = srv->listen_v6 ? sizeof(struct sockaddr_in6)
	                                      : sizeof(struct sockaddr_in);
	const int one = 1;
	int fd, rc = 0;

	if (srv->o.port == 0)
		return 0; /* the kernel picks a free one */
	fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0; /* nothing learned: serve_http_start will say */
	/* as the daemon binds: an old connection in TIME_WAIT is no reason */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)addr, alen))
		rc = q4kh_fail(err, "cannot listen on %s port %ld: %s", srv->o.host, srv->o.port,
		               strerror(errno));
	close(fd);
	return rc;
}

/*
 * Raise the soft limit on open files to what --max-connections needs, as
 * far as the hard limit lets (systemd's soft default is 1024): past it
 * accept() fails and new connections wait unaccepted in the backlog.
 */
static void open_files_for(const struct serve *srv)
{
	const rlim_t want = (rlim_t)srv->o.max_connections + SPARE_FILES;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < want)
		serve_log("warning: the open-file limit (ulimit -n, %llu) is below --max-connections "
		          "%ld + %d: connections past it wait unaccepted",
		          (unsigned long long)rl.rlim_cur, srv->o.max_connections, SPARE_FILES);
}

/* libmicrohttpd's word that a connection closed: serve_accept.c counts
 * the open ones against --max-connections. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code)
{
	(void)c;
	(void)socket_ctx;
	if (code == MHD_CONNECTION_NOTIFY_CLOSED)
		serve_accept_closed(cls);
}

int serve_http_start(struct serve *srv, struct q4kh_error *err)
{
	struct sockaddr_storage addr;
	socklen_t alen = sizeof(addr);
	const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
	                       MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG |
	                       MHD_USE_NO_LISTEN_SOCKET;
	char port[16], host[NI_MAXHOST];

	open_files_for(srv);
	if (serve_accept_listen(srv, err))
		return -1;
	/* Its own limit only backs ours (serve_accept.c hands it at most
	 * --max-connections): a closed connection leaves its count just after
	 * it leaves ours. A connection it refuses anyway is answered 503. */
	srv->httpd = MHD_start_daemon(
		flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_log, srv,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->o.max_connections + CLOSING,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->o.idle_timeout,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION,
		on_connection, srv, MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv, MHD_OPTION_END);
	if (!srv->httpd)
		return q4kh_fail(err, "cannot start libmicrohttpd to serve on %s port %ld",
		                 srv->o.host, srv->o.port);
	if (getsockname(srv->listen_fd, (struct sockaddr *)&addr, &alen) ||
	    getnameinfo((struct sockaddr *)&addr, alen, host, sizeof(host), port, sizeof(port),
	                NI_NUMERICHOST | NI_NUMERICSERV))
		return q4kh_fail(err, "cannot read the address of the listening socket: %s",
		                 strerror(errno));
	if (serve_accept_start(srv, err))
		return -1;
	/* The line tests and scripts read to find the port. */
	serve_log(strchr(host, ':') ? "listening on http://[%s]:%s" : "listening on http://%s:%s",
	          host, port);
	return 0;
}

void serve_http_quiesce(struct serve *srv)
{
	__atomic_store_n(&srv->draining, 1, __ATOMIC_RELAXED);
	serve_accept_quiesce(srv);
}

void serve_http_flush(struct serve *srv, double seconds)
{
	const double end = serve_now() + seconds;

	pthread_mutex_lock(&srv->lock);
	while (srv->streams > 0 && serve_now() < end) {
		pthread_mutex_unlock(&srv->lock);
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
		pthread_mutex_lock(&srv->lock);
	}
	pthread_mutex_unlock(&srv->lock);
}

void serve_http_stop(struct serve *srv)
{
	serve_accept_stop(srv); /* nothing more is handed to httpd */
	if (!srv->httpd)
		return;
	MHD_stop_daemon(srv->httpd);
	srv->httpd = NULL;
}
