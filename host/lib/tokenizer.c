/*
 * A tokenizer over a GGUF vocabulary: loading the vocabulary, special
 * tokens and end-of-generation ids, splitting special tokens out of the
 * text, handing the rest to the model's fragment encoder
 * (tokenizer_spm.c, tokenizer_bpe.c), and decoding ids to pieces. It
 * computes what llama.cpp computes (src/llama-vocab.cpp: the special-token
 * partition, token_to_piece), so that ids match llama.cpp's for the same
 * file and text; the tests hold it to fixtures written by llama.cpp itself.
 */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keeps every index of the escaped text (3 bytes per space) in int32. */
#define MAX_TEXT ((size_t)INT32_MAX / 4)

/* Bits of special_len.first: which kinds of special token start with a byte. */
#define SP_USER 1   /* user-defined: always split out */
#define SP_PARSED 2 /* control or unknown: only with parse_special */

static const char *tok_text(const struct q4kh_tokenizer *t, int32_t id)
{
	return t->arena + t->tok[id].off;
}

/* --- text -> index hash map ---------------------------------------------- */

static uint32_t hash_text(const char *s, size_t n)
{
	uint64_t h = 14695981039346656037ull; /* FNV-1a, 64-bit */

	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)s[i];
		h *= 1099511628211ull;
	}
	return (uint32_t)(h ^ (h >> 32));
}

static int map_init(struct text_map *m, size_t n)
{
	size_t cap = 16;

	while (cap < 2 * n)
		cap *= 2;
	m->slot = malloc(cap * sizeof(*m->slot));
	if (!m->slot)
		return -1;
	memset(m->slot, 0xff, cap * sizeof(*m->slot));
	m->mask = (uint32_t)(cap - 1);
	return 0;
}

/* The slot holding S, or the empty slot where it would go. */
static uint32_t map_slot(const struct text_map *m, const struct tok *ent,
                         const char *arena, const char *s, size_t n)
{
	uint32_t i = hash_text(s, n) & m->mask;

	for (; m->slot[i] >= 0; i = (i + 1) & m->mask) {
		const struct tok *e = &ent[m->slot[i]];
		if (e->len == n && memcmp(arena + e->off, s, n) == 0)
			break;
	}
	return i;
}

int32_t q4kh_tok_map_find(const struct text_map *m, const struct tok *ent,
                          const char *arena, const char *s, size_t n)
{
	return m->slot[map_slot(m, ent, arena, s, n)];
}

static void map_put(struct text_map *m, const struct tok *ent,
                    const char *arena, int32_t id, int replace)
{
	uint32_t i = map_slot(m, ent, arena, arena + ent[id].off, ent[id].len);

	if (m->slot[i] < 0 || replace)
		m->slot[i] = id;
}

int q4kh_tok_map_build(struct text_map *m, const struct tok *ent,
                       const char *arena, int32_t n, int replace)
{
	if (map_init(m, (size_t)n) < 0)
		return -1;
	for (int32_t i = 0; i < n; i++)
		map_put(m, ent, arena, i, replace);
	return 0;
}

int32_t q4kh_tok_find(const struct q4kh_tokenizer *t, const char *s, size_t n)
{
	return q4kh_tok_map_find(&t->all, t->tok, t->arena, s, n);
}

/* --- loading ------------------------------------------------------------- */

static int check_model(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                       struct q4kh_error *err)
{
	struct q4kh_gguf_str s;
	char shown[272];
	int rc = q4kh_gguf_get_str(g, "tokenizer.ggml.model", &s, err);

	if (rc < 0)
		return -1;
	if (rc > 0)
		return q4kh_fail(err, "%s: no tokenizer.ggml.model key", g->path);
	if (s.len == 5 && memcmp(s.data, "llama", 5) == 0)
		t->model = TM_SPM;
	else if (s.len == 4 && memcmp(s.data, "gpt2", 4) == 0)
		t->model = TM_BPE;
	else
		return q4kh_fail(err,
		                 "%s: tokenizer.ggml.model is \"%s\": not supported "
		                 "(supported: \"llama\" SentencePiece, \"gpt2\" byte-level BPE)",
		                 g->path, q4kh_show(shown, sizeof(shown), s.data, s.len, 64, 0));
	return 0;
}

/* The array KEY with one element per token, or NULL (err set when it exists
 * but does not fit). */
static const struct q4kh_gguf_kv *per_token(const struct q4kh_gguf *g,
                                            const char *key, uint64_t n,
                                            int *bad, struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, key);

	*bad = 0;
	if (kv && (kv->type != Q4KH_GGUF_ARRAY || kv->count != n)) {
		*bad = 1;
		q4kh_fail(err, "%s: offset %llu: %s: expected an array of %llu "
		          "(one per token), found %s of %llu",
		          g->path, (unsigned long long)kv->offset, key,
		          (unsigned long long)n, q4kh_gguf_vtype_name(kv->type),
		          (unsigned long long)kv->count);
		return NULL;
	}
	return kv;
}

/* Copy the token texts into one arena; llama.cpp renames an empty text to
 * "[EMPTY_<id>]", and so do we, because a special token of length 0 would
 * match everywhere. */
static int load_texts(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                      const struct q4kh_gguf_kv *kv, struct q4kh_error *err)
{
	struct q4kh_gguf_str *s = malloc(kv->count * sizeof(*s));
	uint64_t total = 0;
	char *p;

	if (!s)
		return q4kh_fail(err, "%s: out of memory for %llu token texts",
		                 g->path, (unsigned long long)kv->count);
	if (q4kh_gguf_array_strings(g, kv, s, err) < 0) {
		free(s);
		return -1;
	}
	for (int32_t i = 0; i < t->n_vocab; i++)
		total += (s[i].len ? s[i].len : 24) + 1;
	if (total > UINT32_MAX || !(t->arena = malloc(total))) {
		free(s);
		return q4kh_fail(err, "%s: token texts take %llu bytes: too "
		                 "large or out of memory",
		                 g->path, (unsigned long long)total);
	}
	p = t->arena;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		t->tok[i].off = (uint32_t)(p - t->arena);
		if (s[i].len)
			memcpy(p, s[i].data, s[i].len);
		t->tok[i].len = s[i].len ? (uint32_t)s[i].len
		                         : (uint32_t)sprintf(p, "[EMPTY_%d]", i);
		p += t->tok[i].len;
		*p++ = '\0';
	}
	free(s);
	return 0;
}

/* Scores (default 0) and types (default NORMAL), as llama.cpp reads them. */
static int load_scores_types(const struct q4kh_gguf *g,
                             struct q4kh_tokenizer *t,
                             struct q4kh_error *err)
{
	uint64_t n = (uint64_t)t->n_vocab;
	int bad;
	const struct q4kh_gguf_kv *sc =
		per_token(g, "tokenizer.ggml.scores", n, &bad, err);
	const struct q4kh_gguf_kv *ty;
	float *f = NULL;
	int32_t *v = NULL;
	int rc = -1;

	if (bad)
		return -1;
	ty = per_token(g, "tokenizer.ggml.token_type", n, &bad, err);
	if (bad)
		return -1;
	f = sc ? malloc(n * sizeof(*f)) : NULL;
	v = ty ? malloc(n * sizeof(*v)) : NULL;
	if ((sc && !f) || (ty && !v)) {
		q4kh_fail(err, "%s: out of memory for token scores", g->path);
		goto out;
	}
	if ((sc && q4kh_gguf_array_f32(g, sc, f, err) < 0) ||
	    (ty && q4kh_gguf_array_i32(g, ty, v, err) < 0))
		goto out;
	for (uint64_t i = 0; i < n; i++) {
		int32_t type = v ? v[i] : TT_NORMAL;
		t->tok[i].score = f ? f[i] : 0.0f;
		t->tok[i].type = type >= TT_NORMAL && type <= TT_BYTE
		                         ? (uint8_t)type : TT_UNDEFINED;
	}
	rc = 0;
out:
	free(f);
	free(v);
	return rc;
}

static int load_tokens(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                       struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, "tokenizer.ggml.tokens");

	if (!kv)
		return q4kh_fail(err, "%s: no tokenizer.ggml.tokens key", g->path);
	if (kv->type != Q4KH_GGUF_ARRAY || kv->elem_type != Q4KH_GGUF_STRING ||
	    kv->count == 0 || kv->count > INT32_MAX)
		return q4kh_fail(err, "%s: offset %llu: tokenizer.ggml.tokens: "
		                 "expected a non-empty array of strings, found %s "
		                 "of %llu %s",
		                 g->path, (unsigned long long)kv->offset,
		                 q4kh_gguf_vtype_name(kv->type),
		                 (unsigned long long)kv->count,
		                 q4kh_gguf_vtype_name(kv->elem_type));
	t->n_vocab = (int32_t)kv->count;
	t->tok = calloc(kv->count, sizeof(*t->tok));
	if (!t->tok)
		return q4kh_fail(err, "%s: out of memory for %llu tokens", g->path,
		                 (unsigned long long)kv->count);
	if (load_texts(g, t, kv, err) < 0)
		return -1;
	return load_scores_types(g, t, err);
}

/* Token id KEY into *id (left as is when absent): -1 when out of range. */
static int load_id(const struct q4kh_gguf *g, const struct q4kh_tokenizer *t,
                   const char *key, int32_t *id, struct q4kh_error *err)
{
	uint32_t v;
	int rc = q4kh_gguf_get_u32(g, key, &v, err);

	if (rc < 0)
		return -1;
	if (rc > 0)
		return 0;
	if (v >= (uint32_t)t->n_vocab)
		return q4kh_fail(err, "%s: %s is %u, expected an id below the "
		                 "vocabulary size %d",
		                 g->path, key, v, t->n_vocab);
	*id = (int32_t)v;
	return 0;
}

static int load_flag(const struct q4kh_gguf *g, const char *key, int *flag,
                     struct q4kh_error *err)
{
	return q4kh_gguf_get_bool(g, key, flag, err) < 0 ? -1 : 0;
}

/* Defaults are llama.cpp's: for SentencePiece bos 1, eos 2, BOS added,
 * space prefix on; for BPE bos = eos = 11 and nothing added (the
 * pre-tokenizer may add BOS). The file's keys override them. */
static int load_settings(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                         struct q4kh_error *err)
{
	int spm = t->model == TM_SPM;
	int32_t bos = spm ? 1 : 11, eos = spm ? 2 : 11;

	t->bos = bos < t->n_vocab ? bos : 0;
	t->eos = eos < t->n_vocab ? eos : 0;
	t->add_bos = spm || t->add_bos;
	t->add_eos = 0;
	t->add_space_prefix = spm;
	if (load_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos, err) < 0 ||
	    load_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos, err) < 0 ||
	    load_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err) < 0 ||
	    load_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err) < 0 ||
	    load_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix,
	              err) < 0)
		return -1;
	return 0;
}

static void eog_add(struct q4kh_tokenizer *t, int32_t id)
{
	for (size_t i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			return;
	if (t->n_eog < MAX_EOG)
		t->eog[t->n_eog++] = id;
}

/*
 * The end-of-generation set, as llama.cpp builds it: tokens found by their
 * text (and forced to CONTROL, which changes how they are split and
 * printed), then EOS and the eot/eom ids the file names. llama.cpp's list
 * includes "</s>", so Gemma 3's user-defined strikethrough tag ends
 * generation there too; it exempts only vocabularies that also hold
 * <|tool_response> or <|plamo:eos|>, whose "</s>" is ordinary text.
 */
static int load_eog(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                    struct q4kh_error *err)
{
	static const char *const texts[] = {
		"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
		"<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
		"<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
		"<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
		/* fill-in-the-middle pad, repository and file separators */
		"<|fim_pad|>", "<fim-pad>", "<|fim_repo|>", "<|repo_name|>",
		"<fim-repo>", "<|file_sep|>", "<|fim_sep|>", "<fim-sep>",
	};
	int keep_s = q4kh_tokenizer_find(t, "<|tool_response>") < 0 &&
	             q4kh_tokenizer_find(t, "<|plamo:eos|>") < 0;
	int32_t eot = -1, eom = -1;

	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		int32_t id = q4kh_tokenizer_find(t, texts[i]);
		if (id < 0 || (!keep_s && strcmp(texts[i], "</s>") == 0))
			continue;
		eog_add(t, id);
		t->tok[id].type = TT_CONTROL;
	}
	if (load_id(g, t, "tokenizer.ggml.eot_token_id", &eot, err) < 0 ||
	    load_id(g, t, "tokenizer.ggml.eom_token_id", &eom, err) < 0)
		return -1;
	eog_add(t, t->eos);
	if (eot >= 0)
		eog_add(t, eot);
	if (eom >= 0)
		eog_add(t, eom);
	return 0;
}

static int is_special_type(uint8_t type)
{
	return type == TT_CONTROL || type == TT_USER || type == TT_UNKNOWN;
}

static int cmp_len_desc(const void *a, const void *b)
{
	const struct special_len *x = a, *y = b;

	return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

/* The special map and its per-length first-byte index. */
static int index_specials(struct q4kh_tokenizer *t)
{
	size_t n = 0;

	for (int32_t i = 0; i < t->n_vocab; i++)
		n += is_special_type(t->tok[i].type);
	if (map_init(&t->special, n) < 0)
		return -1;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		const struct tok *e = &t->tok[i];
		struct special_len *sl = NULL;
		if (!is_special_type(e->type))
			continue;
		map_put(&t->special, t->tok, t->arena, i, 0);
		for (size_t k = 0; k < t->n_sp_len && !sl; k++)
			if (t->sp_len[k].len == e->len)
				sl = &t->sp_len[k];
		if (!sl) {
			void *p = realloc(t->sp_len, (t->n_sp_len + 1) * sizeof(*sl));
			if (!p)
				return -1;
			t->sp_len = p;
			sl = &t->sp_len[t->n_sp_len++];
			memset(sl, 0, sizeof(*sl));
			sl->len = e->len;
		}
		sl->first[(uint8_t)t->arena[e->off]] |=
			e->type == TT_USER ? SP_USER : SP_PARSED;
	}
	if (t->n_sp_len) /* a vocabulary may have no special token */
		qsort(t->sp_len, t->n_sp_len, sizeof(*t->sp_len), cmp_len_desc);
	return 0;
}

/* llama.cpp's byte_to_token for SentencePiece: "<0xXX>" (uppercase hex),
 * else the one-byte text itself. */
static void index_bytes(struct q4kh_tokenizer *t)
{
	for (int b = 0; b < 256; b++) {
		char hex[8];
		char one = (char)b;
		snprintf(hex, sizeof(hex), "<0x%02X>", b);
		t->byte_tok[b] = q4kh_tokenizer_find(t, hex);
		if (t->byte_tok[b] < 0)
			t->byte_tok[b] = q4kh_tok_find(t, &one, 1);
	}
}

static int build_index(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                       struct q4kh_error *err)
{
	if (q4kh_tok_map_build(&t->all, t->tok, t->arena, t->n_vocab, 1) < 0)
		return q4kh_fail(err, "%s: out of memory for the token index",
		                 g->path);
	index_bytes(t);
	if (load_eog(g, t, err) < 0)
		return -1;
	if (index_specials(t) < 0)
		return q4kh_fail(err, "%s: out of memory for the special-token index",
		                 g->path);
	return 0;
}

int q4kh_tokenizer_load(const struct q4kh_gguf *g, struct q4kh_tokenizer **out,
                        struct q4kh_error *err)
{
	struct q4kh_tokenizer *t = calloc(1, sizeof(*t));

	*out = NULL;
	if (!t)
		return q4kh_fail(err, "%s: out of memory for the tokenizer", g->path);
	if (check_model(g, t, err) < 0 || load_tokens(g, t, err) < 0 ||
	    (t->model == TM_BPE && q4kh_tok_bpe_load(g, t, err) < 0) ||
	    load_settings(g, t, err) < 0 || build_index(g, t, err) < 0) {
		q4kh_tokenizer_free(t);
		return -1;
	}
	*out = t;
	return 0;
}

void q4kh_tokenizer_free(struct q4kh_tokenizer *t)
{
	if (!t)
		return;
	free(t->tok);
	free(t->arena);
	free(t->all.slot);
	free(t->special.slot);
	free(t->sp_len);
	q4kh_tok_bpe_free(t->bpe);
	free(t);
}

/* --- encoding ------------------------------------------------------------ */

/* A stretch of the input: raw text (id < 0) or one special token. */
struct seg {
	size_t off, len;
	int32_t id;
};

/* P with room for NEED elements (doubling), or NULL with P still valid. */
void *q4kh_tok_grow(void *p, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 16;

	if (need <= *cap)
		return p;
	while (c < need)
		c *= 2;
	p = realloc(p, c * elem);
	if (p)
		*cap = c;
	return p;
}

int q4kh_tok_push(struct enc *e, int32_t id)
{
	int32_t *p = q4kh_tok_grow(e->ids, &e->cap_ids, e->n_ids + 1, sizeof(*p));

	if (!p)
		return -1;
	e->ids = p;
	e->ids[e->n_ids++] = id;
	return 0;
}

/* The special token of length LEN at S that KINDS allows, or -1. */
static int32_t special_at(const struct q4kh_tokenizer *t, const char *s,
                          size_t len, int kinds)
{
	int32_t id = q4kh_tok_map_find(&t->special, t->tok, t->arena, s, len);

	if (id < 0)
		return -1;
	return (t->tok[id].type == TT_USER ? SP_USER : SP_PARSED) & kinds ? id
	                                                                  : -1;
}

/*
 * Split every raw segment of IN at the special tokens of one length, leftmost
 * first without overlap, into OUT; returns OUT's count. llama.cpp does this
 * per token, longest first; doing all tokens of one length in one pass is the
 * same whenever no two specials of equal length overlap (true of Gemma's
 * vocabulary; llama.cpp's own order between them is unspecified anyway).
 */
static size_t split_len(const struct q4kh_tokenizer *t,
                        const struct special_len *sl, int kinds,
                        const char *text, const struct seg *in, size_t n_in,
                        struct seg *out)
{
	size_t n = 0;

	for (size_t i = 0; i < n_in; i++) {
		size_t start = in[i].off, p = in[i].off, end = in[i].off + in[i].len;
		if (in[i].id >= 0 || in[i].len < sl->len) {
			out[n++] = in[i];
			continue;
		}
		while (p + sl->len <= end) {
			int32_t id = sl->first[(uint8_t)text[p]] & kinds
			                     ? special_at(t, text + p, sl->len, kinds)
			                     : -1;
			if (id < 0) {
				p++;
				continue;
			}
			if (p > start)
				out[n++] = (struct seg){ start, p - start, -1 };
			out[n++] = (struct seg){ p, sl->len, id };
			p += sl->len;
			start = p;
		}
		if (end > start)
			out[n++] = (struct seg){ start, end - start, -1 };
	}
	return n;
}

/* TEXT as segments, special tokens split out; *segs is malloc()ed. Each
 * split adds at most two segments, so 2 * len + 1 bound the count. */
static int split_specials(const struct q4kh_tokenizer *t, const char *text,
                          size_t len, int parse_special, struct seg **segs,
                          size_t *n)
{
	int kinds = SP_USER | (parse_special ? SP_PARSED : 0);
	struct seg *a = malloc((2 * len + 1) * sizeof(*a));
	struct seg *b = malloc((2 * len + 1) * sizeof(*b));

	if (!a || !b) {
		free(a);
		free(b);
		return -1;
	}
	*n = 0;
	if (len)
		a[(*n)++] = (struct seg){ 0, len, -1 };
	for (size_t k = 0; k < t->n_sp_len; k++) {
		struct seg *s = a;
		*n = split_len(t, &t->sp_len[k], kinds, text, a, *n, b);
		a = b;
		b = s;
	}
	free(b);
	*segs = a;
	return 0;
}

static int encode_segments(struct enc *e, const char *text,
                           const struct seg *segs, size_t n, int add_bos,
                           struct q4kh_error *err)
{
	const struct q4kh_tokenizer *t = e->t;
	int prev_special = 1; /* a space prefix goes before the first text */

	if (add_bos && t->add_bos && q4kh_tok_push(e, t->bos) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	for (size_t i = 0; i < n; i++) {
		if (segs[i].id >= 0) {
			if (q4kh_tok_push(e, segs[i].id) < 0)
				return q4kh_fail(err, "tokenizer: out of memory");
			prev_special = 1;
			continue;
		}
		if (t->model == TM_BPE
		            ? q4kh_tok_bpe_encode(e, text + segs[i].off, segs[i].len, err)
		            : q4kh_tok_spm_encode(e, text + segs[i].off, segs[i].len,
		                                  t->add_space_prefix && prev_special,
		                                  err))
			return -1;
		prev_special = 0;
	}
	/* llama.cpp appends EOS under the same add-special switch as BOS */
	if (add_bos && t->add_eos && q4kh_tok_push(e, t->eos) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	return 0;
}

int q4kh_tokenize(const struct q4kh_tokenizer *t, const char *text, size_t len,
                  int add_bos, int parse_special, int32_t **ids, size_t *n,
                  struct q4kh_error *err)
{
	struct enc e = { .t = t };
	struct seg *segs = NULL;
	size_t n_segs = 0;
	int rc;

	*ids = NULL;
	*n = 0;
	if (len > MAX_TEXT)
		return q4kh_fail(err, "tokenizer: text of %zu bytes exceeds the "
		                 "limit of %zu", len, MAX_TEXT);
	e.ids = q4kh_tok_grow(NULL, &e.cap_ids, 1, sizeof(*e.ids));
	if (!e.ids ||
	    split_specials(t, text, len, parse_special, &segs, &n_segs) < 0) {
		free(e.ids);
		return q4kh_fail(err, "tokenizer: out of memory for %zu bytes of "
		                 "text", len);
	}
	rc = encode_segments(&e, text, segs, n_segs, add_bos, err);
	free(segs);
	free(e.buf);
	free(e.sym);
	free(e.heap);
	q4kh_tok_bpe_done(&e);
	if (rc < 0) {
		free(e.ids);
		return -1;
	}
	*ids = e.ids;
	*n = e.n_ids;
	return 0;
}

/* --- decoding and queries ------------------------------------------------ */

/* BUF may be NULL when CAP is 0: memcpy must not see it even for 0 bytes. */
static size_t copy_out(const char *s, size_t n, char *buf, size_t cap)
{
	if (cap)
		memcpy(buf, s, n < cap ? n : cap);
	return n;
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* The byte of a "<0xXX>" token, or -1 when its text is not of that form. */
static int byte_of(const char *s, uint32_t len)
{
	int hi, lo;

	if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	hi = hex_digit(s[3]);
	lo = hex_digit(s[4]);
	return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* A normal token's text with every U+2581 turned back into a space. */
static size_t unescape_out(const char *s, size_t n, char *buf, size_t cap)
{
	size_t w = 0;

	for (size_t i = 0; i < n; w++) {
		int mark = i + SPACE_MARK_LEN <= n &&
		           memcmp(s + i, SPACE_MARK, SPACE_MARK_LEN) == 0;
		if (w < cap)
			buf[w] = mark ? ' ' : s[i];
		i += mark ? SPACE_MARK_LEN : 1;
	}
	return w;
}

size_t q4kh_token_to_piece(const struct q4kh_tokenizer *t, int32_t id,
                           int show_special, char *buf, size_t cap)
{
	const struct tok *e;
	int b;

	if (id < 0 || id >= t->n_vocab)
		return 0;
	e = &t->tok[id];
	switch (e->type) {
	case TT_CONTROL:
	case TT_UNKNOWN:
		return show_special ? copy_out(tok_text(t, id), e->len, buf, cap)
		                    : 0;
	case TT_USER:
		return copy_out(tok_text(t, id), e->len, buf, cap);
	case TT_NORMAL:
		return t->model == TM_BPE
		               ? q4kh_tok_bpe_decode(t, tok_text(t, id), e->len, buf, cap)
		               : unescape_out(tok_text(t, id), e->len, buf, cap);
	case TT_BYTE: /* a SentencePiece notion: BPE prints nothing for it */
		b = t->model == TM_SPM ? byte_of(tok_text(t, id), e->len) : -1;
		if (b < 0)
			return 0;
		if (cap)
			buf[0] = (char)b;
		return 1;
	default: /* unused and undefined tokens print nothing, as in llama.cpp */
		return 0;
	}
}

int32_t q4kh_tokenizer_n_vocab(const struct q4kh_tokenizer *t)
{
	return t->n_vocab;
}

int32_t q4kh_tokenizer_bos(const struct q4kh_tokenizer *t)
{
	return t->bos;
}

int32_t q4kh_tokenizer_eos(const struct q4kh_tokenizer *t)
{
	return t->eos;
}

int32_t q4kh_tokenizer_find(const struct q4kh_tokenizer *t, const char *text)
{
	return q4kh_tok_find(t, text, strlen(text));
}

int q4kh_tokenizer_is_eog(const struct q4kh_tokenizer *t, int32_t id)
{
	for (size_t i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			return 1;
	return 0;
}
