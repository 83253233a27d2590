/*
 * An inference session: a model on a backend device with its memory of the
 * sequence (a KV cache per attention layer; per linear-attention layer a
 * convolution state and a recurrent state), the step graphs its
 * architecture describes, and the memory they run in. Prefill and decode
 * are the same call: eval() appends n tokens at the current position, in
 * steps of at most n_batch tokens, and returns the logits asked for.
 *
 * Each step runs the graph of its shape class (tokens, logits wanted),
 * built once and kept (graph.h): the host writes the step's ids and
 * positions with one upload, runs the graph, and reads the logits with
 * one download. On a backend that can replay (graph_run.h), a shape met a
 * second time is recorded and every later step of that shape is one
 * replay. A session is used from one thread at a time.
 *
 * Several sessions of one model and backend can decode one token each in
 * one step (q4kh_session_eval_batch): the products read each weight once
 * for all of them (a kernel variant's multi-column gemv), while each
 * sequence writes and attends over its own session's KV cache at its own
 * position. Models with recurrent layers (qwen35) keep one sequence per
 * step: their states hold one sequence.
 */
#ifndef Q4KH_SESSION_H
#define Q4KH_SESSION_H

#include <stdint.h>

#include "error.h"
#include "kv_pool.h"
#include "model.h"

struct q4kh_kv_paged;

/* The KV cache's type. */
enum q4kh_kv_choice {
	/* F32 on the reference cpu backend, which is exact; F16 (llama.cpp's
	 * cache) on every other backend, whose attention then reads half the
	 * bytes per token of context. */
	Q4KH_KV_DEFAULT = 0,
	Q4KH_KV_F32,
	Q4KH_KV_F16
};

/* The type of a KV cache of choice KV on backend B: Q4KH_TYPE_F32 or
 * Q4KH_TYPE_F16 (Q4KH_KV_DEFAULT as its comment says). */
uint32_t q4kh_session_kv_type(enum q4kh_kv_choice kv, const struct q4kh_backend *b);

/* The context in tokens of a session of M opened with n_ctx N: N, or for
 * 0 the default, the smaller of 4096 and M's trained context (4096 when
 * the file gives none). */
uint32_t q4kh_session_ctx(const struct q4kh_model *m, uint32_t n);

struct q4kh_session_params {
	uint32_t n_ctx;   /* KV cache length in tokens (0: min(4096, trained)) */
	/* tokens per step, the chunks of a long prompt (0: 512 on a GPU,
	 * where a chunk's products run on tensor cores and each weight is
	 * dequantised once per chunk; 128 on the backends of kind "cpu" other
	 * than the reference, where a weight row decoded for a chunk then
	 * serves twice the columns; else 256: the reference dequantises a
	 * weight row into double once per step, which costs about what 64
	 * columns of its products do) */
	uint32_t n_batch;
	enum q4kh_kv_choice kv;
	/* A paged KV cache shared with other sessions of the model
	 * (kv_paged.h; kv is then ignored: the pools' type), or NULL for a
	 * contiguous cache of the session's own. Its steps write and attend
	 * through the session's block table (ABI 1.8, attention_paged). */
	struct q4kh_kv_paged *paged;
};

/*
 * The paths a step can take: the host's own (its interpreter, or its
 * recording of the interpreter's calls replayed, ABI 1.1), or the
 * backend's graph entry (ABI 1.6), which says how it ran the step.
 */
enum q4kh_step_way {
	Q4KH_WAY_OP_BY_OP,         /* the host's interpreter (graph_run.h) */
	Q4KH_WAY_REPLAY,           /* the host's recording, replayed */
	Q4KH_WAY_GRAPH_NODES,      /* graph entry: the backend's own walk */
	Q4KH_WAY_GRAPH_REPLAY,     /* graph entry: the backend's recording */
	Q4KH_WAY_GRAPH_PERSISTENT, /* graph entry: a persistent kernel */
	Q4KH_WAY_COUNT
};

/* How the steps of a session ran, for the report. */
struct q4kh_session_stats {
	uint64_t steps;    /* steps run */
	uint64_t replayed; /* of them, replays of a host recording */
	uint64_t recorded; /* host recordings made */
	uint64_t ways[Q4KH_WAY_COUNT]; /* steps by the path they took */
	enum q4kh_step_way last;       /* the last step's path */
	uint32_t launches; /* the last graph-entry step's launches (0 unknown) */
	int entry;         /* the backend takes whole steps (graph_entry.h) */
	int replay;        /* the host can replay on it (graph_run.h) */
	int record_failed; /* a recording failed: those shapes run op by op */
	uint32_t kv_type;  /* the KV cache's: Q4KH_TYPE_F32 or Q4KH_TYPE_F16 */
	char why_not[256]; /* why steps were not whole on the backend or not
	                      replays, when they were not */
};

/* "graph entry (replay)", "op by op": a path in the report's words. */
const char *q4kh_step_way_name(enum q4kh_step_way w);
/* "graph_replay", "op_by_op": the same as run --json's token. */
const char *q4kh_step_way_token(enum q4kh_step_way w);

struct q4kh_session_graph; /* one cached step graph (session.c) */

struct q4kh_session {
	uint64_t id; /* unique in the process: keys batched steps' graphs over
	              * contiguous caches (over pages, a shape does) */
	struct q4kh_model *m;
	struct q4kh_backend *b;
	struct q4kh_session_params p;
	int64_t n_past; /* tokens in the KV cache */
	q4kh_buffer *kv, *scratch, *step;
	uint64_t scratch_bytes;
	/* Per attention layer {head_dim, n_kv, n_ctx}, unset for the others;
	 * with p.paged, the pools {head_dim, n_kv, slots} */
	struct q4kh_tensor *k_cache, *v_cache;
	/* with p.paged: the pages of its n_past tokens, and the table's
	 * length in a step's inputs (the pages n_ctx tokens take) */
	struct q4kh_kv_table table;
	int32_t n_table;
	/* Per linear-attention layer, unset for the others: the convolution's
	 * kept inputs {K-1, channels} and the delta rule's state {S, S,
	 * value heads} (plugin.h), f32, in rs, rewritten by every step. */
	struct q4kh_tensor *conv_state, *ssm_state;
	q4kh_buffer *rs;
	uint64_t rs_bytes;
	int rs_stale; /* the states are not those of n_past: zero them first */
	/* q4kh_session_eval_top2: on a backend with top2, the pick of the
	 * last token ({idx, best, second}, 12 bytes), made on first use;
	 * else a host copy of its logits */
	q4kh_buffer *pick;
	float *pick_logits;
	struct q4kh_session_graph *graphs;     /* cached step graphs */
	uint64_t routes; /* m->routes when they were last exported */
	int32_t *values;                       /* host copy of ids, then pos */
	struct q4kh_session_stats stats;
};

/*
 * Allocate caches, states, step inputs and scratch on the model's backend
 * (model uploaded), and build the one-token step: -1 with err when the
 * backend lacks an entry the model's ops need ("backend cuda cannot run
 * qwen35: it has no delta_net"), before any step runs. With p->paged the
 * session's keys and values go to those pools (of this model: else -1),
 * page by page as its tokens come; an eval for which the pool has no free
 * page fails as a full context does ("KV pool full: ..."), nothing
 * changed, and the session's pages go back when it is reset or freed.
 */
int q4kh_session_new(struct q4kh_model *m, const struct q4kh_session_params *p,
                     struct q4kh_session **out, struct q4kh_error *err);
/*
 * What a first eval of N tokens (q4kh_session_eval, eval_top2: its logits
 * or pick of the last token) would do once before computing, done now:
 * the step graphs of its chunks (n_batch tokens, then the last chunk's
 * with its logits) built, planned and bound, the scratch they need
 * reserved, and on a backend with the graph entry (ABI 1.6) each
 * prepared. A start-up step, so that the prompt's own time is its
 * compute (docs/architecture.md section 7, "Start-up"). -1 with err as
 * eval would fail on the same graphs.
 */
int q4kh_session_prepare(struct q4kh_session *s, int64_t n, struct q4kh_error *err);
void q4kh_session_free(struct q4kh_session *s);
/* Forget every cached token (the memory is reused; states are zeroed
 * before the next step). */
void q4kh_session_reset(struct q4kh_session *s);

/*
 * Make DST's KV cache hold the first N tokens of SRC's (N at most
 * src->n_past), as if DST had evaluated them: rows [FROM, N) of every
 * attention layer's keys and values are copied on the device with the
 * backend's copy, the same bits (the caller vouches that rows [0, FROM)
 * of DST already hold the same tokens' keys and values); with DST == SRC
 * nothing is copied, and the tokens past N are forgotten. DST's n_past
 * becomes N. With a paged cache (both on the same pools), nothing is
 * copied: DST's table maps SRC's pages of those tokens, each copied only
 * when one of the two later writes into it (kv_pool.h). Prefix reuse
 * across requests (docs/serve.md, section 5):
 * the keys and values of a token depend only on the tokens up to it, so
 * a request whose prompt starts with tokens another session computed
 * reads them from there. Both sessions on one model and backend with one
 * KV type, on a model without recurrent layers (q4kh_session_batchable:
 * a state holds no prefix). -1 with err otherwise, or on a backend
 * failure, after which DST is empty (n_past 0). Not thread-safe with
 * steps of either session.
 */
int q4kh_session_take_prefix(struct q4kh_session *dst, const struct q4kh_session *src,
                              int64_t from, int64_t n, struct q4kh_error *err);

/*
 * Run ids[0..n) at positions n_past..n_past+n-1. logits (host memory, may be
 * NULL): with all set, n rows of n_vocab floats (row i for token i);
 * otherwise one row for the last token. -1 with err on an id outside the
 * vocabulary or a full context (nothing changes), or on a backend failure:
 * the KV cache is then left as it was before the call, but states, which
 * cannot be rewound, are lost, so a model with linear-attention layers is
 * reset (n_past 0).
 */
int q4kh_session_eval(struct q4kh_session *s, const int32_t *ids, int64_t n,
                      float *logits, int all, struct q4kh_error *err);

/*
 * q4kh_session_eval, with the logits of the tokens flagged in ROWS (n
 * flags) only: LOGITS gets one row of n_vocab floats per flagged token, in
 * order (room for as many rows as flags). With ONLY, a step runs every
 * layer on all its tokens and the output norm and projection on its
 * flagged ones alone (a step graph per pattern of flags): F2's reference,
 * whose rows are the same bits either way. Without, a step with a flagged
 * token computes every one of its rows, as with all, as a candidate's
 * long prompt does. A step without a flag computes none. Errors as
 * q4kh_session_eval's.
 */
int q4kh_session_eval_rows(struct q4kh_session *s, const int32_t *ids, int64_t n,
                           float *logits, const uint8_t *rows, int only,
                           struct q4kh_error *err);

/*
 * q4kh_session_eval, and of the last token's logits only the greedy pick:
 * *token the index of the largest finite logit (lowest on ties; -1 when
 * none is finite) and *margin (unless MARGIN is NULL) its lead over the
 * runner-up (q4kh_top2_margin). On a backend with the top2 entry (ABI 1.4) the pick is
 * made on the device and 12 bytes are read instead of the logits;
 * otherwise the logits are read and picked by q4kh_top2. The same
 * result either way; errors as q4kh_session_eval's.
 */
int q4kh_session_eval_top2(struct q4kh_session *s, const int32_t *ids, int64_t n,
                           int32_t *token, double *margin, struct q4kh_error *err);

/* One sequence of a batched step. */
struct q4kh_batch_seq {
	struct q4kh_session *s; /* its session, which holds its KV cache */
	int32_t id;             /* the token it appends, at s->n_past */
	float *logits; /* n_vocab floats for the token's logits; NULL: its
	                  greedy pick into token instead */
	int32_t token; /* out, when logits is NULL: q4kh_session_eval_top2's
	                  pick (-1 when no logit is finite) */
	/* A prompt's chunk instead of id (a mixed step): n_ids > 0 tokens
	 * ids[0..n_ids), appended at s->n_past on; logits and token are then
	 * those of its last token, and none with skip (a chunk before the
	 * prompt's last, whose logits nothing reads). Zero: id alone. */
	const int32_t *ids;
	int32_t n_ids;
	int skip;
};

/* 1 when S's model can decode with other sessions in one step: it has
 * no recurrent layers. */
int q4kh_session_batchable(const struct q4kh_session *s);

/*
 * One step of B[0..n): for each j, B[j].id (or its chunk B[j].ids)
 * at position B[j].s->n_past of its own session on, as
 * q4kh_session_eval(B[j].s, &B[j].id, 1, ...) (or its chunk) would run it
 * alone (the same logits to rounding: each column's products and
 * per-token ops are those of a step of its own; on the exact cpu bit for
 * bit), then each n_past + its tokens. One step graph for all the
 * columns, its nodes over every column at once but the cache writes and
 * attentions, one per sequence on its session's caches over its columns;
 * the graph is cached in B[0].s, keyed on the sessions in their order
 * and their token counts (a stable set of decoding sessions reuses it; a
 * changed one, or other chunks, builds another), and runs in B[0].s's
 * scratch. n == 1 is a step of that session alone. The sessions must be
 * distinct, of one model and backend and one KV cache kind (contiguous,
 * or the same pools with the same n_ctx), batchable, with at most B[0].s's
 * n_batch tokens in all, each with room in its context. -1 with err when they are not, or when an id is outside the
 * vocabulary (nothing changes), or on a backend failure (no n_past
 * changes; cache rows past them are unread). Every session is used from
 * the calling thread for the call.
 */
int q4kh_session_eval_batch(struct q4kh_batch_seq *b, int32_t n, struct q4kh_error *err);

/*
 * The greedy pick of V[0..n): the index of the largest finite value, the
 * lowest one on ties, or -1 when no value is finite (NaN and +-Inf are
 * skipped; -0 and +0 are equal). val[0] is that value, val[1] the largest
 * finite value of the other indices (the lowest index's on ties), each
 * -INFINITY when there is none. The definition that the backends' top2
 * entries match bit for bit (plugin.h): the scan of the SDK's
 * q4khost/top2.h (q4kh_top2_scan), which a host-memory backend runs too.
 */
int32_t q4kh_top2(const float *v, int64_t n, float val[2]);

/* The lead of a q4kh_top2 pick over its runner-up, in double: +INFINITY
 * with a single finite value, NAN with none. */
double q4kh_top2_margin(int32_t best, const float val[2]);

#endif
