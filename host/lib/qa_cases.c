#include "qa_cases.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_TOKENS 16

void q4kh_qa_cases_free(struct q4kh_qa_case *c, size_t n)
{
	for (size_t i = 0; c && i < n; i++) {
		free(c[i].name);
		free(c[i].prompt);
		for (size_t j = 0; j < c[i].n_accept; j++)
			free(c[i].accept[j]);
		free(c[i].accept);
	}
	free(c);
}

static const char *skip_space(const char *s, size_t *len)
{
	while (*len && isspace((unsigned char)*s)) {
		s++;
		(*len)--;
	}
	return s;
}

int q4kh_qa_accepts(const struct q4kh_qa_case *c, const char *text, size_t len)
{
	text = skip_space(text, &len);
	for (size_t i = 0; i < c->n_accept; i++) {
		size_t alen = strlen(c->accept[i]);
		const char *a = skip_space(c->accept[i], &alen);
		if (alen <= len && !memcmp(text, a, alen))
			return 1;
	}
	return 0;
}

/* Fill C from the object O of line LINE. */
static int parse_case(json_t *o, const char *path, unsigned line,
                      struct q4kh_qa_case *c, struct q4kh_error *err)
{
	static const char *const keys[] = { "prompt", "accept", "max_tokens", "chat", "name" };
	json_t *accept = json_object_get(o, "accept"), *v, *mt = json_object_get(o, "max_tokens");
	json_t *chat = json_object_get(o, "chat"), *name = json_object_get(o, "name");
	const char *key;
	size_t i;

	c->line = line;
	json_object_foreach(o, key, v) {
		size_t k = 0;
		while (k < 5 && strcmp(key, keys[k]))
			k++;
		if (k == 5)
			return q4kh_fail(err, "%s:%u: unknown key \"%s\" (known: prompt, accept, max_tokens, chat, name)",
			                 path, line, key);
	}
	if (!json_is_string(json_object_get(o, "prompt")))
		return q4kh_fail(err, "%s:%u: \"prompt\" must be a string", path, line);
	if (!json_is_array(accept) || json_array_size(accept) == 0)
		return q4kh_fail(err, "%s:%u: \"accept\" must be a non-empty array of strings",
		                 path, line);
	if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 1 ||
	           json_integer_value(mt) > 4096))
		return q4kh_fail(err, "%s:%u: \"max_tokens\" must be a whole number in [1, 4096]",
		                 path, line);
	if (chat && !json_is_boolean(chat))
		return q4kh_fail(err, "%s:%u: \"chat\" must be true or false", path, line);
	if (name && !json_is_string(name))
		return q4kh_fail(err, "%s:%u: \"name\" must be a string", path, line);
	c->name = name ? strdup(json_string_value(name)) : NULL;
	c->prompt = strdup(json_string_value(json_object_get(o, "prompt")));
	c->accept = calloc(json_array_size(accept), sizeof(*c->accept));
	c->max_tokens = mt ? json_integer_value(mt) : DEFAULT_MAX_TOKENS;
	c->chat = chat && json_is_true(chat);
	if ((name && !c->name) || !c->prompt || !c->accept)
		return q4kh_fail(err, "%s:%u: out of memory", path, line);
	json_array_foreach(accept, i, v) {
		const char *s = json_string_value(v);
		size_t len = s ? strlen(s) : 0;
		if (!s || (skip_space(s, &len), len == 0))
			return q4kh_fail(err, "%s:%u: \"accept\" entry %zu must be a string with more than white space",
			                 path, line, i + 1);
		if (!(c->accept[i] = strdup(s)))
			return q4kh_fail(err, "%s:%u: out of memory", path, line);
		c->n_accept++;
	}
	return 0;
}

int q4kh_qa_cases_load(const char *path, struct q4kh_qa_case **out, size_t *n,
                       struct q4kh_error *err)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	unsigned lineno = 0;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!f)
		return q4kh_fail(err, "%s: cannot read: %s", path, strerror(errno));
	while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
		size_t l = (size_t)len;
		const char *s = skip_space(line, &l);
		struct q4kh_qa_case *grown;
		json_error_t jerr;
		json_t *o;

		lineno++;
		if (!l || *s == '#')
			continue;
		/* without the line's end, so that an error at the end of the
		 * object is on this line, not at column 0 of the next */
		while (isspace((unsigned char)s[l - 1]))
			l--;
		o = json_loadb(s, l, 0, &jerr);
		if (!json_is_object(o)) {
			/* jansson's column counts from s, after the indentation;
			 * it reads the line alone, so its "end of file" is the
			 * line's end */
			const char *eof = strstr(jerr.text, "end of file");

			rc = o     ? q4kh_fail(err, "%s:%u: expected one JSON object per line", path,
			                       lineno)
			     : eof ? q4kh_fail(err, "%s:%u:%d: %.*sthe end of the line (a case is "
			                       "one whole JSON object on one line)",
			                       path, lineno, (int)(s - line) + jerr.column,
			                       (int)(eof - jerr.text), jerr.text)
			           : q4kh_fail(err, "%s:%u:%d: %s", path, lineno,
			                       (int)(s - line) + jerr.column, jerr.text);
			json_decref(o);
			break;
		}
		grown = realloc(*out, (*n + 1) * sizeof(**out));
		if (!grown) {
			json_decref(o);
			rc = q4kh_fail(err, "%s: out of memory", path);
			break;
		}
		*out = grown;
		memset(&grown[*n], 0, sizeof(grown[*n]));
		(*n)++;
		rc = parse_case(o, path, lineno, &grown[*n - 1], err);
		json_decref(o);
	}
	free(line);
	if (rc == 0 && ferror(f)) /* a folder reads as an error, not as no lines */
		rc = q4kh_fail(err, "%s: cannot read: %s", path, strerror(errno));
	fclose(f);
	if (rc == 0 && *n == 0)
		rc = q4kh_fail(err, "%s: no cases (one JSON object per line)", path);
	if (rc) {
		q4kh_qa_cases_free(*out, *n);
		*out = NULL;
		*n = 0;
	}
	return rc;
}
