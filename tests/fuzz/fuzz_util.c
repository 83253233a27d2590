/* Helpers shared by the fuzz targets; see fuzz.h. */
#include "fuzz.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void fuzz_violation(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "fuzz: violated: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

void fuzz_check_error(const struct q4kh_error *err, const char *call)
{
	size_t len = strnlen(err->msg, sizeof(err->msg));

	if (len == 0 || len == sizeof(err->msg))
		fuzz_violation("%s failed without a message", call);
	if (memchr(err->msg, '\n', len))
		fuzz_violation("%s: the error is more than one line: %s", call,
		               err->msg);
}

int fuzz_memfd(const uint8_t *data, size_t size, char path[32])
{
	int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
	size_t done = 0;

	if (fd < 0) {
		perror("fuzz: memfd_create");
		abort();
	}
	while (done < size) {
		ssize_t n = write(fd, data + done, size - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			perror("fuzz: write to memfd");
			abort();
		}
		done += (size_t)n;
	}
	snprintf(path, 32, "/proc/self/fd/%d", fd);
	return fd;
}

void fuzz_split(const uint8_t *data, size_t size, char **parts, size_t n)
{
	size_t at = 0;

	for (size_t i = 0; i < n; i++) {
		const uint8_t *nul;
		size_t len;

		if (at > size || (at == size && i > 0)) {
			parts[i] = NULL;
			continue;
		}
		nul = memchr(data + at, 0, size - at);
		len = nul ? (size_t)(nul - (data + at)) : size - at;
		parts[i] = malloc(len + 1);
		if (!parts[i])
			abort();
		memcpy(parts[i], data + at, len);
		parts[i][len] = 0;
		at += len + 1;
	}
}

void fuzz_free_parts(char **parts, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(parts[i]);
}

static char tmp_dir[4096];

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void remove_tmpdir(void)
{
	nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_tmpdir(void)
{
	const char *tmp;

	if (tmp_dir[0])
		return tmp_dir;
	tmp = getenv("TMPDIR");
	snprintf(tmp_dir, sizeof(tmp_dir), "%s/q4kh-fuzz-XXXXXX",
	         tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(tmp_dir)) {
		perror("fuzz: mkdtemp");
		abort();
	}
	atexit(remove_tmpdir);
	return tmp_dir;
}

void fuzz_put_file(const char *path, const char *s)
{
	FILE *f;

	if (!s) {
		if (unlink(path) != 0 && errno != ENOENT) {
			perror(path);
			abort();
		}
		return;
	}
	f = fopen(path, "w");
	if (!f || fputs(s, f) < 0 || fclose(f) != 0) {
		perror(path);
		abort();
	}
}

const char *fuzz_srcdir(void)
{
	const char *s = getenv("Q4KH_TEST_SRCDIR");

	return s && *s ? s : ".";
}
