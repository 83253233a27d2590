/*
 * A paged KV cache's pages, block tables and slot mapping: kv_pool.h.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_pool.h"

int q4kh_kv_pool_init(struct q4kh_kv_pool *p, int32_t n_pages, int32_t page_size,
                      struct q4kh_error *err)
{
	memset(p, 0, sizeof(*p));
	if (n_pages < 1 || page_size < 1)
		return q4kh_fail(err, "KV pool of %d pages of %d tokens, expected at least one page of at least one token",
		                 n_pages, page_size);
	p->refs = calloc((size_t)n_pages, sizeof(*p->refs));
	p->free = malloc(sizeof(*p->free) * (size_t)n_pages);
	if (!p->refs || !p->free) {
		q4kh_kv_pool_free(p);
		return q4kh_fail(err, "KV pool of %d pages: out of memory", n_pages);
	}
	p->page_size = page_size;
	p->n_pages = n_pages;
	/* page 0 on top: a fresh pool hands out pages in order */
	for (int32_t i = 0; i < n_pages; i++)
		p->free[i] = n_pages - 1 - i;
	p->n_free = n_pages;
	return 0;
}

void q4kh_kv_pool_free(struct q4kh_kv_pool *p)
{
	free(p->refs);
	free(p->free);
	memset(p, 0, sizeof(*p));
}

int32_t q4kh_kv_pool_pages_for(const struct q4kh_kv_pool *p, int64_t n)
{
	return (int32_t)((n + p->page_size - 1) / p->page_size);
}

int32_t q4kh_kv_pool_shared(const struct q4kh_kv_pool *p)
{
	int32_t n = 0;

	for (int32_t i = 0; i < p->n_pages; i++)
		n += p->refs[i] > 1;
	return n;
}

/* One table fewer holds PAGE; back to the pool when none does. */
static void unref(struct q4kh_kv_pool *p, int32_t page)
{
	if (--p->refs[page] == 0)
		p->free[p->n_free++] = page;
}

/* A free page, held once. The caller has checked that one is free. */
static int32_t take(struct q4kh_kv_pool *p)
{
	const int32_t page = p->free[--p->n_free];

	p->refs[page] = 1;
	return page;
}

/* Room for N pages in T's array. */
static int reserve(struct q4kh_kv_table *t, int32_t n, struct q4kh_error *err)
{
	int32_t *grown;

	if (n <= t->cap)
		return 0;
	grown = realloc(t->pages, sizeof(*t->pages) * (size_t)n);
	if (!grown)
		return q4kh_fail(err, "KV block table of %d pages: out of memory", n);
	t->pages = grown;
	t->cap = n;
	return 0;
}

int q4kh_kv_table_resize(struct q4kh_kv_pool *p, struct q4kh_kv_table *t, int64_t n,
                         struct q4kh_error *err)
{
	const int32_t want = n < 0 ? -1 : q4kh_kv_pool_pages_for(p, n);

	if (n < 0 || n > (int64_t)p->n_pages * p->page_size)
		return q4kh_fail(err, "KV block table of %lld tokens, expected 0 .. %lld (the pool's %d pages of %d)",
		                 (long long)n, (long long)p->n_pages * p->page_size, p->n_pages,
		                 p->page_size);
	if (want - t->n > p->n_free)
		return q4kh_fail(err, "KV pool full: %d of its %d pages free, %d needed", p->n_free,
		                 p->n_pages, want - t->n);
	if (reserve(t, want, err))
		return -1;
	while (t->n < want)
		t->pages[t->n++] = take(p);
	while (t->n > want)
		unref(p, t->pages[--t->n]);
	t->n_tokens = n;
	return 0;
}

int q4kh_kv_table_share(struct q4kh_kv_pool *p, struct q4kh_kv_table *dst,
                        const struct q4kh_kv_table *src, int64_t n,
                        struct q4kh_error *err)
{
	const int32_t want = q4kh_kv_pool_pages_for(p, n);

	if (dst == src || n < 0 || n > src->n_tokens)
		return q4kh_fail(err, "KV block table: a prefix of %lld tokens shared from a table of %lld%s",
		                 (long long)n, (long long)src->n_tokens,
		                 dst == src ? ", into itself" : "");
	q4kh_kv_table_resize(p, dst, 0, err); /* giving back never fails */
	if (reserve(dst, want, err))
		return -1;
	for (int32_t i = 0; i < want; i++)
		p->refs[dst->pages[i] = src->pages[i]]++;
	dst->n = want;
	dst->n_tokens = n;
	return 0;
}

int q4kh_kv_table_own(struct q4kh_kv_pool *p, struct q4kh_kv_table *t, int64_t from,
                      int64_t to, q4kh_kv_copy_fn *copy, void *arg,
                      struct q4kh_error *err)
{
	int copied = 0;

	if (from < 0 || from > to || to > t->n_tokens)
		return q4kh_fail(err, "KV block table: tokens [%lld, %lld) written in a table of %lld",
		                 (long long)from, (long long)to, (long long)t->n_tokens);
	if (from == to)
		return 0;
	for (int32_t i = (int32_t)(from / p->page_size); i <= (to - 1) / p->page_size; i++) {
		const int32_t old = t->pages[i];
		int32_t mine;

		if (p->refs[old] == 1)
			continue;
		if (!p->n_free)
			return q4kh_fail(err, "KV pool: no free page to copy shared page %d into (%d pages)",
			                 old, p->n_pages);
		mine = take(p);
		if (copy(arg, old, mine, err)) {
			unref(p, mine);
			return -1;
		}
		t->pages[i] = mine;
		unref(p, old);
		copied++;
	}
	return copied;
}

void q4kh_kv_table_slots(const struct q4kh_kv_pool *p, const struct q4kh_kv_table *t,
                         const int32_t *pos, int64_t n, int32_t *slots)
{
	for (int64_t i = 0; i < n; i++)
		slots[i] = t->pages[pos[i] / p->page_size] * p->page_size + pos[i] % p->page_size;
}

void q4kh_kv_table_release(struct q4kh_kv_pool *p, struct q4kh_kv_table *t)
{
	while (t->n > 0)
		unref(p, t->pages[--t->n]);
	free(t->pages);
	memset(t, 0, sizeof(*t));
}
