/*
 * ABI 1.6's step entries (plugin.h: graph_prepare, graph_compute,
 * graph_release; cuda.h says what each does here). A prepared step is the
 * host's graph copied, with its calls planned once by q4khost/step.h over
 * the backend's own table, so its fused groups are those the host's
 * interpreter issues on this backend and its logits the same bits. The
 * first run issues the calls on the stream; the second records them with
 * cuda_measure.c's capture and launches the recording, which every later
 * run replays: between runs the host rewrites only the ids and positions,
 * and over a paged KV cache the slots and block tables, which the kernels
 * read from device memory when they run (cuda_step.c): a recorded step
 * over pages replays for any tables of its shape.
 * A one-token step's decoder layers, where cuda_persist.c reads them as
 * the llama family's, are one call: the persistent kernel. A decode's
 * mixture-of-experts block, from its route to the slots' sum, is two
 * launches (match_moe), with the bits of its nodes. The per-head q and k
 * norms of Gemma 3 and Qwen3 and the rope_store after them are one
 * launch (match_head_norms), with the bits of its six nodes;
 * [plugin.cuda] fuse = 0 plans without that group (A/B runs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "q4khost/cuda_tc.h"
#include "q4khost/step.h"

/* One call of the plan: nodes [first, first + n) as pattern FUSE, or as
 * a decode's mixture-of-experts block with MOE (match_moe), or as the
 * heads' norms and rope_store with HEAD_NORMS (match_head_norms). */
struct cuda_group {
	int32_t first, n;
	q4kh_step_fuse fuse;
	int moe;
	int head_norms;
};

struct q4kh_step {
	struct q4kh_step_graph *g; /* the host's, copied (q4kh_step_copy) */
	struct cuda_persist_plan *persist; /* the layers as one launch, or NULL */
	struct cuda_group *groups;
	int32_t n_groups;
	uint32_t fused;      /* nodes inside groups of two or more */
	uint64_t runs;       /* runs issued without an error */
	q4kh_graph *rec;     /* the recording, from the second run on */
	uint32_t rec_nodes;  /* its nodes: what one replay launches */
	char no_record[256]; /* why recording failed (runs stay eager) */
};

/* --- checking and copying the host's graph --- */

/* Sources each op needs (plugin.h's q4kh_op); later ones are optional. */
static const int8_t needs[] = {
	[Q4KH_OP_GET_ROWS] = 2, [Q4KH_OP_MUL_MAT] = 2,   [Q4KH_OP_RMS_NORM] = 1,
	[Q4KH_OP_ROPE] = 2,     [Q4KH_OP_ADD] = 2,       [Q4KH_OP_SCALE] = 1,
	[Q4KH_OP_GLU] = 2,      [Q4KH_OP_SET_ROWS] = 2,  [Q4KH_OP_ATTENTION] = 4,
	[Q4KH_OP_MUL] = 2,      [Q4KH_OP_COPY] = 1,      [Q4KH_OP_UNARY] = 1,
	[Q4KH_OP_SSM_CONV] = 3, [Q4KH_OP_DELTA_NET] = 6, [Q4KH_OP_MOE_ROUTE] = 2,
	[Q4KH_OP_MUL_MAT_ID] = 3, [Q4KH_OP_ATTENTION_PAGED] = 5,
};

#define N_OPS (int32_t)(sizeof(needs) / sizeof(needs[0]))

static int in_range(int32_t v, const struct q4kh_step_graph *g)
{
	return v >= 0 && v < g->n_values;
}

/* A value's name for a message. */
static const char *name_of(const struct q4kh_step_graph *g, int32_t v)
{
	const char *name = in_range(v, g) ? q4kh_step_value_at(g, v)->name : NULL;

	return name ? name : "unnamed";
}

/* Is every view of G's values a chain that ends in a value of its own? */
static q4kh_status check_values(q4kh_device_ctx *dev, const struct q4kh_step_graph *g)
{
	for (int32_t i = 0; i < g->n_values; i++) {
		int32_t v = i, hops = 0;

		while (q4kh_step_value_at(g, v)->kind == Q4KH_VAL_VIEW) {
			v = q4kh_step_value_at(g, v)->base;
			if (!in_range(v, g) || ++hops > g->n_values)
				return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
				                 "graph_prepare: value %d (%s) views %s, expected a "
				                 "chain of views that ends in one of the graph's %d values",
				                 i, name_of(g, i), in_range(v, g) ? "itself" : "no value",
				                 g->n_values);
		}
	}
	return Q4KH_OK;
}

/*
 * Can node I of G run here? Its sources and output well formed
 * (Q4KH_ERR_INVALID otherwise), and its op, weight or shape one this
 * backend takes (Q4KH_ERR_UNSUPPORTED otherwise: the host runs the graph).
 */
static q4kh_status check_node(q4kh_device_ctx *dev, const struct q4kh_step_graph *g, int32_t i)
{
	const struct q4kh_step_node *n = q4kh_step_node_at(g, i);
	const struct q4kh_step_value *w;

	if (n->op >= (uint32_t)N_OPS)
		return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
		                 "graph_prepare: node %d: op %u (%s), which cuda does not run", i,
		                 n->op, q4kh_step_op_name(n->op));
	if (!in_range(n->out, g))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "graph_prepare: node %d (%s): output %d, expected a value in "
		                 "0 .. %d", i, q4kh_step_op_name(n->op), n->out, g->n_values - 1);
	for (int k = 0; k < Q4KH_STEP_SRC; k++)
		if (n->src[k] < -1 || n->src[k] >= g->n_values ||
		    (k < needs[n->op] && n->src[k] < 0))
			return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
			                 "graph_prepare: node %d (%s, writes %s): source %d is %d, "
			                 "expected a value in 0 .. %d%s", i,
			                 q4kh_step_op_name(n->op), name_of(g, n->out), k, n->src[k],
			                 g->n_values - 1, k < needs[n->op] ? "" : " or -1");
	switch ((q4kh_op)n->op) {
	case Q4KH_OP_GET_ROWS:
		w = q4kh_step_value_at(g, n->src[0]);
		if (!cuda_type_supported(w->t.type))
			return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "graph_prepare: node %d (get_rows of %s): cuda has no "
			                 "rows of type %s", i, name_of(g, n->src[0]),
			                 q4kh_type_name(w->t.type));
		break;
	case Q4KH_OP_MUL_MAT:
		w = q4kh_step_value_at(g, n->src[0]);
		if (w->kernel && (!Q4KH_KERNEL_HAS(w->kernel, gemv) ||
		                  !Q4KH_KERNEL_HAS(w->kernel, gemm)))
			return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "graph_prepare: node %d (mul_mat of %s): its kernel "
			                 "variant has no %s", i, name_of(g, n->src[0]),
			                 Q4KH_KERNEL_HAS(w->kernel, gemv) ? "gemm" : "gemv");
		if (!w->kernel && !cuda_type_supported(w->t.type))
			return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "graph_prepare: node %d (mul_mat of %s): cuda does not "
			                 "multiply %s weights", i, name_of(g, n->src[0]),
			                 q4kh_type_name(w->t.type));
		break;
	case Q4KH_OP_MOE_ROUTE:
	case Q4KH_OP_MUL_MAT_ID:
		w = q4kh_step_value_at(g, n->src[0]);
		/* the router's logits {E, T}, or the experts' stack {K, N, E} */
		if (w->t.ne[n->op == Q4KH_OP_MOE_ROUTE ? 0 : 2] > CUDA_MOE_MAX_EXPERTS)
			return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "graph_prepare: node %d (%s of %s): %lld experts, cuda "
			                 "takes at most %d", i, q4kh_step_op_name(n->op),
			                 name_of(g, n->src[0]),
			                 (long long)w->t.ne[n->op == Q4KH_OP_MOE_ROUTE ? 0 : 2],
			                 CUDA_MOE_MAX_EXPERTS);
		if (n->op == Q4KH_OP_MUL_MAT_ID && !cuda_type_supported(w->t.type))
			return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "graph_prepare: node %d (mul_mat_id of %s): cuda does not "
			                 "multiply %s weights", i, name_of(g, n->src[0]),
			                 q4kh_type_name(w->t.type));
		break;
	case Q4KH_OP_DELTA_NET:
		if (q4kh_step_value_at(g, n->src[0])->t.ne[0] > CUDA_DELTA_MAX_KEYS)
			return cuda_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "graph_prepare: node %d (delta_net into %s): %lld keys a "
			                 "head, cuda takes at most %d", i, name_of(g, n->out),
			                 (long long)q4kh_step_value_at(g, n->src[0])->t.ne[0],
			                 CUDA_DELTA_MAX_KEYS);
		break;
	default:
		break;
	}
	return Q4KH_OK;
}

static q4kh_status check_graph(q4kh_device_ctx *dev, const struct q4kh_step_graph *g)
{
	q4kh_status st;

	if (g->struct_size < sizeof(*g) || g->node_size < sizeof(struct q4kh_step_node) ||
	    g->value_size < sizeof(struct q4kh_step_value))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "graph_prepare: a graph of %u bytes, nodes of %u and values "
		                 "of %u: expected at least ABI 1.6's %zu, %zu and %zu",
		                 g->struct_size, g->node_size, g->value_size, sizeof(*g),
		                 sizeof(struct q4kh_step_node), sizeof(struct q4kh_step_value));
	if (g->n_nodes < 1 || g->n_values < 1 || !g->nodes || !g->values ||
	    (g->ids != -1 && !in_range(g->ids, g)) || (g->pos != -1 && !in_range(g->pos, g)) ||
	    (g->logits != -1 && !in_range(g->logits, g)))
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "graph_prepare: %d nodes over %d values, ids %d, pos %d, "
		                 "logits %d: expected nodes and values, and inputs and logits "
		                 "among the values or -1", g->n_nodes, g->n_values, g->ids, g->pos,
		                 g->logits);
	if ((st = check_values(dev, g)))
		return st;
	for (int32_t i = 0; i < g->n_nodes; i++)
		if ((st = check_node(dev, g, i)))
			return st;
	return Q4KH_OK;
}

/* --- a decode's mixture of experts in two launches --- */

/* Is T the view of slot J of D {N, k, T}: {N, T}, tokens D's apart? */
static int slot_view(const struct q4kh_tensor *t, const struct q4kh_tensor *d, int64_t j)
{
	return t->buffer == d->buffer && t->type == d->type &&
	       t->offset == d->offset + (uint64_t)j * d->nb[1] && t->ne[0] == d->ne[0] &&
	       t->ne[1] == d->ne[2] && t->ne[2] == 1 && t->ne[3] == 1 && t->nb[0] == d->nb[0] &&
	       t->nb[1] == d->nb[2];
}

/*
 * The nodes from I that q4kh_block_moe (host/lib/arch_blocks.c) makes of
 * a block of the experts with few columns (mul_mat_id's direct form:
 * decode), which cuda_launch_moe_fused runs in two launches, or 0:
 * moe_route into ids and weights; mul_mat_id of gate and
 * of up, of one x and those ids; their SiLU GLU into h; mul_mat_id of down
 * of h into d; d times the weights {1, k, T} in place; the k slots of d
 * copied (k = 1) or added in slot order into out. Every contract check of
 * those nodes holds (else they run one by one and report it), up, d (and
 * gate, when h is not it) are read by no later node, and out, h, ids and
 * weights are written where no launch reads them.
 */
static int32_t match_moe(q4kh_device_ctx *dev, const struct q4kh_step_graph *g, int32_t i)
{
	struct q4kh_check quiet = cuda_contract(dev);
	const struct q4kh_step_node *n[6];
	const struct q4kh_tensor *ids, *wts, *x, *h, *d, *m, *out;
	int64_t k;
	int32_t last;

	if (i + 6 >= g->n_nodes)
		return 0;
	for (int j = 0; j < 6; j++)
		n[j] = q4kh_step_node_at(g, i + j);
	if (n[0]->op != Q4KH_OP_MOE_ROUTE || n[1]->op != Q4KH_OP_MUL_MAT_ID ||
	    n[2]->op != Q4KH_OP_MUL_MAT_ID || n[3]->op != Q4KH_OP_GLU ||
	    n[4]->op != Q4KH_OP_MUL_MAT_ID || n[5]->op != Q4KH_OP_MUL ||
	    n[3]->i[0] != Q4KH_GLU_SILU || n[2]->src[1] != n[1]->src[1] ||
	    n[3]->src[0] != n[1]->out || n[3]->src[1] != n[2]->out ||
	    n[1]->out == n[2]->out || n[4]->src[1] != n[3]->out || n[5]->src[0] != n[4]->out ||
	    n[5]->out != n[4]->out)
		return 0;
	for (int j = 1; j < 5; j += j == 2 ? 2 : 1)
		if (n[j]->src[2] != n[0]->src[1])
			return 0;
	ids = q4kh_step_tensor(g, n[0]->src[1]);
	wts = q4kh_step_tensor(g, n[0]->out);
	x = q4kh_step_tensor(g, n[1]->src[1]);
	h = q4kh_step_tensor(g, n[3]->out);
	d = q4kh_step_tensor(g, n[4]->out);
	m = q4kh_step_tensor(g, n[5]->src[1]);
	k = ids->ne[0];
	quiet.msg = NULL; /* a refusal writes nothing */
	quiet.cap = 0;
	last = i + 5 + (k > 1 ? (int32_t)k - 1 : 1);
	if (last >= g->n_nodes || x->ne[1] != 1 ||
	    !cuda_mul_mat_id_direct(k * ids->ne[1], q4kh_step_tensor(g, n[1]->src[0])->ne[2]) ||
	    m->buffer != wts->buffer ||
	    m->offset != wts->offset || m->type != Q4KH_TYPE_F32 || m->ne[0] != 1 ||
	    m->ne[1] != k || m->ne[2] != wts->ne[1] || m->nb[1] != 4 || m->nb[2] != wts->nb[1])
		return 0;
	out = q4kh_step_tensor(g, q4kh_step_node_at(g, last)->out);
	for (int32_t j = 6; i + j <= last; j++) {
		const struct q4kh_step_node *a = q4kh_step_node_at(g, i + j);

		if (k == 1 ? a->op != Q4KH_OP_COPY ||
		                     !slot_view(q4kh_step_tensor(g, a->src[0]), d, 0)
		           : a->op != Q4KH_OP_ADD || a->out != q4kh_step_node_at(g, last)->out ||
		                     !slot_view(q4kh_step_tensor(g, a->src[1]), d, j - 5) ||
		                     !(j == 6 ? slot_view(q4kh_step_tensor(g, a->src[0]), d, 0)
		                              : a->src[0] == a->out))
			return 0;
	}
	if (q4kh_check_moe_route(&quiet, q4kh_step_tensor(g, n[0]->src[0]), n[0]->i[0], ids,
	                         wts) ||
	    q4kh_check_glu(&quiet, Q4KH_GLU_SILU, q4kh_step_tensor(g, n[1]->out),
	                   q4kh_step_tensor(g, n[2]->out), h) ||
	    out->type != Q4KH_TYPE_F32 || out->ne[0] != d->ne[0] || out->ne[1] != d->ne[2] ||
	    out->ne[2] != 1 || out->ne[3] != 1 || out->nb[0] != 4 ||
	    q4kh_check_disjoint(&quiet, "", out, "", h) ||
	    q4kh_check_disjoint(&quiet, "", out, "", ids) ||
	    q4kh_check_disjoint(&quiet, "", out, "", wts) ||
	    q4kh_check_disjoint(&quiet, "", h, "", x) ||
	    q4kh_check_disjoint(&quiet, "", ids, "", x) ||
	    q4kh_check_disjoint(&quiet, "", wts, "", x) ||
	    q4kh_check_disjoint(&quiet, "", h, "", ids) ||
	    q4kh_check_disjoint(&quiet, "", h, "", wts) ||
	    q4kh_check_disjoint(&quiet, "", h, "", q4kh_step_tensor(g, n[0]->src[0])) ||
	    !q4kh_step_dead_after(g, n[2]->out, last) || !q4kh_step_dead_after(g, n[4]->out, last) ||
	    (n[3]->out != n[1]->out && !q4kh_step_dead_after(g, n[1]->out, last)))
		return 0;
	for (int j = 1; j < 5; j += j == 2 ? 2 : 1)
		if (q4kh_check_mul_mat_id(&quiet, q4kh_step_tensor(g, n[j]->src[0]),
		                          q4kh_step_tensor(g, n[j]->src[1]), ids,
		                          q4kh_step_tensor(g, n[j]->out)))
			return 0;
	return last - i + 1;
}

/*
 * Run the block that match_moe found at node I as two launches; where
 * cuda_launch_moe_fused declines its types or alignment, its nodes one by
 * one.
 */
static q4kh_status issue_moe(q4kh_device_ctx *dev, const struct q4kh_step_graph *g, int32_t i,
                             int32_t n, struct q4kh_step_fail *fail)
{
	const struct q4kh_step_host_values none = { NULL, NULL };
	const struct q4kh_step_node *route = q4kh_step_node_at(g, i);
	struct cuda_moe_fused_views v;
	cudaError_t e;
	q4kh_status st;

	v.logits = cuda_view_of(q4kh_step_tensor(g, route->src[0]));
	v.ids = cuda_view_of(q4kh_step_tensor(g, route->src[1]));
	v.weights = cuda_view_of(q4kh_step_tensor(g, route->out));
	v.x = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + 1)->src[1]));
	v.gate = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + 1)->src[0]));
	v.up = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + 2)->src[0]));
	v.h = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + 3)->out));
	v.down = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + 4)->src[0]));
	v.out = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + n - 1)->out));
	e = cuda_launch_moe_fused(&v, route->i[0], dev->sms, dev->pdl, dev->stream);
	if (e != cudaErrorNotSupported)
		return cuda_launched(dev, "graph_compute: the experts' block", e);
	for (int32_t j = i; j < i + n; j++)
		if ((st = q4kh_step_issue_node(&cuda_backend, dev, g, j, &none, fail)))
			return st;
	return Q4KH_OK;
}

/* --- the heads' norms inside rope_store --- */

/* Is f32 tensor T's storage one run of its values, in order? */
static int f32_dense(const struct q4kh_tensor *t)
{
	int64_t nb = sizeof(float);

	for (int d = 0; d < 4; d++) {
		if (t->ne[d] > 1 && t->nb[d] != nb)
			return 0;
		nb *= t->ne[d];
	}
	return t->type == Q4KH_TYPE_F32;
}

/* Do A and B hold the same f32 values, contiguous, in one place? */
static int same_rows(const struct q4kh_tensor *a, const struct q4kh_tensor *b)
{
	int64_t na = 1, nb = 1;

	for (int d = 0; d < 4; d++) {
		na *= a->ne[d];
		nb *= b->ne[d];
	}
	return a->buffer == b->buffer && a->offset == b->offset && na == nb && f32_dense(a) &&
	       f32_dense(b);
}

/* Is node N an rms_norm, in place, of the heads of X {hd, heads, T}
 * (contiguous, hd <= CUDA_HEAD_NORM_MAX), with no weight or an f32 {hd}
 * one, whose contract checks hold? */
static int head_norm_of(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                        const struct q4kh_step_node *n, const struct q4kh_tensor *x)
{
	struct q4kh_check quiet = cuda_contract(dev);
	const struct q4kh_tensor *in = q4kh_step_tensor(g, n->src[0]);
	const struct q4kh_tensor *w = q4kh_step_tensor(g, n->src[1]);

	quiet.msg = NULL; /* a refusal writes nothing */
	quiet.cap = 0;
	return n->op == Q4KH_OP_RMS_NORM && x->ne[0] <= CUDA_HEAD_NORM_MAX &&
	       in->ne[0] == x->ne[0] && same_rows(in, q4kh_step_tensor(g, n->out)) &&
	       same_rows(in, x) && (!w || f32_dense(w)) &&
	       !q4kh_check_rms_norm(&quiet, in, w, n->f[0], q4kh_step_tensor(g, n->out));
}

/*
 * The nodes from I that arch_blocks.c's head_norm and rope_store make
 * when a layer norms its query and key heads (Gemma 3, Qwen3): rms_norm
 * of q's heads and of k's, in place, then the four nodes of a rope_store
 * of those q and k, whose contract checks hold: 6, which
 * cuda_launch_rope_store with the norms runs as one launch, or 0.
 */
static int32_t match_head_norms(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                                int32_t i)
{
	struct q4kh_check quiet = cuda_contract(dev);
	const struct q4kh_step_node *rq, *sk, *sv;
	struct q4kh_rope_params p;

	if (i + 5 >= g->n_nodes || q4kh_step_match(g, i + 2, Q4KH_FUSE_ROPE_STORE) != 4)
		return 0;
	rq = q4kh_step_node_at(g, i + 2);
	sk = q4kh_step_node_at(g, i + 4);
	sv = q4kh_step_node_at(g, i + 5);
	p = rq->rope;
	p.freq_factors = q4kh_step_tensor(g, rq->src[2]);
	quiet.msg = NULL;
	quiet.cap = 0;
	return head_norm_of(dev, g, q4kh_step_node_at(g, i), q4kh_step_tensor(g, rq->out)) &&
	               head_norm_of(dev, g, q4kh_step_node_at(g, i + 1),
	                            q4kh_step_tensor(g, q4kh_step_node_at(g, i + 3)->out)) &&
	               !q4kh_check_rope_store(&quiet, q4kh_step_tensor(g, rq->out),
	                                      q4kh_step_tensor(g, q4kh_step_node_at(g, i + 3)->out),
	                                      q4kh_step_tensor(g, sv->src[0]),
	                                      q4kh_step_tensor(g, rq->src[1]), &p,
	                                      q4kh_step_tensor(g, sk->out),
	                                      q4kh_step_tensor(g, sv->out))
	               ? 6
	               : 0;
}

/* Run the group that match_head_norms found at node I as one launch. */
static q4kh_status issue_head_norms(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                                    int32_t i)
{
	const struct q4kh_step_node *nq = q4kh_step_node_at(g, i);
	const struct q4kh_step_node *nk = q4kh_step_node_at(g, i + 1);
	const struct q4kh_step_node *rq = q4kh_step_node_at(g, i + 2);
	const struct q4kh_step_node *sv = q4kh_step_node_at(g, i + 5);
	const struct q4kh_tensor *wq = q4kh_step_tensor(g, nq->src[1]);
	const struct q4kh_tensor *wk = q4kh_step_tensor(g, nk->src[1]);
	const struct cuda_head_norms hn = {
		wq ? (const float *)cuda_view_of(wq).data : NULL,
		wk ? (const float *)cuda_view_of(wk).data : NULL,
		nq->f[0],
		nk->f[0],
	};
	struct q4kh_rope_params p = rq->rope;
	struct cuda_view q, k, v, kc, vc;
	struct cuda_rope r;

	p.freq_factors = q4kh_step_tensor(g, rq->src[2]);
	r = cuda_rope_of(&p);
	q = cuda_view_of(q4kh_step_tensor(g, rq->out));
	k = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + 3)->out));
	v = cuda_view_of(q4kh_step_tensor(g, sv->src[0]));
	kc = cuda_view_of(q4kh_step_tensor(g, q4kh_step_node_at(g, i + 4)->out));
	vc = cuda_view_of(q4kh_step_tensor(g, sv->out));
	return cuda_launched(dev, "graph_compute: the heads' norms and rope_store",
	                     cuda_launch_rope_store(
	                             &q, &k, &v,
	                             (const int32_t *)cuda_view_of(q4kh_step_tensor(g, rq->src[1]))
	                                     .data,
	                             &r, &kc, &vc, &hn, dev->fault, dev->pdl, dev->stream));
}

/* Free step S and what it holds. */
static void step_free(struct q4kh_step *s)
{
	cuda_persist_free(s->persist);
	q4kh_step_copy_free(s->g);
	free(s->groups);
	free(s);
}

/* The calls of S's graph, as the host's interpreter groups them. */
static q4kh_status plan(q4kh_device_ctx *dev, struct q4kh_step *s)
{
	const int own = dev->ctx->fuse != 0;
	int32_t moe = 0, heads = 0;

	s->groups = calloc((size_t)s->g->n_nodes, sizeof(*s->groups));
	if (!s->groups)
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                 "graph_prepare: out of memory planning %d nodes", s->g->n_nodes);
	for (int32_t i = 0, n; i < s->g->n_nodes; i += n) {
		struct cuda_group *c = &s->groups[s->n_groups++];

		c->first = i;
		if (s->persist && i == s->persist->first) {
			/* the persistent kernel's layers: one call */
			c->fuse = Q4KH_FUSE_NONE;
			n = s->persist->end - i;
			c->n = n;
			s->fused += (uint32_t)n;
			continue;
		}
		n = own ? match_head_norms(dev, s->g, i) : 0;
		c->head_norms = n > 0;
		if (!c->head_norms)
			c->moe = (n = match_moe(dev, s->g, i)) > 0;
		if (c->head_norms || c->moe) {
			c->fuse = Q4KH_FUSE_NONE;
			c->n = n;
			s->fused += (uint32_t)n;
			heads += c->head_norms;
			moe += c->moe;
			continue;
		}
		c->fuse = q4kh_step_next(&cuda_backend, s->g, i, ~0u, &n);
		c->n = n;
		if (n > 1)
			s->fused += (uint32_t)n;
	}
	if (moe)
		cuda_log(dev->ctx, Q4KH_LOG_DEBUG,
		         "cuda: a step of %lld tokens runs its %d blocks of experts as two "
		         "launches each", (long long)s->g->n_tokens, moe);
	if (heads)
		cuda_log(dev->ctx, Q4KH_LOG_DEBUG,
		         "cuda: a step of %lld tokens norms its query and key heads inside "
		         "rope_store's launch in %d layers", (long long)s->g->n_tokens, heads);
	return Q4KH_OK;
}

/*
 * The built-in products of G that go to tensor cores, each shape (K, N and
 * the step's columns) run once on DEV (q4kh_tc_warm_gemm): cuBLAS chooses
 * and loads its kernels for a shape at its first call, here rather than
 * in the step's first run (for a prompt, before the prefill's clock), and
 * the scratch grows to their size (plus one slice of output) now. What
 * fails is left for that product to report.
 */
static void warm_products(q4kh_device_ctx *dev, const struct q4kh_step_graph *g)
{
	const size_t base = CUDA_SCRATCH_COUNTERS * sizeof(int);
	char why[256];

	if (dev->recording || cuda_enter(dev, "graph_prepare"))
		return;
	for (int32_t i = 0; i < g->n_nodes; i++) {
		const struct q4kh_step_node *nd = q4kh_step_node_at(g, i);
		const struct q4kh_step_value *w, *x;
		int64_t k, n, t;
		int j;

		if (nd->op != Q4KH_OP_MUL_MAT)
			continue;
		w = q4kh_step_value_at(g, nd->src[0]);
		x = q4kh_step_value_at(g, nd->src[1]);
		k = w->t.ne[0];
		n = w->t.ne[1];
		t = x->t.ne[1];
		if (w->kernel || !q4kh_tc_wanted(w->t.type, t, Q4KH_TC_MIN_COLUMNS))
			continue;
		for (j = 0; j < dev->n_tc_warm && (dev->tc_warm[j].k != k ||
		                                   dev->tc_warm[j].n != n ||
		                                   dev->tc_warm[j].t != t);
		     j++)
			;
		if (j < dev->n_tc_warm || j == CUDA_TC_WARM_SHAPES)
			continue;
		cuda_warm_join(dev);
		if ((!dev->blas && q4kh_tc_open(&dev->blas, why, sizeof(why))) ||
		    cuda_scratch(dev, "graph_prepare", base + q4kh_tc_warm_bytes(k, n, t)) ||
		    q4kh_tc_warm_gemm(dev->blas, k, n, t, (char *)dev->scratch + base,
		                      dev->stream, why, sizeof(why))) {
			cudaGetLastError();
			return;
		}
		dev->tc_warm[j].k = k;
		dev->tc_warm[j].n = n;
		dev->tc_warm[j].t = t;
		dev->n_tc_warm++;
	}
}

q4kh_status cuda_graph_prepare(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                               q4kh_step **out)
{
	struct q4kh_step *s;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!g || !out)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID, "graph_prepare: %s is NULL",
		                 g ? "out" : "the graph");
	*out = NULL;
	if ((st = check_graph(dev, g)))
		return st;
	s = calloc(1, sizeof(*s));
	if (!s)
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM, "graph_prepare: out of memory");
	s->g = q4kh_step_copy(g);
	if (!s->g)
		st = cuda_fail(dev->ctx, Q4KH_ERR_NOMEM,
		               "graph_prepare: out of memory copying %d nodes and %d values",
		               g->n_nodes, g->n_values);
	if (s->g && dev->ctx->persistent) {
		char why[256];

		if (cuda_persist_plan(dev, s->g, &s->persist, why, sizeof(why)) == Q4KH_OK)
			cuda_log(dev->ctx, Q4KH_LOG_DEBUG,
			         "cuda: a step of %d layers runs as one persistent launch of %d "
			         "blocks", s->persist->run.n_layer, s->persist->run.blocks);
		else if (g->n_tokens == 1)
			cuda_log(dev->ctx, Q4KH_LOG_DEBUG,
			         "cuda: the persistent kernel does not take this step: %s", why);
	}
	if (!s->g || (st = plan(dev, s))) {
		step_free(s);
		return st;
	}
	warm_products(dev, s->g);
	*out = s;
	return Q4KH_OK;
}

/* --- running --- */

/*
 * The failure F of a call as graph_compute's error: the node, the call,
 * the value it writes, and the message of whoever refused (the SDK, the
 * kernel variant, or this backend, whose last_error it rewrites).
 */
static q4kh_status issue_failed(q4kh_device_ctx *dev, const struct q4kh_step *s,
                                q4kh_status st, const struct q4kh_step_fail *f)
{
	const struct q4kh_step_node *n = q4kh_step_node_at(s->g, f->node);
	char why[sizeof(dev->ctx->error)];

	if (f->msg[0])
		snprintf(why, sizeof(why), "%s", f->msg);
	else if (f->kernel && Q4KH_KERNEL_HAS(f->kernel, last_error))
		snprintf(why, sizeof(why), "%s", f->kernel->last_error(f->kernel_ctx));
	else
		snprintf(why, sizeof(why), "%s", dev->ctx->error);
	return cuda_fail(dev->ctx, st, "graph_compute: node %d, %s (%s): %s", f->node, f->call,
	                 name_of(s->g, n->out), why);
}

/* Issue S's planned calls on dev's stream, in order. */
static q4kh_status issue(q4kh_device_ctx *dev, const struct q4kh_step *s)
{
	/* cuda has the ABI 1.2 entries: no node reads host values */
	const struct q4kh_step_host_values none = { NULL, NULL };
	struct q4kh_step_fail fail;

	for (int32_t k = 0; k < s->n_groups; k++) {
		const struct cuda_group *c = &s->groups[k];
		q4kh_status st;

		if (s->persist && c->first == s->persist->first) {
			if ((st = cuda_launched(dev, "graph_compute: the persistent kernel",
			                        cuda_persist_launch(&s->persist->run, dev->stream))))
				return st;
			continue;
		}
		if (c->head_norms) {
			if ((st = issue_head_norms(dev, s->g, c->first)))
				return st;
			continue;
		}
		if (c->moe) {
			memset(&fail, 0, sizeof(fail));
			if ((st = issue_moe(dev, s->g, c->first, c->n, &fail)))
				return fail.call ? issue_failed(dev, s, st, &fail) : st;
			continue;
		}
		st = q4kh_step_issue_group(&cuda_backend, dev, s->g, c->first, c->fuse, c->n,
		                           &none, &fail);
		if (st)
			return issue_failed(dev, s, st, &fail);
	}
	return Q4KH_OK;
}

/*
 * Record S's calls into S->rec (nothing runs). On a failure S->no_record
 * says why, the log says so once, and S's runs stay eager: a variant that
 * cannot be captured costs the replay, not the step.
 */
static void record(q4kh_device_ctx *dev, struct q4kh_step *s)
{
	q4kh_graph *rec = NULL;
	size_t nodes = 0;
	q4kh_status st = cuda_graph_begin(dev), end;

	if (!st) {
		st = issue(dev, s);
		if (st) /* the first failure's message, before graph_end's */
			snprintf(s->no_record, sizeof(s->no_record), "%.255s", dev->ctx->error);
		/* graph_end ends the capture even after a failed call */
		end = cuda_graph_end_counted(dev, &rec, &nodes);
		if (!st)
			st = end;
	}
	if (st) {
		if (!s->no_record[0])
			snprintf(s->no_record, sizeof(s->no_record), "%.255s", dev->ctx->error);
		cuda_graph_free(dev, rec);
		cuda_fail(dev->ctx, st, "graph_compute: recording a step of %lld tokens failed, "
		          "it runs call by call: %s", (long long)s->g->n_tokens, s->no_record);
		cuda_log(dev->ctx, Q4KH_LOG_WARN, "cuda: %s", dev->ctx->error);
		return;
	}
	s->rec = rec;
	s->rec_nodes = (uint32_t)nodes;
}

q4kh_status cuda_graph_compute(q4kh_device_ctx *dev, q4kh_step *step,
                               struct q4kh_step_run *run)
{
	struct q4kh_step *s = step;
	struct q4kh_step_run done = { .struct_size = sizeof(done) };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!s)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID, "graph_compute: the step is NULL");
	if ((st = cuda_not_recording(dev, "graph_compute")) ||
	    (st = cuda_enter(dev, "graph_compute")))
		return st;
	/* a step that ran once has every scratch it needs: record it */
	if (s->runs && !s->rec && !s->no_record[0])
		record(dev, s);
	if (s->rec) {
		st = cuda_graph_launch(dev, s->rec);
		done.path = Q4KH_PATH_REPLAY;
		done.launches = s->rec_nodes;
	} else {
		st = issue(dev, s);
		done.path = Q4KH_PATH_NODES;
		done.launches = (uint32_t)s->n_groups;
	}
	if (s->persist) /* recorded or not, its layers ran as one kernel */
		done.path = Q4KH_PATH_PERSISTENT;
	if (st)
		return st;
	s->runs++;
	done.fused = s->fused;
	if (run) {
		/* the fields a host of RUN's size has room for */
		size_t size = run->struct_size < sizeof(done) ? run->struct_size : sizeof(done);

		done.struct_size = run->struct_size;
		memcpy(run, &done, size);
	}
	return Q4KH_OK;
}

void cuda_graph_release(q4kh_device_ctx *dev, q4kh_step *step)
{
	if (!step)
		return;
	if (dev && step->rec && cudaSetDevice(dev->ordinal) == cudaSuccess)
		cudaStreamSynchronize(dev->stream); /* no replay of it in flight */
	if (dev && step->persist)
		cuda_persist_profile(dev, step->persist);
	cudaGetLastError();
	cuda_graph_free(dev, step->rec);
	step_free(step);
}
