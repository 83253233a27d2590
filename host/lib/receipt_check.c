#include "receipt_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void q4kh_receipt_rules(const struct q4kh_receipt_key *key, struct q4kh_f2_rules *rules)
{
	q4kh_f2_rules_default(rules);
	q4kh_f2_rules_class(rules, key->arith);
	rules->floor = key->floor;
	rules->floor_set = key->floor_set;
	rules->decode_steps = key->decode_steps;
	rules->probe_tokens = key->probe_tokens;
}

/* Fail ERR with "receipt PATH: WHAT: ignored"; 1. */
#define VOID(err, path, fmt, ...) \
	(q4kh_fail((err), "receipt %s: " fmt ": ignored", (path), __VA_ARGS__), 1)

/* "prefill" or "decode step D", for position I, into BUF. */
static const char *where(int64_t i, int32_t decode_step, char *buf, size_t cap)
{
	if (decode_step < 0)
		snprintf(buf, cap, "position %lld (prefill)", (long long)i);
	else
		snprintf(buf, cap, "position %lld (decode step %d)", (long long)i, decode_step);
	return buf;
}

/* A and B (null for NaN) with as many decimals, 4 or more, as tell them
 * apart, into SA and SB. */
static void two_cosines(double a, double b, char *sa, char *sb, size_t cap)
{
	for (int d = 4; d <= 17; d++) {
		snprintf(sa, cap, isnan(a) ? "null" : "%.*f", d, a);
		snprintf(sb, cap, isnan(b) ? "null" : "%.*f", d, b);
		if (strcmp(sa, sb))
			return;
	}
}

/* A receipt without points names no position and passes nothing. */
static int check_pointless(const char *path, const struct q4kh_receipt *r,
                           struct q4kh_error *err)
{
	if (r->verdict != Q4KH_F2_REJECT && r->verdict != Q4KH_F2_BROKEN)
		return VOID(err, path, "verdict \"%s\" but it holds no measured position",
		            q4kh_f2_verdict_name(r->verdict));
	if (!isnan(r->min_cosine))
		return VOID(err, path, "min_cosine %.4f but it holds no measured position",
		            r->min_cosine);
	if (r->worst_position != -1 || r->worst_decode_step != -1)
		return VOID(err, path,
		            "worst_position %lld, worst_decode_step %d but it holds no measured position",
		            (long long)r->worst_position, r->worst_decode_step);
	if (r->near_ties)
		return VOID(err, path, "near_ties %d but it holds no measured position", r->near_ties);
	return 0;
}

/*
 * Point I of R against PT, its position in the plan: the same decode step,
 * the same treatment (judged, compared only, skipped), and a mark its
 * cosine allows. 0, or 1 with err.
 */
static int check_point(const char *path, const struct q4kh_receipt *r, int64_t i,
                       const struct q4kh_f2_point *pt, const struct q4kh_f2_rules *rules,
                       struct q4kh_error *err)
{
	const struct q4kh_receipt_point *p = &r->points[i];
	const char *mark = q4kh_receipt_point_mark(p);
	enum q4kh_f2_verdict v;
	char at[64], shown[32];

	if (p->decode_step != pt->decode_step)
		return VOID(err, path, "point %lld has decode step %d but its probe plan has %s",
		            (long long)i, p->decode_step,
		            where(i, pt->decode_step, at, sizeof(at)));
	if (p->judged != pt->judged || p->computed != pt->computed)
		return VOID(err, path, "point %lld is marked \"%s\" but its probe plan %s %s",
		            (long long)i, mark,
		            pt->judged     ? "judges"
		            : pt->computed ? "compares without judging (\"unjudged\")"
		                           : "skips (\"skipped\")",
		            where(i, pt->decode_step, at, sizeof(at)));
	if (!p->judged)
		return 0;
	v = q4kh_f2_cosine_verdict(p->cosine, rules);
	snprintf(shown, sizeof(shown), isnan(p->cosine) ? "null" : "%.*f",
	         q4kh_f2_cosine_digits(rules), p->cosine);
	/* below a floor the cosine decides; above it, only F2.3 rejects */
	if (v != Q4KH_F2_PASS && p->verdict != v)
		return VOID(err, path, "point %lld is marked \"%s\" but its cosine %s makes it \"%s\" (floors %s and %s)",
		            (long long)i, mark, shown, q4kh_f2_verdict_name(v),
		            q4kh_f2_threshold(rules->floor).s,
		            q4kh_f2_threshold(Q4KH_F2_CATASTROPHIC).s);
	if (v == Q4KH_F2_PASS && p->verdict == Q4KH_F2_BROKEN)
		return VOID(err, path, "point %lld is marked \"broken\" but its cosine %s is not below the %s catastrophic floor",
		            (long long)i, shown, q4kh_f2_threshold(Q4KH_F2_CATASTROPHIC).s);
	if (p->near_tie && !(p->cosine >= rules->near_tie_cosine))
		return VOID(err, path, "point %lld is marked \"near-tie\" but its cosine %s is below the %s a near-tie needs (F2.3)",
		            (long long)i, shown, q4kh_f2_threshold(rules->near_tie_cosine).s);
	return 0;
}

/* R's summary against RES, concluded from its points. 0, or 1 with err. */
static int check_summary(const char *path, const struct q4kh_receipt *r,
                         const struct q4kh_f2_result *res, const struct q4kh_f2_rules *rules,
                         struct q4kh_error *err)
{
	const struct q4kh_f2_point *w = &res->points[res->worst];
	char a[32], b[32], at[64], shown[80];

	if (r->verdict != res->verdict)
		return VOID(err, path, "verdict \"%s\" but its points' verdict is \"%s\", decided at %s",
		            q4kh_f2_verdict_name(r->verdict), q4kh_f2_verdict_name(res->verdict),
		            where(res->worst, w->decode_step, at, sizeof(at)));
	if (!(r->min_cosine == res->min_cosine || (isnan(r->min_cosine) && isnan(res->min_cosine)))) {
		two_cosines(r->min_cosine, res->min_cosine, a, b, sizeof(a));
		return VOID(err, path, "min_cosine %s but its points' lowest judged cosine is %s", a, b);
	}
	if (r->worst_position != res->worst)
		return VOID(err, path, "worst_position %lld but its points decide at %s",
		            (long long)r->worst_position,
		            where(res->worst, w->decode_step, at, sizeof(at)));
	if (r->worst_decode_step != w->decode_step)
		return VOID(err, path, "worst_decode_step %d but its points decide at %s",
		            r->worst_decode_step, where(res->worst, w->decode_step, at, sizeof(at)));
	if (r->near_ties != res->near_ties)
		return VOID(err, path, "near_ties %d but its points hold %d", r->near_ties,
		            res->near_ties);
	if (!q4kh_f2_message_matches(r->message, res, rules)) {
		snprintf(a, sizeof(a), isnan(w->cosine) ? "null" : "%.4f", w->cosine);
		return VOID(err, path, "message \"%s\" but its points give \"%s\" at %s, cosine %s",
		            q4kh_show(shown, sizeof(shown), r->message, strlen(r->message), 60, 0),
		            q4kh_f2_verdict_name(res->verdict),
		            where(res->worst, w->decode_step, at, sizeof(at)), a);
	}
	return 0;
}

int q4kh_receipt_check(const char *path, const struct q4kh_receipt *r,
                       const struct q4kh_f2_plan *plan, struct q4kh_error *err)
{
	const int64_t rows = plan->prefill + plan->decode_steps;
	struct q4kh_f2_rules rules;
	struct q4kh_f2_result res = { 0 };
	int rc = 0;

	if (!r->n_points)
		return check_pointless(path, r, err);
	if (r->n_points != rows)
		return VOID(err, path, "%lld points but its probe plan has %lld (%lld prefill positions, %u decode steps)",
		            (long long)r->n_points, (long long)rows, (long long)plan->prefill,
		            plan->decode_steps);
	q4kh_receipt_rules(&r->key, &rules);
	res.points = calloc((size_t)rows, sizeof(*res.points));
	if (!res.points)
		return q4kh_fail(err, "receipt %s: out of memory for %lld points", path,
		                 (long long)rows);
	res.n_points = rows;
	for (int64_t i = 0; i < rows && !rc; i++) {
		struct q4kh_f2_point *pt = &res.points[i];

		q4kh_f2_plan_point(plan, i, pt);
		rc = check_point(path, r, i, pt, &rules, err);
		pt->cosine = r->points[i].cosine;
		pt->verdict = r->points[i].verdict;
		pt->near_tie = r->points[i].near_tie;
	}
	if (!rc) {
		q4kh_f2_conclude(&res, &rules);
		rc = res.worst < 0 ? VOID(err, path, "its probe plan judges none of its %lld points",
		                          (long long)rows)
		                   : check_summary(path, r, &res, &rules, err);
	}
	q4kh_f2_result_free(&res);
	return rc;
}
