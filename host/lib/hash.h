/*
 * SHA-256 of files (FIPS 180-4, through OpenSSL's libcrypto), as lowercase
 * hex. Receipts key on the bytes of the model and of every plugin file,
 * since version strings do not tell builds apart. Thread-safe.
 */
#ifndef Q4KH_HASH_H
#define Q4KH_HASH_H

#include <stddef.h>

#include "error.h"

#define Q4KH_SHA256_HEX 65 /* 64 hex digits and a NUL */

/*
 * Hash the file at PATH into hex. When cache_dir is not NULL, a small
 * record keyed on the file's device, inode, size, modification and change
 * times (nanoseconds; a change time cannot be set back) lets a multi-gigabyte model be hashed once, not on every
 * run; a stale or unreadable record is ignored. -1 with err when the file
 * cannot be read.
 */
int q4kh_sha256_file(const char *path, const char *cache_dir,
                     char hex[Q4KH_SHA256_HEX], struct q4kh_error *err);

/* Hash LEN bytes of DATA into hex. */
void q4kh_sha256_bytes(const void *data, size_t len, char hex[Q4KH_SHA256_HEX]);

#endif
