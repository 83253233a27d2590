/*
 * What serve feeds the model for a request. Thread-safe (the tokenizer is
 * read-only).
 */
#ifndef Q4KH_SERVE_PROMPT_H
#define Q4KH_SERVE_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "error.h"
#include "gguf.h"
#include "tokenizer.h"

/* MSGS[0..n) in G's chat format with the assistant's opener, tokenized
 * with BOS. *ids is malloc()ed. -1 with err. */
int serve_prompt_chat(const struct q4kh_gguf *g, const struct q4kh_tokenizer *tok,
                      const struct q4kh_chat_msg *msgs, size_t n, int32_t **ids,
                      size_t *n_ids, struct q4kh_error *err);

/* LEN bytes of TEXT as they are, tokenized with BOS. */
int serve_prompt_text(const struct q4kh_tokenizer *tok, const char *text,
                      size_t len, int32_t **ids, size_t *n_ids,
                      struct q4kh_error *err);

#endif
