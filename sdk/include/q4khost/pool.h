/*
 * A persistent pool of worker threads for plugins that compute in host
 * memory, in the SDK's static library (libq4khost_sdk.a, pkg-config
 * q4khost-plugin; pool.c). The in-tree cpu backend and cpu-simd run their
 * ops on it. A device context makes one pool at init and keeps it; each op
 * splits its items (output rows, say) into contiguous parts, one per
 * thread, and the calling thread runs part 0. Which thread computes an
 * item never changes how it is computed, so a plugin whose task function
 * computes each item alone gives the same bits at every thread count.
 *
 * Threads: a pool is used by one caller at a time (the plugins' T1 rule,
 * docs/plugin-abi.md); different pools are independent. Needs -lpthread.
 */
#ifndef Q4KHOST_POOL_H
#define Q4KHOST_POOL_H

#include <stdint.h>

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
 * decimal integer from 1 to Q4KH_MAX_THREADS, digits only. Returns 0 with
 * *OUT set, or 0 with *OUT kept when S is empty (a key with no value
 * counts as unset); -1 (with *OUT kept) for anything else, for the caller
 * to name the key and value in its error. Thread-safe.
 */
int q4kh_threads_parse(const char *s, unsigned *out);

/*
 * Work on items [BEGIN, END) as part PART (0 .. parts - 1, parts <= the
 * pool's threads); PART may index per-thread scratch. Called on the
 * pool's threads concurrently, each part once, with ARG as given to
 * q4kh_pool_run.
 */
typedef void (*q4kh_task_fn)(void *arg, unsigned part, int64_t begin,
                             int64_t end);

/*
 * *OUT = a pool of THREADS (1 .. Q4KH_MAX_THREADS) threads: THREADS - 1
 * workers are started, the caller of q4kh_pool_run being the first.
 * Returns 0; or -1 with errno set (ENOMEM, or pthread_create's error) and
 * *OUT NULL, having started and joined nothing that lives on. The caller
 * owns the pool and frees it with q4kh_pool_destroy.
 */
int q4kh_pool_create(unsigned threads, struct q4kh_pool **out);

/* Stop and join the workers and free P (NULL: nothing). No q4kh_pool_run
 * may be running. */
void q4kh_pool_destroy(struct q4kh_pool *p);

/*
 * Split N items into contiguous parts of at least GRAIN items (GRAIN <= 0:
 * one item), at most one per thread, run FN on each and return when all
 * are done. Part p takes items [N p / parts, N (p + 1) / parts). N <= 0
 * runs nothing; one part runs on the calling thread alone. Cannot fail.
 */
void q4kh_pool_run(struct q4kh_pool *p, int64_t n, int64_t grain, q4kh_task_fn fn,
                   void *arg);

#ifdef __cplusplus
}
#endif

#endif
