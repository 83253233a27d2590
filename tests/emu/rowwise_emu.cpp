/*
 * The cuda backend's row-wise ops (plugins/cuda/cuda_rowwise.cu: rms_norm
 * with its add and norm-add-norm fused forms, rope, rope_set_rows and
 * rope_store) run on a host, with no GPU: the .cu file as it is, launch
 * code included, each launch emulated by tests/emu/emu.h. Checked:
 *  - rms_norm of rows of 256, 640, 4096 and 5000 values (one head of
 *    Gemma 3, its hidden row, Llama-3-8B's, and a row longer than the
 *    values a block holds in registers), 1 and 3 rows, with and without
 *    a weight, against plugin.h's definition in double;
 *  - add_rms_norm bit for bit add (x + a in f32) then rms_norm, x written
 *    back as the sum; norm_add_rms_norm bit for bit rms_norm of a in
 *    place, then add_rms_norm, out apart and out = x;
 *  - rope (NEOX and NORM, n_rot the whole head or part of it, with and
 *    without frequency factors, 1 and 3 tokens) against the rotation in
 *    double; rope_set_rows bit for bit rope then the rows converted to
 *    the cache's type; rope_store (f16 and f32 caches) bit for bit rope
 *    of q, rope_set_rows of k and v's rows converted (the 16-byte stores
 *    and their scalar fallback, a v row that is not 16-byte aligned),
 *    every other cache row untouched;
 *  - norm_rope_store (heads of 64, 128 and 256 values): bit for bit
 *    rms_norm of q's and k's heads in place, then rope_store;
 *  - a negative position: rope_store's fault word says so and writes no
 *    cache row.
 * Built and run by scripts/cuda-emulate.sh; exit 0 when everything
 * agrees.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "emu.h"

/* The .cu file, its launches rewritten for emu.h by the script. */
#include "cuda_rowwise.emu.cu"

static std::mt19937_64 rng(1);

static double nrand(void)
{
	return std::normal_distribution<double>(0.0, 1.0)(rng);
}

/* A contiguous f32 (or f16, TYPE) view {n0, n1, n2} over P. */
static cuda_view view_of(void *p, uint32_t type, int64_t n0, int64_t n1, int64_t n2)
{
	const int64_t es = type == Q4KH_TYPE_F16 ? 2 : 4;

	return { (char *)p, type, { n0, n1, n2, 1 }, { es, es * n0, es * n0 * n1, es * n0 * n1 * n2 } };
}

static std::vector<float> random_row(size_t n, double scale)
{
	std::vector<float> v(n);

	for (auto &x : v)
		x = (float)(scale * nrand());
	return v;
}

static int same_bits(const char *what, const void *a, const void *b, size_t bytes)
{
	if (!memcmp(a, b, bytes))
		return 0;
	printf("FAIL %s: not the same bits\n", what);
	return 1;
}

/* --- rms_norm and its fused forms --- */

static const float EPS = 1e-6f;

/* rms_norm of N values of X with W (NULL: none), in double. */
static void norm_ref(const float *x, const float *w, int64_t n, double *out)
{
	double ss = 0.0;

	for (int64_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	const double s = 1.0 / sqrt(ss / (double)n + EPS);
	for (int64_t i = 0; i < n; i++)
		out[i] = x[i] * s * (w ? w[i] : 1.0);
}

static int norm_launch(std::vector<float> &x, std::vector<float> *a, int norm_a,
                       const std::vector<float> *wa, const std::vector<float> *w,
                       std::vector<float> &out, int64_t n, int64_t rows)
{
	cuda_view vx = view_of(x.data(), Q4KH_TYPE_F32, n, rows, 1), va, vwa, vw, vo;

	if (a)
		va = view_of(a->data(), Q4KH_TYPE_F32, n, rows, 1);
	if (wa)
		vwa = view_of((void *)wa->data(), Q4KH_TYPE_F32, n, 1, 1);
	if (w)
		vw = view_of((void *)w->data(), Q4KH_TYPE_F32, n, 1, 1);
	vo = view_of(out.data(), Q4KH_TYPE_F32, n, rows, 1);
	if (cuda_launch_norm(&vx, a ? &va : NULL, norm_a, wa ? &vwa : NULL, EPS,
	                     w ? &vw : NULL, EPS, &vo, 0, 0) != cudaSuccess) {
		printf("FAIL rms_norm n %lld: the launch failed\n", (long long)n);
		return 1;
	}
	return 0;
}

static int norm_case(int64_t n, int64_t rows, bool with_w, double *worst)
{
	const size_t all = (size_t)(n * rows);
	std::vector<float> x = random_row(all, 2.0), a = random_row(all, 1.0);
	std::vector<float> w = random_row(n, 1.0), wa = random_row(n, 1.0);
	const std::vector<float> *wp = with_w ? &w : NULL;
	std::vector<float> out(all), sum(all), x2, a2, out2(all);
	std::vector<double> ref(n);
	char what[128];
	int bad = 0;

	/* plain, against the definition */
	if (norm_launch(x, NULL, 0, NULL, wp, out, n, rows))
		return 1;
	for (int64_t r = 0; r < rows; r++) {
		norm_ref(&x[r * n], wp ? w.data() : NULL, n, ref.data());
		for (int64_t i = 0; i < n; i++) {
			const double e = fabs(out[r * n + i] - ref[i]) / (fabs(ref[i]) + 1e-3);

			*worst = fmax(*worst, e);
			if (e > 1e-6) {
				printf("FAIL rms_norm n %lld row %lld [%lld]: %.9g, expected %.9g\n",
				       (long long)n, (long long)r, (long long)i, out[r * n + i], ref[i]);
				return 1;
			}
		}
	}
	/* add_rms_norm: add in f32, then the plain norm of the sums */
	for (size_t i = 0; i < all; i++)
		sum[i] = x[i] + a[i];
	x2 = x;
	a2 = a;
	if (norm_launch(sum, NULL, 0, NULL, wp, out, n, rows) ||
	    norm_launch(x2, &a2, 0, NULL, wp, out2, n, rows))
		return 1;
	snprintf(what, sizeof(what), "add_rms_norm n %lld rows %lld w %d", (long long)n,
	         (long long)rows, with_w);
	bad |= same_bits(what, out2.data(), out.data(), all * 4);
	bad |= same_bits(what, x2.data(), sum.data(), all * 4);
	bad |= same_bits(what, a2.data(), a.data(), all * 4);
	/* norm_add_rms_norm: a normed in place with wa, then add_rms_norm;
	 * into out apart, and into x */
	for (int into_x = 0; into_x < 2; into_x++) {
		std::vector<float> an = a, xs = x, o1(all), x3 = x, a3 = a, o2(all);

		if (norm_launch(an, NULL, 0, NULL, &wa, an, n, rows) ||
		    norm_launch(xs, &an, 0, NULL, wp, o1, n, rows) ||
		    norm_launch(x3, &a3, 1, &wa, wp, into_x ? x3 : o2, n, rows))
			return 1;
		snprintf(what, sizeof(what), "norm_add_rms_norm n %lld rows %lld w %d out=%s",
		         (long long)n, (long long)rows, with_w, into_x ? "x" : "apart");
		bad |= same_bits(what, a3.data(), an.data(), all * 4);
		if (into_x)
			bad |= same_bits(what, x3.data(), o1.data(), all * 4);
		else {
			bad |= same_bits(what, o2.data(), o1.data(), all * 4);
			bad |= same_bits(what, x3.data(), xs.data(), all * 4);
		}
	}
	return bad;
}

/* --- rope and its fused forms --- */

struct rope_case {
	int64_t hd, hq, hk, hv, hdv, t;
	int n_rot, neox, factors;
};

/* Case C's rope parameters, FF its frequency factors (where C has). */
static cuda_rope rope_of(const rope_case &c, const float *ff)
{
	cuda_rope p{};

	p.n_rot = c.n_rot;
	p.neox = c.neox;
	p.base = 10000.0;
	p.freq_scale = 1.0;
	p.mscale = 1.0;
	p.freq_factors = c.factors ? ff : NULL;
	return p;
}

/* X {hd, heads, t} rotated at positions POS, in double (plugin.h). */
static void rope_ref(const std::vector<float> &x, int64_t hd, int64_t heads, int64_t t,
                     const int32_t *pos, const rope_case &c, const float *ff,
                     std::vector<double> &out)
{
	const int64_t half = c.n_rot / 2;

	out.assign(x.begin(), x.end());
	for (int64_t tt = 0; tt < t; tt++)
		for (int64_t h = 0; h < heads; h++)
			for (int64_t i = 0; i < half; i++) {
				const size_t base = (size_t)((tt * heads + h) * hd);
				const int64_t a = c.neox ? i : 2 * i, b = c.neox ? i + half : 2 * i + 1;
				double th = pos[tt] * pow(10000.0, -2.0 * i / c.n_rot);

				if (ff)
					th /= ff[i];
				out[base + a] = x[base + a] * cos(th) - x[base + b] * sin(th);
				out[base + b] = x[base + a] * sin(th) + x[base + b] * cos(th);
			}
}

static int rope_check(const char *what, const std::vector<float> &got,
                      const std::vector<double> &ref, double *worst)
{
	for (size_t i = 0; i < got.size(); i++) {
		const double e = fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-2);

		*worst = fmax(*worst, e);
		if (e > 1e-6) {
			printf("FAIL %s [%zu]: %.9g, expected %.9g\n", what, i, got[i], ref[i]);
			return 1;
		}
	}
	return 0;
}

static const int32_t CACHE_ROWS = 9;

template <typename K, typename V>
static int rope_store_case(const rope_case &c, uint32_t kt, uint32_t vt, int v_offset,
                           double *worst)
{
	const size_t nq = (size_t)(c.hd * c.hq * c.t), nk = (size_t)(c.hd * c.hk * c.t);
	const size_t nv = (size_t)(c.hdv * c.hv * c.t);
	const size_t kcn = (size_t)(c.hd * c.hk * CACHE_ROWS), vcn = (size_t)(c.hdv * c.hv * CACHE_ROWS);
	std::vector<float> q = random_row(nq, 1.0), k = random_row(nk, 1.0);
	std::vector<float> vbuf = random_row(nv + 1, 1.0), ff(c.n_rot / 2);
	std::vector<K> kc(kcn), kc2(kcn);
	std::vector<V> vc(vcn), vc2(vcn);
	std::vector<int32_t> pos(c.t);
	std::vector<double> ref;
	const std::vector<float> q0 = q, k0 = k;
	std::vector<float> q2 = q, k2 = k, qr(nq);
	int32_t fault[CUDA_FAULT_WORDS] = { 0 }, fault2[CUDA_FAULT_WORDS] = { 0 };
	const cuda_rope p = rope_of(c, ff.data());
	char what[160];
	int bad = 0;

	for (auto &f : ff)
		f = (float)(1.0 + 3.0 * (rng() % 1000) / 1000.0);
	for (int64_t tt = 0; tt < c.t; tt++)
		pos[tt] = (int32_t)(tt == 0 ? 7 : 3 + tt); /* rows 7, 4, 5 */
	for (size_t i = 0; i < kcn; i++)
		kc[i] = kc2[i] = from_f32<K>(-5.0f);
	for (size_t i = 0; i < vcn; i++)
		vc[i] = vc2[i] = from_f32<V>(-5.0f);
	snprintf(what, sizeof(what), "rope_store hd %lld n_rot %d %s t %lld ff %d k %s v %s%s",
	         (long long)c.hd, c.n_rot, c.neox ? "neox" : "norm", (long long)c.t, c.factors,
	         kt == Q4KH_TYPE_F16 ? "f16" : "f32", vt == Q4KH_TYPE_F16 ? "f16" : "f32",
	         v_offset ? " v unaligned" : "");

	float *v = vbuf.data() + v_offset;
	cuda_view vq = view_of(q.data(), Q4KH_TYPE_F32, c.hd, c.hq, c.t);
	cuda_view vk = view_of(k.data(), Q4KH_TYPE_F32, c.hd, c.hk, c.t);
	cuda_view vv = view_of(v, Q4KH_TYPE_F32, c.hdv, c.hv, c.t);
	cuda_view vkc = view_of(kc.data(), kt, c.hd, c.hk, CACHE_ROWS);
	cuda_view vvc = view_of(vc.data(), vt, c.hdv, c.hv, CACHE_ROWS);
	cuda_view vq2 = view_of(q2.data(), Q4KH_TYPE_F32, c.hd, c.hq, c.t);
	cuda_view vqr = view_of(qr.data(), Q4KH_TYPE_F32, c.hd, c.hq, c.t);
	cuda_view vk2 = view_of(k2.data(), Q4KH_TYPE_F32, c.hd, c.hk, c.t);
	cuda_view vkc2 = view_of(kc2.data(), kt, c.hd, c.hk, CACHE_ROWS);

	/* the ops one by one: rope of q (out apart, then in place), and of
	 * k with its rows cached; v's rows converted here as set_rows does */
	if (cuda_launch_rope(&vq2, pos.data(), &p, &vqr, fault2, 0, 0) ||
	    cuda_launch_rope(&vq2, pos.data(), &p, &vq2, fault2, 0, 0) ||
	    cuda_launch_rope_set_rows(&vk2, pos.data(), &p, &vk2, &vkc2, fault2, 0, 0) ||
	    cuda_launch_rope_store(&vq, &vk, &vv, pos.data(), &p, &vkc, &vvc, NULL, fault, 0, 0)) {
		printf("FAIL %s: a launch failed\n", what);
		return 1;
	}
	for (int64_t tt = 0; tt < c.t; tt++)
		for (size_t i = 0; i < (size_t)(c.hdv * c.hv); i++)
			vc2[(size_t)pos[tt] * c.hdv * c.hv + i] = from_f32<V>(v[tt * c.hdv * c.hv + i]);
	if (fault[0] || fault2[0]) {
		printf("FAIL %s: fault %d, %d\n", what, fault[0], fault2[0]);
		return 1;
	}
	/* rope against the definition, out apart; in place the same bits */
	rope_ref(q0, c.hd, c.hq, c.t, pos.data(), c, p.freq_factors, ref);
	bad |= rope_check(what, qr, ref, worst);
	rope_ref(k0, c.hd, c.hk, c.t, pos.data(), c, p.freq_factors, ref);
	bad |= rope_check(what, k2, ref, worst);
	bad |= same_bits(what, q2.data(), qr.data(), nq * 4);
	/* rope_store: the bits of the ops one by one, every other cache row
	 * as it was */
	bad |= same_bits(what, q.data(), q2.data(), nq * 4);
	bad |= same_bits(what, k.data(), k2.data(), nk * 4);
	bad |= same_bits(what, kc.data(), kc2.data(), kcn * sizeof(K));
	bad |= same_bits(what, vc.data(), vc2.data(), vcn * sizeof(V));
	return bad;
}

/*
 * norm_rope_store (cuda's own group: q's and k's heads normed, q with a
 * weight and k without, then rope_store): bit for bit rms_norm of q's
 * and of k's heads in place, then rope_store.
 */
template <typename K, typename V>
static int norm_rope_store_case(const rope_case &c, uint32_t kt, uint32_t vt)
{
	const size_t nq = (size_t)(c.hd * c.hq * c.t), nk = (size_t)(c.hd * c.hk * c.t);
	const size_t kcn = (size_t)(c.hd * c.hk * CACHE_ROWS), vcn = (size_t)(c.hdv * c.hv * CACHE_ROWS);
	std::vector<float> q = random_row(nq, 3.0), k = random_row(nk, 0.5);
	std::vector<float> v = random_row((size_t)(c.hdv * c.hv * c.t), 1.0), wq = random_row(c.hd, 1.0);
	std::vector<float> q2 = q, k2 = k, ff(c.n_rot / 2, 1.5f);
	std::vector<K> kc(kcn, from_f32<K>(-5.0f)), kc2 = kc;
	std::vector<V> vc(vcn, from_f32<V>(-5.0f)), vc2 = vc;
	std::vector<int32_t> pos(c.t);
	int32_t fault[CUDA_FAULT_WORDS] = { 0 };
	const float eps_q = 1e-6f, eps_k = 1e-5f;
	const cuda_head_norms hn = { wq.data(), NULL, eps_q, eps_k };
	const cuda_rope p = rope_of(c, ff.data());
	char what[160];
	int bad = 0;

	for (int64_t tt = 0; tt < c.t; tt++)
		pos[tt] = (int32_t)(2 + 3 * tt);
	snprintf(what, sizeof(what), "norm_rope_store hd %lld n_rot %d %s t %lld k %s v %s",
	         (long long)c.hd, c.n_rot, c.neox ? "neox" : "norm", (long long)c.t,
	         kt == Q4KH_TYPE_F16 ? "f16" : "f32", vt == Q4KH_TYPE_F16 ? "f16" : "f32");

	/* apart: the norms' nodes in place, then rope_store */
	cuda_view rq = view_of(q2.data(), Q4KH_TYPE_F32, c.hd, c.hq * c.t, 1);
	cuda_view rk = view_of(k2.data(), Q4KH_TYPE_F32, c.hd, c.hk * c.t, 1);
	cuda_view vw = view_of(wq.data(), Q4KH_TYPE_F32, c.hd, 1, 1);
	cuda_view vq2 = view_of(q2.data(), Q4KH_TYPE_F32, c.hd, c.hq, c.t);
	cuda_view vk2 = view_of(k2.data(), Q4KH_TYPE_F32, c.hd, c.hk, c.t);
	cuda_view vv = view_of(v.data(), Q4KH_TYPE_F32, c.hdv, c.hv, c.t);
	cuda_view vkc2 = view_of(kc2.data(), kt, c.hd, c.hk, CACHE_ROWS);
	cuda_view vvc2 = view_of(vc2.data(), vt, c.hdv, c.hv, CACHE_ROWS);
	/* fused */
	cuda_view vq = view_of(q.data(), Q4KH_TYPE_F32, c.hd, c.hq, c.t);
	cuda_view vk = view_of(k.data(), Q4KH_TYPE_F32, c.hd, c.hk, c.t);
	cuda_view vkc = view_of(kc.data(), kt, c.hd, c.hk, CACHE_ROWS);
	cuda_view vvc = view_of(vc.data(), vt, c.hdv, c.hv, CACHE_ROWS);

	if (cuda_launch_norm(&rq, NULL, 0, NULL, 0.0f, &vw, eps_q, &rq, 0, 0) ||
	    cuda_launch_norm(&rk, NULL, 0, NULL, 0.0f, NULL, eps_k, &rk, 0, 0) ||
	    cuda_launch_rope_store(&vq2, &vk2, &vv, pos.data(), &p, &vkc2, &vvc2, NULL, fault, 0, 0) ||
	    cuda_launch_rope_store(&vq, &vk, &vv, pos.data(), &p, &vkc, &vvc, &hn, fault, 0, 0) ||
	    fault[0]) {
		printf("FAIL %s: a launch failed or faulted (%d)\n", what, fault[0]);
		return 1;
	}
	bad |= same_bits(what, q.data(), q2.data(), nq * 4);
	bad |= same_bits(what, k.data(), k2.data(), nk * 4);
	bad |= same_bits(what, kc.data(), kc2.data(), kcn * sizeof(K));
	bad |= same_bits(what, vc.data(), vc2.data(), vcn * sizeof(V));
	return bad;
}

/* A negative position: rope_store's fault word names it, and no cache
 * row is written. */
static int rope_store_fault(void)
{
	const int64_t hd = 128;
	std::vector<float> q = random_row(hd * 2, 1.0), k = random_row(hd, 1.0), v = random_row(hd, 1.0);
	std::vector<__half> kc(hd * CACHE_ROWS, __float2half(-5.0f)), vc = kc, kc0 = kc;
	int32_t pos = -3, fault[CUDA_FAULT_WORDS] = { 0 };
	cuda_rope p{};

	p.n_rot = (int32_t)hd;
	p.neox = 1;
	p.base = 10000.0;
	p.freq_scale = 1.0;
	p.mscale = 1.0;
	cuda_view vq = view_of(q.data(), Q4KH_TYPE_F32, hd, 2, 1);
	cuda_view vk = view_of(k.data(), Q4KH_TYPE_F32, hd, 1, 1);
	cuda_view vv = view_of(v.data(), Q4KH_TYPE_F32, hd, 1, 1);
	cuda_view vkc = view_of(kc.data(), Q4KH_TYPE_F16, hd, 1, CACHE_ROWS);
	cuda_view vvc = view_of(vc.data(), Q4KH_TYPE_F16, hd, 1, CACHE_ROWS);

	if (cuda_launch_rope_store(&vq, &vk, &vv, &pos, &p, &vkc, &vvc, NULL, fault, 0, 0) ||
	    fault[0] != CUDA_FAULT_ROPE_POS || fault[1] != 0 || fault[2] != -3 ||
	    memcmp(kc.data(), kc0.data(), kc.size() * 2) || memcmp(vc.data(), kc0.data(), vc.size() * 2)) {
		printf("FAIL rope_store at position -3: fault %d %d %d, caches %s\n", fault[0],
		       fault[1], fault[2],
		       memcmp(kc.data(), kc0.data(), kc.size() * 2) ||
		                       memcmp(vc.data(), kc0.data(), vc.size() * 2)
		               ? "written"
		               : "untouched");
		return 1;
	}
	return 0;
}

int main(void)
{
	static const int64_t norm_n[] = { 256, 640, 4096, 5000 };
	static const rope_case ropes[] = {
		/* hd, hq, hk, hv, hdv, t, n_rot, neox, factors */
		{ 128, 4, 2, 2, 128, 1, 128, 1, 1 },  /* Llama-3-8B's heads, one token */
		{ 128, 4, 2, 2, 128, 3, 128, 1, 0 },
		{ 256, 4, 1, 1, 256, 1, 256, 1, 0 },  /* Gemma 3 270M's */
		{ 64, 3, 1, 1, 64, 2, 32, 0, 0 },     /* NORM, half the head rotated */
		{ 320, 2, 1, 2, 96, 1, 128, 1, 1 },   /* more items than threads */
	};
	double worst_norm = 0.0, worst_rope = 0.0;
	int bad = 0, cases = 0;

	for (int64_t n : norm_n)
		for (int64_t rows = 1; rows <= 3; rows += 2)
			for (int w = 0; w < 2; w++, cases++)
				bad += norm_case(n, rows, w, &worst_norm);
	for (const rope_case &c : ropes) {
		for (int off = 0; off < 2; off++) {
			bad += rope_store_case<__half, __half>(c, Q4KH_TYPE_F16, Q4KH_TYPE_F16, off,
			                                       &worst_rope);
			cases++;
		}
		bad += rope_store_case<float, __half>(c, Q4KH_TYPE_F32, Q4KH_TYPE_F16, 0, &worst_rope);
		bad += rope_store_case<__half, float>(c, Q4KH_TYPE_F16, Q4KH_TYPE_F32, 0, &worst_rope);
		bad += rope_store_case<float, float>(c, Q4KH_TYPE_F32, Q4KH_TYPE_F32, 1, &worst_rope);
		cases += 3;
		if (c.hd <= CUDA_HEAD_NORM_MAX) {
			bad += norm_rope_store_case<__half, __half>(c, Q4KH_TYPE_F16, Q4KH_TYPE_F16);
			bad += norm_rope_store_case<float, float>(c, Q4KH_TYPE_F32, Q4KH_TYPE_F32);
			cases += 2;
		}
	}
	bad += rope_store_fault();
	cases++;
	printf("rowwise: %d cases, %d failed; worst relative error rms_norm %.3g, rope %.3g\n",
	       cases, bad, worst_norm, worst_rope);
	return bad ? 1 : 0;
}
