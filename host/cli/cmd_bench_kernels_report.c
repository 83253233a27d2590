/*
 * What bench-kernels shows (cmd_bench_kernels.h): the status line that
 * names the work being timed, the table on stdout, and with --json the
 * one object with every row.
 */
#include <math.h>
#include <stdio.h>

#include "cmd_bench_kernels.h"
#include "interrupt.h"
#include "progress.h"

void bench_kernels_status_ceiling(const struct bench *B)
{
	q4kh_progress("measuring the read ceiling: read_pass over 1 GiB, %ld+1 passes",
	              B->o->repeat);
}

void bench_kernels_status_row(const struct bench *B, const struct shape_run *s,
                              const struct result *res, int c)
{
	/* the counters first: a narrow terminal still shows them move */
	q4kh_progress("row %zu of %zu, column %d of %d: timing %s %s %s %lldx%lld, "
	              "kernel %s, %ld+1 passes",
	              B->row, B->total, c, (int)B->o->max_cols, q4kh_type_name(s->type),
	              s->sh->set, s->sh->role, (long long)s->sh->n, (long long)s->sh->k,
	              res->kernel, B->o->repeat);
}

void bench_kernels_print_header(const struct bench *B)
{
	const struct opts *o = B->o;

	/* The cpu backends have no driver: nothing to name. */
	printf("device %s, uuid %s, arch %s%s%s; timing: %s, %s\n", B->b.record.name,
	       B->b.record.uuid, B->b.record.arch, B->b.record.driver_version[0] ? ", driver " : "",
	       B->b.record.driver_version,
	       B->graphs ? "launches recorded in one graph" : "launches one by one",
	       B->timers ? "device events" : "host clock and synchronize");
	if (B->ceiling > 0)
		printf("read ceiling (read_pass over 1 GiB, median of %ld): %.0f GB/s\n\n",
		       o->repeat, B->ceiling * 1e-9);
	else
		printf("read ceiling: the backend has no read_pass (ABI 1.1)\n\n");
	printf("%-6s %-12s %-11s %-14s %-11s %8s %6s %6s | ", "type", "model", "role",
	       "N x K", "kernel", "b1 us", "GB/s", "%ceil");
	if (o->max_cols > 1) /* "2..1" would be an empty range */
		printf("batch 2..%ld, us | b%ld/b1 NMSE\n", o->max_cols, o->max_cols);
	else
		printf("no batches (--max-batch 1) | b1/b1 NMSE\n");
}

void bench_kernels_report(struct bench *B, const struct shape_run *s, const struct result *res)
{
	const int cols = (int)B->o->max_cols;
	const char *tn = q4kh_type_name(s->type);
	const double gbs = res->us[0] > 0 ? (double)s->bytes / res->us[0] * 1e-3 : 0;
	const double pct = B->ceiling > 0 ? 100.0 * gbs * 1e9 / B->ceiling : 0;
	json_t *us = json_array();

	q4kh_progress_clear();
	if (!res->stopped)
		B->done++; /* a row the signal cut short says so in its note */
	for (int c = 0; c < cols; c++)
		json_array_append_new(us, res->us[c] > 0 ? json_real(res->us[c]) : json_null());
	json_array_append_new(
		B->rows,
		json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:o, s:o, s:o, s:o, s:s?}", "type",
		          tn, "set", s->sh->set, "role", s->sh->role, "n", (json_int_t)s->sh->n,
		          "k", (json_int_t)s->sh->k, "weight_bytes", (json_int_t)s->bytes,
		          "kernel", res->kernel, "us", us, "batch1_gbps",
		          res->us[0] > 0 ? json_real(gbs) : json_null(), "batch1_pct_ceiling",
		          res->us[0] > 0 && B->ceiling > 0 ? json_real(pct) : json_null(), "nmse",
		          isfinite(res->nmse) ? json_real(res->nmse) : json_null(), "note",
		          res->note[0] ? res->note : NULL));
	if (B->o->json)
		return;
	printf("%-6s %-12s %-11s %7lldx%-6lld %-11s", tn, s->sh->set, s->sh->role,
	       (long long)s->sh->n, (long long)s->sh->k, res->kernel);
	if (res->note[0]) {
		printf(" %s\n", res->note);
		return;
	}
	if (B->ceiling > 0)
		printf(" %8.2f %6.0f %5.1f%% |", res->us[0], gbs, pct);
	else
		printf(" %8.2f %6.0f %6s |", res->us[0], gbs, "-");
	for (int c = 1; c < cols; c++)
		printf(" %7.2f", res->us[c]);
	printf(" | %4.2fx %8.1e\n", res->us[cols - 1] / res->us[0], res->nmse);
	fflush(stdout);
}

void bench_kernels_print_json(const struct bench *B)
{
	const struct opts *o = B->o;
	const int sig = q4kh_interrupted();
	json_t *root = json_pack(
		"{s:s, s:s, s:s, s:s, s:s, s:o, s:s, s:s, s:I, s:I, s:I, s:o, s:O}", "backend",
		o->backend, "device", B->b.record.name, "uuid", B->b.record.uuid, "arch",
		B->b.record.arch, "driver", B->b.record.driver_version, "read_ceiling_gbps",
		B->ceiling > 0 ? json_real(B->ceiling * 1e-9) : json_null(), "timing",
		B->graphs ? "graph" : "launches", "clock", B->timers ? "device" : "host", "min_mib",
		(json_int_t)o->min_mib, "rows_done", (json_int_t)B->done, "rows_planned",
		(json_int_t)B->total, "interrupted",
		sig ? json_string(q4kh_signal_name(sig)) : json_null(), "rows", B->rows);

	json_dumpf(root, stdout, JSON_INDENT(2));
	putchar('\n');
	fflush(stdout);
	json_decref(root);
}
