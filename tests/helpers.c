#include "helpers.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *env_or(const char *name, const char *fallback)
{
	const char *v = getenv(name);
	return v && *v ? v : fallback;
}

const char *test_srcdir(void) { return env_or("Q4KH_TEST_SRCDIR", "."); }
const char *test_builddir(void) { return env_or("Q4KH_TEST_BUILDDIR", "."); }

const char *test_model_path(void)
{
	static char path[4096];
	const char *m = getenv("Q4KHOST_MODEL");

	if (m && *m) {
		snprintf(path, sizeof(path), "%s", m);
	} else {
		const char *cache = getenv("XDG_CACHE_HOME");
		if (cache && *cache)
			snprintf(path, sizeof(path),
			         "%s/q4khost/models/gemma-3-270m-q4_k_m.gguf", cache);
		else
			snprintf(path, sizeof(path),
			         "%s/.cache/q4khost/models/gemma-3-270m-q4_k_m.gguf",
			         env_or("HOME", "/root"));
	}
	if (access(path, R_OK) != 0) {
		const char *req = getenv("Q4KH_REQUIRE_MODEL");
		if (req && strcmp(req, "1") == 0)
			cr_fatal("default model missing at %s (run scripts/fetch-model.sh)",
			         path);
		cr_skip_test("default model missing at %s (run scripts/fetch-model.sh)",
		             path);
	}
	return path;
}

char *test_tmpdir(void)
{
	char tmpl[4096];
	snprintf(tmpl, sizeof(tmpl), "%s/q4kh-test-XXXXXX", env_or("TMPDIR", "/tmp"));
	cr_assert_not_null(mkdtemp(tmpl), "mkdtemp %s", tmpl);
	return strdup(tmpl);
}

void test_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "cannot create %s", path);
	cr_assert_eq(fwrite(data, 1, len, f), len, "short write to %s", path);
	cr_assert_eq(fclose(f), 0);
	chmod(path, 0644);
}

void *test_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf) {
		buf[n] = 0;
		*len = (size_t)n;
	}
	return buf;
}
