/*
 * Golden cases for q4khost qa (docs/f2.md): a text file with one JSON
 * object per line, e.g.
 *   {"prompt": "1, 2, 3, 4, 5, 6,", "accept": [" 7, 8, 9"], "max_tokens": 8}
 * Keys: "prompt" (a string, required), "accept" (a non-empty array of
 * non-empty strings, required), "max_tokens" (tokens to generate greedily,
 * 1..4096, default 16), "chat" (true: the prompt goes through the model's
 * chat template; default false: raw text), "name" (a label; none by
 * default, the file and line name the case). Blank lines and lines starting with '#' are skipped; any other
 * key is an error (a misspelt key must not pass silently). A case passes
 * when the generated text, leading white space removed, starts with one of
 * its accepted answers, leading white space removed. Thread-safe for
 * distinct cases.
 */
#ifndef Q4KH_QA_CASES_H
#define Q4KH_QA_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

struct q4kh_qa_case {
	char *name; /* NULL when the case has none */
	char *prompt;
	char **accept;
	size_t n_accept;
	int64_t max_tokens;
	int chat;
	unsigned line; /* in the file */
};

/*
 * Read the cases of PATH into *out (malloc()ed, *n of them). -1 with err
 * naming the file and line on a malformed line or when there are none.
 */
int q4kh_qa_cases_load(const char *path, struct q4kh_qa_case **out, size_t *n,
                       struct q4kh_error *err);
void q4kh_qa_cases_free(struct q4kh_qa_case *c, size_t n);

/* 1 when TEXT (LEN bytes) passes case C, else 0. */
int q4kh_qa_accepts(const struct q4kh_qa_case *c, const char *text, size_t len);

#endif
