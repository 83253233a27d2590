/*
 * SIGINT and SIGTERM as a request to stop, not a kill. A command that can
 * stop cleanly (keep the text it generated, print its report, stop the
 * child process it waits for) installs the handlers and asks
 * q4kh_interrupted() between units of work: a token, a prefill batch, a
 * 20 ms poll of a child. A second signal while the first is still being
 * acted on ends the process at once, with that signal, as if no handler
 * were installed: a stop that takes too long can still be forced. Only a
 * signal Q4KH_INTERRUPT_AGAIN_MS or more after the first counts as asked
 * twice: signals that arrive together (timeout -s INT sends one to the
 * process and one to its group, microseconds apart; a Ctrl-C reaches
 * every process of the terminal's group) are one request.
 */
#ifndef Q4KH_INTERRUPT_H
#define Q4KH_INTERRUPT_H

/* How long after the first signal another one forces the stop. */
#define Q4KH_INTERRUPT_AGAIN_MS 500

/* Catch SIGINT and SIGTERM from now on (SA_RESTART: I/O is not cut short). */
void q4kh_interrupt_install(void);

/*
 * The same, and call FIRST(sig) from the handler on the first signal, for
 * a command that waits for it rather than asking q4kh_interrupted() (serve
 * wakes its main thread). FIRST must be async-signal-safe; a second signal
 * still ends the process at once, as above.
 */
void q4kh_interrupt_install_notify(void (*first)(int sig));

/* The signal that asked us to stop (SIGINT or SIGTERM), or 0. Async-signal-safe. */
int q4kh_interrupted(void);

/* "SIGINT", "SIGTERM", or "signal N". */
const char *q4kh_signal_name(int sig);

/* The shell's exit code for a stop by SIG: 128 + SIG (130 for SIGINT, 143 for SIGTERM). */
int q4kh_interrupt_exit_code(int sig);

#endif
