/*
 * Prefix reuse across requests: which blocks of tokens the KV caches of a
 * set of holders (serve's slots, one session each) have computed, so that
 * a request whose prompt starts with tokens one of them holds takes their
 * keys and values (q4kh_session_take_prefix) instead of computing them
 * again (docs/serve.md, section 5).
 *
 * A cache's tokens are cut into blocks of Q4KH_PREFIX_BLOCK; a full block
 * is identified by a hash of its tokens chained with the hash of the
 * blocks before it (vLLM's prefix caching, Kwon et al. 2023), so that
 * one hash names a block and everything before it: the keys and values of
 * a token depend only on the tokens up to it. A match is confirmed on the
 * tokens themselves, so that a collision of hashes costs a comparison,
 * never a wrong answer. Only full blocks are found: a request reuses
 * whole blocks and computes the rest, from the first block that differs
 * on (copy on write: what it writes goes to its own cache).
 *
 * The caches are the holders' own, kept when their request ends: a holder
 * is found until a request overwrites it, and the holder a new request
 * takes, when none holds its prefix, is the least recently used one (its
 * blocks are the ones evicted). Not thread-safe: one owner (serve's
 * engine thread) calls it.
 */
#ifndef Q4KH_KV_PREFIX_H
#define Q4KH_KV_PREFIX_H

#include <stdint.h>

#include "error.h"

/* Tokens a block: vLLM's default. Smaller blocks find more of a prefix
 * and cost more hashes a request; at 16 a system prompt of a few hundred
 * tokens loses at most 15 tokens at its end. */
#define Q4KH_PREFIX_BLOCK 16

struct q4kh_prefix;

/*
 * N_HOLDERS holders of at most CAP tokens each (a session's n_ctx), all
 * empty; -1 with err when out of memory.
 */
int q4kh_prefix_new(int n_holders, int64_t cap, struct q4kh_prefix **out,
                    struct q4kh_error *err);
void q4kh_prefix_free(struct q4kh_prefix *p);

/*
 * The chained hashes of the full blocks of IDS[0..n): h[i] of block i
 * (tokens [16 i, 16 i + 16)) and every block before it, into H (n / 16
 * values). A 64-bit hash: equal prefixes give equal hashes, in any
 * process; different ones collide with a chance of about 2^-64.
 */
void q4kh_prefix_hashes(const int32_t *ids, int64_t n, uint64_t *h);

/*
 * The longest run of full blocks from the start of IDS[0..n) that a holder
 * has computed, at most LIMIT tokens: its length in tokens (a multiple of
 * Q4KH_PREFIX_BLOCK, 0 when no holder has the first block), and in
 * *HOLDER the holder (the least recently used among those with the
 * longest, -1 when none). Each holder's own match, in tokens, into MINE
 * (n_holders values) when not NULL. -1 when out of memory.
 */
int64_t q4kh_prefix_find(const struct q4kh_prefix *p, const int32_t *ids, int64_t n,
                         int64_t limit, int *holder, int64_t *mine);

/* Holder H's cache holds its first N tokens alone from now on (those past
 * them will be overwritten), and is used now (least recently used order). */
void q4kh_prefix_keep(struct q4kh_prefix *p, int h, int64_t n);

/* Holder H's cache computed IDS[0..n) after what it held (up to its CAP;
 * past it the tokens are not kept). */
void q4kh_prefix_append(struct q4kh_prefix *p, int h, const int32_t *ids, int64_t n);

/* Of the holders FREE flags (n_holders flags), the least recently used;
 * -1 when none is flagged. */
int q4kh_prefix_lru(const struct q4kh_prefix *p, const int *free);

#endif
