/*
 * SHA-256 of files (FIPS 180-4, through OpenSSL's libcrypto), as lowercase
 * hex. Receipts key on the bytes of the model and of every plugin file,
 * since version strings do not tell builds apart. Thread-safe.
 */
#ifndef Q4KH_HASH_H
#define Q4KH_HASH_H

#include <stddef.h>
#include <stdint.h>

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

/*
 * As q4kh_sha256_file with CACHE_DIR, for a file this process has mapped
 * whole: MAP (SIZE bytes) holds PATH's bytes and is hashed on a miss of
 * the cache (keyed on stat of PATH), so that the file is not opened
 * again. -1 with err when PATH cannot be stat()ed.
 */
int q4kh_sha256_mapped(const char *path, const void *map, uint64_t size,
                       const char *cache_dir, char hex[Q4KH_SHA256_HEX],
                       struct q4kh_error *err);
/* Hash LEN bytes of DATA into hex. */
void q4kh_sha256_bytes(const void *data, size_t len, char hex[Q4KH_SHA256_HEX]);

/* N bytes of BYTES as 2N lowercase hex digits and a NUL into HEX (2N + 1
 * chars): how digests, MACs and keys are written. */
void q4kh_hex(const unsigned char *bytes, size_t n, char *hex);

/*
 * SHA-256 of data that comes in pieces (a file's rows as they are written
 * or read): q4kh_sha256_new (NULL on out of memory), q4kh_sha256_add for
 * each piece, q4kh_sha256_hex once for the digest of all of them, then
 * q4kh_sha256_free (NULL is fine). add and hex return -1 when libcrypto
 * fails. One hash per thread at a time.
 */
struct q4kh_sha256;
struct q4kh_sha256 *q4kh_sha256_new(void);
int q4kh_sha256_add(struct q4kh_sha256 *h, const void *data, size_t len);
int q4kh_sha256_hex(struct q4kh_sha256 *h, char hex[Q4KH_SHA256_HEX]);
void q4kh_sha256_free(struct q4kh_sha256 *h);

#endif
