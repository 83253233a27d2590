/*
 * A measurement in a child process: posix_spawn, then poll with waitpid
 * so that a time limit and a memory limit can be enforced by the parent.
 *
 * Why the memory limit is a watchdog, not an rlimit: RLIMIT_AS counts
 * address space, and the CUDA driver reserves far more of it than it ever
 * backs (unified addressing), so any useful value breaks CUDA plugins.
 * RLIMIT_DATA counts private writable mappings, also before they are
 * touched, and what a GPU runtime maps that way is not ours to predict.
 * So the parent reads what the child really holds: its private resident
 * memory (RssAnon + RssShmem in /proc/PID/status). File-backed pages are
 * left out on purpose: the model is mmap()ed (twice, by the reference and
 * the candidate), those pages count twice in VmRSS and ru_maxrss, and the
 * kernel can drop them at will; that is also why ru_maxrss at exit is not
 * used. Without /proc the memory limit cannot be enforced and only the
 * time limit applies.
 */
#include "isolate.h"

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define POLL_NS (20 * 1000 * 1000)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* RssAnon + RssShmem of PID in KiB; -1 when its status cannot be read. */
static int private_resident_kib(pid_t pid, uint64_t *kib)
{
	char path[64], line[256];
	unsigned long long v;
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	*kib = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %llu kB", &v) == 1 ||
		    sscanf(line, "RssShmem: %llu kB", &v) == 1) {
			*kib += v;
			found++;
		}
	fclose(f);
	return found ? 0 : -1;
}

uint64_t q4kh_isolate_default_memory_mib(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);

	if (pages <= 0 || size <= 0)
		return 0;
	return (uint64_t)pages * (uint64_t)size / 2 / (1024 * 1024);
}

/* Kill PID and reap it; the reason is the caller's. */
static int kill_child(pid_t pid)
{
	int status;

	kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return 1;
}

int q4kh_isolate_run(const char *exe, const char *const *argv,
                     const struct q4kh_isolate_limits *limits, char *why,
                     size_t why_cap, struct q4kh_error *err)
{
	const uint64_t limit_kib = limits->memory_limit_mib * 1024;
	double t0 = now();
	int status = 0;
	uint64_t kib;
	pid_t pid;

	errno = posix_spawn(&pid, exe, NULL, NULL, (char *const *)argv, environ);
	if (errno)
		return q4kh_fail(err, "cannot start %s: %s", exe, strerror(errno));
	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);

		if (w == pid)
			break;
		if (w < 0 && errno != EINTR)
			return q4kh_fail(err, "waiting for the validation process: %s",
			                 strerror(errno));
		if (limit_kib && private_resident_kib(pid, &kib) == 0 && kib > limit_kib) {
			/* Rounded up: over the limit by 1 KiB reads "M + 1 > M". */
			snprintf(why, why_cap,
			         "validation exceeded the memory limit: %llu MiB resident > %llu MiB",
			         (unsigned long long)((kib + 1023) / 1024),
			         (unsigned long long)limits->memory_limit_mib);
			return kill_child(pid);
		}
		if (now() - t0 > limits->timeout_seconds) {
			snprintf(why, why_cap, "validation timed out after %u s and was killed",
			         limits->timeout_seconds);
			return kill_child(pid);
		}
		nanosleep(&(struct timespec){ .tv_nsec = POLL_NS }, NULL);
	}
	if (WIFSIGNALED(status)) {
		snprintf(why, why_cap, "validation crashed: killed by signal %d (%s)",
		         WTERMSIG(status), strsignal(WTERMSIG(status)));
		return 1;
	}
	if (WEXITSTATUS(status) != 0) {
		snprintf(why, why_cap, "validation failed: the process exited with status %d",
		         WEXITSTATUS(status));
		return 1;
	}
	return 0;
}
