#include "error.h"

#include <stdarg.h>
#include <stdio.h>

int q4kh_fail(struct q4kh_error *err, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return -1;
}

const char *q4kh_show(char *buf, size_t cap, const void *s, size_t len,
                      size_t max, int ascii_only)
{
	const unsigned char *u = s;
	size_t o = 0, i;

	for (i = 0; i < len && i < max && o + 5 < cap; i++) {
		int plain = u[i] >= 0x20 && u[i] != 0x7f && u[i] != '\\' &&
		            (u[i] < 0x80 || !ascii_only);
		if (plain)
			buf[o++] = (char)u[i];
		else
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", u[i]);
	}
	if (i < len && o + 4 < cap)
		o += (size_t)snprintf(buf + o, cap - o, "...");
	if (cap)
		buf[o < cap ? o : cap - 1] = 0;
	return buf;
}
