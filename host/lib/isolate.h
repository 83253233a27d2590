/*
 * Running one measurement in a child process under limits, so that a
 * plugin that crashes, hangs or eats memory fails alone: the parent kills
 * it and says which limit it broke.
 */
#ifndef Q4KH_ISOLATE_H
#define Q4KH_ISOLATE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"

struct q4kh_isolate_limits {
	unsigned timeout_seconds;  /* wall clock, >= 1 */
	uint64_t memory_limit_mib; /* private resident memory; 0 = no limit */
	/* Called once a second while the child runs, with the seconds so far
	 * (NULL: not called); for progress on a terminal. Non-zero when the
	 * child cannot finish within the time limit (a deep measurement's
	 * estimate says so), with one line in WHY (WHY_CAP bytes) that says
	 * it: the child is killed then, as the limit would kill it later,
	 * and the run ends as a timeout does. */
	int (*tick)(void *data, unsigned seconds, char *why, size_t why_cap);
	void *tick_data;
	/* What the child does, as WHY names it ("validation" when NULL): a
	 * backend's enumeration says "its init or device enumeration (in a
	 * helper process)". */
	const char *what;
	/* Where not NULL, which limit stopped the child, when one did
	 * (Q4KH_ISOLATE_HIT_*); left as it is otherwise. */
	int *hit;
	/* Where not NULL, the child's last line on stderr (SAID_CAP bytes,
	 * "" when it wrote none) when it exited with status 0, for the caller
	 * to pass on or to quote; when NULL that line is passed on too. */
	char *said;
	size_t said_cap;
};

enum { Q4KH_ISOLATE_HIT_NONE, Q4KH_ISOLATE_HIT_TIME, Q4KH_ISOLATE_HIT_MEMORY };

/*
 * Run EXE with ARGV (NULL-terminated; the environment is ours) and wait
 * for it under LIMITS. What the child writes on stderr is passed on to
 * ours line by line as it comes, but for its last line, which is its
 * reason when it fails. Returns 0 when it exited with status 0; 1 with one
 * line in WHY when it was killed by a signal ("validation crashed: killed
 * by signal 6 (Aborted)"), exited non-zero ("validation failed: the
 * process exited with status 1"), or broke a limit and was killed
 * ("validation timed out after 5 s and was killed", "validation exceeded
 * the memory limit: 1100 MiB resident > 1024 MiB", or the line of a tick
 * that foresees the time limit), each message but a tick's starting
 * with LIMITS->what and ending with the child's last line on stderr when
 * it wrote one ("...; its last line on stderr: q4khost validate:
 * ..."); 2 with WHY ("validation stopped by SIGINT")
 * when we were asked to stop
 * (interrupt.h: the signal is passed on to the child, which is reaped) or
 * the child was stopped by SIGINT, SIGTERM or SIGHUP: nothing about the
 * plugin was learnt; -1 with err when it could not be started or waited
 * for. The child dies with this process (PR_SET_PDEATHSIG where the
 * system has it) and on its own alarm 5 s after the time limit. Memory is
 * watched, not capped (isolate.c says why): a child may overshoot the
 * limit by what it touches in one 20 ms poll before it is killed. Not
 * thread-safe: it reaps only its own child, but shares the process's
 * signal state.
 */
int q4kh_isolate_run(const char *exe, const char *const *argv,
                     const struct q4kh_isolate_limits *limits, char *why,
                     size_t why_cap, struct q4kh_error *err);

/* How q4kh_isolate_spawn starts a child. */
struct q4kh_spawn_how {
	int stdout_fd;    /* made the child's standard output; -1 keeps ours */
	int stderr_fd;    /* made the child's standard error; -1 keeps ours */
	int own_group;    /* non-zero: the child leads a new process group */
	unsigned alarm_s; /* the child's own alarm, which kills it; 0: none */
};

/*
 * fork and exec EXE with ARGV (NULL-terminated; our environment) as HOW
 * says. Between the two the child asks to die with the thread that forked
 * it (PR_SET_PDEATHSIG: a parent killed with no chance to stop it takes the
 * child along), unblocks every signal and gives SIGINT, SIGTERM, SIGHUP,
 * SIGPIPE and SIGALRM their default action (q4khost ignores SIGPIPE, and
 * an ignored signal stays ignored across exec). Returns the child's pid,
 * or -1 with err when fork fails; a failed exec is the child's exit status
 * 127. The caller waits for it.
 */
pid_t q4kh_isolate_spawn(const char *exe, const char *const *argv,
                         const struct q4kh_spawn_how *how, struct q4kh_error *err);

/*
 * The path of the q4khost binary that runs now, to start it again: what
 * /proc/self/exe links to. Not /proc/self/exe itself: under valgrind (or
 * any tool that loads the program itself) that is the tool's own binary,
 * which it answers readlink() for with the program's. /proc/self/exe when
 * the link cannot be read or its file has been replaced since we started
 * (" (deleted)"). A static string, made on the first call; thread-safe.
 */
const char *q4kh_self_exe(void);

/*
 * The default memory limit in MiB: half of the physical memory, so that a
 * runaway child is stopped while the rest of the machine still has room.
 * 0 (no limit) when the size of physical memory is unknown.
 */
uint64_t q4kh_isolate_default_memory_mib(void);

#endif
