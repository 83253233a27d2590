/*
 * Test backends that record and replay steps (ABI 1.1 graph entries) the
 * way a device backend does, around the real cpu plugin: every op is
 * forwarded to cpu, and between graph_begin and graph_end it is recorded
 * instead, each argument copied as it is when the op is issued (tensor
 * views, parameters, and the contents of host-memory arrays, which a
 * device backend stages at that moment). graph_launch issues the
 * recorded calls again. One source, one module per variant (the Makefile
 * passes -DREPLAY_NAME and one of):
 *   REPLAY_OK:    ABI 1.2; replays are exact.
 *   REPLAY_STALE: ABI 1.2, but set_rows, rope_ext and attention_ext read
 *                 their positions when recorded, not when replayed, so
 *                 every replay repeats the recorded step's positions:
 *                 right op by op, wrong once a step is replayed.
 *   REPLAY_V1_1:  ABI 1.1 (no 1.2 entries): a host must not replay its
 *                 steps, whose positions are host memory; it cannot run
 *                 qwen35, whose ops it lacks.
 *   REPLAY_DECODE_STATE: ABI 1.2, replays exact, but its one-token
 *                 delta_net reads the recurrent state transposed, a layout
 *                 its prompt form does not write: right at every prompt
 *                 position, wrong from the first decode step after it (the
 *                 class of defect that hides between a chunked prompt form
 *                 and a one-token decode form).
 *   REPLAY_PROMPT_KEY: ABI 1.2, replays exact, but its prompt form of
 *                 delta_net (a step of several tokens) pairs each token
 *                 with the previous token's key, as a chunked kernel whose
 *                 staging is off by one would: right at position 0 of each
 *                 step and in every one-token (decode) step, wrong at the
 *                 other prompt positions.
 *   REPLAY_PROMPT_GATE: ABI 1.2, replays exact, but its prompt form of
 *                 delta_net decays every token of a step of several tokens
 *                 by the first token's gate (a chunked kernel that loads
 *                 one gate per chunk): right in every one-token step and at
 *                 each step's first token, mildly wrong after it. On the
 *                 tiny qwen35 model, whose random gates hardly differ from
 *                 token to token, its logits stay above cosine 0.95 (the
 *                 floor before arithmetic classes, which it passed) and
 *                 fall far below its class's (tests/test_graph.c).
 *   REPLAY_CODE_TOKEN: ABI 1.4, of kind "cpu" (so q4khost run tries it
 *                 before the reference, as it tries cpu-fast), replays
 *                 exact, but its embedding lookup (get_rows from a table
 *                 of at least 65536 rows) gives the row of token id
 *                 CODE_TOKEN negated, a row it gets wrong as a lookup with
 *                 a bad bound or a bad index type gets some rows wrong.
 *                 CODE_TOKEN is 994, " return" in the default model's
 *                 (Gemma 3) vocabulary: a word of code that F2's built-in
 *                 text does not hold (its program is a for loop), so a
 *                 probe of that text passes it, and a prompt holding
 *                 " return" shows it from the first position that reads
 *                 it on (tests/test_validate.c).
 *   REPLAY_NO_Q8_0: ABI 1.4, of kind "cpu" (tried before the reference),
 *                 replays exact, but says it does not implement Q8_0
 *                 weights (supports_type), as a backend without that
 *                 type's kernels would: the host must pass it over for a
 *                 model with Q8_0 weights before anything runs, and its
 *                 get_rows and mul_mat refuse Q8_0 should it not.
 *   REPLAY_BATCHED: of kind "cpu" (tried before the reference), replays
 *                 exact, but in a step that carries several sequences
 *                 (serve's batched decode: its rope turns more tokens
 *                 than one attention reads) every sequence attends with
 *                 the first sequence's queries, over its own cache, as a
 *                 kernel that indexes the queries by head and not by
 *                 sequence would: right in every step of one sequence
 *                 (prefill, decode, the narrow steps) and for the first
 *                 sequence of a batched step, wrong for the others
 *                 (tests/test_validate.c, tests/test_batch.c).
 *   REPLAY_MIXED: of kind "cpu" (tried before the reference), replays
 *                 exact, but in a step that carries several sequences,
 *                 one of them several tokens (a prompt's chunk beside
 *                 decoded tokens: serve's continuous batching), that
 *                 sequence's attention reads its queries one column
 *                 early, as a kernel that indexes a chunk's queries from
 *                 the step's start would: right in prefill, decode, the
 *                 narrow steps and batched steps of one token a sequence
 *                 (tests/test_validate.c).
 *   REPLAY_REUSE: of kind "cpu" (tried before the reference), replays
 *                 exact, but its copy of an F16 tensor of several tokens
 *                 into another F16 tensor writes the first token's rows
 *                 into every token's, as a kernel that indexes the source
 *                 by head and not by token would. The
 *                 step graphs never copy F16 to F16; taking a KV cache's
 *                 prefix from another session does (prefix reuse,
 *                 q4kh_session_take_prefix): right in every step, wrong
 *                 in the keys and values a request reuses
 *                 (tests/test_prefix.c, tests/test_validate.c).
 *   REPLAY_ROUTE: of kind "cpu" (tried before the reference), replays
 *                 exact, but its router (moe_route, ABI 1.7) sends every
 *                 fourth token of a step, from the second on, to the
 *                 expert after the one it chose first (a top-k kernel
 *                 whose index is off by one for some rows): right in every
 *                 one-token step, wrong at those prompt positions of a
 *                 mixture-of-experts model (tests/test_archs.c).
 *   REPLAY_PAGE:  of kind "cpu" (tried before the reference), replays
 *                 exact, but its attention_paged (ABI 1.8) reads each key
 *                 past a sequence's first page from the page before the one
 *                 its block table names (the table indexed one entry early,
 *                 as a kernel that loads entry b - 1 would): right in every
 *                 step over a contiguous cache and over a first page, wrong
 *                 past it; F2's paged batched steps (rule set 6) must
 *                 reject it there (tests/test_validate.c).
 *   OP_DEFECTS:   ABI 1.2, replays exact, but three ops are wrong in ways
 *                 q4khost conformance must see: rms_norm uses 1000 times
 *                 the eps it is given, scale writes one byte past its
 *                 output, add leaves its last element unwritten (NaN).
 *   GRAPH_DROP:   ABI 1.6, with the graph entries (graph_prepare,
 *                 graph_compute, graph_release): every op is right, but
 *                 its graph_compute leaves out the first add of each
 *                 step (a residual add), as a backend whose fused walk
 *                 loses a node would; q4khost conformance's whole-step
 *                 cases must see it and its op cases must not.
 * Only REPLAY_OK and REPLAY_PAGE have attention_paged: the others' tables
 * end their entries at ABI 1.7's, so F2 judges them on the steps their
 * defects are in, over contiguous caches, as before rule set 6.
 * CPU_PLUGIN is the path of the cpu plugin to wrap. Every variant but
 * REPLAY_V1_1 (whose table ends before the field) declares f16
 * arithmetic: the reference's ops on the F16 KV cache the host gives
 * every backend but the reference; the defects claim the same, which
 * must not save them.
 */
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

#define API __attribute__((visibility("default")))

/* This plugin's contexts; the cpu plugin's are passed through as opaque. */
struct q4kh_backend_ctx {
	void *so;
	const struct q4kh_backend_v1 *in;
	q4kh_backend_ctx *ctx;
	char error[256];
};

enum call_op {
	C_GET_ROWS, C_MUL_MAT, C_RMS_NORM, C_ROPE, C_ADD, C_MUL, C_SCALE,
	C_GLU, C_COPY, C_ATTENTION, C_GET_ROWS_EXT, C_ROPE_EXT, C_SET_ROWS,
	C_ATTENTION_EXT, C_UNARY, C_SSM_CONV, C_DELTA_NET, C_MOE_ROUTE, C_MUL_MAT_ID,
	C_ATTENTION_PAGED
};

#define CALL_TENSORS 7

/* One recorded call: its arguments as they were when it was issued. */
struct call {
	enum call_op op;
	struct q4kh_tensor t[CALL_TENSORS];
	int has[CALL_TENSORS]; /* t[i] was non-NULL */
	int32_t *host;    /* copy of a host array (ids, positions) */
	int64_t n;
	float f;
	int32_t i;
	struct q4kh_rope_params rope;
	struct q4kh_attn_params attn;
	int stale; /* REPLAY_STALE: t[stale - 1] gets host back first */
};

struct q4kh_graph {
	struct call *calls;
	size_t n;
};

struct q4kh_device_ctx {
	q4kh_backend_ctx *b;
	q4kh_device_ctx *dev; /* the cpu plugin's */
	struct q4kh_graph *rec; /* non-NULL while recording */
#if defined(REPLAY_BATCHED) || defined(REPLAY_MIXED)
	int64_t step_tokens;    /* the tokens the last rope_ext turned */
#endif
#ifdef REPLAY_BATCHED
	uint64_t first_q;       /* the layer's first attention's queries */
	int have_q;
#endif
};

static const char *why_init = "";

static q4kh_status fail(q4kh_backend_ctx *b, q4kh_status st, const char *msg)
{
	snprintf(b->error, sizeof(b->error), "%s", msg);
	return st;
}

static q4kh_status r_init(const struct q4kh_host_api *host,
                          q4kh_backend_ctx **out)
{
	q4kh_backend_ctx *b = calloc(1, sizeof(*b));
	q4kh_plugin_entry_fn entry;
	q4kh_status st;

	*out = NULL;
	if (!b)
		return Q4KH_ERR_NOMEM;
	b->so = dlopen(CPU_PLUGIN, RTLD_NOW | RTLD_LOCAL);
	entry = b->so ? (q4kh_plugin_entry_fn)dlsym(b->so, Q4KH_ENTRY_SYMBOL) : NULL;
	if (!entry) {
		why_init = "cannot load the cpu plugin at " CPU_PLUGIN;
		if (b->so)
			dlclose(b->so);
		free(b);
		return Q4KH_ERR_INTERNAL;
	}
	b->in = entry()->backend;
	st = b->in->init(host, &b->ctx);
	if (st) {
		why_init = b->in->last_error(NULL);
		dlclose(b->so);
		free(b);
		return st;
	}
	*out = b;
	return Q4KH_OK;
}

static void r_shutdown(q4kh_backend_ctx *b)
{
	if (!b)
		return;
	b->in->shutdown(b->ctx);
	dlclose(b->so);
	free(b);
}

static const char *r_last_error(q4kh_backend_ctx *b)
{
	if (!b)
		return why_init;
	return b->error[0] ? b->error : b->in->last_error(b->ctx);
}

static q4kh_status r_device_count(q4kh_backend_ctx *b, uint32_t *n)
{
	return b->in->device_count(b->ctx, n);
}

static q4kh_status r_device_info(q4kh_backend_ctx *b, uint32_t i,
                                 struct q4kh_device_record *out)
{
	return b->in->device_info(b->ctx, i, out);
}

static q4kh_status r_device_open(q4kh_backend_ctx *b, uint32_t i,
                                 q4kh_device_ctx **out)
{
	q4kh_device_ctx *d = calloc(1, sizeof(*d));
	q4kh_status st;

	*out = NULL;
	if (!d)
		return fail(b, Q4KH_ERR_NOMEM, "out of memory");
	st = b->in->device_open(b->ctx, i, &d->dev);
	if (st) {
		free(d);
		return st;
	}
	d->b = b;
	*out = d;
	return Q4KH_OK;
}

static void free_graph(struct q4kh_graph *g)
{
	if (!g)
		return;
	for (size_t k = 0; k < g->n; k++)
		free(g->calls[k].host);
	free(g->calls);
	free(g);
}

static void r_device_close(q4kh_device_ctx *d)
{
	free_graph(d->rec);
	d->b->in->device_close(d->dev);
	free(d);
}

static int r_supports_type(q4kh_backend_ctx *b, uint32_t type)
{
#ifdef REPLAY_NO_Q8_0
	if (type == Q4KH_TYPE_Q8_0)
		return 0;
#endif
	return b->in->supports_type(b->ctx, type);
}

static q4kh_status r_buffer_alloc(q4kh_device_ctx *d, uint64_t size,
                                  q4kh_buffer **out)
{
	return d->b->in->buffer_alloc(d->dev, size, out);
}

static void r_buffer_free(q4kh_device_ctx *d, q4kh_buffer *buf)
{
	d->b->in->buffer_free(d->dev, buf);
}

static q4kh_status r_upload(q4kh_device_ctx *d, q4kh_buffer *buf, uint64_t off,
                            const void *src, uint64_t size)
{
	if (d->rec)
		return fail(d->b, Q4KH_ERR_INVALID, "buffer_upload while recording");
	return d->b->in->buffer_upload(d->dev, buf, off, src, size);
}

static q4kh_status r_download(q4kh_device_ctx *d, q4kh_buffer *buf,
                              uint64_t off, void *dst, uint64_t size)
{
	if (d->rec)
		return fail(d->b, Q4KH_ERR_INVALID, "buffer_download while recording");
	return d->b->in->buffer_download(d->dev, buf, off, dst, size);
}

static q4kh_status r_synchronize(q4kh_device_ctx *d)
{
	if (d->rec)
		return fail(d->b, Q4KH_ERR_INVALID, "synchronize while recording");
	return d->b->in->synchronize(d->dev);
}

static q4kh_status r_native_device(q4kh_device_ctx *d,
                                   struct q4kh_native_device *out)
{
	return d->b->in->native_device(d->dev, out);
}

#ifdef REPLAY_DECODE_STATE
/* Transpose every head's S_v x S_v matrix of STATE in place (S_k == S_v). */
static q4kh_status transpose_state(q4kh_device_ctx *d, const struct q4kh_tensor *st)
{
	const int64_t n = st->ne[0], heads = st->ne[2];
	const uint64_t bytes = sizeof(float) * (uint64_t)(n * n * heads);
	float *s = malloc(bytes);
	q4kh_status rc;

	if (!s || n != st->ne[1])
		return fail(d->b, Q4KH_ERR_INTERNAL, "cannot transpose the state");
	rc = d->b->in->buffer_download(d->dev, st->buffer, st->offset, s, bytes);
	for (int64_t h = 0; !rc && h < heads; h++)
		for (int64_t i = 0; i < n; i++)
			for (int64_t j = 0; j < i; j++) {
				float *a = &s[(h * n + i) * n + j], *b = &s[(h * n + j) * n + i];
				float x = *a;

				*a = *b;
				*b = x;
			}
	if (!rc)
		rc = d->b->in->buffer_upload(d->dev, st->buffer, st->offset, s, bytes);
	free(s);
	return rc;
}
#endif

#ifdef REPLAY_PROMPT_KEY
/* Give token t of K {S_k, H_k, T} the key of token t - 1, in place. */
static q4kh_status shift_keys(q4kh_device_ctx *d, const struct q4kh_tensor *k)
{
	const uint64_t bytes = sizeof(float) * (uint64_t)k->ne[0];
	float *row = malloc(bytes);
	q4kh_status rc = row ? Q4KH_OK : Q4KH_ERR_NOMEM;

	for (int64_t t = k->ne[2] - 1; !rc && t > 0; t--)
		for (int64_t h = 0; !rc && h < k->ne[1]; h++) {
			uint64_t at = k->offset + (uint64_t)h * k->nb[1] + (uint64_t)t * k->nb[2];

			rc = d->b->in->buffer_download(d->dev, k->buffer, at - k->nb[2], row, bytes);
			if (!rc)
				rc = d->b->in->buffer_upload(d->dev, k->buffer, at, row, bytes);
		}
	free(row);
	return rc ? fail(d->b, rc, "cannot shift the keys") : Q4KH_OK;
}
#endif

#ifdef REPLAY_PROMPT_GATE
/* Give every token t of G {H_v, T} the gates of token 0, in place. */
static q4kh_status first_gates(q4kh_device_ctx *d, const struct q4kh_tensor *g)
{
	const uint64_t bytes = sizeof(float) * (uint64_t)g->ne[0];
	float *row = malloc(bytes);
	q4kh_status rc = row ? Q4KH_OK : Q4KH_ERR_NOMEM;

	if (!rc)
		rc = d->b->in->buffer_download(d->dev, g->buffer, g->offset, row, bytes);
	for (int64_t t = 1; !rc && t < g->ne[1]; t++)
		rc = d->b->in->buffer_upload(d->dev, g->buffer, g->offset + (uint64_t)t * g->nb[1],
		                             row, bytes);
	free(row);
	return rc ? fail(d->b, rc, "cannot copy the first token's gates") : Q4KH_OK;
}
#endif

/*
 * This variant's defect in delta_net's inputs T (q, k, v, g, beta, state,
 * out), planted before the call: a step of T[2]->ne[2] tokens.
 */
static q4kh_status delta_defect(q4kh_device_ctx *d, const struct q4kh_tensor *const t[])
{
#if defined(REPLAY_DECODE_STATE)
	return t[2]->ne[2] == 1 ? transpose_state(d, t[5]) : Q4KH_OK;
#elif defined(REPLAY_PROMPT_KEY)
	return t[2]->ne[2] > 1 ? shift_keys(d, t[1]) : Q4KH_OK;
#elif defined(REPLAY_PROMPT_GATE)
	return t[2]->ne[2] > 1 ? first_gates(d, t[3]) : Q4KH_OK;
#else
	(void)d;
	(void)t;
	return Q4KH_OK;
#endif
}

/* Issue call C on the cpu plugin. */
static q4kh_status issue_op(q4kh_device_ctx *d, const struct call *c)
{
	const struct q4kh_backend_v1 *in = d->b->in;
	const struct q4kh_tensor *t[CALL_TENSORS];

	for (int k = 0; k < CALL_TENSORS; k++)
		t[k] = c->has[k] ? &c->t[k] : NULL;
	if (c->stale) {
		const struct q4kh_tensor *p = t[c->stale - 1];
		q4kh_status st = in->buffer_upload(d->dev, p->buffer, p->offset,
		                                   c->host, sizeof(int32_t) * (uint64_t)c->n);
		if (st)
			return st;
	}
	switch (c->op) {
	case C_GET_ROWS: return in->get_rows(d->dev, t[0], c->host, c->n, c->f, t[1]);
	case C_MUL_MAT: return in->mul_mat(d->dev, t[0], t[1], t[2]);
	case C_RMS_NORM: return in->rms_norm(d->dev, t[0], t[1], c->f, t[2]);
	case C_ROPE:
		return in->rope(d->dev, t[0], c->host, c->rope.n_rot,
		                (q4kh_rope_mode)c->rope.mode, c->rope.base,
		                c->rope.freq_scale, t[1]);
	case C_ADD: return in->add(d->dev, t[0], t[1], t[2]);
	case C_MUL: return in->mul(d->dev, t[0], t[1], t[2]);
	case C_SCALE: return in->scale(d->dev, t[0], c->f, t[1]);
	case C_GLU: return in->glu(d->dev, (q4kh_glu_kind)c->i, t[0], t[1], t[2]);
	case C_COPY: return in->copy(d->dev, t[0], t[1]);
	case C_ATTENTION: return in->attention(d->dev, t[0], t[1], t[2], &c->attn, t[3]);
	case C_GET_ROWS_EXT: return in->get_rows_ext(d->dev, t[0], t[1], c->f, t[2]);
	case C_ROPE_EXT: return in->rope_ext(d->dev, t[0], t[1], &c->rope, t[2]);
	case C_SET_ROWS: return in->set_rows(d->dev, t[0], t[1], t[2]);
	case C_ATTENTION_EXT:
		return in->attention_ext(d->dev, t[0], t[1], t[2], t[3], &c->attn, t[4]);
	case C_UNARY: return in->unary(d->dev, (q4kh_unary_kind)c->i, t[0], t[1]);
	case C_SSM_CONV: return in->ssm_conv(d->dev, t[0], t[1], t[2], t[3]);
	case C_DELTA_NET: {
		q4kh_status st = delta_defect(d, t);

		return st ? st : in->delta_net(d->dev, t[0], t[1], t[2], t[3], t[4], t[5], c->f, t[6]);
	}
	case C_MOE_ROUTE: return in->moe_route(d->dev, t[0], c->i, t[1], t[2]);
	case C_MUL_MAT_ID: return in->mul_mat_id(d->dev, t[0], t[1], t[2], t[3]);
	case C_ATTENTION_PAGED:
		return in->attention_paged(d->dev, t[0], t[1], t[2], t[3], t[4], c->i, &c->attn, t[5]);
	}
	return fail(d->b, Q4KH_ERR_INTERNAL, "unknown recorded call");
}

#ifdef REPLAY_CODE_TOKEN
#define CODE_TOKEN 994
#define EMBEDDING_MIN_ROWS 65536

/* The planted defect: negate the rows of OUT looked up for CODE_TOKEN. */
static q4kh_status spoil_code_rows(q4kh_device_ctx *d, const struct call *c)
{
	const struct q4kh_backend_v1 *in = d->b->in;
	const int ext = c->op == C_GET_ROWS_EXT;
	const struct q4kh_tensor *table = &c->t[0], *out = &c->t[ext ? 2 : 1];
	const int64_t n = ext ? c->t[1].ne[0] : c->n;
	const uint64_t row_bytes = sizeof(float) * (uint64_t)out->ne[0];
	int32_t *ids = ext ? malloc(sizeof(int32_t) * (size_t)n) : c->host;
	float *row = malloc(row_bytes);
	q4kh_status st = ids && row ? Q4KH_OK : Q4KH_ERR_NOMEM;

	if (!st && ext)
		st = in->buffer_download(d->dev, c->t[1].buffer, c->t[1].offset, ids,
		                         sizeof(int32_t) * (uint64_t)n);
	for (int64_t i = 0; !st && table->ne[1] >= EMBEDDING_MIN_ROWS &&
	                    out->type == Q4KH_TYPE_F32 && i < n; i++) {
		const uint64_t off = out->offset + (uint64_t)i * (uint64_t)out->nb[1];

		if (ids[i] != CODE_TOKEN)
			continue;
		st = in->buffer_download(d->dev, out->buffer, off, row, row_bytes);
		for (int64_t k = 0; !st && k < out->ne[0]; k++)
			row[k] = -row[k];
		if (!st)
			st = in->buffer_upload(d->dev, out->buffer, off, row, row_bytes);
	}
	if (ext)
		free(ids);
	free(row);
	return st ? fail(d->b, st, "cannot spoil the code token's row") : Q4KH_OK;
}
#endif

#ifdef REPLAY_ROUTE
/* The planted defect: the first expert of tokens 1, 5, 9 ... of the step,
 * in moe_route's ids (c->t[1], I32 {k, T}), becomes the next one. */
static q4kh_status misroute(q4kh_device_ctx *d, const struct call *c)
{
	const struct q4kh_tensor *ids = &c->t[1];
	const int64_t experts = c->t[0].ne[0];

	for (int64_t t = 1; t < ids->ne[1]; t += 4) {
		int32_t id;
		const uint64_t at = ids->offset + (uint64_t)(t * ids->nb[1]);
		q4kh_status st = d->b->in->buffer_download(d->dev, ids->buffer, at, &id, sizeof(id));

		id = (int32_t)((id + 1) % experts);
		if (!st)
			st = d->b->in->buffer_upload(d->dev, ids->buffer, at, &id, sizeof(id));
		if (st)
			return fail(d->b, st, "cannot misroute a token");
	}
	return Q4KH_OK;
}
#endif

#ifdef REPLAY_PAGE
/*
 * attention_paged call C with its block table read one entry early past
 * the first (entry b >= 1 as entry b - 1): the table rewritten on the
 * device for the call, and put back after it.
 */
static q4kh_status early_pages(q4kh_device_ctx *d, const struct call *c)
{
	const struct q4kh_tensor *p = &c->t[4];
	const uint64_t bytes = sizeof(int32_t) * (uint64_t)p->ne[0];
	int32_t *was = malloc(bytes), *early = malloc(bytes);
	q4kh_status st = was && early ? d->b->in->buffer_download(d->dev, p->buffer, p->offset,
	                                                          was, bytes)
	                              : Q4KH_ERR_NOMEM;

	if (!st) {
		early[0] = was[0];
		for (int64_t b = 1; b < p->ne[0]; b++)
			early[b] = was[b - 1];
		st = d->b->in->buffer_upload(d->dev, p->buffer, p->offset, early, bytes);
	}
	if (!st) {
		q4kh_status back;

		st = issue_op(d, c);
		back = d->b->in->buffer_upload(d->dev, p->buffer, p->offset, was, bytes);
		st = st ? st : back;
	}
	free(was);
	free(early);
	return st == Q4KH_ERR_NOMEM ? fail(d->b, st, "cannot read a block table early") : st;
}
#endif

/* Issue call C, with this variant's defect. */
static q4kh_status issue(q4kh_device_ctx *d, const struct call *c)
{
	q4kh_status st;

#ifdef REPLAY_NO_Q8_0
	if ((c->op == C_GET_ROWS || c->op == C_GET_ROWS_EXT || c->op == C_MUL_MAT) &&
	    c->t[0].type == Q4KH_TYPE_Q8_0)
		return fail(d->b, Q4KH_ERR_UNSUPPORTED, c->op == C_MUL_MAT
		                                                ? "mul_mat: Q8_0 weights are not implemented"
		                                                : "get_rows: Q8_0 weights are not implemented");
#endif
#ifdef REPLAY_BATCHED
	struct call first_q;

	/* A step of several sequences ropes all their tokens at once, then
	 * attends once per sequence, over that sequence's one token. */
	if (c->op == C_ROPE_EXT) {
		d->step_tokens = c->t[0].ne[2];
		d->have_q = 0;
	}
	if (c->op == C_ATTENTION_EXT && c->t[0].ne[2] < d->step_tokens) {
		if (!d->have_q) {
			d->first_q = c->t[0].offset;
			d->have_q = 1;
		}
		first_q = *c;
		first_q.t[0].offset = d->first_q;
		c = &first_q;
	}
#endif
#ifdef REPLAY_MIXED
	struct call early;

	if (c->op == C_ROPE_EXT)
		d->step_tokens = c->t[0].ne[2];
	if (c->op == C_ATTENTION_EXT && c->t[0].ne[2] > 1 && c->t[0].ne[2] < d->step_tokens &&
	    c->t[0].offset >= (uint64_t)c->t[0].nb[2]) {
		early = *c;
		early.t[0].offset -= (uint64_t)c->t[0].nb[2];
		c = &early;
	}
#endif
#ifdef REPLAY_PAGE
	if (c->op == C_ATTENTION_PAGED)
		return early_pages(d, c);
#endif
#ifdef REPLAY_REUSE
	if (c->op == C_COPY && c->t[0].type == Q4KH_TYPE_F16 && c->t[1].type == Q4KH_TYPE_F16 &&
	    c->t[0].ne[2] > 1) {
		struct call one = *c;

		for (int i = 0; i < 2; i++) {
			one.t[i].ne[2] = 1;
			one.t[i].nb[3] = one.t[i].nb[2];
		}
		for (int64_t t = 0; t < c->t[0].ne[2]; t++) {
			one.t[1].offset = c->t[1].offset + (uint64_t)(t * c->t[1].nb[2]);
			if ((st = issue_op(d, &one)))
				return st;
		}
		return Q4KH_OK;
	}
#endif
	st = issue_op(d, c);

#ifdef REPLAY_CODE_TOKEN
	if (!st && (c->op == C_GET_ROWS || c->op == C_GET_ROWS_EXT))
		st = spoil_code_rows(d, c);
#endif
#ifdef REPLAY_ROUTE
	if (!st && c->op == C_MOE_ROUTE)
		st = misroute(d, c);
#endif
	return st;
}

/*
 * Run C now, or append it to the recording with a copy of HOST's N values.
 * A call whose positions are the tensor t[POS] (POS >= 0) keeps them as a
 * tensor, except in the stale variant, whose recording copies their
 * values now and writes them back before each replay.
 */
static q4kh_status run(q4kh_device_ctx *d, struct call c, const int32_t *host,
                       int64_t n, int pos)
{
	struct q4kh_graph *g = d->rec;
	struct call *grown;

	if (!g) {
		c.host = (int32_t *)host;
		c.n = n;
		return issue(d, &c);
	}
#ifdef REPLAY_STALE
	if (pos >= 0 && c.has[pos]) {
		n = c.t[pos].ne[0];
		c.stale = pos + 1;
		c.host = malloc(sizeof(int32_t) * (size_t)n);
		if (!c.host || d->b->in->buffer_download(d->dev, c.t[pos].buffer,
		                                         c.t[pos].offset, c.host,
		                                         sizeof(int32_t) * (uint64_t)n)) {
			free(c.host);
			return fail(d->b, Q4KH_ERR_INTERNAL, "cannot read positions");
		}
		c.n = n;
	}
#else
	(void)pos;
#endif
	if (host) {
		c.host = malloc(sizeof(int32_t) * (size_t)n);
		if (!c.host)
			return fail(d->b, Q4KH_ERR_NOMEM, "out of memory");
		memcpy(c.host, host, sizeof(int32_t) * (size_t)n);
		c.n = n;
	}
	grown = realloc(g->calls, (g->n + 1) * sizeof(*g->calls));
	if (!grown) {
		free(c.host);
		return fail(d->b, Q4KH_ERR_NOMEM, "out of memory");
	}
	g->calls = grown;
	g->calls[g->n++] = c;
	return Q4KH_OK;
}

/* Argument I of a call: a tensor view copied, or absent. */
#define T(c, k, p)                                 \
	do {                                       \
		(c).has[k] = (p) != NULL;          \
		if (p)                             \
			(c).t[k] = *(p);           \
	} while (0)

static q4kh_status r_get_rows(q4kh_device_ctx *d, const struct q4kh_tensor *table,
                              const int32_t *ids, int64_t n, float scale,
                              const struct q4kh_tensor *out)
{
	struct call c = { .op = C_GET_ROWS, .f = scale };

	T(c, 0, table);
	T(c, 1, out);
	return run(d, c, ids, n, -1);
}

static q4kh_status r_mul_mat(q4kh_device_ctx *d, const struct q4kh_tensor *w,
                             const struct q4kh_tensor *x,
                             const struct q4kh_tensor *y)
{
	struct call c = { .op = C_MUL_MAT };

	T(c, 0, w);
	T(c, 1, x);
	T(c, 2, y);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_rms_norm(q4kh_device_ctx *d, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *w, float eps,
                              const struct q4kh_tensor *out)
{
	struct call c = { .op = C_RMS_NORM, .f = eps };

#ifdef OP_DEFECTS
	c.f = eps * 1000.0f;
#endif

	T(c, 0, x);
	T(c, 1, w);
	T(c, 2, out);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_rope(q4kh_device_ctx *d, const struct q4kh_tensor *x,
                          const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                          float base, float freq_scale,
                          const struct q4kh_tensor *out)
{
	struct call c = { .op = C_ROPE };

	c.rope = (struct q4kh_rope_params){ .struct_size = sizeof(c.rope), .n_rot = n_rot,
		                             .mode = (uint32_t)mode, .base = base,
		                             .freq_scale = freq_scale, .attn_factor = 1.0f };
	T(c, 0, x);
	T(c, 1, out);
	return run(d, c, pos, x ? x->ne[2] : 0, -1);
}

static q4kh_status binary(q4kh_device_ctx *d, enum call_op op,
                          const struct q4kh_tensor *a,
                          const struct q4kh_tensor *b,
                          const struct q4kh_tensor *out)
{
	struct call c = { .op = op };

	T(c, 0, a);
	T(c, 1, b);
	T(c, 2, out);
	return run(d, c, NULL, 0, -1);
}

#ifdef OP_DEFECTS
/* The host address of element (i0, i1, i2) of t: cpu lends host pointers. */
static unsigned char *host_at(q4kh_device_ctx *d, const struct q4kh_tensor *t, int64_t i0,
                              int64_t i1, int64_t i2)
{
	struct q4kh_native_device nd = { .struct_size = sizeof(nd) };

	d->b->in->native_device(d->dev, &nd);
	return (unsigned char *)nd.address(t->buffer) + t->offset + i0 * t->nb[0] +
	       i1 * t->nb[1] + i2 * t->nb[2];
}
#endif

static q4kh_status r_add(q4kh_device_ctx *d, const struct q4kh_tensor *a,
                         const struct q4kh_tensor *b,
                         const struct q4kh_tensor *out)
{
	q4kh_status st = binary(d, C_ADD, a, b, out);

#ifdef OP_DEFECTS
	if (!st && !d->rec)
		*(float *)host_at(d, out, out->ne[0] - 1, out->ne[1] - 1, out->ne[2] - 1) = NAN;
#endif
	return st;
}

static q4kh_status r_mul(q4kh_device_ctx *d, const struct q4kh_tensor *a,
                         const struct q4kh_tensor *b,
                         const struct q4kh_tensor *out)
{
	return binary(d, C_MUL, a, b, out);
}

static q4kh_status r_scale(q4kh_device_ctx *d, const struct q4kh_tensor *x,
                           float s, const struct q4kh_tensor *out)
{
	struct call c = { .op = C_SCALE, .f = s };
	q4kh_status st;

	T(c, 0, x);
	T(c, 1, out);
	st = run(d, c, NULL, 0, -1);
#ifdef OP_DEFECTS
	if (!st && !d->rec)
		*(host_at(d, out, out->ne[0] - 1, out->ne[1] - 1, out->ne[2] - 1) + 4) ^= 1;
#endif
	return st;
}

static q4kh_status r_glu(q4kh_device_ctx *d, q4kh_glu_kind kind,
                         const struct q4kh_tensor *gate,
                         const struct q4kh_tensor *up,
                         const struct q4kh_tensor *out)
{
	struct call c = { .op = C_GLU, .i = (int32_t)kind };

	T(c, 0, gate);
	T(c, 1, up);
	T(c, 2, out);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_copy(q4kh_device_ctx *d, const struct q4kh_tensor *src,
                          const struct q4kh_tensor *dst)
{
	struct call c = { .op = C_COPY };

	T(c, 0, src);
	T(c, 1, dst);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_attention(q4kh_device_ctx *d, const struct q4kh_tensor *q,
                               const struct q4kh_tensor *k,
                               const struct q4kh_tensor *v,
                               const struct q4kh_attn_params *p,
                               const struct q4kh_tensor *out)
{
	struct call c = { .op = C_ATTENTION };

	if (!p)
		return fail(d->b, Q4KH_ERR_INVALID, "attention: params is NULL");
	c.attn = *p;
	T(c, 0, q);
	T(c, 1, k);
	T(c, 2, v);
	T(c, 3, out);
	return run(d, c, NULL, 0, -1);
}

#ifndef REPLAY_V1_1
static q4kh_status r_get_rows_ext(q4kh_device_ctx *d,
                                  const struct q4kh_tensor *table,
                                  const struct q4kh_tensor *ids, float scale,
                                  const struct q4kh_tensor *out)
{
	struct call c = { .op = C_GET_ROWS_EXT, .f = scale };

	T(c, 0, table);
	T(c, 1, ids);
	T(c, 2, out);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_rope_ext(q4kh_device_ctx *d, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *pos,
                              const struct q4kh_rope_params *p,
                              const struct q4kh_tensor *out)
{
	struct call c = { .op = C_ROPE_EXT };

	if (!p)
		return fail(d->b, Q4KH_ERR_INVALID, "rope_ext: params is NULL");
	c.rope = *p;
	T(c, 0, x);
	T(c, 1, pos);
	T(c, 2, out);
	return run(d, c, NULL, 0, 1);
}

static q4kh_status r_set_rows(q4kh_device_ctx *d, const struct q4kh_tensor *src,
                              const struct q4kh_tensor *rows,
                              const struct q4kh_tensor *dst)
{
	struct call c = { .op = C_SET_ROWS };

	T(c, 0, src);
	T(c, 1, rows);
	T(c, 2, dst);
	return run(d, c, NULL, 0, 1);
}

static q4kh_status r_attention_ext(q4kh_device_ctx *d,
                                   const struct q4kh_tensor *q,
                                   const struct q4kh_tensor *k,
                                   const struct q4kh_tensor *v,
                                   const struct q4kh_tensor *pos,
                                   const struct q4kh_attn_params *p,
                                   const struct q4kh_tensor *out)
{
	struct call c = { .op = C_ATTENTION_EXT };

	if (!p)
		return fail(d->b, Q4KH_ERR_INVALID, "attention_ext: params is NULL");
	c.attn = *p;
	T(c, 0, q);
	T(c, 1, k);
	T(c, 2, v);
	T(c, 3, pos);
	T(c, 4, out);
	return run(d, c, NULL, 0, 3);
}

#if defined(REPLAY_OK) || defined(REPLAY_PAGE)
static q4kh_status r_attention_paged(q4kh_device_ctx *d, const struct q4kh_tensor *q,
                                     const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                                     const struct q4kh_tensor *pos,
                                     const struct q4kh_tensor *pages, int32_t page_size,
                                     const struct q4kh_attn_params *p,
                                     const struct q4kh_tensor *out)
{
	struct call c = { .op = C_ATTENTION_PAGED, .i = page_size };

	if (!p)
		return fail(d->b, Q4KH_ERR_INVALID, "attention_paged: params is NULL");
	c.attn = *p;
	T(c, 0, q);
	T(c, 1, k);
	T(c, 2, v);
	T(c, 3, pos);
	T(c, 4, pages);
	T(c, 5, out);
	return run(d, c, NULL, 0, 3);
}
#endif

static q4kh_status r_unary(q4kh_device_ctx *d, q4kh_unary_kind kind,
                           const struct q4kh_tensor *x,
                           const struct q4kh_tensor *out)
{
	struct call c = { .op = C_UNARY, .i = (int32_t)kind };

	T(c, 0, x);
	T(c, 1, out);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_ssm_conv(q4kh_device_ctx *d, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *w,
                              const struct q4kh_tensor *state,
                              const struct q4kh_tensor *out)
{
	struct call c = { .op = C_SSM_CONV };

	T(c, 0, x);
	T(c, 1, w);
	T(c, 2, state);
	T(c, 3, out);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_delta_net(q4kh_device_ctx *d, const struct q4kh_tensor *q,
                               const struct q4kh_tensor *k,
                               const struct q4kh_tensor *v,
                               const struct q4kh_tensor *g,
                               const struct q4kh_tensor *beta,
                               const struct q4kh_tensor *state, float scale,
                               const struct q4kh_tensor *out)
{
	struct call c = { .op = C_DELTA_NET, .f = scale };

	if (!v || !state)
		return fail(d->b, Q4KH_ERR_INVALID, "delta_net: v or state is NULL");
	T(c, 0, q);
	T(c, 1, k);
	T(c, 2, v);
	T(c, 3, g);
	T(c, 4, beta);
	T(c, 5, state);
	T(c, 6, out);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_moe_route(q4kh_device_ctx *d, const struct q4kh_tensor *logits,
                               int32_t norm, const struct q4kh_tensor *ids,
                               const struct q4kh_tensor *weights)
{
	struct call c = { .op = C_MOE_ROUTE, .i = norm };

	if (!logits || !ids)
		return fail(d->b, Q4KH_ERR_INVALID, "moe_route: logits or ids is NULL");
	T(c, 0, logits);
	T(c, 1, ids);
	T(c, 2, weights);
	return run(d, c, NULL, 0, -1);
}

static q4kh_status r_mul_mat_id(q4kh_device_ctx *d, const struct q4kh_tensor *w,
                                const struct q4kh_tensor *x, const struct q4kh_tensor *ids,
                                const struct q4kh_tensor *y)
{
	struct call c = { .op = C_MUL_MAT_ID };

	T(c, 0, w);
	T(c, 1, x);
	T(c, 2, ids);
	T(c, 3, y);
	return run(d, c, NULL, 0, -1);
}
#endif

static q4kh_status r_graph_begin(q4kh_device_ctx *d)
{
	if (d->rec)
		return fail(d->b, Q4KH_ERR_INVALID, "graph_begin while recording");
	d->rec = calloc(1, sizeof(*d->rec));
	return d->rec ? Q4KH_OK : fail(d->b, Q4KH_ERR_NOMEM, "out of memory");
}

static q4kh_status r_graph_end(q4kh_device_ctx *d, q4kh_graph **out)
{
	*out = d->rec;
	d->rec = NULL;
	return *out ? Q4KH_OK : fail(d->b, Q4KH_ERR_INVALID, "graph_end without graph_begin");
}

static q4kh_status r_graph_launch(q4kh_device_ctx *d, q4kh_graph *g)
{
	for (size_t k = 0; k < g->n; k++) {
		q4kh_status st = issue(d, &g->calls[k]);

		if (st)
			return st;
	}
	return Q4KH_OK;
}

static void r_graph_free(q4kh_device_ctx *d, q4kh_graph *g)
{
	(void)d;
	free_graph(g);
}

#ifdef GRAPH_DROP
#include "q4khost/step.h"

static const struct q4kh_backend_v1 table;

struct q4kh_step {
	struct q4kh_step_graph *g;
};

static q4kh_status r_graph_prepare(q4kh_device_ctx *d, const struct q4kh_step_graph *g,
                                   q4kh_step **out)
{
	q4kh_step *s = calloc(1, sizeof(*s));

	(void)d;
	if (!s || !(s->g = q4kh_step_copy(g))) {
		free(s);
		return Q4KH_ERR_NOMEM;
	}
	*out = s;
	return Q4KH_OK;
}

/* Every node through this table, but the step's first add. */
static q4kh_status r_graph_compute(q4kh_device_ctx *d, q4kh_step *s, struct q4kh_step_run *run)
{
	const struct q4kh_step_host_values none = { NULL, NULL };
	struct q4kh_step_fail fail;
	int dropped = 0;

	for (int32_t i = 0; i < s->g->n_nodes; i++) {
		q4kh_status st;

		if (!dropped && q4kh_step_node_at(s->g, i)->op == Q4KH_OP_ADD) {
			dropped = 1;
			continue;
		}
		if ((st = q4kh_step_issue_node(&table, d, s->g, i, &none, &fail)))
			return st;
	}
	if (run)
		run->path = Q4KH_PATH_NODES;
	return Q4KH_OK;
}

static void r_graph_release(q4kh_device_ctx *d, q4kh_step *s)
{
	(void)d;
	if (s)
		q4kh_step_copy_free(s->g);
	free(s);
}
#endif

static const struct q4kh_backend_v1 table = {
#ifdef REPLAY_V1_1
	.struct_size = offsetof(struct q4kh_backend_v1, graph_free) +
	               sizeof(table.graph_free),
#else
	.struct_size = sizeof(struct q4kh_backend_v1),
	.get_rows_ext = r_get_rows_ext,
	.rope_ext = r_rope_ext,
	.set_rows = r_set_rows,
	.attention_ext = r_attention_ext,
	.unary = r_unary,
	.ssm_conv = r_ssm_conv,
	.delta_net = r_delta_net,
	.moe_route = r_moe_route,
	.mul_mat_id = r_mul_mat_id,
#endif
#if defined(REPLAY_OK) || defined(REPLAY_PAGE)
	.attention_paged = r_attention_paged,
#endif
	.init = r_init,
	.shutdown = r_shutdown,
	.last_error = r_last_error,
	.device_count = r_device_count,
	.device_info = r_device_info,
	.device_open = r_device_open,
	.device_close = r_device_close,
	.supports_type = r_supports_type,
	.buffer_alloc = r_buffer_alloc,
	.buffer_free = r_buffer_free,
	.buffer_upload = r_upload,
	.buffer_download = r_download,
	.get_rows = r_get_rows,
	.mul_mat = r_mul_mat,
	.rms_norm = r_rms_norm,
	.rope = r_rope,
	.add = r_add,
	.mul = r_mul,
	.scale = r_scale,
	.glu = r_glu,
	.copy = r_copy,
	.attention = r_attention,
	.synchronize = r_synchronize,
	.native_device = r_native_device,
	.graph_begin = r_graph_begin,
	.graph_end = r_graph_end,
	.graph_launch = r_graph_launch,
	.graph_free = r_graph_free,
#ifdef GRAPH_DROP
	.graph_prepare = r_graph_prepare,
	.graph_compute = r_graph_compute,
	.graph_release = r_graph_release,
#endif
#ifndef REPLAY_V1_1
	.arith = Q4KH_ARITH_F16,
#endif
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
#ifdef REPLAY_V1_1
	.abi_minor = 1,
#else
	.abi_minor = Q4KH_ABI_MINOR,
#endif
	.kind = Q4KH_KIND_BACKEND,
	.name = REPLAY_NAME,
	.version = "0.1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
	.backend = &table,
#if defined(REPLAY_CODE_TOKEN) || defined(REPLAY_NO_Q8_0) || defined(REPLAY_BATCHED) || \
	defined(REPLAY_ROUTE) || defined(REPLAY_REUSE) || defined(REPLAY_PAGE)
	.backend_kind = "cpu",
#endif
};

API const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc;
}
