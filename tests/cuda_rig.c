/*
 * The rig of the cuda op tests (cuda_rig.h): the cpu reference and the
 * cuda backend on device 0, tensors on both, and the comparison of their
 * outputs.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rig.h"
#include "helpers.h"

/* --- random numbers ------------------------------------------------------ */

static struct drand48_data rng; /* one stream per test process */

void rng_seed(long seed)
{
	srand48_r(seed, &rng);
}

double urand(void) /* [0, 1) */
{
	double v;

	drand48_r(&rng, &v);
	return v;
}

int64_t irand(int64_t lo, int64_t hi) /* inclusive */
{
	return lo + (int64_t)(urand() * (double)(hi - lo + 1));
}

/* Uniform in +-[0.1, 1): random, never near zero. */
float rval(void)
{
	double v = 0.1 + 0.9 * urand();

	return (float)(urand() < 0.5 ? -v : v);
}

float *rvals(size_t n)
{
	float *v = malloc(n * sizeof(float));

	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rval();
	return v;
}

/* --- the two backends ------------------------------------------------------ */


const struct q4kh_plugin *find_plugin(const struct q4kh_registry *reg,
                                             const char *name)
{
	const struct q4kh_plugin *p = q4kh_registry_find(reg, name);

	for (size_t i = 0; !p && i < reg->n_plugins; i++)
		if (!strcmp(reg->plugins[i].name, name))
			cr_assert_fail("plugin %s (%s) not accepted: %s", name,
			               reg->plugins[i].path, reg->plugins[i].reason);
	cr_assert_not_null(p, "no plugin %s on the plugin path %s", name,
	                   reg->path);
	return p;
}

struct q4kh_registry *scan(void)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg;

	cr_assert_eq(q4kh_registry_scan(NULL, NULL, &reg, &err), 0, "%s", err.msg);
	return reg;
}

uint32_t cuda_devices(const struct q4kh_plugin *p, char *why, size_t size)
{
	const struct q4kh_backend_v1 *b = p->desc->backend;
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
	q4kh_backend_ctx *ctx;
	uint32_t n = 0;

	cr_assert_eq(b->init(&p->api, &ctx), Q4KH_OK, "cuda init: %s",
	             b->last_error(NULL));
	cr_assert_eq(b->device_count(ctx, &n), Q4KH_OK, "device_count: %s",
	             b->last_error(ctx));
	if (n == 0) {
		cr_assert_neq(b->device_info(ctx, 0, &rec), Q4KH_OK);
		snprintf(why, size, "%s", b->last_error(ctx));
	}
	b->shutdown(ctx);
	return n;
}

/* The cpu and cuda backends on device 0; skips without a CUDA device. */
struct rig *rig_open(void)
{
	struct rig *r = calloc(1, sizeof(*r));
	struct q4kh_error err = { { 0 } };
	const struct q4kh_plugin *cuda;
	char why[512];

	cr_assert_not_null(r);
	r->reg = scan();
	cuda = find_plugin(r->reg, "cuda");
	if (cuda_devices(cuda, why, sizeof(why)) == 0) {
		q4kh_registry_free(r->reg);
		free(r);
		test_no_cuda_device("the cuda ops", why);
	}
	cr_assert_eq(q4kh_backend_open(find_plugin(r->reg, "cpu"), 0, &r->be[REF],
	                               &err),
	             0, "%s", err.msg);
	cr_assert_eq(q4kh_backend_open(cuda, 0, &r->be[GPU], &err), 0, "%s",
	             err.msg);
	return r;
}

void rig_close(struct rig *r)
{
	q4kh_backend_close(&r->be[GPU]);
	q4kh_backend_close(&r->be[REF]);
	q4kh_registry_free(r->reg);
	free(r);
}


/* --- tensors on both backends ---------------------------------------------- */

size_t row_bytes(uint32_t type, int64_t k)
{
	return (size_t)k / q4kh_type_block_elems(type) *
	       q4kh_type_block_bytes(type);
}


/*
 * A {ne0, ne1, ne2} tensor of TYPE, rows PAD bytes apart beyond their
 * length, at offset POISON_LEAD of a buffer of POISON bytes that reaches
 * GUARD bytes past the view. DATA (rows packed) fills the view unless NULL.
 */
struct twin twin_new(struct rig *r, uint32_t type, int64_t ne0,
                            int64_t ne1, int64_t ne2, int64_t pad,
                            const void *data)
{
	struct twin w = { 0 };
	size_t rb = row_bytes(type, ne0);
	uint8_t *fill;

	w.t[REF] = (struct q4kh_tensor){ .offset = POISON_LEAD, .type = type,
		                         .ne = { ne0, ne1, ne2, 1 } };
	w.t[REF].nb[0] = q4kh_type_block_bytes(type);
	w.t[REF].nb[1] = (int64_t)rb + pad;
	w.t[REF].nb[2] = w.t[REF].nb[1] * ne1;
	w.t[REF].nb[3] = w.t[REF].nb[2] * ne2;
	w.size = POISON_LEAD + (uint64_t)w.t[REF].nb[3] + GUARD;
	fill = malloc(w.size);
	cr_assert_not_null(fill);
	memset(fill, POISON, w.size);
	if (data)
		for (int64_t i = 0; i < ne1 * ne2; i++)
			memcpy(fill + POISON_LEAD + i * w.t[REF].nb[1],
			       (const uint8_t *)data + i * rb, rb);
	w.t[GPU] = w.t[REF];
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(V(r, s)->buffer_alloc(DEV(r, s), w.size, &w.t[s].buffer),
		             Q4KH_OK, "%s", ERR(r, s));
		cr_assert_eq(V(r, s)->buffer_upload(DEV(r, s), w.t[s].buffer, 0, fill,
		                                    w.size),
		             Q4KH_OK, "%s", ERR(r, s));
	}
	free(fill);
	return w;
}

struct twin twin_f32(struct rig *r, int64_t ne0, int64_t ne1,
                            int64_t ne2, const float *data)
{
	return twin_new(r, Q4KH_TYPE_F32, ne0, ne1, ne2, 0, data);
}

void twin_free(struct rig *r, struct twin *w)
{
	for (int s = 0; s < 2; s++)
		V(r, s)->buffer_free(DEV(r, s), w->t[s].buffer);
}

/* The whole buffer of side S. */
static uint8_t *twin_bytes(struct rig *r, const struct twin *w, int s)
{
	uint8_t *raw = malloc(w->size);

	cr_assert_not_null(raw);
	cr_assert_eq(V(r, s)->buffer_download(DEV(r, s), w->t[s].buffer, 0, raw,
	                                      w->size),
	             Q4KH_OK, "%s", ERR(r, s));
	return raw;
}

/* Address of element i of a view (rows in order, ne[3] = 1) in RAW. */
static const uint8_t *element_at(const struct q4kh_tensor *t,
                                 const uint8_t *raw, int64_t i)
{
	int64_t r = i / t->ne[0], c = i % t->ne[0];

	return raw + t->offset + (r % t->ne[1]) * t->nb[1] +
	       (r / t->ne[1]) * t->nb[2] + c * (int64_t)q4kh_type_block_bytes(t->type);
}

/* Element i of an f32 or f16 view, as a double. */
double element(const struct q4kh_tensor *t, const uint8_t *raw,
                      int64_t i)
{
	const uint8_t *p = element_at(t, raw, i);
	float f;

	if (t->type == Q4KH_TYPE_F16)
		return q4kh_fp16_to_f32((uint16_t)(p[0] | p[1] << 8));
	memcpy(&f, p, 4);
	return f;
}

/* Is byte b of the buffer inside t's view (ne[3] = 1)? */
static int in_view(const struct q4kh_tensor *t, uint64_t b)
{
	int64_t rel, i1, i2;

	if (b < t->offset)
		return 0;
	rel = (int64_t)(b - t->offset);
	i2 = rel / t->nb[2];
	i1 = rel % t->nb[2] / t->nb[1];
	return i2 < t->ne[2] && i1 < t->ne[1] &&
	       rel % t->nb[2] % t->nb[1] < (int64_t)row_bytes(t->type, t->ne[0]);
}

/* No byte of the cuda side's buffer (its bytes GPU) outside O's view may
 * have changed. */
static void expect_untouched(const char *what, const struct twin *o,
                             const uint8_t *gpu)
{
	for (uint64_t b = 0; b < o->size; b++)
		if (gpu[b] != POISON && !in_view(&o->t[GPU], b))
			cr_assert_fail("%s: byte %llu of the %llu-byte buffer, outside "
			               "the output view, was written",
			               what, (unsigned long long)b,
			               (unsigned long long)o->size);
}

/*
 * GPU's elements against WANT's (N of them): none NaN, and NMSE <= BOUND;
 * WHO names the side WANT comes from in the message.
 */
static void expect_nmse(const char *what, const double *got, const double *want,
                        int64_t n, double bound, const char *who)
{
	double err = 0.0, sum = 0.0, worst = -1.0;
	int64_t at = 0;

	for (int64_t i = 0; i < n; i++) {
		cr_assert(!isnan(got[i]), "%s: element %lld not written (NaN)", what,
		          (long long)i);
		cr_assert(isfinite(want[i]), "%s: the %s gave %g at %lld", what, who,
		          want[i], (long long)i);
		err += (got[i] - want[i]) * (got[i] - want[i]);
		sum += want[i] * want[i];
		if (fabs(got[i] - want[i]) > worst) {
			worst = fabs(got[i] - want[i]);
			at = i;
		}
	}
	cr_assert(err <= bound * sum,
	          "%s: NMSE %.3g > %g (worst element %lld: %.9g, %s %.9g)", what,
	          sum > 0 ? err / sum : err, bound, (long long)at, got[at], who,
	          want[at]);
}

/* The elements of side S's view in RAW, in order. */
static double *values_of(const struct twin *o, int s, const uint8_t *raw)
{
	const struct q4kh_tensor *t = &o->t[s];
	const int64_t n = t->ne[0] * t->ne[1] * t->ne[2];
	double *v = malloc(sizeof(double) * (size_t)n);

	cr_assert_not_null(v);
	for (int64_t i = 0; i < n; i++)
		v[i] = element(t, raw, i);
	return v;
}

double *twin_values(struct rig *r, const struct twin *o, int s)
{
	uint8_t *raw = twin_bytes(r, o, s);
	double *v = values_of(o, s, raw);

	free(raw);
	return v;
}

/*
 * The cuda output O against the cpu's: every element written (not NaN),
 * nothing outside the view touched, and NMSE <= BOUND, or with BOUND 0 the
 * same bits in every element.
 */
void expect_agree(struct rig *r, const char *what, const struct twin *o,
                         double bound)
{
	const struct q4kh_tensor *t = &o->t[GPU];
	const size_t eb = q4kh_type_block_bytes(t->type);
	uint8_t *ref = twin_bytes(r, o, REF), *gpu = twin_bytes(r, o, GPU);
	int64_t n = t->ne[0] * t->ne[1] * t->ne[2];

	expect_untouched(what, o, gpu);
	if (bound == 0.0) {
		for (int64_t i = 0; i < n; i++) {
			cr_assert(!isnan(element(t, gpu, i)),
			          "%s: element %lld not written (NaN)", what, (long long)i);
			cr_assert(!memcmp(element_at(t, gpu, i),
			                  element_at(&o->t[REF], ref, i), eb),
			          "%s: element %lld = %.9g, cpu %.9g: must be the same "
			          "bits",
			          what, (long long)i, element(t, gpu, i),
			          element(&o->t[REF], ref, i));
		}
	} else {
		double *g = values_of(o, GPU, gpu), *c = values_of(o, REF, ref);

		expect_nmse(what, g, c, n, bound, "cpu reference");
		free(g);
		free(c);
	}
	free(ref);
	free(gpu);
}

void expect_near(struct rig *r, const char *what, const struct twin *o,
                 const double *want, double bound)
{
	const struct q4kh_tensor *t = &o->t[GPU];
	uint8_t *gpu = twin_bytes(r, o, GPU);
	double *g = values_of(o, GPU, gpu);

	expect_untouched(what, o, gpu);
	expect_nmse(what, g, want, t->ne[0] * t->ne[1] * t->ne[2], bound,
	            "test's float64 computation");
	free(g);
	free(gpu);
}

/* --- weights --- */

/* A random fp16 scale of either sign, |d| in [1, 2) * 2^-10. */
static void put_scale(uint8_t *p)
{
	uint16_t h = q4kh_f32_to_fp16((float)((1.0 + urand()) / 1024.0));

	if (urand() < 0.5)
		h |= 0x8000;
	p[0] = (uint8_t)h;
	p[1] = (uint8_t)(h >> 8);
}

/*
 * ROWS rows of K values of TYPE: random bytes everywhere but the fp16
 * scales (quant.h's layouts), which are set to moderate values so every
 * weight is finite. Every bit pattern of the other fields is a valid block.
 */
uint8_t *random_weights(uint32_t type, int64_t k, int64_t rows)
{
	size_t rb = row_bytes(type, k), bb = q4kh_type_block_bytes(type);
	uint8_t *w = malloc(rb * (size_t)rows);
	int scales[2], n_scales = 1;

	cr_assert_not_null(w);
	for (size_t i = 0; i < rb * (size_t)rows; i++)
		w[i] = (uint8_t)irand(0, 255);
	switch (type) {
	case Q4KH_TYPE_F32:
		for (int64_t i = 0; i < k * rows; i++) {
			float f = rval();
			memcpy(w + 4 * i, &f, 4);
		}
		return w;
	case Q4KH_TYPE_F16:
	case Q4KH_TYPE_BF16:
		for (int64_t i = 0; i < k * rows; i++) {
			float f = rval();
			uint32_t bits;
			uint16_t h;

			/* BF16: the high half of the float (truncated: any is valid) */
			memcpy(&bits, &f, 4);
			h = type == Q4KH_TYPE_F16 ? q4kh_f32_to_fp16(f) : (uint16_t)(bits >> 16);
			w[2 * i] = (uint8_t)h;
			w[2 * i + 1] = (uint8_t)(h >> 8);
		}
		return w;
	case Q4KH_TYPE_Q4_K:
	case Q4KH_TYPE_Q5_K:
	case Q4KH_TYPE_Q4_1:
	case Q4KH_TYPE_Q5_1:
		scales[0] = 0; /* d, then dmin or m */
		scales[1] = 2;
		n_scales = 2;
		break;
	case Q4KH_TYPE_Q2_K:
		scales[0] = offsetof(struct q4kh_block_q2_k, d);
		scales[1] = offsetof(struct q4kh_block_q2_k, dmin);
		n_scales = 2;
		break;
	case Q4KH_TYPE_Q3_K:
		scales[0] = offsetof(struct q4kh_block_q3_k, d);
		break;
	case Q4KH_TYPE_Q6_K:
		scales[0] = offsetof(struct q4kh_block_q6_k, d);
		break;
	default:
		scales[0] = 0; /* d first in every other block */
	}
	for (size_t b = 0; b < rb * (size_t)rows / bb; b++)
		for (int i = 0; i < n_scales; i++)
			put_scale(w + b * bb + scales[i]);
	return w;
}

struct twin twin_weights(struct rig *r, uint32_t type, int64_t k,
                                int64_t rows, int64_t pad)
{
	uint8_t *bytes = random_weights(type, k, rows);
	struct twin w = twin_new(r, type, k, rows, 1, pad, bytes);

	free(bytes);
	return w;
}
