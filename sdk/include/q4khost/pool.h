/*
 * A persistent pool of worker threads for plugins that compute in host
 * memory, in the SDK's static library (libq4khost_sdk.a, pkg-config
 * q4khost-plugin; pool.c). The in-tree backends cpu and cpu-fast and the
 * kernel variant cpu-simd run their ops on it.
 *
 * A device context makes one pool at open and keeps it. A job is N items
 * (output rows, say) handed out in contiguous parts: the calling thread
 * and the workers claim parts in order, each a share of what is left
 * (large first, then ever smaller, so a thread the scheduler holds back
 * delays a small part, not a share), and the call returns when every part
 * is done. Which thread computes an item, and how the items are cut into
 * parts, vary from call to call: a task function that computes each item
 * alone gives the same bits at every thread count.
 *
 * Between jobs a worker spins for a while on the pool's shared word (no
 * system call: the ops of one forward step come thousands a second), then
 * sleeps on a condition variable, which the caller signals only when a
 * worker sleeps. The spell is set per pool (spin_us): 0 sleeps after a
 * few microseconds' pauses, as a pool that must leave the cores to others
 * between ops does.
 *
 * Threads: a pool is used by one caller at a time (the plugins' T1 rule,
 * docs/plugin-abi.md); different pools are independent. Needs -lpthread.
 */
#ifndef Q4KHOST_POOL_H
#define Q4KHOST_POOL_H

#include <stdint.h>

#include "q4khost/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most threads a pool takes, and a "threads" setting may ask for. */
#define Q4KH_MAX_THREADS 256

struct q4kh_pool;

/* The online CPUs (sysconf), clamped to 1 .. Q4KH_MAX_THREADS. Thread-safe. */
unsigned q4kh_threads_online(void);

/*
 * Parse a "threads" setting S (a NUL-terminated string, not NULL): a
 * decimal integer from 1 to Q4KH_MAX_THREADS, digits only
 * (q4kh_parse_uint, backend_base.h). Returns 0 with *OUT set, or 0 with
 * *OUT kept when S is empty (a key with no value counts as unset); -1
 * (with *OUT kept) for anything else, for the caller to name the key and
 * value in its error. Thread-safe.
 */
int q4kh_threads_parse(const char *s, unsigned *out);

/*
 * *OUT = a pool of THREADS (1 .. Q4KH_MAX_THREADS) threads: THREADS - 1
 * workers are started, the caller of q4kh_pool_run being thread 0. An
 * idle worker spins for up to SPIN_US microseconds after a job before it
 * sleeps (0: after one short round of pauses). Returns 0; or -1 with errno set (ENOMEM,
 * or pthread_create's error) and *OUT NULL, having started and joined
 * nothing that lives on. The caller owns the pool and frees it with
 * q4kh_pool_destroy.
 */
int q4kh_pool_create(unsigned threads, unsigned spin_us, struct q4kh_pool **out);

/* Stop and join the workers and free P (NULL: nothing). No q4kh_pool_run
 * may be running. */
void q4kh_pool_destroy(struct q4kh_pool *p);

/*
 * Run FN(ARG, thread, begin, end) over items [0, N) in contiguous parts
 * of at least GRAIN items (GRAIN <= 0: one; the last part may be
 * shorter), on the pool's threads and the caller's, and return when every
 * part is done. thread is below the pool's threads; a thread may run
 * several parts of one job, one at a time, so thread may index scratch of
 * its own (plugin.h, q4kh_task_fn). N <= 0 runs nothing; N <= GRAIN, or a
 * pool of one thread, runs [0, N) on the caller alone. Cannot fail. Never
 * call it from inside FN.
 */
void q4kh_pool_run(struct q4kh_pool *p, int64_t n, int64_t grain, q4kh_task_fn fn,
                   void *arg);

/*
 * Lend P to kernel variants (ABI 1.3, T5): in the host's record OUT (its
 * struct_size as the host set it), set threads, pool and parallel
 * (q4kh_pool_run's job, P passed as a void *) where struct_size covers
 * parallel; leave an older record as it is. A backend's native_device()
 * calls it after filling the 1.0 fields. Thread-safe for different OUT.
 */
void q4kh_pool_lend(struct q4kh_pool *p, struct q4kh_native_device *out);

#ifdef __cplusplus
}
#endif

#endif
