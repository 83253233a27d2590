/*
 * The pair-merge engine SentencePiece and byte-level BPE share, as
 * llama.cpp's llm_tokenizer_spm_session and llm_tokenizer_bpe_session run
 * it: the fragment starts as one piece per UTF-8 character; the adjacent
 * pair with the best score (SentencePiece: the merged token's score; BPE:
 * minus the merge's rank) merges first, ties going to the leftmost pair;
 * pairs queued before a neighbour changed are skipped when popped.
 */
#include "tokenizer_impl.h"

/* Heap order: higher score first, then the leftmost pair. */
static int bigram_before(const struct bigram *a, const struct bigram *b)
{
	return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct enc *e, struct bigram b)
{
	size_t i = e->n_heap++;

	while (i > 0 && bigram_before(&b, &e->heap[(i - 1) / 2])) {
		e->heap[i] = e->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	e->heap[i] = b;
}

static struct bigram heap_pop(struct enc *e)
{
	struct bigram top = e->heap[0], last = e->heap[--e->n_heap];
	size_t i = 0, n = e->n_heap;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && bigram_before(&e->heap[c + 1], &e->heap[c]))
			c++;
		if (!bigram_before(&e->heap[c], &last))
			break;
		e->heap[i] = e->heap[c];
		i = c;
	}
	if (n)
		e->heap[i] = last;
	return top;
}

/* Queue the merge of LEFT and RIGHT when PAIR says they merge. */
static void try_bigram(struct enc *e, q4kh_tok_pair_fn pair, int32_t left,
                       int32_t right)
{
	float score;

	if (left < 0 || right < 0 ||
	    !pair(e, &e->sym[left], &e->sym[right], &score))
		return;
	heap_push(e, (struct bigram){ score, left, right,
	                              e->sym[left].n + e->sym[right].n });
}

/* Split the fragment into UTF-8 characters, by the lead byte's
 * length as llama.cpp's unicode_len_utf8 reads it (so an invalid sequence
 * is one piece, later byte tokens), clipped at the end. */
static size_t split_chars(struct enc *e, size_t len)
{
	static const uint8_t lead_len[16] = { 1, 1, 1, 1, 1, 1, 1, 1,
		                              1, 1, 1, 1, 2, 2, 3, 4 };
	size_t n = 0;

	for (size_t off = 0; off < len; n++) {
		size_t c = lead_len[(uint8_t)e->buf[off] >> 4];
		if (c > len - off)
			c = len - off;
		e->sym[n] = (struct sym){ (int32_t)n - 1, -1, (uint32_t)off,
		                          (uint32_t)c };
		if (n)
			e->sym[n - 1].next = (int32_t)n;
		off += c;
	}
	return n;
}

/* Room to merge N bytes: their characters, and the heap, which 3 * N
 * bounds (every merge queues at most two pairs). */
static int reserve_merge(struct enc *e, size_t n)
{
	struct sym *sym = q4kh_tok_grow(e->sym, &e->cap_sym, n, sizeof(*sym));
	struct bigram *heap;

	if (!sym)
		return -1;
	e->sym = sym;
	heap = q4kh_tok_grow(e->heap, &e->cap_heap, 3 * n, sizeof(*heap));
	if (!heap)
		return -1;
	e->heap = heap;
	return 0;
}

int q4kh_tok_merge(struct enc *e, size_t n, q4kh_tok_pair_fn pair)
{
	size_t n_sym;

	if (reserve_merge(e, n) < 0)
		return -1;
	e->n_heap = 0;
	n_sym = split_chars(e, n);
	for (size_t i = 1; i < n_sym; i++)
		try_bigram(e, pair, (int32_t)i - 1, (int32_t)i);
	while (e->n_heap) {
		struct bigram b = heap_pop(e);
		struct sym *l = &e->sym[b.left], *r = &e->sym[b.right];
		/* stale: one side merged elsewhere since it was queued */
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			e->sym[r->next].prev = b.left;
		try_bigram(e, pair, l->prev, b.left);
		try_bigram(e, pair, b.left, l->next);
	}
	return 0;
}
