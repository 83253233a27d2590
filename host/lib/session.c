#include "session.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "graph_entry.h"
#include "graph_run.h"
#include "kv_paged.h"
#include "tensor.h"
#include "q4khost/top2.h"

#define SCRATCH_ALIGN 256
/* Shape classes kept at once: prefill chunks, the last chunk, decode,
 * F2's all-logits prompt; the least recently used goes first. */
#define SESSION_GRAPHS 8

struct q4kh_session_graph {
	struct q4kh_graph *g; /* NULL: a free slot */
	/* the sequences it runs: their sessions' ids, this session's alone
	 * or a batched step's (q4kh_session_eval_batch), in order */
	uint64_t *seq_ids;
	int32_t n_seq;
	int32_t *seq_cols; /* a mixed step's column offsets (q4kh_seqs), or NULL */
	struct q4kh_graph_export ex; /* g as the ABI shows it, bound */
	q4kh_graph *rec;      /* the host's recording, once made */
	q4kh_step *entry;     /* the backend's prepared step (ABI 1.6) */
	uint64_t runs;        /* steps run with g */
	uint64_t used;        /* s->stats.steps when last used */
	int no_record;        /* recording g failed once: run it op by op */
	int no_entry;         /* the backend declined g: the host runs it */
};

static uint64_t align_up(uint64_t v)
{
	return (v + SCRATCH_ALIGN - 1) & ~(uint64_t)(SCRATCH_ALIGN - 1);
}

static int alloc(struct q4kh_session *s, uint64_t size, q4kh_buffer **buf,
                 const char *what, struct q4kh_error *err)
{
	return q4kh_backend_check(s->b, s->b->v->buffer_alloc(s->b->dev, size, buf),
	                          what, err);
}

/* Drop what the backend holds of SG's bound tensors: the host's recording
 * or the backend's prepared step. */
static void drop_recording(struct q4kh_session *s, struct q4kh_session_graph *sg)
{
	if (sg->rec)
		s->b->v->graph_free(s->b->dev, sg->rec);
	if (sg->entry)
		s->b->v->graph_release(s->b->dev, sg->entry);
	sg->rec = NULL;
	sg->entry = NULL;
}

static void drop_graph(struct q4kh_session *s, struct q4kh_session_graph *sg)
{
	drop_recording(s, sg);
	q4kh_graph_export_free(&sg->ex);
	q4kh_graph_free(sg->g);
	free(sg->seq_ids);
	free(sg->seq_cols);
	memset(sg, 0, sizeof(*sg));
}

/* Bind SG's graph to the scratch and step inputs, and export it. */
static int bind(struct q4kh_session *s, struct q4kh_session_graph *sg, struct q4kh_error *err)
{
	q4kh_graph_bind(sg->g, s->scratch, s->step);
	return q4kh_graph_export(sg->g, sg->n_seq, &sg->ex, err);
}

/*
 * Make the scratch at least BYTES long. A new buffer moves every
 * activation, so cached graphs are bound again and their recordings,
 * which hold the old addresses, are dropped.
 */
static int reserve_scratch(struct q4kh_session *s, uint64_t bytes,
                           struct q4kh_error *err)
{
	q4kh_buffer *buf;

	if (bytes <= s->scratch_bytes)
		return 0;
	if (alloc(s, bytes, &buf, "buffer_alloc (activations)", err))
		return -1;
	if (s->scratch)
		s->b->v->buffer_free(s->b->dev, s->scratch);
	s->scratch = buf;
	s->scratch_bytes = bytes;
	for (int i = 0; i < SESSION_GRAPHS; i++) {
		if (!s->graphs[i].g)
			continue;
		drop_recording(s, &s->graphs[i]);
		if (bind(s, &s->graphs[i], err))
			return -1;
	}
	return 0;
}

/* The architecture's graph of SEQ for T tokens and the logits of the
 * last N_OUT, or of the tokens ROWS flags (not NULL), planned. */
static struct q4kh_graph *build(struct q4kh_session *s, const struct q4kh_seqs *seq,
                                int64_t t, int64_t n_out, const uint8_t *rows,
                                struct q4kh_error *err)
{
	struct q4kh_graph *g = q4kh_graph_new(t, n_out);
	const char *missing;

	if (!g || (rows && q4kh_graph_out_rows(g, rows)) ||
	    (s->p.paged && q4kh_graph_paged(g, seq->n, s->n_table))) {
		q4kh_graph_free(g);
		q4kh_fail(err, "out of memory for a step graph");
		return NULL;
	}
	if (s->m->arch->build(g, seq, err) || q4kh_graph_check(g, err))
		goto fail;
	if (n_out && g->logits < 0) {
		q4kh_fail(err, "%s: the step graph has no logits", s->m->arch->name);
		goto fail;
	}
	missing = q4kh_graph_missing(g, s->b);
	if (missing) {
		q4kh_fail(err, "backend %s cannot run %s: it has no %s (an optional entry of the plugin ABI: docs/plugin-abi.md)",
		          s->b->plugin->name, s->m->arch->name, missing);
		goto fail;
	}
	if (q4kh_graph_plan(g, SCRATCH_ALIGN)) {
		q4kh_fail(err, "out of memory planning a step graph of %d values",
		          g->n_vals);
		goto fail;
	}
	return g;
fail:
	q4kh_graph_free(g);
	return NULL;
}

/* Does graph G give the logits of the tokens ROWS flags (NULL: of its last n_out)? */
static int same_rows(const struct q4kh_graph *g, const uint8_t *rows)
{
	if (!g->rows || !rows)
		return !g->rows && !rows;
	return !memcmp(g->rows, rows, (size_t)g->n_tokens);
}

/*
 * Does cached graph C run the sequences SEQ, in that order, with their
 * columns? Over a paged KV cache a graph names no sequence's cache, only
 * the pools they share, and reads each one's block table, slots and
 * positions from the step's inputs: it runs any sequences of its shape
 * (as many, with the same columns), so that a batch-size class keeps its
 * graph, and the backend's recording of it, as requests come and go.
 */
static int same_seqs(const struct q4kh_session_graph *c, const struct q4kh_seqs *seq)
{
	if (c->n_seq != seq->n || !c->seq_cols != !seq->cols)
		return 0;
	if (seq->cols && memcmp(c->seq_cols, seq->cols, sizeof(int32_t) * (size_t)(seq->n + 1)))
		return 0;
	if (seq->s[0]->p.paged)
		return 1;
	for (int32_t j = 0; j < seq->n; j++)
		if (c->seq_ids[j] != seq->s[j]->id)
			return 0;
	return 1;
}

/*
 * The cached graph of this shape and these sequences (S alone, or S
 * first of a batched step), built and bound to S's scratch and step
 * inputs on first use.
 */
static struct q4kh_session_graph *graph_for(struct q4kh_session *s,
                                            const struct q4kh_seqs *seq, int64_t t,
                                            int64_t n_out, const uint8_t *rows,
                                            struct q4kh_error *err)
{
	struct q4kh_session_graph *sg = &s->graphs[0];

	/* A weight changed kernel variant since the graphs were exported:
	 * their exports, recordings and prepared steps name the old ones. */
	for (int i = 0; i < SESSION_GRAPHS && s->routes != s->m->routes; i++) {
		if (!s->graphs[i].g)
			continue;
		drop_recording(s, &s->graphs[i]);
		if (bind(s, &s->graphs[i], err))
			return NULL;
	}
	s->routes = s->m->routes;
	for (int i = 0; i < SESSION_GRAPHS; i++) {
		struct q4kh_session_graph *c = &s->graphs[i];

		if (c->g && c->g->n_tokens == t && c->g->n_out == n_out && same_seqs(c, seq) &&
		    same_rows(c->g, rows))
			return c;
		if (!c->g || (sg->g && c->used < sg->used))
			sg = c;
	}
	drop_graph(s, sg);
	sg->seq_ids = malloc(sizeof(*sg->seq_ids) * (size_t)seq->n);
	sg->seq_cols = seq->cols ? malloc(sizeof(int32_t) * (size_t)(seq->n + 1)) : NULL;
	if (!sg->seq_ids || (seq->cols && !sg->seq_cols)) {
		drop_graph(s, sg);
		q4kh_fail(err, "out of memory");
		return NULL;
	}
	if (seq->cols)
		memcpy(sg->seq_cols, seq->cols, sizeof(int32_t) * (size_t)(seq->n + 1));
	sg->n_seq = seq->n;
	for (int32_t j = 0; j < seq->n; j++)
		sg->seq_ids[j] = seq->s[j]->id;
	sg->g = build(s, seq, t, n_out, rows, err);
	if (!sg->g) {
		drop_graph(s, sg);
		return NULL;
	}
	if (reserve_scratch(s, sg->g->scratch_bytes, err) || bind(s, sg, err)) {
		drop_graph(s, sg);
		return NULL;
	}
	return sg;
}

/* With a paged cache: S's table back at its n_past tokens, the pages past
 * them given back (which never fails). */
static void rewind_table(struct q4kh_session *s)
{
	if (s->p.paged)
		q4kh_kv_table_resize(&s->p.paged->pool, &s->table, s->n_past, NULL);
}

/* A backend of the host's cores other than the exact reference. */
static int fast_cpu(const struct q4kh_backend *b)
{
	return strcmp(b->plugin->name, "cpu") && !strcmp(q4kh_backend_kind(b->plugin), "cpu");
}

uint32_t q4kh_session_kv_type(enum q4kh_kv_choice kv, const struct q4kh_backend *b)
{
	if (kv == Q4KH_KV_DEFAULT)
		kv = strcmp(b->plugin->name, "cpu") ? Q4KH_KV_F16 : Q4KH_KV_F32;
	return kv == Q4KH_KV_F16 ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32;
}

uint32_t q4kh_session_ctx(const struct q4kh_model *m, uint32_t n)
{
	const uint32_t trained = m->hp.n_ctx_train;

	return n ? n : trained && trained < 4096 ? trained : 4096;
}

/* The KV cache of every attention layer, in one buffer. */
static int alloc_kv(struct q4kh_session *s, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &s->m->hp;
	const uint32_t n_attn = hp->n_layer - hp->n_recurrent;
	uint64_t kv_layer = align_up((uint64_t)hp->head_dim * hp->n_head_kv * s->p.n_ctx *
	                             q4kh_type_block_bytes(s->stats.kv_type));
	uint32_t a = 0;

	if (n_attn == 0)
		return 0;
	if (alloc(s, kv_layer * 2 * n_attn, &s->kv, "buffer_alloc (KV cache)", err))
		return -1;
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		if (s->m->layers[il].recurrent)
			continue;
		s->k_cache[il] = q4kh_tensor_make(s->kv, kv_layer * (2 * a), s->stats.kv_type,
		                                  hp->head_dim, hp->n_head_kv, s->p.n_ctx);
		s->v_cache[il] = q4kh_tensor_make(s->kv, kv_layer * (2 * a + 1),
		                                  s->stats.kv_type, hp->head_dim,
		                                  hp->n_head_kv, s->p.n_ctx);
		a++;
	}
	return 0;
}

/* The states of every linear-attention layer, in one buffer (zeroed
 * before the first step). */
static int alloc_states(struct q4kh_session *s, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &s->m->hp;
	const int64_t sd = hp->ssm_head_dim, hv = hp->ssm_v_heads;
	const int64_t ch = 2 * sd * hp->ssm_k_heads + sd * hv;
	const uint64_t conv = align_up(sizeof(float) * (uint64_t)(hp->ssm_conv_k - 1) *
	                               (uint64_t)ch);
	const uint64_t ssm = align_up(sizeof(float) * (uint64_t)(sd * sd * hv));
	uint64_t off = 0;

	if (hp->n_recurrent == 0)
		return 0;
	s->rs_bytes = (conv + ssm) * hp->n_recurrent;
	if (alloc(s, s->rs_bytes, &s->rs, "buffer_alloc (recurrent states)", err))
		return -1;
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		if (!s->m->layers[il].recurrent)
			continue;
		s->conv_state[il] = q4kh_tensor_make(s->rs, off, Q4KH_TYPE_F32,
		                                     hp->ssm_conv_k - 1, ch, 1);
		s->ssm_state[il] = q4kh_tensor_make(s->rs, off + conv, Q4KH_TYPE_F32, sd,
		                                    sd, hv);
		off += conv + ssm;
	}
	s->rs_stale = 1;
	return 0;
}

/* Zero every state: a new sequence starts from none. */
static int clear_states(struct q4kh_session *s, struct q4kh_error *err)
{
	const uint64_t chunk = (uint64_t)1 << 20;
	void *zero = calloc(1, chunk);
	int rc = 0;

	if (!zero)
		return q4kh_fail(err, "out of memory");
	for (uint64_t off = 0; off < s->rs_bytes && !rc; off += chunk) {
		uint64_t n = s->rs_bytes - off < chunk ? s->rs_bytes - off : chunk;

		rc = q4kh_backend_check(s->b, s->b->v->buffer_upload(s->b->dev, s->rs, off,
		                                                      zero, n),
		                        "buffer_upload (zero states)", err);
	}
	free(zero);
	s->rs_stale = rc != 0;
	return rc;
}

/*
 * The int32 values of a step of T tokens and N_SEQS sequences in S's step
 * inputs: ids and positions, and with a paged cache the slots and a
 * table per sequence (graph.h, q4kh_graph_bind).
 */
static uint64_t step_values(const struct q4kh_session *s, int64_t t, int64_t n_seqs)
{
	return (uint64_t)(s->p.paged ? 3 * t + n_seqs * s->n_table : 2 * t);
}

/*
 * With a paged cache, before S writes positions POS[0..t) (n_past on):
 * its table holds n_past + T tokens, each page they write that another
 * table holds too copied first (kv_pool.h); their pool slots into SLOTS
 * and the table into PAGES (n_table entries, those past its pages 0, a
 * page no query of S reads). -1 with err (the pool full, a copy failed),
 * the table then back at n_past.
 */
static int paged_inputs(struct q4kh_session *s, const int32_t *pos, int64_t t, int32_t *slots,
                        int32_t *pages, struct q4kh_error *err)
{
	struct q4kh_kv_paged *k = s->p.paged;

	if (q4kh_kv_table_resize(&k->pool, &s->table, s->n_past + t, err) ||
	    q4kh_kv_table_own(&k->pool, &s->table, s->n_past, s->n_past + t, q4kh_kv_paged_copy,
	                      k, err) < 0) {
		rewind_table(s);
		return -1;
	}
	q4kh_kv_table_slots(&k->pool, &s->table, pos, t, slots);
	memcpy(pages, s->table.pages, sizeof(int32_t) * (size_t)s->table.n);
	memset(pages + s->table.n, 0, sizeof(int32_t) * (size_t)(s->n_table - s->table.n));
	return 0;
}

/* One sequence: S's own tokens. */
static struct q4kh_seqs alone(const struct q4kh_session *const *s)
{
	return (struct q4kh_seqs){ .m = (*s)->m, .n = 1, .s = s };
}

int q4kh_session_new(struct q4kh_model *m, const struct q4kh_session_params *p,
                     struct q4kh_session **out, struct q4kh_error *err)
{
	static atomic_uint_fast64_t next_id;
	const struct q4kh_hparams *hp = &m->hp;
	struct q4kh_session *s = calloc(1, sizeof(*s));
	const struct q4kh_session *self = s;
	struct q4kh_seqs one;
	const char *missing;

	if (!s)
		return q4kh_fail(err, "out of memory");
	s->id = atomic_fetch_add(&next_id, 1) + 1;
	s->m = m;
	s->b = m->backend;
	s->p = *p;
	s->p.n_ctx = q4kh_session_ctx(m, s->p.n_ctx);
	if (!s->p.n_batch)
		s->p.n_batch = strcmp(q4kh_backend_kind(s->b->plugin), "cpu") ? 512
		               : fast_cpu(s->b)                                 ? 128
		                                                                : 256;
	s->stats.kv_type = q4kh_session_kv_type(s->p.kv, s->b);
	s->k_cache = calloc(hp->n_layer, sizeof(*s->k_cache));
	s->v_cache = calloc(hp->n_layer, sizeof(*s->v_cache));
	s->conv_state = calloc(hp->n_layer, sizeof(*s->conv_state));
	s->ssm_state = calloc(hp->n_layer, sizeof(*s->ssm_state));
	if (s->p.paged) {
		if (s->p.paged->m != m) {
			q4kh_fail(err, "a session on a paged KV cache of another model");
			goto fail;
		}
		s->stats.kv_type = s->p.paged->kv_type;
		s->n_table = q4kh_kv_pool_pages_for(&s->p.paged->pool, s->p.n_ctx);
	}
	s->values = calloc(step_values(s, s->p.n_batch, s->p.n_batch), sizeof(*s->values));
	s->graphs = calloc(SESSION_GRAPHS, sizeof(*s->graphs));
	if (!s->k_cache || !s->v_cache || !s->conv_state || !s->ssm_state ||
	    !s->values || !s->graphs) {
		q4kh_fail(err, "out of memory");
		goto fail;
	}
	if (s->p.paged)
		for (uint32_t il = 0; il < hp->n_layer; il++) {
			s->k_cache[il] = s->p.paged->k_pool[il];
			s->v_cache[il] = s->p.paged->v_pool[il];
		}
	else if (alloc_kv(s, err))
		goto fail;
	if (alloc_states(s, err) ||
	    alloc(s, sizeof(int32_t) * step_values(s, s->p.n_batch, s->p.n_batch), &s->step,
	          "buffer_alloc (step inputs)", err))
		goto fail;
	s->stats.entry = !q4kh_graph_entry_missing(s->b);
	missing = q4kh_graph_replay_missing(s->b);
	s->stats.replay = !missing;
	if (missing && !s->stats.entry)
		snprintf(s->stats.why_not, sizeof(s->stats.why_not),
		         "%s does not record steps for replay (it has no %s)",
		         s->b->plugin->name, missing);
	/* the decode step, built now: a backend that lacks an op fails here */
	one = alone(&self);
	if (!graph_for(s, &one, 1, 1, NULL, err))
		goto fail;
	*out = s;
	return 0;
fail:
	q4kh_session_free(s);
	return -1;
}

void q4kh_session_free(struct q4kh_session *s)
{
	if (!s)
		return;
	for (int i = 0; s->graphs && i < SESSION_GRAPHS; i++)
		drop_graph(s, &s->graphs[i]);
	if (s->kv)
		s->b->v->buffer_free(s->b->dev, s->kv);
	if (s->rs)
		s->b->v->buffer_free(s->b->dev, s->rs);
	if (s->step)
		s->b->v->buffer_free(s->b->dev, s->step);
	if (s->scratch)
		s->b->v->buffer_free(s->b->dev, s->scratch);
	if (s->pick)
		s->b->v->buffer_free(s->b->dev, s->pick);
	free(s->pick_logits);
	if (s->p.paged)
		q4kh_kv_table_release(&s->p.paged->pool, &s->table);
	free(s->graphs);
	free(s->k_cache);
	free(s->v_cache);
	free(s->conv_state);
	free(s->ssm_state);
	free(s->values);
	free(s);
}

void q4kh_session_reset(struct q4kh_session *s)
{
	s->n_past = 0;
	rewind_table(s);
	s->rs_stale = s->rs != NULL;
}

int q4kh_session_take_prefix(struct q4kh_session *dst, const struct q4kh_session *src,
                              int64_t from, int64_t n, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &dst->m->hp;

	if (!q4kh_session_batchable(dst))
		return q4kh_fail(err, "%s has recurrent layers, whose states hold no prefix to take",
		                 dst->m->arch->name);
	if (src->m != dst->m || src->b != dst->b || src->stats.kv_type != dst->stats.kv_type ||
	    src->p.paged != dst->p.paged)
		return q4kh_fail(err, "a prefix taken from a session of another model, backend, KV type or paged KV cache");
	if (from < 0 || from > n || n > src->n_past || n > dst->p.n_ctx)
		return q4kh_fail(err, "a prefix of tokens [%lld, %lld) taken from a session of %lld cached tokens into one of n_ctx %u",
		                 (long long)from, (long long)n, (long long)src->n_past, dst->p.n_ctx);
	dst->n_past = 0;
	if (dst->p.paged) {
		if (dst == src ? q4kh_kv_table_resize(&dst->p.paged->pool, &dst->table, n, err)
		               : q4kh_kv_table_share(&dst->p.paged->pool, &dst->table, &src->table, n,
		                                     err)) {
			rewind_table(dst);
			return -1;
		}
		dst->n_past = n;
		return 0;
	}
	for (uint32_t il = 0; il < hp->n_layer && dst != src && n > from; il++) {
		const struct q4kh_tensor *const pairs[2][2] = {
			{ &src->k_cache[il], &dst->k_cache[il] },
			{ &src->v_cache[il], &dst->v_cache[il] },
		};

		if (dst->m->layers[il].recurrent)
			continue;
		for (int kv = 0; kv < 2; kv++) {
			const struct q4kh_tensor a = q4kh_tensor_cols(pairs[kv][0], from, n - from);
			const struct q4kh_tensor b = q4kh_tensor_cols(pairs[kv][1], from, n - from);

			if (q4kh_backend_check(dst->b, dst->b->v->copy(dst->b->dev, &a, &b),
			                       "copy (a KV cache's prefix)", err))
				return -1;
		}
	}
	dst->n_past = n;
	return 0;
}

/*
 * Run graph SG once: as a replay when it has a recording; recorded first
 * when the backend replays and this shape ran before (a shape met once,
 * like a prompt's last chunk, is not worth a recording); else op by op.
 */
/* Count a step that took path W. */
static void took(struct q4kh_session *s, enum q4kh_step_way w)
{
	s->stats.ways[w]++;
	s->stats.last = w;
}

/*
 * SG prepared for the backend's graph entry, once: 1 when it is, 0 when
 * the backend has no entry or declined the graph (the host runs it from
 * then on), -1 with err on a failure.
 */
static int prepare_entry(struct q4kh_session *s, struct q4kh_session_graph *sg,
                         struct q4kh_error *err)
{
	int rc;

	if (!s->stats.entry || sg->no_entry)
		return 0;
	if (sg->entry)
		return 1;
	rc = q4kh_graph_entry_prepare(&sg->ex, s->b, &sg->entry, s->stats.why_not,
	                              sizeof(s->stats.why_not), err);
	sg->no_entry = rc == 0;
	return rc;
}

/*
 * Run SG through the backend's graph entry, preparing it first: 1 when it
 * ran, 0 when the backend declined the graph (the host runs it from then
 * on), -1 with err on a failure.
 */
static int run_entry(struct q4kh_session *s, struct q4kh_session_graph *sg,
                     struct q4kh_error *err)
{
	static const enum q4kh_step_way ways[] = {
		[Q4KH_PATH_NODES] = Q4KH_WAY_GRAPH_NODES,
		[Q4KH_PATH_REPLAY] = Q4KH_WAY_GRAPH_REPLAY,
		[Q4KH_PATH_PERSISTENT] = Q4KH_WAY_GRAPH_PERSISTENT,
	};
	struct q4kh_step_run run = { .struct_size = sizeof(run) };
	int rc = prepare_entry(s, sg, err);

	if (rc <= 0)
		return rc;
	if (q4kh_backend_check(s->b, s->b->v->graph_compute(s->b->dev, sg->entry, &run),
	                       "graph_compute", err))
		return -1;
	took(s, run.path >= Q4KH_PATH_NODES && run.path <= Q4KH_PATH_PERSISTENT
	                ? ways[run.path]
	                : Q4KH_WAY_GRAPH_NODES);
	s->stats.launches = run.launches;
	return 1;
}

int q4kh_session_prepare(struct q4kh_session *s, int64_t n, struct q4kh_error *err)
{
	const struct q4kh_session *self = s;
	const struct q4kh_seqs one = alone(&self);
	const int64_t batch = s->p.n_batch;
	/* eval's chunks: whole batches without logits, the last with them */
	const int64_t shapes[2][2] = { { batch, 0 }, { n - (n - 1) / batch * batch, 1 } };

	if (n <= 0)
		return q4kh_fail(err, "a prompt of %lld tokens to prepare", (long long)n);
	for (int i = n > batch ? 0 : 1; i < 2; i++) {
		struct q4kh_session_graph *sg = graph_for(s, &one, shapes[i][0], shapes[i][1], NULL,
		                                          err);

		if (!sg || prepare_entry(s, sg, err) < 0)
			return -1;
	}
	return 0;
}

static int run_graph(struct q4kh_session *s, struct q4kh_session_graph *sg,
                     const struct q4kh_step_values *in, struct q4kh_error *err)
{
	struct q4kh_error rec_err;
	int rc;

	sg->runs++;
	sg->used = ++s->stats.steps;
	if (s->stats.entry && !sg->no_entry && (rc = run_entry(s, sg, err)))
		return rc < 0 ? -1 : 0;
	if (!sg->rec && s->stats.replay && !sg->no_record && sg->runs > 1) {
		if (q4kh_graph_record(sg->g, &sg->ex.sg, s->b, in, &sg->rec, &rec_err)) {
			sg->no_record = 1;
			s->stats.record_failed = 1;
			snprintf(s->stats.why_not, sizeof(s->stats.why_not), "%.255s",
			         rec_err.msg);
		} else {
			s->stats.recorded++;
		}
	}
	if (!sg->rec) {
		took(s, Q4KH_WAY_OP_BY_OP);
		return q4kh_graph_run(sg->g, &sg->ex.sg, s->b, in, err);
	}
	s->stats.replayed++;
	took(s, Q4KH_WAY_REPLAY);
	return q4kh_backend_check(s->b, s->b->v->graph_launch(s->b->dev, sg->rec),
	                          "graph_launch", err);
}

const char *q4kh_step_way_name(enum q4kh_step_way w)
{
	static const char *const names[Q4KH_WAY_COUNT] = {
		"op by op", "graph replay", "graph entry (node by node)",
		"graph entry (replay)", "graph entry (persistent kernel)",
	};

	return (unsigned)w < Q4KH_WAY_COUNT ? names[w] : "unknown";
}

const char *q4kh_step_way_token(enum q4kh_step_way w)
{
	static const char *const tokens[Q4KH_WAY_COUNT] = {
		"op_by_op", "replay", "graph_nodes", "graph_replay", "graph_persistent",
	};

	return (unsigned)w < Q4KH_WAY_COUNT ? tokens[w] : "unknown";
}

/*
 * One step: T tokens from IDS at n_past; the logits of its last N_OUT
 * tokens, or of the N_OUT that ROWS flags (not NULL), are then at *LG, in
 * the scratch, until the next step.
 */
static int step(struct q4kh_session *s, const int32_t *ids, int64_t t,
                int64_t n_out, const uint8_t *rows, const struct q4kh_tensor **lg,
                struct q4kh_error *err)
{
	const struct q4kh_session *self = s;
	const struct q4kh_seqs one = alone(&self);
	struct q4kh_session_graph *sg = graph_for(s, &one, t, n_out, rows, err);
	struct q4kh_step_values in = { s->values, s->values + t };

	if (!sg)
		return -1;
	memcpy(s->values, ids, sizeof(*ids) * (size_t)t);
	for (int64_t i = 0; i < t; i++)
		s->values[t + i] = (int32_t)(s->n_past + i);
	if ((s->p.paged &&
	     paged_inputs(s, s->values + t, t, s->values + 2 * t, s->values + 3 * t, err)) ||
	    q4kh_backend_check(s->b,
	                       s->b->v->buffer_upload(s->b->dev, s->step, 0, s->values,
	                                              sizeof(int32_t) * step_values(s, t, 1)),
	                       "buffer_upload (step inputs)", err) ||
	    run_graph(s, sg, &in, err))
		return -1;
	*lg = n_out ? &sg->g->vals[sg->g->logits].t : NULL;
	return 0;
}

static int download(struct q4kh_session *s, const struct q4kh_tensor *t, void *dst,
                    const char *what, struct q4kh_error *err)
{
	return q4kh_backend_check(s->b,
	                          s->b->v->buffer_download(s->b->dev, t->buffer, t->offset,
	                                                   dst, q4kh_tensor_bytes(t)),
	                          what, err);
}

int32_t q4kh_top2(const float *v, int64_t n, float val[2])
{
	return q4kh_top2_scan(v, n, val);
}

double q4kh_top2_margin(int32_t best, const float val[2])
{
	return best >= 0 ? (double)val[0] - (double)val[1] : NAN;
}

/*
 * The greedy pick of LG, the last token's logits {n_vocab, 1}: on the
 * device into s->pick with top2 when the backend has it, else from a
 * host copy of the logits.
 */
static int pick(struct q4kh_session *s, const struct q4kh_tensor *lg, int32_t *token,
                double *margin, struct q4kh_error *err)
{
	const struct q4kh_backend_v1 *v = s->b->v;
	struct q4kh_tensor idx, val, both;
	unsigned char rec[12];
	float top[2];

	if (!Q4KH_BACKEND_HAS(v, top2)) {
		if (!s->pick_logits &&
		    !(s->pick_logits = malloc(sizeof(float) * (size_t)s->m->hp.n_vocab)))
			return q4kh_fail(err, "out of memory");
		if (download(s, lg, s->pick_logits, "buffer_download (logits)", err))
			return -1;
		*token = q4kh_top2(s->pick_logits, s->m->hp.n_vocab, top);
		if (margin)
			*margin = q4kh_top2_margin(*token, top);
		return 0;
	}
	if (!s->pick && alloc(s, sizeof(rec), &s->pick, "buffer_alloc (top2)", err))
		return -1;
	/* one 12-byte record: the index, then the two values */
	idx = q4kh_tensor_make(s->pick, 0, Q4KH_TYPE_I32, 1, 1, 1);
	val = q4kh_tensor_make(s->pick, sizeof(int32_t), Q4KH_TYPE_F32, 2, 1, 1);
	both = q4kh_tensor_make(s->pick, 0, Q4KH_TYPE_I32, 3, 1, 1);
	if (q4kh_backend_check(s->b, v->top2(s->b->dev, lg, &idx, &val), "top2", err) ||
	    download(s, &both, rec, "buffer_download (top2)", err))
		return -1;
	memcpy(token, rec, sizeof(*token));
	memcpy(top, rec + sizeof(*token), sizeof(top));
	if (margin)
		*margin = q4kh_top2_margin(*token, top);
	return 0;
}

/* Of LG, the logits {n_vocab, t} of a step's tokens, the rows flagged in
 * ROWS into DST, one after another, a download per run of rows. */
static int download_rows(struct q4kh_session *s, const struct q4kh_tensor *lg,
                         const uint8_t *rows, int64_t t, float *dst, struct q4kh_error *err)
{
	const uint64_t row = sizeof(float) * (uint64_t)s->m->hp.n_vocab;

	for (int64_t i = 0; i < t;) {
		int64_t j = i;

		while (j < t && rows[j])
			j++;
		if (j > i) {
			if (q4kh_backend_check(s->b,
			                       s->b->v->buffer_download(s->b->dev, lg->buffer,
			                                                lg->offset + row * (uint64_t)i,
			                                                dst, row * (uint64_t)(j - i)),
			                       "buffer_download (logits)", err))
				return -1;
			dst += (j - i) * s->m->hp.n_vocab;
		}
		i = j + 1;
	}
	return 0;
}

/*
 * eval, eval_rows and eval_top2: the logits wanted into LOGITS (ALL: every
 * token's; ROWS: the flagged tokens', one after another) or, with TOKEN
 * not NULL, the last token's greedy pick.
 */
static int eval(struct q4kh_session *s, const int32_t *ids, int64_t n, float *logits,
                int all, const uint8_t *rows, int only, int32_t *token, double *margin,
                struct q4kh_error *err)
{
	const int64_t n_vocab = s->m->hp.n_vocab;
	const int64_t start = s->n_past;

	if (n <= 0)
		return q4kh_fail(err, "eval of %lld tokens", (long long)n);
	if (s->n_past + n > s->p.n_ctx)
		return q4kh_fail(err, "context full: %lld cached + %lld new tokens > n_ctx %u (a longer context: --ctx N, up to the model's %u)",
		                 (long long)s->n_past, (long long)n, s->p.n_ctx,
		                 s->m->hp.n_ctx_train);
	for (int64_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= n_vocab)
			return q4kh_fail(err, "token %d at index %lld is outside the vocabulary [0, %lld)",
			                 ids[i], (long long)i, (long long)n_vocab);
	if (s->rs_stale && clear_states(s, err))
		return -1;
	for (int64_t c = 0; c < n; c += s->p.n_batch) {
		int64_t t = n - c < s->p.n_batch ? n - c : s->p.n_batch;
		int64_t n_out = all ? t : (logits || token) && c + t == n, wanted = 0;
		const struct q4kh_tensor *lg;

		if (rows) {
			for (int64_t i = c; i < c + t; i++)
				wanted += rows[i] != 0;
			n_out = !wanted ? 0 : only ? wanted : t;
		}
		/* ONLY: the flagged rows' logits alone, one after another */
		if (step(s, ids + c, t, n_out, wanted && only ? rows + c : NULL, &lg, err))
			goto fail;
		if (lg && rows) {
			if (only ? download(s, lg, logits, "buffer_download (logits)", err)
			         : download_rows(s, lg, rows + c, t, logits, err))
				goto fail;
			logits += wanted * n_vocab;
		} else if (lg && logits &&
		           download(s, lg, all ? logits + c * n_vocab : logits,
		                    "buffer_download (logits)", err))
			goto fail;
		if (lg && token && pick(s, lg, token, margin, err))
			goto fail;
		s->n_past += t;
	}
	return 0;
fail:
	/* the KV cache's rows past start are unread; states cannot rewind */
	if (s->rs)
		q4kh_session_reset(s);
	else
		s->n_past = start;
	rewind_table(s);
	return -1;
}

int q4kh_session_eval(struct q4kh_session *s, const int32_t *ids, int64_t n,
                      float *logits, int all, struct q4kh_error *err)
{
	return eval(s, ids, n, logits, all && logits, NULL, 0, NULL, NULL, err);
}

int q4kh_session_eval_rows(struct q4kh_session *s, const int32_t *ids, int64_t n,
                           float *logits, const uint8_t *rows, int only,
                           struct q4kh_error *err)
{
	return eval(s, ids, n, logits, 0, rows, only, NULL, NULL, err);
}

int q4kh_session_eval_top2(struct q4kh_session *s, const int32_t *ids, int64_t n,
                           int32_t *token, double *margin, struct q4kh_error *err)
{
	return eval(s, ids, n, NULL, 0, NULL, 0, token, margin, err);
}

int q4kh_session_batchable(const struct q4kh_session *s)
{
	return s->m->hp.n_recurrent == 0;
}

/* Can the sequences of B[0..n) run as one step? 0, or -1 with err. */
/* The tokens B appends: its chunk, or its one id; their count in *N. */
static const int32_t *batch_ids(const struct q4kh_batch_seq *b, int32_t *n)
{
	*n = b->n_ids > 0 ? b->n_ids : 1;
	return b->n_ids > 0 ? b->ids : &b->id;
}

/* Can the sequences of B[0..n) run as one step? 0 with their tokens in
 * all in *T, or -1 with err. */
static int batch_check(const struct q4kh_batch_seq *b, int32_t n, int64_t *t,
                       struct q4kh_error *err)
{
	const struct q4kh_session *s0 = b[0].s;

	if (!q4kh_session_batchable(s0))
		return q4kh_fail(err, "%s has recurrent layers, whose states hold one sequence: its sessions step one at a time",
		                 s0->m->arch->name);
	*t = 0;
	for (int32_t j = 0; j < n; j++) {
		const struct q4kh_session *s = b[j].s;
		int32_t nj;
		const int32_t *ids = batch_ids(&b[j], &nj);

		if (s->m != s0->m || s->b != s0->b || s->p.paged != s0->p.paged ||
		    s->n_table != s0->n_table)
			return q4kh_fail(err, "sequence %d of a batched step is on another model, backend or KV cache than sequence 0",
			                 j);
		for (int32_t i = 0; i < j; i++)
			if (b[i].s == s)
				return q4kh_fail(err, "sequences %d and %d of a batched step are one session", i,
				                 j);
		if (s->n_past + nj > s->p.n_ctx)
			return q4kh_fail(err, "sequence %d of a batched step: %d tokens do not fit its context (%lld cached tokens, n_ctx %u)",
			                 j, nj, (long long)s->n_past, s->p.n_ctx);
		for (int32_t k = 0; k < nj; k++)
			if (ids[k] < 0 || (uint32_t)ids[k] >= s0->m->hp.n_vocab)
				return q4kh_fail(err, "token %d of sequence %d is outside the vocabulary [0, %u)",
				                 ids[k], j, s0->m->hp.n_vocab);
		*t += nj;
	}
	if (*t > (int64_t)s0->p.n_batch)
		return q4kh_fail(err, "a batched step of %lld tokens: at most the session's batch of %u tokens",
		                 (long long)*t, s0->p.n_batch);
	return 0;
}

/* B alone: its session's own step of its token or chunk. */
static int eval_alone(struct q4kh_batch_seq *b, struct q4kh_error *err)
{
	int32_t n;
	const int32_t *ids = batch_ids(b, &n);

	if (b->skip)
		return q4kh_session_eval(b->s, ids, n, NULL, 0, err);
	return b->logits ? q4kh_session_eval(b->s, ids, n, b->logits, 0, err)
	                 : q4kh_session_eval_top2(b->s, ids, n, &b->token, NULL, err);
}

/*
 * The step inputs of B[0..n) (T tokens) into S0's values: ids, then
 * positions. For a mixed step (a chunk, or a sequence whose result is
 * skipped) also COLS (n + 1 offsets) and ROWS (T flags: the columns whose
 * logits are wanted); their count.
 */
static int64_t batch_inputs(struct q4kh_session *s0, const struct q4kh_batch_seq *b, int32_t n,
                            int64_t t, int32_t *cols, uint8_t *rows)
{
	int64_t c = 0, n_out = 0;

	for (int32_t j = 0; j < n; j++) {
		int32_t nj;
		const int32_t *ids = batch_ids(&b[j], &nj);

		if (cols)
			cols[j] = (int32_t)c;
		for (int32_t k = 0; k < nj; k++) {
			s0->values[c + k] = ids[k];
			s0->values[t + c + k] = (int32_t)(b[j].s->n_past + k);
		}
		c += nj;
		if (rows)
			rows[c - 1] = !b[j].skip;
		n_out += !b[j].skip;
	}
	if (cols)
		cols[n] = (int32_t)c;
	return n_out;
}

/*
 * With a paged cache: each sequence's pages for its tokens, their slots
 * and its table into S0's values after its ids and positions
 * (paged_inputs). 0, or -1 with err and every table as it was.
 */
static int batch_tables(struct q4kh_session *s0, const struct q4kh_batch_seq *b, int32_t n,
                        int64_t t, struct q4kh_error *err)
{
	int64_t c = 0;

	for (int32_t j = 0; j < n; j++) {
		int32_t nj;

		batch_ids(&b[j], &nj);
		if (paged_inputs(b[j].s, s0->values + t + c, nj, s0->values + 2 * t + c,
		                 s0->values + 3 * t + (int64_t)j * s0->n_table, err)) {
			while (j >= 0)
				rewind_table(b[j--].s);
			return -1;
		}
		c += nj;
	}
	return 0;
}

int q4kh_session_eval_batch(struct q4kh_batch_seq *b, int32_t n, struct q4kh_error *err)
{
	struct q4kh_session *s0;
	const struct q4kh_session **ss;
	struct q4kh_session_graph *sg;
	const struct q4kh_tensor *lg;
	struct q4kh_seqs seq;
	int32_t *cols = NULL;
	uint8_t *rows = NULL;
	int64_t t = 0, n_out, k = 0;
	int mixed = 0, rc = -1;

	if (n < 1)
		return q4kh_fail(err, "a batched step of %d sequences", n);
	s0 = b[0].s;
	if (n == 1)
		return eval_alone(b, err);
	if (batch_check(b, n, &t, err))
		return -1;
	for (int32_t j = 0; j < n; j++)
		mixed |= b[j].skip || b[j].n_ids > 1;
	ss = malloc(sizeof(*ss) * (size_t)n);
	if (mixed) {
		cols = malloc(sizeof(*cols) * (size_t)(n + 1));
		rows = calloc((size_t)t, 1);
	}
	if (!ss || (mixed && (!cols || !rows))) {
		q4kh_fail(err, "out of memory");
		goto out;
	}
	for (int32_t j = 0; j < n; j++)
		ss[j] = b[j].s;
	n_out = batch_inputs(s0, b, n, t, cols, rows);
	seq = (struct q4kh_seqs){ .m = s0->m, .n = n, .s = ss, .cols = cols };
	sg = graph_for(s0, &seq, t, n_out, rows, err);
	if (!sg || (s0->p.paged && batch_tables(s0, b, n, t, err)))
		goto out;
	if (q4kh_backend_check(s0->b,
	                       s0->b->v->buffer_upload(s0->b->dev, s0->step, 0, s0->values,
	                                               sizeof(int32_t) * step_values(s0, t, n)),
	                       "buffer_upload (step inputs)", err) ||
	    run_graph(s0, sg, &(struct q4kh_step_values){ s0->values, s0->values + t }, err)) {
		for (int32_t j = 0; j < n; j++)
			rewind_table(b[j].s);
		goto out;
	}
	lg = n_out ? &sg->g->vals[sg->g->logits].t : NULL;
	for (int32_t j = 0; j < n; j++) {
		struct q4kh_tensor col;

		if (b[j].skip)
			continue;
		col = q4kh_tensor_cols(lg, k++, 1);
		if (b[j].logits ? download(s0, &col, b[j].logits, "buffer_download (logits)", err)
		                : pick(s0, &col, &b[j].token, NULL, err))
			goto out;
	}
	for (int32_t j = 0; j < n; j++) {
		int32_t nj;

		batch_ids(&b[j], &nj);
		b[j].s->n_past += nj;
	}
	rc = 0;
out:
	free(ss);
	free(cols);
	free(rows);
	return rc;
}
