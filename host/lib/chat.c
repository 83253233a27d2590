#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each format's markers in its Jinja template, as llama.cpp detects them. */
enum q4kh_chat_format q4kh_chat_detect(const struct q4kh_gguf *g)
{
	struct q4kh_gguf_str t;

	if (q4kh_gguf_get_str(g, "tokenizer.chat_template", &t, NULL) != 0)
		return Q4KH_CHAT_NONE;
	if (memmem(t.data, t.len, "<|im_start|>", 12))
		return Q4KH_CHAT_CHATML;
	if (memmem(t.data, t.len, "<start_of_turn>", 15))
		return Q4KH_CHAT_GEMMA;
	if (memmem(t.data, t.len, "<|start_header_id|>", 19) &&
	    memmem(t.data, t.len, "<|end_header_id|>", 17))
		return Q4KH_CHAT_LLAMA3;
	return Q4KH_CHAT_UNKNOWN;
}

const char *q4kh_chat_name(enum q4kh_chat_format f)
{
	switch (f) {
	case Q4KH_CHAT_GEMMA: return "gemma";
	case Q4KH_CHAT_CHATML: return "chatml";
	case Q4KH_CHAT_LLAMA3: return "llama3";
	case Q4KH_CHAT_UNKNOWN: return "unknown";
	default: return "none";
	}
}

int q4kh_chat_parse_special(enum q4kh_chat_format f)
{
	return f == Q4KH_CHAT_GEMMA || f == Q4KH_CHAT_CHATML ||
	       f == Q4KH_CHAT_LLAMA3;
}

/* llama.cpp's trim: ASCII whitespace at both ends. */
static int trimmed(const char *s, const char **start)
{
	size_t len = strlen(s);

	while (len && strchr(" \t\n\r\v\f", *s)) {
		s++;
		len--;
	}
	while (len && strchr(" \t\n\r\v\f", s[len - 1]))
		len--;
	*start = s;
	return (int)len;
}

/* Gemma has no system turn: its text goes before the next user message. */
static void gemma(FILE *f, const struct q4kh_chat_msg *msgs, size_t n)
{
	const char *sys = NULL, *s;
	int sys_len = 0, len;

	for (size_t i = 0; i < n; i++) {
		int model = strcmp(msgs[i].role, "assistant") == 0;
		if (strcmp(msgs[i].role, "system") == 0) {
			sys_len = trimmed(msgs[i].content, &sys);
			continue;
		}
		fprintf(f, "<start_of_turn>%s\n", model ? "model" : msgs[i].role);
		if (sys && sys_len && !model) {
			fprintf(f, "%.*s\n\n", sys_len, sys);
			sys = NULL;
		}
		len = trimmed(msgs[i].content, &s);
		fprintf(f, "%.*s<end_of_turn>\n", len, s);
	}
	fputs("<start_of_turn>model\n", f);
}

static void chatml(FILE *f, const struct q4kh_chat_msg *msgs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fprintf(f, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role,
		        msgs[i].content);
	fputs("<|im_start|>assistant\n", f);
}

static void llama3(FILE *f, const struct q4kh_chat_msg *msgs, size_t n)
{
	const char *s;
	int len;

	for (size_t i = 0; i < n; i++) {
		len = trimmed(msgs[i].content, &s);
		fprintf(f, "<|start_header_id|>%s<|end_header_id|>\n\n%.*s<|eot_id|>",
		        msgs[i].role, len, s);
	}
	fputs("<|start_header_id|>assistant<|end_header_id|>\n\n", f);
}

char *q4kh_chat_format_msgs(enum q4kh_chat_format f,
                            const struct q4kh_chat_msg *msgs, size_t n)
{
	char *out = NULL;
	size_t size = 0;
	FILE *mem = open_memstream(&out, &size);

	if (!mem)
		return NULL;
	switch (f) {
	case Q4KH_CHAT_GEMMA: gemma(mem, msgs, n); break;
	case Q4KH_CHAT_CHATML: chatml(mem, msgs, n); break;
	case Q4KH_CHAT_LLAMA3: llama3(mem, msgs, n); break;
	default:
		for (size_t i = 0; i < n; i++)
			fputs(msgs[i].content, mem);
	}
	if (fclose(mem) != 0) {
		free(out);
		return NULL;
	}
	return out;
}

char *q4kh_chat_apply(enum q4kh_chat_format f, const char *user)
{
	struct q4kh_chat_msg m = { "user", user };

	return q4kh_chat_format_msgs(f, &m, 1);
}
