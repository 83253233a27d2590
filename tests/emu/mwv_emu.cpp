/*
 * cuda-mwv's kernels (plugins/cuda-mwv) run on a host, with no GPU, as
 * tests/emu/emu.h emulates a launch: the Q5_0 and Q8_0 copies and their
 * GEMV, and gemv_multi and gemv_glu with them among Q4_K and Q6_K. Loads
 * are plain reads that check their alignment, and every buffer holds
 * exactly the bytes the kernels may read, under AddressSanitizer.
 *  - gemv of Q5_0 and Q8_0 rows (the copy prepare makes, from source rows
 *    2 and 6 bytes apart beyond their length), 1, 3 and 8 columns, 1, 2
 *    and 4 rows a warp, 2 and 4 pieces a lane's step, rows of one block,
 *    of 640 values (20 pieces: lanes 20 .. 31 idle) and longer, against
 *    a double sum of the cpu reference's weights (sdk/lib/dequant.c):
 *    |error| / sum |w x| below 1e-5, padding of y left untouched;
 *  - gemv_multi of mixed types (q, k, v of the default model: Q5_0,
 *    Q5_0, Q8_0; all four types) with biases: each product bit for bit
 *    its gemv plus the bias;
 *  - gemv_glu of Q5_0 and Q8_0 gate and up, SiLU and the tanh GELU: bit
 *    for bit the two gemv and the cuda backend's glu expression.
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

#include "mwv_b32_kernels.emu.cu"
#include "mwv_glu.emu.cu"
#include "mwv_kernels.emu.cu"
#include "mwv_multi.emu.cu"
#include "mwv_q6k_kernels.emu.cu"

static void *exactly(size_t bytes)
{
	void *p = nullptr;

	if (posix_memalign(&p, 16, bytes ? bytes : 16))
		abort();
	memset(p, 0xAB, bytes);
	return p;
}

/* A weight as prepare leaves it: SRC's rows (PAD bytes apart beyond their
 * length), and the kernels' copy of them for all but Q4_K. */
struct weight {
	q4kh_prepared p;
	uint8_t *src;
	void *copy;
};

static weight weight_new(uint32_t type, int64_t k, int64_t n, int64_t pad)
{
	const int64_t rb = k / q4kh_type_block_elems(type) * q4kh_type_block_bytes(type);
	weight w = {};
	int64_t row = 0;

	w.src = (uint8_t *)exactly((size_t)((rb + pad) * (n - 1) + rb));
	random_rows(type, k, n, rb + pad, w.src);
	w.p.multiprocessors = 2;
	w.p.type = type;
	w.p.k = k;
	w.p.n = n;
	w.p.src = w.src;
	w.p.src_stride = rb + pad;
	if (type == Q4KH_TYPE_Q4_K) {
		w.p.data = w.src;
		w.p.stride = w.p.src_stride;
		return w;
	}
	row = type == Q4KH_TYPE_Q6_K ? mwv_q6k_row_bytes(k) : mwv_b32_row_bytes(type, k);
	w.copy = exactly((size_t)(row * n));
	if ((type == Q4KH_TYPE_Q6_K ? mwv_q6k_pack(&w.p, w.copy, 0)
	                            : mwv_b32_pack(&w.p, w.copy, 0)) != cudaSuccess)
		abort();
	w.p.data = w.copy;
	w.p.stride = row;
	return w;
}

static void weight_free(weight &w)
{
	free(w.src);
	free(w.copy);
}

/* gemv as mwv_apply routes it. */
static cudaError_t gemv(const weight &w, const q4kh_cv_io &io, int warps)
{
	switch (w.p.type) {
	case Q4KH_TYPE_Q4_K: return mwv_launch(&w.p, &io, warps, 0);
	case Q4KH_TYPE_Q6_K: return mwv_q6k_launch(&w.p, &io, warps, 0);
	default: return mwv_b32_launch(&w.p, &io, warps, 0);
	}
}

/* T random columns of K activations in [-1, 1), LDX = K + 4 apart. */
static float *columns(int64_t k, int64_t t)
{
	float *x = (float *)exactly((size_t)((k + 4) * (t - 1) + k) * 4);

	for (int64_t c = 0; c < t; c++)
		for (int64_t i = 0; i < k; i++)
			x[c * (k + 4) + i] = (float)(urand() * 2 - 1);
	return x;
}

/* y = W x for T columns against the reference's weights in double. */
static int product(uint32_t type, int64_t k, int64_t n, int64_t pad, int64_t t, int warps)
{
	weight w = weight_new(type, k, n, pad);
	float *x = columns(k, t);
	const int64_t ldy = n + 3;
	std::vector<float> y((size_t)(ldy * t), NAN), deq((size_t)k);
	const q4kh_cv_io io = { x, k + 4, y.data(), ldy, t, "gemv", 0 };
	double worst = 0;
	int bad = gemv(w, io, warps) != cudaSuccess;

	for (int64_t r = 0; r < n; r++) {
		q4kh_dequant_row(type, w.src + r * w.p.src_stride, deq.data(), k);
		for (int64_t c = 0; c < t; c++) {
			const double got = y[(size_t)(c * ldy + r)];
			double s = 0, sa = 0, e;

			for (int64_t i = 0; i < k; i++) {
				s += (double)deq[(size_t)i] * x[c * (k + 4) + i];
				sa += fabs((double)deq[(size_t)i] * x[c * (k + 4) + i]);
			}
			e = fabs(got - s) / (sa > 0 ? sa : 1);
			if (!(e < 1e-5) && bad++ < 5)
				fprintf(stderr, "  row %lld column %lld: %.9g, want %.9g\n", (long long)r,
				        (long long)c, got, s);
			worst = e > worst ? e : worst;
		}
	}
	for (int64_t c = 0; c < t; c++)
		for (int64_t r = n; r < ldy; r++)
			if (!std::isnan(y[(size_t)(c * ldy + r)]) && bad++ < 5)
				fprintf(stderr, "  padding row %lld of column %lld written\n",
				        (long long)r, (long long)c);
	printf("gemv %-4s k=%lld n=%lld pad=%lld t=%lld warps=%d: worst %.2g: %s\n",
	       q4kh_type_name(type), (long long)k, (long long)n, (long long)pad, (long long)t,
	       warps, worst, bad ? "FAIL" : "ok");
	free(x);
	weight_free(w);
	return bad != 0;
}

/* Do A and B (N floats each) hold the same bits? Reports the first difference. */
static int same_bits(const float *a, const float *b, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], 4)) {
			fprintf(stderr, "  %s: value %zu: %.9g, its calls give %.9g\n", what, i,
			        a[i], b[i]);
			return 1;
		}
	return 0;
}

/* gemv_multi of N matrices of K (types, rows, biases) against gemv + bias. */
static int multi(int64_t k, uint32_t n, const uint32_t *types, const int64_t *rows,
                 const int *bias, int64_t t)
{
	weight w[Q4KH_GEMV_MULTI_MAX];
	const q4kh_prepared *p[Q4KH_GEMV_MULTI_MAX];
	std::vector<float> ym[Q4KH_GEMV_MULTI_MAX], ys[Q4KH_GEMV_MULTI_MAX], b[Q4KH_GEMV_MULTI_MAX];
	float *x = columns(k, t);
	q4kh_cv_multi_io io = {};
	int bad = 0;

	io.x = x;
	io.ldx = k + 4;
	io.cols = t;
	for (uint32_t i = 0; i < n; i++) {
		w[i] = weight_new(types[i], k, rows[i], 2 * (types[i] != Q4KH_TYPE_Q4_K));
		p[i] = &w[i].p;
		ym[i].assign((size_t)((rows[i] + 1) * t), NAN);
		ys[i].assign((size_t)((rows[i] + 1) * t), NAN);
		for (int64_t r = 0; bias[i] && r < rows[i]; r++)
			b[i].push_back((float)(urand() * 2 - 1));
		io.y[i] = ym[i].data();
		io.ldy[i] = rows[i] + 1;
		io.bias[i] = bias[i] ? b[i].data() : nullptr;
	}
	bad += mwv_multi_launch(n, p, &io, 4, 0) != cudaSuccess;
	for (uint32_t i = 0; i < n; i++) {
		const q4kh_cv_io one = { x, k + 4, ys[i].data(), rows[i] + 1, t, "gemv", 0 };

		bad += gemv(w[i], one, 4) != cudaSuccess;
		for (int64_t c = 0; bias[i] && c < t; c++)
			for (int64_t r = 0; r < rows[i]; r++)
				ys[i][(size_t)(c * (rows[i] + 1) + r)] += b[i][(size_t)r];
		bad += same_bits(ym[i].data(), ys[i].data(), ym[i].size(),
		                 q4kh_type_name(types[i]));
		weight_free(w[i]);
	}
	printf("multi k=%lld of %u, t=%lld: %s\n", (long long)k, n, (long long)t,
	       bad ? "FAIL" : "bit for bit");
	free(x);
	return bad != 0;
}

/* gemv_glu of TYPE {K, N} against two gemv and the backend's glu value. */
static int glu(uint32_t type, int64_t k, int64_t n, bool silu, int64_t t)
{
	weight gate = weight_new(type, k, n, 0), up = weight_new(type, k, n, 6);
	float *x = columns(k, t);
	const int64_t ldy = n + 2;
	std::vector<float> y((size_t)(ldy * t), NAN), g(y), u(y), want(y);
	const q4kh_cv_io io = { x, k + 4, y.data(), ldy, t, "gemv", 0 };
	const q4kh_cv_io gi = { x, k + 4, g.data(), ldy, t, "gemv", 0 };
	const q4kh_cv_io ui = { x, k + 4, u.data(), ldy, t, "gemv", 0 };
	int bad = mwv_glu_launch(silu, &gate.p, &up.p, &io, 4, 0) != cudaSuccess;

	bad += gemv(gate, gi, 4) != cudaSuccess || gemv(up, ui, 4) != cudaSuccess;
	for (int64_t c = 0; c < t; c++)
		for (int64_t r = 0; r < n; r++)
			want[(size_t)(c * ldy + r)] = q4kh_cuda_glu_value(silu, g[(size_t)(c * ldy + r)],
			                                                  u[(size_t)(c * ldy + r)]);
	bad += same_bits(y.data(), want.data(), y.size(), q4kh_type_name(type));
	printf("glu %-4s %s k=%lld n=%lld t=%lld: %s\n", q4kh_type_name(type),
	       silu ? "SiLU" : "GELU", (long long)k, (long long)n, (long long)t,
	       bad ? "FAIL" : "bit for bit");
	free(x);
	weight_free(gate);
	weight_free(up);
	return bad != 0;
}

int main(void)
{
	/* K, N, source padding: 1 row a warp with 2 pieces a step, 4 rows a
	 * warp (N >= 128 over 2 multiprocessors), 2 rows a warp with 4
	 * pieces a step (65 pieces), 1 row a warp with 4 (128 pieces). */
	static const int64_t shapes[][3] = {
		{ 32, 5, 2 }, { 640, 7, 0 }, { 640, 130, 6 }, { 2080, 40, 2 }, { 4096, 9, 0 },
	};
	static const uint32_t q50 = Q4KH_TYPE_Q5_0, q80 = Q4KH_TYPE_Q8_0;
	int fails = 0;

	for (uint32_t type : { q50, q80 })
		for (const auto &s : shapes)
			for (int64_t t : { 1, 3, 8 })
				fails += product(type, s[0], s[1], s[2], t, t == 3 ? 1 : 4);
	{
		const uint32_t qkv[] = { q50, q50, q80 };
		const int64_t qkv_rows[] = { 130, 33, 64 };
		const int qkv_bias[] = { 1, 0, 1 };
		const uint32_t four[] = { q80, Q4KH_TYPE_Q4_K, q50, Q4KH_TYPE_Q6_K };
		const int64_t four_rows[] = { 5, 17, 9, 3 };
		const int four_bias[] = { 0, 1, 1, 0 };

		for (int64_t t : { 1, 4 }) {
			fails += multi(640, 3, qkv, qkv_rows, qkv_bias, t);
			fails += multi(512, 4, four, four_rows, four_bias, t);
		}
	}
	for (bool silu : { true, false }) {
		fails += glu(q50, 640, 150, silu, 1);
		fails += glu(q50, 640, 9, silu, 5);
		fails += glu(q80, 2080, 33, silu, 2);
	}
	printf("%s\n", fails ? "FAILED" : "all agree");
	return fails != 0;
}
