/* Shared helpers for the Criterion suites. */
#ifndef Q4KH_TEST_HELPERS_H
#define Q4KH_TEST_HELPERS_H

#include <stddef.h>
#include <stdint.h>

/* Source and build roots (set by make check; "." when run by hand). */
const char *test_srcdir(void);
const char *test_builddir(void);

/*
 * Path of the default model (Q4KHOST_MODEL, else the cache folder that
 * scripts/fetch-model.sh fills). When it is missing, the calling test is
 * skipped, or fails when Q4KH_REQUIRE_MODEL=1 (scripts/test.sh sets it so CI
 * can never pass by skipping).
 */
const char *test_model_path(void);

/* A fresh private folder under $TMPDIR, removed with its contents when the
 * test process exits; the caller owns the string. */
char *test_tmpdir(void);

/* Write LEN bytes to PATH (created 0644); aborts the test on failure. */
void test_write_file(const char *path, const void *data, size_t len);

/* Read a whole file; *len gets its size. NULL when unreadable. */
void *test_read_file(const char *path, size_t *len);

/* Cosine similarity of two vectors of N floats, accumulated in double. */
double test_cosine(const float *a, const float *b, int64_t n);

#endif
