/*
 * The q4khost command-line tool: one file per command. Each command parses
 * its own options (getopt_long), prints --help to stdout, and returns one of
 * the exit codes below.
 */
#ifndef Q4KH_CLI_H
#define Q4KH_CLI_H

#include <getopt.h>
#include <jansson.h>
#include <stddef.h>

#include "config.h"
#include "error.h"
#include "guard.h"
#include "registry.h"

struct q4kh_select_request;

enum q4kh_exit {
	Q4KH_EXIT_OK = 0,
	Q4KH_EXIT_FAIL = 1,    /* the work failed (I/O, backend error) */
	Q4KH_EXIT_USAGE = 2,   /* bad command line */
	Q4KH_EXIT_INPUT = 3,   /* a bad model file or configuration (a file, a
	                          setting's value, the receipt folder) */
	Q4KH_EXIT_PLUGIN = 4   /* no plugin could honour the request */
};

/*
 * Say a usage error of COMMAND's command line on stderr in one line,
 * "q4khost COMMAND: MESSAGE", MESSAGE from FMT as printf makes it; every
 * shared parser below says its errors so. q4kh_cli_usage_said: the last
 * MESSAGE said ("" before any), for a command whose --json object must
 * carry its error (run).
 */
void q4kh_cli_usage(const char *command, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
const char *q4kh_cli_usage_said(void);

/*
 * After getopt_long (called with opterr = 0 and an option string starting
 * with ':') returned C, '?' or ':': say in one line which option was
 * unknown ('?'), or which option lacks its value (':'), and return
 * Q4KH_EXIT_USAGE.
 */
int q4kh_cli_bad_option(const char *command, char **argv, int c);

/*
 * Say that ARG, left after COMMAND's options, is not taken (COMMAND has
 * options only; a subcommand such as "plugins extra" does not exist), in
 * one line pointing at --help, and return Q4KH_EXIT_USAGE.
 */
int q4kh_cli_extra_argument(const char *command, const char *arg);

/*
 * Parse S, the value of option WHAT of COMMAND, as a decimal whole number
 * (q4kh_cli_parse_long) or a number (q4kh_cli_parse_double) in [lo, hi]
 * into *out; else say so on stderr in one line and return -1. An empty
 * value, and white space before or after the number, are refused as any
 * other junk is.
 */
int q4kh_cli_parse_long(const char *command, const char *s, const char *what, long lo,
                        long hi, long *out);
int q4kh_cli_parse_double(const char *command, const char *s, const char *what, double lo,
                          double hi, double *out);

/*
 * What COMMAND was given on its command line, checked once its options are
 * parsed; NULL: not given. An empty value of any is a usage error: a line
 * on stderr naming the option, saying an empty value is not allowed and
 * what it expects, and -1 (exit 2). So is a kernel list (KERNEL, the value
 * of option KERNEL_OPTION, --kernel or --kernels) with an empty entry
 * (",,", "a,", "0="), named with the entry's place in the list.
 */
/*
 * The check q4kh_cli_given_check makes of each, for a command's own
 * options (qa --cases FILE): 0 when VALUE is NULL or not empty, else the
 * line on stderr naming OPTION and saying EXPECTED, and -1.
 */
int q4kh_cli_not_empty(const char *command, const char *option, const char *value,
                       const char *expected);

struct q4kh_cli_given {
	const char *model;       /* -m/--model FILE (info: also its FILE) */
	const char *config;      /* --config FILE */
	const char *plugin_path; /* --plugin-path P */
	const char *backend;     /* --backend NAME */
	const char *kernel_option, *kernel;
};
int q4kh_cli_given_check(const char *command, const struct q4kh_cli_given *given);

/*
 * The options that bench, qa and validate share: one table and one parser,
 * so that each takes them, and words their mistakes, alike. A command's
 * table starts with Q4KH_CLI_COMMON_OPTIONS(KERNEL), KERNEL the name of
 * its kernel option ("kernel", or bench's "kernels"), and its own options
 * take values from Q4KH_OPT_OWN on; its short options string holds "m:".
 */
enum {
	Q4KH_OPT_BACKEND = 256, Q4KH_OPT_DEVICE, Q4KH_OPT_KERNEL, Q4KH_OPT_F2,
	Q4KH_OPT_REVALIDATE, Q4KH_OPT_TIMEOUT, Q4KH_OPT_PPATH, Q4KH_OPT_CONFIG, Q4KH_OPT_JSON,
	Q4KH_OPT_OWN
};
#define Q4KH_CLI_COMMON_OPTIONS(KERNEL)                                          \
	{ "model", required_argument, 0, 'm' },                                  \
	{ "backend", required_argument, 0, Q4KH_OPT_BACKEND },                   \
	{ "device", required_argument, 0, Q4KH_OPT_DEVICE },                     \
	{ KERNEL, required_argument, 0, Q4KH_OPT_KERNEL },                       \
	{ "f2", required_argument, 0, Q4KH_OPT_F2 },                             \
	{ "revalidate", no_argument, 0, Q4KH_OPT_REVALIDATE },                   \
	{ "timeout", required_argument, 0, Q4KH_OPT_TIMEOUT },                   \
	{ "plugin-path", required_argument, 0, Q4KH_OPT_PPATH },                 \
	{ "config", required_argument, 0, Q4KH_OPT_CONFIG },                     \
	{ "json", no_argument, 0, Q4KH_OPT_JSON }

struct q4kh_cli_common {
	const char *model, *backend, *kernel, *plugin_path, *config_file;
	const char *f2;         /* --f2 as given, "fresh" for --revalidate; NULL: neither */
	enum q4kh_f2_mode mode; /* with MEASURE (below): --f2 as auto or fresh; else auto */
	const char *fresh_source; /* "Q4KHOST_F2=fresh" when the variable set mode
	                             (q4kh_cli_f2_measure_env), else NULL: --f2 */
	long device, timeout;   /* timeout 0: not given */
	int device_set, json;
};

/*
 * Take option C, what getopt_long returned, into O when it is a shared
 * one: 1; 0 when it is not; -1 when its value is bad, said in one line on
 * stderr as COMMAND's. DEVICE_MAX: the highest --device. MEASURE: --f2
 * takes auto or fresh only (q4kh_cli_f2_measure_mode: validate and qa,
 * which measure), else any value, judged with the setting later (bench).
 */
int q4kh_cli_common_option(const char *command, int c, long device_max, int measure,
                           struct q4kh_cli_common *o);

/*
 * q4kh_cli_given_check of the shared options, once they are parsed;
 * KERNEL_OPTION: "--kernel" or "--kernels".
 */
int q4kh_cli_common_check(const char *command, const char *kernel_option,
                          const struct q4kh_cli_common *o);

/*
 * A command's error as its --json output: one JSON object on stdout,
 * {"error": MESSAGE}, the key run's --json object carries its error in,
 * so a script reading stdout never meets empty or half output.
 * q4kh_cli_error: that object when JSON (the command was given --json),
 * and always the line "q4khost COMMAND: MESSAGE" on stderr; returns RC
 * (the exit code).
 */
void q4kh_cli_json_error(const char *message);
int q4kh_cli_error(const char *command, int json, int rc, const char *message);

/*
 * Whether option --json is among ARGV's options as getopt_long reads them
 * with SHORTS and LONGS (in "-p --json" it is a value), whatever else is
 * wrong there: a usage error is one JSON object too with it. JSON_VAL:
 * what getopt_long returns for --json.
 */
int q4kh_cli_json_asked(int argc, char **argv, const char *shorts,
                        const struct option *longs, int json_val);

/*
 * The options of the commands that measure F2 (validate, qa): --f2 VALUE,
 * which takes auto or fresh only, and --timeout SECONDS, in
 * [1, Q4KH_TIMEOUT_MAX_S]. Each parses VALUE into *out, or says in one
 * line on stderr what COMMAND expected and returns -1.
 */
int q4kh_cli_f2_measure_mode(const char *command, const char *value,
                             enum q4kh_f2_mode *out);

/*
 * For validate and qa, which measure: when neither --f2 nor --revalidate
 * was given, Q4KHOST_F2 (as run and bench read it) as O's mode: auto (use
 * valid receipts) or fresh (measure again; O's fresh_source says so for
 * the guard, guard.h). -1 with err, a bad setting
 * (exit 3), for off or require, which would ask COMMAND not to measure or
 * not to measure anew, and for any other value; the error names the
 * variable.
 */
int q4kh_cli_f2_measure_env(const char *command, struct q4kh_cli_common *o,
                            struct q4kh_error *err);
int q4kh_cli_timeout(const char *command, const char *value, long *out);

/*
 * The path of document NAME ("config.md") for --help: the installed one
 * in DOCDIR, or, in a build that was not installed, the source tree's
 * docs/NAME (absolute), so the path named exists. A static buffer,
 * overwritten by the next call.
 */
const char *q4kh_cli_doc(const char *name);

/*
 * How to get the default model, for a message: "fetch it with SCRIPT",
 * SCRIPT the absolute path of fetch-model.sh, installed in PKGDATADIR or
 * in the source tree of a build not installed (a command to paste from any
 * folder); "fetch it with scripts/fetch-model.sh in q4khost's source
 * tree" when neither is there.
 */
const char *q4kh_cli_fetch_hint(void);

/*
 * The model a command uses: GIVEN (-m FILE, or info's FILE) when not NULL,
 * else the default model ($Q4KHOST_MODEL, else the file
 * scripts/fetch-model.sh fetches into the cache folder), written into BUF.
 * NULL with err when the default is missing: naming Q4KHOST_MODEL when it
 * was set, else saying how to get the default model. An empty GIVEN is a
 * usage error, refused before (q4kh_cli_given_check).
 */
const char *q4kh_cli_model(const char *given, char *buf, size_t cap, struct q4kh_error *err);

/*
 * Load the layered config (FILE: the --config file or NULL; an empty one
 * is refused before, q4kh_cli_given_check) and, unless
 * QUIET, warn on stderr about every key and Q4KHOST_ variable q4khost
 * does not know (config_keys.h) and, when running set-uid or set-gid,
 * name the set environment variables that are ignored for it (secure.h). -1 with err
 * when a file cannot be read or parsed.
 */
int q4kh_cli_config(const char *command, const char *file, int quiet,
                    struct q4kh_config **out, struct q4kh_error *err);

/* "q4khost COMMAND: warning: LINE" on stderr: the warn callback of the
 * library's checks (config_keys.h, q4kh_registry_check_settings). */
void q4kh_cli_warn_line(void *command, const char *line);

/*
 * Scan the plugin path (CLI_PATH: --plugin-path, or NULL) into *out, vet
 * every backend's enumeration in a helper process (enumerate.h: one that
 * crashes or hangs is refused) and check, before any work, the values of
 * every plugin's own settings and every F2 setting of C
 * (q4kh_cli_check_plugins), then the receipt folder and key
 * (q4kh_receipt_dir_check: the commands that call this may need a
 * receipt; run and serve check them with q4kh_cli_check_receipts). With HOST (NULL: none), the command's host
 * context is opened on the registry, without a model (q4kh_host_open:
 * the command opens it with q4kh_host_open_model), and the backends the
 * check starts are started in it, once; the caller closes HOST, before
 * it frees *out, whatever this returns. 0, or the exit code with err:
 * Q4KH_EXIT_FAIL when the scan or a helper failed or was stopped,
 * Q4KH_EXIT_INPUT for a bad setting, whoever checks it (an empty
 * --plugin-path is refused before, q4kh_cli_given_check).
 */
int q4kh_cli_plugins(const char *command, const char *cli_path, const struct q4kh_config *c,
                     int quiet, struct q4kh_host *host, struct q4kh_registry **out,
                     struct q4kh_error *err);

/* The first half of q4kh_cli_plugins: the form of Q4KHOST_Q4K_KERNEL
 * (policy.h), the scan and the vetting; its exit codes. For a command that
 * sets plugins' settings from the registry (run --threads) before they
 * are checked. */
int q4kh_cli_scan(const struct q4kh_config *c, const char *cli_path,
                  struct q4kh_registry **out, struct q4kh_error *err);

/*
 * The second half: the values of every plugin's own settings of R (the
 * plugins check them: q4kh_registry_check_settings, the backends started
 * in HOST when not NULL) and every F2 setting of C for its plugins
 * (guard.h); unless QUIET (a child process of the command, whose parent
 * has said it), warn as COMMAND about every key of a plugin's section
 * that the plugin did not read. 0, or Q4KH_EXIT_INPUT with err.
 */
int q4kh_cli_check_plugins(const char *command, const struct q4kh_registry *r,
                           const struct q4kh_config *c, struct q4kh_host *host, int quiet,
                           struct q4kh_error *err);

/*
 * For a command that serves RQ (run, serve), before any work: the receipt
 * folder and key (q4kh_receipt_dir_check), but only when RQ may need a
 * receipt (q4kh_select_needs_receipts: F2 not off, a candidate besides the
 * reference), so that a run that needs none needs no folder. 0, or
 * Q4KH_EXIT_INPUT with err.
 */
int q4kh_cli_check_receipts(const struct q4kh_select_request *rq, const struct q4kh_config *c,
                            struct q4kh_error *err);

/*
 * The names a command was given (--backend, else Q4KHOST_BACKEND; the
 * kernel variants of --kernel, else Q4KHOST_Q4K_KERNEL; KERNEL_CLI and
 * BACKEND_CLI NULL when not given) checked against R before any work or
 * output: 0, or Q4KH_EXIT_PLUGIN with err naming the unknown name and the
 * ones there; Q4KH_EXIT_INPUT when Q4KHOST_Q4K_KERNEL is no kernel list
 * at all (q4kh_policy_kernel_env_check).
 */
int q4kh_cli_check_names(const struct q4kh_registry *r, const char *kernel_cli,
                         const char *backend_cli, struct q4kh_error *err);

/*
 * With C's --device set, Q4KH_EXIT_PLUGIN and err, in run's words
 * (q4kh_select_check_device: how many devices each backend has), when no
 * backend of host context H (C's --backend alone, when given) has that
 * device; else 0.
 */
int q4kh_cli_check_device(struct q4kh_host *h, const struct q4kh_cli_common *c,
                          struct q4kh_error *err);

/*
 * Warn on stderr about every kernel selector (--kernel KERNEL_CLI, or
 * Q4KHOST_Q4K_KERNEL) that matches no device of R: its entry is ignored.
 */
void q4kh_cli_warn_selectors(const char *command, const struct q4kh_registry *r,
                             const char *kernel_cli);

/*
 * q4khost plugins --explain: per device of every backend, the kernel chain
 * and for every setting its value and origin; text or JSON on stdout.
 * KERNEL_CLI and BACKEND_CLI: the --kernel and --backend values, or NULL.
 * Returns an exit code.
 */
int q4kh_plugins_explain(const struct q4kh_registry *r, const struct q4kh_config *c,
                         const char *kernel_cli, const char *backend_cli, int json);

/*
 * A JSON string of the LEN bytes at S: every byte that is not part of a
 * valid UTF-8 sequence becomes U+FFFD, so the output stays valid JSON
 * whatever it holds (a prompt, a model's text or metadata). NULL only
 * when out of memory.
 */
json_t *q4kh_cli_json_text(const char *s, size_t len);

int q4kh_cmd_run(int argc, char **argv);
int q4kh_cmd_plugins(int argc, char **argv);
int q4kh_cmd_info(int argc, char **argv);
int q4kh_cmd_validate(int argc, char **argv);
int q4kh_cmd_bench(int argc, char **argv);
int q4kh_cmd_bench_kernels(int argc, char **argv);
int q4kh_cmd_qa(int argc, char **argv);
int q4kh_cmd_conformance(int argc, char **argv);
int q4kh_cmd_serve(int argc, char **argv);

#endif
