/*
 * GGUF reader: map the file, then walk it with a cursor that checks every
 * field against the bytes left before reading it. Nothing is read from the
 * mapping that has not been bounds-checked first.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <q4khost/quant.h>

#define GGUF_DEFAULT_ALIGNMENT 32
/* Smallest encodings, to bound counts before allocating for them. */
#define KV_MIN_BYTES 13          /* key length, value type, a 1-byte value */
#define TENSOR_INFO_MIN_BYTES 32 /* name length, n_dims, one ne, type, offset */
#define ARRAY_HEAD_BYTES 12      /* element type, count */
/* An array may hold arrays of non-arrays; nothing we read needs more. */
#define ARRAY_MAX_DEPTH 2
#define NAME_SHOWN 80 /* bytes of a key or tensor name quoted in messages */
#define SUBJECT_MAX (4 * NAME_SHOWN + 32)

struct cursor {
	const char *path;
	const uint8_t *map;
	uint64_t size;
	uint64_t pos;
	char subject[SUBJECT_MAX]; /* "key 'x'", "tensor 'y'": being read */
	struct q4kh_error *err;
};

static uint64_t le_u(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;

	while (n--)
		v = v << 8 | p[n];
	return v;
}

/* A name from the file, quoted safely on one line (escapes, cut long). */
static const char *show_name(char *buf, size_t cap, const uint8_t *s,
                             uint64_t len)
{
	return q4kh_show(buf, cap, s, len > SIZE_MAX ? SIZE_MAX : (size_t)len,
	                 NAME_SHOWN, 1);
}

static int fail_at(const struct cursor *c, uint64_t off, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail_at(const struct cursor *c, uint64_t off, const char *fmt, ...)
{
	char what[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return q4kh_fail(c->err, "%s: offset %" PRIu64 ": %s", c->path, off, what);
}

static int out_of_memory(const struct cursor *c, uint64_t n, const char *what)
{
	return q4kh_fail(c->err, "%s: out of memory for %" PRIu64 " %s", c->path,
	                 n, what);
}

static void set_subject(struct cursor *c, const char *kind,
                        const struct q4kh_gguf_str *name)
{
	char shown[4 * NAME_SHOWN + 8];

	show_name(shown, sizeof(shown), (const uint8_t *)name->data, name->len);
	snprintf(c->subject, sizeof(c->subject), "%s '%s'", kind, shown);
}

static const char *of_subject(const struct cursor *c)
{
	return c->subject[0] ? " of " : "";
}

/* Check that N bytes of FIELD remain at the cursor. */
static int need(const struct cursor *c, uint64_t n, const char *field)
{
	uint64_t rest = c->size - c->pos;

	if (n <= rest)
		return 0;
	if (rest == 0)
		return fail_at(c, c->pos,
		               "expected %s%s%s (%" PRIu64 " byte%s), found the end of the file",
		               field, of_subject(c), c->subject, n, n == 1 ? "" : "s");
	return fail_at(c, c->pos,
	               "expected %s%s%s (%" PRIu64 " bytes), found only %" PRIu64
	               " byte%s before the end of the file",
	               field, of_subject(c), c->subject, n, rest, rest == 1 ? "" : "s");
}

static int read_u32(struct cursor *c, const char *field, uint32_t *v)
{
	if (need(c, 4, field))
		return -1;
	*v = (uint32_t)le_u(c->map + c->pos, 4);
	c->pos += 4;
	return 0;
}

static int read_u64(struct cursor *c, const char *field, uint64_t *v)
{
	if (need(c, 8, field))
		return -1;
	*v = le_u(c->map + c->pos, 8);
	c->pos += 8;
	return 0;
}

static int read_str(struct cursor *c, const char *field,
                    struct q4kh_gguf_str *s)
{
	uint64_t start = c->pos, len;

	if (read_u64(c, field, &len))
		return -1;
	if (len > c->size - c->pos)
		return fail_at(c, start,
		               "expected %s%s%s of at most %" PRIu64
		               " bytes (the rest of the file), found length %" PRIu64,
		               field, of_subject(c), c->subject, c->size - c->pos, len);
	s->len = len;
	s->data = (const char *)c->map + c->pos;
	c->pos += len;
	return 0;
}

/* A name just read must not be longer than MAX (the GGUF spec's limits). */
static int name_limit(const struct cursor *c, const struct q4kh_gguf_str *s,
                      uint64_t max)
{
	if (s->len <= max)
		return 0;
	return fail_at(c, c->pos - s->len - 8,
	               "expected the name of %s to be at most %" PRIu64
	               " bytes (the GGUF limit), found length %" PRIu64,
	               c->subject, max, s->len);
}

/* Bytes of one value of a fixed-size type; 0 for string and array. */
static unsigned fixed_size(uint32_t t)
{
	switch (t) {
	case Q4KH_GGUF_UINT8:
	case Q4KH_GGUF_INT8:
	case Q4KH_GGUF_BOOL:
		return 1;
	case Q4KH_GGUF_UINT16:
	case Q4KH_GGUF_INT16:
		return 2;
	case Q4KH_GGUF_UINT32:
	case Q4KH_GGUF_INT32:
	case Q4KH_GGUF_FLOAT32:
		return 4;
	case Q4KH_GGUF_UINT64:
	case Q4KH_GGUF_INT64:
	case Q4KH_GGUF_FLOAT64:
		return 8;
	default:
		return 0;
	}
}

static uint64_t min_size(uint32_t t)
{
	if (t == Q4KH_GGUF_STRING)
		return 8;
	if (t == Q4KH_GGUF_ARRAY)
		return ARRAY_HEAD_BYTES;
	return fixed_size(t);
}

static int read_vtype(struct cursor *c, const char *field, uint32_t *t)
{
	if (read_u32(c, field, t))
		return -1;
	if (*t > Q4KH_GGUF_FLOAT64)
		return fail_at(c, c->pos - 4, "expected %s%s%s (0 to 12), found %" PRIu32,
		               field, of_subject(c), c->subject, *t);
	return 0;
}

/* Element type and count of an array at nesting DEPTH (1 = outermost). */
static int read_array_head(struct cursor *c, int depth, uint32_t *elem,
                           uint64_t *count)
{
	uint64_t at, rest;

	if (read_vtype(c, "an array element type", elem))
		return -1;
	if (*elem == Q4KH_GGUF_ARRAY && depth >= ARRAY_MAX_DEPTH)
		return fail_at(c, c->pos - 4,
		               "expected an array element type other than array%s%s "
		               "(arrays nest at most %d deep), found array",
		               of_subject(c), c->subject, ARRAY_MAX_DEPTH);
	at = c->pos;
	if (read_u64(c, "an array length", count))
		return -1;
	rest = c->size - c->pos;
	if (*count > rest / min_size(*elem))
		return fail_at(c, at,
		               "expected at most %" PRIu64 " %s elements (%" PRIu64
		               " bytes each at least) in the remaining %" PRIu64
		               " bytes for the array%s%s, found array length %" PRIu64,
		               rest / min_size(*elem), q4kh_gguf_vtype_name(*elem),
		               min_size(*elem), rest, of_subject(c), c->subject, *count);
	return 0;
}

static int skip_elements(struct cursor *c, uint32_t elem, uint64_t count,
                         int depth)
{
	struct q4kh_gguf_str s;
	uint32_t inner;
	uint64_t n;

	if (fixed_size(elem)) {
		/* count <= rest / size was checked with the length */
		c->pos += count * fixed_size(elem);
		return 0;
	}
	for (uint64_t i = 0; i < count; i++) {
		if (elem == Q4KH_GGUF_STRING) {
			if (read_str(c, "a string element", &s))
				return -1;
		} else if (read_array_head(c, depth + 1, &inner, &n) ||
		           skip_elements(c, inner, n, depth + 1)) {
			return -1;
		}
	}
	return 0;
}

static int read_kv(struct cursor *c, uint64_t index, struct q4kh_gguf_kv *kv)
{
	struct q4kh_gguf_str s;

	snprintf(c->subject, sizeof(c->subject), "key #%" PRIu64, index);
	if (read_str(c, "the name", &kv->key) ||
	    name_limit(c, &kv->key, Q4KH_GGUF_MAX_KEY_LEN))
		return -1;
	set_subject(c, "key", &kv->key);
	if (read_vtype(c, "the value type", &kv->type))
		return -1;
	kv->count = 1;
	if (kv->type == Q4KH_GGUF_ARRAY) {
		if (read_array_head(c, 1, &kv->elem_type, &kv->count))
			return -1;
		kv->offset = c->pos;
		kv->data = c->map + c->pos;
		return skip_elements(c, kv->elem_type, kv->count, 1);
	}
	kv->offset = c->pos;
	kv->data = c->map + c->pos;
	if (kv->type == Q4KH_GGUF_STRING)
		return read_str(c, "the string value", &s);
	if (need(c, fixed_size(kv->type), "the value"))
		return -1;
	c->pos += fixed_size(kv->type);
	return 0;
}

static int str_cmp(const struct q4kh_gguf_str *a, const struct q4kh_gguf_str *b)
{
	uint64_t n = a->len < b->len ? a->len : b->len;
	int r = memcmp(a->data, b->data, n);

	if (r)
		return r;
	return (a->len > b->len) - (a->len < b->len);
}

static int str_eq(const struct q4kh_gguf_str *s, const char *z)
{
	size_t n = strlen(z);

	return s->len == n && memcmp(s->data, z, n) == 0;
}

/* Sort orders for duplicate and overlap checks; ties keep file order. */
static int kv_by_key(const void *pa, const void *pb)
{
	const struct q4kh_gguf_kv *a = *(const struct q4kh_gguf_kv *const *)pa;
	const struct q4kh_gguf_kv *b = *(const struct q4kh_gguf_kv *const *)pb;
	int r = str_cmp(&a->key, &b->key);

	return r ? r : (a > b) - (a < b);
}

static int tensor_by_name(const void *pa, const void *pb)
{
	const struct q4kh_gguf_tensor *a = *(const struct q4kh_gguf_tensor *const *)pa;
	const struct q4kh_gguf_tensor *b = *(const struct q4kh_gguf_tensor *const *)pb;
	int r = str_cmp(&a->name, &b->name);

	return r ? r : (a > b) - (a < b);
}

static int tensor_by_offset(const void *pa, const void *pb)
{
	const struct q4kh_gguf_tensor *a = *(const struct q4kh_gguf_tensor *const *)pa;
	const struct q4kh_gguf_tensor *b = *(const struct q4kh_gguf_tensor *const *)pb;

	if (a->offset != b->offset)
		return (a->offset > b->offset) - (a->offset < b->offset);
	return (a > b) - (a < b);
}

/* File offset where a name field (its u64 length) starts. */
static uint64_t name_field(const struct cursor *c, const struct q4kh_gguf_str *s)
{
	return (uint64_t)((const uint8_t *)s->data - c->map) - 8;
}

/* File offset of a tensor info's data offset field. */
static uint64_t offset_field(const struct cursor *c,
                             const struct q4kh_gguf_tensor *t)
{
	return name_field(c, &t->name) + 8 + t->name.len + 4 + 8 * t->n_dims + 4;
}

static int check_unique_keys(struct cursor *c, struct q4kh_gguf *g)
{
	const struct q4kh_gguf_kv **v;
	int rc = 0;

	if (g->n_kv < 2)
		return 0;
	v = malloc(g->n_kv * sizeof(*v));
	if (!v)
		return out_of_memory(c, g->n_kv, "keys");
	for (uint64_t i = 0; i < g->n_kv; i++)
		v[i] = &g->kv[i];
	qsort(v, g->n_kv, sizeof(*v), kv_by_key);
	for (uint64_t i = 1; i < g->n_kv && !rc; i++) {
		if (str_cmp(&v[i - 1]->key, &v[i]->key))
			continue;
		set_subject(c, "key", &v[i]->key);
		rc = fail_at(c, name_field(c, &v[i]->key),
		             "expected unique keys, found %s again (first at offset %" PRIu64 ")",
		             c->subject, name_field(c, &v[i - 1]->key));
	}
	free(v);
	return rc;
}

static int read_alignment(struct cursor *c, struct q4kh_gguf *g)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, "general.alignment");
	uint32_t a = GGUF_DEFAULT_ALIGNMENT;

	if (q4kh_gguf_get_u32(g, "general.alignment", &a, c->err) < 0)
		return -1;
	if (a == 0 || (a & (a - 1)))
		return fail_at(c, kv->offset,
		               "expected general.alignment to be a nonzero power of two, "
		               "found %" PRIu32, a);
	g->alignment = a;
	return 0;
}

static int read_dims(struct cursor *c, struct q4kh_gguf_tensor *t)
{
	uint64_t at = c->pos, ne;
	int64_t n = 1;

	for (uint32_t d = 0; d < 4; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < t->n_dims; d++) {
		if (read_u64(c, "a dimension", &ne))
			return -1;
		if (ne == 0 || ne > INT64_MAX)
			return fail_at(c, c->pos - 8,
			               "expected dimension %" PRIu32 " of %s to be 1 to 2^63-1, "
			               "found %" PRIu64, d, c->subject, ne);
		t->ne[d] = (int64_t)ne;
		if (__builtin_mul_overflow(n, t->ne[d], &n))
			return fail_at(c, at,
			               "expected the dimensions of %s to multiply to "
			               "under 2^63 elements, found an overflow at dimension %" PRIu32,
			               c->subject, d);
	}
	return 0;
}

/* Type, block divisibility and byte size of T; AT is its ne[] field. */
static int read_type(struct cursor *c, struct q4kh_gguf_tensor *t, uint64_t at)
{
	uint32_t be, bb;
	uint64_t rows = 1, row_bytes, size;

	if (read_u32(c, "the type", &t->type))
		return -1;
	be = q4kh_type_block_elems(t->type);
	bb = q4kh_type_block_bytes(t->type);
	if (!bb)
		return fail_at(c, c->pos - 4,
		               "expected a known tensor type for %s, found type id %" PRIu32,
		               c->subject, t->type);
	if (t->ne[0] % be)
		return fail_at(c, at,
		               "expected ne[0] of %s to be a multiple of %" PRIu32
		               " (the %s block size), found %" PRId64,
		               c->subject, be, q4kh_type_name(t->type), t->ne[0]);
	for (int d = 1; d < 4; d++)
		rows *= (uint64_t)t->ne[d]; /* cannot overflow: read_dims bounded it */
	if (__builtin_mul_overflow((uint64_t)t->ne[0] / be, bb, &row_bytes) ||
	    __builtin_mul_overflow(row_bytes, rows, &size))
		return fail_at(c, at,
		               "expected the byte size of %s to fit in 64 bits, found an overflow",
		               c->subject);
	t->size = size;
	return 0;
}

static int read_tensor_info(struct cursor *c, const struct q4kh_gguf *g,
                            uint64_t index, struct q4kh_gguf_tensor *t)
{
	uint64_t dims_at;

	snprintf(c->subject, sizeof(c->subject), "tensor #%" PRIu64, index);
	if (read_str(c, "the name", &t->name) ||
	    name_limit(c, &t->name, Q4KH_GGUF_MAX_TENSOR_NAME))
		return -1;
	set_subject(c, "tensor", &t->name);
	if (read_u32(c, "the dimension count", &t->n_dims))
		return -1;
	if (t->n_dims < 1 || t->n_dims > 4)
		return fail_at(c, c->pos - 4,
		               "expected 1 to 4 dimensions for %s, found %" PRIu32,
		               c->subject, t->n_dims);
	dims_at = c->pos;
	if (read_dims(c, t) || read_type(c, t, dims_at))
		return -1;
	if (read_u64(c, "the data offset", &t->offset))
		return -1;
	if (t->offset % g->alignment)
		return fail_at(c, c->pos - 8,
		               "expected the data offset of %s to be a multiple of the "
		               "alignment %" PRIu64 ", found %" PRIu64,
		               c->subject, g->alignment, t->offset);
	return 0;
}

static int check_unique_tensors(struct cursor *c,
                                const struct q4kh_gguf_tensor **v, uint64_t n)
{
	qsort(v, n, sizeof(*v), tensor_by_name);
	for (uint64_t i = 1; i < n; i++) {
		if (str_cmp(&v[i - 1]->name, &v[i]->name))
			continue;
		set_subject(c, "tensor", &v[i]->name);
		return fail_at(c, name_field(c, &v[i]->name),
		               "expected unique tensor names, found %s again (first at offset %" PRIu64 ")",
		               c->subject, name_field(c, &v[i - 1]->name));
	}
	return 0;
}

/* Turn relative offsets into file offsets, checking each extent. */
static int place_tensors(struct cursor *c, struct q4kh_gguf *g)
{
	uint64_t room = g->data_offset <= g->size ? g->size - g->data_offset : 0;

	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct q4kh_gguf_tensor *t = &g->tensors[i];

		if (t->offset > room || t->size > room - t->offset) {
			set_subject(c, "tensor", &t->name);
			return fail_at(c, offset_field(c, t),
			               "expected the data of %s to end within the %" PRIu64
			               "-byte file, found %" PRIu64 " bytes at data offset %" PRIu64
			               " (the data section starts at %" PRIu64 ")",
			               c->subject, g->size, t->size, t->offset, g->data_offset);
		}
		t->offset += g->data_offset;
		t->data = g->map + t->offset;
	}
	return 0;
}

static int check_no_overlap(struct cursor *c, const struct q4kh_gguf_tensor **v,
                            uint64_t n)
{
	qsort(v, n, sizeof(*v), tensor_by_offset);
	for (uint64_t i = 1; i < n; i++) {
		uint64_t end = v[i - 1]->offset + v[i - 1]->size;
		char prev[SUBJECT_MAX];

		if (end <= v[i]->offset)
			continue;
		set_subject(c, "tensor", &v[i - 1]->name);
		memcpy(prev, c->subject, sizeof(prev));
		set_subject(c, "tensor", &v[i]->name);
		return fail_at(c, offset_field(c, v[i]),
		               "expected the data of %s to start at or after file offset %" PRIu64
		               " where %s ends, found file offset %" PRIu64,
		               c->subject, end, prev, v[i]->offset);
	}
	return 0;
}

static int read_tensors(struct cursor *c, struct q4kh_gguf *g)
{
	const struct q4kh_gguf_tensor **v;
	int rc;

	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (read_tensor_info(c, g, i, &g->tensors[i]))
			return -1;
	c->subject[0] = 0;
	g->data_offset = c->pos + (g->alignment - c->pos % g->alignment) % g->alignment;
	if (place_tensors(c, g))
		return -1;
	if (g->n_tensors < 2)
		return 0;
	v = malloc(g->n_tensors * sizeof(*v));
	if (!v)
		return out_of_memory(c, g->n_tensors, "tensors");
	for (uint64_t i = 0; i < g->n_tensors; i++)
		v[i] = &g->tensors[i];
	rc = check_unique_tensors(c, v, g->n_tensors);
	if (!rc)
		rc = check_no_overlap(c, v, g->n_tensors);
	free(v);
	return rc;
}

static int read_header(struct cursor *c, struct q4kh_gguf *g)
{
	uint64_t rest;
	char shown[24];

	if (need(c, 4, "the magic \"GGUF\""))
		return -1;
	if (memcmp(c->map, "GGUF", 4))
		return fail_at(c, 0, "expected the magic \"GGUF\", found \"%s\"",
		               show_name(shown, sizeof(shown), c->map, 4));
	c->pos = 4;
	if (read_u32(c, "the GGUF version", &g->version))
		return -1;
	if (g->version == 1)
		return fail_at(c, 4, "expected GGUF version 2 or 3, found 1 (an obsolete "
		               "format: convert the model again with current tools)");
	if (g->version != 2 && g->version != 3)
		return fail_at(c, 4, "expected GGUF version 2 or 3, found %" PRIu32,
		               g->version);
	if (read_u64(c, "the tensor count", &g->n_tensors) ||
	    read_u64(c, "the metadata key count", &g->n_kv))
		return -1;
	rest = c->size - c->pos;
	if (g->n_tensors > rest / TENSOR_INFO_MIN_BYTES)
		return fail_at(c, 8,
		               "expected at most %" PRIu64 " tensor infos (%d bytes each at "
		               "least) in the remaining %" PRIu64 " bytes, found tensor count %" PRIu64,
		               rest / TENSOR_INFO_MIN_BYTES, TENSOR_INFO_MIN_BYTES, rest,
		               g->n_tensors);
	if (g->n_kv > rest / KV_MIN_BYTES)
		return fail_at(c, 16,
		               "expected at most %" PRIu64 " metadata keys (%d bytes each at "
		               "least) in the remaining %" PRIu64 " bytes, found key count %" PRIu64,
		               rest / KV_MIN_BYTES, KV_MIN_BYTES, rest, g->n_kv);
	if (g->n_tensors > Q4KH_GGUF_MAX_TENSORS)
		return fail_at(c, 8,
		               "expected at most %u tensors (q4khost's limit), found "
		               "tensor count %" PRIu64, Q4KH_GGUF_MAX_TENSORS, g->n_tensors);
	if (g->n_kv > Q4KH_GGUF_MAX_KEYS)
		return fail_at(c, 16,
		               "expected at most %u metadata keys (q4khost's limit), "
		               "found key count %" PRIu64, Q4KH_GGUF_MAX_KEYS, g->n_kv);
	return 0;
}

static int parse(struct cursor *c, struct q4kh_gguf *g)
{
	if (read_header(c, g))
		return -1;
	g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
	g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
	if (!g->kv || !g->tensors)
		return out_of_memory(c, g->n_kv + g->n_tensors, "keys and tensors");
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (read_kv(c, i, &g->kv[i]))
			return -1;
	c->subject[0] = 0;
	if (check_unique_keys(c, g) || read_alignment(c, g))
		return -1;
	return read_tensors(c, g);
}

static int map_file(struct q4kh_gguf *g, struct q4kh_error *err)
{
	struct stat st;
	int fd = open(g->path, O_RDONLY | O_CLOEXEC);
	void *m;

	if (fd < 0)
		return q4kh_fail(err, "%s: cannot open: %s", g->path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return q4kh_fail(err, "%s: cannot stat: %s", g->path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return q4kh_fail(err, "%s: expected a regular file, found %s", g->path,
		                 S_ISDIR(st.st_mode) ? "a directory" : "a special file");
	}
	g->size = (uint64_t)st.st_size;
	if (g->size > SIZE_MAX) {
		close(fd);
		return q4kh_fail(err, "%s: %" PRIu64 " bytes do not fit in memory",
		                 g->path, g->size);
	}
	if (g->size) {
		m = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			int e = errno;
			close(fd);
			return q4kh_fail(err, "%s: cannot map %" PRIu64 " bytes: %s",
			                 g->path, g->size, strerror(e));
		}
		g->map = m;
	}
	close(fd);
	return 0;
}

static unsigned opens; /* q4kh_gguf_opens */

unsigned q4kh_gguf_opens(void)
{
	return __atomic_load_n(&opens, __ATOMIC_RELAXED);
}

int q4kh_gguf_open(const char *path, struct q4kh_gguf **out,
                   struct q4kh_error *err)
{
	struct q4kh_gguf *g = calloc(1, sizeof(*g));
	struct cursor c = { .path = path, .err = err };

	__atomic_add_fetch(&opens, 1, __ATOMIC_RELAXED);
	*out = NULL;
	if (!g || !(g->path = strdup(path))) {
		free(g);
		return q4kh_fail(err, "%s: out of memory", path);
	}
	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	if (map_file(g, err)) {
		q4kh_gguf_close(g);
		return -1;
	}
	c.map = g->map;
	c.size = g->size;
	if (parse(&c, g)) {
		q4kh_gguf_close(g);
		return -1;
	}
	*out = g;
	return 0;
}

/* 1 when [p, p + size) lies in G's mapping. */
static int in_map(const struct q4kh_gguf *g, const void *p, uint64_t size)
{
	return g->map && (const uint8_t *)p >= g->map &&
	       (uint64_t)((const uint8_t *)p - g->map) <= g->size &&
	       size <= g->size - (uint64_t)((const uint8_t *)p - g->map);
}

void q4kh_gguf_drop_pages(const struct q4kh_gguf *g, const void *p, uint64_t size)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = ((uintptr_t)p + page - 1) / page * page;
	uintptr_t hi = ((uintptr_t)p + size) / page * page;

	if (!in_map(g, p, size) || hi <= lo)
		return;
	/* The mapping is private and never written: dropped pages read back
	 * from the file on their next access. */
	madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void q4kh_gguf_populate(const struct q4kh_gguf *g, const void *p, uint64_t size)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)p / page * page;

	if (!in_map(g, p, size) || !size)
		return;
#ifdef MADV_POPULATE_READ
	if (madvise((void *)lo, (uintptr_t)p + size - lo, MADV_POPULATE_READ) == 0)
		return;
#endif
	madvise((void *)lo, (uintptr_t)p + size - lo, MADV_WILLNEED);
}

void q4kh_gguf_close(struct q4kh_gguf *g)
{
	if (!g)
		return;
	if (g->map)
		munmap((void *)g->map, (size_t)g->size);
	free(g->kv);
	free(g->tensors);
	free(g->path);
	free(g);
}

const struct q4kh_gguf_kv *q4kh_gguf_find(const struct q4kh_gguf *g,
                                          const char *key)
{
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (str_eq(&g->kv[i].key, key))
			return &g->kv[i];
	return NULL;
}

const struct q4kh_gguf_tensor *q4kh_gguf_tensor(const struct q4kh_gguf *g,
                                                const char *name)
{
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (str_eq(&g->tensors[i].name, name))
			return &g->tensors[i];
	return NULL;
}

int q4kh_gguf_scalar_at(const struct q4kh_gguf_kv *kv, uint64_t i,
                        struct q4kh_gguf_scalar *out)
{
	uint32_t t = kv->type == Q4KH_GGUF_ARRAY ? kv->elem_type : kv->type;
	unsigned n = fixed_size(t);
	const uint8_t *p;
	uint64_t u;

	if (!n || i >= kv->count)
		return -1;
	p = kv->data + i * n;
	u = le_u(p, n);
	out->type = t;
	switch (t) {
	case Q4KH_GGUF_INT8:
		out->v.i = (int8_t)u;
		break;
	case Q4KH_GGUF_INT16:
		out->v.i = (int16_t)u;
		break;
	case Q4KH_GGUF_INT32:
		out->v.i = (int32_t)u;
		break;
	case Q4KH_GGUF_INT64:
		out->v.i = (int64_t)u;
		break;
	case Q4KH_GGUF_FLOAT32: {
		uint32_t b = (uint32_t)u;
		float f;
		memcpy(&f, &b, 4);
		out->v.f = f;
		break;
	}
	case Q4KH_GGUF_FLOAT64:
		memcpy(&out->v.f, &u, 8);
		break;
	default:
		out->v.u = u;
	}
	return 0;
}

static int is_signed(uint32_t t)
{
	return t == Q4KH_GGUF_INT8 || t == Q4KH_GGUF_INT16 ||
	       t == Q4KH_GGUF_INT32 || t == Q4KH_GGUF_INT64;
}

static int is_float(uint32_t t)
{
	return t == Q4KH_GGUF_FLOAT32 || t == Q4KH_GGUF_FLOAT64;
}

static int is_integer(uint32_t t)
{
	return fixed_size(t) && !is_float(t) && t != Q4KH_GGUF_BOOL;
}

/* "uint32 5", "float64 1e+300", "string", "array of int32": for messages. */
static void show_value(char *buf, size_t cap, const struct q4kh_gguf_kv *kv,
                       uint64_t i)
{
	struct q4kh_gguf_scalar s;

	if (q4kh_gguf_scalar_at(kv, i, &s))
		snprintf(buf, cap, "%s", q4kh_gguf_vtype_name(kv->type));
	else if (is_float(s.type))
		snprintf(buf, cap, "%s %.9g", q4kh_gguf_vtype_name(s.type), s.v.f);
	else if (is_signed(s.type))
		snprintf(buf, cap, "%s %" PRId64, q4kh_gguf_vtype_name(s.type), s.v.i);
	else
		snprintf(buf, cap, "%s %" PRIu64, q4kh_gguf_vtype_name(s.type), s.v.u);
}

static int kv_fail(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                   const char *expected, const char *found,
                   struct q4kh_error *err)
{
	char name[4 * NAME_SHOWN + 8];

	show_name(name, sizeof(name), (const uint8_t *)kv->key.data, kv->key.len);
	return q4kh_fail(err, "%s: offset %" PRIu64 ": key '%s': expected %s, found %s",
	                 g->path, kv->offset, name, expected, found);
}

/* KV's type (and value, for a scalar) does not fit the getter. */
static int type_fail(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                     const char *expected, struct q4kh_error *err)
{
	char found[96];

	if (kv->type == Q4KH_GGUF_ARRAY)
		snprintf(found, sizeof(found), "array of %s",
		         q4kh_gguf_vtype_name(kv->elem_type));
	else
		show_value(found, sizeof(found), kv, 0);
	return kv_fail(g, kv, expected, found, err);
}

/* Array element I of KV does not fit. */
static int elem_fail(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                     uint64_t i, const char *expected, struct q4kh_error *err)
{
	char value[96], found[128];

	show_value(value, sizeof(value), kv, i);
	snprintf(found, sizeof(found), "element %" PRIu64 " = %s", i, value);
	return kv_fail(g, kv, expected, found, err);
}

/* Integer element I of KV into [lo, hi]; -1 when not an integer or out of it. */
static int int_in(const struct q4kh_gguf_kv *kv, uint64_t i, int64_t lo,
                  uint64_t hi, int64_t *out)
{
	struct q4kh_gguf_scalar s;

	if (q4kh_gguf_scalar_at(kv, i, &s) || !is_integer(s.type))
		return -1;
	if (is_signed(s.type)) {
		if (s.v.i < lo || (s.v.i > 0 && (uint64_t)s.v.i > hi))
			return -1;
		*out = s.v.i;
		return 0;
	}
	if (s.v.u > hi)
		return -1;
	*out = (int64_t)s.v.u;
	return 0;
}

/* Number element I of KV as a float; -1 when not a number or out of range. */
static int float_at(const struct q4kh_gguf_kv *kv, uint64_t i, int ints,
                    float *out)
{
	struct q4kh_gguf_scalar s;

	if (q4kh_gguf_scalar_at(kv, i, &s))
		return -1;
	if (is_float(s.type)) {
		/* inf and NaN carry over; a finite double beyond float does not */
		if (isfinite(s.v.f) && (s.v.f > FLT_MAX || s.v.f < -FLT_MAX))
			return -1;
		*out = (float)s.v.f;
		return 0;
	}
	if (!ints || !is_integer(s.type))
		return -1;
	*out = is_signed(s.type) ? (float)s.v.i : (float)s.v.u;
	return 0;
}

int q4kh_gguf_get_u32(const struct q4kh_gguf *g, const char *key,
                      uint32_t *out, struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, key);
	int64_t v;

	if (!kv)
		return 1;
	if (kv->type == Q4KH_GGUF_ARRAY || int_in(kv, 0, 0, UINT32_MAX, &v))
		return type_fail(g, kv, "an integer that fits uint32", err);
	*out = (uint32_t)v;
	return 0;
}

int q4kh_gguf_get_f32(const struct q4kh_gguf *g, const char *key, float *out,
                      struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, key);

	if (!kv)
		return 1;
	if (kv->type == Q4KH_GGUF_ARRAY || float_at(kv, 0, 0, out))
		return type_fail(g, kv, "a float32 or float64 in float32 range", err);
	return 0;
}

int q4kh_gguf_get_bool(const struct q4kh_gguf *g, const char *key, int *out,
                       struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, key);

	if (!kv)
		return 1;
	if (kv->type != Q4KH_GGUF_BOOL || kv->data[0] > 1)
		return type_fail(g, kv, "a bool (0 or 1)", err);
	*out = kv->data[0];
	return 0;
}

int q4kh_gguf_get_str(const struct q4kh_gguf *g, const char *key,
                      struct q4kh_gguf_str *out, struct q4kh_error *err)
{
	const struct q4kh_gguf_kv *kv = q4kh_gguf_find(g, key);

	if (!kv)
		return 1;
	if (kv->type != Q4KH_GGUF_STRING)
		return type_fail(g, kv, "a string", err);
	out->len = le_u(kv->data, 8);
	out->data = (const char *)kv->data + 8;
	return 0;
}

int q4kh_gguf_array_strings(const struct q4kh_gguf *g,
                            const struct q4kh_gguf_kv *kv,
                            struct q4kh_gguf_str *out, struct q4kh_error *err)
{
	const uint8_t *p = kv->data;

	if (kv->type != Q4KH_GGUF_ARRAY || kv->elem_type != Q4KH_GGUF_STRING)
		return type_fail(g, kv, "an array of strings", err);
	/* open() walked these lengths against the file already */
	for (uint64_t i = 0; i < kv->count; i++) {
		out[i].len = le_u(p, 8);
		out[i].data = (const char *)p + 8;
		p += 8 + out[i].len;
	}
	return 0;
}

int q4kh_gguf_array_f32(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                        float *out, struct q4kh_error *err)
{
	if (kv->type != Q4KH_GGUF_ARRAY || !fixed_size(kv->elem_type) ||
	    kv->elem_type == Q4KH_GGUF_BOOL)
		return type_fail(g, kv, "an array of numbers", err);
	for (uint64_t i = 0; i < kv->count; i++)
		if (float_at(kv, i, 1, &out[i]))
			return elem_fail(g, kv, i, "numbers in float32 range", err);
	return 0;
}

int q4kh_gguf_array_i32(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                        int32_t *out, struct q4kh_error *err)
{
	int64_t v;

	if (kv->type != Q4KH_GGUF_ARRAY || !is_integer(kv->elem_type))
		return type_fail(g, kv, "an array of integers", err);
	for (uint64_t i = 0; i < kv->count; i++) {
		if (int_in(kv, i, INT32_MIN, INT32_MAX, &v))
			return elem_fail(g, kv, i, "integers that fit int32", err);
		out[i] = (int32_t)v;
	}
	return 0;
}

const char *q4kh_gguf_vtype_name(uint32_t type)
{
	static const char *const names[] = {
		"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
		"bool", "string", "array", "uint64", "int64", "float64",
	};

	return type < sizeof(names) / sizeof(names[0]) ? names[type] : "unknown";
}
