/*
 * Running with privileges the caller does not have (set-uid or set-gid):
 * detection, and which environment variables are ignored because of it.
 * Design section 3: the environment is then ignored (secure_getenv) and
 * every plugin file and folder must be owned by root (registry.c).
 */
#ifndef Q4KH_SECURE_H
#define Q4KH_SECURE_H

#include <stddef.h>

struct stat;

/*
 * 1 when this process runs in secure-execution mode: the kernel's
 * AT_SECURE (set-uid, set-gid or file capabilities), else, where the C
 * library lacks getauxval, real and effective ids that differ. Thread-safe.
 */
int q4kh_secure_mode(void);

/*
 * The names of the set environment variables that q4khost reads (every
 * Q4KHOST_* variable, XDG_CONFIG_HOME, XDG_CACHE_HOME, HOME) as one
 * ", "-separated list into BUF (always NUL-terminated, cut at CAP). Returns
 * how many there are. Reads environ: not thread-safe against setenv.
 */
size_t q4kh_secure_env_names(char *buf, size_t cap);

/*
 * Whether the file or folder at PATH, of status ST, may be trusted: 0 when
 * it may; else -1 with one line into WHY (CAP bytes) that says how to fix
 * it: "refused: the WHAT PATH is writable by group staff (mode 0664; fix:
 * chmod g-w PATH)". Someone else who can write it could replace what we
 * read or run, so a file or folder writable by others, or by a group that
 * holds anyone besides its owner, is refused. Writable by the owner's
 * user-private group (the group holds the owner and nobody else, as the
 * user and group databases list them: what umask 002 gives on Debian,
 * Ubuntu and Fedora) is writable by the owner alone, and accepted, as
 * OpenSSH judges ~/.ssh. In a set-uid or set-gid process (sudo's rule for
 * its plugins) any group-writable one, and one not owned by root, is
 * refused, as the caller could own anything else. The rule for plugin
 * files and folders (registry.c) and for the files the host caches about
 * them (enumerate.c). Thread-safe (a group-writable one walks the user
 * database under a lock).
 */
int q4kh_secure_untrusted(const struct stat *st, const char *what, const char *path,
                          char *why, size_t cap);

/*
 * The first half of q4kh_secure_untrusted: -1 with WHY when someone
 * besides the owner of ST may write it (others, or a group that holds
 * anyone else), without the set-uid rule that only root's may be trusted.
 * For what this process's user keeps for itself (the receipt folder and
 * the receipt key's folder: a set-uid host's are its effective user's,
 * whose MAC key seals what they hold). Thread-safe.
 */
int q4kh_secure_shared(const struct stat *st, const char *what, const char *path, char *why,
                       size_t cap);

#endif
