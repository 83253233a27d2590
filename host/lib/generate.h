/*
 * One sequence's generation, the loop of q4khost run (cmd_run.c) and of
 * greedy generation (greedy.h: qa, bench), and the per-sequence part of
 * serve's (serve_engine.c), whose steps may batch several sequences
 * (q4kh_session_eval_batch) and so call the pieces one by one: what an
 * eval keeps for choosing the next token (the session's greedy pick, or
 * the logits for a sampler), the choice, and when the answer ends (an
 * end-of-generation token, the token limit, a full context). Uses the
 * session and sampler from the calling thread only.
 */
#ifndef Q4KH_GENERATE_H
#define Q4KH_GENERATE_H

#include <stdint.h>

#include "error.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"

struct q4kh_gen {
	/* Set by the caller. */
	struct q4kh_sampler *sampler; /* NULL: greedy, the session's top-2 pick */
	float *logits;                /* with a sampler: n_vocab floats, the caller's */
	int32_t n_vocab;
	const struct q4kh_tokenizer *tok; /* NULL: no token ends the answer */
	int64_t max_tokens;               /* the most tokens taken (>= 1) */
	/* Kept by the evals and q4kh_gen_take. */
	int32_t pick;  /* greedy: the last eval's pick, -1 when no logit is finite */
	double margin; /* greedy: its top-1 minus top-2 logit (logit units) */
	int64_t n;     /* tokens taken */
};

enum q4kh_gen_end {
	Q4KH_GEN_ON = 0, /* the answer goes on */
	Q4KH_GEN_EOG,    /* an end-of-generation token: not part of the text */
	Q4KH_GEN_LIMIT,  /* max_tokens taken */
	Q4KH_GEN_CONTEXT /* the context is full: no row to feed the token back */
};

/*
 * Run ids[0..n) in S. With LAST, keep what choosing the next token needs:
 * greedy, the pick and its margin in G (q4kh_session_eval_top2); else the
 * logits in g->logits. Errors as q4kh_session_eval's.
 */
int q4kh_gen_eval(struct q4kh_gen *g, struct q4kh_session *s, const int32_t *ids, int64_t n,
                  int last, struct q4kh_error *err);

/*
 * The token chosen from the last eval: greedy, g->pick; else the
 * sampler's choice from g->logits. -1 when no logit is finite (corrupt
 * weights or a backend fault: never a token to feed back).
 */
int32_t q4kh_gen_choose(struct q4kh_gen *g);

/*
 * Take TOK, chosen for session S (counted in g->n, an end-of-generation
 * token too): whether the answer ends with it, checked in this order: an
 * end-of-generation token (g->tok), max_tokens, a full context.
 */
enum q4kh_gen_end q4kh_gen_take(struct q4kh_gen *g, const struct q4kh_session *s,
                                int32_t tok);

/* What the loop tells its caller, and asks it. */
struct q4kh_gen_calls {
	/* Each token taken, with whether it ends the answer (END); the
	 * loop's stop when it returns nonzero (the text's reader went away). */
	int (*token)(void *data, int32_t tok, enum q4kh_gen_end end);
	/* Polled before each token is chosen: nonzero stops the loop (a
	 * SIGINT or SIGTERM, interrupt.h); NULL: never. */
	int (*stop)(void *data);
	void *data;
};

/* How q4kh_gen_decode ended, besides an answer that ended (0). */
#define Q4KH_GEN_STOPPED 1   /* a call's stop or token said stop */
#define Q4KH_GEN_NO_LOGIT (-2) /* no logit of step g->n was finite */

/*
 * The decode loop, from the prompt's eval (q4kh_gen_eval with LAST, the
 * caller's, so that it may split and time its prefill): choose, take,
 * tell CALLS, feed the token back, until the answer ends (*END says how),
 * a call says stop (Q4KH_GEN_STOPPED), no logit is finite
 * (Q4KH_GEN_NO_LOGIT, the step g->n, for the caller's message) or an eval
 * fails (-1 with err).
 */
int q4kh_gen_decode(struct q4kh_gen *g, struct q4kh_session *s,
                    const struct q4kh_gen_calls *calls, enum q4kh_gen_end *end,
                    struct q4kh_error *err);

#endif
