/*
 * Gemma 3 ("gemma3" GGUF), computed as llama.cpp does (its
 * src/models/gemma3.cpp; Gemma 3 technical report, 2025):
 * interleaved sliding-window and global attention layers, per-head q/k
 * RMSNorm, NeoX RoPE with a separate base for local layers, pre- and
 * post-norms around attention and the GELU-gated FFN, tied embeddings
 * scaled by sqrt(n_embd). Norm weights already hold Gemma's +1.
 */
#include <math.h>
#include <stdlib.h>

#include "arch_blocks.h"
#include "model.h"

/* llama.cpp hard-codes these for gemma3; the GGUF does not carry them. */
#define GEMMA3_SWA_PERIOD 6        /* layer il is global iff il % 6 == 5 */
#define GEMMA3_SWA_ROPE_BASE 10000.0f
#define GEMMA3_27B_LAYERS 62       /* 27B scales q by 1/sqrt(n_embd/n_head) */

static int load_hparams(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;
	float rope_base = 10000.0f, rope_factor = 0.0f;

	if (q4kh_model_attn_hparams(m, err))
		return -1;
	if (hp->n_rot != hp->head_dim)
		return q4kh_fail(err, "%s: rope.dimension_count %u differs from head dim %u: not supported for gemma3",
		                 m->gguf->path, hp->n_rot, hp->head_dim);
	if (q4kh_model_f32(m, "%s.rope.freq_base", &rope_base, 0, err) ||
	    q4kh_model_f32(m, "%s.rope.scaling.factor", &rope_factor, 0, err) ||
	    q4kh_model_u32(m, "%s.attention.sliding_window", &hp->n_swa, 0, err))
		return -1;
	hp->final_softcap = 0.0f;
	/* Without a sliding window llama.cpp builds the non-SWA graph, the one
	 * that applies the final logit softcap. */
	if (hp->n_swa == 0 &&
	    q4kh_model_f32(m, "%s.final_logit_softcapping", &hp->final_softcap, 0, err))
		return -1;
	/* The backend ABI has no tanh op yet; no released Gemma 3 file lacks
	 * the sliding window, so refuse rather than compute it wrongly. */
	if (hp->final_softcap != 0.0f)
		return q4kh_fail(err, "%s: final logit softcapping %g (gemma3 without sliding window) is not supported",
		                 m->gguf->path, hp->final_softcap);
	hp->rope_mode = Q4KH_ROPE_NEOX;
	hp->embd_scale = sqrtf((float)hp->n_embd);
	hp->attn_scale = hp->n_layer == GEMMA3_27B_LAYERS
	                         ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head))
	                         : 1.0f / sqrtf((float)hp->head_dim);
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		struct q4kh_layer *l = &m->layers[il];
		l->swa = hp->n_swa > 0 && il % GEMMA3_SWA_PERIOD != GEMMA3_SWA_PERIOD - 1;
		l->rope_base = l->swa ? GEMMA3_SWA_ROPE_BASE : rope_base;
		l->rope_scale = (l->swa || rope_factor == 0.0f) ? 1.0f : 1.0f / rope_factor;
	}
	return 0;
}

static int load(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp;
	int64_t e, qd, kvd;

	if (load_hparams(m, err))
		return -1;
	hp = &m->hp;
	e = hp->n_embd;
	qd = (int64_t)hp->head_dim * hp->n_head;
	kvd = (int64_t)hp->head_dim * hp->n_head_kv;
	if (q4kh_model_bind_io(m, err))
		return -1;
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		struct q4kh_layer *l = &m->layers[il];
		if (q4kh_model_bind(m, &l->attn_norm, 1, e, 1, err, "blk.%u.attn_norm.weight", il) ||
		    q4kh_model_bind(m, &l->wq, 1, e, qd, err, "blk.%u.attn_q.weight", il) ||
		    q4kh_model_bind(m, &l->wk, 1, e, kvd, err, "blk.%u.attn_k.weight", il) ||
		    q4kh_model_bind(m, &l->wv, 1, e, kvd, err, "blk.%u.attn_v.weight", il) ||
		    q4kh_model_bind(m, &l->wo, 1, qd, e, err, "blk.%u.attn_output.weight", il) ||
		    q4kh_model_bind(m, &l->q_norm, 1, hp->head_dim, 1, err, "blk.%u.attn_q_norm.weight", il) ||
		    q4kh_model_bind(m, &l->k_norm, 1, hp->head_dim, 1, err, "blk.%u.attn_k_norm.weight", il) ||
		    q4kh_model_bind(m, &l->post_attn_norm, 1, e, 1, err, "blk.%u.post_attention_norm.weight", il) ||
		    q4kh_model_bind(m, &l->ffn_norm, 1, e, 1, err, "blk.%u.ffn_norm.weight", il) ||
		    q4kh_model_bind(m, &l->w_gate, 1, e, hp->n_ff, err, "blk.%u.ffn_gate.weight", il) ||
		    q4kh_model_bind(m, &l->w_up, 1, e, hp->n_ff, err, "blk.%u.ffn_up.weight", il) ||
		    q4kh_model_bind(m, &l->w_down, 1, hp->n_ff, e, err, "blk.%u.ffn_down.weight", il) ||
		    q4kh_model_bind(m, &l->post_ffw_norm, 1, e, 1, err, "blk.%u.post_ffw_norm.weight", il))
			return -1;
	}
	return 0;
}

/* x += rmsnorm(a) w: the post-norm on a block's output, then the residual. */
static void add_post_norm(struct q4kh_graph *g, const struct q4kh_model *m,
                          int32_t x, int32_t a, const struct q4kh_weight *w,
                          const char *name, uint32_t il)
{
	q4kh_graph_rms_norm(g, a, q4kh_graph_weight(g, w, "blk.%u.%s", il, name),
	                    m->hp.eps, a);
	q4kh_graph_add(g, x, a, x);
}

static int build(struct q4kh_graph *g, const struct q4kh_seqs *seq,
                 struct q4kh_error *err)
{
	const struct q4kh_model *m = seq->m;
	int32_t x = q4kh_block_embed(g, m);

	(void)err; /* misuse is recorded in g and checked by the caller */
	for (uint32_t il = 0; il < m->hp.n_layer; il++) {
		const struct q4kh_layer *l = &m->layers[il];
		/*
		 * llama.cpp scales q by attn_scale after RoPE and gives its
		 * attention a scale of 1; here the attention's own scale is
		 * attn_scale. The same math: the scale multiplies each q . k
		 * either way (and RoPE is linear). The same bits too but on
		 * 27B: 1/16 on the other sizes (head dim 256) scales exactly.
		 * No op of its own, and nothing between rope q, rope k and
		 * the two cache writes: one rope_store call where the backend
		 * has it (graph_run.c).
		 */
		const struct q4kh_attn_opts opts = {
			.window = l->swa ? (int32_t)m->hp.n_swa : 0,
		};
		int32_t h = q4kh_block_norm(g, m, x, &l->attn_norm, "attn_norm", il);

		add_post_norm(g, m, x, q4kh_block_attention(g, seq, il, h, &opts),
		              &l->post_attn_norm, "post_attention_norm", il);
		h = q4kh_block_norm(g, m, x, &l->ffn_norm, "ffn_norm", il);
		add_post_norm(g, m, x, q4kh_block_ffn(g, m, il, h, Q4KH_GLU_GELU_TANH),
		              &l->post_ffw_norm, "post_ffw_norm", il);
	}
	q4kh_block_logits(g, m, x);
	return 0;
}

const struct q4kh_arch q4kh_arch_gemma3 = {
	.name = "gemma3",
	.load = load,
	.build = build,
};
