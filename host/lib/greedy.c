#include "greedy.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void q4kh_greedy_free(struct q4kh_greedy *g)
{
	free(g->tokens);
	free(g->margins);
	memset(g, 0, sizeof(*g));
}

struct keeping {
	struct q4kh_greedy *out;
	const struct q4kh_gen *g;
};

/* Each token chosen, with the margin of the logits it came from. */
static int keep(void *data, int32_t tok, enum q4kh_gen_end end)
{
	const struct keeping *k = data;
	struct q4kh_greedy *out = k->out;

	out->tokens[out->n] = tok;
	out->margins[out->n++] = k->g->margin;
	out->eog = end == Q4KH_GEN_EOG;
	return 0;
}

int q4kh_greedy_run(struct q4kh_session *s, const struct q4kh_tokenizer *tok,
                    const int32_t *ids, int64_t n_ids, int64_t max_tokens,
                    struct q4kh_greedy *out, struct q4kh_error *err)
{
	struct q4kh_gen g = { .tok = tok, .max_tokens = max_tokens };
	const struct keeping k = { out, &g };
	const struct q4kh_gen_calls calls = { keep, NULL, (void *)&k };
	enum q4kh_gen_end end = Q4KH_GEN_LIMIT;
	double t0;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->tokens = malloc(sizeof(*out->tokens) * (size_t)(max_tokens + 1));
	out->margins = malloc(sizeof(*out->margins) * (size_t)(max_tokens + 1));
	if (!out->tokens || !out->margins) {
		q4kh_greedy_free(out);
		return q4kh_fail(err, "greedy generation: out of memory");
	}
	q4kh_session_reset(s);
	t0 = now();
	if (q4kh_gen_eval(&g, s, ids, n_ids, 1, err))
		goto fail;
	out->prefill_seconds = now() - t0;
	t0 = now();
	if (max_tokens > 0)
		rc = q4kh_gen_decode(&g, s, &calls, &end, err);
	if (rc == Q4KH_GEN_NO_LOGIT)
		q4kh_fail(err, "greedy generation: step %lld: no finite logit", (long long)g.n);
	else if (!rc && end == Q4KH_GEN_CONTEXT)
		q4kh_fail(err, "greedy generation: the context of %u tokens is full after %lld "
		          "tokens of the %lld asked for", s->p.n_ctx, (long long)g.n,
		          (long long)max_tokens);
	if (rc || end == Q4KH_GEN_CONTEXT)
		goto fail;
	out->decode_seconds = now() - t0;
	return 0;
fail:
	q4kh_greedy_free(out);
	return -1;
}
