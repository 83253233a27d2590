/*
 * Byte-level BPE tokenization against llama.cpp:
 * tests/fixtures/tokenizer-bpe.json (scripts/gen-arch-fixtures.py) holds
 * llama.cpp's ids, detokenizations, pieces and end-of-generation sets for
 * the vocabularies of tiny-llama.gguf (Llama 3's "llama-bpe"
 * pre-tokenizer), tiny-qwen2.gguf ("qwen2") and the latter with "gpt-2"
 * as its pre-tokenizer, over a corpus of tricky
 * strings (Unicode, CJK, emoji, digit and whitespace runs, contractions,
 * special tokens in text, invalid UTF-8).
 *
 * tests/fixtures/tokenizer-pre.json (scripts/gen-pretokenizer-fixture.py)
 * holds llama.cpp's ids for the other pre-tokenizers (DeepSeek LLM and V3,
 * Qwen 3.5, SmolLM, Tekken, GPT-4o, Llama 4 and the aliases) on one
 * vocabulary built to show every split in its ids
 * (tests/fixtures/vocab-pre.gguf); tokenizer-deepseek-r1.json, llama.cpp's
 * ids for the real DeepSeek-R1-Distill-Qwen-7B vocabulary, which
 * scripts/fetch-deepseek-vocab.py fetches (those cases skip without it).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "gguf.h"
#include "helpers.h"
#include "prompt.h"
#include "tokenizer.h"

static json_t *load_json(const char *name)
{
	char path[4096];
	json_error_t jerr;
	json_t *doc;

	snprintf(path, sizeof(path), "%s/tests/fixtures/%s", test_srcdir(), name);
	doc = json_load_file(path, JSON_ALLOW_NUL, &jerr);
	cr_assert_not_null(doc, "%s:%d: %s", path, jerr.line, jerr.text);
	return doc;
}

static json_t *load_fixture(void)
{
	return load_json("tokenizer-bpe.json");
}

static json_t *vocab_doc(json_t *doc, const char *arch)
{
	json_t *v = json_object_get(json_object_get(doc, "vocabularies"), arch);

	cr_assert_not_null(v, "fixture has no %s vocabulary", arch);
	return v;
}

static struct q4kh_tokenizer *load_tokenizer(const char *path)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct q4kh_tokenizer *t = NULL;

	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), 0, "%s", err.msg);
	q4kh_gguf_close(g); /* the tokenizer keeps its own copies */
	return t;
}

/* The vocabulary of tiny-ARCH.gguf; "gpt2" is tiny-qwen2's with GPT-2's
 * pre-tokenizer. */
static struct q4kh_tokenizer *open_tokenizer(const char *arch)
{
	char path[4096], *gpt2 = NULL;

	snprintf(path, sizeof(path), "%s/tests/fixtures/tiny-%s.gguf", test_srcdir(),
	         strcmp(arch, "gpt2") ? arch : "qwen2");
	if (!strcmp(arch, "gpt2")) {
		gpt2 = test_patch_gguf(path, "tokenizer.ggml.pre", "qwen2", "gpt-2");
		snprintf(path, sizeof(path), "%s", gpt2);
		free(gpt2);
	}
	return load_tokenizer(path);
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

/* Our ids for case C (text and flags) against WANT; 1 when they differ. */
static int case_differs(const struct q4kh_tokenizer *t, const char *label, json_t *c,
                        json_t *want)
{
	const char *name = json_string_value(json_object_get(c, "name"));
	struct q4kh_error err = { { 0 } };
	size_t len, n, first = SIZE_MAX, nw = json_array_size(want);
	char *text = case_text(c, &len);
	int32_t *ids;

	cr_assert_eq(q4kh_tokenize(t, text, len, json_is_true(json_object_get(c, "add_bos")),
	                           json_is_true(json_object_get(c, "parse_special")), &ids, &n,
	                           &err),
	             0, "%s: %s", name, err.msg);
	for (size_t k = 0; k < n && k < nw && first == SIZE_MAX; k++)
		if (ids[k] != json_integer_value(json_array_get(want, k)))
			first = k;
	if (first == SIZE_MAX && n != nw)
		first = n < nw ? n : nw;
	cr_expect_eq(first, SIZE_MAX,
	             "%s %s: %zu ids, llama.cpp %zu; first difference at %zu: %d vs llama.cpp %lld",
	             label, name, n, nw, first, first < n ? ids[first] : -1,
	             (long long)json_integer_value(json_array_get(want, first)));
	free(ids);
	free(text);
	return first != SIZE_MAX;
}

/* Every case's ids; counts and names the cases that differ. */
static void check_ids(const char *arch)
{
	struct q4kh_tokenizer *t = open_tokenizer(arch);
	json_t *doc = load_fixture(), *cases = json_object_get(vocab_doc(doc, arch), "cases"), *c;
	size_t i, bad = 0;

	cr_assert(json_array_size(cases) > 250);
	json_array_foreach(cases, i, c)
		bad += case_differs(t, arch, c, json_object_get(c, "ids"));
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

/* Vocabulary size, BOS, EOS and the end-of-generation set as V records
 * them. */
static void check_vocab_ids(const struct q4kh_tokenizer *t, const char *label, json_t *v)
{
	json_t *eog = json_object_get(v, "eog");
	int32_t n_vocab = q4kh_tokenizer_n_vocab(t);
	size_t found = 0;

	cr_assert_eq(n_vocab, json_integer_value(json_object_get(v, "n_vocab")));
	cr_assert_eq(q4kh_tokenizer_bos(t), json_integer_value(json_object_get(v, "bos")));
	cr_assert_eq(q4kh_tokenizer_eos(t), json_integer_value(json_object_get(v, "eos")));
	for (int32_t id = 0; id < n_vocab; id++) {
		int want = 0;
		for (size_t k = 0; k < json_array_size(eog); k++)
			want |= json_integer_value(json_array_get(eog, k)) == id;
		cr_expect_eq(q4kh_tokenizer_is_eog(t, id), want, "%s token %d", label, id);
		found += want;
	}
	cr_assert_eq(found, json_array_size(eog));
}

static void check_special_ids(const char *arch)
{
	struct q4kh_tokenizer *t = open_tokenizer(arch);
	json_t *doc = load_fixture();

	check_vocab_ids(t, arch, vocab_doc(doc, arch));
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(bpe, llama3_special_ids_match_llama_cpp) { check_special_ids("llama"); }
Test(bpe, qwen2_special_ids_match_llama_cpp) { check_special_ids("qwen2"); }

/* --- the other pre-tokenizers ------------------------------------------- */

/* tokenizer-pre.json's ids for PRE on vocab-pre.gguf with that name. */
static void check_pre(const char *pre)
{
	char src[4096], *path;
	json_t *doc = load_json("tokenizer-pre.json"), *c;
	json_t *ids = json_object_get(json_object_get(doc, "ids"), pre);
	struct q4kh_tokenizer *t;
	size_t i, bad = 0;

	cr_assert_not_null(ids, "tokenizer-pre.json has no %s", pre);
	cr_assert_eq(json_array_size(ids), json_array_size(json_object_get(doc, "cases")));
	snprintf(src, sizeof(src), "%s/tests/fixtures/vocab-pre.gguf", test_srcdir());
	path = test_vocab_gguf(src, "tokenizer.ggml.pre", pre);
	t = load_tokenizer(path);
	json_array_foreach(json_object_get(doc, "cases"), i, c)
		bad += case_differs(t, pre, c, json_array_get(ids, i));
	fprintf(stderr, "pre-tokenizer %s: %zu cases, %zu differ from llama.cpp\n", pre, i, bad);
	q4kh_tokenizer_free(t);
	free(path);
	json_decref(doc);
}

Test(pre, qwen2) { check_pre("qwen2"); }
Test(pre, deepseek_r1_qwen) { check_pre("deepseek-r1-qwen"); }
Test(pre, deepseek_llm) { check_pre("deepseek-llm"); }
Test(pre, deepseek_v3) { check_pre("deepseek-v3"); }
Test(pre, qwen35) { check_pre("qwen35"); }
Test(pre, smollm) { check_pre("smollm"); }
Test(pre, tekken) { check_pre("tekken"); }
Test(pre, gpt_4o) { check_pre("gpt-4o"); }
Test(pre, llama4) { check_pre("llama4"); }

Test(pre, every_recorded_family_is_tested)
{
	static const char *const tested[] = { "qwen2", "deepseek-r1-qwen", "deepseek-llm",
		                               "deepseek-v3", "qwen35", "smollm",
		                               "tekken", "gpt-4o", "llama4" };
	json_t *doc = load_json("tokenizer-pre.json"), *v;
	const char *pre;

	json_object_foreach(json_object_get(doc, "ids"), pre, v) {
		int found = 0;
		for (size_t k = 0; k < sizeof(tested) / sizeof(tested[0]); k++)
			found |= !strcmp(pre, tested[k]);
		cr_expect(found, "tokenizer-pre.json records %s, which no test checks", pre);
	}
	json_decref(doc);
}

Test(pre, unknown_names_are_refused)
{
	char src[4096], *path;
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct q4kh_tokenizer *t = NULL;

	snprintf(src, sizeof(src), "%s/tests/fixtures/vocab-pre.gguf", test_srcdir());
	path = test_vocab_gguf(src, "tokenizer.ggml.pre", "no-such-pre\n");
	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), -1);
	cr_expect(strstr(err.msg, "\"no-such-pre\\x0a\"") && strstr(err.msg, "deepseek-v3") &&
	          !strchr(err.msg, '\n'), "%s", err.msg);
	q4kh_gguf_close(g);
	free(path);
}

/* --- the real DeepSeek-R1-Distill-Qwen-7B vocabulary --------------------- */

/* The file scripts/fetch-deepseek-vocab.py writes; the test skips without
 * it. */
static const char *deepseek_vocab(void)
{
	static char path[4096];
	const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");

	if (cache && *cache)
		snprintf(path, sizeof(path), "%s/q4khost/vocab/deepseek-r1-distill-qwen-7b.vocab.gguf",
		         cache);
	else
		snprintf(path, sizeof(path),
		         "%s/.cache/q4khost/vocab/deepseek-r1-distill-qwen-7b.vocab.gguf",
		         home ? home : "");
	if (access(path, R_OK) != 0)
		cr_skip_test("%s absent (scripts/fetch-deepseek-vocab.py fetches it)", path);
	return path;
}

Test(deepseek_r1, ids_match_llama_cpp, .timeout = 120)
{
	struct q4kh_tokenizer *t = load_tokenizer(deepseek_vocab());
	json_t *doc = load_json("tokenizer-deepseek-r1.json"), *c;
	size_t i, bad = 0;

	check_vocab_ids(t, "deepseek-r1", doc);
	json_array_foreach(json_object_get(doc, "cases"), i, c)
		bad += case_differs(t, "deepseek-r1", c, json_object_get(c, "ids"));
	fprintf(stderr, "deepseek-r1 vocabulary: %zu cases, %zu differ from llama.cpp\n", i, bad);
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

/* The case: "Hello" in the model's own chat format is 4 ids, as
 * llama.cpp gives them, and 12 with special tokens left as text. */
Test(deepseek_r1, chat_prompt_is_four_ids, .timeout = 120)
{
	const char *path = deepseek_vocab();
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct q4kh_tokenizer *t = NULL;
	struct q4kh_prompt p;
	json_t *doc = load_json("tokenizer-deepseek-r1.json"), *c, *want = NULL, *plain = NULL;
	int32_t *ids;
	size_t i, n;

	json_array_foreach(json_object_get(doc, "cases"), i, c) {
		const char *name = json_string_value(json_object_get(c, "name"));
		if (!strcmp(name, "r1_chat"))
			want = json_object_get(c, "ids");
		if (!strcmp(name, "r1_chat_plain"))
			plain = json_object_get(c, "ids");
	}
	cr_assert(want && plain);
	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_prompt_init(&p, g, NULL, 1, &err), 0, "%s", err.msg);
	cr_expect_eq(p.chat, Q4KH_CHAT_DEEPSEEK3, "detected as %s", q4kh_chat_name(p.chat));
	cr_assert_eq(q4kh_prompt_tokenize(&p, t, "Hello", 1, &ids, &n, &err), 0, "%s", err.msg);
	cr_expect_eq(n, 4);
	cr_expect_eq(json_array_size(want), 4);
	for (size_t k = 0; k < n && k < json_array_size(want); k++)
		cr_expect_eq(ids[k], json_integer_value(json_array_get(want, k)), "id %zu", k);
	free(ids);
	p.parse_special = 0;
	cr_assert_eq(q4kh_prompt_tokenize(&p, t, "Hello", 1, &ids, &n, &err), 0, "%s", err.msg);
	cr_expect_eq(n, json_array_size(plain));
	cr_expect_eq(n, 12);
	free(ids);
	q4kh_tokenizer_free(t);
	q4kh_gguf_close(g);
	json_decref(doc);
}
