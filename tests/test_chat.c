/*
 * Chat templates against llama.cpp: tests/fixtures/chat-templates.json
 * (scripts/gen-chat-fixture.py) holds, for every family llama.cpp
 * recognises, a template text it detects as that family and the text its
 * llama_chat_apply_template makes of a dozen conversations (system turns,
 * several turns, tool roles, odd roles, no messages, Unicode), with and
 * without the assistant's opener; real templates (Qwen 3.5's shape,
 * DeepSeek-R1-Distill's own); and templates it does not recognise.
 * Then the prompt path (prompt.h) that run, qa and F2's probe share, on
 * tests/fixtures/vocab-pre.gguf (Qwen's ChatML vocabulary).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "gguf.h"
#include "helpers.h"
#include "prompt.h"
#include "tokenizer.h"

static json_t *load_fixture(void)
{
	char path[4096];
	json_error_t jerr;
	json_t *doc;

	snprintf(path, sizeof(path), "%s/tests/fixtures/chat-templates.json", test_srcdir());
	doc = json_load_file(path, 0, &jerr);
	cr_assert_not_null(doc, "%s:%d: %s", path, jerr.line, jerr.text);
	return doc;
}

static enum q4kh_chat_format detect(json_t *text)
{
	return q4kh_chat_detect_text(json_string_value(text), json_string_length(text));
}

/* Our text for one fixture case equals llama.cpp's; 1 when it differs. */
static int check_case(enum q4kh_chat_format f, const char *family, json_t *c)
{
	json_t *jm = json_object_get(c, "messages");
	size_t n = json_array_size(jm);
	struct q4kh_chat_msg *msgs = calloc(n + 1, sizeof(*msgs));
	const char *want = json_string_value(json_object_get(c, "text"));
	char *got;
	int differs;

	cr_assert_not_null(msgs);
	for (size_t k = 0; k < n; k++) {
		msgs[k].role = json_string_value(json_array_get(json_array_get(jm, k), 0));
		msgs[k].content = json_string_value(json_array_get(json_array_get(jm, k), 1));
	}
	got = q4kh_chat_format_msgs(f, msgs, n,
	                            json_is_true(json_object_get(c, "add_assistant")));
	cr_assert_not_null(got);
	differs = strcmp(got, want) != 0;
	cr_expect(!differs, "%s %s (opener %d):\n  ours:      \"%s\"\n  llama.cpp: \"%s\"", family,
	          json_string_value(json_object_get(c, "name")),
	          json_is_true(json_object_get(c, "add_assistant")), got, want);
	free(got);
	free(msgs);
	return differs;
}

Test(chat, every_family_matches_llama_cpp)
{
	json_t *doc = load_fixture(), *fam;
	size_t i, cases = 0, bad = 0;

	cr_assert_geq(json_array_size(json_object_get(doc, "families")), 55);
	json_array_foreach(json_object_get(doc, "families"), i, fam) {
		const char *family = json_string_value(json_object_get(fam, "family"));
		enum q4kh_chat_format by_name, f = detect(json_object_get(fam, "template"));
		size_t k;
		json_t *c;

		cr_assert_eq(q4kh_chat_from_name(family, &by_name), 0, "no family %s", family);
		cr_expect_eq(f, by_name, "%s: its template is detected as %s", family,
		             q4kh_chat_name(f));
		json_array_foreach(json_object_get(fam, "cases"), k, c) {
			bad += check_case(by_name, family, c);
			cases++;
		}
	}
	fprintf(stderr, "chat templates: %zu families, %zu cases, %zu differ from llama.cpp\n", i,
	        cases, bad);
	json_decref(doc);
}

Test(chat, real_templates_are_detected)
{
	json_t *doc = load_fixture(), *d;
	size_t i;

	json_array_foreach(json_object_get(doc, "detect"), i, d) {
		enum q4kh_chat_format want;
		const char *family = json_string_value(json_object_get(d, "family"));

		cr_assert_eq(q4kh_chat_from_name(family, &want), 0);
		cr_expect_eq(detect(json_object_get(d, "template")), want, "%s is not %s",
		             json_string_value(json_object_get(d, "name")), family);
	}
	cr_expect_geq(i, 1);
	json_decref(doc);
}

Test(chat, unrecognised_templates_are_unknown)
{
	json_t *doc = load_fixture(), *t;
	size_t i;

	json_array_foreach(json_object_get(doc, "unknown"), i, t)
		cr_expect_eq(detect(t), Q4KH_CHAT_UNKNOWN, "\"%s\" is detected as %s",
		             json_string_value(t), q4kh_chat_name(detect(t)));
	json_decref(doc);
}

Test(chat, names_round_trip)
{
	char names[2048], *save = NULL;
	enum q4kh_chat_format f;
	size_t n = 0;

	q4kh_chat_names(names, sizeof(names));
	for (char *w = strtok_r(names, ", ", &save); w; w = strtok_r(NULL, ", ", &save), n++) {
		cr_assert_eq(q4kh_chat_from_name(w, &f), 0, "%s", w);
		cr_expect_str_eq(q4kh_chat_name(f), w);
	}
	cr_expect_eq(n, Q4KH_CHAT_COUNT - 1); /* all but "unknown" */
	cr_expect_eq(q4kh_chat_from_name("unknown", &f), -1);
	cr_expect_eq(q4kh_chat_from_name("ChatML", &f), -1);
	cr_expect_eq(q4kh_chat_from_name("none", &f), 0);
	cr_expect_eq(f, Q4KH_CHAT_NONE);
	/* "none" names our raw layout, never a template text */
	cr_expect_eq(q4kh_chat_detect_text("none", 4), Q4KH_CHAT_UNKNOWN);
	/* a name cut short is not a name */
	cr_expect_eq(q4kh_chat_detect_text("chatml", 5), Q4KH_CHAT_UNKNOWN);
	/* the list is cut to fit, never overrun */
	cr_expect_eq(strlen(q4kh_chat_names(names, 8)), 7);
}

/* The tiny models' own templates are recognised from the files. */
Test(chat, detects_the_tiny_models_templates)
{
	static const struct {
		const char *arch;
		enum q4kh_chat_format f;
	} want[] = { { "llama", Q4KH_CHAT_LLAMA3 }, { "qwen2", Q4KH_CHAT_CHATML } };

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char path[4096];
		struct q4kh_error err = { { 0 } };
		struct q4kh_gguf *g = NULL;

		snprintf(path, sizeof(path), "%s/tests/fixtures/tiny-%s.gguf", test_srcdir(),
		         want[i].arch);
		cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
		cr_expect_eq(q4kh_chat_detect(g), want[i].f, "%s", want[i].arch);
		q4kh_gguf_close(g);
	}
}

/* --- the prompt path ------------------------------------------------------ */

/* vocab-pre.gguf with tokenizer.chat_template TMPL; *t its tokenizer. */
static struct q4kh_gguf *open_vocab(const char *tmpl, struct q4kh_tokenizer **t)
{
	char src[4096], *path;
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;

	snprintf(src, sizeof(src), "%s/tests/fixtures/vocab-pre.gguf", test_srcdir());
	path = test_vocab_gguf(src, "tokenizer.chat_template", tmpl);
	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenizer_load(g, t, &err), 0, "%s", err.msg);
	free(path);
	return g;
}

static size_t prompt_ids(const struct q4kh_prompt *p, const struct q4kh_tokenizer *t,
                         const char *text, int chat, int32_t **ids)
{
	struct q4kh_error err = { { 0 } };
	size_t n;

	cr_assert_eq(q4kh_prompt_tokenize(p, t, text, chat, ids, &n, &err), 0, "%s", err.msg);
	return n;
}

/* The file's ChatML template lays the text out and its markers are single
 * tokens; --no-parse-special leaves them as text. */
Test(prompt, file_template_and_special_tokens)
{
	struct q4kh_tokenizer *t;
	struct q4kh_gguf *g = open_vocab("{{ '<|im_start|>' + m.role }}", &t);
	struct q4kh_error err = { { 0 } };
	struct q4kh_prompt p;
	char warning[512];
	int32_t *ids, im_start = q4kh_tokenizer_find(t, "<|im_start|>");
	size_t n;

	cr_assert_eq(q4kh_prompt_init(&p, g, NULL, 1, &err), 0, "%s", err.msg);
	cr_expect_eq(p.chat, Q4KH_CHAT_CHATML);
	cr_expect_null(q4kh_prompt_warning(&p, warning, sizeof(warning)));
	n = prompt_ids(&p, t, "Hi", 1, &ids);
	cr_assert_geq(n, 3);
	cr_expect_eq(ids[0], im_start); /* no BOS: Qwen's vocabulary adds none */
	free(ids);
	/* raw text (a case without "chat") still parses the specials in it */
	n = prompt_ids(&p, t, "<|im_start|>", 0, &ids);
	cr_expect_eq(n, 1);
	cr_expect_eq(ids[0], im_start);
	free(ids);
	p.parse_special = 0;
	n = prompt_ids(&p, t, "<|im_start|>", 0, &ids);
	cr_expect_gt(n, 1);
	cr_expect_neq(ids[0], im_start);
	free(ids);
	q4kh_tokenizer_free(t);
	q4kh_gguf_close(g);
}

/* A named family replaces the file's; "none" is raw text; an unknown name
 * is refused with the names listed. */
Test(prompt, named_family_overrides_the_file)
{
	struct q4kh_tokenizer *t;
	struct q4kh_gguf *g = open_vocab("{{ '<|im_start|>' + m.role }}", &t);
	struct q4kh_error err = { { 0 } };
	struct q4kh_prompt p;
	enum q4kh_chat_format f;
	int32_t *ids, *raw;
	size_t n;

	cr_assert_eq(q4kh_prompt_init(&p, g, "llama3", 1, &err), 0, "%s", err.msg);
	cr_expect_eq(p.chat, Q4KH_CHAT_LLAMA3);
	cr_assert_eq(q4kh_prompt_init(&p, g, "none", 1, &err), 0, "%s", err.msg);
	cr_expect_eq(p.chat, Q4KH_CHAT_NONE);
	n = prompt_ids(&p, t, "Hi", 1, &ids);
	cr_expect_eq(n, prompt_ids(&p, t, "Hi", 0, &raw)); /* no layout around it */
	cr_expect_eq(ids[0], raw[0]);
	free(ids);
	free(raw);
	cr_expect_eq(q4kh_prompt_init(&p, g, "ChatML\n", 1, &err), -1);
	cr_expect(strstr(err.msg, "\"ChatML\\x0a\"") && strstr(err.msg, "deepseek3") &&
	          strstr(err.msg, "solar-open") && !strchr(err.msg, '\n'), "%s", err.msg);
	cr_expect_eq(q4kh_prompt_family("nope", &f, &err), -1);
	q4kh_tokenizer_free(t);
	q4kh_gguf_close(g);
}

/* A template no family matches: raw text, and one warning line that shows
 * its start, escaped. */
Test(prompt, unknown_template_is_a_one_line_warning)
{
	struct q4kh_tokenizer *t;
	struct q4kh_gguf *g = open_vocab("{% for m in messages %}\n{{ m.content }}\xc3\xa9 and "
	                                 "a long tail that the warning leaves out",
	                                 &t);
	struct q4kh_error err = { { 0 } };
	struct q4kh_prompt p;
	char warning[512];
	const char *w;

	cr_assert_eq(q4kh_prompt_init(&p, g, NULL, 1, &err), 0, "%s", err.msg);
	cr_expect_eq(p.chat, Q4KH_CHAT_UNKNOWN);
	w = q4kh_prompt_warning(&p, warning, sizeof(warning));
	cr_assert_not_null(w);
	cr_expect(strstr(w, "{% for m in messages %}\\x0a{{ m.content }}\\xc3\\xa9") &&
	          strstr(w, "...") && !strstr(w, "long tail") && !strchr(w, '\n') &&
	          strstr(w, "--chat-template"), "%s", w);
	q4kh_tokenizer_free(t);
	q4kh_gguf_close(g);
}
