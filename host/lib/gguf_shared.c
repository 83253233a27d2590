/*
 * One mapping per model file per process (gguf_shared.h): the F2
 * reference and the candidate, and every later open of the same file,
 * share the parsed file and its pages.
 */
#include "gguf_shared.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct entry {
	struct entry *next;
	struct q4kh_gguf *g;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime, ctime;
	unsigned refs;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *open_files;

static int same_time(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* The entry for the file that ST describes, as it is now, or NULL. */
static struct entry *find(const struct stat *st)
{
	for (struct entry *e = open_files; e; e = e->next)
		if (e->dev == st->st_dev && e->ino == st->st_ino && e->size == st->st_size &&
		    same_time(&e->mtime, &st->st_mtim) && same_time(&e->ctime, &st->st_ctim))
			return e;
	return NULL;
}

int q4kh_gguf_acquire(const char *path, struct q4kh_gguf **out,
                      struct q4kh_error *err)
{
	struct stat st;
	struct entry *e;
	int rc;

	*out = NULL;
	/* an unreadable path gets q4kh_gguf_open's own message */
	if (stat(path, &st) < 0)
		return q4kh_gguf_open(path, out, err);
	pthread_mutex_lock(&lock);
	e = find(&st);
	if (e) {
		e->refs++;
		*out = e->g;
		pthread_mutex_unlock(&lock);
		return 0;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		pthread_mutex_unlock(&lock);
		return q4kh_fail(err, "%s: out of memory", path);
	}
	rc = q4kh_gguf_open(path, &e->g, err);
	if (rc) {
		free(e);
	} else {
		e->dev = st.st_dev;
		e->ino = st.st_ino;
		e->size = st.st_size;
		e->mtime = st.st_mtim;
		e->ctime = st.st_ctim;
		e->refs = 1;
		e->next = open_files;
		open_files = e;
		*out = e->g;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

int q4kh_gguf_held(const char *path, struct q4kh_gguf **out)
{
	struct stat st;
	struct entry *e;

	*out = NULL;
	if (stat(path, &st) < 0)
		return -1;
	pthread_mutex_lock(&lock);
	e = find(&st);
	if (e) {
		e->refs++;
		*out = e->g;
	}
	pthread_mutex_unlock(&lock);
	return e ? 0 : -1;
}

void q4kh_gguf_release(struct q4kh_gguf *g)
{
	struct entry **p, *e;

	if (!g)
		return;
	pthread_mutex_lock(&lock);
	for (p = &open_files; *p && (*p)->g != g; p = &(*p)->next)
		;
	e = *p;
	if (e && --e->refs == 0)
		*p = e->next;
	pthread_mutex_unlock(&lock);
	if (!e) /* opened by q4kh_gguf_open after a failed stat */
		q4kh_gguf_close(g);
	else if (e->refs == 0) {
		q4kh_gguf_close(g);
		free(e);
	}
}
