#include "kv_prefix.h"

#include <stdlib.h>
#include <string.h>

/* What one holder's cache has computed. */
struct holder {
	int32_t *ids;  /* its tokens, cap of them */
	uint64_t *h;   /* the chained hash of each full block of ids */
	int64_t n;     /* tokens whose keys and values it holds */
	uint64_t used; /* p->tick when last kept: least recently used first */
};

struct q4kh_prefix {
	struct holder *hold;
	int n_holders;
	int64_t cap;
	uint64_t tick;
};

int q4kh_prefix_new(int n_holders, int64_t cap, struct q4kh_prefix **out,
                    struct q4kh_error *err)
{
	struct q4kh_prefix *p = calloc(1, sizeof(*p));

	*out = NULL;
	if (!p || !(p->hold = calloc((size_t)n_holders, sizeof(*p->hold)))) {
		free(p);
		return q4kh_fail(err, "out of memory for the prefix cache");
	}
	p->n_holders = n_holders;
	p->cap = cap;
	for (int i = 0; i < n_holders; i++) {
		p->hold[i].ids = malloc(sizeof(int32_t) * (size_t)cap);
		p->hold[i].h = malloc(sizeof(uint64_t) * (size_t)(cap / Q4KH_PREFIX_BLOCK + 1));
		if (!p->hold[i].ids || !p->hold[i].h) {
			q4kh_prefix_free(p);
			return q4kh_fail(err, "out of memory for the prefix cache");
		}
	}
	*out = p;
	return 0;
}

void q4kh_prefix_free(struct q4kh_prefix *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->n_holders; i++) {
		free(p->hold[i].ids);
		free(p->hold[i].h);
	}
	free(p->hold);
	free(p);
}

/* SplitMix64's finaliser (Steele, Lea and Flood 2014): every bit of X
 * reaches every bit of the result. */
static uint64_t mix(uint64_t x)
{
	x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
	return x ^ (x >> 31);
}

/* The hash of the block at IDS after blocks whose hash is PARENT. */
static uint64_t block_hash(uint64_t parent, const int32_t *ids)
{
	uint64_t h = mix(parent ^ UINT64_C(0x9e3779b97f4a7c15));

	for (int i = 0; i < Q4KH_PREFIX_BLOCK; i++)
		h = mix(h ^ (uint32_t)ids[i]);
	return h;
}

void q4kh_prefix_hashes(const int32_t *ids, int64_t n, uint64_t *h)
{
	uint64_t parent = 0;

	for (int64_t b = 0; b < n / Q4KH_PREFIX_BLOCK; b++)
		parent = h[b] = block_hash(parent, ids + b * Q4KH_PREFIX_BLOCK);
}

int64_t q4kh_prefix_find(const struct q4kh_prefix *p, const int32_t *ids, int64_t n,
                         int64_t limit, int *holder, int64_t *mine)
{
	const int64_t blocks = (n < limit ? n : limit) / Q4KH_PREFIX_BLOCK;
	uint64_t *h = malloc(sizeof(*h) * (size_t)(blocks + 1));
	int64_t best = 0;

	*holder = -1;
	if (!h)
		return -1;
	q4kh_prefix_hashes(ids, blocks * Q4KH_PREFIX_BLOCK, h);
	for (int i = 0; i < p->n_holders; i++) {
		const struct holder *o = &p->hold[i];
		int64_t b = 0, len;

		while (b < blocks && b < o->n / Q4KH_PREFIX_BLOCK && o->h[b] == h[b])
			b++;
		/* the hashes say where; the tokens confirm it */
		len = b * Q4KH_PREFIX_BLOCK;
		while (len > 0 && memcmp(o->ids, ids, sizeof(*ids) * (size_t)len))
			len -= Q4KH_PREFIX_BLOCK;
		if (mine)
			mine[i] = len;
		if (len > best || (len == best && len > 0 && o->used < p->hold[*holder].used)) {
			best = len;
			*holder = i;
		}
	}
	free(h);
	return best;
}

void q4kh_prefix_keep(struct q4kh_prefix *p, int h, int64_t n)
{
	struct holder *o = &p->hold[h];

	o->n = n < o->n ? n : o->n;
	o->used = ++p->tick;
}

void q4kh_prefix_append(struct q4kh_prefix *p, int h, const int32_t *ids, int64_t n)
{
	struct holder *o = &p->hold[h];
	const int64_t keep = n < p->cap - o->n ? n : p->cap - o->n;

	memcpy(o->ids + o->n, ids, sizeof(*ids) * (size_t)keep);
	for (int64_t b = o->n / Q4KH_PREFIX_BLOCK; b < (o->n + keep) / Q4KH_PREFIX_BLOCK; b++)
		o->h[b] = block_hash(b ? o->h[b - 1] : 0, o->ids + b * Q4KH_PREFIX_BLOCK);
	o->n += keep;
}

int q4kh_prefix_lru(const struct q4kh_prefix *p, const int *free)
{
	int best = -1;

	for (int i = 0; i < p->n_holders; i++)
		if (free[i] && (best < 0 || p->hold[i].used < p->hold[best].used))
			best = i;
	return best;
}
