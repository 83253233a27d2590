/* A serving path: one candidate opened as serving runs it, a session per slot. */
#include "serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candidates.h"
#include "error.h"

/*
 * The pages of P's pool (0: a cache per slot): --kv-pages N, or with
 * auto as many as the slots' whole contexts hold where P can page, else
 * none and why in p->kv_why.
 */
static long pool_pages(const struct serve *srv, struct serve_path *p)
{
	const struct q4kh_kv_pool pages = { .page_size = Q4KH_PREFIX_BLOCK };
	struct q4kh_error why = { { 0 } };

	if (srv->o.kv_pages != SERVE_KV_PAGES_AUTO)
		return srv->o.kv_pages;
	if (!q4kh_kv_paged_supported(p->m, &why)) {
		snprintf(p->kv_why, sizeof(p->kv_why), "%s", why.msg);
		return 0;
	}
	return (long)srv->n_slots *
	       q4kh_kv_pool_pages_for(&pages, q4kh_session_ctx(p->m, srv->n_ctx));
}

/* A session per slot for P, and what their caches hold for prefix reuse
 * when --prefix-cache is on and their model's sessions batch (a state of
 * a recurrent layer holds no prefix). The opener's session (p->sv.s, when
 * serve_path_open made one) is slot 0's and stays sv's to free; on a pool
 * of pages (pool_pages) every session is on it instead, and the opener's,
 * whose cache holds a whole context, is freed. */
static int add_sessions(struct serve *srv, struct serve_path *p, struct q4kh_error *err)
{
	struct q4kh_session_params sp = { .n_ctx = srv->n_ctx };
	const long pages = pool_pages(srv, p);

	if (pages) {
		if (q4kh_kv_paged_new(p->m, (int32_t)pages, Q4KH_PREFIX_BLOCK,
		                      q4kh_session_kv_type(Q4KH_KV_DEFAULT, p->m->backend),
		                      &p->paged, err))
			return -1;
		sp.paged = p->paged;
		q4kh_session_free(p->sv.s);
		p->sv.s = NULL;
	}
	p->sessions = calloc((size_t)srv->n_slots, sizeof(*p->sessions));
	if (!p->sessions)
		return q4kh_fail(err, "out of memory");
	p->n_sessions = srv->n_slots;
	p->sessions[0] = p->sv.s;
	for (int i = p->sv.s ? 1 : 0; i < srv->n_slots; i++)
		if (q4kh_session_new(p->m, &sp, &p->sessions[i], err))
			return -1;
	if (!srv->o.prefix_cache || !q4kh_session_batchable(p->sessions[0]))
		return 0;
	return q4kh_prefix_new(srv->n_slots, p->sessions[0]->p.n_ctx, &p->prefix, err);
}

int serve_path_open(struct serve *srv, const struct q4kh_candidate *c,
                    struct serve_path **out, struct q4kh_error *err)
{
	struct serve_path *p = calloc(1, sizeof(*p));

	*out = NULL;
	if (!p)
		return q4kh_fail(err, "out of memory");
	p->cand = *c;
	p->plan_index = (int)(c - srv->plan);
	q4kh_candidate_name(&p->cand, p->name, sizeof(p->name));
	snprintf(p->sel.kernel_choice, sizeof(p->sel.kernel_choice), "%s", c->why);
	if (q4kh_serving_open(srv->registry, srv->model_path, &p->cand, srv->n_ctx, &p->sv,
	                      err)) {
		free(p);
		return -1;
	}
	p->be = &p->sv.be;
	p->m = p->sv.m;
	if (add_sessions(srv, p, err)) {
		serve_path_close(p);
		return -1;
	}
	*out = p;
	return 0;
}

int serve_path_select(struct serve *srv, struct serve_path **out, int *explicit_failure,
                      struct q4kh_error *err)
{
	struct serve_path *p = calloc(1, sizeof(*p));

	*out = NULL;
	*explicit_failure = 0;
	if (!p)
		return q4kh_fail(err, "out of memory");
	/* In place: the model keeps pointers to the selection's backend and
	 * kernel. */
	if (q4kh_select(&srv->rq, &p->sel, err)) {
		*explicit_failure = p->sel.explicit_failure;
		free(p);
		return -1;
	}
	p->be = &p->sel.backend;
	p->m = p->sel.model;
	p->plan_index = -1;
	p->cand = (struct q4kh_candidate){ .backend = p->be->plugin->name,
		                           .device = p->be->record.index,
		                           .variant = p->sel.kernel.plugin
		                                              ? p->sel.kernel.plugin->name
		                                              : NULL };
	q4kh_candidate_name(&p->cand, p->name, sizeof(p->name));
	for (int i = 0; i < srv->n_plan; i++)
		if (!strcmp(srv->plan[i].backend, p->cand.backend) &&
		    srv->plan[i].device == p->cand.device &&
		    !strcmp(srv->plan[i].variant ? srv->plan[i].variant : "",
		            p->cand.variant ? p->cand.variant : ""))
			p->plan_index = i;
	if (add_sessions(srv, p, err)) {
		serve_path_close(p);
		return -1;
	}
	*out = p;
	return 0;
}

void serve_path_close(struct serve_path *p)
{
	if (!p)
		return;
	/* sessions[0] belongs to sv when the path was opened by serve_path_open */
	for (int i = p->sv.s ? 1 : 0; i < p->n_sessions; i++)
		q4kh_session_free(p->sessions[i]);
	free(p->sessions);
	q4kh_prefix_free(p->prefix);
	q4kh_kv_paged_free(p->paged);
	if (p->sel.model)
		q4kh_selection_close(&p->sel);
	q4kh_serving_close(&p->sv);
	free(p);
}

void serve_path_describe(const struct serve_path *p, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s on %s, device %u", p->name, p->be->record.name,
	         p->cand.device);
}

void serve_path_f2_header(const struct serve_path *p, char *buf, size_t cap)
{
	char line[900];

	if (p->unverified)
		snprintf(line, sizeof(line), "off; %s serves UNVERIFIED", p->name);
	else if (p->sel.f2_source[0])
		snprintf(line, sizeof(line), "%s; %s", p->sel.f2_verdict, p->sel.f2_source);
	else
		snprintf(line, sizeof(line), "%s", p->sel.f2_verdict);
	/* A header is one line of ASCII. */
	q4kh_show(buf, cap, line, strlen(line), cap > 8 ? cap - 8 : 0, 1);
}

void serve_path_current_f2(struct serve *srv, char *buf, size_t cap)
{
	pthread_mutex_lock(&srv->lock);
	if (srv->cur)
		serve_path_f2_header(srv->cur, buf, cap);
	else
		snprintf(buf, cap, "none; no validated path serves");
	pthread_mutex_unlock(&srv->lock);
}
