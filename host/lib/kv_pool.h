/*
 * A paged KV cache's bookkeeping: which pages of a pool each sequence
 * holds (its block table), how many sequences hold each page, and which
 * pool slot each token's keys and values go to (PagedAttention, Kwon et
 * al. 2023; docs/plugin-abi.md, "Paged KV cache").
 *
 * The pool is N pages of PAGE_SIZE tokens; the device memory it stands
 * for (a key and a value pool per attention layer, {head_dim, n_kv,
 * n_pages * page_size}) is the caller's, which this file never touches:
 * it says which slots to write (q4kh_kv_table_slots, the set_rows rows),
 * which table to hand attention_paged, and which page to copy where when
 * a shared page is about to be written (the copy function of
 * q4kh_kv_table_own).
 *
 * Sharing: q4kh_kv_table_share maps a sequence's first tokens into
 * another's table by reference (the pages are counted, not copied), the
 * partly filled last page too. A page held by more than one table is
 * read-only: before a sequence writes into one (its next token, or the
 * first token after a shorter prefix), q4kh_kv_table_own gives it a page
 * of its own and has the caller copy the shared one into it (copy on
 * write at the first difference). A page returns to the pool when no
 * table holds it. Not thread-safe: one owner calls it.
 */
#ifndef Q4KH_KV_POOL_H
#define Q4KH_KV_POOL_H

#include <stdint.h>

#include "error.h"

/* The pool: pages and how many tables hold each. */
struct q4kh_kv_pool {
	int32_t page_size; /* tokens a page, >= 1 */
	int32_t n_pages;
	int32_t *refs;  /* [n_pages] the tables holding each page; 0: free */
	int32_t *free;  /* [n_pages] a stack of the free pages, top last */
	int32_t n_free;
};

/* One sequence's block table: its key j is in pages[j / page_size]. */
struct q4kh_kv_table {
	int32_t *pages; /* [cap] the pages, in order of positions */
	int32_t n;      /* pages held */
	int32_t cap;
	int64_t n_tokens; /* positions 0 .. n_tokens - 1 hold keys */
};

/*
 * Copy page SRC of every layer's pools into page DST (ARG: the caller's),
 * the rows of the tokens it holds at least; 0, or -1 with err.
 */
typedef int q4kh_kv_copy_fn(void *arg, int32_t src, int32_t dst, struct q4kh_error *err);

/* N_PAGES (>= 1) free pages of PAGE_SIZE (>= 1) tokens; -1 with err. */
int q4kh_kv_pool_init(struct q4kh_kv_pool *p, int32_t n_pages, int32_t page_size,
                      struct q4kh_error *err);

/* Free the pool's arrays (not the tables, which the caller releases). */
void q4kh_kv_pool_free(struct q4kh_kv_pool *p);

/* Pages that N tokens take: ceil(n / page_size). */
int32_t q4kh_kv_pool_pages_for(const struct q4kh_kv_pool *p, int64_t n);

/* Pages that more than one table holds (shared, read-only). */
int32_t q4kh_kv_pool_shared(const struct q4kh_kv_pool *p);

/*
 * Make T hold N tokens (its n_tokens becomes N): new pages from the pool
 * when N needs more than T holds, the pages past N's given back when it
 * needs fewer (a sequence cut back; a page it still holds part of stays
 * and, when shared, is copied at the next write, q4kh_kv_table_own).
 * Never copies. -1 with err, T unchanged, when the pool has too few free
 * pages ("KV pool full: 1 of its 64 pages free, 3 needed") or memory runs
 * out.
 */
int q4kh_kv_table_resize(struct q4kh_kv_pool *p, struct q4kh_kv_table *t, int64_t n,
                         struct q4kh_error *err);

/*
 * DST, whose pages are given back first, holds SRC's first N tokens (N at
 * most src->n_tokens): SRC's pages that hold them, counted once more,
 * none copied; the last one may be partly filled and stays shared until
 * one of the two writes into it. -1 with err: DST unchanged when it is
 * SRC or N is out of range, empty when memory runs out.
 */
int q4kh_kv_table_share(struct q4kh_kv_pool *p, struct q4kh_kv_table *dst,
                        const struct q4kh_kv_table *src, int64_t n,
                        struct q4kh_error *err);

/*
 * Before T's tokens [from, to) are written (to <= t->n_tokens): every
 * page of theirs that another table holds too is replaced in T by a free
 * page, into which COPY(ARG, old, new) copies the old one first (copy on
 * write). Returns the pages copied, or -1 with err (the pool has no free
 * page, or COPY failed; pages replaced before the failure stay replaced,
 * the table consistent).
 */
int q4kh_kv_table_own(struct q4kh_kv_pool *p, struct q4kh_kv_table *t, int64_t from,
                      int64_t to, q4kh_kv_copy_fn *copy, void *arg,
                      struct q4kh_error *err);

/*
 * The pool slot of each of T's positions POS[0..n) (each in
 * [0, t->n_tokens)): pages[pos / page_size] * page_size + pos % page_size,
 * into SLOTS: set_rows' rows for a step that writes those positions.
 */
void q4kh_kv_table_slots(const struct q4kh_kv_pool *p, const struct q4kh_kv_table *t,
                         const int32_t *pos, int64_t n, int32_t *slots);

/* Give back every page T holds and free its array; T is then empty. */
void q4kh_kv_table_release(struct q4kh_kv_pool *p, struct q4kh_kv_table *t);

#endif
