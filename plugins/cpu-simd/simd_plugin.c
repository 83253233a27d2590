/*
 * cpu-simd: the plugin's identity, settings and the kernel-variant table.
 * Weights are read in place from the backend's buffers (a backend of kind
 * "cpu" lends host pointers); each gemv/gemm quantises its activation
 * columns once, then splits the weight rows over worker threads, each of
 * which decodes a row once and multiplies it with every column: the
 * backend's threads where it lends them (ABI 1.3, cpu-fast), else a pool
 * of the variant's own (the reference cpu lends none). Where the set has
 * a packed gemm for the type (AVX-512 VNNI and AMX: Q4_K, Q6_K, Q5_0),
 * prepare() also repacks the weight into tiles of 16 rows, and gemm
 * splits those tiles, and where they are few for the threads the columns
 * too, over the threads instead; gemv runs on those tiles as well for the
 * types whose packed product beats the in-place one at a few columns
 * (struct simd_kernels packed_gemv). gemv_multi (ABI 1.4) runs its products
 * one after another, then adds their biases;
 * gemv_glu (ABI 1.4) its two products, then the reference's glu.
 *
 * Settings ([plugin.cpu-simd]; cpu-simd8 reads the same keys from
 * [plugin.cpu-simd8], and refuses isa = avx2 and repack = off):
 *   threads = 1..256   worker threads of its own, on a backend that lends
 *                      none (default: the online CPUs, as the cpu
 *                      backend's own default; set it like [plugin.cpu]
 *                      threads, since the ABI does not pass that on)
 *   isa = auto | avx2 | avx512-vnni | amx
 *                      the kernels to use (default auto: the best this CPU
 *                      and OS can run; the debug log line of init() names
 *                      it and why each better one was passed over); naming
 *                      one this CPU cannot run fails init() with the
 *                      reason (q4kh_cpu_isa_check). amx is the AVX-512 VNNI
 *                      set with the gemm of repacked Q4_K, Q6_K and Q5_0
 *                      on AMX tiles (simd_amx_packed.c), the same bits: it
 *                      needs AMX-TILE and AMX-INT8, Linux's grant of the
 *                      tile data, a build with the tile intrinsics and
 *                      repack on
 *   repack = on | off  whether prepare() keeps a repacked copy of each Q4_K,
 *                      Q6_K and Q5_0 weight for the gemm of a set that has
 *                      one (VNNI, AMX: simd_*_packed.c; default on: the
 *                      prompt's products run on it, and the decode's of
 *                      Q4_K and Q5_0, at the cost of those
 *                      weights' size again in memory, Q5_0's 384/352 of
 *                      it); off multiplies them in place as the other
 *                      types
 */
#include "buildconf.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/backend_base.h"
#include "q4khost/glu.h"
#include "q4khost/pool.h"
#include "simd.h"

/*
 * Built twice from these sources: cpu-simd quantises the activations to
 * int16, cpu-simd8 (SIMD_INT8) to int8 (simd.h, struct simd_act), which
 * halves the packed products' integer work and declares the int8 class
 * (a plugin declares one, so the two are two plugins). cpu-simd8 scores
 * above cpu-simd, so that a device with no kernel setting tries it first
 * and falls back to cpu-simd where F2 rejects it, and runs only where it
 * has its packed products (AVX-512 VNNI or AMX, repack on): elsewhere
 * int8 would lose accuracy for nothing.
 */
#ifdef SIMD_INT8
#define NAME "cpu-simd8"
#define ARITH Q4KH_ARITH_INT8
#define SCORE_ABOVE N_ISAS
#else
#define NAME "cpu-simd"
#define ARITH Q4KH_ARITH_INT16
#define SCORE_ABOVE 0
#endif
#define ERROR_LEN 512
/* Rows per part at least: smaller parts cost more to hand out than to do. */
#define ROW_GRAIN 16
/* Columns gemv(), gemv_multi() and gemv_glu() take. */
#define MAX_GEMV_COLUMNS 8
/* Parts per thread a packed gemm is cut into at least, where it has the
 * columns: the pool hands them out as threads come free. */
#define PACK_PARTS_PER_THREAD 4
/* Columns of a packed gemm's part come in multiples of this: whole passes
 * of either packed product (8 columns for VNNI, 16 for AMX). */
#define PACK_CHUNK_COLS 16

struct q4kh_kernel_ctx {
	const struct q4kh_host_api *host;
	enum q4kh_cpu_isa isa;             /* Q4KH_CPU_ISA_NONE: score 0, no kernels */
	const struct simd_kernels *kernels; /* &set, or NULL */
	struct simd_kernels set;
	unsigned threads;
	int repack;                        /* the repack setting */
	struct q4kh_pool *pool;            /* started by the first product */
	void *scratch;                     /* one call's columns and rows (carve()) */
	size_t scratch_size;
	float *up;                         /* gemv_glu's up product */
	size_t up_size;                    /* floats */
	char error[ERROR_LEN];
};

struct q4kh_prepared {
	enum simd_wtype type;
	const uint8_t *rows; /* the backend's copy, read in place */
	int64_t k, n, row_bytes;
	void *packed;        /* the same repacked for gemm (simd.h), or NULL */
};


static _Thread_local char init_error[ERROR_LEN];

__attribute__((format(printf, 3, 4))) static q4kh_status
fail(q4kh_kernel_ctx *ctx, q4kh_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ctx ? ctx->error : init_error, ERROR_LEN, fmt, ap);
	va_end(ap);
	return st;
}

/* In the order of enum simd_wtype. */
static const uint32_t types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q6_K,
	                          Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q4_0, Q4KH_TYPE_Q4_1,
	                          Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q5_K };

/* enum simd_wtype of a GGUF type; -1 for types without kernels. */
static int wtype(uint32_t type)
{
	for (int i = 0; i < SIMD_NTYPES; i++)
		if (types[i] == type)
			return i;
	return -1;
}

/* The sets an "isa" setting names, in the order of enum q4kh_cpu_isa. */
static const char *const isa_names[] = { "auto", "avx2", "avx512-vnni", "amx" };
#define N_ISAS (int)(sizeof(isa_names) / sizeof(isa_names[0]))

/* ISA's kernels: AMX is the VNNI set with its packed products on tiles;
 * cpu-simd8's quantise to int8 and take the packed products' int8 forms
 * (gemv's on repacked tiles VNNI's, as cpu-simd's). */
static void kernels_of(enum q4kh_cpu_isa isa, struct simd_kernels *set)
{
	*set = isa == Q4KH_CPU_ISA_AVX2 ? simd_avx2_kernels : simd_vnni_kernels;
#ifdef HAVE_SIMD_AMX
	if (isa == Q4KH_CPU_ISA_AMX_INT8) {
		set->name = "amx";
		set->packed[SIMD_Q4_K] = simd_amx_packed_q4_k;
		set->packed[SIMD_Q6_K] = simd_amx_packed_q6_k;
		set->packed[SIMD_Q5_0] = simd_amx_packed_q5_0;
		set->packed8[SIMD_Q4_K] = simd_amx_packed8_q4_k;
		set->packed8[SIMD_Q6_K] = simd_amx_packed8_q6_k;
		set->packed8[SIMD_Q5_0] = simd_amx_packed8_q5_0;
	}
#endif
#ifdef SIMD_INT8
	set->quantize = set->quantize8;
	for (int t = 0; t < SIMD_NTYPES; t++) {
		set->packed[t] = set->packed8[t];
		set->packed_gemv[t] = set->packed_gemv[t] ? simd_vnni_kernels.packed8[t] : NULL;
	}
#endif
}

/*
 * Can the plugin run ISA here, with REPACK (the setting)? 1, or 0 with
 * the reason in WHY (LEN bytes): the CPU's and the OS's first, then this
 * build's and the settings'.
 */
static int runnable(enum q4kh_cpu_isa isa, int repack, char *why, size_t len)
{
	if (!q4kh_cpu_isa_check(isa, why, len))
		return 0;
#ifdef SIMD_INT8
	if (isa == Q4KH_CPU_ISA_AVX2) {
		snprintf(why, len, "the int8 products are AVX-512 VNNI's and AMX's (cpu-simd "
		         "serves AVX2 in int16)");
		return 0;
	}
	if (!repack) {
		snprintf(why, len, "repack = off, and the int8 products run on repacked weights "
		         "only");
		return 0;
	}
#endif
	if (isa != Q4KH_CPU_ISA_AMX_INT8)
		return 1;
#ifdef HAVE_SIMD_AMX
	if (!repack)
		snprintf(why, len, "repack = off, and the AMX products run on repacked weights only");
	return repack;
#else
	(void)repack;
	snprintf(why, len, "this build's compiler had no AMX intrinsics (configure's "
	         "HAVE_SIMD_AMX)");
	return 0;
#endif
}

/*
 * The best set this plugin runs here, with REPACK: *OUT, and in NOTE (LEN
 * bytes) why each better one was passed over ("" when none was).
 */
static void best_isa(int repack, enum q4kh_cpu_isa *out, char *note, size_t len)
{
	size_t used = 0;

	note[0] = 0;
	for (int i = N_ISAS - 1; i > 0; i--) {
		char why[256];

		if (runnable((enum q4kh_cpu_isa)i, repack, why, sizeof(why))) {
			*out = (enum q4kh_cpu_isa)i;
			return;
		}
		if (used < len)
			used += (size_t)snprintf(note + used, len - used, "%s%s: %s", used ? "; " : "",
			                         isa_names[i], why);
	}
	*out = Q4KH_CPU_ISA_NONE;
}

/* The ISA an "isa" setting names (Q4KH_CPU_ISA_NONE: auto); -1 when the
 * value is unknown. */
static int parse_isa(const char *s, enum q4kh_cpu_isa *out)
{
	for (int i = 0; i < N_ISAS; i++)
		if (!strcmp(s, isa_names[i])) {
			*out = (enum q4kh_cpu_isa)i;
			return 0;
		}
	return -1;
}

static q4kh_status k_init(const struct q4kh_host_api *host, q4kh_kernel_ctx **out)
{
	const char *threads = NULL, *isa = NULL, *repack = NULL;
	unsigned n = q4kh_threads_online();
	enum q4kh_cpu_isa chosen;
	char line[1024], note[768] = "";
	unsigned repack_on = 1;

	if (!host || !out)
		return fail(NULL, Q4KH_ERR_INVALID, NAME ": init: %s is NULL",
		            host ? "out" : "host");
	*out = NULL;
	if (host->abi_major != Q4KH_ABI_MAJOR)
		return fail(NULL, Q4KH_ERR_UNSUPPORTED,
		            NAME ": init: host ABI major %u, plugin built for %d",
		            host->abi_major, Q4KH_ABI_MAJOR);
	if (Q4KH_HOST_HAS(host, config_get)) {
		threads = host->config_get(host->host_data, "threads");
		isa = host->config_get(host->host_data, "isa");
		repack = host->config_get(host->host_data, "repack");
	}
	if (repack && q4kh_parse_bool(repack, &repack_on))
		return fail(NULL, Q4KH_ERR_INVALID,
		            "[plugin." NAME "] repack = \"%s\": expected " Q4KH_BOOL_WORDS, repack);
	if (threads && q4kh_threads_parse(threads, &n))
		return fail(NULL, Q4KH_ERR_INVALID,
		            "[plugin." NAME "] threads = \"%s\": expected an integer "
		            "from 1 to %d", threads, Q4KH_MAX_THREADS);
	if (parse_isa(isa ? isa : "auto", &chosen))
		return fail(NULL, Q4KH_ERR_INVALID,
		            "[plugin." NAME "] isa = \"%s\": expected auto, avx2, avx512-vnni "
		            "or amx", isa);
	if (chosen == Q4KH_CPU_ISA_NONE)
		best_isa(repack_on, &chosen, note, sizeof(note));
	else if (!runnable(chosen, repack_on, note, sizeof(note)))
		return fail(NULL, Q4KH_ERR_UNSUPPORTED, "[plugin." NAME "] isa = %s: %s", isa, note);
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return fail(NULL, Q4KH_ERR_NOMEM, NAME ": init: out of memory");
	(*out)->host = host;
	(*out)->isa = chosen;
	if (chosen != Q4KH_CPU_ISA_NONE) {
		kernels_of(chosen, &(*out)->set);
		(*out)->kernels = &(*out)->set;
	}
	(*out)->threads = n;
	(*out)->repack = repack_on;
	if (Q4KH_HOST_HAS(host, log)) {
		snprintf(line, sizeof(line), NAME ": %s kernels, %u thread%s%s%s%s",
		         chosen ? (*out)->set.name : "no", n, n == 1 ? "" : "s",
		         note[0] ? " (isa auto; passed over: " : "", note, note[0] ? ")" : "");
		host->log(host->host_data, Q4KH_LOG_DEBUG, line);
	}
	return Q4KH_OK;
}

static void k_shutdown(q4kh_kernel_ctx *ctx)
{
	if (!ctx)
		return;
	q4kh_pool_destroy(ctx->pool);
	free(ctx->scratch);
	free(ctx->up);
	free(ctx);
}

static const char *k_last_error(q4kh_kernel_ctx *ctx)
{
	return ctx ? ctx->error : init_error;
}

/* AMX above VNNI above AVX2, cpu-simd8 above cpu-simd; 0 where none runs
 * or for a type without kernels. */
static uint32_t k_score(q4kh_kernel_ctx *ctx, const struct q4kh_device_record *dev,
                        uint32_t type)
{
	(void)dev; /* "cpu" has one device: this process's CPU */
	if (!ctx || !ctx->kernels || wtype(type) < 0)
		return 0;
	return 1 + (uint32_t)ctx->isa + (uint32_t)SCORE_ABOVE;
}

/* FN over [0, n) on the backend's lent threads, else on the variant's. */
static void run_parallel(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev, int lent,
                         int64_t n, int64_t grain, q4kh_task_fn fn, void *arg)
{
	if (lent)
		dev->parallel(dev->pool, n, grain, fn, arg);
	else
		q4kh_pool_run(ctx->pool, n, grain, fn, arg);
}

/*
 * The threads work runs on: *lent = 1 and the backend's count where it
 * lends them (ABI 1.3), else the variant's own pool, started on first use.
 * 0, or a failed status with the reason in ctx.
 */
static q4kh_status threads_of(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                              int *lent, unsigned *threads)
{
	*lent = Q4KH_NATIVE_HAS(dev, parallel) && dev->threads > 0;
	if (!*lent && !ctx->pool && q4kh_pool_create(ctx->threads, 0, &ctx->pool))
		return fail(ctx, Q4KH_ERR_INTERNAL, "cannot start %u worker threads: %s",
		            ctx->threads - 1, strerror(errno));
	*threads = *lent ? dev->threads : ctx->threads;
	return Q4KH_OK;
}

static void repack_part(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct q4kh_prepared *p = arg;

	(void)part;
	simd_pack_tiles((int)p->type, p->rows, p->row_bytes, p->n, p->k, begin, end, p->packed);
}

/*
 * P's rows repacked for the gemm of its type (struct simd_kernels packed),
 * the tiles over the threads. The copy lives as long as P: the file's
 * blocks stay for gemv of the types it reads in place (Q6_K).
 */
static q4kh_status repack(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                          struct q4kh_prepared *p)
{
	const size_t bytes = simd_pack_bytes((int)p->type, p->n, p->k);
	unsigned threads;
	int lent;
	q4kh_status st;

	if ((st = threads_of(ctx, dev, &lent, &threads)))
		return st;
	p->packed = aligned_alloc(64, bytes);
	if (!p->packed)
		return fail(ctx, Q4KH_ERR_NOMEM, "prepare: cannot allocate %zu bytes to repack "
		            "{%lld, %lld} for gemm", bytes, (long long)p->k, (long long)p->n);
	run_parallel(ctx, dev, lent, (p->n + SIMD_PACK_ROWS - 1) / SIMD_PACK_ROWS, 1, repack_part,
	             p);
	return Q4KH_OK;
}

static q4kh_status k_prepare(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                             const struct q4kh_tensor *w, q4kh_prepared **out)
{
	struct q4kh_prepared *p;
	q4kh_status st;
	int t;

	if (!ctx || !w || !out)
		return ctx ? fail(ctx, Q4KH_ERR_INVALID, "prepare: %s is NULL",
		                  w ? "out" : "w")
		           : Q4KH_ERR_INVALID;
	t = wtype(w->type);
	if (!ctx->kernels)
		return fail(ctx, Q4KH_ERR_UNSUPPORTED,
		            "prepare: this CPU runs none of " NAME "'s kernels (its init "
		            "line says why)");
	if (t < 0 || w->ne[0] <= 0 || w->ne[0] % q4kh_type_block_elems(w->type) ||
	    w->ne[1] <= 0 || w->ne[2] != 1 || w->ne[3] != 1)
		return fail(ctx, Q4KH_ERR_UNSUPPORTED,
		            "prepare: type %u {%lld, %lld, %lld, %lld}: expected a 2-D "
		            "Q4_K, Q5_K or Q6_K weight with K a multiple of 256, or Q4_0, "
		            "Q4_1, Q5_0, Q5_1 or Q8_0 with K a multiple of 32",
		            w->type, (long long)w->ne[0], (long long)w->ne[1],
		            (long long)w->ne[2], (long long)w->ne[3]);
	if (w->nb[0] != (int64_t)q4kh_type_block_bytes(w->type) ||
	    w->nb[1] < w->ne[0] / q4kh_type_block_elems(w->type) * w->nb[0])
		return fail(ctx, Q4KH_ERR_INVALID,
		            "prepare: strides nb[0] %lld, nb[1] %lld: expected "
		            "whole blocks of %zu bytes and rows of at least %lld",
		            (long long)w->nb[0], (long long)w->nb[1],
		            (size_t)q4kh_type_block_bytes(w->type),
		            (long long)(w->ne[0] / q4kh_type_block_elems(w->type) *
		                        (int64_t)q4kh_type_block_bytes(w->type)));
	if (!dev || !dev->address || !dev->address(w->buffer))
		return fail(ctx, Q4KH_ERR_INVALID,
		            "prepare: the backend lends no buffer address");
	p = malloc(sizeof(*p));
	if (!p)
		return fail(ctx, Q4KH_ERR_NOMEM, "prepare: out of memory");
	p->type = (enum simd_wtype)t;
	p->rows = (const uint8_t *)dev->address(w->buffer) + w->offset;
	p->k = w->ne[0];
	p->n = w->ne[1];
	p->row_bytes = w->nb[1];
	p->packed = NULL;
	if (ctx->repack && ctx->kernels->packed[t] && (st = repack(ctx, dev, p))) {
		free(p);
		return st;
	}
	*out = p;
	return Q4KH_OK;
}

/* Is t an f32 matrix {rows, T} with contiguous columns nb[1] apart? */
static int f32_columns(const struct q4kh_tensor *t, int64_t rows)
{
	return t->type == Q4KH_TYPE_F32 && t->ne[0] == rows && t->ne[1] >= 1 &&
	       t->ne[2] == 1 && t->ne[3] == 1 && t->nb[0] == 4 &&
	       t->nb[1] >= rows * 4 && t->nb[1] % 4 == 0;
}

/* Bytes of K int16 values with two floats per block of 32: a decoded row
 * (struct simd_row) or a quantised column (struct simd_act). */
static size_t values_bytes(int64_t k)
{
	return sizeof(int16_t) * (size_t)k + 2 * sizeof(float) * (size_t)(k / SIMD_BLOCK);
}

/* Bytes of one column's split (struct simd_act: s16, then hi and lo). */
static size_t split_bytes(int64_t k)
{
	return sizeof(float) * (size_t)(k / 16) + 2 * (size_t)k;
}

/*
 * Scratch for COLS columns (GROUPS groups of W for gemm, with a temporary
 * column per thread of THREADS; else none), ROWS decoded rows and, with
 * SPLIT, one column's split: structs first, then floats and int16, then
 * bytes (K is a multiple of 32, so each part stays aligned).
 */
static size_t scratch_bytes(int64_t k, int64_t cols, int64_t groups, int w, size_t rows,
                            unsigned threads, int split)
{
	const size_t temps = groups ? threads : 0;
	const size_t structs = (size_t)cols * (sizeof(struct simd_act) + sizeof(float *)) +
	                       temps * sizeof(struct simd_act) +
	                       (size_t)groups * sizeof(struct simd_group) +
	                       rows * sizeof(struct simd_row);
	const size_t columns = groups ? (size_t)(groups * w) + temps : (size_t)cols;

	return structs + (rows + columns) * values_bytes(k) + (split ? split_bytes(k) : 0);
}

static int scratch_reserve(q4kh_kernel_ctx *ctx, size_t bytes)
{
	void *p;

	if (bytes <= ctx->scratch_size)
		return 0;
	p = realloc(ctx->scratch, bytes);
	if (!p)
		return -1;
	ctx->scratch = p;
	ctx->scratch_size = bytes;
	return 0;
}

/* The next K values with their floats from *next: floats, then int16. */
static void take(uint8_t **next, int64_t k, int16_t **q, float **f0, float **f1)
{
	*f0 = (float *)*next;
	*f1 = *f0 + k / SIMD_BLOCK;
	*q = (int16_t *)(*f1 + k / SIMD_BLOCK);
	*next += values_bytes(k);
}

/* The quantisation of a gemm's columns into groups, per group. */
struct prep_job {
	const struct simd_kernels *kernels;
	const uint8_t *x;  /* column 0 */
	int64_t stride, k, cols;
	const struct simd_group *grp;
	const struct simd_act *tmp; /* one per thread */
};

/* Each column of groups [begin, end) through the thread's temporary. */
static void prep_part(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct prep_job *j = arg;
	const struct simd_act *t = &j->tmp[thread];
	const int w = j->kernels->width;

	for (int64_t g = begin; g < end; g++)
		for (int c = 0; c < w; c++) {
			const int64_t col = g * w + c;

			if (col < j->cols)
				j->kernels->quantize((const float *)(j->x + col * j->stride), j->k,
				                     (int16_t *)t->q, (float *)t->d, (float *)t->ds);
			simd_interleave(col < j->cols ? t : NULL, j->k, w, c, (int16_t *)j->grp[g].q,
			                (float *)j->grp[g].d, (float *)j->grp[g].ds);
		}
}

/* One product, as the pool's workers see it. */
struct job {
	const struct q4kh_prepared *w;
	simd_rows_fn rows;                /* gemv: act */
	simd_tiles_fn tiles;              /* gemm: grp */
	const struct simd_act *act;
	const struct simd_group *grp;
	int ncols;
	float *const *y;
	const struct simd_row *row;       /* per part: tile_rows of them */
	int tile_rows;
};

static void run_part(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct job *j = arg;
	const struct q4kh_prepared *w = j->w;

	if (j->tiles)
		j->tiles(w->rows, w->row_bytes, begin, end, w->k, j->grp, j->ncols, j->y,
		         &j->row[part * j->tile_rows]);
	else
		j->rows(w->rows, w->row_bytes, begin, end, w->k, j->act, j->ncols, j->y,
		        &j->row[part * j->tile_rows]);
}

/*
 * A gemm on a repacked weight, as its workers see it: item i is tile i %
 * tiles of the weight against the columns of chunk i / tiles (packed_part).
 */
struct packed_job {
	const struct simd_kernels *kernels;
	const struct q4kh_prepared *w;
	const uint8_t *x;        /* column 0 */
	int64_t stride;          /* between x's columns, bytes */
	const struct simd_act *act;
	int ncols;
	float *const *y;
	int64_t tiles, chunks;
	simd_packed_fn fn;       /* the product (struct simd_kernels packed or packed_gemv) */
};

/* Columns [begin, end): quantised, then split with their blocks in order. */
static void packed_cols_part(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct packed_job *j = arg;

	(void)part;
	for (int64_t c = begin; c < end; c++) {
		const struct simd_act *a = &j->act[c];

		j->kernels->quantize((const float *)(j->x + c * j->stride), j->w->k, (int16_t *)a->q,
		                     (float *)a->d, (float *)a->ds);
		j->kernels->split(a->q, j->w->k, -1, (int8_t *)a->hi, (int8_t *)a->lo,
		                  (float *)a->s16);
	}
}

/* The first column of chunk I of J's: whole PACK_CHUNK_COLS, shared out
 * evenly. */
static int chunk_column(const struct packed_job *j, int64_t i)
{
	const int64_t groups = (j->ncols + PACK_CHUNK_COLS - 1) / PACK_CHUNK_COLS;
	const int64_t c = i * groups / j->chunks * PACK_CHUNK_COLS;

	return c < j->ncols ? (int)c : j->ncols;
}

/* Items [begin, end): the tiles of each chunk they cover, as one call. */
static void packed_part(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct packed_job *j = arg;
	const struct q4kh_prepared *w = j->w;

	(void)part;
	while (begin < end) {
		const int64_t chunk = begin / j->tiles, t0 = begin % j->tiles;
		const int64_t t1 = end - chunk * j->tiles < j->tiles ? end - chunk * j->tiles : j->tiles;
		const int c0 = chunk_column(j, chunk), c1 = chunk_column(j, chunk + 1);

		j->fn(w->packed, w->n, w->k, t0, t1, j->act + c0, c1 - c0, j->y + c0);
		begin += t1 - t0;
	}
}

/*
 * y = w x through FN, a packed product of w's type: every column quantised
 * and split into ctx's scratch (the columns over the threads; the bytes
 * of all columns together, K apart, as the products take them), then the
 * tiles of 16 rows over the THREADS, and where there are fewer than
 * PACK_PARTS_PER_THREAD tiles a thread, the columns cut into as many
 * chunks as make up for it (each chunk reads the weight again).
 */
static q4kh_status packed_product(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                                  int lent, unsigned threads, const q4kh_prepared *w,
                                  const uint8_t *xb, int64_t stride, uint8_t *yb, int64_t ynb,
                                  int64_t cols, simd_packed_fn fn)
{
	const int64_t k = w->k, tiles = (w->n + SIMD_PACK_ROWS - 1) / SIMD_PACK_ROWS;
	const int64_t groups = (cols + PACK_CHUNK_COLS - 1) / PACK_CHUNK_COLS;
	const int64_t want = ((int64_t)threads * PACK_PARTS_PER_THREAD + tiles - 1) / tiles;
	const size_t bytes = (size_t)cols * (sizeof(struct simd_act) + sizeof(float *) +
	                                     values_bytes(k) + split_bytes(k));
	struct packed_job j = { ctx->kernels, w, xb, stride, NULL, (int)cols, NULL, tiles,
		                want < groups ? want : groups, fn };
	struct simd_act *act;
	float **ycol;
	uint8_t *next;
	int8_t *hi, *lo;

	if (scratch_reserve(ctx, bytes))
		return fail(ctx, Q4KH_ERR_NOMEM,
		            "gemm: cannot allocate %zu bytes for %lld quantised columns", bytes,
		            (long long)cols);
	act = ctx->scratch;
	ycol = (float **)(act + cols);
	next = (uint8_t *)(ycol + cols);
	hi = (int8_t *)next + cols * (int64_t)(values_bytes(k) + sizeof(float) * (size_t)(k / 16));
	lo = hi + cols * k;
	for (int64_t c = 0; c < cols; c++) {
		int16_t *q;
		float *d, *ds, *s16;

		take(&next, k, &q, &d, &ds);
		s16 = (float *)next;
		next += sizeof(float) * (size_t)(k / 16);
		act[c] = (struct simd_act){ q, d, ds, hi + c * k, lo + c * k, s16 };
		ycol[c] = (float *)(yb + c * ynb);
	}
	j.act = act;
	j.y = ycol;
	run_parallel(ctx, dev, lent, cols, 1, packed_cols_part, &j);
	run_parallel(ctx, dev, lent, tiles * j.chunks, 1, packed_part, &j);
	return Q4KH_OK;
}

/*
 * y = w x, for x's columns, into YB (column c at YB + c * YNB bytes)
 * through the gemv kernels (one column at a time) or, with GEMM, the gemm
 * kernels (W columns per pass), or where w is repacked, its packed product
 * (gemm's, or without GEMM the set's packed_gemv where it has one):
 * product() once it has checked the arguments. Quantises x into ctx's
 * scratch, then splits w's rows over the pool.
 */
static q4kh_status product_to(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                              q4kh_prepared *w, const struct q4kh_tensor *x, uint8_t *yb,
                              int64_t ynb, int gemm)
{
	const int width = ctx->kernels->width;
	const int64_t k = w->k, cols = x->ne[1];
	int64_t groups;
	size_t rows;
	struct job j = { 0 };
	struct simd_act *act, *tmp;
	struct simd_group *grp;
	struct simd_row *row;
	float **ycol;
	uint8_t *xb, *next;
	size_t bytes;
	int lent, split;
	unsigned threads;

	xb = (uint8_t *)dev->address(x->buffer) + x->offset;

	if (threads_of(ctx, dev, &lent, &threads))
		return Q4KH_ERR_INTERNAL;
	if (w->packed && (gemm || ctx->kernels->packed_gemv[w->type]))
		return packed_product(ctx, dev, lent, threads, w, xb, x->nb[1], yb, ynb, cols,
		                      gemm ? ctx->kernels->packed[w->type]
		                           : ctx->kernels->packed_gemv[w->type]);
	groups = gemm ? (cols + width - 1) / width : 0;
	rows = (size_t)threads * (size_t)ctx->kernels->tile_rows;
	/* One column goes through the direct products, which may want it split. */
	split = !gemm && cols == 1 && ctx->kernels->split;
	bytes = scratch_bytes(k, cols, groups, width, rows, threads, split);
	if (scratch_reserve(ctx, bytes))
		return fail(ctx, Q4KH_ERR_NOMEM,
		            "gemv/gemm: cannot allocate %zu bytes for %lld quantised columns",
		            bytes, (long long)cols);
	act = ctx->scratch;
	tmp = act + cols;
	grp = (struct simd_group *)(tmp + (groups ? threads : 0));
	row = (struct simd_row *)(grp + groups);
	ycol = (float **)(row + rows);
	next = (uint8_t *)(ycol + cols);
	for (size_t t = 0; t < rows; t++)
		take(&next, k, &row[t].u, &row[t].s, &row[t].o);
	for (int64_t c = 0; c < cols; c++)
		ycol[c] = (float *)(yb + c * ynb);
	if (gemm) {
		struct prep_job pj = { ctx->kernels, xb, x->nb[1], k, cols, grp, tmp };
		int16_t *q;
		float *d, *ds;

		/* Each column once through its thread's temporary, then into its
		 * group, the groups over the threads. */
		for (unsigned t = 0; t < threads; t++) {
			take(&next, k, &q, &d, &ds);
			tmp[t] = (struct simd_act){ q, d, ds, NULL, NULL, NULL };
		}
		for (int64_t g = 0; g < groups; g++) {
			take(&next, k * width, &q, &d, &ds);
			grp[g] = (struct simd_group){ q, d, ds };
		}
		run_parallel(ctx, dev, lent, groups, 1, prep_part, &pj);
		j.tiles = ctx->kernels->tiles[w->type];
		j.grp = grp;
	} else {
		for (int64_t c = 0; c < cols; c++) {
			int16_t *q;
			float *d, *ds;

			take(&next, k, &q, &d, &ds);
			ctx->kernels->quantize((const float *)(xb + c * x->nb[1]), k, q, d, ds);
			act[c] = (struct simd_act){ q, d, ds, NULL, NULL, NULL };
		}
		if (split) {
			float *s16 = (float *)next;
			int8_t *hi = (int8_t *)(s16 + k / 16), *lo = hi + k;

			ctx->kernels->split(act[0].q, k, (int)w->type, hi, lo, s16);
			act[0] = (struct simd_act){ act[0].q, act[0].d, act[0].ds, hi, lo, s16 };
		}
		j.rows = ctx->kernels->rows[w->type];
		j.act = act;
	}
	j.w = w;
	j.ncols = (int)cols;
	j.y = ycol;
	j.row = row;
	j.tile_rows = ctx->kernels->tile_rows;
	run_parallel(ctx, dev, lent, w->n, ROW_GRAIN, run_part, &j);
	return Q4KH_OK;
}

/*
 * y = w x: checks the arguments, then product_to() y's columns.
 */
static q4kh_status product(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                           q4kh_prepared *w, const struct q4kh_tensor *x,
                           const struct q4kh_tensor *y, int gemm)
{
	if (!ctx || !w || !x || !y || !dev || !dev->address)
		return ctx ? fail(ctx, Q4KH_ERR_INVALID, "gemv/gemm: a NULL argument")
		           : Q4KH_ERR_INVALID;
	if (!ctx->kernels) /* prepare() refused every weight: cannot happen */
		return fail(ctx, Q4KH_ERR_UNSUPPORTED, "gemv/gemm: no kernels for this CPU");
	if (!f32_columns(x, w->k) || !f32_columns(y, w->n) || y->ne[1] != x->ne[1] ||
	    x->ne[1] > INT32_MAX)
		return fail(ctx, Q4KH_ERR_INVALID,
		            "gemv/gemm: expected f32 x {%lld, T} and y {%lld, T} with "
		            "contiguous columns; found x type %u {%lld, %lld}, y type %u "
		            "{%lld, %lld}",
		            (long long)w->k, (long long)w->n, x->type, (long long)x->ne[0],
		            (long long)x->ne[1], y->type, (long long)y->ne[0],
		            (long long)y->ne[1]);
	return product_to(ctx, dev, w, x, (uint8_t *)dev->address(y->buffer) + y->offset,
	                  y->nb[1], gemm);
}

static q4kh_status k_gemv(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                          q4kh_prepared *w, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *y)
{
	return product(ctx, dev, w, x, y, 0);
}

static q4kh_status k_gemm(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                          q4kh_prepared *w, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *y)
{
	return product(ctx, dev, w, x, y, 1);
}

/* Is t an F32 vector {n}, values 4 bytes apart? */
static int f32_vector(const struct q4kh_tensor *t, int64_t n)
{
	return t->type == Q4KH_TYPE_F32 && t->ne[0] == n && t->ne[1] == 1 &&
	       t->ne[2] == 1 && t->ne[3] == 1 && t->nb[0] == 4;
}

/*
 * ABI 1.4: y[i] = w[i] x (+ bias[i]) for i < n, one gemv after another,
 * each bias added to every column afterwards, as the backend's add does
 * (one float addition a value): the same results as gemv() and add
 * separately, so that the interpreter's grouping runs end to end on a CPU
 * (the matrices share nothing here that a GPU launch would save). Checks
 * every argument before it computes anything.
 */
static q4kh_status k_gemv_multi(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                                uint32_t n, q4kh_prepared *const w[],
                                const struct q4kh_tensor *x,
                                const struct q4kh_tensor *const y[],
                                const struct q4kh_tensor *const bias[])
{
	q4kh_status st;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (n < 1 || n > Q4KH_GEMV_MULTI_MAX || !w || !x || !y || !dev || !dev->address)
		return fail(ctx, Q4KH_ERR_INVALID,
		            "gemv_multi: n = %u (expected 1 .. %d) or a NULL argument", n,
		            Q4KH_GEMV_MULTI_MAX);
	if (x->ne[1] < 1 || x->ne[1] > MAX_GEMV_COLUMNS)
		return fail(ctx, Q4KH_ERR_INVALID, "gemv_multi: x has %lld columns, expected 1 .. %d",
		            (long long)x->ne[1], MAX_GEMV_COLUMNS);
	for (uint32_t i = 0; i < n; i++) {
		if (!w[i] || !y[i])
			return fail(ctx, Q4KH_ERR_INVALID, "gemv_multi: w[%u] or y[%u] is NULL", i, i);
		if (w[i]->k != w[0]->k)
			return fail(ctx, Q4KH_ERR_INVALID,
			            "gemv_multi: w[%u] has K = %lld, w[0] %lld", i,
			            (long long)w[i]->k, (long long)w[0]->k);
		if (bias && bias[i] && !f32_vector(bias[i], w[i]->n))
			return fail(ctx, Q4KH_ERR_INVALID,
			            "gemv_multi: bias[%u]: expected F32 {%lld} with nb[0] = 4; "
			            "found type %u {%lld, %lld}", i, (long long)w[i]->n,
			            bias[i]->type, (long long)bias[i]->ne[0],
			            (long long)bias[i]->ne[1]);
	}
	for (uint32_t i = 0; i < n; i++) {
		if ((st = product(ctx, dev, w[i], x, y[i], 0)))
			return st;
		if (bias && bias[i]) {
			const float *b = (const float *)((const uint8_t *)dev->address(bias[i]->buffer) +
			                                 bias[i]->offset);
			uint8_t *yb = (uint8_t *)dev->address(y[i]->buffer) + y[i]->offset;

			for (int64_t c = 0; c < y[i]->ne[1]; c++) {
				float *col = (float *)(yb + c * y[i]->nb[1]);

				for (int64_t r = 0; r < w[i]->n; r++)
					col[r] += b[r];
			}
		}
	}
	return Q4KH_OK;
}

/* gemv_glu's activation: gate = act(gate) * up over rows [begin, end). */
struct glu_job {
	float *gate;       /* column c at gate + c * ldg */
	const float *up;   /* column c at up + c * n */
	int64_t ldg, n, cols;
	q4kh_glu_kind kind;
};

static void glu_part(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct glu_job *j = arg;

	(void)part;
	for (int64_t c = 0; c < j->cols; c++) {
		float *g = j->gate + c * j->ldg;
		const float *u = j->up + c * j->n;

		for (int64_t r = begin; r < end; r++)
			g[r] = q4kh_glu_value(j->kind, g[r], u[r]);
	}
}

/* Do the bytes of f32 matrices A and B (host pointers of dev) overlap? */
static int f32_overlap(const struct q4kh_native_device *dev, const struct q4kh_tensor *a,
                       const struct q4kh_tensor *b)
{
	const uint8_t *a0 = (const uint8_t *)dev->address(a->buffer) + a->offset;
	const uint8_t *b0 = (const uint8_t *)dev->address(b->buffer) + b->offset;

	return a0 < b0 + (b->ne[1] - 1) * b->nb[1] + 4 * b->ne[0] &&
	       b0 < a0 + (a->ne[1] - 1) * a->nb[1] + 4 * a->ne[0];
}

/*
 * ABI 1.4: y = act(w_gate x) * (w_up x) as two gemv() and the reference
 * cpu backend's glu give it: the gate product into y, the up product into
 * the context's memory, then every value through the reference's own
 * arithmetic (q4kh_glu_value, sdk/include/q4khost/glu.h), so that the
 * interpreter's fused path runs end to end without a GPU. On a backend
 * that lends its threads (ABI 1.3) it answers Q4KH_ERR_UNSUPPORTED: the
 * ABI does not tell a variant which "cpu" backend it serves, and the one
 * in the tree that lends them, cpu-fast, has a glu of its own arithmetic
 * (vector approximations) that this cannot reproduce; the reference lends
 * none. Checks every argument before it computes anything.
 */
static q4kh_status k_gemv_glu(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                              q4kh_glu_kind kind, q4kh_prepared *w_gate,
                              q4kh_prepared *w_up, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *y)
{
	struct glu_job j;
	size_t want;
	q4kh_status st;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!w_gate || !w_up || !x || !y || !dev || !dev->address)
		return fail(ctx, Q4KH_ERR_INVALID, "gemv_glu: a NULL argument");
	if (w_up->k != w_gate->k || w_up->n != w_gate->n)
		return fail(ctx, Q4KH_ERR_INVALID,
		            "gemv_glu: up {%lld, %lld} and gate {%lld, %lld} differ",
		            (long long)w_up->k, (long long)w_up->n, (long long)w_gate->k,
		            (long long)w_gate->n);
	if (!f32_columns(x, w_gate->k) || !f32_columns(y, w_gate->n) ||
	    y->ne[1] != x->ne[1] || x->ne[1] > MAX_GEMV_COLUMNS)
		return fail(ctx, Q4KH_ERR_INVALID,
		            "gemv_glu: expected f32 x {%lld, T} and y {%lld, T}, T 1 .. %d, "
		            "with contiguous columns; found x type %u {%lld, %lld}, y type "
		            "%u {%lld, %lld}",
		            (long long)w_gate->k, (long long)w_gate->n, MAX_GEMV_COLUMNS,
		            x->type, (long long)x->ne[0], (long long)x->ne[1], y->type,
		            (long long)y->ne[0], (long long)y->ne[1]);
	if (f32_overlap(dev, x, y))
		return fail(ctx, Q4KH_ERR_INVALID, "gemv_glu: y overlaps x");
	if (!ctx->kernels) /* prepare() refused every weight: cannot happen */
		return fail(ctx, Q4KH_ERR_UNSUPPORTED, "gemv_glu: no kernels for this CPU");
	if (kind != Q4KH_GLU_SILU && kind != Q4KH_GLU_GELU_TANH)
		return fail(ctx, Q4KH_ERR_UNSUPPORTED, "gemv_glu: unknown kind %d", (int)kind);
	if (Q4KH_NATIVE_HAS(dev, parallel) && dev->threads > 0)
		return fail(ctx, Q4KH_ERR_UNSUPPORTED,
		            "gemv_glu: the backend lends its threads, and its glu may round "
		            "otherwise than the reference's");
	want = (size_t)(w_up->n * x->ne[1]);
	if (want > ctx->up_size) {
		float *p = realloc(ctx->up, want * sizeof(float));

		if (!p)
			return fail(ctx, Q4KH_ERR_NOMEM, "gemv_glu: cannot allocate %zu floats", want);
		ctx->up = p;
		ctx->up_size = want;
	}
	j = (struct glu_job){ (float *)((uint8_t *)dev->address(y->buffer) + y->offset), ctx->up,
	                      y->nb[1] / 4, w_up->n, x->ne[1], kind };
	if ((st = product_to(ctx, dev, w_gate, x, (uint8_t *)j.gate, y->nb[1], 0)) ||
	    (st = product_to(ctx, dev, w_up, x, (uint8_t *)ctx->up, 4 * w_up->n, 0)))
		return st;
	run_parallel(ctx, dev, 0, w_up->n, ROW_GRAIN, glu_part, &j);
	return Q4KH_OK;
}

static void k_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w)
{
	(void)ctx;
	if (w)
		free(w->packed);
	free(w);
}

static const struct q4kh_kernel_v1 table = {
	.struct_size = sizeof(table),
	.n_types = SIMD_NTYPES,
	.backend = "cpu",
	.types = types,
	.max_gemv_columns = MAX_GEMV_COLUMNS,
	.init = k_init,
	.shutdown = k_shutdown,
	.last_error = k_last_error,
	.score = k_score,
	.prepare = k_prepare,
	.gemv = k_gemv,
	.gemm = k_gemm,
	.release = k_release,
	.gemv_multi = k_gemv_multi,
	.gemv_glu = k_gemv_glu,
	/* activations quantised to int16 (cpu-simd8: int8) per 32 values */
	.arith = ARITH,
};

#ifdef __clang__
#define SIMD_COMPILER __VERSION__
#else
#define SIMD_COMPILER "gcc " __VERSION__
#endif

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_KERNEL,
	.name = NAME,
	.version = PACKAGE_VERSION,
	.vendor = "q4khost",
	.license = "MIT",
	.build_id = SIMD_COMPILER,
	.kernel = &table,
};

Q4KH_PLUGIN_ENTRY(desc)
