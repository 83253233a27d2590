/*
 * mul_mat: y[n, t] = sum_k w[k, n] x[k, t], accumulated in double.
 *
 * Each thread owns a range of output rows. It dequantizes a block of weight
 * rows once into double scratch and dots it against every activation
 * column (converted to double once per call). Every dot product uses
 * LANES independent accumulators, lane l summing the products at k = l
 * (mod LANES) in increasing k, combined in one fixed tree at the end; so
 * y[n, t] is the same bits whatever the thread count, the batch size T or
 * the blocking, and the lanes let the compiler vectorise without
 * reassociating (no -ffast-math).
 */
/* The kernels below need -O3's vectoriser; the build's CFLAGS say -O2. */
#pragma GCC optimize("O3")

#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define LANES 8
#define ROW_BLOCK 8 /* weight rows dequantized together */
#define COL_BLOCK 4 /* activation columns per micro-kernel */

struct mm_job {
	const struct q4kh_tensor *w, *y;
	q4kh_device_ctx *dev;
	const double *x; /* {K, T} contiguous doubles */
	int64_t k, t;
};

/* Four lanes of a dot product; GCC lowers it to whatever the target has. */
typedef double v4d __attribute__((vector_size(32)));

#define LOAD4(v, p) memcpy(&(v), (p), sizeof(v4d))

/* Lanes 0-3 in lo, 4-7 in hi, summed in one fixed tree. */
static inline double combine(const v4d *lo, const v4d *hi)
{
	return (((*lo)[0] + (*lo)[1]) + ((*lo)[2] + (*lo)[3])) +
	       (((*hi)[0] + (*hi)[1]) + ((*hi)[2] + (*hi)[3]));
}

/*
 * out[r * nc + c] = dot(w + r * k, x + c * k) for r < NR, c < NC. Inlined
 * with constant NR and NC so the accumulators live in registers.
 */
static inline __attribute__((always_inline)) void
dot_tile(const double *w, const double *x, int64_t k, int nr, int nc,
         double *out)
{
	v4d lo[2][COL_BLOCK] = { { { 0 } } }, hi[2][COL_BLOCK] = { { { 0 } } };
	int64_t body = k - k % LANES;

	for (int64_t i = 0; i < body; i += LANES) {
		for (int r = 0; r < nr; r++) {
			v4d w0, w1;

			LOAD4(w0, w + r * k + i);
			LOAD4(w1, w + r * k + i + 4);
			for (int c = 0; c < nc; c++) {
				v4d x0, x1;

				LOAD4(x0, x + c * k + i);
				LOAD4(x1, x + c * k + i + 4);
				lo[r][c] += w0 * x0;
				hi[r][c] += w1 * x1;
			}
		}
	}
	for (int64_t i = body; i < k; i++) {
		int l = (int)(i - body);

		for (int r = 0; r < nr; r++)
			for (int c = 0; c < nc; c++) {
				double p = w[r * k + i] * x[c * k + i];

				if (l < 4)
					lo[r][c][l] += p;
				else
					hi[r][c][l - 4] += p;
			}
	}
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			out[r * nc + c] = combine(&lo[r][c], &hi[r][c]);
}

CPU_VECTOR_CLONES double cpu_dot(const double *a, const double *b, int64_t n)
{
	double out;

	dot_tile(a, b, n, 1, 1, &out);
	return out;
}

/* Rows n0 .. n0+nr-1 (f32 in wf) times every column of x, into y. */
CPU_VECTOR_CLONES static void block_times_x(const struct mm_job *j,
                                            const float *wf, double *wd,
                                            int64_t n0, int64_t nr)
{
	const struct q4kh_tensor *y = j->y;
	int64_t k = j->k;
	double out[2 * COL_BLOCK];

	for (int64_t i = 0; i < nr * k; i++)
		wd[i] = wf[i];
	for (int64_t t = 0; t < j->t; t += COL_BLOCK) {
		int64_t nc = j->t - t < COL_BLOCK ? j->t - t : COL_BLOCK;

		for (int64_t r = 0; r < nr; r += 2) {
			int pair = nr - r >= 2;

			for (int64_t c = 0; c < nc;) {
				const double *xc = j->x + (t + c) * k;
				int cols = nc - c == COL_BLOCK ? COL_BLOCK : 1;

				/* Constant tile sizes, so each call is specialised. */
				if (pair && cols == COL_BLOCK)
					dot_tile(wd + r * k, xc, k, 2, COL_BLOCK, out);
				else if (cols == COL_BLOCK)
					dot_tile(wd + r * k, xc, k, 1, COL_BLOCK, out);
				else if (pair)
					dot_tile(wd + r * k, xc, k, 2, 1, out);
				else
					dot_tile(wd + r * k, xc, k, 1, 1, out);
				for (int cc = 0; cc < cols; cc++) {
					float *yc = (float *)cpu_row(y, t + c + cc, 0, 0);

					for (int rr = 0; rr < 1 + pair; rr++)
						yc[n0 + r + rr] = (float)out[rr * cols + cc];
				}
				c += cols;
			}
		}
	}
}

static void mm_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct mm_job *j = arg;
	int64_t k = j->k;
	double *wd = j->dev->scratch[part];
	float *wf = (float *)(wd + ROW_BLOCK * k);

	for (int64_t n0 = begin; n0 < end; n0 += ROW_BLOCK) {
		int64_t nr = end - n0 < ROW_BLOCK ? end - n0 : ROW_BLOCK;

		for (int64_t r = 0; r < nr; r++)
			cpu_dequant_row(j->w->type, cpu_row(j->w, n0 + r, 0, 0),
			                wf + r * k, k);
		block_times_x(j, wf, wd, n0, nr);
	}
}

q4kh_status cpu_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                        const struct q4kh_tensor *x,
                        const struct q4kh_tensor *y)
{
	struct mm_job j = { w, y, dev, NULL, 0, 0 };
	const struct q4kh_check c = cpu_contract(dev);
	double *xd;
	q4kh_status st;

	if ((st = q4kh_check_mul_mat(&c, w, x, y)))
		return st;
	j.k = w->ne[0];
	j.t = x->ne[1];
	st = cpu_scratch_reserve(dev, (uint64_t)j.k * ROW_BLOCK *
	                                      (sizeof(double) + sizeof(float)));
	if (st)
		return st;
	xd = malloc(sizeof(double) * (size_t)j.k * (size_t)j.t);
	if (!xd)
		return cpu_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                "mul_mat: out of memory for %lld x %lld activations",
		                (long long)j.k, (long long)j.t);
	for (int64_t t = 0; t < j.t; t++) {
		const float *xs = (const float *)cpu_row(x, t, 0, 0);

		for (int64_t i = 0; i < j.k; i++)
			xd[t * j.k + i] = xs[i];
	}
	j.x = xd;
	/* A part of fewer rows than a block would waste the dequantization. */
	cpu_pool_run(dev->pool, w->ne[1], ROW_BLOCK, mm_task, &j);
	free(xd);
	return Q4KH_OK;
}
