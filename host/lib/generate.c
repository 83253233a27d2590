#include "generate.h"

#include <math.h>

int q4kh_gen_eval(struct q4kh_gen *g, struct q4kh_session *s, const int32_t *ids, int64_t n,
                  int last, struct q4kh_error *err)
{
	if (last && !g->sampler)
		return q4kh_session_eval_top2(s, ids, n, &g->pick, &g->margin, err);
	return q4kh_session_eval(s, ids, n, last ? g->logits : NULL, 0, err);
}

int32_t q4kh_gen_choose(struct q4kh_gen *g)
{
	int32_t i = 0;

	if (!g->sampler)
		return g->pick;
	while (i < g->n_vocab && !isfinite(g->logits[i]))
		i++;
	return i < g->n_vocab ? q4kh_sampler_sample(g->sampler, g->logits) : -1;
}

enum q4kh_gen_end q4kh_gen_take(struct q4kh_gen *g, const struct q4kh_session *s,
                                int32_t tok)
{
	g->n++;
	if (g->tok && q4kh_tokenizer_is_eog(g->tok, tok))
		return Q4KH_GEN_EOG;
	if (g->n >= g->max_tokens)
		return Q4KH_GEN_LIMIT;
	if (s->n_past >= s->p.n_ctx)
		return Q4KH_GEN_CONTEXT;
	return Q4KH_GEN_ON;
}

int q4kh_gen_decode(struct q4kh_gen *g, struct q4kh_session *s,
                    const struct q4kh_gen_calls *calls, enum q4kh_gen_end *end,
                    struct q4kh_error *err)
{
	int32_t tok;

	*end = Q4KH_GEN_ON;
	for (;;) {
		if (calls->stop && calls->stop(calls->data))
			return Q4KH_GEN_STOPPED;
		if ((tok = q4kh_gen_choose(g)) < 0)
			return Q4KH_GEN_NO_LOGIT;
		*end = q4kh_gen_take(g, s, tok);
		if (calls->token(calls->data, tok, *end))
			return Q4KH_GEN_STOPPED;
		if (*end != Q4KH_GEN_ON)
			return 0;
		if (q4kh_gen_eval(g, s, &tok, 1, 1, err))
			return -1;
	}
}
