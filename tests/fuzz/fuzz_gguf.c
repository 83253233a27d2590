/*
 * Fuzz target: the GGUF reader and what the host reads from a model file.
 * The input is the whole file, opened through the normal API from a memory
 * file: every key and array element through the typed getters, every
 * tensor's first and last data byte, then the model loader (architecture
 * hyper-parameters and weight binding), the tokenizer and the chat format
 * it detects, as `q4khost run` does before any backend is involved.
 */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

/* Elements of one array read through q4kh_gguf_scalar_at: enough to meet
 * every element type, few enough for a fast run. */
#define SCALARS_READ 64

static volatile uint8_t sink;

static void walk_array(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv)
{
	struct q4kh_error err;
	size_t n = (size_t)kv->count;
	void *buf;

	if (kv->elem_type == Q4KH_GGUF_STRING) {
		struct q4kh_gguf_str *s = malloc((n ? n : 1) * sizeof(*s));
		if (!s)
			return;
		if (q4kh_gguf_array_strings(g, kv, s, &err))
			fuzz_violation("array_strings refused an array of strings: %s",
			               err.msg);
		for (size_t i = 0; i < n; i++)
			if (s[i].len)
				sink ^= (uint8_t)(s[i].data[0] ^ s[i].data[s[i].len - 1]);
		free(s);
		return;
	}
	buf = malloc((n ? n : 1) * 4);
	if (!buf)
		return;
	if (q4kh_gguf_array_f32(g, kv, buf, &err))
		fuzz_check_error(&err, "q4kh_gguf_array_f32");
	if (q4kh_gguf_array_i32(g, kv, buf, &err))
		fuzz_check_error(&err, "q4kh_gguf_array_i32");
	free(buf);
}

static void walk_kv(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv)
{
	struct q4kh_gguf_scalar s;
	struct q4kh_gguf_str str;
	struct q4kh_error err;
	char *key = strndup(kv->key.data, (size_t)kv->key.len);
	uint32_t u;
	float f;
	int b, rc;

	if (!key)
		return;
	for (uint64_t i = 0; i < kv->count && i < SCALARS_READ; i++)
		q4kh_gguf_scalar_at(kv, i, &s);
	if (kv->count > 0)
		q4kh_gguf_scalar_at(kv, kv->count - 1, &s);
	/* A key with a NUL byte cannot be looked up by a C string. */
	if (strlen(key) == kv->key.len && q4kh_gguf_find(g, key) == NULL)
		fuzz_violation("key '%s' is listed but not found", key);
	if (q4kh_gguf_get_u32(g, key, &u, &err) < 0)
		fuzz_check_error(&err, "q4kh_gguf_get_u32");
	if (q4kh_gguf_get_f32(g, key, &f, &err) < 0)
		fuzz_check_error(&err, "q4kh_gguf_get_f32");
	if (q4kh_gguf_get_bool(g, key, &b, &err) < 0)
		fuzz_check_error(&err, "q4kh_gguf_get_bool");
	rc = q4kh_gguf_get_str(g, key, &str, &err);
	if (rc < 0)
		fuzz_check_error(&err, "q4kh_gguf_get_str");
	else if (rc == 0 && str.len)
		sink ^= (uint8_t)str.data[str.len - 1];
	if (kv->type == Q4KH_GGUF_ARRAY)
		walk_array(g, kv);
	sink ^= (uint8_t)q4kh_gguf_vtype_name(kv->type)[0];
	free(key);
}

static void walk_file(const struct q4kh_gguf *g)
{
	for (uint64_t i = 0; i < g->n_kv; i++)
		walk_kv(g, &g->kv[i]);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct q4kh_gguf_tensor *t = &g->tensors[i];
		const uint8_t *d = t->data;
		if (t->offset + t->size > g->size)
			fuzz_violation("tensor %llu ends past the file",
			               (unsigned long long)i);
		if (t->size)
			sink ^= d[0] ^ d[t->size - 1];
	}
}

static void walk_tokenizer(const struct q4kh_gguf *g)
{
	static const char text[] = "Hello, world! <start_of_turn>user\n"
	                           "\xe2\x96\x81 \xff\xfe 12345 \xf0\x9f\x98\x80";
	struct q4kh_tokenizer *t;
	struct q4kh_error err;
	int32_t *ids;
	size_t n;
	char piece[64];

	if (q4kh_tokenizer_load(g, &t, &err)) {
		fuzz_check_error(&err, "q4kh_tokenizer_load");
		return;
	}
	for (int special = 0; special <= 1; special++) {
		if (q4kh_tokenize(t, text, sizeof(text) - 1, 1, special, &ids, &n, &err)) {
			fuzz_check_error(&err, "q4kh_tokenize");
			continue;
		}
		for (size_t i = 0; i < n; i++) {
			if (ids[i] < 0 || ids[i] >= q4kh_tokenizer_n_vocab(t))
				fuzz_violation("token id %d outside the vocabulary of %d",
				               ids[i], q4kh_tokenizer_n_vocab(t));
			q4kh_token_to_piece(t, ids[i], special, piece, sizeof(piece));
		}
		free(ids);
	}
	q4kh_tokenizer_is_eog(t, q4kh_tokenizer_eos(t));
	q4kh_tokenizer_free(t);
}

static void walk_model(const char *path)
{
	struct q4kh_model *m;
	struct q4kh_error err;
	uint32_t types[Q4KH_TYPE_COUNT];
	char *prompt;

	if (q4kh_model_open(path, &m, &err)) {
		fuzz_check_error(&err, "q4kh_model_open");
		return;
	}
	q4kh_model_matrix_types(m, types, Q4KH_TYPE_COUNT);
	walk_tokenizer(m->gguf);
	prompt = q4kh_chat_apply(q4kh_chat_detect(m->gguf), "Hi");
	free(prompt);
	q4kh_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[32];
	int fd = fuzz_memfd(data, size, path);
	struct q4kh_gguf *g;
	struct q4kh_error err;

	if (q4kh_gguf_open(path, &g, &err) == 0) {
		walk_file(g);
		q4kh_gguf_close(g);
		walk_model(path);
	} else {
		fuzz_check_error(&err, "q4kh_gguf_open");
	}
	close(fd);
	return 0;
}
