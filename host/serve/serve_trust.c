/*
 * What serve trusts, and when it changes its mind.
 *
 * Start-up walks the same candidates as q4khost run (q4kh_select_plan) in
 * the same order and serves from the first one that is trusted now,
 * decided as run decides (decide.h, receipts only): the reference cpu
 * backend, or a candidate whose valid receipt says pass (or any candidate
 * with F2 off, loudly). Candidates before it that have no
 * valid receipt are measured in the background, best first, by the same
 * child process as everywhere (q4khost validate, which runs validate --one
 * under F2's limits); the first that passes becomes the path for new
 * requests. A plan with nothing trusted (an explicit request that leaves
 * out the reference) and --f2 require are chosen as run chooses: F2 first,
 * then serving.
 */
#include "buildconf.h"

#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "candidates.h"
#include "isolate.h"

extern char **environ;

void serve_trust_note(struct serve *srv, const char *path, const char *verdict,
                      const char *source, const char *message)
{
	struct serve_verdict *v;

	if (srv->n_verdicts == SERVE_MAX_VERDICTS) {
		memmove(srv->verdicts, srv->verdicts + 1,
		        sizeof(srv->verdicts) - sizeof(srv->verdicts[0]));
		srv->n_verdicts--;
	}
	v = &srv->verdicts[srv->n_verdicts++];
	snprintf(v->path, sizeof(v->path), "%s", path);
	snprintf(v->verdict, sizeof(v->verdict), "%s", verdict);
	snprintf(v->source, sizeof(v->source), "%s", source);
	snprintf(v->message, sizeof(v->message), "%s", message);
	if (!strcmp(verdict, "pass"))
		srv->m.f2_pass++;
	else if (!strcmp(verdict, "reject") || !strcmp(verdict, "broken"))
		srv->m.f2_reject++;
	else
		srv->m.f2_other++;
}

/*
 * Whether plan entry C may serve now, without measuring (decide.h), into
 * D: a verdict of F2 goes to serve's verdicts, a rejection's line to
 * STEPS (CAP bytes). A candidate F2 cannot decide on is undecided.
 */
static enum q4kh_outcome classify(struct serve *srv, const struct q4kh_candidate *c,
                                  struct q4kh_decision *d, char *steps, size_t cap)
{
	const struct q4kh_decide_how how = { srv->mode, srv->mode_origin, 1, &srv->rq };
	struct q4kh_error e = { { 0 } };
	char name[160];

	q4kh_candidate_name(c, name, sizeof(name));
	if (q4kh_decide(&how, &srv->judge, c, &c->dev, d, &e)) {
		serve_log("%s: F2 could not look for a receipt: %s", name, e.msg);
		return Q4KH_UNDECIDED;
	}
	q4kh_receipt_free(&d->d.receipt); /* its points; the message stays */
	if (!d->judged)
		return d->outcome;
	pthread_mutex_lock(&srv->lock);
	serve_trust_note(srv, name, d->verdict, d->source, d->message);
	srv->m.fallbacks += d->outcome != Q4KH_SERVES;
	pthread_mutex_unlock(&srv->lock);
	if (d->outcome == Q4KH_REJECTED)
		q4kh_decision_step(d, name, steps, cap);
	return d->outcome;
}

/* Open plan entry C as a path with the F2 record D and the lines STEPS. */
static struct serve_path *open_trusted(struct serve *srv, const struct q4kh_candidate *c,
                                       const struct q4kh_decision *d, const char *steps,
                                       struct q4kh_error *err)
{
	struct serve_path *p;

	if (serve_path_open(srv, c, &p, err))
		return NULL;
	q4kh_decision_record(d, &p->sel);
	snprintf(p->sel.steps, sizeof(p->sel.steps), "%s", steps);
	p->unverified = !strcmp(d->verdict, "off");
	p->guarded = d->judged;
	return p;
}

struct serve_path *serve_trust_fallback(struct serve *srv, int after,
                                        struct q4kh_error *err)
{
	struct q4kh_decision d;
	char steps[2048];

	for (int i = after + 1; i < srv->n_plan; i++) {
		struct q4kh_error e = { { 0 } };
		struct serve_path *p;

		steps[0] = 0;
		if (classify(srv, &srv->plan[i], &d, steps, sizeof(steps)) != Q4KH_SERVES)
			continue;
		p = open_trusted(srv, &srv->plan[i], &d, steps, &e);
		if (p)
			return p;
		serve_log("%s: cannot start: %s", srv->plan[i].why, e.msg);
	}
	q4kh_fail(err, "no candidate after it in the plan is trusted");
	return NULL;
}

/* Read FD to its end into a malloc()ed string; NULL on out of memory. */
static char *read_all(int fd)
{
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	ssize_t got;

	while (buf) {
		if (len + 1024 > cap) {
			char *b = realloc(buf, cap * 2);
			if (!b)
				break;
			buf = b;
			cap *= 2;
		}
		got = read(fd, buf + len, cap - len - 1);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			buf[len] = 0;
			return buf;
		}
		len += (size_t)got;
	}
	free(buf);
	return NULL;
}

/*
 * Start q4khost validate --json on candidate C in a process group of its
 * own, so that stopping serve can end it and the measurement it runs
 * (which writes no receipt when killed). *pid and *fd: the child and its
 * standard output. Called with srv->lock held, on the F2 thread, which
 * waits for the child (measure), so outlives it.
 *
 * q4kh_isolate_spawn (fork and exec), not posix_spawn: the child must die
 * with serve. A serve killed with no chance to stop it (SIGKILL, a crash)
 * would leave validate running, and the validate --one it started (whose
 * own death signal is validate's) measuring on and writing a receipt. The
 * death signal kills it when the thread that forked it ends: the F2
 * thread, which ends only after waiting for it, or with the whole
 * process.
 */
static int spawn_validate(struct serve *srv, const struct q4kh_candidate *c, pid_t *pid,
                          int *fd, struct q4kh_error *err)
{
	struct q4kh_guard_args a;
	struct q4kh_spawn_how how = { -1, -1, 1, 0 };
	int pipefd[2];

	q4kh_guard_child_args(srv->judge.g, c, &a);
	/* [f2] require_deep: the child judges on the deep probe too, or it
	 * would answer from a shallow receipt that run does not take */
	q4kh_guard_deep_args(srv->judge.g, &a);
	if (srv->mode == Q4KH_F2_FRESH) {
		a.argv[a.n++] = "--f2";
		a.argv[a.n++] = "fresh";
	}
	a.argv[a.n++] = "--json";
	a.argv[a.n] = NULL;
	if (pipe2(pipefd, O_CLOEXEC))
		return q4kh_fail(err, "pipe: %s", strerror(errno));
	how.stdout_fd = pipefd[1];
	*pid = q4kh_isolate_spawn(srv->judge.g->self_exe, a.argv, &how, err);
	close(pipefd[1]);
	if (*pid < 0) {
		close(pipefd[0]);
		return -1;
	}
	/* the parent too, so that a stop can signal the group at once */
	setpgid(*pid, *pid);
	*fd = pipefd[0];
	return 0;
}

/* The verdict in validate's JSON output OUT into D's fields; without one,
 * how the process ended (its wait STATUS) is the reason. */
static void parse_verdict(const char *out, int status, struct serve_verdict *d)
{
	json_t *root = json_loads(out, 0, NULL);
	json_t *c = json_array_get(json_object_get(root, "candidates"), 0);
	const char *v = json_string_value(json_object_get(c, "verdict"));

	if (v) {
		snprintf(d->verdict, sizeof(d->verdict), "%s", v);
		snprintf(d->source, sizeof(d->source), "%s",
		         json_string_value(json_object_get(c, "source")) ?: "");
		snprintf(d->message, sizeof(d->message), "%s",
		         json_string_value(json_object_get(c, "message")) ?: "");
	} else {
		snprintf(d->verdict, sizeof(d->verdict), "not measured");
		snprintf(d->source, sizeof(d->source), "fresh");
		if (WIFSIGNALED(status))
			snprintf(d->message, sizeof(d->message),
			         "not measured: the validation process was killed by signal %d (%s) "
			         "before it gave a verdict (F2.4)",
			         WTERMSIG(status), strsignal(WTERMSIG(status)));
		else
			snprintf(d->message, sizeof(d->message),
			         "not measured: the validation process exited with status %d without "
			         "a verdict (F2.4)",
			         WEXITSTATUS(status));
	}
	json_decref(root);
}

/* Measure plan entry C in a child; its verdict into D. -1 when stopped. */
static int measure(struct serve *srv, const struct q4kh_candidate *c,
                   struct serve_verdict *d)
{
	struct q4kh_error e = { { 0 } };
	pid_t pid = 0;
	int fd = -1, status = 0;
	char *out;

	pthread_mutex_lock(&srv->lock);
	if (srv->f2_quit || spawn_validate(srv, c, &pid, &fd, &e)) {
		int quit = srv->f2_quit;
		pthread_mutex_unlock(&srv->lock);
		if (!quit)
			serve_log("background F2: %s", e.msg);
		return -1;
	}
	srv->f2_child = pid;
	snprintf(srv->validating, sizeof(srv->validating), "%s", d->path);
	pthread_mutex_unlock(&srv->lock);
	out = read_all(fd);
	close(fd);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	pthread_mutex_lock(&srv->lock);
	srv->f2_child = 0;
	srv->validating[0] = 0;
	pthread_mutex_unlock(&srv->lock);
	parse_verdict(out ? out : "", status, d);
	free(out);
	return 0;
}

static void *f2_main(void *arg)
{
	struct serve *srv = arg;

	for (int k = 0; k < srv->n_pending; k++) {
		const struct q4kh_candidate *c = &srv->plan[srv->pending[k]];
		struct serve_verdict d = { 0 };
		struct q4kh_error e = { { 0 } };
		struct serve_path *p = NULL;
		char reason[800];

		q4kh_candidate_name(c, d.path, sizeof(d.path));
		pthread_mutex_lock(&srv->lock);
		serve_log("background F2: measuring %s while %s serves", d.path,
		          srv->cur ? srv->cur->name : "nothing");
		pthread_mutex_unlock(&srv->lock);
		if (measure(srv, c, &d))
			return NULL;
		pthread_mutex_lock(&srv->lock);
		if (srv->f2_quit) {
			pthread_mutex_unlock(&srv->lock);
			return NULL;
		}
		serve_trust_note(srv, d.path, d.verdict, d.source, d.message);
		if (strcmp(d.verdict, "pass")) {
			srv->m.fallbacks++;
			serve_log("background F2: %s: %s: %s [%s]; %s keeps serving", d.path,
			          d.verdict, d.message, d.source, srv->cur ? srv->cur->name : "nothing");
			pthread_mutex_unlock(&srv->lock);
			continue;
		}
		pthread_mutex_unlock(&srv->lock);
		if (serve_path_open(srv, c, &p, &e)) {
			serve_log("background F2: %s passed but cannot start: %s", d.path, e.msg);
			continue;
		}
		snprintf(p->sel.f2_verdict, sizeof(p->sel.f2_verdict), "pass");
		snprintf(p->sel.f2_source, sizeof(p->sel.f2_source), "%s", d.source);
		snprintf(p->sel.f2_message, sizeof(p->sel.f2_message), "%s", d.message);
		p->guarded = 1;
		snprintf(reason, sizeof(reason), "F2 pass (%s): %s", d.source, d.message);
		pthread_mutex_lock(&srv->lock);
		if (!srv->f2_quit && (!srv->cur || srv->cur->plan_index > p->plan_index)) {
			serve_engine_switch(srv, p, 0, reason);
			p = NULL;
		}
		pthread_mutex_unlock(&srv->lock);
		serve_path_close(p);
		return NULL;
	}
	return NULL;
}

/* The path q4kh_select chooses, F2 measured first (run's way). */
static int start_synchronous(struct serve *srv, struct q4kh_error *err)
{
	struct serve_path *p;
	int explicit_failure;

	serve_log("nothing in the plan is trusted without a measurement: F2 runs before serving");
	if (serve_path_select(srv, &p, &explicit_failure, err))
		return explicit_failure ? -2 : -1;
	p->unverified = !strcmp(p->sel.f2_verdict, "off");
	p->guarded = !strcmp(p->sel.f2_verdict, "pass");
	srv->cur = p;
	return 0;
}

int serve_trust_start(struct serve *srv, struct q4kh_error *err)
{
	struct q4kh_decision d;
	struct serve_path *p = NULL;
	char skipped[2048], steps[2048] = "";

	srv->n_plan = q4kh_select_plan(&srv->rq, srv->plan, skipped, sizeof(skipped), err);
	if (srv->n_plan < 0)
		return -2;
	/* What the plan left out and why: a backend that could not start, or
	 * one without a weight type of this model. */
	for (const char *s = skipped; *s;) {
		size_t len = strcspn(s, "\n");

		serve_log("left out: %.*s", (int)len, s);
		s += len + (s[len] == '\n');
	}
	/* no guard, and no receipt folder, where nothing can need a receipt */
	if (q4kh_select_needs_receipts(&srv->rq) && q4kh_decide_guard_open(&srv->judge, &srv->rq, err))
		return -1;
	if (srv->mode == Q4KH_F2_REQUIRE)
		return start_synchronous(srv, err);
	for (int i = 0; i < srv->n_plan && !p; i++) {
		struct q4kh_error e = { { 0 } };

		switch (classify(srv, &srv->plan[i], &d, steps, sizeof(steps))) {
		case Q4KH_UNDECIDED:
			srv->pending[srv->n_pending++] = i;
			break;
		case Q4KH_REJECTED:
			break;
		case Q4KH_SERVES:
			p = open_trusted(srv, &srv->plan[i], &d, steps, &e);
			if (!p) {
				snprintf(steps + strlen(steps), sizeof(steps) - strlen(steps),
				         "%s: cannot start: %s\n", srv->plan[i].why, e.msg);
				serve_log("%s: cannot start: %s", srv->plan[i].why, e.msg);
			}
			break;
		}
	}
	if (!p) {
		srv->n_pending = 0;
		return start_synchronous(srv, err);
	}
	srv->cur = p;
	return 0;
}

int serve_trust_background(struct serve *srv, struct q4kh_error *err)
{
	if (!srv->n_pending)
		return 0;
	if (pthread_create(&srv->f2_thread, NULL, f2_main, srv))
		return q4kh_fail(err, "cannot start the background F2 thread");
	srv->f2_started = 1;
	return 0;
}

void serve_trust_stop(struct serve *srv)
{
	pid_t child;

	if (!srv->f2_started)
		return;
	pthread_mutex_lock(&srv->lock);
	srv->f2_quit = 1;
	child = srv->f2_child;
	pthread_mutex_unlock(&srv->lock);
	if (child > 0)
		kill(-child, SIGKILL);
	pthread_join(srv->f2_thread, NULL);
	srv->f2_started = 0;
}

int serve_trust_demotion_receipt(struct serve *srv, const struct q4kh_candidate *c,
                                 const struct q4kh_device_record *dev,
                                 const struct q4kh_f2_result *res,
                                 const char *message, struct q4kh_error *err)
{
	struct q4kh_receipt r;
	char id[512];
	int rc;

	memset(&r, 0, sizeof(r));
	if (!srv->judge.g)
		return q4kh_fail(err, "F2 is off: no receipt");
	if (q4kh_guard_key(srv->judge.g, c, dev, &r.key, id, sizeof(id), err))
		return -1;
	/* The served request's positions are not the probe's: a receipt
	 * keeps none of them (its points must be its key's probe plan,
	 * receipt_check.h), only the rejection and MESSAGE, which names the
	 * request, the position and the cosine. */
	r.verdict = res->verdict;
	r.min_cosine = NAN;
	r.worst_position = -1;
	r.worst_decode_step = -1;
	r.seconds = res->seconds;
	snprintf(r.message, sizeof(r.message), "%s", message);
	rc = q4kh_receipt_save(srv->judge.g->receipt_dir, id, &srv->judge.g->mac, &r, err);
	return rc ? -1 : 0;
}
