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
 *  - gemv of Q4_K and Q6_K (the copy prepare makes), 1 to 8 columns, 1, 2
 *    and 4 rows per warp, rows of 2 to 72
 *    pieces a lane's step, padded x and y, blocks that stream several row
 *    groups; in one launch (the activations in each block's shared
 *    memory) and, where they do not fit 48 KiB, through quantize_kernel
 *    and the scratch; padding of y left untouched;
 *  - gemv_multi (up to four matrices, Q4_K and Q6_K mixed, biases) and
 *    gemv_glu (both types, SiLU and the tanh GELU), against the same references, and bit for bit against
 *    gemv (plus the bias in float; then the cuda backend's act(g) * u);
 *  - a NaN activation makes its column's outputs NaN, and only its.
 * Built and run by scripts/cuda-emulate.sh; exit 0 when everything agrees.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "emu.h"
#include "emu_rows.h"
#include "q4khost/dequant.h"

#include "dp4a.h"
#include "q4khost/cuda_glu.cuh"

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

/* N random rows of K values of TYPE (Q4_K or Q6_K), their dequantisation by
 * the cpu reference, and what the kernels read: the rows (Q4_K) or their
 * copy by dp4a_q6k_copy (Q6_K). */
struct matrix {
	uint32_t type;
	int64_t n, k, stride, data_stride;
	uint8_t *w, *copy = nullptr;
	std::vector<float> deq;

	matrix(uint32_t t, int64_t rows, int64_t cols) : type(t), n(rows), k(cols)
	{
		stride = k / q4kh_type_block_elems(type) * (int64_t)q4kh_type_block_bytes(type);
		data_stride = stride;
		w = (uint8_t *)aligned((size_t)(stride * n));
		deq.resize((size_t)(n * k));
		random_rows(type, k, n, stride, w);
		for (int64_t r = 0; r < n; r++)
			q4kh_dequant_row(type, w + r * stride, deq.data() + r * k, k);
		if (type != Q4KH_TYPE_Q6_K)
			return;
		q4kh_prepared p = {};

		p.type = type;
		p.k = k;
		p.n = n;
		p.src = w;
		p.src_stride = stride;
		data_stride = dp4a_q6k_row_bytes(k);
		copy = (uint8_t *)aligned((size_t)(data_stride * n));
		if (dp4a_q6k_copy(&p, copy, 0) != cudaSuccess)
			abort();
	}
	~matrix()
	{
		free(w);
		free(copy);
	}
	matrix(const matrix &) = delete;
	matrix &operator=(const matrix &) = delete;

	q4kh_prepared prepared(int sms) const
	{
		q4kh_prepared p = {};

		p.multiprocessors = sms;
		p.type = type;
		p.k = k;
		p.n = n;
		p.data = copy ? copy : w;
		p.stride = data_stride;
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

static int gemv(uint32_t type, int64_t n, int64_t k, int64_t t, int sms, int warps,
                int64_t xpad)
{
	const matrix m(type, n, k);
	acts a(k, t, xpad);
	const int64_t ldy = n + 3;
	std::vector<float> y((size_t)(ldy * t), NAN);
	const q4kh_prepared w = m.prepared(sms);
	const q4kh_cv_io io = { a.x, a.ldx, y.data(), ldy, t, "gemv", 0 };
	void *scratch = aligned(dp4a_scratch_bytes(k, t));
	char what[160];
	cudaError_t e;

	a.quantise();
	e = dp4a_launch(&w, &io, scratch, warps, 0);
	free(scratch);
	snprintf(what, sizeof(what), "gemv %s n=%lld k=%lld t=%lld sms=%d warps=%d (%s)",
	         q4kh_type_name(type), (long long)n, (long long)k, (long long)t, sms, warps,
	         dp4a_one_launch(k, t) ? "one launch" : "scratch");
	if (e != cudaSuccess) {
		printf("%s: launch error %d: FAIL\n", what, (int)e);
		return 1;
	}
	return compare(what, y.data(), n, t, ldy, [&](int64_t r, int64_t c, double *s, double *sa) {
		reference(m, a, r, c, s, sa);
	});
}

/* y[r + c * ldy] of gemv(w, x), through dp4a_launch. */
static std::vector<float> gemv_of(const q4kh_prepared &w, const acts &a, int64_t ldy, int warps)
{
	std::vector<float> y((size_t)(ldy * a.t), NAN);
	const q4kh_cv_io io = { a.x, a.ldx, y.data(), ldy, a.t, "gemv", 0 };
	void *scratch = aligned(dp4a_scratch_bytes(a.k, a.t));

	if (dp4a_launch(&w, &io, scratch, warps, 0) != cudaSuccess)
		abort();
	free(scratch);
	return y;
}

/* Count the values of got that are not want's bits, print the first. */
static int same_bits(const char *what, const std::vector<float> &got,
                     const std::vector<float> &want)
{
	int bad = 0;

	for (size_t i = 0; i < got.size(); i++)
		if (memcmp(&got[i], &want[i], 4) && bad++ < 3)
			fprintf(stderr, "  %s: value %zu: %.9g, gemv's %.9g\n", what, i, got[i],
			        want[i]);
	return bad;
}

/* gemv_multi of N matrices of ROWS[i] rows, the last of type LAST, the
 * others Q4_K (a bias on the odd ones). */
static int multi(uint32_t n, const int64_t *rows, uint32_t last, int64_t k, int64_t t, int sms,
                 int warps)
{
	std::vector<std::unique_ptr<matrix> > m;
	std::vector<q4kh_prepared> p;
	const q4kh_prepared *wp[Q4KH_GEMV_MULTI_MAX];
	std::vector<std::vector<float> > y(n), bias(n);
	acts a(k, t, 4);
	q4kh_cv_multi_io io = {};
	char what[160];
	int bad = 0;

	a.quantise();
	for (uint32_t i = 0; i < n; i++) {
		m.emplace_back(new matrix(i + 1 == n ? last : Q4KH_TYPE_Q4_K, rows[i], k));
		p.push_back(m[i]->prepared(sms));
		y[i].assign((size_t)((rows[i] + 1) * t), NAN);
		for (int64_t r = 0; i % 2 && r < rows[i]; r++)
			bias[i].push_back((float)(urand() - 0.5));
	}
	io.x = a.x;
	io.ldx = a.ldx;
	io.cols = t;
	for (uint32_t i = 0; i < n; i++) {
		wp[i] = &p[i];
		io.y[i] = y[i].data();
		io.ldy[i] = rows[i] + 1;
		io.bias[i] = bias[i].empty() ? nullptr : bias[i].data();
	}
	snprintf(what, sizeof(what), "gemv_multi of %u, last %s, k=%lld t=%lld sms=%d warps=%d",
	         n, q4kh_type_name(last), (long long)k, (long long)t, sms, warps);
	if (dp4a_multi_launch(n, wp, &io, warps, 0) != cudaSuccess) {
		printf("%s: launch error: FAIL\n", what);
		return 1;
	}
	for (uint32_t i = 0; i < n; i++) {
		std::vector<float> g = gemv_of(p[i], a, rows[i] + 1, warps);
		const matrix &mi = *m[i];
		const std::vector<float> &bi = bias[i];

		for (int64_t c = 0; c < t; c++)
			for (int64_t r = 0; !bi.empty() && r < rows[i]; r++)
				g[(size_t)(r + c * (rows[i] + 1))] += bi[(size_t)r];
		bad += same_bits(what, y[i], g);
		bad += compare(what, y[i].data(), rows[i], t, rows[i] + 1,
		               [&](int64_t r, int64_t c, double *s, double *sa) {
			               reference(mi, a, r, c, s, sa);
			               *s += bi.empty() ? 0.0 : bi[(size_t)r];
			               *sa += bi.empty() ? 0.0 : fabs(bi[(size_t)r]);
		               });
	}
	return bad != 0;
}

/* gemv_glu of two N x K matrices of TYPE, SiLU or the tanh GELU. */
static int glu(uint32_t type, bool silu, int64_t n, int64_t k, int64_t t, int sms, int warps)
{
	const matrix g(type, n, k), u(type, n, k);
	const q4kh_prepared pg = g.prepared(sms), pu = u.prepared(sms);
	acts a(k, t, 0);
	const int64_t ldy = n + 2;
	std::vector<float> y((size_t)(ldy * t), NAN), want((size_t)(ldy * t), NAN);
	const q4kh_cv_io io = { a.x, a.ldx, y.data(), ldy, t, "gemv", 0 };
	char what[160];
	int bad;

	a.quantise();
	snprintf(what, sizeof(what), "gemv_glu %s %s n=%lld k=%lld t=%lld sms=%d warps=%d",
	         q4kh_type_name(type), silu ? "SiLU" : "GELU", (long long)n, (long long)k, (long long)t, sms, warps);
	if (dp4a_glu_launch(silu, &pg, &pu, &io, warps, 0) != cudaSuccess) {
		printf("%s: launch error: FAIL\n", what);
		return 1;
	}
	const std::vector<float> yg = gemv_of(pg, a, ldy, warps), yu = gemv_of(pu, a, ldy, warps);
	for (int64_t c = 0; c < t; c++)
		for (int64_t r = 0; r < n; r++)
			want[(size_t)(r + c * ldy)] = q4kh_cuda_glu_value(
				silu, yg[(size_t)(r + c * ldy)], yu[(size_t)(r + c * ldy)]);
	bad = same_bits(what, y, want);
	/* In double: act(g) u, the error of g and u through act'(g) <= 1.13
	 * and act(g), the float activation's within 1e-6 of the value. */
	return compare(what, y.data(), n, t, ldy, [&](int64_t r, int64_t c, double *s, double *sa) {
		double sg, sag, su, sau, act, dact;

		reference(g, a, r, c, &sg, &sag);
		reference(u, a, r, c, &su, &sau);
		if (silu) {
			const double e = 1 / (1 + exp(-sg));

			act = sg * e;
			dact = 1.1;
		} else {
			act = 0.5 * sg * (1 + tanh(0.7978845608028654 * (sg + 0.044715 * sg * sg * sg)));
			dact = 1.13;
		}
		*s = act * su;
		*sa = dact * sag * fabs(su) + fabs(act) * sau + 0.1 * fabs(*s);
	}) + (bad != 0);
}

/* A NaN in column 1 of 3 reaches every row of that column, no other. */
static int nan_column(int64_t k)
{
	const int64_t n = 21, t = 3;
	const matrix m(Q4KH_TYPE_Q4_K, n, k);
	acts a(k, t, 0);
	std::vector<float> y((size_t)(n * t), 0.0f);
	const q4kh_prepared w = m.prepared(2);
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
	const uint32_t q4k = Q4KH_TYPE_Q4_K, q6k = Q4KH_TYPE_Q6_K;
	int fails = 0;

	for (int t : { 1, 2, 3, 5, 8 }) {
		/* 2 pieces a lane's step; 1, 2 and 4 rows a warp */
		fails += gemv(q4k, 67, 2304, t, 8, 4, t % 2 ? 4 : 0);
		fails += gemv(q6k, 67, 2304, t, 8, 4, t % 2 ? 0 : 4);
		fails += gemv(q4k, 67, 2304, t, 2, 2, 0);
		fails += gemv(q6k, 301, 512, t, 2, 8, 8);
		/* Gemma 3 270M's rows: fewer pieces than lanes */
		fails += gemv(t % 2 ? q4k : q6k, 13, 256, t, 1, 1, 0);
	}
	/* a long row, one launch up to 4 columns, then the scratch */
	for (int t : { 4, 5 }) {
		fails += gemv(q4k, 9, 8192, t, 3, 4, 0);
		fails += gemv(q6k, 9, 8192, t, 3, 4, 0);
	}
	for (int t : { 1, 3, 8 }) {
		static const int64_t qkv[] = { 67, 23, 23 }, four[] = { 5, 130, 9, 64 };

		fails += multi(3, qkv, q6k, 2304, t, 2, 4);
		fails += multi(4, four, t == 3 ? q6k : q4k, 512, t, 8, 2);
		fails += multi(1, four + 1, q4k, 256, t, 1, 8);
		fails += glu(q4k, true, 45, 2304, t, 2, 4);
		fails += glu(q6k, t != 3, 130, 512, t, 1, 8);
		fails += glu(q4k, false, 7, 256, t, 8, 1);
	}
	fails += nan_column(2304);
	fails += nan_column(16384);
	printf("%s\n", fails ? "FAILED" : "all agree");
	return fails != 0;
}
