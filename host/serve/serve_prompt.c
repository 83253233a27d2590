/*
 * A request's text to token ids: chat messages through the model's chat
 * template, or a completion prompt as raw text, each with BOS, exactly as
 * q4khost run tokenizes -p (run applies the template to one user message;
 * run --raw takes the text as it is), through the shared prompt path
 * (prompt.h).
 */
#include "serve_prompt.h"

#include "prompt.h"

int serve_prompt_chat(const struct q4kh_gguf *g, const struct q4kh_tokenizer *tok,
                      const struct q4kh_chat_msg *msgs, size_t n, int32_t **ids,
                      size_t *n_ids, struct q4kh_error *err)
{
	struct q4kh_prompt p;

	return q4kh_prompt_init(&p, g, NULL, 1, err) ||
	               q4kh_prompt_tokenize_msgs(&p, tok, msgs, n, ids, n_ids, err)
	       ? -1
	       : 0;
}

int serve_prompt_text(const struct q4kh_tokenizer *tok, const char *text,
                      size_t len, int32_t **ids, size_t *n_ids,
                      struct q4kh_error *err)
{
	/* as run --raw: BOS when the vocabulary asks, special tokens parsed */
	return q4kh_tokenize(tok, text, len, 1, 1, ids, n_ids, err);
}
