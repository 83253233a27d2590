#include "progress.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

static const char *command;
static int on;
/* Plugins log from their own threads, and a log line clears the status line. */
static atomic_int showing;

void q4kh_progress_init(const char *name)
{
	command = name;
	on = isatty(STDERR_FILENO);
}

/* Columns left for the text: a line that wraps cannot be rewritten. */
static int room(void)
{
	struct winsize ws;
	int width = 80, left;

	if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		width = ws.ws_col;
	left = width - 1 - (int)strlen("q4khost : ") - (int)strlen(command);
	return left > 8 ? left : 8;
}

/*
 * TEXT cut to at most ROOM bytes (so at most ROOM columns) where it is
 * longer: at the last space that leaves room for "...", which then marks
 * the cut; inside a word only when no space is in the second half, and
 * never inside a UTF-8 character.
 */
static void fit(char *text, int room)
{
	const size_t keep = room > 3 ? (size_t)room - 3 : 0;
	size_t cut = keep;

	if (strlen(text) <= (size_t)room)
		return;
	while (cut > keep / 2 && text[cut] != ' ')
		cut--;
	if (text[cut] != ' ')
		for (cut = keep; cut > 0 && ((unsigned char)text[cut] & 0xc0) == 0x80; cut--)
			;
	snprintf(text + cut, 4, "...");
}

void q4kh_progress(const char *fmt, ...)
{
	char text[512];
	va_list ap;

	if (!on)
		return;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	fit(text, room());
	/* Carriage return, the text, then erase what a longer line left. */
	fprintf(stderr, "\rq4khost %s: %s\033[K", command, text);
	fflush(stderr);
	atomic_store(&showing, 1);
}

void q4kh_progress_clear(void)
{
	if (!atomic_exchange(&showing, 0))
		return;
	fputs("\r\033[K", stderr);
	fflush(stderr);
}

int q4kh_progress_on_terminal(void)
{
	return on;
}

void q4kh_progress_note(const char *fmt, ...)
{
	va_list ap;

	if (!command)
		return;
	q4kh_progress_clear();
	fprintf(stderr, "q4khost %s: ", command);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
}
