/*
 * Inside the tokenizer: what tokenizer.c (vocabulary, special tokens,
 * pieces, dispatch), tokenizer_spm.c (SentencePiece merges) and
 * tokenizer_bpe.c (byte-level BPE) share. Not part of libq4khost's
 * interface: the q4kh_tok_ names are for these three files only.
 */
#ifndef Q4KH_TOKENIZER_IMPL_H
#define Q4KH_TOKENIZER_IMPL_H

#include "tokenizer.h"

/* tokenizer.ggml.token_type values; anything else reads as UNDEFINED. */
enum tok_type {
	TT_UNDEFINED = 0,
	TT_NORMAL = 1,
	TT_UNKNOWN = 2,
	TT_CONTROL = 3,
	TT_USER = 4,
	TT_UNUSED = 5,
	TT_BYTE = 6,
};

/* tokenizer.ggml.model */
enum tok_model {
	TM_SPM, /* "llama" */
	TM_BPE, /* "gpt2" */
};

#define MAX_EOG 32
#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPACE_MARK_LEN 3

/* A string in an arena: a token's text, or a BPE merge "left right". */
struct tok {
	uint32_t off; /* NUL-terminated */
	uint32_t len;
	float score;
	uint8_t type;
};

/* Open addressing over entry indices, keyed by the entries' texts. */
struct text_map {
	int32_t *slot; /* -1: empty */
	uint32_t mask;
};

/* The special tokens of one text length, indexed by their first byte, so a
 * position is tested with one table read instead of a scan of thousands. */
struct special_len {
	uint32_t len;
	uint8_t first[256];
};

struct bpe; /* tokenizer_bpe.c */

struct q4kh_tokenizer {
	enum tok_model model;
	int32_t n_vocab;
	struct tok *tok;
	char *arena;
	struct text_map all;       /* every token; duplicates: the last id */
	struct text_map special;   /* control, user-defined, unknown */
	struct special_len *sp_len; /* longest first */
	size_t n_sp_len;
	int32_t byte_tok[256]; /* -1: no token for that byte */
	int32_t eog[MAX_EOG];
	size_t n_eog;
	int32_t bos, eos;
	int add_bos, add_eos, add_space_prefix;
	struct bpe *bpe; /* TM_BPE only */
};

/* A piece of the fragment being merged. */
struct sym {
	int32_t prev, next;
	uint32_t off, n; /* n == 0: merged into its left neighbour */
};

/* A candidate merge of two adjacent pieces (higher score merges first). */
struct bigram {
	float score;
	int32_t left, right;
	uint32_t size;
};

/* Scratch of one q4kh_tokenize call. */
struct enc {
	const struct q4kh_tokenizer *t;
	int32_t *ids;
	size_t n_ids, cap_ids;
	char *buf; /* the fragment being merged */
	size_t cap_buf;
	struct sym *sym;
	size_t cap_sym;
	struct bigram *heap;
	size_t n_heap, cap_heap;
	void *bpe; /* per-call state of tokenizer_bpe.c */
};

/*
 * The score of merging pieces LEFT and RIGHT (adjacent, texts at
 * e->buf + off), or 0 with nothing stored when they do not merge.
 */
typedef int (*q4kh_tok_pair_fn)(struct enc *e, const struct sym *left,
                                const struct sym *right, float *score);

/* --- tokenizer.c --- */

/* Entry index of text S (N bytes) in M over ENT/ARENA, or -1. */
int32_t q4kh_tok_map_find(const struct text_map *m, const struct tok *ent,
                          const char *arena, const char *s, size_t n);
/* Build M over entries [0, n) of ENT; a later duplicate replaces an earlier
 * one when replace. -1 on out of memory. */
int q4kh_tok_map_build(struct text_map *m, const struct tok *ent,
                       const char *arena, int32_t n, int replace);
/* Token id of text S (N bytes), or -1. */
int32_t q4kh_tok_find(const struct q4kh_tokenizer *t, const char *s, size_t n);
/* P with room for NEED elements (doubling), or NULL with P still valid. */
void *q4kh_tok_grow(void *p, size_t *cap, size_t need, size_t elem);
/* Append ID to e->ids; -1 on out of memory. */
int q4kh_tok_push(struct enc *e, int32_t id);
/*
 * Merge the N bytes at e->buf: split them into UTF-8 characters, then merge
 * the adjacent pair with the highest score (ties: the leftmost) until none
 * merges. The pieces are then the chain from e->sym[0] (n > 0). -1 on out
 * of memory.
 */
int q4kh_tok_merge(struct enc *e, size_t n, q4kh_tok_pair_fn pair);

/* --- tokenizer_spm.c --- */

/* Encode one raw fragment SentencePiece-style, with a leading U+2581 when
 * prefix. -1 with err. */
int q4kh_tok_spm_encode(struct enc *e, const char *s, size_t len, int prefix,
                        struct q4kh_error *err);

/* --- tokenizer_bpe.c --- */

/* Read merges and the pre-tokenizer of a "gpt2" vocabulary into t->bpe. */
int q4kh_tok_bpe_load(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                      struct q4kh_error *err);
void q4kh_tok_bpe_free(struct bpe *b);
/* Encode one raw fragment: pre-tokenize, byte-encode, merge by rank. */
int q4kh_tok_bpe_encode(struct enc *e, const char *s, size_t len,
                        struct q4kh_error *err);
/* Release e->bpe. */
void q4kh_tok_bpe_done(struct enc *e);
/* The bytes a byte-level token text S stands for (GPT-2's byte-to-unicode
 * map reversed); writes at most cap, returns the full length. */
size_t q4kh_tok_bpe_decode(const struct q4kh_tokenizer *t, const char *s,
                           size_t n, char *buf, size_t cap);

#endif
