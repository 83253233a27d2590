/*
 * GGUF reader (format spec: ggml-org/ggml docs/gguf.md), versions 2 and 3.
 *
 * The file is mmap()ed read-only. Every count, string length, offset, size,
 * alignment and tensor extent is checked against the file with 64-bit,
 * overflow-checked arithmetic before use; a bad file gives one error line
 * naming the file, the byte offset, what was expected and what was found.
 * Strings and tensor data point into the mapping and stay valid until
 * q4kh_gguf_close(). A struct q4kh_gguf is read-only after open and may be
 * shared between threads.
 *
 * Limits, each checked before anything is allocated for what it bounds:
 *  - tensor and key counts: each entry has a smallest encoding (32 and 13
 *    bytes), so a count must fit the bytes left in the file; and at most
 *    Q4KH_GGUF_MAX_TENSORS and Q4KH_GGUF_MAX_KEYS (2^20 each), since each
 *    entry costs about 100 bytes of memory before it is read: a million
 *    is hundreds of times what any published model holds (a few thousand
 *    tensors, a few dozen keys), while a corrupt count could ask for
 *    gigabytes;
 *  - a string (key, value, array element, tensor name) must fit the bytes
 *    left; key names are at most 65535 bytes and tensor names at most 64
 *    (the GGUF spec's limits, which ggml enforces when it writes);
 *  - an array's length times its element's smallest size must fit the
 *    bytes left; arrays nest at most two deep (an array of arrays);
 *  - a tensor has 1 to 4 dimensions, each from 1 to 2^63-1; their product
 *    (elements) and its byte size must not overflow 64 bits, and its data
 *    must lie inside the file. Offsets are 64-bit: files over 4 GiB work.
 * Readers of the metadata bound what they allocate from it themselves
 * (the tokenizer: at most INT32_MAX tokens; the model: n_vocab, the
 * token embedding's rows, at most INT32_MAX).
 */
#ifndef Q4KH_GGUF_H
#define Q4KH_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

enum q4kh_gguf_vtype {
	Q4KH_GGUF_UINT8 = 0,
	Q4KH_GGUF_INT8 = 1,
	Q4KH_GGUF_UINT16 = 2,
	Q4KH_GGUF_INT16 = 3,
	Q4KH_GGUF_UINT32 = 4,
	Q4KH_GGUF_INT32 = 5,
	Q4KH_GGUF_FLOAT32 = 6,
	Q4KH_GGUF_BOOL = 7,
	Q4KH_GGUF_STRING = 8,
	Q4KH_GGUF_ARRAY = 9,
	Q4KH_GGUF_UINT64 = 10,
	Q4KH_GGUF_INT64 = 11,
	Q4KH_GGUF_FLOAT64 = 12
};

/* A string inside the mapping: not NUL-terminated. */
struct q4kh_gguf_str {
	uint64_t len;
	const char *data;
};

#define Q4KH_GGUF_MAX_TENSORS (1u << 20)
#define Q4KH_GGUF_MAX_KEYS (1u << 20)
#define Q4KH_GGUF_MAX_KEY_LEN 65535
#define Q4KH_GGUF_MAX_TENSOR_NAME 64

struct q4kh_gguf_kv {
	struct q4kh_gguf_str key;
	uint32_t type;      /* enum q4kh_gguf_vtype */
	uint32_t elem_type; /* element type when type is ARRAY */
	uint64_t count;     /* elements when type is ARRAY, else 1 */
	uint64_t offset;    /* file offset of the value (array: first element) */
	const uint8_t *data; /* the value's bytes in the mapping (unaligned) */
};

struct q4kh_gguf_tensor {
	struct q4kh_gguf_str name;
	uint32_t n_dims;
	uint32_t type;     /* enum q4kh_type */
	int64_t ne[4];     /* ggml order, unused dims 1 */
	uint64_t offset;   /* file offset of the data */
	uint64_t size;     /* bytes */
	const void *data;  /* in the mapping */
};

struct q4kh_gguf {
	char *path;
	const uint8_t *map;
	uint64_t size;
	uint32_t version;
	uint64_t alignment;
	uint64_t data_offset; /* file offset of the tensor data section */
	uint64_t n_kv;
	struct q4kh_gguf_kv *kv;
	uint64_t n_tensors;
	struct q4kh_gguf_tensor *tensors;
};

/*
 * Map and validate PATH. On success *out owns the mapping; free it with
 * q4kh_gguf_close(). On error returns -1 with err set, e.g.
 * "model.gguf: offset 8: expected at most 31 tensor infos (32 bytes each at
 * least) in the remaining 1000 bytes, found tensor count 9223372036854775807".
 */
int q4kh_gguf_open(const char *path, struct q4kh_gguf **out,
                   struct q4kh_error *err);
void q4kh_gguf_close(struct q4kh_gguf *g);
/* How many times this process called q4kh_gguf_open (each opens and maps
 * a file): for run --json's "host" and the tests that hold a command to
 * one open of its model. Thread-safe. */
unsigned q4kh_gguf_opens(void);

/*
 * Give back the memory of the whole pages of G's mapping inside
 * [p, p + size): their bytes stay readable (read again from the file when
 * next touched), but no longer count as this process's resident memory.
 * For data that has been copied elsewhere. Ranges outside the mapping are
 * ignored.
 */
void q4kh_gguf_drop_pages(const struct q4kh_gguf *g, const void *p, uint64_t size);

/*
 * Map the pages of G's mapping inside [p, p + size) now, read from the
 * file or the page cache (MADV_POPULATE_READ; where the system has none,
 * asked to be read ahead): for data a backend computes from in place, so
 * that its first step does not fault them in page by page. As llama.cpp
 * maps a model with MAP_POPULATE. Ranges outside the mapping are ignored;
 * a failure is no error (the pages fault in on first use).
 */
void q4kh_gguf_populate(const struct q4kh_gguf *g, const void *p, uint64_t size);

/* The key/value pair named KEY, or NULL. */
const struct q4kh_gguf_kv *q4kh_gguf_find(const struct q4kh_gguf *g,
                                          const char *key);
/* The tensor named NAME, or NULL. */
const struct q4kh_gguf_tensor *q4kh_gguf_tensor(const struct q4kh_gguf *g,
                                                const char *name);

/*
 * Typed getters. Return 0 and set *out; return 1 when the key is absent
 * (leaving *out untouched, so callers can pre-set defaults); return -1 with
 * err naming file, key and the type found when the key has an unusable type
 * or value (an integer that does not fit, a negative count).
 */
int q4kh_gguf_get_u32(const struct q4kh_gguf *g, const char *key,
                      uint32_t *out, struct q4kh_error *err);
int q4kh_gguf_get_f32(const struct q4kh_gguf *g, const char *key, float *out,
                      struct q4kh_error *err);
int q4kh_gguf_get_bool(const struct q4kh_gguf *g, const char *key, int *out,
                       struct q4kh_error *err);
int q4kh_gguf_get_str(const struct q4kh_gguf *g, const char *key,
                      struct q4kh_gguf_str *out, struct q4kh_error *err);

/*
 * Array access for KV of type ARRAY. q4kh_gguf_array_strings fills out[i]
 * for every element of a string array (out has kv->count entries).
 * q4kh_gguf_array_f32 / _i32 convert numeric elements (any numeric element
 * type that fits) into out. Return -1 with err on a type mismatch.
 */
int q4kh_gguf_array_strings(const struct q4kh_gguf *g,
                            const struct q4kh_gguf_kv *kv,
                            struct q4kh_gguf_str *out, struct q4kh_error *err);
int q4kh_gguf_array_f32(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                        float *out, struct q4kh_error *err);
int q4kh_gguf_array_i32(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                        int32_t *out, struct q4kh_error *err);

/* A number or bool widened; the member to read follows type. */
struct q4kh_gguf_scalar {
	uint32_t type; /* enum q4kh_gguf_vtype: never STRING or ARRAY */
	union {
		uint64_t u; /* UINT8..UINT64 and BOOL */
		int64_t i;  /* INT8..INT64 */
		double f;   /* FLOAT32, FLOAT64 */
	} v;
};

/*
 * Element I of KV's value, exactly: I is 0 for a scalar KV, below kv->count
 * for an array of numbers or bools. Returns 0, or -1 (no message) for a
 * string, an array of strings or arrays, or I out of range. For printing
 * values of any type (q4khost info) without a getter per type.
 */
int q4kh_gguf_scalar_at(const struct q4kh_gguf_kv *kv, uint64_t i,
                        struct q4kh_gguf_scalar *out);

/* Name of a value type ("uint32", "array"), for messages. */
const char *q4kh_gguf_vtype_name(uint32_t type);

#endif
