#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void q4kh_hex(const unsigned char *bytes, size_t n, char *hex)
{
	static const char digit[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		hex[2 * i] = digit[bytes[i] >> 4];
		hex[2 * i + 1] = digit[bytes[i] & 15];
	}
	hex[2 * n] = 0;
}

static void to_hex(const unsigned char *md, char hex[Q4KH_SHA256_HEX])
{
	q4kh_hex(md, 32, hex);
}

void q4kh_sha256_bytes(const void *data, size_t len, char hex[Q4KH_SHA256_HEX])
{
	unsigned char md[32];
	unsigned int n = 0;

	EVP_Digest(data, len, md, &n, EVP_sha256(), NULL);
	to_hex(md, hex);
}

struct q4kh_sha256 {
	EVP_MD_CTX *ctx;
};

struct q4kh_sha256 *q4kh_sha256_new(void)
{
	struct q4kh_sha256 *h = malloc(sizeof(*h));

	if (h && (h->ctx = EVP_MD_CTX_new()) && EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL))
		return h;
	q4kh_sha256_free(h);
	return NULL;
}

int q4kh_sha256_add(struct q4kh_sha256 *h, const void *data, size_t len)
{
	return EVP_DigestUpdate(h->ctx, data, len) ? 0 : -1;
}

int q4kh_sha256_hex(struct q4kh_sha256 *h, char hex[Q4KH_SHA256_HEX])
{
	unsigned char md[32];
	unsigned int n = 0;

	if (!EVP_DigestFinal_ex(h->ctx, md, &n))
		return -1;
	to_hex(md, hex);
	return 0;
}

void q4kh_sha256_free(struct q4kh_sha256 *h)
{
	if (h) {
		EVP_MD_CTX_free(h->ctx);
		free(h);
	}
}

static int hash_fd(int fd, char hex[Q4KH_SHA256_HEX])
{
	struct q4kh_sha256 *h = q4kh_sha256_new();
	unsigned char buf[1 << 16];
	ssize_t got = -1;
	int rc = -1;

	if (!h)
		return -1;
	while ((got = read(fd, buf, sizeof(buf))) > 0)
		if (q4kh_sha256_add(h, buf, (size_t)got))
			break;
	if (got == 0)
		rc = q4kh_sha256_hex(h, hex);
	q4kh_sha256_free(h);
	return rc;
}

/* The cache record's name and the identity line it must hold. */
static void cache_names(const char *dir, const struct stat *st, char *file,
                        size_t fcap, char *id, size_t icap)
{
	snprintf(file, fcap, "%s/%llx-%llx.sha256", dir,
	         (unsigned long long)st->st_dev, (unsigned long long)st->st_ino);
	/* ctime too: a user can restore an mtime (touch -d), not a ctime */
	snprintf(id, icap, "%lld %lld.%09ld %lld.%09ld", (long long)st->st_size,
	         (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec,
	         (long long)st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
}

static int cache_read(const char *file, const char *id, char hex[Q4KH_SHA256_HEX])
{
	char line[256], want[256];
	FILE *f = fopen(file, "r");
	int ok;

	if (!f)
		return -1;
	snprintf(want, sizeof(want), "%s ", id);
	ok = fgets(line, sizeof(line), f) && !strncmp(line, want, strlen(want)) &&
	     strlen(line) >= strlen(want) + 64;
	fclose(f);
	if (!ok)
		return -1;
	memcpy(hex, line + strlen(want), 64);
	hex[64] = 0;
	return strspn(hex, "0123456789abcdef") == 64 ? 0 : -1;
}

/* Best effort: a cache that cannot be written only costs time. */
static void cache_write(const char *dir, const char *file, const char *id,
                        const char hex[Q4KH_SHA256_HEX])
{
	char tmp[4200];
	FILE *f;

	mkdir(dir, 0755);
	snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", file, (long)getpid());
	f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%s %s\n", id, hex);
	if (fclose(f) == 0)
		rename(tmp, file);
	else
		unlink(tmp);
}

int q4kh_sha256_mapped(const char *path, const void *map, uint64_t size,
                       const char *cache_dir, char hex[Q4KH_SHA256_HEX],
                       struct q4kh_error *err)
{
	char file[4096], id[128];
	struct stat st;

	if (stat(path, &st) != 0)
		return q4kh_fail(err, "%s: cannot stat: %s", path, strerror(errno));
	cache_names(cache_dir, &st, file, sizeof(file), id, sizeof(id));
	if (cache_read(file, id, hex) == 0)
		return 0;
	q4kh_sha256_bytes(map, (size_t)size, hex);
	cache_write(cache_dir, file, id, hex);
	return 0;
}

int q4kh_sha256_file(const char *path, const char *cache_dir,
                     char hex[Q4KH_SHA256_HEX], struct q4kh_error *err)
{
	char file[4096], id[128];
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return q4kh_fail(err, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		close(fd);
		return q4kh_fail(err, "%s: cannot stat: %s", path, strerror(errno));
	}
	if (cache_dir) {
		cache_names(cache_dir, &st, file, sizeof(file), id, sizeof(id));
		if (cache_read(file, id, hex) == 0) {
			close(fd);
			return 0;
		}
	}
	if (hash_fd(fd, hex) != 0) {
		close(fd);
		return q4kh_fail(err, "%s: cannot read: %s", path, strerror(errno));
	}
	close(fd);
	if (cache_dir)
		cache_write(cache_dir, file, id, hex);
	return 0;
}
