/*
 * Reading and running a step graph (q4khost/step.h): the patterns a
 * backend may fuse, and the issuing of nodes and groups through a
 * backend's table and its weights' kernel variants. The host's
 * interpreter and the backends' graph_compute share this code.
 */
#include "q4khost/step.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/contract.h"

const char *q4kh_step_op_name(uint32_t op)
{
	static const char *const names[] = {
		[Q4KH_OP_GET_ROWS] = "get_rows", [Q4KH_OP_MUL_MAT] = "mul_mat",
		[Q4KH_OP_RMS_NORM] = "rms_norm", [Q4KH_OP_ROPE] = "rope",
		[Q4KH_OP_ADD] = "add",           [Q4KH_OP_SCALE] = "scale",
		[Q4KH_OP_GLU] = "glu",           [Q4KH_OP_SET_ROWS] = "set_rows",
		[Q4KH_OP_ATTENTION] = "attention", [Q4KH_OP_MUL] = "mul",
		[Q4KH_OP_COPY] = "copy",         [Q4KH_OP_UNARY] = "unary",
		[Q4KH_OP_SSM_CONV] = "ssm_conv", [Q4KH_OP_DELTA_NET] = "delta_net",
		[Q4KH_OP_MOE_ROUTE] = "moe_route", [Q4KH_OP_MUL_MAT_ID] = "mul_mat_id",
		[Q4KH_OP_ATTENTION_PAGED] = "attention_paged",
	};

	return op < sizeof(names) / sizeof(names[0]) ? names[op] : "unknown op";
}

/* --- copies --- */

struct q4kh_step_graph *q4kh_step_copy(const struct q4kh_step_graph *g)
{
	const size_t ns = sizeof(struct q4kh_step_node), vs = sizeof(struct q4kh_step_value);
	struct q4kh_step_graph *c;
	struct q4kh_step_node *nodes;
	struct q4kh_step_value *vals;
	size_t chars = 0;
	char *at;

	for (int32_t i = 0; i < g->n_values; i++) {
		const char *name = q4kh_step_value_at(g, i)->name;

		chars += name ? strlen(name) + 1 : 0;
	}
	/* the graph, then the values, then the nodes (each aligned as the one
	 * before it ends), then the names */
	c = calloc(1, sizeof(*c) + vs * (size_t)g->n_values + ns * (size_t)g->n_nodes + chars);
	if (!c)
		return NULL;
	vals = (struct q4kh_step_value *)(void *)(c + 1);
	nodes = (struct q4kh_step_node *)(void *)(vals + g->n_values);
	at = (char *)(nodes + g->n_nodes);
	for (int32_t i = 0; i < g->n_nodes; i++)
		memcpy(&nodes[i], q4kh_step_node_at(g, i), g->node_size < ns ? g->node_size : ns);
	for (int32_t i = 0; i < g->n_values; i++) {
		const char *name = q4kh_step_value_at(g, i)->name;

		memcpy(&vals[i], q4kh_step_value_at(g, i), g->value_size < vs ? g->value_size : vs);
		if (name) {
			size_t len = strlen(name) + 1;

			vals[i].name = memcpy(at, name, len);
			at += len;
		}
	}
	*c = *g;
	c->struct_size = sizeof(*c);
	c->node_size = (uint32_t)ns;
	c->value_size = (uint32_t)vs;
	c->nodes = nodes;
	c->values = vals;
	return c;
}

void q4kh_step_copy_free(struct q4kh_step_graph *copy)
{
	free(copy);
}

/* --- shorthands --- */

#define NODE(g, i) q4kh_step_node_at(g, i)
#define VAL(g, v) q4kh_step_value_at(g, v)
#define TEN(g, v) q4kh_step_tensor(g, v)

/* The same view: buffer, offset, type, shape and strides. */
static int same_view(const struct q4kh_tensor *a, const struct q4kh_tensor *b)
{
	return a->buffer == b->buffer && a->offset == b->offset && a->type == b->type &&
	       !memcmp(a->ne, b->ne, sizeof(a->ne)) && !memcmp(a->nb, b->nb, sizeof(a->nb));
}

/* One past the last byte of f32 tensor T in its buffer. */
static uint64_t f32_end(const struct q4kh_tensor *t)
{
	uint64_t end = t->offset + sizeof(float);

	for (int d = 0; d < 4; d++)
		end += (uint64_t)(t->ne[d] - 1) * (uint64_t)t->nb[d];
	return end;
}

/* Do f32 tensors A and B share a byte? */
static int f32_overlap(const struct q4kh_tensor *a, const struct q4kh_tensor *b)
{
	return a->buffer == b->buffer && a->offset < f32_end(b) && b->offset < f32_end(a);
}

/* The value whose memory V is: itself, or the root of its views. */
static int32_t root(const struct q4kh_step_graph *g, int32_t v)
{
	while (VAL(g, v)->kind == Q4KH_VAL_VIEW)
		v = VAL(g, v)->base;
	return v;
}

int q4kh_step_dead_after(const struct q4kh_step_graph *g, int32_t v, int32_t n)
{
	if (VAL(g, v)->kind != Q4KH_VAL_ACT)
		return 0;
	for (int32_t j = n + 1; j < g->n_nodes; j++) {
		const struct q4kh_step_node *m = NODE(g, j);

		for (int k = 0; k < Q4KH_STEP_SRC; k++)
			if (m->src[k] >= 0 && root(g, m->src[k]) == v)
				return 0;
	}
	return 1;
}

/* The kernel variant a mul_mat node's weight is routed to, or NULL. */
static const struct q4kh_step_value *routed(const struct q4kh_step_graph *g,
                                            const struct q4kh_step_node *n)
{
	const struct q4kh_step_value *w;

	if (n->op != Q4KH_OP_MUL_MAT)
		return NULL;
	w = VAL(g, n->src[0]);
	return w->kernel ? w : NULL;
}

/* --- the patterns --- */

/*
 * Can mul_mat nodes A and B run in one call: does neither write a byte
 * that the other reads or writes? (A may be B: its output and its bias.)
 */
static int apart(const struct q4kh_step_graph *g, const struct q4kh_step_node *a,
                 const struct q4kh_step_node *b)
{
	const struct q4kh_tensor *ya = TEN(g, a->out), *yb = TEN(g, b->out);
	const struct q4kh_tensor *ba = TEN(g, a->src[2]), *bb = TEN(g, b->src[2]);

	return (a == b || !f32_overlap(ya, yb)) && (!bb || !f32_overlap(ya, bb)) &&
	       (!ba || !f32_overlap(yb, ba)) && !f32_overlap(ya, TEN(g, b->src[1])) &&
	       !f32_overlap(yb, TEN(g, a->src[1]));
}

static int32_t match_gemv_multi(const struct q4kh_step_graph *g, int32_t i)
{
	const struct q4kh_step_node *first = NODE(g, i);
	const struct q4kh_step_value *w0 = routed(g, first);
	const struct q4kh_tensor *x;
	int32_t n = 0;

	if (!w0 || !Q4KH_KERNEL_HAS(w0->kernel, gemv_multi))
		return 0;
	x = TEN(g, first->src[1]);
	if (x->ne[1] > (int64_t)w0->kernel->max_gemv_columns)
		return 0;
	for (; n < Q4KH_GEMV_MULTI_MAX && i + n < g->n_nodes; n++) {
		const struct q4kh_step_node *nd = NODE(g, i + n);
		const struct q4kh_step_value *w = routed(g, nd);
		int ok = w && nd->src[1] == first->src[1] && w->kernel == w0->kernel &&
		         w->kernel_ctx == w0->kernel_ctx && w->t.ne[0] == x->ne[0];

		for (int32_t j = 0; j <= n && ok; j++)
			ok = apart(g, NODE(g, i + j), nd);
		if (!ok)
			break;
	}
	return n > 1 ? n : 0;
}

static int32_t match_gemv_glu(const struct q4kh_step_graph *g, int32_t i)
{
	const struct q4kh_step_node *gate = NODE(g, i), *up, *glu;
	const struct q4kh_step_value *wg, *wu;
	const struct q4kh_tensor *x;

	if (i + 2 >= g->n_nodes)
		return 0;
	up = NODE(g, i + 1);
	glu = NODE(g, i + 2);
	wg = routed(g, gate);
	wu = routed(g, up);
	if (!wg || !wu || glu->op != Q4KH_OP_GLU || up->src[1] != gate->src[1] ||
	    gate->src[2] >= 0 || up->src[2] >= 0 || glu->src[0] != gate->out ||
	    glu->src[1] != up->out || gate->out == up->out ||
	    !q4kh_step_dead_after(g, up->out, i + 2) ||
	    (glu->out != gate->out && !q4kh_step_dead_after(g, gate->out, i + 2)))
		return 0;
	x = TEN(g, gate->src[1]);
	if (wu->kernel != wg->kernel || wu->kernel_ctx != wg->kernel_ctx ||
	    !Q4KH_KERNEL_HAS(wg->kernel, gemv_glu) ||
	    x->ne[1] > (int64_t)wg->kernel->max_gemv_columns || wg->t.ne[0] != x->ne[0] ||
	    wu->t.ne[0] != x->ne[0] || wg->t.ne[1] != wu->t.ne[1] ||
	    f32_overlap(TEN(g, glu->out), x))
		return 0;
	return 3;
}

/*
 * ADD x = x + a (in place on either operand, a of x's very shape), then
 * RMS_NORM of exactly that x into an out that is a, or apart from a. The
 * value a in *AV.
 */
static int add_norm_pair(const struct q4kh_step_graph *g, const struct q4kh_step_node *n,
                         const struct q4kh_step_node *m, int32_t *av)
{
	const struct q4kh_check quiet = { 0 }; /* a refusal writes nothing */
	const struct q4kh_tensor *x, *a;

	if (n->op != Q4KH_OP_ADD || m->op != Q4KH_OP_RMS_NORM ||
	    (n->out != n->src[0] && n->out != n->src[1]))
		return 0;
	/* a + b is b + a in floating point too: x may be either operand */
	x = TEN(g, n->out);
	*av = n->src[n->out == n->src[0] ? 1 : 0];
	a = TEN(g, *av);
	return same_view(TEN(g, m->src[0]), x) && !memcmp(a->ne, x->ne, sizeof(a->ne)) &&
	       !q4kh_check_disjoint(&quiet, "", a, "", x) &&
	       !q4kh_check_in_place(&quiet, "", TEN(g, m->out), "", a);
}

static int32_t match_add_rms_norm(const struct q4kh_step_graph *g, int32_t i)
{
	int32_t av;

	return i + 1 < g->n_nodes && add_norm_pair(g, NODE(g, i), NODE(g, i + 1), &av) ? 2 : 0;
}

static int32_t match_norm_add_rms_norm(const struct q4kh_step_graph *g, int32_t i)
{
	const struct q4kh_step_node *n = NODE(g, i);
	int32_t av;

	return i + 2 < g->n_nodes && n->op == Q4KH_OP_RMS_NORM && n->out == n->src[0] &&
	               add_norm_pair(g, NODE(g, i + 1), NODE(g, i + 2), &av) && av == n->out
	               ? 3
	               : 0;
}

static int32_t match_rope_set_rows(const struct q4kh_step_graph *g, int32_t i)
{
	const struct q4kh_step_node *n = NODE(g, i), *m;
	const struct q4kh_tensor *x;

	if (i + 1 >= g->n_nodes)
		return 0;
	m = NODE(g, i + 1);
	x = TEN(g, n->out);
	return n->op == Q4KH_OP_ROPE && m->op == Q4KH_OP_SET_ROWS &&
	               same_view(TEN(g, n->src[0]), x) && same_view(TEN(g, m->src[0]), x) &&
	               m->src[1] == n->src[1]
	               ? 2
	               : 0;
}

static int32_t match_rope_store(const struct q4kh_step_graph *g, int32_t i)
{
	const struct q4kh_check quiet = { 0 };
	const struct q4kh_step_node *n[4];
	const struct q4kh_tensor *q, *k;

	if (i + 3 >= g->n_nodes)
		return 0;
	for (int j = 0; j < 4; j++)
		n[j] = NODE(g, i + j);
	if (n[0]->op != Q4KH_OP_ROPE || n[1]->op != Q4KH_OP_ROPE ||
	    n[2]->op != Q4KH_OP_SET_ROWS || n[3]->op != Q4KH_OP_SET_ROWS)
		return 0;
	q = TEN(g, n[0]->out);
	k = TEN(g, n[1]->out);
	if (!same_view(TEN(g, n[0]->src[0]), q) || !same_view(TEN(g, n[1]->src[0]), k) ||
	    !same_view(TEN(g, n[2]->src[0]), k) || n[1]->src[1] != n[0]->src[1] ||
	    n[2]->src[1] != n[0]->src[1] || n[3]->src[1] != n[0]->src[1] ||
	    n[1]->src[2] != n[0]->src[2] ||
	    /* whole structs: numbers only, no padding, freq_factors NULL */
	    memcmp(&n[1]->rope, &n[0]->rope, sizeof(n[0]->rope)))
		return 0;
	return q4kh_check_rope_store_apart(&quiet, q, k, TEN(g, n[3]->src[0]),
	                                   TEN(g, n[0]->src[1]), TEN(g, n[2]->out),
	                                   TEN(g, n[3]->out))
	               ? 0
	               : 4;
}

int32_t q4kh_step_match(const struct q4kh_step_graph *g, int32_t i, q4kh_step_fuse f)
{
	if (i < 0 || i >= g->n_nodes)
		return 0;
	switch (f) {
	case Q4KH_FUSE_GEMV_GLU: return match_gemv_glu(g, i);
	case Q4KH_FUSE_GEMV_MULTI: return match_gemv_multi(g, i);
	case Q4KH_FUSE_ROPE_STORE: return match_rope_store(g, i);
	case Q4KH_FUSE_NORM_ADD_RMS_NORM: return match_norm_add_rms_norm(g, i);
	case Q4KH_FUSE_ADD_RMS_NORM: return match_add_rms_norm(g, i);
	case Q4KH_FUSE_ROPE_SET_ROWS: return match_rope_set_rows(g, i);
	case Q4KH_FUSE_NONE:
	case Q4KH_FUSE_COUNT: break;
	}
	return 0;
}

int q4kh_step_table_fuses(const struct q4kh_backend_v1 *t, q4kh_step_fuse f)
{
	switch (f) {
	case Q4KH_FUSE_GEMV_GLU:
	case Q4KH_FUSE_GEMV_MULTI: return 1; /* the variant's, checked by the match */
	case Q4KH_FUSE_ROPE_STORE: return Q4KH_BACKEND_HAS(t, rope_store);
	case Q4KH_FUSE_NORM_ADD_RMS_NORM: return Q4KH_BACKEND_HAS(t, norm_add_rms_norm);
	case Q4KH_FUSE_ADD_RMS_NORM: return Q4KH_BACKEND_HAS(t, add_rms_norm);
	case Q4KH_FUSE_ROPE_SET_ROWS: return Q4KH_BACKEND_HAS(t, rope_set_rows);
	case Q4KH_FUSE_NONE:
	case Q4KH_FUSE_COUNT: break;
	}
	return 0;
}

/* --- issuing --- */

/* Note the failing call in *FAIL and return ST. */
static q4kh_status failed(q4kh_status st, struct q4kh_step_fail *fail, int32_t node,
                          const char *call, const struct q4kh_step_value *w)
{
	fail->node = node;
	fail->call = call;
	fail->kernel = w ? w->kernel : NULL;
	fail->kernel_ctx = w ? w->kernel_ctx : NULL;
	fail->msg[0] = '\0';
	return st;
}

#define CALL(call_, name_)                                                   \
	do {                                                                 \
		q4kh_status st_ = (call_);                                   \
		if (st_ != Q4KH_OK)                                          \
			return failed(st_, fail, i, name_, NULL);            \
	} while (0)

/* The SDK's own refusal, with its reason (printf-style) in fail->msg. */
__attribute__((format(printf, 4, 5))) static q4kh_status
refuse(struct q4kh_step_fail *fail, int32_t node, const char *call, const char *fmt, ...)
{
	va_list ap;

	failed(Q4KH_ERR_INVALID, fail, node, call, NULL);
	va_start(ap, fmt);
	vsnprintf(fail->msg, sizeof(fail->msg), fmt, ap);
	va_end(ap);
	return Q4KH_ERR_INVALID;
}

/* y = w x (+ bias): through w's kernel variant when it has one. */
static q4kh_status matmul(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                          const struct q4kh_step_graph *g, int32_t i,
                          struct q4kh_step_fail *fail)
{
	const struct q4kh_step_node *n = NODE(g, i);
	const struct q4kh_step_value *w = VAL(g, n->src[0]);
	const struct q4kh_tensor *x = TEN(g, n->src[1]), *y = TEN(g, n->out);
	q4kh_status st;

	if (w->kernel) {
		int gemv = x->ne[1] <= (int64_t)w->kernel->max_gemv_columns;

		st = gemv ? w->kernel->gemv(w->kernel_ctx, w->native, w->prepared, x, y)
		          : w->kernel->gemm(w->kernel_ctx, w->native, w->prepared, x, y);
		if (st != Q4KH_OK)
			return failed(st, fail, i, gemv ? "gemv" : "gemm", w);
	} else {
		CALL(t->mul_mat(dev, &w->t, x, y), "mul_mat");
	}
	if (n->src[2] >= 0)
		CALL(t->add(dev, y, TEN(g, n->src[2]), y), "add");
	return Q4KH_OK;
}

/*
 * The host copy of the positions tensor POS views (the step's, or one
 * sequence's of a batched step) and their count in *N.
 */
static const int32_t *host_pos(const struct q4kh_step_graph *g, const struct q4kh_tensor *pos,
                               const struct q4kh_step_host_values *hv, int64_t *n)
{
	*n = pos->ne[0];
	return hv->pos + (pos->offset - TEN(g, g->pos)->offset) / sizeof(int32_t);
}

/* Are pos[0 .. n) consecutive, as the 1.0 entries' single pos0 needs? */
static q4kh_status consecutive(const int32_t *pos, int64_t n, int32_t i, const char *call,
                               struct q4kh_step_fail *fail)
{
	for (int64_t k = 1; k < n; k++)
		if (pos[k] != pos[0] + k)
			return refuse(fail, i, call,
			              "positions %d, %d are not consecutive, and the backend has no set_rows/attention_ext (ABI 1.2) to take them as they are",
			              pos[0], pos[k]);
	return Q4KH_OK;
}

/* Columns [c0, c0 + n) of T's outermost used dimension (a cache's rows). */
static struct q4kh_tensor cols(const struct q4kh_tensor *t, int64_t c0, int64_t n)
{
	struct q4kh_tensor v = *t;
	int d = t->ne[2] > 1 ? 2 : 1;

	v.offset += (uint64_t)(c0 * t->nb[d]);
	v.ne[d] = n;
	for (int k = d + 1; k < 4; k++)
		v.nb[k] = v.nb[d] * v.ne[d];
	return v;
}

static q4kh_status rope_node(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                             const struct q4kh_step_graph *g, int32_t i,
                             const struct q4kh_step_host_values *hv,
                             struct q4kh_step_fail *fail)
{
	const struct q4kh_step_node *n = NODE(g, i);
	struct q4kh_rope_params p = n->rope;

	p.freq_factors = TEN(g, n->src[2]);
	if (Q4KH_BACKEND_HAS(t, rope_ext)) {
		CALL(t->rope_ext(dev, TEN(g, n->src[0]), TEN(g, n->src[1]), &p, TEN(g, n->out)),
		     "rope_ext");
		return Q4KH_OK;
	}
	if (p.freq_factors || p.ext_factor != 0.0f || p.attn_factor != 1.0f)
		return refuse(fail, i, "rope",
		              "this model's RoPE scaling (frequency factors or YaRN) needs rope_ext (ABI 1.2)");
	CALL(t->rope(dev, TEN(g, n->src[0]), hv->pos, p.n_rot, (q4kh_rope_mode)p.mode, p.base,
	             p.freq_scale, TEN(g, n->out)),
	     "rope");
	return Q4KH_OK;
}

static q4kh_status set_rows_node(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                                 const struct q4kh_step_graph *g, int32_t i,
                                 const struct q4kh_step_host_values *hv,
                                 struct q4kh_step_fail *fail)
{
	const struct q4kh_step_node *n = NODE(g, i);
	struct q4kh_tensor rows;
	const int32_t *pos;
	int64_t np;
	q4kh_status st;

	if (Q4KH_BACKEND_HAS(t, set_rows)) {
		CALL(t->set_rows(dev, TEN(g, n->src[0]), TEN(g, n->src[1]), TEN(g, n->out)),
		     "set_rows");
		return Q4KH_OK;
	}
	pos = host_pos(g, TEN(g, n->src[1]), hv, &np);
	if ((st = consecutive(pos, np, i, "set_rows", fail)))
		return st;
	rows = cols(TEN(g, n->out), pos[0], np);
	CALL(t->copy(dev, TEN(g, n->src[0]), &rows), "copy");
	return Q4KH_OK;
}

static q4kh_status attention_node(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                                  const struct q4kh_step_graph *g, int32_t i,
                                  const struct q4kh_step_host_values *hv,
                                  struct q4kh_step_fail *fail)
{
	const struct q4kh_step_node *n = NODE(g, i);
	struct q4kh_attn_params p = {
		.struct_size = sizeof(p),
		.window = n->i[0],
		.scale = n->f[0],
		.softcap = n->f[1],
	};
	const int32_t *pos;
	int64_t np;
	q4kh_status st;

	if (Q4KH_BACKEND_HAS(t, attention_ext)) {
		CALL(t->attention_ext(dev, TEN(g, n->src[0]), TEN(g, n->src[1]), TEN(g, n->src[2]),
		                      TEN(g, n->src[3]), &p, TEN(g, n->out)),
		     "attention_ext");
		return Q4KH_OK;
	}
	pos = host_pos(g, TEN(g, n->src[3]), hv, &np);
	if ((st = consecutive(pos, np, i, "attention", fail)))
		return st;
	p.pos0 = pos[0];
	CALL(t->attention(dev, TEN(g, n->src[0]), TEN(g, n->src[1]), TEN(g, n->src[2]), &p,
	                  TEN(g, n->out)),
	     "attention");
	return Q4KH_OK;
}

q4kh_status q4kh_step_issue_node(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                                 const struct q4kh_step_graph *g, int32_t i,
                                 const struct q4kh_step_host_values *hv,
                                 struct q4kh_step_fail *fail)
{
	const struct q4kh_step_node *n = NODE(g, i);
	const struct q4kh_tensor *s0 = TEN(g, n->src[0]), *s1 = TEN(g, n->src[1]);
	const struct q4kh_tensor *out = TEN(g, n->out);

	switch ((q4kh_op)n->op) {
	case Q4KH_OP_GET_ROWS:
		if (Q4KH_BACKEND_HAS(t, get_rows_ext))
			CALL(t->get_rows_ext(dev, s0, s1, n->f[0], out), "get_rows_ext");
		else
			CALL(t->get_rows(dev, s0, hv->ids, g->n_tokens, n->f[0], out), "get_rows");
		return Q4KH_OK;
	case Q4KH_OP_MUL_MAT:
		return matmul(t, dev, g, i, fail);
	case Q4KH_OP_RMS_NORM:
		CALL(t->rms_norm(dev, s0, s1, n->f[0], out), "rms_norm");
		return Q4KH_OK;
	case Q4KH_OP_ROPE:
		return rope_node(t, dev, g, i, hv, fail);
	case Q4KH_OP_ADD:
		CALL(t->add(dev, s0, s1, out), "add");
		return Q4KH_OK;
	case Q4KH_OP_SCALE:
		CALL(t->scale(dev, s0, n->f[0], out), "scale");
		return Q4KH_OK;
	case Q4KH_OP_GLU:
		CALL(t->glu(dev, (q4kh_glu_kind)n->i[0], s0, s1, out), "glu");
		return Q4KH_OK;
	case Q4KH_OP_SET_ROWS:
		return set_rows_node(t, dev, g, i, hv, fail);
	case Q4KH_OP_ATTENTION:
		return attention_node(t, dev, g, i, hv, fail);
	case Q4KH_OP_MUL:
		CALL(t->mul(dev, s0, s1, out), "mul");
		return Q4KH_OK;
	case Q4KH_OP_COPY:
		CALL(t->copy(dev, s0, out), "copy");
		return Q4KH_OK;
	case Q4KH_OP_UNARY:
		if (!Q4KH_BACKEND_HAS(t, unary))
			break;
		CALL(t->unary(dev, (q4kh_unary_kind)n->i[0], s0, out), "unary");
		return Q4KH_OK;
	case Q4KH_OP_SSM_CONV:
		if (!Q4KH_BACKEND_HAS(t, ssm_conv))
			break;
		CALL(t->ssm_conv(dev, s0, s1, TEN(g, n->src[2]), out), "ssm_conv");
		return Q4KH_OK;
	case Q4KH_OP_DELTA_NET:
		if (!Q4KH_BACKEND_HAS(t, delta_net))
			break;
		CALL(t->delta_net(dev, s0, s1, TEN(g, n->src[2]), TEN(g, n->src[3]),
		                  TEN(g, n->src[4]), TEN(g, n->src[5]), n->f[0], out),
		     "delta_net");
		return Q4KH_OK;
	case Q4KH_OP_MOE_ROUTE:
		if (!Q4KH_BACKEND_HAS(t, moe_route))
			break;
		CALL(t->moe_route(dev, s0, n->i[0], s1, out), "moe_route");
		return Q4KH_OK;
	case Q4KH_OP_MUL_MAT_ID:
		if (!Q4KH_BACKEND_HAS(t, mul_mat_id))
			break;
		CALL(t->mul_mat_id(dev, s0, s1, TEN(g, n->src[2]), out), "mul_mat_id");
		return Q4KH_OK;
	case Q4KH_OP_ATTENTION_PAGED: {
		const struct q4kh_attn_params p = { .struct_size = sizeof(p), .window = n->i[0],
			                            .scale = n->f[0], .softcap = n->f[1] };

		if (!Q4KH_BACKEND_HAS(t, attention_paged))
			break;
		CALL(t->attention_paged(dev, s0, s1, TEN(g, n->src[2]), TEN(g, n->src[3]),
		                        TEN(g, n->src[4]), n->i[1], &p, out),
		     "attention_paged");
		return Q4KH_OK;
	}
	}
	return refuse(fail, i, q4kh_step_op_name(n->op),
	              "node %d (%s): the backend has no entry for op %u", i,
	              q4kh_step_op_name(n->op), n->op);
}

/* gemv_multi of nodes [I, I + N); node by node when the variant declines. */
static q4kh_status issue_multi(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                               const struct q4kh_step_graph *g, int32_t i, int32_t n,
                               const struct q4kh_step_host_values *hv,
                               struct q4kh_step_fail *fail)
{
	const struct q4kh_step_value *w0 = VAL(g, NODE(g, i)->src[0]);
	q4kh_prepared *w[Q4KH_GEMV_MULTI_MAX];
	const struct q4kh_tensor *y[Q4KH_GEMV_MULTI_MAX], *bias[Q4KH_GEMV_MULTI_MAX];
	q4kh_status st;

	for (int32_t j = 0; j < n; j++) {
		const struct q4kh_step_node *nd = NODE(g, i + j);

		w[j] = VAL(g, nd->src[0])->prepared;
		y[j] = TEN(g, nd->out);
		bias[j] = TEN(g, nd->src[2]);
	}
	st = w0->kernel->gemv_multi(w0->kernel_ctx, w0->native, (uint32_t)n, w,
	                            TEN(g, NODE(g, i)->src[1]), y, bias);
	if (st != Q4KH_ERR_UNSUPPORTED)
		return st == Q4KH_OK ? Q4KH_OK : failed(st, fail, i, "gemv_multi", w0);
	for (int32_t j = 0; j < n; j++)
		if ((st = q4kh_step_issue_node(t, dev, g, i + j, hv, fail)))
			return st;
	return Q4KH_OK;
}

/* gemv_glu of nodes I .. I + 2; the products and the glu when declined. */
static q4kh_status issue_glu(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                             const struct q4kh_step_graph *g, int32_t i,
                             const struct q4kh_step_host_values *hv,
                             struct q4kh_step_fail *fail)
{
	const struct q4kh_step_node *gate = NODE(g, i), *glu = NODE(g, i + 2);
	const struct q4kh_step_value *wg = VAL(g, gate->src[0]);
	const struct q4kh_step_value *wu = VAL(g, NODE(g, i + 1)->src[0]);
	q4kh_status st;
	int32_t n;

	st = wg->kernel->gemv_glu(wg->kernel_ctx, wg->native, (q4kh_glu_kind)glu->i[0],
	                          wg->prepared, wu->prepared, TEN(g, gate->src[1]),
	                          TEN(g, glu->out));
	if (st != Q4KH_ERR_UNSUPPORTED)
		return st == Q4KH_OK ? Q4KH_OK : failed(st, fail, i, "gemv_glu", wg);
	n = match_gemv_multi(g, i);
	st = n == 2 ? issue_multi(t, dev, g, i, 2, hv, fail)
	            : q4kh_step_issue_node(t, dev, g, i, hv, fail);
	if (!st && n != 2)
		st = q4kh_step_issue_node(t, dev, g, i + 1, hv, fail);
	if (!st)
		st = q4kh_step_issue_node(t, dev, g, i + 2, hv, fail);
	return st;
}

q4kh_status q4kh_step_issue_group(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                                  const struct q4kh_step_graph *g, int32_t i,
                                  q4kh_step_fuse f, int32_t n,
                                  const struct q4kh_step_host_values *hv,
                                  struct q4kh_step_fail *fail)
{
	const struct q4kh_step_node *a = NODE(g, i);

	switch (f) {
	case Q4KH_FUSE_GEMV_GLU:
		return issue_glu(t, dev, g, i, hv, fail);
	case Q4KH_FUSE_GEMV_MULTI:
		return issue_multi(t, dev, g, i, n, hv, fail);
	case Q4KH_FUSE_ROPE_STORE: {
		const struct q4kh_step_node *sk = NODE(g, i + 2), *sv = NODE(g, i + 3);
		struct q4kh_rope_params p = a->rope;

		p.freq_factors = TEN(g, a->src[2]);
		CALL(t->rope_store(dev, TEN(g, a->out), TEN(g, NODE(g, i + 1)->out),
		                   TEN(g, sv->src[0]), TEN(g, a->src[1]), &p, TEN(g, sk->out),
		                   TEN(g, sv->out)),
		     "rope_store");
		return Q4KH_OK;
	}
	case Q4KH_FUSE_NORM_ADD_RMS_NORM: {
		const struct q4kh_step_node *add = NODE(g, i + 1), *norm = NODE(g, i + 2);

		CALL(t->norm_add_rms_norm(dev, TEN(g, add->out), TEN(g, a->out),
		                          TEN(g, a->src[1]), a->f[0], TEN(g, norm->src[1]),
		                          norm->f[0], TEN(g, norm->out)),
		     "norm_add_rms_norm");
		return Q4KH_OK;
	}
	case Q4KH_FUSE_ADD_RMS_NORM: {
		const struct q4kh_step_node *norm = NODE(g, i + 1);
		int32_t av;

		add_norm_pair(g, a, norm, &av);
		CALL(t->add_rms_norm(dev, TEN(g, a->out), TEN(g, av), TEN(g, norm->src[1]),
		                     norm->f[0], TEN(g, norm->out)),
		     "add_rms_norm");
		return Q4KH_OK;
	}
	case Q4KH_FUSE_ROPE_SET_ROWS: {
		struct q4kh_rope_params p = a->rope;

		p.freq_factors = TEN(g, a->src[2]);
		CALL(t->rope_set_rows(dev, TEN(g, a->out), TEN(g, a->src[1]), &p,
		                      TEN(g, NODE(g, i + 1)->out)),
		     "rope_set_rows");
		return Q4KH_OK;
	}
	case Q4KH_FUSE_NONE:
	case Q4KH_FUSE_COUNT:
		break;
	}
	return q4kh_step_issue_node(t, dev, g, i, hv, fail);
}

q4kh_step_fuse q4kh_step_next(const struct q4kh_backend_v1 *t, const struct q4kh_step_graph *g,
                              int32_t i, uint32_t allow, int32_t *n)
{
	/* the order the patterns are tried in: products first, then the
	 * four-node attention inputs before the pairs that overlap them */
	static const q4kh_step_fuse order[] = {
		Q4KH_FUSE_GEMV_GLU,          Q4KH_FUSE_GEMV_MULTI,   Q4KH_FUSE_ROPE_STORE,
		Q4KH_FUSE_NORM_ADD_RMS_NORM, Q4KH_FUSE_ADD_RMS_NORM, Q4KH_FUSE_ROPE_SET_ROWS,
	};

	for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
		q4kh_step_fuse f = order[k];

		if ((allow & (1u << f)) && q4kh_step_table_fuses(t, f) &&
		    (*n = q4kh_step_match(g, i, f)) > 0)
			return f;
	}
	*n = 1;
	return Q4KH_FUSE_NONE;
}

q4kh_status q4kh_step_run(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                          const struct q4kh_step_graph *g, uint32_t allow,
                          const struct q4kh_step_host_values *hv, uint32_t *groups,
                          struct q4kh_step_fail *fail)
{
	uint32_t calls = 0;

	for (int32_t i = 0, n; i < g->n_nodes; i += n) {
		q4kh_step_fuse f = q4kh_step_next(t, g, i, allow, &n);
		q4kh_status st = q4kh_step_issue_group(t, dev, g, i, f, n, hv, fail);

		if (st != Q4KH_OK)
			return st;
		calls++;
	}
	if (groups)
		*groups = calls;
	return Q4KH_OK;
}
