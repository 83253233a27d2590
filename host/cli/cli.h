/*
 * The q4khost command-line tool: one file per command. Each command parses
 * its own options (getopt_long), prints --help to stdout, and returns one of
 * the exit codes below.
 */
#ifndef Q4KH_CLI_H
#define Q4KH_CLI_H

enum q4kh_exit {
	Q4KH_EXIT_OK = 0,
	Q4KH_EXIT_FAIL = 1,    /* the work failed (I/O, backend error) */
	Q4KH_EXIT_USAGE = 2,   /* bad command line */
	Q4KH_EXIT_INPUT = 3,   /* a bad model or config file */
	Q4KH_EXIT_PLUGIN = 4   /* no plugin could honour the request */
};

/*
 * After getopt_long (called with opterr = 0) returned '?' or ':': say which
 * argument was wrong in one line and return Q4KH_EXIT_USAGE.
 */
int q4kh_cli_bad_option(const char *command, char **argv);

int q4kh_cmd_run(int argc, char **argv);
int q4kh_cmd_plugins(int argc, char **argv);
int q4kh_cmd_info(int argc, char **argv);
int q4kh_cmd_validate(int argc, char **argv);

#endif
