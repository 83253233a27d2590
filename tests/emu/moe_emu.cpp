/*
 * The cuda backend's mixture-of-experts ops (plugins/cuda/cuda_moe.cu, with
 * the grouped products of cuda_gemv.cu and cuda_matmul.cu) run on a host
 * with no GPU, each launch emulated by tests/emu/emu.h:
 *  - mul_mat_id, direct (a few columns) and grouped (a counting sort, a
 *    gather, tiles of up to 8 columns, a scatter), through the GEMV
 *    formats (Q4_K, Q6_K, Q8_0, Q2_K) and the plain kernel (Q4_K rows
 *    its format cannot align), x one input a token or one a slot, padded
 *    strides: every column within 1e-5 of sum |w x| of the float64 product
 *    of the cpu reference's dequantised weights (sdk/lib/dequant.c),
 *    y's padding untouched;
 *  - an id out of range: the stream's fault words name it (element, value,
 *    limit), its column is left alone and every other column is right;
 *  - moe_route against plugin.h's definition computed here in double:
 *    the same expert ids (ties to the lower index, a NaN column to the
 *    lowest indices) and weights within one float rounding;
 *  - a decode's block fused into two launches (cuda_launch_moe_fused)
 *    against its nodes run one by one, bit for bit, and its sums against
 *    the float64 product of the dequantised down rows.
 * Built and run by scripts/cuda-emulate.sh; exit 0 when everything agrees.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "emu.h"
#include "emu_rows.h"
#include "q4khost/cuda_glu.cuh"
#include "q4khost/dequant.h"

/* cuda_moe.cu, cuda_gemv.cu and cuda_matmul.cu are linked, compiled
 * apart by the script (the last two shared with matmul_emu). */
#include "cuda_kernels.h"

static void *aligned(size_t bytes)
{
	void *p = nullptr;

	if (posix_memalign(&p, 256, bytes ? bytes : 256))
		abort();
	return p;
}

static int32_t fault[CUDA_FAULT_WORDS];

/* A view of F32 or I32 data: rows ne[0] values, the rest strided. */
static cuda_view view(void *data, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                      int64_t nb1, int64_t nb2)
{
	cuda_view v;

	v.data = (char *)data;
	v.type = type;
	v.ne[0] = ne0;
	v.ne[1] = ne1;
	v.ne[2] = ne2;
	v.ne[3] = 1;
	v.nb[0] = type == Q4KH_TYPE_F32 || type == Q4KH_TYPE_I32 ? 4 : 0;
	v.nb[1] = nb1;
	v.nb[2] = nb2;
	v.nb[3] = nb2 * ne2;
	return v;
}

/*
 * One mul_mat_id: E experts {K, N} of TYPE (rows WPAD bytes apart beyond
 * their length), S slots of T tokens, x with X columns a token; ids as
 * CHOOSE gives them; BAD, when >= 0, the column whose id is replaced by E.
 */
static int mul_mat_id(uint32_t type, int64_t e, int64_t k, int64_t n, int64_t s, int64_t t,
                      int64_t xn, int64_t wpad, int64_t bad, const char *what)
{
	const int64_t rb = k / (int64_t)q4kh_type_block_elems(type) *
	                   (int64_t)q4kh_type_block_bytes(type);
	const int64_t w_row = rb + wpad, w_exp = w_row * n;
	const int64_t x_slot = k + 4, x_tok = x_slot * xn + 8, y_slot = n + 2, y_tok = y_slot * s + 1;
	uint8_t *w = (uint8_t *)aligned((size_t)(w_exp * e));
	float *x = (float *)aligned((size_t)(x_tok * t) * 4);
	float *y = (float *)aligned((size_t)(y_tok * t) * 4);
	const int64_t ids_col = s + 1; /* a token's ids, one unused int after them */
	int32_t *ids = (int32_t *)aligned((size_t)(ids_col * t) * 4);
	std::vector<float> deq((size_t)k);
	int fails = 0;
	double worst = 0;

	random_rows(type, k, n * e, w_row, w);
	for (int64_t i = 0; i < x_tok * t; i++)
		x[i] = (float)(urand() * 2 - 1);
	for (int64_t i = 0; i < y_tok * t; i++)
		y[i] = NAN;
	/* distinct experts per token, expert 1 in every token (several tiles
	 * of it when grouped), some experts in none */
	for (int64_t tt = 0; tt < t; tt++) {
		std::vector<int32_t> pool;

		for (int32_t x_ = 0; x_ < (int32_t)e; x_++)
			if (x_ != 1 && x_ != (int32_t)e - 1)
				pool.push_back(x_);
		std::shuffle(pool.begin(), pool.end(), rng);
		for (int64_t j = 0; j < s; j++)
			ids[tt * ids_col + j] = j == tt % s ? 1 : pool[(size_t)j];
	}
	if (bad >= 0)
		ids[bad / s * ids_col + bad % s] = (int32_t)e;
	memset(fault, 0, sizeof(fault));

	const cuda_view vw = { (char *)w, type, { k, n, e, 1 }, { 0, w_row, w_exp, w_exp * e } };
	const cuda_view vx = view(x, Q4KH_TYPE_F32, k, xn, t, x_slot * 4, x_tok * 4);
	const cuda_view vi = view(ids, Q4KH_TYPE_I32, s, t, 1, ids_col * 4, ids_col * 4 * t);
	const cuda_view vy = view(y, Q4KH_TYPE_F32, n, s, t, y_slot * 4, y_tok * 4);
	const size_t sb = cuda_mul_mat_id_scratch(&vw, &vi);
	void *scratch = sb ? aligned(sb) : nullptr;
	cudaError_t err = cuda_launch_mul_mat_id(&vw, &vx, &vi, &vy, scratch, 2, fault, 0);

	if (err != cudaSuccess) {
		printf("%s: launch error %d: FAIL\n", what, (int)err);
		return 1;
	}
	for (int64_t tt = 0; tt < t; tt++)
		for (int64_t j = 0; j < s; j++) {
			const int64_t col = tt * s + j;
			const float *yc = y + tt * y_tok + j * y_slot;
			const float *xc = x + tt * x_tok + (j % xn) * x_slot;
			const int32_t ex = ids[tt * ids_col + j];

			for (int64_t r = 0; r < y_slot; r++) {
				double sum = 0, sa = 0, rel;

				if (r >= n || col == bad) {
					if (!std::isnan(yc[r]) && fails++ < 5)
						fprintf(stderr, "  column %lld row %lld written\n",
						        (long long)col, (long long)r);
					continue;
				}
				q4kh_dequant_row(type, w + ex * w_exp + r * w_row, deq.data(), k);
				for (int64_t i = 0; i < k; i++) {
					sum += (double)deq[(size_t)i] * xc[i];
					sa += fabs((double)deq[(size_t)i] * xc[i]);
				}
				rel = fabs(yc[r] - sum) / (sa > 0 ? sa : 1);
				if (!(rel < 1e-5) && fails++ < 5)
					fprintf(stderr, "  column %lld row %lld: %.9g, want %.9g\n",
					        (long long)col, (long long)r, yc[r], sum);
				if (!(rel <= worst))
					worst = rel;
			}
		}
	if (bad >= 0 && (fault[0] != CUDA_FAULT_MUL_MAT_ID_IDS || fault[1] != bad ||
	                 fault[2] != e || fault[3] != e) && fails++ < 5)
		fprintf(stderr, "  fault words %d %d %d %d, want %d %lld %lld %lld\n", fault[0],
		        fault[1], fault[2], fault[3], CUDA_FAULT_MUL_MAT_ID_IDS, (long long)bad,
		        (long long)e, (long long)e);
	if (bad < 0 && fault[0] && fails++ < 5)
		fprintf(stderr, "  a fault (%d) with every id in range\n", fault[0]);
	printf("%-6s %s: E=%lld K=%lld N=%lld k=%lld T=%lld X=%lld (%s): worst %.2g: %s\n",
	       q4kh_type_name(type), what, (long long)e, (long long)k, (long long)n, (long long)s,
	       (long long)t, (long long)xn, sb ? "grouped" : "direct", worst,
	       fails ? "FAIL" : "ok");
	free(w);
	free(x);
	free(y);
	free(ids);
	free(scratch);
	return fails != 0;
}

/* moe_route of one column from plugin.h's definition, in double. */
static void route_ref(const float *l, int64_t e, int64_t k, int norm, int32_t *ids, float *w)
{
	std::vector<double> p((size_t)e);
	std::vector<bool> taken((size_t)e, false);
	double max = l[0], sum = 0, chosen = 0;
	std::vector<double> c((size_t)k);

	for (int64_t i = 1; i < e; i++)
		max = l[i] > max ? l[i] : max;
	for (int64_t i = 0; i < e; i++)
		sum += p[(size_t)i] = exp((double)l[i] - max);
	for (int64_t j = 0; j < k; j++) {
		int64_t best = -1;

		for (int64_t i = 0; i < e; i++)
			if (!taken[(size_t)i] && !std::isnan(p[(size_t)i]) &&
			    (best < 0 || p[(size_t)i] > p[(size_t)best]))
				best = i;
		for (int64_t i = 0; best < 0; i++)
			if (!taken[(size_t)i])
				best = i;
		taken[(size_t)best] = true;
		ids[j] = (int32_t)best;
		c[(size_t)j] = p[(size_t)best] / sum;
		chosen += c[(size_t)j];
	}
	for (int64_t j = 0; j < k; j++)
		w[j] = (float)(norm ? c[(size_t)j] / std::max(chosen, 0x1p-14) : c[(size_t)j]);
}

/* moe_route over T columns of E logits, K chosen: random logits, column
 * 1 with ties (every value twice), column 2 all NaN when NAN_COL. */
static int route(int64_t e, int64_t k, int64_t t, int norm, bool nan_col)
{
	const int64_t lc = e + 3, ic = k + 1;
	std::vector<float> l((size_t)(lc * t)), w((size_t)(ic * t), NAN), rw((size_t)k);
	std::vector<int32_t> ids((size_t)(ic * t), -7), rids((size_t)k);
	int fails = 0;

	for (auto &v : l)
		v = (float)(urand() * 8 - 4);
	for (int64_t i = 0; t > 1 && i < e; i++)
		l[(size_t)(lc + i)] = (float)((i / 2) % 5) * 0.5f;
	for (int64_t i = 0; nan_col && i < e; i++)
		l[(size_t)(2 * lc + i)] = NAN;
	const cuda_view vl = view(l.data(), Q4KH_TYPE_F32, e, t, 1, lc * 4, lc * 4 * t);
	const cuda_view vi = view(ids.data(), Q4KH_TYPE_I32, k, t, 1, ic * 4, ic * 4 * t);
	const cuda_view vw = view(w.data(), Q4KH_TYPE_F32, k, t, 1, ic * 4, ic * 4 * t);

	if (cuda_launch_moe_route(&vl, norm, &vi, &vw, 0) != cudaSuccess) {
		printf("moe_route: launch error: FAIL\n");
		return 1;
	}
	for (int64_t c = 0; c < t; c++) {
		route_ref(&l[(size_t)(c * lc)], e, k, norm, rids.data(), rw.data());
		for (int64_t j = 0; j < k; j++) {
			const float got = w[(size_t)(c * ic + j)], want = rw[(size_t)j];
			const bool same = std::isnan(want) ? std::isnan(got)
			                                    : fabsf(got - want) <=
			                                              ldexpf(fabsf(want), -23);

			if ((ids[(size_t)(c * ic + j)] != rids[(size_t)j] || !same) && fails++ < 5)
				fprintf(stderr, "  column %lld slot %lld: expert %d weight %.9g, want "
				        "%d %.9g\n", (long long)c, (long long)j,
				        ids[(size_t)(c * ic + j)], got, rids[(size_t)j], want);
		}
		if ((ids[(size_t)(c * ic + k)] != -7 || !std::isnan(w[(size_t)(c * ic + k)])) &&
		    fails++ < 5)
			fprintf(stderr, "  column %lld: padding written\n", (long long)c);
	}
	printf("moe_route E=%lld k=%lld T=%lld norm=%d%s: %s\n", (long long)e, (long long)k,
	       (long long)t, norm, nan_col ? " (a NaN column)" : "", fails ? "FAIL" : "ok");
	return fails != 0;
}

/* Does float A have B's bits? */
static bool same_bits(float a, float b)
{
	return !memcmp(&a, &b, sizeof(a));
}

/*
 * A decode's block fused (cuda_launch_moe_fused) against the same block's
 * nodes run one by one here (moe_route, mul_mat_id of gate and up, the
 * GLU, mul_mat_id of down, the weights' products added in slot order):
 * the same ids, weights, GLU and sums, bit for bit; and the sums within
 * 1e-5 of sum |w h| of the float64 product of the cpu reference's
 * dequantised down rows with that GLU.
 */
static int fused(uint32_t gt, uint32_t dt, int64_t e, int64_t k, int64_t n, int64_t f,
                 int64_t t, int norm)
{
	const int64_t gb = n / (int64_t)q4kh_type_block_elems(gt) *
	                   (int64_t)q4kh_type_block_bytes(gt);
	const int64_t db = f / (int64_t)q4kh_type_block_elems(dt) *
	                   (int64_t)q4kh_type_block_bytes(dt);
	uint8_t *wg = (uint8_t *)aligned((size_t)(gb * f * e)), *wu = (uint8_t *)aligned((size_t)(gb * f * e));
	uint8_t *wd = (uint8_t *)aligned((size_t)(db * n * e));
	float *l = (float *)aligned((size_t)(e * t) * 4), *x = (float *)aligned((size_t)(n * t) * 4);
	float *g1 = (float *)aligned((size_t)(f * k * t) * 4), *u1 = (float *)aligned((size_t)(f * k * t) * 4);
	float *h2 = (float *)aligned((size_t)(f * k * t) * 4), *d1 = (float *)aligned((size_t)(n * k * t) * 4);
	float *o2 = (float *)aligned((size_t)(n * t) * 4);
	float *w1 = (float *)aligned((size_t)(k * t) * 4), *w2 = (float *)aligned((size_t)(k * t) * 4);
	int32_t *i1 = (int32_t *)aligned((size_t)(k * t) * 4), *i2 = (int32_t *)aligned((size_t)(k * t) * 4);
	std::vector<float> deq((size_t)f);
	int fails = 0;
	double worst = 0;

	random_rows(gt, n, f * e, gb, wg);
	random_rows(gt, n, f * e, gb, wu);
	random_rows(dt, f, n * e, db, wd);
	for (int64_t i = 0; i < e * t; i++)
		l[i] = (float)(urand() * 8 - 4);
	for (int64_t i = 0; i < n * t; i++)
		x[i] = (float)(urand() * 2 - 1);
	memset(fault, 0, sizeof(fault));

	const cuda_view vl = view(l, Q4KH_TYPE_F32, e, t, 1, e * 4, e * 4 * t);
	const cuda_view vg = { (char *)wg, gt, { n, f, e, 1 }, { 0, gb, gb * f, gb * f * e } };
	const cuda_view vu = { (char *)wu, gt, { n, f, e, 1 }, { 0, gb, gb * f, gb * f * e } };
	const cuda_view vd = { (char *)wd, dt, { f, n, e, 1 }, { 0, db, db * n, db * n * e } };
	const cuda_view vx = view(x, Q4KH_TYPE_F32, n, 1, t, n * 4, n * 4);
	cuda_view vi = view(i1, Q4KH_TYPE_I32, k, t, 1, k * 4, k * 4 * t);
	cuda_view vw = view(w1, Q4KH_TYPE_F32, k, t, 1, k * 4, k * 4 * t);
	const cuda_view vg1 = view(g1, Q4KH_TYPE_F32, f, k, t, f * 4, f * k * 4);
	const cuda_view vu1 = view(u1, Q4KH_TYPE_F32, f, k, t, f * 4, f * k * 4);
	const cuda_view vd1 = view(d1, Q4KH_TYPE_F32, n, k, t, n * 4, n * k * 4);

	/* the nodes one by one: g1 becomes their GLU in place, as the graph's */
	if (cuda_launch_moe_route(&vl, norm, &vi, &vw, 0) != cudaSuccess ||
	    cuda_launch_mul_mat_id(&vg, &vx, &vi, &vg1, nullptr, 2, fault, 0) != cudaSuccess ||
	    cuda_launch_mul_mat_id(&vu, &vx, &vi, &vu1, nullptr, 2, fault, 0) != cudaSuccess) {
		printf("fused: the nodes' launches failed: FAIL\n");
		return 1;
	}
	for (int64_t i = 0; i < f * k * t; i++)
		g1[i] = q4kh_cuda_glu_value(true, g1[i], u1[i]);
	if (cuda_launch_mul_mat_id(&vd, &vg1, &vi, &vd1, nullptr, 2, fault, 0) != cudaSuccess) {
		printf("fused: down's launch failed: FAIL\n");
		return 1;
	}

	cuda_moe_fused_views v;

	v.logits = vl;
	v.ids = view(i2, Q4KH_TYPE_I32, k, t, 1, k * 4, k * 4 * t);
	v.weights = view(w2, Q4KH_TYPE_F32, k, t, 1, k * 4, k * 4 * t);
	v.x = vx;
	v.gate = vg;
	v.up = vu;
	v.h = view(h2, Q4KH_TYPE_F32, f, k, t, f * 4, f * k * 4);
	v.down = vd;
	v.out = view(o2, Q4KH_TYPE_F32, n, t, 1, n * 4, n * 4 * t);
	if (cuda_launch_moe_fused(&v, norm, 2, 0, 0) != cudaSuccess) {
		printf("fused: launch failed: FAIL\n");
		return 1;
	}
	for (int64_t i = 0; i < k * t; i++)
		if ((i1[i] != i2[i] || !same_bits(w1[i], w2[i])) && fails++ < 5)
			fprintf(stderr, "  slot %lld: expert %d weight %.9g, the nodes' %d %.9g\n",
			        (long long)i, i2[i], w2[i], i1[i], w1[i]);
	for (int64_t i = 0; i < f * k * t; i++)
		if (!same_bits(g1[i], h2[i]) && fails++ < 5)
			fprintf(stderr, "  GLU %lld: %.9g, the nodes' %.9g\n", (long long)i, h2[i], g1[i]);
	for (int64_t tt = 0; tt < t; tt++)
		for (int64_t r = 0; r < n; r++) {
			const float *dc = d1 + tt * n * k + r;
			float nodes = dc[0] * w1[tt * k];
			double sum = 0, sa = 0, rel;

			for (int64_t j = 1; j < k; j++)
				nodes = nodes + dc[j * n] * w1[tt * k + j];
			for (int64_t j = 0; j < k; j++) {
				const float *hc = h2 + tt * f * k + j * f;
				double dot = 0, da = 0;

				q4kh_dequant_row(dt, wd + i2[tt * k + j] * db * n + r * db, deq.data(), f);
				for (int64_t i = 0; i < f; i++) {
					dot += (double)deq[(size_t)i] * hc[i];
					da += fabs((double)deq[(size_t)i] * hc[i]);
				}
				sum += dot * w2[tt * k + j];
				sa += da * fabs(w2[tt * k + j]);
			}
			rel = fabs(o2[tt * n + r] - sum) / (sa > 0 ? sa : 1);
			if ((!same_bits(nodes, o2[tt * n + r]) || !(rel < 1e-5)) && fails++ < 5)
				fprintf(stderr, "  token %lld row %lld: %.9g, the nodes' %.9g, want %.9g\n",
				        (long long)tt, (long long)r, o2[tt * n + r], nodes, sum);
			if (!(rel <= worst))
				worst = rel;
		}
	if (fault[0] && fails++ < 5)
		fprintf(stderr, "  a fault (%d)\n", fault[0]);
	printf("fused  %s/%s: E=%lld k=%lld K=%lld F=%lld T=%lld norm=%d: worst %.2g: %s\n",
	       q4kh_type_name(gt), q4kh_type_name(dt), (long long)e, (long long)k, (long long)n,
	       (long long)f, (long long)t, norm, worst, fails ? "FAIL" : "ok");
	for (void *p : { (void *)wg, (void *)wu, (void *)wd, (void *)l, (void *)x, (void *)g1,
	                 (void *)u1, (void *)h2, (void *)d1, (void *)o2, (void *)w1, (void *)w2,
	                 (void *)i1, (void *)i2 })
		free(p);
	return fails != 0;
}

int main(void)
{
	int fails = 0;

	rng.seed(5);
	fails += route(8, 2, 5, 1, true);
	fails += route(8, 8, 3, 0, false);
	fails += route(128, 8, 9, 1, true);
	fails += route(300, 5, 6, 1, false);
	fails += route(1500, 3, 2, 1, false); /* one warp a block */
	for (uint32_t type : { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q2_K }) {
		fails += mul_mat_id(type, 8, 512, 13, 2, 1, 1, 0, -1, "decode");
		fails += mul_mat_id(type, 8, 256, 11, 3, 2, 3, 0, -1, "few tokens");
		fails += mul_mat_id(type, 8, 512, 13, 2, 11, 1, 0, -1, "prefill");
		fails += mul_mat_id(type, 6, 256, 9, 3, 13, 3, 0, -1, "prefill, x a slot");
	}
	/* rows the GEMV loads cannot align: the plain kernel */
	fails += mul_mat_id(Q4KH_TYPE_Q4_K, 8, 256, 7, 2, 1, 1, 2, -1, "decode, odd rows");
	fails += mul_mat_id(Q4KH_TYPE_Q4_K, 8, 256, 7, 2, 9, 2, 2, -1, "prefill, odd rows");
	fails += mul_mat_id(Q4KH_TYPE_Q6_K, 8, 256, 5, 2, 1, 1, 0, 1, "decode, a bad id");
	fails += mul_mat_id(Q4KH_TYPE_Q6_K, 8, 256, 5, 2, 10, 1, 0, 13, "prefill, a bad id");
	/* a decode's block fused: Qwen3-MoE's types, one shared, k = 1 */
	fails += fused(Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, 16, 4, 512, 256, 1, 1);
	fails += fused(Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q4_K, 16, 3, 256, 512, 2, 0);
	fails += fused(Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q8_0, 8, 1, 256, 96, 1, 1);
	/* few rows, long enough that two warps share each (on the 2
	 * multiprocessors emu.h's occupancy gives): gate and up, then down */
	fails += fused(Q4KH_TYPE_Q6_K, Q4KH_TYPE_Q8_0, 4, 1, 2048, 32, 1, 1);
	fails += fused(Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q8_0, 4, 1, 32, 2048, 1, 1);
	printf("%s\n", fails ? "FAILED" : "all agree");
	return fails != 0;
}
