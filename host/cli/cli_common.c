/*
 * What every command shares: one wording for command-line mistakes, and
 * the config with its warnings (an ignored environment among them).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "config_keys.h"
#include "guard.h"
#include "model.h"
#include "policy.h"
#include "secure.h"

int q4kh_cli_bad_option(const char *command, char **argv)
{
	fprintf(stderr, "q4khost %s: unknown option or missing value in '%s' (try q4khost %s --help)\n",
	        command, argv[optind - 1], command);
	return Q4KH_EXIT_USAGE;
}

int q4kh_cli_parse_long(const char *command, const char *s, const char *what, long lo,
                        long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "q4khost %s: %s must be a whole number in [%ld, %ld], got '%s'\n",
		        command, what, lo, hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

const char *q4kh_cli_fetch_hint(void)
{
	static const char installed[] = Q4KH_PKGDATADIR "/fetch-model.sh";

	return access(installed, X_OK) == 0
	               ? "fetch it with " Q4KH_PKGDATADIR "/fetch-model.sh"
	               : "fetch it with scripts/fetch-model.sh in q4khost's source tree";
}

const char *q4kh_cli_model(const char *given, char *buf, size_t cap, struct q4kh_error *err)
{
	const char *env = q4kh_env("Q4KHOST_MODEL");

	if (given)
		return given;
	if (access(q4kh_default_model_path(buf, cap), F_OK) == 0)
		return buf;
	if (env && *env)
		q4kh_fail(err, "%s (from Q4KHOST_MODEL): %s", buf, strerror(errno));
	else
		q4kh_fail(err, "%s: no such file (the default model: %s, or pass a model file)", buf,
		          q4kh_cli_fetch_hint());
	return NULL;
}

static void warn_line(void *command, const char *line)
{
	fprintf(stderr, "q4khost %s: warning: %s\n", (const char *)command, line);
}

/* Said once, so a privileged user sees why their variables do nothing. */
static void warn_ignored_env(const char *command)
{
	char names[1024];

	if (q4kh_secure_mode() && q4kh_secure_env_names(names, sizeof(names)) > 0)
		fprintf(stderr,
		        "q4khost %s: running set-uid or set-gid: ignoring the environment variables %s\n",
		        command, names);
}

int q4kh_cli_config(const char *command, const char *file, int quiet,
                    struct q4kh_config **out, struct q4kh_error *err)
{
	if (!quiet)
		warn_ignored_env(command);
	if (q4kh_config_load(NULL, file, out, err))
		return -1;
	if (!quiet)
		q4kh_config_check(*out, warn_line, (void *)command);
	if (!quiet && !q4kh_secure_mode()) /* else every variable is ignored, said above */
		q4kh_env_check(warn_line, (void *)command);
	return 0;
}

int q4kh_cli_plugins(const char *cli_path, const struct q4kh_config *c,
                     struct q4kh_registry **out, struct q4kh_error *err)
{
	if (q4kh_registry_scan(cli_path, c, out, err))
		return Q4KH_EXIT_FAIL;
	return q4kh_registry_check_settings(*out, err) || q4kh_guard_config_check(c, *out, err)
	               ? Q4KH_EXIT_INPUT
	               : 0;
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
