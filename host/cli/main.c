/* q4khost: the command dispatcher. */
#include "buildconf.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "log.h"
#include "q4khost/plugin.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
};

static const struct command commands[] = {
	{ "run", q4kh_cmd_run, "generate text from a GGUF model" },
	{ "plugins", q4kh_cmd_plugins, "list plugins found, accepted or rejected, and devices" },
	{ "info", q4kh_cmd_info, "print a GGUF file's metadata and tensor types" },
	{ "validate", q4kh_cmd_validate, "run the F2 parity guard on backends and kernel variants" },
	{ "bench", q4kh_cmd_bench, "compare kernel variants: speed and F2 verdict, one row each" },
	{ "bench-kernels", q4kh_cmd_bench_kernels, "time every variant's GEMV on real models' shapes against the read ceiling" },
	{ "qa", q4kh_cmd_qa, "check golden cases on the reference and every path that passes F2" },
	{ "conformance", q4kh_cmd_conformance, "check every op of a backend against the cpu reference" },
	{ "serve", q4kh_cmd_serve, "serve the OpenAI API over HTTP from paths F2 trusts" },
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost COMMAND [OPTIONS]\n"
	        "       q4khost COMMAND --help\n\n"
	        "Runs GGUF language models through backend and kernel-variant plugins,\n"
	        "and says what really ran.\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
	fprintf(out,
	        "\nenvironment: Q4KHOST_MODEL, Q4KHOST_PLUGIN_PATH, Q4KHOST_BACKEND,\n"
	        "Q4KHOST_CONFIG, Q4KHOST_Q4K_KERNEL, Q4KHOST_F2, Q4KHOST_F2_RECEIPT_DIR,\n"
	        "Q4KHOST_RECEIPT_KEY (the key file that seals receipts),\n"
	        "Q4KHOST_F2_REQUIRE_DEEP (on: run and serve accept deep receipts only,\n"
	        "validate and bench judge on the deep probe),\n"
	        "Q4KHOST_LOG (which plugin log lines are shown: debug, info, warning\n"
	        "or error, any case; q4khost's own messages are always shown),\n"
	        "Q4KHOST_API_KEY (serve);\n"
	        "see man q4khost.ini, or\n%s\n",
	        q4kh_cli_doc("config.md"));
	fprintf(out,
	        "\nexit codes: 0 ok, 1 failure (output that cannot be written, to\n"
	        "            standard output or standard error, included), 2 usage\n"
	        "            error, 3 a bad model file or configuration (a config\n"
	        "            file, a setting's value in a file or the\n"
	        "            environment that is no valid value, the receipt\n"
	        "            folder), 4 no plugin could honour the request (a\n"
	        "            backend or kernel variant named by an option, a file or\n"
	        "            the environment that no plugin on the path is), 130 or\n"
	        "            143 stopped by SIGINT or SIGTERM (run, validate, bench;\n"
	        "            serve exits 0 once it has drained); signals that come\n"
	        "            together are one request, a second one 0.5 s or more\n"
	        "            after the first ends the process at once, by that signal\n"
	        "            (every command, serve included)\n");
}

/* Q4KHOST_LOG=debug|info|warning|error (any case), the threshold of
 * plugin log lines: parsed, never just tested. WHO
 * names the command in the error ("q4khost run"). */
static int apply_log_env(const char *who)
{
	const char *v = q4kh_env("Q4KHOST_LOG");
	q4kh_log_level level;

	if (!v || !*v)
		return 0;
	if (q4kh_log_parse(v, &level)) {
		fprintf(stderr, "%s: Q4KHOST_LOG='%s' is not one of debug, info, warning, error "
		        "(any case): the threshold of plugin log lines\n", who, v);
		return -1;
	}
	q4kh_log_set_threshold(level);
	return 0;
}

/*
 * Whether the reader of FD went away (a pipe into head that has read
 * enough): the write end of a pipe without a reader polls as an error,
 * whatever errno an earlier write left.
 */
static int reader_gone(int fd, int write_errno)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };

	return write_errno == EPIPE || (poll(&p, 1, 0) == 1 && (p.revents & POLLERR));
}

/*
 * Output lost on a full disk must not exit 0 (as coreutils' close_stdout):
 * standard output is flushed and checked, and so is standard error, the
 * report and every message, whose failure nothing can say but the exit
 * code, 1. A reader that went away took what it wanted, which is no
 * failure: every command then ends quietly with its own status (run has
 * stopped generating and said so). WHO: "q4khost" or "q4khost COMMAND",
 * the prefix of the one line said.
 */
static int finish(const char *who, int rc)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		int e = errno;

		if (!reader_gone(STDOUT_FILENO, e)) {
			fprintf(stderr, "%s: cannot write to standard output: %s\n", who, strerror(e));
			rc = rc ? rc : Q4KH_EXIT_FAIL;
		}
	}
	/* unbuffered: ferror says whether any write to it failed */
	if (ferror(stderr) && !reader_gone(STDERR_FILENO, 0))
		rc = rc ? rc : Q4KH_EXIT_FAIL;
	return rc;
}

int main(int argc, char **argv)
{
	char who[64];

	snprintf(who, sizeof(who), "q4khost%s%s", argc > 1 && argv[1][0] != '-' ? " " : "",
	         argc > 1 && argv[1][0] != '-' ? argv[1] : "");
	if (apply_log_env(who)) /* a setting's value, not usage */
		return Q4KH_EXIT_INPUT;
	if (argc < 2) {
		usage(stderr);
		return Q4KH_EXIT_USAGE;
	}
	/* A reader that goes away (| head) is seen as EPIPE by the write, for
	 * every command alike (finish), never as a SIGPIPE that ends the
	 * process with 141 and no word; children of F2 get the default back
	 * (isolate.c). */
	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		usage(stdout);
		return finish("q4khost", Q4KH_EXIT_OK);
	}
	if (!strcmp(argv[1], "--version")) {
		printf("q4khost %s (plugin ABI %d.%d)\n", PACKAGE_VERSION, Q4KH_ABI_MAJOR,
		       Q4KH_ABI_MINOR);
		return finish("q4khost", Q4KH_EXIT_OK);
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name)) {
			snprintf(who, sizeof(who), "q4khost %s", commands[i].name);
			return finish(who, commands[i].fn(argc - 1, argv + 1));
		}
	if (argv[1][0] == '-')
		fprintf(stderr, "q4khost: unknown option '%s': options go after the command "
		        "(q4khost COMMAND [OPTIONS]; try q4khost --help)\n", argv[1]);
	else
		fprintf(stderr, "q4khost: unknown command '%s' (try q4khost --help)\n", argv[1]);
	return Q4KH_EXIT_USAGE;
}
