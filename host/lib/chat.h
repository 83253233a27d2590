/*
 * Chat formatting, chosen from the model's tokenizer.chat_template (a Jinja
 * template we recognise by its markers, not execute), laid out as
 * llama.cpp's built-in templates lay it out (src/llama-chat.cpp):
 *  - Gemma: <start_of_turn>ROLE\n TRIMMED<end_of_turn>\n, "assistant" named
 *    "model", system text (trimmed) put before the next user message with
 *    "\n\n"; opener <start_of_turn>model\n.
 *  - ChatML (Qwen): <|im_start|>ROLE\n CONTENT<|im_end|>\n; opener
 *    <|im_start|>assistant\n.
 *  - Llama 3: <|start_header_id|>ROLE<|end_header_id|>\n\n TRIMMED<|eot_id|>;
 *    opener <|start_header_id|>assistant<|end_header_id|>\n\n.
 * (Spaces above only separate the parts.) The BOS token is not part of the
 * text: the tokenizer adds it. Pure functions, thread-safe.
 */
#ifndef Q4KH_CHAT_H
#define Q4KH_CHAT_H

#include <stddef.h>

#include "gguf.h"

enum q4kh_chat_format {
	Q4KH_CHAT_NONE = 0,  /* the file has no template: raw text */
	Q4KH_CHAT_UNKNOWN,   /* a template we do not recognise: raw text */
	Q4KH_CHAT_GEMMA,
	Q4KH_CHAT_CHATML,
	Q4KH_CHAT_LLAMA3
};

/* One message: role ("system", "user", "assistant") and its text. */
struct q4kh_chat_msg {
	const char *role;
	const char *content;
};

/* Which format G's template is. */
enum q4kh_chat_format q4kh_chat_detect(const struct q4kh_gguf *g);
/* "gemma", "chatml", "llama3", "none", "unknown". */
const char *q4kh_chat_name(enum q4kh_chat_format f);
/* 1 when text in format F carries special tokens, which the tokenizer must
 * then parse (q4kh_tokenize's parse_special); 0 for raw text. */
int q4kh_chat_parse_special(enum q4kh_chat_format f);
/*
 * MSGS[0..n) in format F, ending with the assistant's turn opener; for
 * NONE and UNKNOWN the contents concatenated. malloc()ed; NULL on out of
 * memory.
 */
char *q4kh_chat_format_msgs(enum q4kh_chat_format f,
                            const struct q4kh_chat_msg *msgs, size_t n);
/* The prompt for one USER message (q4kh_chat_format_msgs of one). */
char *q4kh_chat_apply(enum q4kh_chat_format f, const char *user);

#endif
