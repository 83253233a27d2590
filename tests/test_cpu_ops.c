/*
 * The reference cpu plugin, loaded the way the host loads it: its
 * descriptor, device record, threads setting, buffers and types; every op's
 * refusal of bad arguments with a message; and every op's outputs bitwise
 * identical at 1, 2 and 3 threads. Each op against its float64 reference is in
 * test_cpu_ops_matmul.c, _rowwise.c, _attention.c and _recurrent.c; what
 * they share in tests/cpu_ops_helpers.h.
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
#include "cpu_ops_helpers.h"
#include "helpers.h"
#include "q4khost/plugin.h"
#include "weight_types.h"

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
	cr_assert_null(dlsym(e.dl, "q4kh_pool_run"));
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

/* Exactly the weight types q4khost runs (host/lib/weight_types.c): every
 * file that opens can be run and checked against the reference. */
Test(cpu_plugin, supported_types)
{
	struct env *e = env_open("1");

	for (uint32_t t = 0; t < Q4KH_TYPE_COUNT + 60; t++)
		cr_assert_eq(e->b->supports_type(e->ctx, t), q4kh_weight_type_supported(t),
		             "type %u (%s)", t, q4kh_type_name(t) ? q4kh_type_name(t) : "?");
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

/* Every output of a workload, its bytes one after another, and which op
 * gave each part. */
struct bits {
	struct env *e;
	uint8_t *all;
	size_t used;
	const char *op[64];
	size_t end[64]; /* of op[i]'s part */
	int n;
};

/* Append N bytes at P, an output of OP, to B. */
static void append(struct bits *b, const char *op, const void *p, size_t n)
{
	cr_assert_lt(b->n, 64);
	b->all = realloc(b->all, b->used + n);
	cr_assert_not_null(b->all);
	memcpy(b->all + b->used, p, n);
	b->used += n;
	b->op[b->n] = op;
	b->end[b->n++] = b->used;
}

/* Append T's bytes (rows packed), an output of OP, to B; then free T. */
static void keep(struct bits *b, const char *op, struct q4kh_tensor *t)
{
	float *got = fetch(b->e, t);

	append(b, op, got, (size_t)(t->ne[0] / q4kh_type_block_elems(t->type)) *
	                           q4kh_type_block_bytes(t->type) * (size_t)(t->ne[1] * t->ne[2]));
	free(got);
	drop(b->e, t);
}

/* An I32 tensor {n} of IDS. */
static struct q4kh_tensor i32_tensor(struct env *e, const int32_t *ids, int64_t n)
{
	return make_tensor(e, Q4KH_TYPE_I32, n, 1, 1, ids, 0);
}

/* mul_mat of every weight type at 1 and 7 columns; get_rows and
 * get_rows_ext of 40 rows. */
static void products(struct bits *b)
{
	struct env *e = b->e;
	int32_t ids[40];

	for (int i = 0; i < 40; i++)
		ids[i] = (i * 37) % 77;
	for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++) {
		double *exact;
		struct q4kh_tensor w = make_weight(e, all_types[ti], 1024, 77, &exact);
		struct q4kh_tensor it = i32_tensor(e, ids, 40), y;

		for (int64_t t = 1; t <= 7; t += 6) {
			float *xv = random_floats((size_t)(1024 * t));
			struct q4kh_tensor x = f32_tensor(e, 1024, t, 1, xv);

			y = f32_tensor(e, 77, t, 1, NULL);
			cr_assert_eq(e->b->mul_mat(e->dev, &w, &x, &y), Q4KH_OK);
			keep(b, "mul_mat", &y);
			drop(e, &x);
			free(xv);
		}
		y = f32_tensor(e, 1024, 40, 1, NULL);
		cr_assert_eq(e->b->get_rows(e->dev, &w, ids, 40, 0.5f, &y), Q4KH_OK);
		keep(b, "get_rows", &y);
		y = f32_tensor(e, 1024, 40, 1, NULL);
		cr_assert_eq(e->b->get_rows_ext(e->dev, &w, &it, 2.0f, &y), Q4KH_OK);
		keep(b, "get_rows_ext", &y);
		drop(e, &it);
		drop(e, &w);
		free(exact);
	}
}

/* The row-wise ops on {640, 120}: rms_norm, add, mul, scale, both glu,
 * every unary, copy to f16. */
static void rowwise(struct bits *b)
{
	struct env *e = b->e;
	float *av = random_floats(640 * 120), *bv = random_floats(640 * 120);
	float *wv = random_floats(640);
	struct q4kh_tensor a = f32_tensor(e, 640, 120, 1, av), c = f32_tensor(e, 640, 120, 1, bv);
	struct q4kh_tensor w = f32_tensor(e, 640, 1, 1, wv), y;

	y = f32_tensor(e, 640, 120, 1, NULL);
	cr_assert_eq(e->b->rms_norm(e->dev, &a, &w, 1e-6f, &y), Q4KH_OK);
	keep(b, "rms_norm", &y);
	y = f32_tensor(e, 640, 120, 1, NULL);
	cr_assert_eq(e->b->add(e->dev, &a, &w, &y), Q4KH_OK);
	keep(b, "add", &y);
	y = f32_tensor(e, 640, 120, 1, NULL);
	cr_assert_eq(e->b->mul(e->dev, &a, &c, &y), Q4KH_OK);
	keep(b, "mul", &y);
	y = f32_tensor(e, 640, 120, 1, NULL);
	cr_assert_eq(e->b->scale(e->dev, &a, 0.37f, &y), Q4KH_OK);
	keep(b, "scale", &y);
	for (int kind = Q4KH_GLU_GELU_TANH; kind <= Q4KH_GLU_SILU; kind++) {
		y = f32_tensor(e, 640, 120, 1, NULL);
		cr_assert_eq(e->b->glu(e->dev, (q4kh_glu_kind)kind, &a, &c, &y), Q4KH_OK);
		keep(b, "glu", &y);
	}
	for (int kind = Q4KH_UNARY_SIGMOID; kind <= Q4KH_UNARY_SILU; kind++) {
		y = f32_tensor(e, 640, 120, 1, NULL);
		cr_assert_eq(e->b->unary(e->dev, (q4kh_unary_kind)kind, &a, &y), Q4KH_OK);
		keep(b, "unary", &y);
	}
	y = make_tensor(e, Q4KH_TYPE_F16, 640, 120, 1, NULL, 0);
	cr_assert_eq(e->b->copy(e->dev, &a, &y), Q4KH_OK);
	keep(b, "copy", &y);
	drop(e, &a);
	drop(e, &c);
	drop(e, &w);
	free(av);
	free(bv);
	free(wv);
}

/* What an attention layer does with its keys: rope (both modes), rope_ext
 * with YaRN and frequency factors, set_rows into an f16 cache, attention
 * (f16 cache, a window) and attention_ext (f32 cache, positions). */
static void attention_layer(struct bits *b)
{
	struct env *e = b->e;
	enum { HD = 64, NH = 8, T = 100 };
	int32_t pos[T], rows[T];
	float *xv = random_floats(HD * NH * T), *fv = random_floats(HD / 2);
	struct q4kh_tensor x = f32_tensor(e, HD, NH, T, xv), ff = f32_tensor(e, HD / 2, 1, 1, fv);
	struct q4kh_tensor pt, rt, y;
	struct q4kh_rope_params rp = { .struct_size = sizeof(rp), .n_rot = HD,
		                       .mode = Q4KH_ROPE_NEOX, .base = 10000.0f,
		                       .freq_scale = 0.25f, .ext_factor = 1.0f,
		                       .attn_factor = 1.0f, .beta_fast = 32.0f,
		                       .beta_slow = 1.0f, .n_ctx_orig = 64,
		                       .freq_factors = &ff };
	const int32_t attn_pos[9] = { 3, 30, 31, 7, 60, 61, 62, 0, 63 };

	for (int t = 0; t < T; t++) {
		pos[t] = 5 + 3 * t;
		rows[t] = (t * 41) % T;
	}
	pt = i32_tensor(e, pos, T);
	rt = i32_tensor(e, rows, T);
	for (int mode = Q4KH_ROPE_NORM; mode <= Q4KH_ROPE_NEOX; mode += 2) {
		y = f32_tensor(e, HD, NH, T, NULL);
		cr_assert_eq(e->b->rope(e->dev, &x, pos, HD, (q4kh_rope_mode)mode, 10000.0f, 1.0f,
		                        &y),
		             Q4KH_OK);
		keep(b, "rope", &y);
	}
	y = f32_tensor(e, HD, NH, T, NULL);
	cr_assert_eq(e->b->rope_ext(e->dev, &x, &pt, &rp, &y), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	keep(b, "rope_ext", &y);
	y = make_tensor(e, Q4KH_TYPE_F16, HD, NH, T, NULL, 0);
	cr_assert_eq(e->b->set_rows(e->dev, &x, &rt, &y), Q4KH_OK, "%s", e->b->last_error(e->ctx));
	keep(b, "set_rows", &y);
	for (int c = 0; c < 2; c++) {
		struct attn_case ac = {
			.hd = 256, .nh = 4, .nkv = 1, .T = 9, .n_ctx = 64,
			.p = { .struct_size = sizeof(struct q4kh_attn_params),
			       .window = c ? 0 : 12, .pos0 = 20, .scale = 0.0625f },
			.kv_type = c ? Q4KH_TYPE_F32 : Q4KH_TYPE_F16,
			.pos = c ? attn_pos : NULL,
		};
		float *got;
		double *want;

		run_attention(e, &ac, &got, &want);
		append(b, c ? "attention_ext" : "attention", got, sizeof(float) * 256 * 4 * 9);
		free(got);
		free(want);
	}
	drop(e, &x);
	drop(e, &ff);
	drop(e, &pt);
	drop(e, &rt);
	free(xv);
	free(fv);
}

/* A linear-attention layer's own ops: ssm_conv (output and state) and
 * delta_net (output and state). */
static void recurrent(struct bits *b)
{
	struct env *e = b->e;
	enum { C = 40, K = 4, T = 12 };
	float *xv = random_floats(C * T), *wv = random_floats(C * K);
	float *sv = random_floats(C * (K - 1));
	struct q4kh_tensor x = f32_tensor(e, C, T, 1, xv), w = f32_tensor(e, K, C, 1, wv);
	struct q4kh_tensor st = f32_tensor(e, K - 1, C, 1, sv), y = f32_tensor(e, C, T, 1, NULL);
	struct delta_case dc = { .sk = 64, .sv = 64, .hk = 2, .hv = 6, .T = 12 };
	float *got;

	cr_assert_eq(e->b->ssm_conv(e->dev, &x, &w, &st, &y), Q4KH_OK, "%s",
	             e->b->last_error(e->ctx));
	keep(b, "ssm_conv", &y);
	keep(b, "ssm_conv state", &st);
	delta_inputs(&dc);
	st = f32_tensor(e, dc.sk, dc.sv, dc.hv, dc.s0);
	got = run_delta(e, &dc, &st, 0, dc.T, 0.125f);
	append(b, "delta_net", got, sizeof(float) * 64 * 6 * 12);
	free(got);
	keep(b, "delta_net state", &st);
	delta_free(&dc);
	drop(e, &x);
	drop(e, &w);
	free(xv);
	free(wv);
	free(sv);
}

/* The outputs of a fixed workload at THREADS threads, concatenated into
 * *B: every op of the cpu plugin's table (the 1.0 ops, the 1.2 step
 * entries, the linear-attention ones), on shapes that give each thread a
 * part. */
static void workload(const char *threads, struct bits *b)
{
	memset(b, 0, sizeof(*b));
	b->e = env_open(threads);
	rng_state = 51;
	products(b);
	rowwise(b);
	attention_layer(b);
	recurrent(b);
	env_close(b->e);
}

/* The op whose output first differs between A and B, or NULL. */
static const char *first_difference(const struct bits *a, const struct bits *b)
{
	size_t at = 0;

	cr_assert_eq(a->used, b->used);
	while (at < a->used && a->all[at] == b->all[at])
		at++;
	for (int i = 0; at < a->used && i < a->n; i++)
		if (at < a->end[i])
			return a->op[i];
	return NULL;
}

Test(cpu_ops, bitwise_identical_at_1_2_3_threads)
{
	struct bits r[3];
	const char *op;

	for (int i = 0; i < 3; i++)
		workload(i == 0 ? "1" : i == 1 ? "2" : "3", &r[i]);
	for (size_t i = 0; i < r[0].used / sizeof(float); i++)
		cr_assert(!isnan(((float *)r[0].all)[i]), "output %zu not written", i);
	for (int i = 1; i < 3; i++) {
		op = first_difference(&r[0], &r[i]);
		cr_expect_null(op, "%s: %d threads differ from 1", op, i + 1);
	}
	for (int i = 0; i < 3; i++)
		free(r[i].all);
}
