/*
 * A paged KV cache's pools on a device: kv_paged.h.
 */
#include "kv_paged.h"

#include <stdlib.h>

#include "backend.h"
#include "tensor.h"

int q4kh_kv_paged_supported(const struct q4kh_model *m, struct q4kh_error *why)
{
	const struct q4kh_backend *b = m->backend;

	if (m->hp.n_recurrent) {
		q4kh_fail(why, "%s has recurrent layers, whose states hold one sequence: no paged KV cache",
		          m->arch->name);
		return 0;
	}
	if (!Q4KH_BACKEND_HAS(b->v, attention_paged) || !Q4KH_BACKEND_HAS(b->v, set_rows)) {
		q4kh_fail(why, "backend %s has no paged KV cache: it has no %s (ABI 1.8)",
		          b->plugin->name,
		          Q4KH_BACKEND_HAS(b->v, attention_paged) ? "set_rows" : "attention_paged");
		return 0;
	}
	return 1;
}

int q4kh_kv_paged_new(struct q4kh_model *m, int32_t n_pages, int32_t page_size,
                      uint32_t kv_type, struct q4kh_kv_paged **out, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &m->hp;
	const struct q4kh_backend *b = m->backend;
	struct q4kh_kv_paged *k;
	uint64_t layer;

	*out = NULL;
	if (!q4kh_kv_paged_supported(m, err))
		return -1;
	k = calloc(1, sizeof(*k));
	if (!k)
		return q4kh_fail(err, "out of memory");
	k->m = m;
	k->kv_type = kv_type;
	k->k_pool = calloc(hp->n_layer, sizeof(*k->k_pool));
	k->v_pool = calloc(hp->n_layer, sizeof(*k->v_pool));
	if (!k->k_pool || !k->v_pool) {
		q4kh_fail(err, "out of memory");
		goto fail;
	}
	if (q4kh_kv_pool_init(&k->pool, n_pages, page_size, err))
		goto fail;
	/* 256-byte aligned layers, as a session's contiguous cache */
	layer = ((uint64_t)hp->head_dim * hp->n_head_kv * (uint64_t)n_pages * (uint64_t)page_size *
	                 q4kh_type_block_bytes(kv_type) + 255) / 256 * 256;
	if (q4kh_backend_check(b, b->v->buffer_alloc(b->dev, layer * 2 * hp->n_layer, &k->buf),
	                       "buffer_alloc (paged KV cache)", err))
		goto fail;
	/* no recurrent layer: every layer attends */
	for (uint32_t il = 0; il < hp->n_layer; il++) {
		k->k_pool[il] = q4kh_tensor_make(k->buf, layer * (2 * il), kv_type, hp->head_dim,
		                                 hp->n_head_kv, (int64_t)n_pages * page_size);
		k->v_pool[il] = q4kh_tensor_make(k->buf, layer * (2 * il + 1), kv_type,
		                                 hp->head_dim, hp->n_head_kv,
		                                 (int64_t)n_pages * page_size);
	}
	*out = k;
	return 0;
fail:
	q4kh_kv_paged_free(k);
	return -1;
}

void q4kh_kv_paged_free(struct q4kh_kv_paged *k)
{
	if (!k)
		return;
	if (k->buf)
		k->m->backend->v->buffer_free(k->m->backend->dev, k->buf);
	q4kh_kv_pool_free(&k->pool);
	free(k->k_pool);
	free(k->v_pool);
	free(k);
}

int q4kh_kv_paged_copy(void *arg, int32_t src, int32_t dst, struct q4kh_error *err)
{
	const struct q4kh_kv_paged *k = arg;
	const struct q4kh_backend *b = k->m->backend;
	const int64_t ps = k->pool.page_size;

	for (uint32_t il = 0; il < k->m->hp.n_layer; il++) {
		const struct q4kh_tensor *const pools[2] = { &k->k_pool[il], &k->v_pool[il] };

		for (int kv = 0; kv < 2; kv++) {
			const struct q4kh_tensor from = q4kh_tensor_cols(pools[kv], src * ps, ps);
			const struct q4kh_tensor to = q4kh_tensor_cols(pools[kv], dst * ps, ps);

			if (q4kh_backend_check(b, b->v->copy(b->dev, &from, &to),
			                       "copy (a shared KV page, copied on write)", err))
				return -1;
		}
	}
	return 0;
}
