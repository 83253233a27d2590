/*
 * Test plugin: a realistic kernel variant for the "cpu" backend. Q4_K
 * weights times activations quantised to int8 blocks of 32 values (one
 * float scale per block, as Q8_0/Q8_1 do), with integer dot products per
 * 32-value sub-block, then scaled: the CPU twin of the GPU dp4a variants.
 * It is correct but lossy, so it exercises the kernel-variant path (prepare,
 * gemv, gemm, release) and gives the parity guard a variant that must pass.
 *
 * Built twice more for tests/test_serve.c (one source, one module each):
 *   -DQ8ACT_GATE: its first product waits until the file named by
 *     $Q4KH_TEST_GATE exists (at most 10 minutes), so a test decides when
 *     an F2 measurement of it may end; and every product waits while the
 *     file named by $Q4KH_TEST_HOLD exists (at most 10 minutes), so a test
 *     holds a served request in flight;
 *   -DQ8ACT_TAIL: a planted defect that shows only on some prompts: in a
 *     batch of more than 64 columns that is no multiple of 8, the columns
 *     past the last multiple of 8 come out scaled by -50 (a tail-handling
 *     bug), so every step of F2's 64-token probe passes (its prefill, decode,
 *     batched and narrow steps) and a 76-token prompt does not.
 *   -DQ8ACT_IQ4NL (as "cpu-iq4nl"): it lists only IQ4_NL, a type of none
 *     of the test models: a variant that is not applicable to them, whose
 *     products must never be called (they would treat the blocks as Q4_K).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

/* The one weight type it lists. */
#ifdef Q8ACT_IQ4NL
#define Q8ACT_TYPE Q4KH_TYPE_IQ4_NL
#else
#define Q8ACT_TYPE Q4KH_TYPE_Q4_K
#endif

struct q4kh_kernel_ctx {
	char error[256];
};

struct q4kh_prepared {
	const struct q4kh_block_q4_k *blocks; /* the backend's copy, not repacked */
	int64_t k, n;
	int64_t row_bytes;
};

static __thread char init_error[256];

static q4kh_status fail(q4kh_kernel_ctx *ctx, q4kh_status st, const char *msg)
{
	char *dst = ctx ? ctx->error : init_error;
	strncpy(dst, msg, 255);
	dst[255] = 0;
	return st;
}

static q4kh_status k_init(const struct q4kh_host_api *host,
                          q4kh_kernel_ctx **out)
{
	(void)host;
	*out = calloc(1, sizeof(**out));
	return *out ? Q4KH_OK : fail(NULL, Q4KH_ERR_NOMEM, "out of memory");
}

static void k_shutdown(q4kh_kernel_ctx *ctx)
{
	free(ctx);
}

static const char *k_last_error(q4kh_kernel_ctx *ctx)
{
	return ctx ? ctx->error : init_error;
}

static uint32_t k_score(q4kh_kernel_ctx *ctx,
                        const struct q4kh_device_record *dev, uint32_t type)
{
	(void)ctx;
	(void)dev;
	return type == Q8ACT_TYPE ? 1 : 0;
}

static q4kh_status k_prepare(q4kh_kernel_ctx *ctx,
                             const struct q4kh_native_device *dev,
                             const struct q4kh_tensor *w, q4kh_prepared **out)
{
	struct q4kh_prepared *p;

	if (w->type != Q4KH_TYPE_Q4_K || w->ne[0] % Q4KH_QK_K || w->ne[2] != 1)
		return fail(ctx, Q4KH_ERR_UNSUPPORTED, "prepare: only 2-D Q4_K weights");
	p = calloc(1, sizeof(*p));
	if (!p)
		return fail(ctx, Q4KH_ERR_NOMEM, "out of memory");
	p->blocks = (const void *)((const char *)dev->address(w->buffer) + w->offset);
	p->k = w->ne[0];
	p->n = w->ne[1];
	p->row_bytes = w->nb[1];
	*out = p;
	return Q4KH_OK;
}

/* Sub-block j's 6-bit scale and min (quant.h). */
static void scale_min(const uint8_t *q, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

/* One activation column as int8 blocks of 32 with a scale and a sum each. */
static void quantize_column(const float *x, int64_t k, int8_t *q, float *d,
                            int32_t *sum)
{
	for (int64_t b = 0; b < k / 32; b++) {
		float amax = 0;
		for (int i = 0; i < 32; i++)
			amax = fmaxf(amax, fabsf(x[b * 32 + i]));
		d[b] = amax / 127.0f;
		sum[b] = 0;
		for (int i = 0; i < 32; i++) {
			int v = d[b] > 0 ? (int)lrintf(x[b * 32 + i] / d[b]) : 0;
			q[b * 32 + i] = (int8_t)v;
			sum[b] += v;
		}
	}
}

static float row_dot(const struct q4kh_block_q4_k *row, int64_t k,
                     const int8_t *q, const float *d, const int32_t *sum)
{
	float acc = 0;

	for (int64_t s = 0; s < k / Q4KH_QK_K; s++) {
		const struct q4kh_block_q4_k *b = &row[s];
		float bd = q4kh_fp16_to_f32(b->d), bmin = q4kh_fp16_to_f32(b->dmin);
		for (int j = 0; j < 8; j++) {
			const int64_t blk = s * 8 + j;
			const uint8_t *qs = b->qs + 32 * (j / 2);
			int sc, m, dot = 0;

			scale_min(b->scales, j, &sc, &m);
			for (int i = 0; i < 32; i++) {
				int nib = j % 2 ? qs[i] >> 4 : qs[i] & 0xF;
				dot += nib * q[blk * 32 + i];
			}
			/* x = d*sc*q - dmin*m, summed against a = d_a * q_a. */
			acc += d[blk] * (bd * sc * dot - bmin * m * sum[blk]);
		}
	}
	return acc;
}

#ifdef Q8ACT_GATE
static void wait_for_gate(void)
{
	static int opened;
	const char *gate = getenv("Q4KH_TEST_GATE"), *hold = getenv("Q4KH_TEST_HOLD");

	for (int i = 0; gate && !opened && i < 10 * 60 * 50 && access(gate, F_OK); i++)
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
	opened = 1;
	for (int i = 0; hold && i < 10 * 60 * 50 && !access(hold, F_OK); i++)
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
}
#endif

static q4kh_status k_apply(q4kh_kernel_ctx *ctx,
                           const struct q4kh_native_device *dev,
                           q4kh_prepared *w, const struct q4kh_tensor *x,
                           const struct q4kh_tensor *y)
{
	const int64_t k = w->k, blocks = k / 32;
	int8_t *q;
	float *d;
	int32_t *sum;

	if (x->type != Q4KH_TYPE_F32 || y->type != Q4KH_TYPE_F32 ||
	    x->ne[0] != k || y->ne[0] != w->n || x->ne[1] != y->ne[1])
		return fail(ctx, Q4KH_ERR_INVALID, "gemv: shapes or types do not match the weight");
#ifdef Q8ACT_GATE
	wait_for_gate();
#endif
	q = malloc((size_t)k);
	d = malloc(sizeof(float) * (size_t)blocks);
	sum = malloc(sizeof(int32_t) * (size_t)blocks);
	if (!q || !d || !sum) {
		free(q);
		free(d);
		free(sum);
		return fail(ctx, Q4KH_ERR_NOMEM, "out of memory");
	}
	for (int64_t t = 0; t < x->ne[1]; t++) {
		const float *xt = (const float *)((const char *)dev->address(x->buffer) +
		                                  x->offset + t * x->nb[1]);
		float *yt = (float *)((char *)dev->address(y->buffer) + y->offset +
		                      t * y->nb[1]);
		quantize_column(xt, k, q, d, sum);
		for (int64_t r = 0; r < w->n; r++)
			yt[r] = row_dot((const void *)((const char *)w->blocks + r * w->row_bytes),
			                k, q, d, sum);
#ifdef Q8ACT_TAIL
		if (x->ne[1] > 64 && x->ne[1] % 8 && t >= x->ne[1] / 8 * 8)
			for (int64_t r = 0; r < w->n; r++)
				yt[r] *= -50.0f;
#endif
	}
	free(q);
	free(d);
	free(sum);
	return Q4KH_OK;
}

static void k_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w)
{
	(void)ctx;
	free(w);
}

static const uint32_t types[] = { Q8ACT_TYPE };

static const struct q4kh_kernel_v1 table = {
	.struct_size = sizeof(table),
	.n_types = 1,
	.backend = "cpu",
	.types = types,
	.max_gemv_columns = 8,
	.init = k_init,
	.shutdown = k_shutdown,
	.last_error = k_last_error,
	.score = k_score,
	.prepare = k_prepare,
	.gemv = k_apply,
	.gemm = k_apply,
	.release = k_release,
	/* what it does (and serve-tail claims): int8 activations */
	.arith = Q4KH_ARITH_INT8,
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_KERNEL,
#ifndef Q8ACT_NAME
#define Q8ACT_NAME "cpu-q8act"
#endif
	.name = Q8ACT_NAME,
	.version = "1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
	.kernel = &table,
};

__attribute__((visibility("default"))) const struct q4kh_plugin_desc *
q4kh_plugin_entry_v1(void)
{
	return &desc;
}
