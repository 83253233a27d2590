/*
 * The step graph: one forward step of a model as data. An architecture
 * describes the step (arch_NAME.c) as nodes (op, inputs, output,
 * parameters) over named values, once per shape class (tokens in the
 * step, logits wanted); the session plans where every activation lives
 * (q4kh_graph_plan) and runs the graph (graph_run.c), op by op through the
 * backend's table or as a recording the backend replays. Nothing in here
 * touches a device; building and planning are pure host work.
 *
 * Values are tensors of four kinds: fixed tensors that outlive the step
 * (weights, the KV cache), the step's inputs (token ids and positions,
 * I32 {T}, rewritten before every run), activations (f32, placed in the
 * session's scratch by the planner; I32 for expert ids) and views (another value's bytes seen
 * with another shape). A node's output may be one of its inputs (x += a).
 *
 * A graph is used from one thread at a time.
 */
#ifndef Q4KH_GRAPH_H
#define Q4KH_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "q4khost/plugin.h"

struct q4kh_weight;

/* The ops and value kinds are the ABI's (plugin.h, ABI 1.6): the graph a
 * backend's graph_prepare receives is this one, exported. */
#define Q4KH_OP_COUNT (Q4KH_OP_ATTENTION_PAGED + 1)

#define Q4KH_GRAPH_NAME 40
#define Q4KH_GRAPH_SRC Q4KH_STEP_SRC

struct q4kh_value {
	enum q4kh_value_kind kind;
	char name[Q4KH_GRAPH_NAME]; /* "blk.3.q"; views: "blk.3.q (heads)" */
	const struct q4kh_weight *weight; /* FIXED matrices: kernel routing */
	int32_t base;       /* VIEW: the value it views */
	uint64_t offset;    /* VIEW: bytes from base's first; ACT: planned */
	/* Shape and strides; buffer and offset resolved by q4kh_graph_bind. */
	struct q4kh_tensor t;
	int32_t first, last; /* ACT: nodes that write first and read last */
};

struct q4kh_node {
	enum q4kh_op op;
	int32_t src[Q4KH_GRAPH_SRC]; /* value indices; -1 where unused */
	int32_t out;
	int32_t i[2];
	float f[2];
	/* ROPE's parameters; freq_factors is src[2]'s tensor when it runs */
	struct q4kh_rope_params rope;
};

struct q4kh_graph {
	int64_t n_tokens; /* T: tokens the step runs */
	int64_t n_out;    /* logits of the last n_out tokens; 0: none */
	uint8_t *rows;    /* instead, where not NULL: the n_out tokens flagged
	                     among the T (q4kh_graph_out_rows) */
	struct q4kh_value *vals;
	struct q4kh_node *nodes;
	int32_t n_vals, n_nodes;
	int32_t cap_vals, cap_nodes;
	int32_t ids, pos; /* the step inputs */
	int32_t slots, pages; /* and over a paged KV cache, or -1 (q4kh_graph_paged) */
	int32_t logits;   /* {n_vocab, n_out}, or -1 when n_out is 0 */
	uint64_t scratch_bytes; /* after q4kh_graph_plan */
	int failed;       /* a builder call ran out of memory or misused a value */
	char error[160];  /* why, for q4kh_graph_check */
};

/*
 * A new empty graph for a step of T >= 1 tokens, with its two inputs
 * (ids and pos, I32 {T}). NULL when out of memory. Free with
 * q4kh_graph_free (NULL is ignored).
 */
struct q4kh_graph *q4kh_graph_new(int64_t n_tokens, int64_t n_out);
void q4kh_graph_free(struct q4kh_graph *g);
/*
 * Before the architecture builds G, for a step over a paged KV cache
 * (kv_pool.h): its two more inputs, g->slots (I32 {T}, the pool slot of
 * each token, which its set_rows nodes write) and g->pages (I32 {B,
 * N_SEQS}, each sequence's block table of B pages), placed in the step
 * inputs after ids and pos. -1 when out of memory.
 */
int q4kh_graph_paged(struct q4kh_graph *g, int64_t n_seqs, int64_t b);
/*
 * Before the architecture builds G: its logits are those of the tokens
 * flagged in ROWS (T flags, copied; at least one set), in order, instead
 * of the last n_out's, and n_out is their count: the output norm and
 * projection run on those columns alone. -1 when out of memory.
 */
int q4kh_graph_out_rows(struct q4kh_graph *g, const uint8_t *rows);

/*
 * Builders, for architectures. Each returns the index of the value it
 * adds (or its output), or -1 after recording the first misuse in
 * g->error (an op on a value that does not exist, shapes that do not
 * match); later calls on a failed graph do nothing and return -1, so an
 * architecture builds the whole step and checks once at the end
 * (q4kh_graph_check). NAME is printf-style; names are for messages.
 */

/* A tensor that outlives the step (a cache, a norm weight), seen as is. */
int32_t q4kh_graph_fixed(struct q4kh_graph *g, const struct q4kh_tensor *t,
                         const char *name, ...)
	__attribute__((format(printf, 3, 4)));
/* A model weight: its tensor, and for mul_mat its kernel variant. */
int32_t q4kh_graph_weight(struct q4kh_graph *g, const struct q4kh_weight *w,
                          const char *name, ...)
	__attribute__((format(printf, 3, 4)));
/* A new f32 activation {ne0, ne1, ne2}. */
int32_t q4kh_graph_act(struct q4kh_graph *g, int64_t ne0, int64_t ne1,
                       int64_t ne2, const char *name, ...)
	__attribute__((format(printf, 5, 6)));
/* A new I32 activation {ne0, ne1}: moe_route's expert ids. */
int32_t q4kh_graph_ids_act(struct q4kh_graph *g, int64_t ne0, int64_t ne1,
                           const char *name, ...)
	__attribute__((format(printf, 4, 5)));
/* Value V's bytes as a contiguous {ne0, ne1, ne2}; counts must match. */
int32_t q4kh_graph_reshape(struct q4kh_graph *g, int32_t v, int64_t ne0,
                           int64_t ne1, int64_t ne2);
/* Columns [c0, c0 + n) of V's outermost used dimension (its tokens). */
int32_t q4kh_graph_cols(struct q4kh_graph *g, int32_t v, int64_t c0,
                        int64_t n);
/*
 * V's bytes from OFFSET on seen as {ne0, ne1, ne2} with rows NB1 and
 * planes NB2 bytes apart (rows contiguous): one part of every row, a head
 * out of interleaved ones. Every byte it names must be V's.
 */
int32_t q4kh_graph_view(struct q4kh_graph *g, int32_t v, int64_t ne0,
                        int64_t ne1, int64_t ne2, int64_t nb1, int64_t nb2,
                        uint64_t offset);

/*
 * Add a node: OUT = op(SRC...), parameters as enum q4kh_op says. Checks
 * that every source and OUT exists. Returns OUT.
 */
int32_t q4kh_graph_op(struct q4kh_graph *g, enum q4kh_op op, int32_t out,
                      const int32_t src[Q4KH_GRAPH_SRC], const int32_t i[2],
                      const float f[2]);

/* The ops, one builder each; OUT may be the first source (in place). */
static inline int32_t q4kh_graph_node(struct q4kh_graph *g, enum q4kh_op op,
                                      int32_t out, int32_t a, int32_t b,
                                      int32_t c, int32_t d, int32_t i0,
                                      int32_t i1, float f0, float f1)
{
	const int32_t src[Q4KH_GRAPH_SRC] = { a, b, c, d, -1, -1 };
	const int32_t i[2] = { i0, i1 };
	const float f[2] = { f0, f1 };

	return q4kh_graph_op(g, op, out, src, i, f);
}

/* out[:, t] = table[:, ids[t]] * scale (the step's ids). */
static inline int32_t q4kh_graph_get_rows(struct q4kh_graph *g, int32_t table,
                                          float scale, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_GET_ROWS, out, table, g->ids, -1, -1,
	                       0, 0, scale, 0.0f);
}

/* out = w x, w a value of q4kh_graph_weight. */
static inline int32_t q4kh_graph_mul_mat(struct q4kh_graph *g, int32_t w,
                                         int32_t x, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_MUL_MAT, out, w, x, -1, -1, 0, 0,
	                       0.0f, 0.0f);
}

/*
 * out = w x + bias, bias a fixed F32 {N} added to every column (-1 for
 * none): one node, so that the interpreter can hand the bias to a kernel
 * variant's gemv_multi with the product (graph_run.h).
 */
static inline int32_t q4kh_graph_mul_mat_bias(struct q4kh_graph *g, int32_t w,
                                              int32_t x, int32_t bias,
                                              int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_MUL_MAT, out, w, x, bias, -1, 0, 0,
	                       0.0f, 0.0f);
}

/* out = rmsnorm(x) w over ne[0]; w -1 for none. */
static inline int32_t q4kh_graph_rms_norm(struct q4kh_graph *g, int32_t x,
                                          int32_t w, float eps, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_RMS_NORM, out, x, w, -1, -1, 0, 0, eps,
	                       0.0f);
}

/*
 * RoPE of x {head_dim, heads, T} at the step's positions, with P's
 * parameters and the frequency factors FF (a fixed F32 {n_rot/2}, or -1).
 */
int32_t q4kh_graph_rope(struct q4kh_graph *g, int32_t x,
                        const struct q4kh_rope_params *p, int32_t ff,
                        int32_t out);

static inline int32_t q4kh_graph_add(struct q4kh_graph *g, int32_t a,
                                     int32_t b, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_ADD, out, a, b, -1, -1, 0, 0, 0.0f,
	                       0.0f);
}

static inline int32_t q4kh_graph_scale(struct q4kh_graph *g, int32_t x,
                                       float s, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_SCALE, out, x, -1, -1, -1, 0, 0, s,
	                       0.0f);
}

/* out = act(gate) * up. */
static inline int32_t q4kh_graph_glu(struct q4kh_graph *g, q4kh_glu_kind kind,
                                     int32_t gate, int32_t up, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_GLU, out, gate, up, -1, -1, (int32_t)kind,
	                       0, 0.0f, 0.0f);
}

/*
 * cache[:, :, pos[t]] = rows[:, :, t]: keys or values {a, b, T'} at POS,
 * the step's positions (g->pos) or a view of T' of them (one sequence's
 * of a batched step).
 */
static inline int32_t q4kh_graph_set_rows(struct q4kh_graph *g, int32_t rows,
                                          int32_t pos, int32_t cache)
{
	return q4kh_graph_node(g, Q4KH_OP_SET_ROWS, cache, rows, pos, -1, -1,
	                       0, 0, 0.0f, 0.0f);
}

/*
 * Attention of q {head_dim, heads, T'} at POS over the pools K_POOL and
 * V_POOL in pages of PAGE_SIZE tokens through the block table PAGES (a
 * column of g->pages); window 0 = none (plugin.h, attention_paged).
 */
static inline int32_t q4kh_graph_attention_paged(struct q4kh_graph *g, int32_t q,
                                                 int32_t k_pool, int32_t v_pool,
                                                 int32_t pos, int32_t pages,
                                                 int32_t page_size, int32_t window,
                                                 float scale, float softcap,
                                                 int32_t out)
{
	const int32_t src[Q4KH_GRAPH_SRC] = { q, k_pool, v_pool, pos, pages, -1 };
	const int32_t i[2] = { window, page_size };
	const float f[2] = { scale, softcap };

	return q4kh_graph_op(g, Q4KH_OP_ATTENTION_PAGED, out, src, i, f);
}

/* Attention of q {head_dim, heads, T'} over the caches at POS (as
 * set_rows's); window 0 = none (plugin.h, attention). */
static inline int32_t q4kh_graph_attention(struct q4kh_graph *g, int32_t q,
                                           int32_t k_cache, int32_t v_cache,
                                           int32_t pos, int32_t window,
                                           float scale, float softcap,
                                           int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_ATTENTION, out, q, k_cache, v_cache,
	                       pos, window, 0, scale, softcap);
}

static inline int32_t q4kh_graph_mul(struct q4kh_graph *g, int32_t a,
                                     int32_t b, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_MUL, out, a, b, -1, -1, 0, 0, 0.0f,
	                       0.0f);
}

/* out = x element by element, into contiguous memory. */
static inline int32_t q4kh_graph_copy(struct q4kh_graph *g, int32_t x,
                                      int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_COPY, out, x, -1, -1, -1, 0, 0, 0.0f,
	                       0.0f);
}

/* out = f(x), f as q4kh_unary_kind says. */
static inline int32_t q4kh_graph_unary(struct q4kh_graph *g,
                                       q4kh_unary_kind kind, int32_t x,
                                       int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_UNARY, out, x, -1, -1, -1,
	                       (int32_t)kind, 0, 0.0f, 0.0f);
}

/* The short causal convolution of x {C, T} with taps w {K, C} after the
 * inputs state {K-1, C} keeps, which it then advances (plugin.h). */
static inline int32_t q4kh_graph_ssm_conv(struct q4kh_graph *g, int32_t x,
                                          int32_t w, int32_t state,
                                          int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_SSM_CONV, out, x, w, state, -1, 0, 0,
	                       0.0f, 0.0f);
}

/* The gated delta rule over the step's tokens, advancing state (plugin.h). */
static inline int32_t q4kh_graph_delta_net(struct q4kh_graph *g, int32_t q,
                                           int32_t k, int32_t v,
                                           int32_t gate, int32_t beta,
                                           int32_t state, float scale,
                                           int32_t out)
{
	const int32_t src[Q4KH_GRAPH_SRC] = { q, k, v, gate, beta, state };
	const float f[2] = { scale, 0.0f };

	return q4kh_graph_op(g, Q4KH_OP_DELTA_NET, out, src, NULL, f);
}

/*
 * The router's choice (plugin.h, moe_route): ids I32 {k, T} (written) and
 * the experts' weights into out F32 {k, T} from logits {E, T}; NORM 1
 * divides the weights by their sum.
 */
static inline int32_t q4kh_graph_moe_route(struct q4kh_graph *g, int32_t logits,
                                           int32_t norm, int32_t ids, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_MOE_ROUTE, out, logits, ids, -1, -1, norm,
	                       0, 0.0f, 0.0f);
}

/* out[:, j, t] = w[:, :, ids[j, t]] x[:, j % X, t] (plugin.h, mul_mat_id):
 * w a value of q4kh_graph_weight {K, N, E}. */
static inline int32_t q4kh_graph_mul_mat_id(struct q4kh_graph *g, int32_t w,
                                            int32_t x, int32_t ids, int32_t out)
{
	return q4kh_graph_node(g, Q4KH_OP_MUL_MAT_ID, out, w, x, ids, -1, 0, 0,
	                       0.0f, 0.0f);
}

/* 0, or -1 with err naming what the builders refused. */
int q4kh_graph_check(const struct q4kh_graph *g, struct q4kh_error *err);

/*
 * Plan the scratch: give every activation an offset (a multiple of
 * ALIGN) so that two activations whose lives (first write .. last read,
 * views included) overlap never share a byte. Sets g->scratch_bytes.
 * An activation that is written and never read still gets bytes
 * (the logits are read by the host after the step). -1 when out of
 * memory.
 */
int q4kh_graph_plan(struct q4kh_graph *g, uint64_t align);

/*
 * Resolve every value to a tensor: activations and views into SCRATCH,
 * the inputs into STEP (ids at offset 0, pos after T int32 values, then
 * slots and pages when the step has them).
 */
void q4kh_graph_bind(struct q4kh_graph *g, q4kh_buffer *scratch,
                     q4kh_buffer *step);

/* "rms_norm" for an op. */
const char *q4kh_op_name(enum q4kh_op op);

#endif
