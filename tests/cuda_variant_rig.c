/*
 * The variants' rig (cuda_variant_rig.h): the three variants, random
 * valid blocks, the cpu and cuda backends with a variant open, views in
 * poisoned buffers, and one product both ways.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_variant_rig.h"
#include "helpers.h"

/* --- the variants and what they must declare ------------------------------ */

/* The tensor-core columns: cuda-mwv's own (mwv_plugin.c), the others'
 * CUDA_TC_MIN_COLUMNS (q4khost/cuda_tc.h). */
const struct variant mwv = {
	"cuda-mwv", { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q8_0 }, 4, 0, 9
};
const struct variant dp4a = { "cuda-dp4a", { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K }, 2, 1, 17 };
const struct variant iq = { "cuda-gemv-iq", { Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS }, 2, 0, 17 };
const struct variant *const variants[3] = { &mwv, &dp4a, &iq };

int variant_takes(const struct variant *v, uint32_t type)
{
	for (uint32_t i = 0; i < v->n_types; i++)
		if (v->types[i] == type)
			return 1;
	return 0;
}

/* --- random valid blocks ------------------------------------------------- */

/* An fp16 of magnitude in [lo, hi) and random sign (SIGNED) or positive. */
static uint16_t rhalf(double lo, double hi, int is_signed)
{
	double v = lo + (hi - lo) * urand();

	return q4kh_f32_to_fp16((float)(is_signed && urand() < 0.5 ? -v : v));
}

static void random_bytes(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)irand(0, 255);
}

/* Q4_K: 6-bit scales 1..63 and mins 0..63 packed as quant.h says. */
static void pack_q4_k(uint8_t *out)
{
	struct q4kh_block_q4_k b;
	int sc[8], m[8];

	b.d = rhalf(1e-3, 2e-3, 0);
	b.dmin = rhalf(1e-3, 2e-3, 0);
	for (int j = 0; j < 8; j++) {
		sc[j] = (int)irand(1, 63);
		m[j] = (int)irand(0, 63);
	}
	for (int j = 0; j < 4; j++) {
		b.scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
		b.scales[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
		b.scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
	}
	random_bytes(b.qs, sizeof(b.qs));
	memcpy(out, &b, sizeof(b));
}

/* Q6_K: random 6-bit codes, int8 scales never zero. */
static void pack_q6_k(uint8_t *out)
{
	struct q4kh_block_q6_k b;

	b.d = rhalf(1e-4, 1e-3, 1);
	for (int j = 0; j < 16; j++) {
		int sc = (int)irand(-127, 126);

		b.scales[j] = (int8_t)(sc + (sc >= 0));
	}
	random_bytes(b.ql, sizeof(b.ql));
	random_bytes(b.qh, sizeof(b.qh));
	memcpy(out, &b, sizeof(b));
}

/*
 * A block of BYTES whose fp16 scale leads (Q5_0, Q8_0, IQ4_NL): the scale
 * of magnitude in [LO, HI) and either sign, then random codes (Q5_0's
 * fifth bits, Q8_0's int8 with -128 among them).
 */
static void pack_scaled(uint8_t *out, size_t bytes, double lo, double hi)
{
	const uint16_t d = rhalf(lo, hi, 1);

	memcpy(out, &d, sizeof(d));
	random_bytes(out + sizeof(d), bytes - sizeof(d));
}

/* IQ4_XS: 6-bit scales 0..63 but never 32 (a zero sub-block). */
static void pack_iq4_xs(uint8_t *out)
{
	struct q4kh_block_iq4_xs b;

	b.d = rhalf(1e-4, 1e-3, 1);
	b.scales_h = 0;
	memset(b.scales_l, 0, sizeof(b.scales_l));
	for (int j = 0; j < 8; j++) {
		int ls = (int)irand(0, 62);

		ls += ls >= 32;
		b.scales_l[j / 2] |= (uint8_t)((ls & 15) << 4 * (j % 2));
		b.scales_h |= (uint16_t)((ls >> 4) << 2 * j);
	}
	random_bytes(b.qs, sizeof(b.qs));
	memcpy(out, &b, sizeof(b));
}

uint8_t *random_blocks(uint32_t type, int64_t k, int64_t n)
{
	size_t bb = q4kh_type_block_bytes(type), rb = row_bytes(type, k);
	uint8_t *w = malloc(rb * (size_t)n);

	cr_assert_not_null(w);
	for (size_t i = 0; i < rb * (size_t)n; i += bb)
		switch (type) {
		case Q4KH_TYPE_Q4_K: pack_q4_k(w + i); break;
		case Q4KH_TYPE_Q6_K: pack_q6_k(w + i); break;
		case Q4KH_TYPE_Q5_0:
		case Q4KH_TYPE_IQ4_NL: pack_scaled(w + i, bb, 1e-3, 1e-2); break;
		case Q4KH_TYPE_Q8_0: pack_scaled(w + i, bb, 1e-4, 1e-3); break;
		case Q4KH_TYPE_IQ4_XS: pack_iq4_xs(w + i); break;
		default: cr_assert_fail("no packer for type %u", type);
		}
	return w;
}

/* --- the registry, the two backends, a variant --------------------------- */

/*
 * A config whose [plugin.NAME] warps is WARPS for every variant (NULL:
 * unset), read from empty folders so no file of this machine leaks in.
 */
static struct q4kh_config *config_with_warps(const char *warps)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *c;
	char section[64];
	const char *dir = test_tmpdir();

	setenv("XDG_CONFIG_HOME", dir, 1);
	cr_assert_eq(q4kh_config_load(dir, NULL, &c, &err), 0, "%s", err.msg);
	for (size_t i = 0; warps && i < N_VARIANTS; i++) {
		snprintf(section, sizeof(section), "plugin.%s", variants[i]->name);
		cr_assert_eq(q4kh_config_set(c, section, "warps", warps, "test", &err),
		             0, "%s", err.msg);
	}
	return c;
}

void vrig_scan(struct vrig *r, const char *warps)
{
	struct q4kh_error err = { { 0 } };

	memset(r, 0, sizeof(*r));
	r->config = config_with_warps(warps);
	cr_assert_eq(q4kh_registry_scan(NULL, r->config, &r->reg, &err), 0, "%s", err.msg);
}

void vrig_open(struct vrig *r, const char *warps)
{
	struct q4kh_error err = { { 0 } };
	const struct q4kh_plugin *cuda;
	char why[512];

	vrig_scan(r, warps);
	cuda = find_plugin(r->reg, "cuda");
	if (cuda_devices(cuda, why, sizeof(why)) == 0)
		test_no_cuda_device("the CUDA kernel variants", why);
	cr_assert_eq(q4kh_backend_open(find_plugin(r->reg, "cpu"), 0, &r->cpu, &err), 0, "%s",
	             err.msg);
	cr_assert_eq(q4kh_backend_open(cuda, 0, &r->gpu, &err), 0, "%s", err.msg);
}

void vrig_close(struct vrig *r)
{
	q4kh_backend_close(&r->gpu);
	q4kh_backend_close(&r->cpu);
	q4kh_registry_free(r->reg);
	q4kh_config_free(r->config);
}

void kernel_open(struct vrig *r, const struct variant *v, struct q4kh_kernel *k)
{
	struct q4kh_error err = { { 0 } };

	cr_assert_eq(q4kh_kernel_open(find_plugin(r->reg, v->name), &r->gpu, k, &err), 0, "%s",
	             err.msg);
}

void variant_open(struct vrig *r, const struct variant *v, long seed, struct q4kh_kernel *k)
{
	rng_seed(seed);
	vrig_open(r, NULL);
	kernel_open(r, v, k);
}

void variant_close(struct vrig *r, struct q4kh_kernel *k)
{
	q4kh_kernel_close(k);
	vrig_close(r);
}

/* --- views in poisoned buffers ------------------------------------------- */

struct view put(struct q4kh_backend *b, uint32_t type, int64_t ne0, int64_t ne1,
                int64_t nb1, const void *data)
{
	size_t rb = row_bytes(type, ne0);
	struct view v = { .t = { .offset = POISON_LEAD, .type = type,
		                     .ne = { ne0, ne1, 1, 1 } } };

	v.t.nb[0] = q4kh_type_block_bytes(type);
	v.t.nb[1] = nb1;
	v.t.nb[2] = v.t.nb[3] = nb1 * ne1;
	v.size = POISON_LEAD + (uint64_t)((ne1 - 1) * nb1) + rb + GUARD;
	v.bytes = malloc(v.size);
	cr_assert_not_null(v.bytes);
	memset(v.bytes, POISON, v.size);
	if (data)
		for (int64_t i = 0; i < ne1; i++)
			memcpy(v.bytes + POISON_LEAD + i * nb1, (const uint8_t *)data + i * rb,
			       rb);
	cr_assert_eq(b->v->buffer_alloc(b->dev, v.size, &v.t.buffer), Q4KH_OK,
	             "%s", b->v->last_error(b->ctx));
	cr_assert_eq(b->v->buffer_upload(b->dev, v.t.buffer, 0, v.bytes, v.size),
	             Q4KH_OK, "%s", b->v->last_error(b->ctx));
	return v;
}

void drop(struct q4kh_backend *b, struct view *v)
{
	b->v->buffer_free(b->dev, v->t.buffer);
	free(v->bytes);
	v->bytes = NULL;
}

uint8_t *fetch(struct q4kh_backend *b, const struct view *v)
{
	uint8_t *raw = malloc(v->size);

	cr_assert_not_null(raw);
	cr_assert_eq(b->v->buffer_download(b->dev, v->t.buffer, 0, raw, v->size),
	             Q4KH_OK, "%s: %s", b->plugin->name, b->v->last_error(b->ctx));
	return raw;
}

int in_view(const struct view *v, uint64_t i)
{
	int64_t rel = (int64_t)i - (int64_t)v->t.offset;

	return rel >= 0 && rel / v->t.nb[1] < v->t.ne[1] &&
	       rel % v->t.nb[1] < (int64_t)row_bytes(v->t.type, v->t.ne[0]);
}

float f32_at(const struct view *v, const uint8_t *raw, int64_t row, int64_t col)
{
	float f;

	memcpy(&f, raw + v->t.offset + col * v->t.nb[1] + 4 * row, 4);
	return f;
}

/* --- one multiplication, both ways --------------------------------------- */

void weight_new(struct vrig *r, struct q4kh_kernel *k, const struct variant *v,
                uint32_t type, int64_t kk, int64_t n, int64_t pad, struct weight *w)
{
	uint8_t *bytes = random_blocks(type, kk, n);
	int64_t nb1 = (int64_t)row_bytes(type, kk) + pad;

	w->v = v;
	w->type = type;
	w->k = kk;
	w->n = n;
	w->cpu = put(&r->cpu, type, kk, n, nb1, bytes);
	w->gpu = put(&r->gpu, type, kk, n, nb1, bytes);
	w->range = group_ranges(type, bytes, kk, n);
	free(bytes);
	cr_assert_eq(k->v->prepare(k->ctx, &k->native, &w->gpu.t, &w->p), Q4KH_OK,
	             "%s: prepare %s {%lld, %lld}: %s", v->name,
	             q4kh_type_name(type), (long long)kk, (long long)n,
	             k->v->last_error(k->ctx));
	cr_assert_not_null(w->p);
}

void weight_free(struct vrig *r, struct q4kh_kernel *k, struct weight *w)
{
	uint8_t *raw;

	k->v->release(k->ctx, w->p);
	raw = fetch(&r->gpu, &w->gpu);
	cr_assert(!memcmp(raw, w->gpu.bytes, w->gpu.size),
	          "%s: the backend's copy of the %s weight was modified",
	          w->v->name, q4kh_type_name(w->type));
	free(raw);
	drop(&r->cpu, &w->cpu);
	drop(&r->gpu, &w->gpu);
	free(w->range);
}

/* The bound of one element of y (cuda_variant_rig.h): S, the int8 term
 * (cuda-dp4a's GEMV) and sum |x| of its column given. */
static double element_bound(const struct weight *w, int tc, double S, double int8, double xsum)
{
	if (tc)
		return tc_bound(w->k, S, xsum);
	return gemv_bound(w->k, S) + (w->v->int8 ? int8 : 0.0);
}

struct agreement agree(struct vrig *r, const struct weight *w, const float *xv, int64_t t,
                       int gemv, const struct view *yc, const struct view *yg,
                       const char *what)
{
	const int tc = !gemv && t >= w->v->tc_columns;
	const int64_t groups = w->k / CV_GROUP;
	uint8_t *ref = fetch(&r->cpu, yc), *got = fetch(&r->gpu, yg);
	double *ax = malloc(sizeof(double) * (size_t)groups);
	double *dq = malloc(sizeof(double) * (size_t)groups);
	struct agreement a = { 0, 0 };
	double err = 0, sum = 0;

	cr_assert(ax && dq);
	for (uint64_t i = 0; i < yg->size; i++)
		if (got[i] != POISON && !in_view(yg, i))
			cr_assert_fail("%s: byte %llu of the %llu-byte output buffer, outside y, "
			               "was written",
			               what, (unsigned long long)i, (unsigned long long)yg->size);
	for (int64_t c = 0; c < yg->t.ne[1]; c++) {
		const float *x = xv + c * w->k;
		double xsum = 0;

		/* per group: sum |x|, and 16 d_b of the int8 term */
		for (int64_t g = 0; g < groups; g++) {
			double amax = 0;

			ax[g] = 0;
			for (int64_t i = g * CV_GROUP; i < (g + 1) * CV_GROUP; i++) {
				ax[g] += fabs(x[i]);
				amax = fmax(amax, fabs(x[i]));
			}
			dq[g] = 16.0 * amax / 127.0;
			xsum += ax[g];
		}
		for (int64_t i = 0; i < yg->t.ne[0]; i++) {
			const double *s = w->range + i * groups;
			double yg_i = f32_at(yg, got, i, c), yc_i = f32_at(yc, ref, i, c);
			double S = 0, int8 = 0, bound;

			cr_assert(!isnan(yg_i), "%s: y[%lld, %lld] not written (NaN)", what,
			          (long long)i, (long long)c);
			cr_assert(isfinite(yc_i), "%s: cpu y[%lld, %lld] = %g", what, (long long)i,
			          (long long)c, yc_i);
			for (int64_t j = 0; j < groups; j++) {
				S += s[j] * ax[j];
				int8 += s[j] * dq[j];
			}
			bound = element_bound(w, tc, S, int8, xsum);
			cr_assert(fabs(yg_i - yc_i) <= bound,
			          "%s: y[%lld, %lld] = %.9g, cpu %.9g: error %.3g > bound %.3g (%s)",
			          what, (long long)i, (long long)c, yg_i, yc_i, fabs(yg_i - yc_i),
			          bound, tc ? "tensor cores" : w->v->int8 ? "int8 GEMV" : "fp32 GEMV");
			a.worst = fmax(a.worst, fabs(yg_i - yc_i) / bound);
			err += (yg_i - yc_i) * (yg_i - yc_i);
			sum += yc_i * yc_i;
		}
	}
	a.nmse = err / sum;
	if (tc || w->v->int8)
		cr_assert(a.nmse < (tc ? FP16_BOUND : INT8_BOUND), "%s: NMSE %.3g, bound %g", what,
		          a.nmse, tc ? FP16_BOUND : INT8_BOUND);
	free(ax);
	free(dq);
	free(ref);
	free(got);
	return a;
}

struct agreement multiply(struct vrig *r, struct q4kh_kernel *k, const struct weight *w,
                          int64_t t, const float *xv, int gemv)
{
	/* Padded columns: x 16-byte aligned, y only 4. */
	const int64_t xnb = 4 * w->k + 64, ynb = 4 * w->n + 12;
	struct view xc = put(&r->cpu, Q4KH_TYPE_F32, w->k, t, xnb, xv);
	struct view xg = put(&r->gpu, Q4KH_TYPE_F32, w->k, t, xnb, xv);
	struct view yc = put(&r->cpu, Q4KH_TYPE_F32, w->n, t, ynb, NULL);
	struct view yg = put(&r->gpu, Q4KH_TYPE_F32, w->n, t, ynb, NULL);
	char what[160];
	q4kh_status st;
	struct agreement a;

	snprintf(what, sizeof(what), "%s %s %s {%lld, %lld} x %lld", w->v->name,
	         gemv ? "gemv" : "gemm", q4kh_type_name(w->type), (long long)w->k,
	         (long long)w->n, (long long)t);
	cr_assert_eq(r->cpu.v->mul_mat(r->cpu.dev, &w->cpu.t, &xc.t, &yc.t), Q4KH_OK,
	             "cpu mul_mat: %s", r->cpu.v->last_error(r->cpu.ctx));
	st = gemv ? k->v->gemv(k->ctx, &k->native, w->p, &xg.t, &yg.t)
	          : k->v->gemm(k->ctx, &k->native, w->p, &xg.t, &yg.t);
	cr_assert_eq(st, Q4KH_OK, "%s: %s", what, k->v->last_error(k->ctx));
	a = agree(r, w, xv, t, gemv, &yc, &yg, what);
	drop(&r->cpu, &xc);
	drop(&r->gpu, &xg);
	drop(&r->cpu, &yc);
	drop(&r->gpu, &yg);
	return a;
}

void expect_error(struct q4kh_kernel *k, q4kh_status st, q4kh_status want,
                  const char *needle)
{
	const char *msg = k->v->last_error(k->ctx);

	cr_assert_eq(st, want, "expected status %d (%s), got %d: %s", want,
	             needle, st, msg);
	cr_assert(strstr(msg, needle), "last_error \"%s\" lacks \"%s\"", msg,
	          needle);
}

void expect_good_call(struct vrig *r, struct q4kh_kernel *k, q4kh_status st)
{
	cr_assert_eq(st, Q4KH_OK, "%s", k->v->last_error(k->ctx));
	cr_assert_eq(r->gpu.v->synchronize(r->gpu.dev), Q4KH_OK, "%s",
	             r->gpu.v->last_error(r->gpu.ctx));
}
