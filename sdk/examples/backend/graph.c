/*
 * example-backend: the step graph's entries (ABI 1.6) in their simplest
 * form. graph_prepare keeps a copy of the graph and refuses one holding an
 * op this backend has no entry for; graph_compute issues the copy node by
 * node through this backend's own table with the SDK's q4kh_step_run
 * (q4khost/step.h), which also calls the kernel variant a weight is routed
 * to; graph_release frees the copy. A backend that fuses or records does
 * so between these two calls, on the copy it kept.
 */
#include <stdlib.h>
#include <string.h>

#include <q4khost/step.h>

#include "backend.h"

/* The graph as prepared: the SDK's copy of it (q4kh_step_copy). */
struct q4kh_step {
	struct q4kh_step_graph *g;
};

/* 1 when this backend has an entry for OP (the linear-attention ops are
 * not among its ops). */
static int has_op(uint32_t op)
{
	return op <= Q4KH_OP_COPY;
}

q4kh_status example_graph_prepare(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                                  q4kh_step **out)
{
	q4kh_step *s;

	if (!dev || !g || !out)
		return Q4KH_ERR_INVALID;
	*out = NULL;
	for (int32_t i = 0; i < g->n_nodes; i++) {
		uint32_t op = q4kh_step_node_at(g, i)->op;

		if (!has_op(op))
			return example_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                    "graph_prepare: node %d is %s, an op " NAME
			                    " does not have",
			                    i, q4kh_step_op_name(op));
	}
	s = calloc(1, sizeof(*s));
	if (s)
		s->g = q4kh_step_copy(g);
	if (!s || !s->g) {
		example_graph_release(dev, s);
		return example_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                    "graph_prepare: out of memory for %d nodes", g->n_nodes);
	}
	*out = s;
	return Q4KH_OK;
}

q4kh_status example_graph_compute(q4kh_device_ctx *dev, q4kh_step *s, struct q4kh_step_run *run)
{
	/* This backend has every ABI 1.2 entry: no host copies of the ids and
	 * positions are needed. */
	const struct q4kh_step_host_values none = { NULL, NULL };
	struct q4kh_step_fail fail;
	uint32_t calls = 0;
	q4kh_status st;

	if (!dev || !s)
		return Q4KH_ERR_INVALID;
	st = q4kh_step_run(&example_table, dev, s->g, ~0u, &none, &calls, &fail);
	if (st != Q4KH_OK) {
		/* the op's own message is already in last_error() unless a
		 * kernel variant failed or the SDK refused the node */
		if (fail.msg[0])
			example_fail(dev->ctx, st, "graph_compute: %s", fail.msg);
		else if (fail.kernel)
			example_fail(dev->ctx, st, "graph_compute: node %d (%s): %s", fail.node,
			             fail.call, fail.kernel->last_error(fail.kernel_ctx));
		return st;
	}
	if (run) {
		run->path = Q4KH_PATH_NODES;
		run->launches = calls;
		run->fused = calls < (uint32_t)s->g->n_nodes ? (uint32_t)s->g->n_nodes - calls : 0;
	}
	return Q4KH_OK;
}

void example_graph_release(q4kh_device_ctx *dev, q4kh_step *s)
{
	(void)dev;
	if (s)
		q4kh_step_copy_free(s->g);
	free(s);
}
