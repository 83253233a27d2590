#include "decide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candidates.h"
#include "settings.h"

int q4kh_decide_guard_open(struct q4kh_decide_guard *dg, const struct q4kh_select_request *rq,
                           struct q4kh_error *err)
{
	struct q4kh_host *h = rq->host;
	struct q4kh_guard *g = &dg->own;
	const int deep = rq->probe == Q4KH_F2_PROBE_DEEP;
	const int prompt = rq->probe == Q4KH_F2_PROBE_PROMPT &&
	                   rq->n_prompt >= Q4KH_F2_PROMPT_MIN_TOKENS;

	if (deep ? q4kh_deep_probe(h->model_path, rq->deep_ctx, &dg->probe, &dg->deep, err)
	         : !prompt && q4kh_guard_probe_with(h->model->gguf, h->tok, NULL, &dg->probe,
	                                            &dg->n_probe, err))
		return -1;
	if (deep)
		dg->n_probe = (size_t)dg->deep.prefill;
	if (q4kh_guard_init(g, h->registry, h->config, h->model_path,
	                    prompt ? rq->prompt : dg->probe, prompt ? rq->n_prompt : dg->n_probe,
	                    err) ||
	    (deep && q4kh_guard_use_deep(g, &dg->deep, rq->deep_ctx, err)))
		return -1;
	if (prompt)
		g->probe_kind = Q4KH_F2_PROBE_PROMPT;
	g->config_file = rq->config_file;
	g->host = h;
	q4kh_settings_f2_source(rq->mode_origin, "fresh", dg->fresh_source,
	                        sizeof(dg->fresh_source));
	g->fresh_source = dg->fresh_source;
	dg->g = g;
	return 0;
}

void q4kh_decide_guard_close(struct q4kh_decide_guard *dg)
{
	free(dg->probe);
	q4kh_deep_plan_free(&dg->deep);
	dg->probe = NULL;
	if (dg->g == &dg->own)
		dg->g = NULL;
}

/*
 * The F2 record of C when nothing is to be judged: the reference ("not
 * needed"), or with F2 off any other ("off", its source naming where it
 * was set). 1 when it filled OUT; 0 when C must be judged.
 */
static int unjudged(const struct q4kh_decide_how *how, const struct q4kh_candidate *c,
                    struct q4kh_decision *out)
{
	char name[160];

	if (q4kh_candidate_is_reference(c)) {
		snprintf(out->verdict, sizeof(out->verdict), "not needed");
		snprintf(out->message, sizeof(out->message),
		         "the reference cpu backend with its built-in kernels");
		return 1;
	}
	if (how->mode != Q4KH_F2_OFF)
		return 0;
	snprintf(out->verdict, sizeof(out->verdict), "off");
	q4kh_settings_f2_source(how->mode_origin, "off", out->source, sizeof(out->source));
	snprintf(out->message, sizeof(out->message), "F2 IS OFF: %s serves unverified",
	         q4kh_candidate_name(c, name, sizeof(name)));
	return 1;
}

/* Which probe judges candidate C under G (asked for by RQ), and how many of
 * its tokens, into OUT. */
static int describe_probe(const struct q4kh_select_request *rq, const struct q4kh_guard *g,
                          const struct q4kh_candidate *c, struct q4kh_decision *out,
                          struct q4kh_error *err)
{
	struct q4kh_f2_rules rules;
	size_t judged;

	if (q4kh_guard_rules(g, c, &rules, err))
		return -1;
	out->probe_kind = g->probe_kind;
	if (g->deep) {
		char text[300];

		out->probe_tokens = g->deep->prefill;
		out->probe_positions = g->deep->prefill + g->deep->decode_steps;
		q4kh_deep_describe(g->deep, text, sizeof(text));
		snprintf(out->probe, sizeof(out->probe), "%s (%.60s)", text,
		         rq->probe_origin ? rq->probe_origin : "require_deep");
		return 0;
	}
	judged = g->n_probe < rules.probe_tokens ? g->n_probe : rules.probe_tokens;
	out->probe_tokens = (int64_t)judged;
	out->probe_positions = (int64_t)(judged + rules.decode_steps);
	if (g->probe_kind == Q4KH_F2_PROBE_PROMPT && judged < g->n_probe)
		snprintf(out->probe, sizeof(out->probe),
		         "this prompt, its last %zu of %zu tokens (f2_probe_tokens)", judged,
		         g->n_probe);
	else if (g->probe_kind == Q4KH_F2_PROBE_PROMPT)
		snprintf(out->probe, sizeof(out->probe), "this prompt, %zu tokens", judged);
	else if (rq->probe == Q4KH_F2_PROBE_PROMPT)
		snprintf(out->probe, sizeof(out->probe),
		         "built-in probe, %zu tokens (%.200s asked for the prompt, but it has %zu tokens, fewer than the %d a prompt probe needs)",
		         judged, rq->probe_origin ? rq->probe_origin : "--f2-probe prompt",
		         rq->n_prompt, Q4KH_F2_PROMPT_MIN_TOKENS);
	else
		snprintf(out->probe, sizeof(out->probe), "built-in probe, %zu tokens", judged);
	return 0;
}

/*
 * A deep receipt decided for a guard of another probe (guard.h): the
 * probe its points say it judged, into OUT, so that the report names the
 * probe the verdict came from.
 */
static void describe_deep_receipt(const struct q4kh_receipt *r, struct q4kh_decision *out)
{
	int64_t judged = 0, steps = 0;

	for (int64_t i = 0; i < r->n_points; i++) {
		judged += r->points[i].judged;
		steps += r->points[i].decode_step >= 0;
	}
	out->probe_kind = Q4KH_F2_PROBE_DEEP;
	out->probe_tokens = r->n_points - steps;
	out->probe_positions = r->n_points;
	snprintf(out->probe, sizeof(out->probe),
	         "deep probe of a deep receipt: %lld positions judged of %lld, up to position %lld, %lld decode steps",
	         (long long)judged, (long long)r->n_points, (long long)(r->n_points - 1),
	         (long long)steps);
}

/* The decision of a receipt alone (HOW's receipts_only): 1 when none decides. */
static int receipt_only(const struct q4kh_decide_how *how, const struct q4kh_guard *g,
                        const struct q4kh_candidate *c, const struct q4kh_device_record *dev,
                        struct q4kh_decision *out, struct q4kh_error *err)
{
	char why[512];

	if (how->mode == Q4KH_F2_FRESH)
		return 1;
	return q4kh_guard_receipt_decision(g, c, dev, &out->d, why, sizeof(why), NULL, NULL, 0,
	                                   err);
}

int q4kh_decide(const struct q4kh_decide_how *how, struct q4kh_decide_guard *dg,
                const struct q4kh_candidate *c, const struct q4kh_device_record *dev,
                struct q4kh_decision *out, struct q4kh_error *err)
{
	const struct q4kh_receipt *r = &out->d.receipt;
	int rc;

	memset(out, 0, sizeof(*out));
	if (unjudged(how, c, out))
		return 0;
	if (!dg->g && q4kh_decide_guard_open(dg, how->rq, err))
		return -2;
	if (how->rq && describe_probe(how->rq, dg->g, c, out, err))
		return -1;
	rc = how->receipts_only ? receipt_only(how, dg->g, c, dev, out, err)
	                        : q4kh_guard_check(dg->g, c, dev, how->mode, &out->d, err);
	if (rc < 0) {
		q4kh_receipt_free(&out->d.receipt); /* an older receipt read on the way */
		memset(out, 0, sizeof(*out));
		return -1;
	}
	if (rc > 0) {
		memset(out, 0, sizeof(*out));
		out->outcome = Q4KH_UNDECIDED;
		return 0;
	}
	out->judged = 1;
	if (how->rq && dg->g->probe_kind != Q4KH_F2_PROBE_DEEP &&
	    !strcmp(r->key.probe, q4kh_f2_probe_name(Q4KH_F2_PROBE_DEEP)))
		describe_deep_receipt(r, out);
	out->outcome = out->d.verdict == Q4KH_F2_PASS ? Q4KH_SERVES : Q4KH_REJECTED;
	snprintf(out->verdict, sizeof(out->verdict), "%s", q4kh_f2_verdict_name(out->d.verdict));
	snprintf(out->source, sizeof(out->source), "%s", out->d.source);
	snprintf(out->message, sizeof(out->message), "%s", r->message);
	return 0;
}

void q4kh_decision_record(const struct q4kh_decision *d, struct q4kh_selection *s)
{
	snprintf(s->f2_verdict, sizeof(s->f2_verdict), "%s", d->verdict);
	snprintf(s->f2_source, sizeof(s->f2_source), "%s", d->source);
	snprintf(s->f2_message, sizeof(s->f2_message), "%s", d->message);
	if (!d->probe[0])
		return;
	snprintf(s->f2_probe, sizeof(s->f2_probe), "%s", d->probe);
	s->f2_probe_kind = d->probe_kind;
	s->f2_probe_tokens = d->probe_tokens;
	s->f2_probe_positions = d->probe_positions;
}

void q4kh_decision_step(const struct q4kh_decision *d, const char *name, char *buf,
                        size_t cap)
{
	size_t used = strlen(buf);

	if (used + 1 >= cap)
		return;
	/* whether it was measured now or read from a receipt */
	snprintf(buf + used, cap - used, "%s: F2 %s: %s [%s%s]\n", name, d->verdict,
	         q4kh_f2_message_after_verdict(d->d.verdict, d->message), d->source,
	         strncmp(d->source, "receipt", 7) ? "" : "; --f2 fresh measures it again");
}
