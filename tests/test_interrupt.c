/*
 * Ctrl-C keeps the work: a real signal to a real q4khost. `run` stopped by
 * SIGINT prints the text so far, a newline and the report with
 * "stop: interrupted by SIGINT" and exits 130; with --json, SIGTERM still
 * gives one valid object (exit 143). A `validate --one` child never
 * outlives the parent's watch: a SIGTERM to the parent is passed on, a
 * SIGKILLed parent takes the child with it (PR_SET_PDEATHSIG), and a
 * stopped parent leaves it to its own alarm. Two signals at once (timeout
 * -s INT) are one request; bench stops between rows with its table, qa
 * after the case in progress with the cases done,
 * bench-kernels inside a row, with the rows done and --json's object.
 * Nothing here is timed: each signal waits for the state it must find (the
 * text so far, a status line on the program's terminal, the F2 child), and
 * each wait polls until what it waits for happens, bounded by the test's
 * .timeout.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

/* Where a background q4khost writes. */
struct bg {
	char out[4200], err[4200];
	struct test_tty tty; /* stderr, when on a terminal (fd -1: into ERR) */
	const char *receipts;
	pid_t pid;
};

/* Start q4khost ARGS with its own receipts and no user config, its stderr
 * on a terminal (ON_TTY: status lines show) or into a file. */
static void start_as(struct bg *b, const char *args, int on_tty)
{
	char cmd[16384];
	const char *dir = test_tmpdir();

	b->receipts = test_tmpdir();
	snprintf(b->out, sizeof(b->out), "%s/stdout", dir);
	snprintf(b->err, sizeof(b->err), "%s/stderr", dir);
	test_q4khost_command("", b->receipts, args, cmd, sizeof(cmd));
	b->tty.fd = -1;
	b->pid = on_tty ? test_spawn_tty(cmd, b->out, &b->tty) : test_spawn(cmd, b->out, b->err);
}

static void start(struct bg *b, const char *args)
{
	start_as(b, args, 0);
}

static void start_on_tty(struct bg *b, const char *args)
{
	start_as(b, args, 1);
}

/* Wait until B's terminal shows NEEDLE past offset FROM; the offset past it. */
static size_t on_tty(struct bg *b, size_t from, const char *needle)
{
	long at = test_tty_wait_for(&b->tty, from, needle);

	cr_assert_geq(at, 0, "q4khost ended before its terminal showed \"%s\":\n%s", needle,
	              b->tty.text);
	return (size_t)at;
}

static char *slurp(const char *path)
{
	size_t len;
	char *text = test_read_file(path, &len);

	cr_assert_not_null(text, "%s", path);
	return text;
}

/* Wait for B to end: its status, its stdout and stderr in *OUT and *ERR
 * (either may be NULL). */
static int finish(struct bg *b, char **out, char **err)
{
	char *tty = b->tty.fd >= 0 ? test_tty_close(&b->tty) : NULL;
	int status = test_reap(b->pid);

	if (out)
		*out = slurp(b->out);
	if (err)
		*err = tty ? tty : slurp(b->err);
	else
		free(tty);
	return status;
}

/* Poll for the validation child of PARENT. */
static pid_t wait_for_child(pid_t parent)
{
	pid_t child;

	while (!(child = test_child_of(parent, " --one")))
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
	return child;
}

static void wait_until_gone(pid_t pid)
{
	while (test_alive(pid))
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
}

/*
 * Start q4khost COMMAND with the reference plugin alone, its stderr on a
 * terminal, wait for its first text or, with STATUS, for that status line
 * on its terminal, send it N_SIGINTS SIGINTs at once, and return its
 * status with its stdout and stderr.
 */
static int interrupted(const char *command, const char *status_line, int n_sigints,
                       char **out, char **err)
{
	static const char *const none[] = { NULL };
	char args[8192];
	struct bg b;

	test_model_path();
	snprintf(args, sizeof(args), "%s --plugin-path %s", command, test_plugin_dir(none));
	start_on_tty(&b, args);
	if (status_line)
		on_tty(&b, 0, status_line);
	else
		test_wait_for(b.out, NULL); /* the first piece of text */
	for (int i = 0; i < n_sigints; i++)
		cr_assert_eq(kill(b.pid, SIGINT), 0);
	return finish(&b, out, err);
}

/* N_SIGINTS at once: timeout -s INT sends SIGINT to the process and then
 * to its group, microseconds apart: one request to stop, not a second
 * Ctrl-C that kills the process with no report (interrupt.h). */
static void sigint_during_run(int n_sigints)
{
	char *out, *err;
	long decoded = -1;
	const char *line;
	int status = interrupted("run -n 2000 -p 'Once upon a time'", NULL, n_sigints, &out,
	                         &err);

	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 130,
	          "SIGINT exits 130 (status %#x): %s", status, err);
	cr_expect_gt(strlen(out), 1, "the text so far is kept");
	cr_expect_eq(out[strlen(out) - 1], '\n', "and ends in a newline: [%s]", out);
	cr_expect(strstr(err, "q4khost: backend cpu") != NULL, "the report: %s", err);
	line = strstr(err, "; decode ");
	cr_assert_not_null(line, "%s", err);
	cr_expect_eq(sscanf(line, "; decode %ld tokens", &decoded), 1, "%s", line);
	cr_expect(decoded > 0 && decoded < 2000, "stopped early: %ld tokens", decoded);
	cr_expect(strstr(err, "stop: interrupted by SIGINT\n") != NULL, "%s", err);
	free(out);
	free(err);
}

Test(interrupt, sigint_during_run_keeps_the_text_and_the_report, .timeout = 300)
{
	sigint_during_run(1);
}

Test(interrupt, two_signals_together_are_one_request, .timeout = 300)
{
	sigint_during_run(2);
}

/* Stopped during a long prefill (3000 prompt tokens, one a step), once
 * its status line counts a token done: the report says how far it got of
 * the whole prompt. */
Test(interrupt, sigint_during_prefill_says_how_far_of_the_prompt, .timeout = 300)
{
	char *out, *err;
	long done = -1, total = -1;
	const char *line;
	int status = interrupted("run -n 1 -b 1 --raw -p \"$(yes a | head -n 3000 | tr '\\n' ' ')\"",
	                         "prefill: 1 of ", 1, &out, &err);

	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %#x: %s", status, err);
	line = strstr(err, "q4khost: prefill ");
	cr_assert_not_null(line, "%s", err);
	cr_expect_eq(sscanf(line, "q4khost: prefill %ld of %ld tokens in ", &done, &total), 2, "%s",
	             line);
	cr_expect(done >= 1 && done < total && total > 3000, "%ld of %ld: %s", done, total, line);
	cr_expect(strstr(err, "stop: interrupted by SIGINT\n") != NULL, "%s", err);
	free(out);
	free(err);
}

/* bench stops as run does: the table of the rows done, then why, 130; a
 * row the signal cut short (stopped once its status line shows) says it
 * was interrupted, not that it failed. */
Test(interrupt, sigint_during_bench_prints_the_rows_done, .timeout = 300)
{
	char *out, *err;
	int status = interrupted("bench -n 4", "bench: row 1 of ", 1, &out, &err);

	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %#x: %s", status, err);
	cr_expect(strstr(out, "prefill tok/s") != NULL, "the table: %s", out);
	cr_expect(strstr(err, "q4khost bench: stopped by SIGINT") != NULL, "%s", err);
	cr_expect(strstr(out, "failed while timed") == NULL, "%s", out);
	free(out);
	free(err);
}

/*
 * bench-kernels on cpu-fast, built-in alone, rows of seconds (--repeat 100), or
 * NULL where this build or CPU has no cpu-fast. Started, then SIG once
 * its first row is out (WAIT_ROW, text) or its status line times the
 * first row (--json: nothing shows on stdout before the end); its status,
 * stdout and stderr.
 */
static int bench_kernels_stopped(const char *extra, int wait_row, int sig, char **out,
                                 char **err)
{
	const char *b = test_builddir();
	char args[8192];
	struct bg bg;

	test_need_cpu_fast();
	snprintf(args, sizeof(args),
	         "bench-kernels --backend cpu-fast --kernels '' --shapes gemma3-270m "
	         "--types Q4_K --min-mib 2 --repeat 100 %s --plugin-path "
	         "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs",
	         extra, b, b);
	start_on_tty(&bg, args);
	if (wait_row)
		test_wait_for(bg.out, "built-in");
	else
		on_tty(&bg, 0, "row 1 of 2, ");
	cr_assert_eq(kill(bg.pid, sig), 0);
	return finish(&bg, out, err);
}

/* bench-kernels stops inside a row: the rows done, then after how many. */
Test(interrupt, sigint_during_bench_kernels_prints_the_rows_done, .timeout = 300)
{
	char *out, *err;
	int status;

	test_skip_under_sanitizers("it waits for a benchmark row, minutes of timing loops "
	                           "under AddressSanitizer; the --json cases below stop the "
	                           "same command and its handler");
	status = bench_kernels_stopped("", 1, SIGINT, &out, &err);

	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %#x: %s", status, err);
	cr_expect(strstr(out, "attn_output") != NULL, "the first row: %s", out);
	cr_expect(strstr(err, "q4khost bench-kernels: interrupted by SIGINT after 1 of 2 rows") !=
	                  NULL,
	          "%s", err);
	cr_expect(strstr(out, "failed") == NULL, "%s", out);
	free(out);
	free(err);
}

/* With --json, SIGINT or SIGTERM: still one object, saying which signal. */
static void bench_kernels_json_stopped(int sig, int code)
{
	char *out, *err;
	json_error_t jerr;
	json_t *j;
	int status = bench_kernels_stopped("--json", 0, sig, &out, &err);

	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == code, "status %#x: %s", status, err);
	j = json_loads(out, 0, &jerr);
	cr_assert_not_null(j, "stdout is one JSON object (%s): %s", jerr.text, out);
	cr_expect_str_eq(json_string_value(json_object_get(j, "interrupted")) ?: "",
	                 sig == SIGINT ? "SIGINT" : "SIGTERM", "%s", out);
	cr_expect_lt(json_integer_value(json_object_get(j, "rows_done")), 2, "%s", out);
	cr_expect_eq(json_integer_value(json_object_get(j, "rows_planned")), 2, "%s", out);
	cr_expect(strstr(err, "interrupted by ") != NULL, "%s", err);
	json_decref(j);
	free(out);
	free(err);
}

Test(interrupt, bench_kernels_json_sigint_keeps_the_object, .timeout = 300)
{
	bench_kernels_json_stopped(SIGINT, 130);
}

Test(interrupt, bench_kernels_json_sigterm_keeps_the_object, .timeout = 300)
{
	bench_kernels_json_stopped(SIGTERM, 143);
}

/* A row whose F2 was stopped shows no verdict: neither "pass" (what a
 * decision never filled reads as) nor an older receipt's numbers. The
 * variant's F2 hangs until the SIGINT. */
Test(interrupt, bench_rows_without_a_decision_show_no_verdict, .timeout = 300)
{
	static const char *const names[] = { "defect_hang", NULL };
	char args[8192], *out, *err;
	json_t *j, *row;
	json_error_t jerr;
	size_t i;
	int undecided = 0, status;
	struct bg b;

	test_model_path();
	snprintf(args, sizeof(args), "bench -n 2 --json --plugin-path %s", test_plugin_dir(names));
	start(&b, args);
	wait_for_child(b.pid); /* the variant's F2, which hangs until the signal */
	cr_assert_eq(kill(b.pid, SIGINT), 0);
	status = finish(&b, &out, &err);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %#x: %s", status, err);
	j = json_loads(out, 0, &jerr);
	cr_assert_not_null(j, "stdout is one JSON object (%s): %s", jerr.text, out);
	json_array_foreach(json_object_get(j, "rows"), i, row) {
		json_t *f2 = json_object_get(row, "f2");
		const char *note = json_string_value(json_object_get(row, "note"));

		if (!note || !(strstr(note, "stopped") || strstr(note, "could not decide")) ||
		    !strcmp(json_string_value(json_object_get(f2, "verdict")) ?: "", "reference"))
			continue; /* the reference needs no F2 */
		undecided++;
		cr_expect(json_is_null(json_object_get(f2, "verdict")), "row %zu: %s", i, out);
		cr_expect_null(json_object_get(f2, "min_cosine"), "row %zu: %s", i, out);
		cr_expect_null(json_object_get(f2, "source"), "row %zu: %s", i, out);
	}
	cr_expect_gt(undecided, 0, "the hanging variant's row was stopped undecided: %s", out);
	json_decref(j);
	free(out);
	free(err);
}

/* Stopped while F2 measures, before anything serves: still the one JSON
 * object (and with text, a stop line), and the signal's exit code. */
Test(interrupt, run_stopped_during_f2_still_reports, .timeout = 300)
{
	static const char *const names[] = { "defect_hang", NULL };
	const char *plugins;
	char args[8192], *err, *out;
	json_t *j;
	json_error_t jerr;
	int status;
	struct bg b;

	test_model_path();
	plugins = test_plugin_dir(names);
	for (int json = 0; json < 2; json++) {
		snprintf(args, sizeof(args), "run -n 5 -p hello%s --plugin-path %s",
		         json ? " --json" : "", plugins);
		start(&b, args);
		wait_for_child(b.pid); /* the variant's F2, which hangs until the signal */
		cr_assert_eq(kill(b.pid, SIGINT), 0);
		status = finish(&b, &out, &err);
		cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %#x: %s", status,
		          err);
		if (json) {
			j = json_loads(out, 0, &jerr);
			cr_assert_not_null(j, "stdout is one JSON object (%s): %s", jerr.text, out);
			cr_expect_str_eq(json_string_value(json_object_get(j, "stop")),
			                 "interrupted by SIGINT");
			cr_expect_str_eq(json_string_value(json_object_get(j, "text")), "");
			/* a normal run's keys, null where nothing was chosen */
			cr_expect(json_is_string(json_object_get(j, "model")), "%s", out);
			cr_expect(json_is_null(json_object_get(j, "backend")), "%s", out);
			cr_expect_eq(json_integer_value(
			                     json_object_get(json_object_get(j, "device"), "index")), 0);
			cr_expect(json_is_object(json_object_get(j, "f2")), "%s", out);
			cr_expect(json_is_object(json_object_get(j, "prefill")), "%s", out);
			json_decref(j);
		} else {
			cr_expect(strstr(err, "\nq4khost: model ") != NULL, "the report so far: %s", err);
			cr_expect(strstr(err, "\nq4khost: backend none chosen: F2 was measuring "
			                      "cpu/defect-hang") != NULL, "%s", err);
			cr_expect(strstr(err, "\nq4khost: device 0: ") != NULL, "%s", err);
			cr_expect(strstr(err, "\nq4khost: stop: interrupted by SIGINT while F2 "
			                      "measured") != NULL, "%s", err);
		}
		free(out);
		free(err);
	}
}

Test(interrupt, sigterm_during_run_json_gives_a_valid_object, .timeout = 300)
{
	static const char *const none[] = { NULL };
	const char *plugins;
	char args[8192], *err;
	json_t *j, *text, *decode;
	json_error_t jerr;
	struct bg b;
	int status;

	test_model_path();
	plugins = test_plugin_dir(none);
	snprintf(args, sizeof(args),
	         "run -n 2000 -b 1 -p 'Once upon a time' --json --plugin-path %s", plugins);
	start_on_tty(&b, args);
	/* With --json nothing is printed before the end; on a terminal the
	 * prompt's status line shows (-b 1: a step a token) and is erased
	 * when the prompt is in: then decode runs. The object must hold what
	 * was generated. */
	on_tty(&b, on_tty(&b, 0, "prefill: "), "\r\033[K");
	cr_assert_eq(kill(b.pid, SIGTERM), 0);
	status = finish(&b, NULL, &err);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 143,
	          "SIGTERM exits 143 (status %#x): %s", status, err);
	j = json_load_file(b.out, 0, &jerr);
	cr_assert_not_null(j, "stdout is one JSON object (%s): %s", jerr.text, err);
	cr_expect_str_eq(json_string_value(json_object_get(j, "stop")), "interrupted by SIGTERM");
	text = json_object_get(j, "text");
	decode = json_object_get(json_object_get(j, "decode"), "tokens");
	cr_assert(json_is_string(text) && json_is_integer(decode));
	cr_expect_lt(json_integer_value(decode), 2000);
	cr_expect(json_integer_value(decode) == 0 || json_string_length(text) > 0,
	          "the text generated is in the object");
	json_decref(j);
	free(err);
}

/* A reader that goes away (| head) ends the generation, not the process:
 * the report still says what ran and why it stopped (SIGPIPE used to end
 * it with 141 and no report); the reader took what it wanted, so the exit
 * is 0, with no word about the closed pipe (main.c, for every command). */
Test(interrupt, a_reader_that_goes_away_ends_the_run_with_its_report, .timeout = 300)
{
	static const char *const none[] = { NULL };
	char args[8192], q4khost[16384], cmd[40000], errpath[4200], *out, *err;
	long decoded = -1;
	const char *line;

	test_model_path();
	snprintf(args, sizeof(args), "run -n 2000 -p 'Once upon a time' --plugin-path %s",
	         test_plugin_dir(none));
	snprintf(errpath, sizeof(errpath), "%s/stderr", test_tmpdir());
	snprintf(cmd, sizeof(cmd), "{ %s; echo \"exit $?\" >&2; } 2>%s | head -c 20",
	         test_q4khost_command("", test_tmpdir(), args, q4khost, sizeof(q4khost)), errpath);
	cr_assert_eq(test_shell(cmd, &out), 0, "%s", out);
	cr_expect_eq(strlen(out), 20, "[%s]", out);
	err = slurp(errpath);
	cr_expect(strstr(err, "stop: standard output closed\nexit 0\n") != NULL, "%s", err);
	line = strstr(err, "; decode ");
	cr_assert_not_null(line, "%s", err);
	cr_expect_eq(sscanf(line, "; decode %ld tokens", &decoded), 1, "%s", line);
	cr_expect(decoded > 0 && decoded < 2000, "stopped early: %ld tokens", decoded);
	free(out);
	free(err);
}

/* Every command, not only run: info --all (88 KB on the tiny model, more
 * than a pipe holds) into head ends quietly with 0, not SIGPIPE's 141. */
Test(interrupt, every_command_piped_into_head_ends_quietly_with_0)
{
	static const char *const commands[] = { "info --all %s/tests/fixtures/tiny-llama.gguf",
		                                "plugins --json" };
	char args[8192], q4khost[16384], cmd[40000], errpath[4200], *out, *err;

	snprintf(errpath, sizeof(errpath), "%s/stderr", test_tmpdir());
	for (int i = 0; i < 2; i++) {
		snprintf(args, sizeof(args), commands[i], test_srcdir());
		snprintf(cmd, sizeof(cmd), "{ %s; echo \"exit $?\" >&2; } 2>%s | head -c 1",
		         test_q4khost_command("", test_tmpdir(), args, q4khost, sizeof(q4khost)),
		         errpath);
		cr_assert_eq(test_shell(cmd, &out), 0, "%s", out);
		cr_expect_eq(strlen(out), 1, "[%s]", out);
		err = slurp(errpath);
		cr_expect_str_eq(err, "exit 0\n", "%s", args);
		free(out);
		free(err);
	}
}

/* A plugin that hangs in the child: validate's parent is then stopped. */
static void start_hanging_validate(struct bg *b, const char *extra)
{
	static const char *const names[] = { "defect_hang", NULL };
	const char *plugins;
	char args[8192];

	test_model_path();
	plugins = test_plugin_dir(names);
	snprintf(args, sizeof(args), "validate --json --plugin-path %s %s", plugins, extra);
	start(b, args);
}

Test(interrupt, sigterm_to_validate_stops_its_child_and_writes_no_receipt, .timeout = 300)
{
	static const char *const measured[] = { "min_cosine", "min_cosine_position",
		                                "worst_position", "worst_decode_step",
		                                "near_ties", "seconds", "source" };
	json_t *j, *row;
	json_error_t jerr;
	struct bg b;
	pid_t child;
	int status;
	char *err, cmd[8192], *listing;

	start_hanging_validate(&b, "--timeout 600");
	child = wait_for_child(b.pid);
	cr_assert_eq(kill(b.pid, SIGTERM), 0, "to the parent alone");
	status = finish(&b, NULL, &err);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 143, "status %#x: %s", status, err);
	cr_expect(!test_alive(child), "the child was stopped with its parent");
	cr_expect(strstr(err, "stopped by SIGTERM") != NULL, "%s", err);
	/* The stopped row measured nothing: null, not 0.0 or an older
	 * receipt's numbers. */
	j = json_load_file(b.out, 0, &jerr);
	cr_assert_not_null(j, "%s", jerr.text);
	row = json_array_get(json_object_get(j, "candidates"), 0);
	cr_expect(json_is_null(json_object_get(row, "verdict")), "no verdict for a stopped row");
	for (int i = 0; i < 7; i++)
		cr_expect(json_is_null(json_object_get(row, measured[i])), "%s is null", measured[i]);
	json_decref(j);
	snprintf(cmd, sizeof(cmd), "ls %s | grep -c json || true", b.receipts);
	test_shell(cmd, &listing);
	cr_expect_str_eq(listing, "0\n", "no receipt for a measurement that was stopped");
	free(listing);
	free(err);
}

Test(interrupt, a_killed_validate_takes_its_child_along, .timeout = 300)
{
	struct bg b;
	pid_t child;

	start_hanging_validate(&b, "--timeout 600");
	child = wait_for_child(b.pid);
	cr_assert_eq(kill(b.pid, SIGKILL), 0, "no chance to pass anything on");
	test_reap(b.pid);
	wait_until_gone(child); /* PR_SET_PDEATHSIG; else the test times out */
	cr_expect(!test_alive(child));
}

Test(interrupt, a_stopped_validate_leaves_its_child_to_its_own_alarm, .timeout = 300)
{
	struct bg b;
	pid_t child;
	int status;
	json_t *j, *row;
	json_error_t jerr;

	start_hanging_validate(&b, "--timeout 2");
	child = wait_for_child(b.pid);
	cr_assert_eq(kill(b.pid, SIGSTOP), 0, "the parent watches no more");
	wait_until_gone(child); /* its alarm: the time limit + 5 s */
	cr_assert_eq(kill(b.pid, SIGCONT), 0);
	status = test_reap(b.pid);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %#x", status);
	j = json_load_file(b.out, 0, &jerr);
	cr_assert_not_null(j, "%s", jerr.text);
	row = json_array_get(json_object_get(j, "candidates"), 0);
	cr_expect(strstr(json_string_value(json_object_get(row, "message")),
	                 "killed by its own alarm") != NULL,
	          "%s", json_string_value(json_object_get(row, "message")));
	json_decref(j);
}

/*
 * qa stops as bench does, after the case in progress: the report of the
 * cases done with the others as not run, then why on stderr, 130; with
 * --json and SIGTERM one valid object that says it was stopped, 143. On
 * the tiny fixture, the reference alone, 60 cases of 200 tokens, stopped
 * once its status line says the second case began.
 */
static void qa_stopped(const char *extra, int sig, int code)
{
	static const char *const none[] = { NULL };
	char cases[4400], args[16384], line[128];
	FILE *f;
	struct bg b;
	int status;
	char *out, *err;

	snprintf(cases, sizeof(cases), "%s/cases.jsonl", test_tmpdir());
	f = fopen(cases, "w");
	cr_assert_not_null(f);
	for (int i = 0; i < 60; i++) {
		snprintf(line, sizeof(line), "{\"prompt\": \"Once upon a time %d\", \"accept\": [\"x\"], "
		         "\"max_tokens\": 200}\n", i);
		fputs(line, f);
	}
	fclose(f);
	snprintf(args, sizeof(args), "qa --cases %s -m %s/tests/fixtures/tiny-llama.gguf "
	         "--plugin-path %s %s", cases, test_srcdir(), test_plugin_dir(none), extra);
	start_on_tty(&b, args);
	on_tty(&b, 0, ": case 2 of 60"); /* its status line: the first case is done */
	cr_assert_eq(kill(b.pid, sig), 0);
	status = finish(&b, &out, &err);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == code, "status %#x: %s", status, err);
	snprintf(line, sizeof(line), "q4khost qa: stopped by %s; ", sig == SIGINT ? "SIGINT" : "SIGTERM");
	cr_expect(strstr(err, line) != NULL, "%s", err);
	snprintf(line, sizeof(line), "interrupted by %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
	if (strstr(extra, "--json")) {
		json_error_t jerr;
		json_t *j = json_loads(out, 0, &jerr);

		cr_assert_not_null(j, "one object: %s: %s", jerr.text, out);
		cr_expect_str_eq(json_string_value(json_object_get(j, "stopped")), line);
		cr_expect_gt(json_integer_value(json_object_get(j, "not_run")), 0, "%s", out);
		cr_expect_lt(json_integer_value(json_object_get(j, "not_run")), 60,
		             "the case done before the signal counts: %s", out);
		cr_expect_eq(json_array_size(json_object_get(j, "cases")), 60);
		json_decref(j);
	} else {
		cr_expect(strstr(out, " not run (interrupted by SIGINT)\n") != NULL, "%s", out);
		cr_expect(strstr(out, "not run: interrupted by SIGINT") != NULL, "%s", out);
	}
	free(out);
	free(err);
}

Test(interrupt, sigint_during_qa_prints_the_cases_done, .timeout = 120)
{
	qa_stopped("", SIGINT, 130);
}

Test(interrupt, sigterm_during_qa_json_keeps_the_object, .timeout = 120)
{
	qa_stopped("--json", SIGTERM, 143);
}
