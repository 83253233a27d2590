/*
 * Progress of long work (an F2 measurement, a long prefill, a benchmark
 * row) as one status line on stderr that rewrites itself, so a person at
 * a terminal can tell slow work from a hang. Only when stderr is a
 * terminal: a log, a pipe or a test sees none of it. The line is erased
 * before anything else is written to the terminal (q4kh_progress_clear).
 * Work that a log should follow too (an F2 measurement) writes lines of
 * its own there (q4kh_progress_note), as seldom as a log wants them.
 * q4kh_progress_init and q4kh_progress belong to the thread that runs the
 * command; q4kh_progress_clear may be called from any thread (a plugin's
 * log line clears the status line first).
 */
#ifndef Q4KH_PROGRESS_H
#define Q4KH_PROGRESS_H

/* Name the command for the lines ("run": "q4khost run: ..."); decides, once,
 * whether stderr is a terminal. Without it no progress is shown. */
void q4kh_progress_init(const char *command);

/* Show "q4khost COMMAND: TEXT" as the status line, replacing the last;
 * a TEXT too long for the terminal's width is cut at a word, with "...",
 * from its end: what the work is on (a candidate's name) and what changes
 * (a counter, the seconds) go first in TEXT, so that a narrow terminal
 * still shows which and that it moves. */
void q4kh_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Erase the status line, if one is showing. */
void q4kh_progress_clear(void);

/* Whether q4kh_progress shows its line: stderr is a terminal (0 before
 * q4kh_progress_init). */
int q4kh_progress_on_terminal(void);

/*
 * "q4khost COMMAND: TEXT" as a line of its own, kept on a terminal (the
 * status line erased first) and in a log alike: an estimate, or the
 * status a log gets instead of the status line. Nothing before
 * q4kh_progress_init.
 */
void q4kh_progress_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
