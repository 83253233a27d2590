/*
 * mul_mat: y[n, t] = sum_k w[k, n] x[k, t], accumulated in double, each
 * y[n, t] a dot product in cpu_lanes.h's order of sums: the same bits
 * whatever the thread count, the batch size T, the blocking or the
 * instruction set.
 *
 * The blocking, for each thread's range of output rows:
 *   - a block of ROWS weight rows is dequantized once into double;
 *   - the columns go in blocks of COLS, whose lane accumulators are kept in
 *     the thread's scratch while K is walked in slices of SLICE values;
 *   - within a slice, a register tile of NR rows x NC columns runs over
 *     the slice's K: NC activation columns of SLICE doubles stay in L1 for
 *     every tile of rows, the block's rows stream from L2.
 * NR x NC is 4 x 4 with AVX-512's 32 vector registers; AVX2's 16 hold
 * 3 x 3 in vectors of four lanes (cpu_lanes_tile's VW), the rest 2 x 2.
 */
/* The kernels below need -O3's vectoriser; the build's CFLAGS say -O2. */
#pragma GCC optimize("O3")

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "cpu_lanes.h"

#define ROWS 32    /* weight rows dequantized together */
#define COLS 128   /* activation columns whose accumulators are kept */
#define SLICE 512  /* values of K per pass over a block's columns */

typedef cpu_v8d v8d;

struct mm_block;

/* The same function for each tile size and vector width; the CPU picks one
 * (pick_slice). */
typedef void slice_fn(const struct mm_block *b, int64_t t0, int64_t nc, int64_t k0,
                      int64_t n);

struct mm_job {
	const struct q4kh_tensor *w, *x, *y;
	slice_fn *slice; /* pick_slice's, once a call */
	q4kh_device_ctx *dev;
	double *xd; /* {K, T} contiguous doubles */
	int64_t k, t;
};

/* One block's work: rows n0 .. n0+nr-1, in double in wd (row stride k). */
struct mm_block {
	const struct mm_job *j;
	const double *wd;
	v8d *acc; /* [nr][COLS] lane accumulators */
	int64_t n0, nr;
};

/*
 * Block B's columns t0 .. t0+nc-1 over K values [k0, k0 + n), in tiles of
 * NR x NC, the edges in tiles of NR x 1 and 1 x 1, in vectors of VW lanes.
 */
static inline __attribute__((always_inline)) void
slice(const struct mm_block *b, int64_t t0, int64_t nc, int64_t k0, int64_t n,
      const int NR, const int NC, const int VW)
{
	const int64_t k = b->j->k;
	int64_t c = 0;

	for (; c + NC <= nc; c += NC) {
		const double *x = b->j->xd + (t0 + c) * k + k0;
		int64_t r = 0;

		for (; r + NR <= b->nr; r += NR)
			cpu_lanes_tile(b->wd + r * k + k0, k, x, k, n, NR, NC,
			               b->acc + r * COLS + c, COLS, VW);
		for (; r < b->nr; r++)
			for (int cc = 0; cc < NC; cc++)
				cpu_lanes_tile(b->wd + r * k + k0, k, x + cc * k, k, n, 1, 1,
				               b->acc + r * COLS + c + cc, COLS, VW);
	}
	for (; c < nc; c++) {
		const double *x = b->j->xd + (t0 + c) * k + k0;
		int64_t r = 0;

		for (; r + NR <= b->nr; r += NR)
			cpu_lanes_tile(b->wd + r * k + k0, k, x, k, n, NR, 1, b->acc + r * COLS + c,
			               COLS, VW);
		for (; r < b->nr; r++)
			cpu_lanes_tile(b->wd + r * k + k0, k, x, k, n, 1, 1, b->acc + r * COLS + c,
			               COLS, VW);
	}
}


static void slice_2x2(const struct mm_block *b, int64_t t0, int64_t nc, int64_t k0,
                      int64_t n)
{
	slice(b, t0, nc, k0, n, 2, 2, 4);
}

#if CPU_LANES_TARGETS
CPU_TARGET_AVX2 static void slice_avx2(const struct mm_block *b, int64_t t0, int64_t nc,
                                       int64_t k0, int64_t n)
{
	slice(b, t0, nc, k0, n, 3, 3, 4);
}

CPU_TARGET_AVX512 static void slice_avx512(const struct mm_block *b, int64_t t0, int64_t nc,
                                           int64_t k0, int64_t n)
{
	slice(b, t0, nc, k0, n, 4, 4, 8);
}
#endif

static slice_fn *pick_slice(void)
{
	switch (cpu_lanes_isa()) {
#if CPU_LANES_TARGETS
	case 2: return slice_avx512;
	case 1: return slice_avx2;
#endif
	default: return slice_2x2;
	}
}

/* Block B times every column of x, into y. */
static void block_times_x(const struct mm_block *b, slice_fn *fn)
{
	const struct mm_job *j = b->j;
	const int64_t k = j->k, body = k - k % CPU_LANES;

	for (int64_t t0 = 0; t0 < j->t; t0 += COLS) {
		int64_t nc = j->t - t0 < COLS ? j->t - t0 : COLS;

		for (int64_t r = 0; r < b->nr; r++)
			memset(b->acc + r * COLS, 0, sizeof(v8d) * (size_t)nc);
		for (int64_t k0 = 0; k0 < body; k0 += SLICE)
			fn(b, t0, nc, k0, body - k0 < SLICE ? body - k0 : SLICE);
		for (int64_t c = 0; c < nc; c++) {
			const double *x = j->xd + (t0 + c) * k;
			float *yc = (float *)q4kh_cpu_at(j->y, t0 + c, 0, 0);

			for (int64_t r = 0; r < b->nr; r++) {
				v8d *a = b->acc + r * COLS + c;

				/* the tail, k mod 8 values, in lanes 0 .. */
				for (int64_t i = body; i < k; i++)
					(*a)[i - body] += b->wd[r * k + i] * x[i];
				yc[b->n0 + r] = (float)cpu_lanes_sum(a);
			}
		}
	}
}

CPU_VECTOR_CLONES double cpu_dot(const double *a, const double *b, int64_t n)
{
	const int64_t body = n - n % CPU_LANES;
	v8d acc = { 0 };

	cpu_lanes_tile(a, n, b, n, body, 1, 1, &acc, 1, 4);
	for (int64_t i = body; i < n; i++)
		acc[i - body] += a[i] * b[i];
	return cpu_lanes_sum(&acc);
}

/* Bytes of one thread's scratch for K: a block's rows in double, a row
 * dequantized to float, the block's accumulators. */
static uint64_t scratch_bytes(int64_t k)
{
	return sizeof(double) * (uint64_t)(ROWS * k) + sizeof(float) * (uint64_t)k +
	       sizeof(v8d) * ROWS * COLS + Q4KH_CPU_ALIGN;
}

static void mm_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct mm_job *j = arg;
	const int64_t k = j->k;
	double *wd = j->dev->scratch.part[part];
	float *wf = (float *)(wd + ROWS * k);
	uintptr_t a = (uintptr_t)(wf + k);
	struct mm_block b = { j, wd,
		              (v8d *)((a + Q4KH_CPU_ALIGN - 1) & ~(uintptr_t)(Q4KH_CPU_ALIGN - 1)),
		              0, 0 };

	for (b.n0 = begin; b.n0 < end; b.n0 += ROWS) {
		b.nr = end - b.n0 < ROWS ? end - b.n0 : ROWS;
		for (int64_t r = 0; r < b.nr; r++) {
			q4kh_dequant_row(j->w->type, q4kh_cpu_at(j->w, b.n0 + r, 0, 0), wf, k);
			for (int64_t i = 0; i < k; i++)
				wd[r * k + i] = wf[i];
		}
		block_times_x(&b, j->slice);
	}
}

/* Columns [begin, end) of x into double. */
static void x_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct mm_job *j = arg;

	(void)part;
	for (int64_t t = begin; t < end; t++) {
		const float *xs = (const float *)q4kh_cpu_at(j->x, t, 0, 0);

		for (int64_t i = 0; i < j->k; i++)
			j->xd[t * j->k + i] = xs[i];
	}
}

q4kh_status cpu_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                        const struct q4kh_tensor *x,
                        const struct q4kh_tensor *y)
{
	struct mm_job j = { w, x, y, pick_slice(), dev, NULL, 0, 0 };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_mul_mat(&c, w, x, y)))
		return st;
	j.k = w->ne[0];
	j.t = x->ne[1];
	if ((st = cpu_scratch_reserve(dev, scratch_bytes(j.k))))
		return st;
	j.xd = malloc(sizeof(double) * (size_t)j.k * (size_t)j.t);
	if (!j.xd)
		return cpu_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                "mul_mat: out of memory for %lld x %lld activations",
		                (long long)j.k, (long long)j.t);
	q4kh_pool_run(dev->pool, j.t, 1, x_task, &j);
	/* Parts of at least 8 rows: fewer would waste the dequantization. */
	q4kh_pool_run(dev->pool, w->ne[1], 8, mm_task, &j);
	free(j.xd);
	return Q4KH_OK;
}
