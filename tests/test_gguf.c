/*
 * GGUF reader: a file built here byte by byte reads back exactly; every
 * corruption of it fails with the one-line message naming the offset of the
 * bad field; counts and names past the limits of gguf.h are refused; a
 * sparse file over 4 GiB reads back its last tensor; the real default model
 * reads back the facts gguf-py reports.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <q4khost/quant.h>

#include "gguf.h"
#include "gguf_shared.h"
#include "helpers.h"
#include "model.h"

/* --- a small GGUF writer, independent of the reader ------------------- */

struct gbuf {
	uint8_t *p;
	size_t n, cap;
};

static void put(struct gbuf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		cr_assert_not_null(b->p);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void put_le(struct gbuf *b, uint64_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		uint8_t byte = (uint8_t)(v >> (8 * i));
		put(b, &byte, 1);
	}
}

static void put_str(struct gbuf *b, const char *s)
{
	put_le(b, strlen(s), 8);
	put(b, s, strlen(s));
}

static void put_f32(struct gbuf *b, float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	put_le(b, u, 4);
}

static void pad_to(struct gbuf *b, size_t align)
{
	while (b->n % align)
		put_le(b, 0, 1);
}

enum { NT = 3, MAX_KV = 24 };

/* The fixture file and where each field landed in it. */
struct fixture {
	struct gbuf b;
	uint64_t alignment;
	int nkv;
	const char *kv_name[MAX_KV];
	size_t kv_at[MAX_KV], kv_type_at[MAX_KV], kv_value_at[MAX_KV],
		kv_data_at[MAX_KV];
	size_t align_value_at, nested_inner_type_at;
	size_t t_at[NT], t_ndims_at[NT], t_ne_at[NT], t_type_at[NT], t_off_at[NT];
	uint64_t t_rel[NT], t_size[NT];
	size_t infos_end, data_at, end;
};

static const char *const t_name[NT] = { "norm", "w8", "w4" };
static const uint32_t t_type[NT] = { Q4KH_TYPE_F32, Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q4_K };
static const uint32_t t_ndims[NT] = { 1, 2, 2 };
static const int64_t t_ne[NT][4] = { { 8, 1, 1, 1 }, { 64, 3, 1, 1 }, { 256, 2, 1, 1 } };
/* Bytes by hand: 8 floats; 2 Q8_0 blocks of 34 per row x 3; 1 Q4_K block of 144 x 2 */
static const uint64_t t_bytes[NT] = { 32, 204, 288 };

static const char *const strs[3] = { "a", "", "h\xc3\xa9llo" };
static const float f32s[3] = { 1.0f, -2.5f, 3e38f };

static int kv_begin(struct fixture *f, const char *key, uint32_t type)
{
	int k = f->nkv++;

	cr_assert_lt(k, MAX_KV);
	f->kv_name[k] = key;
	f->kv_at[k] = f->b.n;
	put_str(&f->b, key);
	f->kv_type_at[k] = f->b.n;
	put_le(&f->b, type, 4);
	f->kv_value_at[k] = f->kv_data_at[k] = f->b.n;
	return k;
}

static void kv_scalar(struct fixture *f, const char *key, uint32_t type,
                      uint64_t bits, unsigned n)
{
	kv_begin(f, key, type);
	put_le(&f->b, bits, n);
}

static void kv_array_head(struct fixture *f, const char *key, uint32_t elem,
                          uint64_t count)
{
	int k = kv_begin(f, key, Q4KH_GGUF_ARRAY);

	put_le(&f->b, elem, 4);
	put_le(&f->b, count, 8);
	f->kv_data_at[k] = f->b.n;
}

static void write_kvs(struct fixture *f)
{
	double f64 = 0.1, big = 1e300;
	uint64_t u;

	kv_begin(f, "general.architecture", Q4KH_GGUF_STRING);
	put_str(&f->b, "test");
	if (f->alignment != 32) {
		kv_begin(f, "general.alignment", Q4KH_GGUF_UINT32);
		f->align_value_at = f->b.n;
		put_le(&f->b, f->alignment, 4);
	}
	kv_scalar(f, "t.u8", Q4KH_GGUF_UINT8, 200, 1);
	kv_scalar(f, "t.i8", Q4KH_GGUF_INT8, (uint8_t)-100, 1);
	kv_scalar(f, "t.u16", Q4KH_GGUF_UINT16, 60000, 2);
	kv_scalar(f, "t.i16", Q4KH_GGUF_INT16, 1234, 2);
	kv_scalar(f, "t.u32", Q4KH_GGUF_UINT32, 4000000000u, 4);
	kv_scalar(f, "t.i32", Q4KH_GGUF_INT32, (uint32_t)-2000000000, 4);
	kv_begin(f, "t.f32", Q4KH_GGUF_FLOAT32);
	put_f32(&f->b, 1.5f);
	kv_scalar(f, "t.bool", Q4KH_GGUF_BOOL, 1, 1);
	kv_scalar(f, "t.u64", Q4KH_GGUF_UINT64, (1ull << 40) + 5, 8);
	kv_scalar(f, "t.i64", Q4KH_GGUF_INT64, (uint64_t)-(1ll << 40), 8);
	memcpy(&u, &f64, 8);
	kv_scalar(f, "t.f64", Q4KH_GGUF_FLOAT64, u, 8);
	memcpy(&u, &big, 8);
	kv_scalar(f, "t.f64big", Q4KH_GGUF_FLOAT64, u, 8);
	kv_array_head(f, "t.strs", Q4KH_GGUF_STRING, 3);
	for (int i = 0; i < 3; i++)
		put_str(&f->b, strs[i]);
	kv_array_head(f, "t.f32s", Q4KH_GGUF_FLOAT32, 3);
	for (int i = 0; i < 3; i++)
		put_f32(&f->b, f32s[i]);
	kv_array_head(f, "t.i32s", Q4KH_GGUF_INT32, 3);
	put_le(&f->b, (uint32_t)-1, 4);
	put_le(&f->b, 0, 4);
	put_le(&f->b, 7, 4);
	kv_array_head(f, "t.u8s", Q4KH_GGUF_UINT8, 3);
	put_le(&f->b, 0x11ff00, 3); /* 0, 255, 17 */
	kv_array_head(f, "t.u32s", Q4KH_GGUF_UINT32, 2);
	put_le(&f->b, 1, 4);
	put_le(&f->b, 0xffffffffu, 4);
	kv_array_head(f, "t.nested", Q4KH_GGUF_ARRAY, 2); /* [[1, 2], [3]] */
	f->nested_inner_type_at = f->b.n;
	put_le(&f->b, Q4KH_GGUF_UINT16, 4);
	put_le(&f->b, 2, 8);
	put_le(&f->b, 0x00020001, 4);
	put_le(&f->b, Q4KH_GGUF_UINT16, 4);
	put_le(&f->b, 1, 8);
	put_le(&f->b, 3, 2);
	kv_array_head(f, "t.empty", Q4KH_GGUF_INT32, 0);
}

static void write_tensor_infos(struct fixture *f)
{
	uint64_t rel = 0;

	for (int i = 0; i < NT; i++) {
		f->t_at[i] = f->b.n;
		put_str(&f->b, t_name[i]);
		f->t_ndims_at[i] = f->b.n;
		put_le(&f->b, t_ndims[i], 4);
		f->t_ne_at[i] = f->b.n;
		for (uint32_t d = 0; d < t_ndims[i]; d++)
			put_le(&f->b, (uint64_t)t_ne[i][d], 8);
		f->t_type_at[i] = f->b.n;
		put_le(&f->b, t_type[i], 4);
		f->t_off_at[i] = f->b.n;
		rel = (rel + f->alignment - 1) / f->alignment * f->alignment;
		f->t_rel[i] = rel;
		f->t_size[i] = t_bytes[i];
		put_le(&f->b, rel, 8);
		rel += t_bytes[i];
	}
	f->infos_end = f->b.n;
}

/* Byte J of tensor I's data (the F32 tensor holds 0.5 * j instead). */
static uint8_t data_byte(int i, uint64_t j)
{
	return (uint8_t)(i * 31 + j * 7 + 1);
}

static void write_data(struct fixture *f)
{
	pad_to(&f->b, f->alignment);
	f->data_at = f->b.n;
	for (int i = 0; i < NT; i++) {
		while (f->b.n < f->data_at + f->t_rel[i])
			put_le(&f->b, 0, 1);
		for (uint64_t j = 0; j < t_bytes[i]; j++) {
			if (t_type[i] == Q4KH_TYPE_F32 && j % 4 == 0)
				put_f32(&f->b, 0.5f * (float)(j / 4));
			else if (t_type[i] != Q4KH_TYPE_F32)
				put_le(&f->b, data_byte(i, j), 1);
		}
	}
	f->end = f->b.n;
}

/* The fixture; ALIGNMENT 32 writes no general.alignment key (the default). */
static void build(struct fixture *f, uint64_t alignment)
{
	size_t counts;

	memset(f, 0, sizeof(*f));
	f->alignment = alignment;
	put(&f->b, "GGUF", 4);
	put_le(&f->b, 3, 4);
	counts = f->b.n;
	put_le(&f->b, NT, 8);
	put_le(&f->b, 0, 8); /* kv count, patched below */
	write_kvs(f);
	for (int i = 0; i < 8; i++)
		f->b.p[counts + 8 + i] = (uint8_t)((uint64_t)f->nkv >> (8 * i));
	write_tensor_infos(f);
	write_data(f);
}

static void patch(struct fixture *f, size_t at, uint64_t v, unsigned n)
{
	cr_assert_leq(at + n, f->b.n);
	for (unsigned i = 0; i < n; i++)
		f->b.p[at + i] = (uint8_t)(v >> (8 * i));
}

static int kv_index(const struct fixture *f, const char *key)
{
	for (int k = 0; k < f->nkv; k++)
		if (!strcmp(f->kv_name[k], key))
			return k;
	cr_assert_fail("fixture has no key %s", key);
	return -1;
}

/* --- running the reader on bytes ---------------------------------------- */

static const char *dir;
static char path[4096];

static void setup(void)
{
	dir = test_tmpdir();
	snprintf(path, sizeof(path), "%s/t.gguf", dir);
}

static void teardown(void)
{
	unlink(path);
	rmdir(dir);
}

TestSuite(gguf, .init = setup, .fini = teardown);

static struct q4kh_gguf *open_ok(const void *data, size_t n)
{
	struct q4kh_gguf *g = NULL;
	struct q4kh_error err = { { 0 } };

	test_write_file(path, data, n);
	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "open failed: %s", err.msg);
	cr_assert_not_null(g);
	return g;
}

/* Opening the file at path fails with "PATH: " followed by TAIL. */
static void path_fails(const char *tail)
{
	struct q4kh_gguf *g = (struct q4kh_gguf *)1;
	struct q4kh_error err = { { 0 } };
	char want[sizeof(path) + 1024 + 2];

	snprintf(want, sizeof(want), "%s: %s", path, tail);
	cr_assert_eq(q4kh_gguf_open(path, &g, &err), -1, "opened %s", path);
	cr_assert_null(g);
	cr_assert_str_eq(err.msg, want);
}

/* Opening N bytes of DATA fails with "PATH: " followed by the message. */
static void open_fails(const void *data, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void open_fails(const void *data, size_t n, const char *fmt, ...)
{
	char tail[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tail, sizeof(tail), fmt, ap);
	va_end(ap);
	test_write_file(path, data, n);
	path_fails(tail);
}

/* --- a valid file reads back exactly ------------------------------------ */

static void check_tensors(const struct fixture *f, const struct q4kh_gguf *g)
{
	cr_assert_eq(g->n_tensors, NT);
	cr_assert_eq(g->data_offset, f->data_at);
	for (int i = 0; i < NT; i++) {
		const struct q4kh_gguf_tensor *t = q4kh_gguf_tensor(g, t_name[i]);
		const uint8_t *d;

		cr_assert_not_null(t, "%s", t_name[i]);
		cr_assert_eq(t, &g->tensors[i]);
		cr_assert_eq(t->n_dims, t_ndims[i]);
		cr_assert_eq(t->type, t_type[i]);
		for (int k = 0; k < 4; k++)
			cr_assert_eq(t->ne[k], t_ne[i][k], "%s ne[%d]", t_name[i], k);
		cr_assert_eq(t->offset, f->data_at + f->t_rel[i]);
		cr_assert_eq(t->offset % f->alignment, 0);
		cr_assert_eq(t->size, t_bytes[i]);
		cr_assert_eq(t->data, g->map + t->offset);
		d = t->data;
		for (uint64_t j = 0; j < t->size; j++) {
			if (t->type == Q4KH_TYPE_F32)
				break;
			cr_assert_eq(d[j], data_byte(i, j), "%s byte %" PRIu64, t_name[i], j);
		}
	}
	for (int j = 0; j < 8; j++) {
		float v;
		memcpy(&v, (const uint8_t *)g->tensors[0].data + 4 * j, 4);
		cr_assert_eq(v, 0.5f * (float)j);
	}
	cr_assert_null(q4kh_gguf_tensor(g, "w"));
	cr_assert_null(q4kh_gguf_tensor(g, "w88"));
}

static void check_scalars(const struct q4kh_gguf *g)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf_str s;
	uint32_t u = 77;
	float x;
	int b;

	cr_assert_eq(q4kh_gguf_get_str(g, "general.architecture", &s, &err), 0);
	cr_assert_eq(s.len, 4);
	cr_assert_eq(memcmp(s.data, "test", 4), 0);
	cr_assert_eq(q4kh_gguf_get_u32(g, "t.u8", &u, &err), 0);
	cr_assert_eq(u, 200);
	cr_assert_eq(q4kh_gguf_get_u32(g, "t.u16", &u, &err), 0);
	cr_assert_eq(u, 60000);
	cr_assert_eq(q4kh_gguf_get_u32(g, "t.u32", &u, &err), 0);
	cr_assert_eq(u, 4000000000u);
	cr_assert_eq(q4kh_gguf_get_u32(g, "t.i16", &u, &err), 0);
	cr_assert_eq(u, 1234);
	u = 77;
	cr_assert_eq(q4kh_gguf_get_u32(g, "no.such.key", &u, &err), 1);
	cr_assert_eq(u, 77);
	cr_assert_eq(q4kh_gguf_get_f32(g, "t.f32", &x, &err), 0);
	cr_assert_eq(x, 1.5f);
	cr_assert_eq(q4kh_gguf_get_f32(g, "t.f64", &x, &err), 0);
	cr_assert_eq(x, (float)0.1);
	cr_assert_eq(q4kh_gguf_get_bool(g, "t.bool", &b, &err), 0);
	cr_assert_eq(b, 1);
	cr_assert_eq(q4kh_gguf_get_bool(g, "no.such.key", &b, &err), 1);
}

static void check_scalar_at(const struct fixture *f, const struct q4kh_gguf *g)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, "t.i64");
	struct q4kh_gguf_scalar s;

	cr_assert_eq(kv->type, Q4KH_GGUF_INT64);
	cr_assert_eq(kv->count, 1);
	cr_assert_eq(kv->offset, f->kv_data_at[kv_index(f, "t.i64")]);
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 0, &s), 0);
	cr_assert_eq(s.type, Q4KH_GGUF_INT64);
	cr_assert_eq(s.v.i, -(1ll << 40));
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 1, &s), -1);
	kv = q4kh_gguf_find(g, "t.u64");
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 0, &s), 0);
	cr_assert_eq(s.v.u, (1ull << 40) + 5);
	kv = q4kh_gguf_find(g, "t.i8");
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 0, &s), 0);
	cr_assert_eq(s.v.i, -100);
	kv = q4kh_gguf_find(g, "t.f64");
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 0, &s), 0);
	cr_assert_eq(s.v.f, 0.1);
	kv = q4kh_gguf_find(g, "t.u8s");
	cr_assert_eq(kv->elem_type, Q4KH_GGUF_UINT8);
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 1, &s), 0);
	cr_assert_eq(s.v.u, 255);
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 3, &s), -1);
	kv = q4kh_gguf_find(g, "t.nested");
	cr_assert_eq(kv->elem_type, Q4KH_GGUF_ARRAY);
	cr_assert_eq(kv->count, 2);
	cr_assert_eq(q4kh_gguf_scalar_at(kv, 0, &s), -1);
	cr_assert_eq(q4kh_gguf_scalar_at(q4kh_gguf_find(g, "t.strs"), 0, &s), -1);
}

static void check_arrays(const struct fixture *f, const struct q4kh_gguf *g)
{
	struct q4kh_error err = { { 0 } };
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, "t.strs");
	struct q4kh_gguf_str s[3];
	float x[3];
	int32_t v[3];

	cr_assert_eq(kv->type, Q4KH_GGUF_ARRAY);
	cr_assert_eq(kv->elem_type, Q4KH_GGUF_STRING);
	cr_assert_eq(kv->count, 3);
	cr_assert_eq(kv->offset, f->kv_data_at[kv_index(f, "t.strs")]);
	cr_assert_eq(kv->data, g->map + kv->offset);
	cr_assert_eq(q4kh_gguf_array_strings(g, kv, s, &err), 0);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(s[i].len, strlen(strs[i]));
		cr_assert_eq(memcmp(s[i].data, strs[i], s[i].len), 0);
	}
	cr_assert_eq(q4kh_gguf_array_f32(g, q4kh_gguf_find(g, "t.f32s"), x, &err), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(x[i], f32s[i]);
	cr_assert_eq(q4kh_gguf_array_f32(g, q4kh_gguf_find(g, "t.i32s"), x, &err), 0);
	cr_assert(x[0] == -1.0f && x[1] == 0.0f && x[2] == 7.0f);
	cr_assert_eq(q4kh_gguf_array_i32(g, q4kh_gguf_find(g, "t.i32s"), v, &err), 0);
	cr_assert(v[0] == -1 && v[1] == 0 && v[2] == 7);
	cr_assert_eq(q4kh_gguf_array_i32(g, q4kh_gguf_find(g, "t.u8s"), v, &err), 0);
	cr_assert(v[0] == 0 && v[1] == 255 && v[2] == 17);
	kv = q4kh_gguf_find(g, "t.empty");
	cr_assert_eq(kv->count, 0);
	cr_assert_eq(q4kh_gguf_array_i32(g, kv, v, &err), 0);
}

Test(gguf, valid_file_reads_back)
{
	struct fixture f;
	struct q4kh_gguf *g;

	build(&f, 64);
	g = open_ok(f.b.p, f.b.n);
	cr_assert_str_eq(g->path, path);
	cr_assert_eq(g->size, f.end);
	cr_assert_eq(g->version, 3);
	cr_assert_eq(g->alignment, 64);
	cr_assert_eq(g->n_kv, (uint64_t)f.nkv);
	for (int k = 0; k < f.nkv; k++) {
		const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, f.kv_name[k]);
		cr_assert_eq(kv, &g->kv[k], "%s", f.kv_name[k]);
		cr_assert_eq(kv->offset, f.kv_data_at[k], "%s", f.kv_name[k]);
	}
	cr_assert_null(q4kh_gguf_find(g, "t.u"));
	check_tensors(&f, g);
	check_scalars(g);
	check_scalar_at(&f, g);
	check_arrays(&f, g);
	q4kh_gguf_close(g);
	free(f.b.p);
}

Test(gguf, default_alignment_and_version_2)
{
	struct fixture f;
	struct q4kh_gguf *g;

	build(&f, 32);
	patch(&f, 4, 2, 4);
	g = open_ok(f.b.p, f.b.n);
	cr_assert_eq(g->version, 2);
	cr_assert_eq(g->alignment, 32);
	cr_assert_null(q4kh_gguf_find(g, "general.alignment"));
	check_tensors(&f, g);
	q4kh_gguf_close(g);
	free(f.b.p);
}

Test(gguf, no_tensors_no_keys)
{
	struct gbuf b = { 0 };
	struct q4kh_gguf *g;

	put(&b, "GGUF", 4);
	put_le(&b, 3, 4);
	put_le(&b, 0, 8);
	put_le(&b, 0, 8);
	g = open_ok(b.p, b.n);
	cr_assert_eq(g->n_kv, 0);
	cr_assert_eq(g->n_tensors, 0);
	cr_assert_null(q4kh_gguf_find(g, "general.architecture"));
	q4kh_gguf_close(g);
	free(b.p);
}

/* --- typed getters refuse what does not fit --------------------------- */

Test(gguf, getters_refuse_wrong_types)
{
	struct fixture f;
	struct q4kh_gguf *g;
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf_str s;
	char want[sizeof(path) + 512];
	uint32_t u = 9;
	float x;
	int32_t v[3];
	int b;

	build(&f, 64);
	g = open_ok(f.b.p, f.b.n);
#define REFUSED(call, key, what)                                               \
	do {                                                                   \
		cr_assert_eq(call, -1, "%s", key);                             \
		snprintf(want, sizeof(want), "%s: offset %zu: key '%s': %s", path, \
		         f.kv_data_at[kv_index(&f, key)], key, what);          \
		cr_assert_str_eq(err.msg, want);                               \
	} while (0)
	REFUSED(q4kh_gguf_get_u32(g, "t.i8", &u, &err), "t.i8",
	        "expected an integer that fits uint32, found int8 -100");
	REFUSED(q4kh_gguf_get_u32(g, "t.u64", &u, &err), "t.u64",
	        "expected an integer that fits uint32, found uint64 1099511627781");
	REFUSED(q4kh_gguf_get_u32(g, "t.i32", &u, &err), "t.i32",
	        "expected an integer that fits uint32, found int32 -2000000000");
	REFUSED(q4kh_gguf_get_u32(g, "t.bool", &u, &err), "t.bool",
	        "expected an integer that fits uint32, found bool 1");
	REFUSED(q4kh_gguf_get_u32(g, "general.architecture", &u, &err),
	        "general.architecture",
	        "expected an integer that fits uint32, found string");
	REFUSED(q4kh_gguf_get_u32(g, "t.strs", &u, &err), "t.strs",
	        "expected an integer that fits uint32, found array of string");
	cr_assert_eq(u, 9);
	REFUSED(q4kh_gguf_get_f32(g, "t.u32", &x, &err), "t.u32",
	        "expected a float32 or float64 in float32 range, found uint32 4000000000");
	REFUSED(q4kh_gguf_get_f32(g, "t.f64big", &x, &err), "t.f64big",
	        "expected a float32 or float64 in float32 range, found float64 1e+300");
	REFUSED(q4kh_gguf_get_bool(g, "t.u8", &b, &err), "t.u8",
	        "expected a bool (0 or 1), found uint8 200");
	REFUSED(q4kh_gguf_get_str(g, "t.f32", &s, &err), "t.f32",
	        "expected a string, found float32 1.5");
	REFUSED(q4kh_gguf_array_strings(g, q4kh_gguf_find(g, "t.i32s"), &s, &err),
	        "t.i32s", "expected an array of strings, found array of int32");
	REFUSED(q4kh_gguf_array_f32(g, q4kh_gguf_find(g, "t.strs"), &x, &err),
	        "t.strs", "expected an array of numbers, found array of string");
	REFUSED(q4kh_gguf_array_f32(g, q4kh_gguf_find(g, "t.u8"), &x, &err),
	        "t.u8", "expected an array of numbers, found uint8 200");
	REFUSED(q4kh_gguf_array_i32(g, q4kh_gguf_find(g, "t.f32s"), v, &err),
	        "t.f32s", "expected an array of integers, found array of float32");
	REFUSED(q4kh_gguf_array_i32(g, q4kh_gguf_find(g, "t.u32s"), v, &err),
	        "t.u32s", "expected integers that fit int32, found element 1 = uint32 4294967295");
#undef REFUSED
	q4kh_gguf_close(g);
	free(f.b.p);
}

Test(gguf, bool_byte_other_than_0_or_1)
{
	struct fixture f;
	struct q4kh_gguf *g;
	struct q4kh_error err = { { 0 } };
	size_t at;
	int b;

	build(&f, 64);
	at = f.kv_data_at[kv_index(&f, "t.bool")];
	patch(&f, at, 7, 1);
	g = open_ok(f.b.p, f.b.n);
	cr_assert_eq(q4kh_gguf_get_bool(g, "t.bool", &b, &err), -1);
	cr_assert(strstr(err.msg, "key 't.bool': expected a bool (0 or 1), found bool 7"),
	          "%s", err.msg);
	q4kh_gguf_close(g);
	free(f.b.p);
}

Test(gguf, vtype_names)
{
	static const char *const names[] = {
		"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
		"bool", "string", "array", "uint64", "int64", "float64",
	};

	for (uint32_t t = 0; t < 13; t++)
		cr_assert_str_eq(q4kh_gguf_vtype_name(t), names[t]);
	cr_assert_str_eq(q4kh_gguf_vtype_name(13), "unknown");
}

/*
 * Every tensor type GGUF defines has its name and block geometry in
 * quant.h: the ids, names and (values, bytes) per block of gguf-py's
 * GGMLQuantizationType and GGML_QUANT_SIZES (llama.cpp's
 * gguf-py/gguf/constants.py, 2026), copied here as the reference. Ids
 * that were removed from GGUF files (4, 5, 31 to 33, 36 to 38) stay
 * unknown, as past the last.
 */
Test(gguf, every_gguf_type_id_is_known)
{
	static const struct {
		uint32_t id;
		const char *name;
		uint32_t elems, bytes;
	} gguf_py[] = {
		{ 0, "F32", 1, 4 },          { 1, "F16", 1, 2 },
		{ 2, "Q4_0", 32, 2 + 16 },   { 3, "Q4_1", 32, 2 + 2 + 16 },
		{ 6, "Q5_0", 32, 2 + 4 + 16 }, { 7, "Q5_1", 32, 2 + 2 + 4 + 16 },
		{ 8, "Q8_0", 32, 2 + 32 },   { 9, "Q8_1", 32, 4 + 32 },
		{ 10, "Q2_K", 256, 2 + 2 + 64 + 16 },
		{ 11, "Q3_K", 256, 2 + 64 + 32 + 12 },
		{ 12, "Q4_K", 256, 2 + 2 + 128 + 12 },
		{ 13, "Q5_K", 256, 2 + 2 + 128 + 32 + 12 },
		{ 14, "Q6_K", 256, 2 + 128 + 64 + 16 },
		{ 15, "Q8_K", 256, 4 + 256 + 32 },
		{ 16, "IQ2_XXS", 256, 2 + 64 },
		{ 17, "IQ2_XS", 256, 2 + 64 + 8 },
		{ 18, "IQ3_XXS", 256, 2 + 64 + 32 },
		{ 19, "IQ1_S", 256, 2 + 32 + 16 },
		{ 20, "IQ4_NL", 32, 2 + 16 },
		{ 21, "IQ3_S", 256, 2 + 64 + 32 + 8 + 4 },
		{ 22, "IQ2_S", 256, 2 + 64 + 16 },
		{ 23, "IQ4_XS", 256, 2 + 2 + 128 + 4 },
		{ 24, "I8", 1, 1 },          { 25, "I16", 1, 2 },
		{ 26, "I32", 1, 4 },         { 27, "I64", 1, 8 },
		{ 28, "F64", 1, 8 },         { 29, "IQ1_M", 256, 32 + 16 + 8 },
		{ 30, "BF16", 1, 2 },        { 34, "TQ1_0", 256, 2 + 4 * 13 },
		{ 35, "TQ2_0", 256, 2 + 64 }, { 39, "MXFP4", 32, 1 + 16 },
		{ 40, "NVFP4", 64, 4 + 32 }, { 41, "Q1_0", 128, 2 + 16 },
		{ 42, "Q2_0", 64, 2 + 16 },
	};
	static const uint32_t removed[] = { 4, 5, 31, 32, 33, 36, 37, 38, 43 };

	for (size_t i = 0; i < sizeof(gguf_py) / sizeof(gguf_py[0]); i++) {
		const char *name = q4kh_type_name(gguf_py[i].id);

		cr_expect(name && !strcmp(name, gguf_py[i].name), "type %u: %s, expected %s",
		          gguf_py[i].id, name ? name : "(unknown)", gguf_py[i].name);
		cr_expect_eq(q4kh_type_block_elems(gguf_py[i].id), gguf_py[i].elems, "%s",
		             gguf_py[i].name);
		cr_expect_eq(q4kh_type_block_bytes(gguf_py[i].id), gguf_py[i].bytes, "%s",
		             gguf_py[i].name);
	}
	cr_expect_eq(Q4KH_TYPE_COUNT, 43);
	for (size_t i = 0; i < sizeof(removed) / sizeof(removed[0]); i++)
		cr_expect_null(q4kh_type_name(removed[i]), "%u", removed[i]);
}

/* --- truncation ----------------------------------------------------------- */

/* Opening a file cut at every byte fails with an offset inside the file. */
Test(gguf, every_truncation_fails_cleanly)
{
	struct fixture f;
	struct q4kh_error err;
	struct q4kh_gguf *g;
	char prefix[4200];

	build(&f, 64);
	snprintf(prefix, sizeof(prefix), "%s: offset ", path);
	for (size_t n = 0; n < f.end; n++) {
		unsigned long long off;

		test_write_file(path, f.b.p, n);
		cr_assert_eq(q4kh_gguf_open(path, &g, &err), -1, "cut at %zu", n);
		cr_assert_null(g);
		cr_assert_eq(strncmp(err.msg, prefix, strlen(prefix)), 0, "%s", err.msg);
		off = strtoull(err.msg + strlen(prefix), NULL, 10);
		cr_assert_leq(off, n, "cut at %zu: %s", n, err.msg);
		cr_assert_null(strchr(err.msg, '\n'));
	}
	free(f.b.p);
}

/* "found the end of the file" / "found only N bytes before ..." */
static const char *short_by(char *buf, size_t cap, size_t left)
{
	if (left == 0)
		snprintf(buf, cap, "the end of the file");
	else
		snprintf(buf, cap, "only %zu byte%s before the end of the file", left,
		         left == 1 ? "" : "s");
	return buf;
}

Test(gguf, truncated_header)
{
	struct fixture f;
	char by[128];

	build(&f, 64);
	open_fails(f.b.p, 0, "offset 0: expected the magic \"GGUF\" (4 bytes), "
	           "found the end of the file");
	for (size_t n = 1; n < 4; n++)
		open_fails(f.b.p, n, "offset 0: expected the magic \"GGUF\" (4 bytes), "
		           "found only %zu byte%s before the end of the file",
		           n, n == 1 ? "" : "s");
	open_fails(f.b.p, 4, "offset 4: expected the GGUF version (4 bytes), "
	           "found the end of the file");
	for (size_t n = 5; n < 8; n++)
		open_fails(f.b.p, n, "offset 4: expected the GGUF version (4 bytes), "
		           "found only %zu byte%s before the end of the file",
		           n - 4, n == 5 ? "" : "s");
	for (size_t n = 8; n < 16; n++)
		open_fails(f.b.p, n, "offset 8: expected the tensor count (8 bytes), "
		           "found %s", short_by(by, sizeof(by), n - 8));
	for (size_t n = 16; n < 24; n++)
		open_fails(f.b.p, n, "offset 16: expected the metadata key count (8 bytes), "
		           "found %s", short_by(by, sizeof(by), n - 16));
	free(f.b.p);
}

/* Cut N: when the header's counts cannot fit, that is the first error. */
static int counts_fail(const struct fixture *f, size_t n)
{
	size_t rest = n - 24;

	if (NT > rest / 32) {
		open_fails(f->b.p, n, "offset 8: expected at most %zu tensor infos (32 "
		           "bytes each at least) in the remaining %zu bytes, found "
		           "tensor count %d", rest / 32, rest, NT);
		return 1;
	}
	if ((size_t)f->nkv > rest / 13) {
		open_fails(f->b.p, n, "offset 16: expected at most %zu metadata keys (13 "
		           "bytes each at least) in the remaining %zu bytes, found key "
		           "count %d", rest / 13, rest, f->nkv);
		return 1;
	}
	return 0;
}

Test(gguf, truncated_at_key_boundaries)
{
	struct fixture f;
	char by[128];

	build(&f, 64);
	for (int k = 0; k < f.nkv; k++) {
		const char *key = f.kv_name[k];
		size_t n = f.kv_at[k];

		if (!counts_fail(&f, n))
			open_fails(f.b.p, n, "offset %zu: expected the name of key #%d "
			           "(8 bytes), found the end of the file", n, k);
		n = f.kv_type_at[k];
		if (!counts_fail(&f, n))
			open_fails(f.b.p, n, "offset %zu: expected the value type of key "
			           "'%s' (4 bytes), found the end of the file", n, key);
		n = f.kv_type_at[k] + 2;
		if (!counts_fail(&f, n))
			open_fails(f.b.p, n, "offset %zu: expected the value type of key "
			           "'%s' (4 bytes), found %s", n - 2, key,
			           short_by(by, sizeof(by), 2));
	}
	free(f.b.p);
}

/*
 * Cut inside key K's value: the header then claims keys 0..K and no
 * tensors, so the count check passes and the value's own field is named.
 */
static size_t cut_in(struct fixture *f, const char *key, size_t from_value)
{
	int k = kv_index(f, key);

	patch(f, 8, 0, 8);
	patch(f, 16, (uint64_t)k + 1, 8);
	return f->kv_value_at[k] + from_value;
}

static size_t cut_in_data(struct fixture *f, const char *key, size_t from_data)
{
	int k = kv_index(f, key);

	return cut_in(f, key, 0) - f->kv_value_at[k] + f->kv_data_at[k] + from_data;
}

Test(gguf, truncated_inside_values)
{
	struct fixture f;
	size_t n;

	build(&f, 64);
	n = cut_in(&f, "t.u64", 3);
	open_fails(f.b.p, n, "offset %zu: expected the value of key 't.u64' (8 "
	           "bytes), found only 3 bytes before the end of the file", n - 3);
	n = cut_in(&f, "t.u8", 0);
	open_fails(f.b.p, n, "offset %zu: expected the value of key 't.u8' (1 "
	           "byte), found the end of the file", n);
	n = cut_in(&f, "general.architecture", 8 + 2);
	open_fails(f.b.p, n, "offset %zu: expected the string value of key "
	           "'general.architecture' of at most 2 bytes (the rest of the "
	           "file), found length 4", n - 10);
	n = cut_in(&f, "t.strs", 0);
	open_fails(f.b.p, n, "offset %zu: expected an array element type of key "
	           "'t.strs' (4 bytes), found the end of the file", n);
	n = cut_in(&f, "t.strs", 4);
	open_fails(f.b.p, n, "offset %zu: expected an array length of key "
	           "'t.strs' (8 bytes), found the end of the file", n);
	/* 3 strings need 24 bytes at least */
	n = cut_in_data(&f, "t.strs", 23);
	open_fails(f.b.p, n, "offset %zu: expected at most 2 string elements (8 "
	           "bytes each at least) in the remaining 23 bytes for the array "
	           "of key 't.strs', found array length 3", n - 23 - 8);
	n = cut_in_data(&f, "t.strs", 9 + 8 + 8 + 2);
	open_fails(f.b.p, n, "offset %zu: expected a string element of key 't.strs' "
	           "of at most 2 bytes (the rest of the file), found length 6", n - 10);
	n = cut_in_data(&f, "t.f32s", 11);
	open_fails(f.b.p, n, "offset %zu: expected at most 2 float32 elements (4 "
	           "bytes each at least) in the remaining 11 bytes for the array "
	           "of key 't.f32s', found array length 3", n - 11 - 8);
	/* [[1, 2], [3]]: the second inner array's one element is cut */
	n = cut_in_data(&f, "t.nested", 16 + 12 + 1);
	open_fails(f.b.p, n, "offset %zu: expected at most 0 uint16 elements (2 "
	           "bytes each at least) in the remaining 1 bytes for the array "
	           "of key 't.nested', found array length 1", n - 1 - 8);
	free(f.b.p);
}

Test(gguf, truncated_at_tensor_info_boundaries)
{
	struct fixture f;

	build(&f, 64);
	for (int i = 0; i < NT; i++) {
		const char *t = t_name[i];

		open_fails(f.b.p, f.t_at[i], "offset %zu: expected the name of tensor "
		           "#%d (8 bytes), found the end of the file", f.t_at[i], i);
		open_fails(f.b.p, f.t_ndims_at[i], "offset %zu: expected the dimension "
		           "count of tensor '%s' (4 bytes), found the end of the file",
		           f.t_ndims_at[i], t);
		open_fails(f.b.p, f.t_ne_at[i], "offset %zu: expected a dimension of "
		           "tensor '%s' (8 bytes), found the end of the file",
		           f.t_ne_at[i], t);
		open_fails(f.b.p, f.t_type_at[i], "offset %zu: expected the type of "
		           "tensor '%s' (4 bytes), found the end of the file",
		           f.t_type_at[i], t);
		open_fails(f.b.p, f.t_off_at[i], "offset %zu: expected the data offset "
		           "of tensor '%s' (8 bytes), found the end of the file",
		           f.t_off_at[i], t);
	}
	free(f.b.p);
}

/* Cut in the padding or data: the first tensor (in file order) that no
 * longer fits is named. */
Test(gguf, truncated_in_data)
{
	struct fixture f;
	size_t cuts[2 * NT + 3];
	int nc = 0;

	build(&f, 64);
	cuts[nc++] = f.infos_end;
	cuts[nc++] = f.data_at;
	for (int i = 0; i < NT; i++) {
		cuts[nc++] = f.data_at + f.t_rel[i] + 1;
		cuts[nc++] = f.data_at + f.t_rel[i] + f.t_size[i] - 1;
	}
	cuts[nc++] = f.end - 1;
	for (int c = 0; c < nc; c++) {
		size_t n = cuts[c];
		int i = 0;

		while (f.data_at + f.t_rel[i] + f.t_size[i] <= n)
			i++;
		open_fails(f.b.p, n, "offset %zu: expected the data of tensor '%s' to "
		           "end within the %zu-byte file, found %" PRIu64 " bytes at "
		           "data offset %" PRIu64 " (the data section starts at %zu)",
		           f.t_off_at[i], t_name[i], n, f.t_size[i], f.t_rel[i], f.data_at);
	}
	free(f.b.p);
}

/* --- corrupt fields ------------------------------------------------------- */

Test(gguf, wrong_magic_and_versions)
{
	struct fixture f;

	build(&f, 64);
	memcpy(f.b.p, "GGML", 4);
	open_fails(f.b.p, f.b.n, "offset 0: expected the magic \"GGUF\", found \"GGML\"");
	memcpy(f.b.p, "\x00\x01GU", 4);
	open_fails(f.b.p, f.b.n, "offset 0: expected the magic \"GGUF\", found "
	           "\"\\x00\\x01GU\"");
	memcpy(f.b.p, "GGUF", 4);
	patch(&f, 4, 1, 4);
	open_fails(f.b.p, f.b.n, "offset 4: expected GGUF version 2 or 3, found 1 "
	           "(an obsolete format: convert the model again with current tools)");
	patch(&f, 4, 4, 4);
	open_fails(f.b.p, f.b.n, "offset 4: expected GGUF version 2 or 3, found 4");
	free(f.b.p);
}

Test(gguf, absurd_counts)
{
	struct fixture f;
	size_t rest, at;

	build(&f, 64);
	rest = f.end - 24;
	patch(&f, 8, 1ull << 62, 8);
	open_fails(f.b.p, f.b.n, "offset 8: expected at most %zu tensor infos (32 "
	           "bytes each at least) in the remaining %zu bytes, found tensor "
	           "count 4611686018427387904", rest / 32, rest);
	patch(&f, 8, NT, 8);
	patch(&f, 16, UINT64_MAX, 8);
	open_fails(f.b.p, f.b.n, "offset 16: expected at most %zu metadata keys (13 "
	           "bytes each at least) in the remaining %zu bytes, found key count "
	           "18446744073709551615", rest / 13, rest);
	patch(&f, 16, (uint64_t)f.nkv, 8);
	patch(&f, 24, 1ull << 63, 8);
	open_fails(f.b.p, f.b.n, "offset 24: expected the name of key #0 of at most "
	           "%zu bytes (the rest of the file), found length "
	           "9223372036854775808", f.end - 32);
	patch(&f, 24, strlen("general.architecture"), 8);
	at = f.kv_value_at[kv_index(&f, "t.strs")] + 4;
	patch(&f, at, UINT64_MAX / 2, 8);
	open_fails(f.b.p, f.b.n, "offset %zu: expected at most %zu string elements (8 "
	           "bytes each at least) in the remaining %zu bytes for the array of "
	           "key 't.strs', found array length 9223372036854775807",
	           at, (f.end - at - 8) / 8, f.end - at - 8);
	patch(&f, at, 3, 8);
	at = f.kv_value_at[kv_index(&f, "t.u32s")] + 4;
	patch(&f, at, 1ull << 61, 8);
	open_fails(f.b.p, f.b.n, "offset %zu: expected at most %zu uint32 elements (4 "
	           "bytes each at least) in the remaining %zu bytes for the array of "
	           "key 't.u32s', found array length 2305843009213693952",
	           at, (f.end - at - 8) / 4, f.end - at - 8);
	free(f.b.p);
}

Test(gguf, unknown_value_types)
{
	struct fixture f;
	size_t at;

	build(&f, 64);
	at = f.kv_type_at[kv_index(&f, "t.u8")];
	patch(&f, at, 13, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected the value type of key 't.u8' "
	           "(0 to 12), found 13", at);
	patch(&f, at, Q4KH_GGUF_UINT8, 4);
	at = f.kv_value_at[kv_index(&f, "t.f32s")];
	patch(&f, at, 0xffffffffu, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected an array element type of key "
	           "'t.f32s' (0 to 12), found 4294967295", at);
	free(f.b.p);
}

Test(gguf, arrays_nest_two_deep_at_most)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, f.nested_inner_type_at, Q4KH_GGUF_ARRAY, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected an array element type other "
	           "than array of key 't.nested' (arrays nest at most 2 deep), "
	           "found array", f.nested_inner_type_at);
	free(f.b.p);
}

Test(gguf, duplicate_keys)
{
	struct fixture f;
	int a = 0, b;

	build(&f, 64);
	a = kv_index(&f, "t.u8");
	b = kv_index(&f, "t.i8");
	f.b.p[f.kv_at[b] + 8 + 2] = 'u'; /* t.i8 -> t.u8 */
	open_fails(f.b.p, f.b.n, "offset %zu: expected unique keys, found key 't.u8' "
	           "again (first at offset %zu)", f.kv_at[b], f.kv_at[a]);
	free(f.b.p);
}

Test(gguf, bad_alignment)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, f.align_value_at, 0, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected general.alignment to be a "
	           "nonzero power of two, found 0", f.align_value_at);
	patch(&f, f.align_value_at, 3, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected general.alignment to be a "
	           "nonzero power of two, found 3", f.align_value_at);
	patch(&f, f.kv_type_at[kv_index(&f, "general.alignment")], Q4KH_GGUF_FLOAT32, 4);
	patch(&f, f.align_value_at, 0x42800000, 4); /* 64.0f */
	open_fails(f.b.p, f.b.n, "offset %zu: key 'general.alignment': expected an "
	           "integer that fits uint32, found float32 64", f.align_value_at);
	free(f.b.p);
}

Test(gguf, bad_dimension_counts)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, f.t_ndims_at[1], 0, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected 1 to 4 dimensions for tensor "
	           "'w8', found 0", f.t_ndims_at[1]);
	patch(&f, f.t_ndims_at[1], 5, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected 1 to 4 dimensions for tensor "
	           "'w8', found 5", f.t_ndims_at[1]);
	free(f.b.p);
}

Test(gguf, bad_dimensions)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, f.t_ne_at[1] + 8, 0, 8);
	open_fails(f.b.p, f.b.n, "offset %zu: expected dimension 1 of tensor 'w8' to "
	           "be 1 to 2^63-1, found 0", f.t_ne_at[1] + 8);
	patch(&f, f.t_ne_at[1] + 8, 1ull << 63, 8);
	open_fails(f.b.p, f.b.n, "offset %zu: expected dimension 1 of tensor 'w8' to "
	           "be 1 to 2^63-1, found 9223372036854775808", f.t_ne_at[1] + 8);
	patch(&f, f.t_ne_at[1] + 8, 1ull << 58, 8); /* 64 * 2^58 = 2^64 elements */
	open_fails(f.b.p, f.b.n, "offset %zu: expected the dimensions of tensor 'w8' "
	           "to multiply to under 2^63 elements, found an overflow at "
	           "dimension 1", f.t_ne_at[1]);
	patch(&f, f.t_ne_at[1] + 8, 3, 8);
	patch(&f, f.t_ne_at[0], 1ull << 62, 8); /* 2^62 floats: 2^64 bytes */
	open_fails(f.b.p, f.b.n, "offset %zu: expected the byte size of tensor 'norm' "
	           "to fit in 64 bits, found an overflow", f.t_ne_at[0]);
	patch(&f, f.t_ne_at[0], 8, 8);
	patch(&f, f.t_ne_at[1], 48, 8);
	open_fails(f.b.p, f.b.n, "offset %zu: expected ne[0] of tensor 'w8' to be a "
	           "multiple of 32 (the Q8_0 block size), found 48", f.t_ne_at[1]);
	patch(&f, f.t_ne_at[2], 128, 8);
	patch(&f, f.t_ne_at[1], 64, 8);
	open_fails(f.b.p, f.b.n, "offset %zu: expected ne[0] of tensor 'w4' to be a "
	           "multiple of 256 (the Q4_K block size), found 128", f.t_ne_at[2]);
	free(f.b.p);
}

Test(gguf, unknown_tensor_types)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, f.t_type_at[2], 99, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected a known tensor type for "
	           "tensor 'w4', found type id 99", f.t_type_at[2]);
	patch(&f, f.t_type_at[2], 4, 4); /* Q4_2, removed from ggml */
	open_fails(f.b.p, f.b.n, "offset %zu: expected a known tensor type for "
	           "tensor 'w4', found type id 4", f.t_type_at[2]);
	free(f.b.p);
}

Test(gguf, misaligned_offset)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, f.t_off_at[2], f.t_rel[2] + 32, 8);
	open_fails(f.b.p, f.b.n, "offset %zu: expected the data offset of tensor "
	           "'w4' to be a multiple of the alignment 64, found %" PRIu64,
	           f.t_off_at[2], f.t_rel[2] + 32);
	free(f.b.p);
}

Test(gguf, data_past_the_end)
{
	struct fixture f;
	uint64_t far[] = { 1ull << 20, UINT64_MAX - 63 };

	build(&f, 64);
	for (int i = 0; i < 2; i++) {
		patch(&f, f.t_off_at[1], far[i], 8);
		open_fails(f.b.p, f.b.n, "offset %zu: expected the data of tensor 'w8' "
		           "to end within the %zu-byte file, found 204 bytes at data "
		           "offset %" PRIu64 " (the data section starts at %zu)",
		           f.t_off_at[1], f.end, far[i], f.data_at);
	}
	free(f.b.p);
}

Test(gguf, overlapping_tensors)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, f.t_off_at[2], f.t_rel[1], 8); /* w4 on top of w8 */
	open_fails(f.b.p, f.b.n, "offset %zu: expected the data of tensor 'w4' to "
	           "start at or after file offset %" PRIu64 " where tensor 'w8' "
	           "ends, found file offset %" PRIu64, f.t_off_at[2],
	           f.data_at + f.t_rel[1] + 204, f.data_at + f.t_rel[1]);
	patch(&f, f.t_off_at[2], f.t_rel[2], 8);
	patch(&f, f.t_off_at[0], f.t_rel[1], 8); /* norm inside w8, listed first */
	open_fails(f.b.p, f.b.n, "offset %zu: expected the data of tensor 'w8' to "
	           "start at or after file offset %" PRIu64 " where tensor 'norm' "
	           "ends, found file offset %" PRIu64, f.t_off_at[1],
	           f.data_at + f.t_rel[1] + 32, f.data_at + f.t_rel[1]);
	free(f.b.p);
}

Test(gguf, duplicate_tensor_names)
{
	struct fixture f;

	build(&f, 64);
	f.b.p[f.t_at[2] + 8 + 1] = '8'; /* w4 -> w8 */
	open_fails(f.b.p, f.b.n, "offset %zu: expected unique tensor names, found "
	           "tensor 'w8' again (first at offset %zu)", f.t_at[2], f.t_at[1]);
	free(f.b.p);
}

Test(gguf, names_are_quoted_safely)
{
	struct fixture f;

	build(&f, 64);
	f.b.p[f.t_at[1] + 8] = '\n';
	patch(&f, f.t_ndims_at[1], 9, 4);
	open_fails(f.b.p, f.b.n, "offset %zu: expected 1 to 4 dimensions for tensor "
	           "'\\x0a8', found 9", f.t_ndims_at[1]);
	free(f.b.p);
}

/* A file with one tensor info: NAME, F32 {ne0} at data offset 0. */
static void tensor_file(struct gbuf *b, const char *name, uint64_t ne0)
{
	put(b, "GGUF", 4);
	put_le(b, 3, 4);
	put_le(b, 1, 8); /* tensors */
	put_le(b, 0, 8); /* keys */
	put_str(b, name);
	put_le(b, 1, 4);
	put_le(b, ne0, 8);
	put_le(b, Q4KH_TYPE_F32, 4);
	put_le(b, 0, 8);
	pad_to(b, 32);
	for (uint64_t i = 0; i < ne0; i++)
		put_f32(b, (float)i);
}

Test(gguf, names_within_the_gguf_limits)
{
	struct gbuf b = { 0 };
	char name[Q4KH_GGUF_MAX_TENSOR_NAME + 2], *key;
	struct q4kh_gguf *g;

	memset(name, 't', sizeof(name) - 1);
	name[sizeof(name) - 1] = 0;
	tensor_file(&b, name, 8);
	/* 65 bytes: one past the spec's 64 */
	open_fails(b.p, b.n, "offset 24: expected the name of tensor #0 to be at "
	           "most 64 bytes (the GGUF limit), found length 65");
	name[Q4KH_GGUF_MAX_TENSOR_NAME] = 0;
	b.n = 0;
	tensor_file(&b, name, 8);
	g = open_ok(b.p, b.n);
	cr_assert_eq(g->tensors[0].name.len, 64);
	q4kh_gguf_close(g);

	key = malloc(Q4KH_GGUF_MAX_KEY_LEN + 2);
	cr_assert_not_null(key);
	memset(key, 'k', Q4KH_GGUF_MAX_KEY_LEN + 1);
	key[Q4KH_GGUF_MAX_KEY_LEN + 1] = 0;
	b.n = 0;
	put(&b, "GGUF", 4);
	put_le(&b, 3, 4);
	put_le(&b, 0, 8);
	put_le(&b, 1, 8);
	put_str(&b, key);
	put_le(&b, Q4KH_GGUF_UINT8, 4);
	put_le(&b, 7, 1);
	open_fails(b.p, b.n, "offset 24: expected the name of key #0 to be at most "
	           "65535 bytes (the GGUF limit), found length 65536");
	free(key);
	free(b.p);
}

/*
 * Counts that the file's size allows but no model needs: refused before
 * the reader allocates for them. The file is made long (sparse) so only
 * q4khost's own limit can fire.
 */
Test(gguf, counts_past_the_limits)
{
	struct fixture f;

	build(&f, 64);
	patch(&f, 8, Q4KH_GGUF_MAX_TENSORS + 1ull, 8);
	test_write_file(path, f.b.p, f.b.n);
	cr_assert_eq(truncate(path, 64 << 20), 0, "%s", strerror(errno));
	path_fails("offset 8: expected at most 1048576 tensors (q4khost's limit), "
	           "found tensor count 1048577");
	patch(&f, 8, NT, 8);
	patch(&f, 16, Q4KH_GGUF_MAX_KEYS + 1ull, 8);
	test_write_file(path, f.b.p, f.b.n);
	cr_assert_eq(truncate(path, 64 << 20), 0, "%s", strerror(errno));
	path_fails("offset 16: expected at most 1048576 metadata keys (q4khost's "
	           "limit), found key count 1048577");
	free(f.b.p);
}

/*
 * A tensor whose data lies past 4 GiB (offsets are 64-bit throughout): a
 * sparse file, so it costs a few blocks of disk. The header has two F32
 * tensors: "low" at data offset 0 and "high" at 5 GiB; the last bytes of
 * the file are high's values, written with pwrite at that offset.
 */
Test(gguf, file_over_4_gib)
{
	const uint64_t high_rel = 5ull << 30;
	struct gbuf b = { 0 };
	const struct q4kh_gguf_tensor *t;
	struct q4kh_gguf *g;
	struct q4kh_error err = { { 0 } };
	float high[8], low[8];
	uint64_t data_at;
	int fd;

	put(&b, "GGUF", 4);
	put_le(&b, 3, 4);
	put_le(&b, 2, 8);
	put_le(&b, 0, 8);
	put_str(&b, "low");
	put_le(&b, 1, 4);
	put_le(&b, 8, 8);
	put_le(&b, Q4KH_TYPE_F32, 4);
	put_le(&b, 0, 8);
	put_str(&b, "high");
	put_le(&b, 1, 4);
	put_le(&b, 8, 8);
	put_le(&b, Q4KH_TYPE_F32, 4);
	put_le(&b, high_rel, 8);
	pad_to(&b, 32);
	data_at = b.n;
	for (int i = 0; i < 8; i++) {
		low[i] = (float)i;
		high[i] = -0.5f * (float)(i + 1);
		put_f32(&b, low[i]);
	}
	test_write_file(path, b.p, b.n);
	fd = open(path, O_WRONLY);
	cr_assert_geq(fd, 0);
	if (pwrite(fd, high, sizeof(high), (off_t)(data_at + high_rel)) != sizeof(high)) {
		int e = errno;
		close(fd);
		cr_skip_test("the file system under %s refuses a sparse file of 5 GiB: %s",
		             dir, strerror(e));
	}
	close(fd);

	cr_assert_eq(q4kh_gguf_open(path, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(g->size, data_at + high_rel + sizeof(high));
	t = q4kh_gguf_tensor(g, "high");
	cr_assert_not_null(t);
	cr_assert_eq(t->offset, data_at + high_rel);
	cr_assert_eq(t->size, sizeof(high));
	cr_assert_eq(memcmp(t->data, high, sizeof(high)), 0);
	t = q4kh_gguf_tensor(g, "low");
	cr_assert_eq(memcmp(t->data, low, sizeof(low)), 0);
	q4kh_gguf_close(g);
	free(b.p);
}

/*
 * The model's vocabulary is token_embd.weight's row count; token ids are
 * int32, so 2^31 rows are refused when the model loads. A llama file with
 * just the keys and that tensor (F32 {2, 2^31}: 16 GiB, sparse).
 */
Test(gguf, vocabulary_past_int32_is_refused)
{
	static const char *const u32_keys[] = {
		"llama.embedding_length", "llama.block_count",
		"llama.feed_forward_length", "llama.attention.head_count",
	};
	static const uint32_t u32_values[] = { 2, 1, 2, 1 };
	const uint64_t rows = 1ull << 31;
	struct gbuf b = { 0 };
	struct q4kh_model *m = NULL;
	struct q4kh_error err = { { 0 } };
	char want[sizeof(path) + 200];

	put(&b, "GGUF", 4);
	put_le(&b, 3, 4);
	put_le(&b, 1, 8);
	put_le(&b, 6, 8);
	put_str(&b, "general.architecture");
	put_le(&b, Q4KH_GGUF_STRING, 4);
	put_str(&b, "llama");
	for (int i = 0; i < 4; i++) {
		put_str(&b, u32_keys[i]);
		put_le(&b, Q4KH_GGUF_UINT32, 4);
		put_le(&b, u32_values[i], 4);
	}
	put_str(&b, "llama.attention.layer_norm_rms_epsilon");
	put_le(&b, Q4KH_GGUF_FLOAT32, 4);
	put_f32(&b, 1e-5f);
	put_str(&b, "token_embd.weight");
	put_le(&b, 2, 4);
	put_le(&b, 2, 8);
	put_le(&b, rows, 8);
	put_le(&b, Q4KH_TYPE_F32, 4);
	put_le(&b, 0, 8);
	pad_to(&b, 32);
	test_write_file(path, b.p, b.n);
	if (truncate(path, (off_t)(b.n + rows * 2 * 4)) != 0)
		cr_skip_test("the file system under %s refuses a sparse file of 16 GiB: %s",
		             dir, strerror(errno));
	cr_assert_eq(q4kh_model_open(path, &m, &err), -1);
	snprintf(want, sizeof(want), "%s: token_embd.weight has 2147483648 rows: "
	         "expected a vocabulary of at most 2147483647 tokens", path);
	cr_assert_str_eq(err.msg, want);
	free(b.p);
}

Test(gguf, not_a_gguf_file)
{
	struct q4kh_gguf *g;
	struct q4kh_error err;
	char want[4200];

	snprintf(want, sizeof(want), "%s/missing.gguf", dir);
	cr_assert_eq(q4kh_gguf_open(want, &g, &err), -1);
	cr_assert_null(g);
	cr_assert(strstr(err.msg, "missing.gguf: cannot open: No such file or directory"),
	          "%s", err.msg);
	cr_assert_eq(q4kh_gguf_open(dir, &g, &err), -1);
	snprintf(want, sizeof(want), "%s: expected a regular file, found a directory", dir);
	cr_assert_str_eq(err.msg, want);
}

/* --- the real default model ------------------------------------------------ */

/*
 * Expected values: gguf-py 0.x (`from gguf import GGUFReader`) on
 * gemma-3-270m-q4_k_m.gguf (253113024 bytes): r.fields, r.tensors,
 * r.data_offset, field.offset, tensor.data and gguf.dequantize.
 */
static void check_model_metadata(const struct q4kh_gguf *g)
{
	struct q4kh_error err = { { 0 } };
	const struct q4kh_gguf_kv *kv;
	struct q4kh_gguf_str s, *toks;
	uint32_t u;
	float x, *scores;
	int32_t *tt;
	int b;

	cr_assert_eq(q4kh_gguf_get_str(g, "general.architecture", &s, &err), 0);
	cr_assert(s.len == 6 && !memcmp(s.data, "gemma3", 6));
#define U32(key, want)                                                         \
	do {                                                                   \
		cr_assert_eq(q4kh_gguf_get_u32(g, key, &u, &err), 0, "%s", err.msg); \
		cr_assert_eq(u, want, key);                                    \
	} while (0)
	U32("gemma3.embedding_length", 640);
	U32("gemma3.block_count", 18);
	U32("gemma3.context_length", 32768);
	U32("gemma3.feed_forward_length", 2048);
	U32("gemma3.attention.head_count", 4);
	U32("gemma3.attention.head_count_kv", 1);
	U32("gemma3.attention.key_length", 256);
	U32("gemma3.attention.sliding_window", 512);
	U32("tokenizer.ggml.bos_token_id", 2);
	U32("general.file_type", 15);
#undef U32
	cr_assert_eq(q4kh_gguf_get_f32(g, "gemma3.attention.layer_norm_rms_epsilon", &x, &err), 0);
	cr_assert_eq(x, (float)9.999999974752427e-07);
	cr_assert_eq(q4kh_gguf_get_f32(g, "gemma3.rope.freq_base", &x, &err), 0);
	cr_assert_eq(x, 1000000.0f);
	cr_assert_eq(q4kh_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &err), 0);
	cr_assert_eq(b, 1);
	cr_assert_eq(q4kh_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b, &err), 0);
	cr_assert_eq(b, 0);

	kv = q4kh_gguf_find(g, "tokenizer.ggml.tokens");
	cr_assert_not_null(kv);
	cr_assert_eq(kv->count, 262144);
	cr_assert_eq((const uint8_t *)kv->key.data - g->map - 8, 934);
	toks = calloc(kv->count, sizeof(*toks));
	cr_assert_eq(q4kh_gguf_array_strings(g, kv, toks, &err), 0);
	cr_assert(toks[0].len == 5 && !memcmp(toks[0].data, "<pad>", 5));
	cr_assert(toks[106].len == 13 && !memcmp(toks[106].data, "<end_of_turn>", 13));
	cr_assert(toks[262143].len == 12 && !memcmp(toks[262143].data, "<unused6241>", 12));
	free(toks);

	kv = q4kh_gguf_find(g, "tokenizer.ggml.scores");
	cr_assert_eq((const uint8_t *)kv->key.data - g->map - 8, 4413497);
	scores = calloc(kv->count, sizeof(*scores));
	cr_assert_eq(q4kh_gguf_array_f32(g, kv, scores, &err), 0);
	cr_assert_eq(scores[0], -1000.0f);
	cr_assert_eq(scores[1000], -506.0f);
	free(scores);
	kv = q4kh_gguf_find(g, "tokenizer.ggml.token_type");
	tt = calloc(kv->count, sizeof(*tt));
	cr_assert_eq(q4kh_gguf_array_i32(g, kv, tt, &err), 0);
	cr_assert(tt[0] == 3 && tt[1000] == 1);
	free(tt);
	kv = q4kh_gguf_find(g, "general.tags");
	cr_assert_eq(kv->elem_type, Q4KH_GGUF_STRING);
	cr_assert_eq(kv->count, 4);
}

struct want_tensor {
	const char *name;
	uint32_t type;
	int64_t ne0, ne1;
	uint64_t offset, size;
};

static void check_model_tensors(const struct q4kh_gguf *g)
{
	static const struct want_tensor want[] = {
		{ "output_norm.weight", Q4KH_TYPE_F32, 640, 1, 6525120, 2560 },
		{ "token_embd.weight", Q4KH_TYPE_Q8_0, 640, 262144, 6527680, 178257920 },
		{ "blk.0.attn_k.weight", Q4KH_TYPE_Q5_0, 640, 256, 184785600, 112640 },
		{ "blk.0.attn_output.weight", Q4KH_TYPE_Q4_K, 1024, 640, 184901824, 368640 },
		{ "blk.0.attn_q.weight", Q4KH_TYPE_Q5_0, 640, 1024, 185270464, 450560 },
		{ "blk.17.ffn_down.weight", Q4KH_TYPE_Q6_K, 2048, 640, 250227904, 1075200 },
		{ "blk.17.post_ffw_norm.weight", Q4KH_TYPE_F32, 640, 1, 253110464, 2560 },
	};
	/* F32, Q5_0, Q4_K, Q8_0, Q6_K counts and bytes */
	static const uint32_t types[5] = { Q4KH_TYPE_F32, Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q4_K,
	                                   Q4KH_TYPE_Q8_0, Q4KH_TYPE_Q6_K };
	static const uint64_t counts[5] = { 109, 81, 27, 10, 9 };
	static const uint64_t bytes[5] = { 223744, 43591680, 13271040, 179824640, 9676800 };
	static const float norm0[4] = { 7.125f, 9.5625f, 47.0f, 145.0f };
	static const uint8_t embd0[4] = { 0xf2, 0x10, 0xf4, 0x47 };
	uint64_t n[5] = { 0 }, sz[5] = { 0 }, params = 0;
	const struct q4kh_gguf_tensor *t;
	uint16_t d;
	float x;

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		t = q4kh_gguf_tensor(g, want[i].name);
		cr_assert_not_null(t, "%s", want[i].name);
		cr_assert_eq(t->type, want[i].type, "%s", want[i].name);
		cr_assert_eq(t->ne[0], want[i].ne0, "%s", want[i].name);
		cr_assert_eq(t->ne[1], want[i].ne1, "%s", want[i].name);
		cr_assert_eq(t->offset, want[i].offset, "%s", want[i].name);
		cr_assert_eq(t->size, want[i].size, "%s", want[i].name);
	}
	t = q4kh_gguf_tensor(g, "token_embd.weight");
	cr_assert_eq(t->n_dims, 2);
	cr_assert_eq(memcmp(t->data, embd0, 4), 0);
	/* first value of row 0, dequantized by gguf-py: d * qs[0] */
	memcpy(&d, t->data, 2);
	cr_assert_eq(q4kh_fp16_to_f32(d) * (float)((const int8_t *)t->data)[2],
	             -0.007244110107421875f);
	t = q4kh_gguf_tensor(g, "output_norm.weight");
	for (int j = 0; j < 4; j++) {
		memcpy(&x, (const float *)t->data + j, 4);
		cr_assert_eq(x, norm0[j]);
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		t = &g->tensors[i];
		params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
		for (int k = 0; k < 5; k++)
			if (t->type == types[k]) {
				n[k]++;
				sz[k] += t->size;
			}
	}
	for (int k = 0; k < 5; k++) {
		cr_assert_eq(n[k], counts[k], "%s", q4kh_type_name(types[k]));
		cr_assert_eq(sz[k], bytes[k], "%s", q4kh_type_name(types[k]));
	}
	cr_assert_eq(params, 268098176);
}

Test(gguf, default_model_matches_gguf_py)
{
	const char *model = test_model_path();
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g;

	cr_assert_eq(q4kh_gguf_open(model, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(g->size, 253113024);
	cr_assert_eq(g->version, 3);
	cr_assert_eq(g->n_tensors, 236);
	cr_assert_eq(g->n_kv, 33); /* gguf-py's 36 fields include 3 GGUF.* header ones */
	cr_assert_eq(g->alignment, 32);
	cr_assert_eq(g->data_offset, 6525120);
	check_model_metadata(g);
	check_model_tensors(g);
	q4kh_gguf_close(g);
}

/* One mapping per file per process; a changed file is a new one. */
Test(gguf_shared, same_file_same_mapping_until_it_changes)
{
	const char *model = test_model_path();
	char *copy = NULL;
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *a, *b, *c;
	size_t len;
	void *bytes;

	cr_assert_eq(q4kh_gguf_acquire(model, &a, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_gguf_acquire(model, &b, &err), 0, "%s", err.msg);
	cr_expect_eq(a, b, "a second open of the same file maps it again");
	q4kh_gguf_release(b);
	cr_expect_eq(a->n_tensors > 0, 1); /* still open after one release */
	q4kh_gguf_release(a);

	/* a copy that is rewritten in place is not the old file */
	cr_assert(asprintf(&copy, "%s/copy.gguf", test_tmpdir()) > 0);
	bytes = test_read_file(model, &len);
	cr_assert_not_null(bytes);
	test_write_file(copy, bytes, len);
	cr_assert_eq(q4kh_gguf_acquire(copy, &a, &err), 0, "%s", err.msg);
	sleep(1); /* a new modification time, whatever the clock's grain */
	test_write_file(copy, bytes, len);
	cr_assert_eq(q4kh_gguf_acquire(copy, &c, &err), 0, "%s", err.msg);
	cr_expect_neq(a, c, "a rewritten file must be read again");
	q4kh_gguf_release(a);
	q4kh_gguf_release(c);
	cr_expect_eq(q4kh_gguf_acquire("/nonexistent/model.gguf", &a, &err), -1);
	cr_expect(strstr(err.msg, "/nonexistent/model.gguf: cannot open") != NULL, "%s", err.msg);
	free(bytes);
	free(copy);
}
