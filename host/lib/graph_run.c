/*
 * Running a step graph on a backend device without the backend's graph
 * entry (graph_run.h): the host's interpreter, which walks the exported
 * graph with the SDK (q4khost/step.h) and issues one backend or
 * kernel-variant call per node or fused group, and the recording of a
 * step that the backend replays.
 */
#include "graph_run.h"

#include <stdio.h>

#include "kernel.h"
#include "model.h"
#include "q4khost/step.h"

/*
 * The error of a failed call: the plugin's message (the backend's, or the
 * kernel variant's that FAIL names) or the SDK's refusal, after the call
 * and the value it writes: "rms_norm (blk.3.attn_norm)".
 */
static int failed(const struct q4kh_graph *g, const struct q4kh_backend *b, q4kh_status st,
                  const struct q4kh_step_fail *fail, struct q4kh_error *err)
{
	const struct q4kh_node *n = &g->nodes[fail->node];
	char what[96];

	snprintf(what, sizeof(what), "%s (%s)", fail->call, g->vals[n->out].name);
	if (fail->msg[0])
		return q4kh_fail(err, "%s: %s (backend %s)", what, fail->msg, b->plugin->name);
	if (fail->kernel)
		return q4kh_kernel_check(g->vals[n->src[0]].weight->kernel, st, fail->call, err);
	return q4kh_backend_check(b, st, what, err);
}

int q4kh_graph_run(const struct q4kh_graph *g, const struct q4kh_step_graph *sg,
                   const struct q4kh_backend *b, const struct q4kh_step_values *in,
                   struct q4kh_error *err)
{
	const struct q4kh_step_host_values hv = { in->ids, in->pos };
	struct q4kh_step_fail fail;
	q4kh_status st = q4kh_step_run(b->v, b->dev, sg, ~0u, &hv, NULL, &fail);

	return st == Q4KH_OK ? 0 : failed(g, b, st, &fail, err);
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
		case Q4KH_OP_MOE_ROUTE:
		case Q4KH_OP_MUL_MAT_ID:
			if (!Q4KH_BACKEND_HAS(v, moe_route))
				return "moe_route";
			if (!Q4KH_BACKEND_HAS(v, mul_mat_id))
				return "mul_mat_id";
			break;
		case Q4KH_OP_ATTENTION_PAGED: /* its pools are written by set_rows */
			if (!Q4KH_BACKEND_HAS(v, attention_paged))
				return "attention_paged";
			if (!Q4KH_BACKEND_HAS(v, set_rows))
				return "set_rows";
			break;
		default: /* the 1.0 entries, or a fallback to them */
			break;
		}
	}
	return NULL;
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

int q4kh_graph_record(const struct q4kh_graph *g, const struct q4kh_step_graph *sg,
                      const struct q4kh_backend *b, const struct q4kh_step_values *in,
                      q4kh_graph **out, struct q4kh_error *err)
{
	int rc;

	*out = NULL;
	if (q4kh_backend_check(b, b->v->graph_begin(b->dev), "graph_begin", err))
		return -1;
	rc = q4kh_graph_run(g, sg, b, in, err);
	/* graph_end ends the recording even when it fails or the run did */
	if (q4kh_backend_check(b, b->v->graph_end(b->dev, out), "graph_end", rc ? NULL : err) ||
	    rc) {
		b->v->graph_free(b->dev, *out);
		*out = NULL;
		return -1;
	}
	return 0;
}
