/*
 * Running a bound step graph on a backend device (graph_run.h): the
 * interpreter, which issues one backend or kernel-variant call per node
 * (or per fused pair of nodes), and the recording of a step that the
 * backend replays.
 */
#include "graph_run.h"

#include <stdio.h>
#include <string.h>

#include "kernel.h"
#include "model.h"
#include "q4khost/contract.h"
#include "tensor.h"

/*
 * Stop at the first failing call; the plugin's message is in err, after
 * WHAT, which names the call only then (a step runs hundreds of nodes).
 */
#define CALL(call)                                                       \
	do {                                                             \
		q4kh_status st_ = (call);                                \
		if (st_ != Q4KH_OK) {                                    \
			q4kh_backend_check(b, st_, WHAT, err);           \
			return -1;                                       \
		}                                                        \
	} while (0)

/* "rms_norm (blk.3.attn_norm)" for node N of G, into BUF. */
static const char *node_name(const struct q4kh_graph *g, const struct q4kh_node *n,
                             char *buf, size_t cap)
{
	snprintf(buf, cap, "%s (%s)", q4kh_op_name(n->op), g->vals[n->out].name);
	return buf;
}

#define WHAT node_name(g, n, what, sizeof(what))

/*
 * y = w x (+ bias) through w's kernel variant when it has one (gemv for at
 * most max_gemv_columns columns, gemm beyond), else the backend's mul_mat;
 * the bias (NULL for none) through the backend's add.
 */
static int matmul(const struct q4kh_backend *b, const struct q4kh_weight *w,
                  const struct q4kh_tensor *x, const struct q4kh_tensor *bias,
                  const struct q4kh_tensor *y, const struct q4kh_graph *g,
                  const struct q4kh_node *n, struct q4kh_error *err)
{
	const struct q4kh_kernel *k = w ? w->kernel : NULL;
	char what[96];

	if (k) {
		int gemv = x->ne[1] <= (int64_t)k->v->max_gemv_columns;
		q4kh_status st = gemv ? k->v->gemv(k->ctx, &k->native, w->prepared, x, y)
		                      : k->v->gemm(k->ctx, &k->native, w->prepared, x, y);

		if (q4kh_kernel_check(k, st, gemv ? "gemv" : "gemm", err))
			return -1;
	} else {
		CALL(b->v->mul_mat(b->dev, w ? &w->t : NULL, x, y));
	}
	if (bias)
		CALL(b->v->add(b->dev, y, bias, y));
	return 0;
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
	return a->buffer == b->buffer && a->offset < f32_end(b) &&
	       b->offset < f32_end(a);
}

/* The bias of mul_mat node N, or NULL. */
static const struct q4kh_tensor *bias_of(const struct q4kh_graph *g,
                                         const struct q4kh_node *n)
{
	return n->src[2] >= 0 ? &g->vals[n->src[2]].t : NULL;
}

/*
 * Can mul_mat nodes A and B run in one call: does neither write a byte
 * that the other reads or writes? (A may be B: its output and its bias.)
 */
static int apart(const struct q4kh_graph *g, const struct q4kh_node *a,
                 const struct q4kh_node *b)
{
	const struct q4kh_tensor *ya = &g->vals[a->out].t, *yb = &g->vals[b->out].t;
	const struct q4kh_tensor *ba = bias_of(g, a), *bb = bias_of(g, b);

	return (a == b || !f32_overlap(ya, yb)) && (!bb || !f32_overlap(ya, bb)) &&
	       (!ba || !f32_overlap(yb, ba)) &&
	       !f32_overlap(ya, &g->vals[b->src[1]].t) &&
	       !f32_overlap(yb, &g->vals[a->src[1]].t);
}

/*
 * How many nodes from I on one gemv_multi serves: the mul_mat nodes that
 * follow one another, read the same x value with at most max_gemv_columns
 * columns, and whose weights the same kernel-variant context serves with
 * gemv_multi (ABI 1.4), up to Q4KH_GEMV_MULTI_MAX of them, while no
 * output shares a byte with x, a bias or another output (the planner
 * keeps them apart: this only makes sure). 1 when no such run of two or
 * more starts at I.
 */
static int32_t multi_run(const struct q4kh_graph *g, int32_t i)
{
	const struct q4kh_node *first = &g->nodes[i];
	const struct q4kh_weight *w0;
	const struct q4kh_kernel *k;
	const struct q4kh_tensor *x;
	int32_t n = 0;

	if (first->op != Q4KH_OP_MUL_MAT)
		return 1;
	w0 = g->vals[first->src[0]].weight;
	k = w0 ? w0->kernel : NULL;
	x = &g->vals[first->src[1]].t;
	if (!k || !Q4KH_KERNEL_HAS(k->v, gemv_multi) ||
	    x->ne[1] > (int64_t)k->v->max_gemv_columns)
		return 1;
	for (; n < Q4KH_GEMV_MULTI_MAX && i + n < g->n_nodes; n++) {
		const struct q4kh_node *nd = &g->nodes[i + n];
		const struct q4kh_weight *w;
		int ok;

		if (nd->op != Q4KH_OP_MUL_MAT || nd->src[1] != first->src[1])
			break;
		w = g->vals[nd->src[0]].weight;
		ok = w && w->kernel && w->kernel->v == k->v &&
		     w->kernel->ctx == k->ctx && w->t.ne[0] == x->ne[0];

		for (int32_t j = 0; j <= n && ok; j++)
			ok = apart(g, &g->nodes[i + j], nd);
		if (!ok)
			break;
	}
	return n > 1 ? n : 1;
}

/*
 * Nodes [I, I + N) of multi_run as one gemv_multi; when the variant
 * answers Q4KH_ERR_UNSUPPORTED (it does not fuse this combination), node
 * by node instead.
 */
static int run_multi(const struct q4kh_graph *g, int32_t i, int32_t n,
                     const struct q4kh_backend *b, struct q4kh_error *err)
{
	const struct q4kh_node *nodes = &g->nodes[i];
	const struct q4kh_kernel *k = g->vals[nodes[0].src[0]].weight->kernel;
	q4kh_prepared *w[Q4KH_GEMV_MULTI_MAX];
	const struct q4kh_tensor *y[Q4KH_GEMV_MULTI_MAX];
	const struct q4kh_tensor *bias[Q4KH_GEMV_MULTI_MAX];
	q4kh_status st;

	for (int32_t j = 0; j < n; j++) {
		w[j] = g->vals[nodes[j].src[0]].weight->prepared;
		y[j] = &g->vals[nodes[j].out].t;
		bias[j] = bias_of(g, &nodes[j]);
	}
	st = k->v->gemv_multi(k->ctx, &k->native, (uint32_t)n, w,
	                      &g->vals[nodes[0].src[1]].t, y, bias);
	if (st != Q4KH_ERR_UNSUPPORTED)
		return q4kh_kernel_check(k, st, "gemv_multi", err);
	for (int32_t j = 0; j < n; j++) {
		const struct q4kh_node *nd = &nodes[j];

		if (matmul(b, g->vals[nd->src[0]].weight, &g->vals[nd->src[1]].t,
		           bias[j], y[j], g, nd, err))
			return -1;
	}
	return 0;
}

/* Is activation V read by no node after node N (N its last reader)? */
static int dead_after(const struct q4kh_graph *g, int32_t v, int32_t n)
{
	return g->vals[v].kind == Q4KH_VAL_ACT && g->vals[v].last == n;
}

/*
 * Nodes I, I + 1, I + 2 as one gemv_glu (ABI 1.4) when they are a
 * feed-forward block's MUL_MAT gate, MUL_MAT up of the same x (no bias)
 * and GLU(gate, up), both weights served by one kernel-variant context
 * that has the entry, of the same K and N, with x at most
 * max_gemv_columns columns. The call writes the GLU's output only, never
 * the products: up's value must be read by nothing after the GLU, and so
 * must gate's unless it is the GLU's output (in place, as q4kh_block_ffn
 * builds it); the output shares no byte with x. Returns 3 (the nodes
 * that ran), 0 when the nodes run as they are (not the pattern, or the
 * variant answered Q4KH_ERR_UNSUPPORTED, having done nothing), -1 with
 * err on a failure.
 */
static int32_t fuse_gemv_glu(const struct q4kh_graph *g, int32_t i,
                             struct q4kh_error *err)
{
	const struct q4kh_node *gate = &g->nodes[i], *up = gate + 1, *glu = gate + 2;
	const struct q4kh_weight *wg, *wu;
	const struct q4kh_kernel *k;
	const struct q4kh_tensor *x, *y;
	q4kh_status st;

	if (i + 2 >= g->n_nodes || gate->op != Q4KH_OP_MUL_MAT ||
	    up->op != Q4KH_OP_MUL_MAT || glu->op != Q4KH_OP_GLU ||
	    up->src[1] != gate->src[1] || gate->src[2] >= 0 || up->src[2] >= 0 ||
	    glu->src[0] != gate->out || glu->src[1] != up->out || gate->out == up->out ||
	    !dead_after(g, up->out, i + 2) ||
	    (glu->out != gate->out && !dead_after(g, gate->out, i + 2)))
		return 0;
	wg = g->vals[gate->src[0]].weight;
	wu = g->vals[up->src[0]].weight;
	k = wg ? wg->kernel : NULL;
	x = &g->vals[gate->src[1]].t;
	y = &g->vals[glu->out].t;
	if (!k || !wu || !wu->kernel || wu->kernel->v != k->v || wu->kernel->ctx != k->ctx ||
	    !Q4KH_KERNEL_HAS(k->v, gemv_glu) ||
	    x->ne[1] > (int64_t)k->v->max_gemv_columns || wg->t.ne[0] != x->ne[0] ||
	    wu->t.ne[0] != x->ne[0] || wg->t.ne[1] != wu->t.ne[1] || f32_overlap(y, x))
		return 0;
	st = k->v->gemv_glu(k->ctx, &k->native, (q4kh_glu_kind)glu->i[0], wg->prepared,
	                    wu->prepared, x, y);
	if (st == Q4KH_ERR_UNSUPPORTED)
		return 0;
	return q4kh_kernel_check(k, st, "gemv_glu", err) ? -1 : 3;
}

/* Are pos[0 .. n) consecutive, as the 1.0 entries' single pos0 needs? */
static int consecutive(const int32_t *pos, int64_t n, const char *what,
                       struct q4kh_error *err)
{
	for (int64_t t = 1; t < n; t++)
		if (pos[t] != pos[0] + t)
			return q4kh_fail(err, "%s: positions %d, %d are not consecutive, and the backend has no set_rows/attention_ext (ABI 1.2) to take them as they are",
			                 what, pos[0], pos[t]);
	return 0;
}

/*
 * The host copy of the positions POS holds, the step's or a view of some
 * of them (one sequence's of a batched step), and in *N their count.
 */
static const int32_t *host_pos(const struct q4kh_graph *g, const struct q4kh_tensor *pos,
                               const struct q4kh_step_values *in, int64_t *n)
{
	*n = pos->ne[0];
	return in->pos + (pos->offset - g->vals[g->pos].t.offset) / sizeof(int32_t);
}

static int run_node(const struct q4kh_graph *g, const struct q4kh_node *n,
                    const struct q4kh_backend *b,
                    const struct q4kh_step_values *in, struct q4kh_error *err)
{
	const struct q4kh_backend_v1 *v = b->v;
	q4kh_device_ctx *dev = b->dev;
	const struct q4kh_value *vals = g->vals;
	const struct q4kh_tensor *out = &vals[n->out].t;
	const struct q4kh_tensor *s[Q4KH_GRAPH_SRC];
	char what[96];

	for (int k = 0; k < Q4KH_GRAPH_SRC; k++)
		s[k] = n->src[k] >= 0 ? &vals[n->src[k]].t : NULL;
	switch (n->op) {
	case Q4KH_OP_GET_ROWS:
		if (Q4KH_BACKEND_HAS(v, get_rows_ext))
			CALL(v->get_rows_ext(dev, s[0], s[1], n->f[0], out));
		else
			CALL(v->get_rows(dev, s[0], in->ids, g->n_tokens, n->f[0], out));
		return 0;
	case Q4KH_OP_MUL_MAT:
		return matmul(b, vals[n->src[0]].weight, s[1], s[2], out, g, n, err);
	case Q4KH_OP_RMS_NORM:
		CALL(v->rms_norm(dev, s[0], s[1], n->f[0], out));
		return 0;
	case Q4KH_OP_ROPE: {
		struct q4kh_rope_params p = n->rope;

		p.freq_factors = s[2];
		if (Q4KH_BACKEND_HAS(v, rope_ext)) {
			CALL(v->rope_ext(dev, s[0], s[1], &p, out));
			return 0;
		}
		if (p.freq_factors || p.ext_factor != 0.0f || p.attn_factor != 1.0f)
			return q4kh_fail(err, "%s: this model's RoPE scaling (frequency factors or YaRN) needs rope_ext (ABI 1.2), which %s lacks",
			                 WHAT, b->plugin->name);
		CALL(v->rope(dev, s[0], in->pos, p.n_rot, (q4kh_rope_mode)p.mode,
		             p.base, p.freq_scale, out));
		return 0;
	}
	case Q4KH_OP_ADD:
		CALL(v->add(dev, s[0], s[1], out));
		return 0;
	case Q4KH_OP_SCALE:
		CALL(v->scale(dev, s[0], n->f[0], out));
		return 0;
	case Q4KH_OP_GLU:
		CALL(v->glu(dev, (q4kh_glu_kind)n->i[0], s[0], s[1], out));
		return 0;
	case Q4KH_OP_SET_ROWS:
		if (Q4KH_BACKEND_HAS(v, set_rows)) {
			CALL(v->set_rows(dev, s[0], s[1], out));
		} else {
			struct q4kh_tensor rows;
			int64_t np;
			const int32_t *pos = host_pos(g, s[1], in, &np);

			if (consecutive(pos, np, WHAT, err))
				return -1;
			rows = q4kh_tensor_cols(out, pos[0], np);
			CALL(v->copy(dev, s[0], &rows));
		}
		return 0;
	case Q4KH_OP_ATTENTION: {
		int64_t np;
		const int32_t *pos = host_pos(g, s[3], in, &np);
		struct q4kh_attn_params p = {
			.struct_size = sizeof(p),
			.window = n->i[0],
			.pos0 = pos[0],
			.scale = n->f[0],
			.softcap = n->f[1],
		};

		if (Q4KH_BACKEND_HAS(v, attention_ext)) {
			CALL(v->attention_ext(dev, s[0], s[1], s[2], s[3], &p, out));
			return 0;
		}
		if (consecutive(pos, np, WHAT, err))
			return -1;
		CALL(v->attention(dev, s[0], s[1], s[2], &p, out));
		return 0;
	}
	case Q4KH_OP_MUL:
		CALL(v->mul(dev, s[0], s[1], out));
		return 0;
	case Q4KH_OP_COPY:
		CALL(v->copy(dev, s[0], out));
		return 0;
	/* q4kh_graph_missing has checked that the backend has these three */
	case Q4KH_OP_UNARY:
		CALL(v->unary(dev, (q4kh_unary_kind)n->i[0], s[0], out));
		return 0;
	case Q4KH_OP_SSM_CONV:
		CALL(v->ssm_conv(dev, s[0], s[1], s[2], out));
		return 0;
	case Q4KH_OP_DELTA_NET:
		CALL(v->delta_net(dev, s[0], s[1], s[2], s[3], s[4], s[5], n->f[0],
		                  out));
		return 0;
	}
	return q4kh_fail(err, "step graph: node of unknown op %d", (int)n->op);
}

const char *q4kh_graph_missing(const struct q4kh_graph *g,
                               const struct q4kh_backend *b)
{
	const struct q4kh_backend_v1 *v = b->v;

	for (int32_t i = 0; i < g->n_nodes; i++) {
		switch (g->nodes[i].op) {
		case Q4KH_OP_UNARY:
			if (!Q4KH_BACKEND_HAS(v, unary))
				return "unary";
			break;
		case Q4KH_OP_SSM_CONV:
			if (!Q4KH_BACKEND_HAS(v, ssm_conv))
				return "ssm_conv";
			break;
		case Q4KH_OP_DELTA_NET:
			if (!Q4KH_BACKEND_HAS(v, delta_net))
				return "delta_net";
			break;
		default: /* the 1.0 entries, or a fallback to them */
			break;
		}
	}
	return NULL;
}

/*
 * The peephole: pairs of consecutive nodes that a backend with the ABI 1.4
 * fused entries runs as one call (one kernel instead of two on a GPU,
 * where a decode step is bound by launches). Each fuse_* function looks
 * at node N and the node M after it, and when they form its pattern, the
 * tensors satisfy the fused entry's contract (plugin.h) and the backend
 * has the entry, issues the one call and returns 1: the caller then skips
 * both nodes. Otherwise it returns 0 and the nodes run one by one, as on
 * a backend without the entry; -1 when the call fails. A fused entry
 * gives what its two entries give, so a step's result does not depend on
 * whether the backend has it. The builders (arch_*.c) issue each pair
 * back to back.
 */

/* The same view: buffer, offset, type, shape and strides. */
static int same_view(const struct q4kh_tensor *a, const struct q4kh_tensor *b)
{
	return a->buffer == b->buffer && a->offset == b->offset && a->type == b->type &&
	       !memcmp(a->ne, b->ne, sizeof(a->ne)) && !memcmp(a->nb, b->nb, sizeof(a->nb));
}

/* 1 when fused call ST succeeded, -1 with err naming it (WHAT) when not. */
static int fused(const struct q4kh_backend *b, q4kh_status st, const char *what,
                 struct q4kh_error *err)
{
	return q4kh_backend_check(b, st, what, err) ? -1 : 1;
}

/*
 * ADD x = x + a (in place on either operand, a of x's very shape), then
 * RMS_NORM of exactly that x (the same view: the next norm of the
 * residual stream) into an out that is a, or apart from a: the operands
 * of add_rms_norm in *X, *A (its value in *AV), *W and *OUT; 0 when the
 * nodes are not that pair.
 */
static int add_norm_pair(const struct q4kh_graph *g, const struct q4kh_node *n,
                         const struct q4kh_node *m, const struct q4kh_tensor **x,
                         int32_t *av, const struct q4kh_tensor **w,
                         const struct q4kh_tensor **out)
{
	const struct q4kh_check quiet = { 0 }; /* a refusal writes nothing */
	const struct q4kh_tensor *a;

	if (n->op != Q4KH_OP_ADD || m->op != Q4KH_OP_RMS_NORM ||
	    (n->out != n->src[0] && n->out != n->src[1]))
		return 0;
	/* a + b is b + a in floating point too: x may be either operand */
	*x = &g->vals[n->out].t;
	*av = n->src[n->out == n->src[0] ? 1 : 0];
	a = &g->vals[*av].t;
	*w = m->src[1] >= 0 ? &g->vals[m->src[1]].t : NULL;
	*out = &g->vals[m->out].t;
	return same_view(&g->vals[m->src[0]].t, *x) && !memcmp(a->ne, (*x)->ne, sizeof(a->ne)) &&
	       !q4kh_check_disjoint(&quiet, "", a, "", *x) &&
	       !q4kh_check_in_place(&quiet, "", *out, "", a);
}

/* Nodes N, N + 1 as add_rms_norm where the backend has it (add_norm_pair). */
static int fuse_add_rms_norm(const struct q4kh_graph *g, const struct q4kh_node *n,
                             const struct q4kh_node *m, const struct q4kh_backend *b,
                             struct q4kh_error *err)
{
	const struct q4kh_tensor *x, *w, *out;
	int32_t av;
	char what[96];

	if (!Q4KH_BACKEND_HAS(b->v, add_rms_norm) || !add_norm_pair(g, n, m, &x, &av, &w, &out))
		return 0;
	snprintf(what, sizeof(what), "add_rms_norm (%s)", g->vals[m->out].name);
	return fused(b, b->v->add_rms_norm(b->dev, x, &g->vals[av].t, w, m->f[0], out), what,
	             err);
}

/*
 * RMS_NORM of a in place (a block's output norm), then the add_norm_pair
 * that adds exactly that a to the residual stream and norms it again:
 * norm_add_rms_norm (ABI 1.5), nodes N .. N + 2.
 */
static int fuse_norm_add_rms_norm(const struct q4kh_graph *g, const struct q4kh_node *n,
                                  const struct q4kh_backend *b, struct q4kh_error *err)
{
	const struct q4kh_tensor *x, *w, *out, *wa;
	int32_t av;
	char what[96];

	if (n->op != Q4KH_OP_RMS_NORM || n->out != n->src[0] ||
	    !Q4KH_BACKEND_HAS(b->v, norm_add_rms_norm) ||
	    !add_norm_pair(g, n + 1, n + 2, &x, &av, &w, &out) || av != n->out)
		return 0;
	wa = n->src[1] >= 0 ? &g->vals[n->src[1]].t : NULL;
	snprintf(what, sizeof(what), "norm_add_rms_norm (%s)", g->vals[n[2].out].name);
	return fused(b, b->v->norm_add_rms_norm(b->dev, x, &g->vals[av].t, wa, n->f[0], w,
	                                        n[2].f[0], out),
	             what, err);
}

/*
 * ROPE of x in place, then SET_ROWS of exactly that x into a cache at the
 * same positions (the keys of an attention layer): rope_set_rows.
 */
static int fuse_rope_set_rows(const struct q4kh_graph *g, const struct q4kh_node *n,
                              const struct q4kh_node *m, const struct q4kh_backend *b,
                              struct q4kh_error *err)
{
	const struct q4kh_tensor *x = &g->vals[n->out].t;
	struct q4kh_rope_params p = n->rope;
	char what[96];

	if (n->op != Q4KH_OP_ROPE || m->op != Q4KH_OP_SET_ROWS ||
	    !Q4KH_BACKEND_HAS(b->v, rope_set_rows) || !same_view(&g->vals[n->src[0]].t, x) ||
	    !same_view(&g->vals[m->src[0]].t, x) || m->src[1] != n->src[1])
		return 0;
	p.freq_factors = n->src[2] >= 0 ? &g->vals[n->src[2]].t : NULL;
	snprintf(what, sizeof(what), "rope_set_rows (%s)", g->vals[m->out].name);
	return fused(b, b->v->rope_set_rows(b->dev, x, &g->vals[n->src[1]].t, &p,
	                                    &g->vals[m->out].t),
	             what, err);
}

/*
 * An attention layer's inputs, four nodes from N: ROPE of q in place,
 * ROPE of k in place with the same positions, parameters and frequency
 * factors, SET_ROWS of exactly that k into the keys' cache, SET_ROWS of v
 * into the values' cache at the same positions: rope_store. Returns 1
 * when it ran them (the caller skips the four), 0 when the nodes do not
 * form the pattern, -1 when the call fails. Every architecture's
 * attention block builds the four back to back (arch_blocks.c; Gemma's
 * scale of q is the attention's scale, not a node between them).
 */
static int fuse_rope_store(const struct q4kh_graph *g, const struct q4kh_node *n,
                           const struct q4kh_backend *b, struct q4kh_error *err)
{
	const struct q4kh_check quiet = { 0 }; /* a refusal writes nothing */
	const struct q4kh_tensor *q = &g->vals[n[0].out].t, *k = &g->vals[n[1].out].t;
	const struct q4kh_tensor *v, *pos = &g->vals[n[0].src[1]].t;
	struct q4kh_rope_params p = n[0].rope;
	char what[96];

	if (n[0].op != Q4KH_OP_ROPE || n[1].op != Q4KH_OP_ROPE ||
	    n[2].op != Q4KH_OP_SET_ROWS || n[3].op != Q4KH_OP_SET_ROWS ||
	    !Q4KH_BACKEND_HAS(b->v, rope_store) || !same_view(&g->vals[n[0].src[0]].t, q) ||
	    !same_view(&g->vals[n[1].src[0]].t, k) || !same_view(&g->vals[n[2].src[0]].t, k) ||
	    n[1].src[1] != n[0].src[1] || n[2].src[1] != n[0].src[1] ||
	    n[3].src[1] != n[0].src[1] || n[1].src[2] != n[0].src[2] ||
	    /* whole structs: numbers only, no padding, freq_factors NULL */
	    memcmp(&n[1].rope, &n[0].rope, sizeof(p)))
		return 0;
	v = &g->vals[n[3].src[0]].t;
	if (q4kh_check_rope_store_apart(&quiet, q, k, v, pos, &g->vals[n[2].out].t,
	                                &g->vals[n[3].out].t))
		return 0;
	p.freq_factors = n[0].src[2] >= 0 ? &g->vals[n[0].src[2]].t : NULL;
	snprintf(what, sizeof(what), "rope_store (%s)", g->vals[n[2].out].name);
	return fused(b, b->v->rope_store(b->dev, q, k, v, pos, &p, &g->vals[n[2].out].t,
	                                 &g->vals[n[3].out].t),
	             what, err);
}

/*
 * Run what starts at node I: gate, up and their GLU (one gemv_glu), a
 * group of products of one input (one gemv_multi), a fused group
 * (rope_store's four nodes, then the pairs), or the node alone. Returns
 * the nodes that ran, -1 with err on a failure.
 */
static int32_t run_at(const struct q4kh_graph *g, int32_t i,
                      const struct q4kh_backend *b,
                      const struct q4kh_step_values *in, struct q4kh_error *err)
{
	const struct q4kh_node *n = &g->nodes[i];
	const int32_t ffn = fuse_gemv_glu(g, i, err);
	int32_t group;
	int rc = 0;

	if (ffn)
		return ffn;
	group = multi_run(g, i);
	if (group > 1)
		return run_multi(g, i, group, b, err) ? -1 : group;
	if (i + 3 < g->n_nodes && (rc = fuse_rope_store(g, n, b, err)))
		return rc < 0 ? -1 : 4;
	if (i + 2 < g->n_nodes && (rc = fuse_norm_add_rms_norm(g, n, b, err)))
		return rc < 0 ? -1 : 3;
	if (i + 1 < g->n_nodes) {
		rc = fuse_add_rms_norm(g, n, n + 1, b, err);
		if (!rc)
			rc = fuse_rope_set_rows(g, n, n + 1, b, err);
	}
	if (rc)
		return rc < 0 ? -1 : 2;
	return run_node(g, n, b, in, err) ? -1 : 1;
}

int q4kh_graph_run(const struct q4kh_graph *g, const struct q4kh_backend *b,
                   const struct q4kh_step_values *in, struct q4kh_error *err)
{
	for (int32_t i = 0, ran; i < g->n_nodes; i += ran)
		if ((ran = run_at(g, i, b, in, err)) < 0)
			return -1;
	return 0;
}

const char *q4kh_graph_replay_missing(const struct q4kh_backend *b)
{
	const struct q4kh_backend_v1 *v = b->v;

#define NEED(f)                                  \
	if (!Q4KH_BACKEND_HAS(v, f))             \
		return #f;
	NEED(graph_begin) NEED(graph_end) NEED(graph_launch) NEED(graph_free)
	NEED(get_rows_ext) NEED(rope_ext) NEED(set_rows) NEED(attention_ext)
#undef NEED
	return NULL;
}

#undef WHAT
#define WHAT what

int q4kh_graph_record(const struct q4kh_graph *g, const struct q4kh_backend *b,
                      const struct q4kh_step_values *in, q4kh_graph **out,
                      struct q4kh_error *err)
{
	const char *what = "graph_begin";
	int rc;

	*out = NULL;
	CALL(b->v->graph_begin(b->dev));
	rc = q4kh_graph_run(g, b, in, err);
	what = "graph_end";
	/* graph_end ends the recording even when it fails or the run did */
	if (q4kh_backend_check(b, b->v->graph_end(b->dev, out), what,
	                       rc ? NULL : err) || rc) {
		b->v->graph_free(b->dev, *out);
		*out = NULL;
		return -1;
	}
	return 0;
}
