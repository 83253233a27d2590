#include "greedy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The finite argmax of V (lowest index on ties) and its margin over the
 * runner-up; -1 when V holds no finite value. */
static int32_t top2(const float *v, int32_t n, double *margin)
{
	int32_t best = -1;
	double second = -INFINITY;

	for (int32_t i = 0; i < n; i++) {
		if (!isfinite(v[i]))
			continue;
		if (best < 0 || v[i] > v[best]) {
			if (best >= 0)
				second = v[best];
			best = i;
		} else if (v[i] > second) {
			second = v[i];
		}
	}
	*margin = best >= 0 ? v[best] - second : NAN;
	return best;
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
	const int32_t n_vocab = (int32_t)s->m->hp.n_vocab;
	float *logits = malloc(sizeof(float) * (size_t)n_vocab);
	double t0;

	memset(out, 0, sizeof(*out));
	out->tokens = malloc(sizeof(*out->tokens) * (size_t)(max_tokens + 1));
	out->margins = malloc(sizeof(*out->margins) * (size_t)(max_tokens + 1));
	if (!logits || !out->tokens || !out->margins) {
		free(logits);
		q4kh_greedy_free(out);
		return q4kh_fail(err, "greedy generation: out of memory");
	}
	q4kh_session_reset(s);
	t0 = now();
	if (q4kh_session_eval(s, ids, n_ids, logits, 0, err))
		goto fail;
	out->prefill_seconds = now() - t0;
	t0 = now();
	while (out->n < max_tokens) {
		int32_t t = top2(logits, n_vocab, &out->margins[out->n]);

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
		if (q4kh_session_eval(s, &t, 1, logits, 0, err))
			goto fail;
	}
	out->decode_seconds = now() - t0;
	free(logits);
	return 0;
fail:
	free(logits);
	q4kh_greedy_free(out);
	return -1;
}
