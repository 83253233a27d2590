#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum q4kh_chat_format q4kh_chat_detect(const struct q4kh_gguf *g)
{
	struct q4kh_gguf_str t;

	if (q4kh_gguf_get_str(g, "tokenizer.chat_template", &t, NULL) != 0)
		return Q4KH_CHAT_NONE;
	if (memmem(t.data, t.len, "<start_of_turn>", 15))
		return Q4KH_CHAT_GEMMA;
	return Q4KH_CHAT_UNKNOWN;
}

const char *q4kh_chat_name(enum q4kh_chat_format f)
{
	switch (f) {
	case Q4KH_CHAT_GEMMA: return "gemma";
	case Q4KH_CHAT_UNKNOWN: return "unknown";
	default: return "none";
	}
}

/* Gemma's template trims the message. */
static void trim(const char **s, size_t *len)
{
	while (*len && strchr(" \t\n\r", **s)) {
		(*s)++;
		(*len)--;
	}
	while (*len && strchr(" \t\n\r", (*s)[*len - 1]))
		(*len)--;
}

char *q4kh_chat_apply(enum q4kh_chat_format f, const char *user)
{
	const char *msg = user;
	size_t len = strlen(user);
	char *out;

	if (f != Q4KH_CHAT_GEMMA)
		return strdup(user);
	trim(&msg, &len);
	if (asprintf(&out, "<start_of_turn>user\n%.*s<end_of_turn>\n<start_of_turn>model\n",
	             (int)len, msg) < 0)
		return NULL;
	return out;
}
