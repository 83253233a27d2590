/* What the cpu plugin's suites share: tests/cpu_ops_helpers.h. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops_helpers.h"
#include "helpers.h"

/* --- the plugin under a test host --------------------------------------- */

static const char *test_config(void *host_data, const char *key)
{
	const struct env *e = host_data;

	return strcmp(key, "threads") == 0 ? e->threads : NULL;
}

static void test_log(void *host_data, q4kh_log_level level, const char *msg)
{
	(void)host_data;
	(void)level;
	(void)msg;
}

void env_load(struct env *e)
{
	e->desc = test_plugin_load("plugins/cpu/.libs/cpu.so", &e->dl);
	e->b = e->desc->backend;
	cr_assert_not_null(e->b);
	e->api = test_host_api(e, test_config);
	e->api.log = test_log;
}

struct env *env_open(const char *threads)
{
	struct env *e = calloc(1, sizeof(*e));

	cr_assert_not_null(e);
	e->threads = threads;
	env_load(e);
	cr_assert_eq(e->b->init(&e->api, &e->ctx), Q4KH_OK, "init: %s",
	             e->b->last_error(NULL));
	cr_assert_eq(e->b->device_open(e->ctx, 0, &e->dev), Q4KH_OK,
	             "device_open: %s", e->b->last_error(e->ctx));
	return e;
}

void env_close(struct env *e)
{
	e->b->device_close(e->dev);
	e->b->shutdown(e->ctx);
	dlclose(e->dl);
	free(e);
}

/* --- random numbers and fp16, independent of the plugin ------------------ */

uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static int rng_int(int lo, int hi) /* inclusive */
{
	return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

/* Uniform in +-[0.1, 1): random, never zero. */
static float rng_val(void)
{
	double u = (double)(rng_next() >> 11) / 9007199254740992.0;
	double v = 0.1 + 0.9 * u;

	return (float)(rng_next() & 1 ? v : -v);
}

uint16_t ref_to_half(double x)
{
	uint16_t sign = signbit(x) ? 0x8000 : 0;
	double a = fabs(x), r;
	int e;

	if (isnan(x))
		return 0x7E00;
	if (a == 0.0)
		return sign;
	frexp(a, &e);
	e -= 1; /* a = 1.f * 2^e */
	if (e < -14)
		e = -14; /* subnormal: steps of 2^-24 */
	r = nearbyint(ldexp(a, 10 - e));
	if (r >= 2048.0) {
		r /= 2.0;
		e++;
	}
	if (e > 15)
		return sign | 0x7C00;
	if (r < 1024.0)
		return sign | (uint16_t)r;
	return sign | (uint16_t)((e + 15) << 10) | (uint16_t)(r - 1024.0);
}

double ref_from_half(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v;

	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return h & 0x8000 ? -v : v;
}

/* A random fp16 scale in [lo, 2 lo): bits and exact value. */
static uint16_t rng_scale(double lo, double *value)
{
	uint16_t h = ref_to_half(lo * (1.0 + (double)rng_int(0, 1023) / 1024.0));

	*value = ref_from_half(h);
	return h;
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

/* --- quantized rows, packed from chosen codes ---------------------------- */

const uint32_t all_types[8] = {
	Q4KH_TYPE_F32, Q4KH_TYPE_F16, Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q5_0,
	Q4KH_TYPE_Q4_0, Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_Q5_K,
};

static void pack_q8_0(uint8_t *b, double *w)
{
	double d;

	put16(b, rng_scale(0.002, &d));
	for (int j = 0; j < 32; j++) {
		int q = rng_int(-127, 127);

		b[2 + j] = (uint8_t)(int8_t)q;
		w[j] = d * q;
	}
}

/* Q4_0 and Q5_0: codes 0..(2^bits - 1), value j in nibble j % 16. */
static void pack_q4_0(uint8_t *b, double *w)
{
	double d;

	put16(b, rng_scale(0.01, &d));
	memset(b + 2, 0, 16);
	for (int j = 0; j < 32; j++) {
		int q = rng_int(0, 15);

		b[2 + j % 16] |= (uint8_t)(q << (j < 16 ? 0 : 4));
		w[j] = d * (q - 8);
	}
}

static void pack_q5_0(uint8_t *b, double *w)
{
	double d;
	uint32_t qh = 0;

	put16(b, rng_scale(0.01, &d));
	memset(b + 6, 0, 16);
	for (int j = 0; j < 32; j++) {
		int q = rng_int(0, 31);

		b[6 + j % 16] |= (uint8_t)((q & 15) << (j < 16 ? 0 : 4));
		qh |= (uint32_t)(q >> 4) << j;
		w[j] = d * (q - 16);
	}
	for (int i = 0; i < 4; i++)
		b[2 + i] = (uint8_t)(qh >> (8 * i));
}

/* The 12 scale bytes of Q4_K / Q5_K from eight 6-bit scales and mins. */
static void pack_k_scales(uint8_t *s, const int *sc, const int *m)
{
	for (int j = 0; j < 4; j++) {
		s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
		s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
		s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
	}
}

/* Q4_K (bits 4) and Q5_K (bits 5). */
static void pack_k(uint8_t *b, double *w, int bits)
{
	uint8_t *qh = b + 16, *qs = b + (bits == 5 ? 48 : 16);
	int sc[8], m[8];
	double d, dmin;

	put16(b, rng_scale(0.0005, &d));
	put16(b + 2, rng_scale(0.0005, &dmin));
	for (int j = 0; j < 8; j++) {
		sc[j] = rng_int(0, 63);
		m[j] = rng_int(0, 63);
	}
	pack_k_scales(b + 4, sc, m);
	memset(qs, 0, 128);
	if (bits == 5)
		memset(qh, 0, 32);
	for (int j = 0; j < 8; j++) {
		for (int i = 0; i < 32; i++) {
			int q = rng_int(0, (1 << bits) - 1);

			qs[32 * (j / 2) + i] |= (uint8_t)((q & 15) << 4 * (j % 2));
			if (bits == 5)
				qh[i] |= (uint8_t)((q >> 4) << j);
			w[32 * j + i] = d * sc[j] * q - dmin * m[j];
		}
	}
}

static void pack_q6_k(uint8_t *b, double *w)
{
	uint8_t *ql = b, *qh = b + 128;
	int8_t *scales = (int8_t *)(b + 192);
	int q[256];
	double d;

	put16(b + 208, rng_scale(0.0002, &d));
	for (int s = 0; s < 16; s++)
		scales[s] = (int8_t)rng_int(-128, 127);
	for (int v = 0; v < 256; v++) {
		q[v] = rng_int(0, 63);
		w[v] = d * scales[v / 16] * (q[v] - 32);
	}
	for (int h = 0; h < 2; h++) {
		for (int l = 0; l < 32; l++) {
			const int *g = q + 128 * h + l;

			ql[64 * h + l] = (uint8_t)((g[0] & 15) | (g[64] & 15) << 4);
			ql[64 * h + l + 32] = (uint8_t)((g[32] & 15) | (g[96] & 15) << 4);
			qh[32 * h + l] = (uint8_t)((g[0] >> 4) | (g[32] >> 4) << 2 |
			                           (g[64] >> 4) << 4 | (g[96] >> 4) << 6);
		}
	}
}

static size_t row_bytes(uint32_t type, int64_t k)
{
	return (size_t)k / q4kh_type_block_elems(type) *
	       q4kh_type_block_bytes(type);
}

/* A random row of K values of TYPE: its bytes and exact values. */
static void make_row(uint32_t type, int64_t k, uint8_t *bytes, double *w)
{
	int64_t be = q4kh_type_block_elems(type);
	size_t bb = q4kh_type_block_bytes(type);

	for (int64_t i = 0; i < k / be; i++) {
		uint8_t *b = bytes + i * bb;
		double *x = w + i * be;

		switch (type) {
		case Q4KH_TYPE_F32: {
			float f = rng_val();
			memcpy(b, &f, 4);
			*x = f;
			break;
		}
		case Q4KH_TYPE_F16:
			put16(b, ref_to_half(rng_val()));
			*x = ref_from_half((uint16_t)(b[0] | b[1] << 8));
			break;
		case Q4KH_TYPE_Q8_0: pack_q8_0(b, x); break;
		case Q4KH_TYPE_Q4_0: pack_q4_0(b, x); break;
		case Q4KH_TYPE_Q5_0: pack_q5_0(b, x); break;
		case Q4KH_TYPE_Q4_K: pack_k(b, x, 4); break;
		case Q4KH_TYPE_Q5_K: pack_k(b, x, 5); break;
		case Q4KH_TYPE_Q6_K: pack_q6_k(b, x); break;
		default: cr_assert_fail("no packer for type %u", type);
		}
	}
}

/* --- tensors in plugin buffers ------------------------------------------- */

struct q4kh_tensor make_tensor(struct env *e, uint32_t type, int64_t ne0,
                               int64_t ne1, int64_t ne2,
                               const void *data, int64_t pad)
{
	struct q4kh_tensor t = { .type = type, .ne = { ne0, ne1, ne2, 1 } };
	size_t rb = row_bytes(type, ne0);
	uint64_t size;
	uint8_t *fill;

	t.nb[0] = q4kh_type_block_bytes(type);
	t.nb[1] = (int64_t)rb + pad;
	t.nb[2] = t.nb[1] * ne1;
	t.nb[3] = t.nb[2] * ne2;
	size = (uint64_t)t.nb[3];
	cr_assert_eq(e->b->buffer_alloc(e->dev, size, &t.buffer), Q4KH_OK);
	fill = malloc(size);
	cr_assert_not_null(fill);
	memset(fill, 0xFF, size); /* NaN in f32 and f16 */
	if (data)
		for (int64_t r = 0; r < ne1 * ne2; r++)
			memcpy(fill + r * t.nb[1], (const uint8_t *)data + r * rb, rb);
	cr_assert_eq(e->b->buffer_upload(e->dev, t.buffer, 0, fill, size), Q4KH_OK);
	free(fill);
	return t;
}

struct q4kh_tensor f32_tensor(struct env *e, int64_t ne0, int64_t ne1,
                              int64_t ne2, const float *data)
{
	return make_tensor(e, Q4KH_TYPE_F32, ne0, ne1, ne2, data, 0);
}

float *fetch(struct env *e, const struct q4kh_tensor *t)
{
	int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
	size_t rb = row_bytes(t->type, t->ne[0]);
	float *out = malloc(rb * (size_t)rows);

	cr_assert_not_null(out);
	for (int64_t r = 0; r < rows; r++)
		cr_assert_eq(e->b->buffer_download(e->dev, t->buffer,
		                                   t->offset + (uint64_t)(r * t->nb[1]),
		                                   (uint8_t *)out + r * rb, rb),
		             Q4KH_OK);
	return out;
}

void drop(struct env *e, struct q4kh_tensor *t)
{
	e->b->buffer_free(e->dev, t->buffer);
	t->buffer = NULL;
}

float *random_floats(size_t n)
{
	float *v = malloc(n * sizeof(float));

	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rng_val();
	return v;
}

void expect_close(const char *what, const float *got, const double *want,
                  size_t n, double rtol, double atol)
{
	for (size_t i = 0; i < n; i++) {
		cr_assert(!isnan(got[i]), "%s[%zu] was not written (NaN)", what, i);
		cr_assert(fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]),
		          "%s[%zu] = %.9g, expected %.9g", what, i, (double)got[i],
		          want[i]);
	}
}

void expect_status(struct env *e, q4kh_status st, const char *needle)
{
	const char *msg = e->b->last_error(e->ctx);

	cr_assert_eq(st, Q4KH_ERR_INVALID, "expected INVALID (%s), got %d",
	             needle, st);
	cr_assert(strstr(msg, needle), "last_error \"%s\" lacks \"%s\"", msg,
	          needle);
}

/* --- workloads the suites share ----------------------------------------- */

struct q4kh_tensor make_weight(struct env *e, uint32_t type, int64_t k,
                               int64_t n, double **exact)
{
	size_t rb = row_bytes(type, k);
	uint8_t *bytes = malloc(rb * (size_t)n);
	struct q4kh_tensor t;

	*exact = malloc(sizeof(double) * (size_t)(k * n));
	cr_assert(bytes && *exact);
	for (int64_t r = 0; r < n; r++)
		make_row(type, k, bytes + r * rb, *exact + r * k);
	t = make_tensor(e, type, k, n, 1, bytes, 0);
	free(bytes);
	return t;
}

double ref_lanes_dot(const float *a, const double *b, int64_t n)
{
	double l[8] = { 0 };

	for (int64_t i = 0; i < n; i++)
		l[i % 8] += a[i] * b[i];
	return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/*
 * Inputs of C where the order of sums shows after rounding to float: in
 * each query and key, dimension d (d mod 32 = 3) 2^20 times larger and
 * d + 16 its copy, negated in the keys, so that the two products cancel
 * in the score and the terms summed between them round to the big one's
 * grain; each odd key a copy of the key before it (the same weight) with
 * some values of its value row 2^30 times larger and negated, cancelling
 * in the weighted sum the same way.
 */
static void cancel_pairs(const struct attn_case *c, float *q, float *k, float *v)
{
	const int64_t hd = c->hd;

	for (int64_t r = 0; r < c->nh * c->T; r++)
		for (int64_t d = 3; d + 16 < hd; d += 32) {
			q[r * hd + d] *= 0x1p20f;
			q[r * hd + d + 16] = q[r * hd + d];
		}
	for (int64_t r = 0; r < c->nkv * c->n_ctx; r++)
		for (int64_t d = 3; d + 16 < hd; d += 32) {
			k[r * hd + d] *= 0x1p20f;
			k[r * hd + d + 16] = -k[r * hd + d];
		}
	for (int64_t j = 1; j < c->n_ctx; j += 2)
		for (int64_t g = 0; g < c->nkv; g++) {
			const int64_t r0 = ((j - 1) * c->nkv + g) * hd, r1 = (j * c->nkv + g) * hd;
			float *v0 = v + r0, *v1 = v + r1;

			memcpy(k + r1, k + r0, sizeof(float) * (size_t)hd);
			for (int64_t d = 5; d < hd; d += 32) {
				v0[d] *= 0x1p30f;
				v1[d] = -v0[d];
			}
		}
}

/*
 * attention_paged of Q over C's caches (KDATA, VDATA: n_ctx rows of
 * n_kv * hd values of C's type) scattered over pools as C's block table
 * says; the output, which must equal CONTIGUOUS bit for bit.
 */
static float *run_paged(struct env *e, const struct attn_case *c,
                        const struct q4kh_tensor *q, const void *kdata,
                        const void *vdata, const float *contiguous)
{
	const size_t es = c->kv_type == Q4KH_TYPE_F16 ? 2 : 4;
	const size_t row = es * (size_t)(c->hd * c->nkv);
	const int64_t slots = (int64_t)c->pool_pages * c->page_size;
	uint8_t *kp = malloc(row * (size_t)slots), *vp = malloc(row * (size_t)slots);
	int32_t *pos = malloc(sizeof(int32_t) * (size_t)c->T);
	struct q4kh_tensor k, v, pt, pg, out;
	float *got;

	cr_assert(kp && vp && pos);
	cr_assert_geq((int64_t)c->n_pages * c->page_size, c->n_ctx);
	memset(kp, 0xFF, row * (size_t)slots); /* NaN: read, it shows */
	memset(vp, 0xFF, row * (size_t)slots);
	for (int64_t j = 0; j < c->n_ctx; j++) {
		const int64_t s = (int64_t)c->pages[j / c->page_size] * c->page_size +
		                  j % c->page_size;

		memcpy(kp + (size_t)s * row, (const uint8_t *)kdata + (size_t)j * row, row);
		memcpy(vp + (size_t)s * row, (const uint8_t *)vdata + (size_t)j * row, row);
	}
	for (int64_t t = 0; t < c->T; t++)
		pos[t] = c->pos ? c->pos[t] : (int32_t)(c->p.pos0 + t);
	k = make_tensor(e, c->kv_type, c->hd, c->nkv, slots, kp, 0);
	v = make_tensor(e, c->kv_type, c->hd, c->nkv, slots, vp, 0);
	pt = make_tensor(e, Q4KH_TYPE_I32, c->T, 1, 1, pos, 0);
	pg = make_tensor(e, Q4KH_TYPE_I32, c->n_pages, 1, 1, c->pages, 0);
	out = f32_tensor(e, c->hd, c->nh, c->T, NULL);
	cr_assert_eq(e->b->attention_paged(e->dev, q, &k, &v, &pt, &pg, c->page_size, &c->p,
	                                   &out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	for (int64_t i = 0; i < c->hd * c->nh * c->T; i++)
		cr_assert(!memcmp(&got[i], &contiguous[i], sizeof(float)),
		          "attention_paged out[%lld] = %.9g, the contiguous cache's %.9g (pages of %d)",
		          (long long)i, (double)got[i], (double)contiguous[i], c->page_size);
	free(kp);
	free(vp);
	free(pos);
	drop(e, &k);
	drop(e, &v);
	drop(e, &pt);
	drop(e, &pg);
	drop(e, &out);
	return got;
}

void run_attention(struct env *e, const struct attn_case *c, float **got,
                   double **want)
{
	int64_t qn = c->hd * c->nh * c->T, kn = c->hd * c->nkv * c->n_ctx;
	float *qv = random_floats((size_t)qn), *kv = random_floats((size_t)kn);
	float *vv = random_floats((size_t)kn);
	double *kd = malloc(sizeof(double) * (size_t)kn);
	double *vd = malloc(sizeof(double) * (size_t)kn);
	double *s = malloc(sizeof(double) * (size_t)c->n_ctx);
	uint16_t *kh = malloc(2 * (size_t)kn), *vh = malloc(2 * (size_t)kn);
	struct q4kh_tensor q, k, v, out, pos = { 0 };
	int f16 = c->kv_type == Q4KH_TYPE_F16;

	if (c->cancel)
		cancel_pairs(c, qv, kv, vv);
	for (int64_t i = 0; i < kn; i++) {
		kv[i] *= 2.0f;
		kh[i] = ref_to_half(kv[i]);
		vh[i] = ref_to_half(vv[i]);
		kd[i] = f16 ? ref_from_half(kh[i]) : kv[i];
		vd[i] = f16 ? ref_from_half(vh[i]) : vv[i];
	}
	q = f32_tensor(e, c->hd, c->nh, c->T, qv);
	k = make_tensor(e, c->kv_type, c->hd, c->nkv, c->n_ctx,
	                f16 ? (void *)kh : (void *)kv, 0);
	v = make_tensor(e, c->kv_type, c->hd, c->nkv, c->n_ctx,
	                f16 ? (void *)vh : (void *)vv, 0);
	out = f32_tensor(e, c->hd, c->nh, c->T, NULL);
	*want = malloc(sizeof(double) * (size_t)qn);
	for (int64_t t = 0; t < c->T; t++)
		for (int64_t h = 0; h < c->nh; h++) {
			int64_t p = c->pos ? c->pos[t] : c->p.pos0 + t;
			int64_t g = h / (c->nh / c->nkv);
			const float *qq = qv + (t * c->nh + h) * c->hd;
			double *o = *want + (t * c->nh + h) * c->hd, mx = -INFINITY,
			       sum = 0;

			for (int64_t j = 0; j <= p; j++) {
				const double *kk = kd + (j * c->nkv + g) * c->hd;
				double d;

				s[j] = -INFINITY;
				if (c->p.window && p - j >= c->p.window)
					continue;
				d = ref_lanes_dot(qq, kk, c->hd) * c->p.scale;
				if (c->p.softcap > 0)
					d = c->p.softcap * tanh(d / c->p.softcap);
				s[j] = d;
				mx = fmax(mx, d);
			}
			for (int64_t j = 0; j <= p; j++)
				sum += exp(s[j] - mx);
			for (int64_t i = 0; i < c->hd; i++) {
				double a = 0;

				for (int64_t j = 0; j <= p; j++)
					a += exp(s[j] - mx) *
					     vd[(j * c->nkv + g) * c->hd + i];
				o[i] = a / sum;
			}
		}
	if (c->pos) {
		pos = make_tensor(e, Q4KH_TYPE_I32, c->T, 1, 1, c->pos, 0);
		cr_assert_eq(e->b->attention_ext(e->dev, &q, &k, &v, &pos, &c->p, &out),
		             Q4KH_OK, "%s", e->b->last_error(e->ctx));
		drop(e, &pos);
	} else {
		cr_assert_eq(e->b->attention(e->dev, &q, &k, &v, &c->p, &out), Q4KH_OK,
		             "%s", e->b->last_error(e->ctx));
	}
	*got = fetch(e, &out);
	if (c->page_size) {
		float *paged = run_paged(e, c, &q, f16 ? (void *)kh : (void *)kv,
		                         f16 ? (void *)vh : (void *)vv, *got);

		free(*got);
		*got = paged;
	}
	free(qv);
	free(kv);
	free(vv);
	free(kd);
	free(vd);
	free(s);
	free(kh);
	free(vh);
	drop(e, &q);
	drop(e, &k);
	drop(e, &v);
	drop(e, &out);
}

void delta_inputs(struct delta_case *c)
{
	const int64_t nq = c->sk * c->hk * c->T;

	c->q = random_floats((size_t)nq);
	c->k = random_floats((size_t)nq);
	c->v = random_floats((size_t)(c->sv * c->hv * c->T));
	c->g = random_floats((size_t)(c->hv * c->T));
	c->beta = random_floats((size_t)(c->hv * c->T));
	c->s0 = random_floats((size_t)(c->sk * c->sv * c->hv));
	for (int64_t r = 0; r < c->hk * c->T; r++) {
		double nq2 = 0, nk2 = 0;

		for (int64_t i = 0; i < c->sk; i++) {
			nq2 += (double)c->q[r * c->sk + i] * c->q[r * c->sk + i];
			nk2 += (double)c->k[r * c->sk + i] * c->k[r * c->sk + i];
		}
		for (int64_t i = 0; i < c->sk; i++) {
			c->q[r * c->sk + i] = (float)(c->q[r * c->sk + i] / sqrt(nq2));
			c->k[r * c->sk + i] = (float)(c->k[r * c->sk + i] / sqrt(nk2));
		}
	}
	for (int64_t i = 0; i < c->hv * c->T; i++) {
		c->g[i] = -fabsf(c->g[i]) * 2.0f;
		c->beta[i] = fabsf(c->beta[i]);
	}
}

void delta_free(struct delta_case *c)
{
	free(c->q);
	free(c->k);
	free(c->v);
	free(c->g);
	free(c->beta);
	free(c->s0);
}

float *run_delta(struct env *e, const struct delta_case *c, struct q4kh_tensor *state,
                 int64_t t0, int64_t n, float scale)
{
	/* q and k with padded rows, as the views of a wider projection */
	struct q4kh_tensor q = make_tensor(e, Q4KH_TYPE_F32, c->sk, c->hk, n,
	                                   c->q + t0 * c->hk * c->sk, 16);
	struct q4kh_tensor k = make_tensor(e, Q4KH_TYPE_F32, c->sk, c->hk, n,
	                                   c->k + t0 * c->hk * c->sk, 16);
	struct q4kh_tensor v = f32_tensor(e, c->sv, c->hv, n, c->v + t0 * c->hv * c->sv);
	struct q4kh_tensor g = f32_tensor(e, c->hv, n, 1, c->g + t0 * c->hv);
	struct q4kh_tensor b = f32_tensor(e, c->hv, n, 1, c->beta + t0 * c->hv);
	struct q4kh_tensor out = f32_tensor(e, c->sv, c->hv, n, NULL);
	float *got;

	cr_assert_eq(e->b->delta_net(e->dev, &q, &k, &v, &g, &b, state, scale, &out), Q4KH_OK,
	             "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	drop(e, &q);
	drop(e, &k);
	drop(e, &v);
	drop(e, &g);
	drop(e, &b);
	drop(e, &out);
	return got;
}
