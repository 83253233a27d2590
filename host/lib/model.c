#include "model.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gguf_shared.h"
#include "kernel.h"
#include "tensor.h"
#include "weight_types.h"

#define DEFAULT_MODEL "gemma-3-270m-q4_k_m.gguf"

static const struct q4kh_arch *const archs[] = {
	&q4kh_arch_gemma3,
	&q4kh_arch_llama,
	&q4kh_arch_qwen2,
	&q4kh_arch_qwen3,
	&q4kh_arch_qwen35,
	&q4kh_arch_qwen3moe,
};

#define N_ARCHS (sizeof(archs) / sizeof(archs[0]))

/* Alignment of each weight inside the backend buffer (cache line, SIMD). */
#define WEIGHT_ALIGN 256

char *q4kh_default_model_path(char *buf, size_t cap)
{
	const char *env = q4kh_env("Q4KHOST_MODEL");
	char cache[4096];

	if (env && *env)
		snprintf(buf, cap, "%s", env);
	else
		snprintf(buf, cap, "%s/q4khost/models/%s", q4kh_cache_home(cache, sizeof(cache)),
		         DEFAULT_MODEL);
	return buf;
}

static const struct q4kh_arch *find_arch(const char *name, size_t len)
{
	for (size_t i = 0; i < N_ARCHS; i++)
		if (strlen(archs[i]->name) == len && !memcmp(archs[i]->name, name, len))
			return archs[i];
	return NULL;
}

int q4kh_model_open(const char *path, struct q4kh_model **out,
                    struct q4kh_error *err)
{
	struct q4kh_model *m = calloc(1, sizeof(*m));
	struct q4kh_gguf_str arch = { 0 };
	int rc;

	if (!m)
		return q4kh_fail(err, "%s: out of memory", path);
	if (q4kh_gguf_acquire(path, &m->gguf, err))
		goto fail;
	rc = q4kh_gguf_get_str(m->gguf, "general.architecture", &arch, err);
	if (rc < 0)
		goto fail;
	if (rc > 0) {
		q4kh_fail(err, "%s: no general.architecture key: not a model file",
		          path);
		goto fail;
	}
	m->arch = find_arch(arch.data, arch.len);
	if (!m->arch) {
		char names[256] = "", shown[272];
		for (size_t i = 0; i < N_ARCHS; i++)
			snprintf(names + strlen(names), sizeof(names) - strlen(names),
			         "%s%s", i ? ", " : "", archs[i]->name);
		q4kh_fail(err, "%s: general.architecture is \"%s\": not supported (supported: %s)",
		          path, q4kh_show(shown, sizeof(shown), arch.data, arch.len, 64, 0),
		          names);
		goto fail;
	}
	if (q4kh_weight_types_check(m->gguf, err) || m->arch->load(m, err))
		goto fail;
	*out = m;
	return 0;
fail:
	q4kh_model_free(m);
	return -1;
}

/* q4kh_model_bind and q4kh_model_bind3: weight NAME_FMT of shape {ne0, ne1, ne2}. */
static int bind_shape(struct q4kh_model *m, struct q4kh_weight *w, int required,
                      const int64_t ne[3], struct q4kh_error *err, const char *name_fmt,
                      va_list ap)
{
	char name[256], want[64];
	const struct q4kh_gguf_tensor *t;

	vsnprintf(name, sizeof(name), name_fmt, ap);
	t = q4kh_gguf_tensor(m->gguf, name);
	if (!t) {
		w->src = NULL;
		return required ? q4kh_fail(err, "%s: tensor %s is missing",
		                            m->gguf->path, name)
		                : 0;
	}
	if (ne[2] == 1)
		snprintf(want, sizeof(want), "{%lld, %lld}", (long long)ne[0], (long long)ne[1]);
	else
		snprintf(want, sizeof(want), "{%lld, %lld, %lld}", (long long)ne[0],
		         (long long)ne[1], (long long)ne[2]);
	if (t->ne[0] != ne[0] || t->ne[1] != ne[1] || t->ne[2] != ne[2] || t->ne[3] != 1)
		return q4kh_fail(err,
		                 "%s: tensor %s has shape {%lld, %lld, %lld, %lld}, expected %s",
		                 m->gguf->path, name, (long long)t->ne[0],
		                 (long long)t->ne[1], (long long)t->ne[2],
		                 (long long)t->ne[3], want);
	/* Norms and biases go to ops that take F32 alone (contract.h), as
	 * llama.cpp's converters write every vector. */
	if (t->type != Q4KH_TYPE_F32 && ne[1] == 1 && ne[2] == 1 && ne[0] > 1)
		return q4kh_fail(err, "%s: tensor %s is a vector of type %s, expected F32",
		                 m->gguf->path, name, q4kh_type_name(t->type));
	w->src = t;
	return 0;
}

int q4kh_model_bind(struct q4kh_model *m, struct q4kh_weight *w, int required,
                    int64_t ne0, int64_t ne1, struct q4kh_error *err,
                    const char *name_fmt, ...)
{
	const int64_t ne[3] = { ne0, ne1, 1 };
	va_list ap;
	int rc;

	va_start(ap, name_fmt);
	rc = bind_shape(m, w, required, ne, err, name_fmt, ap);
	va_end(ap);
	return rc;
}

int q4kh_model_bind3(struct q4kh_model *m, struct q4kh_weight *w, int64_t ne0, int64_t ne1,
                     int64_t ne2, struct q4kh_error *err, const char *name_fmt, ...)
{
	const int64_t ne[3] = { ne0, ne1, ne2 };
	va_list ap;
	int rc;

	va_start(ap, name_fmt);
	rc = bind_shape(m, w, 1, ne, err, name_fmt, ap);
	va_end(ap);
	return rc;
}

static void key_name(const struct q4kh_model *m, const char *fmt, char *buf,
                     size_t cap)
{
	snprintf(buf, cap, fmt, m->arch->name);
}

int q4kh_model_u32(const struct q4kh_model *m, const char *key_fmt,
                   uint32_t *out, int required, struct q4kh_error *err)
{
	char key[256];
	int rc;

	key_name(m, key_fmt, key, sizeof(key));
	rc = q4kh_gguf_get_u32(m->gguf, key, out, err);
	if (rc > 0 && required)
		return q4kh_fail(err, "%s: required key %s is missing", m->gguf->path,
		                 key);
	return rc < 0 ? -1 : 0;
}

int q4kh_model_f32(const struct q4kh_model *m, const char *key_fmt, float *out,
                   int required, struct q4kh_error *err)
{
	char key[256];
	int rc;

	key_name(m, key_fmt, key, sizeof(key));
	rc = q4kh_gguf_get_f32(m->gguf, key, out, err);
	if (rc > 0 && required)
		return q4kh_fail(err, "%s: required key %s is missing", m->gguf->path,
		                 key);
	return rc < 0 ? -1 : 0;
}

/* The first of M's attention hyper-parameters out of range, named by its
 * GGUF key with what was expected: -1 with ERR; 0 when all are in range. */
static int check_attn_hparams(const struct q4kh_model *m, struct q4kh_error *err)
{
	const struct q4kh_hparams *hp = &m->hp;
	const char *path = m->gguf->path, *a = m->arch->name;

	if (hp->n_embd == 0)
		return q4kh_fail(err, "%s: %s.embedding_length = 0: expected at least 1", path, a);
	if (hp->n_layer == 0 || hp->n_layer > 4096)
		return q4kh_fail(err, "%s: %s.block_count = %u: expected 1 to 4096", path, a,
		                 hp->n_layer);
	if (hp->n_ff == 0)
		return q4kh_fail(err, "%s: %s.feed_forward_length = 0: expected at least 1", path,
		                 a);
	if (hp->n_head == 0)
		return q4kh_fail(err, "%s: %s.attention.head_count = 0: expected at least 1", path,
		                 a);
	if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv)
		return q4kh_fail(err, "%s: %s.attention.head_count_kv = %u: expected a divisor of "
		                 "%s.attention.head_count %u",
		                 path, a, hp->n_head_kv, a, hp->n_head);
	if (!(hp->eps >= 0.0f))
		return q4kh_fail(err, "%s: %s.attention.layer_norm_rms_epsilon = %g: expected a "
		                 "number of at least 0",
		                 path, a, (double)hp->eps);
	return 0;
}

int q4kh_model_attn_hparams(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;
	uint32_t key_len, val_len;

	hp->n_ctx_train = 0;
	if (q4kh_model_u32(m, "%s.embedding_length", &hp->n_embd, 1, err) ||
	    q4kh_model_u32(m, "%s.block_count", &hp->n_layer, 1, err) ||
	    q4kh_model_u32(m, "%s.feed_forward_length", &hp->n_ff, 1, err) ||
	    q4kh_model_u32(m, "%s.attention.head_count", &hp->n_head, 1, err) ||
	    q4kh_model_u32(m, "%s.context_length", &hp->n_ctx_train, 0, err) ||
	    q4kh_model_f32(m, "%s.attention.layer_norm_rms_epsilon", &hp->eps, 1, err))
		return -1;
	hp->n_head_kv = hp->n_head;
	if (q4kh_model_u32(m, "%s.attention.head_count_kv", &hp->n_head_kv, 0, err))
		return -1;
	if (check_attn_hparams(m, err))
		return -1;
	key_len = hp->n_embd / hp->n_head;
	if (q4kh_model_u32(m, "%s.attention.key_length", &key_len, 0, err))
		return -1;
	val_len = key_len;
	if (q4kh_model_u32(m, "%s.attention.value_length", &val_len, 0, err))
		return -1;
	if (val_len != key_len || key_len == 0 || key_len % 2 || key_len > 1024)
		return q4kh_fail(err, "%s: %s.attention.key_length %u and value_length %u "
		                 "(where missing: embedding_length / head_count): expected equal, "
		                 "even and at most 1024",
		                 m->gguf->path, m->arch->name, key_len, val_len);
	hp->head_dim = key_len;
	hp->n_rot = key_len;
	if (q4kh_model_u32(m, "%s.rope.dimension_count", &hp->n_rot, 0, err))
		return -1;
	if (hp->n_rot == 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
		return q4kh_fail(err, "%s: %s.rope.dimension_count is %u: expected an even number from 2 to the head dimension %u",
		                 m->gguf->path, m->arch->name, hp->n_rot, hp->head_dim);
	hp->rope_ext_factor = 0.0f;
	hp->rope_attn_factor = 1.0f;
	hp->yarn_beta_fast = hp->yarn_beta_slow = 0.0f;
	hp->n_ctx_orig = hp->n_ctx_train;
	m->layers = calloc(hp->n_layer, sizeof(*m->layers));
	if (!m->layers)
		return q4kh_fail(err, "out of memory");
	return 0;
}

int q4kh_model_bind_io(struct q4kh_model *m, struct q4kh_error *err)
{
	struct q4kh_hparams *hp = &m->hp;
	const int64_t e = hp->n_embd;

	m->tok_embd.src = q4kh_gguf_tensor(m->gguf, "token_embd.weight");
	if (!m->tok_embd.src || m->tok_embd.src->ne[0] != e ||
	    m->tok_embd.src->ne[2] != 1)
		return q4kh_fail(err, "%s: token_embd.weight is missing or not {%lld, n_vocab}",
		                 m->gguf->path, (long long)e);
	/* Token ids are int32 everywhere (tokenizer, sampler, sessions). */
	if (m->tok_embd.src->ne[1] > INT32_MAX)
		return q4kh_fail(err, "%s: token_embd.weight has %lld rows: expected a vocabulary of at most %d tokens",
		                 m->gguf->path, (long long)m->tok_embd.src->ne[1], INT32_MAX);
	hp->n_vocab = (uint32_t)m->tok_embd.src->ne[1];
	if (q4kh_model_bind(m, &m->output_norm, 1, e, 1, err, "output_norm.weight") ||
	    q4kh_model_bind(m, &m->output, 0, e, hp->n_vocab, err, "output.weight"))
		return -1;
	if (!m->output.src)
		m->output = m->tok_embd; /* tied LM head */
	return 0;
}

/* The weights of a layer, as weight_list visits them. */
#define LAYER_WEIGHTS 29

/* Visit every bound weight (each once, though output may alias tok_embd). */
static size_t weight_list(struct q4kh_model *m, struct q4kh_weight **list)
{
	size_t n = 0;

	list[n++] = &m->tok_embd;
	list[n++] = &m->output_norm;
	if (m->output.src != m->tok_embd.src)
		list[n++] = &m->output;
	list[n++] = &m->rope_freqs;
	for (uint32_t il = 0; il < m->hp.n_layer; il++) {
		struct q4kh_layer *l = &m->layers[il];
		struct q4kh_weight *lw[LAYER_WEIGHTS] = {
			&l->attn_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->q_norm,
			&l->k_norm, &l->post_attn_norm, &l->ffn_norm, &l->w_gate,
			&l->w_up, &l->w_down, &l->post_ffw_norm, &l->bq, &l->bk,
			&l->bv, &l->ssm_in, &l->ssm_z, &l->ssm_conv, &l->ssm_alpha,
			&l->ssm_beta, &l->ssm_dt, &l->ssm_a, &l->ssm_norm,
			&l->ssm_out, &l->ffn_gate_inp, &l->ffn_gate_exps,
			&l->ffn_up_exps, &l->ffn_down_exps,
		};
		for (size_t i = 0; i < LAYER_WEIGHTS; i++)
			list[n++] = lw[i];
	}
	return n;
}

static size_t weight_slots(const struct q4kh_model *m)
{
	return 4 + LAYER_WEIGHTS * (size_t)m->hp.n_layer;
}

/* Matrices, not norm vectors: what session_matmul multiplies by; the
 * experts' stacks {K, N, E} too (mul_mat_id), whose types the backend
 * must multiply. */
static int is_matrix(const struct q4kh_weight *w)
{
	return w->src && w->src->ne[1] > 1 && !w->not_matrix;
}

/* A matrix a kernel variant may take: the variants' entries multiply by
 * one matrix {K, N}, so a stack of experts stays on the backend's
 * mul_mat_id. */
static int is_routable(const struct q4kh_weight *w)
{
	return is_matrix(w) && w->src->ne[2] == 1;
}

/* After a change to tok_embd, a tied LM head must see the same state. */
static void sync_tied_output(struct q4kh_model *m)
{
	if (m->output.src == m->tok_embd.src)
		m->output = m->tok_embd;
}

/* The weights a kernel variant takes while they are uploaded: those
 * of its TYPES (q4kh_model_upload_for); K NULL for none. */
struct route {
	const struct q4kh_kernel *k;
	const uint32_t *types;
	size_t n_types;
};

static int routed(const struct route *rt, const struct q4kh_weight *w)
{
	if (!rt->k || !is_routable(w) || w->kernel == rt->k)
		return 0;
	for (size_t i = 0; i < rt->n_types; i++)
		if (rt->types[i] == w->src->type)
			return 1;
	return 0;
}

/* Route W through K: prepare() it, release its previous kernel's copy. */
static int prepare_one(struct q4kh_model *m, struct q4kh_weight *w,
                       const struct q4kh_kernel *k, struct q4kh_error *err)
{
	q4kh_prepared *p = NULL;
	char what[320];

	snprintf(what, sizeof(what), "prepare (%.*s)", (int)w->src->name.len,
	         w->src->name.data);
	if (q4kh_kernel_check(k, k->v->prepare(k->ctx, &k->native, &w->t, &p), what, err))
		return -1;
	if (w->kernel)
		w->kernel->v->release(w->kernel->ctx, w->prepared);
	w->kernel = k;
	w->prepared = p;
	/* A variant that repacked the weight never reads the file's copy
	 * again; one that reads it in place faults it back in. */
	q4kh_gguf_drop_pages(m->gguf, w->src->data, w->src->size);
	return 0;
}

/*
 * Weights used in place: one buffer over the file's tensor data section,
 * each weight a view at its offset in it. Nothing is copied.
 */
static int wrap_weights(struct q4kh_model *m, struct q4kh_weight **list, size_t n,
                        struct q4kh_error *err)
{
	const struct q4kh_gguf *g = m->gguf;
	const uint8_t *base = g->map + g->data_offset;
	struct q4kh_backend *b = m->backend;

	if (q4kh_backend_check(b, b->v->buffer_wrap(b->dev, base, g->size - g->data_offset,
	                                            &m->weights),
	                       "buffer_wrap (weights in place)", err))
		return -1;
	/* what a copy would have read: now, not during the first step */
	q4kh_gguf_populate(g, base, g->size - g->data_offset);
	for (size_t i = 0; i < n; i++) {
		const struct q4kh_gguf_tensor *src = list[i]->src;

		if (src)
			list[i]->t = q4kh_tensor_make(m->weights, (uint64_t)((const uint8_t *)src->data - base),
			                              src->type, src->ne[0], src->ne[1], src->ne[2]);
	}
	return 0;
}

/*
 * Weights copied into one buffer of the backend's own memory, each routed
 * one prepared by RT's variant right after its upload (the backend's
 * stream orders the two), so that the variant's prepares and warm-up
 * overlap the rest of the upload.
 */
static int copy_weights(struct q4kh_model *m, struct q4kh_weight **list, size_t n,
                        const struct route *rt, struct q4kh_error *err)
{
	struct q4kh_backend *b = m->backend;
	uint64_t total = 0, off = 0;
	char what[400];

	for (size_t i = 0; i < n; i++)
		if (list[i]->src)
			total += (list[i]->src->size + WEIGHT_ALIGN - 1) & ~(uint64_t)(WEIGHT_ALIGN - 1);
	if (q4kh_backend_check(b, b->v->buffer_alloc(b->dev, total, &m->weights),
	                       "buffer_alloc (weights)", err))
		return -1;
	for (size_t i = 0; i < n; i++) {
		const struct q4kh_gguf_tensor *src = list[i]->src;
		if (!src)
			continue;
		list[i]->t = q4kh_tensor_make(m->weights, off, src->type, src->ne[0],
		                              src->ne[1], src->ne[2]);
		snprintf(what, sizeof(what), "buffer_upload (weight %.*s, %llu bytes at offset %llu of %s)",
		         (int)src->name.len, src->name.data, (unsigned long long)src->size,
		         (unsigned long long)((const uint8_t *)src->data - m->gguf->map),
		         m->gguf->path);
		if (q4kh_backend_check(b, b->v->buffer_upload(b->dev, m->weights, off,
		                                              src->data, src->size),
		                       what, err) ||
		    (routed(rt, list[i]) && prepare_one(m, list[i], rt->k, err)))
			return -1;
		off += (src->size + WEIGHT_ALIGN - 1) & ~(uint64_t)(WEIGHT_ALIGN - 1);
	}
	/* An upload may return before its copy lands (cuda's from pageable
	 * memory): a failed copy, or a variant's failed work on it, shows
	 * here, with the file's name. */
	snprintf(what, sizeof(what), "synchronize (the weights of %s)", m->gguf->path);
	if (q4kh_backend_check(b, b->v->synchronize(b->dev), what, err))
		return -1;
	/* the backend has its copy; the file's pages are not needed again */
	q4kh_gguf_drop_pages(m->gguf, m->gguf->map + m->gguf->data_offset,
	                     m->gguf->size - m->gguf->data_offset);
	return 0;
}

int q4kh_model_upload_for(struct q4kh_model *m, struct q4kh_backend *b,
                          const struct q4kh_kernel *k, const uint32_t *types,
                          size_t n_types, struct q4kh_error *err)
{
	struct q4kh_weight **list = calloc(weight_slots(m), sizeof(*list));
	const struct route rt = { k, types, n_types };
	size_t n;
	int rc;

	if (!list)
		return q4kh_fail(err, "out of memory");
	n = weight_list(m, list);
	m->backend = b;
	if (Q4KH_BACKEND_HAS(b->v, buffer_wrap) && m->gguf->alignment % 32 == 0) {
		rc = wrap_weights(m, list, n, err);
		for (size_t i = 0; i < n && rc == 0; i++)
			if (routed(&rt, list[i]))
				rc = prepare_one(m, list[i], k, err);
	} else {
		rc = copy_weights(m, list, n, &rt, err);
	}
	if (k)
		m->routes++;
	sync_tied_output(m);
	free(list);
	return rc;
}

int q4kh_model_upload(struct q4kh_model *m, struct q4kh_backend *b,
                      struct q4kh_error *err)
{
	return q4kh_model_upload_for(m, b, NULL, NULL, 0, err);
}

static void release_weights(struct q4kh_weight **list, size_t n,
                            const struct q4kh_kernel *only)
{
	for (size_t i = 0; i < n; i++) {
		struct q4kh_weight *w = list[i];
		if (!w->kernel || (only && w->kernel != only))
			continue;
		w->kernel->v->release(w->kernel->ctx, w->prepared);
		w->kernel = NULL;
		w->prepared = NULL;
	}
}

int q4kh_model_use_kernel(struct q4kh_model *m, const struct q4kh_kernel *k,
                          uint32_t type, struct q4kh_error *err)
{
	struct q4kh_weight **list = calloc(weight_slots(m), sizeof(*list));
	const struct route rt = { k, &type, 1 };
	size_t n;

	if (!list)
		return q4kh_fail(err, "out of memory");
	n = weight_list(m, list);

	for (size_t i = 0; i < n; i++)
		if (routed(&rt, list[i]) && prepare_one(m, list[i], k, err)) {
			release_weights(list, n, k);
			sync_tied_output(m);
			free(list);
			return -1;
		}
	sync_tied_output(m);
	free(list);
	m->routes++;
	return 0;
}

void q4kh_model_release_kernels(struct q4kh_model *m)
{
	struct q4kh_weight **list = calloc(weight_slots(m), sizeof(*list));

	if (!list)
		return;
	m->routes++;
	release_weights(list, weight_list(m, list), NULL);
	sync_tied_output(m);
	free(list);
}

size_t q4kh_model_matrix_types(const struct q4kh_model *m, uint32_t *types,
                               size_t cap)
{
	struct q4kh_weight **list = calloc(weight_slots(m), sizeof(*list));
	size_t n, nt = 0;

	if (!list)
		return 0;
	n = weight_list((struct q4kh_model *)m, list);
	for (size_t i = 0; i < n; i++) {
		size_t j;
		if (!is_matrix(list[i]))
			continue;
		for (j = 0; j < nt && types[j] != list[i]->src->type; j++)
			;
		if (j == nt && nt < cap)
			types[nt++] = list[i]->src->type;
	}
	free(list);
	return nt;
}

const struct q4kh_kernel *q4kh_model_kernel_for(const struct q4kh_model *m,
                                                uint32_t type)
{
	struct q4kh_weight **list = calloc(weight_slots(m), sizeof(*list));
	const struct q4kh_kernel *k = NULL;
	size_t n;

	if (!list)
		return NULL;
	n = weight_list((struct q4kh_model *)m, list);
	for (size_t i = 0; i < n && !k; i++)
		if (is_routable(list[i]) && list[i]->src->type == type)
			k = list[i]->kernel;
	free(list);
	return k;
}

void q4kh_model_free(struct q4kh_model *m)
{
	if (!m)
		return;
	if (m->layers)
		q4kh_model_release_kernels(m);
	if (m->weights)
		m->backend->v->buffer_free(m->backend->dev, m->weights);
	free(m->layers);
	q4kh_gguf_release(m->gguf);
	free(m);
}

int q4kh_model_types_at(const char *path, uint32_t *types, size_t cap, size_t *n,
                        struct q4kh_error *err)
{
	struct q4kh_model *m;

	*n = 0;
	if (q4kh_model_open(path, &m, err))
		return -1;
	*n = q4kh_model_matrix_types(m, types, cap);
	q4kh_model_free(m);
	return 0;
}
