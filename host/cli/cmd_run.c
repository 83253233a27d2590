/* q4khost run: tokenize a prompt, prefill, decode, stream text, report. */
#include "buildconf.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cli.h"
#include "config.h"
#include "generate.h"
#include "interrupt.h"
#include "kernel.h"
#include "model.h"
#include "progress.h"
#include "prompt.h"
#include "select.h"
#include "registry.h"
#include "report.h"
#include "sampler.h"
#include "session.h"
#include "settings.h"
#include "tokenizer.h"

#define DEFAULT_PROMPT "The three primary colors are"

struct run_opts {
	const char *model, *prompt, *plugin_path, *config_file, *backend, *kernel;
	const char *f2; /* the --f2 value, NULL when not given */
	const char *f2_probe; /* the --f2-probe value, NULL when not given */
	const char *chat_template; /* --chat-template NAME, NULL: the file's */
	long n_predict, device, ctx, batch, threads;
	struct q4kh_sampler_params sp;
	int raw, json, no_parse_special;
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost run [-m FILE] [-p TEXT] [-n N] [OPTIONS]\n\n"
	        "Generate text from a GGUF model, streamed to stdout; a report of\n"
	        "what really ran (backend, device, kernels, plugin files, speed) goes\n"
	        "to stderr.\n\n"
	        "  -m, --model FILE      GGUF model (default: $Q4KHOST_MODEL, else the\n"
	        "                        default model that fetch-model.sh fetches\n"
	        "                        into the cache folder; man q4khost, FILES)\n"
	        "  -p, --prompt TEXT     prompt (default: \"" DEFAULT_PROMPT "\")\n"
	        "  -n, --n-predict N     tokens to generate, at least 1 (default 64)\n"
	        "  -c, --ctx N           context length in tokens (default: the model's\n"
	        "                        trained context, at most 4096; more than it\n"
	        "                        is warned about)\n"
	        "  -b, --batch N         prompt tokens per step, the chunks of a long\n"
	        "                        prompt (default: 512 on a GPU, 128 on cpu-fast,\n"
	        "                        64 on the cpu reference)\n"
	        "      --temp T          sampling temperature, 0 to 2 (OpenAI's range, as\n"
	        "                        serve takes); 0 = greedy (default 0)\n"
	        "      --top-k K         keep the K most likely tokens; 0 = every token,\n"
	        "                        no cut (default 40)\n"
	        "      --top-p P         nucleus sampling threshold (default 0.95)\n"
	        "      --seed S          random seed (default 0); the report and --json\n"
	        "                        name all four (or greedy), to run it again\n"
	        "      --raw             do not apply the model's chat template (not with\n"
	        "                        --chat-template)\n"
	        "      --chat-template NAME  lay the prompt out as chat family NAME\n"
	        "                        (chatml, llama3, deepseek3, ...; none = raw text)\n"
	        "                        instead of the model's own template's family\n"
	        "      --no-parse-special  special tokens written in the prompt stay text\n"
	        "      --backend NAME    backend plugin (default: $Q4KHOST_BACKEND, else\n"
	        "                        the first GPU backend whose kernels pass F2,\n"
	        "                        else the reference cpu)\n"
	        "      --f2 MODE         parity guard: auto (a valid receipt, else measure;\n"
	        "                        default: $Q4KHOST_F2, else [f2] mode, else auto),\n"
	        "                        fresh, off, require\n"
	        "      --revalidate      the same as --f2 fresh\n"
	        "      --f2-probe KIND   what F2 judges a candidate on: builtin (its own\n"
	        "                        text; default: [f2] probe, else builtin) or\n"
	        "                        prompt (this prompt as tokenized for the run,\n"
	        "                        its last f2_probe_tokens tokens; one of fewer\n"
	        "                        than 8 tokens falls back to builtin, saying why)\n"
	        "      --device N        device index within the backend (default 0)\n"
	        "      --kernel LIST     kernel variants to try, in order, for the weight\n"
	        "                        types they implement: NAME[,NAME...], each\n"
	        "                        optionally DEVICE=NAME (index, UUID, name or\n"
	        "                        arch); none = the built-in kernels (default:\n"
	        "                        $Q4KHOST_Q4K_KERNEL, else [gpu.*] q4k_kernel in\n"
	        "                        the config, else by score; man q4khost.ini)\n"
	        "      --threads N       threads of the cpu backends (the reference and\n"
	        "                        every other of kind cpu) and of the kernel\n"
	        "                        variants for them (default: [plugin.NAME]\n"
	        "                        threads, else every online CPU)\n"
	        "      --plugin-path P   ':'-separated plugin folders\n"
	        "      --config FILE     extra INI configuration file\n"
	        "      --json            print one JSON object (prompt, text and report)\n"
	        "                        instead of streaming, an error's too (\"stop\":\n"
	        "                        \"error\", with \"error\"); bytes of the prompt or\n"
	        "                        text that are not UTF-8 become U+FFFD there\n"
	        "  -h, --help            this help\n\n"
	        "SIGINT (Ctrl-C) or SIGTERM stops the generation: the text so far, a\n"
	        "newline and the report (stop: interrupted) are still printed, or the\n"
	        "JSON object with them; a second signal, 0.5 s or more after the\n"
	        "first, ends the process at once (signals that come together, as\n"
	        "timeout -s INT sends them, are one request).\n"
	        "A reader of the text that goes away (| head) stops it too, with the\n"
	        "report (stop: standard output closed) and exit code 0.\n\n"
	        "A failure while generating (logits with no finite value, output that\n"
	        "cannot be written) still prints the report, then the error.\n\n"
	        "exit codes: 0 ok, 1 failure (the text, the report or a message that\n"
	        "            cannot be written included), 2 usage (a prompt longer\n"
	        "            than the context included), 3 bad model or config file,\n"
	        "            4 the requested backend or kernel cannot serve,\n"
	        "            130 stopped by SIGINT, 143 stopped by SIGTERM\n");
}

static int parse_long(const char *s, const char *what, long lo, long hi, long *out)
{
	return q4kh_cli_parse_long("run", s, what, lo, hi, out);
}

/* A float option: a double in [lo, hi] rounds to a float in it (the bounds are floats). */
static int parse_float(const char *s, const char *what, float lo, float hi, float *out)
{
	double v;

	if (q4kh_cli_parse_double("run", s, what, lo, hi, &v))
		return -1;
	*out = (float)v;
	return 0;
}

/* run's options, for parse and q4kh_cli_json_asked */
enum { O_TEMP = 256, O_TOPK, O_TOPP, O_SEED, O_RAW, O_BACKEND, O_DEVICE,
       O_PPATH, O_CONFIG, O_JSON, O_THREADS, O_KERNEL, O_F2, O_REVALIDATE,
       O_CHAT_TEMPLATE, O_NO_PARSE_SPECIAL, O_F2_PROBE };
static const struct option longs[] = {
	{ "model", required_argument, 0, 'm' },
	{ "prompt", required_argument, 0, 'p' },
	{ "n-predict", required_argument, 0, 'n' },
	{ "ctx", required_argument, 0, 'c' },
	{ "batch", required_argument, 0, 'b' },
	{ "temp", required_argument, 0, O_TEMP },
	{ "top-k", required_argument, 0, O_TOPK },
	{ "top-p", required_argument, 0, O_TOPP },
	{ "seed", required_argument, 0, O_SEED },
	{ "raw", no_argument, 0, O_RAW },
	{ "backend", required_argument, 0, O_BACKEND },
	{ "device", required_argument, 0, O_DEVICE },
	{ "plugin-path", required_argument, 0, O_PPATH },
	{ "config", required_argument, 0, O_CONFIG },
	{ "json", no_argument, 0, O_JSON },
	{ "threads", required_argument, 0, O_THREADS },
	{ "kernel", required_argument, 0, O_KERNEL },
	{ "f2", required_argument, 0, O_F2 },
	{ "revalidate", no_argument, 0, O_REVALIDATE },
	{ "f2-probe", required_argument, 0, O_F2_PROBE },
	{ "chat-template", required_argument, 0, O_CHAT_TEMPLATE },
	{ "no-parse-special", no_argument, 0, O_NO_PARSE_SPECIAL },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};
#define SHORTS ":m:p:n:c:b:h"

static int parse(int argc, char **argv, struct run_opts *o)
{
	struct q4kh_error err;
	enum q4kh_chat_format family;
	long v;
	int c;

	memset(o, 0, sizeof(*o));
	o->prompt = DEFAULT_PROMPT;
	o->n_predict = 64;
	o->sp.top_k = 40;
	o->sp.top_p = 0.95f;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, SHORTS, longs, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'n':
			if (parse_long(optarg, "--n-predict", 1, INT_MAX, &o->n_predict))
				return -1;
			break;
		case 'c':
			if (parse_long(optarg, "--ctx", 1, 1 << 20, &o->ctx))
				return -1;
			break;
		case 'b':
			if (parse_long(optarg, "--batch", 1, 1 << 16, &o->batch))
				return -1;
			break;
		case O_TEMP:
			if (parse_float(optarg, "--temp", 0, Q4KH_TEMPERATURE_MAX, &o->sp.temperature))
				return -1;
			break;
		case O_TOPK:
			if (parse_long(optarg, "--top-k", 0, INT_MAX, &v))
				return -1;
			o->sp.top_k = (int32_t)v;
			break;
		case O_TOPP:
			if (parse_float(optarg, "--top-p", 0, 1, &o->sp.top_p))
				return -1;
			break;
		case O_SEED:
			if (parse_long(optarg, "--seed", 0, LONG_MAX, &v))
				return -1;
			o->sp.seed = (uint64_t)v;
			break;
		case O_RAW: o->raw = 1; break;
		case O_CHAT_TEMPLATE:
			if (q4kh_prompt_family(optarg, &family, &err)) {
				q4kh_cli_usage("run", "%s", err.msg);
				return -1;
			}
			o->chat_template = optarg;
			break;
		case O_NO_PARSE_SPECIAL: o->no_parse_special = 1; break;
		case O_BACKEND: o->backend = optarg; break;
		case O_KERNEL: o->kernel = optarg; break;
		case O_REVALIDATE: o->f2 = "fresh"; break;
		case O_F2: o->f2 = optarg; break;
		case O_F2_PROBE: o->f2_probe = optarg; break;
		case O_DEVICE:
			if (parse_long(optarg, "--device", 0, 1023, &o->device))
				return -1;
			break;
		case O_PPATH: o->plugin_path = optarg; break;
		case O_CONFIG: o->config_file = optarg; break;
		case O_JSON: o->json = 1; break;
		case O_THREADS:
			if (parse_long(optarg, "--threads", 1, 256, &o->threads))
				return -1;
			break;
		case 'h': usage(stdout); return 1;
		default:
			q4kh_cli_bad_option("run", argv, c);
			return -1;
		}
	}
	if (q4kh_cli_given_check("run", &(struct q4kh_cli_given){ o->model, o->config_file,
	                                                o->plugin_path, o->backend, "--kernel",
	                                                o->kernel }))
		return -1;
	if (optind < argc) {
		q4kh_cli_usage("run", "unexpected argument '%s': the prompt goes after -p (try "
		               "q4khost run --help)", argv[optind]);
		return -1;
	}
	if (o->raw && o->chat_template) {
		q4kh_cli_usage("run", "--raw and --chat-template %s contradict each other: --raw "
		               "lays out no chat template (--chat-template none says the same)",
		               o->chat_template);
		return -1;
	}
	return 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Everything a run holds, so one cleanup path frees it. */
struct run {
	struct q4kh_config *config;
	struct q4kh_registry *registry;
	/* the model file, its tokenizer, the backends and variants, each
	 * opened once for the run (host.h) */
	struct q4kh_host host;
	struct q4kh_selection sel; /* backend, kernel variant, model */
	struct q4kh_model *model;  /* sel.model */
	const struct q4kh_tokenizer *tok; /* host.tok */
	struct q4kh_session *session;
	struct q4kh_sampler *sampler;
	int32_t *ids; /* the prompt, tokenized before F2 (it may be the probe) */
	size_t n_ids;
	const char *chat_name; /* the prompt's layout, for the report */
	/* the model file, known before anything is chosen: for the report of
	 * a run stopped then ("" before it was opened) */
	char model_path[4096], arch[32];
	uint32_t n_layer;
	/* the generation (generate.h): at temperature 0 the next token is
	 * the session's greedy pick (made on the device when the backend has
	 * top2), else it is sampled (sampler) from the logits */
	struct q4kh_gen g;
	float *logits;
	char *text; /* generated text, kept for --json */
	size_t text_len, text_cap;
	/* the command's start, the end of the last start-up phase timed, and
	 * the phases (report.h) */
	double t0, mark;
	struct q4kh_startup startup;
};

/* Seconds since the last phase ended, into *PHASE; the next starts now. */
static void phase_done(struct run *r, double *phase)
{
	double t = now();

	*phase = t - r->mark;
	r->mark = t;
}

static void run_free(struct run *r)
{
	q4kh_sampler_free(r->sampler);
	q4kh_session_free(r->session);
	q4kh_selection_close(&r->sel);
	q4kh_host_close(&r->host);
	q4kh_registry_free(r->registry);
	q4kh_config_free(r->config);
	free(r->ids);
	free(r->logits);
	free(r->text);
}

/* -1 with errno when the text could not be written or kept. */
static int emit(struct run *r, const char *piece, size_t len, int stream)
{
	if (stream)
		return fwrite(piece, 1, len, stdout) != len || fflush(stdout) ? -1 : 0;
	if (r->text_len + len + 1 > r->text_cap) {
		size_t cap = (r->text_cap + len + 1) * 2;
		char *t = realloc(r->text, cap);
		if (!t)
			return -1;
		r->text = t;
		r->text_cap = cap;
	}
	memcpy(r->text + r->text_len, piece, len);
	r->text_len += len;
	r->text[r->text_len] = 0;
	return 0;
}

/* Open config, plugins, backend, model, tokenizer and session. */
/* --threads for every backend of the host's cores (kind "cpu") and every
 * kernel variant for them: they run on the same cores and the ABI does
 * not pass the backend's count on. */
static int set_cpu_threads(struct run *r, long threads, struct q4kh_error *err)
{
	char v[32], section[96];

	snprintf(v, sizeof(v), "%ld", threads);
	for (size_t i = 0; i < r->registry->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->registry->plugins[i];

		if (p->state != Q4KH_PLUGIN_ACCEPTED ||
		    strcmp(p->desc->kind == Q4KH_KIND_KERNEL ? p->desc->kernel->backend
		                                             : q4kh_backend_kind(p),
		           "cpu"))
			continue;
		snprintf(section, sizeof(section), "plugin.%s", p->name);
		if (q4kh_config_set(r->config, section, "threads", v, "--threads", err))
			return -1;
	}
	return 0;
}

/* A context longer than the model was trained on runs, but is no promise. */
static void warn_beyond_training(const struct run_opts *o, const struct q4kh_model *m)
{
	if (o->ctx && m->hp.n_ctx_train && o->ctx > (long)m->hp.n_ctx_train)
		fprintf(stderr,
		        "q4khost run: warning: --ctx %ld is above the %u tokens the model was trained on (%s.context_length); text past position %u is unreliable\n",
		        o->ctx, m->hp.n_ctx_train, m->arch->name, m->hp.n_ctx_train);
}

/*
 * The prompt as the model reads it, into r->ids, with the tokenizer
 * r->tok, from the model file G: before anything is chosen, because F2
 * may judge on it (--f2-probe prompt).
 */
static int tokenize_prompt(const struct run_opts *o, struct run *r,
                           const struct q4kh_gguf *g, struct q4kh_error *err)
{
	struct q4kh_prompt pr;
	char warning[512];

	if (q4kh_prompt_init(&pr, g, o->raw ? "none" : o->chat_template,
	                     !o->no_parse_special, err))
		return Q4KH_EXIT_FAIL;
	if (q4kh_prompt_warning(&pr, warning, sizeof(warning)))
		fprintf(stderr, "q4khost run: warning: %s\n", warning);
	r->chat_name = o->raw ? "off (--raw)" : q4kh_chat_name(pr.chat);
	if (q4kh_prompt_tokenize(&pr, r->tok, o->prompt, 1, &r->ids, &r->n_ids, err))
		return Q4KH_EXIT_FAIL;
	if (r->n_ids == 0) {
		q4kh_fail(err, "the prompt tokenized to nothing");
		return Q4KH_EXIT_FAIL;
	}
	return 0;
}

static int setup(const struct run_opts *o, struct run *r, struct q4kh_error *err)
{
	char model_path[4096];
	const char *model;
	struct q4kh_session_params sp = { 0 };
	struct q4kh_select_request rq = { 0 };
	char origin[700], backend_origin[64], probe_origin[700];
	int bad_file, rc, deep;

	if (q4kh_cli_config("run", o->config_file, 0, &r->config, err))
		return Q4KH_EXIT_INPUT;
	if (q4kh_settings_f2_mode(r->config, o->f2, &rq.mode, origin, sizeof(origin),
	                          &bad_file, err))
		return bad_file ? Q4KH_EXIT_INPUT : Q4KH_EXIT_USAGE;
	if (q4kh_settings_f2_probe(r->config, o->f2_probe, &rq.probe, probe_origin,
	                           sizeof(probe_origin), &bad_file, err) ||
	    q4kh_settings_f2_deep_probe(r->config, &deep, probe_origin, sizeof(probe_origin),
	                                &bad_file, err))
		return bad_file ? Q4KH_EXIT_INPUT : Q4KH_EXIT_USAGE;
	if (deep) {
		/* deep receipts only: F2 measures the deep probe where none is
		 * valid, as it measures any probe without a receipt */
		rq.probe = Q4KH_F2_PROBE_DEEP;
		rq.deep_ctx = (uint32_t)o->ctx;
	}
	if (o->threads) {
		char v[32];
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		if (cpus > 0 && o->threads > cpus)
			fprintf(stderr, "q4khost run: warning: --threads %ld is more than the %ld "
			        "online CPUs: the extra threads share them and are usually slower\n",
			        o->threads, cpus);
		snprintf(v, sizeof(v), "%ld", o->threads);
		if (q4kh_config_set(r->config, "plugin.cpu", "threads", v, "--threads", err))
			return Q4KH_EXIT_FAIL;
	}
	/* --threads reaches every cpu plugin before the settings check
	 * starts them, once, in the run's host context */
	if ((rc = q4kh_cli_scan(r->config, o->plugin_path, &r->registry, err)))
		return rc;
	if (o->threads && set_cpu_threads(r, o->threads, err))
		return Q4KH_EXIT_FAIL;
	if (q4kh_host_open(&r->host, r->registry, r->config, NULL, err))
		return Q4KH_EXIT_FAIL;
	if ((rc = q4kh_cli_check_plugins("run", r->registry, r->config, &r->host, 0, err)))
		return rc;
	q4kh_cli_warn_selectors("run", r->registry, o->kernel);
	phase_done(r, &r->startup.plugins);
	rq.config_file = o->config_file;
	rq.mode_origin = origin;
	rq.backend = q4kh_settings_backend(o->backend, backend_origin, sizeof(backend_origin));
	if (q4kh_registry_check_backend(r->registry, rq.backend, backend_origin, err))
		return Q4KH_EXIT_PLUGIN;
	rq.device = (uint32_t)o->device;
	rq.kernel = o->kernel;
	rq.host = &r->host;
	if ((rc = q4kh_cli_check_receipts(&rq, r->config, err)))
		return rc;
	model = q4kh_cli_model(o->model, model_path, sizeof(model_path), err);
	if (!model)
		return Q4KH_EXIT_INPUT;
	/* A bad file is the user's input error (exit 3), whatever serves it. */
	if (q4kh_host_open_model(&r->host, model, err))
		return Q4KH_EXIT_INPUT;
	r->tok = r->host.tok;
	snprintf(r->model_path, sizeof(r->model_path), "%s", model);
	snprintf(r->arch, sizeof(r->arch), "%s", r->host.model->arch->name);
	r->n_layer = r->host.model->hp.n_layer;
	if ((rc = tokenize_prompt(o, r, r->host.model->gguf, err)))
		return rc;
	phase_done(r, &r->startup.model);
	rq.probe_origin = probe_origin;
	rq.prompt = r->ids;
	rq.n_prompt = r->n_ids;
	if (q4kh_select(&rq, &r->sel, err)) {
		if (r->sel.interrupted)
			return q4kh_interrupt_exit_code(r->sel.interrupted);
		return r->sel.explicit_failure ? Q4KH_EXIT_PLUGIN : Q4KH_EXIT_FAIL;
	}
	r->model = r->sel.model;
	phase_done(r, &r->startup.choice);
	warn_beyond_training(o, r->model);
	sp.n_ctx = (uint32_t)o->ctx;
	sp.n_batch = (uint32_t)o->batch;
	/* the prompt's graphs are start-up: its prefill times its compute */
	if (q4kh_session_new(r->model, &sp, &r->session, err) ||
	    (r->n_ids <= r->session->p.n_ctx &&
	     q4kh_session_prepare(r->session, (int64_t)r->n_ids, err)))
		return Q4KH_EXIT_FAIL;
	r->sampler = q4kh_sampler_new(&o->sp, r->model->hp.n_vocab);
	r->logits = malloc(sizeof(float) * r->model->hp.n_vocab);
	if (!r->sampler || !r->logits) {
		q4kh_fail(err, "out of memory");
		return Q4KH_EXIT_FAIL;
	}
	r->g = (struct q4kh_gen){
		.sampler = q4kh_sampler_greedy(&o->sp) ? NULL : r->sampler, .logits = r->logits,
		.n_vocab = r->model->hp.n_vocab, .tok = r->tok, .max_tokens = o->n_predict,
	};
	phase_done(r, &r->startup.session);
	return 0;
}

/* Stop, and say why in the report, when a SIGINT or SIGTERM came. */
static int stopped(struct q4kh_report *rep, char *reason, size_t cap)
{
	int sig = q4kh_interrupted();

	if (sig) {
		snprintf(reason, cap, "interrupted by %s", q4kh_signal_name(sig));
		rep->stop_reason = reason;
	}
	return sig;
}

/*
 * The prompt, one batch of the session at a time (the batches it would run
 * anyway), so that a long prefill shows progress and can be stopped
 * between batches. The last token's pick or logits are kept (q4kh_gen_eval).
 */
static int prefill(struct run *r, const int32_t *ids, int64_t n, struct q4kh_report *rep,
                   char *reason, size_t cap, struct q4kh_error *err)
{
	const int64_t batch = r->session->p.n_batch ? r->session->p.n_batch : n;
	double t0 = now();

	for (int64_t done = 0; done < n; done += batch) {
		int64_t k = n - done < batch ? n - done : batch;

		if (n > batch && done)
			q4kh_progress("prefill: %lld of %lld prompt tokens, %.1f tokens/s",
			              (long long)done, (long long)n, done / (now() - t0));
		else if (n > batch)
			q4kh_progress("prefill: 0 of %lld prompt tokens", (long long)n);
		if (stopped(rep, reason, cap))
			break;
		if (q4kh_gen_eval(&r->g, r->session, ids + done, k, done + k == n, err)) {
			q4kh_progress_clear();
			return -1;
		}
		rep->prompt_tokens = done + k;
	}
	q4kh_progress_clear();
	rep->prefill_seconds = now() - t0;
	return 0;
}

/*
 * Say once that standard output failed (main's finish must not say it
 * again): the bytes still buffered for it are dropped.
 */
static int output_failed(struct q4kh_report *rep, struct q4kh_error *err)
{
	int e = errno;

	__fpurge(stdout);
	clearerr(stdout);
	rep->stop_reason = "error";
	return q4kh_fail(err, "cannot write to standard output: %s", strerror(e));
}

/* What the decode loop of a run tells and asks (generate.h). */
struct decoding {
	const struct run_opts *o;
	struct run *r;
	struct q4kh_report *rep;
	char *reason;
	size_t cap;
	struct q4kh_error *err;
	int out_gone; /* standard output failed or was closed */
};

static int decode_stop(void *data)
{
	struct decoding *d = data;

	return stopped(d->rep, d->reason, d->cap);
}

/* Token TOK of the answer, which ends with it as END says: shown, or the
 * reason the run stops. Nonzero when the text cannot be written. */
static int decode_token(void *data, int32_t tok, enum q4kh_gen_end end)
{
	struct decoding *d = data;
	struct q4kh_report *rep = d->rep;
	char piece[256];
	size_t len;

	if (d->r->g.n == 1) {
		d->r->startup.first_token = now() - d->r->t0;
		rep->startup = &d->r->startup;
	}
	rep->generated_tokens++;
	if (end == Q4KH_GEN_EOG) {
		rep->stop_reason = "end of generation token";
		return 0;
	}
	len = q4kh_token_to_piece(d->r->tok, tok, 0, piece, sizeof(piece));
	if (emit(d->r, piece, len < sizeof(piece) ? len : sizeof(piece), !d->o->json)) {
		d->out_gone = !d->o->json;
		if (d->o->json) {
			q4kh_fail(d->err, "out of memory");
			rep->stop_reason = "error";
		} else if (errno != EPIPE) {
			output_failed(rep, d->err);
		} else {
			rep->stop_reason = "standard output closed";
		}
		return 1;
	}
	if (end == Q4KH_GEN_CONTEXT)
		rep->stop_reason = "context full";
	return 0;
}

/*
 * Prefill the prompt (tokenized in setup) and decode. 0, or the exit code
 * with err; a failure once the prompt runs sets rep->stop_reason to
 * "error" (the report is still printed).
 */
static int generate(const struct run_opts *o, struct run *r,
                    struct q4kh_report *rep, char *reason, size_t cap,
                    struct q4kh_error *err)
{
	struct decoding d = { o, r, rep, reason, cap, err, 0 };
	const struct q4kh_gen_calls calls = { decode_token, decode_stop, &d };
	enum q4kh_gen_end end;
	double t0;
	int rc;

	rep->chat_template = r->chat_name;
	rep->sampling = &o->sp;
	/* Checked before the prefill, not found full after it. The prompt
	 * fills a row of the cache per token; the first token generated comes
	 * from the prompt's last logits and needs no row of its own, nor does
	 * the last: the whole request needs prompt + n - 1 rows, the hint. */
	if (r->n_ids > r->session->p.n_ctx) {
		q4kh_fail(err, "the prompt is %zu tokens; the context holds %u (--ctx%s): a "
		          "shorter prompt, or --ctx %lld or more for the prompt and the %ld "
		          "tokens asked for (-n) (the model was trained on %u)",
		          r->n_ids, r->session->p.n_ctx,
		          o->ctx ? "" : " not given: the model's trained context, at most 4096",
		          (long long)r->n_ids + o->n_predict - 1, o->n_predict,
		          r->model->hp.n_ctx_train);
		return Q4KH_EXIT_USAGE;
	}
	rep->stop_reason = "token limit";
	rep->prompt_total = (int64_t)r->n_ids;
	if (prefill(r, r->ids, (int64_t)r->n_ids, rep, reason, cap, err)) {
		rep->stop_reason = "error";
		return Q4KH_EXIT_FAIL;
	}
	t0 = now();
	rc = q4kh_gen_decode(&r->g, r->session, &calls, &end, err);
	if (rc == Q4KH_GEN_NO_LOGIT)
		/* corrupt weights or a backend fault, never a token to feed back */
		q4kh_fail(err, "the logits of step %lld have no finite value (model data or "
		          "backend): model %s, backend %s device %u", (long long)r->g.n,
		          r->model->gguf->path, r->sel.backend.plugin->name, r->sel.device);
	if (rc < 0)
		rep->stop_reason = "error";
	rep->decode_seconds = now() - t0;
	/* The newline, before the report reaches unbuffered stderr. */
	if (!o->json && !d.out_gone && (fputc('\n', stdout) == EOF || fflush(stdout)) &&
	    !err->msg[0])
		output_failed(rep, err);
	return err->msg[0] ? Q4KH_EXIT_FAIL : 0;
}

/* JSON's string S, or null when S is NULL or "". */
static json_t *string_or_null(const char *s)
{
	return s && s[0] ? json_string(s) : json_null();
}

/*
 * With --json, the one object of a run that generated nothing: the keys
 * of any other run's (report.h), null where not known, with STOP
 * ("error", "interrupted by SIGINT") and MESSAGE as "error" when there is
 * one. R (NULL: none, a usage error) says what was known: the model once
 * opened, F2's last word on the choice (f2.message; not MESSAGE, which
 * may be no F2 matter at all), and the device of the candidate F2 was
 * measuring when a signal stopped it. No backend was chosen: "backend"
 * is null.
 */
static void print_nothing_json(const struct run *r, const char *prompt, const char *stop,
                               const char *message)
{
	const struct q4kh_selection *s = r ? &r->sel : NULL;
	const struct q4kh_device_record *d = s && s->measuring[0] ? &s->measuring_device : NULL;
	json_t *device = d ? json_pack("{s:i, s:s, s:s, s:s, s:s, s:I}", "index", (int)d->index,
	                               "name", d->name, "uuid", d->uuid, "arch", d->arch,
	                               "driver_version", d->driver_version, "memory_bytes",
	                               (json_int_t)d->memory_bytes)
	                   : json_null();
	json_t *rejected = json_array();
	json_t *j;

	for (const char *t = s ? s->steps : ""; *t;) { /* as report.c lists them */
		size_t len = strcspn(t, "\n");
		json_array_append_new(rejected, json_stringn(t, len));
		t += len + (t[len] == '\n');
	}
	j = json_pack("{s:o, s:o, s:n, s:o, s:n, s:n, s:{s:n, s:n, s:o, s:o, s:o}, "
	              "s:[], s:[], s:o, s:{s:i, s:I, s:f, s:n}, s:{s:i, s:f, s:n}, s:s, "
	              "s:o, s:s}",
	              "model", string_or_null(r ? r->model_path : NULL), "architecture",
	              string_or_null(r ? r->arch : NULL), "backend", "device", device,
	              "kernels", "kernel_choice", "f2", "verdict", "source", "message",
	              string_or_null(s ? s->f2_message : NULL), "rejected_first", rejected,
	              "measuring",
	              string_or_null(s ? s->measuring : NULL), "refused_backends",
	              "rejected_plugins", "chat_template",
	              string_or_null(r ? r->chat_name : NULL), "prefill",
	              "tokens", 0, "of", (json_int_t)(r ? r->n_ids : 0), "seconds", 0.0,
	              "tokens_per_second", "decode", "tokens", 0, "seconds", 0.0,
	              "tokens_per_second", "stop", stop, "prompt",
	              q4kh_cli_json_text(prompt, strlen(prompt)), "text", "");

	if (message[0])
		json_object_set_new(j, "error", json_string(message));
	json_dumpf(j, stdout, JSON_INDENT(2));
	fputc('\n', stdout);
	json_decref(j);
}

/*
 * Without --json, the report lines of a run a signal STOP stopped while
 * F2 measured the candidates: the model, the candidate being measured
 * and its device, as far as known, then the stop.
 */
static void print_stopped_report(const struct run *r, const char *stop)
{
	const struct q4kh_selection *s = &r->sel;

	if (r->model_path[0])
		fprintf(stderr, "q4khost: model %s (%s, %u layers)\n", r->model_path, r->arch,
		        r->n_layer);
	if (s->measuring[0]) {
		fprintf(stderr, "q4khost: backend none chosen: F2 was measuring %s (plugin %s %s "
		        "from %s)\n", s->measuring, s->measuring_plugin->name,
		        s->measuring_plugin->desc->version, s->measuring_plugin->path);
		fprintf(stderr, "q4khost: device %u: %s, uuid %s, arch %s\n",
		        s->measuring_device.index, s->measuring_device.name,
		        s->measuring_device.uuid, s->measuring_device.arch);
	}
	for (const char *t = s->steps; *t;) {
		size_t len = strcspn(t, "\n");
		fprintf(stderr, "q4khost: F2 rejected first: %.*s\n", (int)len, t);
		t += len + (t[len] == '\n');
	}
	fprintf(stderr, "q4khost: stop: %s while F2 measured the candidates; nothing was "
	        "generated\n", stop);
}

/*
 * Nothing was generated: the run failed before the prompt ran (STOP
 * "error"), or a signal stopped it while F2 measured the candidates
 * (STOP "interrupted by SIGINT"). With --json the one object all the
 * same; ERR's message goes to stderr too, and without --json a signal's
 * stop line.
 */
static void nothing_generated(const struct run_opts *o, const struct run *r, const char *stop,
                              const struct q4kh_error *err)
{
	if (o->json)
		print_nothing_json(r, o->prompt, stop, err->msg);
	if (err->msg[0])
		fprintf(stderr, "q4khost run: %s\n", err->msg);
	if (!o->json && strcmp(stop, "error"))
		print_stopped_report(r, stop);
}

int q4kh_cmd_run(int argc, char **argv)
{
	struct run_opts o;
	struct run r = { 0 };
	struct q4kh_report rep = { 0 };
	struct q4kh_error err = { { 0 } };
	char reason[64];
	int rc;

	r.t0 = r.mark = now(); /* the time to the first token counts from here */
	rc = parse(argc, argv, &o);
	if (rc > 0)
		return Q4KH_EXIT_OK;
	if (rc) { /* said on stderr; the prompt is -p's when it came first */
		if (q4kh_cli_json_asked(argc, argv, SHORTS, longs, O_JSON))
			print_nothing_json(NULL, o.prompt, "error", q4kh_cli_usage_said());
		return Q4KH_EXIT_USAGE;
	}
	q4kh_interrupt_install();
	q4kh_progress_init("run");
	rc = setup(&o, &r, &err);
	if (rc == 0)
		rc = generate(&o, &r, &rep, reason, sizeof(reason), &err);
	if (rc && !rep.stop_reason) { /* before the prompt ran: no report */
		if (r.sel.interrupted) {
			snprintf(reason, sizeof(reason), "interrupted by %s",
			         q4kh_signal_name(r.sel.interrupted));
			rc = q4kh_interrupt_exit_code(r.sel.interrupted);
		}
		nothing_generated(&o, &r, r.sel.interrupted ? reason : "error", &err);
		run_free(&r);
		return rc;
	}
	rep.model_path = r.model->gguf->path;
	rep.model = r.model;
	rep.backend = &r.sel.backend;
	rep.selection = &r.sel;
	rep.registry = r.registry;
	rep.device_index = r.sel.device;
	rep.steps = &r.session->stats;
	if (o.json) {
		json_t *j = q4kh_report_json(&rep);
		json_object_set_new(j, "prompt", q4kh_cli_json_text(o.prompt, strlen(o.prompt)));
		json_object_set_new(j, "text", q4kh_cli_json_text(r.text ? r.text : "", r.text_len));
		json_object_set_new(j, "host", q4kh_host_json(&r.host));
		if (rc)
			json_object_set_new(j, "error", json_string(err.msg));
		json_dumpf(j, stdout, JSON_INDENT(2));
		fputc('\n', stdout);
		json_decref(j);
	} else {
		q4kh_report_print(stderr, &rep);
	}
	if (rc)
		fprintf(stderr, "q4khost run: %s\n", err.msg);
	run_free(&r);
	/* Stopped by a signal: the shell's convention, 128 + the signal. */
	return rc ? rc
	          : rep.stop_reason == reason ? q4kh_interrupt_exit_code(q4kh_interrupted())
	                                      : Q4KH_EXIT_OK;
}
