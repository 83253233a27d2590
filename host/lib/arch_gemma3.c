/*
 * Gemma 3 ("gemma3" GGUF), computed as llama.cpp does
 * (/work/shared/gemma3-notes.md; Gemma 3 technical report, 2025):
 * interleaved sliding-window and global attention layers, per-head q/k
 * RMSNorm, NeoX RoPE with a separate base for local layers, pre- and
 * post-norms around attention and the GELU-gated FFN, tied embeddings
 * scaled by sqrt(n_embd). Norm weights already hold Gemma's +1.
 */
#include <math.h>
#include <stdlib.h>

#include "model.h"
#include "session.h"
#include "tensor.h"

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

/* Stop at the first failing op; the plugin's message is in err. */
#define OP(call, name)                                                   \
	do {                                                             \
		if (q4kh_backend_check(b, (call), (name), err))          \
			return -1;                                       \
	} while (0)

static int forward(struct q4kh_session *s, const int32_t *ids, int64_t n,
                   int64_t out0, struct q4kh_error *err)
{
	const struct q4kh_model *m = s->m;
	const struct q4kh_hparams *hp = &m->hp;
	const struct q4kh_backend *b = s->b;
	const struct q4kh_backend_v1 *v = b->v;
	q4kh_device_ctx *dev = b->dev;
	const int64_t hd = hp->head_dim;
	struct q4kh_tensor x = q4kh_tensor_cols(&s->x, 0, n);
	struct q4kh_tensor h = q4kh_tensor_cols(&s->h, 0, n);
	struct q4kh_tensor a = q4kh_tensor_cols(&s->a, 0, n);
	struct q4kh_tensor q = q4kh_tensor_cols(&s->q, 0, n);
	struct q4kh_tensor k = q4kh_tensor_cols(&s->k, 0, n);
	struct q4kh_tensor vv = q4kh_tensor_cols(&s->v, 0, n);
	struct q4kh_tensor o = q4kh_tensor_cols(&s->o, 0, n);
	struct q4kh_tensor g = q4kh_tensor_cols(&s->g, 0, n);
	struct q4kh_tensor u = q4kh_tensor_cols(&s->u, 0, n);
	/* Heads as rows: {hd, heads, n}, and {hd, heads * n} for per-head norms. */
	struct q4kh_tensor qh = q4kh_tensor_reshape(&q, hd, hp->n_head, n);
	struct q4kh_tensor kh = q4kh_tensor_reshape(&k, hd, hp->n_head_kv, n);
	struct q4kh_tensor vh = q4kh_tensor_reshape(&vv, hd, hp->n_head_kv, n);
	struct q4kh_tensor oh = q4kh_tensor_reshape(&o, hd, hp->n_head, n);
	struct q4kh_tensor qr = q4kh_tensor_reshape(&q, hd, hp->n_head * n, 1);
	struct q4kh_tensor kr = q4kh_tensor_reshape(&k, hd, hp->n_head_kv * n, 1);

	OP(v->get_rows(dev, &m->tok_embd.t, ids, n, hp->embd_scale, &x), "get_rows");
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		const struct q4kh_layer *l = &m->layers[il];
		struct q4kh_tensor kc = q4kh_tensor_cols(&s->k_cache[il], s->n_past, n);
		struct q4kh_tensor vc = q4kh_tensor_cols(&s->v_cache[il], s->n_past, n);
		struct q4kh_attn_params ap = {
			.struct_size = sizeof(ap),
			.window = l->swa ? (int32_t)hp->n_swa : 0,
			.pos0 = s->n_past,
			.scale = 1.0f, /* q is pre-scaled, as llama.cpp does */
			.softcap = 0.0f,
		};

		/* Attention block. */
		OP(v->rms_norm(dev, &x, &l->attn_norm.t, hp->eps, &h), "rms_norm");
		if (q4kh_session_matmul(s, &l->wq, &h, &q, err) ||
		    q4kh_session_matmul(s, &l->wk, &h, &k, err) ||
		    q4kh_session_matmul(s, &l->wv, &h, &vv, err))
			return -1;
		OP(v->rms_norm(dev, &qr, &l->q_norm.t, hp->eps, &qr), "rms_norm (q)");
		OP(v->rms_norm(dev, &kr, &l->k_norm.t, hp->eps, &kr), "rms_norm (k)");
		OP(v->rope(dev, &qh, s->pos, (int32_t)hp->n_rot, hp->rope_mode,
		           l->rope_base, l->rope_scale, &qh), "rope (q)");
		OP(v->rope(dev, &kh, s->pos, (int32_t)hp->n_rot, hp->rope_mode,
		           l->rope_base, l->rope_scale, &kh), "rope (k)");
		OP(v->scale(dev, &q, hp->attn_scale, &q), "scale");
		OP(v->copy(dev, &kh, &kc), "copy (K cache)");
		OP(v->copy(dev, &vh, &vc), "copy (V cache)");
		OP(v->attention(dev, &qh, &s->k_cache[il], &s->v_cache[il], &ap, &oh),
		   "attention");
		if (q4kh_session_matmul(s, &l->wo, &o, &a, err))
			return -1;
		OP(v->rms_norm(dev, &a, &l->post_attn_norm.t, hp->eps, &a), "rms_norm");
		OP(v->add(dev, &x, &a, &x), "add");

		/* Feed-forward block. */
		OP(v->rms_norm(dev, &x, &l->ffn_norm.t, hp->eps, &h), "rms_norm");
		if (q4kh_session_matmul(s, &l->w_gate, &h, &g, err) ||
		    q4kh_session_matmul(s, &l->w_up, &h, &u, err))
			return -1;
		OP(v->glu(dev, Q4KH_GLU_GELU_TANH, &g, &u, &g), "glu");
		if (q4kh_session_matmul(s, &l->w_down, &g, &a, err))
			return -1;
		OP(v->rms_norm(dev, &a, &l->post_ffw_norm.t, hp->eps, &a), "rms_norm");
		OP(v->add(dev, &x, &a, &x), "add");
	}
	if (out0 < n) {
		struct q4kh_tensor xo = q4kh_tensor_cols(&x, out0, n - out0);
		struct q4kh_tensor ho = q4kh_tensor_cols(&h, 0, n - out0);
		struct q4kh_tensor lo = q4kh_tensor_cols(&s->logits, 0, n - out0);

		OP(v->rms_norm(dev, &xo, &m->output_norm.t, hp->eps, &ho), "rms_norm (output)");
		if (q4kh_session_matmul(s, &m->output, &ho, &lo, err))
			return -1;
	}
	return 0;
}

const struct q4kh_arch q4kh_arch_gemma3 = {
	.name = "gemma3",
	.load = load,
	.forward = forward,
};
