/*
 * The cpu-fast suites' rig (cpu_fast_rig.h): cpu-fast.so opened on an
 * instruction set, tensors in its buffers, random values, RoPE in double.
 */
#include "cpu_fast_rig.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static const char *config(void *host_data, const char *key)
{
	const struct env *e = host_data;

	if (!strcmp(key, "isa"))
		return e->isa;
	if (!strcmp(key, "spin_us"))
		return e->spin;
	return !strcmp(key, "threads") ? e->threads : NULL;
}

struct env *env_load(void)
{
	struct env *e = calloc(1, sizeof(*e));

	cr_assert_not_null(e);
	e->desc = test_plugin_load("plugins/cpu-fast/.libs/cpu-fast.so", &e->dl);
	e->b = e->desc->backend;
	e->api = test_host_api(e, config);
	e->threads = "2";
	return e;
}

/* Close E's device and shut its backend down, where open. */
static void env_shutdown(struct env *e)
{
	if (e->dev)
		e->b->device_close(e->dev);
	if (e->ctx)
		e->b->shutdown(e->ctx);
	e->dev = NULL;
	e->ctx = NULL;
}

q4kh_status env_init(struct env *e)
{
	env_shutdown(e);
	return e->b->init(&e->api, &e->ctx);
}

struct env *env_open(const char *isa)
{
	struct env *e = env_load();

	e->isa = isa;
	cr_assert_eq(env_init(e), Q4KH_OK, "%s", e->b->last_error(NULL));
	cr_assert_eq(e->b->device_open(e->ctx, 0, &e->dev), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	return e;
}

void env_close(struct env *e)
{
	env_shutdown(e);
	dlclose(e->dl);
	free(e);
}

int cpu_runs(const char *isa)
{
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return 0;
	return !strcmp(isa, "avx2") ||
	       (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"));
}

const char *const isas[2] = { "avx2", "avx512" };

struct env *env_open_default(void)
{
	if (!cpu_runs("avx2"))
		cr_skip_test("cpu-fast has no device on a CPU without AVX2");
	return env_open(NULL);
}

struct q4kh_tensor tensor(struct env *e, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                          const void *data)
{
	struct q4kh_tensor t = { .type = type, .ne = { ne0, ne1, ne2, 1 } };
	const uint64_t row = (uint64_t)(ne0 / q4kh_type_block_elems(type)) *
	                     q4kh_type_block_bytes(type);

	t.nb[0] = (int64_t)q4kh_type_block_bytes(type);
	t.nb[1] = (int64_t)row;
	t.nb[2] = t.nb[1] * ne1;
	t.nb[3] = t.nb[2] * ne2;
	cr_assert_eq(e->b->buffer_alloc(e->dev, (uint64_t)t.nb[3], &t.buffer), Q4KH_OK);
	if (data)
		cr_assert_eq(e->b->buffer_upload(e->dev, t.buffer, 0, data, (uint64_t)t.nb[3]),
		             Q4KH_OK);
	return t;
}

void *fetch(struct env *e, const struct q4kh_tensor *t)
{
	void *out = malloc((size_t)t->nb[3]);

	cr_assert_not_null(out);
	cr_assert_eq(e->b->buffer_download(e->dev, t->buffer, t->offset, out, (uint64_t)t->nb[3]),
	             Q4KH_OK);
	return out;
}

void drop(struct env *e, struct q4kh_tensor *t)
{
	e->b->buffer_free(e->dev, t->buffer);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

double uniform(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

float *randoms(int64_t n, double scale)
{
	float *x = malloc(sizeof(float) * (size_t)n);

	cr_assert_not_null(x);
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(uniform() * scale);
	return x;
}

/* plugin.h's RoPE in double: pair i of a token at position pos. */
static void rope_exact(const struct q4kh_rope_params *p, const float *ff, int64_t pos,
                       int32_t i, double *c, double *s)
{
	double extrap = pos * pow(p->base, -2.0 * i / p->n_rot) / (ff ? ff[i] : 1.0);
	double theta = p->freq_scale * extrap, m = p->attn_factor;

	if (p->ext_factor != 0.0f) {
		double d_fast = p->n_rot * log(p->n_ctx_orig / (p->beta_fast * 2 * M_PI)) /
		                (2 * log(p->base));
		double d_slow = p->n_rot * log(p->n_ctx_orig / (p->beta_slow * 2 * M_PI)) /
		                (2 * log(p->base));
		double lo = fmax(0, floor(d_fast)), hi = fmin(p->n_rot - 1, ceil(d_slow));
		double r = p->ext_factor * (1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo))));

		theta = theta * (1 - r) + extrap * r;
		m *= 1 + 0.1 * log(1 / p->freq_scale);
	}
	*c = cos(theta) * m;
	*s = sin(theta) * m;
}

void expect_rope(const struct q4kh_rope_params *p, const float *ff, const int32_t *pos,
                 int64_t hd, int64_t heads, int64_t T, const float *x, const float *got,
                 const char *what)
{
	for (int64_t t = 0; t < T; t++)
		for (int64_t h = 0; h < heads; h++) {
			const float *xr = x + (t * heads + h) * hd;
			const float *gr = got + (t * heads + h) * hd;

			for (int32_t i = 0; i < p->n_rot / 2; i++) {
				const int ia = p->mode == Q4KH_ROPE_NEOX ? i : 2 * i;
				const int ib = p->mode == Q4KH_ROPE_NEOX ? i + p->n_rot / 2 : 2 * i + 1;
				double c, s, m;

				rope_exact(p, ff, pos[t], i, &c, &s);
				m = hypot(c, s);
				EXPECT_NEAR(gr[ia], xr[ia] * c - xr[ib] * s,
				            4 * U * m * (fabs(xr[ia]) + fabs(xr[ib])) + 1e-30,
				            "%s, t %lld head %lld pair %d", what, (long long)t,
				            (long long)h, i);
				EXPECT_NEAR(gr[ib], xr[ia] * s + xr[ib] * c,
				            4 * U * m * (fabs(xr[ia]) + fabs(xr[ib])) + 1e-30,
				            "%s, t %lld head %lld pair %d", what, (long long)t,
				            (long long)h, i);
			}
			for (int64_t i = p->n_rot; i < hd; i++)
				cr_expect_eq(gr[i], xr[i], "%s pass-through %lld", what, (long long)i);
		}
}
