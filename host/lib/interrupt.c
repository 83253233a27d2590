#include "interrupt.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop_signal;
static struct timespec first_at; /* when stop_signal was set (CLOCK_MONOTONIC) */
static void (*notify)(int sig);  /* told of the first signal, or NULL */

/* Whether NOW is at least Q4KH_INTERRUPT_AGAIN_MS after the first signal. */
static int asked_again(const struct timespec *now)
{
	long long ms = (long long)(now->tv_sec - first_at.tv_sec) * 1000 +
	               (now->tv_nsec - first_at.tv_nsec) / 1000000;

	return ms >= Q4KH_INTERRUPT_AGAIN_MS;
}

static void on_signal(int sig)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now); /* async-signal-safe */
	if (stop_signal) {
		/* A signal that came with the first one (timeout -s INT sends
		 * it to the process, then to its group) is the same request. */
		if (!asked_again(&now))
			return;
		/* Asked twice: the default action, now. */
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	first_at = now;
	stop_signal = sig;
	if (notify)
		notify(sig);
}

void q4kh_interrupt_install(void)
{
	q4kh_interrupt_install_notify(NULL);
}

void q4kh_interrupt_install_notify(void (*first)(int sig))
{
	struct sigaction sa;

	notify = first;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

int q4kh_interrupted(void)
{
	return stop_signal;
}

const char *q4kh_signal_name(int sig)
{
	static char other[32];

	switch (sig) {
	case SIGINT: return "SIGINT";
	case SIGTERM: return "SIGTERM";
	case SIGHUP: return "SIGHUP";
	case SIGKILL: return "SIGKILL";
	}
	snprintf(other, sizeof(other), "signal %d", sig);
	return other;
}

int q4kh_interrupt_exit_code(int sig)
{
	return 128 + sig;
}
