/*
 * Building, checking, planning and binding a step graph (graph.h).
 */
#include "graph.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "tensor.h"

static const char *const op_names[Q4KH_OP_COUNT] = {
	[Q4KH_OP_GET_ROWS] = "get_rows", [Q4KH_OP_MUL_MAT] = "mul_mat",
	[Q4KH_OP_RMS_NORM] = "rms_norm", [Q4KH_OP_ROPE] = "rope",
	[Q4KH_OP_ADD] = "add",           [Q4KH_OP_SCALE] = "scale",
	[Q4KH_OP_GLU] = "glu",
	[Q4KH_OP_SET_ROWS] = "set_rows", [Q4KH_OP_ATTENTION] = "attention",
	[Q4KH_OP_MUL] = "mul",           [Q4KH_OP_COPY] = "copy",
	[Q4KH_OP_UNARY] = "unary",       [Q4KH_OP_SSM_CONV] = "ssm_conv",
	[Q4KH_OP_DELTA_NET] = "delta_net", [Q4KH_OP_MOE_ROUTE] = "moe_route",
	[Q4KH_OP_MUL_MAT_ID] = "mul_mat_id", [Q4KH_OP_ATTENTION_PAGED] = "attention_paged",
};

const char *q4kh_op_name(enum q4kh_op op)
{
	return op >= 0 && op < Q4KH_OP_COUNT ? op_names[op] : "unknown op";
}

/* Record the first misuse; every later builder call then does nothing. */
__attribute__((format(printf, 2, 3))) static int32_t refuse(struct q4kh_graph *g,
                                                            const char *fmt, ...)
{
	va_list ap;

	if (!g->failed) {
		va_start(ap, fmt);
		vsnprintf(g->error, sizeof(g->error), fmt, ap);
		va_end(ap);
		g->failed = 1;
	}
	return -1;
}

/* Make room for one more element of an array that doubles. */
static int grow(void **items, int32_t *cap, int32_t n, size_t size)
{
	int32_t c = *cap ? *cap * 2 : 64;
	void *p;

	if (n < *cap)
		return 0;
	p = realloc(*items, (size_t)c * size);
	if (!p)
		return -1;
	*items = p;
	*cap = c;
	return 0;
}

static int32_t add_value(struct q4kh_graph *g, enum q4kh_value_kind kind,
                         const struct q4kh_tensor *t, const char *fmt,
                         va_list ap)
{
	struct q4kh_value *v, nv = { .kind = kind, .t = *t, .base = -1, .first = -1, .last = -1 };

	if (g->failed)
		return -1;
	/* T and the name's arguments may point into g->vals (a view names its
	 * base), which grow() may move: both are copied first. */
	vsnprintf(nv.name, sizeof(nv.name), fmt, ap);
	if (grow((void **)&g->vals, &g->cap_vals, g->n_vals, sizeof(*g->vals)))
		return refuse(g, "out of memory for %d values", g->n_vals + 1);
	v = &g->vals[g->n_vals];
	*v = nv;
	return g->n_vals++;
}

static int32_t value(struct q4kh_graph *g, enum q4kh_value_kind kind,
                     const struct q4kh_tensor *t, const char *fmt, ...)
{
	va_list ap;
	int32_t i;

	va_start(ap, fmt);
	i = add_value(g, kind, t, fmt, ap);
	va_end(ap);
	return i;
}

struct q4kh_graph *q4kh_graph_new(int64_t n_tokens, int64_t n_out)
{
	struct q4kh_graph *g = calloc(1, sizeof(*g));
	struct q4kh_tensor in;

	if (!g)
		return NULL;
	g->n_tokens = n_tokens;
	g->n_out = n_out;
	g->logits = -1;
	g->slots = g->pages = -1;
	in = q4kh_tensor_make(NULL, 0, Q4KH_TYPE_I32, n_tokens, 1, 1);
	g->ids = value(g, Q4KH_VAL_IDS, &in, "ids");
	g->pos = value(g, Q4KH_VAL_POS, &in, "pos");
	if (g->failed || n_tokens < 1 || n_out < 0 || n_out > n_tokens) {
		q4kh_graph_free(g);
		return NULL;
	}
	return g;
}

int q4kh_graph_paged(struct q4kh_graph *g, int64_t n_seqs, int64_t b)
{
	struct q4kh_tensor t = q4kh_tensor_make(NULL, 0, Q4KH_TYPE_I32, g->n_tokens, 1, 1);

	g->slots = value(g, Q4KH_VAL_SLOTS, &t, "slots");
	t = q4kh_tensor_make(NULL, 0, Q4KH_TYPE_I32, b, n_seqs, 1);
	g->pages = value(g, Q4KH_VAL_PAGES, &t, "pages");
	return g->failed ? -1 : 0;
}

int q4kh_graph_out_rows(struct q4kh_graph *g, const uint8_t *rows)
{
	g->rows = malloc((size_t)g->n_tokens);
	if (!g->rows)
		return -1;
	g->n_out = 0;
	for (int64_t i = 0; i < g->n_tokens; i++)
		g->n_out += (g->rows[i] = rows[i] != 0);
	return 0;
}

void q4kh_graph_free(struct q4kh_graph *g)
{
	if (!g)
		return;
	free(g->rows);
	free(g->vals);
	free(g->nodes);
	free(g);
}

int32_t q4kh_graph_fixed(struct q4kh_graph *g, const struct q4kh_tensor *t,
                         const char *name, ...)
{
	va_list ap;
	int32_t i;

	va_start(ap, name);
	i = add_value(g, Q4KH_VAL_FIXED, t, name, ap);
	va_end(ap);
	return i;
}

int32_t q4kh_graph_weight(struct q4kh_graph *g, const struct q4kh_weight *w,
                          const char *name, ...)
{
	va_list ap;
	int32_t i;

	if (!w->src) {
		char shown[Q4KH_GRAPH_NAME];

		va_start(ap, name);
		vsnprintf(shown, sizeof(shown), name, ap);
		va_end(ap);
		return refuse(g, "tensor %s is not in the model", shown);
	}
	va_start(ap, name);
	i = add_value(g, Q4KH_VAL_FIXED, &w->t, name, ap);
	va_end(ap);
	if (i >= 0)
		g->vals[i].weight = w;
	return i;
}

static int32_t add_act(struct q4kh_graph *g, uint32_t type, int64_t ne0, int64_t ne1,
                       int64_t ne2, const char *name, va_list ap)
{
	struct q4kh_tensor t = q4kh_tensor_make(NULL, 0, type, ne0, ne1, ne2);

	if (ne0 < 1 || ne1 < 1 || ne2 < 1)
		return refuse(g, "activation %s of %lld x %lld x %lld", name,
		              (long long)ne0, (long long)ne1, (long long)ne2);
	return add_value(g, Q4KH_VAL_ACT, &t, name, ap);
}

int32_t q4kh_graph_act(struct q4kh_graph *g, int64_t ne0, int64_t ne1,
                       int64_t ne2, const char *name, ...)
{
	va_list ap;
	int32_t i;

	va_start(ap, name);
	i = add_act(g, Q4KH_TYPE_F32, ne0, ne1, ne2, name, ap);
	va_end(ap);
	return i;
}

int32_t q4kh_graph_ids_act(struct q4kh_graph *g, int64_t ne0, int64_t ne1,
                           const char *name, ...)
{
	va_list ap;
	int32_t i;

	va_start(ap, name);
	i = add_act(g, Q4KH_TYPE_I32, ne0, ne1, 1, name, ap);
	va_end(ap);
	return i;
}

static int exists(const struct q4kh_graph *g, int32_t v)
{
	return v >= 0 && v < g->n_vals;
}

/* The value whose memory V is: itself, or the root of its views. */
static int32_t root(const struct q4kh_graph *g, int32_t v)
{
	while (g->vals[v].kind == Q4KH_VAL_VIEW)
		v = g->vals[v].base;
	return v;
}

static int32_t view(struct q4kh_graph *g, int32_t v,
                    const struct q4kh_tensor *t, uint64_t offset,
                    const char *how)
{
	int32_t i = value(g, Q4KH_VAL_VIEW, t, "%.24s (%s)", g->vals[v].name, how);

	if (i >= 0) {
		g->vals[i].base = v;
		g->vals[i].offset = offset;
	}
	return i;
}

int32_t q4kh_graph_reshape(struct q4kh_graph *g, int32_t v, int64_t ne0,
                           int64_t ne1, int64_t ne2)
{
	const struct q4kh_tensor *t;
	struct q4kh_tensor r;

	if (g->failed)
		return -1;
	if (!exists(g, v))
		return refuse(g, "reshape of value %d, which does not exist", v);
	t = &g->vals[v].t;
	if (ne0 * ne1 * ne2 != t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] ||
	    t->nb[1] != t->ne[0] * t->nb[0] || t->nb[2] != t->ne[1] * t->nb[1])
		return refuse(g, "reshape of %s {%lld, %lld, %lld} to {%lld, %lld, %lld}",
		              g->vals[v].name, (long long)t->ne[0], (long long)t->ne[1],
		              (long long)t->ne[2], (long long)ne0, (long long)ne1,
		              (long long)ne2);
	r = q4kh_tensor_reshape(t, ne0, ne1, ne2);
	return view(g, v, &r, 0, "reshaped");
}

int32_t q4kh_graph_cols(struct q4kh_graph *g, int32_t v, int64_t c0, int64_t n)
{
	struct q4kh_tensor c;
	int d;

	if (g->failed)
		return -1;
	if (!exists(g, v))
		return refuse(g, "columns of value %d, which does not exist", v);
	d = g->vals[v].t.ne[2] > 1 ? 2 : 1;
	if (c0 < 0 || n < 1 || c0 + n > g->vals[v].t.ne[d])
		return refuse(g, "columns %lld .. %lld of %s, which has %lld",
		              (long long)c0, (long long)(c0 + n - 1), g->vals[v].name,
		              (long long)g->vals[v].t.ne[d]);
	c = q4kh_tensor_cols(&g->vals[v].t, c0, n);
	return view(g, v, &c, c.offset - g->vals[v].t.offset, "columns");
}

int32_t q4kh_graph_view(struct q4kh_graph *g, int32_t v, int64_t ne0,
                        int64_t ne1, int64_t ne2, int64_t nb1, int64_t nb2,
                        uint64_t offset)
{
	struct q4kh_tensor t;
	uint64_t end;

	if (g->failed)
		return -1;
	if (!exists(g, v))
		return refuse(g, "view of value %d, which does not exist", v);
	t = g->vals[v].t;
	if (ne0 < 1 || ne1 < 1 || ne2 < 1 || nb1 < ne0 * t.nb[0] || nb2 < 0)
		return refuse(g, "view {%lld, %lld, %lld} of %s with rows %lld bytes apart",
		              (long long)ne0, (long long)ne1, (long long)ne2,
		              g->vals[v].name, (long long)nb1);
	end = offset + (uint64_t)(ne0 * t.nb[0]) + (uint64_t)((ne1 - 1) * nb1) +
	      (uint64_t)((ne2 - 1) * nb2);
	if (end > q4kh_tensor_bytes(&t) || t.nb[1] != t.ne[0] * t.nb[0] ||
	    t.nb[2] != t.ne[1] * t.nb[1])
		return refuse(g, "view of %s ends at byte %llu of its %llu (or it is not contiguous)",
		              g->vals[v].name, (unsigned long long)end,
		              (unsigned long long)q4kh_tensor_bytes(&t));
	t.offset += offset;
	t.ne[0] = ne0;
	t.ne[1] = ne1;
	t.ne[2] = ne2;
	t.ne[3] = 1;
	t.nb[1] = nb1;
	t.nb[2] = nb2;
	t.nb[3] = nb2 * ne2;
	return view(g, v, &t, offset, "view");
}

int32_t q4kh_graph_op(struct q4kh_graph *g, enum q4kh_op op, int32_t out,
                      const int32_t src[Q4KH_GRAPH_SRC], const int32_t i[2],
                      const float f[2])
{
	struct q4kh_node *n;

	if (g->failed)
		return -1;
	if (op < 0 || op >= Q4KH_OP_COUNT)
		return refuse(g, "node of unknown op %d", (int)op);
	if (!exists(g, out))
		return refuse(g, "%s into value %d, which does not exist",
		              q4kh_op_name(op), out);
	for (int k = 0; k < Q4KH_GRAPH_SRC; k++)
		if (src[k] != -1 && !exists(g, src[k]))
			return refuse(g, "%s into %s reads value %d, which does not exist",
			              q4kh_op_name(op), g->vals[out].name, src[k]);
	if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes, sizeof(*g->nodes)))
		return refuse(g, "out of memory for %d nodes", g->n_nodes + 1);
	n = &g->nodes[g->n_nodes++];
	n->op = op;
	memcpy(n->src, src, sizeof(n->src));
	n->out = out;
	n->i[0] = i ? i[0] : 0;
	n->i[1] = i ? i[1] : 0;
	n->f[0] = f ? f[0] : 0.0f;
	n->f[1] = f ? f[1] : 0.0f;
	memset(&n->rope, 0, sizeof(n->rope));
	return out;
}

int32_t q4kh_graph_rope(struct q4kh_graph *g, int32_t x,
                        const struct q4kh_rope_params *p, int32_t ff,
                        int32_t out)
{
	int32_t r = q4kh_graph_node(g, Q4KH_OP_ROPE, out, x, g->pos, ff, -1, 0, 0,
	                            0.0f, 0.0f);

	if (r >= 0) {
		g->nodes[g->n_nodes - 1].rope = *p;
		g->nodes[g->n_nodes - 1].rope.freq_factors = NULL;
	}
	return r;
}

int q4kh_graph_check(const struct q4kh_graph *g, struct q4kh_error *err)
{
	if (g->failed)
		return q4kh_fail(err, "step graph of %lld tokens: %s",
		                 (long long)g->n_tokens, g->error);
	return 0;
}

/* Widen the life of V's memory to node N. */
static void touch(struct q4kh_graph *g, int32_t v, int32_t n)
{
	struct q4kh_value *r;

	if (v < 0)
		return;
	r = &g->vals[root(g, v)];
	if (r->kind != Q4KH_VAL_ACT)
		return;
	if (r->first < 0 || n < r->first)
		r->first = n;
	if (n > r->last)
		r->last = n;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* Do activations A and B (planned) live at once and share bytes? */
static int clash(const struct q4kh_value *a, const struct q4kh_value *b,
                 uint64_t a_off, uint64_t a_size)
{
	uint64_t b_size = q4kh_tensor_bytes(&b->t);

	return a->first <= b->last && b->first <= a->last &&
	       a_off < b->offset + b_size && b->offset < a_off + a_size;
}

int q4kh_graph_plan(struct q4kh_graph *g, uint64_t align)
{
	int32_t *placed = malloc(sizeof(*placed) * (size_t)g->n_vals);
	int32_t n_placed = 0;

	if (!placed)
		return -1;
	g->scratch_bytes = 0;
	for (int32_t n = 0; n < g->n_nodes; n++) {
		for (int k = 0; k < Q4KH_GRAPH_SRC; k++)
			touch(g, g->nodes[n].src[k], n);
		touch(g, g->nodes[n].out, n);
	}
	/* The host reads the logits after the last node. */
	if (g->logits >= 0)
		touch(g, g->logits, g->n_nodes);
	/*
	 * First fit in order of creation: each activation goes to the lowest
	 * aligned offset where it shares no byte with a placed activation
	 * whose life overlaps its own.
	 */
	for (int32_t v = 0; v < g->n_vals; v++) {
		struct q4kh_value *a = &g->vals[v];
		uint64_t size, off = 0;
		int moved = 1;

		if (a->kind != Q4KH_VAL_ACT)
			continue;
		if (a->first < 0) /* never used: still valid memory */
			a->first = a->last = 0;
		size = align_up(q4kh_tensor_bytes(&a->t), align);
		while (moved) {
			moved = 0;
			for (int32_t k = 0; k < n_placed; k++) {
				const struct q4kh_value *b = &g->vals[placed[k]];

				if (clash(a, b, off, size)) {
					off = align_up(b->offset + q4kh_tensor_bytes(&b->t), align);
					moved = 1;
				}
			}
		}
		a->offset = off;
		placed[n_placed++] = v;
		if (off + size > g->scratch_bytes)
			g->scratch_bytes = off + size;
	}
	free(placed);
	return 0;
}

void q4kh_graph_bind(struct q4kh_graph *g, q4kh_buffer *scratch,
                     q4kh_buffer *step)
{
	for (int32_t v = 0; v < g->n_vals; v++) {
		struct q4kh_value *a = &g->vals[v];

		switch (a->kind) {
		case Q4KH_VAL_IDS:
		case Q4KH_VAL_POS:
		case Q4KH_VAL_SLOTS:
		case Q4KH_VAL_PAGES:
			a->t.buffer = step;
			a->t.offset = (uint64_t)(a->kind == Q4KH_VAL_IDS     ? 0
			                         : a->kind == Q4KH_VAL_POS   ? 1
			                         : a->kind == Q4KH_VAL_SLOTS ? 2
			                                                     : 3) *
			              (uint64_t)g->n_tokens * sizeof(int32_t);
			break;
		case Q4KH_VAL_ACT:
			a->t.buffer = scratch;
			a->t.offset = a->offset;
			break;
		case Q4KH_VAL_VIEW: /* bases come first: they are older values */
			a->t.buffer = g->vals[a->base].t.buffer;
			a->t.offset = g->vals[a->base].t.offset + a->offset;
			break;
		case Q4KH_VAL_FIXED:
			break;
		}
	}
}
