/*
 * What every command shares: one wording for command-line mistakes, and
 * the config with its warnings.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "config_keys.h"

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

static void warn_line(void *command, const char *line)
{
	fprintf(stderr, "q4khost %s: warning: %s\n", (const char *)command, line);
}

int q4kh_cli_config(const char *command, const char *file, int quiet,
                    struct q4kh_config **out, struct q4kh_error *err)
{
	if (q4kh_config_load(NULL, file, out, err))
		return -1;
	if (!quiet)
		q4kh_config_check(*out, warn_line, (void *)command);
	return 0;
}
