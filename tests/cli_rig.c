/*
 * The CLI suites' rig (cli_rig.h): the tiny fixture, q4khost on it, files,
 * JSON and counts.
 */
#include "cli_rig.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

const char *tiny_model(void)
{
	static char path[4200];

	snprintf(path, sizeof(path), "%s/tests/fixtures/tiny-llama.gguf", test_srcdir());
	return path;
}

int q4khost_with(const char *env, const char *command, const char *model, const char *plugins,
                 const char *extra, char **out)
{
	char args[16384];

	snprintf(args, sizeof(args), "%s -m %s --plugin-path %s %s", command,
	         model ? model : tiny_model(), plugins, extra);
	return test_q4khost(env, test_tmpdir(), args, out);
}

char *file_with(const char *name, const char *text)
{
	char *path;

	cr_assert_geq(asprintf(&path, "%s/%s", test_tmpdir(), name), 0);
	test_write_file(path, text, strlen(text));
	return path;
}

json_t *parse_json(const char *text)
{
	json_error_t jerr;
	json_t *j = json_loads(strchr(text, '{') ? strchr(text, '{') : text, 0, &jerr);

	cr_assert_not_null(j, "no JSON (%s): %s", jerr.text, text);
	return j;
}

int count(const char *text, const char *needle)
{
	int n = 0;

	for (const char *p = text; (p = strstr(p, needle)); p++)
		n++;
	return n;
}
