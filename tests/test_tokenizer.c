/*
 * The tokenizer against llama.cpp: tests/fixtures/tokenizer-gemma3.json holds
 * llama.cpp's ids, detokenizations and pieces for the default Gemma 3 model
 * (written by scripts/gen-tokenizer-fixture.py through llama-cpp-python).
 * A small synthetic vocabulary checks the merge order and the errors by hand.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "helpers.h"
#include "tokenizer.h"

/* --- fixture access ------------------------------------------------------ */

static json_t *load_fixture(void)
{
	char path[4096];
	json_error_t jerr;
	json_t *doc;

	snprintf(path, sizeof(path), "%s/tests/fixtures/tokenizer-gemma3.json",
	         test_srcdir());
	doc = json_load_file(path, JSON_ALLOW_NUL, &jerr);
	cr_assert_not_null(doc, "%s:%d: %s", path, jerr.line, jerr.text);
	return doc;
}

/* Bytes of a hex string; *n gets the count. */
static char *unhex(const char *hex, size_t *n)
{
	size_t len = strlen(hex);
	char *out = malloc(len / 2 + 1);

	cr_assert_not_null(out);
	for (size_t i = 0; i + 1 < len; i += 2) {
		unsigned v;
		cr_assert_eq(sscanf(hex + i, "%2x", &v), 1, "bad hex %s", hex);
		out[i / 2] = (char)v;
	}
	*n = len / 2;
	return out;
}

/* A case's input: "text" (UTF-8) or "text_hex" (anything else). */
static char *case_text(json_t *c, size_t *n)
{
	json_t *s = json_object_get(c, "text");
	char *out;

	if (!s)
		return unhex(json_string_value(json_object_get(c, "text_hex")), n);
	*n = json_string_length(s);
	out = malloc(*n + 1);
	cr_assert_not_null(out);
	memcpy(out, json_string_value(s), *n);
	return out;
}

static struct q4kh_tokenizer *open_model_tokenizer(void)
{
	struct q4kh_error err = { "" };
	struct q4kh_gguf *g = NULL;
	struct q4kh_tokenizer *t = NULL;

	cr_assert_eq(q4kh_gguf_open(test_model_path(), &g, &err), 0, "%s",
	             err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), 0, "%s", err.msg);
	q4kh_gguf_close(g); /* the tokenizer keeps its own copies */
	return t;
}

/* Our detokenization: every piece with specials hidden, as llama.cpp's. */
static char *detokenize(const struct q4kh_tokenizer *t, const int32_t *ids,
                        size_t n, size_t *len)
{
	size_t cap = 64, w = 0;
	char *out = malloc(cap);

	cr_assert_not_null(out);
	for (size_t i = 0; i < n; i++) {
		size_t k = q4kh_token_to_piece(t, ids[i], 0, NULL, 0);
		while (w + k > cap)
			cap *= 2;
		out = realloc(out, cap);
		cr_assert_not_null(out);
		cr_assert_eq(q4kh_token_to_piece(t, ids[i], 0, out + w, k), k);
		w += k;
	}
	*len = w;
	return out;
}

/* --- Gemma 3 against llama.cpp ------------------------------------------- */

Test(gemma3, ids_match_llama_cpp)
{
	struct q4kh_tokenizer *t = open_model_tokenizer();
	json_t *doc = load_fixture(), *cases = json_object_get(doc, "cases"), *c;
	size_t i, bad = 0;

	cr_assert(json_array_size(cases) > 200);
	json_array_foreach(cases, i, c) {
		const char *name = json_string_value(json_object_get(c, "name"));
		json_t *want = json_object_get(c, "ids");
		struct q4kh_error err = { "" };
		int32_t *ids;
		size_t len, n, first = SIZE_MAX;
		char *text = case_text(c, &len);

		cr_assert_eq(q4kh_tokenize(t, text, len,
		                           json_is_true(json_object_get(c, "add_bos")),
		                           json_is_true(json_object_get(c, "parse_special")),
		                           &ids, &n, &err),
		             0, "%s: %s", name, err.msg);
		for (size_t k = 0; k < n && k < json_array_size(want); k++)
			if (ids[k] != json_integer_value(json_array_get(want, k))) {
				first = k;
				break;
			}
		if (first == SIZE_MAX && n != json_array_size(want))
			first = n < json_array_size(want) ? n : json_array_size(want);
		cr_expect_eq(first, SIZE_MAX,
		             "%s: %zu ids, llama.cpp %zu; first difference at %zu: "
		             "%d vs llama.cpp %lld",
		             name, n, json_array_size(want), first,
		             first < n ? ids[first] : -1,
		             (long long)json_integer_value(json_array_get(want, first)));
		bad += first != SIZE_MAX;
		free(ids);
		free(text);
	}
	cr_log_info("%zu of %zu cases match llama.cpp", i - bad, i);
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(gemma3, detokenization_matches_llama_cpp)
{
	struct q4kh_tokenizer *t = open_model_tokenizer();
	json_t *doc = load_fixture(), *cases = json_object_get(doc, "cases"), *c;
	size_t i, round_trips = 0;

	json_array_foreach(cases, i, c) {
		const char *name = json_string_value(json_object_get(c, "name"));
		json_t *jids = json_object_get(c, "ids");
		size_t n = json_array_size(jids), want_len, got_len, text_len;
		int32_t *ids = malloc((n + 1) * sizeof(*ids));
		char *want = unhex(json_string_value(json_object_get(c, "detok_hex")),
		                   &want_len);
		char *text = case_text(c, &text_len);
		char *got;

		for (size_t k = 0; k < n; k++)
			ids[k] = (int32_t)json_integer_value(json_array_get(jids, k));
		got = detokenize(t, ids, n, &got_len);
		cr_expect(got_len == want_len && memcmp(got, want, got_len) == 0,
		          "%s: detokenized to %zu bytes, llama.cpp %zu", name,
		          got_len, want_len);
		/* where llama.cpp's decoding gives the input back, ours must too */
		if (want_len == text_len && memcmp(want, text, text_len) == 0) {
			round_trips++;
			cr_expect(got_len == text_len && memcmp(got, text, text_len) == 0,
			          "%s: no round trip", name);
		}
		free(ids);
		free(want);
		free(text);
		free(got);
	}
	cr_log_info("%zu of %zu cases round-trip", round_trips, i);
	cr_expect(round_trips > 100);
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(gemma3, pieces_match_llama_cpp)
{
	struct q4kh_tokenizer *t = open_model_tokenizer();
	json_t *doc = load_fixture(), *pieces = json_object_get(doc, "pieces"), *p;
	size_t i;

	cr_assert(json_array_size(pieces) > 600);
	json_array_foreach(pieces, i, p) {
		int32_t id = (int32_t)json_integer_value(json_array_get(p, 0));
		for (int special = 0; special <= 1; special++) {
			size_t want_len, got_len;
			char *want = unhex(json_string_value(json_array_get(p, 1 + special)),
			                   &want_len);
			char buf[512];
			got_len = q4kh_token_to_piece(t, id, special, buf, sizeof(buf));
			cr_expect(got_len == want_len && memcmp(buf, want, got_len) == 0,
			          "token %d (show_special %d): %zu bytes, llama.cpp %zu",
			          id, special, got_len, want_len);
			free(want);
		}
	}
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(gemma3, special_ids_and_end_of_generation)
{
	struct q4kh_tokenizer *t = open_model_tokenizer();
	json_t *doc = load_fixture(), *eog = json_object_get(doc, "eog");
	int32_t n_vocab = q4kh_tokenizer_n_vocab(t);
	size_t found = 0;

	cr_assert_eq(n_vocab, json_integer_value(json_object_get(doc, "n_vocab")));
	cr_assert_eq(q4kh_tokenizer_bos(t),
	             json_integer_value(json_object_get(doc, "bos")));
	cr_assert_eq(q4kh_tokenizer_eos(t),
	             json_integer_value(json_object_get(doc, "eos")));
	for (int32_t id = 0; id < n_vocab; id++) {
		int want = 0;
		for (size_t k = 0; k < json_array_size(eog); k++)
			want |= json_integer_value(json_array_get(eog, k)) == id;
		cr_expect_eq(q4kh_tokenizer_is_eog(t, id), want, "token %d", id);
		found += want;
	}
	cr_assert_eq(found, json_array_size(eog));
	cr_assert_eq(q4kh_tokenizer_is_eog(t, -1), 0);
	cr_assert_eq(q4kh_tokenizer_is_eog(t, n_vocab), 0);
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

/* The ids llama.cpp gave <start_of_turn> and <end_of_turn> in the fixture's
 * parsed-special case are what find() must return. */
Test(gemma3, find_by_text)
{
	struct q4kh_tokenizer *t = open_model_tokenizer();
	json_t *doc = load_fixture(), *cases = json_object_get(doc, "cases"), *c;
	size_t i;

	json_array_foreach(cases, i, c) {
		json_t *ids = json_object_get(c, "ids");
		if (strcmp(json_string_value(json_object_get(c, "name")),
		           "sot_special") != 0)
			continue;
		cr_assert_eq(q4kh_tokenizer_find(t, "<start_of_turn>"),
		             json_integer_value(json_array_get(ids, 1)));
		cr_assert_eq(q4kh_tokenizer_find(t, "<end_of_turn>"),
		             json_integer_value(json_array_get(ids, 5)));
	}
	cr_assert_eq(q4kh_tokenizer_find(t, "no such token, surely"), -1);
	cr_assert_eq(q4kh_tokenizer_find(t, ""), -1);
	json_decref(doc);
	q4kh_tokenizer_free(t);
}

Test(gemma3, piece_is_cut_at_cap_and_unknown_ids_are_empty)
{
	struct q4kh_tokenizer *t = open_model_tokenizer();
	int32_t id = q4kh_tokenizer_find(t, "<start_of_turn>");
	char buf[8] = "xxxxxxxx";

	/* 15 bytes of text: the full length comes back, only cap are written */
	cr_assert_eq(q4kh_token_to_piece(t, id, 1, buf, 4), 15);
	cr_assert(memcmp(buf, "<staxxxx", 8) == 0);
	cr_assert_eq(q4kh_token_to_piece(t, id, 0, buf, sizeof(buf)), 0);
	cr_assert_eq(q4kh_token_to_piece(t, -1, 1, buf, sizeof(buf)), 0);
	cr_assert_eq(q4kh_token_to_piece(t, q4kh_tokenizer_n_vocab(t), 1, buf,
	                                 sizeof(buf)), 0);
	q4kh_tokenizer_free(t);
}

/* --- a synthetic vocabulary ---------------------------------------------- */

struct buf {
	unsigned char *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *data, size_t n)
{
	while (b->n + n > b->cap) {
		b->cap = b->cap ? 2 * b->cap : 256;
		b->p = realloc(b->p, b->cap);
		cr_assert_not_null(b->p);
	}
	memcpy(b->p + b->n, data, n);
	b->n += n;
}

/* GGUF is little-endian, as is every machine this runs on (checked below). */
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }

static void put_str(struct buf *b, const char *s)
{
	put_u64(b, strlen(s));
	put(b, s, strlen(s));
}

static void put_key(struct buf *b, const char *key, uint32_t type)
{
	put_str(b, key);
	put_u32(b, type);
}

struct vocab {
	const char *text;
	float score;
	int32_t type;
};

/*
 * A GGUF v3 file with no tensors and the tokenizer keys for VOCAB; MODEL is
 * tokenizer.ggml.model. bos 1, eos 2, no BOS added, no space prefix.
 */
static char *write_vocab(const char *model, const struct vocab *v, size_t n)
{
	struct buf b = { 0 };
	const char *dir = test_tmpdir();
	char *path = malloc(strlen(dir) + 16);
	uint32_t one = 1;

	cr_assert_eq(*(unsigned char *)&one, 1, "big-endian host");
	put(&b, "GGUF", 4);
	put_u32(&b, 3);
	put_u64(&b, 0); /* tensors */
	put_u64(&b, 8); /* key/value pairs */
	put_key(&b, "tokenizer.ggml.model", Q4KH_GGUF_STRING);
	put_str(&b, model);
	put_key(&b, "tokenizer.ggml.tokens", Q4KH_GGUF_ARRAY);
	put_u32(&b, Q4KH_GGUF_STRING);
	put_u64(&b, n);
	for (size_t i = 0; i < n; i++)
		put_str(&b, v[i].text);
	put_key(&b, "tokenizer.ggml.scores", Q4KH_GGUF_ARRAY);
	put_u32(&b, Q4KH_GGUF_FLOAT32);
	put_u64(&b, n);
	for (size_t i = 0; i < n; i++)
		put(&b, &v[i].score, 4);
	put_key(&b, "tokenizer.ggml.token_type", Q4KH_GGUF_ARRAY);
	put_u32(&b, Q4KH_GGUF_INT32);
	put_u64(&b, n);
	for (size_t i = 0; i < n; i++)
		put(&b, &v[i].type, 4);
	put_key(&b, "tokenizer.ggml.bos_token_id", Q4KH_GGUF_UINT32);
	put_u32(&b, 1);
	put_key(&b, "tokenizer.ggml.eos_token_id", Q4KH_GGUF_UINT32);
	put_u32(&b, 2);
	put_key(&b, "tokenizer.ggml.add_bos_token", Q4KH_GGUF_BOOL);
	put(&b, "\0", 1);
	put_key(&b, "tokenizer.ggml.add_space_prefix", Q4KH_GGUF_BOOL);
	put(&b, "\0", 1);
	while (b.n % 32)
		put(&b, "\0", 1);
	sprintf(path, "%s/v.gguf", dir);
	test_write_file(path, b.p, b.n);
	free(b.p);
	return path;
}

/* Ids: 0 <unk>, 1 <s>, 2 <e>, 3 a, 4 b, 5 c, 6 ab, 7 bc, 8 ca, 9 <0x7A>,
 * 10 ▁, 11 ▁a, 12 <ctl>, 13 "\n\n", 14 aa, 15 "\n". */
static const struct vocab synth[] = {
	{ "<unk>", 0, 2 },    { "<s>", 0, 3 },   { "<e>", 0, 3 },
	{ "a", -1, 1 },       { "b", -1, 1 },    { "c", -1, 1 },
	{ "ab", -3, 1 },      { "bc", -2, 1 },   { "ca", -6, 1 },
	{ "<0x7A>", 0, 6 },   { "\xe2\x96\x81", -1, 1 },
	{ "\xe2\x96\x81" "a", -4, 1 },           { "<ctl>", 0, 3 },
	{ "\n\n", 0, 4 },     { "aa", -2, 1 },   { "\n", 0, 4 },
};

static struct q4kh_tokenizer *synth_tokenizer(void)
{
	struct q4kh_error err = { "" };
	struct q4kh_gguf *g;
	struct q4kh_tokenizer *t;
	char *path = write_vocab("llama", synth, sizeof(synth) / sizeof(synth[0]));

	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), 0, "%s", err.msg);
	q4kh_gguf_close(g);
	free(path);
	return t;
}

static void expect_ids(const struct q4kh_tokenizer *t, const char *text,
                       int parse_special, const int32_t *want, size_t n_want)
{
	struct q4kh_error err = { "" };
	int32_t *ids;
	size_t n;

	cr_assert_eq(q4kh_tokenize(t, text, strlen(text), 1, parse_special, &ids,
	                           &n, &err), 0, "%s", err.msg);
	cr_expect_eq(n, n_want, "\"%s\": %zu ids, expected %zu", text, n, n_want);
	for (size_t i = 0; i < n && i < n_want; i++)
		cr_expect_eq(ids[i], want[i], "\"%s\": id %zu is %d, expected %d",
		             text, i, ids[i], want[i]);
	free(ids);
}

#define EXPECT_IDS(t, text, special, ...)                                     \
	do {                                                                  \
		const int32_t w_[] = { __VA_ARGS__ };                         \
		expect_ids(t, text, special, w_, sizeof(w_) / sizeof(w_[0])); \
	} while (0)

Test(synthetic, merges_by_score_then_leftmost)
{
	struct q4kh_tokenizer *t = synth_tokenizer();

	/* bc (-2) beats ab (-3), and a+bc is no token; no BOS: the file's
	 * add_bos_token is false */
	EXPECT_IDS(t, "abc", 0, 3, 7);
	/* ab alone */
	EXPECT_IDS(t, "ab", 0, 6);
	/* aa ties at -2 at positions 0 and 1: the leftmost pair merges */
	EXPECT_IDS(t, "aaa", 0, 14, 3);
	/* a space becomes U+2581; ▁a (-4) is the only pair */
	EXPECT_IDS(t, "c a", 0, 5, 11);
	q4kh_tokenizer_free(t);
}

Test(synthetic, byte_fallback_and_specials)
{
	struct q4kh_tokenizer *t = synth_tokenizer();
	struct q4kh_error err = { "" };
	int32_t *ids;
	size_t n;

	/* z has only a byte token */
	EXPECT_IDS(t, "az", 0, 3, 9);
	/* user-defined "\n\n" always splits out, longest first */
	EXPECT_IDS(t, "a\n\n\nb", 0, 3, 13, 15, 4);
	/* control tokens only with parse_special */
	EXPECT_IDS(t, "a<ctl>", 1, 3, 12);
	/* q has no token and no byte token: an error, not a crash */
	cr_assert_eq(q4kh_tokenize(t, "q", 1, 0, 0, &ids, &n, &err), -1);
	cr_assert(strstr(err.msg, "0x71"), "%s", err.msg);
	q4kh_tokenizer_free(t);
}

Test(synthetic, rejects_other_tokenizer_models)
{
	struct q4kh_error err = { "" };
	struct q4kh_gguf *g;
	struct q4kh_tokenizer *t = (void *)1;
	char *path = write_vocab("bert", synth, 3);

	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), -1);
	cr_assert_null(t);
	cr_assert(strstr(err.msg, "\"bert\"") && strstr(err.msg, path), "%s",
	          err.msg);
	q4kh_gguf_close(g);
	free(path);
}

/* A vocabulary with no special token at all (found by fuzz-gguf: the
 * special-token index was sorted through a null pointer). */
Test(synthetic, vocabulary_without_special_tokens)
{
	static const struct vocab plain[] = {
		{ "a", -1, 1 }, { "b", -1, 1 }, { "ab", -2, 1 },
	};
	struct q4kh_error err = { "" };
	struct q4kh_gguf *g;
	struct q4kh_tokenizer *t;
	char *path = write_vocab("llama", plain, 3);

	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, &t, &err), 0, "%s", err.msg);
	q4kh_gguf_close(g);
	EXPECT_IDS(t, "aab", 1, 0, 2);
	q4kh_tokenizer_free(t);
	free(path);
}
