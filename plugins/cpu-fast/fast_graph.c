/*
 * cpu-fast's step graph entries (ABI 1.6, plugin.h's graph_prepare,
 * graph_compute, graph_release). graph_prepare copies the graph and plans
 * it once: the groups of nodes that run as one call (the SDK's patterns,
 * q4khost/step.h, through this backend's fused entries and the kernel
 * variants' gemv_multi and gemv_glu; and this backend's own below), so a
 * run issues the plan without matching anything again. graph_compute runs
 * the plan on the calling thread, each call one job of the worker pool.
 *
 * This backend's own fusion: a built-in product whose output is added
 * into another tensor by the next node (the residual add after the
 * attention output and FFN down products of a layer whose weights no
 * kernel variant serves, y = W x; r = r + y), one pool job whose
 * epilogue adds each product row into r as it is made. It gives the bits
 * of the two nodes run one by one: the same dot products, then the same
 * single f32 addition per value.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/step.h"

#include "fast.h"

/* A pattern of this backend's own, numbered after the SDK's. */
#define FAST_FUSE_MATMUL_ADD Q4KH_FUSE_COUNT

struct fast_group {
	int32_t i, n;  /* nodes [i, i + n) */
	uint32_t fuse; /* q4kh_step_fuse, or FAST_FUSE_MATMUL_ADD */
};

struct q4kh_step {
	struct q4kh_step_graph *g; /* the copy (q4kh_step_copy) */
	struct fast_group *groups;
	int32_t n_groups;
	uint32_t fused; /* nodes inside a group of more than one */
};

#define NODE(g, i) q4kh_step_node_at(g, i)
#define TEN(g, v) q4kh_step_tensor(g, v)

/* Do the f32 views A and B share a byte? */
static int overlap(const struct q4kh_tensor *a, const struct q4kh_tensor *b)
{
	uint64_t ea = a->offset + sizeof(float), eb = b->offset + sizeof(float);

	for (int d = 0; d < 4; d++) {
		ea += (uint64_t)(a->ne[d] - 1) * (uint64_t)a->nb[d];
		eb += (uint64_t)(b->ne[d] - 1) * (uint64_t)b->nb[d];
	}
	return a->buffer == b->buffer && a->offset < eb && b->offset < ea;
}

/*
 * MUL_MAT of a weight no kernel variant serves and without bias at node
 * I, then ADD of its output y and another f32 tensor r of y's shape into
 * exactly r: 2 when so and r shares no byte with the product's inputs nor
 * with y (the epilogue writes r while other threads still read x).
 */
static int32_t match_matmul_add(const struct q4kh_step_graph *g, int32_t i)
{
	const struct q4kh_step_node *mm = NODE(g, i), *add;
	const struct q4kh_tensor *y, *r, *x;
	int32_t rv;

	if (i + 1 >= g->n_nodes || mm->op != Q4KH_OP_MUL_MAT || mm->src[2] >= 0 ||
	    q4kh_step_value_at(g, mm->src[0])->kernel)
		return 0;
	add = NODE(g, i + 1);
	if (add->op != Q4KH_OP_ADD || (add->src[0] != mm->out && add->src[1] != mm->out))
		return 0;
	/* a + b is b + a in floating point: y may be either operand */
	rv = add->src[add->src[0] == mm->out ? 1 : 0];
	if (add->out != rv || rv == mm->out)
		return 0;
	y = TEN(g, mm->out);
	r = TEN(g, rv);
	x = TEN(g, mm->src[1]);
	return r->type == Q4KH_TYPE_F32 && !memcmp(r->ne, y->ne, sizeof(r->ne)) &&
	               r->nb[0] == sizeof(float) && y->ne[2] == 1 && y->ne[3] == 1 &&
	               !overlap(r, x) && !overlap(r, y) && r->buffer != TEN(g, mm->src[0])->buffer
	               ? 2
	               : 0;
}

/* The plan of S's graph: its groups, in order. 0, or -1 out of memory. */
static int plan(q4kh_step *s)
{
	const struct q4kh_step_graph *g = s->g;

	s->groups = calloc((size_t)g->n_nodes + 1, sizeof(*s->groups));
	if (!s->groups)
		return -1;
	for (int32_t i = 0, n; i < g->n_nodes; i += n) {
		uint32_t f = (n = match_matmul_add(g, i)) ? FAST_FUSE_MATMUL_ADD
		                                          : q4kh_step_next(&fast_table, g, i, ~0u, &n);

		s->groups[s->n_groups++] = (struct fast_group){ i, n, f };
		if (n > 1)
			s->fused += (uint32_t)n;
	}
	return 0;
}

void fast_graph_release(q4kh_device_ctx *dev, q4kh_step *s)
{
	(void)dev;
	if (s) {
		q4kh_step_copy_free(s->g);
		free(s->groups);
	}
	free(s);
}

q4kh_status fast_graph_prepare(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                               q4kh_step **out)
{
	q4kh_step *s;

	if (!dev || !g || !out)
		return Q4KH_ERR_INVALID;
	*out = NULL;
	for (int32_t i = 0; i < g->n_nodes; i++)
		if (NODE(g, i)->op > Q4KH_OP_ATTENTION_PAGED)
			return fast_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "graph_prepare: node %d has op %u, which cpu-fast does not "
			                 "know (it knows up to %d, attention_paged)",
			                 i, NODE(g, i)->op, Q4KH_OP_ATTENTION_PAGED);
	s = calloc(1, sizeof(*s));
	if (s)
		s->g = q4kh_step_copy(g);
	if (!s || !s->g) {
		fast_graph_release(dev, s);
		return fast_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                 "graph_prepare: out of memory for a graph of %d nodes", g->n_nodes);
	}
	if (plan(s)) {
		fast_graph_release(dev, s);
		return fast_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                 "graph_prepare: out of memory planning %d nodes", g->n_nodes);
	}
	*out = s;
	return Q4KH_OK;
}

/* Group P of S's plan, issued. */
static q4kh_status issue(q4kh_device_ctx *dev, const q4kh_step *s, const struct fast_group *p,
                         struct q4kh_step_fail *fail)
{
	/* cpu-fast has every ABI 1.2 entry: no host copies of ids or positions */
	static const struct q4kh_step_host_values none = { NULL, NULL };
	const struct q4kh_step_graph *g = s->g;

	if (p->fuse == FAST_FUSE_MATMUL_ADD) {
		const struct q4kh_step_node *mm = NODE(g, p->i);
		q4kh_status st = fast_mul_mat_add(dev, TEN(g, mm->src[0]), TEN(g, mm->src[1]),
		                                  TEN(g, mm->out), TEN(g, NODE(g, p->i + 1)->out));

		if (st != Q4KH_OK)
			*fail = (struct q4kh_step_fail){ .node = p->i, .call = "mul_mat" };
		return st;
	}
	return q4kh_step_issue_group(&fast_table, dev, g, p->i, (q4kh_step_fuse)p->fuse, p->n,
	                             &none, fail);
}

q4kh_status fast_graph_compute(q4kh_device_ctx *dev, q4kh_step *s, struct q4kh_step_run *run)
{
	struct q4kh_step_fail fail;

	if (!dev || !s)
		return Q4KH_ERR_INVALID;
	for (int32_t k = 0; k < s->n_groups; k++) {
		q4kh_status st = issue(dev, s, &s->groups[k], &fail);

		if (st == Q4KH_OK)
			continue;
		/* the entry's own message is in last_error() unless a kernel
		 * variant failed or the SDK refused the node */
		if (fail.msg[0] || fail.kernel) {
			char why[sizeof(dev->ctx->error) / 2];

			snprintf(why, sizeof(why), "%s",
			         fail.msg[0] ? fail.msg : fail.kernel->last_error(fail.kernel_ctx));
			fast_fail(dev->ctx, st, "graph_compute: node %d (%s): %s", fail.node,
			          fail.call, why);
		}
		return st;
	}
	if (run) {
		run->path = Q4KH_PATH_NODES;
		run->launches = (uint32_t)s->n_groups;
		run->fused = s->fused;
	}
	return Q4KH_OK;
}
