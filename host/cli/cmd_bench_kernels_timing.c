/*
 * bench-kernels' timed passes (cmd_bench_kernels.h): launches recorded in
 * one graph where the backend can, timed by device events or by the host
 * clock around a synchronize, and stopped when SIGINT or SIGTERM comes.
 */
#include <stdlib.h>
#include <time.h>

#include "cmd_bench_kernels.h"
#include "interrupt.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int bench_kernels_time_passes(struct bench *B, launch_fn launch, void *ctx, size_t copies,
                              size_t l, int c, double *median, struct q4kh_error *err)
{
	const struct q4kh_backend_v1 *v = B->b.v;
	q4kh_graph *g = NULL;
	double t[1000];
	long r;
	int rc = -1;

	if (B->graphs) {
		if (q4kh_backend_check(&B->b, v->graph_begin(B->b.dev), "graph_begin", err))
			return -1;
		for (size_t i = 0; i < l; i++)
			if (launch(B, ctx, i % copies, c, err)) {
				v->graph_end(B->b.dev, &g);
				v->graph_free(B->b.dev, g);
				return -1;
			}
		if (q4kh_backend_check(&B->b, v->graph_end(B->b.dev, &g), "graph_end", err))
			return -1;
	}
	for (r = -1; r < B->o->repeat; r++) {
		double t0 = now(), s = 0;

		if (B->timers &&
		    q4kh_backend_check(&B->b, v->timer_start(B->b.dev), "timer_start", err))
			goto out;
		if (g) {
			if (q4kh_backend_check(&B->b, v->graph_launch(B->b.dev, g), "graph_launch",
			                       err))
				goto out;
		} else {
			for (size_t i = 0; i < l && !q4kh_interrupted(); i++)
				if (launch(B, ctx, i % copies, c, err))
					goto out;
		}
		if (B->timers) {
			if (q4kh_backend_check(&B->b, v->timer_stop(B->b.dev, &s), "timer_stop", err))
				goto out;
		} else {
			if (q4kh_backend_check(&B->b, v->synchronize(B->b.dev), "synchronize", err))
				goto out;
			s = now() - t0;
		}
		if (r >= 0)
			t[r] = s;
		if (q4kh_interrupted()) { /* this pass may be cut short: no median */
			rc = STOPPED;
			goto out;
		}
	}
	qsort(t, (size_t)B->o->repeat, sizeof(t[0]), cmp_double);
	*median = t[B->o->repeat / 2];
	rc = 0;
out:
	if (g)
		v->graph_free(B->b.dev, g);
	return rc;
}
