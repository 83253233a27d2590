/*
 * Running a step graph on a backend device through the backend's op
 * table, for backends without the graph entry of ABI 1.6 (graph_entry.h)
 * or graphs they decline.
 *
 * The interpreter walks the graph's export (struct q4kh_step_graph) with
 * the SDK's q4khost/step.h, the code a backend's own graph_compute can
 * share: one call per node, a mul_mat through its weight's kernel
 * variant, and a group of nodes as one call where the backend (its
 * deprecated fused entries of ABI 1.4 and 1.5: add_rms_norm,
 * rope_set_rows, rope_store, norm_add_rms_norm) or the variant
 * (gemv_multi, gemv_glu) has the entry and the views make the fused form
 * exact. Ops whose ABI 1.2 entry the backend has read the step's ids and
 * positions from the graph's input tensors, which the caller has
 * uploaded; older backends get them from host memory through the 1.0
 * entries, which then need consecutive positions.
 *
 * A backend that has every 1.2 entry and the 1.1 graph entries can record
 * the interpreter's calls once and replay them for later steps of the same
 * shape: nothing a recording holds changes between steps except the input
 * tensors' contents. Used from the backend's thread.
 */
#ifndef Q4KH_GRAPH_RUN_H
#define Q4KH_GRAPH_RUN_H

#include "backend.h"
#include "error.h"
#include "graph.h"

/* The step's inputs in host memory: ids and positions of its T tokens. */
struct q4kh_step_values {
	const int32_t *ids;
	const int32_t *pos;
};

/*
 * NULL when B has an entry for every op of G; else the name of the first
 * optional entry that G needs and B lacks ("delta_net"). The host checks
 * before G's first run: the interpreter calls these entries unchecked.
 */
const char *q4kh_graph_missing(const struct q4kh_graph *g,
                               const struct q4kh_backend *b);

/* Issue every node of G (exported as SG) on B, in order, fused groups as
 * one call. -1 with err naming the call and the value it writes. */
int q4kh_graph_run(const struct q4kh_graph *g, const struct q4kh_step_graph *sg,
                   const struct q4kh_backend *b, const struct q4kh_step_values *in,
                   struct q4kh_error *err);

/*
 * NULL when B can record a step and replay it (see above); else the name
 * of the first entry it lacks ("graph_begin", "rope_ext").
 */
const char *q4kh_graph_replay_missing(const struct q4kh_backend *b);

/*
 * Record G on B (graph_begin, the interpreter, graph_end) into *out, to be
 * replayed with graph_launch and released with graph_free. Nothing runs.
 * -1 with err when a call fails; the recording is then ended and freed.
 */
int q4kh_graph_record(const struct q4kh_graph *g, const struct q4kh_step_graph *sg,
                      const struct q4kh_backend *b, const struct q4kh_step_values *in,
                      q4kh_graph **out, struct q4kh_error *err);

#endif
