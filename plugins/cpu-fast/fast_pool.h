/*
 * cpu-fast's worker pool (fast_pool.c): threads that spin on a shared
 * ticket for a while after each job and only then sleep, so the jobs of
 * one forward step (one per op or matrix, thousands a second) are handed
 * out and collected through memory, without a system call. It is the
 * pool the backend lends to kernel variants (plugin.h, struct
 * q4kh_native_device: parallel). One caller at a time per pool.
 */
#ifndef Q4KH_FAST_POOL_H
#define Q4KH_FAST_POOL_H

#include <stdint.h>

#include "q4khost/plugin.h"

struct fast_pool;

/*
 * Start THREADS - 1 workers (the caller is thread 0), each spinning for
 * up to SPIN_US microseconds after a job before it sleeps. 0, or -1 with
 * errno.
 */
int fast_pool_create(unsigned threads, unsigned spin_us, struct fast_pool **out);
void fast_pool_destroy(struct fast_pool *p);

/*
 * fn(arg, thread, begin, end) over items [0, n): parts of at least GRAIN
 * items, each a share of what is left (large first, then smaller, so a
 * thread the scheduler holds back delays a small part, not a share),
 * claimed in order by whichever thread is free, the caller included.
 * Returns when every part is done; with at most GRAIN items, runs them on
 * the caller alone. Matches plugin.h's parallel() (POOL is a struct
 * fast_pool).
 */
void fast_pool_run(void *pool, int64_t n, int64_t grain, q4kh_task_fn fn,
                   void *arg);

#endif
