/*
 * A kernel profile of any CUDA program, for machines without Nsight
 * Systems: preloaded (LD_PRELOAD), it asks CUPTI's activity API for every
 * kernel the process runs, CUDA graph replays included, and at exit
 * writes one line per kernel name to stderr, or to $CUPTI_TRACE_OUT:
 * launches, total and mean GPU microseconds, share of the kernels' time,
 * sorted by total; then the kernels' total and the span from the first
 * kernel's start to the last one's end. Kernels that overlap (programmatic
 * dependent launches) count their whole time in total_us, so each line
 * also gives advance_us: over the kernels in the order they end, the time
 * by which each moved the last end forward, its part of the span; the
 * idle time between a kernel's start and the end before it is counted
 * apart as gaps. With CUPTI_TRACE_API=1 it also times the host's calls
 * into the CUDA runtime and driver (module loading, allocations, cuBLAS's
 * own calls into them), one line per function with its calls and total
 * wall microseconds, to see where a first prompt's host time goes.
 * scripts/gpu-profile.sh builds it on the GPU machine and runs q4khost
 * under it.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)
#define MAX_NAMES 512

struct entry {
	char *name;
	uint64_t count, ns, advance;
};

/* One kernel's run, kept for the advance computed at exit. */
struct run {
	uint64_t start, end;
	int name;
};

static struct entry table[MAX_NAMES];
static int n_names;
static struct entry api[MAX_NAMES]; /* host calls, CUPTI_TRACE_API=1 */
static int n_api;
static uint64_t first_start = UINT64_MAX, last_end;
static struct run *runs;
static size_t n_runs, cap_runs;

/* NAME's line of T (*N lines in use; past MAX_NAMES the rest share the
 * last line), counted once more with NS nanoseconds; its index. */
static int count(struct entry *t, int *n, const char *name, uint64_t ns)
{
	int i;

	for (i = 0; i < *n; i++)
		if (!strcmp(t[i].name, name))
			break;
	if (i == *n) {
		if (*n == MAX_NAMES)
			i = MAX_NAMES - 1;
		else
			t[(*n)++].name = strdup(name);
	}
	t[i].count++;
	t[i].ns += ns;
	return i;
}

static void add(const char *name, uint64_t start, uint64_t end)
{
	const int i = count(table, &n_names, name, end - start);

	if (n_runs == cap_runs) {
		size_t cap = cap_runs ? 2 * cap_runs : 4096;
		struct run *r = realloc(runs, cap * sizeof(*r));

		if (!r)
			return; /* the totals stay right; advance misses this run */
		runs = r;
		cap_runs = cap;
	}
	runs[n_runs++] = (struct run){ start, end, i };
	if (start < first_start)
		first_start = start;
	if (end > last_end)
		last_end = end;
}

static void CUPTIAPI requested(uint8_t **buf, size_t *size, size_t *max)
{
	*buf = aligned_alloc(8, BUF_BYTES);
	*size = BUF_BYTES;
	*max = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buf,
                               size_t size, size_t valid)
{
	CUpti_Activity *rec = NULL;

	(void)ctx;
	(void)stream;
	(void)size;
	while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS)
		if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
		    rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
			const CUpti_ActivityKernel4 *k = (const CUpti_ActivityKernel4 *)rec;

			add(k->name ? k->name : "?", k->start, k->end);
		} else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ||
		           rec->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
			const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
			const char *name = NULL;

			cuptiGetCallbackName(rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME
			                             ? CUPTI_CB_DOMAIN_RUNTIME_API
			                             : CUPTI_CB_DOMAIN_DRIVER_API,
			                     a->cbid, &name);
			count(api, &n_api, name ? name : "?", a->end - a->start);
		}
	free(buf);
}

static int by_total(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;

	return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

static int by_end(const void *a, const void *b)
{
	const struct run *x = a, *y = b;

	return x->end < y->end ? -1 : x->end > y->end;
}

/* Each name's advance (see the top of this file); returns the gaps. */
static uint64_t advances(void)
{
	uint64_t prev = 0, gaps = 0;

	qsort(runs, n_runs, sizeof(*runs), by_end);
	for (size_t i = 0; i < n_runs; i++) {
		uint64_t from = runs[i].start > prev ? runs[i].start : prev;

		if (prev && runs[i].start > prev)
			gaps += runs[i].start - prev;
		if (runs[i].end > from)
			table[runs[i].name].advance += runs[i].end - from;
		if (runs[i].end > prev)
			prev = runs[i].end;
	}
	return gaps;
}

__attribute__((constructor)) static void start(void)
{
	if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
	    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
		fprintf(stderr, "cupti-trace: CUPTI did not start; no profile\n");
	if (getenv("CUPTI_TRACE_API") && !strcmp(getenv("CUPTI_TRACE_API"), "1") &&
	    (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
	     cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS))
		fprintf(stderr, "cupti-trace: no host-call activity from CUPTI\n");
}

__attribute__((destructor)) static void stop(void)
{
	const char *path = getenv("CUPTI_TRACE_OUT");
	FILE *f = path ? fopen(path, "w") : stderr;
	uint64_t total = 0, gaps;

	cuptiActivityFlushAll(1);
	if (!f)
		f = stderr;
	gaps = advances();
	qsort(table, (size_t)n_names, sizeof(table[0]), by_total);
	for (int i = 0; i < n_names; i++)
		total += table[i].ns;
	fprintf(f, "%10s %12s %10s %6s %12s  %s\n", "launches", "total_us", "mean_us",
	        "share", "advance_us", "kernel");
	for (int i = 0; i < n_names; i++)
		fprintf(f, "%10llu %12.1f %10.2f %5.1f%% %12.1f  %.150s\n",
		        (unsigned long long)table[i].count, table[i].ns / 1e3,
		        table[i].ns / 1e3 / (double)table[i].count,
		        100.0 * (double)table[i].ns / (double)(total ? total : 1),
		        table[i].advance / 1e3, table[i].name);
	fprintf(f, "kernels: %.1f us in all; span from the first start to the last end: "
	        "%.1f us, of which gaps between kernels %.1f us\n",
	        total / 1e3, last_end > first_start ? (last_end - first_start) / 1e3 : 0.0,
	        gaps / 1e3);
	if (n_api) {
		qsort(api, (size_t)n_api, sizeof(api[0]), by_total);
		fprintf(f, "%10s %12s %10s  %s\n", "calls", "host_us", "mean_us", "runtime or driver call");
		for (int i = 0; i < n_api && i < 25; i++)
			fprintf(f, "%10llu %12.1f %10.2f  %s\n", (unsigned long long)api[i].count,
			        api[i].ns / 1e3, api[i].ns / 1e3 / (double)api[i].count, api[i].name);
	}
	if (f != stderr)
		fclose(f);
}
