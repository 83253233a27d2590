/*
 * q4khost bench-kernels in three files: the command itself (options, the
 * random weights, the rows it checks and times: cmd_bench_kernels.c), its
 * timed passes, which a signal stops (cmd_bench_kernels_timing.c), and
 * what it shows: the status line, the table and the --json object
 * (cmd_bench_kernels_report.c). What they share is here; nothing outside
 * them uses it.
 */
#ifndef Q4KH_CMD_BENCH_KERNELS_H
#define Q4KH_CMD_BENCH_KERNELS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "error.h"
#include "kernel.h"

#define MAX_COLS 8
#define MAX_KERNELS 16
struct shape {
	const char *set, *role;
	int64_t n, k; /* rows (outputs) x inputs */
};

struct opts {
	const char *backend, *kernels, *sets, *type_list, *plugin_path, *config_file;
	long device, max_cols, min_mib, repeat;
	int json;
};

/* One timed kernel on one shape: microseconds per launch for 1..8 columns. */
struct result {
	const char *kernel; /* variant name, or "built-in" */
	double us[MAX_COLS];
	double nmse;
	int stopped;    /* SIGINT or SIGTERM cut its timing short */
	char note[512]; /* why it was not timed, or why it is wrong */
};

struct bench {
	const struct opts *o;
	struct q4kh_backend b;
	struct q4kh_kernel k[MAX_KERNELS];
	size_t n_k;
	int graphs, timers;
	double ceiling; /* bytes per second */
	json_t *rows;
	int failed;
	size_t done, total; /* rows reported whole, rows planned */
	size_t row;         /* the row being timed, 1 .. total */
};

/* What bench_kernels_time_passes returns when SIGINT or SIGTERM asked to stop. */
#define STOPPED 1

/* One shape of one type, on the device: its weight copies and the tensors
 * of every column count. */
struct shape_run {
	const struct shape *sh;
	uint32_t type;
	uint64_t bytes, stride; /* one copy's bytes, and copies' distance */
	size_t copies, launches;
	q4kh_buffer *w, *x, *y;
	struct q4kh_tensor tw, tx[MAX_COLS], ty[MAX_COLS];
	struct q4kh_kernel *k;        /* NULL: the built-in */
	q4kh_prepared **prep;         /* per copy, for a variant */
};

/* One launch of the work: copy I of the weights, C columns. */
typedef int (*launch_fn)(struct bench *B, void *ctx, size_t i, int c, struct q4kh_error *err);

/*
 * Median seconds of one pass of L launches (launch(i % copies)) over
 * REPEAT timed passes, after one untimed pass. STOPPED when SIGINT or
 * SIGTERM came during a pass (launches timed one by one stop at once).
 */
int bench_kernels_time_passes(struct bench *B, launch_fn launch, void *ctx, size_t copies,
                              size_t l, int c, double *median, struct q4kh_error *err);

/* The status line while the read ceiling is measured. */
void bench_kernels_status_ceiling(const struct bench *B);
/* The status line while column C of S's row for RES's kernel is timed. */
void bench_kernels_status_row(const struct bench *B, const struct shape_run *s,
                              const struct result *res, int c);
/* The device, the timing, the read ceiling and the table's head (not with
 * --json). */
void bench_kernels_print_header(const struct bench *B);
/* RES's row: counted, kept for --json, printed as a table line without. */
void bench_kernels_report(struct bench *B, const struct shape_run *s, const struct result *res);
/* The --json object: the rows reported, and the signal that stopped the run. */
void bench_kernels_print_json(const struct bench *B);

#endif
