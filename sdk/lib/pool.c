/*
 * The worker pool (q4khost/pool.h). A job is published as a ticket, one
 * 64-bit word that holds the job's generation and the next unclaimed
 * item; a thread claims a part by advancing the ticket with a
 * compare-and-swap that also checks the generation, so a thread that
 * wakes late for a finished job can never claim a part of the next. The
 * job's function and arguments sit in one of two slots chosen by the
 * generation's parity: the caller rewrites a slot only when the job before
 * it is done, and a late thread that reads a slot being rewritten fails
 * its compare-and-swap. Idle workers spin on the ticket for the pool's
 * spell (with spin_us 0, one round of SPIN_CHECK pauses), then sleep on a
 * condition variable, which the caller signals only when one sleeps.
 */
#include "buildconf.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_IMMINTRIN_H
#include <immintrin.h>
#endif

#include "q4khost/backend_base.h"
#include "q4khost/pool.h"

#define IDX_BITS 40
#define IDX_MASK ((UINT64_C(1) << IDX_BITS) - 1)
#define GEN_MASK ((UINT64_C(1) << (64 - IDX_BITS)) - 1)
/*
 * A claim takes the remaining items over this many times the threads (and
 * at least the job's grain): large parts first, then ever smaller ones, so
 * the threads finish a job together and a thread the scheduler holds back
 * delays the last small part only.
 */
#define CLAIM_SHARE 2
/*
 * Spins between two looks at the clock, each with a sched_yield: on a
 * loaded machine a spinning thread then lends its core to a thread of the
 * same process the scheduler holds back (the one it waits for, often), and
 * on an idle one the call returns at once.
 */
#define SPIN_CHECK 256

struct job {
	_Atomic(q4kh_task_fn) fn;
	_Atomic(void *) arg;
	_Atomic int64_t n, grain;
};

struct q4kh_pool {
	unsigned threads;
	uint64_t spin_ns;
	uint64_t gen; /* the caller's: generation of the last job */
	pthread_t *workers;
	unsigned started;
	struct job slot[2];
	pthread_mutex_t lock;
	pthread_cond_t wake;
	_Atomic unsigned sleepers;
	_Atomic int stop;
	/* Written by every thread: each on a line of its own. */
	_Alignas(64) _Atomic uint64_t ticket;
	_Alignas(64) _Atomic int64_t done; /* items finished in this job */
};

struct worker {
	struct q4kh_pool *pool;
	unsigned thread;
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
	/* "threads =" with no value: as if unset */
	return *s ? q4kh_parse_uint(s, 1, Q4KH_MAX_THREADS, out) : 0;
}

/* A spin's pause: the core's hint that this thread waits, where it has one. */
static void spin_pause(void)
{
#ifdef HAVE_IMMINTRIN_H
	_mm_pause();
#endif
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t gen_of(uint64_t ticket)
{
	return ticket >> IDX_BITS;
}

/* Claim and run parts of job GEN until none is left. */
static void work(struct q4kh_pool *p, uint64_t gen, unsigned thread)
{
	const struct job *j = &p->slot[gen & 1];
	uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);

	for (;;) {
		int64_t next = (int64_t)(t & IDX_MASK), n, end;

		if (gen_of(t) != gen)
			return;
		n = atomic_load_explicit(&j->n, memory_order_relaxed);
		if (next >= n)
			return;
		end = (n - next) / ((int64_t)p->threads * CLAIM_SHARE);
		if (end < atomic_load_explicit(&j->grain, memory_order_relaxed))
			end = atomic_load_explicit(&j->grain, memory_order_relaxed);
		end = next + end < n ? next + end : n;
		if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t,
		                                           (t & ~IDX_MASK) | (uint64_t)end,
		                                           memory_order_acquire,
		                                           memory_order_acquire))
			continue;
		atomic_load_explicit(&j->fn, memory_order_relaxed)(
			atomic_load_explicit(&j->arg, memory_order_relaxed), thread, next, end);
		atomic_fetch_add_explicit(&p->done, end - next, memory_order_release);
		t = atomic_load_explicit(&p->ticket, memory_order_acquire);
	}
}

/* The generation of the next job after SEEN; spins first, then sleeps. */
static uint64_t wait_job(struct q4kh_pool *p, uint64_t seen)
{
	uint64_t start = now_ns(), g;

	for (unsigned i = 1;; i++) {
		g = gen_of(atomic_load_explicit(&p->ticket, memory_order_acquire));
		if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
			return g;
		spin_pause();
		if (i % SPIN_CHECK == 0) {
			if (now_ns() - start > p->spin_ns)
				break;
			sched_yield();
		}
	}
	pthread_mutex_lock(&p->lock);
	/* seq_cst against the caller's publish-then-count (q4kh_pool_run). */
	atomic_fetch_add(&p->sleepers, 1);
	while ((g = gen_of(atomic_load(&p->ticket))) == seen && !atomic_load(&p->stop))
		pthread_cond_wait(&p->wake, &p->lock);
	atomic_fetch_sub(&p->sleepers, 1);
	pthread_mutex_unlock(&p->lock);
	return g;
}

static void *worker_main(void *arg)
{
	struct worker w = *(struct worker *)arg;
	uint64_t seen = 0;

	free(arg);
	for (;;) {
		seen = wait_job(w.pool, seen);
		if (atomic_load(&w.pool->stop))
			return NULL;
		work(w.pool, seen, w.thread);
	}
}

static int start_worker(struct q4kh_pool *p, unsigned thread)
{
	struct worker *w = malloc(sizeof(*w));
	int rc;

	if (!w)
		return ENOMEM;
	*w = (struct worker){ p, thread };
	rc = pthread_create(&p->workers[thread - 1], NULL, worker_main, w);
	if (rc)
		free(w);
	return rc;
}

int q4kh_pool_create(unsigned threads, unsigned spin_us, struct q4kh_pool **out)
{
	struct q4kh_pool *p = aligned_alloc(64, sizeof(*p));
	int rc = 0;

	*out = NULL;
	if (!p)
		return -1; /* errno is ENOMEM */
	*p = (struct q4kh_pool){ .threads = threads, .spin_ns = (uint64_t)spin_us * 1000 };
	atomic_init(&p->ticket, IDX_MASK); /* generation 0, nothing to claim */
	p->workers = calloc(threads, sizeof(*p->workers));
	if (!p->workers) {
		free(p);
		errno = ENOMEM;
		return -1;
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
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
	atomic_store(&p->stop, 1);
	pthread_mutex_lock(&p->lock);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->started; i++)
		pthread_join(p->workers[i], NULL);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p->workers);
	free(p);
}

void q4kh_pool_run(struct q4kh_pool *p, int64_t n, int64_t grain, q4kh_task_fn fn,
                   void *arg)
{
	struct job *j;

	if (n <= 0)
		return;
	if (grain < 1)
		grain = 1;
	if (p->threads == 1 || grain >= n) {
		fn(arg, 0, 0, n);
		return;
	}
	p->gen = (p->gen + 1) & GEN_MASK;
	j = &p->slot[p->gen & 1];
	atomic_store_explicit(&j->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&j->arg, arg, memory_order_relaxed);
	atomic_store_explicit(&j->n, n, memory_order_relaxed);
	atomic_store_explicit(&j->grain, grain, memory_order_relaxed);
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	/* Publish (seq_cst), then count sleepers: a worker counts itself
	 * before it checks the ticket, so one of the two sees the other. */
	atomic_store(&p->ticket, p->gen << IDX_BITS);
	if (atomic_load(&p->sleepers)) {
		pthread_mutex_lock(&p->lock);
		pthread_cond_broadcast(&p->wake);
		pthread_mutex_unlock(&p->lock);
	}
	work(p, p->gen, 0);
	for (unsigned i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < n; i++) {
		spin_pause();
		if (i % SPIN_CHECK == 0)
			sched_yield();
	}
}

/* plugin.h's parallel(): the pool as a void *. */
static void parallel(void *pool, int64_t n, int64_t grain, q4kh_task_fn fn, void *arg)
{
	q4kh_pool_run(pool, n, grain, fn, arg);
}

void q4kh_pool_lend(struct q4kh_pool *p, struct q4kh_native_device *out)
{
	if (out->struct_size <
	    offsetof(struct q4kh_native_device, parallel) + sizeof(out->parallel))
		return;
	out->threads = p->threads;
	out->pool = p;
	out->parallel = parallel;
}
