/*
 * Byte-level BPE fragments (tokenizer.ggml.model = "gpt2"), as llama.cpp's
 * llm_tokenizer_bpe_session encodes them (src/llama-vocab.cpp,
 * src/unicode.cpp):
 *  1. the text is read as code points the way llama.cpp reads UTF-8 (no
 *     overlong or surrogate checks; a byte that starts no sequence is
 *     U+FFFD) and written back as UTF-8;
 *  2. the pre-tokenizer named by tokenizer.ggml.pre splits it into words:
 *     each of its regular expressions in turn (run by PCRE2 with Unicode
 *     properties) splits every piece the one before it left into its
 *     matches and the stretches between them;
 *  3. each word's bytes become GPT-2's printable stand-ins (Radford et al.
 *     2019, encoder.py bytes_to_unicode), then adjacent pieces merge by
 *     the lowest rank in tokenizer.ggml.merges (Sennrich et al. 2016);
 *     some pre-tokenizers (Llama 3's, Tekken) first take a whole word
 *     that is a token.
 * llama.cpp runs these expressions either by its own code or by std::regex
 * over the text with every non-ASCII whitespace character replaced by a
 * vertical tab (so such a character is \s and nothing else: it never
 * matches a class that names it); the regular expressions see the text
 * with the same replacement here.
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
 * is neither letter, number, mark, punctuation, symbol nor space. */
#define SURROGATE_STAND_IN "\xee\x80\x80"
#define MAX_REGEX 6

/* Expressions more than one pre-tokenizer uses. CONTRACTION is
 * "(?i:'s|'t|'re|'ve|'m|'ll|'d)" spelled without (?i:), as llama.cpp
 * spells it. */
#define CONTRACTION "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define GPT2_REGEX                                                        \
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+" \
	"|\\s+(?!\\S)"
/* Tekken and GPT-4o: a run of capitals then small letters, or of capitals
 * alone; "capital" is a letter other than a-z and "small" a letter other
 * than A-Z, so a letter outside ASCII is both (llama.cpp writes them
 * (?=[\p{L}])[^a-z] and (?=[\p{L}])[^A-Z]; as one class each, a long word
 * costs PCRE2 no stack per letter). */
#define UPPER "[^\\P{L}a-z]"
#define LOWER "[^\\P{L}A-Z]"
#define CASED_WORDS(suffix)                                                 \
	"[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+" suffix                   \
	"|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*" suffix

/* The split that llama.cpp's unicode_regex_split computes for the
 * pre-tokenizer types it names; the regular expressions are the ones its
 * llm_tokenizer_bpe uses for them (those of the models' tokenizer.json
 * files). */
struct pre_tokenizer {
	const char *names; /* tokenizer.ggml.pre values, '|'-separated */
	const char *regex[MAX_REGEX]; /* applied in turn; NULL after the last */
	int ignore_merges; /* a word that is a token is taken whole */
	int add_bos;       /* default of tokenizer.ggml.add_bos_token */
};

static const struct pre_tokenizer pre_tokenizers[] = {
	{ "llama-bpe|llama3|llama-v3",
	  { CONTRACTION "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
	    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
	  1, 1 },
	{ "qwen2|deepseek-r1-qwen",
	  { CONTRACTION "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
	    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
	  0, 0 },
	/* Qwen 3.5: combining marks count as letters */
	{ "qwen35",
	  { CONTRACTION "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
	    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
	  0, 0 },
	{ "gpt-2", { GPT2_REGEX }, 0, 0 },
	/* digits one by one, then GPT-2's split */
	{ "smollm", { "\\p{N}", GPT2_REGEX }, 0, 0 },
	{ "tekken",
	  { CASED_WORDS("") "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+"
	    "|\\s+(?!\\S)|\\s+" },
	  1, 1 },
	{ "gpt-4o|llama4",
	  { CASED_WORDS("(?:" CONTRACTION ")?") "|\\p{N}{1,3}"
	    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
	  0, 0 },
	/* DeepSeek LLM: line breaks alone; Latin, Greek, Cyrillic and other
	 * cased letters; ASCII and full-width punctuation; trailing space;
	 * runs of U+0800 to U+9FA5 (CJK and most scripts after Armenian) and
	 * Hangul; digit runs */
	{ "deepseek-llm",
	  { "[\\r\\n]",
	    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"
	    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"
	    "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}"
	    "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}"
	    "\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"
	    "\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}"
	    "\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}"
	    "\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}"
	    "\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}"
	    "\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"
	    "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}"
	    "\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}"
	    "\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"
	    "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}"
	    "\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}"
	    "\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}"
	    "\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}"
	    "\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+",
	    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
	    "\\s+$",
	    "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+",
	    "\\p{N}+" },
	  0, 0 },
	/* DeepSeek V3: digits in threes; CJK and kana; then words with
	 * their leading punctuation, punctuation runs, white space */
	{ "deepseek-v3",
	  { "\\p{N}{1,3}",
	    "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
	    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
	    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*"
	    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
	  0, 0 },
};

#define SUPPORTED_PRE                                                            \
	"llama-bpe (llama3, llama-v3), qwen2 (deepseek-r1-qwen), qwen35, gpt-2, "   \
	"smollm, tekken, gpt-4o (llama4), deepseek-llm, deepseek-v3"

struct bpe {
	const struct pre_tokenizer *pre;
	pcre2_code *re[MAX_REGEX];
	struct tok *merge; /* "left right", rank = index */
	char *arena;
	int32_t n_merges;
	struct text_map ranks; /* the first of duplicate merges wins */
	uint16_t byte_cp[256]; /* GPT-2's stand-in code point of each byte */
	int16_t cp_byte[512];  /* and back; -1 where none */
};

/* A stretch [start, end) of bpe_call.match. */
struct span {
	size_t start, end;
};

/* Per-call scratch (struct enc's bpe). */
struct bpe_call {
	pcre2_match_data *md;
	char *text;  /* read back as llama.cpp reads it */
	char *match; /* the same for the regular expressions (read_text) */
	uint32_t *at; /* text offset of every match offset, and of its end */
	size_t cap_text, cap_match, cap_at;
	struct span *words, *next; /* the split so far; the next one */
	size_t cap_words, cap_next;
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

static int compile(struct bpe *b, size_t k, struct q4kh_error *err)
{
	int code;
	PCRE2_SIZE at;

	b->re[k] = pcre2_compile((PCRE2_SPTR)b->pre->regex[k], PCRE2_ZERO_TERMINATED,
	                         PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &at, NULL);
	if (!b->re[k]) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(code, msg, sizeof(msg));
		return q4kh_fail(err, "pre-tokenizer %s: PCRE2 rejects its pattern %zu at "
		                 "offset %zu: %s",
		                 b->pre->names, k, (size_t)at, (char *)msg);
	}
	/* Speed only: without JIT support pcre2_match interprets. */
	pcre2_jit_compile(b->re[k], PCRE2_JIT_COMPLETE);
	return 0;
}

static int load_pre(const struct q4kh_gguf *g, struct bpe *b,
                    struct q4kh_error *err)
{
	struct q4kh_gguf_str s;
	char shown[272];
	int rc = q4kh_gguf_get_str(g, "tokenizer.ggml.pre", &s, err);

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
	for (size_t k = 0; k < MAX_REGEX && b->pre->regex[k]; k++)
		if (compile(b, k, err) < 0)
			return -1;
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
	for (size_t k = 0; k < MAX_REGEX; k++)
		pcre2_code_free(b->re[k]);
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

/* llama.cpp's whitespace beyond ASCII (src/unicode-data.cpp: Unicode's
 * White_Space property). */
static int wide_space(int32_t cp)
{
	return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
	       cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Room for the copies of LEN input bytes (each yields at most 3). */
static int reserve_text(struct bpe_call *c, size_t len)
{
	void *p = q4kh_tok_grow(c->text, &c->cap_text, 3 * len + 1, 1);

	if (!p)
		return -1;
	c->text = p;
	if (!(p = q4kh_tok_grow(c->match, &c->cap_match, 3 * len + 1, 1)))
		return -1;
	c->match = p;
	if (!(p = q4kh_tok_grow(c->at, &c->cap_at, 3 * len + 1, sizeof(*c->at))))
		return -1;
	c->at = p;
	return 0;
}

/*
 * Step 1 into c->text (*n bytes), and what the regular expressions see
 * into c->match (*m bytes): the same with every non-ASCII whitespace
 * character a vertical tab and every surrogate a stand-in. c->at maps
 * match offsets (and *m) to text offsets. -1 on out of memory.
 */
static int read_text(struct bpe_call *c, const char *s, size_t len, size_t *n,
                     size_t *m)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t w = 0, v = 0;

	if (len > UINT32_MAX / 3 || reserve_text(c, len) < 0)
		return -1;
	for (size_t i = 0; i < len;) {
		int32_t cp = read_cpt(u, len, &i);
		size_t tk = 3, mk; /* bytes of text and of match */
		if (cp < 0 || cp > 0x10ffff)
			memcpy(c->text + w, REPLACEMENT, 3);
		else
			tk = put_utf8(c->text + w, (uint32_t)cp);
		mk = wide_space(cp) ? 1 : tk;
		if (wide_space(cp))
			c->match[v] = '\v';
		else if (cp >= 0xd800 && cp <= 0xdfff)
			memcpy(c->match + v, SURROGATE_STAND_IN, 3);
		else
			memcpy(c->match + v, c->text + w, tk);
		for (size_t k = 0; k < mk; k++)
			c->at[v + k] = (uint32_t)(w + k);
		w += tk;
		v += mk;
	}
	c->at[v] = (uint32_t)w;
	*n = w;
	*m = v;
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
	/* only the whole match is read, whatever the groups */
	c->md = pcre2_match_data_create(1, NULL);
	if (!c->md) {
		free(c);
		return NULL;
	}
	e->bpe = c;
	return c;
}

/* Append span [start, end) to c->next (*n of them); -1 on out of memory. */
static int add_span(struct bpe_call *c, size_t *n, size_t start, size_t end)
{
	struct span *p = q4kh_tok_grow(c->next, &c->cap_next, *n + 1, sizeof(*p));

	if (!p)
		return -1;
	c->next = p;
	c->next[(*n)++] = (struct span){ start, end };
	return 0;
}

/*
 * Split every word of c->words by expression RE into c->next: its
 * matches and the stretches between them, each word a subject of its own
 * (a lookahead or $ sees no further than the word's end). *n: the count in,
 * then out. -1 with err.
 */
static int split_words(struct bpe_call *c, const pcre2_code *re, size_t *n,
                       struct q4kh_error *err)
{
	size_t out = 0;

	for (size_t i = 0; i < *n; i++) {
		const char *w = c->match + c->words[i].start;
		size_t len = c->words[i].end - c->words[i].start, at = 0, start = 0;
		while (at < len) {
			int rc = pcre2_match(re, (PCRE2_SPTR)w, len, at, PCRE2_NO_UTF_CHECK, c->md,
			                     NULL);
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
			if (rc == PCRE2_ERROR_NOMATCH)
				break;
			if (rc < 0) {
				PCRE2_UCHAR msg[256];
				pcre2_get_error_message(rc, msg, sizeof(msg));
				return q4kh_fail(err, "tokenizer: pre-tokenizer match at byte %zu "
				                 "failed: %s", c->words[i].start + at, (char *)msg);
			}
			if (ov[1] == ov[0]) { /* no pattern matches empty; be safe */
				at = ov[0] + 1;
				continue;
			}
			if ((ov[0] > start && add_span(c, &out, c->words[i].start + start,
			                               c->words[i].start + ov[0]) < 0) ||
			    add_span(c, &out, c->words[i].start + ov[0], c->words[i].start + ov[1]) < 0)
				return q4kh_fail(err, "tokenizer: out of memory");
			start = at = ov[1];
		}
		if (len > start && add_span(c, &out, c->words[i].start + start, c->words[i].end) < 0)
			return q4kh_fail(err, "tokenizer: out of memory");
	}
	*n = out;
	return 0;
}

int q4kh_tok_bpe_encode(struct enc *e, const char *s, size_t len,
                        struct q4kh_error *err)
{
	const struct bpe *b = e->t->bpe;
	struct bpe_call *c = call_state(e);
	size_t n, m, n_words = 0;

	if (!c || read_text(c, s, len, &n, &m) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	if (m && add_span(c, &n_words, 0, m) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	for (size_t k = 0; k < MAX_REGEX && b->re[k]; k++) {
		struct span *t = c->words;
		size_t cap = c->cap_words;
		c->words = c->next;
		c->cap_words = c->cap_next;
		c->next = t;
		c->cap_next = cap;
		if (split_words(c, b->re[k], &n_words, err) < 0)
			return -1;
	}
	for (size_t i = 0; i < n_words; i++) {
		const struct span *w = &c->next[i];
		if (encode_word(e, c->text + c->at[w->start], c->at[w->end] - c->at[w->start]) < 0)
			return q4kh_fail(err, "tokenizer: out of memory");
	}
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
	free(c->at);
	free(c->words);
	free(c->next);
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
