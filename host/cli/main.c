/* q4khost: the command dispatcher. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
};

static const struct command commands[] = {
	{ "run", q4kh_cmd_run, "generate text from a GGUF model" },
	{ "plugins", q4kh_cmd_plugins, "list plugins found, accepted or rejected, and devices" },
	{ "info", q4kh_cmd_info, "print a GGUF file's metadata and tensor types" },
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost COMMAND [OPTIONS]\n"
	        "       q4khost COMMAND --help\n\n"
	        "Runs GGUF language models through backend and kernel-variant plugins,\n"
	        "and says what really ran.\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(out,
	        "\nexit codes: 0 ok, 1 failure, 2 usage error, 3 bad input file,\n"
	        "            4 no plugin could honour the request\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return Q4KH_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		usage(stdout);
		return Q4KH_EXIT_OK;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("q4khost %s (plugin ABI %d.%d)\n", PACKAGE_VERSION, 1, 0);
		return Q4KH_EXIT_OK;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "q4khost: unknown command '%s' (try q4khost --help)\n",
	        argv[1]);
	return Q4KH_EXIT_USAGE;
}
