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

#include "arch_llama.h"
#include "session.h"
#include "tensor.h"

/* RoPE base and linear frequency scaling; other scalings are refused. */
static int load_rope(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;
	float base = 10000.0f, factor = 0.0f;
	struct q4kh_gguf_str type = { 0, NULL };
	char key[128], shown[144];
	int rc;

	snprintf(key, sizeof(key), "%s.rope.scaling.type", m->arch->name);
	rc = q4kh_gguf_get_str(m->gguf, key, &type, err);
	if (rc < 0)
		return -1;
	if (rc == 0 && !(type.len == 4 && !memcmp(type.data, "none", 4)) &&
	    !(type.len == 6 && !memcmp(type.data, "linear", 6)))
		return q4kh_fail(err, "%s: %s is \"%s\": not supported (supported: none, linear)",
		                 m->gguf->path, key,
		                 q4kh_show(shown, sizeof(shown), type.data, type.len, 32, 0));
	if (q4kh_gguf_tensor(m->gguf, "rope_freqs.weight"))
		return q4kh_fail(err, "%s: tensor rope_freqs.weight (Llama 3.1 RoPE frequency factors) is not supported",
		                 m->gguf->path);
	/* llama.cpp applies a factor whatever the type says */
	if (q4kh_model_f32(m, "%s.rope.freq_base", &base, 0, err) ||
	    q4kh_model_f32(m, "%s.rope.scaling.factor", &factor, 0, err))
		return -1;
	if (!(base > 0.0f) || isinf(base) || !(factor >= 0.0f) || isinf(factor))
		return q4kh_fail(err, "%s: %s.rope.freq_base %g and rope.scaling.factor %g: expected a finite base > 0 and a finite factor >= 0",
		                 m->gguf->path, m->arch->name, (double)base, (double)factor);
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		m->layers[il].rope_base = base;
		m->layers[il].rope_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
	}
	return 0;
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
	    q4kh_model_bind(m, &l->ffn_norm, 1, e, 1, err, "blk.%u.ffn_norm.weight", il) ||
	    q4kh_model_bind(m, &l->w_gate, 1, e, hp->n_ff, err, "blk.%u.ffn_gate.weight", il) ||
	    q4kh_model_bind(m, &l->w_up, 1, e, hp->n_ff, err, "blk.%u.ffn_up.weight", il) ||
	    q4kh_model_bind(m, &l->w_down, 1, hp->n_ff, e, err, "blk.%u.ffn_down.weight", il))
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

	if (q4kh_model_attn_hparams(m, err) || load_rope(m, err) ||
	    q4kh_model_bind_io(m, err))
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

/* Stop at the first failing op; the plugin's message is in err. */
#define OP(call, name)                                                   \
	do {                                                             \
		if (q4kh_backend_check(b, (call), (name), err))          \
			return -1;                                       \
	} while (0)

/* y += bias, broadcast over the tokens, when the layer has that bias. */
static int add_bias(const struct q4kh_backend *b, const struct q4kh_weight *bias,
                    const struct q4kh_tensor *y, struct q4kh_error *err)
{
	if (bias->src)
		OP(b->v->add(b->dev, y, &bias->t, y), "add (bias)");
	return 0;
}

/* Norm, q/k/v, optional per-head norms, RoPE, cache, attention: into s->o. */
static int attention(struct q4kh_session *s, const struct q4kh_layer *l,
                     int64_t n, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &s->m->hp;
	const struct q4kh_backend *b = s->b;
	const struct q4kh_backend_v1 *v = b->v;
	q4kh_device_ctx *dev = b->dev;
	const int64_t hd = hp->head_dim;
	const int64_t il = l - s->m->layers;
	struct q4kh_tensor x = q4kh_tensor_cols(&s->x, 0, n);
	struct q4kh_tensor h = q4kh_tensor_cols(&s->h, 0, n);
	struct q4kh_tensor q = q4kh_tensor_cols(&s->q, 0, n);
	struct q4kh_tensor k = q4kh_tensor_cols(&s->k, 0, n);
	struct q4kh_tensor vv = q4kh_tensor_cols(&s->v, 0, n);
	struct q4kh_tensor o = q4kh_tensor_cols(&s->o, 0, n);
	/* Heads as rows: {hd, heads, n}, and {hd, heads * n} for per-head norms. */
	struct q4kh_tensor qh = q4kh_tensor_reshape(&q, hd, hp->n_head, n);
	struct q4kh_tensor kh = q4kh_tensor_reshape(&k, hd, hp->n_head_kv, n);
	struct q4kh_tensor vh = q4kh_tensor_reshape(&vv, hd, hp->n_head_kv, n);
	struct q4kh_tensor oh = q4kh_tensor_reshape(&o, hd, hp->n_head, n);
	struct q4kh_tensor qr = q4kh_tensor_reshape(&q, hd, hp->n_head * n, 1);
	struct q4kh_tensor kr = q4kh_tensor_reshape(&k, hd, hp->n_head_kv * n, 1);
	struct q4kh_tensor kc = q4kh_tensor_cols(&s->k_cache[il], s->n_past, n);
	struct q4kh_tensor vc = q4kh_tensor_cols(&s->v_cache[il], s->n_past, n);
	struct q4kh_attn_params ap = {
		.struct_size = sizeof(ap),
		.window = 0,
		.pos0 = s->n_past,
		.scale = hp->attn_scale,
		.softcap = 0.0f,
	};

	OP(v->rms_norm(dev, &x, &l->attn_norm.t, hp->eps, &h), "rms_norm");
	if (q4kh_session_matmul(s, &l->wq, &h, &q, err) ||
	    q4kh_session_matmul(s, &l->wk, &h, &k, err) ||
	    q4kh_session_matmul(s, &l->wv, &h, &vv, err) ||
	    add_bias(b, &l->bq, &q, err) || add_bias(b, &l->bk, &k, err) ||
	    add_bias(b, &l->bv, &vv, err))
		return -1;
	if (l->q_norm.src) {
		OP(v->rms_norm(dev, &qr, &l->q_norm.t, hp->eps, &qr), "rms_norm (q)");
		OP(v->rms_norm(dev, &kr, &l->k_norm.t, hp->eps, &kr), "rms_norm (k)");
	}
	OP(v->rope(dev, &qh, s->pos, (int32_t)hp->n_rot, hp->rope_mode,
	           l->rope_base, l->rope_scale, &qh), "rope (q)");
	OP(v->rope(dev, &kh, s->pos, (int32_t)hp->n_rot, hp->rope_mode,
	           l->rope_base, l->rope_scale, &kh), "rope (k)");
	OP(v->copy(dev, &kh, &kc), "copy (K cache)");
	OP(v->copy(dev, &vh, &vc), "copy (V cache)");
	OP(v->attention(dev, &qh, &s->k_cache[il], &s->v_cache[il], &ap, &oh),
	   "attention");
	return 0;
}

/* x += Wdown (silu(Wgate f) * (Wup f)), f = rmsnorm(x) ffn_norm. */
static int feed_forward(struct q4kh_session *s, const struct q4kh_layer *l,
                        int64_t n, struct q4kh_error *err)
{
	const struct q4kh_backend *b = s->b;
	q4kh_device_ctx *dev = b->dev;
	struct q4kh_tensor x = q4kh_tensor_cols(&s->x, 0, n);
	struct q4kh_tensor h = q4kh_tensor_cols(&s->h, 0, n);
	struct q4kh_tensor a = q4kh_tensor_cols(&s->a, 0, n);
	struct q4kh_tensor g = q4kh_tensor_cols(&s->g, 0, n);
	struct q4kh_tensor u = q4kh_tensor_cols(&s->u, 0, n);

	OP(b->v->rms_norm(dev, &x, &l->ffn_norm.t, s->m->hp.eps, &h), "rms_norm");
	if (q4kh_session_matmul(s, &l->w_gate, &h, &g, err) ||
	    q4kh_session_matmul(s, &l->w_up, &h, &u, err))
		return -1;
	OP(b->v->glu(dev, Q4KH_GLU_SILU, &g, &u, &g), "glu");
	if (q4kh_session_matmul(s, &l->w_down, &g, &a, err))
		return -1;
	OP(b->v->add(dev, &x, &a, &x), "add");
	return 0;
}

int q4kh_llama_forward(struct q4kh_session *s, const int32_t *ids, int64_t n,
                       int64_t out0, struct q4kh_error *err)
{
	const struct q4kh_model *m = s->m;
	const struct q4kh_hparams *hp = &m->hp;
	const struct q4kh_backend *b = s->b;
	q4kh_device_ctx *dev = b->dev;
	struct q4kh_tensor x = q4kh_tensor_cols(&s->x, 0, n);
	struct q4kh_tensor a = q4kh_tensor_cols(&s->a, 0, n);
	struct q4kh_tensor o = q4kh_tensor_cols(&s->o, 0, n);

	OP(b->v->get_rows(dev, &m->tok_embd.t, ids, n, hp->embd_scale, &x), "get_rows");
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		const struct q4kh_layer *l = &m->layers[il];

		if (attention(s, l, n, err) ||
		    q4kh_session_matmul(s, &l->wo, &o, &a, err))
			return -1;
		OP(b->v->add(dev, &x, &a, &x), "add");
		if (feed_forward(s, l, n, err))
			return -1;
	}
	if (out0 < n) {
		struct q4kh_tensor xo = q4kh_tensor_cols(&x, out0, n - out0);
		struct q4kh_tensor ho = q4kh_tensor_cols(&s->h, 0, n - out0);
		struct q4kh_tensor lo = q4kh_tensor_cols(&s->logits, 0, n - out0);

		OP(b->v->rms_norm(dev, &xo, &m->output_norm.t, hp->eps, &ho),
		   "rms_norm (output)");
		if (q4kh_session_matmul(s, &m->output, &ho, &lo, err))
			return -1;
	}
	return 0;
}

static const struct q4kh_llama_family llama = {
	.rope_mode = Q4KH_ROPE_NORM,
};

const struct q4kh_arch q4kh_arch_llama = {
	.name = "llama",
	.load = q4kh_llama_load,
	.forward = q4kh_llama_forward,
	.data = &llama,
};
