/*
 * Layered configuration: each file that exists becomes one iniparser
 * dictionary; a lookup walks the layers from the highest down. Values are
 * only ever read with iniparser_getstring (see config.h).
 */
#include "buildconf.h"

#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <iniparser.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

/*
 * iniparser 4.1 reads lines into a 1024-byte buffer with fgets: a line of
 * more than 1022 characters plus its newline does not fit and fails.
 */
#define INI_LINE_MAX 1022

struct layer {
	char *path; /* the file, or the origin of an override */
	dictionary *dict;
	int is_file;
};

struct q4kh_config {
	struct layer *layers;
	size_t n_layers;
};

const char *q4kh_env(const char *name)
{
#ifdef HAVE_SECURE_GETENV
	return secure_getenv(name);
#else
	return getenv(name);
#endif
}

const char *q4kh_home(void)
{
	const char *home = q4kh_env("HOME");
	const struct passwd *pw;

	if (home && home[0] == '/')
		return home;
	pw = getpwuid(geteuid());
	return pw && pw->pw_dir ? pw->pw_dir : "";
}

const char *q4kh_cache_home(char *buf, size_t cap)
{
	const char *cache = q4kh_env("XDG_CACHE_HOME");

	if (cache && cache[0] == '/') {
		snprintf(buf, cap, "%s", cache);
		return buf;
	}
	snprintf(buf, cap, "%s/.cache", q4kh_home());
	return buf;
}

const char *q4kh_config_home(char *buf, size_t cap)
{
	const char *xdg = q4kh_env("XDG_CONFIG_HOME");

	/* The XDG base directory spec ignores a relative XDG_CONFIG_HOME. */
	if (xdg && xdg[0] == '/')
		snprintf(buf, cap, "%s", xdg);
	else
		snprintf(buf, cap, "%s/.config", q4kh_home());
	return buf;
}

int q4kh_mkdirs_private(const char *dir)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s", dir);
	for (char *p = path + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			if (mkdir(path, 0700) != 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* iniparser would print its own diagnostics to stderr; we word our own. */
static int ini_quiet(const char *fmt, ...)
{
	(void)fmt;
	return 0;
}

static char *trim(char *s)
{
	char *end = s + strlen(s);

	while (isspace((unsigned char)*s))
		s++;
	while (end > s && isspace((unsigned char)end[-1]))
		end--;
	*end = 0;
	return s;
}

/* 1 when the trimmed line S is one iniparser accepts on its own. */
static int ini_line_ok(const char *s)
{
	size_t len = strlen(s);
	const char *eq;

	if (len == 0 || s[0] == ';' || s[0] == '#')
		return 1;
	if (s[0] == '[')
		return len >= 2 && s[len - 1] == ']';
	eq = strchr(s, '=');
	return eq && eq > s;
}

/* The text of LINE without its trailing newline; its length in *len. */
static char *chomp(char *line, ssize_t n, size_t *len)
{
	*len = (size_t)n;
	if (*len > 0 && line[*len - 1] == '\n')
		line[--*len] = 0;
	return line;
}

/*
 * iniparser_load says only that a file failed; find the first line it
 * would refuse so the message can name it. Lines joined by a trailing
 * backslash are judged by their first part.
 */
static int explain_bad_file(const char *path, struct q4kh_error *err)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, len;
	ssize_t n;
	unsigned lineno = 0;
	int joined = 0;

	if (!f)
		return q4kh_fail(err, "%s: cannot read: %s", path, strerror(errno));
	q4kh_fail(err, "%s: not a valid INI file (iniparser refused it)", path);
	while ((n = getline(&line, &cap, f)) >= 0) {
		char *s = trim(chomp(line, n, &len));
		int was_joined = joined;

		lineno++;
		if (len > INI_LINE_MAX) {
			q4kh_fail(err, "%s:%u: line of %zu bytes is longer than the %d that iniparser reads",
			          path, lineno, len, INI_LINE_MAX);
			break;
		}
		joined = *s && s[strlen(s) - 1] == '\\';
		if (joined)
			s[strlen(s) - 1] = 0;
		if (!was_joined && !ini_line_ok(s)) {
			char shown[4 * 80 + 8];
			q4kh_fail(err, "%s:%u: expected [section], key = value, a comment or a blank line; found \"%s\"",
			          path, lineno,
			          q4kh_show(shown, sizeof(shown), s, strlen(s), 80, 0));
			break;
		}
	}
	free(line);
	fclose(f);
	return -1;
}

/*
 * Append PATH as the next layer. A missing optional file is skipped; any
 * other failure is an error naming the file.
 */
static int add_layer(struct q4kh_config *c, const char *path, int required,
                     struct q4kh_error *err)
{
	struct layer *grown;
	struct stat st;
	char bom[3];
	FILE *f;
	dictionary *d;

	if (stat(path, &st) != 0) {
		if ((errno == ENOENT || errno == ENOTDIR) && !required)
			return 0;
		return q4kh_fail(err, "%s: %s", path, strerror(errno));
	}
	if (S_ISDIR(st.st_mode))
		return q4kh_fail(err, "%s: is a folder, expected an INI file", path);
	f = fopen(path, "r");
	if (!f)
		return q4kh_fail(err, "%s: cannot read: %s", path, strerror(errno));
	/* iniparser would take the mark for part of the first line, and a
	 * message quoting it would show an invisible character. */
	if (fread(bom, 1, 3, f) == 3 && !memcmp(bom, "\xef\xbb\xbf", 3)) {
		fclose(f);
		return q4kh_fail(err, "%s:1: the file starts with a UTF-8 byte order mark (bytes EF BB BF), which an INI file must not have; save it as UTF-8 without BOM",
		                 path);
	}
	fclose(f);

	iniparser_set_error_callback(ini_quiet);
	d = iniparser_load(path);
	if (!d)
		return explain_bad_file(path, err);

	grown = realloc(c->layers, (c->n_layers + 1) * sizeof(*grown));
	if (!grown) {
		iniparser_freedict(d);
		return q4kh_fail(err, "%s: out of memory", path);
	}
	c->layers = grown;
	c->layers[c->n_layers].dict = d;
	c->layers[c->n_layers].is_file = 1;
	c->layers[c->n_layers].path = strdup(path);
	if (!c->layers[c->n_layers].path) {
		iniparser_freedict(d);
		return q4kh_fail(err, "%s: out of memory", path);
	}
	c->n_layers++;
	return 0;
}

static int join_layer(struct q4kh_config *c, const char *dir, const char *name,
                      int required, struct q4kh_error *err)
{
	char path[4096];

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path))
		return q4kh_fail(err, "%s/%s: path too long", dir, name);
	return add_layer(c, path, required, err);
}

static int is_ini_name(const struct dirent *e)
{
	size_t len = strlen(e->d_name);

	return e->d_name[0] != '.' && len > 4 &&
	       strcmp(e->d_name + len - 4, ".ini") == 0;
}

/* Byte order, not the locale's: the layer order must not depend on LANG. */
static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static int add_conf_d(struct q4kh_config *c, const char *sysconfdir,
                      struct q4kh_error *err)
{
	char dir[4096];
	struct dirent **names;
	int n, rc = 0;

	if ((size_t)snprintf(dir, sizeof(dir), "%s/conf.d", sysconfdir) >= sizeof(dir))
		return q4kh_fail(err, "%s/conf.d: path too long", sysconfdir);
	n = scandir(dir, &names, is_ini_name, by_name);
	if (n < 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return 0;
		return q4kh_fail(err, "%s: %s", dir, strerror(errno));
	}
	for (int i = 0; i < n; i++) {
		if (rc == 0)
			rc = join_layer(c, dir, names[i]->d_name, 0, err);
		free(names[i]);
	}
	free(names);
	return rc;
}

static int add_user_file(struct q4kh_config *c, struct q4kh_error *err)
{
	const char *xdg = q4kh_env("XDG_CONFIG_HOME");
	char dir[4096];

	if (!(xdg && xdg[0] == '/') && !*q4kh_home())
		return 0; /* no home folder at all: no user file */
	return join_layer(c, q4kh_config_home(dir, sizeof(dir)), "q4khost/q4khost.ini", 0, err);
}

int q4kh_config_load(const char *sysconfdir, const char *cli_file,
                     struct q4kh_config **out, struct q4kh_error *err)
{
	struct q4kh_config *c = calloc(1, sizeof(*c));
	const char *env = NULL;

	*out = NULL;
	if (!c)
		return q4kh_fail(err, "configuration: out of memory");
	if (!sysconfdir)
		sysconfdir = Q4KH_SYSCONFDIR;
	/* Q4KHOST_CONFIG names the extra file when --config does not. */
	if (!cli_file) {
		env = q4kh_env("Q4KHOST_CONFIG");
		cli_file = env && *env ? env : NULL;
	}
	if (join_layer(c, sysconfdir, "q4khost.ini", 0, err) != 0 ||
	    add_conf_d(c, sysconfdir, err) != 0 || add_user_file(c, err) != 0)
		goto fail;
	if (cli_file && add_layer(c, cli_file, 1, err) != 0) {
		/* say where the name came from: a user who typed neither may
		 * not know which of the two set it */
		char why[sizeof(err->msg)];

		snprintf(why, sizeof(why), "%s", err->msg);
		q4kh_fail(err, "%.900s (from %s)", why,
		          cli_file == env ? "Q4KHOST_CONFIG" : "--config");
		goto fail;
	}
	*out = c;
	return 0;
fail:
	q4kh_config_free(c);
	return -1;
}

int q4kh_config_whole(const struct q4kh_config *c, const char *section, const char *key,
                      uint64_t lo, uint64_t hi, uint64_t *v, char *origin, size_t cap,
                      struct q4kh_error *err)
{
	char where[600], *end;
	const char *s = q4kh_config_where(c, section, key, where, sizeof(where));
	unsigned long long n;

	if (!s)
		return 0;
	errno = 0;
	n = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || n < lo || n > hi)
		return q4kh_fail(err, "%s: %s = \"%s\": expected a whole number from %llu to %llu",
		                 where, key, s, (unsigned long long)lo, (unsigned long long)hi);
	*v = n;
	snprintf(origin, cap, "%s", where);
	return 0;
}

void q4kh_config_free(struct q4kh_config *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_layers; i++) {
		iniparser_freedict(c->layers[i].dict);
		free(c->layers[i].path);
	}
	free(c->layers);
	free(c);
}

int q4kh_config_set(struct q4kh_config *c, const char *section,
                    const char *key, const char *value, const char *origin,
                    struct q4kh_error *err)
{
	char full[1024];
	struct layer *top = c->n_layers ? &c->layers[c->n_layers - 1] : NULL;

	if ((size_t)snprintf(full, sizeof(full), "%s:%s", section, key) >= sizeof(full))
		return q4kh_fail(err, "%s: setting %s:%s: name too long", origin,
		                 section, key);
	/* Each override is a layer of its own, so it names its origin. */
	if (!top || strcmp(top->path, origin) != 0) {
		struct layer *grown = realloc(c->layers, (c->n_layers + 1) * sizeof(*grown));
		if (!grown)
			return q4kh_fail(err, "%s: out of memory", origin);
		c->layers = grown;
		top = &c->layers[c->n_layers];
		top->dict = dictionary_new(0);
		top->path = strdup(origin);
		top->is_file = 0;
		if (!top->dict || !top->path) {
			if (top->dict)
				dictionary_del(top->dict);
			free(top->path);
			return q4kh_fail(err, "%s: out of memory", origin);
		}
		c->n_layers++;
	}
	if (iniparser_set(top->dict, section, NULL) != 0 ||
	    iniparser_set(top->dict, full, value) != 0)
		return q4kh_fail(err, "%s: out of memory", origin);
	return 0;
}

/* The highest layer that sets SECTION:KEY, or NULL; its value in *value. */
static const struct layer *lookup(const struct q4kh_config *c, const char *section,
                                  const char *key, const char **value)
{
	char full[1024];

	if (!c || !section || !key)
		return NULL;
	if ((size_t)snprintf(full, sizeof(full), "%s:%s", section, key) >= sizeof(full))
		return NULL;
	for (size_t i = c->n_layers; i-- > 0;) {
		*value = iniparser_getstring(c->layers[i].dict, full, NULL);
		if (*value)
			return &c->layers[i];
	}
	return NULL;
}

const char *q4kh_config_get(const struct q4kh_config *c, const char *section,
                            const char *key, const char **origin)
{
	const char *v = NULL;
	const struct layer *l = lookup(c, section, key, &v);

	if (origin)
		*origin = l ? l->path : NULL;
	return l ? v : NULL;
}

static void lower(char *s)
{
	for (; *s; s++)
		*s = (char)tolower((unsigned char)*s);
}

/*
 * Walk the key lines of the INI file PATH as iniparser reads them: FN gets
 * the section and key (trimmed and lower-cased, as iniparser stores them;
 * section "" before the first header) and the line number. A line ending
 * in a backslash continues on the next, which is no key line.
 */
static void scan_keys(const char *path, q4kh_config_key_fn fn, void *data)
{
	FILE *f = fopen(path, "r");
	char *line = NULL, section[1024] = "";
	size_t cap = 0, len;
	ssize_t n;
	unsigned lineno = 0;
	int joined = 0;

	if (!f)
		return;
	while ((n = getline(&line, &cap, f)) >= 0) {
		char *s = trim(chomp(line, n, &len)), *eq;
		int was_joined = joined;

		lineno++;
		joined = *s && s[strlen(s) - 1] == '\\';
		if (was_joined || !*s || *s == ';' || *s == '#')
			continue;
		if (*s == '[') {
			s[strcspn(s, "]")] = 0;
			snprintf(section, sizeof(section), "%s", trim(s + 1));
			lower(section);
			continue;
		}
		eq = strchr(s, '=');
		if (!eq)
			continue;
		*eq = 0;
		s = trim(s);
		lower(s);
		fn(data, path, lineno, section, s);
	}
	free(line);
	fclose(f);
}

void q4kh_config_each(const struct q4kh_config *c, q4kh_config_key_fn fn, void *data)
{
	for (size_t i = 0; c && i < c->n_layers; i++)
		if (c->layers[i].is_file)
			scan_keys(c->layers[i].path, fn, data);
}

struct find_line {
	char section[1024], key[1024];
	unsigned line;
};

static void match_line(void *data, const char *file, unsigned line,
                       const char *section, const char *key)
{
	struct find_line *fl = data;

	(void)file;
	/* iniparser keeps the last value of a key set twice. */
	if (!strcmp(section, fl->section) && !strcmp(key, fl->key))
		fl->line = line;
}

const char *q4kh_config_where(const struct q4kh_config *c, const char *section,
                              const char *key, char *origin, size_t cap)
{
	const char *v = NULL;
	const struct layer *l = lookup(c, section, key, &v);
	struct find_line fl = { .line = 0 };

	if (!l)
		return NULL;
	if (!l->is_file) {
		snprintf(origin, cap, "%s", l->path);
		return v;
	}
	snprintf(fl.section, sizeof(fl.section), "%s", section);
	snprintf(fl.key, sizeof(fl.key), "%s", key);
	lower(fl.section);
	lower(fl.key);
	scan_keys(l->path, match_line, &fl);
	if (fl.line)
		snprintf(origin, cap, "%s:%u [%s]", l->path, fl.line, fl.section);
	else
		snprintf(origin, cap, "%s [%s]", l->path, fl.section);
	return v;
}

/* strcmp for qsort over an array of strings. */
static int by_string(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

size_t q4kh_config_section_keys(const struct q4kh_config *c, const char *section,
                                const char *skip, const char **keys, size_t cap)
{
	size_t n = 0;
	char sec[256];

	snprintf(sec, sizeof(sec), "%s", section);
	lower(sec);
	for (size_t i = 0; c && i < c->n_layers; i++) {
		dictionary *d = c->layers[i].dict;
		int nk = iniparser_getsecnkeys(d, sec);
		const char **lk;

		if (nk <= 0 || !(lk = calloc((size_t)nk, sizeof(*lk))))
			continue;
		iniparser_getseckeys(d, sec, lk);
		for (int k = 0; k < nk && n < cap; k++) {
			const char *name = strchr(lk[k], ':') + 1;
			size_t j = 0;

			while (j < n && strcmp(keys[j], name))
				j++;
			if (j == n && !(skip && !strncmp(name, skip, strlen(skip))))
				keys[n++] = name;
		}
		free(lk);
	}
	qsort(keys, n, sizeof(keys[0]), by_string);
	return n;
}

int q4kh_config_section_text(const struct q4kh_config *c, const char *section,
                             const char *skip, char *buf, size_t cap)
{
	const char *keys[256];
	size_t n = q4kh_config_section_keys(c, section, skip, keys, 256), used = 0;

	buf[0] = 0;
	for (size_t k = 0; k < n; k++) {
		const char *v = q4kh_config_get(c, section, keys[k], NULL);
		int w = snprintf(buf + used, cap - used, "%s%s=%s", k ? "; " : "", keys[k],
		                 v ? v : "");

		if (w < 0 || (size_t)w >= cap - used)
			return -1;
		used += (size_t)w;
	}
	return 0;
}

void q4kh_config_each_set(const struct q4kh_config *c, q4kh_config_set_fn fn, void *data)
{
	for (size_t i = 0; c && i < c->n_layers; i++) {
		dictionary *d = c->layers[i].dict;

		if (c->layers[i].is_file)
			continue;
		for (int s = 0; s < iniparser_getnsec(d); s++) {
			const char *sec = iniparser_getsecname(d, s);
			int nk = iniparser_getsecnkeys(d, sec);
			const char **lk = nk > 0 ? calloc((size_t)nk, sizeof(*lk)) : NULL;

			if (!lk)
				continue;
			iniparser_getseckeys(d, sec, lk);
			for (int k = 0; k < nk; k++)
				fn(data, sec, strchr(lk[k], ':') + 1,
				   iniparser_getstring(d, lk[k], ""), c->layers[i].path);
			free(lk);
		}
	}
}
