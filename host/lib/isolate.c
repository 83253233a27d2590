/*
 * A measurement in a child process: fork and exec, then poll with waitpid
 * so that a time limit and a memory limit can be enforced by the parent.
 *
 * The child must not outlive the parent's watch. A parent stopped by
 * SIGINT or SIGTERM (q4kh_interrupted) forwards the signal and reaps the
 * child; a parent that dies without that chance (SIGKILL, a crash) takes
 * the child with it through PR_SET_PDEATHSIG, set between fork and exec
 * (posix_spawn has no place for it); and a parent that stops polling (a
 * stopped process, a debugger) is covered by the child's own alarm, a
 * little after the parent's time limit, which survives exec.
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
#include "buildconf.h"

#include "isolate.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_SYS_PRCTL_H
#include <sys/prctl.h>
#endif

#include "interrupt.h"
#include "progress.h"

extern char **environ;

#define POLL_NS (20 * 1000 * 1000)
/* The child's own alarm rings this long after the parent's time limit, so
 * the parent, which can say why, normally acts first. */
#define CHILD_GRACE_S 5
/* A child asked to stop gets this long before SIGKILL. */
#define STOP_GRACE_S 2.0

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

static void reap(pid_t pid)
{
	int status;

	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
}

/* Kill PID and reap it; the reason is the caller's. */
static int kill_child(pid_t pid)
{
	kill(pid, SIGKILL);
	reap(pid);
	return 1;
}

/* Pass SIG on to PID, give it a moment to go, then make sure it does. */
static void stop_child(pid_t pid, int sig)
{
	double t0 = now();
	int status;

	kill(pid, sig);
	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (now() - t0 > STOP_GRACE_S) {
			kill_child(pid);
			return;
		}
		nanosleep(&(struct timespec){ .tv_nsec = POLL_NS }, NULL);
	}
}

pid_t q4kh_isolate_spawn(const char *exe, const char *const *argv,
                         const struct q4kh_spawn_how *how, struct q4kh_error *err)
{
	static const int defaults[] = { SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGALRM };
	pid_t parent = getpid(), pid = fork();
	sigset_t none;

	if (pid < 0) {
		q4kh_fail(err, "cannot start %s: fork: %s", exe, strerror(errno));
		return -1;
	}
	if (pid > 0)
		return pid;
	/* The child: only async-signal-safe calls until exec. */
#ifdef HAVE_SYS_PRCTL_H
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
		_exit(127); /* the parent is already gone */
#else
	(void)parent;
#endif
	if (how->own_group)
		setpgid(0, 0);
	for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
		signal(defaults[i], SIG_DFL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if ((how->stdout_fd >= 0 && dup2(how->stdout_fd, STDOUT_FILENO) < 0) ||
	    (how->stderr_fd >= 0 && dup2(how->stderr_fd, STDERR_FILENO) < 0))
		_exit(127);
	alarm(how->alarm_s);
	execve(exe, (char *const *)argv, environ);
	_exit(127);
}

static char self_exe[4096];
static pthread_once_t self_exe_once = PTHREAD_ONCE_INIT;

static void find_self_exe(void)
{
	static const char deleted[] = " (deleted)";
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	size_t d = sizeof(deleted) - 1;

	if (n <= 0 || (size_t)n == sizeof(self_exe) - 1 ||
	    ((size_t)n >= d && !memcmp(self_exe + n - d, deleted, d)))
		n = snprintf(self_exe, sizeof(self_exe), "/proc/self/exe");
	self_exe[n] = 0;
}

const char *q4kh_self_exe(void)
{
	pthread_once(&self_exe_once, find_self_exe);
	return self_exe;
}

/*
 * The child's stderr, read from a pipe as it comes: every line is passed
 * on to ours but the last, held back as the child's reason when it fails.
 * A line longer than the room is passed on in pieces.
 */
struct said {
	int fd;          /* the pipe's read end, non-blocking; -1 once closed */
	char last[512];  /* the last line, or as much of it as has come */
	size_t len;
	int ended;       /* last holds a whole line (its newline came) */
};

static void pass_on(struct said *s)
{
	q4kh_progress_clear();
	fprintf(stderr, "%.*s%s", (int)s->len, s->last, s->ended ? "\n" : "");
	s->len = 0;
	s->ended = 0;
}

/* Whatever the child has written since the last call. */
static void read_said(struct said *s)
{
	char buf[4096];
	ssize_t n;

	while (s->fd >= 0 && (n = read(s->fd, buf, sizeof(buf))) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				close(s->fd);
				s->fd = -1;
			}
			return;
		}
		for (ssize_t i = 0; i < n; i++) {
			if (s->ended || s->len == sizeof(s->last))
				pass_on(s);
			if (buf[i] == '\n')
				s->ended = 1;
			else
				s->last[s->len++] = buf[i];
		}
	}
	if (s->fd >= 0) { /* end of file: every writer is gone */
		close(s->fd);
		s->fd = -1;
	}
}

/* Append the child's last line to WHY (CAP bytes), when it wrote one. */
static void quote_said(const struct said *s, char *why, size_t cap)
{
	size_t used = strlen(why);

	if (s->len)
		snprintf(why + used, cap - used, "; its last line on stderr: %.*s", (int)s->len,
		         s->last);
}

/* A stop asked of the process, not a crash of the plugin. */
static int is_stop_signal(int sig)
{
	return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

static void set_hit(const struct q4kh_isolate_limits *limits, int which)
{
	if (limits->hit)
		*limits->hit = which;
}

/* Wait for the child PID under LIMITS, reading what it says into S: as
 * q4kh_isolate_run, but for the child's last line. */
static int watch(pid_t pid, const struct q4kh_isolate_limits *limits, struct said *s,
                 char *why, size_t why_cap, struct q4kh_error *err)
{
	const uint64_t limit_kib = limits->memory_limit_mib * 1024;
	const char *what = limits->what ? limits->what : "validation";
	double t0 = now();
	unsigned ticked = 0;
	int status = 0, sig;
	uint64_t kib;

	for (;;) {
		pid_t w;

		read_said(s);
		w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			break;
		if (w < 0 && errno != EINTR)
			return q4kh_fail(err, "waiting for the %s process: %s", what,
			                 strerror(errno));
		if ((sig = q4kh_interrupted())) {
			stop_child(pid, sig);
			snprintf(why, why_cap, "%s stopped by %s", what, q4kh_signal_name(sig));
			return 2;
		}
		if (limit_kib && private_resident_kib(pid, &kib) == 0 && kib > limit_kib) {
			/* Rounded up: over the limit by 1 KiB reads "M + 1 > M". */
			snprintf(why, why_cap,
			         "%s exceeded the memory limit: %llu MiB resident > %llu MiB", what,
			         (unsigned long long)((kib + 1023) / 1024),
			         (unsigned long long)limits->memory_limit_mib);
			set_hit(limits, Q4KH_ISOLATE_HIT_MEMORY);
			return kill_child(pid);
		}
		if (now() - t0 > limits->timeout_seconds) {
			kill(pid, SIGKILL);
			while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
				;
			/* One already dying of its own alarm (this process was
			 * stopped meanwhile, and a process whose threads are
			 * still going down cannot be reaped yet) keeps that
			 * verdict. */
			if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
				break;
			snprintf(why, why_cap, "%s timed out after %u s and was killed", what,
			         limits->timeout_seconds);
			set_hit(limits, Q4KH_ISOLATE_HIT_TIME);
			return 1;
		}
		if (limits->tick && (unsigned)(now() - t0) > ticked) {
			ticked = (unsigned)(now() - t0);
			if (limits->tick(limits->tick_data, ticked, why, why_cap)) {
				set_hit(limits, Q4KH_ISOLATE_HIT_TIME);
				return kill_child(pid);
			}
		}
		nanosleep(&(struct timespec){ .tv_nsec = POLL_NS }, NULL);
	}
	if (WIFSIGNALED(status) && (is_stop_signal(WTERMSIG(status)) || q4kh_interrupted())) {
		sig = q4kh_interrupted() ? q4kh_interrupted() : WTERMSIG(status);
		snprintf(why, why_cap, "%s stopped by %s", what, q4kh_signal_name(sig));
		return 2;
	}
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
		snprintf(why, why_cap,
		         "%s timed out after %u s and was killed by its own alarm", what,
		         limits->timeout_seconds + CHILD_GRACE_S);
		set_hit(limits, Q4KH_ISOLATE_HIT_TIME);
		return 1;
	}
	if (WIFSIGNALED(status)) {
		snprintf(why, why_cap, "%s crashed: killed by signal %d (%s)", what,
		         WTERMSIG(status), strsignal(WTERMSIG(status)));
		return 1;
	}
	if (WEXITSTATUS(status) != 0) {
		snprintf(why, why_cap, "%s failed: the process exited with status %d", what,
		         WEXITSTATUS(status));
		return 1;
	}
	return 0;
}

int q4kh_isolate_run(const char *exe, const char *const *argv,
                     const struct q4kh_isolate_limits *limits, char *why,
                     size_t why_cap, struct q4kh_error *err)
{
	struct q4kh_spawn_how how = { -1, -1, 0, limits->timeout_seconds + CHILD_GRACE_S };
	struct said s = { -1, "", 0, 0 };
	int fds[2], rc;
	pid_t pid;

	if (pipe2(fds, O_CLOEXEC) != 0)
		return q4kh_fail(err, "cannot start %s: pipe: %s", exe, strerror(errno));
	how.stderr_fd = fds[1];
	pid = q4kh_isolate_spawn(exe, argv, &how, err);
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return -1;
	}
	s.fd = fds[0];
	fcntl(s.fd, F_SETFL, O_NONBLOCK);
	rc = watch(pid, limits, &s, why, why_cap, err);
	read_said(&s); /* what came after the last poll, or before a kill */
	if (s.fd >= 0)
		close(s.fd);
	if (rc == 1) {
		quote_said(&s, why, why_cap);
	} else if (rc == 0 && limits->said) {
		snprintf(limits->said, limits->said_cap, "%.*s", (int)s.len, s.last);
	} else if (s.len) {
		pass_on(&s);
	}
	return rc;
}
