/*
 * A paged KV cache's bookkeeping (host/lib/kv_pool.c): pages handed to
 * block tables and given back, the slot of each position, a prefix shared
 * by reference and copied at the first write into a shared page (the
 * pages shared counted), and the pool's refusals. Every expected page, count and slot below is worked
 * out by hand from the pool's documented order (a fresh pool hands out
 * page 0 first; a page given back is the next handed out).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kv_pool.h"

/* The copies a table's writes asked for, in order. */
struct copies {
	int n;
	int32_t src[8], dst[8];
	int fail; /* fail the next copy */
};

static int record_copy(void *arg, int32_t src, int32_t dst, struct q4kh_error *err)
{
	struct copies *c = arg;

	if (c->fail)
		return q4kh_fail(err, "copy of page %d refused by the test", src);
	cr_assert_lt(c->n, 8);
	c->src[c->n] = src;
	c->dst[c->n++] = dst;
	return 0;
}

static void expect_pages(const struct q4kh_kv_table *t, const int32_t *want, int32_t n)
{
	cr_assert_eq(t->n, n, "a table of %d pages, expected %d", t->n, n);
	for (int32_t i = 0; i < n; i++)
		cr_expect_eq(t->pages[i], want[i], "page %d of the table is %d, expected %d", i,
		             t->pages[i], want[i]);
}

/* A sequence growing over many pages, its slots, and everything given back. */
Test(kv_pool, a_sequence_spans_pages_and_gives_them_back)
{
	struct q4kh_kv_pool p;
	struct q4kh_kv_table t = { 0 };
	struct q4kh_error err = { 0 };
	static const int32_t pos[6] = { 0, 15, 16, 17, 99, 100 };
	int32_t slots[6], want[7];

	cr_assert_eq(q4kh_kv_pool_init(&p, 10, 16, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_resize(&p, &t, 1, &err), 0, "%s", err.msg);
	expect_pages(&t, (const int32_t[]){ 0 }, 1);
	/* 101 tokens: 7 pages, the last holding 5 of 16 */
	cr_assert_eq(q4kh_kv_table_resize(&p, &t, 101, &err), 0, "%s", err.msg);
	for (int32_t i = 0; i < 7; i++)
		want[i] = i;
	expect_pages(&t, want, 7);
	cr_expect_eq(p.n_free, 3);
	q4kh_kv_table_slots(&p, &t, pos, 6, slots);
	for (int i = 0; i < 6; i++)
		cr_expect_eq(slots[i], pos[i], "slot of position %d: %d", pos[i], slots[i]);
	/* cut back to 40 tokens: pages 6 .. 3 return, 3 on top */
	cr_assert_eq(q4kh_kv_table_resize(&p, &t, 40, &err), 0, "%s", err.msg);
	expect_pages(&t, want, 3);
	cr_expect_eq(p.n_free, 7);
	for (int32_t i = 0; i < 10; i++)
		cr_expect_eq(p.refs[i], i < 3, "page %d held %d times", i, p.refs[i]);
	q4kh_kv_table_release(&p, &t);
	cr_expect_eq(p.n_free, 10);
	cr_expect_null(t.pages);
	cr_expect_eq(t.n_tokens, 0);
	q4kh_kv_pool_free(&p);
}

/* Pages out of order after another table's pages came back, and the
 * slots that follow from them. */
Test(kv_pool, slots_follow_the_table_not_the_position)
{
	struct q4kh_kv_pool p;
	struct q4kh_kv_table a = { 0 }, b = { 0 };
	struct q4kh_error err = { 0 };
	static const int32_t pos[5] = { 0, 3, 4, 7, 9 };
	int32_t slots[5];

	cr_assert_eq(q4kh_kv_pool_init(&p, 6, 4, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_resize(&p, &a, 8, &err), 0, "%s", err.msg); /* 0, 1 */
	cr_assert_eq(q4kh_kv_table_resize(&p, &b, 4, &err), 0, "%s", err.msg); /* 2 */
	q4kh_kv_table_release(&p, &a); /* free: 3 .. 5 below, then 1, 0 on top */
	cr_assert_eq(q4kh_kv_table_resize(&p, &b, 10, &err), 0, "%s", err.msg);
	expect_pages(&b, (const int32_t[]){ 2, 0, 1 }, 3);
	q4kh_kv_table_slots(&p, &b, pos, 5, slots);
	cr_expect_eq(slots[0], 8);
	cr_expect_eq(slots[1], 11);
	cr_expect_eq(slots[2], 0);
	cr_expect_eq(slots[3], 3);
	cr_expect_eq(slots[4], 5);
	q4kh_kv_table_release(&p, &b);
	q4kh_kv_pool_free(&p);
}

/*
 * A prefix of 20 tokens (one full page of 16 and 4 of the next) shared
 * from a table of 37: the two pages counted twice, nothing copied; the
 * sharer's first write (token 20, in the shared second page) copies that
 * page and nothing else, the owner's next write (token 37, in its own
 * third page) copies nothing, and a write into the first page, still
 * shared, copies it. Pages return when the last table holding them goes.
 */
Test(kv_pool, shared_prefix_pages_are_copied_at_the_first_write)
{
	struct q4kh_kv_pool p;
	struct q4kh_kv_table a = { 0 }, b = { 0 };
	struct q4kh_error err = { 0 };
	struct copies c = { 0 };

	cr_assert_eq(q4kh_kv_pool_init(&p, 8, 16, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_resize(&p, &a, 37, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_share(&p, &b, &a, 20, &err), 0, "%s", err.msg);
	expect_pages(&b, (const int32_t[]){ 0, 1 }, 2);
	cr_expect_eq(b.n_tokens, 20);
	cr_expect_eq(p.refs[0], 2);
	cr_expect_eq(p.refs[1], 2);
	cr_expect_eq(p.refs[2], 1);
	cr_expect_eq(p.n_free, 5);
	cr_expect_eq(q4kh_kv_pool_shared(&p), 2); /* pages 0 and 1 */

	/* b's next token, 20: page 1 is shared, so b gets page 3, a copy */
	cr_assert_eq(q4kh_kv_table_resize(&p, &b, 21, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_own(&p, &b, 20, 21, record_copy, &c, &err), 1, "%s", err.msg);
	cr_expect_eq(c.src[0], 1);
	cr_expect_eq(c.dst[0], 3);
	expect_pages(&b, (const int32_t[]){ 0, 3 }, 2);
	expect_pages(&a, (const int32_t[]){ 0, 1, 2 }, 3);
	cr_expect_eq(p.refs[1], 1);
	cr_expect_eq(p.refs[3], 1);
	cr_expect_eq(q4kh_kv_pool_shared(&p), 1); /* page 0 */

	/* a's next token, 37: its page 2 is its own */
	cr_assert_eq(q4kh_kv_table_resize(&p, &a, 38, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_own(&p, &a, 37, 38, record_copy, &c, &err), 0, "%s", err.msg);
	cr_expect_eq(c.n, 1);

	/* b rewrites its tokens 10 .. 20 (cut back and decoded again): page 0 is
	 * still a's too, page 3 is b's */
	cr_assert_eq(q4kh_kv_table_own(&p, &b, 10, 21, record_copy, &c, &err), 1, "%s", err.msg);
	cr_expect_eq(c.src[1], 0);
	cr_expect_eq(c.dst[1], 4);
	expect_pages(&b, (const int32_t[]){ 4, 3 }, 2);
	cr_expect_eq(p.refs[0], 1);
	cr_expect_eq(q4kh_kv_pool_shared(&p), 0);

	/* a leaves: its pages 0, 1, 2 come back; b's 4 and 3 stay */
	q4kh_kv_table_release(&p, &a);
	cr_expect_eq(p.n_free, 6);
	cr_expect_eq(p.refs[3], 1);
	cr_expect_eq(p.refs[4], 1);
	q4kh_kv_table_release(&p, &b);
	cr_expect_eq(p.n_free, 8);
	for (int32_t i = 0; i < 8; i++)
		cr_expect_eq(p.refs[i], 0, "page %d still held %d times", i, p.refs[i]);
	q4kh_kv_pool_free(&p);
}

/* A prefix shared whole (a page boundary) and a table shared twice: the
 * counts, then a copy that fails, leaving the table as it was. */
Test(kv_pool, a_failed_copy_leaves_the_table_as_it_was)
{
	struct q4kh_kv_pool p;
	struct q4kh_kv_table a = { 0 }, b = { 0 }, d = { 0 };
	struct q4kh_error err = { 0 };
	struct copies c = { .fail = 1 };

	cr_assert_eq(q4kh_kv_pool_init(&p, 4, 8, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_resize(&p, &a, 16, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_share(&p, &b, &a, 16, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_kv_table_share(&p, &d, &b, 8, &err), 0, "%s", err.msg);
	cr_expect_eq(p.refs[0], 3);
	cr_expect_eq(p.refs[1], 2);
	cr_assert_eq(q4kh_kv_table_own(&p, &d, 0, 8, record_copy, &c, &err), -1);
	cr_expect_str_eq(err.msg, "copy of page 0 refused by the test");
	expect_pages(&d, (const int32_t[]){ 0 }, 1);
	cr_expect_eq(p.refs[0], 3);
	cr_expect_eq(p.n_free, 2);
	q4kh_kv_table_release(&p, &a);
	q4kh_kv_table_release(&p, &b);
	q4kh_kv_table_release(&p, &d);
	cr_expect_eq(p.n_free, 4);
	q4kh_kv_pool_free(&p);
}

/* What the pool refuses, each with what it expected. */
Test(kv_pool, refusals_say_what_was_expected)
{
	struct q4kh_kv_pool p;
	struct q4kh_kv_table a = { 0 }, b = { 0 };
	struct q4kh_error err = { 0 };
	struct copies c = { 0 };

	cr_expect_eq(q4kh_kv_pool_init(&p, 0, 16, &err), -1);
	cr_expect_str_eq(err.msg, "KV pool of 0 pages of 16 tokens, expected at least one page of at least one token");
	cr_assert_eq(q4kh_kv_pool_init(&p, 3, 4, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_kv_table_resize(&p, &a, 13, &err), -1);
	cr_expect_str_eq(err.msg, "KV block table of 13 tokens, expected 0 .. 12 (the pool's 3 pages of 4)");
	cr_assert_eq(q4kh_kv_table_resize(&p, &a, 9, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_kv_table_resize(&p, &b, 5, &err), -1);
	cr_expect_str_eq(err.msg, "KV pool full: 0 of its 3 pages free, 2 needed");
	cr_expect_eq(b.n, 0);
	cr_expect_eq(q4kh_kv_table_share(&p, &b, &a, 10, &err), -1);
	cr_expect_str_eq(err.msg, "KV block table: a prefix of 10 tokens shared from a table of 9");
	cr_expect_eq(q4kh_kv_table_share(&p, &a, &a, 4, &err), -1);
	cr_expect_str_eq(err.msg, "KV block table: a prefix of 4 tokens shared from a table of 9, into itself");
	cr_expect_eq(a.n_tokens, 9);
	cr_assert_eq(q4kh_kv_table_share(&p, &b, &a, 6, &err), 0, "%s", err.msg);
	cr_expect_eq(q4kh_kv_table_own(&p, &b, 4, 7, record_copy, &c, &err), -1);
	cr_expect_str_eq(err.msg, "KV block table: tokens [4, 7) written in a table of 6");
	cr_expect_eq(q4kh_kv_table_own(&p, &b, 4, 6, record_copy, &c, &err), -1);
	cr_expect_str_eq(err.msg, "KV pool: no free page to copy shared page 1 into (3 pages)");
	q4kh_kv_table_release(&p, &a);
	q4kh_kv_table_release(&p, &b);
	q4kh_kv_pool_free(&p);
}
