/*
 * A kernel profile of any CUDA program, for machines without Nsight
 * Systems: preloaded (LD_PRELOAD), it asks CUPTI's activity API for every
 * kernel the process runs, CUDA graph replays included, and at exit
 * writes one line per kernel name to stderr, or to $CUPTI_TRACE_OUT:
 * launches, total and mean GPU microseconds, share of the kernels' time,
 * sorted by total; then the kernels' total and the span from the first
 * kernel's start to the last one's end. scripts/gpu-profile.sh builds it
 * on the GPU machine and runs q4khost under it.
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
	uint64_t count, ns;
};

static struct entry table[MAX_NAMES];
static int n_names;
static uint64_t first_start = UINT64_MAX, last_end;

static void add(const char *name, uint64_t start, uint64_t end)
{
	int i;

	for (i = 0; i < n_names; i++)
		if (!strcmp(table[i].name, name))
			break;
	if (i == n_names) {
		if (n_names == MAX_NAMES)
			i = MAX_NAMES - 1; /* the rest share the last line */
		else
			table[n_names++].name = strdup(name);
	}
	table[i].count++;
	table[i].ns += end - start;
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
		}
	free(buf);
}

static int by_total(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;

	return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

__attribute__((constructor)) static void start(void)
{
	if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
	    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
		fprintf(stderr, "cupti-trace: CUPTI did not start; no profile\n");
}

__attribute__((destructor)) static void stop(void)
{
	const char *path = getenv("CUPTI_TRACE_OUT");
	FILE *f = path ? fopen(path, "w") : stderr;
	uint64_t total = 0;

	cuptiActivityFlushAll(1);
	if (!f)
		f = stderr;
	qsort(table, (size_t)n_names, sizeof(table[0]), by_total);
	for (int i = 0; i < n_names; i++)
		total += table[i].ns;
	fprintf(f, "%10s %12s %10s %6s  %s\n", "launches", "total_us", "mean_us",
	        "share", "kernel");
	for (int i = 0; i < n_names; i++)
		fprintf(f, "%10llu %12.1f %10.2f %5.1f%%  %.150s\n",
		        (unsigned long long)table[i].count, table[i].ns / 1e3,
		        table[i].ns / 1e3 / (double)table[i].count,
		        100.0 * (double)table[i].ns / (double)(total ? total : 1),
		        table[i].name);
	fprintf(f, "kernels: %.1f us in all; span from the first start to the last end: %.1f us\n",
	        total / 1e3, last_end > first_start ? (last_end - first_start) / 1e3 : 0.0);
	if (f != stderr)
		fclose(f);
}
