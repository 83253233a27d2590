/*
 * The cpu-fast plugin around its ops (test_cpu_fast; cpu_fast_rig.h is
 * the rig): the worker pool (every item once, any thread count, lent to a
 * kernel variant through struct q4kh_native_device), the descriptor and
 * device record, settings, wrapped weights, bad views and errors, and its
 * one exported symbol.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_fast_rig.h"
#include "helpers.h"

/* The pool: every item of every job once, whatever the thread count. */
struct count_job {
	_Atomic int *hits;
	_Atomic unsigned bad_thread;
	unsigned threads;
};

static void count_task(void *arg, unsigned thread, int64_t begin, int64_t end)
{
	struct count_job *j = arg;

	if (thread >= j->threads)
		atomic_fetch_add(&j->bad_thread, 1);
	for (int64_t i = begin; i < end; i++)
		atomic_fetch_add(&j->hits[i], 1);
}

Test(cpu_fast, the_lent_pool_runs_every_item_once)
{
	static const char *const counts[] = { "1", "2", "3" };
	static const int64_t sizes[] = { 1, 2, 7, 100, 4097 };

	if (!cpu_runs("avx2"))
		cr_skip_test("cpu-fast has no device on a CPU without AVX2");
	for (int c = 0; c < 3; c++) {
		struct env *e = env_load();
		struct q4kh_native_device nd = { .struct_size = sizeof(nd) };

		e->threads = counts[c];
		e->spin = c == 2 ? "0" : NULL; /* three threads on two cores: sleep */
		cr_assert_eq(env_init(e), Q4KH_OK, "%s", e->b->last_error(NULL));
		cr_assert_eq(e->b->device_open(e->ctx, 0, &e->dev), Q4KH_OK, "%s",
		             e->b->last_error(e->ctx));
		cr_assert_eq(e->b->native_device(e->dev, &nd), Q4KH_OK);
		cr_assert_eq(nd.threads, (uint32_t)(c + 1));
		cr_assert(Q4KH_NATIVE_HAS(&nd, parallel));
		for (int rep = 0; rep < 300; rep++) {
			const int64_t n = sizes[rep % 5];
			struct count_job j = { calloc((size_t)n, sizeof(_Atomic int)), 0, nd.threads };

			nd.parallel(nd.pool, n, 1 + rep % 3, count_task, &j);
			for (int64_t i = 0; i < n; i++)
				cr_assert_eq(atomic_load(&j.hits[i]), 1,
				             "threads %s, job %d of %lld items: item %lld ran %d times",
				             counts[c], rep, (long long)n, (long long)i,
				             atomic_load(&j.hits[i]));
			cr_assert_eq(atomic_load(&j.bad_thread), 0);
			free(j.hits);
		}
		env_close(e);
	}
}

/* An older host's record: the backend writes nothing past it. */
Test(cpu_fast, native_handles_of_an_abi_1_0_host)
{
	struct env *e;
	unsigned char rec[64];
	struct q4kh_native_device *nd = (struct q4kh_native_device *)rec;

	e = env_open_default();
	memset(rec, 0xAB, sizeof(rec));
	nd->struct_size = offsetof(struct q4kh_native_device, address) + sizeof(nd->address);
	cr_assert_eq(e->b->native_device(e->dev, nd), Q4KH_OK);
	cr_expect_eq(nd->ordinal, -1);
	cr_expect_not_null(nd->address);
	for (size_t i = nd->struct_size; i < sizeof(rec); i++)
		cr_expect_eq(rec[i], 0xAB, "byte %zu past the record was written", i);
	env_close(e);
}

/*
 * The SDK's backend scaffolding as cpu-fast meets a host
 * (q4khost/backend_base.h): another ABI major is refused as rule V5 says
 * (Q4KH_ERR_UNSUPPORTED, the line for last_error(NULL)), and device_info
 * writes no byte past a short record (V2) and refuses one too short to
 * hold its struct_size.
 */
Test(cpu_fast, init_refuses_another_major_and_records_keep_to_their_size)
{
	struct env *e = env_load();
	struct q4kh_device_record full, *r = &full;
	const unsigned char *rec = (const unsigned char *)&full;

	e->api.abi_major = Q4KH_ABI_MAJOR + 1;
	cr_assert_eq(env_init(e), Q4KH_ERR_UNSUPPORTED);
	cr_expect_str_eq(e->b->last_error(NULL),
	                 "cpu-fast: init: host ABI major 2, plugin built for 1");
	env_close(e);

	e = env_open_default();
	memset(&full, 0xAB, sizeof(full));
	r->struct_size = 12; /* struct_size, index, and 4 bytes of name */
	cr_assert_eq(e->b->device_info(e->ctx, 0, r), Q4KH_OK, "%s", e->b->last_error(e->ctx));
	cr_expect_eq(r->struct_size, 12);
	cr_expect_eq(r->index, 0);
	cr_expect_eq(memcmp(r->name, "cpu ", 4), 0);
	for (size_t i = 12; i < sizeof(full); i++)
		cr_expect_eq(rec[i], 0xAB, "byte %zu past the record was written", i);
	r->struct_size = 2;
	cr_expect_eq(e->b->device_info(e->ctx, 0, r), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "device_info: out->struct_size 2 is too small");
	env_close(e);
}

Test(cpu_fast, identity_device_and_settings)
{
	struct env *e = env_load();
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
	uint32_t n = 0;

	cr_expect_str_eq(e->desc->name, "cpu-fast");
	cr_expect_eq(e->desc->kind, Q4KH_KIND_BACKEND);
	cr_expect_str_eq(e->desc->backend_kind, "cpu");
	cr_expect_eq(e->desc->abi_minor, Q4KH_ABI_MINOR);
	cr_expect_null(e->b->graph_begin, "a recording could not hold a variant's products");
	cr_expect_not_null(e->b->attention_ext);
	cr_expect_not_null(e->b->buffer_wrap);
	e->threads = "0";
	cr_expect_eq(env_init(e), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(NULL),
	                 "[plugin.cpu-fast] threads = \"0\": expected an integer from 1 to 256");
	e->threads = "2";
	e->spin = "fast";
	cr_expect_eq(env_init(e), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(NULL),
	                 "[plugin.cpu-fast] spin_us = \"fast\": expected an integer from 0 to 100000");
	e->spin = NULL;
	e->isa = "sse9";
	cr_expect_eq(env_init(e), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(NULL),
	                 "[plugin.cpu-fast] isa = \"sse9\": expected auto, avx2 or avx512");
	e->isa = NULL;
	cr_assert_eq(env_init(e), Q4KH_OK);
	cr_assert_eq(e->b->device_count(e->ctx, &n), Q4KH_OK);
	if (!cpu_runs("avx2")) {
		cr_expect_eq(n, 0);
		env_close(e);
		return;
	}
	cr_assert_eq(n, 1);
	cr_assert_eq(e->b->device_info(e->ctx, 0, &rec), Q4KH_OK);
	cr_expect_str_eq(rec.name, cpu_runs("avx512") ? "cpu (avx512 float32, 2 threads)"
	                                             : "cpu (avx2 float32, 2 threads)");
	cr_expect_str_eq(rec.uuid, "cpu");
	cr_expect_eq(rec.multiprocessors, 2);
	env_close(e);
}

Test(cpu_fast, wrapped_weights_are_read_in_place_and_never_written)
{
	static const float host[16] __attribute__((aligned(32))) = { 1, 2, 3, 4 };
	struct env *e;
	q4kh_buffer *buf;
	struct q4kh_tensor w, o;
	float got[4];

	e = env_open_default();
	cr_assert_eq(e->b->buffer_wrap(e->dev, host, sizeof(host), &buf), Q4KH_OK);
	cr_expect_eq(e->b->buffer_upload(e->dev, buf, 0, host, 4), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "buffer_upload: the buffer wraps read-only host memory (buffer_wrap)");
	w = (struct q4kh_tensor){ .buffer = buf, .type = Q4KH_TYPE_F32, .ne = { 4, 1, 1, 1 },
		                  .nb = { 4, 16, 16, 16 } };
	o = tensor(e, Q4KH_TYPE_F32, 4, 1, 1, NULL);
	cr_assert_eq(e->b->scale(e->dev, &w, 2.0f, &o), Q4KH_OK);
	cr_assert_eq(e->b->buffer_download(e->dev, o.buffer, 0, got, sizeof(got)), Q4KH_OK);
	cr_expect(got[0] == 2 && got[3] == 8);
	e->b->buffer_free(e->dev, buf);
	drop(e, &o);
	env_close(e);
}

Test(cpu_fast, bad_views_fail_with_one_line)
{
	struct env *e;
	struct q4kh_tensor a, b;

	e = env_open_default();
	a = tensor(e, Q4KH_TYPE_F32, 8, 2, 1, NULL);
	b = tensor(e, Q4KH_TYPE_F32, 8, 3, 1, NULL);
	cr_expect_eq(e->b->add(e->dev, &a, &b, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx), "add: b->ne[1] = 3, expected 1 or a->ne[1] = 2");
	a.ne[1] = 5;
	cr_expect_eq(e->b->scale(e->dev, &a, 1.0f, &a), Q4KH_ERR_INVALID);
	cr_expect_str_eq(e->b->last_error(e->ctx),
	                 "scale x: view {8, 5, 1, 1} at offset 0 ends past its 64-byte buffer");
	drop(e, &a);
	drop(e, &b);
	env_close(e);
}

Test(cpu_fast, exports_exactly_the_entry_symbol)
{
	char so[4096], first[256];
	int n;

	snprintf(so, sizeof(so), "%s/plugins/cpu-fast/.libs/cpu-fast.so", test_builddir());
	n = test_exported_symbols(so, first, sizeof(first));
	cr_assert_eq(n, 1, "cpu-fast.so exports %d symbols", n);
	cr_assert_str_eq(first, "q4kh_plugin_entry_v1");
}
