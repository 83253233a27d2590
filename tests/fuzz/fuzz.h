/*
 * Shared by the libFuzzer targets in tests/fuzz (one file per target, each
 * defining LLVMFuzzerTestOneInput) and by the Criterion suite that replays
 * their seeds and regression inputs (tests/fuzz/replay.c), where the
 * target's entry is an ordinary function built by the normal compiler.
 *
 * A target treats any input as possible and checks what the code
 * promises; a broken promise calls fuzz_violation(), which aborts, so
 * libFuzzer keeps the input as a crash and the replay suite fails. None of
 * these functions is thread-safe (libFuzzer runs one input at a time).
 */
#ifndef Q4KH_FUZZ_H
#define Q4KH_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Print "fuzz: violated: WHAT" to stderr and abort(). */
void fuzz_violation(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

/*
 * The error contract of libq4khost (error.h): a failing call leaves one
 * non-empty line in ERR. CALL names the call for the report.
 */
void fuzz_check_error(const struct q4kh_error *err, const char *call);

/*
 * DATA in an anonymous memory file (memfd); *path gets a name that open()
 * accepts ("/proc/self/fd/N", at most 32 bytes). Returns the descriptor
 * for close(); aborts when the kernel refuses, which is no finding.
 */
int fuzz_memfd(const uint8_t *data, size_t size, char path[32]);

/*
 * Split DATA at NUL bytes into N parts, each a malloc()ed NUL-terminated
 * string; parts past the end of the input are NULL, bytes past the Nth
 * part are ignored. Free with fuzz_free_parts.
 */
void fuzz_split(const uint8_t *data, size_t size, char **parts, size_t n);
void fuzz_free_parts(char **parts, size_t n);

/* A private folder made once per process under $TMPDIR (or /tmp), removed
 * with its contents at exit (libFuzzer skips atexit handlers: scripts/fuzz.sh
 * gives each target a TMPDIR of its own, which it clears). */
const char *fuzz_tmpdir(void);

/* Write S (NULL: remove the file) to PATH; aborts on failure. */
void fuzz_put_file(const char *path, const char *s);

/* The source tree: $Q4KH_TEST_SRCDIR, else ".". */
const char *fuzz_srcdir(void);

#endif
