/*
 * How a user's text becomes the ids a model reads: one path for `run`,
 * `qa`, F2's probe and any later server, so that they all see the same
 * prompt for the same text.
 *
 *  1. Layout: the model file's chat template decides (chat.h), unless a
 *     family is named (--chat-template NAME, "none" for raw text). A file
 *     without a template, or with one no family matches, gets raw text;
 *     the unmatched template is worth a warning (q4kh_prompt_warning).
 *  2. Tokens: BOS when the vocabulary asks for it, and special tokens
 *     written in the text (<|im_start|>, <｜User｜>, ...) become single
 *     tokens, as llama.cpp's tools tokenize prompts by default; parse_special
 *     off (--no-parse-special) leaves control tokens as plain text.
 */
#ifndef Q4KH_PROMPT_H
#define Q4KH_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "error.h"
#include "gguf.h"
#include "tokenizer.h"

struct q4kh_prompt {
	enum q4kh_chat_format chat; /* NONE and UNKNOWN: raw text */
	int parse_special;
	char start[96]; /* UNKNOWN: the template's first characters, escaped */
};

/* The family called NAME (--chat-template NAME): q4kh_chat_from_name, or
 * -1 with err naming every family. */
int q4kh_prompt_family(const char *name, enum q4kh_chat_format *out,
                       struct q4kh_error *err);

/*
 * The layout for model file G: family NAME when not NULL (a name
 * q4kh_chat_from_name takes), else the file's template. -1 with err
 * (q4kh_prompt_family's) when NAME is none of them.
 */
int q4kh_prompt_init(struct q4kh_prompt *p, const struct q4kh_gguf *g,
                     const char *name, int parse_special,
                     struct q4kh_error *err);

/* One line saying the file's template was not recognised, naming its
 * first characters, into BUF (CAP bytes); NULL when there is nothing to
 * say. */
const char *q4kh_prompt_warning(const struct q4kh_prompt *p, char *buf,
                                size_t cap);

/*
 * TEXT as the model reads it: one user message in P's layout followed by
 * the assistant's opener when CHAT, else TEXT as it is; BOS added when the
 * vocabulary asks for it; special tokens parsed when P says so. *ids is
 * malloc()ed. -1 with err.
 */
int q4kh_prompt_tokenize(const struct q4kh_prompt *p,
                         const struct q4kh_tokenizer *t, const char *text,
                         int chat, int32_t **ids, size_t *n,
                         struct q4kh_error *err);

/*
 * MSGS[0..n) laid out in P's family with the assistant's opener (a chat
 * request of any number of turns), then tokenized as q4kh_prompt_tokenize
 * does. *ids is malloc()ed. -1 with err.
 */
int q4kh_prompt_tokenize_msgs(const struct q4kh_prompt *p,
                              const struct q4kh_tokenizer *t,
                              const struct q4kh_chat_msg *msgs, size_t n,
                              int32_t **ids, size_t *n_ids, struct q4kh_error *err);

#endif
