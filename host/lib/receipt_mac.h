/*
 * The integrity of F2 receipts (docs/f2.md, rule R.1): each receipt ends
 * in an HMAC-SHA256 of its content under a secret key of this user's, so
 * that a receipt edited by hand, however consistently, or written with
 * another key, reads as no receipt. The key is 32 random bytes, kept as 64
 * hex digits in a file of its own outside the receipt folder: the file
 * Q4KHOST_RECEIPT_KEY names, else $XDG_CONFIG_HOME/q4khost/receipt.key,
 * else ~/.config/q4khost/receipt.key; made at first use, mode 0600. A key
 * file that others could read or replace is refused. Thread-safe.
 */
#ifndef Q4KH_RECEIPT_MAC_H
#define Q4KH_RECEIPT_MAC_H

#include <stddef.h>

#include "error.h"

#define Q4KH_RECEIPT_KEY_BYTES 32
/* The hex digits of a MAC, and its NUL. */
#define Q4KH_RECEIPT_MAC_HEX 65

/*
 * A receipt file is its content (a JSON object up to its last member, no
 * closing brace), then Q4KH_RECEIPT_MAC_START, the MAC's 64 hex digits and
 * Q4KH_RECEIPT_MAC_END: the MAC is the HMAC-SHA256 of every byte before
 * Q4KH_RECEIPT_MAC_START, so the file stays one JSON object whose last
 * member is "mac".
 */
#define Q4KH_RECEIPT_MAC_START ",\n \"mac\": \"hmac-sha256:"
#define Q4KH_RECEIPT_MAC_END "\"\n}\n"

struct q4kh_receipt_mac {
	unsigned char key[Q4KH_RECEIPT_KEY_BYTES];
	char path[4096]; /* the key file it came from */
};

/*
 * The key file's path into BUF (CAP bytes): Q4KHOST_RECEIPT_KEY, else
 * $XDG_CONFIG_HOME/q4khost/receipt.key (an absolute XDG_CONFIG_HOME),
 * else q4kh_home()/.config/q4khost/receipt.key. *origin says which:
 * "Q4KHOST_RECEIPT_KEY" or "default".
 */
void q4kh_receipt_mac_path(char *buf, size_t cap, const char **origin);

/*
 * This user's receipt key into *out, from its file (q4kh_receipt_mac_path),
 * made when there is none: 32 bytes from OpenSSL's RAND_bytes, written as
 * 64 hex digits and a newline to a new file of mode 0600 (its folders made
 * 0700 as mkdir -p does) and linked into place, so that processes that
 * make it at once all read the one that won. It is opened without
 * following a symbolic link, and refused, -1 with err in one line naming
 * the file, what is wrong and the fix, when it is not a regular file, not
 * owned by this user, readable or writable by anyone else (mode 0640;
 * fix: chmod 600 FILE), in a folder others may write
 * (q4kh_secure_untrusted), not 64 hex digits, or a relative
 * Q4KHOST_RECEIPT_KEY.
 */
int q4kh_receipt_mac_load(struct q4kh_receipt_mac *out, struct q4kh_error *err);

/*
 * The HMAC-SHA256 under K of the N bytes at DATA, as 64 lowercase hex
 * digits into HEX.
 */
void q4kh_receipt_mac_of(const struct q4kh_receipt_mac *k, const void *data, size_t n,
                         char hex[Q4KH_RECEIPT_MAC_HEX]);

/*
 * Whether MAC (64 hex digits) is K's HMAC-SHA256 of the N bytes at DATA,
 * compared in constant time: 1 when it is.
 */
int q4kh_receipt_mac_ok(const struct q4kh_receipt_mac *k, const void *data, size_t n,
                        const char *mac);

#endif
