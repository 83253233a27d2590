/* What every command shares: one wording for command-line mistakes. */
#include <getopt.h>
#include <stdio.h>

#include "cli.h"

int q4kh_cli_bad_option(const char *command, char **argv)
{
	fprintf(stderr, "q4khost %s: unknown option or missing value in '%s' (try q4khost %s --help)\n",
	        command, argv[optind - 1], command);
	return Q4KH_EXIT_USAGE;
}
