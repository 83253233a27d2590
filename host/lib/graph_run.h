/*
 * Running a planned and bound step graph (graph.h) on a backend device.
 *
 * The interpreter issues one call per node through the backend's op table,
 * or through the weight's kernel variant for mul_mat. Ops whose ABI 1.2
 * entry the backend has (get_rows_ext, rope_ext, set_rows, attention_ext)
 * read the step's ids and positions from the graph's input tensors, which
 * the caller has uploaded; older backends get them from host memory
 * through the 1.0 entries, which then need consecutive positions (a
 * node's own: all the step's, or the one of its sequence that a cache
 * write or attention of a batched decode step reads through a view). Two
 * consecutive nodes that a backend's ABI 1.4 fused entry computes
 * (add then rms_norm of the sum, rope then set_rows of the rotated keys)
 * are issued as that one call (graph_run.c, "The peephole").
 *
 * Mul_mat nodes that follow one another and read the same x, whose weights
 * one kernel-variant context serves and which have at most its
 * max_gemv_columns columns, go to that variant as one gemv_multi call
 * (ABI 1.4) with their biases (up to Q4KH_GEMV_MULTI_MAX at a time): on a
 * GPU one launch instead of one per matrix and one per bias. Everywhere
 * else (variants without it or refusing the combination with
 * Q4KH_ERR_UNSUPPORTED, gemm, the backend's mul_mat) each node is one
 * product followed by the backend's add of its bias. Before that, a
 * feed-forward block's gate and up products (no bias) followed by their
 * GLU go to the variant's gemv_glu (ABI 1.4) as one call when it serves
 * both weights and up's value is read by nothing after the GLU (the call
 * writes the GLU's output only); when it refuses, the products group as
 * above and the GLU runs on the backend.
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

/* Issue every node of G on B, in order, fused pairs as one call. -1 with
 * err naming the node (or the fused entry). */
int q4kh_graph_run(const struct q4kh_graph *g, const struct q4kh_backend *b,
                   const struct q4kh_step_values *in, struct q4kh_error *err);

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
int q4kh_graph_record(const struct q4kh_graph *g, const struct q4kh_backend *b,
                      const struct q4kh_step_values *in, q4kh_graph **out,
                      struct q4kh_error *err);

#endif
