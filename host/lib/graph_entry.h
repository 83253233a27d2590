/*
 * The step graph as the plugin ABI shows it (ABI 1.6, plugin.h's struct
 * q4kh_step_graph): the export of a planned and bound graph (graph.h),
 * every weight with the route of its product (its kernel variant, or
 * none). The session keeps one export per cached graph, made again when
 * the graph is bound again, and runs it one of two ways: handed whole to
 * a backend with the graph entries (graph_prepare, graph_compute,
 * graph_release; docs/plugin-abi.md section 4, "The step as the unit of
 * work"), or through the host's interpreter (graph_run.h), which walks
 * the same export with the SDK's q4khost/step.h. Used from the backend's
 * thread.
 */
#ifndef Q4KH_GRAPH_ENTRY_H
#define Q4KH_GRAPH_ENTRY_H

#include <stddef.h>

#include "backend.h"
#include "error.h"
#include "graph.h"

struct q4kh_graph_export {
	struct q4kh_step_graph sg;    /* nodes and values point below */
	struct q4kh_step_node *nodes; /* g->n_nodes */
	struct q4kh_step_value *vals; /* g->n_vals; names point into g */
};

/*
 * Export G (bound; N_SEQS sequences in the step) into *EX, whose arrays
 * it allocates (again: what *EX held is freed first). -1 with err when
 * out of memory. The export reads G's names: G outlives it.
 */
int q4kh_graph_export(const struct q4kh_graph *g, int32_t n_seqs,
                      struct q4kh_graph_export *ex, struct q4kh_error *err);
void q4kh_graph_export_free(struct q4kh_graph_export *ex);

/* NULL when B has all three graph entries; else the first it lacks. */
const char *q4kh_graph_entry_missing(const struct q4kh_backend *b);

/*
 * Hand EX to B's graph_prepare. 1 with *out set when B took it; 0 when B
 * answered Q4KH_ERR_UNSUPPORTED, with B's reason in WHY (CAP bytes); -1
 * with err on any other failure.
 */
int q4kh_graph_entry_prepare(const struct q4kh_graph_export *ex,
                             const struct q4kh_backend *b, q4kh_step **out,
                             char *why, size_t cap, struct q4kh_error *err);

#endif
