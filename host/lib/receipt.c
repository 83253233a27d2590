#include "buildconf.h"

#include "receipt.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "secure.h"

/* 2: every measured position is kept ("points"). 4: their cosines to
 * the last bit, so that the summary is derived from them exactly when read
 * (receipt_check.h). 5: sealed by an HMAC-SHA256 under this user's key
 * ("mac", last: receipt_mac.h). */
#define RECEIPT_SCHEMA 5

#define MAC_START Q4KH_RECEIPT_MAC_START
#define MAC_END Q4KH_RECEIPT_MAC_END
/* The largest receipt file read: a deep probe's 4,136 points take 200 KiB. */
#define RECEIPT_MAX_BYTES (64u << 20)

void q4kh_receipt_dir(const struct q4kh_config *c, char *buf, size_t cap,
                      const char **origin)
{
	const char *env = q4kh_env("Q4KHOST_F2_RECEIPT_DIR");
	const char *file, *conf = q4kh_config_get(c, "f2", "receipt_dir", &file);
	char cache[4096];

	if (env && *env) {
		snprintf(buf, cap, "%s", env);
		*origin = "Q4KHOST_F2_RECEIPT_DIR";
	} else if (conf && *conf) {
		snprintf(buf, cap, "%s", conf);
		*origin = file;
	} else {
		snprintf(buf, cap, "%s/q4khost/f2", q4kh_cache_home(cache, sizeof(cache)));
		*origin = "default";
	}
}


/* q4kh_receipt_folder_check, with the key loaded into *MAC when MAC is not
 * NULL and KEY is set (KEY 0: the folder only). */
static int check(const struct q4kh_config *c, int key, struct q4kh_receipt_mac *mac,
                 struct q4kh_error *err)
{
	char dir[4096], where[700], created[300], untrusted[700];
	const char *origin, *why;
	struct q4kh_receipt_mac own;
	struct stat st;

	q4kh_receipt_dir(c, dir, sizeof(dir), &origin);
	if (dir[0] != '/') {
		why = "a relative folder would depend on the current directory; give an absolute path";
	} else if (q4kh_mkdirs_private(dir) != 0) {
		snprintf(created, sizeof(created), "cannot create it: %s", strerror(errno));
		why = created;
	} else if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
		why = strerror(ENOTDIR); /* a file of that name: mkdir saw EEXIST */
	} else if (access(dir, W_OK | X_OK) != 0) {
		why = strerror(errno);
	} else if (stat(dir, &st) == 0 &&
	           q4kh_secure_shared(&st, "receipt folder", dir, untrusted, sizeof(untrusted))) {
		/* whoever else may write it could plant or swap receipts */
		why = untrusted;
	} else {
		return key ? q4kh_receipt_mac_load(mac ? mac : &own, err) : 0;
	}
	if (!strcmp(origin, "Q4KHOST_F2_RECEIPT_DIR"))
		return q4kh_fail(err, "Q4KHOST_F2_RECEIPT_DIR=%s: F2 cannot keep its receipts there: %s",
		                 dir, why);
	if (strcmp(origin, "default"))
		return q4kh_fail(err, "%s: receipt_dir = \"%s\": F2 cannot keep its receipts there: %s",
		                 q4kh_config_where(c, "f2", "receipt_dir", where, sizeof(where))
		                         ? where
		                         : origin,
		                 dir, why);
	return q4kh_fail(err,
	                 "%s (the default receipt folder): F2 cannot keep its receipts there: %s; "
	                 "set Q4KHOST_F2_RECEIPT_DIR or [f2] receipt_dir to a folder you may write",
	                 dir, why);
}

int q4kh_receipt_dir_check(const struct q4kh_config *c, struct q4kh_receipt_mac *mac,
                           struct q4kh_error *err)
{
	return check(c, 1, mac, err);
}

int q4kh_receipt_folder_check(const struct q4kh_config *c, struct q4kh_error *err)
{
	return check(c, 0, NULL, err);
}

void q4kh_receipt_path(const char *dir, const char *id, char *buf, size_t cap)
{
	char hex[Q4KH_SHA256_HEX];

	q4kh_sha256_bytes(id, strlen(id), hex);
	snprintf(buf, cap, "%s/%.32s.json", dir, hex);
}

static json_t *key_json(const struct q4kh_receipt_key *k)
{
	json_t *plugins = json_array();

	for (int i = 0; i < k->n_plugins; i++)
		json_array_append_new(plugins, json_pack("{s:s, s:s, s:s, s:s}", "role",
		                                         k->plugins[i].role, "name",
		                                         k->plugins[i].name, "sha256",
		                                         k->plugins[i].sha256, "settings",
		                                         k->plugins[i].settings));
	return json_pack("{s:s, s:o, s:s, s:s, s:i, s:f, s:s, s:b, s:i, s:i, s:s, s:s}",
	                 "model_sha256", k->model_sha256, "plugins", plugins,
	                 "device_uuid", k->device_uuid, "driver_version",
	                 k->driver_version, "ruleset", k->ruleset, "floor", k->floor,
	                 "arith", q4kh_f2_arith_name(k->arith), "floor_set", k->floor_set,
	                 "decode_steps", (int)k->decode_steps, "probe_tokens",
	                 (int)k->probe_tokens, "probe_sha256", k->probe_sha256,
	                 "probe", k->probe);
}

/* Copy a JSON string into a fixed field; 0 when it fits. */
static int get_str(json_t *o, const char *name, char *dst, size_t cap)
{
	const char *s = json_string_value(json_object_get(o, name));

	if (!s || strlen(s) >= cap)
		return -1;
	memcpy(dst, s, strlen(s) + 1);
	return 0;
}

static int key_parse(json_t *o, struct q4kh_receipt_key *k)
{
	json_t *plugins = json_object_get(o, "plugins"), *p;
	size_t i;

	memset(k, 0, sizeof(*k));
	if (get_str(o, "model_sha256", k->model_sha256, sizeof(k->model_sha256)) ||
	    get_str(o, "device_uuid", k->device_uuid, sizeof(k->device_uuid)) ||
	    get_str(o, "driver_version", k->driver_version, sizeof(k->driver_version)) ||
	    get_str(o, "probe_sha256", k->probe_sha256, sizeof(k->probe_sha256)) ||
	    !json_is_array(plugins) || json_array_size(plugins) > Q4KH_RECEIPT_PLUGINS)
		return -1;
	json_array_foreach(plugins, i, p) {
		if (get_str(p, "role", k->plugins[i].role, sizeof(k->plugins[i].role)) ||
		    get_str(p, "name", k->plugins[i].name, sizeof(k->plugins[i].name)) ||
		    get_str(p, "sha256", k->plugins[i].sha256, sizeof(k->plugins[i].sha256)) ||
		    get_str(p, "settings", k->plugins[i].settings, sizeof(k->plugins[i].settings)))
			return -1;
		/* Keys are compared role by role (q4kh_receipt_key_diff); we
		 * never write a role twice. */
		for (size_t j = 0; j < i; j++)
			if (!strcmp(k->plugins[j].role, k->plugins[i].role))
				return -1;
	}
	k->n_plugins = (int)json_array_size(plugins);
	k->ruleset = (int)json_integer_value(json_object_get(o, "ruleset"));
	k->floor = json_number_value(json_object_get(o, "floor"));
	k->arith = q4kh_f2_arith_of_name(json_string_value(json_object_get(o, "arith")));
	k->floor_set = json_is_true(json_object_get(o, "floor_set"));
	k->decode_steps = (uint32_t)json_integer_value(json_object_get(o, "decode_steps"));
	k->probe_tokens = (uint32_t)json_integer_value(json_object_get(o, "probe_tokens"));
	/* Receipts from before probe kinds were all of the built-in probe. */
	if (!json_object_get(o, "probe"))
		snprintf(k->probe, sizeof(k->probe), "builtin");
	else if (get_str(o, "probe", k->probe, sizeof(k->probe)))
		return -1;
	return 0;
}

static const char *const verdicts[] = { "pass", "reject", "broken", "not measured" };

void q4kh_receipt_free(struct q4kh_receipt *r)
{
	free(r->points);
	r->points = NULL;
	r->n_points = 0;
}

int q4kh_receipt_set_points(struct q4kh_receipt *r, const struct q4kh_f2_point *pts,
                            int64_t n, struct q4kh_error *err)
{
	q4kh_receipt_free(r);
	if (n <= 0)
		return 0;
	r->points = calloc((size_t)n, sizeof(*r->points));
	if (!r->points)
		return q4kh_fail(err, "receipt: out of memory for %lld points", (long long)n);
	for (int64_t i = 0; i < n; i++)
		r->points[i] = (struct q4kh_receipt_point){ pts[i].cosine, pts[i].decode_step,
			                                    pts[i].verdict, pts[i].judged,
			                                    pts[i].computed, pts[i].near_tie };
	r->n_points = n;
	return 0;
}

/*
 * A point is [cosine or null, decode step, mark]: compact, and readable
 * without this program.
 */
const char *q4kh_receipt_point_mark(const struct q4kh_receipt_point *p)
{
	if (!p->computed)
		return "skipped";
	if (!p->judged)
		return "unjudged";
	if (p->verdict == Q4KH_F2_PASS && p->near_tie)
		return "near-tie";
	return verdicts[p->verdict];
}

/*
 * ROOT as indented JSON, with the points appended one per line: a receipt
 * stays readable and small (about 50 bytes a position). A cosine keeps its
 * 17 significant digits: read back, it is the same double, so the lowest
 * and the position that decided come out as measured.
 */
static int write_json(FILE *f, json_t *root, const struct q4kh_receipt *r)
{
	char *head = json_dumps(root, JSON_INDENT(1)), *end;
	int ok;

	if (!head || !(end = strrchr(head, '}'))) {
		free(head);
		return 0;
	}
	while (end > head && end[-1] == '\n')
		end--;
	ok = fprintf(f, "%.*s,\n \"points\": [", (int)(end - head), head) > 0;
	for (int64_t i = 0; ok && i < r->n_points; i++) {
		const struct q4kh_receipt_point *p = &r->points[i];
		json_t *pt = json_pack("[o, i, s]",
		                       isfinite(p->cosine) ? json_real(p->cosine) : json_null(),
		                       (int)p->decode_step, q4kh_receipt_point_mark(p));
		char *line = pt ? json_dumps(pt, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;

		ok = line && fprintf(f, "%s\n  %s", i ? "," : "", line) > 0;
		free(line);
		json_decref(pt);
	}
	ok = ok && fprintf(f, "\n ]\n}\n") > 0;
	free(head);
	return ok;
}

static int points_parse(json_t *a, struct q4kh_receipt *r)
{
	static const char *const marks[] = { "pass", "reject", "broken", "unjudged", "near-tie",
		                             "skipped" };
	json_t *p;
	size_t i;

	if (!json_is_array(a))
		return -1;
	r->points = calloc(json_array_size(a) + 1, sizeof(*r->points));
	if (!r->points)
		return -1;
	json_array_foreach(a, i, p) {
		struct q4kh_receipt_point *pt = &r->points[i];
		json_t *c = json_array_get(p, 0);
		const char *m = json_string_value(json_array_get(p, 2));
		int k = 0;

		while (m && k < 6 && strcmp(m, marks[k]))
			k++;
		if (json_array_size(p) != 3 || !(json_is_number(c) || json_is_null(c)) ||
		    !json_is_integer(json_array_get(p, 1)) || !m || k == 6 ||
		    (k == 5 && !json_is_null(c)))
			return -1;
		pt->cosine = json_is_null(c) ? NAN : json_number_value(c);
		pt->decode_step = (int32_t)json_integer_value(json_array_get(p, 1));
		pt->judged = k != 3 && k != 5;
		pt->computed = k != 5;
		pt->near_tie = k == 4;
		pt->verdict = k < 3 ? (enum q4kh_f2_verdict)k : Q4KH_F2_PASS;
		r->n_points = (int64_t)i + 1;
	}
	return 0;
}

/* The limit a verdict was stopped by ({"kind", "value"}), when there was one. */
static void load_limit(json_t *o, struct q4kh_receipt *out)
{
	const char *kind = json_string_value(json_object_get(o, "kind"));
	json_t *v = json_object_get(o, "value");

	out->limit[0] = 0;
	out->limit_value = 0;
	if (!kind || !json_is_integer(v) || json_integer_value(v) < 0 ||
	    (strcmp(kind, "time") && strcmp(kind, "memory")))
		return;
	snprintf(out->limit, sizeof(out->limit), "%s", kind);
	out->limit_value = (uint64_t)json_integer_value(v);
}

/*
 * The file PATH into *BUF (malloc()ed, NUL-terminated; *LEN bytes):
 * opened without following a symbolic link, or blocking on a FIFO, and
 * only when it is a regular file. 0; 1 with err when there is none, or
 * when it is a symbolic link or not a regular file (it counts as none, and
 * the next receipt written replaces it); -1 with err.
 */
static int read_receipt(const char *path, char **buf, size_t *len, struct q4kh_error *err)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	ssize_t n = 0;

	*buf = NULL;
	if (fd < 0 && errno == ENOENT) {
		q4kh_fail(err, "no receipt");
		return 1;
	}
	if (fd < 0 && errno == ELOOP) {
		q4kh_fail(err, "receipt %s is a symbolic link: not followed; measuring again", path);
		return 1;
	}
	if (fd < 0)
		return q4kh_fail(err, "receipt %s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > RECEIPT_MAX_BYTES) {
		close(fd);
		q4kh_fail(err, "receipt %s is not a regular file of at most %u MiB: not read; measuring again",
		          path, RECEIPT_MAX_BYTES >> 20);
		return 1;
	}
	*buf = malloc((size_t)st.st_size + 1);
	while (*buf && (size_t)n < (size_t)st.st_size) {
		ssize_t k = read(fd, *buf + n, (size_t)st.st_size - (size_t)n);

		if (k <= 0)
			break;
		n += k;
	}
	close(fd);
	if (!*buf || n != st.st_size) {
		const int oom = !*buf;

		free(*buf);
		*buf = NULL;
		return q4kh_fail(err, "receipt %s: cannot read it%s", path, oom ? ": out of memory" : "");
	}
	(*buf)[n] = 0;
	*len = (size_t)n;
	return 0;
}

/*
 * How much of the receipt TEXT (LEN bytes) MAC covers: the bytes before
 * its MAC_START, when it ends in a MAC under K that is the MAC of them;
 * else 0.
 */
static size_t sealed_length(const struct q4kh_receipt_mac *k, const char *text, size_t len)
{
	const size_t start = strlen(MAC_START), end = strlen(MAC_END);
	size_t body;
	char mac[Q4KH_RECEIPT_MAC_HEX];

	if (len < start + 64 + end)
		return 0;
	body = len - end - 64 - start;
	if (memcmp(text + body, MAC_START, start) || memcmp(text + len - end, MAC_END, end))
		return 0;
	memcpy(mac, text + body + start, 64);
	mac[64] = 0;
	return q4kh_receipt_mac_ok(k, text, body, mac) ? body : 0;
}

/*
 * Why receipt PATH (TEXT, LEN bytes) has no MAC of ours: another
 * version's receipt (a schema number other than ours: those before 5 were
 * not sealed), else an integrity failure. Nothing of the file is quoted:
 * it may be anything, a secret file included.
 */
static int unsealed(const char *path, const char *text, size_t len, struct q4kh_error *err)
{
	json_t *root = json_loadb(text, len, 0, NULL);
	json_t *schema = json_object_get(root, "schema");

	if (json_is_integer(schema) && json_integer_value(schema) != RECEIPT_SCHEMA)
		q4kh_fail(err, "receipt %s is of schema %lld%s; this host reads sealed receipts of schema %d: measuring again",
		          path, (long long)json_integer_value(schema),
		          json_integer_value(schema) < RECEIPT_SCHEMA ? " (an earlier version's, unsigned)" : "",
		          RECEIPT_SCHEMA);
	else
		q4kh_fail(err, "receipt %s fails its integrity check: edited, or written with another key; measuring again",
		          path);
	json_decref(root);
	return 1;
}

int q4kh_receipt_load(const char *dir, const char *id, const struct q4kh_receipt_mac *k,
                      struct q4kh_receipt *out, struct q4kh_error *err)
{
	char path[4096], *text;
	const char *v, *stored_id;
	size_t len = 0, body;
	json_t *root;
	int rc;

	q4kh_receipt_path(dir, id, path, sizeof(path));
	memset(out, 0, sizeof(*out));
	if ((rc = read_receipt(path, &text, &len, err)))
		return rc;
	body = sealed_length(k, text, len);
	if (!body) {
		rc = unsealed(path, text, len, err);
		free(text);
		return rc;
	}
	/* sealed: the content is ours, and it must still parse as a receipt */
	rc = -1;
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
	free(text);
	v = json_string_value(json_object_get(root, "verdict"));
	stored_id = json_string_value(json_object_get(root, "id"));
	if (!root || json_integer_value(json_object_get(root, "schema")) != RECEIPT_SCHEMA ||
	    !stored_id || key_parse(json_object_get(root, "key"), &out->key) || !v ||
	    points_parse(json_object_get(root, "points"), out)) {
		q4kh_receipt_free(out);
		q4kh_fail(err, "%s: not a receipt of schema %d", path, RECEIPT_SCHEMA);
		goto out;
	}
	/* a sealed receipt of another candidate, copied over this one's */
	if (strcmp(stored_id, id)) {
		q4kh_receipt_free(out);
		q4kh_fail(err, "receipt %s is another candidate's (its id is not this one's): measuring again",
		          path);
		rc = 1;
		goto out;
	}
	out->verdict = Q4KH_F2_NOT_MEASURED;
	for (int i = 0; i < 4; i++)
		if (!strcmp(v, verdicts[i]))
			out->verdict = (enum q4kh_f2_verdict)i;
	out->min_cosine = json_is_number(json_object_get(root, "min_cosine"))
	                          ? json_number_value(json_object_get(root, "min_cosine"))
	                          : NAN;
	out->worst_position = json_integer_value(json_object_get(root, "worst_position"));
	out->worst_decode_step = (int32_t)json_integer_value(json_object_get(root, "worst_decode_step"));
	out->near_ties = (int)json_integer_value(json_object_get(root, "near_ties"));
	out->seconds = json_number_value(json_object_get(root, "seconds"));
	get_str(root, "message", out->message, sizeof(out->message));
	get_str(root, "created", out->created, sizeof(out->created));
	get_str(root, "host_version", out->host_version, sizeof(out->host_version));
	load_limit(json_object_get(root, "limit"), out);
	rc = 0;
out:
	json_decref(root);
	return rc;
}

/* ROOT as receipt text (write_json) with its MAC under K into the file F. */
static int write_sealed(FILE *f, json_t *root, const struct q4kh_receipt *r,
                        const struct q4kh_receipt_mac *k)
{
	char *text = NULL, mac[Q4KH_RECEIPT_MAC_HEX];
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	int ok = m && write_json(m, root, r);

	if (m)
		ok = fclose(m) == 0 && ok;
	/* write_json ends in "\n}\n": the MAC goes before the brace */
	ok = ok && len > 3;
	if (ok) {
		len -= 3;
		q4kh_receipt_mac_of(k, text, len, mac);
		ok = fwrite(text, 1, len, f) == len &&
		     fprintf(f, "%s%s%s", MAC_START, mac, MAC_END) > 0;
	}
	free(text);
	return ok;
}

int q4kh_receipt_save(const char *dir, const char *id, const struct q4kh_receipt_mac *k,
                      const struct q4kh_receipt *r, struct q4kh_error *err)
{
	char path[4096], tmp[4200], created[32];
	time_t t = time(NULL);
	struct tm tm;
	json_t *root;
	int fd, rc;
	FILE *f;

	if (q4kh_mkdirs_private(dir) != 0)
		return q4kh_fail(err, "%s: cannot create the receipt folder: %s", dir,
		                 strerror(errno));
	gmtime_r(&t, &tm);
	strftime(created, sizeof(created), Q4KH_RECEIPT_TIME_FORMAT, &tm);
	root = json_pack("{s:i, s:s, s:o, s:s, s:s, s:I, s:i, s:i, s:f, s:s, s:s}",
	                 "schema", RECEIPT_SCHEMA, "id", id, "key", key_json(&r->key),
	                 "verdict", verdicts[r->verdict], "message", r->message,
	                 "worst_position", (json_int_t)r->worst_position,
	                 "worst_decode_step", (int)r->worst_decode_step, "near_ties",
	                 r->near_ties, "seconds", r->seconds, "created", created,
	                 "host_version", PACKAGE_VERSION);
	if (!root)
		return q4kh_fail(err, "receipt: out of memory");
	/* NaN is no JSON number: a NaN minimum is written as null. */
	json_object_set_new(root, "min_cosine",
	                    isfinite(r->min_cosine) ? json_real(r->min_cosine) : json_null());
	if (r->limit[0])
		json_object_set_new(root, "limit",
		                    json_pack("{s:s, s:I}", "kind", r->limit, "value",
		                              (json_int_t)r->limit_value));
	q4kh_receipt_path(dir, id, path, sizeof(path));
	/* a new file (never one planted under its name, nor a link's target),
	 * renamed over the receipt: rename replaces a link, never follows it */
	snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
	unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	f = fd >= 0 ? fdopen(fd, "w") : NULL;
	rc = f && write_sealed(f, root, r, k) && fflush(f) == 0 && fsync(fileno(f)) == 0;
	if (f)
		rc = fclose(f) == 0 && rc;
	else if (fd >= 0)
		close(fd);
	json_decref(root);
	if (!rc || rename(tmp, path) != 0) {
		int e = errno;
		unlink(tmp);
		return q4kh_fail(err, "%s: cannot write the receipt: %s", path, strerror(e));
	}
	return 0;
}

static void short_hash(const char *h, char *buf)
{
	snprintf(buf, 16, "%.8s…", h);
}

const char *q4kh_receipt_key_diff(const struct q4kh_receipt_key *old,
                                  const struct q4kh_receipt_key *cur, char *buf,
                                  size_t cap)
{
	char a[16], b[16];

	if (strcmp(old->model_sha256, cur->model_sha256)) {
		short_hash(old->model_sha256, a);
		short_hash(cur->model_sha256, b);
		snprintf(buf, cap, "the model file changed (sha256 %s -> %s)", a, b);
		return buf;
	}
	for (int i = 0; i < cur->n_plugins; i++) {
		const struct q4kh_receipt_plugin *c = &cur->plugins[i], *o = NULL;
		for (int j = 0; j < old->n_plugins; j++)
			if (!strcmp(old->plugins[j].role, c->role))
				o = &old->plugins[j];
		if (!o || strcmp(o->name, c->name)) {
			snprintf(buf, cap, "the %s plugin is now %s", c->role, c->name);
			return buf;
		}
		if (strcmp(o->sha256, c->sha256)) {
			short_hash(o->sha256, a);
			short_hash(c->sha256, b);
			snprintf(buf, cap, "the plugin file of %s changed (sha256 %s -> %s)",
			         c->name, a, b);
			return buf;
		}
		if (strcmp(o->settings, c->settings)) {
			snprintf(buf, cap, "the settings of %s changed ([plugin.%s] \"%.60s\" -> \"%.60s\")",
			         c->name, c->name, o->settings, c->settings);
			return buf;
		}
	}
	if (old->n_plugins != cur->n_plugins)
		snprintf(buf, cap, "the set of plugins changed");
	else if (strcmp(old->device_uuid, cur->device_uuid))
		snprintf(buf, cap, "the device changed (%s -> %s)", old->device_uuid,
		         cur->device_uuid);
	else if (strcmp(old->driver_version, cur->driver_version))
		snprintf(buf, cap, "the driver changed (%s -> %s)", old->driver_version,
		         cur->driver_version);
	else if (old->ruleset != cur->ruleset)
		snprintf(buf, cap, "the F2 rule set changed (%d -> %d)", old->ruleset,
		         cur->ruleset);
	else if (old->floor != cur->floor || old->arith != cur->arith ||
	         old->floor_set != cur->floor_set || old->decode_steps != cur->decode_steps ||
	         old->probe_tokens != cur->probe_tokens)
		snprintf(buf, cap, "the F2 settings changed (floor %s, %s, %u decode steps, %u probe tokens)",
		         q4kh_f2_threshold(cur->floor).s,
		         cur->floor_set ? "set by f2_floor" : q4kh_f2_arith_name(cur->arith),
		         cur->decode_steps, cur->probe_tokens);
	else if (strcmp(old->probe, cur->probe))
		snprintf(buf, cap, "the probe changed (%s -> %s)", old->probe, cur->probe);
	else if (strcmp(old->probe_sha256, cur->probe_sha256))
		snprintf(buf, cap, "the probe's tokens changed (sha256 %.8s… -> %.8s…)",
		         old->probe_sha256, cur->probe_sha256);
	else
		return NULL;
	return buf;
}
