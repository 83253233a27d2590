#include "greedy.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int q4kh_greedy_run(struct q4kh_session *s, const struct q4kh_tokenizer *tok,
                    const int32_t *ids, int64_t n_ids, int64_t max_tokens,
                    struct q4kh_greedy *out, struct q4kh_error *err)
{
	double t0;
	int32_t t;

	memset(out, 0, sizeof(*out));
	out->tokens = malloc(sizeof(*out->tokens) * (size_t)(max_tokens + 1));
	out->margins = malloc(sizeof(*out->margins) * (size_t)(max_tokens + 1));
	if (!out->tokens || !out->margins) {
		q4kh_greedy_free(out);
		return q4kh_fail(err, "greedy generation: out of memory");
	}
	q4kh_session_reset(s);
	t0 = now();
	if (q4kh_session_eval_top2(s, ids, n_ids, &t, &out->margins[0], err))
		goto fail;
	out->prefill_seconds = now() - t0;
	t0 = now();
	while (out->n < max_tokens) {
		if (t < 0) {
			q4kh_fail(err, "greedy generation: step %lld: no finite logit",
			          (long long)out->n);
			goto fail;
		}
		out->tokens[out->n++] = t;
		if (tok && q4kh_tokenizer_is_eog(tok, t)) {
			out->eog = 1;
			break;
		}
		if (out->n == max_tokens)
			break;
		if (q4kh_session_eval_top2(s, &out->tokens[out->n - 1], 1, &t,
		                           &out->margins[out->n], err))
			goto fail;
	}
	out->decode_seconds = now() - t0;
	return 0;
fail:
	q4kh_greedy_free(out);
	return -1;
}
