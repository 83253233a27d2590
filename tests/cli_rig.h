/*
 * The rig of the suites that run the q4khost CLI as a new user does
 * (tests/test_diagnostics.c, tests/test_first_run.c; test_select and
 * test_ab use its files and JSON): the tiny llama fixture, q4khost on it
 * with a plugin path and receipts of its own, a file of given text, the
 * JSON a command printed, and counting in what it printed.
 */
#ifndef Q4KH_TEST_CLI_RIG_H
#define Q4KH_TEST_CLI_RIG_H

#include <jansson.h>

/* tests/fixtures/tiny-llama.gguf's path. */
const char *tiny_model(void);

/*
 * q4khost COMMAND -m MODEL (NULL: the tiny llama fixture) --plugin-path
 * PLUGINS EXTRA, with receipts of its own and ENV before it
 * (test_q4khost): its exit status, all it printed in *out.
 */
int q4khost_with(const char *env, const char *command, const char *model, const char *plugins,
                 const char *extra, char **out);

/* A file NAME in a fresh folder holding TEXT; its path (malloc()ed). */
char *file_with(const char *name, const char *text);

/* The JSON object in TEXT, a command's output: from its first '{' on
 * (warnings go to stderr, before the object). Fails the test without. */
json_t *parse_json(const char *text);

/* How many times NEEDLE occurs in TEXT (a line's count with "\n"). */
int count(const char *text, const char *needle);

#endif
