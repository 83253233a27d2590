/*
 * The row-wise ops: get_rows, rms_norm, rope, add, mul, scale, glu, unary,
 * copy. Each validates its tensors, then hands contiguous ranges of rows to
 * the pool; a row is computed by one thread, in one fixed order.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define F32 CPU_T(Q4KH_TYPE_F32)
#define F16 CPU_T(Q4KH_TYPE_F16)

/* Rows per part so that a part holds at least this many values. */
#define GRAIN_VALUES 16384

static int64_t grain(int64_t row_len)
{
	return row_len >= GRAIN_VALUES ? 1 : GRAIN_VALUES / row_len;
}

/* --- get_rows --- */

struct get_rows_job {
	const struct q4kh_tensor *table, *out;
	const int32_t *ids;
	float scale;
};

static void get_rows_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct get_rows_job *j = arg;
	int64_t k = j->table->ne[0];

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		float *o = (float *)cpu_row(j->out, r, 0, 0);

		cpu_dequant_row(j->table->type, cpu_row(j->table, j->ids[r], 0, 0),
		                o, k);
		for (int64_t i = 0; i < k; i++)
			o[i] *= j->scale;
	}
}

/* The checks of table and out that get_rows and get_rows_ext share. */
static q4kh_status get_rows_tensors(q4kh_device_ctx *dev,
                                    const struct q4kh_tensor *table, int64_t n,
                                    const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = cpu_tensor_check(dev, "get_rows table", table,
	                           cpu_supported_types())) ||
	    (st = cpu_tensor_shape(dev, "get_rows table", table, -1, -1, 1, 1)) ||
	    (st = cpu_tensor_check(dev, "get_rows out", out, F32)) ||
	    (st = cpu_tensor_disjoint(dev, "get_rows out", out, "table", table)))
		return st;
	return cpu_tensor_shape(dev, "get_rows out", out, table->ne[0], n, 1, 1);
}

q4kh_status cpu_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                         const int32_t *ids, int64_t n, float scale,
                         const struct q4kh_tensor *out)
{
	struct get_rows_job j = { table, out, ids, scale };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (n < 1 || !ids)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "get_rows: %lld ids at %p, expected at least one",
		                (long long)n, (const void *)ids);
	if ((st = get_rows_tensors(dev, table, n, out)))
		return st;
	for (int64_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= table->ne[1])
			return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
			                "get_rows: ids[%lld] = %d, expected 0 .. %lld",
			                (long long)i, ids[i],
			                (long long)table->ne[1] - 1);
	cpu_pool_run(dev->pool, n, grain(table->ne[0]), get_rows_task, &j);
	return Q4KH_OK;
}

q4kh_status cpu_get_rows_ext(q4kh_device_ctx *dev,
                             const struct q4kh_tensor *table,
                             const struct q4kh_tensor *ids, float scale,
                             const struct q4kh_tensor *out)
{
	struct get_rows_job j = { table, out, NULL, scale };
	int64_t n = ids ? ids->ne[0] : 1;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = get_rows_tensors(dev, table, n, out)) ||
	    (st = cpu_index_check(dev, "get_rows_ext ids", ids, n, table->ne[1])))
		return st;
	j.ids = (const int32_t *)cpu_row(ids, 0, 0, 0);
	cpu_pool_run(dev->pool, n, grain(table->ne[0]), get_rows_task, &j);
	return Q4KH_OK;
}

/* --- rms_norm --- */

struct rms_norm_job {
	const struct q4kh_tensor *x, *w, *out;
	double eps;
};

static void rms_norm_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct rms_norm_job *j = arg;
	const float *w = j->w ? (const float *)cpu_row(j->w, 0, 0, 0) : NULL;
	int64_t n = j->x->ne[0];

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		const float *x = (const float *)cpu_flat_row(j->x, r);
		float *o = (float *)cpu_flat_row(j->out, r);
		double sum = 0.0;
		float s;

		for (int64_t i = 0; i < n; i++)
			sum += (double)x[i] * (double)x[i];
		s = (float)(1.0 / sqrt(sum / (double)n + j->eps));
		/* ggml's order: scale first, then the weight (a separate mul). */
		for (int64_t i = 0; i < n; i++)
			o[i] = w ? x[i] * s * w[i] : x[i] * s;
	}
}

q4kh_status cpu_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *w, float eps,
                         const struct q4kh_tensor *out)
{
	struct rms_norm_job j = { x, w, out, eps };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cpu_tensor_check(dev, "rms_norm x", x, F32)) ||
	    (st = cpu_tensor_check(dev, "rms_norm out", out, F32)) ||
	    (st = cpu_tensor_shape(dev, "rms_norm out", out, x->ne[0], x->ne[1],
	                           x->ne[2], x->ne[3])) ||
	    (st = cpu_tensor_inplace(dev, "rms_norm out", out, "x", x)))
		return st;
	if (w && ((st = cpu_tensor_check(dev, "rms_norm w", w, F32)) ||
	          (st = cpu_tensor_shape(dev, "rms_norm w", w, x->ne[0], 1, 1, 1)) ||
	          (st = cpu_tensor_disjoint(dev, "rms_norm out", out, "w", w))))
		return st;
	if (!(eps >= 0.0f) || isinf(eps))
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "rms_norm: eps = %g, expected a finite value >= 0",
		                (double)eps);
	cpu_pool_run(dev->pool, cpu_nrows(x), grain(x->ne[0]), rms_norm_task, &j);
	return Q4KH_OK;
}

/* --- rope --- */

struct rope_job {
	const struct q4kh_tensor *x, *out;
	int32_t n_rot;
	q4kh_rope_mode mode;
	const double *cs; /* per token: n_rot/2 pairs of (cos, sin) */
};

static void rope_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct rope_job *j = arg;
	int64_t n_head = j->x->ne[1], hd = j->x->ne[0];
	int32_t half = j->n_rot / 2;
	/* NORM rotates neighbours, NEOX the two halves of the rotated part. */
	int64_t step = j->mode == Q4KH_ROPE_NORM ? 2 : 1;
	int64_t other = j->mode == Q4KH_ROPE_NORM ? 1 : half;

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		int64_t t = r / n_head;
		const float *x = (const float *)cpu_row(j->x, r % n_head, t, 0);
		float *o = (float *)cpu_row(j->out, r % n_head, t, 0);
		const double *cs = j->cs + 2 * half * t;

		for (int32_t i = 0; i < half; i++) {
			double a = x[i * step], b = x[i * step + other];
			double c = cs[2 * i], s = cs[2 * i + 1];

			o[i * step] = (float)(a * c - b * s);
			o[i * step + other] = (float)(a * s + b * c);
		}
		if (o != x)
			memcpy(o + j->n_rot, x + j->n_rot,
			       (size_t)(hd - j->n_rot) * sizeof(float));
	}
}

static q4kh_status rope_args(q4kh_device_ctx *dev,
                             const struct q4kh_rope_params *p, int64_t hd)
{
	if (p->mode != Q4KH_ROPE_NORM && p->mode != Q4KH_ROPE_NEOX)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "rope: mode %u, expected %d (NORM) or %d (NEOX)",
		                p->mode, Q4KH_ROPE_NORM, Q4KH_ROPE_NEOX);
	if (p->n_rot < 2 || p->n_rot % 2 || p->n_rot > hd)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "rope: n_rot = %d, expected an even number from 2 to "
		                "the head dimension %lld",
		                p->n_rot, (long long)hd);
	if (!(p->base > 0.0f) || isinf(p->base) || !isfinite(p->freq_scale) ||
	    !(p->freq_scale > 0.0f))
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "rope: base %g and freq_scale %g, expected a finite "
		                "base > 0 and a finite scale > 0",
		                (double)p->base, (double)p->freq_scale);
	if (!isfinite(p->ext_factor) || !isfinite(p->attn_factor) ||
	    !isfinite(p->beta_fast) || !isfinite(p->beta_slow) ||
	    (p->ext_factor != 0.0f &&
	     (p->n_ctx_orig < 1 || !(p->beta_fast > 0.0f) || !(p->beta_slow > 0.0f))))
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "rope: ext_factor %g, attn_factor %g, beta_fast %g, "
		                "beta_slow %g, n_ctx_orig %d: expected finite values, "
		                "and with ext_factor betas > 0 and n_ctx_orig > 0",
		                (double)p->ext_factor, (double)p->attn_factor,
		                (double)p->beta_fast, (double)p->beta_slow, p->n_ctx_orig);
	return Q4KH_OK;
}

/* YaRN's d(b): the pair index whose wavelength fits b times in n_ctx_orig. */
static double yarn_dim(const struct q4kh_rope_params *p, double beta)
{
	return p->n_rot * log(p->n_ctx_orig / (beta * 2.0 * M_PI)) /
	       (2.0 * log((double)p->base));
}

/* (cos, sin) per token and pair, by the formula in plugin.h, in double. */
static double *rope_table(const int32_t *pos, int64_t T,
                          const struct q4kh_rope_params *p, const float *ff)
{
	int32_t half = p->n_rot / 2;
	double *cs = malloc(sizeof(double) * 2 * (size_t)half * (size_t)T);
	double lo = 0.0, hi = 0.0, m = p->attn_factor;

	if (!cs)
		return NULL;
	if (p->ext_factor != 0.0f) {
		lo = fmax(0.0, floor(yarn_dim(p, p->beta_fast)));
		hi = fmin(p->n_rot - 1, ceil(yarn_dim(p, p->beta_slow)));
		m *= 1.0 + 0.1 * log(1.0 / p->freq_scale);
	}
	for (int64_t t = 0; t < T; t++) {
		for (int32_t i = 0; i < half; i++) {
			double extrap = (double)pos[t] * pow((double)p->base, -2.0 * i / p->n_rot) /
			                (ff ? ff[i] : 1.0);
			double theta = p->freq_scale * extrap;

			if (p->ext_factor != 0.0f) {
				double y = (i - lo) / fmax(0.001, hi - lo);
				double r = p->ext_factor * (1.0 - fmin(1.0, fmax(0.0, y)));

				theta = theta * (1.0 - r) + extrap * r;
			}
			cs[2 * (half * t + i)] = cos(theta) * m;
			cs[2 * (half * t + i) + 1] = sin(theta) * m;
		}
	}
	return cs;
}

/* rope of x over positions pos[0 .. x->ne[2]), after every check. */
static q4kh_status rope_run(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                            const int32_t *pos, const struct q4kh_rope_params *p,
                            const float *ff, const struct q4kh_tensor *out)
{
	struct rope_job j = { x, out, p->n_rot, (q4kh_rope_mode)p->mode, NULL };

	j.cs = rope_table(pos, x->ne[2], p, ff);
	if (!j.cs)
		return cpu_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                "rope: out of memory for %lld angles",
		                (long long)x->ne[2] * p->n_rot / 2);
	cpu_pool_run(dev->pool, x->ne[1] * x->ne[2], grain(x->ne[0]), rope_task,
	             &j);
	free((void *)j.cs);
	return Q4KH_OK;
}

/* The checks of x and out that rope and rope_ext share. */
static q4kh_status rope_tensors(q4kh_device_ctx *dev,
                                const struct q4kh_tensor *x,
                                const struct q4kh_tensor *out)
{
	q4kh_status st;

	if ((st = cpu_tensor_check(dev, "rope x", x, F32)) ||
	    (st = cpu_tensor_shape(dev, "rope x", x, -1, -1, -1, 1)) ||
	    (st = cpu_tensor_check(dev, "rope out", out, F32)))
		return st;
	if ((st = cpu_tensor_shape(dev, "rope out", out, x->ne[0], x->ne[1],
	                           x->ne[2], 1)))
		return st;
	return cpu_tensor_inplace(dev, "rope out", out, "x", x);
}

q4kh_status cpu_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                     const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                     float base, float freq_scale,
                     const struct q4kh_tensor *out)
{
	const struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = n_rot, .mode = (uint32_t)mode,
		.base = base, .freq_scale = freq_scale, .attn_factor = 1.0f,
	};
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!pos)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID, "rope: pos is NULL");
	if ((st = rope_tensors(dev, x, out)) || (st = rope_args(dev, &p, x->ne[0])))
		return st;
	return rope_run(dev, x, pos, &p, NULL, out);
}

q4kh_status cpu_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *pos,
                         const struct q4kh_rope_params *p,
                         const struct q4kh_tensor *out)
{
	const float *ff = NULL;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!p || p->struct_size < offsetof(struct q4kh_rope_params, freq_factors) +
	                                   sizeof(p->freq_factors))
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "rope_ext: params %s, expected a struct of at least "
		                "%zu bytes",
		                p ? "too small" : "NULL",
		                offsetof(struct q4kh_rope_params, freq_factors) +
		                        sizeof(p->freq_factors));
	if ((st = rope_tensors(dev, x, out)) || (st = rope_args(dev, p, x->ne[0])) ||
	    (st = cpu_index_check(dev, "rope_ext pos", pos, x->ne[2], INT32_MAX)))
		return st;
	if (p->freq_factors) {
		if ((st = cpu_tensor_check(dev, "rope_ext freq_factors", p->freq_factors,
		                           F32)) ||
		    (st = cpu_tensor_shape(dev, "rope_ext freq_factors", p->freq_factors,
		                           p->n_rot / 2, 1, 1, 1)))
			return st;
		ff = (const float *)cpu_row(p->freq_factors, 0, 0, 0);
	}
	return rope_run(dev, x, (const int32_t *)cpu_row(pos, 0, 0, 0), p, ff, out);
}

/* --- add, mul --- */

struct binary_job {
	const struct q4kh_tensor *a, *b, *out;
	int mul;
};

static void binary_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct binary_job *j = arg;
	const struct q4kh_tensor *a = j->a, *b = j->b;
	int64_t n = a->ne[0];

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2];
		int64_t i3 = r / (a->ne[1] * a->ne[2]);
		const float *x = (const float *)cpu_row(a, i1, i2, i3);
		const float *y = (const float *)cpu_row(b, i1 % b->ne[1],
		                                        i2 % b->ne[2], i3 % b->ne[3]);
		float *o = (float *)cpu_row(j->out, i1, i2, i3);
		int64_t ystep = b->ne[0] == 1 ? 0 : 1;

		if (j->mul)
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i] * y[i * ystep];
		else
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i] + y[i * ystep];
	}
}

static q4kh_status binary(q4kh_device_ctx *dev, const char *op,
                          const struct q4kh_tensor *a,
                          const struct q4kh_tensor *b,
                          const struct q4kh_tensor *out, int mul)
{
	struct binary_job j = { a, b, out, mul };
	char na[32], nb[32], no[32];
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	snprintf(na, sizeof(na), "%s a", op);
	snprintf(nb, sizeof(nb), "%s b", op);
	snprintf(no, sizeof(no), "%s out", op);
	if ((st = cpu_tensor_check(dev, na, a, F32)) ||
	    (st = cpu_tensor_check(dev, nb, b, F32)) ||
	    (st = cpu_tensor_check(dev, no, out, F32)) ||
	    (st = cpu_tensor_shape(dev, no, out, a->ne[0], a->ne[1], a->ne[2],
	                           a->ne[3])) ||
	    (st = cpu_tensor_inplace(dev, no, out, "a", a)) ||
	    (st = cpu_tensor_inplace(dev, no, out, "b", b)))
		return st;
	for (int i = 0; i < 4; i++)
		if (b->ne[i] != 1 && b->ne[i] != a->ne[i])
			return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
			                "%s: b->ne[%d] = %lld, expected 1 or a->ne[%d] "
			                "= %lld",
			                op, i, (long long)b->ne[i], i,
			                (long long)a->ne[i]);
	cpu_pool_run(dev->pool, cpu_nrows(a), grain(a->ne[0]), binary_task, &j);
	return Q4KH_OK;
}

q4kh_status cpu_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                    const struct q4kh_tensor *b, const struct q4kh_tensor *out)
{
	return binary(dev, "add", a, b, out, 0);
}

q4kh_status cpu_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                    const struct q4kh_tensor *b, const struct q4kh_tensor *out)
{
	return binary(dev, "mul", a, b, out, 1);
}

/* --- scale --- */

struct scale_job {
	const struct q4kh_tensor *x, *out;
	float s;
};

static void scale_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct scale_job *j = arg;

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		const float *x = (const float *)cpu_flat_row(j->x, r);
		float *o = (float *)cpu_flat_row(j->out, r);

		for (int64_t i = 0; i < j->x->ne[0]; i++)
			o[i] = x[i] * j->s;
	}
}

q4kh_status cpu_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      float s, const struct q4kh_tensor *out)
{
	struct scale_job j = { x, out, s };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cpu_tensor_check(dev, "scale x", x, F32)) ||
	    (st = cpu_tensor_check(dev, "scale out", out, F32)) ||
	    (st = cpu_tensor_shape(dev, "scale out", out, x->ne[0], x->ne[1],
	                           x->ne[2], x->ne[3])) ||
	    (st = cpu_tensor_inplace(dev, "scale out", out, "x", x)))
		return st;
	cpu_pool_run(dev->pool, cpu_nrows(x), grain(x->ne[0]), scale_task, &j);
	return Q4KH_OK;
}

/* --- glu --- */

struct glu_job {
	const struct q4kh_tensor *gate, *up, *out;
	q4kh_glu_kind kind;
};

/* 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), in double. */
static double gelu_tanh(double g)
{
	const double k = 0.79788456080286535587989211986876; /* sqrt(2/pi) */

	return 0.5 * g * (1.0 + tanh(k * (g + 0.044715 * g * g * g)));
}

static double silu(double g)
{
	return g / (1.0 + exp(-g));
}

static void glu_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct glu_job *j = arg;
	double (*act)(double) = j->kind == Q4KH_GLU_SILU ? silu : gelu_tanh;

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		const float *g = (const float *)cpu_flat_row(j->gate, r);
		const float *u = (const float *)cpu_flat_row(j->up, r);
		float *o = (float *)cpu_flat_row(j->out, r);

		for (int64_t i = 0; i < j->gate->ne[0]; i++)
			o[i] = (float)(act(g[i]) * (double)u[i]);
	}
}

q4kh_status cpu_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                    const struct q4kh_tensor *gate,
                    const struct q4kh_tensor *up,
                    const struct q4kh_tensor *out)
{
	struct glu_job j = { gate, up, out, kind };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (kind != Q4KH_GLU_GELU_TANH && kind != Q4KH_GLU_SILU)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "glu: kind %d, expected %d (GELU tanh) or %d (SiLU)",
		                (int)kind, Q4KH_GLU_GELU_TANH, Q4KH_GLU_SILU);
	if ((st = cpu_tensor_check(dev, "glu gate", gate, F32)) ||
	    (st = cpu_tensor_check(dev, "glu up", up, F32)) ||
	    (st = cpu_tensor_check(dev, "glu out", out, F32)) ||
	    (st = cpu_tensor_shape(dev, "glu up", up, gate->ne[0], gate->ne[1],
	                           gate->ne[2], gate->ne[3])) ||
	    (st = cpu_tensor_shape(dev, "glu out", out, gate->ne[0], gate->ne[1],
	                           gate->ne[2], gate->ne[3])) ||
	    (st = cpu_tensor_inplace(dev, "glu out", out, "gate", gate)) ||
	    (st = cpu_tensor_inplace(dev, "glu out", out, "up", up)))
		return st;
	cpu_pool_run(dev->pool, cpu_nrows(gate), grain(gate->ne[0]), glu_task, &j);
	return Q4KH_OK;
}

/* --- unary --- */

struct unary_job {
	const struct q4kh_tensor *x, *out;
	double (*f)(double);
};

static double sigmoid(double x)
{
	return 1.0 / (1.0 + exp(-x));
}

/* log(1 + exp(x)), without overflow for large x. */
static double softplus(double x)
{
	return x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static void unary_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct unary_job *j = arg;

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		const float *x = (const float *)cpu_flat_row(j->x, r);
		float *o = (float *)cpu_flat_row(j->out, r);

		for (int64_t i = 0; i < j->x->ne[0]; i++)
			o[i] = (float)j->f(x[i]);
	}
}

q4kh_status cpu_unary(q4kh_device_ctx *dev, q4kh_unary_kind kind,
                      const struct q4kh_tensor *x,
                      const struct q4kh_tensor *out)
{
	struct unary_job j = { x, out, NULL };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	switch (kind) {
	case Q4KH_UNARY_SIGMOID: j.f = sigmoid; break;
	case Q4KH_UNARY_SOFTPLUS: j.f = softplus; break;
	case Q4KH_UNARY_SILU: j.f = silu; break;
	default:
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "unary: kind %d, expected %d (sigmoid), %d (softplus) "
		                "or %d (SiLU)",
		                (int)kind, Q4KH_UNARY_SIGMOID, Q4KH_UNARY_SOFTPLUS,
		                Q4KH_UNARY_SILU);
	}
	if ((st = cpu_tensor_check(dev, "unary x", x, F32)) ||
	    (st = cpu_tensor_check(dev, "unary out", out, F32)) ||
	    (st = cpu_tensor_shape(dev, "unary out", out, x->ne[0], x->ne[1],
	                           x->ne[2], x->ne[3])) ||
	    (st = cpu_tensor_inplace(dev, "unary out", out, "x", x)))
		return st;
	cpu_pool_run(dev->pool, cpu_nrows(x), grain(x->ne[0]), unary_task, &j);
	return Q4KH_OK;
}

/* --- copy --- */

struct copy_job {
	const struct q4kh_tensor *src, *dst;
};

/* Convert N values of row S (type FROM) into row D (type TO). */
static void convert_row(uint32_t from, uint32_t to, const void *s, void *d,
                        int64_t n)
{
	const float *sf = s;
	const uint16_t *sh = s;
	float *df = d;
	uint16_t *dh = d;

	if (from == to)
		memmove(d, s, (size_t)n * q4kh_type_block_bytes(from));
	else if (from == Q4KH_TYPE_F32)
		for (int64_t i = 0; i < n; i++)
			dh[i] = q4kh_f32_to_fp16(sf[i]);
	else
		for (int64_t i = 0; i < n; i++)
			df[i] = q4kh_fp16_to_f32(sh[i]);
}

static void copy_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct copy_job *j = arg;

	(void)part;
	for (int64_t r = begin; r < end; r++)
		convert_row(j->src->type, j->dst->type, cpu_flat_row(j->src, r),
		            cpu_flat_row(j->dst, r), j->src->ne[0]);
}

q4kh_status cpu_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                     const struct q4kh_tensor *dst)
{
	struct copy_job j = { src, dst };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cpu_tensor_check(dev, "copy src", src, F32 | F16)) ||
	    (st = cpu_tensor_check(dev, "copy dst", dst, F32 | F16)) ||
	    (st = cpu_tensor_shape(dev, "copy dst", dst, src->ne[0], src->ne[1],
	                           src->ne[2], src->ne[3])) ||
	    (st = cpu_tensor_inplace(dev, "copy dst", dst, "src", src)))
		return st;
	cpu_pool_run(dev->pool, cpu_nrows(src), grain(src->ne[0]), copy_task, &j);
	return Q4KH_OK;
}

/* --- set_rows --- */

struct set_rows_job {
	const struct q4kh_tensor *src, *dst;
	const int32_t *rows;
};

/* Row r of src: index r % ne[1] of token r / ne[1]. */
static void set_rows_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct set_rows_job *j = arg;
	int64_t b = j->src->ne[1];

	(void)part;
	for (int64_t r = begin; r < end; r++)
		convert_row(j->src->type, j->dst->type,
		            cpu_row(j->src, r % b, r / b, 0),
		            cpu_row(j->dst, r % b, j->rows[r / b], 0), j->src->ne[0]);
}

q4kh_status cpu_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                         const struct q4kh_tensor *rows,
                         const struct q4kh_tensor *dst)
{
	struct set_rows_job j = { src, dst, NULL };
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cpu_tensor_check(dev, "set_rows src", src, F32)) ||
	    (st = cpu_tensor_shape(dev, "set_rows src", src, -1, -1, -1, 1)) ||
	    (st = cpu_tensor_check(dev, "set_rows dst", dst, F32 | F16)) ||
	    (st = cpu_tensor_shape(dev, "set_rows dst", dst, src->ne[0],
	                           src->ne[1], -1, 1)) ||
	    (st = cpu_tensor_disjoint(dev, "set_rows dst", dst, "src", src)) ||
	    (st = cpu_index_check(dev, "set_rows rows", rows, src->ne[2],
	                          dst->ne[2])) ||
	    (st = cpu_tensor_disjoint(dev, "set_rows dst", dst, "rows", rows)))
		return st;
	j.rows = (const int32_t *)cpu_row(rows, 0, 0, 0);
	cpu_pool_run(dev->pool, src->ne[1] * src->ne[2], grain(src->ne[0]),
	             set_rows_task, &j);
	return Q4KH_OK;
}
