/*
 * The chat families' layouts, as llama.cpp's llm_chat_apply_template
 * writes them (src/llama-chat.cpp). Most families fit one of two tables:
 * the same turn for every role with the role's name inside it, or one turn
 * per role name; the rest have a function each. "Trimmed" is llama.cpp's
 * trim: ASCII whitespace (isspace in the C locale) off both ends.
 */
#include "chat.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is(const char *role, const char *name)
{
	return strcmp(role, name) == 0;
}

/* S trimmed: its start, and its length into *len. */
static const char *trimmed(const char *s, size_t *len)
{
	size_t n = strlen(s);

	while (n && isspace((unsigned char)*s)) {
		s++;
		n--;
	}
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	*len = n;
	return s;
}

static void put_trimmed(FILE *f, const char *s)
{
	size_t len;

	s = trimmed(s, &len);
	fwrite(s, 1, len, f);
}

static void put_content(FILE *f, const char *s, int trim)
{
	if (trim)
		put_trimmed(f, s);
	else
		fputs(s, f);
}

/* --- every role alike: BEFORE role BETWEEN content AFTER ------------------ */

struct uniform {
	enum q4kh_chat_format f;
	const char *start; /* once, before the first message */
	const char *before, *between, *after;
	int trim;
	const char *opener; /* the assistant's turn, with add_assistant */
};

static const struct uniform uniform[] = {
	{ Q4KH_CHAT_CHATML, "", "<|im_start|>", "\n", "<|im_end|>\n", 0,
	  "<|im_start|>assistant\n" },
	{ Q4KH_CHAT_PHI3, "", "<|", "|>\n", "<|end|>\n", 0, "<|assistant|>\n" },
	{ Q4KH_CHAT_PHI4, "", "<|im_start|>", "<|im_sep|>", "<|im_end|>", 0,
	  "<|im_start|>assistant<|im_sep|>" },
	{ Q4KH_CHAT_FALCON3, "", "<|", "|>\n", "\n", 0, "<|assistant|>\n" },
	{ Q4KH_CHAT_ZEPHYR, "", "<|", "|>\n", "<|endoftext|>\n", 0, "<|assistant|>\n" },
	{ Q4KH_CHAT_LLAMA3, "", "<|start_header_id|>", "<|end_header_id|>\n\n",
	  "<|eot_id|>", 1, "<|start_header_id|>assistant<|end_header_id|>\n\n" },
	{ Q4KH_CHAT_LLAMA4, "", "<|header_start|>", "<|header_end|>\n\n", "<|eot|>", 1,
	  "<|header_start|>assistant<|header_end|>\n\n" },
	{ Q4KH_CHAT_CHATGLM3, "[gMASK]sop", "<|", "|>\n ", "", 0, "<|assistant|>" },
	{ Q4KH_CHAT_CHATGLM4, "[gMASK]<sop>", "<|", "|>\n", "", 0, "<|assistant|>\n" },
	{ Q4KH_CHAT_GLMEDGE, "", "<|", "|>\n", "", 0, "<|assistant|>" },
	{ Q4KH_CHAT_MEGREZ, "", "<|role_start|>", "<|role_end|>", "<|turn_end|>", 0,
	  "<|role_start|>assistant<|role_end|>" },
	{ Q4KH_CHAT_SOLAR_OPEN, "", "<|begin|>", "<|content|>", "<|end|>", 0,
	  "<|begin|>assistant" },
};

static void put_uniform(FILE *f, const struct uniform *u,
                        const struct q4kh_chat_msg *m, size_t n, int add)
{
	fputs(u->start, f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%s%s%s", u->before, m[i].role, u->between);
		put_content(f, m[i].content, u->trim);
		fputs(u->after, f);
	}
	if (add)
		fputs(u->opener, f);
}

/* --- one turn per role name ----------------------------------------------- */

struct role_turn {
	const char *role; /* NULL: any role not named before it; must be last */
	const char *before, *after;
	int trim;
};

struct by_role {
	enum q4kh_chat_format f;
	const char *start;
	struct role_turn turn[6]; /* ends at a NULL before or a NULL role */
	const char *opener;       /* NULL: the family has none */
};

#define EOS_DS "<｜end▁of▁sentence｜>"

static const struct by_role by_role[] = {
	{ Q4KH_CHAT_COMMAND_R, "",
	  { { "system", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>", 1 },
	    { "user", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>", 1 },
	    { "assistant", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>", 1 } },
	  "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>" },
	{ Q4KH_CHAT_VICUNA, "",
	  { { "system", "", "\n\n", 0 },
	    { "user", "USER: ", "\n", 0 },
	    { "assistant", "ASSISTANT: ", "</s>\n", 0 } },
	  "ASSISTANT:" },
	{ Q4KH_CHAT_VICUNA_ORCA, "",
	  { { "system", "SYSTEM: ", "\n", 0 },
	    { "user", "USER: ", "\n", 0 },
	    { "assistant", "ASSISTANT: ", "</s>\n", 0 } },
	  "ASSISTANT:" },
	{ Q4KH_CHAT_DEEPSEEK, "",
	  { { "system", "", "", 0 },
	    { "user", "### Instruction:\n", "\n", 0 },
	    { "assistant", "### Response:\n", "\n<|EOT|>\n", 0 } },
	  "### Response:\n" },
	{ Q4KH_CHAT_DEEPSEEK2, "",
	  { { "system", "", "\n\n", 0 },
	    { "user", "User: ", "\n\n", 0 },
	    { "assistant", "Assistant: ", EOS_DS, 0 } },
	  "Assistant:" },
	{ Q4KH_CHAT_DEEPSEEK3, "",
	  { { "system", "", "\n\n", 0 },
	    { "user", "<｜User｜>", "", 0 },
	    { "assistant", "<｜Assistant｜>", EOS_DS, 0 } },
	  "<｜Assistant｜>" },
	{ Q4KH_CHAT_EXAONE3, "",
	  { { "system", "[|system|]", "[|endofturn|]\n", 1 },
	    { "user", "[|user|]", "\n", 1 },
	    { "assistant", "[|assistant|]", "[|endofturn|]\n", 1 } },
	  "[|assistant|]" },
	{ Q4KH_CHAT_EXAONE4, "",
	  { { "system", "[|system|]", "[|endofturn|]\n", 1 },
	    { "user", "[|user|]", "\n", 1 },
	    { "assistant", "[|assistant|]", "[|endofturn|]\n", 1 },
	    { "tool", "[|tool|]", "[|endofturn|]\n", 1 } },
	  "[|assistant|]" },
	{ Q4KH_CHAT_EXAONE_MOE, "",
	  { { "system", "<|system|>\n", "<|endofturn|>\n", 1 },
	    { "user", "<|user|>\n", "<|endofturn|>\n", 1 },
	    { "assistant", "<|assistant|>\n", "<|endofturn|>\n", 1 },
	    { "tool", "<|tool|>\n", "<|endofturn|>\n", 1 } },
	  "<|assistant|>\n" },
	{ Q4KH_CHAT_YANDEX, "",
	  { { "user", " Пользователь: ", "\n\n", 0 },
	    { "assistant", " Ассистент: ", "\n\n", 0 } },
	  " Ассистент:[SEP]" },
	{ Q4KH_CHAT_DOTS1, "",
	  { { "system", "<|system|>", "<|endofsystem|>", 0 },
	    { "user", "<|userprompt|>", "<|endofuserprompt|>", 0 },
	    { NULL, "<|response|>", "<|endofresponse|>", 0 } },
	  "<|response|>" },
	{ Q4KH_CHAT_HUNYUAN_MOE, "",
	  { { "system", "<|startoftext|>", "<|extra_4|>", 0 },
	    { "assistant", "", "<|eos|>", 0 },
	    { NULL, "<|startoftext|>", "<|extra_0|>", 0 } },
	  NULL },
	{ Q4KH_CHAT_GROK2, "",
	  { { "system", "System: ", "<|separator|>\n\n", 1 },
	    { "user", "Human: ", "<|separator|>\n\n", 1 },
	    { "assistant", "Assistant: ", "<|separator|>\n\n", 0 } },
	  "Assistant:" },
	{ Q4KH_CHAT_SMOLVLM, "<|im_start|>",
	  { { "system", "", "\n\n", 0 },
	    { "user", "User: ", "<end_of_utterance>\n", 0 },
	    { NULL, "Assistant: ", "<end_of_utterance>\n", 0 } },
	  "Assistant:" },
	{ Q4KH_CHAT_KIMI_K2, "",
	  { { "system", "<|im_system|>system<|im_middle|>", "<|im_end|>", 0 },
	    { "user", "<|im_user|>user<|im_middle|>", "<|im_end|>", 0 },
	    { "assistant", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", 0 },
	    { "tool", "<|im_system|>tool<|im_middle|>", "<|im_end|>", 0 },
	    { NULL, "", "<|im_end|>", 0 } },
	  "<|im_assistant|>assistant<|im_middle|>" },
	{ Q4KH_CHAT_MINICPM, "",
	  { { "user", "<用户>", "<AI>", 1 },
	    { NULL, "", "", 1 } },
	  NULL },
};

/* The turn for ROLE, or NULL when the family writes nothing for it. */
static const struct role_turn *turn_for(const struct by_role *b, const char *role)
{
	for (size_t k = 0; k < 6 && b->turn[k].before; k++)
		if (!b->turn[k].role || is(role, b->turn[k].role))
			return &b->turn[k];
	return NULL;
}

static void put_by_role(FILE *f, const struct by_role *b,
                        const struct q4kh_chat_msg *m, size_t n, int add)
{
	fputs(b->start, f);
	for (size_t i = 0; i < n; i++) {
		const struct role_turn *t = turn_for(b, m[i].role);
		if (!t)
			continue;
		fputs(t->before, f);
		put_content(f, m[i].content, t->trim);
		fputs(t->after, f);
	}
	if (add && b->opener)
		fputs(b->opener, f);
}

/* --- families of their own ------------------------------------------------ */

/* Mistral v1, v3 and v3-tekken: [INST] opens a turn that an assistant
 * message closes; the system text sits inside the turn. No opener. */
static void mistral(FILE *f, enum q4kh_chat_format fmt,
                    const struct q4kh_chat_msg *m, size_t n)
{
	const char *lead = fmt == Q4KH_CHAT_MISTRAL_V1 ? " " : "";
	const char *trail = fmt == Q4KH_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
	int inside = 0;

	for (size_t i = 0; i < n; i++) {
		if (!inside) {
			fprintf(f, "%s[INST]%s", lead, trail);
			inside = 1;
		}
		if (is(m[i].role, "system")) {
			fprintf(f, "%s\n\n", m[i].content);
		} else if (is(m[i].role, "user")) {
			fprintf(f, "%s%s[/INST]", m[i].content, lead);
		} else {
			fputs(trail, f);
			put_content(f, m[i].content, fmt == Q4KH_CHAT_MISTRAL_V3);
			fputs("</s>", f);
			inside = 0;
		}
	}
}

/* Mistral v7 (a space after each tag) and v7-tekken (none). No opener. */
static void mistral_v7(FILE *f, enum q4kh_chat_format fmt,
                       const struct q4kh_chat_msg *m, size_t n)
{
	const char *sp = fmt == Q4KH_CHAT_MISTRAL_V7 ? " " : "";

	for (size_t i = 0; i < n; i++) {
		if (is(m[i].role, "system"))
			fprintf(f, "[SYSTEM_PROMPT]%s%s[/SYSTEM_PROMPT]", sp, m[i].content);
		else if (is(m[i].role, "user"))
			fprintf(f, "[INST]%s%s[/INST]", sp, m[i].content);
		else
			fprintf(f, "%s%s</s>", sp, m[i].content);
	}
}

/* Llama 2 and its variants: <<SYS>> blocks (all but plain llama2), <s>
 * before each later [INST] (sys-bos), trimmed contents (sys-strip). The
 * text starts inside the first turn. No opener. */
static void llama2(FILE *f, enum q4kh_chat_format fmt,
                   const struct q4kh_chat_msg *m, size_t n)
{
	int inside = 1;

	fputs("[INST] ", f);
	for (size_t i = 0; i < n; i++) {
		int strip = fmt == Q4KH_CHAT_LLAMA2_SYS_STRIP;
		if (!inside) {
			inside = 1;
			fputs(fmt == Q4KH_CHAT_LLAMA2_SYS_BOS ? "<s>[INST] " : "[INST] ", f);
		}
		if (is(m[i].role, "system")) {
			fputs(fmt == Q4KH_CHAT_LLAMA2 ? "" : "<<SYS>>\n", f);
			put_content(f, m[i].content, strip);
			fputs(fmt == Q4KH_CHAT_LLAMA2 ? "\n" : "\n<</SYS>>\n\n", f);
		} else if (is(m[i].role, "user")) {
			put_content(f, m[i].content, strip);
			fputs(" [/INST]", f);
		} else {
			put_content(f, m[i].content, strip);
			fputs("</s>", f);
			inside = 0;
		}
	}
}

/* The system messages of M[from, to) run together (trimmed when TRIM):
 * Gemma and Orion have no system turn and put that text into the next user
 * message. Returns its length; writes it to F when F is not NULL. */
static size_t put_pending_system(FILE *f, const struct q4kh_chat_msg *m,
                                 size_t from, size_t to, int trim)
{
	size_t len = 0;

	for (size_t k = from; k < to; k++) {
		const char *s = m[k].content;
		size_t n = strlen(s);
		if (!is(m[k].role, "system"))
			continue;
		if (trim)
			s = trimmed(s, &n);
		if (f)
			fwrite(s, 1, n, f);
		len += n;
	}
	return len;
}

/* Gemma: "assistant" is "model"; waiting system text (trimmed) opens the
 * next turn that is not the model's. */
static void gemma(FILE *f, const struct q4kh_chat_msg *m, size_t n, int add)
{
	size_t from = 0;

	for (size_t i = 0; i < n; i++) {
		const char *role = is(m[i].role, "assistant") ? "model" : m[i].role;
		if (is(m[i].role, "system"))
			continue;
		fprintf(f, "<start_of_turn>%s\n", role);
		if (!is(role, "model") && put_pending_system(NULL, m, from, i, 1)) {
			put_pending_system(f, m, from, i, 1);
			fputs("\n\n", f);
			from = i;
		}
		put_trimmed(f, m[i].content);
		fputs("<end_of_turn>\n", f);
	}
	if (add)
		fputs("<start_of_turn>model\n", f);
}

/* Orion: waiting system text opens the next user message. No opener. */
static void orion(FILE *f, const struct q4kh_chat_msg *m, size_t n)
{
	size_t from = 0;

	for (size_t i = 0; i < n; i++) {
		if (is(m[i].role, "system"))
			continue;
		if (!is(m[i].role, "user")) {
			fprintf(f, "%s</s>", m[i].content);
			continue;
		}
		fputs("Human: ", f);
		if (put_pending_system(NULL, m, from, i, 0)) {
			put_pending_system(f, m, from, i, 0);
			fputs("\n\n", f);
			from = i;
		}
		fprintf(f, "%s\n\nAssistant: </s>", m[i].content);
	}
}

/* OpenChat: "GPT4 Correct Role: " with the role's first byte uppercased. */
static void openchat(FILE *f, const struct q4kh_chat_msg *m, size_t n, int add)
{
	for (size_t i = 0; i < n; i++) {
		const char *r = m[i].role;
		if (is(r, "system")) {
			fprintf(f, "%s<|end_of_turn|>", m[i].content);
			continue;
		}
		fputs("GPT4 Correct ", f);
		if (*r) {
			fputc(toupper((unsigned char)*r), f);
			r++;
		}
		fprintf(f, "%s: %s<|end_of_turn|>", r, m[i].content);
	}
	if (add)
		fputs("GPT4 Correct Assistant:", f);
}

/* Monarch: <s> before every message but the first. */
static void monarch(FILE *f, const struct q4kh_chat_msg *m, size_t n, int add)
{
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s%s\n%s</s>\n", i ? "<s>" : "", m[i].role, m[i].content);
	if (add)
		fputs("<s>assistant\n", f);
}

/* GigaChat: a leading system message joins the <s> header. */
static void gigachat(FILE *f, const struct q4kh_chat_msg *m, size_t n, int add)
{
	size_t i = 0;

	fputs("<s>", f);
	if (n && is(m[0].role, "system"))
		fprintf(f, "%s<|message_sep|>", m[i++].content);
	for (; i < n; i++) {
		if (is(m[i].role, "user"))
			fprintf(f, "user<|role_sep|>%s<|message_sep|>available functions"
			           "<|role_sep|>[]<|message_sep|>",
			        m[i].content);
		else if (is(m[i].role, "assistant"))
			fprintf(f, "assistant<|role_sep|>%s<|message_sep|>", m[i].content);
	}
	if (add)
		fputs("assistant<|role_sep|>", f);
}

/* Bailing roles: "user" is HUMAN, any other role in capitals. */
static void put_bailing_role(FILE *f, const char *role)
{
	fputs("<role>", f);
	if (is(role, "user"))
		fputs("HUMAN", f);
	else
		for (const char *p = role; *p; p++)
			fputc(toupper((unsigned char)*p), f);
	fputs("</role>", f);
}

static void bailing(FILE *f, enum q4kh_chat_format fmt,
                    const struct q4kh_chat_msg *m, size_t n, int add)
{
	int v2 = fmt == Q4KH_CHAT_BAILING2;

	if (v2 && !(n && is(m[0].role, "system")))
		fputs("<role>SYSTEM</role>detailed thinking off<|role_end|>", f);
	for (size_t i = 0; i < n; i++) {
		put_bailing_role(f, m[i].role);
		fprintf(f, "%s%s", m[i].content, v2 ? "<|role_end|>" : "");
	}
	if (add)
		fputs(fmt == Q4KH_CHAT_BAILING_THINK ? "<role>ASSISTANT</role><think>"
		                                     : "<role>ASSISTANT</role>", f);
}

/* Granite 3.x names the role as given; 4.0 and 4.1 spell a tool call's
 * role "assistant". */
static void granite(FILE *f, enum q4kh_chat_format fmt,
                    const struct q4kh_chat_msg *m, size_t n, int add)
{
	for (size_t i = 0; i < n; i++) {
		int call = is(m[i].role, "assistant_tool_call");
		const char *role = call && fmt != Q4KH_CHAT_GRANITE ? "assistant" : m[i].role;
		fprintf(f, "<|start_of_role|>%s<|end_of_role|>%s%s<|end_of_text|>\n", role,
		        call ? "<|tool_call|>" : "", m[i].content);
	}
	if (add)
		fputs("<|start_of_role|>assistant<|end_of_role|>", f);
}

/* RWKV World: the opener follows a user message that ends the chat,
 * whatever add_assistant says. */
static void rwkv(FILE *f, const struct q4kh_chat_msg *m, size_t n)
{
	static const struct { const char *role, *label; } labels[] = {
		{ "system", "System: " }, { "user", "User: " }, { "assistant", "Assistant: " }
	};

	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < 3; k++) {
			if (!is(m[i].role, labels[k].role))
				continue;
			fputs(labels[k].label, f);
			put_trimmed(f, m[i].content);
			fputs("\n\n", f);
			if (k == 1 && i + 1 == n)
				fputs("Assistant:", f);
		}
}

/* gpt-oss (OpenAI's Harmony format). */
static void gpt_oss(FILE *f, const struct q4kh_chat_msg *m, size_t n, int add)
{
	for (size_t i = 0; i < n; i++)
		fprintf(f, "<|start|>%s<|message|>%s%s", m[i].role, m[i].content,
		        is(m[i].role, "assistant") ? "<|return|>" : "<|end|>");
	if (add)
		fputs("<|start|>assistant", f);
}

/* Seed-OSS: only the assistant's text is trimmed. */
static void seed_oss(FILE *f, const struct q4kh_chat_msg *m, size_t n, int add)
{
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "<seed:bos>%s\n", m[i].role);
		put_content(f, m[i].content, is(m[i].role, "assistant"));
		fputs("<seed:eos>", f);
	}
	if (add)
		fputs("<seed:bos>assistant\n", f);
}

#define HY_SYS_END "<｜hy_place▁holder▁no▁3｜>"

/* Hunyuan dense: a first system message ends with its own marker (and
 * still gets no turn). No opener. */
static void hunyuan_dense(FILE *f, const struct q4kh_chat_msg *m, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (i == 0 && is(m[i].role, "system"))
			fprintf(f, "%s" HY_SYS_END, m[i].content);
		if (is(m[i].role, "assistant"))
			fprintf(f, "<｜hy_Assistant｜>%s<｜hy_place▁holder▁no▁2｜>", m[i].content);
		else if (is(m[i].role, "user"))
			fprintf(f, "<｜hy_User｜>%s<｜hy_Assistant｜>", m[i].content);
	}
}

/* Hunyuan VL: each marker follows its message. No opener. */
static void hunyuan_vl(FILE *f, const struct q4kh_chat_msg *m, size_t n)
{
	fputs("<｜hy_begin▁of▁sentence｜>", f);
	for (size_t i = 0; i < n; i++) {
		if (i == 0 && is(m[i].role, "system"))
			fprintf(f, "%s" HY_SYS_END, m[i].content);
		else if (is(m[i].role, "user"))
			fprintf(f, "%s<｜hy_User｜>", m[i].content);
		else if (is(m[i].role, "assistant"))
			fprintf(f, "%s<｜hy_Assistant｜>", m[i].content);
	}
}

/* Pangu embedded: roles in Chinese; an empty system turn when the chat
 * does not start with one. */
static void pangu(FILE *f, const struct q4kh_chat_msg *m, size_t n, int add)
{
	static const struct { const char *role, *label; } labels[] = {
		{ "system", "系统" }, { "user", "用户" }, { "assistant", "助手" },
		{ "tool", "工具" }, { "function", "方法" },
	};

	for (size_t i = 0; i < n; i++) {
		if (i == 0 && !is(m[i].role, "system"))
			fputs("[unused9]系统：[unused10]", f);
		for (size_t k = 0; k < sizeof(labels) / sizeof(labels[0]); k++)
			if (is(m[i].role, labels[k].role))
				fprintf(f, "[unused9]%s：%s[unused10]", labels[k].label, m[i].content);
	}
	if (add)
		fputs("[unused9]助手：", f);
}

/* The families of their own; 1 when FMT is none of them. */
static int put_own(FILE *f, enum q4kh_chat_format fmt,
                   const struct q4kh_chat_msg *m, size_t n, int add)
{
	switch (fmt) {
	case Q4KH_CHAT_MISTRAL_V1:
	case Q4KH_CHAT_MISTRAL_V3:
	case Q4KH_CHAT_MISTRAL_V3_TEKKEN: mistral(f, fmt, m, n); return 0;
	case Q4KH_CHAT_MISTRAL_V7:
	case Q4KH_CHAT_MISTRAL_V7_TEKKEN: mistral_v7(f, fmt, m, n); return 0;
	case Q4KH_CHAT_LLAMA2:
	case Q4KH_CHAT_LLAMA2_SYS:
	case Q4KH_CHAT_LLAMA2_SYS_BOS:
	case Q4KH_CHAT_LLAMA2_SYS_STRIP: llama2(f, fmt, m, n); return 0;
	case Q4KH_CHAT_GEMMA: gemma(f, m, n, add); return 0;
	case Q4KH_CHAT_ORION: orion(f, m, n); return 0;
	case Q4KH_CHAT_OPENCHAT: openchat(f, m, n, add); return 0;
	case Q4KH_CHAT_MONARCH: monarch(f, m, n, add); return 0;
	case Q4KH_CHAT_GIGACHAT: gigachat(f, m, n, add); return 0;
	case Q4KH_CHAT_BAILING:
	case Q4KH_CHAT_BAILING_THINK:
	case Q4KH_CHAT_BAILING2: bailing(f, fmt, m, n, add); return 0;
	case Q4KH_CHAT_GRANITE:
	case Q4KH_CHAT_GRANITE_4_0:
	case Q4KH_CHAT_GRANITE_4_1: granite(f, fmt, m, n, add); return 0;
	case Q4KH_CHAT_RWKV_WORLD: rwkv(f, m, n); return 0;
	case Q4KH_CHAT_GPT_OSS: gpt_oss(f, m, n, add); return 0;
	case Q4KH_CHAT_SEED_OSS: seed_oss(f, m, n, add); return 0;
	case Q4KH_CHAT_HUNYUAN_DENSE: hunyuan_dense(f, m, n); return 0;
	case Q4KH_CHAT_HUNYUAN_VL: hunyuan_vl(f, m, n); return 0;
	case Q4KH_CHAT_PANGU_EMBED: pangu(f, m, n, add); return 0;
	default: return 1;
	}
}

static void put_msgs(FILE *f, enum q4kh_chat_format fmt,
                     const struct q4kh_chat_msg *m, size_t n, int add)
{
	for (size_t i = 0; i < sizeof(uniform) / sizeof(uniform[0]); i++)
		if (uniform[i].f == fmt) {
			put_uniform(f, &uniform[i], m, n, add);
			return;
		}
	for (size_t i = 0; i < sizeof(by_role) / sizeof(by_role[0]); i++)
		if (by_role[i].f == fmt) {
			put_by_role(f, &by_role[i], m, n, add);
			return;
		}
	if (put_own(f, fmt, m, n, add) == 0)
		return;
	/* none, unknown, and deepseek-ocr, which has no template */
	for (size_t i = 0; i < n; i++)
		fputs(m[i].content, f);
}

char *q4kh_chat_format_msgs(enum q4kh_chat_format f,
                            const struct q4kh_chat_msg *msgs, size_t n,
                            int add_assistant)
{
	char *out = NULL;
	size_t size = 0;
	FILE *mem = open_memstream(&out, &size);

	if (!mem)
		return NULL;
	put_msgs(mem, f, msgs, n, add_assistant);
	if (fclose(mem) != 0) {
		free(out);
		return NULL;
	}
	return out;
}

char *q4kh_chat_apply(enum q4kh_chat_format f, const char *user)
{
	struct q4kh_chat_msg m = { "user", user };

	return q4kh_chat_format_msgs(f, &m, 1, 1);
}
