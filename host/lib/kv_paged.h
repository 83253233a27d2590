/*
 * A paged KV cache on a backend device, shared by the sessions of one
 * model (session.h, q4kh_session_params.paged): per attention layer a key
 * pool and a value pool {head_dim, n_kv, n_pages * page_size}, in one
 * buffer, and the bookkeeping of kv_pool.h over their pages. Each
 * session holds a block table of pages (PagedAttention, Kwon et al. 2023;
 * docs/plugin-abi.md, "Paged KV cache"): its steps write keys and values
 * to the slots its table names (set_rows) and attend through it
 * (attention_paged, ABI 1.8), and a session that takes another's prefix
 * maps that session's pages instead of copying them. Used from one thread
 * at a time, as its sessions are.
 */
#ifndef Q4KH_KV_PAGED_H
#define Q4KH_KV_PAGED_H

#include <stdint.h>

#include "error.h"
#include "kv_pool.h"
#include "model.h"

struct q4kh_kv_paged {
	struct q4kh_model *m;
	struct q4kh_kv_pool pool;
	q4kh_buffer *buf;
	/* Per attention layer {head_dim, n_kv, n_pages * page_size}, in buf;
	 * unset for the others. */
	struct q4kh_tensor *k_pool, *v_pool;
	uint32_t kv_type; /* Q4KH_TYPE_F32 or Q4KH_TYPE_F16 */
};

/*
 * Can M's sessions share a paged KV cache? 1 when they can; 0 with WHY
 * saying why not: M has recurrent layers (their states hold one
 * sequence, not pages), or its backend lacks attention_paged or set_rows
 * (ABI 1.8). For a caller that falls back to a cache per session.
 */
int q4kh_kv_paged_supported(const struct q4kh_model *m, struct q4kh_error *why);

/*
 * Pools of N_PAGES pages of PAGE_SIZE tokens for every attention layer of
 * M, of KV_TYPE (F32 or F16), on M's backend; -1 with err where
 * q4kh_kv_paged_supported says no (its reason), or when the device's
 * memory runs out.
 */
int q4kh_kv_paged_new(struct q4kh_model *m, int32_t n_pages, int32_t page_size,
                      uint32_t kv_type, struct q4kh_kv_paged **out, struct q4kh_error *err);

/* Free the pools (every session on them freed first); NULL is ignored. */
void q4kh_kv_paged_free(struct q4kh_kv_paged *k);

/*
 * A q4kh_kv_copy_fn (kv_pool.h) over ARG, a struct q4kh_kv_paged: page SRC
 * of every layer's key and value pools copied into page DST with the
 * backend's copy (the same bits). 0, or -1 with err.
 */
int q4kh_kv_paged_copy(void *arg, int32_t src, int32_t dst, struct q4kh_error *err);

#endif
