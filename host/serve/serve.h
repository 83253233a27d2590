/*
 * q4khost serve: an OpenAI-compatible HTTP server (docs/serve.md) that
 * serves only from paths F2 trusts, never makes a request wait for F2, and
 * can keep checking parity on live traffic.
 *
 * The parts, one file each:
 *   serve_http.c    libmicrohttpd: routing, limits, the API key, SSE
 *   serve_api.c     OpenAI request bodies in, response bodies out
 *   serve_prompt.c  messages or a prompt to token ids (the chat template)
 *   serve_text.c    stop strings and UTF-8 of generated text
 *   serve_engine.c  slots, the fair queue and the engine thread
 *   serve_path.c    a serving path: candidate, model, one session per slot
 *   serve_trust.c   the start-up choice, background F2, demotion receipts
 *   serve_shadow.c  shadow parity: served requests re-run teacher-forced
 *   serve_status.c  /health and /metrics
 *
 * Threads: libmicrohttpd runs one thread per connection; one engine thread
 * runs every forward step (sessions are used from one thread at a time);
 * a background F2 thread waits on a validation child process; a shadow
 * thread runs the comparisons. Everything they share sits in struct serve
 * under srv->lock; the forward steps run outside it.
 */
#ifndef Q4KH_SERVE_H
#define Q4KH_SERVE_H

#include <jansson.h>
#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "config.h"
#include "decide.h"
#include "error.h"
#include "f2.h"
#include "generate.h"
#include "guard.h"
#include "kv_paged.h"
#include "kv_prefix.h"
#include "registry.h"
#include "sampler.h"
#include "select.h"
#include "serving.h"
#include "session.h"
#include "tokenizer.h"

#define SERVE_MAX_STOP 4 /* stop strings per request, as OpenAI allows */
#define SERVE_MAX_SWITCHES 32 /* switches /health lists, latest last */
#define SERVE_MAX_VERDICTS 64 /* background and shadow verdicts kept */
/* Every 503's Retry-After, seconds: a slot frees or the queue moves that
 * soon at any load worth queueing for, and a balancer retries elsewhere at
 * once (docs/serve.md, section 6). */
#define SERVE_RETRY_AFTER "1"
/* --kv-pages auto, the default: on a path that can page (a model without
 * recurrent layers, a backend with attention_paged), as many pages as
 * --parallel whole contexts hold, the memory of the caches per slot it
 * replaces; elsewhere a whole context's cache per slot, said at start-up
 * (docs/serve.md, section 5). */
#define SERVE_KV_PAGES_AUTO (-1L)

/* Why a request got 503 (q4khost_rejected_total's reason label). */
enum serve_reject {
	SERVE_REJECT_QUEUE_FULL,  /* --max-queue requests wait already */
	SERVE_REJECT_CONNECTIONS, /* --max-connections are open */
	SERVE_REJECT_DRAINING,    /* SIGTERM: the server stops */
	SERVE_REJECT_NO_PATH,     /* no trusted path can serve, until a restart */
	SERVE_REJECT_N
};

struct serve_opts {
	const char *model, *host, *plugin_path, *config_file, *backend, *kernel;
	const char *f2;           /* the --f2 value, NULL when not given */
	const char *api_key_file; /* NULL: Q4KHOST_API_KEY, else no key */
	long port, device, ctx, threads, parallel;
	long max_body;            /* bytes of a request body */
	long max_prompt;          /* tokens of a prompt (0: the context) */
	long max_tokens;          /* the largest max_tokens a request may ask */
	long max_connections, max_queue;
	long step_tokens;         /* tokens a batched step carries at most (0:
	                             the session's batch) */
	int prefix_cache;         /* --prefix-cache: reuse prompts' starts */
	long kv_pages;            /* --kv-pages: pages of Q4KH_PREFIX_BLOCK tokens
	                             every slot of a path shares; 0: a whole
	                             context's cache per slot;
	                             SERVE_KV_PAGES_AUTO: pages where the
	                             path can page */
	long idle_timeout;        /* seconds a connection may stay silent */
	long drain_timeout;       /* seconds SIGTERM waits for requests */
	double shadow_rate;       /* --f2-shadow */
	struct q4kh_sampler_params defaults;
	int seed_set;
};

/*
 * A serving path: one candidate opened for serving, with a session per
 * slot. Heap-allocated and never moved (the model points at its backend).
 */
struct serve_path {
	struct q4kh_candidate cand; /* names point into the registry */
	char name[160];             /* "cpu/cpu-simd" */
	struct q4kh_serving sv;     /* backend, kernel, model, sessions[0] */
	struct q4kh_selection sel;  /* the F2 record; after a synchronous
	                               q4kh_select also what it opened */
	struct q4kh_backend *be;    /* sv.be or sel.backend */
	struct q4kh_model *m;
	struct q4kh_session **sessions; /* one per slot */
	int n_sessions;
	/* what each session's KV cache holds, for prefix reuse across
	 * requests (kv_prefix.h); NULL when --prefix-cache is off or the
	 * model has recurrent layers. Engine only. */
	struct q4kh_prefix *prefix;
	/* on pages (--kv-pages; auto, the default, where the path can page):
	 * the pool of pages every session's keys and values go to
	 * (kv_paged.h), a slot taking pages for the tokens it holds; NULL:
	 * each session has a whole context's cache. Engine only. */
	struct q4kh_kv_paged *paged;
	/* with --kv-pages auto and paged NULL: why the path cannot page */
	char kv_why[sizeof(((struct q4kh_error *)0)->msg)];
	int guarded;    /* F2 judged it: neither the reference nor F2 off */
	int unverified; /* F2 is off */
	int plan_index; /* its place in the start-up plan; -1 outside it */
	/* engine, under srv->lock */
	int running;    /* jobs on it */
	int retired;    /* no longer current: closed when running is 0 */
	int demoted;    /* shadow parity rejected it: its jobs stop */
};

enum serve_kind { SERVE_CHAT, SERVE_COMPLETION };
enum serve_state { SERVE_QUEUED, SERVE_RUNNING, SERVE_DONE };

/* One generation request, shared by its HTTP thread and the engine. */
struct serve_job {
	/* set before it is queued, then read-only */
	enum serve_kind kind;
	char id[48];              /* "chatcmpl-17" */
	uint64_t seq;
	int stream, include_usage;
	int ignore_eos;           /* an end-of-generation token ends nothing */
	int32_t *ids;
	size_t n_ids;
	struct q4kh_sampler_params sp;
	int64_t max_tokens;
	char *stop[SERVE_MAX_STOP];
	size_t n_stop;
	long created;             /* Unix time */
	double t_submit;
	/* under srv->lock */
	enum serve_state state;
	int cancel;               /* the client left, or the server stops */
	char *text;               /* generated bytes, stop strings cut */
	size_t len, cap, ready;   /* ready: bytes that may be sent now */
	int64_t n_gen;            /* tokens in the answer */
	const char *finish;       /* "stop", "length", NULL while running */
	char error[1024];         /* set when it ended without an answer */
	int http_status;          /* with error: 503 or 500 */
	int for_good;             /* a 503 that no retry helps: nothing serves
	                             until a restart (no Retry-After) */
	char served_by[200];      /* the path's name and device */
	char path_name[160];      /* the path's name */
	char f2[400];             /* the path's F2 verdict, for the header */
	double t_first;           /* first token, seconds after t_submit */
	int refs;
	pthread_cond_t cv;
	/* engine only */
	int slot;
	struct serve_path *path;
	struct q4kh_sampler *sampler;
	/* the answer's generation (generate.h): its sampler (NULL: greedy),
	 * the slot's logits, limits and the tokens taken */
	struct q4kh_gen g;
	size_t fed;               /* prompt tokens prefilled */
	size_t reused;            /* of them, taken from the prefix cache */
	size_t n_fed;             /* answer tokens fed back (gen[0..n_fed)) */
	int32_t last;             /* the token to feed next */
	int32_t *gen;             /* answer tokens, for shadow parity */
	size_t n_gen_cap;
	double t_decode0;
};

/* One verdict /health lists: background F2, a receipt, or shadow parity. */
struct serve_verdict {
	char path[160];
	char verdict[32];
	char source[256];
	char message[512];
};

struct serve_switch {
	char at[32], from[160], to[160], reason[600];
};

struct serve_metrics {
	uint64_t requests[6][10]; /* endpoint x status code (serve_status.c) */
	uint64_t prompt_tokens, completion_tokens;
	double decode_seconds;    /* engine time in steps that made tokens */
	/* steps of several requests at once, and the tokens they made */
	uint64_t batched_steps, batched_tokens;
	/* of them, those that carried prompt chunks, and those chunks' tokens */
	uint64_t mixed_steps, batched_prompt_tokens;
	/* the engine's forward steps by the path they took (session.h) */
	uint64_t steps_by_path[Q4KH_WAY_COUNT];
	/* prefix reuse: requests looked up, those that reused a block, the
	 * blocks and tokens reused, and of those the tokens copied from
	 * another slot's cache (the rest were in the slot's own) */
	uint64_t prefix_lookups, prefix_hits, prefix_blocks, prefix_tokens, prefix_copied;
	/* of the tokens reused from another slot, those whose pages were
	 * shared instead (--kv-pages) */
	uint64_t prefix_shared;
	uint64_t page_waits; /* times the queue's head waited for KV pages */
	uint64_t ttft_buckets[10], ttft_count;
	double ttft_sum;
	uint64_t f2_pass, f2_reject, f2_other; /* background F2 and receipts */
	uint64_t fallbacks, switches;
	uint64_t shadow_pass, shadow_reject, shadow_other, shadow_dropped;
	uint64_t rejected[SERVE_REJECT_N]; /* 503s, by enum serve_reject */
};

/* A path's KV pages (--kv-pages): all, free, held by more than one slot. */
struct serve_pages {
	int32_t total, free, shared;
};

struct serve_shadow;

struct serve {
	struct serve_opts o;
	struct q4kh_config *config;
	struct q4kh_registry *registry;
	char model_path[4096];
	char model_id[256];       /* the file's base name: /v1/models */
	/* the command's host context (host.h): the model file, its tokenizer,
	 * the backends the plan and a synchronous choice use (the paths
	 * opened later, on other threads, have contexts of their own) */
	struct q4kh_host host;
	const struct q4kh_gguf *gguf;   /* host's, for the chat template */
	const struct q4kh_tokenizer *tok; /* host's */
	int32_t n_vocab;
	uint32_t n_ctx;
	char api_key[512];        /* empty: none */
	char kv_pages_origin[700]; /* where o.kv_pages was set */
	enum q4kh_f2_mode mode;
	char mode_origin[700];
	struct q4kh_select_request rq;
	struct q4kh_candidate plan[Q4KH_SELECT_MAX];
	int n_plan;
	/* receipts: lookups and demotions; judge.g NULL with F2 off. On the
	 * deep probe with [f2] require_deep (rq.probe Q4KH_F2_PROBE_DEEP),
	 * where it was set in deep_origin (rq.probe_origin). */
	struct q4kh_decide_guard judge;
	char deep_origin[700];

	pthread_mutex_t lock;
	pthread_cond_t work;      /* the engine's: jobs, cancels, switches */
	/* engine */
	struct serve_job **queue; /* FIFO ring of max_queue */
	size_t q_head, q_len;
	struct serve_job **slots;
	int n_slots;
	struct serve_path *cur;   /* new requests go here; NULL: none can */
	/* with cur NULL: why nothing serves and what the operator must do,
	 * for every 503 and /health (docs/serve.md, section 4) */
	char unavailable[900];
	struct serve_path *retired[8];
	int n_retired;
	uint64_t next_seq;
	int draining, quit;
	int streams; /* event streams MHD holds (lock): shut_down lets them end */
	pthread_t engine;
	int engine_started;
	float **logits;           /* per slot: a sampled job's (greedy reads a pick) */
	/* per slot: a round's batched steps: the step's sequences, which
	 * slots are due, the slots of one step */
	struct q4kh_batch_seq *batch;
	int *due, *batch_slots;
	size_t *take; /* per slot: its tokens in the step planned */
	/* per slot: a lookup's match in its cache, and the free slots of the
	 * longest (serve_engine.c, place), or those whose pages may be given
	 * back (pages_fit) */
	int64_t *prefix_mine;
	int *prefix_pick;
	/* --kv-pages: the job at the queue's head waits for pages, until a
	 * job ends or the path changes (serve_engine.c, admit); and the
	 * current path's pool as the engine last saw it, for /health and
	 * /metrics (the pool itself is the engine's) */
	int pages_wait;
	struct serve_pages pages;
	/* trust */
	struct serve_verdict verdicts[SERVE_MAX_VERDICTS];
	int n_verdicts;
	struct serve_switch switches[SERVE_MAX_SWITCHES];
	int n_switches;
	char validating[160];     /* the candidate F2 measures now, or "" */
	pid_t f2_child;           /* its process group, 0 when none */
	int f2_quit;
	pthread_t f2_thread;
	int f2_started;
	int pending[Q4KH_SELECT_MAX]; /* plan indices F2 measures in order */
	int n_pending;
	struct serve_shadow *shadow;
	struct serve_metrics m;
	double t_start;
	long started;             /* Unix time */
	sem_t stop;               /* posted by SIGTERM and SIGINT */
	struct MHD_Daemon *httpd;
	int listen_fd;            /* ours: serve_accept.c accepts on it */
	long conns;               /* connections handed to httpd, open (atomic) */
	struct serve_acceptor *acceptor;
	struct sockaddr_storage listen_addr; /* --host and --port, resolved */
	int listen_v6;
};

/* serve_path.c */
int serve_path_open(struct serve *srv, const struct q4kh_candidate *c,
                    struct serve_path **out, struct q4kh_error *err);
/* Choose, guard and open a path as q4khost run does (q4kh_select, F2
 * measured before it returns), for requests that name what must serve. */
int serve_path_select(struct serve *srv, struct serve_path **out, int *explicit_failure,
                      struct q4kh_error *err);
void serve_path_close(struct serve_path *p);
/* "cpu/cpu-simd on cpu (2 threads), device 0" */
void serve_path_describe(const struct serve_path *p, char *buf, size_t cap);
/* The X-Q4KHost-F2 header's value for P (ASCII, one line). */
void serve_path_f2_header(const struct serve_path *p, char *buf, size_t cap);
/* The same for the path new requests go to now (takes srv->lock). */
void serve_path_current_f2(struct serve *srv, char *buf, size_t cap);

/* serve_engine.c */
int serve_engine_start(struct serve *srv, struct q4kh_error *err);
/*
 * Queue JOB (its request part filled). 0, or an HTTP status with
 * job->error: 503 when draining, full or nothing can serve (the last
 * with job->for_good set: no retry helps).
 */
int serve_engine_submit(struct serve *srv, struct serve_job *job);
/* Make P current; with DEMOTE the old path's jobs stop or are re-run.
 * Called with srv->lock held. */
void serve_engine_switch(struct serve *srv, struct serve_path *p, int demote,
                         const char *reason);
/* Cancel every job and stop the engine thread. */
void serve_engine_stop(struct serve *srv);
/* Wait up to SECONDS for the queue and slots to empty. */
void serve_engine_drain(struct serve *srv, double seconds);
struct serve_job *serve_job_new(void);
/* Drop one reference (srv->lock held); frees the job at zero. */
void serve_job_release(struct serve_job *j);
/*
 * The KV pages of Q4KH_PREFIX_BLOCK tokens job J (its prompt and
 * max_tokens set) may hold at its end: its prompt and max_tokens, at most
 * the context of SRV's slots. With --kv-pages, J is admitted when the
 * pool can keep that many for it (docs/serve.md, section 5).
 */
int64_t serve_job_pages(const struct serve *srv, const struct serve_job *j);

/* serve_trust.c */
/* Choose and open what serves first; start background F2 when needed. */
int serve_trust_start(struct serve *srv, struct q4kh_error *err);
/* Start measuring, in the background, what start-up could not trust. */
int serve_trust_background(struct serve *srv, struct q4kh_error *err);
/* Kill a running validation child and join the F2 thread. */
void serve_trust_stop(struct serve *srv);
/* Add a verdict for /health (srv->lock held). */
void serve_trust_note(struct serve *srv, const char *path, const char *verdict,
                      const char *source, const char *message);
/* The trusted path to serve after plan entry AFTER is demoted; NULL when
 * none. Opens it (no lock held). */
struct serve_path *serve_trust_fallback(struct serve *srv, int after,
                                        struct q4kh_error *err);
/* Write the receipt of candidate C on device DEV from a shadow result
 * RES that rejected it: its verdict and MESSAGE, without points (the
 * request's positions are not the probe's). */
int serve_trust_demotion_receipt(struct serve *srv, const struct q4kh_candidate *c,
                                 const struct q4kh_device_record *dev,
                                 const struct q4kh_f2_result *res,
                                 const char *message, struct q4kh_error *err);

/* serve_shadow.c */
int serve_shadow_start(struct serve *srv, struct q4kh_error *err);
/* Offer a finished job for sampling (srv->lock held). */
void serve_shadow_offer(struct serve *srv, const struct serve_job *j);
void serve_shadow_stop(struct serve *srv);
/* The shadow's part of /health (srv->lock held). */
json_t *serve_shadow_json(struct serve *srv);

/* serve_status.c */
enum serve_endpoint {
	SERVE_EP_CHAT, SERVE_EP_COMPLETIONS, SERVE_EP_MODELS, SERVE_EP_HEALTH,
	SERVE_EP_METRICS, SERVE_EP_OTHER
};
/* The endpoint of a request's PATH (SERVE_EP_OTHER for any other). */
enum serve_endpoint serve_status_endpoint(const char *path);
void serve_status_count(struct serve *srv, enum serve_endpoint ep, unsigned code);
/* Count a 503 for REASON (srv->lock held). */
void serve_status_reject(struct serve *srv, enum serve_reject reason);
void serve_status_ttft(struct serve *srv, double seconds); /* lock held */
/* /health's JSON, malloc()ed; WHY (CAP bytes) is "" when the server is
 * ready (not draining, and its path trusted by F2: the reference or a
 * pass, not F2 off), else why not: /health answers 503 then. */
char *serve_status_health(struct serve *srv, char *why, size_t cap);
char *serve_status_metrics(struct serve *srv); /* malloc()ed text */

/* serve_accept.c */
/*
 * Listen on srv->listen_addr (serve_http_resolve) into srv->listen_fd, non-
 * blocking; -1 with err naming the host, the port and the reason.
 */
int serve_accept_listen(struct serve *srv, struct q4kh_error *err);
/*
 * Start the thread that accepts every connection on srv->listen_fd: while
 * fewer than --max-connections are open it hands the connection to
 * srv->httpd (serve_http_start made it, without a socket of its own); past
 * them it answers 503 with Retry-After and an OpenAI error itself, without
 * a thread, so that no connection is closed unanswered (docs/serve.md,
 * section 6). -1 with err when the thread cannot start.
 */
int serve_accept_start(struct serve *srv, struct q4kh_error *err);
/* Stop accepting: new connections are refused; those answered 503 finish. */
void serve_accept_quiesce(struct serve *srv);
/* Join the thread, close what it holds and the listening socket. */
void serve_accept_stop(struct serve *srv);
/* A connection handed to httpd closed (its counter, srv->conns). */
void serve_accept_closed(struct serve *srv);

/* serve_http.c */
/*
 * Resolve --host and --port into srv->listen_addr, before anything is
 * loaded: -1 with err naming the host and getaddrinfo's reason.
 */
int serve_http_resolve(struct serve *srv, struct q4kh_error *err);
/* 0 when srv->listen_addr's port (port 0 aside) can be bound now, so that
 * a port in use is said before the model loads; -1 with err naming the
 * host, the port and the reason. A port taken between this check and
 * serve_http_start still fails there. */
int serve_http_port_free(const struct serve *srv, struct q4kh_error *err);
/* Listen on srv->listen_addr (serve_http_resolve) and serve. */
int serve_http_start(struct serve *srv, struct q4kh_error *err);
/* Stop accepting connections; requests on open ones get 503. */
void serve_http_quiesce(struct serve *srv);
/* Wait up to SECONDS for every event stream to end (the jobs are done or
 * cancelled: each stream sends its last events, an error event and
 * [DONE] for a cancelled one, before the connections close). */
void serve_http_flush(struct serve *srv, double seconds);
void serve_http_stop(struct serve *srv);

/* One log line on stderr: "q4khost serve: ...". Thread-safe. */
void serve_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double serve_now(void);
/* UTC, ISO 8601, into BUF (32 bytes). */
void serve_utc(char *buf, size_t cap);

#endif
