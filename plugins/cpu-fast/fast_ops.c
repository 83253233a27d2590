/*
 * The row-wise ops: get_rows, rms_norm, add, mul, scale, glu, copy,
 * set_rows, add_rms_norm (ABI 1.4: add, then rms_norm of the sum),
 * norm_add_rms_norm (ABI 1.5: rms_norm of a in place first) and
 * top2 (ABI 1.4: the greedy pick of each column). Each checks its
 * tensors, then hands ranges of rows to the pool
 * (on the calling thread alone when they are few); the inner loops are the
 * instruction set's (fast_kernels.h).
 */
#include <math.h>
#include <string.h>

#include "fast.h"
#include "q4khost/top2.h"

/* --- get_rows --- */

struct get_rows_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *table, *out;
	const int32_t *ids;
	float scale;
};

static void get_rows_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct get_rows_job *j = arg;
	const int64_t n = j->table->ne[0];

	(void)thread;
	for (int64_t r = begin; r < end; r++) {
		float *o = (float *)q4kh_cpu_at(j->out, r, 0, 0);
		const void *row = q4kh_cpu_at(j->table, j->ids[r], 0, 0);

		if (j->table->type == Q4KH_TYPE_F16)
			j->k->from_f16(row, o, n);
		else
			q4kh_dequant_row(j->table->type, row, o, n);
		if (j->scale != 1.0f)
			j->k->scale(o, j->scale, o, n);
	}
}

static q4kh_status get_rows_run(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                                const int32_t *ids, int64_t n, float scale,
                                const struct q4kh_tensor *out)
{
	struct get_rows_job j = { dev->k, table, out, ids, scale };

	q4kh_pool_run(dev->pool, n, fast_grain(table->ne[0]), get_rows_task, &j);
	return Q4KH_OK;
}

q4kh_status fast_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                          const int32_t *ids, int64_t n, float scale,
                          const struct q4kh_tensor *out)
{
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_get_rows(&c, table, ids, n, out)))
		return st;
	return get_rows_run(dev, table, ids, n, scale, out);
}

q4kh_status fast_get_rows_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                              const struct q4kh_tensor *ids, float scale,
                              const struct q4kh_tensor *out)
{
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_get_rows_ext(&c, table, ids, out)) ||
	    (st = fast_index_values(dev, "get_rows_ext ids", ids, table->ne[1])))
		return st;
	return get_rows_run(dev, table, (const int32_t *)q4kh_cpu_at(ids, 0, 0, 0), ids->ne[0],
	                    scale, out);
}

/* --- rms_norm, add_rms_norm --- */

struct rms_norm_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *x, *out;
	const struct q4kh_tensor *a; /* add_rms_norm: x += a first; else NULL */
	const float *w;
	double eps;
	int norm_a;       /* norm_add_rms_norm: a normed in place before the add */
	const float *w_a; /* its weight, or NULL */
	double eps_a;
};

/* rms_norm's arithmetic on row X of N values into O (may be X). */
static void norm_row(const struct fast_kernels *k, float *x, const float *w, double eps,
                     float *o, int64_t n)
{
	const float s = (float)(1.0 / sqrt((double)k->sum_squares(x, n) / (double)n + eps));

	if (w)
		k->scale_mul(x, s, w, o, n);
	else
		k->scale(x, s, o, n);
}

static void rms_norm_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct rms_norm_job *j = arg;
	const int64_t n = j->x->ne[0];

	(void)thread;
	for (int64_t r = begin; r < end; r++) {
		float *x = (float *)q4kh_cpu_flat_row(j->x, r);
		float *o = (float *)q4kh_cpu_flat_row(j->out, r);

		/* a's own norm first (norm_add_rms_norm), then add's kernel on
		 * the row the norm then reads (out may be a: the sum is
		 * complete before the first write of out) */
		if (j->norm_a)
			norm_row(j->k, (float *)q4kh_cpu_flat_row(j->a, r), j->w_a, j->eps_a,
			         (float *)q4kh_cpu_flat_row(j->a, r), n);
		if (j->a)
			j->k->add(x, (const float *)q4kh_cpu_flat_row(j->a, r), x, n);
		norm_row(j->k, x, j->w, j->eps, o, n);
	}
}

q4kh_status fast_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w, float eps,
                          const struct q4kh_tensor *out)
{
	struct rms_norm_job j = { dev ? dev->k : NULL, x, out, NULL, NULL, eps, 0, NULL, 0.0 };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rms_norm(&c, x, w, eps, out)))
		return st;
	j.w = w ? (const float *)q4kh_cpu_at(w, 0, 0, 0) : NULL;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), fast_grain(x->ne[0]), rms_norm_task, &j);
	return Q4KH_OK;
}

q4kh_status fast_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *a, const struct q4kh_tensor *w,
                              float eps, const struct q4kh_tensor *out)
{
	struct rms_norm_job j = { dev ? dev->k : NULL, x, out, a, NULL, eps, 0, NULL, 0.0 };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_add_rms_norm(&c, x, a, w, eps, out)))
		return st;
	j.w = w ? (const float *)q4kh_cpu_at(w, 0, 0, 0) : NULL;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), fast_grain(x->ne[0]), rms_norm_task, &j);
	return Q4KH_OK;
}

q4kh_status fast_norm_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                   const struct q4kh_tensor *a, const struct q4kh_tensor *w_a,
                                   float eps_a, const struct q4kh_tensor *w, float eps,
                                   const struct q4kh_tensor *out)
{
	struct rms_norm_job j = { dev ? dev->k : NULL, x, out, a, NULL, eps, 1, NULL, eps_a };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_norm_add_rms_norm(&c, x, a, w_a, eps_a, w, eps, out)))
		return st;
	j.w = w ? (const float *)q4kh_cpu_at(w, 0, 0, 0) : NULL;
	j.w_a = w_a ? (const float *)q4kh_cpu_at(w_a, 0, 0, 0) : NULL;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), fast_grain(x->ne[0]), rms_norm_task, &j);
	return Q4KH_OK;
}

/* --- add, mul, scale --- */

struct binary_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *a, *b, *out;
	int mul;
};

static void binary_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct binary_job *j = arg;
	const struct q4kh_tensor *a = j->a, *b = j->b;
	const int64_t n = a->ne[0];

	(void)thread;
	for (int64_t r = begin; r < end; r++) {
		const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2];
		const int64_t i3 = r / (a->ne[1] * a->ne[2]);
		const float *x = (const float *)q4kh_cpu_at(a, i1, i2, i3);
		const float *y = (const float *)q4kh_cpu_at(b, i1 % b->ne[1], i2 % b->ne[2],
		                                        i3 % b->ne[3]);
		float *o = (float *)q4kh_cpu_at(j->out, i1, i2, i3);

		if (b->ne[0] == 1 && n > 1) { /* one value of b per row */
			for (int64_t i = 0; i < n; i++)
				o[i] = j->mul ? x[i] * y[0] : x[i] + y[0];
		} else if (j->mul) {
			j->k->mul(x, y, o, n);
		} else {
			j->k->add(x, y, o, n);
		}
	}
}

static q4kh_status binary(q4kh_device_ctx *dev, const char *op, const struct q4kh_tensor *a,
                          const struct q4kh_tensor *b, const struct q4kh_tensor *out,
                          int mul)
{
	struct binary_job j = { dev ? dev->k : NULL, a, b, out, mul };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_binary(&c, op, a, b, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(a), fast_grain(a->ne[0]), binary_task, &j);
	return Q4KH_OK;
}

q4kh_status fast_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b, const struct q4kh_tensor *out)
{
	return binary(dev, "add", a, b, out, 0);
}

q4kh_status fast_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b, const struct q4kh_tensor *out)
{
	return binary(dev, "mul", a, b, out, 1);
}

struct scale_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *x, *out;
	float s;
};

static void scale_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct scale_job *j = arg;

	(void)thread;
	for (int64_t r = begin; r < end; r++)
		j->k->scale((const float *)q4kh_cpu_flat_row(j->x, r), j->s,
		            (float *)q4kh_cpu_flat_row(j->out, r), j->x->ne[0]);
}

q4kh_status fast_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x, float s,
                       const struct q4kh_tensor *out)
{
	struct scale_job j = { dev ? dev->k : NULL, x, out, s };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_scale(&c, x, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(x), fast_grain(x->ne[0]), scale_task, &j);
	return Q4KH_OK;
}

/* --- glu --- */

struct glu_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *gate, *up, *out;
	q4kh_glu_kind kind;
};

static void glu_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct glu_job *j = arg;

	(void)thread;
	for (int64_t r = begin; r < end; r++)
		j->k->glu(j->kind, (const float *)q4kh_cpu_flat_row(j->gate, r),
		          (const float *)q4kh_cpu_flat_row(j->up, r),
		          (float *)q4kh_cpu_flat_row(j->out, r), j->gate->ne[0]);
}

q4kh_status fast_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                     const struct q4kh_tensor *gate, const struct q4kh_tensor *up,
                     const struct q4kh_tensor *out)
{
	struct glu_job j = { dev ? dev->k : NULL, gate, up, out, kind };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_glu(&c, kind, gate, up, out)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(gate), fast_grain(gate->ne[0]), glu_task, &j);
	return Q4KH_OK;
}

/* --- copy, set_rows --- */

void fast_convert(const struct fast_kernels *k, uint32_t from, uint32_t to, const void *s,
                  void *d, int64_t n)
{
	if (from == to)
		memmove(d, s, (size_t)n * q4kh_type_block_bytes(from));
	else if (from == Q4KH_TYPE_F32)
		k->to_f16(s, d, n);
	else
		k->from_f16(s, d, n);
}

struct copy_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *src, *dst;
	const int32_t *rows; /* set_rows: token t's row of dst; NULL: copy */
};

static void copy_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct copy_job *j = arg;
	const struct q4kh_tensor *s = j->src, *d = j->dst;

	(void)thread;
	for (int64_t r = begin; r < end; r++)
		fast_convert(j->k, s->type, d->type, q4kh_cpu_flat_row(s, r),
		        j->rows ? q4kh_cpu_at(d, r % s->ne[1], j->rows[r / s->ne[1]], 0)
		                : q4kh_cpu_flat_row(d, r),
		        s->ne[0]);
}

q4kh_status fast_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                      const struct q4kh_tensor *dst)
{
	struct copy_job j = { dev ? dev->k : NULL, src, dst, NULL };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_copy(&c, src, dst)))
		return st;
	q4kh_pool_run(dev->pool, q4kh_cpu_rows(src), fast_grain(src->ne[0]), copy_task, &j);
	return Q4KH_OK;
}

q4kh_status fast_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                          const struct q4kh_tensor *rows, const struct q4kh_tensor *dst)
{
	struct copy_job j = { dev ? dev->k : NULL, src, dst, NULL };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_set_rows(&c, src, rows, dst)) ||
	    (st = fast_index_values(dev, "set_rows rows", rows, dst->ne[2])))
		return st;
	j.rows = (const int32_t *)q4kh_cpu_at(rows, 0, 0, 0);
	q4kh_pool_run(dev->pool, src->ne[1] * src->ne[2], fast_grain(src->ne[0]), copy_task,
	              &j);
	return Q4KH_OK;
}

/* --- top2 --- */

struct top2_job {
	const struct q4kh_tensor *x, *idx, *val;
};

/* Columns [begin, end) of x: each the scan of the host's q4kh_top2
 * (q4khost/top2.h), which plugin.h's top2 contract defines. */
static void top2_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct top2_job *j = arg;

	(void)thread;
	for (int64_t t = begin; t < end; t++)
		((int32_t *)q4kh_cpu_at(j->idx, 0, 0, 0))[t] =
			q4kh_top2_scan((const float *)q4kh_cpu_flat_row(j->x, t), j->x->ne[0],
			               (float *)q4kh_cpu_flat_row(j->val, t));
}

q4kh_status fast_top2(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const struct q4kh_tensor *idx, const struct q4kh_tensor *val)
{
	struct top2_job j = { x, idx, val };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_top2(&c, x, idx, val)))
		return st;
	q4kh_pool_run(dev->pool, x->ne[1], fast_grain(x->ne[0]), top2_task, &j);
	return Q4KH_OK;
}
