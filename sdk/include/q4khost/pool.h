/*
 * A persistent pool of worker threads (cpu_pool.c): the cpu backend's, and
 * compiled into kernel variants for "cpu" that want the same. Not
 * thread-safe: one caller at a time per pool.
 */
#ifndef Q4KH_CPU_POOL_H
#define Q4KH_CPU_POOL_H

#include <stdint.h>

#define CPU_MAX_THREADS 256

struct cpu_pool;

/* The online CPUs, clamped to 1 .. CPU_MAX_THREADS. */
unsigned cpu_threads_online(void);
/*
 * A "threads" setting: a decimal integer from 1 to CPU_MAX_THREADS, nothing
 * else; an empty value counts as unset (*out kept). 0 with *out set or
 * kept, or -1.
 */
int cpu_threads_parse(const char *s, unsigned *out);

/*
 * Work on items [begin, end) as part PART (0 .. threads-1); a part may index
 * per-thread scratch.
 */
typedef void (*cpu_task_fn)(void *arg, unsigned part, int64_t begin,
                            int64_t end);

/* Start THREADS - 1 workers (the caller is the first). 0 or -1 (errno). */
int cpu_pool_create(unsigned threads, struct cpu_pool **out);
void cpu_pool_destroy(struct cpu_pool *p);
/*
 * Split N items into contiguous parts of at least GRAIN items, at most one
 * per thread, run FN on each and return when all are done.
 */
void cpu_pool_run(struct cpu_pool *p, int64_t n, int64_t grain, cpu_task_fn fn,
                  void *arg);

#endif
