#include "helpers.h"
#include "model.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
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

	q4kh_default_model_path(path, sizeof(path));
	if (access(path, R_OK) != 0) {
		const char *req = getenv("Q4KH_REQUIRE_MODEL");
		if (req && strcmp(req, "1") == 0)
			cr_assert_fail("default model missing at %s (run scripts/fetch-model.sh)",
			         path);
		cr_skip_test("default model missing at %s (run scripts/fetch-model.sh)",
		             path);
	}
	return path;
}

static char *tmpdirs[64];
static size_t n_tmpdirs;

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* Each test runs in its own process; its folders go when it exits. */
static void remove_tmpdirs(void)
{
	for (size_t i = 0; i < n_tmpdirs; i++)
		nftw(tmpdirs[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

char *test_tmpdir(void)
{
	char tmpl[4096];
	snprintf(tmpl, sizeof(tmpl), "%s/q4kh-test-XXXXXX", env_or("TMPDIR", "/tmp"));
	cr_assert_not_null(mkdtemp(tmpl), "mkdtemp %s", tmpl);
	cr_assert_lt(n_tmpdirs, sizeof(tmpdirs) / sizeof(tmpdirs[0]));
	if (n_tmpdirs == 0)
		atexit(remove_tmpdirs);
	tmpdirs[n_tmpdirs++] = strdup(tmpl);
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

double test_cosine(const float *a, const float *b, int64_t n)
{
	double ab = 0, aa = 0, bb = 0;

	for (int64_t i = 0; i < n; i++) {
		ab += (double)a[i] * b[i];
		aa += (double)a[i] * a[i];
		bb += (double)b[i] * b[i];
	}
	return ab / sqrt(aa * bb);
}
