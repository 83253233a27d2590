/*
 * The reference cpu plugin, loaded the way the host loads it (dlopen of the
 * built cpu.so, the entry symbol, init with a test host API), checked op by
 * op against float64 references written here from the definitions: the
 * block layouts of ggml (packed here from chosen integer codes), RMSNorm,
 * RoPE, GELU/SiLU, softmax attention, sigmoid/softplus, the short causal
 * convolution and the gated delta rule. Outputs are poisoned with NaN first
 * so an element the plugin forgets to write fails the test.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "buildconf.h"
#include "helpers.h"
#include "q4khost/plugin.h"

/* --- the plugin under a test host --------------------------------------- */

struct env {
	void *dl;
	const struct q4kh_plugin_desc *desc;
	const struct q4kh_backend_v1 *b;
	struct q4kh_host_api api;
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev;
	const char *threads;
};

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

static void env_load(struct env *e)
{
	e->desc = test_plugin_load("plugins/cpu/.libs/cpu.so", &e->dl);
	e->b = e->desc->backend;
	cr_assert_not_null(e->b);
	e->api = test_host_api(e, test_config);
	e->api.log = test_log;
}

/* Load, init with THREADS (NULL: unset) and open device 0. */
static struct env *env_open(const char *threads)
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

static void env_close(struct env *e)
{
	e->b->device_close(e->dev);
	e->b->shutdown(e->ctx);
	dlclose(e->dl);
	free(e);
}

/* --- random numbers and fp16, independent of the plugin ------------------ */

static uint64_t rng_state;

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

/* binary16 of x, rounded to nearest even, from frexp/ldexp. */
static uint16_t ref_to_half(double x)
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

static double ref_from_half(uint16_t h)
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

static const uint32_t all_types[] = {
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

/*
 * A tensor of TYPE {ne0, ne1, ne2} in a buffer of its own, rows PAD bytes
 * apart beyond their size, filled with DATA (contiguous) or NaN bytes.
 */
static struct q4kh_tensor make_tensor(struct env *e, uint32_t type, int64_t ne0,
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

static struct q4kh_tensor f32_tensor(struct env *e, int64_t ne0, int64_t ne1,
                                     int64_t ne2, const float *data)
{
	return make_tensor(e, Q4KH_TYPE_F32, ne0, ne1, ne2, data, 0);
}

/* The f32 values of t, rows packed. */
static float *fetch(struct env *e, const struct q4kh_tensor *t)
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

static void drop(struct env *e, struct q4kh_tensor *t)
{
	e->b->buffer_free(e->dev, t->buffer);
	t->buffer = NULL;
}

static float *random_floats(size_t n)
{
	float *v = malloc(n * sizeof(float));

	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rng_val();
	return v;
}

/* Compare got with want within atol + rtol |want|; every element written. */
static void expect_close(const char *what, const float *got, const double *want,
                         size_t n, double rtol, double atol)
{
	for (size_t i = 0; i < n; i++) {
		cr_assert(!isnan(got[i]), "%s[%zu] was not written (NaN)", what, i);
		cr_assert(fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]),
		          "%s[%zu] = %.9g, expected %.9g", what, i, (double)got[i],
		          want[i]);
	}
}

static void expect_status(struct env *e, q4kh_status st, const char *needle)
{
	const char *msg = e->b->last_error(e->ctx);

	cr_assert_eq(st, Q4KH_ERR_INVALID, "expected INVALID (%s), got %d",
	             needle, st);
	cr_assert(strstr(msg, needle), "last_error \"%s\" lacks \"%s\"", msg,
	          needle);
}

/* --- descriptor, device, buffers ----------------------------------------- */

Test(cpu_plugin, descriptor_and_exports)
{
	struct env e = { 0 };
	const struct q4kh_backend_v1 *b;

	env_load(&e);
	b = e.b;
	cr_assert_eq(e.desc->struct_size, sizeof(struct q4kh_plugin_desc));
	cr_assert_eq(e.desc->abi_minor, Q4KH_ABI_MINOR);
	cr_assert_eq(e.desc->kind, Q4KH_KIND_BACKEND);
	cr_assert_str_eq(e.desc->name, "cpu");
	cr_assert_str_eq(e.desc->version, PACKAGE_VERSION);
	cr_assert_str_eq(e.desc->vendor, "q4khost");
	cr_assert_str_eq(e.desc->license, "MIT");
	cr_assert(strlen(e.desc->build_id) > 3, "build_id \"%s\"", e.desc->build_id);
	cr_assert_null(e.desc->kernel);
	cr_assert_eq(b->struct_size, sizeof(struct q4kh_backend_v1));
	cr_assert(b->init && b->shutdown && b->last_error && b->device_count &&
	          b->device_info && b->device_open && b->device_close &&
	          b->supports_type && b->buffer_alloc && b->buffer_free &&
	          b->buffer_upload && b->buffer_download && b->get_rows &&
	          b->mul_mat && b->rms_norm && b->rope && b->add && b->mul &&
	          b->scale && b->glu && b->copy && b->attention && b->synchronize);
	cr_assert_not_null(b->native_device, "cpu lends host pointers to kernel variants");
	/* Built with hidden visibility: nothing but the entry is exported. */
	cr_assert_null(dlsym(e.dl, "cpu_pool_run"));
	cr_assert_null(dlsym(e.dl, "cpu_mul_mat"));
	cr_assert_null(dlsym(e.dl, "cpu_fail"));
	dlclose(e.dl);
}

Test(cpu_plugin, device_record)
{
	struct env *e = env_open("3");
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
	struct utsname u;
	uint32_t count = 0;
	struct q4kh_device_record small;

	cr_assert_eq(e->b->device_count(e->ctx, &count), Q4KH_OK);
	cr_assert_eq(count, 1);
	cr_assert_eq(e->b->device_info(e->ctx, 0, &rec), Q4KH_OK);
	cr_assert_str_eq(rec.name, "cpu (3 threads)");
	cr_assert_str_eq(rec.uuid, "cpu");
	cr_assert_eq(uname(&u), 0);
	cr_assert_str_eq(rec.arch, u.machine);
	cr_assert_str_eq(rec.driver_version, "");
	cr_assert_gt(rec.memory_bytes, 1u << 20);
	cr_assert_eq(rec.multiprocessors, 3);
	cr_assert_eq(rec.index, 0);
	expect_status(e, e->b->device_info(e->ctx, 1, &rec), "no device 1");
	/* An older, shorter record: nothing written past its struct_size. */
	memset(&small, 0xAB, sizeof(small));
	small.struct_size = 8;
	cr_assert_eq(e->b->device_info(e->ctx, 0, &small), Q4KH_OK);
	cr_assert_eq(small.index, 0);
	for (size_t i = 8; i < sizeof(small); i++)
		cr_assert_eq(((unsigned char *)&small)[i], 0xAB,
		             "byte %zu of a short record written", i);
	cr_assert_eq(e->b->synchronize(e->dev), Q4KH_OK);
	env_close(e);
}

/* Unset, or set to nothing ("threads =" in a config file). */
Test(cpu_plugin, default_threads_are_online_cpus)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	for (int i = 0; i < 2; i++) {
		struct env *e = env_open(i ? "" : NULL);
		struct q4kh_device_record rec = { .struct_size = sizeof(rec) };

		cr_assert_eq(e->b->device_info(e->ctx, 0, &rec), Q4KH_OK);
		cr_assert_eq(rec.multiprocessors, (uint32_t)(n > 256 ? 256 : n));
		env_close(e);
	}
}

Test(cpu_plugin, bad_thread_config_fails_init)
{
	static const char *bad[] = { "0", "257", "abc", "2x", "-1", " 2" };
	struct env e = { 0 };
	q4kh_backend_ctx *ctx;

	env_load(&e);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		e.threads = bad[i];
		ctx = (q4kh_backend_ctx *)&e;
		cr_assert_eq(e.b->init(&e.api, &ctx), Q4KH_ERR_INVALID,
		             "threads = \"%s\" accepted", bad[i]);
		cr_assert_null(ctx);
		cr_assert(strstr(e.b->last_error(NULL), "threads"),
		          "message \"%s\"", e.b->last_error(NULL));
	}
	dlclose(e.dl);
}

Test(cpu_plugin, buffers_and_bounds)
{
	struct env *e = env_open("2");
	q4kh_buffer *buf;
	uint8_t in[100], out[100];

	for (int i = 0; i < 100; i++)
		in[i] = (uint8_t)(i * 7 + 1);
	cr_assert_eq(e->b->buffer_alloc(e->dev, 100, &buf), Q4KH_OK);
	cr_assert_eq(e->b->buffer_upload(e->dev, buf, 0, in, 100), Q4KH_OK);
	cr_assert_eq(e->b->buffer_download(e->dev, buf, 10, out, 90), Q4KH_OK);
	cr_assert_arr_eq(out, in + 10, 90);
	{
		/* Kernel variants for cpu reach buffers through host pointers. */
		struct q4kh_native_device nd = { .struct_size = sizeof(nd) };
		cr_assert_eq(e->b->native_device(e->dev, &nd), Q4KH_OK);
		cr_assert_eq(nd.ordinal, -1);
		cr_assert_null(nd.stream);
		cr_assert_eq(memcmp(nd.address(buf), in, 100), 0);
		nd.struct_size = 4;
		expect_status(e, e->b->native_device(e->dev, &nd), "record of 4 bytes");
	}
	expect_status(e, e->b->buffer_upload(e->dev, buf, 50, in, 51),
	              "51 bytes at offset 50 do not fit in the 100-byte buffer");
	expect_status(e, e->b->buffer_download(e->dev, buf, UINT64_MAX, out, 2),
	              "do not fit");
	expect_status(e, e->b->buffer_upload(e->dev, NULL, 0, in, 1),
	              "buffer is NULL");
	expect_status(e, e->b->buffer_upload(e->dev, buf, 0, NULL, 1),
	              "host pointer is NULL");
	{
		q4kh_buffer *huge = buf;

		cr_assert_eq(e->b->buffer_alloc(e->dev, UINT64_MAX - 8, &huge),
		             Q4KH_ERR_NOMEM);
		cr_assert_null(huge, "a failed allocation leaves *out NULL");
	}
	e->b->buffer_free(e->dev, buf);
	env_close(e);
}

/* ABI 1.2: ops read host memory the buffer wraps; it stays the caller's. */
Test(cpu_plugin, wrapped_host_memory_is_read_in_place)
{
	struct env *e = env_open("2");
	float *host = aligned_alloc(64, 64 * sizeof(float));
	float *got;
	q4kh_buffer *buf;
	struct q4kh_tensor x, out;
	double want[64];

	cr_assert_not_null(host);
	for (int i = 0; i < 64; i++) {
		host[i] = (float)(i - 20) / 8.0f;
		want[i] = host[i] * 0.5; /* exact: one rounding of an exact product */
	}
	cr_assert_eq(e->b->buffer_wrap(e->dev, host, 64 * sizeof(float), &buf), Q4KH_OK,
	             "%s", e->b->last_error(e->ctx));
	x = (struct q4kh_tensor){ .buffer = buf, .type = Q4KH_TYPE_F32,
		                  .ne = { 64, 1, 1, 1 }, .nb = { 4, 256, 256, 256 } };
	out = f32_tensor(e, 64, 1, 1, NULL);
	cr_assert_eq(e->b->scale(e->dev, &x, 0.5f, &out), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &out);
	expect_close("scale of wrapped memory", got, want, 64, 0, 0);
	/* what the host changes, the next op sees: no copy was taken */
	host[3] = 100.0f;
	want[3] = 50.0;
	cr_assert_eq(e->b->scale(e->dev, &x, 0.5f, &out), Q4KH_OK);
	free(got);
	got = fetch(e, &out);
	expect_close("after the host's change", got, want, 64, 0, 0);
	expect_status(e, e->b->buffer_upload(e->dev, buf, 0, host, 4),
	              "wraps read-only host memory");
	expect_status(e, e->b->buffer_wrap(e->dev, (char *)host + 4, 8, &buf),
	              "aligned to 32 bytes");
	e->b->buffer_free(e->dev, x.buffer); /* frees the buffer, not host */
	host[0] = 1.0f;
	free(got);
	free(host);
	drop(e, &out);
	env_close(e);
}

Test(cpu_plugin, supported_types)
{
	struct env *e = env_open("1");
	static const uint32_t no[] = { Q4KH_TYPE_Q4_1, Q4KH_TYPE_Q5_1,
		                       Q4KH_TYPE_Q2_K, Q4KH_TYPE_Q3_K,
		                       Q4KH_TYPE_BF16, 99 };

	for (size_t i = 0; i < sizeof(all_types) / sizeof(all_types[0]); i++)
		cr_assert_eq(e->b->supports_type(e->ctx, all_types[i]), 1, "%s",
		             q4kh_type_name(all_types[i]));
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		cr_assert_eq(e->b->supports_type(e->ctx, no[i]), 0, "type %u", no[i]);
	env_close(e);
}

/* --- get_rows and mul_mat over every type -------------------------------- */

/* A random {K, N} weight of TYPE: a tensor and its exact values. */
static struct q4kh_tensor make_weight(struct env *e, uint32_t type, int64_t k,
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

Test(cpu_ops, get_rows_every_type)
{
	struct env *e = env_open("2");
	const int32_t ids[] = { 3, 0, 4, 3, 1 };
	const float scale = 1.75f;

	rng_state = 11;
	for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++) {
		uint32_t type = all_types[ti];
		double *exact;
		struct q4kh_tensor w = make_weight(e, type, 512, 5, &exact);
		struct q4kh_tensor out = f32_tensor(e, 512, 5, 1, NULL);
		float *got;

		cr_assert_eq(e->b->get_rows(e->dev, &w, ids, 5, scale, &out), Q4KH_OK,
		             "%s", e->b->last_error(e->ctx));
		got = fetch(e, &out);
		/* Exact: every block value is one rounding of its definition. */
		for (int i = 0; i < 5; i++)
			for (int k = 0; k < 512; k++) {
				float want = (float)exact[ids[i] * 512 + k] * scale;

				cr_assert(got[i * 512 + k] == want,
				          "%s row %d [%d] = %.9g, expected %.9g",
				          q4kh_type_name(type), ids[i], k,
				          (double)got[i * 512 + k], (double)want);
			}
		free(got);
		free(exact);
		drop(e, &w);
		drop(e, &out);
	}
	env_close(e);
}

/* y = w x in float64 from the exact weights; tol from sum |w x|. */
static void check_mul_mat(struct env *e, uint32_t type, int64_t k, int64_t n,
                          int64_t t)
{
	double *exact, *want = malloc(sizeof(double) * (size_t)(n * t));
	double *mag = malloc(sizeof(double) * (size_t)(n * t));
	struct q4kh_tensor w = make_weight(e, type, k, n, &exact);
	float *xv = random_floats((size_t)(k * t));
	/* Padded rows: strides must be honoured. */
	struct q4kh_tensor x = make_tensor(e, Q4KH_TYPE_F32, k, t, 1, xv, 64);
	struct q4kh_tensor y = make_tensor(e, Q4KH_TYPE_F32, n, t, 1, NULL, 32);
	float *got;

	for (int64_t c = 0; c < t; c++)
		for (int64_t r = 0; r < n; r++) {
			double s = 0, m = 0;

			for (int64_t i = 0; i < k; i++) {
				s += exact[r * k + i] * xv[c * k + i];
				m += fabs(exact[r * k + i] * xv[c * k + i]);
			}
			want[c * n + r] = s;
			mag[c * n + r] = m;
		}
	cr_assert_eq(e->b->mul_mat(e->dev, &w, &x, &y), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &y);
	for (int64_t i = 0; i < n * t; i++) {
		cr_assert(!isnan(got[i]), "%s y[%lld] not written",
		          q4kh_type_name(type), (long long)i);
		cr_assert(fabs(got[i] - want[i]) <= 1e-6 * mag[i] + 1e-30,
		          "%s K=%lld T=%lld y[%lld] = %.9g, expected %.9g",
		          q4kh_type_name(type), (long long)k, (long long)t,
		          (long long)i, (double)got[i], want[i]);
	}
	free(got);
	free(xv);
	free(exact);
	free(want);
	free(mag);
	drop(e, &w);
	drop(e, &x);
	drop(e, &y);
}

Test(cpu_ops, mul_mat_every_type)
{
	struct env *e = env_open("3");
	const int64_t ts[] = { 1, 3, 7 };

	rng_state = 12;
	for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++)
		for (size_t i = 0; i < 3; i++)
			check_mul_mat(e, all_types[ti], 512, 19, ts[i]);
	/* Lengths that leave a tail after the 8 accumulator lanes. */
	check_mul_mat(e, Q4KH_TYPE_F32, 37, 11, 5);
	check_mul_mat(e, Q4KH_TYPE_F16, 13, 9, 4);
	env_close(e);
}

/* Column t of y must not depend on what else is in the batch. */
Test(cpu_ops, mul_mat_column_independent_of_batch)
{
	struct env *e = env_open("2");
	double *exact;
	struct q4kh_tensor w, x7, x1, y7, y1;
	float *xv, *g7, *g1;

	rng_state = 13;
	w = make_weight(e, Q4KH_TYPE_Q4_K, 1024, 29, &exact);
	xv = random_floats(1024 * 7);
	x7 = f32_tensor(e, 1024, 7, 1, xv);
	x1 = f32_tensor(e, 1024, 1, 1, xv + 1024 * 5);
	y7 = f32_tensor(e, 29, 7, 1, NULL);
	y1 = f32_tensor(e, 29, 1, 1, NULL);
	cr_assert_eq(e->b->mul_mat(e->dev, &w, &x7, &y7), Q4KH_OK);
	cr_assert_eq(e->b->mul_mat(e->dev, &w, &x1, &y1), Q4KH_OK);
	g7 = fetch(e, &y7);
	g1 = fetch(e, &y1);
	cr_assert_arr_eq(g1, g7 + 29 * 5, 29 * sizeof(float));
	free(g7);
	free(g1);
	free(xv);
	free(exact);
	drop(e, &w);
	drop(e, &x7);
	drop(e, &x1);
	drop(e, &y7);
	drop(e, &y1);
	env_close(e);
}

/* --- row-wise ops --------------------------------------------------------- */

static void check_rms_norm(struct env *e, int with_weight, int in_place)
{
	const int64_t n = 300, rows = 10;
	const float eps = 1e-6f;
	float *xv = random_floats((size_t)(n * rows)), *wv = random_floats(n);
	double *want = malloc(sizeof(double) * (size_t)(n * rows));
	struct q4kh_tensor x = f32_tensor(e, n, 5, 2, xv);
	struct q4kh_tensor w = f32_tensor(e, n, 1, 1, wv);
	struct q4kh_tensor out = in_place ? x : f32_tensor(e, n, 5, 2, NULL);
	float *got;

	for (int64_t r = 0; r < rows; r++) {
		double ss = 0;

		for (int64_t i = 0; i < n; i++)
			ss += (double)xv[r * n + i] * xv[r * n + i];
		for (int64_t i = 0; i < n; i++)
			want[r * n + i] = xv[r * n + i] / sqrt(ss / n + eps) *
			                  (with_weight ? wv[i] : 1.0);
	}
	cr_assert_eq(e->b->rms_norm(e->dev, &x, with_weight ? &w : NULL, eps, &out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	expect_close("rms_norm", got, want, (size_t)(n * rows), 4e-7, 0);
	free(got);
	free(xv);
	free(wv);
	free(want);
	if (!in_place)
		drop(e, &out);
	drop(e, &x);
	drop(e, &w);
}

Test(cpu_ops, rms_norm)
{
	struct env *e = env_open("2");

	rng_state = 21;
	check_rms_norm(e, 1, 0);
	check_rms_norm(e, 0, 0);
	check_rms_norm(e, 1, 1);
	env_close(e);
}

static void check_rope(struct env *e, q4kh_rope_mode mode)
{
	const int64_t hd = 64, nh = 3, T = 4;
	const int32_t n_rot = 48, pos[4] = { 0, 7, 100, 4095 };
	const double base = 10000.0, fs = 0.5;
	float *xv = random_floats((size_t)(hd * nh * T));
	double *want = malloc(sizeof(double) * (size_t)(hd * nh * T));
	struct q4kh_tensor x = f32_tensor(e, hd, nh, T, xv);
	struct q4kh_tensor out = f32_tensor(e, hd, nh, T, NULL);
	float *got;

	for (int64_t t = 0; t < T; t++)
		for (int64_t h = 0; h < nh; h++) {
			const float *v = xv + (t * nh + h) * hd;
			double *o = want + (t * nh + h) * hd;

			for (int64_t i = 0; i < hd; i++)
				o[i] = v[i];
			for (int i = 0; i < n_rot / 2; i++) {
				double th = fs * pos[t] * pow(base, -2.0 * i / n_rot);
				int a = mode == Q4KH_ROPE_NORM ? 2 * i : i;
				int b = mode == Q4KH_ROPE_NORM ? 2 * i + 1 : i + n_rot / 2;

				o[a] = v[a] * cos(th) - v[b] * sin(th);
				o[b] = v[a] * sin(th) + v[b] * cos(th);
			}
		}
	cr_assert_eq(e->b->rope(e->dev, &x, pos, n_rot, mode, (float)base,
	                        (float)fs, &out),
	             Q4KH_OK, "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	expect_close(mode == Q4KH_ROPE_NORM ? "rope NORM" : "rope NEOX", got, want,
	             (size_t)(hd * nh * T), 1e-7, 1e-7);
	/* In place gives the same. */
	cr_assert_eq(e->b->rope(e->dev, &x, pos, n_rot, mode, (float)base,
	                        (float)fs, &x),
	             Q4KH_OK);
	free(got);
	got = fetch(e, &x);
	expect_close("rope in place", got, want, (size_t)(hd * nh * T), 1e-7, 1e-7);
	free(got);
	free(xv);
	free(want);
	drop(e, &x);
	drop(e, &out);
}

Test(cpu_ops, rope_norm_and_neox)
{
	struct env *e = env_open("2");

	rng_state = 22;
	check_rope(e, Q4KH_ROPE_NORM);
	check_rope(e, Q4KH_ROPE_NEOX);
	env_close(e);
}

/* add or mul of a {33, 4, 3} with b broadcast to it. */
static void check_binary(struct env *e, int mul, int64_t b0, int64_t b1,
                         int64_t b2)
{
	const int64_t n0 = 33, n1 = 4, n2 = 3;
	float *av = random_floats((size_t)(n0 * n1 * n2));
	float *bv = random_floats((size_t)(b0 * b1 * b2));
	double *want = malloc(sizeof(double) * (size_t)(n0 * n1 * n2));
	struct q4kh_tensor a = f32_tensor(e, n0, n1, n2, av);
	struct q4kh_tensor b = f32_tensor(e, b0, b1, b2, bv);
	struct q4kh_tensor out = f32_tensor(e, n0, n1, n2, NULL);
	float *got;

	for (int64_t k = 0; k < n2; k++)
		for (int64_t j = 0; j < n1; j++)
			for (int64_t i = 0; i < n0; i++) {
				double x = av[(k * n1 + j) * n0 + i];
				double y = bv[((k % b2) * b1 + j % b1) * b0 + i % b0];

				/* Exact in double, so one rounding: IEEE f32. */
				want[(k * n1 + j) * n0 + i] = (float)(mul ? x * y : x + y);
			}
	cr_assert_eq((mul ? e->b->mul : e->b->add)(e->dev, &a, &b, &out), Q4KH_OK,
	             "%s", e->b->last_error(e->ctx));
	got = fetch(e, &out);
	expect_close(mul ? "mul" : "add", got, want, (size_t)(n0 * n1 * n2), 0, 0);
	free(got);
	/* out may alias a. */
	cr_assert_eq((mul ? e->b->mul : e->b->add)(e->dev, &a, &b, &a), Q4KH_OK);
	got = fetch(e, &a);
	expect_close("in place", got, want, (size_t)(n0 * n1 * n2), 0, 0);
	free(got);
	free(av);
	free(bv);
	free(want);
	drop(e, &a);
	drop(e, &b);
	drop(e, &out);
}

Test(cpu_ops, add_mul_broadcast)
{
	struct env *e = env_open("2");

	rng_state = 23;
	for (int mul = 0; mul < 2; mul++) {
		check_binary(e, mul, 33, 4, 3);
		check_binary(e, mul, 33, 1, 1);
		check_binary(e, mul, 1, 4, 1);
		check_binary(e, mul, 33, 1, 3);
		check_binary(e, mul, 1, 1, 1);
	}
	env_close(e);
}

Test(cpu_ops, scale)
{
	struct env *e = env_open("2");
	float *xv;
	double want[70 * 3];
	struct q4kh_tensor x, out;
	float *got;

	rng_state = 24;
	xv = random_floats(70 * 3);
	x = f32_tensor(e, 70, 3, 1, xv);
	out = f32_tensor(e, 70, 3, 1, NULL);
	for (int i = 0; i < 70 * 3; i++)
		want[i] = (float)((double)xv[i] * 0.3f);
	cr_assert_eq(e->b->scale(e->dev, &x, 0.3f, &out), Q4KH_OK);
	got = fetch(e, &out);
	expect_close("scale", got, want, 70 * 3, 0, 0);
	free(got);
	cr_assert_eq(e->b->scale(e->dev, &x, 0.3f, &x), Q4KH_OK);
	got = fetch(e, &x);
	expect_close("scale in place", got, want, 70 * 3, 0, 0);
	free(got);
	free(xv);
	drop(e, &x);
	drop(e, &out);
	env_close(e);
}

Test(cpu_ops, glu_gelu_tanh_and_silu)
{
	struct env *e = env_open("2");
	const int64_t n = 96, rows = 4;

	rng_state = 25;
	for (int kind = 0; kind < 2; kind++) {
		float *g = random_floats((size_t)(n * rows));
		float *u = random_floats((size_t)(n * rows));
		double want[96 * 4];
		struct q4kh_tensor gt, ut, out;
		float *got;

		for (int64_t i = 0; i < n * rows; i++) {
			double x;

			g[i] *= 6.0f; /* reach both tails: |g| up to 6 */
			if (i % 17 == 0)
				g[i] = i % 2 ? 12.5f : -12.5f;
			x = g[i];
			if (kind == Q4KH_GLU_GELU_TANH)
				want[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) *
				                               (x + 0.044715 * x * x * x))) *
				          u[i];
			else
				want[i] = x / (1.0 + exp(-x)) * u[i];
		}
		gt = f32_tensor(e, n, rows, 1, g);
		ut = f32_tensor(e, n, rows, 1, u);
		out = f32_tensor(e, n, rows, 1, NULL);
		cr_assert_eq(e->b->glu(e->dev, (q4kh_glu_kind)kind, &gt, &ut, &out),
		             Q4KH_OK, "%s", e->b->last_error(e->ctx));
		got = fetch(e, &out);
		expect_close(kind ? "silu" : "gelu_tanh", got, want,
		             (size_t)(n * rows), 1e-7, 1e-12);
		free(got);
		free(g);
		free(u);
		drop(e, &gt);
		drop(e, &ut);
		drop(e, &out);
	}
	env_close(e);
}

Test(cpu_ops, copy_f32_f16)
{
	struct env *e = env_open("2");
	const int64_t n = 40, rows = 6;
	float *src;
	uint16_t *half;
	struct q4kh_tensor s, h, back, cache;
	double want[40 * 6];
	float *got;
	uint8_t *raw;

	rng_state = 26;
	src = random_floats((size_t)(n * rows));
	/* Edges: ties, overflow to inf, subnormals, underflow to zero. */
	src[0] = 65520.0f;
	src[1] = 65504.0f;
	src[2] = 1.0f + 1.0f / 2048.0f;
	src[3] = 1e-7f;
	src[4] = -3e-8f;
	src[5] = 1e-9f;
	src[6] = 1.0f + 3.0f / 2048.0f;
	half = malloc(sizeof(uint16_t) * (size_t)(n * rows));
	for (int64_t i = 0; i < n * rows; i++) {
		half[i] = ref_to_half(src[i]);
		want[i] = ref_from_half(half[i]);
	}
	s = f32_tensor(e, n, rows, 1, src);
	/* Rows of a KV cache slot: strides wider than the rows. */
	h = make_tensor(e, Q4KH_TYPE_F16, n, rows, 1, NULL, 24);
	back = f32_tensor(e, n, rows, 1, NULL);
	cr_assert_eq(e->b->copy(e->dev, &s, &h), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	raw = malloc((size_t)(h.nb[1] * rows));
	cr_assert_eq(e->b->buffer_download(e->dev, h.buffer, 0, raw,
	                                   (uint64_t)(h.nb[1] * rows)),
	             Q4KH_OK);
	for (int64_t r = 0; r < rows; r++)
		for (int64_t i = 0; i < n; i++) {
			const uint8_t *p = raw + r * h.nb[1] + 2 * i;

			cr_assert_eq(p[0] | p[1] << 8, half[r * n + i],
			             "f16 of %.9g: 0x%04x, expected 0x%04x",
			             (double)src[r * n + i], p[0] | p[1] << 8,
			             half[r * n + i]);
		}
	cr_assert_eq(e->b->copy(e->dev, &h, &back), Q4KH_OK);
	got = fetch(e, &back);
	for (int64_t i = 0; i < n * rows; i++)
		cr_assert(got[i] == want[i] || (isinf(got[i]) && isinf(want[i])),
		          "f32 of f16 [%lld] = %.9g, expected %.9g", (long long)i,
		          (double)got[i], want[i]);
	free(got);
	/* f32 to f32 into a strided destination. */
	cache = make_tensor(e, Q4KH_TYPE_F32, n, rows, 1, NULL, 16);
	cr_assert_eq(e->b->copy(e->dev, &s, &cache), Q4KH_OK);
	got = fetch(e, &cache);
	cr_assert_arr_eq(got, src, sizeof(float) * (size_t)(n * rows));
	free(got);
	free(raw);
	free(src);
	free(half);
	drop(e, &s);
	drop(e, &h);
	drop(e, &back);
	drop(e, &cache);
	env_close(e);
}

/* --- attention ------------------------------------------------------------ */

struct attn_case {
	int64_t hd, nh, nkv, T, n_ctx;
	struct q4kh_attn_params p;
	uint32_t kv_type;
	const int32_t *pos; /* attention_ext's positions; NULL: attention, pos0 */
};

/* Random q and caches; out and the float64 reference. */
static void run_attention(struct env *e, const struct attn_case *c, float **got,
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
				double d = 0;

				s[j] = -INFINITY;
				if (c->p.window && p - j >= c->p.window)
					continue;
				for (int64_t i = 0; i < c->hd; i++)
					d += qq[i] * kk[i];
				d *= c->p.scale;
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

Test(cpu_ops, attention_gqa_window_softcap)
{
	struct env *e = env_open("3");
	const struct attn_params_case {
		int32_t window;
		int64_t pos0;
		float softcap;
		uint32_t type;
	} cases[] = {
		{ 0, 6, 0.0f, Q4KH_TYPE_F32 }, { 4, 6, 0.0f, Q4KH_TYPE_F32 },
		{ 0, 0, 30.0f, Q4KH_TYPE_F16 }, { 3, 11, 0.0f, Q4KH_TYPE_F16 },
		{ 1, 2, 0.0f, Q4KH_TYPE_F32 },
	};

	rng_state = 31;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct attn_case c = {
			.hd = 64, .nh = 4, .nkv = 2, .T = 5, .n_ctx = 16,
			.p = { .struct_size = sizeof(struct q4kh_attn_params),
			       .window = cases[i].window, .pos0 = cases[i].pos0,
			       .scale = 0.125f, .softcap = cases[i].softcap },
			.kv_type = cases[i].type,
		};
		float *got;
		double *want;
		char what[64];

		run_attention(e, &c, &got, &want);
		snprintf(what, sizeof(what), "attention case %zu", i);
		expect_close(what, got, want, (size_t)(c.hd * c.nh * c.T), 1e-6, 1e-7);
		free(got);
		free(want);
	}
	env_close(e);
}

/* ABI 1.2: one position per query, in device memory, in any order. */
Test(cpu_ops, attention_ext_positions_per_query)
{
	struct env *e = env_open("2");
	static const int32_t pos[][5] = { { 9, 2, 15, 0, 7 }, { 4, 5, 6, 7, 8 } };

	rng_state = 37;
	for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++) {
		struct attn_case c = {
			.hd = 32, .nh = 4, .nkv = 1, .T = 5, .n_ctx = 16,
			.p = { .struct_size = sizeof(struct q4kh_attn_params),
			       .window = i ? 3 : 0, .pos0 = 1000, /* ignored */
			       .scale = 0.2f },
			.kv_type = i ? Q4KH_TYPE_F16 : Q4KH_TYPE_F32,
			.pos = pos[i],
		};
		float *got;
		double *want;

		run_attention(e, &c, &got, &want);
		expect_close("attention_ext", got, want, (size_t)(c.hd * c.nh * c.T), 1e-6,
		             1e-7);
		free(got);
		free(want);
	}
	env_close(e);
}

/* ABI 1.2: the KV-cache write at rows from device memory, f32 to f16. */
Test(cpu_ops, set_rows_writes_exactly_the_rows_named)
{
	struct env *e = env_open("2");
	static const int32_t rows[3] = { 5, 1, 3 };
	float *src;
	uint16_t *got;
	struct q4kh_tensor s, r, d, bad;

	rng_state = 43;
	src = random_floats(8 * 2 * 3);
	s = f32_tensor(e, 8, 2, 3, src);
	r = make_tensor(e, Q4KH_TYPE_I32, 3, 1, 1, rows, 0);
	d = make_tensor(e, Q4KH_TYPE_F16, 8, 2, 6, NULL, 0);
	cr_assert_eq(e->b->set_rows(e->dev, &s, &r, &d), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = malloc(2 * 8 * 2 * 6);
	cr_assert_not_null(got);
	cr_assert_eq(e->b->buffer_download(e->dev, d.buffer, 0, got, 2 * 8 * 2 * 6), Q4KH_OK);
	for (int64_t j = 0; j < 6; j++) {
		int64_t t = j == 5 ? 0 : j == 1 ? 1 : j == 3 ? 2 : -1;

		for (int64_t i = 0; i < 16; i++) {
			uint16_t want = t < 0 ? 0xFFFF : ref_to_half(src[t * 16 + i]);

			cr_expect_eq(got[j * 16 + i], want, "row %lld value %lld: %04x, expected %04x",
			             (long long)j, (long long)i, got[j * 16 + i], want);
		}
	}
	bad = r;
	bad.ne[0] = 2;
	expect_status(e, e->b->set_rows(e->dev, &s, &bad, &d),
	              "set_rows rows: shape {2, 1, 1, 1}, expected {3, 1, 1, 1}");
	drop(e, &d);
	d = make_tensor(e, Q4KH_TYPE_F16, 8, 2, 5, NULL, 0);
	expect_status(e, e->b->set_rows(e->dev, &s, &r, &d),
	              "set_rows rows[0] = 5, expected 0 .. 4");
	free(src);
	free(got);
	drop(e, &s);
	drop(e, &r);
	drop(e, &d);
	env_close(e);
}

/* ABI 1.2: rope_ext and get_rows_ext read ids and positions from tensors
 * and give the 1.0 entries' bits. */
Test(cpu_ops, rope_ext_and_get_rows_ext_match_the_host_memory_forms)
{
	struct env *e = env_open("2");
	static const int32_t pos[3] = { 17, 3, 250 }, ids[2] = { 6, 2 };
	struct q4kh_rope_params rp = { .struct_size = sizeof(rp), .n_rot = 16,
		                       .mode = Q4KH_ROPE_NEOX, .base = 10000.0f,
		                       .freq_scale = 0.5f, .attn_factor = 1.0f };
	double *exact;
	float *x = random_floats(32 * 2 * 3), *a, *b;
	struct q4kh_tensor xt, o1, o2, pt, it, w;

	rng_state = 47;
	xt = f32_tensor(e, 32, 2, 3, x);
	o1 = f32_tensor(e, 32, 2, 3, NULL);
	o2 = f32_tensor(e, 32, 2, 3, NULL);
	pt = make_tensor(e, Q4KH_TYPE_I32, 3, 1, 1, pos, 0);
	cr_assert_eq(e->b->rope(e->dev, &xt, pos, 16, Q4KH_ROPE_NEOX, 10000.0f, 0.5f, &o1),
	             Q4KH_OK);
	cr_assert_eq(e->b->rope_ext(e->dev, &xt, &pt, &rp, &o2), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	a = fetch(e, &o1);
	b = fetch(e, &o2);
	cr_expect_eq(memcmp(a, b, sizeof(float) * 32 * 2 * 3), 0, "rope_ext differs from rope");
	free(a);
	free(b);
	expect_status(e, e->b->rope_ext(e->dev, &xt, &pt, NULL, &o2), "rope_ext: params NULL");

	w = make_weight(e, Q4KH_TYPE_Q4_K, 256, 8, &exact);
	it = make_tensor(e, Q4KH_TYPE_I32, 2, 1, 1, ids, 0);
	drop(e, &o1);
	drop(e, &o2);
	o1 = f32_tensor(e, 256, 2, 1, NULL);
	o2 = f32_tensor(e, 256, 2, 1, NULL);
	cr_assert_eq(e->b->get_rows(e->dev, &w, ids, 2, 0.5f, &o1), Q4KH_OK);
	cr_assert_eq(e->b->get_rows_ext(e->dev, &w, &it, 0.5f, &o2), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	a = fetch(e, &o1);
	b = fetch(e, &o2);
	cr_expect_eq(memcmp(a, b, sizeof(float) * 256 * 2), 0,
	             "get_rows_ext differs from get_rows");
	free(a);
	free(b);
	free(x);
	free(exact);
	drop(e, &xt);
	drop(e, &o1);
	drop(e, &o2);
	drop(e, &pt);
	drop(e, &it);
	drop(e, &w);
	env_close(e);
}

/* --- linear-attention ops (ABI 1.2) ------------------------------------- */

static double ref_unary(q4kh_unary_kind kind, double x)
{
	switch (kind) {
	case Q4KH_UNARY_SIGMOID: return 1.0 / (1.0 + exp(-x));
	case Q4KH_UNARY_SOFTPLUS: return (double)log1pl(expl(x));
	case Q4KH_UNARY_SILU: return x / (1.0 + exp(-x));
	}
	return NAN;
}

Test(cpu_ops, unary_sigmoid_softplus_silu)
{
	struct env *e = env_open("2");
	const int64_t n = 50, rows = 3;

	rng_state = 61;
	for (int kind = 0; kind < 3; kind++) {
		float *x = random_floats((size_t)(n * rows));
		double want[50 * 3];
		struct q4kh_tensor xt, out;
		float *got;

		for (int64_t i = 0; i < n * rows; i++) {
			x[i] *= 8.0f; /* both tails */
			if (i % 13 == 0)
				x[i] = i % 2 ? 40.0f : -40.0f;
			want[i] = ref_unary((q4kh_unary_kind)kind, x[i]);
		}
		/* rows 3 floats apart beyond their length: strides are free */
		xt = make_tensor(e, Q4KH_TYPE_F32, n, rows, 1, x, 12);
		out = f32_tensor(e, n, rows, 1, NULL);
		cr_assert_eq(e->b->unary(e->dev, (q4kh_unary_kind)kind, &xt, &out), Q4KH_OK,
		             "%s", e->b->last_error(e->ctx));
		got = fetch(e, &out);
		expect_close("unary", got, want, (size_t)(n * rows), 1e-7, 1e-30);
		free(got);
		cr_assert_eq(e->b->unary(e->dev, (q4kh_unary_kind)kind, &xt, &xt), Q4KH_OK);
		got = fetch(e, &xt);
		expect_close("unary in place", got, want, (size_t)(n * rows), 1e-7, 1e-30);
		free(got);
		free(x);
		drop(e, &xt);
		drop(e, &out);
	}
	env_close(e);
}

/* Outputs {C, T} and the new state of the convolution, from the
 * definition: each channel's kept values, then its inputs. */
static void ref_conv(const float *x, const float *w, const float *state, int64_t c_n,
                     int64_t T, int64_t k, double *out, double *new_state)
{
	for (int64_t c = 0; c < c_n; c++) {
		double u[64];

		for (int64_t i = 0; i < k - 1; i++)
			u[i] = state[c * (k - 1) + i];
		for (int64_t t = 0; t < T; t++)
			u[k - 1 + t] = x[t * c_n + c];
		for (int64_t t = 0; t < T; t++) {
			out[t * c_n + c] = 0.0;
			for (int64_t i = 0; i < k; i++)
				out[t * c_n + c] += (double)w[c * k + i] * u[t + i];
		}
		for (int64_t i = 0; i < k - 1; i++)
			new_state[c * (k - 1) + i] = u[T + i];
	}
}

Test(cpu_ops, ssm_conv_matches_the_definition_and_carries_its_state)
{
	struct env *e = env_open("2");
	const int64_t C = 40, K = 4, T = 5;
	double want[40 * 5], want_state[40 * 3];
	struct q4kh_tensor xt, wt, st, out, x2, x3, o2, o3;
	float *x, *w, *s0, *got, *got_state, *a, *b;

	rng_state = 62;
	x = random_floats(C * T);
	w = random_floats(C * K);
	s0 = random_floats(C * 3);
	ref_conv(x, w, s0, C, T, K, want, want_state);
	xt = f32_tensor(e, C, T, 1, x);
	wt = f32_tensor(e, K, C, 1, w);
	st = f32_tensor(e, K - 1, C, 1, s0);
	out = f32_tensor(e, C, T, 1, NULL);
	cr_assert_eq(e->b->ssm_conv(e->dev, &xt, &wt, &st, &out), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	got = fetch(e, &out);
	got_state = fetch(e, &st);
	expect_close("ssm_conv out", got, want, (size_t)(C * T), 1e-7, 1e-7);
	expect_close("ssm_conv state", got_state, want_state, (size_t)(C * 3), 0, 0);

	/* The same 5 tokens as steps of 2 and 3, and of 1 (fewer than the 3
	 * kept): the same bits, the state carrying the rest. */
	for (int split = 1; split <= 2; split++) {
		drop(e, &st);
		st = f32_tensor(e, K - 1, C, 1, s0);
		x2 = f32_tensor(e, C, split, 1, x);
		x3 = f32_tensor(e, C, T - split, 1, x + C * split);
		o2 = f32_tensor(e, C, split, 1, NULL);
		o3 = f32_tensor(e, C, T - split, 1, NULL);
		cr_assert_eq(e->b->ssm_conv(e->dev, &x2, &wt, &st, &o2), Q4KH_OK);
		cr_assert_eq(e->b->ssm_conv(e->dev, &x3, &wt, &st, &o3), Q4KH_OK);
		a = fetch(e, &o2);
		b = fetch(e, &o3);
		cr_expect_eq(memcmp(a, got, sizeof(float) * C * split), 0,
		             "steps of %d: first step differs", split);
		cr_expect_eq(memcmp(b, got + C * split, sizeof(float) * C * (T - split)), 0,
		             "steps of %d: second step differs", split);
		free(a);
		free(b);
		a = fetch(e, &st);
		cr_expect_eq(memcmp(a, got_state, sizeof(float) * C * 3), 0,
		             "steps of %d: state differs", split);
		free(a);
		drop(e, &x2);
		drop(e, &x3);
		drop(e, &o2);
		drop(e, &o3);
	}
	expect_status(e, e->b->ssm_conv(e->dev, &xt, &wt, &out, &out),
	              "ssm_conv state: shape {40, 5, 1, 1}, expected {3, 40, 1, 1}");
	expect_status(e, e->b->ssm_conv(e->dev, &xt, &wt, &st, &xt),
	              "ssm_conv out (offset 0) overlaps x");
	free(got);
	free(got_state);
	free(x);
	free(w);
	free(s0);
	drop(e, &xt);
	drop(e, &wt);
	drop(e, &st);
	drop(e, &out);
	env_close(e);
}

struct delta_case {
	int64_t sk, sv, hk, hv, T;
	float *q, *k, *v, *g, *beta, *s0; /* packed */
};

/* Random inputs: q and k of norm 1, as the layer gives them; log decays
 * in (-2, 0); beta in (0, 1). */
static void delta_inputs(struct delta_case *c)
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

static void delta_free(struct delta_case *c)
{
	free(c->q);
	free(c->k);
	free(c->v);
	free(c->g);
	free(c->beta);
	free(c->s0);
}

/* The gated delta rule as plugin.h defines it, in double: out {S_v, H_v,
 * T} and the final state {S_k, S_v, H_v}. */
static void ref_delta(const struct delta_case *c, double scale, double *out, double *state)
{
	const int64_t sk = c->sk, sv = c->sv;

	for (int64_t i = 0; i < sk * sv * c->hv; i++)
		state[i] = c->s0[i];
	for (int64_t h = 0; h < c->hv; h++) {
		double *s = state + h * sk * sv; /* s[i * sk + j] = S[i][j] */
		int64_t kh = h % c->hk;

		for (int64_t t = 0; t < c->T; t++) {
			const float *q = c->q + (t * c->hk + kh) * sk;
			const float *k = c->k + (t * c->hk + kh) * sk;
			const float *v = c->v + (t * c->hv + h) * sv;
			double decay = exp(c->g[t * c->hv + h]), b = c->beta[t * c->hv + h];

			for (int64_t i = 0; i < sk * sv; i++)
				s[i] *= decay;
			for (int64_t i = 0; i < sv; i++) {
				double sk_i = 0.0, d;

				for (int64_t j = 0; j < sk; j++)
					sk_i += s[i * sk + j] * k[j];
				d = b * (v[i] - sk_i);
				for (int64_t j = 0; j < sk; j++)
					s[i * sk + j] += d * k[j];
			}
			for (int64_t i = 0; i < sv; i++) {
				double o = 0.0;

				for (int64_t j = 0; j < sk; j++)
					o += s[i * sk + j] * q[j];
				out[(t * c->hv + h) * sv + i] = scale * o;
			}
		}
	}
}

/* Run delta_net on tokens [t0, t0 + n) of c against STATE; returns out. */
static float *run_delta(struct env *e, const struct delta_case *c, struct q4kh_tensor *state,
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

Test(cpu_ops, delta_net_matches_the_definition_token_by_token_or_not)
{
	struct env *e = env_open("2");
	struct delta_case c = { .sk = 32, .sv = 24, .hk = 2, .hv = 6, .T = 9 };
	const float scale = 1.0f / sqrtf(32.0f);
	double *want, *want_state;
	struct q4kh_tensor st;
	float *got, *got_state;

	rng_state = 63;
	delta_inputs(&c);
	want = malloc(sizeof(double) * (size_t)(c.sv * c.hv * c.T));
	want_state = malloc(sizeof(double) * (size_t)(c.sk * c.sv * c.hv));
	cr_assert(want && want_state);
	ref_delta(&c, scale, want, want_state);
	st = f32_tensor(e, c.sk, c.sv, c.hv, c.s0);
	got = run_delta(e, &c, &st, 0, c.T, scale);
	got_state = fetch(e, &st);
	expect_close("delta_net out", got, want, (size_t)(c.sv * c.hv * c.T), 1e-6, 1e-7);
	expect_close("delta_net state", got_state, want_state, (size_t)(c.sk * c.sv * c.hv),
	             1e-6, 1e-7);
	free(got);
	free(got_state);

	/* One token per call, as decode runs it: the state goes through f32
	 * between calls, nothing else differs. */
	drop(e, &st);
	st = f32_tensor(e, c.sk, c.sv, c.hv, c.s0);
	for (int64_t t = 0; t < c.T; t++) {
		got = run_delta(e, &c, &st, t, 1, scale);
		expect_close("delta_net one token", got, want + t * c.hv * c.sv,
		             (size_t)(c.hv * c.sv), 1e-5, 1e-6);
		free(got);
	}
	got_state = fetch(e, &st);
	expect_close("delta_net state after single tokens", got_state, want_state,
	             (size_t)(c.sk * c.sv * c.hv), 1e-5, 1e-6);
	free(got_state);
	drop(e, &st);
	free(want);
	free(want_state);
	delta_free(&c);
	env_close(e);
}

Test(cpu_ops, delta_net_refuses_bad_shapes_and_aliasing)
{
	struct env *e = env_open("2");
	struct q4kh_tensor q = f32_tensor(e, 8, 3, 2, NULL), v = f32_tensor(e, 8, 4, 2, NULL);
	struct q4kh_tensor g = f32_tensor(e, 4, 2, 1, NULL), st = f32_tensor(e, 8, 8, 4, NULL);
	struct q4kh_tensor out = f32_tensor(e, 8, 4, 2, NULL), q2 = f32_tensor(e, 8, 2, 2, NULL);

	expect_status(e, e->b->delta_net(e->dev, &q, &q, &v, &g, &g, &st, 1.0f, &out),
	              "delta_net: 4 value heads is not a multiple of 3 key heads");
	expect_status(e, e->b->delta_net(e->dev, &q2, &q2, &v, &g, &g, &out, 1.0f, &out),
	              "delta_net state: shape {8, 4, 2, 1}, expected {8, 8, 4, 1}");
	expect_status(e, e->b->delta_net(e->dev, &q2, &q2, &v, &g, &g, &st, 1.0f, &v),
	              "delta_net out (offset 0) overlaps delta_net v");
	expect_status(e, e->b->unary(e->dev, (q4kh_unary_kind)7, &q, &q),
	              "unary: kind 7, expected 0 (sigmoid)");
	drop(e, &q);
	drop(e, &v);
	drop(e, &g);
	drop(e, &st);
	drop(e, &out);
	drop(e, &q2);
	env_close(e);
}

/* --- invalid arguments ---------------------------------------------------- */

Test(cpu_ops, invalid_arguments_fail_with_messages)
{
	struct env *e = env_open("2"), *other = env_open("1");
	double *exact;
	struct q4kh_tensor w, x, y, bad, f16x, t3, foreign, view;
	struct q4kh_attn_params ap = { .struct_size = sizeof(ap), .scale = 1.0f };
	const int32_t ids[] = { 0, 9 }, pos[2] = { 0, 1 };

	rng_state = 41;
	w = make_weight(e, Q4KH_TYPE_Q8_0, 64, 8, &exact);
	x = f32_tensor(e, 64, 2, 1, NULL);
	y = f32_tensor(e, 8, 2, 1, NULL);
	f16x = make_tensor(e, Q4KH_TYPE_F16, 64, 2, 1, NULL, 0);
	t3 = f32_tensor(e, 64, 3, 1, NULL);
	foreign = f32_tensor(other, 64, 2, 1, NULL);

	expect_status(e, e->b->mul_mat(e->dev, &w, &f16x, &y),
	              "mul_mat x: type 1 (F16), expected F32");
	expect_status(e, e->b->mul_mat(e->dev, &w, &t3, &y),
	              "mul_mat y: shape {8, 2, 1, 1}, expected {8, 3, 1, 1}");
	expect_status(e, e->b->mul_mat(e->dev, NULL, &x, &y),
	              "mul_mat w: tensor is NULL");
	expect_status(e, e->b->mul_mat(e->dev, &w, &foreign, &y),
	              "another device");
	bad = x;
	bad.offset = 4;
	expect_status(e, e->b->mul_mat(e->dev, &w, &bad, &y), "ends past");
	bad = x;
	bad.nb[0] = 8;
	expect_status(e, e->b->mul_mat(e->dev, &w, &bad, &y), "nb[0] = 8");
	bad = w;
	bad.ne[0] = 48;
	expect_status(e, e->b->mul_mat(e->dev, &bad, &x, &y),
	              "not a multiple of Q8_0's block of 32");
	bad = w;
	bad.type = Q4KH_TYPE_Q4_1;
	expect_status(e, e->b->mul_mat(e->dev, &bad, &x, &y), "Q4_1");
	bad = x;
	bad.ne[1] = -1;
	expect_status(e, e->b->mul_mat(e->dev, &w, &bad, &y), "ne[1] = -1");
	/* y overlapping x: a view of x's buffer. */
	view = x;
	view.ne[0] = 8;
	view.nb[1] = 32;
	expect_status(e, e->b->mul_mat(e->dev, &w, &x, &view), "overlaps");

	expect_status(e, e->b->get_rows(e->dev, &w, ids, 2, 1.0f, &y),
	              "get_rows out: shape");
	expect_status(e, e->b->get_rows(e->dev, &w, ids, 2, 1.0f, &x),
	              "ids[1] = 9, expected 0 .. 7");
	expect_status(e, e->b->get_rows(e->dev, &w, NULL, 2, 1.0f, &x), "ids");

	expect_status(e, e->b->rms_norm(e->dev, &x, NULL, -1.0f, &x), "eps");
	expect_status(e, e->b->rms_norm(e->dev, &x, &y, 1e-6f, &x),
	              "rms_norm w: shape");
	expect_status(e, e->b->rope(e->dev, &x, pos, 7, Q4KH_ROPE_NEOX, 1e4f,
	                            1.0f, &x),
	              "n_rot = 7");
	expect_status(e, e->b->rope(e->dev, &x, pos, 8, (q4kh_rope_mode)1, 1e4f,
	                            1.0f, &x),
	              "mode 1");
	expect_status(e, e->b->rope(e->dev, &x, NULL, 8, Q4KH_ROPE_NEOX, 1e4f,
	                            1.0f, &x),
	              "pos is NULL");
	expect_status(e, e->b->add(e->dev, &x, &y, &x), "b->ne[0] = 8");
	expect_status(e, e->b->mul(e->dev, &x, &t3, &x), "mul: b->ne[1] = 3");
	expect_status(e, e->b->scale(e->dev, &x, 2.0f, &t3), "scale out: shape");
	expect_status(e, e->b->glu(e->dev, (q4kh_glu_kind)7, &x, &x, &t3),
	              "glu: kind 7");
	expect_status(e, e->b->glu(e->dev, Q4KH_GLU_SILU, &x, &t3, &x),
	              "glu up: shape");
	expect_status(e, e->b->copy(e->dev, &x, &t3), "copy dst: shape");
	expect_status(e, e->b->copy(e->dev, &w, &x), "copy src: type 8 (Q8_0)");

	/* q {8, 2, 3}, cache {8, 1, 2}: positions 0..2 do not fit. */
	x.ne[0] = 8;
	x.ne[1] = 2;
	x.ne[2] = 3;
	x.nb[1] = 32;
	x.nb[2] = 64;
	x.nb[3] = 192;
	bad = f32_tensor(e, 8, 1, 2, NULL);
	view = f32_tensor(e, 8, 2, 3, NULL);
	expect_status(e, e->b->attention(e->dev, &x, &bad, &bad, &ap, &view),
	              "positions 0 .. 2, expected inside the 2-position cache");
	expect_status(e, e->b->attention(e->dev, &x, &bad, &bad, NULL, &view),
	              "params is NULL");
	ap.window = -1;
	drop(e, &bad);
	bad = f32_tensor(e, 8, 1, 8, NULL);
	expect_status(e, e->b->attention(e->dev, &x, &bad, &bad, &ap, &view),
	              "window -1");
	ap.window = 0;
	drop(e, &bad);
	bad = f32_tensor(e, 8, 3, 8, NULL);
	expect_status(e, e->b->attention(e->dev, &x, &bad, &bad, &ap, &view),
	              "2 query heads is not a multiple of 3 KV heads");
	expect_status(e, e->b->attention(e->dev, &x, &bad, &bad, &ap, &x),
	              "attention out (offset 0) overlaps q");

	free(exact);
	drop(e, &w);
	drop(e, &y);
	drop(e, &f16x);
	drop(e, &t3);
	drop(e, &bad);
	drop(e, &view);
	x.ne[0] = 64;
	drop(e, &x);
	drop(other, &foreign);
	env_close(other);
	env_close(e);
}

/* --- determinism across thread counts ------------------------------------ */

/* The outputs of a fixed workload, concatenated. */
static uint8_t *workload(const char *threads, size_t *len)
{
	struct env *e = env_open(threads);
	static const uint32_t types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q8_0 };
	static const int64_t ts[] = { 1, 7 };
	uint8_t *all = NULL;
	size_t used = 0;

	rng_state = 51;
	for (int ti = 0; ti < 2; ti++)
		for (int i = 0; i < 2; i++) {
			double *exact;
			struct q4kh_tensor w = make_weight(e, types[ti], 1024, 77, &exact);
			float *xv = random_floats((size_t)(1024 * ts[i]));
			struct q4kh_tensor x = f32_tensor(e, 1024, ts[i], 1, xv);
			struct q4kh_tensor y = f32_tensor(e, 77, ts[i], 1, NULL);
			float *got;

			cr_assert_eq(e->b->mul_mat(e->dev, &w, &x, &y), Q4KH_OK);
			got = fetch(e, &y);
			all = realloc(all, used + sizeof(float) * (size_t)(77 * ts[i]));
			memcpy(all + used, got, sizeof(float) * (size_t)(77 * ts[i]));
			used += sizeof(float) * (size_t)(77 * ts[i]);
			free(got);
			free(xv);
			free(exact);
			drop(e, &w);
			drop(e, &x);
			drop(e, &y);
		}
	{
		float *xv = random_floats(640 * 120), *wv = random_floats(640);
		struct q4kh_tensor x = f32_tensor(e, 640, 120, 1, xv);
		struct q4kh_tensor w = f32_tensor(e, 640, 1, 1, wv);
		float *got;

		cr_assert_eq(e->b->rms_norm(e->dev, &x, &w, 1e-6f, &x), Q4KH_OK);
		got = fetch(e, &x);
		all = realloc(all, used + sizeof(float) * 640 * 120);
		memcpy(all + used, got, sizeof(float) * 640 * 120);
		used += sizeof(float) * 640 * 120;
		free(got);
		free(xv);
		free(wv);
		drop(e, &x);
		drop(e, &w);
	}
	{
		struct attn_case c = {
			.hd = 256, .nh = 4, .nkv = 1, .T = 9, .n_ctx = 40,
			.p = { .struct_size = sizeof(struct q4kh_attn_params),
			       .window = 12, .pos0 = 20, .scale = 0.0625f },
			.kv_type = Q4KH_TYPE_F16,
		};
		float *got;
		double *want;

		run_attention(e, &c, &got, &want);
		all = realloc(all, used + sizeof(float) * 256 * 4 * 9);
		memcpy(all + used, got, sizeof(float) * 256 * 4 * 9);
		used += sizeof(float) * 256 * 4 * 9;
		free(got);
		free(want);
	}
	{
		struct delta_case c = { .sk = 64, .sv = 64, .hk = 2, .hv = 6, .T = 12 };
		struct q4kh_tensor st;
		float *got;

		delta_inputs(&c);
		st = f32_tensor(e, c.sk, c.sv, c.hv, c.s0);
		got = run_delta(e, &c, &st, 0, c.T, 0.125f);
		all = realloc(all, used + sizeof(float) * 64 * 6 * 12);
		memcpy(all + used, got, sizeof(float) * 64 * 6 * 12);
		used += sizeof(float) * 64 * 6 * 12;
		free(got);
		drop(e, &st);
		delta_free(&c);
	}
	env_close(e);
	*len = used;
	return all;
}

Test(cpu_ops, bitwise_identical_at_1_2_3_threads)
{
	size_t n1, n2, n3;
	uint8_t *r1 = workload("1", &n1), *r2 = workload("2", &n2);
	uint8_t *r3 = workload("3", &n3);

	cr_assert_eq(n1, n2);
	cr_assert_eq(n1, n3);
	for (size_t i = 0; i < n1 / sizeof(float); i++)
		cr_assert(!isnan(((float *)r1)[i]), "output %zu not written", i);
	cr_assert(memcmp(r1, r2, n1) == 0, "2 threads differ from 1");
	cr_assert(memcmp(r1, r3, n1) == 0, "3 threads differ from 1");
	free(r1);
	free(r2);
	free(r3);
}
