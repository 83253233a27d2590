/*
 * Secure-execution mode: the kernel tells ld.so and us through AT_SECURE
 * that the caller does not hold our privileges, so nothing the caller
 * controls (environment, files the caller could write) may steer us.
 */
#include "buildconf.h"

#include "secure.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef HAVE_SYS_AUXV_H
#include <sys/auxv.h>
#endif

extern char **environ;

int q4kh_secure_mode(void)
{
#if defined(HAVE_GETAUXVAL) && defined(AT_SECURE)
	return getauxval(AT_SECURE) != 0;
#else
	return getuid() != geteuid() || getgid() != getegid();
#endif
}

/* 1 when the "NAME=value" entry E names a variable q4kh_env reads. */
static int is_ours(const char *e)
{
	static const char *const named[] = { "XDG_CONFIG_HOME=", "XDG_CACHE_HOME=",
		                             "HOME=" };

	if (!strncmp(e, "Q4KHOST_", 8))
		return 1;
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
		if (!strncmp(e, named[i], strlen(named[i])))
			return 1;
	return 0;
}

size_t q4kh_secure_env_names(char *buf, size_t cap)
{
	size_t n = 0, used = 0;

	buf[0] = 0;
	for (char **e = environ; e && *e; e++) {
		if (!is_ours(*e))
			continue;
		if (used < cap)
			used += (size_t)snprintf(buf + used, cap - used, "%s%.*s",
			                         n ? ", " : "", (int)strcspn(*e, "="), *e);
		n++;
	}
	return n;
}

/* Who besides the owner may write: NULL when nobody. */
static const char *writers(mode_t mode)
{
	if ((mode & S_IWGRP) && (mode & S_IWOTH))
		return "group and others";
	if (mode & S_IWGRP)
		return "group";
	if (mode & S_IWOTH)
		return "others";
	return NULL;
}

int q4kh_secure_untrusted(const struct stat *st, const char *what, const char *path,
                          char *why, size_t size)
{
	const char *who = writers(st->st_mode);

	if (who) {
		snprintf(why, size, "refused: the %s %s is writable by %s (mode %04o)", what, path,
		         who, (unsigned)(st->st_mode & 07777));
		return -1;
	}
	if (st->st_uid != 0 && q4kh_secure_mode()) {
		snprintf(why, size,
		         "refused: the %s %s is owned by uid %u, not root (required when running set-uid or set-gid)",
		         what, path, (unsigned)st->st_uid);
		return -1;
	}
	return 0;
}
