/*
 * example-cpu-q4k: a complete Q4_K kernel variant for q4khost's "cpu"
 * backend, built out of tree against the installed SDK alone (see the
 * Makefile beside this file and docs/plugin-abi.md).
 *
 * What it shows, in the order the host uses it:
 *  - the one exported entry symbol and a descriptor of static data;
 *  - init(): the ABI handshake from the plugin's side, reading the host
 *    API only up to its struct_size, one [plugin.example-cpu-q4k] setting
 *    parsed strictly, logging through the host;
 *  - score(): which devices and types it takes;
 *  - prepare(): a repack of each weight into a layout of its own, owned by
 *    the plugin until release();
 *  - gemv()/gemm(): checked arguments, the backend's memory reached through
 *    the native handles it lends (host pointers, for "cpu"), errors as a
 *    status plus a message the host fetches with last_error().
 *
 * The arithmetic: Q4_K value i of sub-block j is d*sc_j*q_i - dmin*m_j
 * (quant.h), so a sub-block's dot product with activations a is
 *   (d*sc_j) * sum(q_i a_i) - (dmin*m_j) * sum(a_i).
 * prepare() decodes the two factors once per sub-block into floats;
 * activations stay float (no int8 rounding), so the logits keep close to
 * the reference's and F2 passes with room to spare.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <q4khost/plugin.h>

#define NAME "example-cpu-q4k"
#define MAX_TILE 64
#define ERROR_LEN 512

#ifndef PLUGIN_VERSION
#define PLUGIN_VERSION "0"
#endif
#ifndef BUILD_ID
#define BUILD_ID "unknown"
#endif

struct q4kh_kernel_ctx {
	int tile; /* activation columns per pass over a weight row */
	char error[ERROR_LEN];
};

/* One 32-value sub-block, decoded: x_i = scale * q_i - min. */
struct sub {
	float scale;
	float min;
};

struct q4kh_prepared {
	int64_t k, n;        /* the weight is {K, N} */
	const uint8_t *rows; /* the backend's Q4_K rows, read in place */
	int64_t row_bytes;
	struct sub *subs;    /* n rows of k / 32 decoded factors: ours */
};

/* Why the last init() on this thread failed (ctx did not exist yet). */
static _Thread_local char init_error[ERROR_LEN];

/* Keep the message for last_error() and return st: plugins never print. */
__attribute__((format(printf, 3, 4))) static q4kh_status
fail(q4kh_kernel_ctx *ctx, q4kh_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ctx ? ctx->error : init_error, ERROR_LEN, fmt, ap);
	va_end(ap);
	return st;
}

/* "1".."64", nothing else: a typo must not pass as a default. */
static int parse_tile(const char *s, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (end == s || *end || v < 1 || v > MAX_TILE)
		return -1;
	*out = (int)v;
	return 0;
}

static q4kh_status k_init(const struct q4kh_host_api *host,
                          q4kh_kernel_ctx **out)
{
	const char *tile = NULL;
	char line[160];
	int t = 8;

	if (!host || !out)
		return fail(NULL, Q4KH_ERR_INVALID, "init: %s is NULL",
		            host ? "out" : "host");
	*out = NULL;
	if (host->abi_major != Q4KH_ABI_MAJOR)
		return fail(NULL, Q4KH_ERR_UNSUPPORTED,
		            "init: host ABI major %u, plugin built for %d",
		            host->abi_major, Q4KH_ABI_MAJOR);
	if (Q4KH_HOST_HAS(host, config_get))
		tile = host->config_get(host->host_data, "tile");
	if (tile && parse_tile(tile, &t))
		return fail(NULL, Q4KH_ERR_INVALID,
		            "[plugin." NAME "] tile = \"%s\": expected 1 to 64 "
		            "(activation columns per pass)", tile);
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return fail(NULL, Q4KH_ERR_NOMEM, "init: out of memory");
	(*out)->tile = t;
	if (Q4KH_HOST_HAS(host, log)) {
		snprintf(line, sizeof(line), "float activations, %d columns per pass", t);
		host->log(host->host_data, Q4KH_LOG_DEBUG, line);
	}
	return Q4KH_OK;
}

static void k_shutdown(q4kh_kernel_ctx *ctx)
{
	free(ctx);
}

static const char *k_last_error(q4kh_kernel_ctx *ctx)
{
	return ctx ? ctx->error : init_error;
}

/* Q4_K on any cpu device; the lowest score above 0 (docs/plugin-abi.md K2). */
static uint32_t k_score(q4kh_kernel_ctx *ctx,
                        const struct q4kh_device_record *dev, uint32_t type)
{
	(void)ctx;
	(void)dev;
	return type == Q4KH_TYPE_Q4_K ? 1 : 0;
}

/* Sub-block j's 6-bit scale and min, unpacked as quant.h describes. */
static void scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
		*m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

static q4kh_status k_prepare(q4kh_kernel_ctx *ctx,
                             const struct q4kh_native_device *dev,
                             const struct q4kh_tensor *w, q4kh_prepared **out)
{
	const int64_t per_row = w->ne[0] / 32;
	struct q4kh_prepared *p;

	if (w->type != Q4KH_TYPE_Q4_K || w->ne[0] <= 0 || w->ne[0] % Q4KH_QK_K ||
	    w->ne[1] <= 0 || w->ne[2] != 1 || w->ne[3] != 1)
		return fail(ctx, Q4KH_ERR_UNSUPPORTED,
		            "prepare: type %u {%lld, %lld, %lld, %lld}: only 2-D Q4_K "
		            "weights with K a multiple of 256",
		            w->type, (long long)w->ne[0], (long long)w->ne[1],
		            (long long)w->ne[2], (long long)w->ne[3]);
	if (!dev || !dev->address)
		return fail(ctx, Q4KH_ERR_INVALID,
		            "prepare: the backend lends no buffer addresses");
	p = calloc(1, sizeof(*p));
	if (p)
		p->subs = malloc(sizeof(*p->subs) * (size_t)(per_row * w->ne[1]));
	if (!p || !p->subs) {
		free(p);
		return fail(ctx, Q4KH_ERR_NOMEM, "prepare: out of memory");
	}
	p->k = w->ne[0];
	p->n = w->ne[1];
	p->rows = (const uint8_t *)dev->address(w->buffer) + w->offset;
	p->row_bytes = w->nb[1];
	for (int64_t r = 0; r < p->n; r++) {
		const struct q4kh_block_q4_k *b =
			(const void *)(p->rows + r * p->row_bytes);
		struct sub *s = p->subs + r * per_row;

		for (int64_t sb = 0; sb < p->k / Q4KH_QK_K; sb++) {
			const float d = q4kh_fp16_to_f32(b[sb].d);
			const float dmin = q4kh_fp16_to_f32(b[sb].dmin);

			for (int j = 0; j < 8; j++) {
				int sc, m;

				scale_min(b[sb].scales, j, &sc, &m);
				s[sb * 8 + j].scale = d * (float)sc;
				s[sb * 8 + j].min = dmin * (float)m;
			}
		}
	}
	*out = p;
	return Q4KH_OK;
}

/* Is t an f32 matrix of ROWS values per column, columns nb[1] apart? */
static int f32_columns(const struct q4kh_tensor *t, int64_t rows)
{
	return t->type == Q4KH_TYPE_F32 && t->ne[0] == rows && t->ne[1] >= 1 &&
	       t->ne[2] == 1 && t->ne[3] == 1 && t->nb[0] == 4 &&
	       t->nb[1] >= rows * 4;
}

/*
 * y[:, c0 .. c0+nc) = W x[:, c0 .. c0+nc): each weight row's nibbles are
 * unpacked once per sub-block and applied to every column of the tile.
 */
static void tile_product(const struct q4kh_prepared *w, const uint8_t *x,
                         int64_t ldx, uint8_t *y, int64_t ldy, int nc,
                         const float *xsum)
{
	const int64_t per_row = w->k / 32;

	for (int64_t r = 0; r < w->n; r++) {
		const struct q4kh_block_q4_k *b =
			(const void *)(w->rows + r * w->row_bytes);
		const struct sub *s = w->subs + r * per_row;
		float acc[MAX_TILE] = { 0 };

		for (int64_t j = 0; j < per_row; j++) {
			/* Sub-blocks 2c and 2c+1 share 32 bytes: low, then high nibbles. */
			const uint8_t *qs = b[j / 8].qs + 32 * ((j % 8) / 2);
			const int shift = (int)(j % 2) * 4;
			float q[32];

			for (int i = 0; i < 32; i++)
				q[i] = (float)((qs[i] >> shift) & 0xF);
			for (int c = 0; c < nc; c++) {
				const float *a = (const float *)(x + c * ldx) + j * 32;
				float dot = 0;

				for (int i = 0; i < 32; i++)
					dot += q[i] * a[i];
				acc[c] += s[j].scale * dot - s[j].min * xsum[c * per_row + j];
			}
		}
		for (int c = 0; c < nc; c++)
			((float *)(y + c * ldy))[r] = acc[c];
	}
}

static q4kh_status k_apply(q4kh_kernel_ctx *ctx,
                           const struct q4kh_native_device *dev,
                           q4kh_prepared *w, const struct q4kh_tensor *x,
                           const struct q4kh_tensor *y)
{
	const int64_t per_row = w->k / 32, cols = x->ne[1];
	const uint8_t *xb;
	uint8_t *yb;
	float *xsum;

	if (!f32_columns(x, w->k) || !f32_columns(y, w->n) || y->ne[1] != cols)
		return fail(ctx, Q4KH_ERR_INVALID,
		            "gemv/gemm: expected f32 x {%lld, T} and y {%lld, T} with "
		            "contiguous columns; found x type %u {%lld, %lld}, y type %u "
		            "{%lld, %lld}",
		            (long long)w->k, (long long)w->n, x->type,
		            (long long)x->ne[0], (long long)x->ne[1], y->type,
		            (long long)y->ne[0], (long long)y->ne[1]);
	xb = (const uint8_t *)dev->address(x->buffer) + x->offset;
	yb = (uint8_t *)dev->address(y->buffer) + y->offset;
	xsum = malloc(sizeof(*xsum) * (size_t)(per_row * ctx->tile));
	if (!xsum)
		return fail(ctx, Q4KH_ERR_NOMEM, "gemv/gemm: out of memory");
	for (int64_t c0 = 0; c0 < cols; c0 += ctx->tile) {
		const int nc = (int)(cols - c0 < ctx->tile ? cols - c0 : ctx->tile);

		for (int c = 0; c < nc; c++) {
			const float *a = (const float *)(xb + (c0 + c) * x->nb[1]);

			for (int64_t j = 0; j < per_row; j++) {
				float sum = 0;
				for (int i = 0; i < 32; i++)
					sum += a[j * 32 + i];
				xsum[c * per_row + j] = sum;
			}
		}
		tile_product(w, xb + c0 * x->nb[1], x->nb[1], yb + c0 * y->nb[1],
		             y->nb[1], nc, xsum);
	}
	free(xsum);
	return Q4KH_OK;
}

static void k_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w)
{
	(void)ctx;
	if (w)
		free(w->subs);
	free(w);
}

static const uint32_t types[] = { Q4KH_TYPE_Q4_K };

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
	/* The arithmetic F2 holds it to (docs/plugin-abi.md): float
	 * activations and float sums, nothing rounded to f16 or integers. */
	.arith = Q4KH_ARITH_F32,
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_KERNEL,
	.name = NAME,
	.version = PLUGIN_VERSION,
	.vendor = "q4khost SDK example",
	.license = "MIT",
	.build_id = BUILD_ID,
	.kernel = &table,
};

/* The one symbol the plugin exports (-fvisibility=hidden hides the rest). */
Q4KH_PLUGIN_ENTRY(desc)
