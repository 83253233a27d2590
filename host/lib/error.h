/*
 * Error reporting inside libq4khost: a failing function fills a
 * struct q4kh_error with one line a user can act on (which file, which
 * offset or line, what was expected, what was found) and returns -1.
 */
#ifndef Q4KH_ERROR_H
#define Q4KH_ERROR_H

#include <stddef.h>

struct q4kh_error {
	char msg[1024];
};

/*
 * Format the message into err (may be NULL) and return -1, so callers can
 * write `return q4kh_fail(err, "...", ...);`. Thread-safe for distinct err.
 */
int q4kh_fail(struct q4kh_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * LEN bytes of S as they may appear inside a one-line message, whatever
 * they hold (a value from a file, the environment or the command line):
 * printable ASCII as is; a backslash, control bytes, DEL and, when
 * ASCII_ONLY, every byte above 0x7f as \xNN; at most MAX bytes of S, then
 * "...". Writes into BUF (CAP bytes, NUL-terminated, cut to fit) and
 * returns BUF. Thread-safe.
 */
const char *q4kh_show(char *buf, size_t cap, const void *s, size_t len,
                      size_t max, int ascii_only);

#endif
