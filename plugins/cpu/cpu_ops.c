/*
 * The row-wise ops: get_rows, rms_norm, rope, add, mul, scale, glu, unary,
 * copy. Each validates its tensors, then hands contiguous ranges of rows to
 * the pool; a row is computed by one thread, in one fixed order.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "q4khost/glu.h"

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
		float *o = (float *)q4kh_cpu_at(j->out, r, 0, 0);

		q4kh_dequant_row(j->table->type, q4kh_cpu_at(j->table, j->ids[r], 0, 0),
		                 o, k);
		for (int64_t i = 0; i < k; i++)
			o[i] *= j->scale;
	}
}

q4kh_status cpu_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                         const int32_t *ids, int64_t n, float scale,
                         const struct q4kh_tensor *out)
{
	struct get_rows_job j = { table, out, ids, scale };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_get_rows(&c, table, ids, n, out)))
		return st;
	q4kh_pool_run(dev->pool, n, grain(table->ne[0]), get_rows_task, &j);
	return Q4KH_OK;
}

q4kh_status cpu_get_rows_ext(q4kh_device_ctx *dev,
                             const struct q4kh_tensor *table,
                             const struct q4kh_tensor *ids, float scale,
                             const struct q4kh_tensor *out)
{
	struct get_rows_job j = { table, out, NULL, scale };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_get_rows_ext(&c, table, ids, out)) ||
	    (st = cpu_index_values(dev, "get_rows_ext ids", ids, table->ne[1])))
		return st;
	j.ids = (const int32_t *)q4kh_cpu_at(ids, 0, 0, 0);
	q4kh_pool_run(dev->pool, ids->ne[0], grain(table->ne[0]), get_rows_task, &j);
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
	const float *w = j->w ? (const float *)q4kh_cpu_at(j->w, 0, 0, 0) : NULL;
	int64_t n = j->x->ne[0];

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		const float *x = (const float *)q4kh_cpu_flat_row(j->x, r);
		float *o = (float *)q4kh_cpu_flat_row(j->out, r);
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
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rms_norm(&c, x, w, eps, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), grain(x->ne[0]), rms_norm_task, &j);
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
		const float *x = (const float *)q4kh_cpu_at(j->x, r % n_head, t, 0);
		float *o = (float *)q4kh_cpu_at(j->out, r % n_head, t, 0);
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
	q4kh_pool_run(dev->pool, x->ne[1] * x->ne[2], grain(x->ne[0]), rope_task,
	              &j);
	free((void *)j.cs);
	return Q4KH_OK;
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
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope(&c, x, pos, n_rot, mode, base, freq_scale, out)))
		return st;
	return rope_run(dev, x, pos, &p, NULL, out);
}

q4kh_status cpu_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *pos,
                         const struct q4kh_rope_params *p,
                         const struct q4kh_tensor *out)
{
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope_ext(&c, x, pos, p, out)) ||
	    (st = cpu_index_values(dev, "rope_ext pos", pos, INT32_MAX)))
		return st;
	return rope_run(dev, x, (const int32_t *)q4kh_cpu_at(pos, 0, 0, 0), p,
	                p->freq_factors ? (const float *)q4kh_cpu_at(p->freq_factors, 0, 0, 0)
	                                : NULL,
	                out);
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
		const float *x = (const float *)q4kh_cpu_at(a, i1, i2, i3);
		const float *y = (const float *)q4kh_cpu_at(b, i1 % b->ne[1],
		                                        i2 % b->ne[2], i3 % b->ne[3]);
		float *o = (float *)q4kh_cpu_at(j->out, i1, i2, i3);
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
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_binary(&c, op, a, b, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(a), grain(a->ne[0]), binary_task, &j);
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
		const float *x = (const float *)q4kh_cpu_flat_row(j->x, r);
		float *o = (float *)q4kh_cpu_flat_row(j->out, r);

		for (int64_t i = 0; i < j->x->ne[0]; i++)
			o[i] = x[i] * j->s;
	}
}

q4kh_status cpu_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      float s, const struct q4kh_tensor *out)
{
	struct scale_job j = { x, out, s };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_scale(&c, x, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), grain(x->ne[0]), scale_task, &j);
	return Q4KH_OK;
}

/* --- glu --- */

struct glu_job {
	const struct q4kh_tensor *gate, *up, *out;
	q4kh_glu_kind kind;
};

static void glu_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct glu_job *j = arg;

	(void)part;
	for (int64_t r = begin; r < end; r++) {
		const float *g = (const float *)q4kh_cpu_flat_row(j->gate, r);
		const float *u = (const float *)q4kh_cpu_flat_row(j->up, r);
		float *o = (float *)q4kh_cpu_flat_row(j->out, r);

		for (int64_t i = 0; i < j->gate->ne[0]; i++)
			o[i] = q4kh_glu_value(j->kind, g[i], u[i]);
	}
}

q4kh_status cpu_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                    const struct q4kh_tensor *gate,
                    const struct q4kh_tensor *up,
                    const struct q4kh_tensor *out)
{
	struct glu_job j = { gate, up, out, kind };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_glu(&c, kind, gate, up, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(gate), grain(gate->ne[0]), glu_task, &j);
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
		const float *x = (const float *)q4kh_cpu_flat_row(j->x, r);
		float *o = (float *)q4kh_cpu_flat_row(j->out, r);

		for (int64_t i = 0; i < j->x->ne[0]; i++)
			o[i] = (float)j->f(x[i]);
	}
}

q4kh_status cpu_unary(q4kh_device_ctx *dev, q4kh_unary_kind kind,
                      const struct q4kh_tensor *x,
                      const struct q4kh_tensor *out)
{
	struct unary_job j = { x, out, NULL };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_unary(&c, kind, x, out)))
		return st;
	j.f = kind == Q4KH_UNARY_SIGMOID ? sigmoid
	      : kind == Q4KH_UNARY_SOFTPLUS ? softplus
	                                    : q4kh_silu;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), grain(x->ne[0]), unary_task, &j);
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
		convert_row(j->src->type, j->dst->type, q4kh_cpu_flat_row(j->src, r),
		            q4kh_cpu_flat_row(j->dst, r), j->src->ne[0]);
}

q4kh_status cpu_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                     const struct q4kh_tensor *dst)
{
	struct copy_job j = { src, dst };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_copy(&c, src, dst)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(src), grain(src->ne[0]), copy_task, &j);
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
		            q4kh_cpu_at(j->src, r % b, r / b, 0),
		            q4kh_cpu_at(j->dst, r % b, j->rows[r / b], 0), j->src->ne[0]);
}

q4kh_status cpu_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                         const struct q4kh_tensor *rows,
                         const struct q4kh_tensor *dst)
{
	struct set_rows_job j = { src, dst, NULL };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_set_rows(&c, src, rows, dst)) ||
	    (st = cpu_index_values(dev, "set_rows rows", rows, dst->ne[2])))
		return st;
	j.rows = (const int32_t *)q4kh_cpu_at(rows, 0, 0, 0);
	q4kh_pool_run(dev->pool, src->ne[1] * src->ne[2], grain(src->ne[0]),
	              set_rows_task, &j);
	return Q4KH_OK;
}
