/*
 * Byte-level BPE tokenization against llama.cpp:
 * tests/fixtures/tokenizer-bpe.json (scripts/gen-arch-fixtures.py) holds
 * llama.cpp's ids, detokenizations, pieces and end-of-generation sets for
 * the vocabularies of tiny-llama.gguf (Llama 3's "llama-bpe"
 * pre-tokenizer), tiny-qwen2.gguf ("qwen2") and the latter with "gpt-2"
 * as its pre-tokenizer, over a corpus of tricky
 * strings (Unicode, CJK, emoji, digit and whitespace runs, contractions,
 * special tokens in text, invalid UTF-8).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "helpers.h"
#include "tokenizer.h"

static json_t *load_fixture(void)
{
	char path[4096];
	json_error_t jerr;
	json_t *doc;

	snprintf(path, sizeof(path), "%s/tests/fixtures/tokenizer-bpe.json", test_srcdir());
	doc = json_load_file(path, JSON_ALLOW_NUL, &jerr);
	cr_assert_not_null(doc, "%s:%d: %s", path, jerr.line, jerr.text);
	return doc;
}

static json_t *vocab_doc(json_t *doc, const char *arch)
{
	json_t *v = json_object_get(json_object_get(doc, "vocabularies"), arch);

	cr_assert_not_null(v, "fixture has no %s vocabulary", arch);
	return v;
}

/* The vocabulary of tiny-ARCH.gguf; "gpt2" is tiny-qwen2's with GPT-2's
 * pre-tokenizer. */
static struct q4kh_tokenizer *open_tokenizer(const char *arch)
{
	char path[4096], *gpt2 = NULL;
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct q4kh_tokenizer *t = NULL;

	snprintf(path, sizeof(path), "%s/tests/fixtures/tiny-%s.gguf", test_srcdir(),
	         strcmp(arch, "gpt2") ? arch : "qwen2");
	if (!strcmp(arch, "gpt2")) {
		gpt2 = test_patch_gguf(path, "tokenizer.ggml.pre", "qwen2", "gpt-2");
		snprintf(path, sizeof(path), "%s", gpt2);
		free(gpt2);
	}
	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), 0, "%s", err.msg);
	q4kh_gguf_close(g); /* the tokenizer keeps its own copies */
	return t;
}

/* A case's input: "text" (UTF-8) or "text_hex" (anything else). */
static char *case_text(json_t *c, size_t *n)
{
	json_t *s = json_object_get(c, "text");
	char *out;

	if (!s)
		return test_unhex(json_string_value(json_object_get(c, "text_hex")), n);
	*n = json_string_length(s);
	out = malloc(*n + 1);
	cr_assert_not_null(out);
	memcpy(out, json_string_value(s), *n);
	return out;
}

/* Every case's ids; counts and names the cases that differ. */
static void check_ids(const char *arch)
{
	struct q4kh_tokenizer *t = open_tokenizer(arch);
	json_t *doc = load_fixture(), *cases = json_object_get(vocab_doc(doc, arch), "cases"), *c;
	size_t i, bad = 0;

	cr_assert(json_array_size(cases) > 250);
	json_array_foreach(cases, i, c) {
		const char *name = json_string_value(json_object_get(c, "name"));
		json_t *want = json_object_get(c, "ids");
		struct q4kh_error err = { { 0 } };
		size_t len, n, first = SIZE_MAX, nw = json_array_size(want);
		char *text = case_text(c, &len);
		int32_t *ids;

		cr_assert_eq(q4kh_tokenize(t, text, len, json_is_true(json_object_get(c, "add_bos")),
		                           json_is_true(json_object_get(c, "parse_special")),
		                           &ids, &n, &err),
		             0, "%s: %s", name, err.msg);
		for (size_t k = 0; k < n && k < nw && first == SIZE_MAX; k++)
			if (ids[k] != json_integer_value(json_array_get(want, k)))
				first = k;
		if (first == SIZE_MAX && n != nw)
			first = n < nw ? n : nw;
		cr_expect_eq(first, SIZE_MAX,
		             "%s %s: %zu ids, llama.cpp %zu; first difference at %zu: %d vs llama.cpp %lld",
		             arch, name, n, nw, first, first < n ? ids[first] : -1,
		             (long long)json_integer_value(json_array_get(want, first)));
		bad += first != SIZE_MAX;
		free(ids);
		free(text);
	}
	fprintf(stderr, "%s tokenizer: %zu cases, %zu differ from llama.cpp\n", arch, i, bad);
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(bpe, llama3_ids_match_llama_cpp) { check_ids("llama"); }
Test(bpe, qwen2_ids_match_llama_cpp) { check_ids("qwen2"); }
Test(bpe, gpt2_ids_match_llama_cpp) { check_ids("gpt2"); }

/* Concatenated pieces (specials hidden) equal llama.cpp's, and every
 * token's piece, special shown or not. */
static void check_pieces(const char *arch)
{
	struct q4kh_tokenizer *t = open_tokenizer(arch);
	json_t *doc = load_fixture(), *v = vocab_doc(doc, arch), *c, *p;
	size_t i;

	json_array_foreach(json_object_get(v, "cases"), i, c) {
		json_t *jids = json_object_get(c, "ids");
		size_t want_len, got_len = 0;
		char *want = test_unhex(json_string_value(json_object_get(c, "detok_hex")), &want_len);
		char *got = malloc(want_len + 64);

		for (size_t k = 0; k < json_array_size(jids); k++) {
			int32_t id = (int32_t)json_integer_value(json_array_get(jids, k));
			size_t room = want_len + 64 - got_len;
			size_t len = q4kh_token_to_piece(t, id, 0, got + got_len, room);
			cr_assert_leq(len, room, "%s: piece of %d too long", arch, id);
			got_len += len;
		}
		cr_expect(got_len == want_len && memcmp(got, want, got_len) == 0,
		          "%s %s: detokenized to %zu bytes, llama.cpp %zu", arch,
		          json_string_value(json_object_get(c, "name")), got_len, want_len);
		free(want);
		free(got);
	}
	cr_assert_eq(json_array_size(json_object_get(v, "pieces")), (size_t)q4kh_tokenizer_n_vocab(t));
	json_array_foreach(json_object_get(v, "pieces"), i, p) {
		int32_t id = (int32_t)json_integer_value(json_array_get(p, 0));
		for (int special = 0; special <= 1; special++) {
			size_t want_len, got_len;
			char *want = test_unhex(json_string_value(json_array_get(p, 1 + special)), &want_len);
			char buf[512];

			got_len = q4kh_token_to_piece(t, id, special, buf, sizeof(buf));
			cr_expect(got_len == want_len && memcmp(buf, want, got_len) == 0,
			          "%s token %d (show_special %d): %zu bytes, llama.cpp %zu", arch, id,
			          special, got_len, want_len);
			free(want);
		}
	}
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(bpe, llama3_pieces_match_llama_cpp) { check_pieces("llama"); }
Test(bpe, qwen2_pieces_match_llama_cpp) { check_pieces("qwen2"); }
Test(bpe, gpt2_pieces_match_llama_cpp) { check_pieces("gpt2"); }

static void check_special_ids(const char *arch)
{
	struct q4kh_tokenizer *t = open_tokenizer(arch);
	json_t *doc = load_fixture(), *v = vocab_doc(doc, arch), *eog = json_object_get(v, "eog");
	int32_t n_vocab = q4kh_tokenizer_n_vocab(t);
	size_t found = 0;

	cr_assert_eq(n_vocab, json_integer_value(json_object_get(v, "n_vocab")));
	cr_assert_eq(q4kh_tokenizer_bos(t), json_integer_value(json_object_get(v, "bos")));
	cr_assert_eq(q4kh_tokenizer_eos(t), json_integer_value(json_object_get(v, "eos")));
	for (int32_t id = 0; id < n_vocab; id++) {
		int want = 0;
		for (size_t k = 0; k < json_array_size(eog); k++)
			want |= json_integer_value(json_array_get(eog, k)) == id;
		cr_expect_eq(q4kh_tokenizer_is_eog(t, id), want, "%s token %d", arch, id);
		found += want;
	}
	cr_assert_eq(found, json_array_size(eog));
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(bpe, llama3_special_ids_match_llama_cpp) { check_special_ids("llama"); }
Test(bpe, qwen2_special_ids_match_llama_cpp) { check_special_ids("qwen2"); }
