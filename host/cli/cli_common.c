/*
 * What every command shares: one wording for command-line mistakes, and
 * the config with its warnings (an ignored environment among them).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "config_keys.h"
#include "enumerate.h"
#include "guard.h"
#include "model.h"
#include "policy.h"
#include "secure.h"
#include "select.h"
#include "settings.h"

/* What the last usage error said, for a --json object. */
static char usage_said[1024];

void q4kh_cli_usage(const char *command, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(usage_said, sizeof(usage_said), fmt, ap);
	va_end(ap);
	fprintf(stderr, "q4khost %s: %s\n", command, usage_said);
}

const char *q4kh_cli_usage_said(void)
{
	return usage_said;
}

int q4kh_cli_bad_option(const char *command, char **argv, int c)
{
	const char *arg = argv[optind - 1];
	int len = (int)strcspn(arg, "="); /* --name=value names --name */

	if (c == ':')
		q4kh_cli_usage(command, "option '%.*s' needs a value (try q4khost %s --help)", len,
		               arg, command);
	else if (optopt && !strncmp(arg, "--", 2) && arg[len]) /* --json=1: known, given a value */
		q4kh_cli_usage(command, "option '%.*s' takes no value (try q4khost %s --help)", len,
		               arg, command);
	else if (optopt && strncmp(arg, "--", 2)) /* short, maybe among others: -xv */
		q4kh_cli_usage(command, "unknown option '-%c' (try q4khost %s --help)", optopt,
		               command);
	else
		q4kh_cli_usage(command, "unknown option '%.*s' (try q4khost %s --help)", len, arg,
		               command);
	return Q4KH_EXIT_USAGE;
}

int q4kh_cli_extra_argument(const char *command, const char *arg)
{
	q4kh_cli_usage(command, "unexpected argument '%s': %s takes options only (try q4khost %s "
	               "--help)", arg, command, command);
	return Q4KH_EXIT_USAGE;
}

/*
 * Say that S, the value of WHAT of COMMAND, is not KIND ("a whole
 * number") in RANGE ("[1, 64]"): empty, or junk, white space around it
 * included (strtol and strtod would skip it before the number). -1.
 */
static int bad_number(const char *command, const char *what, const char *kind,
                      const char *range, const char *s)
{
	size_t len = strlen(s);

	if (!len)
		q4kh_cli_usage(command, "%s: the value is empty; expected %s in %s", what, kind, range);
	else
		q4kh_cli_usage(command, "%s must be %s in %s, got '%s'%s", what, kind, range, s,
		               isspace((unsigned char)s[0]) || isspace((unsigned char)s[len - 1])
		                       ? " (white space around it is not allowed)"
		                       : "");
	return -1;
}

int q4kh_cli_parse_long(const char *command, const char *s, const char *what, long lo,
                        long hi, long *out)
{
	char *end, range[64];
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || isspace((unsigned char)*s) || v < lo || v > hi) {
		snprintf(range, sizeof(range), "[%ld, %ld]", lo, hi);
		return bad_number(command, what, "a whole number", range, s);
	}
	*out = v;
	return 0;
}

int q4kh_cli_parse_double(const char *command, const char *s, const char *what, double lo,
                          double hi, double *out)
{
	char *end, range[64];
	double v;

	errno = 0;
	v = strtod(s, &end);
	/* decimal only: strtod would also read 0x1 as one */
	if (errno || end == s || *end || isspace((unsigned char)*s) || strpbrk(s, "xX") ||
	    !(v >= lo && v <= hi)) {
		snprintf(range, sizeof(range), "[%g, %g]", lo, hi);
		return bad_number(command, what, "a number", range, s);
	}
	*out = v;
	return 0;
}

int q4kh_cli_not_empty(const char *command, const char *option, const char *value,
                       const char *expected)
{
	if (!value || *value)
		return 0;
	q4kh_cli_usage(command, "%s '': an empty value is not allowed; expected %s", option,
	               expected);
	return -1;
}

/* The place (from 1) of LIST's first entry with no name ("a,,b": 2; in
 * "0=a,1=", 2), or 0 when every entry has one. */
static int empty_entry(const char *list)
{
	int place = 1;

	for (const char *e = list;; place++) {
		size_t len = strcspn(e, ",");
		const char *eq = memchr(e, '=', len);

		if (!len || (eq && eq + 1 == e + len))
			return place;
		if (!e[len])
			return 0;
		e += len + 1;
	}
}

int q4kh_cli_given_check(const char *command, const struct q4kh_cli_given *g)
{
	static const char *const kernels =
	        "kernel variant names, NAME[,NAME...], each maybe DEVICE=NAME, or none for the "
	        "built-in kernels (q4khost plugins lists the variants)";
	int place;

	if (q4kh_cli_not_empty(command, "--model", g->model, "the path of a GGUF file (or no "
	                       "--model, for the default model)") ||
	    q4kh_cli_not_empty(command, "--config", g->config, "the path of an INI file") ||
	    q4kh_cli_not_empty(command, "--plugin-path", g->plugin_path,
	                       "':'-separated plugin folders") ||
	    q4kh_cli_not_empty(command, "--backend", g->backend,
	                       "the name of a backend plugin (q4khost plugins lists them)") ||
	    q4kh_cli_not_empty(command, g->kernel_option, g->kernel, kernels))
		return -1;
	if (g->kernel && (place = empty_entry(g->kernel))) {
		q4kh_cli_usage(command, "%s '%s': entry %d of the list has no name; expected %s",
		               g->kernel_option, g->kernel, place, kernels);
		return -1;
	}
	return 0;
}

int q4kh_cli_common_option(const char *command, int c, long device_max, int measure,
                           struct q4kh_cli_common *o)
{
	switch (c) {
	case 'm': o->model = optarg; break;
	case Q4KH_OPT_BACKEND: o->backend = optarg; break;
	case Q4KH_OPT_KERNEL: o->kernel = optarg; break;
	case Q4KH_OPT_PPATH: o->plugin_path = optarg; break;
	case Q4KH_OPT_CONFIG: o->config_file = optarg; break;
	case Q4KH_OPT_JSON: o->json = 1; break;
	case Q4KH_OPT_REVALIDATE:
		o->f2 = "fresh";
		o->mode = Q4KH_F2_FRESH;
		break;
	case Q4KH_OPT_F2:
		if (measure && q4kh_cli_f2_measure_mode(command, optarg, &o->mode))
			return -1;
		o->f2 = optarg;
		break;
	case Q4KH_OPT_DEVICE:
		if (q4kh_cli_parse_long(command, optarg, "--device", 0, device_max, &o->device))
			return -1;
		o->device_set = 1;
		break;
	case Q4KH_OPT_TIMEOUT:
		if (q4kh_cli_timeout(command, optarg, &o->timeout))
			return -1;
		break;
	default: return 0;
	}
	return 1;
}

int q4kh_cli_common_check(const char *command, const char *kernel_option,
                          const struct q4kh_cli_common *o)
{
	return q4kh_cli_given_check(command, &(struct q4kh_cli_given){ o->model, o->config_file,
	                                                     o->plugin_path, o->backend,
	                                                     kernel_option, o->kernel });
}

void q4kh_cli_json_error(const char *message)
{
	json_t *j = json_pack("{s:s}", "error", message);

	json_dumpf(j, stdout, JSON_INDENT(2));
	fputc('\n', stdout);
	json_decref(j);
}

int q4kh_cli_error(const char *command, int json, int rc, const char *message)
{
	if (json)
		q4kh_cli_json_error(message);
	fprintf(stderr, "q4khost %s: %s\n", command, message);
	return rc;
}

int q4kh_cli_json_asked(int argc, char **argv, const char *shorts,
                        const struct option *longs, int json_val)
{
	int c, json = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, shorts, longs, NULL)) != -1)
		json |= c == json_val;
	return json;
}

int q4kh_cli_f2_measure_mode(const char *command, const char *value,
                             enum q4kh_f2_mode *out)
{
	if (q4kh_f2_mode_parse(value, out) || (*out != Q4KH_F2_AUTO && *out != Q4KH_F2_FRESH)) {
		q4kh_cli_usage(command, "--f2 '%s' is not one of auto, fresh", value);
		return -1;
	}
	return 0;
}

int q4kh_cli_f2_measure_env(const char *command, struct q4kh_cli_common *o,
                            struct q4kh_error *err)
{
	const char *v = q4kh_env("Q4KHOST_F2");
	enum q4kh_f2_mode mode;

	if (o->f2 || !v || !*v)
		return 0;
	if (q4kh_f2_mode_parse(v, &mode) || (mode != Q4KH_F2_AUTO && mode != Q4KH_F2_FRESH))
		return q4kh_fail(err, "Q4KHOST_F2=%.64s: %s measures F2 and takes auto (use valid "
		                 "receipts) or fresh (measure again); unset the variable or give "
		                 "--f2", v, command);
	o->mode = mode;
	if (mode == Q4KH_F2_FRESH)
		o->fresh_source = "Q4KHOST_F2=fresh";
	return 0;
}

int q4kh_cli_timeout(const char *command, const char *value, long *out)
{
	return q4kh_cli_parse_long(command, value, "--timeout (seconds)", 1, Q4KH_TIMEOUT_MAX_S,
	                           out);
}

/*
 * INSTALLED, unless it is not there (MODE: access(2)'s) and the source
 * tree's REL is: then its canonical path (configure may have been given
 * a relative path to itself), in BUF of PATH_MAX bytes.
 */
static const char *installed_or_source(const char *installed, const char *rel, int mode,
                                       char *buf)
{
	char source[PATH_MAX + 64];

	snprintf(source, sizeof(source), "%s/%s", Q4KH_SRCDIR, rel);
	if (access(installed, mode) == 0 || access(source, mode) != 0 || !realpath(source, buf))
		return installed;
	return buf;
}

const char *q4kh_cli_doc(const char *name)
{
	static char installed[PATH_MAX], rel[PATH_MAX], buf[PATH_MAX];

	snprintf(installed, sizeof(installed), "%s/%s", Q4KH_DOCDIR, name);
	snprintf(rel, sizeof(rel), "docs/%s", name);
	return installed_or_source(installed, rel, R_OK, buf);
}

const char *q4kh_cli_fetch_hint(void)
{
	static char hint[PATH_MAX + 32], buf[PATH_MAX];
	const char *script = installed_or_source(Q4KH_PKGDATADIR "/fetch-model.sh",
	                                         "scripts/fetch-model.sh", X_OK, buf);

	if (access(script, X_OK) != 0)
		return "fetch it with scripts/fetch-model.sh in q4khost's source tree";
	snprintf(hint, sizeof(hint), "fetch it with %s", script);
	return hint;
}

const char *q4kh_cli_model(const char *given, char *buf, size_t cap, struct q4kh_error *err)
{
	const char *env = q4kh_env("Q4KHOST_MODEL");

	struct stat st;

	if (given)
		return given;
	if (stat(q4kh_default_model_path(buf, cap), &st) == 0) {
		if (S_ISREG(st.st_mode) || !env || !*env)
			return buf;
		q4kh_fail(err, "%s (from Q4KHOST_MODEL): expected a GGUF model file, found %s", buf,
		          S_ISDIR(st.st_mode) ? "a directory" : "no regular file");
		return NULL;
	}
	if (env && *env)
		q4kh_fail(err, "%s (from Q4KHOST_MODEL): %s", buf, strerror(errno));
	else
		q4kh_fail(err, "%s: no such file (the default model: %s, or pass a model file)", buf,
		          q4kh_cli_fetch_hint());
	return NULL;
}

void q4kh_cli_warn_line(void *command, const char *line)
{
	fprintf(stderr, "q4khost %s: warning: %s\n", (const char *)command, line);
}

/* Said once, so a privileged user sees why their variables do nothing. */
static void warn_ignored_env(const char *command)
{
	static const char *const xdg[] = { "XDG_CONFIG_HOME", "XDG_CACHE_HOME" };
	char names[1024];

	if (q4kh_secure_mode() && q4kh_secure_env_names(names, sizeof(names)) > 0) {
		fprintf(stderr,
		        "q4khost %s: running set-uid or set-gid: ignoring the environment variables %s\n",
		        command, names);
		return;
	}
	/* The XDG base directory spec: a relative value is invalid, ignored. */
	for (int i = 0; i < 2; i++) {
		const char *v = q4kh_env(xdg[i]);

		if (v && *v && v[0] != '/')
			fprintf(stderr, "q4khost %s: warning: %s=%s is a relative path, which the XDG "
			        "base directory spec says to ignore: using %s/%s\n", command, xdg[i], v,
			        q4kh_home(), i ? ".cache" : ".config");
	}
}

int q4kh_cli_config(const char *command, const char *file, int quiet,
                    struct q4kh_config **out, struct q4kh_error *err)
{
	if (!quiet)
		warn_ignored_env(command);
	/* before the files: a misspelt variable may be why one is missing */
	if (!quiet && !q4kh_secure_mode()) /* else every variable is ignored, said above */
		q4kh_env_check(q4kh_cli_warn_line, (void *)command);
	if (q4kh_config_load(NULL, file, out, err))
		return -1;
	if (!quiet)
		q4kh_config_check(*out, q4kh_cli_warn_line, (void *)command);
	return 0;
}

int q4kh_cli_scan(const struct q4kh_config *c, const char *cli_path,
                  struct q4kh_registry **out, struct q4kh_error *err)
{
	unsigned limit;

	*out = NULL;
	if (q4kh_enumerate_timeout(c, &limit, err) || q4kh_policy_kernel_env_check(err))
		return Q4KH_EXIT_INPUT;
	if (q4kh_registry_scan(cli_path, c, out, err) || q4kh_enumerate_vet(*out, c, err))
		return Q4KH_EXIT_FAIL;
	return 0;
}

int q4kh_cli_check_plugins(const char *command, const struct q4kh_registry *r,
                           const struct q4kh_config *c, struct q4kh_host *host, int quiet,
                           struct q4kh_error *err)
{
	return q4kh_registry_check_settings(r, host ? q4kh_host_start_status : NULL, host,
	                                    quiet ? NULL : q4kh_cli_warn_line, (void *)command,
	                                    err) ||
	               q4kh_guard_config_check(c, r, err)
	               ? Q4KH_EXIT_INPUT
	               : 0;
}

int q4kh_cli_plugins(const char *command, const char *cli_path, const struct q4kh_config *c,
                     int quiet, struct q4kh_host *host, struct q4kh_registry **out,
                     struct q4kh_error *err)
{
	int rc = q4kh_cli_scan(c, cli_path, out, err);

	if (rc)
		return rc;
	if (host && q4kh_host_open(host, *out, c, NULL, err))
		return Q4KH_EXIT_FAIL;
	rc = q4kh_cli_check_plugins(command, *out, c, host, quiet, err);
	return rc ? rc : q4kh_receipt_dir_check(c, NULL, err) ? Q4KH_EXIT_INPUT : 0;
}

int q4kh_cli_check_receipts(const struct q4kh_select_request *rq, const struct q4kh_config *c,
                            struct q4kh_error *err)
{
	return q4kh_select_needs_receipts(rq) && q4kh_receipt_dir_check(c, NULL, err)
	               ? Q4KH_EXIT_INPUT
	               : 0;
}

int q4kh_cli_check_names(const struct q4kh_registry *r, const char *kernel_cli,
                         const char *backend_cli, struct q4kh_error *err)
{
	struct q4kh_kernel_choice choice;
	struct q4kh_device_record none = { 0 }; /* the names parse alike for any device */
	char origin[64];
	const char *backend = q4kh_settings_backend(backend_cli, origin, sizeof(origin));

	if (q4kh_policy_kernel_env_check(err))
		return Q4KH_EXIT_INPUT;
	if (q4kh_registry_check_backend(r, backend, origin, err) ||
	    q4kh_policy_kernel_choice(r, NULL, kernel_cli, NULL, "", &none, &choice, err))
		return Q4KH_EXIT_PLUGIN;
	return 0;
}

int q4kh_cli_check_device(struct q4kh_host *h, const struct q4kh_cli_common *c,
                          struct q4kh_error *err)
{
	if (c->device_set &&
	    q4kh_select_check_device(h, c->backend, (uint32_t)c->device, err))
		return Q4KH_EXIT_PLUGIN;
	return 0;
}

void q4kh_cli_warn_selectors(const char *command, const struct q4kh_registry *r,
                             const char *kernel_cli)
{
	char unmatched[1024];

	if (q4kh_policy_unmatched_selectors(r, kernel_cli, NULL, unmatched, sizeof(unmatched)))
		fprintf(stderr,
		        "q4khost %s: warning: kernel selectors that match no device here, their entries ignored: %s (q4khost plugins lists the devices)\n",
		        command, unmatched);
}

/* Length of the valid UTF-8 sequence at S (N bytes left), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, cp = s[0] & 0x07;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	/* overlong forms, surrogates, beyond U+10FFFF */
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

json_t *q4kh_cli_json_text(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	json_t *j = json_stringn(s, len);
	char *buf;
	size_t o = 0;

	if (j)
		return j;
	buf = malloc(len * 3 + 1);
	if (!buf)
		return NULL;
	for (size_t i = 0; i < len;) {
		size_t n = utf8_len(p + i, len - i);

		if (n) {
			memcpy(buf + o, p + i, n);
			o += n;
			i += n;
		} else {
			memcpy(buf + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	j = json_stringn(buf, o);
	free(buf);
	return j;
}
