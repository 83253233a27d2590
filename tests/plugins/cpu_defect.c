/*
 * Test plugins with planted defects, for the F2 guard to catch. One source,
 * one module per defect (the Makefile passes -DDEFECT_NAME and -DDEFECT_x).
 * Each is a kernel variant for the "cpu" backend that multiplies Q8_0
 * weights correctly (dequantised, fp32 partial sums) and then spoils
 * the result in its own way:
 *   biased: adds +-1 RMS to alternate logits of the LM head: cosine ~0.71,
 *           broken;
 *   noisy:  adds Gaussian noise of 0.4 RMS to LM-head logits well under
 *           the top one: cosine ~0.93, argmax unchanged;
 *   nan:    one NaN logit per LM-head column;
 *   flip:   sinks each column's top logit: argmax changes, cosine ~1;
 *   kv:     correct in prefill and in the first 4 decode steps, then
 *           scales the value projection by -20 (a KV-cache defect):
 *           the Q8_0 attn_v of the default model; the tiny fixtures have
 *           no Q8_0 layer matrix, so there it spoils nothing;
 *   late:   correct at every position below LATE_POSITION (600), biased
 *           as "biased" from there on (a kernel that goes wrong in a long
 *           context): past the built-in probe's 72 positions;
 *   decode9: correct in prefill and in the first 8 decode steps, biased
 *           from the 9th (decode step 8) on: past the 8 decode steps
 *           F2 runs by default;
 *   batched: correct when called with one column, biased with more (a
 *           batched kernel wrong where the one-column one is right);
 *   narrow: correct with one column and with more than 8, biased with 2
 *           to 8 (a GEMV tile of several columns that is wrong: a short
 *           prompt's chunk or a batched decode step of several sequences,
 *           which F2's wide prefill and one-column decode never take).
 *   abort:  says so on stderr and aborts in its first matmul, as a
 *           runtime's failed assertion does; hang: sleeps forever in it;
 *   fail:   fails its first matmul with an error (the product cannot run),
 *           so that the measurement ends without a verdict (F2.4);
 *   hog:    in its first matmul touches memory 16 MiB at a time, up to
 *           HOG_MIB more, then sleeps until killed (the bound keeps a host
 *           whose memory limit failed safe; its time limit then ends it);
 *   slow:   right, but sleeps SLOW_MS for each column of the LM head, as
 *           a kernel far slower than its time limit allows: a deep
 *           measurement's estimate foresees the limit.
 * The LM head is told apart as the weight with the most rows (>= 4096): its
 * rows are the vocabulary, more than any layer matrix has in the models the
 * tests run (the default model's 262144 over its FFN's 2048; the tiny
 * fixtures' 4107 or more over their FFN's 768), so the defects fire on
 * both.
 * Each declares the arithmetic it claims, f32 (its products' own): F2
 * then holds it to the f32 floor, and a declaration must never save a
 * defect, however fine the class it claims.
 *
 * A kernel variant is told no positions: it sees its weight and the columns
 * of each call, nothing else. So late, decode9 and kv key on what it can
 * count, as a kernel keeping per-weight state could: kv and decode9 on the
 * single-column calls a weight has had (the decode steps, when the prefill
 * has two columns or more in every call), late on the columns the LM head
 * has multiplied before the one at hand. In F2's measurement that count
 * is the position: each validation child runs one sequence, from position
 * 0, on a fresh load of the plugin, and asks for the logits of every
 * position (the prefill in chunks of n_batch columns, then one column a
 * decode step). Outside F2 (a run's prefill computes the last position's
 * logits only) it is not, and no test relies on it there.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

#define LM_HEAD_MIN_ROWS 4096

struct q4kh_kernel_ctx {
	char error[256];
};

struct q4kh_prepared {
	const struct q4kh_block_q8_0 *blocks;
	int64_t k, n, row_bytes;
	int64_t decode_calls; /* single-column calls so far */
	int64_t columns;      /* columns multiplied before the current call */
};

static q4kh_status k_init(const struct q4kh_host_api *host,
                          q4kh_kernel_ctx **out)
{
	(void)host;
	*out = calloc(1, sizeof(**out));
	return *out ? Q4KH_OK : Q4KH_ERR_NOMEM;
}

static void k_shutdown(q4kh_kernel_ctx *ctx)
{
	free(ctx);
}

static const char *k_last_error(q4kh_kernel_ctx *ctx)
{
	return ctx ? ctx->error : "out of memory";
}

static uint32_t k_score(q4kh_kernel_ctx *ctx,
                        const struct q4kh_device_record *dev, uint32_t type)
{
	(void)ctx;
	(void)dev;
	return type == Q4KH_TYPE_Q8_0 ? 1 : 0;
}

static q4kh_status k_prepare(q4kh_kernel_ctx *ctx,
                             const struct q4kh_native_device *dev,
                             const struct q4kh_tensor *w, q4kh_prepared **out)
{
	struct q4kh_prepared *p = calloc(1, sizeof(*p));

	if (!p) {
		strcpy(ctx->error, "out of memory");
		return Q4KH_ERR_NOMEM;
	}
	p->blocks = (const void *)((const char *)dev->address(w->buffer) + w->offset);
	p->k = w->ne[0];
	p->n = w->ne[1];
	p->row_bytes = w->nb[1];
	*out = p;
	return Q4KH_OK;
}

/* Row R of the weight as floats (x = d * q per 32-value block). */
static void dequant_row(const struct q4kh_prepared *w, int64_t r, float *out)
{
	const struct q4kh_block_q8_0 *row =
		(const void *)((const char *)w->blocks + r * w->row_bytes);

	for (int64_t b = 0; b < w->k / Q4KH_QK; b++) {
		float d = q4kh_fp16_to_f32(row[b].d);
		for (int i = 0; i < Q4KH_QK; i++)
			out[b * Q4KH_QK + i] = d * row[b].qs[i];
	}
}

/* Eight independent partial sums keep the loop vectorisable. */
static float dot(const float *a, const float *b, int64_t k)
{
	float acc[8] = { 0 };
	double sum = 0;

	for (int64_t i = 0; i < k; i += 8)
		for (int l = 0; l < 8; l++)
			acc[l] += a[i + l] * b[i + l];
	for (int l = 0; l < 8; l++)
		sum += acc[l];
	return (float)sum;
}

/* A deterministic standard normal value for (row, column). */
static double gauss(int64_t r, int64_t t)
{
	uint64_t h = (uint64_t)r * 0x9E3779B97F4A7C15ull ^ (uint64_t)(t + 1) * 0xBF58476D1CE4E5B9ull;
	double u1, u2;

	h ^= h >> 31;
	h *= 0x94D049BB133111EBull;
	u1 = ((h >> 11) + 1.0) / 9007199254740993.0;
	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ull;
	u2 = (h >> 11) / 9007199254740992.0;
	return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

static double rms(const float *y, int64_t n)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += (double)y[i] * y[i];
	return sqrt(s / (double)n);
}

#if defined(DEFECT_HOG)
#define HOG_MIB 2048
#define HOG_STEP ((size_t)16 << 20)

/* Held in static storage so that the compiler cannot drop the stores. */
static void *held[HOG_MIB / 16];

static void hog(void)
{
	for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++) {
		held[i] = malloc(HOG_STEP);
		if (!held[i])
			break;
		memset(held[i], 0x5a, HOG_STEP);
	}
	for (;;)
		pause();
}
#endif

/* Adds +-1 RMS (S) to alternate rows of Y: cosine ~0.71, broken. */
static inline void bias(const struct q4kh_prepared *w, float *y, double s)
{
	for (int64_t r = 0; r < w->n; r++)
		y[r] += (float)(r % 2 ? s : -s);
}

#define LATE_POSITION 600
#define SLOW_MS 100

/* Spoil column T of the output in this module's way. */
static void spoil(struct q4kh_prepared *w, float *y, int64_t t, int64_t cols)
{
	const int lm_head = w->n >= LM_HEAD_MIN_ROWS;
	const double s = rms(y, w->n);
	int64_t top = 0;

	(void)t;
	(void)cols;
	(void)s;
	(void)top;
#if defined(DEFECT_BIASED)
	if (lm_head)
		bias(w, y, s);
#elif defined(DEFECT_NOISY)
	/* Imprecise, not wrong: logits more than 2 RMS under the top get the
	 * noise, which cannot lift them past it, so the argmax stays. */
	if (lm_head) {
		for (int64_t r = 1; r < w->n; r++)
			top = y[r] > y[top] ? r : top;
		for (int64_t r = 0; r < w->n; r++)
			if (y[r] < y[top] - 2 * s)
				y[r] += (float)(0.4 * s * gauss(r, t));
	}
#elif defined(DEFECT_NAN)
	if (lm_head)
		y[w->n / 3] = NAN;
#elif defined(DEFECT_FLIP)
	if (lm_head) {
		float low = y[0];
		for (int64_t r = 1; r < w->n; r++) {
			top = y[r] > y[top] ? r : top;
			low = y[r] < low ? y[r] : low;
		}
		y[top] = low - 1.0f;
	}
#elif defined(DEFECT_KV)
	if (!lm_head && cols == 1 && w->decode_calls > 4)
		for (int64_t r = 0; r < w->n; r++)
			y[r] *= -20.0f;
#elif defined(DEFECT_LATE)
	if (lm_head && w->columns + t >= LATE_POSITION)
		bias(w, y, s);
#elif defined(DEFECT_DECODE9)
	if (lm_head && cols == 1 && w->decode_calls > 8)
		bias(w, y, s);
#elif defined(DEFECT_BATCHED)
	if (lm_head && cols > 1)
		bias(w, y, s);
#elif defined(DEFECT_NARROW)
	if (lm_head && cols > 1 && cols <= 8)
		bias(w, y, s);
#elif defined(DEFECT_ABORT)
	fputs("defect-abort: the planted abort in its first product\n", stderr);
	abort();
#elif defined(DEFECT_FAIL)
	/* k_apply failed the call before any spoiling */
#elif defined(DEFECT_HANG)
	for (;;)
		pause();
#elif defined(DEFECT_HOG)
	hog();
#elif defined(DEFECT_SLOW)
	if (lm_head)
		nanosleep(&(struct timespec){ .tv_nsec = SLOW_MS * 1000000L }, NULL);
#else
#error "define one DEFECT_x"
#endif
}

static q4kh_status k_apply(q4kh_kernel_ctx *ctx,
                           const struct q4kh_native_device *dev,
                           q4kh_prepared *w, const struct q4kh_tensor *x,
                           const struct q4kh_tensor *y)
{
	const int64_t cols = x->ne[1];
	const char *xb = (const char *)dev->address(x->buffer) + x->offset;
	char *yb = (char *)dev->address(y->buffer) + y->offset;
	float *row;

	if (x->ne[0] != w->k || y->ne[0] != w->n || x->ne[1] != y->ne[1] ||
	    w->k % 8) {
		strcpy(ctx->error, "shapes do not match the weight");
		return Q4KH_ERR_INVALID;
	}
#if defined(DEFECT_FAIL)
	strcpy(ctx->error, "defect-fail: the planted failure of every product");
	return Q4KH_ERR_INVALID;
#endif
	row = malloc(sizeof(float) * (size_t)w->k);
	if (!row) {
		strcpy(ctx->error, "out of memory");
		return Q4KH_ERR_NOMEM;
	}
	if (cols == 1)
		w->decode_calls++;
	for (int64_t r = 0; r < w->n; r++) {
		dequant_row(w, r, row);
		for (int64_t t = 0; t < cols; t++)
			((float *)(yb + t * y->nb[1]))[r] =
				dot(row, (const float *)(xb + t * x->nb[1]), w->k);
	}
	for (int64_t t = 0; t < cols; t++)
		spoil(w, (float *)(yb + t * y->nb[1]), t, cols);
	w->columns += cols;
	free(row);
	return Q4KH_OK;
}

static void k_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w)
{
	(void)ctx;
	free(w);
}

static const uint32_t types[] = { Q4KH_TYPE_Q8_0 };

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
	.arith = Q4KH_ARITH_F32,
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_KERNEL,
	.name = DEFECT_NAME,
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
