/*
 * The blocks that the architectures' step graphs share (arch_*.c): the
 * embedding lookup, the attention block, the gated feed-forward block and
 * the LM head, each added to a step graph (graph.h) as the nodes that
 * compute it. Pure host work; builders report misuse through the graph.
 */
#ifndef Q4KH_ARCH_BLOCKS_H
#define Q4KH_ARCH_BLOCKS_H

#include "graph.h"
#include "model.h"
#include "session.h"

/* How an architecture's attention differs from Llama's. */
struct q4kh_attn_opts {
	int32_t window;   /* sliding window in keys; 0 = none */
	int gate_q;       /* Wq gives each head's query, then as many values of
	                     an output gate: the attention's output is
	                     multiplied by sigmoid(gate) before Wo (Qwen3.5) */
};

/* x = token_embd[:, ids] * embd_scale: the residual stream {n_embd, T}. */
int32_t q4kh_block_embed(struct q4kh_graph *g, const struct q4kh_model *m);

/*
 * Attention of layer IL over h = its normed input {n_embd, T}:
 * q, k, v = Wq h (+ bq), Wk h (+ bk), Wv h (+ bv); per-head RMSNorm of q
 * and k when the layer has q_norm; RoPE at the step's positions (with
 * the model's frequency factors and YaRN scaling); k and v written to
 * the layer's cache rows; attention with the scale hp.attn_scale; with
 * gate_q, the output times sigmoid(gate); then Wo. Returns the output
 * {n_embd, T}. Each sequence of SEQ (model.h) writes and reads its own
 * session's caches: several sequences get a cache write and an
 * attention node each, over their own column and position.
 */
int32_t q4kh_block_attention(struct q4kh_graph *g, const struct q4kh_seqs *seq,
                             uint32_t il, int32_t h,
                             const struct q4kh_attn_opts *opts);

/*
 * out = W x (+ bias), a new activation {W's rows, T} named blk.IL.NAME:
 * one mul_mat node with the bias as its third source. Projections of one
 * input built one after another stay adjacent nodes, which the
 * interpreter serves with one gemv_multi (graph_run.h).
 */
int32_t q4kh_block_project(struct q4kh_graph *g, const struct q4kh_weight *w,
                           const struct q4kh_weight *bias, int32_t x,
                           const char *name, uint32_t il);

/* Wdown (act(Wgate h) * (Wup h)) of layer IL: {n_embd, T}. */
int32_t q4kh_block_ffn(struct q4kh_graph *g, const struct q4kh_model *m,
                       uint32_t il, int32_t h, q4kh_glu_kind act);

/*
 * The mixture of experts of layer IL over h {n_embd, T}, as llama.cpp's
 * build_moe_ffn with softmax gating and normalised weights (Qwen3-MoE):
 * the router's logits ffn_gate_inp h {n_expert, T}; moe_route's top
 * n_expert_used experts and their weights; each chosen expert's
 * Wdown (silu(Wgate h) * (Wup h)) through mul_mat_id; each times its
 * weight; the slots summed in order (slot 0 + slot 1, then + slot 2 ...).
 * Returns {n_embd, T}.
 */
int32_t q4kh_block_moe(struct q4kh_graph *g, const struct q4kh_model *m, uint32_t il,
                       int32_t h);

/* out = rmsnorm(x) w, into a new activation named NAME. */
int32_t q4kh_block_norm(struct q4kh_graph *g, const struct q4kh_model *m,
                        int32_t x, const struct q4kh_weight *w,
                        const char *name, uint32_t il);

/*
 * The logits of the last g->n_out tokens of x, or of the tokens g->rows
 * flags: Wout (rmsnorm(x) output_norm), set as g->logits. Nothing when
 * n_out is 0.
 */
void q4kh_block_logits(struct q4kh_graph *g, const struct q4kh_model *m,
                       int32_t x);

#endif
