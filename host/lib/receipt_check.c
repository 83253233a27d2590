#include "buildconf.h"

#include "receipt_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Where plan point PT is: "position 5 (prefill)", "position 70 (decode
 * step 6)", "position 23 (batched step of 4 sequences, sequence 1, its
 * decode step 0)", into BUF. */
static const char *where(const struct q4kh_f2_point *pt, char *buf, size_t cap)
{
	if (pt->batch)
		snprintf(buf, cap, "position %lld (batched step of %d sequences, sequence %d, its decode step %d)",
		         (long long)pt->position, pt->batch, pt->seq, pt->decode_step);
	else if (pt->decode_step < 0)
		snprintf(buf, cap, "position %lld (prefill)", (long long)pt->position);
	else
		snprintf(buf, cap, "position %lld (decode step %d)", (long long)pt->position,
		         pt->decode_step);
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
	char at[128], shown[32];

	if (p->decode_step != pt->decode_step)
		return VOID(err, path, "point %lld has decode step %d but its probe plan has %s",
		            (long long)i, p->decode_step, where(pt, at, sizeof(at)));
	if (p->judged != pt->judged || p->computed != pt->computed)
		return VOID(err, path, "point %lld is marked \"%s\" but its probe plan %s %s",
		            (long long)i, mark,
		            pt->judged     ? "judges"
		            : pt->computed ? "compares without judging (\"unjudged\")"
		                           : "skips (\"skipped\")",
		            where(pt, at, sizeof(at)));
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
	char a[32], b[32], at[128], shown[80];

	if (r->verdict != res->verdict)
		return VOID(err, path, "verdict \"%s\" but its points' verdict is \"%s\", decided at %s",
		            q4kh_f2_verdict_name(r->verdict), q4kh_f2_verdict_name(res->verdict),
		            where(w, at, sizeof(at)));
	if (!(r->min_cosine == res->min_cosine || (isnan(r->min_cosine) && isnan(res->min_cosine)))) {
		two_cosines(r->min_cosine, res->min_cosine, a, b, sizeof(a));
		return VOID(err, path, "min_cosine %s but its points' lowest judged cosine is %s", a, b);
	}
	if (r->worst_position != w->position)
		return VOID(err, path, "worst_position %lld but its points decide at %s",
		            (long long)r->worst_position,
		            where(w, at, sizeof(at)));
	if (r->worst_decode_step != w->decode_step)
		return VOID(err, path, "worst_decode_step %d but its points decide at %s",
		            r->worst_decode_step, where(w, at, sizeof(at)));
	if (r->near_ties != res->near_ties)
		return VOID(err, path, "near_ties %d but its points hold %d", r->near_ties,
		            res->near_ties);
	if (!q4kh_f2_message_matches(r->message, res, rules)) {
		snprintf(a, sizeof(a), isnan(w->cosine) ? "null" : "%.4f", w->cosine);
		return VOID(err, path, "message \"%s\" but its points give \"%s\" at %s, cosine %s",
		            q4kh_show(shown, sizeof(shown), r->message, strlen(r->message), 60, 0),
		            q4kh_f2_verdict_name(res->verdict),
		            where(w, at, sizeof(at)), a);
	}
	return 0;
}

/* Whether S is a time as receipts write it (Q4KH_RECEIPT_TIME_FORMAT),
 * every field in range: 1 when it is. */
static int is_time(const char *s)
{
	struct tm tm = { 0 }, back;
	time_t t;
	const char *end = strptime(s, Q4KH_RECEIPT_TIME_FORMAT, &tm);

	/* strptime takes fields of fewer digits: the length is a receipt's */
	if (!end || *end || strlen(s) != 20)
		return 0;
	back = tm;
	t = timegm(&back);
	/* timegm normalises a day past its month's end (February 30) */
	return t != (time_t)-1 && back.tm_mday == tm.tm_mday && back.tm_mon == tm.tm_mon;
}

int q4kh_receipt_check(const char *path, const struct q4kh_receipt *r,
                       const struct q4kh_f2_plan *plan, struct q4kh_error *err)
{
	const int64_t rows = q4kh_f2_plan_points(plan);
	struct q4kh_f2_rules rules;
	struct q4kh_f2_result res = { 0 };
	int rc = 0;
	char shown[4 * 32 + 8];

	if (!is_time(r->created))
		return VOID(err, path, "created \"%s\" but a receipt's time is UTC as 2026-11-30T06:01:24Z",
		            q4kh_show(shown, sizeof(shown), r->created, strlen(r->created), 32, 1));
	if (!r->n_points)
		return check_pointless(path, r, err);
	if (r->n_points != rows) {
		char batched[48] = "";

		if (plan->batched)
			snprintf(batched, sizeof(batched), ", %lld in batched steps",
			         (long long)plan->batched);
		return VOID(err, path, "%lld points but its probe plan has %lld (%lld prefill positions, %u decode steps%s)",
		            (long long)r->n_points, (long long)rows, (long long)plan->prefill,
		            plan->decode_steps, batched);
	}
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
