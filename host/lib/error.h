/*
 * Error reporting inside libq4khost: a failing function fills a
 * struct q4kh_error with one line a user can act on (which file, which
 * offset or line, what was expected, what was found) and returns -1.
 */
#ifndef Q4KH_ERROR_H
#define Q4KH_ERROR_H

struct q4kh_error {
	char msg[1024];
};

/*
 * Format the message into err (may be NULL) and return -1, so callers can
 * write `return q4kh_fail(err, "...", ...);`. Thread-safe for distinct err.
 */
int q4kh_fail(struct q4kh_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif
