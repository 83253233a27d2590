/*
 * The cuda backend's GEMV (plugins/cuda/cuda_gemv.cuh) run on a host, with
 * no GPU: each block's 128 threads are fibers, with warp shuffles and
 * __syncthreads as tests/emu/emu.h emulates them, loads are plain reads
 * that check their alignment. It checks the lane layouts and the walk, not the speed:
 *  - every weight of the formats that compute weights one by one (all but
 *    Q4_K, Q5_K, Q6_K and IQ4_XS) equals the cpu reference's
 *    dequantisation (sdk/lib/dequant.c), zeros' signs aside, and every
 *    value of a row is taken exactly once;
 *  - y = W x of every type, 1 to 11 columns, row counts that are not
 *    multiples of the rows per task, padded rows and columns, partial
 *    units (rows of 640 values among them), ks = 1, 2, 4 and several blocks per launch, against a double
 *    sum of the cpu reference's weights (|error| / sum |w x| below 1e-5;
 *    padding of y left untouched).
 * Built and run by scripts/cuda-emulate.sh (not by make: it needs the CUDA
 * toolkit's headers and a C++20 compiler); exit 0 when everything agrees.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "emu.h"
#include "emu_rows.h"
#include "q4khost/dequant.h"

#include "cuda_gemv.cuh"
#include "q4khost/cuda_quant.cuh"

static void *aligned(size_t bytes)
{
	void *p = nullptr;

	if (posix_memalign(&p, 16, bytes ? bytes : 16))
		abort();
	return p;
}

/* --- y = W x through gv_block ------------------------------------------------ */

template <uint32_t TYPE, int C>
static void run_blocks(const gv_args &g, int64_t blocks)
{
	constexpr int R = gv_rows(C), U = gv_units(TYPE, C);
	std::vector<float> part(GV_WARPS * R * C, NAN); /* __shared__ */

	emu::run(dim3((unsigned)blocks), dim3(GV_THREADS), 0, [&]() {
		gv_block<TYPE, C, R, U>(g, blockIdx.x, gridDim.x, threadIdx.x, part.data(),
		                        []() { __syncthreads(); });
	});
}

template <uint32_t TYPE>
static void run_type(const gv_args &g, int c, int64_t blocks)
{
	switch (c) {
	case 1: run_blocks<TYPE, 1>(g, blocks); break;
	case 2: run_blocks<TYPE, 2>(g, blocks); break;
	case 4: run_blocks<TYPE, 4>(g, blocks); break;
	default: run_blocks<TYPE, 8>(g, blocks);
	}
}

static void run(uint32_t type, const gv_args &g, int c, int64_t blocks)
{
	q4kh_for_type(type, [&](auto ty) {
		run_type<decltype(ty)::value>(g, c, blocks);
		return cudaSuccess;
	});
}

/* The alignment TYPE's format needs of rows and strides (gv_fmt::ALIGN). */
static int64_t align_of(uint32_t type)
{
	int64_t a = 0;

	q4kh_for_type(type, [&](auto ty) {
		a = gv_fmt<decltype(ty)::value>::ALIGN;
		return cudaSuccess;
	});
	return a;
}

/* One product: N rows of K values (rows WPAD bytes apart beyond their
 * length), T columns of x (XPAD floats beyond K), C columns a pass. */
static int product(uint32_t type, int c, int64_t n, int64_t k, int64_t t, int ks,
                   int64_t blocks, int64_t wpad, int64_t xpad)
{
	const size_t rb = (size_t)(k / q4kh_type_block_elems(type) * q4kh_type_block_bytes(type));
	const int64_t stride = (int64_t)rb + wpad, xcol = k + xpad, ycol = n + 3;
	std::vector<uint8_t> rows((size_t)(stride * n));
	/* Exactly the bytes the views cover, so that a read past them shows
	 * under AddressSanitizer. */
	const size_t wbytes = (size_t)(stride * (n - 1)) + rb, xn = (size_t)(xcol * (t - 1) + k);
	uint8_t *w = (uint8_t *)aligned(wbytes);
	float *x = (float *)aligned(xn * 4);
	std::vector<float> y((size_t)(ycol * t), NAN), deq((size_t)k);
	double num = 0, den = 0, worst = 0;
	int bad = 0;
	gv_args g;

	random_rows(type, k, n, stride, rows.data());
	memcpy(w, rows.data(), wbytes);
	for (size_t i = 0; i < xn; i++)
		x[i] = (float)(urand() * 2 - 1);
	g.w = w;
	g.x = x;
	g.y = y.data();
	g.w_row = stride;
	g.x_col = xcol;
	g.y_col = ycol;
	g.n = n;
	g.k = k;
	g.t = t;
	g.units = (int)((k + GV_UNIT - 1) / GV_UNIT);
	g.ks = ks;
	run(type, g, c, blocks);
	for (int64_t r = 0; r < n; r++) {
		q4kh_dequant_row(type, w + r * stride, deq.data(), k);
		for (int64_t j = 0; j < t; j++) {
			double s = 0, sa = 0, e;
			const double got = y[(size_t)(j * ycol + r)];

			for (int64_t i = 0; i < k; i++) {
				s += (double)deq[(size_t)i] * x[j * xcol + i];
				sa += fabs((double)deq[(size_t)i] * x[j * xcol + i]);
			}
			e = fabs(got - s) / (sa > 0 ? sa : 1);
			num += (got - s) * (got - s);
			den += s * s;
			if (!(e < 1e-5) && bad++ < 5)
				fprintf(stderr, "  row %lld column %lld: %.9g, want %.9g\n",
				        (long long)r, (long long)j, got, s);
			if (!(e <= worst))
				worst = e;
		}
	}
	for (int64_t j = 0; j < t; j++)
		for (int64_t r = n; r < ycol; r++)
			if (!std::isnan(y[(size_t)(j * ycol + r)]) && bad++ < 5)
				fprintf(stderr, "  padding row %lld of column %lld written\n",
				        (long long)r, (long long)j);
	free(w);
	free(x);
	printf("%-6s C=%d n=%lld k=%lld t=%lld ks=%d blocks=%lld: NMSE %.2g, worst %.2g: %s\n",
	       q4kh_type_name(type), c, (long long)n, (long long)k, (long long)t, ks,
	       (long long)blocks, den > 0 ? num / den : 0.0, worst, bad ? "FAIL" : "ok");
	return bad != 0;
}

/* --- weights one by one --------------------------------------------------------- */

template <class E>
static int weights(uint32_t type, int64_t k)
{
	const size_t rb = (size_t)(k / q4kh_type_block_elems(type) * q4kh_type_block_bytes(type));
	const int units = (int)((k + GV_UNIT - 1) / GV_UNIT);
	uint8_t *w = (uint8_t *)aligned(rb);
	std::vector<float> deq((size_t)k);
	std::vector<int> seen((size_t)k, 0);
	int bad = 0;

	random_rows(type, k, 1, (int64_t)rb, w);
	q4kh_dequant_row(type, w, deq.data(), k);
	for (int u = 0; u < units; u++)
		for (int lane = 0; lane < 32; lane++) {
			const typename E::lane_t L = E::lane_init(lane, k, units);
			const bool ok[2] = { u < L.lim0, u < L.lim1 };
			const typename E::lane_raw q =
				E::lane_load(w + (int64_t)u * E::UB, L, ok[0], ok[1]);
			float v[8];

			E::values(q, L, v);
			for (int run = 0; run < 2; run++)
				for (int i = 0; ok[run] && i < 4; i++) {
					const int64_t at = (int64_t)GV_UNIT * u + L.x0 + run * E::X1 + i;
					const float want = deq[(size_t)at];

					seen[(size_t)at]++;
					if (memcmp(&v[4 * run + i], &want, 4) &&
					    !(v[4 * run + i] == 0 && want == 0) && bad++ < 5)
						fprintf(stderr, "  %s weight %lld: %.9g, want %.9g\n",
						        q4kh_type_name(type), (long long)at,
						        v[4 * run + i], want);
				}
		}
	for (int64_t i = 0; i < k; i++)
		if (seen[(size_t)i] != 1 && bad++ < 5)
			fprintf(stderr, "  %s value %lld taken %d times\n", q4kh_type_name(type),
			        (long long)i, seen[(size_t)i]);
	free(w);
	printf("weights %-6s k=%lld: %s\n", q4kh_type_name(type), (long long)k,
	       bad ? "FAIL" : "as the reference");
	return bad != 0;
}

int main(void)
{
	static const uint32_t types[] = {
		Q4KH_TYPE_F32,  Q4KH_TYPE_F16,  Q4KH_TYPE_BF16, Q4KH_TYPE_Q4_0,   Q4KH_TYPE_Q4_1,
		Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q2_K,   Q4KH_TYPE_Q3_K,
		Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS,
	};
	int fails = 0;

	fails += weights<gv_float<4> >(Q4KH_TYPE_F32, 1100);
	fails += weights<gv_float<2> >(Q4KH_TYPE_F16, 1100);
	fails += weights<gv_float<2, true> >(Q4KH_TYPE_BF16, 1100);
	fails += weights<gv_q8_0>(Q4KH_TYPE_Q8_0, 1120);
	fails += weights<gv_b32<Q4KH_TYPE_Q4_0> >(Q4KH_TYPE_Q4_0, 1120);
	fails += weights<gv_b32<Q4KH_TYPE_Q4_1> >(Q4KH_TYPE_Q4_1, 1120);
	fails += weights<gv_b32<Q4KH_TYPE_Q5_0> >(Q4KH_TYPE_Q5_0, 1120);
	fails += weights<gv_b32<Q4KH_TYPE_Q5_1> >(Q4KH_TYPE_Q5_1, 1120);
	fails += weights<gv_b32<Q4KH_TYPE_IQ4_NL> >(Q4KH_TYPE_IQ4_NL, 1120);
	fails += weights<gv_k2<Q4KH_TYPE_Q2_K> >(Q4KH_TYPE_Q2_K, 2304);
	fails += weights<gv_k2<Q4KH_TYPE_Q3_K> >(Q4KH_TYPE_Q3_K, 2304);
	for (uint32_t type : types) {
		const int64_t be = q4kh_type_block_elems(type);
		/* A long row (several steps, a partial unit) and a short one. */
		const int64_t kl = be == 256 ? 2304 : be == 32 ? 1120 : 1100;
		const int64_t ksh = be == 256 ? 512 : be == 32 ? 96 : 68;
		const int64_t align = align_of(type);

		for (int c : { 1, 2, 4, 8 }) {
			fails += product(type, c, 67, kl, c, 1, 3, 0, 4);
			fails += product(type, c, 13, ksh, c == 8 ? 11 : c, 1, 5, 3 * align, 0);
			fails += product(type, c, 9, kl, c == 4 ? 3 : c, 2, 2, align, 8);
			fails += product(type, c, 5, 4 * kl, c, 4, 1, 0, 0);
			fails += product(type, c, 1, kl, c, 4, 3, 0, 0);
			/* Gemma 3 270M's rows: one whole step and a partial one. */
			fails += product(type, c, 11, be == 256 ? 768 : 640, c, 1, 2, 0, 0);
			fails += product(type, c, 11, be == 256 ? 768 : 640, c, 2, 2, 0, 0);
		}
	}
	printf("%s\n", fails ? "FAILED" : "all agree");
	return fails != 0;
}
