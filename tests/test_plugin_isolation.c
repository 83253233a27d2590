/*
 * The in-tree plugins are built as a vendor's are (docs/plugin-abi.md,
 * "The SDK's library"): what two plugins share is in the SDK, so each
 * plugin folder's sources include only their own folder's files, the
 * SDK's public headers (q4khost/...) and configure's buildconf.h, and
 * Makefile.am builds no module of one plugin folder from another's files.
 * Read from the source tree: every #include under plugins/, and every
 * SOURCES, LIBADD and object prerequisite that Makefile.am gives a module
 * or convenience library under plugins/, its $(VARIABLES) expanded.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"

#define LINE_MAX_LEN 4096
#define VARS_MAX 1024

/* What a check found wrong, one line each. */
struct findings {
	char text[16384];
	size_t len;
	int n;
};

static void found(struct findings *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void found(struct findings *f, const char *fmt, ...)
{
	va_list ap;
	int k;

	f->n++;
	if (f->len >= sizeof(f->text) - 1)
		return;
	va_start(ap, fmt);
	k = vsnprintf(f->text + f->len, sizeof(f->text) - f->len, fmt, ap);
	va_end(ap);
	if (k > 0)
		f->len += (size_t)k < sizeof(f->text) - f->len ? (size_t)k : sizeof(f->text) - f->len - 1;
}

static int is_file(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/*
 * Is the quoted include NAME, in a file of plugin folder DIR, one a
 * vendor's plugin could have: its folder's own file, an SDK header or
 * buildconf.h (what configure writes for the tree's build)?
 */
static int include_allowed(const char *dir, const char *name)
{
	char path[LINE_MAX_LEN];

	if (strstr(name, "..") || name[0] == '/')
		return 0;
	if (!strcmp(name, "buildconf.h"))
		return 1;
	if (!strncmp(name, "q4khost/", 8)) {
		snprintf(path, sizeof(path), "%s/sdk/include/%s", test_srcdir(), name);
		return is_file(path);
	}
	snprintf(path, sizeof(path), "%s/plugins/%s/%s", test_srcdir(), dir, name);
	return is_file(path);
}

/* Check every #include of FILE (plugins/DIR/BASE); count them in *N. */
static void check_includes(const char *dir, const char *base, struct findings *f, int *n)
{
	char path[LINE_MAX_LEN], line[LINE_MAX_LEN], name[LINE_MAX_LEN];
	FILE *in;
	int lineno = 0;

	snprintf(path, sizeof(path), "%s/plugins/%s/%s", test_srcdir(), dir, base);
	in = fopen(path, "r");
	cr_assert_not_null(in, "cannot read %s", path);
	while (fgets(line, sizeof(line), in)) {
		const char *p = line;
		char open;
		size_t k = 0;

		lineno++;
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p++ != '#')
			continue;
		while (*p == ' ' || *p == '\t')
			p++;
		if (strncmp(p, "include", 7))
			continue;
		for (p += 7; *p == ' ' || *p == '\t'; p++)
			;
		open = *p++;
		if (open != '"' && open != '<')
			continue;
		while (*p && *p != (open == '"' ? '"' : '>') && k < sizeof(name) - 1)
			name[k++] = *p++;
		name[k] = '\0';
		(*n)++;
		if (open == '"' ? !include_allowed(dir, name) : strstr(name, "..") != NULL)
			found(f, "plugins/%s/%s:%d: #include %c%s%c: neither this folder's file, an "
			      "SDK header (q4khost/) nor buildconf.h\n",
			      dir, base, lineno, open, name, open == '"' ? '"' : '>');
	}
	fclose(in);
}

Test(plugin_isolation, plugins_include_only_their_own_files_and_the_sdk)
{
	struct findings f = { .len = 0 };
	char path[LINE_MAX_LEN];
	struct dirent *d, *e;
	DIR *top, *sub;
	int includes = 0, folders = 0;

	snprintf(path, sizeof(path), "%s/plugins", test_srcdir());
	top = opendir(path);
	cr_assert_not_null(top, "cannot list %s", path);
	while ((d = readdir(top))) {
		if (d->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/plugins/%s", test_srcdir(), d->d_name);
		sub = opendir(path);
		if (!sub)
			continue;
		folders++;
		while ((e = readdir(sub))) {
			const char *dot = strrchr(e->d_name, '.');

			if (dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") ||
			            !strcmp(dot, ".cuh")))
				check_includes(d->d_name, e->d_name, &f, &includes);
		}
		closedir(sub);
	}
	closedir(top);
	cr_assert_geq(folders, 2, "%d plugin folders under %s/plugins", folders, test_srcdir());
	cr_assert_gt(includes, 0, "no #include read under %s/plugins", test_srcdir());
	cr_expect_eq(f.n, 0, "%d include(s) cross a plugin folder:\n%s", f.n, f.text);
}

/* Makefile.am's variables: every assignment's value, += appended. */
struct vars {
	char *name[VARS_MAX];
	char *value[VARS_MAX];
	int n;
	char **rules; /* the other logical lines (rules), NULL-terminated */
	char *text;   /* Makefile.am, which the rules point into */
};

static void vars_free(struct vars *v)
{
	for (int i = 0; i < v->n; i++) {
		free(v->name[i]);
		free(v->value[i]);
	}
	free(v->rules);
	free(v->text);
}

static const char *var_get(const struct vars *v, const char *name)
{
	for (int i = 0; i < v->n; i++)
		if (!strcmp(v->name[i], name))
			return v->value[i];
	return "";
}

static void var_add(struct vars *v, const char *name, size_t len, const char *value)
{
	char *s;
	int i;

	for (i = 0; i < v->n; i++)
		if (strlen(v->name[i]) == len && !strncmp(v->name[i], name, len))
			break;
	if (i == v->n) {
		cr_assert_lt(v->n, VARS_MAX, "more than %d variables in Makefile.am", VARS_MAX);
		v->name[v->n] = strndup(name, len);
		v->value[v->n++] = strdup("");
	}
	s = malloc(strlen(v->value[i]) + strlen(value) + 2);
	cr_assert_not_null(s);
	sprintf(s, "%s %s", v->value[i], value);
	free(v->value[i]);
	v->value[i] = s;
}

/* Makefile.am as logical lines (continuations joined), assignments in V. */
static void read_makefile(struct vars *v)
{
	char path[LINE_MAX_LEN];
	size_t len, nrules = 0;
	char *text, *line, *save;

	snprintf(path, sizeof(path), "%s/Makefile.am", test_srcdir());
	v->text = text = test_read_file(path, &len);
	cr_assert_not_null(text, "cannot read %s", path);
	for (char *p = text; (p = strstr(p, "\\\n"));)
		p[0] = p[1] = ' ';
	v->rules = calloc(len / 2 + 2, sizeof(*v->rules));
	cr_assert_not_null(v->rules);
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		size_t k = 0;
		const char *eq;

		if (line[0] == '#' || line[0] == '\t')
			continue;
		while (isalnum((unsigned char)line[k]) || line[k] == '_')
			k++;
		eq = line + k;
		while (*eq == ' ')
			eq++;
		if (k && (eq[0] == '=' || (eq[0] == '+' && eq[1] == '=')))
			var_add(v, line, k, eq + (eq[0] == '=' ? 1 : 2));
		else
			v->rules[nrules++] = line;
	}
}

/* S with every $(NAME) replaced by its value, DEPTH levels deep, into OUT. */
static void expand(const struct vars *v, const char *s, char *out, size_t cap, int depth)
{
	size_t o = 0;

	cr_assert_lt(depth, 16, "Makefile.am: variables nested too deep at %.60s", s);
	while (*s && o < cap - 1) {
		const char *end;

		if (s[0] == '$' && s[1] == '(' && (end = strchr(s, ')'))) {
			char name[256], sub[65536];

			snprintf(name, sizeof(name), "%.*s", (int)(end - s - 2), s + 2);
			expand(v, var_get(v, name), sub, sizeof(sub), depth + 1);
			o += (size_t)snprintf(out + o, cap - o, "%s", sub);
			if (o >= cap)
				o = cap - 1;
			s = end + 1;
		} else {
			out[o++] = *s++;
		}
	}
	out[o] = '\0';
}

/* Check that every plugins/... word of WHAT (for TARGET) is in folder DIR. */
static void check_words(const char *target, const char *dir, const char *field, const char *what,
                        struct findings *f)
{
	static char words[65536];
	char *w, *save;

	snprintf(words, sizeof(words), "%s", what);
	for (w = strtok_r(words, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
		const char *p = strstr(w, "plugins/");

		if (!p || (p != w && p[-1] != '/'))
			continue;
		p += 8;
		if (strncmp(p, dir, strlen(dir)) || p[strlen(dir)] != '/')
			found(f, "Makefile.am: %s %s takes %s, from another plugin folder than %s\n",
			      target, field, w, dir);
	}
}

/* The canonical variable prefix automake gives TARGET (plugins/a-b/c.la:
 * plugins_a_b_c_la) into CANON. */
static void canon_of(const char *target, char *canon, size_t cap)
{
	snprintf(canon, cap, "%s", target);
	for (char *c = canon; *c; c++)
		if (!isalnum((unsigned char)*c) && *c != '_' && *c != '@')
			*c = '_';
}

/*
 * The plugin folder whose files TARGET (of canonical prefix CANON) may
 * take, into DIR: its own, or, for a second build of another plugin's
 * sources (its SOURCES exactly "$(OTHER_SOURCES)" of a target of ALL, as
 * cpu-simd8 is cpu-simd's with -DSIMD_INT8), that plugin's folder.
 */
static void source_folder(const struct vars *v, const char *all, const char *target,
                          const char *canon, char *dir, size_t cap)
{
	static char copy[65536];
	char key[600], other[512], ref[600], *t, *save;
	const char *raw, *slash = strchr(target + 8, '/');

	snprintf(dir, cap, "%.*s", (int)(slash - target - 8), target + 8);
	snprintf(key, sizeof(key), "%s_SOURCES", canon);
	raw = var_get(v, key);
	raw += strspn(raw, " \t"); /* var_add joins the parts with spaces */
	snprintf(copy, sizeof(copy), "%s", all);
	for (t = strtok_r(copy, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
		if (strncmp(t, "plugins/", 8) || !(slash = strchr(t + 8, '/')))
			continue;
		canon_of(t, other, sizeof(other));
		snprintf(ref, sizeof(ref), "$(%s_SOURCES)", other);
		if (strcmp(other, canon) && !strncmp(raw, ref, strlen(ref)) &&
		    !raw[strlen(ref) + strspn(raw + strlen(ref), " \t")])
			snprintf(dir, cap, "%.*s", (int)(slash - t - 8), t + 8);
	}
}

Test(plugin_isolation, makefile_builds_no_plugin_from_another_plugins_files)
{
	static const char *const fields[] = { "SOURCES", "LIBADD", "DEPENDENCIES" };
	static char targets[65536], value[65536], all[65536];
	struct findings f = { .len = 0 };
	struct vars v = { .n = 0 };
	char *t, *save;
	int checked = 0, cpu = 0;

	read_makefile(&v);
	snprintf(value, sizeof(value), "%s %s %s", var_get(&v, "plugin_LTLIBRARIES"),
	         var_get(&v, "noinst_LTLIBRARIES"), var_get(&v, "noinst_LIBRARIES"));
	expand(&v, value, targets, sizeof(targets), 0);
	snprintf(all, sizeof(all), "%s", targets);
	for (t = strtok_r(targets, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
		char canon[512], dir[256], key[600], objects[600];

		if (strncmp(t, "plugins/", 8) || !strchr(t + 8, '/'))
			continue;
		canon_of(t, canon, sizeof(canon));
		source_folder(&v, all, t, canon, dir, sizeof(dir));
		for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
			snprintf(key, sizeof(key), "%s_%s", canon, fields[i]);
			expand(&v, var_get(&v, key), value, sizeof(value), 0);
			check_words(t, dir, fields[i], value, &f);
		}
		/* $(TARGET_OBJECTS): prerequisites (nvcc writes no dependency files) */
		snprintf(objects, sizeof(objects), "$(%s_OBJECTS):", canon);
		for (char **r = v.rules; *r; r++)
			if (!strncmp(*r, objects, strlen(objects))) {
				expand(&v, *r + strlen(objects), value, sizeof(value), 0);
				check_words(t, dir, "prerequisites", value, &f);
			}
		checked++;
		cpu += !strcmp(t, "plugins/cpu/cpu.la");
	}
	vars_free(&v);
	cr_assert_eq(cpu, 1, "Makefile.am: plugins/cpu/cpu.la not among the plugin modules");
	cr_assert_geq(checked, 2, "Makefile.am: %d plugin modules and libraries found", checked);
	cr_expect_eq(f.n, 0, "%d plugin build(s) take another plugin's files:\n%s", f.n, f.text);
}
