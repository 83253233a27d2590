/*
 * The built-in matrix product, for the weight types no kernel variant
 * serves: each weight row decoded to f32 once (the reference's exact
 * decoders, sdk/lib/dequant.c) into the thread's scratch, then one
 * f32 SIMD dot product per column. F32 and F16 rows are read in place.
 * The step graph's fused form (fast_graph.c) adds each product value
 * into a residual as it is made: one f32 addition, add's.
 */
#include "fast.h"

struct matmul_job {
	q4kh_device_ctx *dev;
	const struct q4kh_tensor *w, *x, *y;
	const struct q4kh_tensor *r; /* r += y as it is made, or NULL */
};

static void matmul_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct matmul_job *j = arg;
	const struct fast_kernels *k = j->dev->k;
	const int64_t K = j->w->ne[0], T = j->x->ne[1];
	const uint32_t type = j->w->type;
	float *scratch = j->dev->scratch.part[thread];

	for (int64_t r = begin; r < end; r++) {
		const void *w = q4kh_cpu_at(j->w, r, 0, 0);
		const float *row = type == Q4KH_TYPE_F32 ? w : scratch;

		if (type != Q4KH_TYPE_F32 && type != Q4KH_TYPE_F16)
			q4kh_dequant_row(type, w, scratch, K);
		for (int64_t t = 0; t < T; t++) {
			const float *x = (const float *)q4kh_cpu_at(j->x, t, 0, 0);

			const float v = type == Q4KH_TYPE_F16 ? k->dot_f16(x, w, K) : k->dot(row, x, K);

			((float *)q4kh_cpu_at(j->y, t, 0, 0))[r] = v;
			if (j->r)
				((float *)q4kh_cpu_at(j->r, t, 0, 0))[r] += v;
		}
	}
}

q4kh_status fast_mul_mat_add(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                             const struct q4kh_tensor *x, const struct q4kh_tensor *y,
                             const struct q4kh_tensor *r)
{
	struct matmul_job j = { dev, w, x, y, r };
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_mul_mat(&c, w, x, y)) ||
	    (r && (st = q4kh_check_binary(&c, "add", r, y, r))) ||
	    (st = fast_scratch(dev, sizeof(float) * (uint64_t)w->ne[0])))
		return st;
	q4kh_pool_run(dev->pool, w->ne[1], fast_grain(w->ne[0] * x->ne[1]), matmul_task, &j);
	return Q4KH_OK;
}

q4kh_status fast_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                         const struct q4kh_tensor *x, const struct q4kh_tensor *y)
{
	return fast_mul_mat_add(dev, w, x, y, NULL);
}
