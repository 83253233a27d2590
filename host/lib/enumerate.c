/*
 * Backend enumeration in a helper process, and the cache of its verdicts.
 *
 * A record is one small text file per plugin file, DIR/DEV-INO.enum (DIR
 * the folder "backends" of the receipt folder), of two lines: the
 * identity it was made for, "q4khost-enumerate SCHEMA SIZE MTIME CTIME
 * LIMIT SHA", SHA the SHA-256 of the build id and the effective settings;
 * then "ok", or "refused WHY". It is written atomically (a temporary file
 * of mode 0644 at most, renamed), and read only from a regular file that
 * q4kh_secure_untrusted accepts in a folder it accepts: anyone else who
 * could write it could hide a crashing backend or refuse a good one.
 */
#include "enumerate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "guard.h"
#include "hash.h"
#include "isolate.h"
#include "progress.h"
#include "receipt.h"
#include "secure.h"

/* Raise it when q4kh_enumerate_here asks a backend more: older "ok"
 * records then vouch for less than is asked, and count as none. */
#define CACHE_SCHEMA 1
#define WHAT "its init or device enumeration (in a helper process)"

int q4kh_enumerate_timeout(const struct q4kh_config *c, unsigned *seconds,
                           struct q4kh_error *err)
{
	uint64_t v = Q4KH_ENUMERATE_TIMEOUT_S;
	char origin[8];

	if (q4kh_config_whole(c, "plugins", "enumerate_timeout_s", 1,
	                      Q4KH_ENUMERATE_TIMEOUT_MAX_S, &v, origin, sizeof(origin), err))
		return -1;
	*seconds = (unsigned)v;
	return 0;
}

void q4kh_enumerate_here(const struct q4kh_plugin *p)
{
	const struct q4kh_backend_v1 *v = p->desc->backend;
	struct q4kh_device_record rec;
	q4kh_backend_ctx *ctx = NULL;
	uint32_t n = 0;

	if (v->init(&p->api, &ctx) != Q4KH_OK) {
		v->last_error(NULL);
		return;
	}
	if (v->device_count(ctx, &n) != Q4KH_OK) {
		v->last_error(ctx);
		n = 0;
	}
	for (uint32_t i = 0; i < (n ? n : 1); i++) {
		memset(&rec, 0, sizeof(rec));
		rec.struct_size = sizeof(rec);
		if (v->device_info(ctx, i, &rec) != Q4KH_OK)
			v->last_error(ctx);
	}
	v->shutdown(ctx);
}

/* Where P's record lives, and the identity line it must hold: -1 when P's
 * file cannot be looked at or its settings do not fit (no caching then). */
static int identity(const struct q4kh_plugin *p, const char *dir, unsigned limit, char *file,
                    size_t fcap, char *id, size_t icap)
{
	char section[96], settings[2048], *text, sha[Q4KH_SHA256_HEX];
	struct stat st;
	int n;

	snprintf(section, sizeof(section), "plugin.%s", p->name);
	if (fstat(p->fd, &st) != 0 ||
	    q4kh_config_section_text(p->config, section, NULL, settings, sizeof(settings)) ||
	    asprintf(&text, "%s\n%s", p->desc->build_id ? p->desc->build_id : "", settings) < 0)
		return -1;
	q4kh_sha256_bytes(text, strlen(text), sha);
	free(text);
	n = snprintf(file, fcap, "%s/%llx-%llx.enum", dir, (unsigned long long)st.st_dev,
	             (unsigned long long)st.st_ino);
	if (n < 0 || (size_t)n >= fcap)
		return -1;
	/* ctime too: a user can restore an mtime (touch -d), not a ctime */
	n = snprintf(id, icap, "q4khost-enumerate %d %lld %lld.%09ld %lld.%09ld %u %s",
	             CACHE_SCHEMA, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
	             st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec,
	             limit, sha);
	return n > 0 && (size_t)n < icap ? 0 : -1;
}

/* The verdict of FILE's record for ID: 0 fine, 1 refused (why into WHY),
 * -1 none (missing, stale, malformed or untrusted). */
static int read_record(const char *file, const char *id, char *why, size_t cap)
{
	char line[512], refusal[600];
	struct stat st;
	int fd = open(file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), rc = -1;
	FILE *f;

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    q4kh_secure_untrusted(&st, "file", file, refusal, sizeof(refusal)) ||
	    !(f = fdopen(fd, "r"))) {
		close(fd);
		return -1;
	}
	if (fgets(line, sizeof(line), f) && !strncmp(line, id, strlen(id)) &&
	    !strcmp(line + strlen(id), "\n") && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (!strcmp(line, "ok")) {
			rc = 0;
		} else if (!strncmp(line, "refused ", 8)) {
			snprintf(why, cap, "%s", line + 8);
			rc = 1;
		}
	}
	fclose(f);
	return rc;
}

/* Best effort: a record that cannot be written only costs a helper. */
static void write_record(const char *dir, const char *file, const char *id,
                         const char *verdict)
{
	char tmp[4200];
	FILE *f;
	int fd;

	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return;
	if (snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", file, (long)getpid()) >= (int)sizeof(tmp))
		return;
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(tmp);
		return;
	}
	fprintf(f, "%s\n%s\n", id, verdict);
	if (fclose(f) != 0 || rename(tmp, file) != 0)
		unlink(tmp);
}

/* Whether DIR may hold records this process trusts (a missing one may:
 * this process makes it). */
static int dir_trusted(const char *dir)
{
	char why[600];
	struct stat st;

	if (lstat(dir, &st) != 0)
		return errno == ENOENT;
	return S_ISDIR(st.st_mode) && !q4kh_secure_untrusted(&st, "folder", dir, why, sizeof(why));
}

/* The helper's command line: P's file on R's path, with every effective
 * [plugin.NAME] setting, so that its init reads what ours would. */
static void helper_args(const struct q4kh_registry *r, const struct q4kh_plugin *p,
                        struct q4kh_guard_args *a)
{
	char section[96];
	const char *keys[Q4KH_GUARD_OVERRIDES];
	size_t n;

	snprintf(section, sizeof(section), "plugin.%s", p->name);
	n = q4kh_config_section_keys(p->config, section, NULL, keys, Q4KH_GUARD_OVERRIDES);
	a->n = a->n_set = 0;
	a->argv[a->n++] = "q4khost";
	a->argv[a->n++] = "validate";
	a->argv[a->n++] = "--enumerate";
	a->argv[a->n++] = p->path;
	a->argv[a->n++] = "--plugin-path";
	a->argv[a->n++] = r->path;
	for (size_t i = 0; i < n; i++) {
		snprintf(a->set[a->n_set], sizeof(a->set[0]), "%s:%s=%s", section, keys[i],
		         q4kh_config_get(p->config, section, keys[i], NULL));
		a->argv[a->n++] = "--set";
		a->argv[a->n++] = a->set[a->n_set++];
	}
	a->argv[a->n] = NULL;
}

/* What a terminal shows while a helper runs: a hang takes the whole limit. */
static int show_enumerating(void *data, unsigned seconds, char *why, size_t why_cap)
{
	const struct q4kh_plugin *p = data;

	(void)why;
	(void)why_cap;
	q4kh_progress("%u s: trying backend %s's init and devices in a helper process (%s)",
	              seconds, p->name, p->path);
	return 0;
}

static void refuse(struct q4kh_plugin *p, const char *why, const char *file)
{
	p->state = Q4KH_PLUGIN_REFUSED;
	snprintf(p->reason, sizeof(p->reason),
	         "%.200s; the command went on without it and remembers this until the plugin "
	         "file changes (%.160s)", why, file);
}

/* Vet P: its record, else a helper. -1 with err as q4kh_enumerate_vet. */
static int vet_one(const struct q4kh_registry *r, const struct q4kh_config *c,
                   struct q4kh_plugin *p, const char *dir, int trusted, unsigned limit,
                   struct q4kh_error *err)
{
	struct q4kh_error unkept;
	const struct q4kh_isolate_limits limits = { limit, 0, show_enumerating, p, WHAT, NULL,
		                                    NULL, 0 };
	char file[4200], id[512], why[512], verdict[530];
	struct q4kh_guard_args a;
	int cacheable = identity(p, dir, limit, file, sizeof(file), id, sizeof(id)) == 0;
	int rc = cacheable && trusted ? read_record(file, id, why, sizeof(why)) : -1;

	if (rc >= 0) {
		if (rc == 1)
			refuse(p, why, file);
		return 0;
	}
	helper_args(r, p, &a);
	rc = q4kh_isolate_run(q4kh_self_exe(), a.argv, &limits, why, sizeof(why), err);
	q4kh_progress_clear();
	if (rc < 0)
		return -1;
	if (rc == 2)
		return q4kh_fail(err, "%s while backend %s (%s) was enumerated", why, p->name,
		                 p->path);
	snprintf(verdict, sizeof(verdict), rc ? "refused %s" : "ok", why);
	/* the receipt folder is made as F2 makes it; when it cannot be, the
	 * verdict is not kept, and the command that needs receipts says why */
	if (cacheable && q4kh_receipt_folder_check(c, &unkept) == 0)
		write_record(dir, file, id, verdict);
	if (rc)
		refuse(p, why, file);
	return 0;
}

int q4kh_enumerate_vet(struct q4kh_registry *r, const struct q4kh_config *c,
                       struct q4kh_error *err)
{
	char receipts[4096], dir[4200];
	const char *origin;
	unsigned limit;
	int trusted;

	if (q4kh_enumerate_timeout(c, &limit, err))
		return -1;
	q4kh_receipt_dir(c, receipts, sizeof(receipts), &origin);
	snprintf(dir, sizeof(dir), "%s/backends", receipts);
	trusted = dir_trusted(dir);
	for (size_t i = 0; i < r->n_plugins; i++) {
		struct q4kh_plugin *p = &r->plugins[i];

		if (p->state == Q4KH_PLUGIN_ACCEPTED && p->desc->kind == Q4KH_KIND_BACKEND &&
		    vet_one(r, c, p, dir, trusted, limit, err))
			return -1;
	}
	return 0;
}
