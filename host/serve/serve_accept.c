/*
 * Accepting connections. libmicrohttpd closes a connection past its limit
 * without a word (the client sees a reset or a broken pipe), so serve
 * accepts every one itself: while fewer than --max-connections are open it
 * hands the socket to libmicrohttpd (a thread each); past them one thread,
 * this one, answers 503 with Retry-After and an OpenAI error body on the
 * socket, reads and drops what the client sends until it closes, and
 * writes the request's access line (docs/serve.md, section 6).
 */
#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_api.h"

/* Connections answered 503 whose client has not closed yet; past them new
 * ones wait in the listen backlog until one of these ends. */
#define MAX_ANSWERED 1024
/* Seconds an answered client has to close before its socket is closed. */
#define LINGER_S 5.0
/* Milliseconds to wait before accepting again when accept() lacks a file
 * descriptor (ulimit -n): the connections wait in the backlog meanwhile. */
#define EMFILE_PAUSE_MS 100

/* A connection answered 503 here: what is left to send, what it sent. */
struct answered {
	int fd;
	char *out;        /* the whole answer, malloc()ed */
	size_t len, off;  /* its bytes, and those sent */
	double t0;        /* accepted */
	char client[64];
	char head[256];   /* the request's first bytes, for the access line */
	size_t n_head;
	char reason[200]; /* the access line's */
};

struct serve_acceptor {
	pthread_t thread;
	int wake[2];     /* a byte wakes the thread: quiesce or stop */
	int quiesced, quit; /* under srv->lock */
	struct answered a[MAX_ANSWERED];
	int n;
	struct pollfd pf[2 + MAX_ANSWERED]; /* the wake pipe, the socket, a[] */
	int said_emfile; /* the file-descriptor warning, once per shortage */
};

int serve_accept_listen(struct serve *srv, struct q4kh_error *err)
{
	const socklen_t alen = srv->listen_v6 ? sizeof(struct sockaddr_in6)
	                                      : sizeof(struct sockaddr_in);
	const int one = 1;
	int fd = socket(srv->listen_addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0)
		return q4kh_fail(err, "cannot open a socket to listen on %s port %ld: %s",
		                 srv->o.host, srv->o.port, strerror(errno));
	/* an old connection in TIME_WAIT is no reason to refuse the port */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (srv->listen_v6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)&srv->listen_addr, alen) || listen(fd, SOMAXCONN)) {
		int e = errno;

		close(fd);
		return q4kh_fail(err, "cannot listen on %s port %ld: %s", srv->o.host, srv->o.port,
		                 strerror(e));
	}
	srv->listen_fd = fd;
	return 0;
}

/* The numeric address of A (LEN bytes) into BUF ("?" when unknown). */
static void address(const struct sockaddr *a, socklen_t len, char *buf, size_t cap)
{
	if (getnameinfo(a, len, buf, cap, NULL, 0, NI_NUMERICHOST))
		snprintf(buf, cap, "?");
}

/* The 503 for a connection past the limit: status line, headers, body. */
static char *answer_503(struct serve *srv, const char *message, size_t *len)
{
	char f2[400], *body = serve_api_error_body(message, "server_error", NULL, NULL), *out;
	int n;

	if (!body)
		return NULL;
	serve_path_current_f2(srv, f2, sizeof(f2));
	n = asprintf(&out, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
	             "Content-Length: %zu\r\nRetry-After: " SERVE_RETRY_AFTER "\r\n"
	             "Connection: close\r\nX-Q4KHost-F2: %s\r\n\r\n%s",
	             strlen(body), f2, body);
	free(body);
	if (n < 0)
		return NULL;
	*len = (size_t)n;
	return out;
}

/* Send what is left of A's answer; once it is all out, no more is sent
 * (the client reads the end of the answer, then closes). */
static void send_more(struct answered *a)
{
	ssize_t n = send(a->fd, a->out + a->off, a->len - a->off, MSG_NOSIGNAL | MSG_DONTWAIT);

	if (n > 0)
		a->off += (size_t)n;
	if (a->off == a->len)
		shutdown(a->fd, SHUT_WR);
}

/* The request line's method and path of A's first bytes, printable, into
 * METHOD and PATH ("-" for what did not come). */
static void request_line(const struct answered *a, char *method, size_t mcap, char *path,
                         size_t pcap)
{
	const char *h = a->head, *end = h + a->n_head;
	const char *sp = memchr(h, ' ', a->n_head);
	const char *p_end = sp ? memchr(sp + 1, ' ', (size_t)(end - sp - 1)) : NULL;

	snprintf(method, mcap, "-");
	snprintf(path, pcap, "-");
	if (!sp)
		return;
	q4kh_show(method, mcap, h, (size_t)(sp - h), 12, 1);
	if (p_end)
		q4kh_show(path, pcap, sp + 1, (size_t)(p_end - sp - 1), 120, 1);
}

/* A's client closed, or its time is up: its access line, and the socket
 * closed. Counted as a request of its endpoint when its path came. */
static void finish(struct serve *srv, struct answered *a)
{
	char method[16], path[200];

	request_line(a, method, sizeof(method), path, sizeof(path));
	serve_log("access: %s %s %s 503 %.3f s: %s (Retry-After: " SERVE_RETRY_AFTER " s)%s",
	          a->client, method, path, serve_now() - a->t0, a->reason,
	          a->off < a->len ? "; the client left before the whole answer" : "");
	serve_status_count(srv, serve_status_endpoint(path), 503);
	close(a->fd);
	free(a->out);
}

/* Answer FD (its peer ADDR) 503: --max-connections are open, or
 * libmicrohttpd took no more. */
static void refuse(struct serve *srv, struct serve_acceptor *ac, int fd,
                   const struct sockaddr *addr, socklen_t alen)
{
	struct answered *a = &ac->a[ac->n];

	*a = (struct answered){ .fd = fd, .t0 = serve_now() };
	address(addr, alen, a->client, sizeof(a->client));
	snprintf(a->reason, sizeof(a->reason),
	         "%ld connections are open, the most this server takes (--max-connections); "
	         "try again later", srv->o.max_connections);
	a->out = answer_503(srv, a->reason, &a->len);
	if (!a->out) {
		serve_log("access: %s - - 503 0.000 s: out of memory for the answer to a connection "
		          "past --max-connections; it was closed unanswered", a->client);
		close(fd);
		return;
	}
	pthread_mutex_lock(&srv->lock);
	serve_status_reject(srv, SERVE_REJECT_CONNECTIONS);
	pthread_mutex_unlock(&srv->lock);
	send_more(a);
	ac->n++;
}

/*
 * Hand FD to libmicrohttpd when fewer than --max-connections are open,
 * else answer it here. libmicrohttpd closes a socket it does not take, so
 * it gets a copy, and the answer goes to the original.
 */
static void place(struct serve *srv, struct serve_acceptor *ac, int fd,
                  const struct sockaddr *addr, socklen_t alen)
{
	if (__atomic_add_fetch(&srv->conns, 1, __ATOMIC_RELAXED) <= srv->o.max_connections) {
		int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);

		if (copy >= 0 && MHD_add_connection(srv->httpd, copy, addr, alen) == MHD_YES) {
			close(fd);
			return;
		}
	}
	__atomic_sub_fetch(&srv->conns, 1, __ATOMIC_RELAXED);
	refuse(srv, ac, fd, addr, alen);
}

/* Accept what waits on the listening socket, as long as there is room;
 * the time to wait before trying again, in ms (0: none). */
static int accept_waiting(struct serve *srv, struct serve_acceptor *ac)
{
	while (ac->n < MAX_ANSWERED) {
		struct sockaddr_storage addr;
		socklen_t alen = sizeof(addr);
		int fd = accept4(srv->listen_fd, (struct sockaddr *)&addr, &alen,
		                 SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd >= 0) {
			ac->said_emfile = 0;
			place(srv, ac, fd, (struct sockaddr *)&addr, alen);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
			if (!ac->said_emfile++)
				serve_log("warning: cannot accept a connection: %s (ulimit -n); new "
				          "connections wait in the listen backlog", strerror(errno));
			return EMFILE_PAUSE_MS;
		}
		return 0; /* EAGAIN: none left; else the socket was shut down */
	}
	return 0;
}

/* What came on A's socket: kept for the access line while there is room,
 * else dropped. 1 when the client is done (closed, reset, or past
 * LINGER_S), 0 while it may still read or send. */
static int read_more(struct answered *a, double now)
{
	char buf[4096];
	ssize_t n;

	while ((n = recv(a->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
		size_t keep = sizeof(a->head) - a->n_head < (size_t)n ? sizeof(a->head) - a->n_head
		                                                       : (size_t)n;
		memcpy(a->head + a->n_head, buf, keep);
		a->n_head += keep;
	}
	if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		return 1;
	return now - a->t0 > LINGER_S;
}

/* Poll's timeout in ms for the answered connections' LINGER_S, or -1. */
static int next_deadline(const struct serve_acceptor *ac, double now, int pause_ms)
{
	int timeout = pause_ms ? pause_ms : -1;

	for (int i = 0; i < ac->n; i++) {
		int left = (int)((ac->a[i].t0 + LINGER_S - now) * 1000.0) + 1;

		if (left < 0)
			left = 0;
		if (timeout < 0 || left < timeout)
			timeout = left;
	}
	return timeout;
}

static void *accept_loop(void *arg)
{
	struct serve *srv = arg;
	struct serve_acceptor *ac = srv->acceptor;
	struct pollfd *pf = ac->pf;
	int pause_ms = 0;

	for (;;) {
		int quit, quiesced, listening;
		double now;
		char drop[64];

		pthread_mutex_lock(&srv->lock);
		quit = ac->quit;
		quiesced = ac->quiesced;
		pthread_mutex_unlock(&srv->lock);
		if (quit)
			return NULL;
		listening = !quiesced && !pause_ms && ac->n < MAX_ANSWERED;
		pf[0] = (struct pollfd){ .fd = ac->wake[0], .events = POLLIN };
		pf[1] = (struct pollfd){ .fd = listening ? srv->listen_fd : -1, .events = POLLIN };
		for (int i = 0; i < ac->n; i++)
			pf[2 + i] = (struct pollfd){
				.fd = ac->a[i].fd,
				.events = POLLIN | (ac->a[i].off < ac->a[i].len ? POLLOUT : 0)
			};
		poll(pf, (nfds_t)(2 + ac->n), next_deadline(ac, serve_now(), pause_ms));
		pause_ms = 0;
		if (pf[0].revents & POLLIN)
			while (read(ac->wake[0], drop, sizeof(drop)) > 0)
				;
		now = serve_now();
		/* last first: a finished one is replaced by the last */
		for (int i = ac->n - 1; i >= 0; i--) {
			struct answered *a = &ac->a[i];

			if (pf[2 + i].revents & POLLOUT)
				send_more(a);
			if (read_more(a, now)) {
				finish(srv, a);
				*a = ac->a[--ac->n];
			}
		}
		if (listening && (pf[1].revents & POLLIN))
			pause_ms = accept_waiting(srv, ac);
	}
}

static void wake(struct serve *srv, int *flag)
{
	pthread_mutex_lock(&srv->lock);
	*flag = 1;
	pthread_mutex_unlock(&srv->lock);
	/* a full pipe already holds a byte for the thread to read */
	ssize_t rc = write(srv->acceptor->wake[1], "", 1);

	(void)rc;
}

int serve_accept_start(struct serve *srv, struct q4kh_error *err)
{
	struct serve_acceptor *ac = calloc(1, sizeof(*ac));
	int rc;

	if (!ac)
		return q4kh_fail(err, "out of memory for the thread that accepts connections");
	if (pipe2(ac->wake, O_CLOEXEC | O_NONBLOCK)) {
		free(ac);
		return q4kh_fail(err, "cannot make a pipe to wake the thread that accepts "
		                 "connections: %s", strerror(errno));
	}
	srv->acceptor = ac;
	rc = pthread_create(&ac->thread, NULL, accept_loop, srv);
	if (rc) {
		close(ac->wake[0]);
		close(ac->wake[1]);
		free(ac);
		srv->acceptor = NULL;
		return q4kh_fail(err, "cannot start the thread that accepts connections: %s",
		                 strerror(rc));
	}
	return 0;
}

void serve_accept_quiesce(struct serve *srv)
{
	if (!srv->acceptor)
		return;
	wake(srv, &srv->acceptor->quiesced);
	/* New connections are refused at once instead of waiting in the
	 * backlog (Linux stops listening on a shut-down socket). */
	shutdown(srv->listen_fd, SHUT_RD);
}

void serve_accept_stop(struct serve *srv)
{
	struct serve_acceptor *ac = srv->acceptor;

	if (ac) {
		wake(srv, &ac->quit);
		pthread_join(ac->thread, NULL);
		for (int i = 0; i < ac->n; i++)
			finish(srv, &ac->a[i]);
		close(ac->wake[0]);
		close(ac->wake[1]);
		free(ac);
		srv->acceptor = NULL;
	}
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	srv->listen_fd = -1;
}

void serve_accept_closed(struct serve *srv)
{
	__atomic_sub_fetch(&srv->conns, 1, __ATOMIC_RELAXED);
}
