/*
 * An inference session: a model on a backend device with its KV cache and
 * scratch activations. Prefill and decode are the same call: eval() appends
 * n tokens at the current position, in batches of at most n_batch, and
 * returns the logits asked for. A session is used from one thread at a
 * time.
 */
#ifndef Q4KH_SESSION_H
#define Q4KH_SESSION_H

#include <stdint.h>

#include "error.h"
#include "model.h"

struct q4kh_session_params {
	uint32_t n_ctx;   /* KV cache length in tokens (0: min(4096, trained)) */
	uint32_t n_batch; /* tokens per forward (0: 64) */
	uint32_t kv_type; /* Q4KH_TYPE_F32 or Q4KH_TYPE_F16 */
};

struct q4kh_session {
	struct q4kh_model *m;
	struct q4kh_backend *b;
	struct q4kh_session_params p;
	int64_t n_past; /* tokens in the KV cache */
	q4kh_buffer *kv, *scratch;
	struct q4kh_tensor *k_cache, *v_cache; /* per layer {head_dim, n_kv, n_ctx} */
	/* Activations, n_batch columns each. */
	struct q4kh_tensor x, h, q, k, v, o, a, g, u, logits;
	int32_t *pos; /* positions of the batch being run */
};

/* Allocate cache and scratch on the model's backend (model uploaded). */
int q4kh_session_new(struct q4kh_model *m, const struct q4kh_session_params *p,
                     struct q4kh_session **out, struct q4kh_error *err);
void q4kh_session_free(struct q4kh_session *s);
/* Forget every cached token (the cache memory is reused). */
void q4kh_session_reset(struct q4kh_session *s);

/*
 * Run ids[0..n) at positions n_past..n_past+n-1. logits (host memory, may be
 * NULL): with all set, n rows of n_vocab floats (row i for token i);
 * otherwise one row for the last token. -1 with err on an id outside the
 * vocabulary, a full context, or a backend failure (the cache is then left
 * as it was before the call).
 */
int q4kh_session_eval(struct q4kh_session *s, const int32_t *ids, int64_t n,
                      float *logits, int all, struct q4kh_error *err);

/*
 * y = w x through w's kernel variant when it has one (gemv for at most
 * max_gemv_columns columns, gemm beyond), else the backend's built-in.
 */
int q4kh_session_matmul(struct q4kh_session *s, const struct q4kh_weight *w,
                        const struct q4kh_tensor *x, const struct q4kh_tensor *y,
                        struct q4kh_error *err);

#endif
