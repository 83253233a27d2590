/*
 * Model files opened once per process. Opening the same file again (the
 * same device, inode, size, modification and change times) while it is
 * open returns the same parsed, mapped file, so the F2 reference and the
 * candidate, or a server's sessions, hold one copy of its pages. The
 * file is read-only to everyone who holds it. Thread-safe.
 */
#ifndef Q4KH_GGUF_SHARED_H
#define Q4KH_GGUF_SHARED_H

#include "error.h"
#include "gguf.h"

/*
 * q4kh_gguf_open, shared: *out is PATH's open file, opened now or earlier
 * by this process. -1 with err as q4kh_gguf_open. Release with
 * q4kh_gguf_release, never q4kh_gguf_close.
 */
int q4kh_gguf_acquire(const char *path, struct q4kh_gguf **out,
                      struct q4kh_error *err);
/*
 * PATH's file as this process holds it now, one hold more, into *out: 0;
 * -1 (*out NULL) when no one holds it, and nothing is opened.
 */
int q4kh_gguf_held(const char *path, struct q4kh_gguf **out);
/* Drop one hold on G; the last closes it. NULL is ignored. */
void q4kh_gguf_release(struct q4kh_gguf *g);

#endif
