/*
 * The step graph exported as the plugin ABI shows it, and handed to a
 * backend's ABI 1.6 entries (graph_entry.h).
 */
#include "graph_entry.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernel.h"
#include "model.h"

/* Value IN as the ABI shows it: its tensor, and a weight's route. */
static void export_value(const struct q4kh_value *in, struct q4kh_step_value *out)
{
	const struct q4kh_kernel *k = in->weight ? in->weight->kernel : NULL;

	*out = (struct q4kh_step_value){
		.t = in->t,
		.kind = (uint32_t)in->kind,
		.base = in->kind == Q4KH_VAL_VIEW ? in->base : -1,
		.name = in->name,
	};
	if (k) {
		out->kernel = k->v;
		out->kernel_ctx = k->ctx;
		out->prepared = in->weight->prepared;
		out->native = &k->native;
	}
}

static void export_node(const struct q4kh_node *in, struct q4kh_step_node *out)
{
	*out = (struct q4kh_step_node){
		.op = (uint32_t)in->op,
		.out = in->out,
		.i = { in->i[0], in->i[1] },
		.f = { in->f[0], in->f[1] },
		.rope = in->rope,
	};
	for (int k = 0; k < Q4KH_STEP_SRC; k++)
		out->src[k] = in->src[k];
	out->rope.freq_factors = NULL;
}

void q4kh_graph_export_free(struct q4kh_graph_export *ex)
{
	free(ex->nodes);
	free(ex->vals);
	*ex = (struct q4kh_graph_export){ 0 };
}

int q4kh_graph_export(const struct q4kh_graph *g, int32_t n_seqs,
                      struct q4kh_graph_export *ex, struct q4kh_error *err)
{
	q4kh_graph_export_free(ex);
	ex->nodes = calloc((size_t)g->n_nodes, sizeof(*ex->nodes));
	ex->vals = calloc((size_t)g->n_vals, sizeof(*ex->vals));
	if (!ex->nodes || !ex->vals) {
		q4kh_graph_export_free(ex);
		return q4kh_fail(err, "out of memory exporting a step graph of %d nodes",
		                 g->n_nodes);
	}
	for (int32_t i = 0; i < g->n_nodes; i++)
		export_node(&g->nodes[i], &ex->nodes[i]);
	for (int32_t i = 0; i < g->n_vals; i++)
		export_value(&g->vals[i], &ex->vals[i]);
	ex->sg = (struct q4kh_step_graph){
		.struct_size = sizeof(ex->sg),
		.node_size = sizeof(*ex->nodes),
		.value_size = sizeof(*ex->vals),
		.n_nodes = g->n_nodes,
		.n_values = g->n_vals,
		.ids = g->ids,
		.pos = g->pos,
		.logits = g->logits,
		.n_tokens = g->n_tokens,
		.n_out = g->n_out,
		.n_seqs = (uint32_t)n_seqs,
		.nodes = ex->nodes,
		.values = ex->vals,
	};
	return 0;
}

const char *q4kh_graph_entry_missing(const struct q4kh_backend *b)
{
	const struct q4kh_backend_v1 *v = b->v;

	if (!Q4KH_BACKEND_HAS(v, graph_prepare))
		return "graph_prepare";
	if (!Q4KH_BACKEND_HAS(v, graph_compute))
		return "graph_compute";
	if (!Q4KH_BACKEND_HAS(v, graph_release))
		return "graph_release";
	return NULL;
}

int q4kh_graph_entry_prepare(const struct q4kh_graph_export *ex,
                             const struct q4kh_backend *b, q4kh_step **out,
                             char *why, size_t cap, struct q4kh_error *err)
{
	q4kh_status st = b->v->graph_prepare(b->dev, &ex->sg, out);

	if (st == Q4KH_ERR_UNSUPPORTED) {
		snprintf(why, cap, "%s's graph_prepare declined a step of %lld tokens: %s",
		         b->plugin->name, (long long)ex->sg.n_tokens, b->v->last_error(b->ctx));
		*out = NULL;
		return 0;
	}
	if (q4kh_backend_check(b, st, "graph_prepare", err)) {
		*out = NULL;
		return -1;
	}
	return 1;
}
