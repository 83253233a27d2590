/*
 * Chat formatting of a single user message, chosen from the model's
 * tokenizer.chat_template (a Jinja template we recognise, not execute).
 * Known: Gemma's turn format (<start_of_turn>user ... <end_of_turn>
 * <start_of_turn>model). The BOS token is not part of the returned text:
 * the tokenizer adds it.
 */
#ifndef Q4KH_CHAT_H
#define Q4KH_CHAT_H

#include "gguf.h"

enum q4kh_chat_format {
	Q4KH_CHAT_NONE = 0,  /* the file has no template: raw text */
	Q4KH_CHAT_UNKNOWN,   /* a template we do not recognise: raw text */
	Q4KH_CHAT_GEMMA
};

/* Which format G's template is. */
enum q4kh_chat_format q4kh_chat_detect(const struct q4kh_gguf *g);
/* "gemma", "none", "unknown". */
const char *q4kh_chat_name(enum q4kh_chat_format f);
/*
 * The prompt for USER in format F, ending with the model's turn opener;
 * raw USER for NONE and UNKNOWN. malloc()ed; NULL on out of memory.
 */
char *q4kh_chat_apply(enum q4kh_chat_format f, const char *user);

#endif
