/*
 * Chat formatting. The model file's tokenizer.chat_template (a Jinja
 * template) decides the layout: we recognise the template's family by the
 * markers llama.cpp looks for (src/llama-chat.cpp, llm_chat_detect_template),
 * not by running Jinja, and lay the messages out byte for byte as
 * llama.cpp's llama_chat_apply_template does for that family
 * (tests/test_chat.c holds each family to output recorded from llama.cpp).
 * A family can also be named (--chat-template NAME) with llama.cpp's names.
 *
 * The BOS token is never part of the text: the tokenizer adds it. The
 * special tokens in the text (<|im_start|>, <｜User｜>, ...) become single
 * tokens only when the text is tokenized with parse_special on.
 * Pure functions, thread-safe.
 */
#ifndef Q4KH_CHAT_H
#define Q4KH_CHAT_H

#include <stddef.h>

#include "gguf.h"

/* The families of llama.cpp's llm_chat_template, plus NONE and UNKNOWN. */
enum q4kh_chat_format {
	Q4KH_CHAT_NONE = 0, /* the file has no template: raw text */
	Q4KH_CHAT_UNKNOWN,  /* a template we do not recognise: raw text */
	Q4KH_CHAT_CHATML,
	Q4KH_CHAT_LLAMA2,
	Q4KH_CHAT_LLAMA2_SYS,
	Q4KH_CHAT_LLAMA2_SYS_BOS,
	Q4KH_CHAT_LLAMA2_SYS_STRIP,
	Q4KH_CHAT_MISTRAL_V1,
	Q4KH_CHAT_MISTRAL_V3,
	Q4KH_CHAT_MISTRAL_V3_TEKKEN,
	Q4KH_CHAT_MISTRAL_V7,
	Q4KH_CHAT_MISTRAL_V7_TEKKEN,
	Q4KH_CHAT_PHI3,
	Q4KH_CHAT_PHI4,
	Q4KH_CHAT_FALCON3,
	Q4KH_CHAT_ZEPHYR,
	Q4KH_CHAT_MONARCH,
	Q4KH_CHAT_GEMMA,
	Q4KH_CHAT_ORION,
	Q4KH_CHAT_OPENCHAT,
	Q4KH_CHAT_VICUNA,
	Q4KH_CHAT_VICUNA_ORCA,
	Q4KH_CHAT_DEEPSEEK,
	Q4KH_CHAT_DEEPSEEK2,
	Q4KH_CHAT_DEEPSEEK3,
	Q4KH_CHAT_DEEPSEEK_OCR,
	Q4KH_CHAT_COMMAND_R,
	Q4KH_CHAT_LLAMA3,
	Q4KH_CHAT_CHATGLM3,
	Q4KH_CHAT_CHATGLM4,
	Q4KH_CHAT_GLMEDGE,
	Q4KH_CHAT_MINICPM,
	Q4KH_CHAT_EXAONE3,
	Q4KH_CHAT_EXAONE4,
	Q4KH_CHAT_EXAONE_MOE,
	Q4KH_CHAT_RWKV_WORLD,
	Q4KH_CHAT_GRANITE,
	Q4KH_CHAT_GRANITE_4_0,
	Q4KH_CHAT_GRANITE_4_1,
	Q4KH_CHAT_GIGACHAT,
	Q4KH_CHAT_MEGREZ,
	Q4KH_CHAT_YANDEX,
	Q4KH_CHAT_BAILING,
	Q4KH_CHAT_BAILING_THINK,
	Q4KH_CHAT_BAILING2,
	Q4KH_CHAT_LLAMA4,
	Q4KH_CHAT_SMOLVLM,
	Q4KH_CHAT_DOTS1,
	Q4KH_CHAT_HUNYUAN_MOE,
	Q4KH_CHAT_GPT_OSS,
	Q4KH_CHAT_HUNYUAN_DENSE,
	Q4KH_CHAT_HUNYUAN_VL,
	Q4KH_CHAT_KIMI_K2,
	Q4KH_CHAT_SEED_OSS,
	Q4KH_CHAT_GROK2,
	Q4KH_CHAT_PANGU_EMBED,
	Q4KH_CHAT_SOLAR_OPEN,
	Q4KH_CHAT_COUNT
};

/* One message: role ("system", "user", "assistant", "tool", ...) and its
 * text. */
struct q4kh_chat_msg {
	const char *role;
	const char *content;
};

/* --- chat_detect.c ------------------------------------------------------- */

/*
 * The family of template text TMPL (LEN bytes), as llama.cpp's
 * llama_chat_apply_template takes its tmpl argument: a family name
 * (q4kh_chat_name) stands for that family, anything else is searched for
 * the markers of each family in llama.cpp's order. UNKNOWN when none
 * matches.
 */
enum q4kh_chat_format q4kh_chat_detect_text(const char *tmpl, size_t len);
/* The family of G's tokenizer.chat_template; NONE when it has none. */
enum q4kh_chat_format q4kh_chat_detect(const struct q4kh_gguf *g);
/*
 * The family llama.cpp calls NAME ("chatml", "llama3", "deepseek3", ...),
 * "none" for raw text; -1 for any other name. q4kh_chat_names lists them.
 */
int q4kh_chat_from_name(const char *name, enum q4kh_chat_format *out);
/* The name of F ("chatml"; "none", "unknown" for those two). */
const char *q4kh_chat_name(enum q4kh_chat_format f);
/* Every name q4kh_chat_from_name takes, ", "-separated, into BUF (CAP
 * bytes, cut to fit); returns BUF. For messages and --help. */
const char *q4kh_chat_names(char *buf, size_t cap);

/* --- chat.c --------------------------------------------------------------- */

/*
 * MSGS[0..n) laid out in family F; with ADD_ASSISTANT the assistant's turn
 * opener follows, for the families that have one (llama.cpp's add_ass).
 * For NONE and UNKNOWN: the contents concatenated. malloc()ed; NULL on
 * out of memory.
 */
char *q4kh_chat_format_msgs(enum q4kh_chat_format f,
                            const struct q4kh_chat_msg *msgs, size_t n,
                            int add_assistant);
/* The prompt for one USER message, with the assistant's opener. */
char *q4kh_chat_apply(enum q4kh_chat_format f, const char *user);

#endif
