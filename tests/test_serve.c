/*
 * q4khost serve, the real server on loopback with the tiny models: the
 * openai Python client and curl against q4khost run's greedy answers, a
 * bounded load test (whose concurrent decode runs in batched steps), bad
 * input and SIGTERM, background F2 switching paths, shadow parity
 * demoting a variant with a prompt-dependent defect, F2 off and explicit
 * requests; 256 clients at once, replicas behind HAProxy and the
 * Kubernetes example (packaging/); and the text rules (UTF-8, stop
 * strings) alone.
 * Every wait is bounded; no assertion is about time.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "buildconf.h"
#include "helpers.h"
#include "serve_text.h"

#define POLLS 1200 /* of 100 ms: the bound on any wait for the server */

struct server {
	pid_t pid;
	char url[128];
	char log[4200];
};

static const char *q4khost(void)
{
	static char p[4200];

	snprintf(p, sizeof(p), "%s/host/cli/q4khost", test_builddir());
	return p;
}

static const char *fixture(const char *name)
{
	static char p[4][4200];
	static int i;

	i = (i + 1) % 4;
	snprintf(p[i], sizeof(p[i]), "%s/tests/fixtures/%s", test_srcdir(), name);
	return p[i];
}

static void sleep_ms(long ms)
{
	nanosleep(&(struct timespec){ ms / 1000, (ms % 1000) * 1000000L }, NULL);
}

static char *read_log(const struct server *s)
{
	size_t len;
	char *t = test_read_file(s->log, &len);

	return t ? t : strdup("");
}

/* Expect S's log to hold WHAT (or, without PRESENT, not to). */
static void expect_log(const struct server *s, const char *what, int present)
{
	char *log = read_log(s);

	cr_expect((strstr(log, what) != NULL) == present, "%s \"%s\":\n%s",
	          present ? "no" : "a line with", what, log);
	free(log);
}

/*
 * Start q4khost serve --port 0 ARGS with receipts in RECEIPTS (and
 * $Q4KH_TEST_GATE = GATE when not NULL) and ENV (NAME=VALUE, or NULL) set;
 * wait for its "listening on" line. server_start: without ENV.
 */
static void server_start_env(struct server *s, const char *const *args, const char *receipts,
                             const char *gate, const char *env)
{
	const char *argv[64] = { q4khost(), "serve", "--port", "0" };
	static int started; /* a log of its own for each server of a test */
	int n = 4;

	snprintf(s->log, sizeof(s->log), "%s/serve-%d.log", test_tmpdir(), started++);
	while (*args && n < 62)
		argv[n++] = *args++;
	argv[n] = NULL;
	s->pid = fork();
	cr_assert_geq(s->pid, 0);
	if (s->pid == 0) {
		int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves no server */
		dup2(fd, 1);
		dup2(fd, 2);
		setenv("Q4KHOST_F2_RECEIPT_DIR", receipts, 1);
		setenv("XDG_CONFIG_HOME", receipts, 1); /* and the receipt key */
		if (gate)
			setenv("Q4KH_TEST_GATE", gate, 1);
		unsetenv("Q4KHOST_F2");
		unsetenv("Q4KHOST_BACKEND");
		unsetenv("Q4KHOST_Q4K_KERNEL");
		unsetenv("Q4KHOST_API_KEY");
		if (env)
			putenv((char *)env);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < POLLS; i++) {
		char *log = read_log(s), *at = strstr(log, "listening on http://");
		int status;

		if (at) {
			sscanf(at + strlen("listening on "), "%127s", s->url);
			free(log);
			return;
		}
		if (waitpid(s->pid, &status, WNOHANG) == s->pid)
			cr_assert_fail("q4khost serve exited before listening:\n%s", log);
		free(log);
		sleep_ms(100);
	}
	cr_assert_fail("q4khost serve did not listen");
}

static void server_start(struct server *s, const char *const *args, const char *receipts,
                         const char *gate)
{
	server_start_env(s, args, receipts, gate, NULL);
}

/* Wait for the server to exit; its wait status. Fails after the bound. */
static int server_end(struct server *s)
{
	int status;

	for (int i = 0; i < POLLS; i++) {
		if (waitpid(s->pid, &status, WNOHANG) == s->pid)
			return status;
		sleep_ms(100);
	}
	kill(s->pid, SIGKILL);
	cr_assert_fail("q4khost serve did not exit after the signal");
	return -1;
}

/* Wait for the server to exit; its exit status (-1: killed by a signal). */
static int server_wait(struct server *s)
{
	int status = server_end(s);

	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void server_stop(struct server *s)
{
	char *log;

	kill(s->pid, SIGTERM);
	log = read_log(s);
	cr_assert_eq(server_wait(s), 0, "q4khost serve did not exit 0 on SIGTERM:\n%s", log);
	free(log);
}

/* A plugin folder with the cpu plugin and the test plugins NAMES. */
static const char *plugins(const char *const *names)
{
	return test_plugin_dir(names);
}

struct reply {
	int status;
	char *body, *headers;
};

static void reply_free(struct reply *r)
{
	free(r->body);
	free(r->headers);
}

/* METHOD PATH on S with BODY (or NULL) through curl. One folder for the
 * test's requests, one after another: a poll of /health makes hundreds,
 * more than test_tmpdir has folders. */
static struct reply http(const struct server *s, const char *method, const char *path,
                         const char *body)
{
	static const char *dir;
	char req[4300], hdr[4300], out[4300], cmd[16384], *printed;
	struct reply r = { 0 };
	size_t len;

	if (!dir)
		dir = test_tmpdir();
	snprintf(req, sizeof(req), "%s/req", dir);
	snprintf(hdr, sizeof(hdr), "%s/hdr", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	test_write_file(req, body ? body : "", body ? strlen(body) : 0);
	snprintf(cmd, sizeof(cmd),
	         "curl -sS --max-time 300 -X %s -H 'Content-Type: application/json' %s%s -D %s -o %s "
	         "-w '%%{http_code}' '%s%s'",
	         method, body ? "--data-binary @" : "", body ? req : "", hdr, out, s->url, path);
	cr_assert_eq(test_shell(cmd, &printed), 0, "%s: %s", cmd, printed);
	r.status = atoi(printed);
	free(printed);
	r.body = test_read_file(out, &len);
	r.headers = test_read_file(hdr, &len);
	cr_assert(r.body && r.headers);
	return r;
}

/* /health's JSON; its status is 200 when it says ready, else 503. */
static json_t *health(const struct server *s)
{
	struct reply r = http(s, "GET", "/health", NULL);
	json_t *h = json_loads(r.body, 0, NULL);

	cr_assert_not_null(h, "%s", r.body);
	cr_assert_eq(r.status, json_is_true(json_object_get(h, "ready")) ? 200 : 503, "%s",
	             r.body);
	reply_free(&r);
	return h;
}

/* /health's serving path ("cpu/built-in"), malloc()ed. */
static char *serving(const struct server *s)
{
	json_t *h = health(s);
	const char *p = json_string_value(
		json_object_get(json_object_get(json_array_get(json_object_get(h, "devices"), 0),
		                                "serving"),
		                "path"));
	char *out = strdup(p ? p : "");

	json_decref(h);
	return out;
}

/* Poll /health until the serving path is PATH; fails after the bound. */
static void await_serving(const struct server *s, const char *path)
{
	for (int i = 0; i < POLLS; i++) {
		char *p = serving(s);
		int done = !strcmp(p, path);

		free(p);
		if (done)
			return;
		sleep_ms(100);
	}
	cr_assert_fail("the server never served %s", path);
}

static char *header(const struct reply *r, const char *name)
{
	char *at = strcasestr(r->headers, name);
	size_t n;

	cr_assert_not_null(at, "no %s in\n%s", name, r->headers);
	at += strlen(name) + 2;
	n = strcspn(at, "\r\n");
	return strndup(at, n);
}

/* q4khost run's greedy answer on BACKEND (NULL: run's choice), cleaned as
 * serve sends text. */
static char *run_answer_on(const char *model, const char *dir, const char *backend,
                           const char *prompt, int n, int chat)
{
	char cmd[16384], *out, *clean;
	size_t len;

	snprintf(cmd, sizeof(cmd), "%s run -m %s --plugin-path %s%s%s -p '%s' -n %d %s 2>/dev/null",
	         q4khost(), model, dir, backend ? " --backend " : "", backend ? backend : "",
	         prompt, n, chat ? "" : "--raw");
	cr_assert_eq(test_shell(cmd, &out), 0, "%s: %s", cmd, out);
	len = strlen(out);
	cr_assert(len > 0 && out[len - 1] == '\n');
	clean = serve_utf8_clean(out, len - 1, &len);
	free(out);
	return clean;
}

/* q4khost run's greedy answer on its choice of backend. */
static char *run_answer(const char *model, const char *dir, const char *prompt, int n,
                        int chat)
{
	return run_answer_on(model, dir, NULL, prompt, n, chat);
}

/* The text of a curl-fetched stream, checking its events. */
static char *stream_text(const char *body)
{
	char *text = calloc(1, strlen(body) + 1);
	const char *p = body;
	int done = 0;

	while ((p = strstr(p, "data: "))) {
		json_t *o, *c;

		p += 6;
		if (!strncmp(p, "[DONE]", 6)) {
			done = 1;
			break;
		}
		o = json_loadb(p, strcspn(p, "\n"), 0, NULL);
		cr_assert_not_null(o, "a bad event: %.200s", p);
		c = json_array_get(json_object_get(o, "choices"), 0);
		if (json_object_get(c, "delta"))
			c = json_object_get(c, "delta");
		if (json_string_value(json_object_get(c, "content")))
			strcat(text, json_string_value(json_object_get(c, "content")));
		if (json_string_value(json_object_get(c, "text")))
			strcat(text, json_string_value(json_object_get(c, "text")));
		json_decref(o);
	}
	cr_assert(done, "the stream did not end with data: [DONE]:\n%s", body);
	return text;
}

/* The folder of Python package NAME (scripts/fetch-python.sh), malloc()ed;
 * a skip without it (a failure for openai under Q4KH_REQUIRE_MODEL=1). */
static char *python_package(const char *name)
{
	char cmd[8192], *dir;

	snprintf(cmd, sizeof(cmd), "bash %s/scripts/fetch-python.sh --cached %s", test_srcdir(),
	         name);
	if (test_shell(cmd, &dir)) {
		const char *req = getenv("Q4KH_REQUIRE_MODEL");
		free(dir);
		if (req && !strcmp(req, "1") && !strcmp(name, "openai"))
			cr_assert_fail("the openai client is missing (run scripts/fetch-python.sh "
			               "openai)");
		cr_skip_test("%s is missing (run scripts/fetch-python.sh %s)", name, name);
	}
	dir[strcspn(dir, "\n")] = 0;
	return dir;
}

/* python3 SCRIPT ARGS from tests/serve, with Python package PACKAGE on
 * PYTHONPATH when not NULL. */
static void python_with(const char *package, const char *script, const char *args)
{
	char cmd[16384], *out, *dir;
	int rc;

	dir = package ? python_package(package) : strdup("");
	snprintf(cmd, sizeof(cmd),
	         "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=%s:%s/tests/serve python3 %s/tests/serve/%s %s",
	         dir, test_srcdir(), test_srcdir(), script, args);
	free(dir);
	rc = test_shell(cmd, &out);
	cr_log_info("%s", out);
	cr_assert_eq(rc, 0, "%s\n%s", cmd, out);
	free(out);
}

static void python(const char *script, const char *args)
{
	python_with(NULL, script, args);
}

Test(serve_text, utf8_as_python_replaces)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "a\xff" "b", "a\xEF\xBF\xBD" "b" },
		{ "\xe2\x82", "\xEF\xBF\xBD" },
		{ "\xe2\x82" "A", "\xEF\xBF\xBD" "A" },
		{ "\xf0\x80\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },
		{ "\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },
		{ "\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD" },
		{ "\xf0\x9f\x98", "\xEF\xBF\xBD" },
		{ "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t len;
		char *out = serve_utf8_clean(cases[i].in, strlen(cases[i].in), &len);

		cr_assert_str_eq(out, cases[i].out, "case %zu", i);
		cr_assert_eq(len, strlen(cases[i].out));
		free(out);
	}
	cr_assert_eq(serve_utf8_incomplete("ab\xe2\x82", 4), 2);
	cr_assert_eq(serve_utf8_incomplete("ab\xf0\x9f\x98", 5), 3);
	cr_assert_eq(serve_utf8_incomplete("ab\xe2", 3), 1);
	cr_assert_eq(serve_utf8_incomplete("ab\x80", 3), 0);
	cr_assert_eq(serve_utf8_incomplete("ab\xf0\x80", 4), 0);
	cr_assert_eq(serve_utf8_incomplete("\xc3\xa9", 2), 0);
	cr_assert_eq(serve_utf8_incomplete("", 0), 0);
}

Test(serve_text, stop_strings)
{
	char *stops[] = { "world", "\n\n" };

	cr_assert_eq(serve_stop_find("hello world", 11, 0, stops, 2), 6);
	cr_assert_eq(serve_stop_find("hello world", 11, 8, stops, 2), 6);
	cr_assert_eq(serve_stop_find("hello world", 11, 11, stops, 2), -1);
	cr_assert_eq(serve_stop_find("a\n\nb", 4, 2, stops, 2), 1);
	cr_assert_eq(serve_stop_partial("hello wo", 8, stops, 2), 2);
	cr_assert_eq(serve_stop_partial("hello\n", 6, stops, 2), 1);
	cr_assert_eq(serve_stop_partial("hello", 5, stops, 2), 0);
}

/* Chat and completions, streamed and not, through the openai client and
 * curl: each greedy answer is run's. */
Test(serve, answers_as_run, .timeout = 600)
{
	static const char *const models[] = { "tiny-llama.gguf", "tiny-qwen2.gguf",
		                               "tiny-qwen3.gguf" };
	const char *dir = plugins((const char *const[]){ NULL });
	const char *receipts = test_tmpdir();

	for (size_t m = 0; m < 3; m++) {
		const char *model = fixture(models[m]);
		const char *args[] = { "-m", model, "--plugin-path", dir, NULL };
		struct server s;
		char py[16384], body[1024], *want, *got, *f2;
		struct reply r;
		json_t *o;

		server_start(&s, args, receipts, NULL);
		snprintf(py, sizeof(py), "%s %s %s %s 16 'Hello, how are you?' 'Once upon a time'",
		         s.url, q4khost(), model, dir);
		python_with("openai", "openai_check.py", py);

		want = run_answer(model, dir, "The three primary colors are", 12, 1);
		snprintf(body, sizeof(body), "{\"messages\": [{\"role\": \"user\", \"content\": "
		                             "\"The three primary colors are\"}], \"max_tokens\": 12, "
		                             "\"temperature\": 0}");
		r = http(&s, "POST", "/v1/chat/completions", body);
		cr_assert_eq(r.status, 200, "%s", r.body);
		o = json_loads(r.body, 0, NULL);
		cr_assert_str_eq(json_string_value(json_object_get(json_object_get(
			                 json_array_get(json_object_get(o, "choices"), 0), "message"),
			                                            "content")),
		                 want);
		f2 = header(&r, "X-Q4KHost-F2");
		cr_assert_str_eq(f2, "not needed");
		free(f2);
		json_decref(o);
		reply_free(&r);
		free(want);

		want = run_answer(model, dir, "1, 2, 3, 4,", 12, 0);
		r = http(&s, "POST", "/v1/completions",
		         "{\"prompt\": \"1, 2, 3, 4,\", \"max_tokens\": 12, \"temperature\": 0, "
		         "\"stream\": true}");
		cr_assert_eq(r.status, 200, "%s", r.body);
		got = stream_text(r.body);
		cr_assert_str_eq(got, want);
		free(got);
		free(want);
		reply_free(&r);

		r = http(&s, "GET", "/metrics", NULL);
		cr_assert_eq(r.status, 200);
		cr_assert_not_null(strstr(r.body, "q4khost_requests_total{endpoint=\"/v1/chat/completions\",code=\"200\"}"),
		                   "%s", r.body);
		cr_assert_not_null(strstr(r.body, "q4khost_time_to_first_token_seconds_count"));
		reply_free(&r);
		got = serving(&s);
		cr_assert_str_eq(got, "cpu/built-in");
		free(got);
		server_stop(&s);
	}
}

/* The text of a completion of PROMPT, N tokens, with sampling SAMPLING
 * ("\"temperature\": 0", ...), streamed or not. */
static char *completion(const struct server *s, const char *prompt, int n,
                        const char *sampling, int stream)
{
	char body[1024], *text;
	struct reply r;
	json_t *o;

	snprintf(body, sizeof(body),
	         "{\"prompt\": \"%s\", \"max_tokens\": %d, %s, \"stream\": %s}", prompt, n,
	         sampling, stream ? "true" : "false");
	r = http(s, "POST", "/v1/completions", body);
	cr_assert_eq(r.status, 200, "%s: %s", body, r.body);
	if (stream) {
		text = stream_text(r.body);
	} else {
		o = json_loads(r.body, 0, NULL);
		cr_assert_not_null(o, "%s", r.body);
		text = strdup(json_string_value(json_object_get(
			json_array_get(json_object_get(o, "choices"), 0), "text")));
		json_decref(o);
	}
	reply_free(&r);
	return text;
}

/*
 * On cpu-fast, whose backend has top2 (ABI 1.4), a greedy answer takes
 * each token from the pick made on the device: the same text as sampling
 * with top_k 1 from the downloaded logits (the sampler's exact greedy,
 * what serve did at temperature 0 before) and as q4khost run on cpu-fast.
 */
Test(serve, greedy_pick_on_the_device_is_the_logits_pick, .timeout = 600)
{
	static const char *const prompts[] = { "1, 2, 3, 4,", "Once upon a time" };
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-qwen2.gguf");
	char path[8192];
	const char *args[] = { "-m", model, "--plugin-path", path, "--backend", "cpu-fast",
		               "--f2", "require", NULL };
	struct server s;
	char *got;

	test_need_cpu_fast();
	snprintf(path, sizeof(path), "%s:%s/plugins/cpu-fast/.libs", dir, test_builddir());
	server_start(&s, args, test_tmpdir(), NULL);
	await_serving(&s, "cpu-fast/built-in");
	for (size_t i = 0; i < 2; i++) {
		char *greedy = completion(&s, prompts[i], 16, "\"temperature\": 0", (int)i);
		char *want = run_answer_on(model, path, "cpu-fast", prompts[i], 16, 0);

		got = completion(&s, prompts[i], 16, "\"temperature\": 1, \"top_k\": 1", (int)i);
		cr_expect_str_eq(greedy, got, "%s: the device's pick and the logits' differ",
		                 prompts[i]);
		cr_expect_str_eq(greedy, want, "%s: serve and run differ on cpu-fast", prompts[i]);
		free(got);
		free(want);
		free(greedy);
	}
	got = serving(&s);
	cr_assert_str_eq(got, "cpu-fast/built-in");
	free(got);
	server_stop(&s);
}

/* 400 requests from 16 clients: no error, every answer run's, RSS flat,
 * and decode steps that batched several requests (/metrics) among them.
 * Under AddressSanitizer (scripts/test-sanitizers.sh) 100 requests, and
 * memory is not judged: its quarantine holds what was freed. On BACKEND
 * (NULL: the reference, the only plugin on the path), which must serve
 * after F2 (--f2 require) and answer as run does on it. */
static void load_on(const char *backend)
{
#ifdef __SANITIZE_ADDRESS__
	const char *rss = "no-rss", *count = "100";
#else
	const char *rss = "rss", *count = "400";
#endif
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-llama.gguf");
	char path[8192], served[64];
	const char *args[] = { "-m", model, "--plugin-path", path, "--parallel", "4",
		               backend ? "--backend" : NULL, backend, "--f2", "require", NULL };
	struct server s;
	char py[16384];

	snprintf(path, sizeof(path), "%s", dir);
	if (backend)
		snprintf(path, sizeof(path), "%s:%s/plugins/%s/.libs", dir, test_builddir(),
		         backend);
	server_start(&s, args, test_tmpdir(), NULL);
	if (backend) {
		snprintf(served, sizeof(served), "%s/built-in", backend);
		await_serving(&s, served);
	}
	snprintf(py, sizeof(py), "%s %d %s %s %s %s 16 %s %s", s.url, (int)s.pid, q4khost(),
	         model, path, count, rss, backend ? backend : "");
	python("load.py", py);
	server_stop(&s);
}

Test(serve, load, .timeout = 900)
{
	load_on(NULL);
}

/* The same load on cpu-fast, whose batched steps are its own kernels'
 * (multi-column products, F16 caches side by side). */
Test(serve, load_on_cpu_fast, .timeout = 900)
{
	test_need_cpu_fast();
	load_on("cpu-fast");
}

/* Bad input, slow clients, a client that leaves, the API key. */
Test(serve, bad_input, .timeout = 600)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *tmp = test_tmpdir();
	char keyfile[4200], py[16384];
	const char *args[] = { "-m", model, "--plugin-path", dir, "--api-key-file", keyfile,
		               "--max-body", "65536", "--idle-timeout", "2", NULL };
	struct server s;

	snprintf(keyfile, sizeof(keyfile), "%s/key", tmp);
	test_write_file(keyfile, "s3cret-key-4711\n", 16);
	server_start(&s, args, test_tmpdir(), NULL);
	snprintf(py, sizeof(py), "%s s3cret-key-4711 %s %s", s.url, s.log, model);
	python("abuse.py", py);
	server_stop(&s);
}

/*
 * Serve on the serve-gated variant (each product waits while the file
 * HOLD exists), with 300 s of --idle-timeout and --shutdown-timeout, and
 * tests/serve/SCRIPT URL PID LOG HOLD against it, which signals it; its
 * wait status once it exited.
 */
static int held_and_signalled(const char *script)
{
	const char *dir = plugins((const char *const[]){ "serve_gated", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *args[] = { "-m", model, "--plugin-path", dir, "--kernel", "serve-gated",
		               "--idle-timeout", "300", "--shutdown-timeout", "300", NULL };
	char hold[4200], env[4300], py[16384];
	struct server s;

	snprintf(hold, sizeof(hold), "%s/hold", test_tmpdir());
	snprintf(env, sizeof(env), "Q4KH_TEST_HOLD=%s", hold);
	server_start_env(&s, args, test_tmpdir(), NULL, env);
	snprintf(py, sizeof(py), "%s %d %s %s", s.url, (int)s.pid, s.log, hold);
	python(script, py);
	return server_end(&s);
}

/*
 * SIGTERM drains (docs/serve.md section 6): a request held in flight by
 * the serve-gated variant (each product waits while the hold file exists)
 * finishes whole after the signal, connections kept alive across it get
 * 503, new ones are refused or get 503, and serve exits 0. The drain's
 * limit outlasts drain.py's waits, so only a drain that does not wait for
 * the request can cancel it.
 */
Test(serve, sigterm_drains, .timeout = 600)
{
	int status = held_and_signalled("drain.py");

	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	          "serve did not exit 0 after SIGTERM: status 0x%x", status);
}

/*
 * A second SIGINT, a second after the first, stops serve at once (the
 * top-level --help's promise): the drain of the first would wait 300 s
 * for the request the serve-gated variant holds; serve ends by SIGINT.
 */
Test(serve, a_second_sigint_stops_at_once, .timeout = 600)
{
	int status = held_and_signalled("second_signal.py");

	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT,
	          "serve did not end by SIGINT (the shell's 130): status 0x%x", status);
}


/*
 * Start S (ARGS, RECEIPTS, GATE: server_start) and see that it serves
 * PATH at once, trusted on F2's pass from SOURCE ("receipt of "), with no
 * measurement in the background. Its log (malloc()ed).
 */
static char *serves_at_once(struct server *s, const char *const *args, const char *receipts,
                            const char *gate, const char *path, const char *source)
{
	char *p, *log, want[160];

	server_start(s, args, receipts, gate);
	p = serving(s);
	cr_assert_str_eq(p, path);
	free(p);
	log = read_log(s);
	snprintf(want, sizeof(want), "F2: pass (%s", source);
	cr_assert_not_null(strstr(log, want), "%s", log);
	cr_assert_null(strstr(log, "in the background"), "%s", log);
	return log;
}
/* No receipt: the reference serves at once while F2 measures the variant
 * (held by a gate the test opens), then the variant takes over. */
Test(serve, background_f2_switches, .timeout = 600)
{
	const char *dir = plugins((const char *const[]){ "serve_gated", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *receipts = test_tmpdir();
	const char *args[] = { "-m", model, "--plugin-path", dir, NULL };
	const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 4}";
	char gate[4200], *v, *log;
	struct server s;
	struct reply r;
	json_t *h, *sw;

	snprintf(gate, sizeof(gate), "%s/gate", test_tmpdir());
	server_start(&s, args, receipts, gate);
	r = http(&s, "POST", "/v1/chat/completions", req);
	cr_assert_eq(r.status, 200, "%s", r.body);
	v = header(&r, "X-Q4KHost-Served-By");
	cr_assert(!strncmp(v, "cpu/built-in", 12), "%s", v);
	free(v);
	reply_free(&r);
	/* The answer came while the measurement still waits at the gate. */
	h = health(&s);
	cr_assert(json_is_true(json_object_get(json_object_get(json_array_get(
		                       json_object_get(h, "devices"), 0), "validation"), "running")));
	json_decref(h);
	test_write_file(gate, "", 0);
	await_serving(&s, "cpu/serve-gated");
	h = health(&s);
	sw = json_array_get(json_object_get(h, "switches"), 0);
	cr_assert_str_eq(json_string_value(json_object_get(sw, "from")), "cpu/built-in");
	cr_assert_str_eq(json_string_value(json_object_get(sw, "to")), "cpu/serve-gated");
	json_decref(h);
	r = http(&s, "POST", "/v1/chat/completions", req);
	cr_assert_eq(r.status, 200);
	v = header(&r, "X-Q4KHost-Served-By");
	cr_assert(!strncmp(v, "cpu/serve-gated", 15), "%s", v);
	free(v);
	v = header(&r, "X-Q4KHost-F2");
	cr_assert(!strncmp(v, "pass; fresh", 11), "%s", v);
	free(v);
	reply_free(&r);
	log = read_log(&s);
	cr_assert_not_null(strstr(log, "switching from cpu/built-in to cpu/serve-gated"), "%s", log);
	free(log);
	server_stop(&s);

	/* With its receipt it serves at once, measuring nothing. */
	free(serves_at_once(&s, args, receipts, gate, "cpu/serve-gated", "receipt of "));
	server_stop(&s);
}

/* Poll the server's log until it holds TEXT; the log, malloc()ed; fails
 * after the bound. */
static char *await_log(const struct server *s, const char *text)
{
	for (int i = 0; i < POLLS; i++) {
		char *log = read_log(s);

		if (strstr(log, text))
			return log;
		free(log);
		sleep_ms(100);
	}
	cr_assert_fail("the server's log never said '%s'", text);
	return NULL;
}

/*
 * replay-batched, exact but in a step of several sequences (its planted
 * defect, tests/plugins/replay.c): the background F2 finds it broken in
 * its batched steps, at sequence 1 (position 41 of the built-in probe,
 * docs/f2.md), and the reference keeps serving, as the log says.
 */
Test(serve, a_backend_wrong_only_in_batched_steps_does_not_serve, .timeout = 600)
{
	const char *dir = plugins((const char *const[]){ "replay_batched", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *args[] = { "-m", model, "--plugin-path", dir, NULL };
	struct server s;
	char *log, *p;

	server_start(&s, args, test_tmpdir(), NULL);
	log = await_log(&s, "keeps serving");
	cr_expect_not_null(strstr(log, "background F2: replay-batched/built-in: broken: batched step "
	                               "of 4 sequences, sequence 1, position 41 (its decode step 0): "),
	                   "%s", log);
	cr_expect_not_null(strstr(log, "; cpu/built-in keeps serving"), "%s", log);
	free(log);
	p = serving(&s);
	cr_expect_str_eq(p, "cpu/built-in");
	free(p);
	server_stop(&s);
}

/* q4khost ARGS with receipts in RECEIPTS: its output, stdout and stderr
 * (malloc()ed); fails unless it exits 0. */
static char *q4khost_ok(const char *receipts, const char *args)
{
	char cmd[20000], *out;

	snprintf(cmd, sizeof(cmd), "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s %s 2>&1",
	         receipts, receipts, q4khost(), args);
	cr_assert_eq(test_shell(cmd, &out), 0, "%s: %s", cmd, out);
	return out;
}

/*
 * [f2] require_deep holds for serve as for run: a shallow pass receipt of
 * cpu-fast (a plain run's) does not let it serve. The reference serves
 * first and the background F2 measures the deep probe (its own child
 * judged on the built-in probe before, answered from the shallow receipt
 * and switched); cpu-fast serves after that fresh deep pass only.
 */
Test(serve, require_deep_takes_no_shallow_receipt, .timeout = 600)
{
	const char *b = test_builddir(), *model = fixture("tiny-llama.gguf");
	const char *receipts = test_tmpdir();
	char dir[8400], cmd[16384], *out, *log;
	const char *args[] = { "-m", model, "--plugin-path", dir, "--ctx", "300", NULL };
	struct server s;
	json_t *h, *v;
	size_t i;
	int deep_fresh = 0;

	test_need_cpu_fast();
	snprintf(dir, sizeof(dir), "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs", b, b);
	snprintf(cmd, sizeof(cmd), "run -m %s --plugin-path %s --backend cpu-fast --kernel none "
	         "-p Hi -n 1", model, dir);
	out = q4khost_ok(receipts, cmd);
	cr_assert_not_null(strstr(out, "F2: pass (fresh: no receipt)"), "%s", out);
	cr_assert_not_null(strstr(out, "F2 probe: built-in probe, "), "%s", out);
	free(out);

	server_start_env(&s, args, receipts, NULL, "Q4KHOST_F2_REQUIRE_DEEP=true");
	log = read_log(&s);
	cr_expect_null(strstr(log, "F2: pass (receipt of "), "the shallow receipt counted:\n%s",
	               log);
	free(log);
	await_serving(&s, "cpu-fast/built-in");
	h = health(&s);
	json_array_foreach(json_object_get(h, "verdicts"), i, v) {
		const char *src = json_string_value(json_object_get(v, "source"));

		cr_expect(strncmp(src, "receipt of ", 11),
		          "%s served on a receipt: %s", json_string_value(json_object_get(v, "path")),
		          src);
		deep_fresh |= !strcmp(json_string_value(json_object_get(v, "verdict")), "pass") &&
		              !strncmp(src, "fresh", 5);
	}
	cr_expect(deep_fresh, "no fresh deep pass in /health");
	json_decref(h);
	log = read_log(&s);
	cr_expect_not_null(strstr(log, "background F2: measuring cpu-fast/built-in"), "%s", log);
	free(log);
	server_stop(&s);
}

/*
 * A deep receipt decides for serve as for run (decide.h, one decision for
 * both): cpu-fast holds only the deep probe's pass receipt (validate
 * --deep). run serves it on that receipt, naming the probe; serve starts
 * on it at once, on the same receipt, with the same probe line, and
 * measures nothing in the background.
 */
Test(serve, a_deep_receipt_decides_as_for_run, .timeout = 600)
{
	static const char probe[] = "F2 probe: deep probe of a deep receipt: 180 positions judged "
	                            "of 300, up to position 299, 32 decode steps";
	const char *b = test_builddir(), *model = fixture("tiny-llama.gguf");
	const char *receipts = test_tmpdir();
	char dir[8400], cmd[16384], *out, *log;
	const char *args[] = { "-m", model, "--plugin-path", dir, NULL };
	struct server s;

	test_need_cpu_fast();
	snprintf(dir, sizeof(dir), "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs", b, b);
	snprintf(cmd, sizeof(cmd), "validate --deep --ctx 300 -m %s --plugin-path %s --backend "
	         "cpu-fast --kernel none", model, dir);
	free(q4khost_ok(receipts, cmd));
	snprintf(cmd, sizeof(cmd), "run -m %s --plugin-path %s -p Hi -n 1", model, dir);
	out = q4khost_ok(receipts, cmd);
	cr_expect_not_null(strstr(out, "backend cpu-fast "), "%s", out);
	cr_expect_not_null(strstr(out, "F2: pass (deep receipt of "), "%s", out);
	cr_expect_not_null(strstr(out, probe), "%s", out);
	free(out);

	log = serves_at_once(&s, args, receipts, NULL, "cpu-fast/built-in", "deep receipt of ");
	cr_expect_not_null(strstr(log, probe), "%s", log);
	free(log);
	server_stop(&s);
}

/* serve killed with no chance to stop its background F2 (SIGKILL) takes the
 * validation with it: neither validate nor the validate --one it started
 * measures on (and writes a receipt) once serve is gone. */
Test(serve, sigkill_during_background_f2_ends_the_validation, .timeout = 300)
{
	const char *dir = plugins((const char *const[]){ "serve_gated", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *args[] = { "-m", model, "--plugin-path", dir, NULL };
	char gate[4200];
	struct server s;
	pid_t validate = 0, one = 0;
	int status, gone = 0;

	snprintf(gate, sizeof(gate), "%s/gate", test_tmpdir());
	server_start(&s, args, test_tmpdir(), gate);
	/* the measurement waits at the gate, which stays shut */
	for (int i = 0; i < POLLS && !one; i++, sleep_ms(100)) {
		if (!validate)
			validate = test_child_of(s.pid, "validate");
		if (validate)
			one = test_child_of(validate, "--one");
	}
	cr_assert(validate && one, "no background validation under serve %d (validate %d)",
	          (int)s.pid, (int)validate);
	cr_assert_eq(kill(s.pid, SIGKILL), 0);
	cr_assert_eq(waitpid(s.pid, &status, 0), s.pid);
	/* They die with their parent (PR_SET_PDEATHSIG): wait for that state.
	 * The bound only catches one that stays, as the shut gate would keep
	 * a measurement for 10 minutes. */
	for (int i = 0; i < POLLS && !gone; i++, sleep_ms(100))
		gone = !test_alive(validate) && !test_alive(one);
	/* whatever still runs is ours to end, whether the test passes or not */
	kill(validate, SIGKILL);
	kill(one, SIGKILL);
	cr_expect(gone, "%d s after serve's SIGKILL: validate %d %s, validate --one %d %s",
	          POLLS / 10, (int)validate, test_alive(validate) ? "runs" : "is gone", (int)one,
	          test_alive(one) ? "runs" : "is gone");
}

/* A completion of 76 prompt tokens, answered 200: a batch with a tail of
 * 4 columns, which serve-tail gets wrong (tests/plugins/cpu_q8act.c). */
static struct reply tail_request(const struct server *s)
{
	static const char body[] =
		"{\"prompt\": \"The quick brown fox jumps over the lazy dog again and again, "
		"while the farmer watches from the old barn near the river. The quick brown "
		"fox jumps over the lazy dog again and again, while the farmer watches from "
		"the old barn near the river\", \"max_tokens\": 4}";
	struct reply r = http(s, "POST", "/v1/completions", body);

	cr_assert_eq(r.status, 200, "%s", r.body);
	return r;
}

/* A variant whose defect shows only on some prompts passes F2, serves, and
 * is demoted by shadow parity after it serves such a prompt. */
Test(serve, shadow_parity_demotes, .timeout = 600)
{
	const char *dir = plugins((const char *const[]){ "serve_tail", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *receipts = test_tmpdir();
	const char *args[] = { "-m", model, "--plugin-path", dir, "--f2-shadow", "1", NULL };
	struct server s;
	struct reply r;
	char cmd[16384], *v, *out;
	json_t *h = NULL, *o, *c;
	int passed = 0;

	server_start(&s, args, receipts, NULL);
	await_serving(&s, "cpu/serve-tail");
	/* 3 prompt tokens: no batch with a tail; shadow parity passes it. */
	r = http(&s, "POST", "/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 4}");
	cr_assert_eq(r.status, 200, "%s", r.body);
	reply_free(&r);
	for (int i = 0; i < POLLS && !passed; i++, sleep_ms(100)) {
		h = health(&s);
		passed = (int)json_integer_value(json_object_get(json_object_get(h, "shadow"), "passed"));
		json_decref(h);
	}
	cr_assert_eq(passed, 1);
	v = serving(&s);
	cr_assert_str_eq(v, "cpu/serve-tail");
	free(v);
	r = tail_request(&s);
	v = header(&r, "X-Q4KHost-Served-By");
	cr_assert(!strncmp(v, "cpu/serve-tail", 14), "%s", v);
	free(v);
	reply_free(&r);
	await_serving(&s, "cpu/built-in");
	h = health(&s);
	o = json_array_get(json_object_get(h, "switches"), 1);
	cr_assert_str_eq(json_string_value(json_object_get(o, "from")), "cpu/serve-tail");
	cr_assert_not_null(strstr(json_string_value(json_object_get(o, "reason")),
	                          "shadow parity, served request cmpl-2"));
	json_decref(h);
	r = http(&s, "GET", "/metrics", NULL);
	cr_assert_not_null(strstr(r.body, "q4khost_fallbacks_total 1"), "%s", r.body);
	cr_assert_not_null(strstr(r.body, "q4khost_shadow_checks_total{verdict=\"pass\"} 1"));
	reply_free(&r);
	server_stop(&s);

	/* The receipt names the request and position; validate and run read it. */
	snprintf(cmd, sizeof(cmd),
	         "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s validate --json -m %s "
	         "--plugin-path %s 2>/dev/null",
	         receipts, receipts, q4khost(), model, dir);
	test_shell(cmd, &out);
	o = json_loads(out, 0, NULL);
	cr_assert_not_null(o, "%s", out);
	c = json_array_get(json_object_get(o, "candidates"), 0);
	cr_assert_str_eq(json_string_value(json_object_get(c, "kernel")), "serve-tail");
	cr_assert(strcmp(json_string_value(json_object_get(c, "verdict")), "pass"), "%s", out);
	cr_assert(!strncmp(json_string_value(json_object_get(c, "source")), "receipt of ", 11));
	cr_assert_not_null(strstr(json_string_value(json_object_get(c, "message")),
	                          "shadow parity, served request cmpl-2 (76 prompt + "),
	                   "%s", out);
	cr_assert_not_null(strstr(json_string_value(json_object_get(c, "message")), "position "));
	json_decref(o);
	free(out);
	snprintf(cmd, sizeof(cmd),
	         "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s run -m %s --plugin-path %s -n 2 "
	         "2>&1 >/dev/null",
	         receipts, receipts, q4khost(), model, dir);
	cr_assert_eq(test_shell(cmd, &out), 0, "%s", out);
	cr_assert_not_null(strstr(out, "F2 rejected first: cpu/serve-tail"), "%s", out);
	cr_assert_not_null(strstr(out, "kernels: Q4_K=cpu built-in"), "%s", out);
	free(out);
}

/*
 * A demotion that leaves nothing to serve is for good: --kernel serve-tail
 * leaves the reference out, so after shadow parity demotes it every
 * request gets 503 without Retry-After (a retry cannot help), its message
 * saying why and that serve must be restarted; /health says the same.
 */
Test(serve, a_demotion_with_nothing_left_says_restart, .timeout = 600)
{
	const char *dir = plugins((const char *const[]){ "serve_tail", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *args[] = { "-m", model, "--plugin-path", dir, "--kernel", "serve-tail",
		               "--f2-shadow", "1", NULL };
	const char *req = "{\"prompt\": \"Hi\", \"max_tokens\": 2}";
	struct server s;
	struct reply r;
	json_t *h = NULL, *e;
	const char *msg;
	int rejected = 0;

	server_start(&s, args, test_tmpdir(), NULL);
	r = tail_request(&s);
	reply_free(&r);
	for (int i = 0; i < POLLS && !rejected; i++, sleep_ms(100)) {
		h = health(&s);
		rejected = (int)json_integer_value(
			json_object_get(json_object_get(h, "shadow"), "rejected"));
		json_decref(h);
	}
	cr_assert_eq(rejected, 1);
	free(await_log(&s, "switching from cpu/serve-tail to none"));
	r = http(&s, "POST", "/v1/completions", req);
	cr_assert_eq(r.status, 503, "%s", r.body);
	cr_expect_null(strcasestr(r.headers, "Retry-After"), "%s", r.headers);
	e = json_loads(r.body, 0, NULL);
	cr_assert_not_null(e, "%s", r.body);
	msg = json_string_value(json_object_get(json_object_get(e, "error"), "message"));
	cr_assert_not_null(msg, "%s", r.body);
	cr_expect_not_null(strstr(msg, "nothing serves until q4khost serve is restarted: shadow "
	                               "parity demoted cpu/serve-tail (request cmpl-1)"), "%s", msg);
	cr_expect_not_null(strstr(msg, "restart serve"), "%s", msg);
	json_decref(e);
	reply_free(&r);
	h = health(&s);
	cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "unavailable");
	cr_expect(json_is_false(json_object_get(h, "ready")));
	msg = json_string_value(json_object_get(h, "unavailable"));
	cr_expect(msg && strstr(msg, "restart serve"), "%s", msg ? msg : "(no unavailable)");
	json_decref(h);
	r = http(&s, "GET", "/health", NULL);
	cr_expect_null(strcasestr(r.headers, "Retry-After"), "%s", r.headers);
	reply_free(&r);
	server_stop(&s);
}

/* F2 off says so on every response; an explicit request is validated
 * before serving, as run does. */
Test(serve, f2_off_and_explicit_request, .timeout = 600)
{
	const char *dir = plugins((const char *const[]){ "cpu_q8act", NULL });
	const char *model = fixture("tiny-qwen2.gguf");
	const char *off[] = { "-m", model, "--plugin-path", dir, "--f2", "off", NULL };
	const char *named[] = { "-m", model, "--plugin-path", dir, "--kernel", "cpu-q8act",
		                "--parallel", "1", NULL };
	const char *paths[] = { "/v1/models", "/health", "/metrics", "/nowhere" };
	struct server s;
	struct reply r;
	char *v, *log;
	json_t *h;

	server_start(&s, off, test_tmpdir(), NULL);
	for (size_t i = 0; i < 4; i++) {
		r = http(&s, "GET", paths[i], NULL);
		v = header(&r, "X-Q4KHost-F2");
		cr_assert(!strncmp(v, "off; cpu/cpu-q8act serves UNVERIFIED", 36), "%s: %s", paths[i], v);
		free(v);
		reply_free(&r);
	}
	r = http(&s, "POST", "/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 2}");
	cr_assert_eq(r.status, 200);
	v = header(&r, "X-Q4KHost-F2");
	cr_assert(!strncmp(v, "off;", 4), "%s", v);
	/* the body says so too, for a client that keeps bodies alone */
	h = json_loads(r.body, 0, NULL);
	cr_assert_not_null(h, "%s", r.body);
	cr_expect_str_eq(json_string_value(json_object_get(h, "q4khost_f2")), v);
	json_decref(h);
	free(v);
	reply_free(&r);
	/* not ready: a balancer or Kubernetes sends it nothing */
	h = health(&s);
	cr_assert(json_is_true(json_object_get(json_object_get(h, "f2"), "unverified")));
	cr_assert(json_is_false(json_object_get(h, "ready")));
	json_decref(h);
	log = read_log(&s);
	cr_assert_not_null(strstr(log, "F2 IS OFF"), "%s", log);
	free(log);
	server_stop(&s);

	server_start(&s, named, test_tmpdir(), NULL);
	log = read_log(&s);
	cr_assert_not_null(strstr(log, "F2 runs before serving"), "%s", log);
	cr_assert_not_null(strstr(log, "F2: pass (fresh: no receipt)"), "%s", log);
	cr_expect_not_null(strstr(log, " (tiny-qwen2.gguf), 1 slot of "), "%s", log);
	free(log);
	v = serving(&s);
	cr_assert_str_eq(v, "cpu/cpu-q8act");
	free(v);
	server_stop(&s);
}

/*
 * ignore_eos (llama-server's and vLLM's field, for benchmarks that need
 * answers of max_tokens): greedy on tiny-llama, this prompt's answer ends
 * with an end-of-generation token after 17 tokens; with ignore_eos the
 * same answer goes on through it to max_tokens, finish_reason "length".
 */
Test(serve, ignore_eos_answers_max_tokens, .timeout = 120)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *args[] = { "-m", fixture("tiny-llama.gguf"), "--plugin-path", dir,
		               "--backend", "cpu", NULL };
	char prompt[560] = "0 0 ", body[1024], *text[2] = { NULL, NULL };
	struct server s;

	while (strlen(prompt) < 511) /* scripts/serve-load.py's first prompt */
		strcat(prompt, "the quick brown fox ");
	prompt[511] = 0;
	server_start(&s, args, test_tmpdir(), NULL);
	for (int ignore = 0; ignore < 2; ignore++) {
		struct reply r;
		json_t *b, *choice;

		snprintf(body, sizeof(body), "{\"prompt\": \"%s\", \"max_tokens\": 128, "
		         "\"temperature\": 0, \"ignore_eos\": %s}", prompt,
		         ignore ? "true" : "false");
		r = http(&s, "POST", "/v1/completions", body);
		cr_assert_eq(r.status, 200, "%s", r.body);
		b = json_loads(r.body, 0, NULL);
		cr_assert_not_null(b, "%s", r.body);
		choice = json_array_get(json_object_get(b, "choices"), 0);
		cr_expect_str_eq(json_string_value(json_object_get(choice, "finish_reason")),
		                 ignore ? "length" : "stop");
		cr_expect_eq(json_integer_value(json_object_get(json_object_get(b, "usage"),
		                                                "completion_tokens")),
		             ignore ? 128 : 17, "%s", r.body);
		text[ignore] = strdup(json_string_value(json_object_get(choice, "text")));
		json_decref(b);
		reply_free(&r);
	}
	cr_expect(!strncmp(text[1], text[0], strlen(text[0])),
	          "the answer past the end-of-generation token does not start with the one "
	          "that stopped there: %s / %s", text[0], text[1]);
	free(text[0]);
	free(text[1]);
	server_stop(&s);
}

/* An empty Q4KHOST_API_KEY is no key, said at start-up; a request naming
 * another model (a client's fixed "gpt-4") is served by the one model
 * loaded, whose id the response carries, as /v1/models lists it. */
Test(serve, an_empty_key_is_warned_about_and_any_model_name_is_served, .timeout = 600)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *args[] = { "-m", model, "--plugin-path", dir, NULL };
	const char *req = "{\"model\": \"gpt-4\", \"messages\": [{\"role\": \"user\", "
	                  "\"content\": \"Hi\"}], \"max_tokens\": 2}";
	struct server s;
	struct reply r;
	json_t *models, *answer;
	char *log;

	server_start_env(&s, args, test_tmpdir(), NULL, "Q4KHOST_API_KEY=");
	log = read_log(&s);
	cr_expect_not_null(strstr(log, "warning: Q4KHOST_API_KEY is set but empty, which means no "
	                               "key: the server is open to every client that reaches it"),
	                   "%s", log);
	cr_expect_null(strstr(log, "API key: none"), "a warning says it: %s", log);
	free(log);
	r = http(&s, "GET", "/v1/models", NULL);
	models = json_loads(r.body, 0, NULL);
	cr_assert_not_null(models, "%s", r.body);
	reply_free(&r);
	r = http(&s, "POST", "/v1/chat/completions", req);
	cr_expect_eq(r.status, 200, "no key asked, any model name taken: %s", r.body);
	answer = json_loads(r.body, 0, NULL);
	cr_assert_not_null(answer, "%s", r.body);
	cr_expect_str_eq(json_string_value(json_object_get(answer, "model")),
	                 json_string_value(json_object_get(
	                         json_array_get(json_object_get(models, "data"), 0), "id")),
	                 "%s", r.body);
	json_decref(answer);
	json_decref(models);
	reply_free(&r);
	server_stop(&s);
}

/* Issue 19: the log names the device the background F2 measures on, and
 * an empty 'messages' array is called empty, not just "an array". */
Test(serve, names_the_device_f2_measures_on_and_an_empty_messages_array, .timeout = 300)
{
	const char *dir = plugins((const char *const[]){ "cpu_q8act", NULL });
	const char *args[] = { "-m", fixture("tiny-llama.gguf"), "--plugin-path", dir, NULL };
	struct server s;
	struct reply r;
	char *log;

	server_start(&s, args, test_tmpdir(), NULL);
	log = read_log(&s);
	cr_expect_not_null(strstr(log, "q4khost serve: F2 measures cpu-q8act on cpu, device 0, in "
	                               "the background (by score ("), "%s", log);
	/* no key at all: the warning --help promises, not "API key: none" */
	cr_expect_not_null(strstr(log, "q4khost serve: warning: no API key (neither "
	                               "--api-key-file nor Q4KHOST_API_KEY gives one): anyone who "
	                               "can reach the port can use it"), "%s", log);
	free(log);
	/* the column where the bad token starts, not where it ends */
	r = http(&s, "POST", "/v1/chat/completions", "not json");
	cr_expect_eq(r.status, 400, "%s", r.body);
	cr_expect_not_null(strstr(r.body, "near 'not' (line 1, column 1)"), "%s", r.body);
	reply_free(&r);
	r = http(&s, "POST", "/v1/chat/completions", "{\"messages\": []}");
	cr_expect_eq(r.status, 400, "%s", r.body);
	cr_expect_not_null(strstr(r.body, "'messages' must be a non-empty array, got an empty "
	                                  "array\""), "%s", r.body);
	reply_free(&r);
	server_stop(&s);
}

/* The access line of the request METHOD PATH with STATUS in S's log,
 * waited for (a line comes when its request ends); malloc()ed. */
static char *access_line(const struct server *s, const char *method, const char *path,
                         int status)
{
	char want[512], *log, *at, *line;

	snprintf(want, sizeof(want), "q4khost serve: access: 127.0.0.1 %s %s %d ", method, path,
	         status);
	log = await_log(s, want);
	at = strstr(log, want);
	line = strndup(at, strcspn(at, "\n"));
	free(log);
	return line;
}

/*
 * Issue 33: every request has an access line (method, path, status, time
 * and why), 4xx ones included; a client that drops a request before its
 * answer is a 499 line, not libmicrohttpd's "internal error"; a NUL in a
 * string is said in the user's words, not by jansson's flag.
 */
Test(serve, access_log_and_plain_words, .timeout = 300)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *args[] = { "-m", fixture("tiny-llama.gguf"), "--plugin-path", dir, NULL };
	const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], "
	                   "\"max_tokens\": 1500, \"temperature\": 0}";
	struct server s;
	struct reply r;
	char cmd[8192], req[4200], raw[1024], *line, *log, *out;
	int n;

	server_start(&s, args, test_tmpdir(), NULL);
	r = http(&s, "POST", "/v1/chat/completions",
	         "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}");
	cr_expect_eq(r.status, 400, "%s", r.body);
	cr_expect_null(strstr(r.body, "JSON_ALLOW_NUL"), "%s", r.body);
	cr_expect_not_null(strstr(r.body, "a string in the body holds \\\\u0000, a NUL character, "
	                                  "which no prompt or field may contain (line 1, column "),
	                   "%s", r.body);
	reply_free(&r);
	line = access_line(&s, "POST", "/v1/chat/completions", 400);
	cr_expect_not_null(strstr(line, " s: a string in the body holds \\u0000, a NUL character"),
	                   "%s", line);
	free(line);

	r = http(&s, "GET", "/v1/nothing", NULL);
	cr_expect_eq(r.status, 404, "%s", r.body);
	reply_free(&r);
	line = access_line(&s, "GET", "/v1/nothing", 404);
	cr_expect_not_null(strstr(line, " s: no such endpoint"), "%s", line);
	free(line);
	r = http(&s, "GET", "/health", NULL);
	reply_free(&r);
	free(access_line(&s, "GET", "/health", 200));

	/* A long answer asked for, the connection closed at once. */
	snprintf(req, sizeof(req), "%s/request", test_tmpdir());
	n = snprintf(raw, sizeof(raw),
	             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
	             "application/json\r\nContent-Length: %zu\r\n\r\n%s",
	             strlen(body), body);
	test_write_file(req, raw, (size_t)n);
	snprintf(cmd, sizeof(cmd), "bash -c 'exec 3<>/dev/tcp/127.0.0.1/%s && cat %s >&3'",
	         strrchr(s.url, ':') + 1, req);
	cr_assert_eq(test_shell(cmd, &out), 0, "%s: %s", cmd, out);
	free(out);
	line = access_line(&s, "POST", "/v1/chat/completions", 499);
	cr_expect_not_null(strstr(line, " s: the client closed the connection before the answer; "
	                                "chatcmpl-"),
	                   "%s", line);
	cr_expect_not_null(strstr(line, " was cancelled"), "%s", line);
	free(line);
	server_stop(&s);
	log = read_log(&s);
	cr_expect_null(strstr(log, "internal error"), "%s", log);
	free(log);
}

/*
 * Issue 34: 256 clients at once, each reconnecting for its second request,
 * with the default limits (and the default KV pages, which /health
 * shows): every request is answered, none refused at the connection
 * limit. Then with a queue of 8: the requests past it get 503
 * with Retry-After, said in their access lines, and are answered when
 * sent again after it.
 */
Test(serve, a_crowd_of_clients_is_answered, .timeout = 300)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *defaults[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu", NULL };
	const char *small[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu",
		                "--max-queue", "8", NULL };
	struct server s;
	char py[8192], *log, *line;
	json_t *h;

	server_start(&s, defaults, test_tmpdir(), NULL);
	h = health(&s);
	cr_expect(json_is_object(json_object_get(h, "kv_pages")),
	          "the default settings have no KV pages");
	json_decref(h);
	snprintf(py, sizeof(py), "%s 256 2 any", s.url);
	python("crowd.py", py);
	server_stop(&s);
	log = read_log(&s);
	cr_expect_null(strstr(log, "(--max-connections)"), "%s", log);
	free(log);

	server_start(&s, small, test_tmpdir(), NULL);
	snprintf(py, sizeof(py), "%s 256 1 503", s.url);
	python("crowd.py", py);
	line = access_line(&s, "POST", "/v1/completions", 503);
	cr_expect_not_null(strstr(line, "s: the queue is full (8 requests waiting); try again "
	                                "later (Retry-After: 1 s)"), "%s", line);
	free(line);
	server_stop(&s);
}

/*
 * Issue 34, continuous batching: six clients at once with prompts of 3
 * to 188 words on the exact cpu backend, --step-tokens 48 so that a
 * prompt takes up to six steps: steps carry prompt chunks of several
 * requests beside the answer tokens of others (tests/serve/mixed.py), and
 * every greedy answer is the one the same prompt gets alone and from
 * q4khost run.
 */
Test(serve, prompts_and_answers_share_steps, .timeout = 180)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *args[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu",
		               "--parallel", "6", "--step-tokens", "48", NULL };
	struct server s;
	char py[16384];

	server_start(&s, args, test_tmpdir(), NULL);
	snprintf(py, sizeof(py), "%s %s %s %s 6", s.url, q4khost(), model, dir);
	python("mixed.py", py);
	server_stop(&s);
}

/*
 * Issue 34, prefix reuse: four clients at once share a long system
 * prompt, each asking two questions in turn, greedy and sampled with a
 * seed, on the exact cpu backend (tests/serve/prefix.py) with MODEL:
 * every answer is the one a server with --prefix-cache off gives, byte
 * for byte, and /metrics counts the hits; the log line of a request that
 * reused blocks says how many of its prompt tokens were reused.
 */
static void shared_system_prompt(const char *model)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *on[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu",
		             "--parallel", "4", NULL };
	const char *off[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu",
		              "--parallel", "4", "--prefix-cache", "off", NULL };
	struct server s, t;
	char py[8192];

	server_start(&s, on, test_tmpdir(), NULL);
	server_start(&t, off, test_tmpdir(), NULL);
	snprintf(py, sizeof(py), "%s %s 4", s.url, t.url);
	python("prefix.py", py);
	server_stop(&t);
	server_stop(&s);
	expect_log(&s, " of them reused) + 10 answer tokens", 1);
}

/* On tiny-llama: quick, but its answers hardly depend on the prompt. */
Test(serve, a_shared_system_prompt_is_reused_with_the_same_answers, .timeout = 180)
{
	shared_system_prompt(fixture("tiny-llama.gguf"));
}

/* On Gemma 3 (the default model), whose answers do: a reused key one
 * token off changes a sampled answer there (checked by planting it). */
Test(serve, a_shared_system_prompt_on_gemma3_is_answered_as_without_reuse, .timeout = 300)
{
	shared_system_prompt(test_model_path());
}

/*
 * Issue 34, the paged KV cache: eight slots share a pool of POOL pages of
 * 16 tokens (--kv-pages POOL), which holds one request of the test's but
 * not two whole prompts (tests/serve/pages.py checks it from the token
 * counts), with MODEL on BACKEND (NULL: the exact cpu, the only plugin on
 * the path; else measured by F2 before serving, as for the load test):
 * eight clients at once share a system prompt and ask two questions each:
 * every answer is the one a server with a cache per slot (--kv-pages 0)
 * and no prefix reuse gives the request alone, byte for byte, sampled
 * ones too on the exact cpu; requests waited for pages and none was lost
 * or failed; prefix hits shared pages and copied none; /health and
 * /metrics show the pool, and the log line at start-up too; a request
 * bigger than the pool is refused with 400, naming the pages it needs and
 * --kv-pages. On cuda every step went through the backend's graph entry,
 * most of them replays of its recordings (q4khost_steps_total{path}).
 * With DEFAULTS, a third server without --kv-pages pages too (auto: the
 * eight slots' whole contexts of 512 tokens, 256 pages) and answers as
 * the cache per slot does, no request waiting for pages.
 */
static void pages_on(const char *model, const char *backend, int pool, int defaults)
{
	const char *dir = plugins((const char *const[]){ NULL });
	char path[8192], served[64], py[16384], pages[16], want[256];
	const char *paged[] = { "-m", model, "--plugin-path", path, "--ctx", "512",
		                "--parallel", "8", "--kv-pages", pages,
		                "--backend", backend ? backend : "cpu", "--f2", "require", NULL };
	const char *plain[] = { "-m", model, "--plugin-path", path, "--ctx", "512",
		                "--kv-pages", "0", "--prefix-cache", "off",
		                "--backend", backend ? backend : "cpu", "--f2", "require", NULL };
	const char *by_default[] = { "-m", model, "--plugin-path", path, "--ctx", "512",
		                     "--parallel", "8",
		                     "--backend", backend ? backend : "cpu", "--f2", "require", NULL };
	const char *mode = !backend ? "exact" : strcmp(backend, "cuda") ? "fast" : "graph";
	struct server s, t, d;

	snprintf(pages, sizeof(pages), "%d", pool);
	snprintf(path, sizeof(path), "%s", dir);
	if (backend)
		snprintf(path, sizeof(path), "%s:%s/plugins/%s/.libs", dir, test_builddir(),
		         backend);
	snprintf(served, sizeof(served), "%s/built-in", backend ? backend : "cpu");
	server_start(&s, paged, test_tmpdir(), NULL);
	await_serving(&s, served);
	server_start(&t, plain, test_tmpdir(), NULL);
	await_serving(&t, served);
	snprintf(py, sizeof(py), "%s %s %d 8 %s", s.url, t.url, pool, mode);
	python("pages.py", py);
	server_stop(&s);
	if (defaults) {
		server_start(&d, by_default, test_tmpdir(), NULL);
		await_serving(&d, served);
		snprintf(py, sizeof(py), "%s %s 256 8 %s auto", d.url, t.url, mode);
		python("pages.py", py);
		server_stop(&d);
		expect_log(&d, "KV cache: 256 pages of 16 tokens (auto, the default: as many as "
		               "--parallel 8 whole contexts of 512 tokens hold) shared by the slots",
		           1);
	}
	server_stop(&t);
	snprintf(want, sizeof(want), "KV cache: %d pages of 16 tokens (--kv-pages) shared by the slots",
	         pool);
	expect_log(&s, want, 1);
	expect_log(&t, "KV cache: a whole context's per slot (0 pages, --kv-pages)", 1);
}

/* On tiny-llama: quick, but its answers hardly depend on the prompt. */
Test(serve, many_slots_on_few_pages_answer_as_a_cache_per_slot, .timeout = 300)
{
	pages_on(fixture("tiny-llama.gguf"), NULL, 20, 1);
}

/* On Gemma 3 (the default model), whose answers do. */
Test(serve, many_slots_on_few_pages_on_gemma3_answer_as_a_cache_per_slot, .timeout = 600)
{
	pages_on(test_model_path(), NULL, 12, 0);
}

/* On cpu-fast, its own paged attention and F16 pages. */
Test(serve, many_slots_on_few_pages_on_cpu_fast, .timeout = 600)
{
	test_need_cpu_fast();
	pages_on(fixture("tiny-llama.gguf"), "cpu-fast", 20, 1);
}

/* On cuda: the paged steps, batched decode among them, through its graph
 * entry (recorded, replayed with new tables and positions). Skips where
 * this build has no CUDA plugins or the system shows no NVIDIA GPU. */
Test(serve, many_slots_on_few_pages_on_cuda_replay_their_steps, .timeout = 600)
{
#ifdef Q4KH_CUDA_ARCHS
	test_need_cuda_device("q4khost serve --kv-pages on cuda");
	pages_on(fixture("tiny-llama.gguf"), "cuda", 20, 1);
#else
	cr_skip_test("this build has no CUDA plugins");
#endif
}

/*
 * [serve] kv_pages in a configuration file sets the pool as --kv-pages
 * does: the start-up line names the file and line it came from, /health
 * shows the pool; auto there is the default's pool, said as from the
 * file; a value that is neither auto nor a whole number in range is
 * refused before any work (exit 3), naming the file, the line and what is
 * taken; on the command line, a usage error (exit 2).
 */
Test(serve, kv_pages_from_the_configuration_file, .timeout = 120)
{
	const char *dir = plugins((const char *const[]){ NULL });
	char conf[4200], bad[4200], args[16384], want[4400], *out;
	const char *argv[] = { "-m", fixture("tiny-llama.gguf"), "--plugin-path", dir,
		               "--backend", "cpu", "--config", conf, NULL };
	struct server s;
	json_t *h;

	snprintf(conf, sizeof(conf), "%s/serve.ini", test_tmpdir());
	test_write_file(conf, "[serve]\n\nkv_pages = 24\n", strlen("[serve]\n\nkv_pages = 24\n"));
	server_start(&s, argv, test_tmpdir(), NULL);
	snprintf(want, sizeof(want), "KV cache: 24 pages of 16 tokens (%s:3 [serve]) shared", conf);
	expect_log(&s, want, 1);
	h = health(&s);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(h, "kv_pages"), "total")),
	             24);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(h, "kv_pages"), "free")),
	             24);
	json_decref(h);
	server_stop(&s);

	test_write_file(conf, "[serve]\nkv_pages = auto\n", strlen("[serve]\nkv_pages = auto\n"));
	server_start(&s, argv, test_tmpdir(), NULL);
	/* tiny-llama's context: 2048 tokens, 128 pages a slot */
	snprintf(want, sizeof(want), "KV cache: 512 pages of 16 tokens (auto, %s:2 [serve]: as "
	         "many as --parallel 4 whole contexts of 2048 tokens hold)", conf);
	expect_log(&s, want, 1);
	server_stop(&s);

	snprintf(bad, sizeof(bad), "%s/bad.ini", test_tmpdir());
	test_write_file(bad, "[serve]\nkv_pages = -1\n", strlen("[serve]\nkv_pages = -1\n"));
	snprintf(args, sizeof(args), "serve --port 0 -m %s --plugin-path %s --backend cpu --config %s",
	         fixture("tiny-llama.gguf"), dir, bad);
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 3, "%s", out);
	snprintf(want, sizeof(want), "%s:2 [serve]: kv_pages = \"-1\": expected auto or a whole "
	         "number from 0 to 16777216", bad);
	cr_expect_not_null(strstr(out, want), "%s", out);
	free(out);

	snprintf(args, sizeof(args), "serve --port 0 -m %s --kv-pages lots",
	         fixture("tiny-llama.gguf"));
	cr_expect_eq(test_q4khost("", test_tmpdir(), args, &out), 2, "%s", out);
	cr_expect_not_null(strstr(out, "q4khost serve: --kv-pages must be auto or a whole number "
	                               "in [0, 16777216], got 'lots'"), "%s", out);
	free(out);
}

/*
 * Issue 34: the default pool (--kv-pages auto) falls back to a whole
 * context's cache per slot on a model with recurrent layers (qwen35),
 * whose states hold one sequence: the start-up line says so and why,
 * /health shows no pool, and requests are answered. An explicit
 * --kv-pages N that cannot be honoured is refused (exit 1, the reason
 * said) rather than falling back.
 */
Test(serve, a_recurrent_model_falls_back_to_a_cache_per_slot, .timeout = 120)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-qwen35.gguf");
	const char *argv[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu", NULL };
	char args[16384], *out;
	struct server s;
	struct reply r;
	json_t *h;
	int rc;

	server_start(&s, argv, test_tmpdir(), NULL);
	h = health(&s);
	cr_expect(json_is_null(json_object_get(h, "kv_pages")), "kv_pages is not null");
	json_decref(h);
	r = http(&s, "POST", "/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 4}");
	cr_expect_eq(r.status, 200, "%s", r.body);
	reply_free(&r);
	server_stop(&s);
	expect_log(&s, "KV cache: a whole context's per slot, not pages (auto, the default): "
	               "qwen35 has recurrent layers, whose states hold one sequence: no paged "
	               "KV cache", 1);

	snprintf(args, sizeof(args), "serve --port 0 -m %s --plugin-path %s --backend cpu "
	         "--kv-pages 32", model, dir);
	rc = test_q4khost("", test_tmpdir(), args, &out);
	cr_expect_eq(rc, 1, "exit %d: %s", rc, out);
	cr_expect_not_null(strstr(out, "qwen35 has recurrent layers, whose states hold one "
	                                "sequence: no paged KV cache"), "%s", out);
	free(out);
}

/*
 * Issue 34: more clients at once than --max-connections (4), each on a
 * connection of its own: every connection past the limit is accepted and
 * answered 503 with Retry-After and a JSON error (tests/serve/crowd.py
 * fails on a reset, a broken pipe or a connection closed unanswered), said
 * in its access line and counted on /metrics; sent again, every request is
 * answered.
 */
Test(serve, connections_past_the_limit_get_503, .timeout = 120)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *args[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu",
		               "--parallel", "1", "--max-connections", "4", NULL };
	struct server s;
	struct reply r;
	char py[8192], *line;
	const char *at;

	server_start(&s, args, test_tmpdir(), NULL);
	snprintf(py, sizeof(py), "%s 48 2 503", s.url);
	python("crowd.py", py);
	line = access_line(&s, "POST", "/v1/completions", 503);
	cr_expect_not_null(strstr(line, " s: 4 connections are open, the most this server takes "
	                                "(--max-connections); try again later (Retry-After: 1 s)"),
	                   "%s", line);
	free(line);
	r = http(&s, "GET", "/metrics", NULL);
	cr_assert_eq(r.status, 200, "%s", r.body);
	at = strstr(r.body, "q4khost_rejected_total{reason=\"connections\"} ");
	cr_assert_not_null(at, "%s", r.body);
	cr_expect_gt(atol(at + strlen("q4khost_rejected_total{reason=\"connections\"} ")), 0,
	             "%s", r.body);
	cr_expect_not_null(strstr(r.body, "q4khost_queue_depth 0\n"), "%s", r.body);
	cr_expect_not_null(strstr(r.body, "q4khost_connections_limit 4\n"), "%s", r.body);
	reply_free(&r);
	server_stop(&s);
	expect_log(&s, "connection limit", 0);
}

/*
 * Issue 34: two replicas and a third with F2 off behind HAProxy with the
 * configuration in packaging/haproxy (tests/serve/balance.py): the third,
 * not ready, gets nothing; the first, stopped with SIGTERM in the middle
 * of a load, drains and exits 0 while every request is answered. Skips
 * without haproxy (scripts/install-deps.sh installs it).
 */
Test(serve, replicas_behind_haproxy, .timeout = 300)
{
	const char *dir = plugins((const char *const[]){ NULL });
	const char *unverified = plugins((const char *const[]){ "cpu_q8act", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *ready[] = { "-m", model, "--plugin-path", dir, NULL };
	const char *off[] = { "-m", model, "--plugin-path", unverified, "--f2", "off", NULL };
	struct server r[3];
	char py[16384], *out;
	int status;

	status = test_shell("command -v haproxy", &out);
	free(out);
	if (status)
		cr_skip_test("haproxy is not installed (scripts/install-deps.sh installs it)");
	server_start(&r[0], ready, test_tmpdir(), NULL);
	server_start(&r[1], ready, test_tmpdir(), NULL);
	server_start(&r[2], off, test_tmpdir(), NULL);
	snprintf(py, sizeof(py), "%s/packaging/haproxy/q4khost-serve.cfg %s %d %s %s %s %s %s",
	         test_srcdir(), r[0].url, (int)r[0].pid, r[0].log, r[1].url, r[1].log, r[2].url,
	         r[2].log);
	python("balance.py", py);
	status = server_wait(&r[0]);
	cr_assert_eq(status, 0, "the replica stopped with SIGTERM exited %d", status);
	server_stop(&r[1]);
	server_stop(&r[2]);
}

/* Issue 34: the Kubernetes example validates against Kubernetes' schemas
 * and agrees with serve (tests/serve/kubernetes_check.py); skips without
 * kubernetes-validate (scripts/fetch-python.sh kubernetes-validate). */
Test(serve_deploy, kubernetes_example, .timeout = 120)
{
	char args[8192];

	snprintf(args, sizeof(args), "%s/packaging/kubernetes/q4khost-serve.yaml %s", test_srcdir(),
	         q4khost());
	python_with("kubernetes-validate", "kubernetes_check.py", args);
}

/*
 * A receipt edited by hand (docs/f2.md, R.1) decides nothing for serve
 * either: defect-biased's broken receipt, edited into a pass without the
 * key, is refused by its MAC at start-up, so the reference serves while
 * F2 measures the variant again in the background, finds it broken, and
 * the reference goes on serving.
 */
Test(serve, an_edited_receipt_does_not_serve, .timeout = 300)
{
	const char *dir = plugins((const char *const[]){ "defect_biased", NULL });
	const char *model = fixture("tiny-llama.gguf"), *receipts = test_tmpdir();
	const char *args[] = { "-m", model, "--plugin-path", dir, NULL };
	char cmd[16384], *out, *log, *path;
	struct server s;
	json_t *r;

	snprintf(cmd, sizeof(cmd),
	         "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s validate -m %s --plugin-path %s "
	         "--kernel defect-biased 2>&1",
	         receipts, receipts, q4khost(), model, dir);
	cr_assert_eq(test_shell(cmd, &out), 1, "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "ls %s/*.json", receipts);
	cr_assert_eq(test_shell(cmd, &path), 0, "%s", path);
	*strchr(path, '\n') = 0;
	r = json_load_file(path, 0, NULL);
	cr_assert_not_null(r, "%s", path);
	json_object_set_new(r, "verdict", json_string("pass"));
	cr_assert_eq(json_dump_file(r, path, JSON_INDENT(1)), 0);
	json_decref(r);

	server_start(&s, args, receipts, NULL);
	log = await_log(&s, "background F2: cpu/defect-biased: broken: position 1 (prefill): ");
	cr_expect_not_null(strstr(log, "fails its integrity check: edited, or written with another "
	                               "key; measuring again]; cpu/built-in keeps serving"),
	                   "%s", log);
	free(log);
	out = serving(&s);
	cr_expect_str_eq(out, "cpu/built-in");
	free(out);
	server_stop(&s);
	free(path);
}

/*
 * serve that can need no receipt (--f2 off; or the reference alone,
 * --backend cpu --kernel none) starts with a receipt folder, and a key,
 * that cannot be made: it needs neither (docs/config.md, receipt_dir).
 */
Test(serve, f2_off_needs_no_receipt_folder, .timeout = 300)
{
	const char *dir = plugins((const char *const[]){ "cpu_q8act", NULL });
	const char *model = fixture("tiny-llama.gguf");
	const char *off[] = { "-m", model, "--plugin-path", dir, "--f2", "off", NULL };
	const char *ref[] = { "-m", model, "--plugin-path", dir, "--backend", "cpu", "--kernel",
		              "none", NULL };
	char file[4200], receipts[4300], *p;
	struct server s;

	snprintf(file, sizeof(file), "%s/a-file", test_tmpdir());
	test_write_file(file, "x\n", 2);
	/* the folder and the key's folder (XDG_CONFIG_HOME) under a file */
	snprintf(receipts, sizeof(receipts), "%s/f2", file);
	server_start(&s, off, receipts, NULL);
	p = serving(&s);
	cr_expect_str_eq(p, "cpu/cpu-q8act");
	free(p);
	server_stop(&s);
	server_start(&s, ref, receipts, NULL);
	p = serving(&s);
	cr_expect_str_eq(p, "cpu/built-in");
	free(p);
	server_stop(&s);
}
