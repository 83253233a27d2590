/*
 * Llama ("llama" GGUF: Llama 2/3, TinyLlama, SmolLM and kin), and the
 * graph its family shares, computed as llama.cpp's llm_build_llama,
 * llm_build_qwen2 and llm_build_qwen3 do (Touvron et al. 2023, "LLaMA";
 * Qwen2 and Qwen3 technical reports, 2024/2025). Per layer, with x the f32
 * residual stream:
 *   h = rmsnorm(x) attn_norm
 *   q, k, v = Wq h (+ bq), Wk h (+ bk), Wv h (+ bv)
 *   [qk_norm] per head: q = rmsnorm(q) q_norm, k = rmsnorm(k) k_norm
 *   q, k = rope(q), rope(k)       (NORM for Llama, NEOX for Qwen)
 *   x = x + Wo attention(q, K, V)  (scores scaled by 1/sqrt(head_dim))
 *   x = x + Wdown (silu(Wgate f) * (Wup f)),  f = rmsnorm(x) ffn_norm
 * then logits = Wout (rmsnorm(x) output_norm), Wout = token_embd if tied.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch_blocks.h"
#include "arch_llama.h"

/* 1 when string S of length N is TEXT. */
static int is(const struct q4kh_gguf_str *s, const char *text)
{
	return s->len == strlen(text) && !memcmp(s->data, text, s->len);
}

/* YaRN's magnitude factor as llama.cpp's context computes it (llama-context.cpp). */
static float yarn_mscale(float factor, float mscale)
{
	return factor <= 1.0f ? 1.0f : 0.1f * mscale * logf(factor) + 1.0f;
}

/*
 * RoPE: base, rope.scaling.type none, linear or yarn with its factor,
 * original context, attention factor and log multiplier, as llama.cpp
 * 0.3.36 reads them (llama-model.cpp, llama-context.cpp: YaRN's
 * ext_factor 1, beta_fast 32, beta_slow 1); the frequency factors of
 * rope_freqs.weight when the family has them. Other scalings are refused.
 */
int q4kh_llama_rope(struct q4kh_model *m, int rope_freqs, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;
	float base = 10000.0f, factor = 0.0f, attn = 1.0f, log_mul = 0.0f, scale;
	struct q4kh_gguf_str type = { 0, NULL };
	char key[128], shown[144];
	int rc, yarn;

	snprintf(key, sizeof(key), "%s.rope.scaling.type", m->arch->name);
	rc = q4kh_gguf_get_str(m->gguf, key, &type, err);
	if (rc < 0)
		return -1;
	yarn = rc == 0 && is(&type, "yarn");
	if (rc == 0 && !is(&type, "none") && !is(&type, "linear") && !yarn)
		return q4kh_fail(err, "%s: %s is \"%s\": not supported (supported: none, linear, yarn)",
		                 m->gguf->path, key,
		                 q4kh_show(shown, sizeof(shown), type.data, type.len, 32, 0));
	if (q4kh_model_f32(m, "%s.rope.freq_base", &base, 0, err) ||
	    q4kh_model_f32(m, "%s.rope.scaling.factor", &factor, 0, err) ||
	    q4kh_model_f32(m, "%s.rope.scaling.attn_factor", &attn, 0, err) ||
	    q4kh_model_f32(m, "%s.rope.scaling.yarn_log_multiplier", &log_mul, 0, err) ||
	    q4kh_model_u32(m, "%s.rope.scaling.original_context_length", &hp->n_ctx_orig, 0, err))
		return -1;
	if (!(base > 0.0f) || isinf(base) || !(factor >= 0.0f) || isinf(factor) ||
	    !isfinite(attn) || !isfinite(log_mul))
		return q4kh_fail(err, "%s: %s.rope.freq_base %g, rope.scaling.factor %g, attn_factor %g, yarn_log_multiplier %g: expected a finite base > 0, a finite factor >= 0 and finite factors",
		                 m->gguf->path, m->arch->name, (double)base, (double)factor,
		                 (double)attn, (double)log_mul);
	/* a factor applies unless the type says none (llama-context.cpp) */
	scale = factor == 0.0f || (rc == 0 && is(&type, "none")) ? 1.0f : 1.0f / factor;
	hp->rope_attn_factor = attn;
	if (yarn) {
		float fac = 1.0f / scale;

		if (hp->n_ctx_orig == 0)
			return q4kh_fail(err, "%s: YaRN RoPE scaling needs %s.rope.scaling.original_context_length or %s.context_length",
			                 m->gguf->path, m->arch->name, m->arch->name);
		hp->rope_ext_factor = 1.0f;
		hp->yarn_beta_fast = 32.0f;
		hp->yarn_beta_slow = 1.0f;
		hp->rope_attn_factor *= (log_mul != 0.0f
		                                 ? yarn_mscale(fac, 1.0f) / yarn_mscale(fac, log_mul)
		                                 : yarn_mscale(fac, 1.0f)) /
		                        (1.0f + 0.1f * logf(fac));
	}
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		m->layers[il].rope_base = base;
		m->layers[il].rope_scale = scale;
	}
	if (!rope_freqs && q4kh_gguf_tensor(m->gguf, "rope_freqs.weight"))
		return q4kh_fail(err, "%s: tensor rope_freqs.weight: RoPE frequency factors are not part of the %s architecture",
		                 m->gguf->path, m->arch->name);
	if (q4kh_model_bind(m, &m->rope_freqs, 0, hp->n_rot / 2, 1, err, "rope_freqs.weight"))
		return -1;
	if (m->rope_freqs.src && m->rope_freqs.src->type != Q4KH_TYPE_F32)
		return q4kh_fail(err, "%s: rope_freqs.weight is %s, expected F32", m->gguf->path,
		                 q4kh_type_name(m->rope_freqs.src->type));
	return 0;
}

/*
 * A mixture of experts' sizes as llama.cpp 0.3.36 reads them
 * (llama-model.cpp, qwen3moe.cpp): expert_count and expert_used_count,
 * 1 <= used <= count; expert_feed_forward_length, else n_ff / used.
 */
static int expert_hparams(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;

	if (q4kh_model_u32(m, "%s.expert_count", &hp->n_expert, 1, err) ||
	    q4kh_model_u32(m, "%s.expert_used_count", &hp->n_expert_used, 1, err) ||
	    q4kh_model_u32(m, "%s.expert_feed_forward_length", &hp->n_ff_exp, 0, err))
		return -1;
	if (hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert ||
	    hp->n_expert > Q4KH_MAX_EXPERTS)
		return q4kh_fail(err, "%s: %s.expert_count %u, expert_used_count %u: expected 1 <= used <= count <= %d",
		                 m->gguf->path, m->arch->name, hp->n_expert, hp->n_expert_used,
		                 Q4KH_MAX_EXPERTS);
	if (hp->n_ff_exp == 0)
		hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
	return 0;
}

/* Layer IL's router and its experts' three stacks. */
static int bind_experts(struct q4kh_model *m, uint32_t il, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &m->hp;
	struct q4kh_layer *l = &m->layers[il];
	const int64_t e = hp->n_embd, f = hp->n_ff_exp, n = hp->n_expert;

	return q4kh_model_bind(m, &l->ffn_gate_inp, 1, e, n, err, "blk.%u.ffn_gate_inp.weight", il) ||
	       q4kh_model_bind3(m, &l->ffn_gate_exps, e, f, n, err, "blk.%u.ffn_gate_exps.weight", il) ||
	       q4kh_model_bind3(m, &l->ffn_up_exps, e, f, n, err, "blk.%u.ffn_up_exps.weight", il) ||
	       q4kh_model_bind3(m, &l->ffn_down_exps, f, e, n, err, "blk.%u.ffn_down_exps.weight", il)
	               ? -1
	               : 0;
}

static int bind_layer(struct q4kh_model *m, const struct q4kh_llama_family *f,
                      uint32_t il, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &m->hp;
	struct q4kh_layer *l = &m->layers[il];
	const int64_t e = hp->n_embd, hd = hp->head_dim;
	const int64_t qd = hd * hp->n_head, kvd = hd * hp->n_head_kv;

	if (q4kh_model_bind(m, &l->attn_norm, 1, e, 1, err, "blk.%u.attn_norm.weight", il) ||
	    q4kh_model_bind(m, &l->wq, 1, e, qd, err, "blk.%u.attn_q.weight", il) ||
	    q4kh_model_bind(m, &l->wk, 1, e, kvd, err, "blk.%u.attn_k.weight", il) ||
	    q4kh_model_bind(m, &l->wv, 1, e, kvd, err, "blk.%u.attn_v.weight", il) ||
	    q4kh_model_bind(m, &l->bq, f->qkv_bias, qd, 1, err, "blk.%u.attn_q.bias", il) ||
	    q4kh_model_bind(m, &l->bk, f->qkv_bias, kvd, 1, err, "blk.%u.attn_k.bias", il) ||
	    q4kh_model_bind(m, &l->bv, f->qkv_bias, kvd, 1, err, "blk.%u.attn_v.bias", il) ||
	    q4kh_model_bind(m, &l->wo, 1, qd, e, err, "blk.%u.attn_output.weight", il) ||
	    q4kh_model_bind(m, &l->ffn_norm, 1, e, 1, err, "blk.%u.ffn_norm.weight", il))
		return -1;
	if (f->moe ? bind_experts(m, il, err)
	           : (q4kh_model_bind(m, &l->w_gate, 1, e, hp->n_ff, err, "blk.%u.ffn_gate.weight", il) ||
	              q4kh_model_bind(m, &l->w_up, 1, e, hp->n_ff, err, "blk.%u.ffn_up.weight", il) ||
	              q4kh_model_bind(m, &l->w_down, 1, hp->n_ff, e, err, "blk.%u.ffn_down.weight", il)))
		return -1;
	if (f->qk_norm &&
	    (q4kh_model_bind(m, &l->q_norm, 1, hd, 1, err, "blk.%u.attn_q_norm.weight", il) ||
	     q4kh_model_bind(m, &l->k_norm, 1, hd, 1, err, "blk.%u.attn_k_norm.weight", il)))
		return -1;
	/* biases are added as f32 vectors (q4kh_model_bind checks vectors are
	 * not block-quantized; F16 would need a conversion first) */
	if ((l->bq.src && l->bq.src->type != Q4KH_TYPE_F32) ||
	    (l->bk.src && l->bk.src->type != Q4KH_TYPE_F32) ||
	    (l->bv.src && l->bv.src->type != Q4KH_TYPE_F32))
		return q4kh_fail(err, "%s: blk.%u attention biases must be F32", m->gguf->path, il);
	return 0;
}

int q4kh_llama_load(struct q4kh_model *m, struct q4kh_error *err)
{
	const struct q4kh_llama_family *f = m->arch->data;
	struct q4kh_hparams *hp = &m->hp;

	if (q4kh_model_attn_hparams(m, err) || q4kh_llama_rope(m, f->rope_freqs, err) ||
	    (f->moe && expert_hparams(m, err)) || q4kh_model_bind_io(m, err))
		return -1;
	hp->rope_mode = f->rope_mode;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	hp->embd_scale = 1.0f;
	hp->final_softcap = 0.0f;
	hp->n_swa = 0;
	for (uint32_t il = 0; il < hp->n_layer; il++)
		if (bind_layer(m, f, il, err))
			return -1;
	return 0;
}

int q4kh_llama_build(struct q4kh_graph *g, const struct q4kh_seqs *seq,
                     struct q4kh_error *err)
{
	const struct q4kh_model *m = seq->m;
	const struct q4kh_llama_family *f = m->arch->data;
	const struct q4kh_attn_opts opts = { .window = 0 };
	int32_t x = q4kh_block_embed(g, m);

	(void)err; /* misuse is recorded in g and checked by the caller */
	for (uint32_t il = 0; il < m->hp.n_layer; il++) {
		const struct q4kh_layer *l = &m->layers[il];
		int32_t h = q4kh_block_norm(g, m, x, &l->attn_norm, "attn_norm", il);

		q4kh_graph_add(g, x, q4kh_block_attention(g, seq, il, h, &opts), x);
		h = q4kh_block_norm(g, m, x, &l->ffn_norm, "ffn_norm", il);
		q4kh_graph_add(g, x,
		               f->moe ? q4kh_block_moe(g, m, il, h)
		                      : q4kh_block_ffn(g, m, il, h, Q4KH_GLU_SILU),
		               x);
	}
	q4kh_block_logits(g, m, x);
	return 0;
}

static const struct q4kh_llama_family llama = {
	.rope_mode = Q4KH_ROPE_NORM,
	.rope_freqs = 1,
};

const struct q4kh_arch q4kh_arch_llama = {
	.name = "llama",
	.load = q4kh_llama_load,
	.build = q4kh_llama_build,
	.data = &llama,
};
