/*
 * q4khost serve: the OpenAI-compatible HTTP server (host/serve/serve.h,
 * docs/serve.md). This file parses the command line, opens what serves,
 * starts the parts and stops them on SIGTERM or SIGINT.
 */
#include "buildconf.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "gguf.h"
#include "interrupt.h"
#include "model.h"
#include "serve.h"
#include "settings.h"
#include "q4khost/backend_base.h"

#define MAX_CONNECTIONS 65536 /* each a thread of libmicrohttpd's */
#define SERVE_MAX_KV_PAGES (1L << 24) /* 2^28 tokens */
#define KV_PAGES_UNSET (-2L) /* not on the command line: [serve] kv_pages */

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost serve [-m FILE] [--host ADDR] [--port N] [OPTIONS]\n\n"
	        "Serve a GGUF model over HTTP with the OpenAI API: POST /v1/chat/completions,\n"
	        "POST /v1/completions, GET /v1/models, GET /health, GET /metrics\n"
	        "(docs/serve.md). Only paths F2 trusts serve: the reference cpu backend, or\n"
	        "a candidate with a passing receipt; a better candidate without a receipt\n"
	        "is measured in the background and takes over between requests.\n\n"
	        "  -m, --model FILE        GGUF model (default: as q4khost run)\n"
	        "      --host ADDR         address to listen on (default 127.0.0.1; any other\n"
	        "                          address is reachable from other machines); one\n"
	        "                          that does not resolve is a usage error, said\n"
	        "                          before the model loads\n"
	        "      --port N            TCP port (default 8080; 0: a free one, named on\n"
	        "                          stderr as \"listening on http://ADDR:PORT\")\n"
	        "      --api-key-file FILE clients must send \"Authorization: Bearer KEY\" with\n"
	        "                          the key in FILE (default: $Q4KHOST_API_KEY; no key\n"
	        "                          when neither is set, or it is empty, said in a\n"
	        "                          warning)\n"
	        "  -c, --ctx N             context per slot in tokens (default: min(4096,\n"
	        "                          the model's))\n"
	        "      --parallel N        requests generated at once, one slot each (default 4)\n"
	        "      --step-tokens N     tokens one step carries at most: every answer's next\n"
	        "                          token, then prompts' chunks (default and most: the\n"
	        "                          session's batch, 256 on cpu, 128 on cpu-fast, 512\n"
	        "                          on a GPU)\n"
	        "      --prefix-cache on|off  reuse the keys and values of a prompt's start that\n"
	        "                          a slot computed for an earlier request, in blocks of\n"
	        "                          16 tokens (default on: the same answers, bit for bit\n"
	        "                          on cpu, and no memory of its own)\n"
	        "      --kv-pages N|auto   keep every slot's keys and values in one pool of N\n"
	        "                          pages of 16 tokens, a slot holding pages for the\n"
	        "                          tokens it uses: --parallel may then exceed what\n"
	        "                          N pages hold in whole contexts; a request waits\n"
	        "                          for the pages its prompt and max_tokens may take;\n"
	        "                          0: a whole context's cache per slot; auto: as many\n"
	        "                          pages as --parallel whole contexts hold, or a\n"
	        "                          cache per slot where the path cannot page (a\n"
	        "                          model with recurrent layers), said at start-up\n"
	        "                          (default: [serve] kv_pages, else auto)\n"
	        "      --max-queue N       requests waiting for a slot; more get 503 with\n"
	        "                          Retry-After (default 512)\n"
	        "      --max-connections N open connections, a thread each; past them a new one\n"
	        "                          is answered 503 with Retry-After at once (default:\n"
	        "                          2 x (--parallel + --max-queue), at least 1024)\n"
	        "      --max-body BYTES    largest request body (default 1048576)\n"
	        "      --max-prompt-tokens N  longest prompt (default: the context)\n"
	        "      --max-tokens N      largest max_tokens, and the default (default 4096)\n"
	        "      --idle-timeout S    seconds a connection may stay silent (default 30)\n"
	        "      --shutdown-timeout S  seconds SIGTERM lets requests finish before they\n"
	        "                          are cancelled (default 10)\n"
	        "      --temp T, --top-k K, --top-p P, --seed S\n"
	        "                          sampling of requests that do not set it (default:\n"
	        "                          greedy, 40, 0.95, a random seed per request); T\n"
	        "                          from 0 to 2, OpenAI's range, as run takes it\n"
	        "      --backend NAME, --device N, --kernel LIST\n"
	        "                          what may serve, as for q4khost run\n"
	        "      --f2 MODE           auto (default: $Q4KHOST_F2, else [f2] mode, else\n"
	        "                          auto), fresh, off (every response says it is\n"
	        "                          unverified), require (F2 before serving)\n"
	        "      --revalidate        the same as --f2 fresh\n"
	        "      --f2-shadow RATE    re-run this fraction (0 to 1) of the requests a guarded\n"
	        "                          path served on the reference, teacher-forced, and\n"
	        "                          demote the path when F2's rules reject it (default 0)\n"
	        "      --plugin-path P     ':'-separated plugin folders\n"
	        "      --config FILE       extra INI configuration file\n"
	        "  -h, --help              this help\n\n"
	        "SIGTERM or SIGINT: stop accepting, let requests finish (--shutdown-timeout),\n"
	        "cancel the rest, exit 0. A second one 0.5 s or more after the first stops\n"
	        "serve at once, by that signal (the shell's status 130 or 143), cutting off\n"
	        "the requests in flight.\n\n"
	        "exit codes: 0 stopped by a signal, 1 failure, 2 usage, 3 bad model or config\n"
	        "            file, 4 the requested backend or kernel cannot serve\n");
}

static int parse_long(const char *s, const char *what, long lo, long hi, long *out)
{
	return q4kh_cli_parse_long("serve", s, what, lo, hi, out);
}

static int parse_double(const char *s, const char *what, double lo, double hi, double *out)
{
	return q4kh_cli_parse_double("serve", s, what, lo, hi, out);
}

/*
 * --max-connections when not given: room for every request the slots and
 * the queue hold, and as many again for idle keep-alive connections and
 * for those on their way out, so that a request is refused only when the
 * queue is full (docs/serve.md, section 6). Given lower, a warning says
 * what follows.
 */
static void connection_limit(struct serve_opts *o)
{
	const long held = o->parallel + o->max_queue;

	if (!o->max_connections) {
		o->max_connections = 2 * held < 1024 ? 1024 : 2 * held;
		if (o->max_connections > MAX_CONNECTIONS)
			o->max_connections = MAX_CONNECTIONS;
	} else if (o->max_connections <= held) {
		serve_log("warning: --max-connections %ld is not above --parallel + --max-queue "
		          "(%ld): requests may get 503 before the queue is full",
		          o->max_connections, held);
	}
}

/* S, a value of --kv-pages or [serve] kv_pages: auto
 * (SERVE_KV_PAGES_AUTO) or pages from 0 to SERVE_MAX_KV_PAGES, into *OUT;
 * -1 for anything else (a sign or white space among it). */
static int kv_pages_value(const char *s, long *out)
{
	char *end;
	long v;

	if (!strcmp(s, "auto")) {
		*out = SERVE_KV_PAGES_AUTO;
		return 0;
	}
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || !isdigit((unsigned char)*s) || *end || v > SERVE_MAX_KV_PAGES)
		return -1;
	*out = v;
	return 0;
}

static int parse(int argc, char **argv, struct serve_opts *o)
{
	enum { O_HOST = 256, O_PORT, O_KEYFILE, O_PARALLEL, O_QUEUE, O_CONNS, O_STEP, O_BODY,
	       O_PROMPT, O_MAXTOK, O_IDLE, O_DRAIN, O_TEMP, O_TOPK, O_TOPP, O_SEED,
	       O_BACKEND, O_DEVICE, O_KERNEL, O_F2, O_REVALIDATE, O_SHADOW, O_PPATH,
	       O_CONFIG, O_PREFIX, O_KV_PAGES };
	static const struct option longs[] = {
		{ "model", required_argument, 0, 'm' },
		{ "host", required_argument, 0, O_HOST },
		{ "port", required_argument, 0, O_PORT },
		{ "api-key-file", required_argument, 0, O_KEYFILE },
		{ "ctx", required_argument, 0, 'c' },
		{ "parallel", required_argument, 0, O_PARALLEL },
		{ "max-queue", required_argument, 0, O_QUEUE },
		{ "step-tokens", required_argument, 0, O_STEP },
		{ "prefix-cache", required_argument, 0, O_PREFIX },
		{ "kv-pages", required_argument, 0, O_KV_PAGES },
		{ "max-connections", required_argument, 0, O_CONNS },
		{ "max-body", required_argument, 0, O_BODY },
		{ "max-prompt-tokens", required_argument, 0, O_PROMPT },
		{ "max-tokens", required_argument, 0, O_MAXTOK },
		{ "idle-timeout", required_argument, 0, O_IDLE },
		{ "shutdown-timeout", required_argument, 0, O_DRAIN },
		{ "temp", required_argument, 0, O_TEMP },
		{ "top-k", required_argument, 0, O_TOPK },
		{ "top-p", required_argument, 0, O_TOPP },
		{ "seed", required_argument, 0, O_SEED },
		{ "backend", required_argument, 0, O_BACKEND },
		{ "device", required_argument, 0, O_DEVICE },
		{ "kernel", required_argument, 0, O_KERNEL },
		{ "f2", required_argument, 0, O_F2 },
		{ "revalidate", no_argument, 0, O_REVALIDATE },
		{ "f2-shadow", required_argument, 0, O_SHADOW },
		{ "plugin-path", required_argument, 0, O_PPATH },
		{ "config", required_argument, 0, O_CONFIG },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	double d;
	long v;
	unsigned on = 1;
	int c;

	memset(o, 0, sizeof(*o));
	o->host = "127.0.0.1";
	o->port = 8080;
	o->parallel = 4;
	o->max_queue = 512;
	o->max_body = 1 << 20;
	o->max_tokens = 4096;
	o->idle_timeout = 30;
	o->drain_timeout = 10;
	o->prefix_cache = 1;
	o->kv_pages = KV_PAGES_UNSET;
	o->defaults.top_k = 40;
	o->defaults.top_p = 0.95f;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":m:c:h", longs, NULL)) != -1) {
		int rc = 0;

		switch (c) {
		case 'm': o->model = optarg; break;
		case O_HOST: o->host = optarg; break;
		case O_PORT: rc = parse_long(optarg, "--port", 0, 65535, &o->port); break;
		case O_KEYFILE: o->api_key_file = optarg; break;
		case 'c': rc = parse_long(optarg, "--ctx", 16, 1 << 20, &o->ctx); break;
		case O_PARALLEL: rc = parse_long(optarg, "--parallel", 1, 256, &o->parallel); break;
		case O_QUEUE: rc = parse_long(optarg, "--max-queue", 1, 1 << 20, &o->max_queue); break;
		case O_STEP: rc = parse_long(optarg, "--step-tokens", 1, 1 << 16, &o->step_tokens); break;
		case O_PREFIX:
			if (q4kh_parse_bool(optarg, &on)) {
				q4kh_cli_usage("serve", "--prefix-cache %s: expected " Q4KH_BOOL_WORDS,
				               optarg);
				rc = -1;
			}
			o->prefix_cache = (int)on;
			break;
		case O_KV_PAGES:
			rc = kv_pages_value(optarg, &o->kv_pages);
			if (rc)
				q4kh_cli_usage("serve", "--kv-pages must be auto or a whole number in "
				               "[0, %ld], got '%s'", SERVE_MAX_KV_PAGES, optarg);
			break;
		case O_CONNS:
			rc = parse_long(optarg, "--max-connections", 1, MAX_CONNECTIONS,
			                &o->max_connections);
			break;
		case O_BODY: rc = parse_long(optarg, "--max-body", 64, 1L << 30, &o->max_body); break;
		case O_PROMPT:
			rc = parse_long(optarg, "--max-prompt-tokens", 1, 1 << 20, &o->max_prompt);
			break;
		case O_MAXTOK: rc = parse_long(optarg, "--max-tokens", 1, 1 << 20, &o->max_tokens); break;
		case O_IDLE: rc = parse_long(optarg, "--idle-timeout", 1, 86400, &o->idle_timeout); break;
		case O_DRAIN:
			rc = parse_long(optarg, "--shutdown-timeout", 0, 86400, &o->drain_timeout);
			break;
		case O_TEMP:
			rc = parse_double(optarg, "--temp", 0, Q4KH_TEMPERATURE_MAX, &d);
			o->defaults.temperature = (float)d;
			break;
		case O_TOPK:
			rc = parse_long(optarg, "--top-k", 0, INT_MAX, &v);
			o->defaults.top_k = (int32_t)v;
			break;
		case O_TOPP:
			rc = parse_double(optarg, "--top-p", 0, 1, &d);
			o->defaults.top_p = (float)d;
			break;
		case O_SEED:
			rc = parse_long(optarg, "--seed", 0, LONG_MAX, &v);
			o->defaults.seed = (uint64_t)v;
			o->seed_set = 1;
			break;
		case O_BACKEND: o->backend = optarg; break;
		case O_DEVICE: rc = parse_long(optarg, "--device", 0, 1023, &o->device); break;
		case O_KERNEL: o->kernel = optarg; break;
		case O_F2: o->f2 = optarg; break;
		case O_REVALIDATE: o->f2 = "fresh"; break;
		case O_SHADOW: rc = parse_double(optarg, "--f2-shadow", 0, 1, &o->shadow_rate); break;
		case O_PPATH: o->plugin_path = optarg; break;
		case O_CONFIG: o->config_file = optarg; break;
		case 'h': usage(stdout); return 1;
		default:
			q4kh_cli_bad_option("serve", argv, c);
			return -1;
		}
		if (rc)
			return -1;
	}
	if (q4kh_cli_given_check("serve", &(struct q4kh_cli_given){ o->model, o->config_file,
	                                                  o->plugin_path, o->backend,
	                                                  "--kernel", o->kernel }))
		return -1;
	if (q4kh_cli_not_empty("serve", "--api-key-file", o->api_key_file,
	                       "the path of a file whose first line is the API key"))
		return -1;
	if (optind < argc) {
		q4kh_cli_extra_argument("serve", argv[optind]);
		return -1;
	}
	connection_limit(o);
	return 0;
}

/* The API key from --api-key-file (its first line) or Q4KHOST_API_KEY. */
static int load_api_key(struct serve *srv, struct q4kh_error *err)
{
	const char *env = q4kh_env("Q4KHOST_API_KEY");
	FILE *f;
	size_t n;

	if (!srv->o.api_key_file) {
		/* set but empty reads as unset, said: a deploy that lost its secret */
		if (env && !*env)
			serve_log("warning: Q4KHOST_API_KEY is set but empty, which means no key: "
			          "the server is open to every client that reaches it");
		else if (env)
			snprintf(srv->api_key, sizeof(srv->api_key), "%s", env);
		else /* the warning --help promises */
			serve_log("warning: no API key (neither --api-key-file nor Q4KHOST_API_KEY "
			          "gives one): anyone who can reach the port can use it");
		if (srv->api_key[0])
			serve_log("API key: required (from Q4KHOST_API_KEY)");
		return 0;
	}
	f = fopen(srv->o.api_key_file, "r");
	if (!f)
		return q4kh_fail(err, "%s: cannot read the API key: %s", srv->o.api_key_file,
		                 strerror(errno));
	if (!fgets(srv->api_key, sizeof(srv->api_key), f))
		srv->api_key[0] = 0;
	fclose(f);
	n = strcspn(srv->api_key, "\r\n");
	srv->api_key[n] = 0;
	if (!n)
		return q4kh_fail(err, "%s: the first line holds no API key", srv->o.api_key_file);
	serve_log("API key: required (from %s)", srv->o.api_key_file);
	return 0;
}

/* --kv-pages, else [serve] kv_pages, else auto; where it was set into
 * srv->kv_pages_origin. -1 with err naming the file, line and what is
 * taken for a bad value in a file. */
static int kv_pages(struct serve *srv, struct q4kh_error *err)
{
	char *origin = srv->kv_pages_origin;
	const size_t cap = sizeof(srv->kv_pages_origin);
	const char *s;

	if (srv->o.kv_pages != KV_PAGES_UNSET) {
		snprintf(origin, cap, "--kv-pages");
		return 0;
	}
	s = q4kh_config_where(srv->config, "serve", "kv_pages", origin, cap);
	if (!s) {
		snprintf(origin, cap, "the default");
		srv->o.kv_pages = SERVE_KV_PAGES_AUTO;
		return 0;
	}
	if (kv_pages_value(s, &srv->o.kv_pages))
		return q4kh_fail(err, "%s: kv_pages = \"%s\": expected auto or a whole number from 0 to %ld",
		                 origin, s, SERVE_MAX_KV_PAGES);
	return 0;
}

/* Config, plugins, model file, tokenizer: everything before the choice. */
static int setup(struct serve *srv, struct q4kh_error *err)
{
	const struct serve_opts *o = &srv->o;
	char origin[700];
	int bad_file, rc, deep;
	const char *base;

	if (q4kh_cli_config("serve", o->config_file, 0, &srv->config, err))
		return Q4KH_EXIT_INPUT;
	if (q4kh_settings_f2_mode(srv->config, o->f2, &srv->mode, srv->mode_origin,
	                          sizeof(srv->mode_origin), &bad_file, err) ||
	    q4kh_settings_f2_deep_probe(srv->config, &deep, srv->deep_origin,
	                                sizeof(srv->deep_origin), &bad_file, err))
		return bad_file ? Q4KH_EXIT_INPUT : Q4KH_EXIT_USAGE;
	if (deep) {
		/* deep receipts only: the guard judges on the deep probe */
		srv->rq.probe = Q4KH_F2_PROBE_DEEP;
		srv->rq.deep_ctx = (uint32_t)o->ctx;
		srv->rq.probe_origin = srv->deep_origin;
	}
	if (kv_pages(srv, err))
		return Q4KH_EXIT_INPUT;
	if ((rc = q4kh_cli_scan(srv->config, o->plugin_path, &srv->registry, err)))
		return rc;
	if (q4kh_host_open(&srv->host, srv->registry, srv->config, NULL, err))
		return Q4KH_EXIT_FAIL;
	if ((rc = q4kh_cli_check_plugins("serve", srv->registry, srv->config, &srv->host, 0, err)))
		return rc;
	srv->rq.host = &srv->host;
	srv->rq.config_file = o->config_file;
	srv->rq.backend = q4kh_settings_backend(o->backend, origin, sizeof(origin));
	srv->rq.device = (uint32_t)o->device;
	srv->rq.kernel = o->kernel;
	srv->rq.mode = srv->mode;
	srv->rq.mode_origin = srv->mode_origin;
	if ((rc = q4kh_cli_check_receipts(&srv->rq, srv->config, err)))
		return rc;
	if (o->model)
		snprintf(srv->model_path, sizeof(srv->model_path), "%s", o->model);
	else if (access(q4kh_default_model_path(srv->model_path, sizeof(srv->model_path)), F_OK)) {
		q4kh_fail(err, "%s: no such file (the default model: %s, or pass -m FILE)",
		          srv->model_path, q4kh_cli_fetch_hint());
		return Q4KH_EXIT_INPUT;
	}
	/* A bad file is the user's input error (exit 3), whatever serves it. */
	if (q4kh_host_open_model(&srv->host, srv->model_path, err))
		return Q4KH_EXIT_INPUT;
	srv->gguf = srv->host.model->gguf;
	srv->tok = srv->host.tok;
	base = strrchr(srv->model_path, '/');
	snprintf(srv->model_id, sizeof(srv->model_id), "%.255s", base ? base + 1 : srv->model_path);
	if (load_api_key(srv, err))
		return Q4KH_EXIT_INPUT;
	srv->n_slots = (int)o->parallel;
	srv->n_ctx = (uint32_t)o->ctx;
	return 0;
}

/* Say what serves, and what F2 still measures. */
static void announce(struct serve *srv)
{
	const struct serve_path *p = srv->cur;
	char what[400];

	serve_path_describe(p, what, sizeof(what));
	serve_log("model %s (%s), %d slot%s of %u tokens", srv->model_path, srv->model_id,
	          srv->n_slots, srv->n_slots == 1 ? "" : "s", srv->n_ctx);
	if (p->paged && srv->o.kv_pages == SERVE_KV_PAGES_AUTO)
		serve_log("KV cache: %d pages of %d tokens (auto, %s: as many as --parallel %d "
		          "whole contexts of %u tokens hold) shared by the slots; a request waits "
		          "for the pages its prompt and max_tokens may take",
		          p->paged->pool.n_pages, p->paged->pool.page_size, srv->kv_pages_origin,
		          srv->n_slots, srv->n_ctx);
	else if (p->paged)
		serve_log("KV cache: %d pages of %d tokens (%s) shared by the slots, %.1f whole "
		          "contexts; a request waits for the pages its prompt and max_tokens may "
		          "take, and one that needs more than %d is refused",
		          p->paged->pool.n_pages, p->paged->pool.page_size, srv->kv_pages_origin,
		          (double)p->paged->pool.n_pages * p->paged->pool.page_size / srv->n_ctx,
		          p->paged->pool.n_pages);
	else if (p->kv_why[0])
		serve_log("KV cache: a whole context's per slot, not pages (auto, %s): %s",
		          srv->kv_pages_origin, p->kv_why);
	else
		serve_log("KV cache: a whole context's per slot (0 pages, %s)",
		          srv->kv_pages_origin);
	serve_log("serving %s; F2: %s%s%s%s: %s", what, p->sel.f2_verdict,
	          p->sel.f2_source[0] ? " (" : "", p->sel.f2_source, p->sel.f2_source[0] ? ")" : "",
	          p->sel.f2_message);
	if (p->sel.f2_probe[0]) /* as run's report says it */
		serve_log("F2 probe: %s", p->sel.f2_probe);
	for (const char *s = p->sel.steps; *s;) {
		size_t len = strcspn(s, "\n");
		serve_log("F2 rejected first: %.*s", (int)len, s);
		s += len + (s[len] == '\n');
	}
	if (p->unverified)
		serve_log("F2 IS OFF: %s serves UNVERIFIED; /health and every response say so", p->name);
	for (int k = 0; k < srv->n_pending; k++) {
		const struct q4kh_candidate *c = &srv->plan[srv->pending[k]];
		/* WHY starts with the kernel (the variant, or the built-in
		 * kernels) and goes on with why it was chosen: the device, which
		 * it does not name, goes between */
		const char *kernel = c->variant ? c->variant : "the built-in kernels";
		size_t n = strlen(kernel);
		const char *how = strncmp(c->why, kernel, n)  ? c->why
		                  : c->why[n] == ',' ? c->why + n + 2
		                                     : c->why + n;

		serve_log("F2 measures %s on %s, device %u, in the background%s%s%s; it serves "
		          "once it passes", kernel, c->backend, c->device, *how ? " (" : "", how,
		          *how ? ")" : "");
	}
	if (strcmp(srv->o.host, "127.0.0.1") && strcmp(srv->o.host, "::1") &&
	    strcmp(srv->o.host, "localhost"))
		serve_log("warning: --host %s may be reachable from other machines%s", srv->o.host,
		          srv->api_key[0] ? "" : ", and no API key is set");
}

static struct serve *the_server; /* for the signal handler */

/* The first SIGTERM or SIGINT takes effect here, not when the main thread
 * wakes: from the handler on, every new request is answered 503 (a
 * lock-free atomic store and sem_post are async-signal-safe). A second one
 * 0.5 s or more later ends serve at once (interrupt.h), drain or not. */
static void on_first_signal(int sig)
{
	(void)sig;
	__atomic_store_n(&the_server->draining, 1, __ATOMIC_RELAXED);
	sem_post(&the_server->stop);
}

static void install_signals(struct serve *srv)
{
	the_server = srv;
	signal(SIGPIPE, SIG_IGN); /* a client that left is noticed by its write */
	q4kh_interrupt_install_notify(on_first_signal);
}

/* Stop accepting, let requests finish within the bound, cancel the rest. */
static void shut_down(struct serve *srv)
{
	serve_log("stopping: no new connections; requests in flight get %ld s to finish",
	          srv->o.drain_timeout);
	serve_http_quiesce(srv);
	serve_engine_drain(srv, (double)srv->o.drain_timeout);
	serve_engine_stop(srv);
	serve_http_flush(srv, 2.0); /* cancelled streams say so and end */
	serve_http_stop(srv);
	serve_trust_stop(srv);
	serve_shadow_stop(srv);
	serve_log("stopped");
}

static void serve_free(struct serve *srv)
{
	serve_path_close(srv->cur);
	for (int i = 0; i < srv->n_retired; i++)
		serve_path_close(srv->retired[i]);
	for (int i = 0; srv->logits && i < srv->n_slots; i++)
		free(srv->logits[i]);
	free(srv->logits);
	free(srv->batch);
	free(srv->due);
	free(srv->batch_slots);
	free(srv->prefix_mine);
	free(srv->prefix_pick);
	free(srv->take);
	free(srv->slots);
	free(srv->queue);
	q4kh_decide_guard_close(&srv->judge);
	q4kh_host_close(&srv->host);
	q4kh_registry_free(srv->registry);
	q4kh_config_free(srv->config);
	pthread_mutex_destroy(&srv->lock);
	pthread_cond_destroy(&srv->work);
	sem_destroy(&srv->stop);
	free(srv);
}

int q4kh_cmd_serve(int argc, char **argv)
{
	struct serve *srv = calloc(1, sizeof(*srv));
	struct q4kh_error err = { { 0 } };
	int rc;

	if (!srv)
		return Q4KH_EXIT_FAIL;
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->work, NULL);
	sem_init(&srv->stop, 0, 0);
	srv->listen_fd = -1;
	srv->t_start = serve_now();
	srv->started = (long)time(NULL);
	rc = parse(argc, argv, &srv->o);
	if (rc) {
		serve_free(srv);
		return rc > 0 ? Q4KH_EXIT_OK : Q4KH_EXIT_USAGE;
	}
	/* a host that cannot be listened on is a usage error, a port in use a
	 * failure, both said before the model loads */
	rc = serve_http_resolve(srv, &err)     ? Q4KH_EXIT_USAGE
	     : serve_http_port_free(srv, &err) ? Q4KH_EXIT_FAIL
	                                       : setup(srv, &err);
	if (!rc) {
		int t = serve_trust_start(srv, &err);
		rc = t == -2 ? Q4KH_EXIT_PLUGIN : t ? Q4KH_EXIT_FAIL : 0;
	}
	if (!rc) {
		srv->n_ctx = srv->cur->sessions[0]->p.n_ctx;
		srv->n_vocab = (int32_t)srv->cur->m->hp.n_vocab;
		announce(srv);
		install_signals(srv);
		if (serve_engine_start(srv, &err) ||
		    serve_shadow_start(srv, &err) || serve_http_start(srv, &err) ||
		    serve_trust_background(srv, &err))
			rc = Q4KH_EXIT_FAIL;
	}
	if (rc) {
		fprintf(stderr, "q4khost serve: %s\n", err.msg[0] ? err.msg : "cannot start");
		serve_trust_stop(srv);
		serve_engine_stop(srv);
		serve_http_stop(srv);
		serve_shadow_stop(srv);
		serve_free(srv);
		return rc;
	}
	while (sem_wait(&srv->stop) && errno == EINTR)
		;
	shut_down(srv);
	serve_free(srv);
	return Q4KH_EXIT_OK;
}
