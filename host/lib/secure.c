/*
 * Secure-execution mode: the kernel tells ld.so and us through AT_SECURE
 * that the caller does not hold our privileges, so nothing the caller
 * controls (environment, files the caller could write) may steer us.
 */
#include "buildconf.h"

#include "secure.h"

#include <grp.h>
#include <pthread.h>
#include <pwd.h>
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

/*
 * 1 when the group GID holds the user UID and nobody else: a user-private
 * group, what useradd makes for each user on Debian, Ubuntu and Fedora
 * (umask 002 is their default). Writable by such a group is writable by
 * its owner alone, as OpenSSH's and Debian's check of ~/.ssh judges it:
 * every user whose primary group it is and every listed member must be
 * UID, and UID must be one of them. Users are walked with getpwent_r,
 * whose position is the process's: the lock keeps our walks apart. Any
 * lookup that fails counts as "not private".
 */
static int private_group(uid_t uid, gid_t gid)
{
	static pthread_mutex_t walk = PTHREAD_MUTEX_INITIALIZER;
	struct passwd pw, *owner = NULL, *each;
	struct group gr, *g = NULL;
	char owner_buf[4096], group_buf[16384], each_buf[4096];
	int members = 0, others = 0;

	if (getpwuid_r(uid, &pw, owner_buf, sizeof(owner_buf), &owner) != 0 || !owner ||
	    getgrgid_r(gid, &gr, group_buf, sizeof(group_buf), &g) != 0 || !g)
		return 0;
	for (char **m = g->gr_mem; *m; m++) {
		if (strcmp(*m, owner->pw_name))
			return 0;
		members = 1;
	}
	members |= owner->pw_gid == gid;
	pthread_mutex_lock(&walk);
	setpwent();
	while (!others && getpwent_r(&pw, each_buf, sizeof(each_buf), &each) == 0)
		others = each->pw_gid == gid && each->pw_uid != uid;
	endpwent();
	pthread_mutex_unlock(&walk);
	return members && !others;
}

/* Who besides the owner of ST may write it: NULL when nobody. GROUP
 * (CAP bytes) gets the group's name, or its number. */
static const char *writers(const struct stat *st, char *group, size_t cap)
{
	struct group gr, *g = NULL;
	char buf[16384];
	mode_t mode = st->st_mode;

	/* a set-uid process keeps sudo's rule: no group may write */
	if ((mode & S_IWGRP) && !q4kh_secure_mode() && private_group(st->st_uid, st->st_gid))
		mode &= ~(mode_t)S_IWGRP;
	if (getgrgid_r(st->st_gid, &gr, buf, sizeof(buf), &g) == 0 && g)
		snprintf(group, cap, "%s", g->gr_name);
	else
		snprintf(group, cap, "%u", (unsigned)st->st_gid);
	if ((mode & S_IWGRP) && (mode & S_IWOTH))
		return "go";
	if (mode & S_IWGRP)
		return "g";
	if (mode & S_IWOTH)
		return "o";
	return NULL;
}

int q4kh_secure_shared(const struct stat *st, const char *what, const char *path, char *why,
                       size_t size)
{
	char group[256], whom[300];
	const char *who = writers(st, group, sizeof(group));

	if (!who)
		return 0;
	if (who[0] == 'g')
		snprintf(whom, sizeof(whom), "group %s%s", group, who[1] ? " and others" : "");
	else
		snprintf(whom, sizeof(whom), "others");
	snprintf(why, size, "refused: the %s %s is writable by %s (mode %04o; fix: chmod %s-w %s)",
	         what, path, whom, (unsigned)(st->st_mode & 07777), who, path);
	return -1;
}

int q4kh_secure_untrusted(const struct stat *st, const char *what, const char *path,
                          char *why, size_t size)
{
	if (q4kh_secure_shared(st, what, path, why, size))
		return -1;
	if (st->st_uid != 0 && q4kh_secure_mode()) {
		snprintf(why, size,
		         "refused: the %s %s is owned by uid %u, not root (required when running set-uid or set-gid)",
		         what, path, (unsigned)st->st_uid);
		return -1;
	}
	return 0;
}
