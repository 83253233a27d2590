#include "prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int q4kh_prompt_family(const char *name, enum q4kh_chat_format *out,
                       struct q4kh_error *err)
{
	char shown[272], names[1024];

	if (q4kh_chat_from_name(name, out) == 0)
		return 0;
	return q4kh_fail(err, "--chat-template \"%s\": no such family (known: %s)",
	                 q4kh_show(shown, sizeof(shown), name, strlen(name), 64, 0),
	                 q4kh_chat_names(names, sizeof(names)));
}

int q4kh_prompt_init(struct q4kh_prompt *p, const struct q4kh_gguf *g,
                     const char *name, int parse_special,
                     struct q4kh_error *err)
{
	struct q4kh_gguf_str t;

	memset(p, 0, sizeof(*p));
	p->parse_special = parse_special;
	if (name)
		return q4kh_prompt_family(name, &p->chat, err);
	p->chat = q4kh_chat_detect(g);
	if (p->chat == Q4KH_CHAT_UNKNOWN &&
	    q4kh_gguf_get_str(g, "tokenizer.chat_template", &t, NULL) == 0)
		q4kh_show(p->start, sizeof(p->start), t.data, t.len, 48, 1);
	return 0;
}

const char *q4kh_prompt_warning(const struct q4kh_prompt *p, char *buf,
                                size_t cap)
{
	if (p->chat != Q4KH_CHAT_UNKNOWN)
		return NULL;
	snprintf(buf, cap,
	         "the model's chat template is none that q4khost knows (it starts \"%s\"): "
	         "prompts go in as raw text; --chat-template NAME picks a layout",
	         p->start);
	return buf;
}

/* Tokenize PROMPT (malloc()ed, freed here; NULL: out of memory) as P says. */
static int tokenize(const struct q4kh_prompt *p, const struct q4kh_tokenizer *t,
                    char *prompt, int32_t **ids, size_t *n, struct q4kh_error *err)
{
	int rc;

	if (!prompt)
		return q4kh_fail(err, "out of memory");
	rc = q4kh_tokenize(t, prompt, strlen(prompt), 1, p->parse_special, ids, n, err);
	free(prompt);
	return rc;
}

int q4kh_prompt_tokenize(const struct q4kh_prompt *p,
                         const struct q4kh_tokenizer *t, const char *text,
                         int chat, int32_t **ids, size_t *n,
                         struct q4kh_error *err)
{
	return tokenize(p, t, chat ? q4kh_chat_apply(p->chat, text) : strdup(text), ids, n,
	                err);
}

int q4kh_prompt_tokenize_msgs(const struct q4kh_prompt *p,
                              const struct q4kh_tokenizer *t,
                              const struct q4kh_chat_msg *msgs, size_t n,
                              int32_t **ids, size_t *n_ids, struct q4kh_error *err)
{
	return tokenize(p, t, q4kh_chat_format_msgs(p->chat, msgs, n, 1), ids, n_ids, err);
}
