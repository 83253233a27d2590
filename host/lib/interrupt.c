#include "interrupt.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
	if (stop_signal) {
		/* Asked twice: the default action, now. */
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	stop_signal = sig;
}

void q4kh_interrupt_install(void)
{
	struct sigaction sa;

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
