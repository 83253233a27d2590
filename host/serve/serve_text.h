/*
 * Generated text on its way to a client: stop strings and UTF-8. A model
 * emits bytes, token by token; a multi-byte character may span tokens and
 * a stop string may too, so a stream holds back the bytes that are not
 * settled yet, and what is sent is valid UTF-8 (JSON strings must be).
 * Pure functions, thread-safe.
 */
#ifndef Q4KH_SERVE_TEXT_H
#define Q4KH_SERVE_TEXT_H

#include <stddef.h>

/*
 * LEN bytes of S with every ill-formed sequence replaced by U+FFFD, one
 * per maximal subpart (Unicode 15, section 3.9, "U+FFFD Substitution of
 * Maximal Subparts", as Python's bytes.decode('utf-8', 'replace') does).
 * malloc()ed and NUL-terminated; *out_len gets its length. NULL on out of
 * memory.
 */
char *serve_utf8_clean(const char *s, size_t len, size_t *out_len);

/*
 * How many bytes at the end of S[0..len) are the start of a multi-byte
 * character that the next bytes may still complete (0 to 3).
 */
size_t serve_utf8_incomplete(const char *s, size_t len);

/*
 * The first occurrence of any of the N stop strings in S[0..len) that
 * ends after byte FROM (earlier ones were looked for before): its offset,
 * or -1.
 */
long serve_stop_find(const char *s, size_t len, size_t from,
                     char *const *stop, size_t n);

/*
 * The longest tail of S[0..len) that is a proper prefix of one of the N
 * stop strings: bytes a stream must hold back until it knows.
 */
size_t serve_stop_partial(const char *s, size_t len, char *const *stop, size_t n);

#endif
