/*
 * Greedy generation on a session with what a benchmark and a golden-case
 * check need: the tokens chosen, the top-2 margin of the logits each was
 * chosen from, and the time spent in prefill and in decode. Prefill is one
 * eval of the prompt (batched), decode one eval per token, as serving runs
 * them (cmd_run.c). Uses the session from the calling thread only.
 */
#ifndef Q4KH_GREEDY_H
#define Q4KH_GREEDY_H

#include <stdint.h>

#include "error.h"
#include "session.h"
#include "tokenizer.h"

struct q4kh_greedy {
	int32_t *tokens;  /* n chosen tokens, malloc()ed */
	double *margins;  /* margins[i]: top-1 minus top-2 logit of the logits
	                     token i was chosen from (logit units) */
	int64_t n;
	int eog;          /* stopped at an end-of-generation token (the last) */
	double prefill_seconds; /* the prompt's one eval */
	double decode_seconds;  /* the n - 1 single-token evals */
};

/*
 * From an empty cache (the session is reset first), run IDS[0..n_ids) and
 * then choose up to MAX_TOKENS tokens by argmax, feeding each back. With
 * TOK not NULL, stop after a token it calls end-of-generation; with NULL,
 * always choose MAX_TOKENS (a benchmark's fixed count). The loop is
 * generate.h's. -1 with err when an eval fails, no logit is finite, the
 * context fills before MAX_TOKENS, or on out of memory; *out is then empty.
 */
int q4kh_greedy_run(struct q4kh_session *s, const struct q4kh_tokenizer *tok,
                    const int32_t *ids, int64_t n_ids, int64_t max_tokens,
                    struct q4kh_greedy *out, struct q4kh_error *err);
void q4kh_greedy_free(struct q4kh_greedy *g);

#endif
