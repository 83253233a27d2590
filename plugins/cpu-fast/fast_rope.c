/*
 * RoPE (plugin.h, struct q4kh_rope_params). The angles depend only on the
 * parameters and the position, so the device keeps a table per set of
 * parameters (a model has one or two: Gemma's local and global layers) with
 * a row of cos and sin per position, computed in double the first time a
 * position is met and kept in f32: a decode step computes one row per
 * table instead of one per layer, head and pair. The rotation runs in f32
 * SIMD over (token, head) rows; rope_set_rows (ABI 1.4) writes each
 * rotated row to its cache row as soon as it is rotated, and rope_store
 * (ABI 1.4) does that for the keys, rotates the queries and writes the
 * values to their cache in the same pool job.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fast.h"

/* Tables kept per device; the least recently used goes first. */
#define MAX_TABLES 8

struct fast_angles {
	struct fast_angles *next;
	struct q4kh_rope_params p; /* freq_factors: NULL; ff holds them */
	float *ff;                 /* n_rot / 2 factors, or NULL */
	double *freq;              /* per pair: theta / position */
	int64_t row_len;           /* floats per position */
	int64_t cap;               /* positions with room */
	uint8_t *ready;            /* per position: its row is computed */
	float *rows;
};

static int same_params(const struct fast_angles *a, const struct q4kh_rope_params *p,
                       const float *ff)
{
	const struct q4kh_rope_params *q = &a->p;

	return q->n_rot == p->n_rot && q->mode == p->mode && q->base == p->base &&
	       q->freq_scale == p->freq_scale && q->ext_factor == p->ext_factor &&
	       q->attn_factor == p->attn_factor && q->beta_fast == p->beta_fast &&
	       q->beta_slow == p->beta_slow && q->n_ctx_orig == p->n_ctx_orig &&
	       !a->ff == !ff &&
	       (!ff || !memcmp(a->ff, ff, sizeof(float) * (size_t)(p->n_rot / 2)));
}

static void angles_free(struct fast_angles *a)
{
	free(a->ff);
	free(a->freq);
	free(a->ready);
	free(a->rows);
	free(a);
}

void fast_angles_free(q4kh_device_ctx *dev)
{
	while (dev->angles) {
		struct fast_angles *a = dev->angles;

		dev->angles = a->next;
		angles_free(a);
	}
}

/* YaRN's d(b): the pair index whose wavelength fits b times in n_ctx_orig. */
static double yarn_dim(const struct q4kh_rope_params *p, double beta)
{
	return p->n_rot * log(p->n_ctx_orig / (beta * 2.0 * M_PI)) / (2.0 * log((double)p->base));
}

/*
 * Per pair i, theta / position as plugin.h's formula says, in double:
 * base^(-2i/n_rot) / ff[i], times freq_scale mixed with 1 by YaRN's ramp.
 */
static void fill_freq(struct fast_angles *a)
{
	const struct q4kh_rope_params *p = &a->p;
	double lo = 0.0, hi = 0.0;

	if (p->ext_factor != 0.0f) {
		lo = fmax(0.0, floor(yarn_dim(p, p->beta_fast)));
		hi = fmin(p->n_rot - 1, ceil(yarn_dim(p, p->beta_slow)));
	}
	for (int32_t i = 0; i < p->n_rot / 2; i++) {
		double extrap = pow((double)p->base, -2.0 * i / p->n_rot) / (a->ff ? a->ff[i] : 1.0);
		double mix = p->freq_scale;

		if (p->ext_factor != 0.0f) {
			double r = p->ext_factor *
			           (1.0 - fmin(1.0, fmax(0.0, (i - lo) / fmax(0.001, hi - lo))));

			mix = mix * (1.0 - r) + r;
		}
		a->freq[i] = extrap * mix;
	}
}

static struct fast_angles *angles_new(const struct q4kh_rope_params *p, const float *ff)
{
	struct fast_angles *a = calloc(1, sizeof(*a));
	const size_t half = (size_t)(p->n_rot / 2);

	if (!a)
		return NULL;
	a->p = *p;
	a->p.freq_factors = NULL;
	a->row_len = p->mode == Q4KH_ROPE_NORM ? 2 * p->n_rot : p->n_rot;
	a->freq = malloc(sizeof(double) * half);
	a->ff = ff ? malloc(sizeof(float) * half) : NULL;
	if (!a->freq || (ff && !a->ff)) {
		angles_free(a);
		return NULL;
	}
	if (ff)
		memcpy(a->ff, ff, sizeof(float) * half);
	fill_freq(a);
	return a;
}

/* The table of P on DEV, moved to the front; NULL when out of memory. */
static struct fast_angles *angles_for(q4kh_device_ctx *dev, const struct q4kh_rope_params *p,
                                      const float *ff)
{
	struct fast_angles **link = &dev->angles, *a;
	int n = 0;

	for (; *link; link = &(*link)->next, n++)
		if (same_params(*link, p, ff)) {
			a = *link;
			*link = a->next;
			a->next = dev->angles;
			dev->angles = a;
			return a;
		}
	a = angles_new(p, ff);
	if (!a)
		return NULL;
	if (n == MAX_TABLES) { /* drop the last: the least recently used */
		for (link = &dev->angles; (*link)->next; link = &(*link)->next)
			;
		angles_free(*link);
		*link = NULL;
	}
	a->next = dev->angles;
	dev->angles = a;
	return a;
}

/* Room for positions [0, need); -1 when out of memory. */
static int angles_reserve(struct fast_angles *a, int64_t need)
{
	int64_t cap = a->cap ? a->cap : 64;
	uint8_t *ready;
	float *rows;

	if (need <= a->cap)
		return 0;
	while (cap < need)
		cap *= 2;
	rows = realloc(a->rows, sizeof(float) * (size_t)(cap * a->row_len));
	if (!rows)
		return -1;
	a->rows = rows;
	ready = realloc(a->ready, (size_t)cap);
	if (!ready)
		return -1;
	memset(ready + a->cap, 0, (size_t)(cap - a->cap));
	a->ready = ready;
	a->cap = cap;
	return 0;
}

/* Row of position POS: NEOX c[half] s[half], NORM cc[n_rot] ss[n_rot]
 * (fast.h, rope_norm). cos and sin carry the magnitude m of plugin.h. */
static void fill_row(const struct fast_angles *a, int64_t pos, float *row)
{
	const struct q4kh_rope_params *p = &a->p;
	const int32_t half = p->n_rot / 2;
	double m = p->attn_factor;

	if (p->ext_factor != 0.0f)
		m *= 1.0 + 0.1 * log(1.0 / p->freq_scale);
	for (int32_t i = 0; i < half; i++) {
		const double theta = (double)pos * a->freq[i];
		const float c = (float)(cos(theta) * m), s = (float)(sin(theta) * m);

		if (p->mode == Q4KH_ROPE_NORM) {
			row[2 * i] = row[2 * i + 1] = c;
			row[p->n_rot + 2 * i] = -s;
			row[p->n_rot + 2 * i + 1] = s;
		} else {
			row[i] = c;
			row[half + i] = s;
		}
	}
}

/*
 * Row X of HD values rotated at position POS (table A's row ready) into
 * O, which may be X; with C (not NULL, a row of type CTYPE) O also
 * converted to C, as set_rows writes it.
 */
static void rope_row(const struct fast_kernels *k, const struct fast_angles *a, int32_t pos,
                     int64_t hd, const float *x, float *o, uint32_t ctype, void *c)
{
	const int32_t n_rot = a->p.n_rot;
	const float *row = a->rows + (int64_t)pos * a->row_len;

	if (a->p.mode == Q4KH_ROPE_NORM)
		k->rope_norm(x, row, row + n_rot, o, n_rot);
	else
		k->rope_neox(x, row, row + n_rot / 2, o, n_rot / 2);
	if (o != x)
		memcpy(o + n_rot, x + n_rot, sizeof(float) * (size_t)(hd - n_rot));
	if (c)
		fast_convert(k, Q4KH_TYPE_F32, ctype, o, c, hd);
}

struct rope_job {
	const struct fast_kernels *k;
	const struct q4kh_tensor *x, *out;
	const struct fast_angles *a;
	const int32_t *pos;
	const struct q4kh_tensor *cache; /* rope_set_rows: out's rows go to
	                                    cache rows pos; else NULL */
};

static void rope_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct rope_job *j = arg;
	const int64_t heads = j->x->ne[1];

	(void)thread;
	for (int64_t r = begin; r < end; r++) {
		const int64_t h = r % heads, t = r / heads;

		rope_row(j->k, j->a, j->pos[t], j->x->ne[0],
		         (const float *)q4kh_cpu_at(j->x, h, t, 0),
		         (float *)q4kh_cpu_at(j->out, h, t, 0), j->cache ? j->cache->type : 0,
		         j->cache ? q4kh_cpu_at(j->cache, h, j->pos[t], 0) : NULL);
	}
}

/*
 * The table of P (frequency factors FF) with the rows of positions
 * pos[0 .. n) (each >= 0) computed; NULL, the device's error set, when
 * out of memory.
 */
static struct fast_angles *angles_at(q4kh_device_ctx *dev, const struct q4kh_rope_params *p,
                                     const float *ff, const int32_t *pos, int64_t n)
{
	struct fast_angles *a = angles_for(dev, p, ff);
	int64_t last = 0;

	for (int64_t t = 0; t < n; t++)
		last = pos[t] > last ? pos[t] : last;
	if (!a || angles_reserve(a, last + 1)) {
		fast_fail(dev->ctx, Q4KH_ERR_NOMEM,
		          "rope: out of memory for the angles of %lld positions",
		          (long long)last + 1);
		return NULL;
	}
	for (int64_t t = 0; t < n; t++)
		if (!a->ready[pos[t]]) {
			fill_row(a, pos[t], a->rows + (int64_t)pos[t] * a->row_len);
			a->ready[pos[t]] = 1;
		}
	return a;
}

/*
 * rope of checked x over positions pos[0 .. x->ne[2]) (each >= 0), and
 * with CACHE (not NULL; every position one of its rows) set_rows of out
 * at those positions.
 */
static q4kh_status rope_run(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                            const int32_t *pos, const struct q4kh_rope_params *p,
                            const float *ff, const struct q4kh_tensor *out,
                            const struct q4kh_tensor *cache)
{
	struct rope_job j = { dev->k, x, out, angles_at(dev, p, ff, pos, x->ne[2]), pos, cache };

	if (!j.a)
		return Q4KH_ERR_NOMEM;
	q4kh_pool_run(dev->pool, x->ne[1] * x->ne[2], fast_grain(x->ne[0]), rope_task, &j);
	return Q4KH_OK;
}

q4kh_status fast_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x, const int32_t *pos,
                      int32_t n_rot, q4kh_rope_mode mode, float base, float freq_scale,
                      const struct q4kh_tensor *out)
{
	const struct q4kh_rope_params p = {
		.struct_size = sizeof(p), .n_rot = n_rot, .mode = (uint32_t)mode,
		.base = base, .freq_scale = freq_scale, .attn_factor = 1.0f,
	};
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope(&c, x, pos, n_rot, mode, base, freq_scale, out)))
		return st;
	/* The angle tables are indexed by position: the host's are never
	 * negative. */
	for (int64_t t = 0; t < x->ne[2]; t++)
		if (pos[t] < 0)
			return fast_fail(dev->ctx, Q4KH_ERR_UNSUPPORTED,
			                 "rope: pos[%lld] = %d: this backend rotates positions "
			                 ">= 0 only",
			                 (long long)t, pos[t]);
	return rope_run(dev, x, pos, &p, NULL, out, NULL);
}

/* rope_run with the positions and frequency factors of checked device
 * tensors (rope_ext, rope_set_rows). */
static q4kh_status rope_ext_run(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                const struct q4kh_tensor *pos,
                                const struct q4kh_rope_params *p,
                                const struct q4kh_tensor *out,
                                const struct q4kh_tensor *cache)
{
	const float *ff = p->freq_factors ? (const float *)q4kh_cpu_at(p->freq_factors, 0, 0, 0)
	                                  : NULL;

	return rope_run(dev, x, (const int32_t *)q4kh_cpu_at(pos, 0, 0, 0), p, ff, out, cache);
}

q4kh_status fast_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *pos, const struct q4kh_rope_params *p,
                          const struct q4kh_tensor *out)
{
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_rope_ext(&c, x, pos, p, out)) ||
	    (st = fast_index_values(dev, "rope_ext pos", pos, INT32_MAX)))
		return st;
	return rope_ext_run(dev, x, pos, p, out, NULL);
}

q4kh_status fast_rope_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                               const struct q4kh_tensor *pos, const struct q4kh_rope_params *p,
                               const struct q4kh_tensor *cache)
{
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st, rows;

	/* the positions as rope_ext checks them, then as set_rows' rows: one
	 * past the cache fails set_rows alone, after x is rotated (U2) */
	if ((st = q4kh_check_rope_set_rows(&c, x, pos, p, cache)) ||
	    (st = fast_index_values(dev, "rope_ext pos", pos, INT32_MAX)))
		return st;
	rows = fast_index_values(dev, "set_rows rows", pos, cache->ne[2]);
	st = rope_ext_run(dev, x, pos, p, x, rows ? NULL : cache);
	return st ? st : rows;
}

struct store_job {
	const struct fast_kernels *k;
	const struct fast_angles *a;
	const int32_t *pos;
	const struct q4kh_tensor *q, *kx, *v;
	const struct q4kh_tensor *k_cache, *v_cache; /* NULL: that cache not written */
};

/* Rows r of a token's q heads, then its k heads, then its v heads. */
static void store_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	const struct store_job *j = arg;
	const int64_t hq = j->q->ne[1], hk = j->kx->ne[1];
	const int64_t per_token = hq + hk + j->v->ne[1];

	(void)thread;
	for (int64_t r = begin; r < end; r++) {
		const int64_t t = r / per_token;
		const int32_t pos = j->pos[t];
		int64_t h = r % per_token;

		if (h < hq) {
			float *x = (float *)q4kh_cpu_at(j->q, h, t, 0);

			rope_row(j->k, j->a, pos, j->q->ne[0], x, x, 0, NULL);
		} else if ((h -= hq) < hk) {
			float *x = (float *)q4kh_cpu_at(j->kx, h, t, 0);

			rope_row(j->k, j->a, pos, j->kx->ne[0], x, x,
			         j->k_cache ? j->k_cache->type : 0,
			         j->k_cache ? q4kh_cpu_at(j->k_cache, h, pos, 0) : NULL);
		} else if (j->v_cache) {
			h -= hk;
			fast_convert(j->k, Q4KH_TYPE_F32, j->v_cache->type,
			             q4kh_cpu_at(j->v, h, t, 0), q4kh_cpu_at(j->v_cache, h, pos, 0),
			             j->v->ne[0]);
		}
	}
}

q4kh_status fast_rope_store(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                            const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                            const struct q4kh_tensor *pos, const struct q4kh_rope_params *p,
                            const struct q4kh_tensor *k_cache,
                            const struct q4kh_tensor *v_cache)
{
	const struct q4kh_check c = fast_contract(dev);
	struct store_job j = { dev ? dev->k : NULL, NULL, NULL, q, k, v, k_cache, v_cache };
	q4kh_status st, k_rows, v_rows;

	/* the positions as rope_ext checks them, then as each set_rows' rows:
	 * one past a cache fails that cache's set_rows alone (U2, U4): q and k
	 * are rotated, the other cache written. v's check first, so that the
	 * line left is k's when both fail (a check that passes writes none). */
	if ((st = q4kh_check_rope_store(&c, q, k, v, pos, p, k_cache, v_cache)) ||
	    (st = fast_index_values(dev, "rope_ext pos", pos, INT32_MAX)))
		return st;
	v_rows = fast_index_values(dev, "set_rows rows", pos, v_cache->ne[2]);
	k_rows = fast_index_values(dev, "set_rows rows", pos, k_cache->ne[2]);
	if (k_rows)
		j.k_cache = NULL;
	if (v_rows)
		j.v_cache = NULL;
	j.pos = (const int32_t *)q4kh_cpu_at(pos, 0, 0, 0);
	j.a = angles_at(dev, p,
	                p->freq_factors ? (const float *)q4kh_cpu_at(p->freq_factors, 0, 0, 0)
	                                : NULL,
	                j.pos, q->ne[2]);
	if (!j.a)
		return Q4KH_ERR_NOMEM;
	q4kh_pool_run(dev->pool, (q->ne[1] + k->ne[1] + v->ne[1]) * q->ne[2],
	              fast_grain(q->ne[0]), store_task, &j);
	return k_rows ? k_rows : v_rows;
}
