/*
 * Reading and running a step graph (plugin ABI 1.6, plugin.h's struct
 * q4kh_step_graph): the part of graph_compute that every backend shares,
 * in the SDK's static library (libq4khost_sdk.a, pkg-config
 * q4khost-plugin). The host runs its own interpreter through the same
 * functions, so a backend that calls them computes what the host would.
 *
 *  - q4kh_step_match: does a fusable pattern of nodes start at node i,
 *    with the views that make its fused form exact?
 *  - q4kh_step_issue_node / q4kh_step_issue_group: issue a node, or a
 *    matched group, through a backend's own table (struct q4kh_backend_v1)
 *    and, for a weight that names a kernel variant, through that
 *    variant's entries.
 *  - q4kh_step_run: the whole graph, node by node, each group whose fused
 *    entry the table has as one call: the simplest graph_compute.
 *
 * docs/plugin-abi.md section 4, "The step as the unit of work", says what
 * each pattern means. Nothing here allocates, blocks or keeps state
 * between calls; every function is thread-safe for distinct graphs and
 * devices. Errors come back as the status of the failing call with
 * struct q4kh_step_fail saying which call, which node and which plugin's
 * last_error() holds the message.
 */
#ifndef Q4KHOST_STEP_H
#define Q4KHOST_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "q4khost/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensor of value V of G, or NULL for V = -1 (an unused source). */
static inline const struct q4kh_tensor *q4kh_step_tensor(const struct q4kh_step_graph *g,
                                                         int32_t v)
{
	return v >= 0 ? &q4kh_step_value_at(g, v)->t : NULL;
}

/* Is V an activation (Q4KH_VAL_ACT) that no node after node N of G
 * reads, through no view of it? A fused call need not write it then. */
int q4kh_step_dead_after(const struct q4kh_step_graph *g, int32_t v, int32_t n);

/*
 * A copy of G that outlives graph_prepare (docs/plugin-abi.md E2): one
 * allocation holding the graph, its nodes and its values at this
 * header's sizes (the fields a host older than this header lacks are
 * zero; those a newer host added are dropped), with node_size and
 * value_size set to them, and the values' names copied into it (the
 * host's are valid during graph_prepare only). NULL when out of memory.
 * Free with q4kh_step_copy_free (NULL is ignored).
 */
struct q4kh_step_graph *q4kh_step_copy(const struct q4kh_step_graph *g);
void q4kh_step_copy_free(struct q4kh_step_graph *copy);

/*
 * The patterns of consecutive nodes a backend may run as one call, as the
 * in-tree backends and the host's interpreter do. Each is exact: the
 * fused call gives the bits of its nodes run one by one.
 */
typedef enum q4kh_step_fuse {
	Q4KH_FUSE_NONE = 0,
	/* mul_mat gate, mul_mat up (same x, no bias), glu(gate, up): the
	 * weights' kernel variant's gemv_glu; up (and gate, unless it is the
	 * glu's output) read by nothing later */
	Q4KH_FUSE_GEMV_GLU = 1,
	/* 2 .. Q4KH_GEMV_MULTI_MAX mul_mat nodes of one x, their weights
	 * served by one kernel-variant context: its gemv_multi, biases too */
	Q4KH_FUSE_GEMV_MULTI = 2,
	/* rope q, rope k, set_rows k, set_rows v (one pos, one set of
	 * parameters): the backend's rope_store */
	Q4KH_FUSE_ROPE_STORE = 3,
	/* rms_norm a in place, add a to x, rms_norm x: norm_add_rms_norm */
	Q4KH_FUSE_NORM_ADD_RMS_NORM = 4,
	/* add a to x in place, rms_norm x: add_rms_norm */
	Q4KH_FUSE_ADD_RMS_NORM = 5,
	/* rope x in place, set_rows x into a cache at the same pos:
	 * rope_set_rows */
	Q4KH_FUSE_ROPE_SET_ROWS = 6,
	Q4KH_FUSE_COUNT
} q4kh_step_fuse;

/*
 * How many nodes pattern F covers from node I of G: 0 when the nodes
 * there are not that pattern or the views do not make the fused form
 * exact; 3 for GEMV_GLU and NORM_ADD_RMS_NORM, 4 for ROPE_STORE, 2 for
 * ADD_RMS_NORM and ROPE_SET_ROWS, 2 .. Q4KH_GEMV_MULTI_MAX for GEMV_MULTI
 * (which also needs the weights' variant to have the entry and at most
 * max_gemv_columns columns; GEMV_GLU likewise). Pure.
 */
int32_t q4kh_step_match(const struct q4kh_step_graph *g, int32_t i, q4kh_step_fuse f);

/*
 * 1 when backend table T has the fused entry of F (for the products: when
 * F's weights' variant has it, which q4kh_step_match already checks).
 */
int q4kh_step_table_fuses(const struct q4kh_backend_v1 *t, q4kh_step_fuse f);

/* Which call failed, for the error a caller reports. */
struct q4kh_step_fail {
	int32_t node;       /* the first node of the failing call */
	const char *call;   /* "mul_mat", "gemv_multi", "rope_store" ... */
	/* the kernel variant whose entry failed (its last_error(kernel_ctx)
	 * holds the message), or NULL when the backend's entry did (its
	 * last_error) or the SDK refused the node (msg) */
	const struct q4kh_kernel_v1 *kernel;
	q4kh_kernel_ctx *kernel_ctx;
	char msg[160]; /* set when the SDK itself refused: why */
};

/*
 * The step's ids and positions in host memory, for a backend without the
 * ABI 1.2 entries (get_rows_ext, rope_ext, set_rows, attention_ext),
 * which take them from the host; NULL members for one that has them.
 */
struct q4kh_step_host_values {
	const int32_t *ids; /* {n_tokens} */
	const int32_t *pos; /* {n_tokens} */
};

/*
 * Issue node I of G through T on DEV: the entry of its op (the 1.2 one
 * when T has it, else the 1.0 one with HV's host values, which then need
 * consecutive positions), a mul_mat through its weight's kernel variant
 * (gemv up to max_gemv_columns columns, gemm beyond) or T's mul_mat, and
 * a bias through T's add. Q4KH_OK, or the failing call's status with
 * *FAIL filled.
 */
q4kh_status q4kh_step_issue_node(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                                 const struct q4kh_step_graph *g, int32_t i,
                                 const struct q4kh_step_host_values *hv,
                                 struct q4kh_step_fail *fail);

/*
 * Issue the N nodes from I that q4kh_step_match found as F as one call:
 * T's fused entry, or the variant's gemv_glu / gemv_multi. A variant that
 * answers Q4KH_ERR_UNSUPPORTED (having done nothing) gets its nodes issued
 * one by one instead (gemv_glu: the products as a gemv_multi group when
 * they form one). Status and *FAIL as q4kh_step_issue_node's.
 */
q4kh_status q4kh_step_issue_group(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                                  const struct q4kh_step_graph *g, int32_t i,
                                  q4kh_step_fuse f, int32_t n,
                                  const struct q4kh_step_host_values *hv,
                                  struct q4kh_step_fail *fail);

/*
 * The group that starts at node I when T runs G: the first pattern of
 * GEMV_GLU, GEMV_MULTI, ROPE_STORE, NORM_ADD_RMS_NORM, ADD_RMS_NORM,
 * ROPE_SET_ROWS that matches there and that T (or the weights' variant)
 * has the entry for, with its node count in *N; Q4KH_FUSE_NONE and 1 for
 * a node alone. ALLOW: a mask of (1u << F) for the patterns the caller
 * takes (~0u for every one).
 */
q4kh_step_fuse q4kh_step_next(const struct q4kh_backend_v1 *t, const struct q4kh_step_graph *g,
                              int32_t i, uint32_t allow, int32_t *n);

/*
 * Run every node of G on T, in order, each group q4kh_step_next finds
 * with ALLOW as one call. *GROUPS (may be NULL) gets the calls issued.
 * Q4KH_OK, or the first failure's status with *FAIL filled.
 */
q4kh_status q4kh_step_run(const struct q4kh_backend_v1 *t, q4kh_device_ctx *dev,
                          const struct q4kh_step_graph *g, uint32_t allow,
                          const struct q4kh_step_host_values *hv, uint32_t *groups,
                          struct q4kh_step_fail *fail);

/* "rms_norm" for an op of q4kh_op; "unknown op" otherwise. */
const char *q4kh_step_op_name(uint32_t op);

#ifdef __cplusplus
}
#endif

#endif /* Q4KHOST_STEP_H */
