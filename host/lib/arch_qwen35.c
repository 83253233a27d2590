/*
 * Qwen3.5 ("qwen35" GGUF: Qwen3.5 0.8B to 27B, dense), computed as
 * llama.cpp's llama_model_qwen35 and its delta-net base do: a hybrid of
 * gated full-attention layers and gated delta-net linear-attention layers
 * (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks"). Per layer,
 * with x the f32 residual stream and h = rmsnorm(x) attn_norm:
 *
 * full attention (every full_attention_interval-th layer, or the layers
 * attention.recurrent_layers leaves out):
 *   q | gate = Wq h (per head: head_dim query values, then head_dim gate)
 *   q, k = rmsnorm(q) q_norm, rmsnorm(Wk h) k_norm per head; v = Wv h
 *   q, k = rope(q), rope(k)   (NeoX over rope.dimension_count values)
 *   a = Wo (attention(q, K, V) * sigmoid(gate))
 *
 * linear attention (H_k key heads, H_v value heads, S values per head):
 *   c = silu(conv(Wqkv h))    (short causal convolution, K taps per
 *                              channel, the last K-1 inputs kept)
 *   q, k, v = the parts of c; q, k = l2norm(q), l2norm(k) per head
 *   beta = sigmoid(Wbeta h), g = softplus(Walpha h + dt_bias) * ssm_a
 *   o = delta_net(q, k, v, g, beta)   (plugin.h; the state kept)
 *   a = Wout (rmsnorm(o) ssm_norm * silu(Wz h))   (per value head)
 *
 * then x = x + a; x = x + Wdown (silu(Wgate f) * (Wup f)),
 * f = rmsnorm(x) post_attention_norm; and logits = Wout (rmsnorm(x)
 * output_norm). Norm weights already hold Qwen's +1 (the converter adds
 * it); ssm_norm's does not need it. Qwen3.5 rotates with interleaved
 * multi-section RoPE; text tokens have one position in every section, so
 * it is NeoX RoPE wherever every rotated pair falls in the three position
 * sections, which load() checks. The layers past block_count -
 * nextn_predict_layers (multi-token prediction) are not run.
 */
#include <math.h>
#include <stdio.h>

#include "arch_blocks.h"
#include "arch_llama.h"
#include "model.h"
#include "session.h"

/* llama.cpp's default when the file has no full_attention_interval */
#define QWEN35_FULL_ATTENTION_INTERVAL 4
#define QWEN35_ROPE_SECTIONS 4

/*
 * Interleaved multi-section RoPE (llama.cpp's IMROPE) gives rotated pair
 * i the position of section (i mod sum) mod 3 while that stays under 3
 * times the section's size, else the fourth section's, which is 0 for
 * text: such a pair would not rotate. Refuse sections that leave one.
 */
static int check_sections(struct q4kh_model *m, struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv;
	int32_t sec[QWEN35_ROPE_SECTIONS];
	char key[128];
	int64_t sum = 0;
	int bad = 0;

	snprintf(key, sizeof(key), "%s.rope.dimension_sections", m->arch->name);
	kv = q4kh_gguf_find(m->gguf, key);
	if (!kv)
		return q4kh_fail(err, "%s: required key %s is missing", m->gguf->path, key);
	if (kv->type != Q4KH_GGUF_ARRAY || kv->count != QWEN35_ROPE_SECTIONS)
		return q4kh_fail(err, "%s: %s is not an array of %d integers",
		                 m->gguf->path, key, QWEN35_ROPE_SECTIONS);
	if (q4kh_gguf_array_i32(m->gguf, kv, sec, err))
		return -1;
	for (int i = 0; i < QWEN35_ROPE_SECTIONS; i++) {
		bad |= sec[i] < 0;
		sum += sec[i];
	}
	for (int64_t i = 0; !bad && i < m->hp.n_rot / 2; i++) {
		int64_t s = sum ? i % sum : 0;

		bad = !sum || s >= 3 * (int64_t)sec[s % 3];
	}
	if (bad)
		return q4kh_fail(err, "%s: %s is [%d, %d, %d, %d]: expected sections that give each of the %u rotated pairs a text position (llama.cpp would leave one unrotated)",
		                 m->gguf->path, key, sec[0], sec[1], sec[2], sec[3],
		                 m->hp.n_rot / 2);
	return 0;
}

/* Which layers are linear attention: the array's nonzero entries, else
 * every layer but each interval-th. LAYERS counts the file's blocks
 * (multi-token prediction layers included), as the array does. */
static int mark_recurrent(struct q4kh_model *m, uint32_t layers,
                          struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;
	uint32_t interval = QWEN35_FULL_ATTENTION_INTERVAL;
	const struct q4kh_gguf_kv *kv;
	char key[128];

	snprintf(key, sizeof(key), "%s.attention.recurrent_layers", m->arch->name);
	kv = q4kh_gguf_find(m->gguf, key);
	if (kv && (kv->type != Q4KH_GGUF_ARRAY || kv->count != layers))
		return q4kh_fail(err, "%s: %s is not an array of %u values (one per block)",
		                 m->gguf->path, key, layers);
	if (!kv && q4kh_model_u32(m, "%s.full_attention_interval", &interval, 0, err))
		return -1;
	if (!kv && interval == 0)
		return q4kh_fail(err, "%s: %s.full_attention_interval is 0", m->gguf->path,
		                 m->arch->name);
	hp->n_recurrent = 0;
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		struct q4kh_gguf_scalar v;

		if (kv && q4kh_gguf_scalar_at(kv, il, &v))
			return q4kh_fail(err, "%s: %s holds no number at %u", m->gguf->path,
			                 key, il);
		if (kv && (v.type == Q4KH_GGUF_FLOAT32 || v.type == Q4KH_GGUF_FLOAT64))
			m->layers[il].recurrent = v.v.f != 0.0;
		else
			m->layers[il].recurrent = kv ? v.v.u != 0 : (il + 1) % interval != 0;
		hp->n_recurrent += (uint32_t)m->layers[il].recurrent;
	}
	return 0;
}

static int load_hparams(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;
	uint32_t blocks, nextn = 0, inner, state, groups, rank;

	if (q4kh_model_attn_hparams(m, err) || q4kh_llama_rope(m, 0, err) ||
	    q4kh_model_u32(m, "%s.nextn_predict_layers", &nextn, 0, err))
		return -1;
	blocks = hp->n_layer;
	if (nextn >= blocks)
		return q4kh_fail(err, "%s: %s.nextn_predict_layers %u of %u blocks leaves no layer",
		                 m->gguf->path, m->arch->name, nextn, blocks);
	hp->n_layer = blocks - nextn;
	if (check_sections(m, err) ||
	    q4kh_model_u32(m, "%s.ssm.conv_kernel", &hp->ssm_conv_k, 1, err) ||
	    q4kh_model_u32(m, "%s.ssm.inner_size", &inner, 1, err) ||
	    q4kh_model_u32(m, "%s.ssm.state_size", &state, 1, err) ||
	    q4kh_model_u32(m, "%s.ssm.group_count", &groups, 1, err) ||
	    q4kh_model_u32(m, "%s.ssm.time_step_rank", &rank, 1, err) ||
	    mark_recurrent(m, blocks, err))
		return -1;
	/* llama.cpp sizes both head kinds by state_size and reads value heads
	 * as inner_size / time_step_rank: they must agree */
	if (hp->ssm_conv_k < 2 || hp->ssm_conv_k > 64 || state == 0 || state > 1024 ||
	    groups == 0 || rank == 0 || rank % groups || (uint64_t)state * rank != inner)
		return q4kh_fail(err, "%s: linear attention with conv_kernel %u, state_size %u, group_count %u, time_step_rank %u, inner_size %u: expected 2 to 64 taps and inner_size = state_size x time_step_rank, a multiple of group_count heads",
		                 m->gguf->path, hp->ssm_conv_k, state, groups, rank, inner);
	hp->ssm_head_dim = state;
	hp->ssm_k_heads = groups;
	hp->ssm_v_heads = rank;
	hp->rope_mode = Q4KH_ROPE_NEOX;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	hp->embd_scale = 1.0f;
	hp->final_softcap = 0.0f;
	hp->n_swa = 0;
	return 0;
}

/* An F32 weight: the ops that read these take no other type. */
static int need_f32(const struct q4kh_model *m, const struct q4kh_weight *w,
                    struct q4kh_error *err)
{
	if (w->src->type == Q4KH_TYPE_F32)
		return 0;
	return q4kh_fail(err, "%s: tensor %.*s is %s, expected F32", m->gguf->path,
	                 (int)w->src->name.len, w->src->name.data,
	                 q4kh_type_name(w->src->type));
}

static int bind_linear(struct q4kh_model *m, uint32_t il, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &m->hp;
	struct q4kh_layer *l = &m->layers[il];
	const int64_t e = hp->n_embd, hv = hp->ssm_v_heads, sd = hp->ssm_head_dim;
	const int64_t vd = sd * hv, ch = 2 * sd * hp->ssm_k_heads + vd;

	if (q4kh_model_bind(m, &l->ssm_in, 1, e, ch, err, "blk.%u.attn_qkv.weight", il) ||
	    q4kh_model_bind(m, &l->ssm_z, 1, e, vd, err, "blk.%u.attn_gate.weight", il) ||
	    q4kh_model_bind(m, &l->ssm_conv, 1, hp->ssm_conv_k, ch, err, "blk.%u.ssm_conv1d.weight", il) ||
	    q4kh_model_bind(m, &l->ssm_alpha, 1, e, hv, err, "blk.%u.ssm_alpha.weight", il) ||
	    q4kh_model_bind(m, &l->ssm_beta, 1, e, hv, err, "blk.%u.ssm_beta.weight", il) ||
	    q4kh_model_bind(m, &l->ssm_dt, 1, hv, 1, err, "blk.%u.ssm_dt.bias", il) ||
	    q4kh_model_bind(m, &l->ssm_a, 1, hv, 1, err, "blk.%u.ssm_a", il) ||
	    q4kh_model_bind(m, &l->ssm_norm, 1, sd, 1, err, "blk.%u.ssm_norm.weight", il) ||
	    q4kh_model_bind(m, &l->ssm_out, 1, vd, e, err, "blk.%u.ssm_out.weight", il) ||
	    need_f32(m, &l->ssm_conv, err) || need_f32(m, &l->ssm_dt, err) ||
	    need_f32(m, &l->ssm_a, err) || need_f32(m, &l->ssm_norm, err))
		return -1;
	l->ssm_conv.not_matrix = 1;
	return 0;
}

static int bind_full(struct q4kh_model *m, uint32_t il, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &m->hp;
	struct q4kh_layer *l = &m->layers[il];
	const int64_t e = hp->n_embd, hd = hp->head_dim;
	const int64_t qd = hd * hp->n_head, kvd = hd * hp->n_head_kv;

	return q4kh_model_bind(m, &l->wq, 1, e, 2 * qd, err, "blk.%u.attn_q.weight", il) ||
	       q4kh_model_bind(m, &l->wk, 1, e, kvd, err, "blk.%u.attn_k.weight", il) ||
	       q4kh_model_bind(m, &l->wv, 1, e, kvd, err, "blk.%u.attn_v.weight", il) ||
	       q4kh_model_bind(m, &l->wo, 1, qd, e, err, "blk.%u.attn_output.weight", il) ||
	       q4kh_model_bind(m, &l->q_norm, 1, hd, 1, err, "blk.%u.attn_q_norm.weight", il) ||
	       q4kh_model_bind(m, &l->k_norm, 1, hd, 1, err, "blk.%u.attn_k_norm.weight", il)
	               ? -1
	               : 0;
}

static int load(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;

	if (load_hparams(m, err) || q4kh_model_bind_io(m, err))
		return -1;
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		struct q4kh_layer *l = &m->layers[il];
		const int64_t e = hp->n_embd;

		if (q4kh_model_bind(m, &l->attn_norm, 1, e, 1, err, "blk.%u.attn_norm.weight", il) ||
		    q4kh_model_bind(m, &l->post_attn_norm, 1, e, 1, err, "blk.%u.post_attention_norm.weight", il) ||
		    q4kh_model_bind(m, &l->w_gate, 1, e, hp->n_ff, err, "blk.%u.ffn_gate.weight", il) ||
		    q4kh_model_bind(m, &l->w_up, 1, e, hp->n_ff, err, "blk.%u.ffn_up.weight", il) ||
		    q4kh_model_bind(m, &l->w_down, 1, hp->n_ff, e, err, "blk.%u.ffn_down.weight", il) ||
		    (l->recurrent ? bind_linear(m, il, err) : bind_full(m, il, err)))
			return -1;
	}
	return 0;
}

/* x <- x / sqrt(sum x^2 + eps) per row, as llama.cpp computes it: an
 * RMSNorm with eps / n, then 1 / sqrt(n). */
static void l2_norm(struct q4kh_graph *g, int32_t x, int64_t n, float eps)
{
	q4kh_graph_rms_norm(g, x, -1, eps / (float)n, x);
	q4kh_graph_scale(g, x, 1.0f / sqrtf((float)n), x);
}

/* The gated delta-net of layer IL over h {n_embd, T}: {n_embd, T}. */
static int32_t linear_attention(struct q4kh_graph *g, const struct q4kh_session *s,
                                uint32_t il, int32_t h)
{
	const struct q4kh_model *m = s->m;
	const struct q4kh_hparams *hp = &m->hp;
	const struct q4kh_layer *l = &m->layers[il];
	const int64_t T = g->n_tokens, sd = hp->ssm_head_dim;
	const int64_t hk = hp->ssm_k_heads, hv = hp->ssm_v_heads;
	const int64_t kd = sd * hk, vd = sd * hv, ch = 2 * kd + vd;
	const int64_t col = ch * (int64_t)sizeof(float), row = sd * (int64_t)sizeof(float);
	int32_t qkv = q4kh_block_project(g, &l->ssm_in, NULL, h, "attn_qkv", il);
	int32_t z = q4kh_block_project(g, &l->ssm_z, NULL, h, "attn_gate", il);
	int32_t beta = q4kh_block_project(g, &l->ssm_beta, NULL, h, "ssm_beta", il);
	/* alpha + dt_bias: the bias rides with the product (gemv_multi) */
	int32_t decay = q4kh_block_project(g, &l->ssm_alpha, &l->ssm_dt, h, "ssm_alpha", il);
	int32_t conv = q4kh_graph_act(g, ch, T, 1, "blk.%u.conv", il);
	int32_t o = q4kh_graph_act(g, sd, hv, T, "blk.%u.delta", il);
	int32_t q, k, v, heads;

	q4kh_graph_unary(g, Q4KH_UNARY_SIGMOID, beta, beta);
	q4kh_graph_unary(g, Q4KH_UNARY_SOFTPLUS, decay, decay);
	q4kh_graph_mul(g, decay, q4kh_graph_weight(g, &l->ssm_a, "blk.%u.ssm_a", il), decay);
	q4kh_graph_ssm_conv(g, qkv, q4kh_graph_weight(g, &l->ssm_conv, "blk.%u.ssm_conv1d", il),
	                    q4kh_graph_fixed(g, &s->conv_state[il], "blk.%u.conv_state", il),
	                    conv);
	q4kh_graph_unary(g, Q4KH_UNARY_SILU, conv, conv);
	/* each token's channels: the queries, the keys, the values */
	q = q4kh_graph_view(g, conv, sd, hk, T, row, col, 0);
	k = q4kh_graph_view(g, conv, sd, hk, T, row, col, (uint64_t)kd * sizeof(float));
	v = q4kh_graph_view(g, conv, sd, hv, T, row, col, 2 * (uint64_t)kd * sizeof(float));
	l2_norm(g, q, sd, hp->eps);
	l2_norm(g, k, sd, hp->eps);
	q4kh_graph_delta_net(g, q, k, v, decay, beta,
	                     q4kh_graph_fixed(g, &s->ssm_state[il], "blk.%u.ssm_state", il),
	                     1.0f / sqrtf((float)sd), o);
	/* the gated RMSNorm, per value head: rmsnorm(o) ssm_norm * silu(z) */
	heads = q4kh_graph_reshape(g, o, sd, hv * T, 1);
	q4kh_graph_rms_norm(g, heads, q4kh_graph_weight(g, &l->ssm_norm, "blk.%u.ssm_norm", il),
	                    hp->eps, heads);
	q4kh_graph_glu(g, Q4KH_GLU_SILU, q4kh_graph_reshape(g, z, sd, hv, T), o, o);
	return q4kh_block_project(g, &l->ssm_out, NULL, q4kh_graph_reshape(g, o, vd, T, 1),
	                          "ssm_out", il);
}

static int build(struct q4kh_graph *g, const struct q4kh_seqs *seq,
                 struct q4kh_error *err)
{
	const struct q4kh_model *m = seq->m;
	const struct q4kh_session *s = seq->s[0];
	const struct q4kh_attn_opts opts = { .gate_q = 1 };
	int32_t x;

	if (seq->n != 1)
		return q4kh_fail(err, "qwen35: a step of %d sequences: its recurrent states hold one sequence, so each runs its own steps",
		                 seq->n);
	x = q4kh_block_embed(g, m);
	for (uint32_t il = 0; il < m->hp.n_layer; il++) {
		const struct q4kh_layer *l = &m->layers[il];
		int32_t h = q4kh_block_norm(g, m, x, &l->attn_norm, "attn_norm", il);

		q4kh_graph_add(g, x,
		               l->recurrent ? linear_attention(g, s, il, h)
		                            : q4kh_block_attention(g, seq, il, h, &opts),
		               x);
		h = q4kh_block_norm(g, m, x, &l->post_attn_norm, "post_attention_norm", il);
		q4kh_graph_add(g, x, q4kh_block_ffn(g, m, il, h, Q4KH_GLU_SILU), x);
	}
	q4kh_block_logits(g, m, x);
	return 0;
}

const struct q4kh_arch q4kh_arch_qwen35 = {
	.name = "qwen35",
	.load = load,
	.build = build,
};
