#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "kernel.h"
#include "tensor.h"

#define SCRATCH_ALIGN 256

static uint64_t align_up(uint64_t v)
{
	return (v + SCRATCH_ALIGN - 1) & ~(uint64_t)(SCRATCH_ALIGN - 1);
}

/* Lay out an f32 activation of rows x n_batch at *off in the scratch. */
static struct q4kh_tensor scratch_f32(struct q4kh_session *s, uint64_t *off,
                                      int64_t rows)
{
	struct q4kh_tensor t = q4kh_tensor_make(s->scratch, *off, Q4KH_TYPE_F32,
	                                        rows, s->p.n_batch, 1);
	*off += align_up(q4kh_tensor_bytes(&t));
	return t;
}

static int alloc(struct q4kh_session *s, uint64_t size, q4kh_buffer **buf,
                 const char *what, struct q4kh_error *err)
{
	return q4kh_backend_check(s->b, s->b->v->buffer_alloc(s->b->dev, size, buf),
	                          what, err);
}

int q4kh_session_new(struct q4kh_model *m, const struct q4kh_session_params *p,
                     struct q4kh_session **out, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &m->hp;
	struct q4kh_session *s = calloc(1, sizeof(*s));
	uint64_t kv_layer, off = 0;
	int64_t kv_rows = (int64_t)hp->head_dim * hp->n_head_kv;

	if (!s)
		return q4kh_fail(err, "out of memory");
	s->m = m;
	s->b = m->backend;
	s->p = *p;
	if (!s->p.n_ctx)
		s->p.n_ctx = hp->n_ctx_train && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
	if (!s->p.n_batch)
		s->p.n_batch = 64;
	if (s->p.kv_type != Q4KH_TYPE_F16)
		s->p.kv_type = Q4KH_TYPE_F32;
	s->k_cache = calloc(hp->n_layer, sizeof(*s->k_cache));
	s->v_cache = calloc(hp->n_layer, sizeof(*s->v_cache));
	s->pos = calloc(s->p.n_batch, sizeof(*s->pos));
	if (!s->k_cache || !s->v_cache || !s->pos) {
		q4kh_fail(err, "out of memory");
		goto fail;
	}
	kv_layer = align_up((uint64_t)kv_rows * s->p.n_ctx *
	                    q4kh_type_block_bytes(s->p.kv_type));
	if (alloc(s, kv_layer * 2 * hp->n_layer, &s->kv, "buffer_alloc (KV cache)", err))
		goto fail;
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		s->k_cache[il] = q4kh_tensor_make(s->kv, kv_layer * (2 * il), s->p.kv_type,
		                                  hp->head_dim, hp->n_head_kv, s->p.n_ctx);
		s->v_cache[il] = q4kh_tensor_make(s->kv, kv_layer * (2 * il + 1),
		                                  s->p.kv_type, hp->head_dim,
		                                  hp->n_head_kv, s->p.n_ctx);
	}
	/* Sizes first (buffer NULL), then the same layout on the real buffer. */
	for (int pass = 0; pass < 2; pass++) {
		off = 0;
		s->x = scratch_f32(s, &off, hp->n_embd);
		s->h = scratch_f32(s, &off, hp->n_embd);
		s->a = scratch_f32(s, &off, hp->n_embd);
		s->q = scratch_f32(s, &off, (int64_t)hp->head_dim * hp->n_head);
		s->o = scratch_f32(s, &off, (int64_t)hp->head_dim * hp->n_head);
		s->k = scratch_f32(s, &off, kv_rows);
		s->v = scratch_f32(s, &off, kv_rows);
		s->g = scratch_f32(s, &off, hp->n_ff);
		s->u = scratch_f32(s, &off, hp->n_ff);
		s->logits = scratch_f32(s, &off, hp->n_vocab);
		if (pass == 0 && alloc(s, off, &s->scratch, "buffer_alloc (activations)", err))
			goto fail;
	}
	*out = s;
	return 0;
fail:
	q4kh_session_free(s);
	return -1;
}

void q4kh_session_free(struct q4kh_session *s)
{
	if (!s)
		return;
	if (s->kv)
		s->b->v->buffer_free(s->b->dev, s->kv);
	if (s->scratch)
		s->b->v->buffer_free(s->b->dev, s->scratch);
	free(s->k_cache);
	free(s->v_cache);
	free(s->pos);
	free(s);
}

void q4kh_session_reset(struct q4kh_session *s)
{
	s->n_past = 0;
}

int q4kh_session_matmul(struct q4kh_session *s, const struct q4kh_weight *w,
                        const struct q4kh_tensor *x, const struct q4kh_tensor *y,
                        struct q4kh_error *err)
{
	const struct q4kh_kernel *k = w->kernel;

	if (k) {
		int gemv = x->ne[1] <= (int64_t)k->v->max_gemv_columns;
		q4kh_status st = gemv ? k->v->gemv(k->ctx, &k->native, w->prepared, x, y)
		                      : k->v->gemm(k->ctx, &k->native, w->prepared, x, y);
		return q4kh_kernel_check(k, st, gemv ? "gemv" : "gemm", err);
	}
	return q4kh_backend_check(s->b, s->b->v->mul_mat(s->b->dev, &w->t, x, y),
	                          "mul_mat", err);
}

int q4kh_session_eval(struct q4kh_session *s, const int32_t *ids, int64_t n,
                      float *logits, int all, struct q4kh_error *err)
{
	const int64_t n_vocab = s->m->hp.n_vocab;
	const int64_t start = s->n_past;

	if (n <= 0)
		return q4kh_fail(err, "eval of %lld tokens", (long long)n);
	if (s->n_past + n > s->p.n_ctx)
		return q4kh_fail(err, "context full: %lld cached + %lld new tokens > n_ctx %u (a longer context: --ctx N, up to the model's %u)",
		                 (long long)s->n_past, (long long)n, s->p.n_ctx,
		                 s->m->hp.n_ctx_train);
	for (int64_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= n_vocab)
			return q4kh_fail(err, "token %d at index %lld is outside the vocabulary [0, %lld)",
			                 ids[i], (long long)i, (long long)n_vocab);
	for (int64_t c = 0; c < n; c += s->p.n_batch) {
		int64_t t = n - c < s->p.n_batch ? n - c : s->p.n_batch;
		int last = c + t == n;
		int64_t out0 = all ? 0 : (last && logits ? t - 1 : t);

		for (int64_t i = 0; i < t; i++)
			s->pos[i] = (int32_t)(s->n_past + i);
		if (s->m->arch->forward(s, ids + c, t, out0, err))
			goto fail;
		s->n_past += t;
		if (logits && out0 < t) {
			float *dst = all ? logits + c * n_vocab : logits;
			uint64_t bytes = (uint64_t)(t - out0) * n_vocab * sizeof(float);
			if (q4kh_backend_check(s->b,
			                       s->b->v->buffer_download(s->b->dev, s->scratch,
			                                                s->logits.offset, dst,
			                                                bytes),
			                       "buffer_download (logits)", err))
				goto fail;
		}
	}
	return 0;
fail:
	s->n_past = start;
	return -1;
}
