/*
 * A step handed whole to a backend (ABI 1.6: graph_prepare,
 * graph_compute, graph_release; docs/plugin-abi.md section 4, "The step
 * as the unit of work"). The session (session.c) prepares each cached
 * step graph once its tensors are bound, runs it through graph_compute
 * for every step of that shape, and releases it before the scratch
 * moves. A backend without the entries, or one that answers
 * Q4KH_ERR_UNSUPPORTED for a graph, gets the host's interpreter
 * (graph_run.h) instead. Used from the backend's thread.
 */
#ifndef Q4KH_GRAPH_ENTRY_H
#define Q4KH_GRAPH_ENTRY_H

#include <stddef.h>

#include "backend.h"
#include "error.h"
#include "graph.h"

/* NULL when B has all three entries; else the name of the first it lacks. */
const char *q4kh_graph_entry_missing(const struct q4kh_backend *b);

/*
 * Export G (planned and bound; N_SEQS sequences in the step) as a
 * struct q4kh_step_graph, every weight with the route of its product
 * (its kernel variant, or none), and hand it to B's graph_prepare.
 * 1 with *out set when B took it; 0 when B answered
 * Q4KH_ERR_UNSUPPORTED, with B's reason in WHY (CAP bytes); -1 with err
 * on any other failure.
 */
int q4kh_graph_entry_prepare(const struct q4kh_graph *g, int32_t n_seqs,
                             const struct q4kh_backend *b, q4kh_step **out,
                             char *why, size_t cap, struct q4kh_error *err);

#endif
