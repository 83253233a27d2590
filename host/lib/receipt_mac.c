/*
 * Receipt keys and MACs (receipt_mac.h). The cryptography is OpenSSL's
 * (HMAC, RAND_bytes, CRYPTO_memcmp); this file only keeps the key.
 */
#include "buildconf.h"

#include "receipt_mac.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "hash.h"
#include "secure.h"

void q4kh_receipt_mac_path(char *buf, size_t cap, const char **origin)
{
	const char *env = q4kh_env("Q4KHOST_RECEIPT_KEY");
	char conf[4096];

	if (env && *env) {
		snprintf(buf, cap, "%s", env);
		*origin = "Q4KHOST_RECEIPT_KEY";
		return;
	}
	snprintf(buf, cap, "%s/q4khost/receipt.key", q4kh_config_home(conf, sizeof(conf)));
	*origin = "default";
}

/* The folders above FILE that are missing, each new one 0700; 0 or -1. */
static int parents(const char *file)
{
	char dir[4096], *slash;

	snprintf(dir, sizeof(dir), "%s", file);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = 0;
	return q4kh_mkdirs_private(dir);
}

/* A new key into PATH: a private temporary file linked into place, so that
 * nobody reads a key half written; 0, or -1 with errno (EEXIST: another
 * process made it first). */
static int make_key(const char *path)
{
	unsigned char key[Q4KH_RECEIPT_KEY_BYTES];
	char tmp[4200], text[2 * Q4KH_RECEIPT_KEY_BYTES + 2];
	int fd, ok, e;

	if (RAND_bytes(key, sizeof(key)) != 1) {
		errno = EIO;
		return -1;
	}
	q4kh_hex(key, sizeof(key), text);
	OPENSSL_cleanse(key, sizeof(key));
	text[2 * Q4KH_RECEIPT_KEY_BYTES] = '\n';
	snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	ok = write(fd, text, sizeof(text) - 1) == (ssize_t)(sizeof(text) - 1) && fsync(fd) == 0;
	e = errno;
	ok = close(fd) == 0 && ok;
	OPENSSL_cleanse(text, sizeof(text));
	if (ok && link(tmp, path) != 0) {
		e = errno;
		ok = 0;
	}
	unlink(tmp);
	errno = e;
	return ok ? 0 : -1;
}

/* Whether the key file open as FD, of status ST, may be trusted; 0, or -1
 * with WHY. */
static int key_untrusted(const char *path, const struct stat *st, char *why, size_t cap)
{
	char dir[4096], *slash;
	struct stat ds;

	if (!S_ISREG(st->st_mode)) {
		snprintf(why, cap, "refused: the receipt key %s is not a regular file", path);
		return -1;
	}
	if (st->st_uid != geteuid()) {
		snprintf(why, cap, "refused: the receipt key %s is owned by uid %u, not by this user (uid %u); each user keeps a key of their own",
		         path, (unsigned)st->st_uid, (unsigned)geteuid());
		return -1;
	}
	if (st->st_mode & 077) {
		snprintf(why, cap, "refused: the receipt key %s may be read or written by others (mode %04o; fix: chmod 600 %s)",
		         path, (unsigned)(st->st_mode & 07777), path);
		return -1;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash)
		slash[slash == dir] = 0;
	if (stat(dir, &ds) != 0) {
		snprintf(why, cap, "refused: the receipt key's folder %s: %s", dir, strerror(errno));
		return -1;
	}
	return q4kh_secure_shared(&ds, "receipt key's folder", dir, why, cap);
}

int q4kh_receipt_mac_load(struct q4kh_receipt_mac *out, struct q4kh_error *err)
{
	char text[2 * Q4KH_RECEIPT_KEY_BYTES + 2], why[8400];
	const char *origin;
	struct stat st;
	ssize_t n;
	int fd;

	q4kh_receipt_mac_path(out->path, sizeof(out->path), &origin);
	if (out->path[0] != '/')
		return q4kh_fail(err, "%s=%s: a relative receipt key would depend on the current directory; give an absolute path",
		                 origin, out->path);
	fd = open(out->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		if (parents(out->path) != 0 || (make_key(out->path) != 0 && errno != EEXIST))
			return q4kh_fail(err, "%s: cannot make the receipt key: %s", out->path,
			                 strerror(errno));
		fd = open(out->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (fd < 0)
		return q4kh_fail(err, "%s: cannot open the receipt key: %s", out->path,
		                 errno == ELOOP ? "it is a symbolic link (refused)" : strerror(errno));
	if (fstat(fd, &st) != 0 || key_untrusted(out->path, &st, why, sizeof(why))) {
		close(fd);
		return q4kh_fail(err, "%s", why);
	}
	n = read(fd, text, sizeof(text));
	close(fd);
	if (n < 2 * Q4KH_RECEIPT_KEY_BYTES || n > 2 * Q4KH_RECEIPT_KEY_BYTES + 1 ||
	    (n > 2 * Q4KH_RECEIPT_KEY_BYTES && text[n - 1] != '\n'))
		return q4kh_fail(err, "%s: expected a receipt key of %d hex digits and a newline (%zd bytes)",
		                 out->path, 2 * Q4KH_RECEIPT_KEY_BYTES, n);
	for (int i = 0; i < Q4KH_RECEIPT_KEY_BYTES; i++) {
		int hi = OPENSSL_hexchar2int((unsigned char)text[2 * i]);
		int lo = OPENSSL_hexchar2int((unsigned char)text[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			OPENSSL_cleanse(text, sizeof(text));
			return q4kh_fail(err, "%s: offset %d: expected a hex digit in the receipt key",
			                 out->path, 2 * i + (hi >= 0));
		}
		out->key[i] = (unsigned char)(hi << 4 | lo);
	}
	OPENSSL_cleanse(text, sizeof(text));
	return 0;
}

void q4kh_receipt_mac_of(const struct q4kh_receipt_mac *k, const void *data, size_t n,
                         char hex[Q4KH_RECEIPT_MAC_HEX])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int len = 0;

	HMAC(EVP_sha256(), k->key, sizeof(k->key), data, n, md, &len);
	q4kh_hex(md, 32, hex);
}

int q4kh_receipt_mac_ok(const struct q4kh_receipt_mac *k, const void *data, size_t n,
                        const char *mac)
{
	char want[Q4KH_RECEIPT_MAC_HEX];

	q4kh_receipt_mac_of(k, data, n, want);
	return strlen(mac) == 64 && CRYPTO_memcmp(want, mac, 64) == 0;
}
