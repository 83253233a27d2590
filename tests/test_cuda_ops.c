/*
 * The cuda backend's ABI 1.0 and 1.1 ops, op by op, against the reference
 * cpu plugin (cuda_rig.h says how outputs are compared). The tests of the
 * "cuda_plugin" suite run everywhere; the others skip without a device.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "buildconf.h"
#include "config.h"
#include "conformance.h"
#include "helpers.h"
#include "model.h"
#include "q4khost/plugin.h"
#include "registry.h"
#include "cuda_rig.h"

/* --- weights ---------------------------------------------------------------- */

static const uint32_t weight_types[] = {
	Q4KH_TYPE_F32,  Q4KH_TYPE_F16,  Q4KH_TYPE_BF16, Q4KH_TYPE_Q4_0,   Q4KH_TYPE_Q4_1,
	Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q2_K,   Q4KH_TYPE_Q3_K,
	Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS,
};
#define N_WEIGHT_TYPES (sizeof(weight_types) / sizeof(weight_types[0]))

/* Row lengths: a short one, and one long enough for several groups of 32
 * values per lane of a warp. */
static int64_t short_k(uint32_t type)
{
	switch (q4kh_type_block_elems(type)) {
	case 1: return 67;
	case 32: return 96;
	default: return 256;
	}
}

static int64_t long_k(uint32_t type)
{
	switch (q4kh_type_block_elems(type)) {
	case 1: return 1100;
	case 32: return 1120;
	default: return 2304;
	}
}

/* --- the plugin, on every machine --------------------------------------- */

/* Is a file whose name contains NAME mapped into this process? */
static int mapped(const char *name)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096];
	int found = 0, lines = 0;

	cr_assert_not_null(f, "cannot read /proc/self/maps");
	while (!found && fgets(line, sizeof(line), f)) {
		found = strstr(line, name) != NULL;
		lines++;
	}
	fclose(f);
	cr_assert_gt(lines, 0, "/proc/self/maps is empty");
	return found;
}

Test(cuda_plugin, loads_and_exports_only_its_entry)
{
	struct q4kh_registry *reg;
	const struct q4kh_plugin *p;
	const struct q4kh_backend_v1 *b;
	q4kh_backend_ctx *ctx;

	/* The host links no CUDA: only the plugin brings the runtime in. */
	cr_assert(!mapped("libcudart"), "libcudart is loaded before any plugin");
	reg = scan();
	p = find_plugin(reg, "cuda");
	cr_assert(mapped("libcudart"), "the cuda plugin did not load libcudart");
	cr_assert_eq(p->desc->kind, Q4KH_KIND_BACKEND);
	cr_assert_str_eq(p->desc->version, PACKAGE_VERSION);
	cr_assert_str_eq(p->desc->license, "MIT");
	cr_assert(strstr(p->desc->build_id, "nvcc ") &&
	                  strstr(p->desc->build_id, "sm_"),
	          "build_id \"%s\" names no nvcc and architectures",
	          p->desc->build_id);
	b = p->desc->backend;
	cr_assert_eq(b->struct_size, sizeof(*b));
	cr_assert_not_null(b->native_device);
	for (const char **s = (const char *[]){ "cuda_mul_mat", "cuda_fail",
	                                        "cuda_launch_mul_mat",
	                                        "cuda_type_supported", NULL };
	     *s; s++)
		cr_assert_null(dlsym(p->dl, *s), "%s is exported", *s);
	cr_assert_eq(b->init(&p->api, &ctx), Q4KH_OK, "%s", b->last_error(NULL));
	/* which types: test_cuda_weight_types */
	b->shutdown(ctx);
	q4kh_registry_free(reg);
}

Test(cuda_plugin, no_device_is_zero_devices_not_an_error)
{
	struct q4kh_registry *reg = scan();
	const struct q4kh_plugin *p = find_plugin(reg, "cuda");
	const struct q4kh_backend_v1 *b = p->desc->backend;
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
	struct q4kh_backend be;
	struct q4kh_error err = { { 0 } };
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev = (q4kh_device_ctx *)&rec;
	uint32_t n = 99;

	cr_assert_eq(b->init(&p->api, &ctx), Q4KH_OK, "%s", b->last_error(NULL));
	cr_assert_eq(b->device_count(ctx, &n), Q4KH_OK, "%s", b->last_error(ctx));
	if (n > 0) {
		b->shutdown(ctx);
		q4kh_registry_free(reg);
		cr_skip_test("%u CUDA device(s) present: this test is for machines "
		             "without one", n);
	}
	cr_assert_eq(b->device_info(ctx, 0, &rec), Q4KH_ERR_INVALID);
	cr_assert(strstr(b->last_error(ctx),
	                 "device_info: no device 0 (the cuda backend has 0: "),
	          "message \"%s\"", b->last_error(ctx));
	cr_assert_eq(b->device_open(ctx, 0, &dev), Q4KH_ERR_INVALID);
	cr_assert_null(dev);
	cr_assert(strstr(b->last_error(ctx), "device_open: no device 0"),
	          "message \"%s\"", b->last_error(ctx));
	b->shutdown(ctx);
	cr_assert_eq(q4kh_backend_open(p, 0, &be, &err), -1);
	cr_assert(strstr(err.msg, "cuda: no device 0 (the backend has 0)"), "%s",
	          err.msg);
	q4kh_registry_free(reg);
}

/*
 * [plugin.cuda] pdl, fuse and persistent: the on/off words of
 * docs/config.md ("On and off"), "" as unset; anything else fails init
 * with Q4KH_ERR_INVALID, naming the key, the value and the words (with or
 * without a device: init reads them first).
 */
Test(cuda_plugin, settings_are_validated)
{
	static const char *const keys[] = { "pdl", "fuse", "persistent" };
	static const char *const good[] = { "0", "1", "", "On", "off", "TRUE", "no" };
	static const char *const bad[] = { "2", "enabled", "-1", "1 " };
	const char *dir = test_tmpdir();

	for (size_t k = 0; k < 3; k++)
		for (size_t i = 0; i < 11; i++) {
			const char *v = i < 7 ? good[i] : bad[i - 7];
			struct q4kh_error err = { { 0 } };
			struct q4kh_config *c;
			struct q4kh_registry *reg;
			const struct q4kh_plugin *p;
			q4kh_backend_ctx *ctx = NULL;
			char want[160];

			setenv("XDG_CONFIG_HOME", dir, 1);
			cr_assert_eq(q4kh_config_load(dir, NULL, &c, &err), 0, "%s", err.msg);
			cr_assert_eq(q4kh_config_set(c, "plugin.cuda", keys[k], v, "test", &err), 0,
			             "%s", err.msg);
			cr_assert_eq(q4kh_registry_scan(NULL, c, &reg, &err), 0, "%s", err.msg);
			p = find_plugin(reg, "cuda");
			if (i < 7) {
				cr_expect_eq(p->desc->backend->init(&p->api, &ctx), Q4KH_OK,
				             "%s = \"%s\": %s", keys[k], v,
				             p->desc->backend->last_error(NULL));
				if (ctx)
					p->desc->backend->shutdown(ctx);
			} else {
				cr_expect_eq(p->desc->backend->init(&p->api, &ctx), Q4KH_ERR_INVALID,
				             "%s = \"%s\" accepted", keys[k], v);
				snprintf(want, sizeof(want),
				         "[plugin.cuda] %s = \"%s\": expected 1, on, true, yes or 0, "
				         "off, false, no (any case)",
				         keys[k], v);
				cr_expect(strstr(p->desc->backend->last_error(NULL), want),
				          "last_error(NULL) \"%s\" lacks \"%s\"",
				          p->desc->backend->last_error(NULL), want);
			}
			q4kh_registry_free(reg);
			q4kh_config_free(c);
		}
}

/* --- devices, buffers, native handles ------------------------------------- */

static int hex_run(const char *s, int n)
{
	for (int i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

Test(cuda_device, records)
{
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	q4kh_backend_ctx *ctx = r->be[GPU].ctx;
	struct q4kh_device_record small;
	uint32_t n = 0;

	cr_assert_eq(b->device_count(ctx, &n), Q4KH_OK);
	cr_assert_geq(n, 1);
	for (uint32_t i = 0; i < n; i++) {
		struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
		const char *u = rec.uuid;

		cr_assert_eq(b->device_info(ctx, i, &rec), Q4KH_OK, "%s", ERR(r, GPU));
		cr_log_info("cuda device %u: %s, %s, %s, driver %s, %llu MiB, %u SMs",
		            i, rec.name, rec.uuid, rec.arch, rec.driver_version,
		            (unsigned long long)(rec.memory_bytes >> 20),
		            rec.multiprocessors);
		cr_assert_eq(rec.index, i);
		cr_assert_eq(rec.struct_size, sizeof(rec));
		cr_assert_gt(strlen(rec.name), 0);
		/* nvidia-smi's form: GPU-8-4-4-4-12 lower-case hex digits. */
		cr_assert(strlen(u) == 40 && !strncmp(u, "GPU-", 4) &&
		                  hex_run(u + 4, 8) && u[12] == '-' &&
		                  hex_run(u + 13, 4) && u[17] == '-' &&
		                  hex_run(u + 18, 4) && u[22] == '-' &&
		                  hex_run(u + 23, 4) && u[27] == '-' &&
		                  hex_run(u + 28, 12),
		          "uuid \"%s\"", u);
		cr_assert(!strncmp(rec.arch, "sm_", 3) && strlen(rec.arch) >= 5 &&
		                  strspn(rec.arch + 3, "0123456789") ==
		                          strlen(rec.arch + 3),
		          "arch \"%s\"", rec.arch);
		cr_assert(strchr(rec.driver_version, '.'), "driver_version \"%s\"",
		          rec.driver_version);
		cr_assert_geq(rec.memory_bytes, 1ull << 30);
		cr_assert_geq(rec.multiprocessors, 1);
	}
	cr_assert_eq(b->device_info(ctx, n, &small), Q4KH_ERR_INVALID);
	/* An older, shorter record: nothing written past its struct_size. */
	memset(&small, 0xAB, sizeof(small));
	small.struct_size = 8;
	cr_assert_eq(b->device_info(ctx, 0, &small), Q4KH_OK);
	cr_assert_eq(small.index, 0);
	for (size_t i = 8; i < sizeof(small); i++)
		cr_assert_eq(((unsigned char *)&small)[i], 0xAB,
		             "byte %zu of a short record written", i);
	rig_close(r);
}

static void expect_status(struct rig *r, q4kh_status st, q4kh_status want,
                          const char *needle)
{
	const char *msg = ERR(r, GPU);

	cr_assert_eq(st, want, "expected status %d (%s), got %d: %s", want,
	             needle, st, msg);
	cr_assert(strstr(msg, needle), "last_error \"%s\" lacks \"%s\"", msg,
	          needle);
}

Test(cuda_device, buffers_and_bounds)
{
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	q4kh_device_ctx *dev = DEV(r, GPU);
	q4kh_buffer *buf, *huge = NULL, *empty;
	uint8_t in[1000], out[1000];

	for (int i = 0; i < 1000; i++)
		in[i] = (uint8_t)(i * 7 + 1);
	cr_assert_eq(b->buffer_alloc(dev, 1000, &buf), Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(b->buffer_upload(dev, buf, 0, in, 1000), Q4KH_OK);
	cr_assert_eq(b->buffer_upload(dev, buf, 333, in, 10), Q4KH_OK);
	cr_assert_eq(b->buffer_download(dev, buf, 0, out, 1000), Q4KH_OK);
	cr_assert_arr_eq(out, in, 333);
	cr_assert_arr_eq(out + 333, in, 10);
	cr_assert_arr_eq(out + 343, in + 343, 1000 - 343);
	cr_assert_eq(b->buffer_download(dev, buf, 999, out, 1), Q4KH_OK);
	cr_assert_eq(out[0], in[999]);
	cr_assert_eq(b->buffer_download(dev, buf, 1000, out, 0), Q4KH_OK);
	expect_status(r, b->buffer_upload(dev, buf, 500, in, 501),
	              Q4KH_ERR_INVALID,
	              "501 bytes at offset 500 do not fit in the 1000-byte buffer");
	expect_status(r, b->buffer_download(dev, buf, UINT64_MAX, out, 2),
	              Q4KH_ERR_INVALID, "do not fit");
	expect_status(r, b->buffer_upload(dev, NULL, 0, in, 1), Q4KH_ERR_INVALID,
	              "buffer is NULL");
	expect_status(r, b->buffer_download(dev, buf, 0, NULL, 1),
	              Q4KH_ERR_INVALID, "host pointer is NULL");
	/* Out of device memory: an error with CUDA's words, then business as
	 * usual (the error is not left behind for the next call). */
	expect_status(r, b->buffer_alloc(dev, UINT64_MAX / 2, &huge),
	              Q4KH_ERR_NOMEM, "buffer_alloc: cudaMalloc of ");
	cr_assert_null(huge);
	cr_assert(strstr(ERR(r, GPU), "cudaErrorMemoryAllocation"), "%s",
	          ERR(r, GPU));
	cr_assert_eq(b->buffer_alloc(dev, 0, &empty), Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(b->buffer_download(dev, buf, 0, out, 1000), Q4KH_OK, "%s",
	             ERR(r, GPU));
	cr_assert_arr_eq(out + 343, in + 343, 1000 - 343);
	cr_assert_eq(b->synchronize(dev), Q4KH_OK, "%s", ERR(r, GPU));
	b->buffer_free(dev, empty);
	b->buffer_free(dev, buf);
	rig_close(r);
}

/* BYTES at offset AT of FILE, read with pread: not through a mapping. */
static uint8_t *file_bytes(const char *file, uint64_t at, size_t bytes)
{
	uint8_t *p = malloc(bytes ? bytes : 1);
	int fd = open(file, O_RDONLY);
	size_t got = 0;

	cr_assert(p && fd >= 0, "%s: %s", file, strerror(errno));
	while (got < bytes) {
		ssize_t n = pread(fd, p + got, bytes - got, (off_t)(at + got));

		cr_assert_gt(n, 0, "%s: pread at %llu: %s", file,
		             (unsigned long long)(at + got), n ? strerror(errno) : "end of file");
		got += (size_t)n;
	}
	close(fd);
	return p;
}

/* The first byte where DEVICE (SIZE bytes at OFFSET of BUF) and WANT
 * differ, or -1. */
static int64_t first_difference(struct rig *r, q4kh_buffer *buf, uint64_t offset,
                                const uint8_t *want, size_t size)
{
	uint8_t *got = malloc(size ? size : 1);
	int64_t at = -1;

	cr_assert_not_null(got);
	cr_assert_eq(V(r, GPU)->buffer_download(DEV(r, GPU), buf, offset, got, size), Q4KH_OK,
	             "%s", ERR(r, GPU));
	for (size_t i = 0; i < size && at < 0; i++)
		if (got[i] != want[i])
			at = (int64_t)i;
	free(got);
	return at;
}

/*
 * Uploads from a file's read-only mapping, larger than the pinned ring
 * that stages them (cuda_buffer.c: 4 slots of 16 MiB), at odd sizes and
 * offsets, with a small one (the driver's staging) between them: the
 * device holds the file's bytes, byte for byte.
 */
Test(cuda_device, large_uploads_from_a_mapping_are_byte_exact, .timeout = 120)
{
	const size_t size = ((size_t)70 << 20) + 4099, first = ((size_t)20 << 20) + 7;
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	q4kh_device_ctx *dev = DEV(r, GPU);
	char *path = NULL;
	uint8_t *data = malloc(size), *want;
	const uint8_t *map;
	q4kh_buffer *buf;
	int64_t at;
	int fd;

	cr_assert_not_null(data);
	for (size_t i = 0; i < size; i++)
		data[i] = (uint8_t)irand(0, 255);
	cr_assert(asprintf(&path, "%s/upload.bin", test_tmpdir()) > 0);
	test_write_file(path, data, size);
	free(data);
	fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	cr_assert_neq(map, MAP_FAILED, "%s: mmap: %s", path, strerror(errno));
	close(fd);
	cr_assert_eq(b->buffer_alloc(dev, size + 3, &buf), Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(b->buffer_upload(dev, buf, 3, map, first), Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(b->buffer_upload(dev, buf, 3 + first, map + first, 100), Q4KH_OK, "%s",
	             ERR(r, GPU));
	cr_assert_eq(b->buffer_upload(dev, buf, 3 + first + 100, map + first + 100,
	                              size - first - 100),
	             Q4KH_OK, "%s", ERR(r, GPU));
	want = file_bytes(path, 0, size);
	at = first_difference(r, buf, 3, want, size);
	cr_expect_eq(at, -1, "the device's byte %lld of %s is not the file's", (long long)at, path);
	/* again: the ring's slots are reused, their earlier copies waited for */
	cr_assert_eq(b->buffer_upload(dev, buf, 3, map, size), Q4KH_OK, "%s", ERR(r, GPU));
	at = first_difference(r, buf, 3, want, size);
	cr_expect_eq(at, -1, "after a second upload, the device's byte %lld is not the file's",
	             (long long)at);
	free(want);
	munmap((void *)map, size);
	unlink(path);
	free(path);
	b->buffer_free(dev, buf);
	rig_close(r);
}

/* Weight W of model M on the device is the file's bytes, read with pread. */
static void expect_file_bytes(struct rig *r, const struct q4kh_model *m,
                              const struct q4kh_weight *w)
{
	const struct q4kh_gguf *g = m->gguf;
	uint8_t *want;
	int64_t at;

	if (!w->src)
		return;
	want = file_bytes(g->path, (uint64_t)((const uint8_t *)w->src->data - g->map),
	                  (size_t)w->src->size);
	at = first_difference(r, w->t.buffer, w->t.offset, want, (size_t)w->src->size);
	cr_expect_eq(at, -1, "%s: byte %lld of weight %.*s on the device is not the file's", g->path,
	             (long long)at, (int)w->src->name.len, w->src->name.data);
	free(want);
}

/* A model's upload (q4kh_model_upload: its embedding, LM head and stacks
 * of experts through the ring, the rest through the driver's staging)
 * leaves every weight the file's bytes. */
Test(cuda_device, uploaded_weights_are_the_files_bytes, .timeout = 120)
{
	struct rig *r = rig_open();
	struct q4kh_error err = { { 0 } };
	struct q4kh_model *m = NULL;
	char *path = NULL;

	cr_assert(asprintf(&path, "%s/tests/fixtures/tiny-qwen3moe.gguf", test_srcdir()) > 0);
	cr_assert_eq(q4kh_model_open(path, &m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(m, &r->be[GPU], &err), 0, "%s", err.msg);
	expect_file_bytes(r, m, &m->tok_embd);
	expect_file_bytes(r, m, &m->output);
	for (uint32_t il = 0; il < m->hp.n_layer; il++) {
		const struct q4kh_layer *l = &m->layers[il];
		const struct q4kh_weight *lw[] = {
			&l->attn_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->q_norm, &l->k_norm,
			&l->ffn_norm, &l->ffn_gate_inp, &l->ffn_gate_exps, &l->ffn_up_exps,
			&l->ffn_down_exps,
		};

		for (size_t i = 0; i < sizeof(lw) / sizeof(lw[0]); i++)
			expect_file_bytes(r, m, lw[i]);
	}
	q4kh_model_free(m);
	free(path);
	rig_close(r);
}

Test(cuda_device, native_handles)
{
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	struct q4kh_native_device nd = { .struct_size = sizeof(nd) };
	struct q4kh_native_device old = { .struct_size = 8 };
	/* a host of ABI 1.3 .. 1.8: its record ends before flags */
	struct q4kh_native_device v13 = { .struct_size = offsetof(struct q4kh_native_device, flags),
		                          .flags = 7 };
	struct q4kh_device_record rec = { .struct_size = sizeof(rec) };
	q4kh_buffer *a, *c;
	int cc = 0;

	cr_assert_eq(b->native_device(DEV(r, GPU), &nd), Q4KH_OK, "%s",
	             ERR(r, GPU));
	cr_assert_eq(nd.ordinal, 0);
	/* [plugin.cuda] pdl unset: programmatic dependent launch from 9.0 on */
	cr_assert_eq(b->device_info(r->be[GPU].ctx, 0, &rec), Q4KH_OK, "%s", ERR(r, GPU));
	cr_assert_eq(sscanf(rec.arch, "sm_%d", &cc), 1, "arch \"%s\"", rec.arch);
	cr_expect_eq(nd.flags, cc >= 90 ? Q4KH_NATIVE_CUDA_PDL : 0u, "%s", rec.arch);
	cr_assert_eq(b->native_device(DEV(r, GPU), &v13), Q4KH_OK, "%s", ERR(r, GPU));
	cr_expect_eq(v13.flags, 7u, "flags written past the host's record");
	cr_expect_eq(Q4KH_NATIVE_FLAGS(&v13), 0u);
	cr_assert_not_null(nd.stream);
	cr_assert_not_null(nd.address);
	cr_assert_eq(b->buffer_alloc(DEV(r, GPU), 64, &a), Q4KH_OK);
	cr_assert_eq(b->buffer_alloc(DEV(r, GPU), 64, &c), Q4KH_OK);
	cr_assert_not_null(nd.address(a));
	cr_assert_neq(nd.address(a), nd.address(c));
	cr_assert_null(nd.address(NULL));
	expect_status(r, b->native_device(DEV(r, GPU), &old), Q4KH_ERR_INVALID,
	              "native_device: record of 8 bytes");
	b->buffer_free(DEV(r, GPU), a);
	b->buffer_free(DEV(r, GPU), c);
	rig_close(r);
}

/* --- get_rows and mul_mat over every weight type --------------------------- */

static void check_get_rows(struct rig *r, uint32_t type, int64_t k, int64_t n)
{
	const int64_t rows = 37;
	struct twin w = twin_weights(r, type, k, rows, 0);
	struct twin out = twin_new(r, Q4KH_TYPE_F32, k, n, 1, 16, NULL);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	float scale = (float)(0.5 + urand());
	char what[96];

	cr_assert_not_null(ids);
	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)irand(0, rows - 1); /* repeats too */
	ids[n - 1] = rows - 1;
	BOTH(r, get_rows(DEV(r, s_), T(w), ids, n, scale, T(out)));
	snprintf(what, sizeof(what), "get_rows %s K=%lld n=%lld",
	         q4kh_type_name(type), (long long)k, (long long)n);
	/* Dequantization is exact in f32: one rounding of the scale. */
	expect_agree(r, what, &out, 0.0);
	free(ids);
	twin_free(r, &w);
	twin_free(r, &out);
}

Test(cuda_ops, get_rows_every_type)
{
	struct rig *r = rig_open();
	static const int64_t ns[] = { 1, 5, 9, 67 };

	rng_seed(11);
	for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++)
		for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
			check_get_rows(r, weight_types[ti], short_k(weight_types[ti]),
			               ns[i]);
			check_get_rows(r, weight_types[ti], long_k(weight_types[ti]),
			               ns[i]);
		}
	rig_close(r);
}

/* w {K, N} of TYPE times x {K, T}; x and y rows padded, w rows too when
 * PAD_W. */
static void check_mul_mat(struct rig *r, uint32_t type, int64_t k, int64_t n,
                          int64_t t, int pad_w)
{
	struct twin w = twin_weights(r, type, k, n, pad_w ? 8 : 0);
	float *xv = rvals((size_t)(k * t));
	struct twin x = twin_new(r, Q4KH_TYPE_F32, k, t, 1, 64, xv);
	struct twin y = twin_new(r, Q4KH_TYPE_F32, n, t, 1, 36, NULL);
	char what[96];

	BOTH(r, mul_mat(DEV(r, s_), T(w), T(x), T(y)));
	snprintf(what, sizeof(what), "mul_mat %s K=%lld N=%lld T=%lld",
	         q4kh_type_name(type), (long long)k, (long long)n, (long long)t);
	expect_agree(r, what, &y, NMSE_BOUND);
	free(xv);
	twin_free(r, &w);
	twin_free(r, &x);
	twin_free(r, &y);
}

Test(cuda_ops, mul_mat_every_type_t1_to_9)
{
	struct rig *r = rig_open();

	rng_seed(12);
	for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
		uint32_t type = weight_types[ti];

		for (int64_t t = 1; t <= 9; t++) {
			check_mul_mat(r, type, short_k(type), 67, t, t % 2);
			check_mul_mat(r, type, long_k(type), 13, t, 0);
		}
		check_mul_mat(r, type, short_k(type), 1, 1, 0);
	}
	rig_close(r);
}

/*
 * Prompt sizes around every hand-over: the GEMV's 8-column tiles (7, 8,
 * 9), the tensor-core product from Q4KH_TC_MIN_COLUMNS (16, 17) on (63, 64, 65:
 * its 64 MiB weight slices and cuBLAS's tiles), a long prompt past 512
 * (511, 513), for every quantised type; the output
 * padded with poison that must stay untouched.
 */
Test(cuda_ops, mul_mat_prompt_sizes)
{
	static const uint32_t types[] = {
		Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q8_0,
		Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS, Q4KH_TYPE_Q4_1, Q4KH_TYPE_Q5_1,
		Q4KH_TYPE_Q2_K, Q4KH_TYPE_Q3_K,
	};
	static const int64_t cols[] = { 1, 7, 8, 9, 16, 17, 63, 64, 65, 511, 513 };
	struct rig *r = rig_open();

	rng_seed(14);
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
		for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++)
			check_mul_mat(r, types[ti], long_k(types[ti]), 75, cols[c], c % 2);
	rig_close(r);
}

Test(cuda_ops, mul_mat_large_and_batched)
{
	struct rig *r = rig_open();

	rng_seed(13);
	check_mul_mat(r, Q4KH_TYPE_Q4_K, 4096, 1027, 1, 0);
	check_mul_mat(r, Q4KH_TYPE_Q4_K, 4096, 515, 17, 0);
	check_mul_mat(r, Q4KH_TYPE_Q4_K, 2048, 258, 64, 0);
	check_mul_mat(r, Q4KH_TYPE_Q6_K, 2048, 515, 67, 0);
	check_mul_mat(r, Q4KH_TYPE_Q5_K, 1536, 333, 9, 1);
	check_mul_mat(r, Q4KH_TYPE_IQ4_XS, 2048, 300, 33, 0);
	check_mul_mat(r, Q4KH_TYPE_F16, 2048, 300, 33, 0);
	check_mul_mat(r, Q4KH_TYPE_F32, 640, 129, 100, 0);
	/* A vocabulary-sized output: many blocks along the rows. */
	check_mul_mat(r, Q4KH_TYPE_Q8_0, 640, 70001, 2, 0);
	/* Few long rows: several warps share each row (cuda_gemv.cu's ks). */
	check_mul_mat(r, Q4KH_TYPE_Q4_K, 14336, 67, 1, 0);
	check_mul_mat(r, Q4KH_TYPE_Q6_K, 14336, 67, 2, 0);
	check_mul_mat(r, Q4KH_TYPE_Q8_0, 14336, 37, 3, 0);
	check_mul_mat(r, Q4KH_TYPE_IQ4_XS, 14336, 33, 1, 0);
	check_mul_mat(r, Q4KH_TYPE_F16, 14336, 21, 8, 0);
	rig_close(r);
}

/* --- row-wise and element-wise ops ------------------------------------------ */

Test(cuda_ops, rms_norm)
{
	struct rig *r = rig_open();
	/* {ne0, ne1, ne2} and the size of x: at 1e-3, mean(x^2) is near
	 * eps, whose handling then shows. */
	static const struct {
		int64_t s[3];
		float mag;
	} shapes[] = {
		{ { 640, 1, 1 }, 1.0f },  { { 640, 9, 1 }, 1.0f },
		{ { 67, 5, 3 }, 1.0f },   { { 256, 36, 1 }, 1.0f },
		{ { 1, 4, 1 }, 1.0f },    { { 2048, 2, 1 }, 1.0f },
		{ { 640, 3, 1 }, 1e-3f },
	};

	rng_seed(21);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (int mode = 0; mode < 3; mode++) { /* weight, none, in place */
			const int64_t *s = shapes[i].s;
			size_t n = (size_t)(s[0] * s[1] * s[2]);
			float *xv = rvals(n), *wv = rvals((size_t)s[0]);
			struct twin x, w, out;
			char what[96];

			for (size_t j = 0; j < n; j++)
				xv[j] *= shapes[i].mag;
			x = twin_new(r, Q4KH_TYPE_F32, s[0], s[1], s[2], 8, xv);
			w = twin_f32(r, s[0], 1, 1, wv);
			out = mode == 2 ? x : twin_f32(r, s[0], s[1], s[2], NULL);

			BOTH(r, rms_norm(DEV(r, s_), T(x), mode == 1 ? NULL : T(w),
			                 1e-6f, T(out)));
			snprintf(what, sizeof(what), "rms_norm {%lld, %lld, %lld} x%g %s",
			         (long long)s[0], (long long)s[1], (long long)s[2],
			         (double)shapes[i].mag,
			         mode == 0 ? "weighted" : mode == 1 ? "plain" : "in place");
			expect_agree(r, what, &out, NMSE_BOUND);
			if (mode != 2)
				twin_free(r, &out);
			twin_free(r, &x);
			twin_free(r, &w);
			free(xv);
			free(wv);
		}
	rig_close(r);
}

Test(cuda_ops, rope_norm_and_neox)
{
	struct rig *r = rig_open();
	static const int64_t dims[][2] = { /* head dim, rotated dims */
		{ 64, 64 }, { 256, 256 }, { 128, 64 }, { 80, 32 }, { 2, 2 },
	};

	rng_seed(22);
	for (int mode = 0; mode <= 2; mode += 2)
		for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
			for (int64_t t = 1; t <= 9; t++) {
				const int64_t hd = dims[d][0], nh = 1 + t % 4;
				const int32_t n_rot = (int32_t)dims[d][1];
				int32_t pos[9];
				float *xv = rvals((size_t)(hd * nh * t));
				struct twin x = twin_f32(r, hd, nh, t, xv);
				struct twin out = twin_new(r, Q4KH_TYPE_F32, hd, nh, t, 4, NULL);
				const float base = t % 2 ? 10000.0f : 1000000.0f;
				const float fs = t % 3 ? 1.0f : 0.25f;
				char what[96];

				for (int64_t i = 0; i < t; i++)
					pos[i] = (int32_t)(i == 0 ? 0 : irand(1, 100000));
				BOTH(r, rope(DEV(r, s_), T(x), pos, n_rot, (q4kh_rope_mode)mode,
				             base, fs, T(out)));
				snprintf(what, sizeof(what),
				         "rope %s hd=%lld n_rot=%d heads=%lld T=%lld",
				         mode ? "NEOX" : "NORM", (long long)hd, n_rot,
				         (long long)nh, (long long)t);
				expect_agree(r, what, &out, NMSE_BOUND);
				BOTH(r, rope(DEV(r, s_), T(x), pos, n_rot, (q4kh_rope_mode)mode,
				             base, fs, T(x)));
				expect_agree(r, "rope in place", &x, NMSE_BOUND);
				twin_free(r, &x);
				twin_free(r, &out);
				free(xv);
			}
	rig_close(r);
}

/* add or mul of a {67, 5, 3} with b broadcast to it: one rounding each. */
Test(cuda_ops, add_mul_broadcast)
{
	struct rig *r = rig_open();
	static const int64_t bs[][3] = {
		{ 67, 5, 3 }, { 67, 1, 1 }, { 1, 5, 1 }, { 67, 1, 3 }, { 1, 1, 1 },
	};

	rng_seed(23);
	for (int mul = 0; mul < 2; mul++)
		for (size_t i = 0; i < sizeof(bs) / sizeof(bs[0]); i++) {
			float *av = rvals(67 * 5 * 3);
			float *bv = rvals((size_t)(bs[i][0] * bs[i][1] * bs[i][2]));
			struct twin a = twin_new(r, Q4KH_TYPE_F32, 67, 5, 3, 12, av);
			struct twin b = twin_f32(r, bs[i][0], bs[i][1], bs[i][2], bv);
			struct twin out = twin_f32(r, 67, 5, 3, NULL);
			char what[64];

			snprintf(what, sizeof(what), "%s with b {%lld, %lld, %lld}",
			         mul ? "mul" : "add", (long long)bs[i][0],
			         (long long)bs[i][1], (long long)bs[i][2]);
			if (mul)
				BOTH(r, mul(DEV(r, s_), T(a), T(b), T(out)));
			else
				BOTH(r, add(DEV(r, s_), T(a), T(b), T(out)));
			expect_agree(r, what, &out, 0.0);
			if (mul)
				BOTH(r, mul(DEV(r, s_), T(a), T(b), T(a)));
			else
				BOTH(r, add(DEV(r, s_), T(a), T(b), T(a)));
			expect_agree(r, "in place", &a, 0.0);
			twin_free(r, &a);
			twin_free(r, &b);
			twin_free(r, &out);
			free(av);
			free(bv);
		}
	rig_close(r);
}

Test(cuda_ops, scale)
{
	struct rig *r = rig_open();
	float *xv;
	struct twin x, out;

	rng_seed(24);
	xv = rvals(70 * 9 * 2);
	x = twin_new(r, Q4KH_TYPE_F32, 70, 9, 2, 20, xv);
	out = twin_f32(r, 70, 9, 2, NULL);
	BOTH(r, scale(DEV(r, s_), T(x), 0.3f, T(out)));
	expect_agree(r, "scale", &out, 0.0);
	BOTH(r, scale(DEV(r, s_), T(x), -7.25f, T(x)));
	expect_agree(r, "scale in place", &x, 0.0);
	twin_free(r, &x);
	twin_free(r, &out);
	free(xv);
	rig_close(r);
}

Test(cuda_ops, glu_gelu_tanh_and_silu)
{
	struct rig *r = rig_open();
	const int64_t n = 2048 + 67, rows = 5;

	rng_seed(25);
	for (int kind = 0; kind < 2; kind++)
		for (int in_place = 0; in_place < 2; in_place++) {
			float *g = rvals((size_t)(n * rows)), *u = rvals((size_t)(n * rows));
			struct twin gt, ut, out;

			for (int64_t i = 0; i < n * rows; i++) {
				g[i] *= 8.0f; /* both tails */
				if (i % 97 == 0)
					g[i] = i % 2 ? 30.0f : -30.0f;
			}
			gt = twin_f32(r, n, rows, 1, g);
			ut = twin_new(r, Q4KH_TYPE_F32, n, rows, 1, 4, u);
			out = in_place ? gt : twin_f32(r, n, rows, 1, NULL);
			BOTH(r, glu(DEV(r, s_), (q4kh_glu_kind)kind, T(gt), T(ut), T(out)));
			expect_agree(r, kind ? "glu SiLU" : "glu GELU (tanh)", &out,
			             NMSE_BOUND);
			if (!in_place)
				twin_free(r, &out);
			twin_free(r, &gt);
			twin_free(r, &ut);
			free(g);
			free(u);
		}
	rig_close(r);
}

/* f32 -> f16 (round to nearest even, overflow to inf), f16 -> f32, and
 * either into strided rows like a KV cache slot. */
Test(cuda_ops, copy_f32_f16)
{
	struct rig *r = rig_open();
	const int64_t n = 67, rows = 9;
	static const float edges[] = {
		65520.0f, 65504.0f, 1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f,
		1e-7f, -3e-8f, 1e-9f, -0.0f, 6.1035156e-05f, 2.9802322e-08f,
	};
	float *src;
	struct twin s, h, back, wide, h2;

	rng_seed(26);
	src = rvals((size_t)(n * rows));
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
		src[i] = edges[i];
	for (int64_t i = 20; i < n * rows; i += 3)
		src[i] *= (float)ldexp(1.0, (int)irand(-30, 18));
	s = twin_f32(r, n, rows, 1, src);
	h = twin_new(r, Q4KH_TYPE_F16, n, rows, 1, 24, NULL);
	back = twin_f32(r, n, rows, 1, NULL);
	wide = twin_new(r, Q4KH_TYPE_F32, n, rows, 1, 40, NULL);
	h2 = twin_new(r, Q4KH_TYPE_F16, n, rows, 1, 2, NULL);
	BOTH(r, copy(DEV(r, s_), T(s), T(h)));
	expect_agree(r, "copy f32 -> f16", &h, 0.0);
	BOTH(r, copy(DEV(r, s_), T(h), T(back)));
	expect_agree(r, "copy f16 -> f32", &back, 0.0);
	BOTH(r, copy(DEV(r, s_), T(s), T(wide)));
	expect_agree(r, "copy f32 -> f32", &wide, 0.0);
	BOTH(r, copy(DEV(r, s_), T(h), T(h2)));
	expect_agree(r, "copy f16 -> f16", &h2, 0.0);
	twin_free(r, &s);
	twin_free(r, &h);
	twin_free(r, &back);
	twin_free(r, &wide);
	twin_free(r, &h2);
	free(src);
	rig_close(r);
}

/* --- attention ------------------------------------------------------------ */

struct attn_case {
	int64_t hd, nh, nkv, T, pos0, n_ctx;
	int32_t window;
	float softcap;
	uint32_t k_type, v_type;
};

/* A cache {hd, nkv, n_ctx} of TYPE: random rows up to position END, poison
 * (NaN) beyond, which attention must never read. */
static struct twin cache_new(struct rig *r, const struct attn_case *c,
                             uint32_t type, int64_t end)
{
	size_t eb = q4kh_type_block_bytes(type);
	size_t n = (size_t)(c->hd * c->nkv * c->n_ctx);
	size_t valid = (size_t)(c->hd * c->nkv * end);
	uint8_t *data = malloc(n * eb);
	struct twin t;

	cr_assert_not_null(data);
	memset(data, POISON, n * eb);
	for (size_t i = 0; i < valid; i++) {
		float f = 2.0f * rval();
		uint16_t h = q4kh_f32_to_fp16(f);

		if (type == Q4KH_TYPE_F16)
			memcpy(data + 2 * i, &h, 2);
		else
			memcpy(data + 4 * i, &f, 4);
	}
	t = twin_new(r, type, c->hd, c->nkv, c->n_ctx, 0, data);
	free(data);
	return t;
}

static void check_attention(struct rig *r, const struct attn_case *c)
{
	float *qv = rvals((size_t)(c->hd * c->nh * c->T));
	struct twin q = twin_f32(r, c->hd, c->nh, c->T, qv);
	struct twin k = cache_new(r, c, c->k_type, c->pos0 + c->T);
	struct twin v = cache_new(r, c, c->v_type, c->pos0 + c->T);
	struct twin out = twin_new(r, Q4KH_TYPE_F32, c->hd, c->nh, c->T, 8, NULL);
	struct q4kh_attn_params p = {
		.struct_size = sizeof(p), .window = c->window, .pos0 = c->pos0,
		.scale = (float)(1.0 / sqrt((double)c->hd)), .softcap = c->softcap,
	};
	char what[160];

	BOTH(r, attention(DEV(r, s_), T(q), T(k), T(v), &p, T(out)));
	snprintf(what, sizeof(what),
	         "attention hd=%lld heads=%lld/%lld T=%lld pos0=%lld window=%d "
	         "softcap=%g k %s v %s",
	         (long long)c->hd, (long long)c->nh, (long long)c->nkv,
	         (long long)c->T, (long long)c->pos0, c->window,
	         (double)c->softcap, q4kh_type_name(c->k_type),
	         q4kh_type_name(c->v_type));
	expect_agree(r, what, &out, NMSE_BOUND);
	twin_free(r, &q);
	twin_free(r, &k);
	twin_free(r, &v);
	twin_free(r, &out);
	free(qv);
}

Test(cuda_ops, attention_gqa_window_softcap)
{
	struct rig *r = rig_open();
	static const int64_t heads[][2] = { { 4, 1 }, { 8, 2 }, { 3, 3 } };
	static const int64_t hds[] = { 64, 256, 72 };
	static const int32_t windows[] = { 0, 1, 4, 512 };
	static const uint32_t kv[][2] = {
		{ Q4KH_TYPE_F32, Q4KH_TYPE_F32 },
		{ Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ Q4KH_TYPE_F16, Q4KH_TYPE_F32 },
	};
	int i = 0;

	rng_seed(31);
	for (int64_t t = 1; t <= 9; t++)
		for (int64_t pos0 = 0; pos0 <= 130; pos0 += 65, i++) {
			/* Head counts, head dims, windows and cache types
			 * rotate at different rates: many pairings. */
			const int64_t *hk = heads[(i / 3 + i) % 3];
			const struct attn_case c = {
				.hd = hds[i % 3], .nh = hk[0], .nkv = hk[1], .T = t,
				.pos0 = pos0, .n_ctx = pos0 + t + i % 5,
				.window = windows[i % 4],
				.softcap = i % 7 == 3 ? 30.0f : 0.0f,
				.k_type = kv[i / 3 % 3][0], .v_type = kv[i / 3 % 3][1],
			};

			check_attention(r, &c);
		}
	rig_close(r);
}

/* Each of the N CASES, drawn from SEED. */
static void check_attention_cases(long seed, const struct attn_case *cases, size_t n)
{
	struct rig *r = rig_open();

	rng_seed(seed);
	for (size_t i = 0; i < n; i++)
		check_attention(r, &cases[i]);
	rig_close(r);
}

Test(cuda_ops, attention_long_context)
{
	static const struct attn_case cases[] = {
		/* Gemma 3 270M's shape: 4 heads over 1 KV head of 256, a
		 * 512-key window; prefill chunk and decode step. */
		{ 256, 4, 1, 9, 600, 700, 512, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 256, 4, 1, 1, 1200, 1300, 0, 0.0f, Q4KH_TYPE_F32, Q4KH_TYPE_F32 },
		{ 64, 8, 2, 1, 2500, 2501, 0, 50.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 128, 4, 4, 67, 3, 80, 16, 0.0f, Q4KH_TYPE_F32, Q4KH_TYPE_F16 },
		{ 96, 6, 2, 130, 0, 130, 0, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
	};

	check_attention_cases(32, cases, sizeof(cases) / sizeof(cases[0]));
}

/* Prompts over an F16 cache (cuda_flash.cu where the device has compute
 * capability 8.0): the three head dimensions, several 64-query tiles with
 * a partial last one, chunks after earlier tokens, windows shorter and
 * longer than a key tile, softcap, grouped queries as the models we serve
 * have them. */
Test(cuda_ops, attention_prompt_on_tensor_cores)
{
	static const struct attn_case cases[] = {
		{ 128, 32, 8, 200, 0, 200, 0, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 128, 12, 2, 130, 300, 450, 0, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 256, 4, 1, 150, 600, 800, 512, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 256, 4, 1, 64, 0, 64, 0, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 64, 8, 2, 100, 0, 120, 0, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 64, 4, 4, 70, 10, 90, 5, 30.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 128, 8, 1, 17, 1000, 1100, 1, 0.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
		{ 128, 4, 2, 300, 0, 300, 0, 50.0f, Q4KH_TYPE_F16, Q4KH_TYPE_F16 },
	};

	check_attention_cases(33, cases, sizeof(cases) / sizeof(cases[0]));
}

/* --- many ops in a row without waiting ------------------------------------- */

/*
 * A chain of ops on one stream with no synchronisation between them: two
 * get_rows and two ropes whose ids and positions differ (the staging buffer
 * is reused while earlier ops may still be queued), a get_rows of 10000 ids
 * (the staging buffer grows mid-chain), matmuls, norms and adds on their
 * outputs; then every output against the cpu's.
 */
Test(cuda_ops, chain_without_synchronize)
{
	struct rig *r = rig_open();
	const int64_t k = 256, vocab = 300, t = 7, big = 10000;
	int32_t ids_a[7], ids_b[7], pos_a[7], pos_b[7];
	int32_t *ids_big = malloc(sizeof(int32_t) * big);
	struct twin table, xa, xb, xbig, w, ya, yb, norm_w;
	struct q4kh_tensor ha[2], hb[2];

	rng_seed(41);
	cr_assert_not_null(ids_big);
	for (int i = 0; i < t; i++) {
		ids_a[i] = (int32_t)irand(0, vocab - 1);
		ids_b[i] = (int32_t)irand(0, vocab - 1);
		pos_a[i] = i;
		pos_b[i] = (int32_t)(1000 + 3 * i);
	}
	for (int64_t i = 0; i < big; i++)
		ids_big[i] = (int32_t)irand(0, vocab - 1);
	table = twin_weights(r, Q4KH_TYPE_Q6_K, k, vocab, 0);
	w = twin_weights(r, Q4KH_TYPE_Q4_K, k, 96, 0);
	{
		float *nw = rvals((size_t)k);

		norm_w = twin_f32(r, k, 1, 1, nw);
		free(nw);
	}
	xa = twin_f32(r, k, t, 1, NULL);
	xb = twin_f32(r, k, t, 1, NULL);
	xbig = twin_f32(r, k, big, 1, NULL);
	ya = twin_f32(r, 96, t, 1, NULL);
	yb = twin_f32(r, 96, t, 1, NULL);
	/* The same activations seen as heads: {64, 4, t}. */
	for (int s = 0; s < 2; s++) {
		ha[s] = xa.t[s];
		hb[s] = xb.t[s];
		ha[s].ne[0] = hb[s].ne[0] = 64;
		ha[s].ne[1] = hb[s].ne[1] = 4;
		ha[s].ne[2] = hb[s].ne[2] = t;
		ha[s].nb[1] = hb[s].nb[1] = 256;
		ha[s].nb[2] = hb[s].nb[2] = 1024;
		ha[s].nb[3] = hb[s].nb[3] = 1024 * t;
	}
	BOTH(r, get_rows(DEV(r, s_), T(table), ids_a, t, 1.0f, T(xa)));
	BOTH(r, get_rows(DEV(r, s_), T(table), ids_b, t, 2.0f, T(xb)));
	BOTH(r, rope(DEV(r, s_), &ha[s_], pos_a, 64, Q4KH_ROPE_NEOX, 10000.0f,
	             1.0f, &ha[s_]));
	BOTH(r, rope(DEV(r, s_), &hb[s_], pos_b, 32, Q4KH_ROPE_NORM, 10000.0f,
	             1.0f, &hb[s_]));
	BOTH(r, get_rows(DEV(r, s_), T(table), ids_big, big, 0.5f, T(xbig)));
	BOTH(r, rms_norm(DEV(r, s_), T(xa), T(norm_w), 1e-6f, T(xa)));
	BOTH(r, mul_mat(DEV(r, s_), T(w), T(xa), T(ya)));
	BOTH(r, mul_mat(DEV(r, s_), T(w), T(xb), T(yb)));
	BOTH(r, add(DEV(r, s_), T(ya), T(yb), T(ya)));
	BOTH(r, get_rows(DEV(r, s_), T(table), ids_b, t, 1.0f, T(xb)));
	expect_agree(r, "chain: get_rows, rope, rms_norm (a)", &xa, NMSE_BOUND);
	expect_agree(r, "chain: get_rows again (b)", &xb, 0.0);
	expect_agree(r, "chain: get_rows of 10000 ids", &xbig, 0.0);
	expect_agree(r, "chain: mul_mat + add", &ya, NMSE_BOUND);
	expect_agree(r, "chain: mul_mat of the roped b", &yb, NMSE_BOUND);
	cr_assert_eq(V(r, GPU)->synchronize(DEV(r, GPU)), Q4KH_OK, "%s",
	             ERR(r, GPU));
	twin_free(r, &table);
	twin_free(r, &w);
	twin_free(r, &norm_w);
	twin_free(r, &xa);
	twin_free(r, &xb);
	twin_free(r, &xbig);
	twin_free(r, &ya);
	twin_free(r, &yb);
	free(ids_big);
	rig_close(r);
}

/* --- invalid arguments -------------------------------------------------------- */

/*
 * Every call below is invalid; the cuda plugin must refuse it before it
 * enqueues anything, with the cpu reference's status and a message that
 * names the operand and what was expected.
 */
Test(cuda_ops, invalid_arguments_fail_with_messages)
{
	struct rig *r = rig_open();
	const struct q4kh_backend_v1 *b = V(r, GPU);
	q4kh_device_ctx *dev = DEV(r, GPU);
	struct q4kh_attn_params ap = { .struct_size = sizeof(ap), .scale = 1.0f };
	const int32_t ids[] = { 0, 9 }, pos[3] = { 0, 1, 2 };
	struct twin w, x, y, f16x, t3, q, cache, big_q, big_cache;
	struct q4kh_tensor bad, view, foreign;

	rng_seed(51);
	w = twin_weights(r, Q4KH_TYPE_Q8_0, 64, 8, 0);
	x = twin_f32(r, 64, 2, 1, NULL);
	y = twin_f32(r, 8, 2, 1, NULL);
	f16x = twin_new(r, Q4KH_TYPE_F16, 64, 2, 1, 0, NULL);
	t3 = twin_f32(r, 64, 3, 1, NULL);
	q = twin_f32(r, 8, 2, 3, NULL);
	cache = twin_f32(r, 8, 1, 2, NULL);
#define G(tw) (&(tw).t[GPU])
	expect_status(r, b->mul_mat(dev, G(w), G(f16x), G(y)), Q4KH_ERR_INVALID,
	              "mul_mat x: type 1 (F16), expected F32");
	expect_status(r, b->mul_mat(dev, G(w), G(t3), G(y)), Q4KH_ERR_INVALID,
	              "mul_mat y: shape {8, 2, 1, 1}, expected {8, 3, 1, 1}");
	expect_status(r, b->mul_mat(dev, NULL, G(x), G(y)), Q4KH_ERR_INVALID,
	              "mul_mat w: tensor is NULL");
	/* A buffer of another device context: the cpu's. */
	foreign = x.t[REF];
	expect_status(r, b->mul_mat(dev, G(w), &foreign, G(y)), Q4KH_ERR_INVALID,
	              "mul_mat x: buffer belongs to another device context");
	bad = *G(x);
	bad.offset = x.size - 8;
	expect_status(r, b->mul_mat(dev, G(w), &bad, G(y)), Q4KH_ERR_INVALID,
	              "ends past its");
	bad = *G(x);
	bad.nb[0] = 8;
	expect_status(r, b->mul_mat(dev, G(w), &bad, G(y)), Q4KH_ERR_INVALID,
	              "mul_mat x: nb[0] = 8, expected 4");
	bad = *G(x);
	bad.offset = 2;
	expect_status(r, b->mul_mat(dev, G(w), &bad, G(y)), Q4KH_ERR_INVALID,
	              "mul_mat x: offset 2 is not a multiple of 4");
	bad = *G(w);
	bad.ne[0] = 48;
	expect_status(r, b->mul_mat(dev, &bad, G(x), G(y)), Q4KH_ERR_INVALID,
	              "not a multiple of Q8_0's block of 32");
	bad = *G(w);
	bad.type = Q4KH_TYPE_IQ2_XXS; /* a GGUF type cuda does not take */
	expect_status(r, b->mul_mat(dev, &bad, G(x), G(y)), Q4KH_ERR_INVALID,
	              "mul_mat w: type 16 (");
	bad = *G(x);
	bad.ne[1] = -1;
	expect_status(r, b->mul_mat(dev, G(w), &bad, G(y)), Q4KH_ERR_INVALID,
	              "mul_mat x: ne[1] = -1");
	view = *G(x);
	view.ne[0] = 8;
	view.nb[1] = 32;
	expect_status(r, b->mul_mat(dev, G(w), G(x), &view), Q4KH_ERR_INVALID,
	              "mul_mat y (offset 64) overlaps x (offset 64)");

	expect_status(r, b->get_rows(dev, G(w), ids, 2, 1.0f, G(y)),
	              Q4KH_ERR_INVALID, "get_rows out: shape");
	expect_status(r, b->get_rows(dev, G(w), ids, 2, 1.0f, G(x)),
	              Q4KH_ERR_INVALID, "get_rows: ids[1] = 9, expected 0 .. 7");
	expect_status(r, b->get_rows(dev, G(w), NULL, 2, 1.0f, G(x)),
	              Q4KH_ERR_INVALID, "get_rows: 2 ids at");
	expect_status(r, b->rms_norm(dev, G(x), NULL, -1.0f, G(x)),
	              Q4KH_ERR_INVALID, "rms_norm: eps = -1");
	expect_status(r, b->rms_norm(dev, G(x), G(y), 1e-6f, G(x)),
	              Q4KH_ERR_INVALID, "rms_norm w: shape");
	expect_status(r, b->rope(dev, G(q), pos, 7, Q4KH_ROPE_NEOX, 1e4f, 1.0f,
	                         G(q)),
	              Q4KH_ERR_INVALID, "rope: n_rot = 7");
	expect_status(r, b->rope(dev, G(q), pos, 8, (q4kh_rope_mode)1, 1e4f, 1.0f,
	                         G(q)),
	              Q4KH_ERR_INVALID, "rope: mode 1");
	expect_status(r, b->rope(dev, G(q), NULL, 8, Q4KH_ROPE_NEOX, 1e4f, 1.0f,
	                         G(q)),
	              Q4KH_ERR_INVALID, "rope: pos is NULL");
	expect_status(r, b->rope(dev, G(q), pos, 8, Q4KH_ROPE_NEOX, 0.0f, 1.0f,
	                         G(q)),
	              Q4KH_ERR_INVALID, "rope: base 0");
	expect_status(r, b->add(dev, G(x), G(y), G(x)), Q4KH_ERR_INVALID,
	              "add: b->ne[0] = 8");
	expect_status(r, b->mul(dev, G(x), G(t3), G(x)), Q4KH_ERR_INVALID,
	              "mul: b->ne[1] = 3");
	expect_status(r, b->scale(dev, G(x), 2.0f, G(t3)), Q4KH_ERR_INVALID,
	              "scale out: shape");
	expect_status(r, b->glu(dev, (q4kh_glu_kind)7, G(x), G(x), G(t3)),
	              Q4KH_ERR_INVALID, "glu: kind 7");
	expect_status(r, b->glu(dev, Q4KH_GLU_SILU, G(x), G(t3), G(x)),
	              Q4KH_ERR_INVALID, "glu up: shape");
	expect_status(r, b->copy(dev, G(x), G(t3)), Q4KH_ERR_INVALID,
	              "copy dst: shape");
	expect_status(r, b->copy(dev, G(w), G(x)), Q4KH_ERR_INVALID,
	              "copy src: type 8 (Q8_0), expected F32 or F16");

	/* q {8, 2, 3} over a 2-position cache: positions 0..2 do not fit. */
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), &ap, G(t3)),
	              Q4KH_ERR_INVALID, "attention out: shape");
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), &ap, G(q)),
	              Q4KH_ERR_INVALID, "attention out (offset 64) overlaps q");
	twin_free(r, &t3);
	t3 = twin_f32(r, 8, 2, 3, NULL);
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), &ap, G(t3)),
	              Q4KH_ERR_INVALID,
	              "attention: positions 0 .. 2, expected inside the "
	              "2-position cache");
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), NULL, G(t3)),
	              Q4KH_ERR_INVALID, "attention: params is NULL");
	ap.struct_size = 8;
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), &ap, G(t3)),
	              Q4KH_ERR_INVALID, "attention: params struct_size 8");
	ap.struct_size = sizeof(ap);
	ap.window = -1;
	twin_free(r, &cache);
	cache = twin_f32(r, 8, 1, 8, NULL);
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), &ap, G(t3)),
	              Q4KH_ERR_INVALID, "attention: window -1");
	ap.window = 0;
	ap.softcap = -1.0f;
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), &ap, G(t3)),
	              Q4KH_ERR_INVALID, "softcap -1");
	ap.softcap = 0.0f;
	twin_free(r, &cache);
	cache = twin_f32(r, 8, 3, 8, NULL);
	expect_status(r, b->attention(dev, G(q), G(cache), G(cache), &ap, G(t3)),
	              Q4KH_ERR_INVALID,
	              "attention: 2 query heads is not a multiple of 3 KV heads");
	/* Larger heads than the kernel's shared memory holds. */
	big_q = twin_f32(r, MAX_HEAD_DIM + 2, 1, 1, NULL);
	big_cache = twin_f32(r, MAX_HEAD_DIM + 2, 1, 1, NULL);
	expect_status(r, b->attention(dev, G(big_q), G(big_cache), G(big_cache),
	                              &ap, G(big_q)),
	              Q4KH_ERR_INVALID, "overlaps");
	twin_free(r, &y);
	y = twin_f32(r, MAX_HEAD_DIM + 2, 1, 1, NULL);
	expect_status(r, b->attention(dev, G(big_q), G(big_cache), G(big_cache),
	                              &ap, G(y)),
	              Q4KH_ERR_UNSUPPORTED, "attention: head dimension 4098");
#undef G
	/* Nothing refused above reached the device: the stream is clean. */
	cr_assert_eq(b->synchronize(dev), Q4KH_OK, "%s", ERR(r, GPU));
	twin_free(r, &w);
	twin_free(r, &x);
	twin_free(r, &y);
	twin_free(r, &f16x);
	twin_free(r, &t3);
	twin_free(r, &q);
	twin_free(r, &cache);
	twin_free(r, &big_q);
	twin_free(r, &big_cache);
	rig_close(r);
}

/* --- the conformance suite vendors run (q4khost conformance) --------------- */

static void log_failure(void *data, const struct q4kh_conf_result *res)
{
	int *skipped = data;

	if (res->skipped)
		(*skipped)++;
	else if (!res->ok)
		cr_log_error("conformance %s %s: %s", res->op, res->what, res->message);
}

/*
 * Every case of q4khost conformance (host/lib/conformance.c: odd shapes,
 * strided views, poisoned outputs, guard bytes, NaN inputs) on the cuda
 * backend against the reference, as a vendor's backend is judged; none
 * may fail (cases of ops or types it does not offer are skipped: the
 * linear-attention ops, today).
 */
Test(cuda_ops, conformance_passes_every_case)
{
	struct rig *r = rig_open();
	struct q4kh_error err = { { 0 } };
	int skipped = 0;
	const int failed = q4kh_conformance_run(&r->be[REF], &r->be[GPU], 1234, log_failure,
	                                        &skipped, &err);

	cr_assert_geq(failed, 0, "conformance could not run: %s", err.msg);
	cr_expect_eq(failed, 0, "%d conformance cases failed on cuda (logged above)", failed);
	cr_log_info("conformance on cuda: %d cases skipped (ops or types it does not offer)",
	            skipped);
	rig_close(r);
}
