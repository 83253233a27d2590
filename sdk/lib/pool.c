/*
 * A persistent pool of worker threads, created once per device. Each op
 * splits its items (output rows) into contiguous parts, one per thread; the
 * calling thread runs part 0. Which thread computes an item never changes
 * how it is computed, so results do not depend on the thread count.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "q4khost/pool.h"

struct q4kh_pool {
	unsigned threads;
	pthread_t *workers; /* threads - 1 of them */
	unsigned started;
	pthread_mutex_t lock;
	pthread_cond_t wake; /* a new job, or stop */
	pthread_cond_t done; /* the last part of a job finished */
	uint64_t job;        /* incremented for every job */
	unsigned pending;    /* parts of the current job still running */
	int stop;
	q4kh_task_fn fn;
	void *arg;
	int64_t n;
	unsigned parts;
};

unsigned q4kh_threads_online(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (n < 1)
		return 1;
	return n > Q4KH_MAX_THREADS ? Q4KH_MAX_THREADS : (unsigned)n;
}

int q4kh_threads_parse(const char *s, unsigned *out)
{
	unsigned long v = 0;

	if (!*s)
		return 0; /* "threads =" with no value: as if unset */
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (unsigned long)(*p - '0');
		if (v > Q4KH_MAX_THREADS)
			return -1;
	}
	if (v < 1)
		return -1;
	*out = (unsigned)v;
	return 0;
}

struct pool_worker {
	struct q4kh_pool *pool;
	unsigned part;
};

static void part_range(const struct q4kh_pool *p, unsigned part, int64_t *begin,
                       int64_t *end)
{
	*begin = p->n * part / p->parts;
	*end = p->n * (part + 1) / p->parts;
}

static void *worker_main(void *arg)
{
	struct q4kh_pool *p = ((struct pool_worker *)arg)->pool;
	unsigned part = ((struct pool_worker *)arg)->part;
	uint64_t seen = 0;
	int64_t begin, end;
	q4kh_task_fn fn;
	void *fn_arg;

	free(arg);
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->stop && p->job == seen)
			pthread_cond_wait(&p->wake, &p->lock);
		if (p->stop)
			break;
		seen = p->job;
		if (part >= p->parts)
			continue;
		part_range(p, part, &begin, &end);
		fn = p->fn;
		fn_arg = p->arg;
		pthread_mutex_unlock(&p->lock);
		fn(fn_arg, part, begin, end);
		pthread_mutex_lock(&p->lock);
		if (--p->pending == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static int start_worker(struct q4kh_pool *p, unsigned part)
{
	struct pool_worker *w = malloc(sizeof(*w));
	int rc;

	if (!w)
		return ENOMEM;
	w->pool = p;
	w->part = part;
	rc = pthread_create(&p->workers[part - 1], NULL, worker_main, w);
	if (rc)
		free(w);
	return rc;
}

int q4kh_pool_create(unsigned threads, struct q4kh_pool **out)
{
	struct q4kh_pool *p = calloc(1, sizeof(*p));
	int rc = 0;

	*out = NULL;
	if (!p)
		return -1; /* errno is ENOMEM */
	p->threads = threads;
	p->workers = calloc(threads, sizeof(*p->workers));
	if (!p->workers) {
		free(p);
		errno = ENOMEM;
		return -1;
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	for (unsigned i = 1; i < threads && !rc; i++) {
		rc = start_worker(p, i);
		if (!rc)
			p->started++;
	}
	if (rc) {
		q4kh_pool_destroy(p);
		errno = rc;
		return -1;
	}
	*out = p;
	return 0;
}

void q4kh_pool_destroy(struct q4kh_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = 1;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->started; i++)
		pthread_join(p->workers[i], NULL);
	pthread_cond_destroy(&p->done);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p->workers);
	free(p);
}

void q4kh_pool_run(struct q4kh_pool *p, int64_t n, int64_t grain, q4kh_task_fn fn,
                   void *arg)
{
	int64_t parts = grain > 0 ? (n + grain - 1) / grain : n;
	int64_t begin, end;

	if (n <= 0)
		return;
	if (parts > p->threads)
		parts = p->threads;
	if (parts <= 1) {
		fn(arg, 0, 0, n);
		return;
	}
	pthread_mutex_lock(&p->lock);
	p->fn = fn;
	p->arg = arg;
	p->n = n;
	p->parts = (unsigned)parts;
	p->pending = (unsigned)parts - 1;
	p->job++;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);

	part_range(p, 0, &begin, &end);
	fn(arg, 0, begin, end);

	pthread_mutex_lock(&p->lock);
	while (p->pending)
		pthread_cond_wait(&p->done, &p->lock);
	pthread_mutex_unlock(&p->lock);
}
