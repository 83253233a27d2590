/*
 * The engine: a fixed set of slots, each with its own session (KV cache)
 * on the current path, filled from one FIFO queue, and one thread that
 * runs every forward step, with continuous batching: each round is one
 * batched step per path (q4kh_session_eval_batch) carrying every decoding
 * slot's next token first, then chunks of the prompts still being read,
 * under a budget of --step-tokens (docs/serve.md, section 5): each weight
 * is read once for all of its columns, through the kernel variants'
 * multi-column GEMV, while each slot's cache writes and attention run on
 * its own session. Requests join the batch when a slot takes them and
 * leave it at their last token, between steps; they are admitted in the
 * order they came, and no request sees another's tokens (each slot's
 * session is emptied when it takes a job, but for the whole blocks of the
 * job's own prompt that some slot's cache holds, which it reuses: prefix
 * reuse, kv_prefix.h; and a batched step keeps every sequence's cache
 * apart). Each job picks its token with its own
 * sampler, as alone, and ends as a run's answer ends: the bookkeeping of
 * one sequence is generate.h's, the steps this file's. Models with recurrent layers (qwen35) run one slot
 * per step. On pages (--kv-pages; auto, the default, where the path can
 * page) the slots' sessions keep their keys and values in one pool per
 * path, and a request takes a slot only when the pool can hold the pages
 * it may need beside those promised to the running ones (pages_fit), so
 * that no running request runs out of pages.
 */
#include "serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_text.h"

struct serve_job *serve_job_new(void)
{
	struct serve_job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	pthread_cond_init(&j->cv, NULL);
	j->refs = 1;
	j->slot = -1;
	return j;
}

void serve_job_release(struct serve_job *j)
{
	if (!j || --j->refs > 0)
		return;
	for (size_t i = 0; i < j->n_stop; i++)
		free(j->stop[i]);
	q4kh_sampler_free(j->sampler);
	pthread_cond_destroy(&j->cv);
	free(j->ids);
	free(j->text);
	free(j->gen);
	free(j);
}

/* End J with an error and no answer (lock held). */
static void fail_job(struct serve_job *j, int status, const char *msg)
{
	snprintf(j->error, sizeof(j->error), "%s", msg);
	j->http_status = status;
	j->state = SERVE_DONE;
	j->ready = j->len;
	pthread_cond_broadcast(&j->cv);
}

/* J is refused because nothing serves (lock held): counted, marked for
 * good (its 503 advertises no retry); the message, why and what to do. */
static const char *no_path(struct serve *srv, struct serve_job *j)
{
	j->for_good = 1;
	serve_status_reject(srv, SERVE_REJECT_NO_PATH);
	return srv->unavailable[0] ? srv->unavailable
	                           : "no validated path can serve this model (see /health)";
}

int serve_engine_submit(struct serve *srv, struct serve_job *job)
{
	int status = 0;

	pthread_mutex_lock(&srv->lock);
	if (srv->draining) {
		snprintf(job->error, sizeof(job->error), "the server is shutting down");
		serve_status_reject(srv, SERVE_REJECT_DRAINING);
		status = 503;
	} else if (!srv->cur) {
		snprintf(job->error, sizeof(job->error), "%s", no_path(srv, job));
		status = 503;
	} else if (srv->q_len >= (size_t)srv->o.max_queue) {
		snprintf(job->error, sizeof(job->error),
		         "the queue is full (%zu requests waiting); try again later", srv->q_len);
		serve_status_reject(srv, SERVE_REJECT_QUEUE_FULL);
		status = 503;
	} else {
		job->seq = ++srv->next_seq;
		snprintf(job->id, sizeof(job->id), "%s-%llu",
		         job->kind == SERVE_CHAT ? "chatcmpl" : "cmpl",
		         (unsigned long long)job->seq);
		job->state = SERVE_QUEUED;
		job->t_submit = serve_now();
		job->created = (long)time(NULL);
		job->refs++; /* the engine's */
		srv->queue[(srv->q_head + srv->q_len++) % (size_t)srv->o.max_queue] = job;
		pthread_cond_signal(&srv->work);
	}
	pthread_mutex_unlock(&srv->lock);
	return status;
}

static struct serve_job *queue_pop(struct serve *srv)
{
	struct serve_job *j;

	if (!srv->q_len)
		return NULL;
	j = srv->queue[srv->q_head];
	srv->q_head = (srv->q_head + 1) % (size_t)srv->o.max_queue;
	srv->q_len--;
	return j;
}

/* Put J back at the head of the queue (a re-run after a demotion). */
static void queue_push_front(struct serve *srv, struct serve_job *j)
{
	srv->q_head = (srv->q_head + (size_t)srv->o.max_queue - 1) % (size_t)srv->o.max_queue;
	srv->queue[srv->q_head] = j;
	srv->q_len++;
}

/*
 * The free slot for job J on the current path P, its cache holding the
 * longest start of J's prompt found (lock held): with prefix reuse on,
 * the run of whole blocks of the prompt that some slot's cache holds (at
 * most all but the prompt's last token, whose logits the answer needs),
 * in the free slot that holds most of it already (the least recently
 * used of those; without a match, the least recently used: its blocks
 * are evicted), the rest taken from the slot that has it (copied, or on
 * pages shared); J's prompt is fed from there on, and *OWN gets the
 * tokens the slot held already. Else the first free slot, emptied.
 */
static int place(struct serve *srv, struct serve_path *p, struct serve_job *j, int64_t *own_out)
{
	const int64_t limit = ((int64_t)j->n_ids - 1) / Q4KH_PREFIX_BLOCK * Q4KH_PREFIX_BLOCK;
	int64_t *mine = srv->prefix_mine, len, own = 0;
	struct q4kh_error err = { { 0 } };
	int src, i = 0;

	j->fed = j->reused = 0;
	*own_out = 0;
	if (!p->prefix) {
		while (srv->slots[i])
			i++;
		q4kh_session_reset(p->sessions[i]);
		return i;
	}
	len = q4kh_prefix_find(p->prefix, j->ids, (int64_t)j->n_ids, limit, &src, mine);
	for (int k = 0; k < srv->n_slots; k++) {
		if (len < 0)
			mine[k] = 0;
		if (!srv->slots[k] && mine[k] > own)
			own = mine[k];
	}
	for (int k = 0; k < srv->n_slots; k++)
		srv->prefix_pick[k] = !srv->slots[k] && mine[k] == own;
	i = q4kh_prefix_lru(p->prefix, srv->prefix_pick);
	if (len > 0 && q4kh_session_take_prefix(p->sessions[i], p->sessions[src], own, len, &err)) {
		serve_log("%s: no prefix reuse: %s", j->id, err.msg);
		len = 0;
	}
	if (len <= 0) {
		len = 0;
		q4kh_session_reset(p->sessions[i]);
	}
	q4kh_prefix_keep(p->prefix, i, own < len ? own : len);
	if (len > own)
		q4kh_prefix_append(p->prefix, i, j->ids + own, len - own);
	j->fed = j->reused = (size_t)len;
	*own_out = own < len ? own : len;
	return i;
}

/* Job J, placed on path P with OWN of its reused tokens in its slot's
 * cache already, runs: its prefix lookup counted (lock held). */
static void count_prefix(struct serve *srv, const struct serve_path *p,
                         const struct serve_job *j, int64_t own)
{
	const uint64_t from_other = j->reused - (uint64_t)own;

	if (!p->prefix)
		return;
	srv->m.prefix_lookups++;
	srv->m.prefix_hits += j->reused > 0;
	srv->m.prefix_blocks += j->reused / Q4KH_PREFIX_BLOCK;
	srv->m.prefix_tokens += j->reused;
	if (p->paged)
		srv->m.prefix_shared += from_other;
	else
		srv->m.prefix_copied += from_other;
}

int64_t serve_job_pages(const struct serve *srv, const struct serve_job *j)
{
	const struct q4kh_kv_pool pages = { .page_size = Q4KH_PREFIX_BLOCK };
	const int64_t tokens = (int64_t)j->n_ids + j->max_tokens;

	return q4kh_kv_pool_pages_for(&pages, tokens < srv->n_ctx ? tokens : srv->n_ctx);
}

/*
 * Pages of path P's pool promised to the jobs running on it: each one's
 * serve_job_pages less the pages its table holds already (lock held).
 * Prefixes are whole blocks, a block a page: a page shared by prefix is
 * full and never written, so no job needs a page to copy one into.
 */
static int64_t pages_promised(const struct serve *srv, const struct serve_path *p)
{
	int64_t n = 0;

	for (int i = 0; i < srv->n_slots; i++)
		if (srv->slots[i] && srv->slots[i]->path == p)
			n += serve_job_pages(srv, srv->slots[i]) - p->sessions[i]->table.n;
	return n;
}

/*
 * Can job J, placed in slot I of path P (its table holding J's prefix),
 * run on P's pages? Its serve_job_pages less those its table holds must
 * be free beside those promised to the running jobs; while they are not,
 * the least recently used idle slot's cache (kept for prefix reuse) is
 * given back. 0 when they still are not: J waits (lock held).
 */
static int pages_fit(struct serve *srv, struct serve_path *p, const struct serve_job *j, int i)
{
	const int64_t need = serve_job_pages(srv, j) - p->sessions[i]->table.n;
	int *idle = srv->prefix_pick;

	while (p->paged->pool.n_free - pages_promised(srv, p) < need) {
		int k;

		for (k = 0; k < srv->n_slots; k++)
			idle[k] = k != i && !srv->slots[k] && p->sessions[k]->table.n > 0;
		k = p->prefix ? q4kh_prefix_lru(p->prefix, idle) : -1;
		if (k < 0)
			return 0;
		q4kh_session_reset(p->sessions[k]);
		q4kh_prefix_keep(p->prefix, k, 0);
	}
	return 1;
}

/* The current path's pages into srv->pages, for /health and /metrics
 * (lock held). */
static void note_pages(struct serve *srv)
{
	const struct q4kh_kv_pool *pool = srv->cur && srv->cur->paged ? &srv->cur->paged->pool
	                                                               : NULL;

	srv->pages = pool ? (struct serve_pages){ pool->n_pages, pool->n_free,
		                                  q4kh_kv_pool_shared(pool) }
	                  : (struct serve_pages){ 0 };
}

/* Give a free slot to each waiting job, in order (lock held): with
 * --kv-pages, while the pool can hold the head's pages (pages_fit); one
 * that must wait for pages keeps its place and every job behind it waits
 * too, until a job ends. */
static void admit(struct serve *srv)
{
	int busy = 0;

	for (int i = 0; i < srv->n_slots; i++)
		busy += srv->slots[i] != NULL;
	while (busy < srv->n_slots && srv->q_len && !srv->pages_wait) {
		struct serve_job *j = queue_pop(srv);
		int64_t own;
		int i;

		if (!srv->cur) {
			fail_job(j, 503, no_path(srv, j));
			serve_job_release(j);
			continue;
		}
		i = place(srv, srv->cur, j, &own);
		if (srv->cur->paged && !pages_fit(srv, srv->cur, j, i)) {
			queue_push_front(srv, j);
			srv->pages_wait = 1;
			srv->m.page_waits++;
			break;
		}
		q4kh_sampler_free(j->sampler);
		j->sampler = q4kh_sampler_new(&j->sp, srv->n_vocab);
		if (!j->sampler) {
			fail_job(j, 500, "out of memory");
			serve_job_release(j);
			continue;
		}
		count_prefix(srv, srv->cur, j, own);
		j->g = (struct q4kh_gen){
			.sampler = q4kh_sampler_greedy(&j->sp) ? NULL : j->sampler,
			.logits = srv->logits[i], .n_vocab = srv->n_vocab,
			.tok = j->ignore_eos ? NULL : srv->tok,
			.max_tokens = j->max_tokens,
		};
		j->slot = i;
		j->path = srv->cur;
		j->path->running++;
		j->n_fed = 0;
		serve_path_describe(j->path, j->served_by, sizeof(j->served_by));
		snprintf(j->path_name, sizeof(j->path_name), "%s", j->path->name);
		serve_path_f2_header(j->path, j->f2, sizeof(j->f2));
		j->state = SERVE_RUNNING;
		srv->slots[i] = j;
		busy++;
		pthread_cond_broadcast(&j->cv);
	}
	note_pages(srv);
}

/* Free slot I of its job, which ended (lock held). */
static void end_job(struct serve *srv, int i, const char *finish)
{
	struct serve_job *j = srv->slots[i];
	double now = serve_now();

	j->finish = finish;
	j->state = SERVE_DONE;
	j->ready = j->len;
	srv->m.prompt_tokens += j->n_ids;
	srv->m.completion_tokens += (uint64_t)j->n_gen;
	if (j->t_decode0 > 0)
		srv->m.decode_seconds += now - j->t_decode0;
	if (!j->error[0] && !j->cancel)
		serve_shadow_offer(srv, j);
	if (j->error[0])
		serve_log("%s: %s after %lld tokens: %s", j->id, j->served_by,
		          (long long)j->n_gen, j->error);
	else
		serve_log("%s: %zu prompt (%zu of them reused) + %lld answer tokens on %s, first token after %.3f s, %.3f s in all (%s)",
		          j->id, j->n_ids, j->reused, (long long)j->n_gen, j->served_by, j->t_first,
		          now - j->t_submit, j->cancel ? "cancelled" : finish);
	q4kh_sampler_free(j->sampler);
	j->sampler = NULL;
	/* its pages: kept for prefix reuse, else given back now */
	if (j->path->paged && !j->path->prefix)
		q4kh_session_reset(j->path->sessions[i]);
	srv->pages_wait = 0;
	j->path->running--;
	srv->slots[i] = NULL;
	j->slot = -1;
	pthread_cond_broadcast(&j->cv);
	serve_job_release(j);
}

static int push_gen(struct serve_job *j, int32_t tok)
{
	if ((size_t)j->n_gen + 1 > j->n_gen_cap) {
		size_t cap = j->n_gen_cap ? j->n_gen_cap * 2 : 64;
		int32_t *g = realloc(j->gen, cap * sizeof(*g));
		if (!g)
			return -1;
		j->gen = g;
		j->n_gen_cap = cap;
	}
	j->gen[j->n_gen] = tok;
	return 0;
}

static int append(struct serve_job *j, const char *s, size_t n)
{
	if (j->len + n + 1 > j->cap) {
		size_t cap = (j->cap + n + 1) * 2;
		char *t = realloc(j->text, cap);
		if (!t)
			return -1;
		j->text = t;
		j->cap = cap;
	}
	memcpy(j->text + j->len, s, n);
	j->len += n;
	j->text[j->len] = 0;
	return 0;
}

/*
 * Slot I's job chose TOK (lock held): as q4khost run does, an
 * end-of-generation token ends the answer, any other is its text; the
 * answer ends at a stop string, at max_tokens or when the context is full.
 */
static void take_token(struct serve *srv, int i, int32_t tok)
{
	struct serve_job *j = srv->slots[i];
	const struct q4kh_session *s = j->path->sessions[i];
	char piece[256];
	size_t from = j->len, n, hold;
	long stop;
	enum q4kh_gen_end end = q4kh_gen_take(&j->g, s, tok);

	if (j->n_gen == 0) {
		j->t_first = serve_now() - j->t_submit;
		j->t_decode0 = serve_now();
		serve_status_ttft(srv, j->t_first);
	}
	if (end == Q4KH_GEN_EOG) {
		end_job(srv, i, "stop");
		return;
	}
	n = q4kh_token_to_piece(srv->tok, tok, 0, piece, sizeof(piece));
	if (push_gen(j, tok) || append(j, piece, n < sizeof(piece) ? n : sizeof(piece))) {
		snprintf(j->error, sizeof(j->error), "out of memory");
		j->http_status = 500;
		end_job(srv, i, "error");
		return;
	}
	j->n_gen++;
	stop = serve_stop_find(j->text, j->len, from, j->stop, j->n_stop);
	if (stop >= 0) {
		j->len = (size_t)stop;
		j->text[j->len] = 0;
		end_job(srv, i, "stop");
		return;
	}
	if (end != Q4KH_GEN_ON) { /* max_tokens, or the context is full */
		end_job(srv, i, "length");
		return;
	}
	j->last = tok;
	hold = serve_utf8_incomplete(j->text, j->len);
	n = serve_stop_partial(j->text, j->len, j->stop, j->n_stop);
	hold = n > hold ? n : hold;
	if (j->len - hold > j->ready)
		j->ready = j->len - hold;
	pthread_cond_broadcast(&j->cv);
}

/*
 * Job J's next token from its step's result (q4kh_gen_choose: at
 * temperature 0 the session's greedy pick, made on the device when the
 * backend has top2, else its sampler's choice from the slot's logits).
 * -1 with err when there is none.
 */
static int choose(struct serve_job *j, int32_t *tok, struct q4kh_error *err)
{
	if ((*tok = q4kh_gen_choose(&j->g)) < 0)
		return q4kh_fail(err, "no logit is finite");
	return 0;
}

/*
 * One step of job J in its slot, without the lock: the next piece of its
 * prompt, or the token it chose last. *tok gets the token chosen, or -1
 * while the prompt is not all in.
 */
static int step(struct serve_job *j, int32_t *tok, struct q4kh_error *err)
{
	struct q4kh_session *s = j->path->sessions[j->slot];

	*tok = -1;
	if (j->fed < j->n_ids) {
		size_t t = j->n_ids - j->fed;
		int last;

		t = t < s->p.n_batch ? t : s->p.n_batch;
		last = j->fed + t == j->n_ids;
		if (q4kh_gen_eval(&j->g, s, j->ids + j->fed, (int64_t)t, last, err))
			return -1;
		j->fed += t;
		if (!last)
			return 0;
	} else if (q4kh_gen_eval(&j->g, s, &j->last, 1, 1, err)) {
		return -1;
	} else {
		j->n_fed++;
	}
	return choose(j, tok, err);
}

/* A step of session S (one slot's, or the first of a batched step's) ran
 * and did not fail (RC 0): count the path it took (lock held). */
static void count_step(struct serve *srv, const struct q4kh_session *s, int rc)
{
	if (!rc)
		srv->m.steps_by_path[s->stats.last]++;
}

/* Does slot I's job run in the round's batched steps: its path's model
 * can batch? (lock held) */
static int batched(const struct serve *srv, int i)
{
	return q4kh_session_batchable(srv->slots[i]->path->sessions[i]);
}

/*
 * Slot I's step failed with ERR, or its token is TOK (lock held): end the
 * job with the error, or take the token.
 */
static void stepped(struct serve *srv, int i, int rc, int32_t tok,
                    const struct q4kh_error *err)
{
	struct serve_job *j = srv->slots[i];

	if (rc) {
		snprintf(j->error, sizeof(j->error), "generation failed: %.200s", err->msg);
		j->http_status = 500;
		end_job(srv, i, "error");
	} else if (tok >= 0) {
		take_token(srv, i, tok);
	}
}

/*
 * One step for the slots SLOT[0..n) (in slot order, so that a set that
 * stays busy decoding keeps its cached graph; over pages, any set of as
 * many decoding slots with the same first slot does), all on one path: each
 * decoding slot's next token and each prefilling slot's next srv->take
 * tokens of its prompt, in one batched step of their sessions (lock held;
 * dropped while it runs).
 */
static void step_batch(struct serve *srv, const int *slot, int n)
{
	struct q4kh_batch_seq *b = srv->batch;
	struct q4kh_error err = { { 0 } };
	int rc, prefill = 0;

	for (int k = 0; k < n; k++) {
		struct serve_job *j = srv->slots[slot[k]];

		b[k] = (struct q4kh_batch_seq){
			.s = j->path->sessions[slot[k]],
			.id = j->last,
			.logits = j->g.sampler ? j->g.logits : NULL,
		};
		if (j->fed < j->n_ids) {
			b[k].ids = j->ids + j->fed;
			b[k].n_ids = (int32_t)srv->take[slot[k]];
			b[k].skip = j->fed + srv->take[slot[k]] < j->n_ids;
			prefill = 1;
		}
	}
	pthread_mutex_unlock(&srv->lock);
	rc = q4kh_session_eval_batch(b, n, &err);
	pthread_mutex_lock(&srv->lock);
	count_step(srv, b[0].s, rc);
	if (!rc && n > 1) {
		srv->m.batched_steps++;
		srv->m.mixed_steps += prefill;
	}
	for (int k = 0; k < n; k++) {
		struct serve_job *j = srv->slots[slot[k]];
		struct q4kh_error jerr = err;
		int32_t tok = b[k].token;
		int jrc = rc;

		if (!rc && j->path->prefix) /* what its cache holds now */
			q4kh_prefix_append(j->path->prefix, slot[k], b[k].n_ids ? b[k].ids : &b[k].id,
			                   b[k].n_ids ? b[k].n_ids : 1);

		if (!jrc && b[k].n_ids) {
			j->fed += (size_t)b[k].n_ids;
			srv->m.batched_prompt_tokens += n > 1 ? (uint64_t)b[k].n_ids : 0;
			if (b[k].skip)
				continue; /* more of its prompt next round */
		} else if (!jrc) {
			j->n_fed++;
		}
		if (!jrc) {
			srv->m.batched_tokens += n > 1;
			j->g.pick = b[k].token;
			jrc = choose(j, &tok, &jerr);
		}
		stepped(srv, slot[k], jrc, tok, &jerr);
	}
}

/*
 * The slots of path P that DUE marks into one step of at most BUDGET
 * tokens (srv->take: each one's share), from slot RR on: every decoding
 * slot's next token first, then prompts' chunks in the tokens left, so
 * that a long prompt neither stalls the answers under way nor waits for
 * them to end. Those left out wait for the next round. The slots taken,
 * in slot order, into SLOT; their count (lock held).
 */
static int plan_step(struct serve *srv, const struct serve_path *p, const int *due, int rr,
                     size_t budget, int *slot)
{
	int n = 0;

	for (int pass = 0; pass < 2; pass++)
		for (int k = 0; k < srv->n_slots && budget; k++) {
			const int i = (rr + k) % srv->n_slots;
			const struct serve_job *j = srv->slots[i];
			size_t left;

			if (!due[i] || j->path != p || (j->fed < j->n_ids) != pass)
				continue;
			left = pass ? j->n_ids - j->fed : 1;
			srv->take[i] = left < budget ? left : budget;
			budget -= srv->take[i];
		}
	for (int i = 0; i < srv->n_slots; i++)
		if (due[i] && srv->slots[i]->path == p && srv->take[i])
			slot[n++] = i;
	return n;
}

/*
 * The round's batched steps: the slots DUE marks (and unmarks), one step
 * per path of at most --step-tokens tokens and the session's batch
 * (lock held).
 */
static void batch_round(struct serve *srv, int *due, int rr)
{
	for (;;) {
		const struct serve_path *p = NULL;
		size_t budget = 0;
		int n;

		for (int i = 0; i < srv->n_slots && !p; i++)
			if (due[i]) {
				p = srv->slots[i]->path;
				budget = p->sessions[i]->p.n_batch;
			}
		if (!p)
			return;
		if (srv->o.step_tokens && (size_t)srv->o.step_tokens < budget)
			budget = (size_t)srv->o.step_tokens;
		memset(srv->take, 0, sizeof(*srv->take) * (size_t)srv->n_slots);
		n = plan_step(srv, p, due, rr, budget, srv->batch_slots);
		for (int i = 0; i < srv->n_slots; i++)
			if (due[i] && srv->slots[i]->path == p)
				due[i] = 0;
		if (n)
			step_batch(srv, srv->batch_slots, n);
	}
}

/*
 * J's path was demoted by shadow parity (lock held): an answer not yet
 * sent starts again on the current path; a stream already under way ends
 * with an error, as its first tokens came from the demoted path.
 */
static void demoted(struct serve *srv, int i)
{
	struct serve_job *j = srv->slots[i];

	if (j->stream) {
		snprintf(j->error, sizeof(j->error),
		         "the path serving this request (%s) was demoted by shadow parity; the answer was stopped",
		         j->path->name);
		j->http_status = 500;
		end_job(srv, i, "error");
		return;
	}
	if (srv->q_len == (size_t)srv->o.max_queue) {
		snprintf(j->error, sizeof(j->error),
		         "the path serving this request (%s) was demoted by shadow parity and the queue is full",
		         j->path->name);
		j->http_status = 503;
		serve_status_reject(srv, SERVE_REJECT_QUEUE_FULL);
		end_job(srv, i, "error");
		return;
	}
	j->path->running--;
	srv->slots[i] = NULL;
	j->slot = -1;
	j->len = j->ready = 0;
	j->n_gen = 0;
	j->n_fed = 0;
	j->t_decode0 = 0;
	j->state = SERVE_QUEUED;
	queue_push_front(srv, j);
}

/* Close every retired path no job runs on any more (lock held; dropped
 * while closing). */
static void close_retired(struct serve *srv)
{
	for (int k = 0; k < srv->n_retired; k++) {
		struct serve_path *p = srv->retired[k];

		if (p->running)
			continue;
		srv->retired[k] = srv->retired[--srv->n_retired];
		k--;
		pthread_mutex_unlock(&srv->lock);
		serve_path_close(p);
		pthread_mutex_lock(&srv->lock);
	}
}

static void *engine_main(void *arg)
{
	struct serve *srv = arg;
	int rr = 0;

	pthread_mutex_lock(&srv->lock);
	for (;;) {
		int busy = 0;

		admit(srv);
		for (int i = 0; i < srv->n_slots; i++)
			busy += srv->slots[i] != NULL;
		if (!busy) {
			close_retired(srv);
			if (srv->quit)
				break;
			pthread_cond_wait(&srv->work, &srv->lock);
			continue;
		}
		for (int k = 0; k < srv->n_slots; k++) {
			int i = (rr + k) % srv->n_slots;
			struct serve_job *j = srv->slots[i];
			struct q4kh_error err = { { 0 } };
			int32_t tok;
			int rc;

			if (!j)
				continue;
			if (j->cancel) {
				end_job(srv, i, "cancelled");
				continue;
			}
			if (j->path->demoted) {
				demoted(srv, i);
				continue;
			}
			if ((srv->due[i] = batched(srv, i)))
				continue;
			pthread_mutex_unlock(&srv->lock);
			rc = step(j, &tok, &err);
			pthread_mutex_lock(&srv->lock);
			count_step(srv, j->path->sessions[i], rc);
			stepped(srv, i, rc, tok, &err);
		}
		batch_round(srv, srv->due, rr);
		note_pages(srv);
		rr = (rr + 1) % srv->n_slots;
		close_retired(srv);
	}
	pthread_mutex_unlock(&srv->lock);
	return NULL;
}

int serve_engine_start(struct serve *srv, struct q4kh_error *err)
{
	srv->queue = calloc((size_t)srv->o.max_queue, sizeof(*srv->queue));
	srv->slots = calloc((size_t)srv->n_slots, sizeof(*srv->slots));
	srv->logits = calloc((size_t)srv->n_slots, sizeof(*srv->logits));
	srv->batch = calloc((size_t)srv->n_slots, sizeof(*srv->batch));
	srv->due = calloc((size_t)srv->n_slots, sizeof(*srv->due));
	srv->batch_slots = calloc((size_t)srv->n_slots, sizeof(*srv->batch_slots));
	srv->take = calloc((size_t)srv->n_slots, sizeof(*srv->take));
	srv->prefix_mine = calloc((size_t)srv->n_slots, sizeof(*srv->prefix_mine));
	srv->prefix_pick = calloc((size_t)srv->n_slots, sizeof(*srv->prefix_pick));
	if (!srv->queue || !srv->slots || !srv->logits || !srv->batch || !srv->due ||
	    !srv->batch_slots || !srv->take || !srv->prefix_mine || !srv->prefix_pick)
		return q4kh_fail(err, "out of memory");
	for (int i = 0; i < srv->n_slots; i++) {
		srv->logits[i] = malloc(sizeof(float) * (size_t)srv->n_vocab);
		if (!srv->logits[i])
			return q4kh_fail(err, "out of memory");
	}
	note_pages(srv);
	if (pthread_create(&srv->engine, NULL, engine_main, srv))
		return q4kh_fail(err, "cannot start the engine thread");
	srv->engine_started = 1;
	return 0;
}

void serve_engine_switch(struct serve *srv, struct serve_path *p, int demote,
                         const char *reason)
{
	struct serve_path *old = srv->cur;
	struct serve_switch *sw;

	if (srv->n_switches == SERVE_MAX_SWITCHES) {
		memmove(srv->switches, srv->switches + 1,
		        sizeof(srv->switches) - sizeof(srv->switches[0]));
		srv->n_switches--;
	}
	sw = &srv->switches[srv->n_switches++];
	serve_utc(sw->at, sizeof(sw->at));
	snprintf(sw->from, sizeof(sw->from), "%s", old ? old->name : "none");
	snprintf(sw->to, sizeof(sw->to), "%s", p ? p->name : "none");
	snprintf(sw->reason, sizeof(sw->reason), "%s", reason);
	srv->m.switches++;
	srv->m.fallbacks += demote;
	serve_log("switching from %s to %s: %s", sw->from, sw->to, reason);
	srv->cur = p;
	srv->pages_wait = 0; /* the head's pages are the new path's to find */
	note_pages(srv);
	if (old) {
		old->retired = 1;
		old->demoted |= demote;
		if (srv->n_retired < (int)(sizeof(srv->retired) / sizeof(srv->retired[0])))
			srv->retired[srv->n_retired++] = old;
		else /* cannot happen with fewer switches than slots; keep it open */
			serve_log("too many retired paths: %s stays open", old->name);
	}
	pthread_cond_signal(&srv->work);
}

void serve_engine_drain(struct serve *srv, double seconds)
{
	double end = serve_now() + seconds;

	pthread_mutex_lock(&srv->lock);
	for (;;) {
		int busy = (int)srv->q_len;

		for (int i = 0; i < srv->n_slots; i++)
			busy += srv->slots[i] != NULL;
		if (!busy || serve_now() >= end)
			break;
		pthread_mutex_unlock(&srv->lock);
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
		pthread_mutex_lock(&srv->lock);
	}
	pthread_mutex_unlock(&srv->lock);
}

void serve_engine_stop(struct serve *srv)
{
	struct serve_job *j;

	if (!srv->engine_started)
		return;
	pthread_mutex_lock(&srv->lock);
	srv->quit = 1;
	while ((j = queue_pop(srv))) {
		fail_job(j, 503, "the server is shutting down");
		serve_status_reject(srv, SERVE_REJECT_DRAINING);
		serve_job_release(j);
	}
	for (int i = 0; i < srv->n_slots; i++)
		if (srv->slots[i]) {
			srv->slots[i]->cancel = 1;
			snprintf(srv->slots[i]->error, sizeof(srv->slots[i]->error),
			         "the server is shutting down");
			srv->slots[i]->http_status = 503;
		}
	pthread_cond_signal(&srv->work);
	pthread_mutex_unlock(&srv->lock);
	pthread_join(srv->engine, NULL);
	srv->engine_started = 0;
}
