/*
 * Shadow parity (--f2-shadow RATE): a fraction RATE of the requests a
 * guarded path served are run again in the background, teacher-forced, on
 * the reference cpu backend and on the same candidate: the request's
 * prompt in steps of the session's batch, as served, then each answer
 * token that was fed back, one step each. Every position of prompt and
 * answer is judged by F2's rules (f2.h; position 0 is not judged). A path
 * that fails is demoted on its device: the next trusted path serves new
 * requests, a log line says why, and a receipt records the rejection with
 * the request and position, so later runs and starts skip it until a key
 * changes. F2 judges one probe; a defect that shows only on some prompts
 * can only be caught on the prompts that show it.
 *
 * Samples wait in a short queue; when it is full a sample is dropped and
 * counted, never waited for.
 */
#include "serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candidates.h"

#define SHADOW_QUEUE 16

struct sample {
	char id[48];
	char path[160];
	struct q4kh_candidate cand; /* names point into the registry */
	int plan_index;
	int32_t *tokens;            /* the prompt, then the answer tokens fed */
	size_t n_prompt, n_answer;
};

struct serve_shadow {
	pthread_t thread;
	int started, quit;
	pthread_cond_t cv;
	struct sample *q[SHADOW_QUEUE];
	size_t head, len;
	double credit;              /* sampling: a request is taken per 1.0 */
	int busy;
	struct serve_verdict last;
	/* the shadow thread's own sessions */
	struct q4kh_serving ref, cand;
	char cand_name[160];
	uint32_t cand_device;
};

static void sample_free(struct sample *s)
{
	if (s)
		free(s->tokens);
	free(s);
}

void serve_shadow_offer(struct serve *srv, const struct serve_job *j)
{
	struct serve_shadow *sh = srv->shadow;
	struct sample *s;

	if (!sh || !j->path->guarded || j->path->demoted)
		return;
	sh->credit += srv->o.shadow_rate;
	if (sh->credit < 1.0)
		return;
	sh->credit -= 1.0;
	if (sh->len == SHADOW_QUEUE) {
		srv->m.shadow_dropped++;
		return;
	}
	s = calloc(1, sizeof(*s));
	if (s)
		s->tokens = malloc(sizeof(int32_t) * (j->n_ids + j->n_fed + 1));
	if (!s || !s->tokens) {
		sample_free(s);
		srv->m.shadow_dropped++;
		return;
	}
	snprintf(s->id, sizeof(s->id), "%s", j->id);
	snprintf(s->path, sizeof(s->path), "%s", j->path->name);
	s->cand = j->path->cand;
	s->plan_index = j->path->plan_index;
	memcpy(s->tokens, j->ids, sizeof(int32_t) * j->n_ids);
	memcpy(s->tokens + j->n_ids, j->gen, sizeof(int32_t) * j->n_fed);
	s->n_prompt = j->n_ids;
	s->n_answer = j->n_fed;
	sh->q[(sh->head + sh->len++) % SHADOW_QUEUE] = s;
	pthread_cond_signal(&sh->cv);
}

static int quitting(struct serve_shadow *sh)
{
	return __atomic_load_n(&sh->quit, __ATOMIC_RELAXED);
}

/* F2.4: a side that could not run decides the verdict. */
static void not_measured(struct q4kh_f2_result *out, const char *side,
                         const struct q4kh_error *e)
{
	out->verdict = Q4KH_F2_NOT_MEASURED;
	snprintf(out->message, sizeof(out->message),
	         "not measured: the %s failed (F2.4): %.400s", side, e->msg);
}

/*
 * TOKENS[0..n_prompt + n_answer) on REF and CAND from empty caches, the
 * prompt in steps of the batch and then one token per step, each
 * position's logits judged by RULES into OUT (as q4kh_f2_run fills it).
 * -1 only on out of memory.
 */
static int compare(struct serve_shadow *sh, struct q4kh_session *ref,
                   struct q4kh_session *cand, const struct sample *s,
                   const struct q4kh_f2_rules *rules, struct q4kh_f2_result *out,
                   struct q4kh_error *err)
{
	const int64_t v = ref->m->hp.n_vocab, total = (int64_t)(s->n_prompt + s->n_answer);
	const int64_t batch = ref->p.n_batch < cand->p.n_batch ? ref->p.n_batch : cand->p.n_batch;
	struct q4kh_error e = { { 0 } };
	double t0 = serve_now();
	float *rl, *cl;
	int64_t pos = 0;

	memset(out, 0, sizeof(*out));
	rl = malloc(sizeof(float) * (size_t)(batch * v));
	cl = malloc(sizeof(float) * (size_t)(batch * v));
	out->points = calloc((size_t)total, sizeof(*out->points));
	if (!rl || !cl || !out->points) {
		free(rl);
		free(cl);
		q4kh_f2_result_free(out);
		return q4kh_fail(err, "shadow parity: out of memory");
	}
	q4kh_session_reset(ref);
	q4kh_session_reset(cand);
	while (pos < total && !quitting(sh)) {
		int64_t t = pos < (int64_t)s->n_prompt ? (int64_t)s->n_prompt - pos : 1;

		t = t < batch ? t : batch;
		if (q4kh_session_eval(ref, s->tokens + pos, t, rl, 1, &e)) {
			not_measured(out, "reference", &e);
			break;
		}
		if (q4kh_session_eval(cand, s->tokens + pos, t, cl, 1, &e)) {
			not_measured(out, "candidate", &e);
			break;
		}
		for (int64_t r = 0; r < t; r++) {
			struct q4kh_f2_point *pt = &out->points[pos + r];

			pt->position = pos + r;
			pt->decode_step = pos + r < (int64_t)s->n_prompt
			                          ? -1
			                          : (int32_t)(pos + r - (int64_t)s->n_prompt);
			pt->judged = pos + r >= 1;
			q4kh_f2_judge(rl + r * v, cl + r * v, v, rules, pt);
		}
		pos += t;
	}
	if (pos == total) {
		out->n_points = total;
		q4kh_f2_conclude(out, rules);
	} else if (!out->message[0]) {
		out->verdict = Q4KH_F2_NOT_MEASURED;
		snprintf(out->message, sizeof(out->message), "not measured: serve is stopping");
	}
	out->seconds = serve_now() - t0;
	q4kh_session_reset(ref);
	q4kh_session_reset(cand);
	free(rl);
	free(cl);
	return 0;
}

/* The shadow's sessions for S's candidate (opened once, kept). */
static int open_sides(struct serve *srv, struct serve_shadow *sh, const struct sample *s,
                      struct q4kh_error *err)
{
	if (!sh->ref.s &&
	    q4kh_serving_open(srv->registry, srv->model_path,
	                      &(struct q4kh_candidate){ .backend = "cpu" }, srv->n_ctx, &sh->ref,
	                      err))
		return -1;
	if (sh->cand.s && (strcmp(sh->cand_name, s->path) || sh->cand_device != s->cand.device))
		q4kh_serving_close(&sh->cand);
	if (!sh->cand.s) {
		if (q4kh_serving_open(srv->registry, srv->model_path, &s->cand, srv->n_ctx,
		                      &sh->cand, err))
			return -1;
		snprintf(sh->cand_name, sizeof(sh->cand_name), "%s", s->path);
		sh->cand_device = s->cand.device;
	}
	return 0;
}

/* S's path failed: receipt, fall-back, log line. */
static void demote(struct serve *srv, struct serve_shadow *sh, const struct sample *s,
                   const struct q4kh_f2_result *res)
{
	struct q4kh_error e = { { 0 } };
	struct serve_path *fb;
	char msg[512], reason[700];

	snprintf(msg, sizeof(msg), "shadow parity, served request %s (%zu prompt + %zu answer tokens): %.380s",
	         s->id, s->n_prompt, s->n_answer, res->message);
	serve_log("shadow parity: %s: %s: %s", s->path, q4kh_f2_verdict_name(res->verdict), msg);
	if (serve_trust_demotion_receipt(srv, &s->cand, &sh->cand.be.record, res, msg, &e))
		serve_log("shadow parity: the receipt of %s could not be written: %s", s->path, e.msg);
	fb = serve_trust_fallback(srv, s->plan_index, &e);
	snprintf(reason, sizeof(reason), "demoted by %.600s", msg);
	pthread_mutex_lock(&srv->lock);
	if (srv->cur && !strcmp(srv->cur->name, s->path) && srv->cur->cand.device == s->cand.device) {
		if (!fb) {
			/* Permanent: every request gets this, without a retry. */
			snprintf(srv->unavailable, sizeof(srv->unavailable),
			         "nothing serves until q4khost serve is restarted: shadow parity "
			         "demoted %.160s (request %s) and %.200s; restart serve: the next "
			         "start skips it (its receipt now holds the rejection) and serves "
			         "the next trusted candidate: the reference cpu backend, unless "
			         "--backend, --kernel or Q4KHOST_Q4K_KERNEL leave it out (then drop "
			         "them, or name a candidate that passes F2)",
			         s->path, s->id, e.msg);
			serve_log("shadow parity: %s", srv->unavailable);
		}
		serve_engine_switch(srv, fb, 1, reason);
		fb = NULL;
	}
	pthread_mutex_unlock(&srv->lock);
	serve_path_close(fb);
}

static void check(struct serve *srv, struct serve_shadow *sh, const struct sample *s)
{
	struct q4kh_f2_rules rules;
	struct q4kh_f2_result res = { 0 };
	struct q4kh_error e = { { 0 } };
	const char *verdict;

	if (q4kh_guard_rules_where(srv->config, s->cand.variant ? s->cand.variant : s->cand.backend,
	                           q4kh_guard_arith(srv->registry, &s->cand), &rules, NULL, &e) ||
	    open_sides(srv, sh, s, &e) || compare(sh, sh->ref.s, sh->cand.s, s, &rules, &res, &e)) {
		res.verdict = Q4KH_F2_NOT_MEASURED;
		snprintf(res.message, sizeof(res.message), "not measured: %.480s", e.msg);
	}
	verdict = q4kh_f2_verdict_name(res.verdict);
	pthread_mutex_lock(&srv->lock);
	snprintf(sh->last.path, sizeof(sh->last.path), "%s", s->path);
	snprintf(sh->last.verdict, sizeof(sh->last.verdict), "%s", verdict);
	snprintf(sh->last.source, sizeof(sh->last.source), "shadow (%s)", s->id);
	snprintf(sh->last.message, sizeof(sh->last.message), "%s", res.message);
	if (res.verdict == Q4KH_F2_PASS)
		srv->m.shadow_pass++;
	else if (res.verdict == Q4KH_F2_NOT_MEASURED)
		srv->m.shadow_other++;
	else
		srv->m.shadow_reject++;
	if (res.verdict != Q4KH_F2_PASS)
		serve_trust_note(srv, s->path, verdict, sh->last.source, res.message);
	pthread_mutex_unlock(&srv->lock);
	if (res.verdict == Q4KH_F2_REJECT || res.verdict == Q4KH_F2_BROKEN)
		demote(srv, sh, s, &res);
	else if (res.verdict == Q4KH_F2_NOT_MEASURED && !quitting(sh))
		serve_log("shadow parity on %s (%s): %s", s->id, s->path, res.message);
	q4kh_f2_result_free(&res);
}

static void *shadow_main(void *arg)
{
	struct serve *srv = arg;
	struct serve_shadow *sh = srv->shadow;

	pthread_mutex_lock(&srv->lock);
	while (!sh->quit) {
		struct sample *s;

		if (!sh->len) {
			pthread_cond_wait(&sh->cv, &srv->lock);
			continue;
		}
		s = sh->q[sh->head];
		sh->head = (sh->head + 1) % SHADOW_QUEUE;
		sh->len--;
		sh->busy = 1;
		pthread_mutex_unlock(&srv->lock);
		check(srv, sh, s);
		sample_free(s);
		pthread_mutex_lock(&srv->lock);
		sh->busy = 0;
	}
	pthread_mutex_unlock(&srv->lock);
	return NULL;
}

int serve_shadow_start(struct serve *srv, struct q4kh_error *err)
{
	struct serve_shadow *sh;

	if (srv->o.shadow_rate <= 0)
		return 0;
	sh = calloc(1, sizeof(*sh));
	if (!sh)
		return q4kh_fail(err, "out of memory");
	pthread_cond_init(&sh->cv, NULL);
	srv->shadow = sh;
	if (pthread_create(&sh->thread, NULL, shadow_main, srv))
		return q4kh_fail(err, "cannot start the shadow parity thread");
	sh->started = 1;
	return 0;
}

void serve_shadow_stop(struct serve *srv)
{
	struct serve_shadow *sh = srv->shadow;

	if (!sh)
		return;
	pthread_mutex_lock(&srv->lock);
	__atomic_store_n(&sh->quit, 1, __ATOMIC_RELAXED);
	pthread_cond_signal(&sh->cv);
	pthread_mutex_unlock(&srv->lock);
	if (sh->started)
		pthread_join(sh->thread, NULL);
	while (sh->len) {
		sample_free(sh->q[sh->head]);
		sh->head = (sh->head + 1) % SHADOW_QUEUE;
		sh->len--;
	}
	q4kh_serving_close(&sh->cand);
	q4kh_serving_close(&sh->ref);
	pthread_cond_destroy(&sh->cv);
	free(sh);
	srv->shadow = NULL;
}

json_t *serve_shadow_json(struct serve *srv)
{
	struct serve_shadow *sh = srv->shadow;
	json_t *o = json_pack("{s:f, s:I, s:I, s:I, s:I}", "rate", srv->o.shadow_rate,
	                      "passed", (json_int_t)srv->m.shadow_pass, "rejected",
	                      (json_int_t)srv->m.shadow_reject, "not_measured",
	                      (json_int_t)srv->m.shadow_other, "dropped",
	                      (json_int_t)srv->m.shadow_dropped);

	if (!sh || !o)
		return o;
	json_object_set_new(o, "queue", json_integer((json_int_t)sh->len));
	json_object_set_new(o, "running", json_boolean(sh->busy));
	if (sh->last.path[0])
		json_object_set_new(o, "last",
		                    json_pack("{s:s, s:s, s:s, s:s}", "path", sh->last.path,
		                              "verdict", sh->last.verdict, "source",
		                              sh->last.source, "message", sh->last.message));
	return o;
}
