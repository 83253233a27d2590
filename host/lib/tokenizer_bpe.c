/*
 * Byte-level BPE fragments (tokenizer.ggml.model = "gpt2"), as llama.cpp's
 * llm_tokenizer_bpe_session encodes them (src/llama-vocab.cpp,
 * src/unicode.cpp):
 *  1. the text is read as code points the way llama.cpp reads UTF-8 (no
 *     overlong or surrogate checks; a byte that starts no sequence is
 *     U+FFFD) and written back as UTF-8;
 *  2. the pre-tokenizer named by tokenizer.ggml.pre splits it into words:
 *     every match of its regular expression (run by PCRE2 with Unicode
 *     properties) and every stretch between matches;
 *  3. each word's bytes become GPT-2's printable stand-ins (Radford et al.
 *     2019, encoder.py bytes_to_unicode), then adjacent pieces merge by
 *     the lowest rank in tokenizer.ggml.merges (Sennrich et al. 2016);
 *     Llama 3's pre-tokenizer first takes a whole word that is a token.
 */
#include "tokenizer_impl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPLACEMENT "\xef\xbf\xbd" /* U+FFFD */
/* Matched in place of a surrogate code point, which PCRE2 cannot take:
 * U+E000 (private use) has the same UTF-8 length and, like a surrogate,
 * is neither letter, number nor space. */
#define SURROGATE_STAND_IN "\xee\x80\x80"

/* The split that llama.cpp's unicode_regex_split computes for the
 * pre-tokenizer types it names; the regular expressions are the ones its
 * llm_tokenizer_bpe uses for them. */
struct pre_tokenizer {
	const char *names; /* tokenizer.ggml.pre values, '|'-separated */
	const char *regex;
	int ignore_merges; /* a word that is a token is taken whole */
	int add_bos;       /* default of tokenizer.ggml.add_bos_token */
};

static const struct pre_tokenizer pre_tokenizers[] = {
	{ "llama-bpe|llama3|llama-v3",
	  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
	  "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
	  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	  1, 1 },
	{ "qwen2|deepseek-r1-qwen",
	  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
	  "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
	  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	  0, 0 },
	{ "gpt-2",
	  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
	  "|\\s+(?!\\S)",
	  0, 0 },
};

#define SUPPORTED_PRE "llama-bpe (llama3, llama-v3), qwen2 (deepseek-r1-qwen), gpt-2"

struct bpe {
	const struct pre_tokenizer *pre;
	pcre2_code *re;
	struct tok *merge; /* "left right", rank = index */
	char *arena;
	int32_t n_merges;
	struct text_map ranks; /* the first of duplicate merges wins */
	uint16_t byte_cp[256]; /* GPT-2's stand-in code point of each byte */
	int16_t cp_byte[512];  /* and back; -1 where none */
};

/* Per-call scratch (struct enc's bpe). */
struct bpe_call {
	pcre2_match_data *md;
	char *text, *match; /* read back as llama.cpp reads it; for the regex */
	size_t cap_text, cap_match;
	char *key; /* "left right" being looked up */
	size_t cap_key;
};

/* --- loading ------------------------------------------------------------- */

/* bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other
 * 68 take 256, 257, ... in byte order. */
static void init_byte_map(struct bpe *b)
{
	uint16_t next = 256;

	memset(b->cp_byte, 0xff, sizeof(b->cp_byte));
	for (int c = 0; c < 256; c++) {
		int printable = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) ||
		                (c >= 0xae && c <= 0xff);
		b->byte_cp[c] = printable ? (uint16_t)c : next++;
		b->cp_byte[b->byte_cp[c]] = (int16_t)c;
	}
}

static int name_in(const char *names, const char *s, size_t n)
{
	for (const char *p = names; *p;) {
		size_t len = strcspn(p, "|");
		if (len == n && memcmp(p, s, n) == 0)
			return 1;
		p += len + (p[len] == '|');
	}
	return 0;
}

static int load_pre(const struct q4kh_gguf *g, struct bpe *b,
                    struct q4kh_error *err)
{
	struct q4kh_gguf_str s;
	char shown[272];
	int rc = q4kh_gguf_get_str(g, "tokenizer.ggml.pre", &s, err);
	int code;
	PCRE2_SIZE at;

	if (rc < 0)
		return -1;
	if (rc > 0)
		return q4kh_fail(err, "%s: no tokenizer.ggml.pre key: the BPE "
		                 "pre-tokenizer is unknown (supported: %s)",
		                 g->path, SUPPORTED_PRE);
	for (size_t i = 0; i < sizeof(pre_tokenizers) / sizeof(pre_tokenizers[0]); i++)
		if (name_in(pre_tokenizers[i].names, s.data, s.len))
			b->pre = &pre_tokenizers[i];
	if (!b->pre)
		return q4kh_fail(err, "%s: tokenizer.ggml.pre is \"%s\": not "
		                 "supported (supported: %s)",
		                 g->path, q4kh_show(shown, sizeof(shown), s.data, s.len, 64, 0),
		                 SUPPORTED_PRE);
	b->re = pcre2_compile((PCRE2_SPTR)b->pre->regex, PCRE2_ZERO_TERMINATED,
	                      PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
	if (!b->re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(code, msg, sizeof(msg));
		return q4kh_fail(err, "pre-tokenizer %.*s: PCRE2 rejects its pattern "
		                 "at offset %zu: %s",
		                 (int)s.len, s.data, (size_t)at, (char *)msg);
	}
	/* Speed only: without JIT support pcre2_match interprets. */
	pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE);
	return 0;
}

static int load_merges(const struct q4kh_gguf *g, struct bpe *b,
                       struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, "tokenizer.ggml.merges");
	struct q4kh_gguf_str *s;
	uint64_t total = 0;
	char *p;

	if (!kv)
		return q4kh_fail(err, "%s: no tokenizer.ggml.merges key (a \"gpt2\" "
		                 "vocabulary needs its merges)", g->path);
	if (kv->type != Q4KH_GGUF_ARRAY || kv->elem_type != Q4KH_GGUF_STRING ||
	    kv->count > INT32_MAX)
		return q4kh_fail(err, "%s: offset %llu: tokenizer.ggml.merges: "
		                 "expected an array of strings, found %s of %llu %s",
		                 g->path, (unsigned long long)kv->offset,
		                 q4kh_gguf_vtype_name(kv->type),
		                 (unsigned long long)kv->count,
		                 q4kh_gguf_vtype_name(kv->elem_type));
	s = malloc((kv->count + 1) * sizeof(*s));
	b->merge = calloc(kv->count + 1, sizeof(*b->merge));
	if (!s || !b->merge || q4kh_gguf_array_strings(g, kv, s, err) < 0) {
		free(s);
		return err->msg[0] ? -1 : q4kh_fail(err, "%s: out of memory for %llu merges",
		                                    g->path, (unsigned long long)kv->count);
	}
	for (uint64_t i = 0; i < kv->count; i++)
		total += s[i].len + 1;
	if (total > UINT32_MAX || !(b->arena = malloc(total ? total : 1))) {
		free(s);
		return q4kh_fail(err, "%s: merges take %llu bytes: too large or out "
		                 "of memory", g->path, (unsigned long long)total);
	}
	p = b->arena;
	for (uint64_t i = 0; i < kv->count; i++) {
		b->merge[i] = (struct tok){ (uint32_t)(p - b->arena), (uint32_t)s[i].len, 0, 0 };
		memcpy(p, s[i].data, s[i].len);
		p += s[i].len;
		*p++ = '\0';
	}
	b->n_merges = (int32_t)kv->count;
	free(s);
	if (q4kh_tok_map_build(&b->ranks, b->merge, b->arena, b->n_merges, 0) < 0)
		return q4kh_fail(err, "%s: out of memory for the merge index", g->path);
	return 0;
}

int q4kh_tok_bpe_load(const struct q4kh_gguf *g, struct q4kh_tokenizer *t,
                      struct q4kh_error *err)
{
	struct bpe *b = calloc(1, sizeof(*b));

	if (!b)
		return q4kh_fail(err, "%s: out of memory for the BPE tables", g->path);
	t->bpe = b;
	init_byte_map(b);
	if (load_pre(g, b, err) < 0 || load_merges(g, b, err) < 0)
		return -1;
	t->add_bos = b->pre->add_bos;
	return 0;
}

void q4kh_tok_bpe_free(struct bpe *b)
{
	if (!b)
		return;
	pcre2_code_free(b->re);
	free(b->merge);
	free(b->arena);
	free(b->ranks.slot);
	free(b);
}

/* --- encoding ------------------------------------------------------------ */

static int cont(const uint8_t *s, size_t len, size_t i)
{
	return i < len && (s[i] & 0xc0) == 0x80;
}

/*
 * The code point at S[*i] as llama.cpp's unicode_cpt_from_utf8 reads it,
 * advancing *i; -1 (one byte consumed) where it throws.
 */
static int32_t read_cpt(const uint8_t *s, size_t len, size_t *i)
{
	uint8_t c = s[*i];
	int n = !(c & 0x80) ? 1 : !(c & 0x40) ? 0 : !(c & 0x20) ? 2
	        : !(c & 0x10) ? 3 : !(c & 0x08) ? 4 : 0;
	int32_t cp;

	for (int k = 1; k < n; k++)
		if (!cont(s, len, *i + k))
			n = 0;
	if (n == 0) {
		(*i)++;
		return -1;
	}
	cp = n == 1 ? c : c & (0xff >> (n + 1));
	for (int k = 1; k < n; k++)
		cp = (cp << 6) | (s[*i + k] & 0x3f);
	*i += n;
	return cp;
}

static size_t put_utf8(char *out, uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/*
 * Step 1 into c->text, and the same with surrogates replaced by a stand-in
 * into c->match (equal lengths, so offsets agree). Every input byte yields
 * at most 3 bytes. *n gets the length. -1 on out of memory.
 */
static int read_text(struct bpe_call *c, const char *s, size_t len, size_t *n)
{
	const uint8_t *u = (const uint8_t *)s;
	char *text = q4kh_tok_grow(c->text, &c->cap_text, 3 * len + 1, 1), *match;
	size_t w = 0;

	if (!text)
		return -1;
	c->text = text;
	match = q4kh_tok_grow(c->match, &c->cap_match, 3 * len + 1, 1);
	if (!match)
		return -1;
	c->match = match;
	for (size_t i = 0; i < len;) {
		int32_t cp = read_cpt(u, len, &i);
		size_t k;
		if (cp < 0 || cp > 0x10ffff) {
			memcpy(text + w, REPLACEMENT, 3);
			memcpy(match + w, REPLACEMENT, 3);
			w += 3;
			continue;
		}
		k = put_utf8(text + w, (uint32_t)cp);
		if (cp >= 0xd800 && cp <= 0xdfff)
			memcpy(match + w, SURROGATE_STAND_IN, 3);
		else
			memcpy(match + w, text + w, k);
		w += k;
	}
	*n = w;
	return 0;
}

/* Two pieces merge when "left right" is a merge; its rank orders them. */
static int bpe_pair(struct enc *e, const struct sym *left,
                    const struct sym *right, float *score)
{
	const struct bpe *b = e->t->bpe;
	char *key = ((struct bpe_call *)e->bpe)->key; /* sized by encode_word */
	size_t n = left->n + 1 + right->n;
	int32_t rank;

	memcpy(key, e->buf + left->off, left->n);
	key[left->n] = ' ';
	memcpy(key + left->n + 1, e->buf + right->off, right->n);
	rank = q4kh_tok_map_find(&b->ranks, b->merge, b->arena, key, n);
	if (rank < 0)
		return 0;
	*score = -(float)rank; /* exact: ranks stay below 2^24 */
	return 1;
}

/* A final piece: its token, else each of its bytes that is a one-byte
 * token (llama.cpp drops the others). */
static int emit_piece(struct enc *e, const struct sym *s)
{
	int32_t id = q4kh_tok_find(e->t, e->buf + s->off, s->n);

	if (id >= 0)
		return q4kh_tok_push(e, id);
	for (uint32_t j = 0; j < s->n; j++) {
		id = q4kh_tok_find(e->t, e->buf + s->off + j, 1);
		if (id >= 0 && q4kh_tok_push(e, id) < 0)
			return -1;
	}
	return 0;
}

/* Step 3 for one word of N bytes at W. */
static int encode_word(struct enc *e, const char *w, size_t n)
{
	const struct bpe *b = e->t->bpe;
	struct bpe_call *c = e->bpe;
	char *buf = q4kh_tok_grow(e->buf, &e->cap_buf, 2 * n, 1), *key;
	size_t len = 0;
	int32_t id;

	if (!buf)
		return -1;
	e->buf = buf;
	/* a pair's key is at most the whole encoded word and a space */
	key = q4kh_tok_grow(c->key, &c->cap_key, 2 * n + 1, 1);
	if (!key)
		return -1;
	c->key = key;
	for (size_t i = 0; i < n; i++)
		len += put_utf8(buf + len, b->byte_cp[(uint8_t)w[i]]);
	if (b->pre->ignore_merges && (id = q4kh_tok_find(e->t, buf, len)) >= 0)
		return q4kh_tok_push(e, id);
	if (q4kh_tok_merge(e, len, bpe_pair) < 0)
		return -1;
	for (int32_t i = 0; len && i >= 0; i = e->sym[i].next)
		if (emit_piece(e, &e->sym[i]) < 0)
			return -1;
	return 0;
}

static struct bpe_call *call_state(struct enc *e)
{
	struct bpe_call *c = e->bpe;

	if (c)
		return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->md = pcre2_match_data_create_from_pattern(e->t->bpe->re, NULL);
	if (!c->md) {
		free(c);
		return NULL;
	}
	e->bpe = c;
	return c;
}

int q4kh_tok_bpe_encode(struct enc *e, const char *s, size_t len,
                        struct q4kh_error *err)
{
	struct bpe_call *c = call_state(e);
	size_t n, at = 0, start = 0;

	if (!c || read_text(c, s, len, &n) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	while (at < n) {
		int rc = pcre2_match(e->t->bpe->re, (PCRE2_SPTR)c->match, n, at,
		                     PCRE2_NO_UTF_CHECK, c->md, NULL);
		PCRE2_SIZE *ov;
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(rc, msg, sizeof(msg));
			return q4kh_fail(err, "tokenizer: pre-tokenizer match at byte "
			                 "%zu failed: %s", at, (char *)msg);
		}
		ov = pcre2_get_ovector_pointer(c->md);
		if (ov[1] == ov[0]) { /* no pattern matches empty; be safe */
			at = ov[0] + 1;
			continue;
		}
		if ((ov[0] > start && encode_word(e, c->text + start, ov[0] - start) < 0) ||
		    encode_word(e, c->text + ov[0], ov[1] - ov[0]) < 0)
			return q4kh_fail(err, "tokenizer: out of memory");
		start = at = ov[1];
	}
	if (n > start && encode_word(e, c->text + start, n - start) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	return 0;
}

void q4kh_tok_bpe_done(struct enc *e)
{
	struct bpe_call *c = e->bpe;

	if (!c)
		return;
	pcre2_match_data_free(c->md);
	free(c->text);
	free(c->match);
	free(c->key);
	free(c);
	e->bpe = NULL;
}

/* --- decoding ------------------------------------------------------------ */

size_t q4kh_tok_bpe_decode(const struct q4kh_tokenizer *t, const char *s,
                           size_t n, char *buf, size_t cap)
{
	const struct bpe *b = t->bpe;
	const uint8_t *u = (const uint8_t *)s;
	size_t w = 0;

	for (size_t i = 0; i < n;) {
		size_t i0 = i;
		int32_t cp = read_cpt(u, n, &i);
		char tmp[64];
		size_t k;
		if (cp >= 0 && cp < 512 && b->cp_byte[cp] >= 0) {
			if (w < cap)
				buf[w] = (char)b->cp_byte[cp];
			w++;
			continue;
		}
		/* llama.cpp's llama_decode_text marks a character that stands for
		 * no byte, followed by the whole token text */
		k = (size_t)snprintf(tmp, sizeof(tmp), "[UNK_BYTE_0x");
		for (size_t j = i0; j < i && k + 2 < sizeof(tmp); j++)
			k += (size_t)snprintf(tmp + k, sizeof(tmp) - k, "%02x", u[j]);
		for (size_t j = 0; j < k; j++, w++)
			if (w < cap)
				buf[w] = tmp[j];
		for (size_t j = 0; j < n; j++, w++)
			if (w < cap)
				buf[w] = s[j];
		if (w < cap)
			buf[w] = ']';
		w++;
	}
	return w;
}
