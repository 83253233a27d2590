/*
 * The shared blocks of the architectures' step graphs (arch_blocks.h),
 * computed as llama.cpp's graph builders do (llm_graph_context's
 * build_norm, build_attn and build_ffn).
 */
#include "arch_blocks.h"

#include "kv_paged.h"

int32_t q4kh_block_embed(struct q4kh_graph *g, const struct q4kh_model *m)
{
	int32_t x = q4kh_graph_act(g, m->hp.n_embd, g->n_tokens, 1, "x");

	return q4kh_graph_get_rows(g, q4kh_graph_weight(g, &m->tok_embd, "token_embd"),
	                           m->hp.embd_scale, x);
}

int32_t q4kh_block_norm(struct q4kh_graph *g, const struct q4kh_model *m,
                        int32_t x, const struct q4kh_weight *w,
                        const char *name, uint32_t il)
{
	int32_t out = q4kh_graph_act(g, m->hp.n_embd, g->n_tokens, 1, "blk.%u.%s",
	                             il, name);

	return q4kh_graph_rms_norm(g, x, q4kh_graph_weight(g, w, "blk.%u.%s", il, name),
	                           m->hp.eps, out);
}

int32_t q4kh_block_project(struct q4kh_graph *g, const struct q4kh_weight *w,
                           const struct q4kh_weight *bias, int32_t x,
                           const char *name, uint32_t il)
{
	int32_t out = q4kh_graph_act(g, w->t.ne[1], g->n_tokens, 1, "blk.%u.%s",
	                             il, name);

	return q4kh_graph_mul_mat_bias(
		g, q4kh_graph_weight(g, w, "blk.%u.%s.weight", il, name), x,
		bias && bias->src ? q4kh_graph_weight(g, bias, "blk.%u.%s.bias", il, name)
		                  : -1,
		out);
}

/* Per-head RMSNorm of v {head_dim * heads, T} with weight w, in place. */
static void head_norm(struct q4kh_graph *g, const struct q4kh_model *m,
                      int32_t v, int64_t heads, const struct q4kh_weight *w,
                      const char *name, uint32_t il)
{
	int32_t rows = q4kh_graph_reshape(g, v, m->hp.head_dim, heads * g->n_tokens, 1);

	q4kh_graph_rms_norm(g, rows, q4kh_graph_weight(g, w, "blk.%u.%s", il, name),
	                    m->hp.eps, rows);
}

/*
 * Split Wq's output {2 head_dim n_head, T}, each head's query followed by
 * its gate values, into the queries (returned, contiguous) and
 * sigmoid(gate) {head_dim, n_head, T} in *gate.
 */
static int32_t split_gate(struct q4kh_graph *g, const struct q4kh_hparams *hp,
                          int32_t qg, uint32_t il, int32_t *gate)
{
	const int64_t hd = hp->head_dim, nh = hp->n_head, T = g->n_tokens;
	const int64_t row = 2 * hd * (int64_t)sizeof(float);
	int32_t q = q4kh_graph_act(g, hd * nh, T, 1, "blk.%u.attn_q (query)", il);

	q4kh_graph_copy(g, q4kh_graph_view(g, qg, hd, nh, T, row, row * nh, 0),
	                q4kh_graph_reshape(g, q, hd, nh, T));
	*gate = q4kh_graph_act(g, hd, nh, T, "blk.%u.attn_q (gate)", il);
	q4kh_graph_unary(g, Q4KH_UNARY_SIGMOID,
	                 q4kh_graph_view(g, qg, hd, nh, T, row, row * nh,
	                                 (uint64_t)hd * sizeof(float)),
	                 *gate);
	return q;
}

/*
 * Sequence J's keys and values of layer IL into its caches and its
 * queries' attention over them, into oh: its columns of kh, v and qh
 * and their positions (one, or a prompt's chunk in a mixed step), when
 * the step batches several sequences.
 */
static void attend_one(struct q4kh_graph *g, const struct q4kh_seqs *seq,
                       int32_t j, uint32_t il, int32_t qh, int32_t kh, int32_t vh,
                       int32_t oh, const struct q4kh_attn_opts *opts)
{
	const int64_t c0 = seq->cols ? seq->cols[j] : j;
	const int64_t nt = seq->cols ? seq->cols[j + 1] - c0 : 1;
	const int64_t row = nt * (int64_t)sizeof(int32_t);
	const int32_t pos = q4kh_graph_view(g, g->pos, nt, 1, 1, row, row,
	                                    (uint64_t)c0 * sizeof(int32_t));
	const int32_t kc = q4kh_graph_fixed(g, &seq->s[j]->k_cache[il],
	                                    "blk.%u.k_cache.%d", il, j);
	const int32_t vc = q4kh_graph_fixed(g, &seq->s[j]->v_cache[il],
	                                    "blk.%u.v_cache.%d", il, j);

	q4kh_graph_set_rows(g, q4kh_graph_cols(g, kh, c0, nt), pos, kc);
	q4kh_graph_set_rows(g, q4kh_graph_cols(g, vh, c0, nt), pos, vc);
	q4kh_graph_attention(g, q4kh_graph_cols(g, qh, c0, nt), kc, vc, pos, opts->window,
	                     seq->m->hp.attn_scale, 0.0f, q4kh_graph_cols(g, oh, c0, nt));
}

/*
 * The same over a paged KV cache (session.h, p.paged): sequence J's keys
 * and values to their slots in the layer's pools KP and VP, and its
 * queries' attention through its block table, a column of the step's
 * pages; with several sequences, over its columns of the step (as
 * attend_one), else over all of them.
 */
static void attend_paged(struct q4kh_graph *g, const struct q4kh_seqs *seq, int32_t j,
                         int32_t kp, int32_t vp, int32_t qh, int32_t kh, int32_t vh,
                         int32_t oh, const struct q4kh_attn_opts *opts)
{
	int32_t pos = g->pos, slots = g->slots, pages = g->pages;

	if (seq->n > 1) {
		const int64_t c0 = seq->cols ? seq->cols[j] : j;
		const int64_t nt = seq->cols ? seq->cols[j + 1] - c0 : 1;
		const int64_t row = nt * (int64_t)sizeof(int32_t);
		const uint64_t at = (uint64_t)c0 * sizeof(int32_t);

		pos = q4kh_graph_view(g, g->pos, nt, 1, 1, row, row, at);
		slots = q4kh_graph_view(g, g->slots, nt, 1, 1, row, row, at);
		pages = q4kh_graph_cols(g, g->pages, j, 1);
		qh = q4kh_graph_cols(g, qh, c0, nt);
		kh = q4kh_graph_cols(g, kh, c0, nt);
		vh = q4kh_graph_cols(g, vh, c0, nt);
		oh = q4kh_graph_cols(g, oh, c0, nt);
	}
	q4kh_graph_set_rows(g, kh, slots, kp);
	q4kh_graph_set_rows(g, vh, slots, vp);
	q4kh_graph_attention_paged(g, qh, kp, vp, pos, pages, seq->s[j]->p.paged->pool.page_size,
	                           opts->window, seq->m->hp.attn_scale, 0.0f, oh);
}

int32_t q4kh_block_attention(struct q4kh_graph *g, const struct q4kh_seqs *seq,
                             uint32_t il, int32_t h,
                             const struct q4kh_attn_opts *opts)
{
	const struct q4kh_model *m = seq->m;
	const struct q4kh_hparams *hp = &m->hp;
	const struct q4kh_layer *l = &m->layers[il];
	const int64_t hd = hp->head_dim, T = g->n_tokens;
	/* q, k and v one after another: one gemv_multi where a variant has it */
	int32_t q = q4kh_block_project(g, &l->wq, &l->bq, h, "attn_q", il);
	int32_t k = q4kh_block_project(g, &l->wk, &l->bk, h, "attn_k", il);
	int32_t v = q4kh_block_project(g, &l->wv, &l->bv, h, "attn_v", il);
	const struct q4kh_rope_params rope = {
		.struct_size = sizeof(rope),
		.n_rot = (int32_t)hp->n_rot,
		.mode = (uint32_t)hp->rope_mode,
		.base = l->rope_base,
		.freq_scale = l->rope_scale,
		.ext_factor = hp->rope_ext_factor,
		.attn_factor = hp->rope_attn_factor,
		.beta_fast = hp->yarn_beta_fast,
		.beta_slow = hp->yarn_beta_slow,
		.n_ctx_orig = (int32_t)hp->n_ctx_orig,
	};
	int32_t qh, kh, vh, oh, ff, gate = -1;

	if (opts->gate_q)
		q = split_gate(g, hp, q, il, &gate);
	if (l->q_norm.src) {
		head_norm(g, m, q, hp->n_head, &l->q_norm, "attn_q_norm", il);
		head_norm(g, m, k, hp->n_head_kv, &l->k_norm, "attn_k_norm", il);
	}
	qh = q4kh_graph_reshape(g, q, hd, hp->n_head, T);
	kh = q4kh_graph_reshape(g, k, hd, hp->n_head_kv, T);
	vh = q4kh_graph_reshape(g, v, hd, hp->n_head_kv, T);
	ff = m->rope_freqs.src ? q4kh_graph_weight(g, &m->rope_freqs, "rope_freqs") : -1;
	oh = q4kh_graph_act(g, hd, hp->n_head, T, "blk.%u.attn", il);
	/*
	 * rope q, rope k, k and v into the caches, nothing between them: one
	 * rope_store call on backends that fuse the four, else the keys as
	 * one rope_set_rows (graph_run.c). Several sequences rope every
	 * column at once and then write and attend per sequence, which
	 * those patterns do not match: the nodes run one by one.
	 */
	q4kh_graph_rope(g, qh, &rope, ff, qh);
	q4kh_graph_rope(g, kh, &rope, ff, kh);
	if (seq->s[0]->p.paged) {
		const int32_t kp = q4kh_graph_fixed(g, &seq->s[0]->k_cache[il], "blk.%u.k_pool", il);
		const int32_t vp = q4kh_graph_fixed(g, &seq->s[0]->v_cache[il], "blk.%u.v_pool", il);

		for (int32_t j = 0; j < seq->n; j++)
			attend_paged(g, seq, j, kp, vp, qh, kh, vh, oh, opts);
	} else if (seq->n == 1) {
		const int32_t kc = q4kh_graph_fixed(g, &seq->s[0]->k_cache[il],
		                                    "blk.%u.k_cache", il);
		const int32_t vc = q4kh_graph_fixed(g, &seq->s[0]->v_cache[il],
		                                    "blk.%u.v_cache", il);

		q4kh_graph_set_rows(g, kh, g->pos, kc);
		q4kh_graph_set_rows(g, vh, g->pos, vc);
		q4kh_graph_attention(g, qh, kc, vc, g->pos, opts->window, hp->attn_scale,
		                     0.0f, oh);
	} else {
		for (int32_t j = 0; j < seq->n; j++)
			attend_one(g, seq, j, il, qh, kh, vh, oh, opts);
	}
	if (opts->gate_q)
		q4kh_graph_mul(g, oh, gate, oh);
	return q4kh_block_project(g, &l->wo, NULL,
	                          q4kh_graph_reshape(g, oh, hd * hp->n_head, T, 1),
	                          "attn_output", il);
}

int32_t q4kh_block_ffn(struct q4kh_graph *g, const struct q4kh_model *m,
                       uint32_t il, int32_t h, q4kh_glu_kind act)
{
	const struct q4kh_layer *l = &m->layers[il];
	/*
	 * gate and up adjacent, as q, k and v above, and the GLU in place on
	 * gate right after them: the interpreter's pattern for gemv_glu
	 * (graph_run.c), up read by nothing after it
	 */
	int32_t gate = q4kh_block_project(g, &l->w_gate, NULL, h, "ffn_gate", il);
	int32_t up = q4kh_block_project(g, &l->w_up, NULL, h, "ffn_up", il);

	q4kh_graph_glu(g, act, gate, up, gate);
	return q4kh_block_project(g, &l->w_down, NULL, gate, "ffn_down", il);
}

int32_t q4kh_block_moe(struct q4kh_graph *g, const struct q4kh_model *m, uint32_t il,
                       int32_t h)
{
	const struct q4kh_layer *l = &m->layers[il];
	const int64_t e = m->hp.n_embd, f = m->hp.n_ff_exp, k = m->hp.n_expert_used;
	const int64_t T = g->n_tokens, slot = e * (int64_t)sizeof(float);
	int32_t logits = q4kh_block_project(g, &l->ffn_gate_inp, NULL, h, "ffn_gate_inp", il);
	int32_t ids = q4kh_graph_ids_act(g, k, T, "blk.%u.ffn_moe_topk", il);
	int32_t weights = q4kh_graph_act(g, k, T, 1, "blk.%u.ffn_moe_weights", il);
	int32_t x = q4kh_graph_reshape(g, h, e, 1, T);
	int32_t gate = q4kh_graph_act(g, f, k, T, "blk.%u.ffn_moe_gate", il);
	int32_t up = q4kh_graph_act(g, f, k, T, "blk.%u.ffn_moe_up", il);
	int32_t down = q4kh_graph_act(g, e, k, T, "blk.%u.ffn_moe_down", il);
	int32_t out = q4kh_graph_act(g, e, T, 1, "blk.%u.ffn_moe_out", il);

	q4kh_graph_moe_route(g, logits, 1, ids, weights);
	q4kh_graph_mul_mat_id(g, q4kh_graph_weight(g, &l->ffn_gate_exps, "blk.%u.ffn_gate_exps", il),
	                      x, ids, gate);
	q4kh_graph_mul_mat_id(g, q4kh_graph_weight(g, &l->ffn_up_exps, "blk.%u.ffn_up_exps", il),
	                      x, ids, up);
	q4kh_graph_glu(g, Q4KH_GLU_SILU, gate, up, gate);
	q4kh_graph_mul_mat_id(g, q4kh_graph_weight(g, &l->ffn_down_exps, "blk.%u.ffn_down_exps", il),
	                      gate, ids, down);
	q4kh_graph_mul(g, down, q4kh_graph_reshape(g, weights, 1, k, T), down);
	/* slot j of every token: {n_embd, T}, tokens k slots apart */
	if (k == 1)
		return q4kh_graph_copy(g, q4kh_graph_view(g, down, e, T, 1, slot * k, slot * k * T, 0),
		                       out);
	q4kh_graph_add(g, q4kh_graph_view(g, down, e, T, 1, slot * k, slot * k * T, 0),
	               q4kh_graph_view(g, down, e, T, 1, slot * k, slot * k * T, (uint64_t)slot),
	               out);
	for (int64_t j = 2; j < k; j++)
		q4kh_graph_add(g, out,
		               q4kh_graph_view(g, down, e, T, 1, slot * k, slot * k * T,
		                               (uint64_t)(slot * j)),
		               out);
	return out;
}

void q4kh_block_logits(struct q4kh_graph *g, const struct q4kh_model *m,
                       int32_t x)
{
	int64_t n = g->n_out, done = 0;
	int32_t h, logits, norm;

	if (!n)
		return;
	h = q4kh_graph_act(g, m->hp.n_embd, n, 1, "result_norm");
	norm = q4kh_graph_weight(g, &m->output_norm, "output_norm");
	if (!g->rows)
		q4kh_graph_rms_norm(g, q4kh_graph_cols(g, x, g->n_tokens - n, n), norm,
		                    m->hp.eps, h);
	/* Chosen tokens: each run of them normed into the next columns of h. */
	for (int64_t i = 0; g->rows && i < g->n_tokens;) {
		int64_t j = i;

		while (j < g->n_tokens && g->rows[j])
			j++;
		if (j > i) {
			q4kh_graph_rms_norm(g, q4kh_graph_cols(g, x, i, j - i), norm, m->hp.eps,
			                    q4kh_graph_cols(g, h, done, j - i));
			done += j - i;
		}
		i = j + 1;
	}
	logits = q4kh_graph_act(g, m->hp.n_vocab, n, 1, "logits");
	g->logits = q4kh_graph_mul_mat(g, q4kh_graph_weight(g, &m->output, "output"),
	                               h, logits);
}
