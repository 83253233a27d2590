/*
 * Which chat family a template is, told by the markers llama.cpp tests for
 * (src/llama-chat.cpp, llm_chat_detect_template) in the same order, since
 * one template often holds several families' markers (a Phi 4 template has
 * ChatML's <|im_start|> too); and the families' names, llama.cpp's.
 */
#include "chat.h"

#include <stdio.h>
#include <string.h>

/* Indexed by enum q4kh_chat_format. DOTS1 has no name in llama.cpp (it is
 * only detected); "dots1" is ours. */
static const char *const names[Q4KH_CHAT_COUNT] = {
	[Q4KH_CHAT_NONE] = "none",
	[Q4KH_CHAT_UNKNOWN] = "unknown",
	[Q4KH_CHAT_CHATML] = "chatml",
	[Q4KH_CHAT_LLAMA2] = "llama2",
	[Q4KH_CHAT_LLAMA2_SYS] = "llama2-sys",
	[Q4KH_CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
	[Q4KH_CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
	[Q4KH_CHAT_MISTRAL_V1] = "mistral-v1",
	[Q4KH_CHAT_MISTRAL_V3] = "mistral-v3",
	[Q4KH_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
	[Q4KH_CHAT_MISTRAL_V7] = "mistral-v7",
	[Q4KH_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
	[Q4KH_CHAT_PHI3] = "phi3",
	[Q4KH_CHAT_PHI4] = "phi4",
	[Q4KH_CHAT_FALCON3] = "falcon3",
	[Q4KH_CHAT_ZEPHYR] = "zephyr",
	[Q4KH_CHAT_MONARCH] = "monarch",
	[Q4KH_CHAT_GEMMA] = "gemma",
	[Q4KH_CHAT_ORION] = "orion",
	[Q4KH_CHAT_OPENCHAT] = "openchat",
	[Q4KH_CHAT_VICUNA] = "vicuna",
	[Q4KH_CHAT_VICUNA_ORCA] = "vicuna-orca",
	[Q4KH_CHAT_DEEPSEEK] = "deepseek",
	[Q4KH_CHAT_DEEPSEEK2] = "deepseek2",
	[Q4KH_CHAT_DEEPSEEK3] = "deepseek3",
	[Q4KH_CHAT_DEEPSEEK_OCR] = "deepseek-ocr",
	[Q4KH_CHAT_COMMAND_R] = "command-r",
	[Q4KH_CHAT_LLAMA3] = "llama3",
	[Q4KH_CHAT_CHATGLM3] = "chatglm3",
	[Q4KH_CHAT_CHATGLM4] = "chatglm4",
	[Q4KH_CHAT_GLMEDGE] = "glmedge",
	[Q4KH_CHAT_MINICPM] = "minicpm",
	[Q4KH_CHAT_EXAONE3] = "exaone3",
	[Q4KH_CHAT_EXAONE4] = "exaone4",
	[Q4KH_CHAT_EXAONE_MOE] = "exaone-moe",
	[Q4KH_CHAT_RWKV_WORLD] = "rwkv-world",
	[Q4KH_CHAT_GRANITE] = "granite",
	[Q4KH_CHAT_GRANITE_4_0] = "granite-4.0",
	[Q4KH_CHAT_GRANITE_4_1] = "granite-4.1",
	[Q4KH_CHAT_GIGACHAT] = "gigachat",
	[Q4KH_CHAT_MEGREZ] = "megrez",
	[Q4KH_CHAT_YANDEX] = "yandex",
	[Q4KH_CHAT_BAILING] = "bailing",
	[Q4KH_CHAT_BAILING_THINK] = "bailing-think",
	[Q4KH_CHAT_BAILING2] = "bailing2",
	[Q4KH_CHAT_LLAMA4] = "llama4",
	[Q4KH_CHAT_SMOLVLM] = "smolvlm",
	[Q4KH_CHAT_DOTS1] = "dots1",
	[Q4KH_CHAT_HUNYUAN_MOE] = "hunyuan-moe",
	[Q4KH_CHAT_GPT_OSS] = "gpt-oss",
	[Q4KH_CHAT_HUNYUAN_DENSE] = "hunyuan-dense",
	[Q4KH_CHAT_HUNYUAN_VL] = "hunyuan-vl",
	[Q4KH_CHAT_KIMI_K2] = "kimi-k2",
	[Q4KH_CHAT_SEED_OSS] = "seed_oss",
	[Q4KH_CHAT_GROK2] = "grok-2",
	[Q4KH_CHAT_PANGU_EMBED] = "pangu-embedded",
	[Q4KH_CHAT_SOLAR_OPEN] = "solar-open",
};

const char *q4kh_chat_name(enum q4kh_chat_format f)
{
	return (unsigned)f < Q4KH_CHAT_COUNT ? names[f] : "unknown";
}

/* "unknown" is what detection says, not a layout one can ask for. */
static int nameable(int f)
{
	return f != Q4KH_CHAT_UNKNOWN;
}

int q4kh_chat_from_name(const char *name, enum q4kh_chat_format *out)
{
	for (int f = 0; f < Q4KH_CHAT_COUNT; f++)
		if (nameable(f) && !strcmp(name, names[f])) {
			*out = (enum q4kh_chat_format)f;
			return 0;
		}
	return -1;
}

const char *q4kh_chat_names(char *buf, size_t cap)
{
	size_t w = 0;

	if (cap)
		buf[0] = '\0';
	for (int f = 0; f < Q4KH_CHAT_COUNT && w < cap; f++)
		if (nameable(f)) {
			int k = snprintf(buf + w, cap - w, "%s%s", w ? ", " : "", names[f]);
			w += k > 0 ? (size_t)k : 0;
		}
	return buf;
}

/* The template text being tested: has(t, "...") is llama.cpp's
 * tmpl_contains. */
struct text {
	const char *s;
	size_t len;
};

static int has(const struct text *t, const char *marker)
{
	return memmem(t->s, t->len, marker, strlen(marker)) != NULL;
}

/* The [INST] families: Mistral's official templates, else Llama 2's. */
static enum q4kh_chat_format inst_family(const struct text *t)
{
	if (has(t, "[SYSTEM_PROMPT]"))
		return Q4KH_CHAT_MISTRAL_V7;
	if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
		if (has(t, " [INST]"))
			return Q4KH_CHAT_MISTRAL_V1;
		if (has(t, "\"[INST]\""))
			return Q4KH_CHAT_MISTRAL_V3_TEKKEN;
		return Q4KH_CHAT_MISTRAL_V3;
	}
	if (has(t, "content.strip()"))
		return Q4KH_CHAT_LLAMA2_SYS_STRIP;
	if (has(t, "bos_token + '[INST]"))
		return Q4KH_CHAT_LLAMA2_SYS_BOS;
	if (has(t, "<<SYS>>"))
		return Q4KH_CHAT_LLAMA2_SYS;
	return Q4KH_CHAT_LLAMA2;
}

/* Families whose markers llama.cpp tests before Llama 3's. */
static enum q4kh_chat_format early_family(const struct text *t)
{
	if (has(t, "<|im_start|>"))
		return has(t, "<|im_sep|>") ? Q4KH_CHAT_PHI4
		       : has(t, "<end_of_utterance>") ? Q4KH_CHAT_SMOLVLM
		                                      : Q4KH_CHAT_CHATML;
	if ((t->len >= 7 && !memcmp(t->s, "mistral", 7)) || has(t, "[INST]"))
		return inst_family(t);
	if (has(t, "<|assistant|>") && has(t, "<|end|>"))
		return Q4KH_CHAT_PHI3;
	if (has(t, "[gMASK]<sop>"))
		return Q4KH_CHAT_CHATGLM4;
	if (has(t, "<|assistant|>") && has(t, "<|user|>")) {
		if (has(t, "<|tool_declare|>"))
			return Q4KH_CHAT_EXAONE_MOE;
		return has(t, "</s>") ? Q4KH_CHAT_FALCON3 : Q4KH_CHAT_GLMEDGE;
	}
	if (has(t, "<|{{ item['role'] }}|>") && has(t, "<|begin_of_image|>"))
		return Q4KH_CHAT_GLMEDGE;
	if (has(t, "<|user|>") && has(t, "<|endoftext|>"))
		return Q4KH_CHAT_ZEPHYR;
	if (has(t, "bos_token + message['role']"))
		return Q4KH_CHAT_MONARCH;
	if (has(t, "<start_of_turn>"))
		return Q4KH_CHAT_GEMMA;
	if (has(t, "'\\n\\nAssistant: ' + eos_token"))
		return Q4KH_CHAT_ORION;
	if (has(t, "GPT4 Correct "))
		return Q4KH_CHAT_OPENCHAT;
	if (has(t, "USER: ") && has(t, "ASSISTANT: "))
		return has(t, "SYSTEM: ") ? Q4KH_CHAT_VICUNA_ORCA : Q4KH_CHAT_VICUNA;
	if (has(t, "### Instruction:") && has(t, "<|EOT|>"))
		return Q4KH_CHAT_DEEPSEEK;
	if (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>"))
		return Q4KH_CHAT_COMMAND_R;
	return Q4KH_CHAT_UNKNOWN;
}

/* The Bailing families share <role>ASSISTANT</role>. */
static enum q4kh_chat_format bailing_family(const struct text *t)
{
	if (has(t, "'HUMAN'"))
		return Q4KH_CHAT_BAILING;
	if (has(t, "\"HUMAN\"") && has(t, "<think>"))
		return Q4KH_CHAT_BAILING_THINK;
	if (has(t, "<role>HUMAN</role>") && has(t, "<|role_end|>"))
		return Q4KH_CHAT_BAILING2;
	return Q4KH_CHAT_UNKNOWN;
}

/* From Llama 3's markers on, in llama.cpp's order. */
static enum q4kh_chat_format late_family(const struct text *t)
{
	if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
		return Q4KH_CHAT_LLAMA3;
	if (has(t, "[gMASK]sop"))
		return Q4KH_CHAT_CHATGLM3;
	if (has(t, "<用户>"))
		return Q4KH_CHAT_MINICPM;
	if (has(t, "'Assistant: ' + message['content'] + eos_token"))
		return Q4KH_CHAT_DEEPSEEK2;
	if (has(t, "<｜Assistant｜>") && has(t, "<｜User｜>") &&
	    has(t, "<｜end▁of▁sentence｜>"))
		return Q4KH_CHAT_DEEPSEEK3;
	if (has(t, "[|system|]") && has(t, "[|assistant|]") && has(t, "[|endofturn|]"))
		return has(t, "[|tool|]") ? Q4KH_CHAT_EXAONE4 : Q4KH_CHAT_EXAONE3;
	if (has(t, "rwkv-world") ||
	    has(t, "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"))
		return Q4KH_CHAT_RWKV_WORLD;
	if (has(t, "<|start_of_role|>")) {
		if (!has(t, "<tool_call>") && !has(t, "<tools>"))
			return Q4KH_CHAT_GRANITE;
		return has(t, "g4_default_system_message") ? Q4KH_CHAT_GRANITE_4_0
		                                           : Q4KH_CHAT_GRANITE_4_1;
	}
	if (has(t, "message['role'] + additional_special_tokens[0] + "
	           "message['content'] + additional_special_tokens[1]"))
		return Q4KH_CHAT_GIGACHAT;
	if (has(t, "<|role_start|>"))
		return Q4KH_CHAT_MEGREZ;
	if (has(t, " Ассистент:"))
		return Q4KH_CHAT_YANDEX;
	if (has(t, "<role>ASSISTANT</role>") && bailing_family(t) != Q4KH_CHAT_UNKNOWN)
		return bailing_family(t);
	if (has(t, "<|header_start|>") && has(t, "<|header_end|>"))
		return Q4KH_CHAT_LLAMA4;
	if (has(t, "<|endofuserprompt|>"))
		return Q4KH_CHAT_DOTS1;
	if (has(t, "<|extra_0|>") && has(t, "<|extra_4|>"))
		return Q4KH_CHAT_HUNYUAN_MOE;
	if (has(t, "<|start|>") && has(t, "<|channel|>"))
		return Q4KH_CHAT_GPT_OSS;
	if (has(t, "<｜hy_Assistant｜>") && has(t, "<｜hy_begin▁of▁sentence｜>"))
		return Q4KH_CHAT_HUNYUAN_VL;
	if (has(t, "<｜hy_Assistant｜>") && has(t, "<｜hy_place▁holder▁no▁3｜>"))
		return Q4KH_CHAT_HUNYUAN_DENSE;
	if (has(t, "<|im_assistant|>assistant<|im_middle|>"))
		return Q4KH_CHAT_KIMI_K2;
	if (has(t, "<seed:bos>"))
		return Q4KH_CHAT_SEED_OSS;
	if (has(t, "'Assistant: '  + message['content'] + '<|separator|>"))
		return Q4KH_CHAT_GROK2;
	if (has(t, "[unused9]系统：[unused10]"))
		return Q4KH_CHAT_PANGU_EMBED;
	if (has(t, "<|begin|>") && has(t, "<|end|>") && has(t, "<|content|>"))
		return Q4KH_CHAT_SOLAR_OPEN;
	return Q4KH_CHAT_UNKNOWN;
}

enum q4kh_chat_format q4kh_chat_detect_text(const char *tmpl, size_t len)
{
	struct text t = { tmpl, len };
	enum q4kh_chat_format f;

	/* a whole name; "none" is ours, not llama.cpp's, and stays text */
	for (int i = Q4KH_CHAT_CHATML; i < Q4KH_CHAT_COUNT; i++)
		if (i != Q4KH_CHAT_DOTS1 && strlen(names[i]) == len &&
		    !memcmp(tmpl, names[i], len))
			return (enum q4kh_chat_format)i;
	f = early_family(&t);
	return f != Q4KH_CHAT_UNKNOWN ? f : late_family(&t);
}

enum q4kh_chat_format q4kh_chat_detect(const struct q4kh_gguf *g)
{
	struct q4kh_gguf_str t;

	if (q4kh_gguf_get_str(g, "tokenizer.chat_template", &t, NULL) != 0)
		return Q4KH_CHAT_NONE;
	return q4kh_chat_detect_text(t.data, t.len);
}
