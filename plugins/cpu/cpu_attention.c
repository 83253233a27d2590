/*
 * Causal grouped-query attention over the KV cache, in double. For query
 * t of head h at position p, over the visible keys i = first .. p:
 *   s_i = scale * dot(q, K_i)  (cpu_lanes.h's order), then the soft cap;
 *   e_i = exp(s_i - max s), sum = e_first + ... + e_p in increasing i;
 *   out = (e_first V_first + ... + e_p V_p) / sum, each dimension summed
 *   in increasing i.
 * So a query's output depends on its own position and keys only: the same
 * bits whatever the batch, the thread count or the blocking below, and
 * whether its keys come from a contiguous cache or, through a block table,
 * from pages of a pool (attention_paged: only the row each key is read
 * from changes, in cache_rows).
 *
 * One work item is one KV head (group) and a block of TOKENS queries'
 * tokens: the group's n_rep heads of each, whose key ranges are equal.
 * The item walks its keys in blocks of KEYS rows, converted once into
 * double and used by every query of the item while in L1 and L2: first
 * for the scores (register tiles of keys x heads), then, after each
 * query's softmax, for the weighted sum (tiles of heads x 4 vectors of
 * dimensions: 32 with AVX-512, else 16).
 */
/* The kernels below need -O3's vectoriser; the build's CFLAGS say -O2. */
#pragma GCC optimize("O3")

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "cpu_lanes.h"

#define TOKENS 16 /* query tokens per work item */
#define KEYS 64   /* key rows converted together */

typedef cpu_v8d v8d;

struct attn_job {
	const struct q4kh_tensor *q, *k, *v, *out;
	q4kh_device_ctx *dev;
	const int32_t *pos; /* query t's position; NULL: pos0 + t */
	const int32_t *pages; /* the block table; NULL: key j is row j */
	int64_t page_size;
	int64_t pos0;
	int32_t window;
	double scale, softcap;
	int64_t hd, rep, n_kv, n_tok, blocks;
	int64_t span; /* the most keys one item sees */
	int isa;      /* cpu_lanes_isa() */
};

/* One item's work and its scratch. */
struct attn_item {
	const struct attn_job *j;
	int64_t g, t0, nt; /* group, tokens t0 .. t0+nt-1 */
	int64_t lo, n;     /* its keys lo .. lo+n-1 */
	double *qd;        /* [nt * rep][hd] the queries */
	double *s;         /* [nt * rep][n] scores, then weights */
	v8d *acc;          /* [nt * rep][hd / 8] the weighted sums */
	double *rows;      /* [KEYS][hd] a block of K or V rows */
	v8d *tile;         /* [4 * 4] a tile's lanes */
};

static int64_t pos_of(const struct attn_job *j, int64_t t)
{
	return j->pos ? j->pos[t] : j->pos0 + t;
}

static int64_t first_of(const struct attn_job *j, int64_t p)
{
	return j->window && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
}

/* The row of cache C holding key I: I itself, or its slot in the pool. */
static int64_t slot_of(const struct attn_job *j, int64_t i)
{
	return j->pages ? j->pages[i / j->page_size] * j->page_size + i % j->page_size : i;
}

/* Keys i0 .. i0+n-1 of group G of cache C (f32 or f16), as doubles. */
static void cache_rows(const struct attn_job *j, const struct q4kh_tensor *c, int64_t g,
                       int64_t i0, int64_t n, double *out)
{
	for (int64_t r = 0; r < n; r++, out += j->hd) {
		const unsigned char *p = q4kh_cpu_at(c, g, slot_of(j, i0 + r), 0);

		if (c->type == Q4KH_TYPE_F32)
			for (int64_t i = 0; i < j->hd; i++)
				out[i] = ((const float *)p)[i];
		else
			for (int64_t i = 0; i < j->hd; i++)
				out[i] = j->dev->f16[((const uint16_t *)p)[i]];
	}
}

/*
 * Scores of keys i0 .. i0+nk-1 (rows of it->rows from R) against heads
 * h0 .. h0+NH-1 of token row QT, in tiles of NK keys, vectors of VW lanes.
 */
static inline __attribute__((always_inline)) void
scores(const struct attn_item *it, int64_t qt, int64_t h0, int64_t i0, int64_t nk,
       const double *r, const int NK, const int NH, const int VW)
{
	const int64_t hd = it->j->hd, body = hd - hd % CPU_LANES;
	const double *q = it->qd + (qt * it->j->rep + h0) * hd;
	double *s = it->s + (qt * it->j->rep + h0) * it->n + (i0 - it->lo);

	for (int64_t i = 0; i < nk;) {
		const int nr = nk - i >= NK ? NK : 1;
		const double *kr = r + i * hd;

		memset(it->tile, 0, sizeof(v8d) * NK * NH);
		if (nr == NK)
			cpu_lanes_tile(kr, hd, q, hd, body, NK, NH, it->tile, NH, VW);
		else
			cpu_lanes_tile(kr, hd, q, hd, body, 1, NH, it->tile, NH, VW);
		for (int a = 0; a < nr; a++)
			for (int h = 0; h < NH; h++) {
				v8d *l = &it->tile[a * NH + h];

				for (int64_t d = body; d < hd; d++)
					(*l)[d - body] += kr[a * hd + d] * q[h * hd + d];
				s[h * it->n + i + a] = it->j->scale * cpu_lanes_sum(l);
			}
		i += nr;
	}
}

/*
 * acc of heads h0 .. h0+NH-1 of token row QT += weights x V rows i0 ..
 * i0+nk-1 (rows of it->rows from R), in tiles of NH heads x 4 vectors of
 * type VT (then one), as NAME; the dimensions past the last eight alone.
 * Each dimension's sum runs in increasing i whatever VT: one body for
 * cpu_v8d (AVX-512) and cpu_v4d (cpu_lanes_tile says why both). NAME_tile
 * is one tile of NU vectors, NU constant so that the tile lives in
 * registers: acc (heads LDA doubles apart) += W (heads LDW apart) x R
 * (rows HD apart).
 */
#define WEIGH_OF(NAME, VT)                                                                  \
	static inline __attribute__((always_inline)) void NAME##_tile(                      \
		const double *w, int64_t ldw, double *acc, int64_t lda, const double *r,    \
		int64_t hd, int64_t nk, const int NH, const int NU)                         \
	{                                                                                   \
		enum { VL = sizeof(VT) / sizeof(double) };                                  \
		VT a[4][4];                                                                 \
                                                                                            \
		for (int h = 0; h < NH; h++)                                                \
			for (int x = 0; x < NU; x++)                                        \
				memcpy(&a[h][x], acc + h * lda + x * VL, sizeof(VT));       \
		for (int64_t i = 0; i < nk; i++) {                                          \
			VT vv[4];                                                           \
                                                                                            \
			_Pragma("GCC unroll 4") for (int x = 0; x < NU; x++)                \
				memcpy(&vv[x], r + i * hd + x * VL, sizeof(VT));            \
			_Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {              \
				const double e = w[h * ldw + i];                            \
                                                                                            \
				_Pragma("GCC unroll 4") for (int x = 0; x < NU; x++)        \
					a[h][x] += e * vv[x];                               \
			}                                                                   \
		}                                                                           \
		for (int h = 0; h < NH; h++)                                                \
			for (int x = 0; x < NU; x++)                                        \
				memcpy(acc + h * lda + x * VL, &a[h][x], sizeof(VT));       \
	}                                                                                   \
	static inline __attribute__((always_inline)) void NAME(                             \
		const struct attn_item *it, int64_t qt, int64_t h0, int64_t i0, int64_t nk, \
		const double *r, const int NH)                                              \
	{                                                                                   \
		enum { VL = sizeof(VT) / sizeof(double) };                                  \
		const int64_t hd = it->j->hd, body = hd - hd % CPU_LANES, rep = it->j->rep; \
		const double *w = it->s + (qt * rep + h0) * it->n + (i0 - it->lo);          \
		double *acc = (double *)(it->acc + (qt * rep + h0) * (hd / CPU_LANES));     \
		int64_t u = 0;                                                              \
                                                                                            \
		for (; u + 4 * VL <= body; u += 4 * VL)                                     \
			NAME##_tile(w, it->n, acc + u, body, r + u, hd, nk, NH, 4);         \
		for (; u < body; u += VL)                                                   \
			NAME##_tile(w, it->n, acc + u, body, r + u, hd, nk, NH, 1);         \
	}

WEIGH_OF(weigh8, v8d)
WEIGH_OF(weigh4, cpu_v4d)

/* weigh8 or weigh4, by VW. */
static inline __attribute__((always_inline)) void
weigh(const struct attn_item *it, int64_t qt, int64_t h0, int64_t i0, int64_t nk,
      const double *r, const int NH, const int VW)
{
	if (VW == CPU_LANES)
		weigh8(it, qt, h0, i0, nk, r, NH);
	else
		weigh4(it, qt, h0, i0, nk, r, NH);
}

/* The dimensions past the last eight, for head row QH (weights W). */
static void weigh_tail(const struct attn_item *it, int64_t qh, int64_t i0, int64_t nk,
                       const double *r, double *tail)
{
	const int64_t hd = it->j->hd, body = hd - hd % CPU_LANES;
	const double *w = it->s + qh * it->n + (i0 - it->lo);

	for (int64_t i = 0; i < nk; i++)
		for (int64_t d = body; d < hd; d++)
			tail[qh * hd + d] += w[i] * r[i * hd + d];
}

/*
 * Keys of token row QT within block [b0, b0 + nb): *i0 and the count (0
 * when none).
 */
static int64_t visible(const struct attn_item *it, int64_t qt, int64_t b0, int64_t nb,
                       int64_t *i0)
{
	const int64_t p = pos_of(it->j, it->t0 + qt), f = first_of(it->j, p);
	const int64_t a = f > b0 ? f : b0, z = p < b0 + nb - 1 ? p : b0 + nb - 1;

	*i0 = a;
	return z >= a ? z - a + 1 : 0;
}

/* One block's scores or weighted sums for every query of IT, heads in
 * tiles of NH (then one), keys in tiles of NK, vectors of VW lanes. */
static inline __attribute__((always_inline)) void
block_pass(const struct attn_item *it, int64_t b0, int64_t nb, int pass, double *tail,
           const int NK, const int NH, const int VW)
{
	const int64_t rep = it->j->rep;

	for (int64_t qt = 0; qt < it->nt; qt++) {
		int64_t i0, nk = visible(it, qt, b0, nb, &i0);
		const double *r = it->rows + (i0 - b0) * it->j->hd;

		if (!nk)
			continue;
		for (int64_t h = 0; h < rep;) {
			const int nh = rep - h >= NH ? NH : 1;

			if (pass == 0 && nh == NH)
				scores(it, qt, h, i0, nk, r, NK, NH, VW);
			else if (pass == 0)
				scores(it, qt, h, i0, nk, r, NK, 1, VW);
			else if (nh == NH)
				weigh(it, qt, h, i0, nk, r, NH, VW);
			else
				weigh(it, qt, h, i0, nk, r, 1, VW);
			if (pass == 1 && it->j->hd % CPU_LANES)
				for (int x = 0; x < nh; x++)
					weigh_tail(it, qt * rep + h + x, i0, nk, r, tail);
			h += nh;
		}
	}
}

typedef void pass_fn(const struct attn_item *it, int64_t b0, int64_t nb, int pass,
                     double *tail);

static void pass_2x2(const struct attn_item *it, int64_t b0, int64_t nb, int pass,
                     double *tail)
{
	block_pass(it, b0, nb, pass, tail, 2, 2, 4);
}

#if CPU_LANES_TARGETS
CPU_TARGET_AVX2 static void pass_avx2(const struct attn_item *it, int64_t b0, int64_t nb,
                                      int pass, double *tail)
{
	block_pass(it, b0, nb, pass, tail, 2, 2, 4);
}

CPU_TARGET_AVX512 static void pass_avx512(const struct attn_item *it, int64_t b0,
                                          int64_t nb, int pass, double *tail)
{
	block_pass(it, b0, nb, pass, tail, 4, 4, 8);
}
#endif

static pass_fn *pick_pass(int isa)
{
	switch (isa) {
#if CPU_LANES_TARGETS
	case 2: return pass_avx512;
	case 1: return pass_avx2;
#endif
	default: return pass_2x2;
	}
}

/* Each query's scores of IT into weights (e_i), and their sums. */
static void softmax(const struct attn_item *it, double *sums)
{
	const struct attn_job *j = it->j;

	for (int64_t qt = 0; qt < it->nt; qt++) {
		const int64_t p = pos_of(j, it->t0 + qt), f = first_of(j, p);

		for (int64_t h = 0; h < j->rep; h++) {
			double *s = it->s + (qt * j->rep + h) * it->n - it->lo;
			double max = -INFINITY, sum = 0.0;

			for (int64_t i = f; i <= p; i++) {
				if (j->softcap > 0.0)
					s[i] = j->softcap * tanh(s[i] / j->softcap);
				if (s[i] > max)
					max = s[i];
			}
			for (int64_t i = f; i <= p; i++) {
				s[i] = exp(s[i] - max);
				sum += s[i];
			}
			sums[qt * j->rep + h] = sum;
		}
	}
}

/* Work item R: group R mod n_kv; token blocks paired early with late, so
 * that contiguous parts of the items cost about the same. */
static void item_of(const struct attn_job *j, int64_t r, struct attn_item *it)
{
	const int64_t half = r / j->n_kv;
	const int64_t b = half % 2 ? j->blocks - 1 - half / 2 : half / 2;
	int64_t hi = 0;

	it->g = r % j->n_kv;
	it->t0 = b * TOKENS;
	it->nt = j->n_tok - it->t0 < TOKENS ? j->n_tok - it->t0 : TOKENS;
	it->lo = INT64_MAX;
	for (int64_t t = it->t0; t < it->t0 + it->nt; t++) {
		const int64_t p = pos_of(j, t), f = first_of(j, p);

		it->lo = f < it->lo ? f : it->lo;
		hi = p > hi ? p : hi;
	}
	it->n = hi - it->lo + 1;
}

static void attn_task(void *arg, unsigned part, int64_t begin, int64_t end)
{
	const struct attn_job *j = arg;
	const int64_t hd = j->hd, nq = TOKENS * j->rep;
	pass_fn *pass = pick_pass(j->isa);
	struct attn_item it = { .j = j };
	v8d *base = j->dev->scratch.part[part];
	double *sum, *tail;

	it.tile = base;
	it.acc = base + 16;
	it.qd = (double *)(it.acc + nq * (hd / CPU_LANES));
	it.rows = it.qd + nq * hd;
	sum = it.rows + KEYS * hd;
	tail = sum + nq;
	it.s = tail + nq * hd;
	for (int64_t r = begin; r < end; r++) {
		item_of(j, r, &it);
		for (int64_t t = 0; t < it.nt; t++)
			for (int64_t h = 0; h < j->rep; h++) {
				const float *q = (const float *)q4kh_cpu_at(j->q, it.g * j->rep + h,
				                                        it.t0 + t, 0);

				for (int64_t d = 0; d < hd; d++)
					it.qd[(t * j->rep + h) * hd + d] = q[d];
			}
		memset(it.acc, 0, sizeof(v8d) * (size_t)(it.nt * j->rep * (hd / CPU_LANES)));
		memset(tail, 0, sizeof(double) * (size_t)(it.nt * j->rep * hd));
		for (int ps = 0; ps < 2; ps++) {
			for (int64_t b0 = it.lo; b0 < it.lo + it.n; b0 += KEYS) {
				const int64_t nb = it.lo + it.n - b0 < KEYS ? it.lo + it.n - b0 : KEYS;

				cache_rows(j, ps ? j->v : j->k, it.g, b0, nb, it.rows);
				pass(&it, b0, nb, ps, tail);
			}
			if (!ps)
				softmax(&it, sum);
		}
		for (int64_t t = 0; t < it.nt; t++)
			for (int64_t h = 0; h < j->rep; h++) {
				const int64_t qh = t * j->rep + h;
				const double *a = (const double *)(it.acc + qh * (hd / CPU_LANES));
				float *o = (float *)q4kh_cpu_at(j->out, it.g * j->rep + h,
				                                it.t0 + t, 0);

				for (int64_t d = 0; d < hd - hd % CPU_LANES; d++)
					o[d] = (float)(a[d] / sum[qh]);
				for (int64_t d = hd - hd % CPU_LANES; d < hd; d++)
					o[d] = (float)(tail[qh * hd + d] / sum[qh]);
			}
	}
}

/* Run job J, checked, whose queries reach at most key position LAST. */
static q4kh_status attn_run(q4kh_device_ctx *dev, struct attn_job *j,
                            const struct q4kh_attn_params *params, int64_t last)
{
	const int64_t hd = j->q->ne[0], nq = TOKENS * (j->q->ne[1] / j->k->ne[1]);
	q4kh_status st;

	j->window = params->window;
	j->scale = params->scale;
	j->softcap = params->softcap;
	j->hd = hd;
	j->n_kv = j->k->ne[1];
	j->rep = j->q->ne[1] / j->n_kv;
	j->n_tok = j->q->ne[2];
	j->blocks = (j->n_tok + TOKENS - 1) / TOKENS;
	/* a block of TOKENS consecutive positions sees at most window +
	 * TOKENS - 1 keys; positions given one by one, any of them */
	j->span = !j->pos && j->window && j->window + TOKENS < last + 1 ? j->window + TOKENS
	                                                                : last + 1;
	j->isa = cpu_lanes_isa();
	/* the tile, sums, queries, a block of rows, 1/sums, tails, scores */
	st = cpu_scratch_reserve(dev, sizeof(v8d) * 16 +
	                                      sizeof(double) *
	                                              (uint64_t)(nq * hd * 3 + KEYS * hd + nq +
	                                                         nq * j->span));
	if (st)
		return st;
	q4kh_pool_run(dev->pool, j->n_kv * j->blocks, 1, attn_task, j);
	return Q4KH_OK;
}

q4kh_status cpu_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                          const struct q4kh_tensor *k_cache,
                          const struct q4kh_tensor *v_cache,
                          const struct q4kh_attn_params *params,
                          const struct q4kh_tensor *out)
{
	struct attn_job j = { .q = q, .k = k_cache, .v = v_cache, .out = out, .dev = dev };
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_attention(&c, q, k_cache, v_cache, params, out)))
		return st;
	j.pos0 = params->pos0;
	return attn_run(dev, &j, params, params->pos0 + q->ne[2] - 1);
}

q4kh_status cpu_attention_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                              const struct q4kh_tensor *k_cache,
                              const struct q4kh_tensor *v_cache,
                              const struct q4kh_tensor *pos,
                              const struct q4kh_attn_params *params,
                              const struct q4kh_tensor *out)
{
	struct attn_job j = { .q = q, .k = k_cache, .v = v_cache, .out = out, .dev = dev };
	const struct q4kh_check c = cpu_contract(dev);
	int64_t last = 0;
	q4kh_status st;

	if ((st = q4kh_check_attention_ext(&c, q, k_cache, v_cache, pos, params, out)) ||
	    (st = cpu_index_values(dev, "attention_ext pos", pos, k_cache->ne[2])))
		return st;
	j.pos = (const int32_t *)q4kh_cpu_at(pos, 0, 0, 0);
	for (int64_t t = 0; t < q->ne[2]; t++)
		if (j.pos[t] > last)
			last = j.pos[t];
	return attn_run(dev, &j, params, last);
}

q4kh_status cpu_attention_paged(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                const struct q4kh_tensor *k_pool,
                                const struct q4kh_tensor *v_pool,
                                const struct q4kh_tensor *pos,
                                const struct q4kh_tensor *pages, int32_t page_size,
                                const struct q4kh_attn_params *params,
                                const struct q4kh_tensor *out)
{
	struct attn_job j = { .q = q, .k = k_pool, .v = v_pool, .out = out, .dev = dev };
	const struct q4kh_check c = cpu_contract(dev);
	int64_t last = 0;
	q4kh_status st;

	if ((st = q4kh_cpu_attention_paged_args(&c, q, k_pool, v_pool, pos, pages, page_size,
	                                        params, out, &j.pos, &j.pages, &last)))
		return st;
	j.page_size = page_size;
	return attn_run(dev, &j, params, last);
}
