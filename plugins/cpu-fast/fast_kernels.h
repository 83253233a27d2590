/*
 * cpu-fast's inner loops (struct fast_kernels, fast.h), written once over
 * a float vector of FAST_W lanes and included by each instruction-set file
 * (fast_avx2.c, fast_avx512.c) after it defines
 *
 *   vf; vzero(), vset(x), vload(p), vstore(p, v), vload_h(p), vstore_h(p, v)
 *   (binary16 values, rounded to nearest even), vadd, vsub, vmul, vdiv,
 *   vmax(a, b) and vmin(a, b) (b when either is NaN), vfma(a, b, c) = a b + c,
 *   vfnma(a, b, c) = c - a b, vhsum(v), vswap_pairs(v) (lanes 2i and 2i + 1
 *   swapped), vround(v) (to nearest), vscale2(p, n) = p 2^n (n integral),
 *
 * and FAST_TABLE and FAST_NAME, the struct fast_kernels to define and its
 * name. Every loop ends with a scalar tail, so any length works.
 */
#ifndef Q4KH_FAST_KERNELS_H
#define Q4KH_FAST_KERNELS_H

#include <math.h>

#include "fast.h"

/*
 * e^x, within 2 ulp of it over [-87.3, 88] (Cephes' expf: x = n ln2 + r,
 * |r| <= ln2 / 2, e^r by a degree-6 polynomial); x is clamped to that
 * range (e^88 = 1.7e38 stands for anything larger), NaN stays NaN.
 */
static inline vf vexp(vf x)
{
	vf n, r, p;

	x = vmin(vset(88.0f), vmax(vset(-87.3f), x));
	n = vround(vmul(x, vset(1.44269504088896341f)));
	r = vfnma(n, vset(0.693359375f), x);
	r = vfnma(n, vset(-2.12194440e-4f), r);
	p = vset(1.9875691500e-4f);
	p = vfma(p, r, vset(1.3981999507e-3f));
	p = vfma(p, r, vset(8.3334519073e-3f));
	p = vfma(p, r, vset(4.1665795894e-2f));
	p = vfma(p, r, vset(1.6666665459e-1f));
	p = vfma(p, r, vset(5.0000001201e-1f));
	p = vfma(p, vmul(r, r), vadd(r, vset(1.0f)));
	return vscale2(p, n);
}

/* 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3):
 * the same function without 1 + tanh's cancellation for negative u. */
static inline vf vgelu(vf g)
{
	const vf u2 = vmul(vset(1.5957691216057308f),
	                   vfma(vmul(vmul(g, g), g), vset(0.044715f), g));

	return vdiv(g, vadd(vset(1.0f), vexp(vsub(vzero(), u2))));
}

static inline vf vsilu(vf g)
{
	return vdiv(g, vadd(vset(1.0f), vexp(vsub(vzero(), g))));
}

static inline float gelu1(float g)
{
	return g / (1.0f + expf(-1.5957691216057308f * (g + 0.044715f * g * g * g)));
}

static inline float silu1(float g)
{
	return g / (1.0f + expf(-g));
}

static float sum_squares(const float *x, int64_t n)
{
	vf a0 = vzero(), a1 = vzero();
	int64_t i = 0;
	float s;

	for (; i + 2 * FAST_W <= n; i += 2 * FAST_W) {
		const vf v0 = vload(x + i), v1 = vload(x + i + FAST_W);

		a0 = vfma(v0, v0, a0);
		a1 = vfma(v1, v1, a1);
	}
	for (; i + FAST_W <= n; i += FAST_W) {
		const vf v = vload(x + i);

		a0 = vfma(v, v, a0);
	}
	s = vhsum(vadd(a0, a1));
	for (; i < n; i++)
		s += x[i] * x[i];
	return s;
}

static void scale(const float *x, float s, float *out, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore(out + i, vmul(vload(x + i), vset(s)));
	for (; i < n; i++)
		out[i] = x[i] * s;
}

static void scale_mul(const float *x, float s, const float *w, float *out, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore(out + i, vmul(vmul(vload(x + i), vset(s)), vload(w + i)));
	for (; i < n; i++)
		out[i] = x[i] * s * w[i];
}

static void add(const float *a, const float *b, float *out, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore(out + i, vadd(vload(a + i), vload(b + i)));
	for (; i < n; i++)
		out[i] = a[i] + b[i];
}

static void mul(const float *a, const float *b, float *out, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore(out + i, vmul(vload(a + i), vload(b + i)));
	for (; i < n; i++)
		out[i] = a[i] * b[i];
}

static void glu(q4kh_glu_kind kind, const float *g, const float *u, float *out, int64_t n)
{
	int64_t i = 0;

	if (kind == Q4KH_GLU_SILU) {
		for (; i + FAST_W <= n; i += FAST_W)
			vstore(out + i, vmul(vsilu(vload(g + i)), vload(u + i)));
		for (; i < n; i++)
			out[i] = silu1(g[i]) * u[i];
		return;
	}
	for (; i + FAST_W <= n; i += FAST_W)
		vstore(out + i, vmul(vgelu(vload(g + i)), vload(u + i)));
	for (; i < n; i++)
		out[i] = gelu1(g[i]) * u[i];
}

static void to_f16(const float *x, uint16_t *out, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore_h(out + i, vload(x + i));
	for (; i < n; i++)
		out[i] = q4kh_f32_to_fp16(x[i]);
}

static void from_f16(const uint16_t *x, float *out, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore(out + i, vload_h(x + i));
	for (; i < n; i++)
		out[i] = q4kh_fp16_to_f32(x[i]);
}

/* Two accumulators: one would wait on the latency of every FMA. */
#define DOT_BODY(load_b)                                                     \
	vf a0 = vzero(), a1 = vzero();                                       \
	int64_t i = 0;                                                       \
	float s;                                                             \
	for (; i + 2 * FAST_W <= n; i += 2 * FAST_W) {                       \
		a0 = vfma(vload(a + i), load_b(b + i), a0);                  \
		a1 = vfma(vload(a + i + FAST_W), load_b(b + i + FAST_W), a1); \
	}                                                                    \
	for (; i + FAST_W <= n; i += FAST_W)                                 \
		a0 = vfma(vload(a + i), load_b(b + i), a0);                  \
	s = vhsum(vadd(a0, a1));

static float dot(const float *a, const float *b, int64_t n)
{
	DOT_BODY(vload)
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

static float dot_f16(const float *a, const uint16_t *b, int64_t n)
{
	DOT_BODY(vload_h)
	for (; i < n; i++)
		s += a[i] * q4kh_fp16_to_f32(b[i]);
	return s;
}

static void axpy(float a, const float *x, float *y, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore(y + i, vfma(vset(a), vload(x + i), vload(y + i)));
	for (; i < n; i++)
		y[i] += a * x[i];
}

static void axpy_f16(float a, const uint16_t *x, float *y, int64_t n)
{
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W)
		vstore(y + i, vfma(vset(a), vload_h(x + i), vload(y + i)));
	for (; i < n; i++)
		y[i] += a * q4kh_fp16_to_f32(x[i]);
}

static float exp_sum(float *s, float max, int64_t n)
{
	vf acc = vzero();
	int64_t i = 0;
	float sum;

	for (; i + FAST_W <= n; i += FAST_W) {
		const vf e = vexp(vsub(vload(s + i), vset(max)));

		vstore(s + i, e);
		acc = vadd(acc, e);
	}
	sum = vhsum(acc);
	for (; i < n; i++) {
		s[i] = expf(s[i] - max);
		sum += s[i];
	}
	return sum;
}

static void rope_neox(const float *x, const float *c, const float *s, float *out,
                      int64_t half)
{
	int64_t i = 0;

	for (; i + FAST_W <= half; i += FAST_W) {
		const vf a = vload(x + i), b = vload(x + half + i);
		const vf cv = vload(c + i), sv = vload(s + i);

		vstore(out + i, vfnma(b, sv, vmul(a, cv)));
		vstore(out + half + i, vfma(a, sv, vmul(b, cv)));
	}
	for (; i < half; i++) {
		const float a = x[i], b = x[half + i];

		out[i] = a * c[i] - b * s[i];
		out[half + i] = a * s[i] + b * c[i];
	}
}

static void rope_norm(const float *x, const float *cc, const float *ss, float *out,
                      int64_t n_rot)
{
	int64_t i = 0;

	for (; i + FAST_W <= n_rot; i += FAST_W) {
		const vf v = vload(x + i);

		vstore(out + i, vfma(vswap_pairs(v), vload(ss + i), vmul(v, vload(cc + i))));
	}
	for (; i < n_rot; i += 2) {
		const float a = x[i], b = x[i + 1];

		out[i] = a * cc[i] + b * ss[i];
		out[i + 1] = b * cc[i + 1] + a * ss[i + 1];
	}
}

/* softplus(x) = log(1 + e^x), without overflow for large x. */
static inline float softplus1(float x)
{
	return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}

static void unary(q4kh_unary_kind kind, const float *x, float *out, int64_t n)
{
	int64_t i = 0;

	if (kind == Q4KH_UNARY_SOFTPLUS) {
		for (; i < n; i++)
			out[i] = softplus1(x[i]);
		return;
	}
	for (; i + FAST_W <= n; i += FAST_W) {
		const vf v = vload(x + i);

		vstore(out + i, kind == Q4KH_UNARY_SILU ? vsilu(v)
		                                        : vdiv(vset(1.0f),
		                                               vadd(vset(1.0f),
		                                                    vexp(vsub(vzero(), v)))));
	}
	for (; i < n; i++)
		out[i] = kind == Q4KH_UNARY_SILU ? silu1(x[i]) : 1.0f / (1.0f + expf(-x[i]));
}

/*
 * One row of a delta-rule state (fast.h): two passes over the row, the
 * first for its products with k and q, the second for the update.
 */
static float delta_row(float *row, const float *k, const float *q, int64_t n, float decay,
                       float beta, float v, float kq)
{
	vf ak = vzero(), aq = vzero();
	float rk, rq, d;
	int64_t i = 0;

	for (; i + FAST_W <= n; i += FAST_W) {
		const vf r = vload(row + i);

		ak = vfma(r, vload(k + i), ak);
		aq = vfma(r, vload(q + i), aq);
	}
	rk = vhsum(ak);
	rq = vhsum(aq);
	for (; i < n; i++) {
		rk += row[i] * k[i];
		rq += row[i] * q[i];
	}
	d = beta * (v - decay * rk);
	i = 0;
	for (; i + FAST_W <= n; i += FAST_W)
		vstore(row + i, vfma(vload(row + i), vset(decay), vmul(vset(d), vload(k + i))));
	for (; i < n; i++)
		row[i] = row[i] * decay + d * k[i];
	return decay * rq + d * kq;
}

const struct fast_kernels FAST_TABLE = {
	.name = FAST_NAME,
	.sum_squares = sum_squares,
	.scale = scale,
	.scale_mul = scale_mul,
	.add = add,
	.mul = mul,
	.glu = glu,
	.to_f16 = to_f16,
	.from_f16 = from_f16,
	.dot = dot,
	.dot_f16 = dot_f16,
	.axpy = axpy,
	.axpy_f16 = axpy_f16,
	.exp_sum = exp_sum,
	.rope_neox = rope_neox,
	.rope_norm = rope_norm,
	.unary = unary,
	.delta_row = delta_row,
};

#endif
