/*
 * cuda-dp4a's kernels (plugins/cuda-dp4a) run on a host, with no GPU, as
 * tests/emu/emu.h emulates a launch (threads as fibers, warp shuffles,
 * __syncthreads, dynamic shared memory filled with 0xff). Each product is
 * checked against the cpu reference's dequantisation of the weights
 * (sdk/lib/dequant.c) times the activations rounded to int8 as the
 * variant promises (per 32 values d = max |x| / 127, q = round(x / d),
 * computed here on their own), summed in double: the kernels compute
 * that exactly up to fp32 rounding, so |error| / sum |w x| stays below
 * 1e-5 (the int8 rounding itself is tests/cuda_variant_rig.h's to bound,
 * on a GPU). Covered:
 *  - gemv, 1 to 8 columns, 1, 2 and 4 rows per warp, rows of 2 to 72
 *    pieces a lane's step, padded x and y, blocks that stream several row
 *    groups; in one launch (the activations in each block's shared
 *    memory) and, where they do not fit 48 KiB, through quantize_kernel
 *    and the scratch; padding of y left untouched;
 *  - a NaN activation makes its column's outputs NaN, and only its.
 * Built and run by scripts/cuda-emulate.sh; exit 0 when everything agrees.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu.h"
#include "emu_rows.h"
#include "q4khost/dequant.h"

#include "dp4a_kernels.emu.cu"

static void *aligned(size_t bytes)
{
	void *p = nullptr;

	if (posix_memalign(&p, 16, bytes ? bytes : 16))
		abort();
	return p;
}

/* Column x (K values) as the variant's int8 activations promise it. */
static std::vector<double> int8_column(const float *x, int64_t k)
{
	std::vector<double> v((size_t)k);

	for (int64_t b = 0; b < k; b += 32) {
		float amax = 0.0f, d;

		for (int i = 0; i < 32; i++)
			amax = std::max(amax, std::fabs(x[b + i]));
		d = amax / 127.0f;
		for (int i = 0; i < 32; i++)
			v[(size_t)(b + i)] = amax > 0.0f ? (double)d * std::nearbyint(x[b + i] / d) : 0.0;
	}
	return v;
}

/* N random Q4_K rows of K values (device rows, 16-byte aligned) and their
 * dequantisation by the cpu reference. */
struct matrix {
	int64_t n, k, stride;
	uint8_t *w;
	std::vector<float> deq;

	matrix(uint32_t type, int64_t rows, int64_t cols) : n(rows), k(cols)
	{
		stride = k / q4kh_type_block_elems(type) * (int64_t)q4kh_type_block_bytes(type);
		w = (uint8_t *)aligned((size_t)(stride * n));
		deq.resize((size_t)(n * k));
		random_rows(type, k, n, stride, w);
		for (int64_t r = 0; r < n; r++)
			q4kh_dequant_row(type, w + r * stride, deq.data() + r * k, k);
	}
	~matrix() { free(w); }
	matrix(const matrix &) = delete;
	matrix &operator=(const matrix &) = delete;

	q4kh_prepared prepared(uint32_t type, int sms) const
	{
		q4kh_prepared p = {};

		p.multiprocessors = sms;
		p.type = type;
		p.k = k;
		p.n = n;
		p.data = w;
		p.stride = stride;
		return p;
	}
};

/* Activations: T columns of K random values in [-1, 1), LDX floats apart. */
struct acts {
	int64_t k, t, ldx;
	float *x;
	std::vector<std::vector<double> > q; /* int8_column of each */

	acts(int64_t k_, int64_t t_, int64_t pad) : k(k_), t(t_), ldx(k_ + pad)
	{
		const size_t n = (size_t)(ldx * (t - 1) + k);

		x = (float *)aligned(n * 4);
		for (size_t i = 0; i < n; i++)
			x[i] = (float)(urand() * 2 - 1);
	}
	~acts() { free(x); }
	acts(const acts &) = delete;
	acts &operator=(const acts &) = delete;

	void quantise()
	{
		q.clear();
		for (int64_t c = 0; c < t; c++)
			q.push_back(int8_column(x + c * ldx, k));
	}
};

/* Row r of m times column c of a: the sum and the sum of magnitudes. */
static void reference(const matrix &m, const acts &a, int64_t r, int64_t c, double *s,
                      double *sa)
{
	*s = *sa = 0;
	for (int64_t i = 0; i < m.k; i++) {
		const double p = (double)m.deq[(size_t)(r * m.k + i)] * a.q[(size_t)c][(size_t)i];

		*s += p;
		*sa += fabs(p);
	}
}

/* Compare y[r + c * ldy] (r < n, c < t) with want(r, c, &s, &sa) and check
 * the padding rows n .. ldy - 1 are still NaN; print one line. */
template <class W>
static int compare(const char *what, const float *y, int64_t n, int64_t t, int64_t ldy,
                   const W &want)
{
	double worst = 0;
	int bad = 0;

	for (int64_t c = 0; c < t; c++) {
		for (int64_t r = 0; r < n; r++) {
			double s, sa;
			const double got = y[r + c * ldy];

			want(r, c, &s, &sa);
			const double e = fabs(got - s) / (sa > 0 ? sa : 1);

			if (!(e < 1e-5) && bad++ < 5)
				fprintf(stderr, "  %s: row %lld column %lld: %.9g, want %.9g\n", what,
				        (long long)r, (long long)c, got, s);
			if (!(e <= worst))
				worst = e;
		}
		for (int64_t r = n; r < ldy; r++)
			if (!std::isnan(y[r + c * ldy]) && bad++ < 5)
				fprintf(stderr, "  %s: padding row %lld of column %lld written\n", what,
				        (long long)r, (long long)c);
	}
	printf("%s: worst %.2g: %s\n", what, worst, bad ? "FAIL" : "ok");
	return bad != 0;
}

/* --- gemv ------------------------------------------------------------------------ */

static int gemv(int64_t n, int64_t k, int64_t t, int sms, int warps, int64_t xpad)
{
	const matrix m(Q4KH_TYPE_Q4_K, n, k);
	acts a(k, t, xpad);
	const int64_t ldy = n + 3;
	std::vector<float> y((size_t)(ldy * t), NAN);
	const q4kh_prepared w = m.prepared(Q4KH_TYPE_Q4_K, sms);
	const q4kh_cv_io io = { a.x, a.ldx, y.data(), ldy, t, "gemv", 0 };
	void *scratch = aligned(dp4a_scratch_bytes(k, t));
	char what[160];
	cudaError_t e;

	a.quantise();
	e = dp4a_launch(&w, &io, scratch, warps, 0);
	free(scratch);
	snprintf(what, sizeof(what), "gemv n=%lld k=%lld t=%lld sms=%d warps=%d (%s)",
	         (long long)n, (long long)k, (long long)t, sms, warps,
	         dp4a_one_launch(k, t) ? "one launch" : "scratch");
	if (e != cudaSuccess) {
		printf("%s: launch error %d: FAIL\n", what, (int)e);
		return 1;
	}
	return compare(what, y.data(), n, t, ldy, [&](int64_t r, int64_t c, double *s, double *sa) {
		reference(m, a, r, c, s, sa);
	});
}

/* A NaN in column 1 of 3 reaches every row of that column, no other. */
static int nan_column(int64_t k)
{
	const int64_t n = 21, t = 3;
	const matrix m(Q4KH_TYPE_Q4_K, n, k);
	acts a(k, t, 0);
	std::vector<float> y((size_t)(n * t), 0.0f);
	const q4kh_prepared w = m.prepared(Q4KH_TYPE_Q4_K, 2);
	const q4kh_cv_io io = { a.x, a.ldx, y.data(), n, t, "gemv", 0 };
	void *scratch = aligned(dp4a_scratch_bytes(k, t));
	int bad = 0;

	a.x[a.ldx + k / 2 + 5] = NAN;
	bad += dp4a_launch(&w, &io, scratch, 4, 0) != cudaSuccess;
	free(scratch);
	for (int64_t c = 0; c < t; c++)
		for (int64_t r = 0; r < n; r++)
			bad += std::isnan(y[(size_t)(r + c * n)]) != (c == 1);
	printf("NaN activation k=%lld (%s): %s\n", (long long)k,
	       dp4a_one_launch(k, t) ? "one launch" : "scratch", bad ? "FAIL" : "ok");
	return bad != 0;
}

int main(void)
{
	int fails = 0;

	for (int t = 1; t <= 8; t++) {
		/* 2 pieces a lane's step; 1, 2 and 4 rows a warp */
		fails += gemv(67, 2304, t, 8, 4, t % 2 ? 4 : 0);
		fails += gemv(67, 2304, t, 2, 2, 0);
		fails += gemv(301, 512, t, 2, 8, 8);
		/* Gemma 3 270M's rows: fewer pieces than lanes */
		fails += gemv(13, 256, t, 1, 1, 0);
	}
	/* a long row, one launch up to 4 columns, then the scratch */
	for (int t : { 1, 4, 5, 8 })
		fails += gemv(9, 8192, t, 3, 4, 0);
	fails += nan_column(2304);
	fails += nan_column(16384);
	printf("%s\n", fails ? "FAILED" : "all agree");
	return fails != 0;
}
