/*
 * Fuzz target: the tokenizers. Built once per process: the default
 * model's SentencePiece vocabulary (Gemma 3) and two byte-level BPE ones
 * from tests/fixtures (tiny-llama: Llama 3's pre-tokenizer, tiny-qwen2:
 * Qwen2's). Input byte 0 picks the tokenizer (bits 0-1) and the flags
 * parse_special (bit 2) and add_bos (bit 3); the rest is the text.
 *
 * Every id must lie in the vocabulary. Without add_bos, decoding the ids
 * (q4kh_token_to_piece with show_special, so control tokens print their
 * text) must give the text back where the tokenizer promises it:
 *  - SentencePiece: any bytes (a character without a token becomes byte
 *    tokens), except U+2581, which stands for a space in the vocabulary
 *    and prints as one, and with a leading space when the vocabulary asks
 *    for a space prefix;
 *  - byte-level BPE: valid UTF-8 (no surrogates, no overlong forms),
 *    provided the vocabulary holds a token for every byte's stand-in (the
 *    text is read as code points, so an invalid byte becomes U+FFFD).
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model.h"
#include "tokenizer_impl.h"

#define MAX_TOKENIZERS 3

struct fuzz_tok {
	const char *name;
	struct q4kh_tokenizer *t;
	int every_byte; /* BPE: a token for each of the 256 byte stand-ins */
};

static struct fuzz_tok toks[MAX_TOKENIZERS];
static size_t n_toks;

/* GPT-2's stand-in code point of byte B (bytes_to_unicode). */
static unsigned stand_in(unsigned b)
{
	unsigned extra = 256;

	for (unsigned c = 0; c < 256; c++) {
		int printable = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) ||
		                (c >= 0xae && c <= 0xff);
		if (c == b)
			return printable ? c : extra;
		extra += !printable;
	}
	return 0;
}

static int has_every_byte(const struct q4kh_tokenizer *t)
{
	for (unsigned b = 0; b < 256; b++) {
		unsigned cp = stand_in(b);
		char s[3] = { (char)cp, 0, 0 };
		if (cp >= 0x80) {
			s[0] = (char)(0xc0 | (cp >> 6));
			s[1] = (char)(0x80 | (cp & 0x3f));
		}
		if (q4kh_tokenizer_find(t, s) < 0)
			return 0;
	}
	return 1;
}

static void add_tokenizer(const char *name, const char *path)
{
	struct q4kh_gguf *g;
	struct q4kh_error err;
	struct fuzz_tok *ft = &toks[n_toks];

	if (q4kh_gguf_open(path, &g, &err)) {
		fprintf(stderr, "fuzz: tokenizer %s not available: %s\n", name, err.msg);
		return;
	}
	if (q4kh_tokenizer_load(g, &ft->t, &err))
		fuzz_violation("the %s vocabulary does not load: %s", name, err.msg);
	q4kh_gguf_close(g);
	ft->name = name;
	ft->every_byte = ft->t->model == TM_BPE && has_every_byte(ft->t);
	n_toks++;
}

static void load_tokenizers(void)
{
	char path[4096];

	q4kh_default_model_path(path, sizeof(path));
	add_tokenizer("gemma3 (default model)", path);
	snprintf(path, sizeof(path), "%s/tests/fixtures/tiny-llama.gguf", fuzz_srcdir());
	add_tokenizer("tiny-llama", path);
	snprintf(path, sizeof(path), "%s/tests/fixtures/tiny-qwen2.gguf", fuzz_srcdir());
	add_tokenizer("tiny-qwen2", path);
	if (n_toks == 0)
		fuzz_violation("no tokenizer could be loaded (Q4KH_TEST_SRCDIR unset?)");
}

/* Strict UTF-8 (RFC 3629): no overlong forms, surrogates or values past
 * U+10FFFF. */
static int valid_utf8(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint8_t c = s[i];
		size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2
		         : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
		uint32_t cp;
		static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };

		if (k == 0 || k > n - i)
			return 0;
		cp = k == 1 ? c : c & (0x7f >> k);
		for (size_t j = 1; j < k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		i += k;
	}
	return 1;
}

static int promises_round_trip(const struct fuzz_tok *ft, const char *text,
                               size_t len)
{
	if (!valid_utf8((const uint8_t *)text, len))
		return 0;
	if (ft->t->model == TM_SPM)
		return !memmem(text, len, SPACE_MARK, SPACE_MARK_LEN);
	return ft->every_byte;
}

/* The ids decoded and concatenated; malloc()ed, length in *len. */
static char *detokenize(const struct q4kh_tokenizer *t, const int32_t *ids,
                        size_t n, size_t *len)
{
	size_t cap = 64, used = 0;
	char *out = malloc(cap);

	if (!out)
		abort();
	for (size_t i = 0; i < n; i++) {
		/* the length first, as callers that size their buffer ask it */
		size_t need = q4kh_token_to_piece(t, ids[i], 1, NULL, 0);
		while (used + need > cap)
			cap *= 2;
		out = realloc(out, cap);
		if (!out)
			abort();
		if (q4kh_token_to_piece(t, ids[i], 1, out + used, cap - used) != need)
			fuzz_violation("token %d: two lengths for one piece", ids[i]);
		used += need;
	}
	*len = used;
	return out;
}

static void check_round_trip(const struct fuzz_tok *ft, const char *text,
                             size_t len, const int32_t *ids, size_t n)
{
	size_t got_len, prefix = ft->t->model == TM_SPM && ft->t->add_space_prefix && len;
	char *got = detokenize(ft->t, ids, n, &got_len);

	if (got_len != prefix + len || (prefix && got[0] != ' ') ||
	    memcmp(got + prefix, text, len) != 0)
		fuzz_violation("%s: %zu bytes of text came back as %zu bytes "
		               "through %zu tokens", ft->name, len, got_len, n);
	free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct fuzz_tok *ft;
	struct q4kh_error err;
	int parse_special, add_bos;
	const char *text;
	int32_t *ids;
	size_t len, n;

	if (n_toks == 0)
		load_tokenizers();
	if (size == 0)
		return 0;
	ft = &toks[(data[0] & 3) % n_toks];
	parse_special = !!(data[0] & 4);
	add_bos = !!(data[0] & 8);
	text = (const char *)data + 1;
	len = size - 1;
	if (q4kh_tokenize(ft->t, text, len, add_bos, parse_special, &ids, &n, &err)) {
		fuzz_check_error(&err, "q4kh_tokenize");
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= q4kh_tokenizer_n_vocab(ft->t))
			fuzz_violation("%s: token id %d outside the vocabulary of %d",
			               ft->name, ids[i], q4kh_tokenizer_n_vocab(ft->t));
	if (!add_bos && promises_round_trip(ft, text, len))
		check_round_trip(ft, text, len, ids, n);
	free(ids);
	return 0;
}
