/*
 * A request's text to token ids: chat messages through the model's chat
 * template, or a completion prompt as raw text, each with BOS, exactly as
 * q4khost run tokenizes -p (run applies the template to one user message;
 * run --raw takes the text as it is). The template step is this one
 * function so that it can move to the shared prompt builder in one place.
 */
#include "serve_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "chat.h"

int serve_prompt_chat(const struct q4kh_gguf *g, const struct q4kh_tokenizer *tok,
                      const struct q4kh_chat_msg *msgs, size_t n, int32_t **ids,
                      size_t *n_ids, struct q4kh_error *err)
{
	enum q4kh_chat_format fmt = q4kh_chat_detect(g);
	char *text = q4kh_chat_format_msgs(fmt, msgs, n);
	int rc;

	if (!text)
		return q4kh_fail(err, "out of memory");
	rc = q4kh_tokenize(tok, text, strlen(text), 1, q4kh_chat_parse_special(fmt),
	                   ids, n_ids, err);
	free(text);
	return rc;
}

int serve_prompt_text(const struct q4kh_tokenizer *tok, const char *text,
                      size_t len, int32_t **ids, size_t *n_ids,
                      struct q4kh_error *err)
{
	return q4kh_tokenize(tok, text, len, 1, 0, ids, n_ids, err);
}
