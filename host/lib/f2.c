#include "f2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "f2_reference.h"
#include "kv_paged.h"
#include "kv_prefix.h"
#include "sampler.h"

/*
 * Each class's acceptance floor: the lowest cosine correct code of that
 * class gave over every fixture and the default model, built-in and deep
 * probes, with a margin (docs/f2.md, "Floors that follow the
 * arithmetic", has the table). A class's floor is never above a finer
 * class's, so that the coarsest part of a path sets it.
 */
static const struct {
	const char *name;
	double floor;
} arith_classes[] = {
	[Q4KH_ARITH_UNDECLARED] = { "undeclared", Q4KH_F2_FLOOR_DEFAULT },
	[Q4KH_ARITH_EXACT] = { "exact", 0.999999 },
	[Q4KH_ARITH_F32] = { "f32", 0.99999 },
	[Q4KH_ARITH_F16] = { "f16", 0.9999 },
	[Q4KH_ARITH_INT16] = { "int16", 0.9999 },
	[Q4KH_ARITH_INT8] = { "int8", 0.99 },
};

int q4kh_f2_arith_known(uint32_t arith)
{
	return arith < sizeof(arith_classes) / sizeof(arith_classes[0]);
}

const char *q4kh_f2_arith_name(uint32_t arith)
{
	return q4kh_f2_arith_known(arith) ? arith_classes[arith].name : "unknown";
}

uint32_t q4kh_f2_arith_of_name(const char *name)
{
	for (uint32_t a = 0; name && q4kh_f2_arith_known(a); a++)
		if (!strcmp(name, arith_classes[a].name))
			return a;
	return Q4KH_ARITH_UNDECLARED;
}

double q4kh_f2_arith_floor(uint32_t arith)
{
	return q4kh_f2_arith_known(arith) ? arith_classes[arith].floor : Q4KH_F2_FLOOR_DEFAULT;
}

uint32_t q4kh_f2_arith_coarsest(uint32_t a, uint32_t b)
{
	if (a == Q4KH_ARITH_UNDECLARED || b == Q4KH_ARITH_UNDECLARED)
		return Q4KH_ARITH_UNDECLARED;
	return a > b ? a : b;
}

void q4kh_f2_rules_class(struct q4kh_f2_rules *r, uint32_t arith)
{
	r->arith = arith;
	r->floor = q4kh_f2_arith_floor(arith);
	r->floor_set = 0;
}

const char *q4kh_f2_floor_source(const struct q4kh_f2_rules *r)
{
	static const char *const of_class[] = {
		[Q4KH_ARITH_UNDECLARED] = "no arithmetic class declared",
		[Q4KH_ARITH_EXACT] = "exact arithmetic",
		[Q4KH_ARITH_F32] = "f32 arithmetic",
		[Q4KH_ARITH_F16] = "f16 arithmetic",
		[Q4KH_ARITH_INT16] = "int16 arithmetic",
		[Q4KH_ARITH_INT8] = "int8 arithmetic",
	};

	if (r->floor_set)
		return "set by f2_floor";
	return q4kh_f2_arith_known(r->arith) ? of_class[r->arith] : of_class[0];
}

void q4kh_f2_rules_default(struct q4kh_f2_rules *r)
{
	q4kh_f2_rules_class(r, Q4KH_ARITH_UNDECLARED);
	r->near_tie_cosine = 0.98;
	r->near_tie_logits = 0.5;
	r->decode_steps = 8;
	r->probe_tokens = 64;
}

struct q4kh_f2_threshold_text q4kh_f2_threshold(double v)
{
	struct q4kh_f2_threshold_text t;

	for (int digits = 2; digits <= 17; digits++) {
		snprintf(t.s, sizeof(t.s), "%.*f", digits, v);
		if (strtod(t.s, NULL) == v)
			break;
	}
	return t;
}

const char *q4kh_f2_verdict_name(enum q4kh_f2_verdict v)
{
	switch (v) {
	case Q4KH_F2_PASS: return "pass";
	case Q4KH_F2_REJECT: return "reject";
	case Q4KH_F2_BROKEN: return "broken";
	case Q4KH_F2_NOT_MEASURED: return "not measured";
	}
	return "unknown";
}

const char *q4kh_f2_message_after_verdict(enum q4kh_f2_verdict v, const char *message)
{
	const char *name = q4kh_f2_verdict_name(v);
	size_t len = strlen(name);

	return !strncmp(message, name, len) && !strncmp(message + len, ": ", 2) ? message + len + 2
	                                                                       : message;
}

/* Index of the largest finite value (lowest index on ties), -1 if none. */
static int32_t finite_argmax(const float *v, int64_t n)
{
	int32_t best = -1;

	for (int64_t i = 0; i < n; i++)
		if (isfinite(v[i]) && (best < 0 || v[i] > v[best]))
			best = (int32_t)i;
	return best;
}

enum q4kh_f2_verdict q4kh_f2_cosine_verdict(double cos, const struct q4kh_f2_rules *rules)
{
	/* NaN (F2.1: NaN/Inf logits or a vector of zeros) fails both tests */
	if (isnan(cos))
		return Q4KH_F2_REJECT;
	if (!(cos >= Q4KH_F2_CATASTROPHIC))
		return Q4KH_F2_BROKEN;
	return cos >= rules->floor ? Q4KH_F2_PASS : Q4KH_F2_REJECT;
}

void q4kh_f2_judge(const float *ref, const float *cand, int64_t n,
                   const struct q4kh_f2_rules *rules, struct q4kh_f2_point *pt)
{
	double ab = 0, aa = 0, bb = 0, second = -INFINITY;
	int bad_ref = 0, bad_cand = 0;

	for (int64_t i = 0; i < n; i++) {
		bad_ref |= !isfinite(ref[i]);
		bad_cand |= !isfinite(cand[i]);
		ab += (double)ref[i] * cand[i];
		aa += (double)ref[i] * ref[i];
		bb += (double)cand[i] * cand[i];
	}
	pt->ref_argmax = finite_argmax(ref, n);
	pt->cand_argmax = finite_argmax(cand, n);
	for (int64_t i = 0; i < n; i++)
		if (i != pt->ref_argmax && isfinite(ref[i]) && ref[i] > second)
			second = ref[i];
	pt->ref_margin = pt->ref_argmax >= 0 ? ref[pt->ref_argmax] - second : NAN;
	pt->ref_gap = pt->ref_argmax >= 0 && pt->cand_argmax >= 0
	                      ? (double)ref[pt->ref_argmax] - ref[pt->cand_argmax]
	                      : NAN;
	pt->nonfinite = bad_cand ? 1 : bad_ref ? 2 : 0;
	pt->zero_norm = aa == 0 || bb == 0;
	pt->cosine = pt->nonfinite || pt->zero_norm ? NAN : ab / sqrt(aa * bb);
	/* Every comparison is written so that NaN fails it (F2.1). */
	pt->near_tie = pt->ref_argmax != pt->cand_argmax &&
	               pt->cosine >= rules->near_tie_cosine &&
	               pt->ref_gap <= rules->near_tie_logits;
	pt->verdict = Q4KH_F2_PASS;
	pt->rule = NULL;
	pt->computed = 1;
	if (!pt->judged)
		return;
	pt->verdict = q4kh_f2_cosine_verdict(pt->cosine, rules);
	if (pt->verdict != Q4KH_F2_PASS) {
		pt->rule = isnan(pt->cosine) ? "F2.1" : "F2.2";
		pt->near_tie = 0;
	} else if (pt->ref_argmax != pt->cand_argmax && !pt->near_tie) {
		pt->verdict = Q4KH_F2_REJECT;
		pt->rule = "F2.3";
	}
}

int q4kh_f2_cosine_digits(const struct q4kh_f2_rules *rules)
{
	const int floor_digits = (int)strlen(q4kh_f2_threshold(rules->floor).s) - 2;

	return floor_digits + 2 > 4 ? floor_digits + 2 : 4;
}

void q4kh_f2_describe(const struct q4kh_f2_point *pt,
                      const struct q4kh_f2_rules *rules, char *buf, size_t cap)
{
	const int digits = q4kh_f2_cosine_digits(rules);
	char where[200], argmax[160], what[200];

	char pages[40] = "";

	if (pt->paged)
		snprintf(pages, sizeof(pages), " over pages of %d tokens", pt->paged);
	if (pt->batch)
		snprintf(where, sizeof(where),
		         "batched step of %d sequences%s, sequence %d, position %lld (its decode "
		         "step %d%s)",
		         pt->batch, pages, pt->seq, (long long)pt->position, pt->decode_step,
		         pt->seq == pt->batch - 1 && pt->decode_step == 0
		                 ? ", the last token of a prompt chunk: a mixed step"
		                 : "");
	else if (pt->decode_step >= 0)
		snprintf(where, sizeof(where), "position %lld (decode step %d)",
		         (long long)pt->position, pt->decode_step);
	else if (pt->narrow)
		snprintf(where, sizeof(where), "position %lld (prefill in a step of %d tokens)",
		         (long long)pt->position, pt->narrow);
	else
		snprintf(where, sizeof(where), "position %lld (prefill)",
		         (long long)pt->position);
	if (pt->ref_argmax == pt->cand_argmax)
		snprintf(argmax, sizeof(argmax), "argmax %d (agrees)", pt->ref_argmax);
	else
		snprintf(argmax, sizeof(argmax),
		         "argmax %d (reference) vs %d (candidate), reference gap %.3f",
		         pt->ref_argmax, pt->cand_argmax, pt->ref_gap);
	if (pt->nonfinite)
		snprintf(what, sizeof(what), "%s logits hold NaN or Inf (F2.1)",
		         pt->nonfinite == 1 ? "candidate" : "reference");
	else if (pt->zero_norm)
		snprintf(what, sizeof(what), "a logit vector is all zeros (F2.1)");
	else if (!(pt->cosine >= Q4KH_F2_CATASTROPHIC))
		snprintf(what, sizeof(what), "cosine %.4f < %s catastrophic floor",
		         pt->cosine, q4kh_f2_threshold(Q4KH_F2_CATASTROPHIC).s);
	else if (pt->judged && !(pt->cosine >= rules->floor))
		snprintf(what, sizeof(what), "cosine %.*f < %s acceptance floor (%s)", digits,
		         pt->cosine, q4kh_f2_threshold(rules->floor).s,
		         q4kh_f2_floor_source(rules));
	else if (pt->ref_argmax != pt->cand_argmax && !pt->near_tie)
		snprintf(what, sizeof(what),
		         "cosine %.*f, argmax differs beyond a near-tie (F2.3: needs cosine >= %s and a reference gap <= %s)",
		         digits, pt->cosine, q4kh_f2_threshold(rules->near_tie_cosine).s,
		         q4kh_f2_threshold(rules->near_tie_logits).s);
	else
		snprintf(what, sizeof(what), "cosine %.*f%s", digits, pt->cosine,
		         pt->near_tie ? ", a tolerated near-tie" : "");
	snprintf(buf, cap, "%s: %s, %s", where, argmax, what);
}

void q4kh_f2_result_free(struct q4kh_f2_result *r)
{
	free(r->points);
	r->points = NULL;
}

/* Higher is worse: NOT_MEASURED > BROKEN > REJECT > PASS. */
static int severity(enum q4kh_f2_verdict v)
{
	switch (v) {
	case Q4KH_F2_NOT_MEASURED: return 3;
	case Q4KH_F2_BROKEN: return 2;
	case Q4KH_F2_REJECT: return 1;
	default: return 0;
	}
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Fail closed: a side that could not run decides the verdict (F2.4). */
static void not_measured(struct q4kh_f2_result *out, const char *side,
                         const char *phase, const struct q4kh_error *e)
{
	out->verdict = Q4KH_F2_NOT_MEASURED;
	snprintf(out->message, sizeof(out->message),
	         "not measured: the %s failed in %s (F2.4): %.400s", side, phase, e->msg);
}

/*
 * The message of verdict V decided at WORST (q4kh_f2_conclude's): the line
 * that describes WORST, after a summary over JUDGED positions and
 * NEAR_TIES when V is a pass.
 */
static void verdict_message(char *buf, size_t cap, enum q4kh_f2_verdict v,
                            const struct q4kh_f2_point *worst, int64_t judged, int near_ties,
                            const struct q4kh_f2_rules *rules)
{
	char line[512];

	q4kh_f2_describe(worst, rules, line, sizeof(line));
	if (v != Q4KH_F2_PASS)
		snprintf(buf, cap, "%s", line);
	else
		snprintf(buf, cap,
		         "pass over %lld judged position%s at the %s acceptance floor (%s), %d near-tie%s; lowest at %.380s",
		         (long long)judged, judged == 1 ? "" : "s", q4kh_f2_threshold(rules->floor).s,
		         q4kh_f2_floor_source(rules), near_ties, near_ties == 1 ? "" : "s", line);
}

void q4kh_f2_conclude(struct q4kh_f2_result *out, const struct q4kh_f2_rules *rules)
{
	int64_t judged = 0;

	out->verdict = Q4KH_F2_PASS;
	out->min_cosine = INFINITY;
	out->worst = -1;
	out->near_ties = 0; /* concluded again after the narrow steps */
	for (int64_t i = 0; i < out->n_points; i++) {
		const struct q4kh_f2_point *pt = &out->points[i];
		if (!pt->judged)
			continue;
		judged++;
		out->near_ties += pt->near_tie;
		if (isnan(pt->cosine) ||
		    (!isnan(out->min_cosine) && pt->cosine < out->min_cosine))
			out->min_cosine = pt->cosine; /* NaN sticks */
		/* The first point of the worst severity: where trouble starts. */
		if (severity(pt->verdict) > severity(out->verdict)) {
			out->verdict = pt->verdict;
			out->worst = i;
		} else if (out->verdict == Q4KH_F2_PASS &&
		           (out->worst < 0 || pt->cosine < out->points[out->worst].cosine)) {
			out->worst = i;
		}
	}
	if (out->worst < 0) {
		out->verdict = Q4KH_F2_NOT_MEASURED;
		snprintf(out->message, sizeof(out->message),
		         "not measured: no position could be judged (F2.4)");
		return;
	}
	verdict_message(out->message, sizeof(out->message), out->verdict,
	                &out->points[out->worst], judged, out->near_ties, rules);
}

int q4kh_f2_message_matches(const char *message, const struct q4kh_f2_result *res,
                            const struct q4kh_f2_rules *rules)
{
	struct q4kh_f2_point w;
	const char *argmax = strstr(message, "argmax "), *narrow;
	char want[sizeof(res->message)];
	int64_t judged = 0;

	if (res->worst < 0)
		return !strcmp(message, res->message);
	for (int64_t i = 0; i < res->n_points; i++)
		judged += res->points[i].judged != 0;
	w = res->points[res->worst];
	/* What a receipt's point does not keep, as MESSAGE says it. */
	if (!argmax)
		return 0;
	if (sscanf(argmax, "argmax %d (reference) vs %d (candidate), reference gap %lf",
	           &w.ref_argmax, &w.cand_argmax, &w.ref_gap) != 3) {
		if (sscanf(argmax, "argmax %d (agrees)", &w.ref_argmax) != 1)
			return 0;
		w.cand_argmax = w.ref_argmax;
	}
	/* Where the cosine passes, the argmaxes differ exactly at a
	 * tolerated near-tie and at an F2.3 rejection. */
	if (q4kh_f2_cosine_verdict(w.cosine, rules) == Q4KH_F2_PASS &&
	    (w.ref_argmax == w.cand_argmax) != (w.verdict == Q4KH_F2_PASS && !w.near_tie))
		return 0;
	w.paged = 0;
	if (w.batch && strstr(message, " over pages of ") &&
	    sscanf(strstr(message, " over pages of "), " over pages of %d tokens", &w.paged) != 1)
		return 0;
	narrow = strstr(message, "(prefill in a step of ");
	w.narrow = 0;
	if (narrow && w.decode_step < 0 &&
	    sscanf(narrow, "(prefill in a step of %d tokens)", &w.narrow) != 1)
		return 0;
	w.nonfinite = isnan(w.cosine) && strstr(message, "candidate logits hold") ? 1
	              : isnan(w.cosine) && strstr(message, "reference logits hold") ? 2
	                                                                             : 0;
	w.zero_norm = isnan(w.cosine) && !w.nonfinite;
	verdict_message(want, sizeof(want), res->verdict, &w, judged, res->near_ties, rules);
	return !strcmp(message, want);
}

int64_t q4kh_f2_plan_points(const struct q4kh_f2_plan *plan)
{
	return plan->prefill + plan->decode_steps + plan->batched;
}

int64_t q4kh_f2_batch_length(int64_t prefill, int32_t seq)
{
	const int64_t reach = prefill < Q4KH_F2_BATCH_REACH ? prefill : Q4KH_F2_BATCH_REACH;
	/* the longest leaves room for its decode steps within the reach */
	const int64_t top = reach - Q4KH_F2_BATCH_STEPS;

	if (top < Q4KH_F2_BATCH_SEQS)
		return 0;
	return top - seq * ((top - 1) / (Q4KH_F2_BATCH_SEQS - 1));
}

struct q4kh_f2_plan q4kh_f2_probe_plan(size_t n, const struct q4kh_f2_rules *rules)
{
	const int64_t p = (int64_t)(n < rules->probe_tokens ? n : rules->probe_tokens);

	return (struct q4kh_f2_plan){ p, rules->decode_steps, NULL,
		                      q4kh_f2_batch_length(p, 0)
		                              ? Q4KH_F2_BATCH_SEQS * Q4KH_F2_BATCH_STEPS
		                              : 0 };
}

void q4kh_f2_plan_point(const struct q4kh_f2_plan *plan, int64_t i, struct q4kh_f2_point *pt)
{
	const int64_t j = i - plan->prefill - plan->decode_steps; /* a batched point's */

	*pt = (struct q4kh_f2_point){ .position = i,
		                      .decode_step = i < plan->prefill ? -1
		                                                       : (int32_t)(i - plan->prefill),
		                      .cosine = NAN,
		                      .ref_argmax = -1,
		                      .cand_argmax = -1,
		                      .judged = plan->judged ? plan->judged[i] != 0 : i >= 1,
		                      .computed = !plan->judged || plan->judged[i] };
	if (j < 0)
		return;
	/* step by step, so that the first of them that fails is the earliest */
	pt->batch = Q4KH_F2_BATCH_SEQS;
	pt->seq = (int32_t)(j % Q4KH_F2_BATCH_SEQS);
	pt->decode_step = (int32_t)(j / Q4KH_F2_BATCH_SEQS);
	pt->position = q4kh_f2_batch_length(plan->prefill, pt->seq) + pt->decode_step;
}

/*
 * A run's memory: OUT's ROWS points, and N_ROWS rows of V logits for each
 * side into *RL and *CL. -1 with err, nothing kept, on out of memory.
 */
static int run_alloc(struct q4kh_f2_result *out, int64_t rows, int64_t n_rows, int64_t v,
                     float **rl, float **cl, struct q4kh_error *err)
{
	*rl = malloc(sizeof(float) * (size_t)(n_rows * v));
	*cl = malloc(sizeof(float) * (size_t)(n_rows * v));
	out->points = calloc((size_t)rows, sizeof(*out->points));
	if (*rl && *cl && out->points)
		return 0;
	free(*rl);
	free(*cl);
	q4kh_f2_result_free(out);
	return q4kh_fail(err, "F2: out of memory for 2 x %lld x %lld logits", (long long)n_rows,
	                 (long long)v);
}

/*
 * One teacher-forced decode step of TOK (the reference's greedy token) on
 * both sides, logits into RL and CL; -1 with OUT not measured (F2.4) when
 * a side fails.
 */
static int decode_both(struct q4kh_f2_ref *ref, struct q4kh_session *cand, int32_t tok,
                       float *rl, float *cl, struct q4kh_f2_result *out)
{
	struct q4kh_error e = { { 0 } };

	if (tok < 0 || q4kh_f2_ref_eval(ref, &tok, 1, rl, NULL, &e)) {
		not_measured(out, "reference", "a decode step", &e);
		return -1;
	}
	if (q4kh_session_eval(cand, &tok, 1, cl, 1, &e)) {
		not_measured(out, "candidate", "a decode step", &e);
		return -1;
	}
	return 0;
}

/* A run's end: its seconds since T0, both sessions reset, the logits freed. */
static void run_end(struct q4kh_f2_result *out, double t0, struct q4kh_f2_ref *ref,
                    struct q4kh_session *cand, float *rl, float *cl)
{
	out->seconds = now() - t0;
	q4kh_f2_ref_end(ref);
	q4kh_f2_ref_reset(ref);
	q4kh_session_reset(cand);
	free(rl);
	free(cl);
}

/*
 * The narrow steps: CAND runs PROBE[0..) again from an empty cache in steps
 * of 2, 3, .., Q4KH_F2_NARROW_MAX tokens (as far as P allows; never one,
 * decode's width), each position judged against the reference's logits
 * in RL (row i for position i; CL is scratch for as many rows). When they
 * are worse than OUT's own verdict, their worse points replace OUT's and
 * OUT is concluded again; otherwise OUT stays as it is. A failed step is
 * a failed measurement (F2.4).
 */
/* The narrow steps' tokens: 2 + 3 + .. + Q4KH_F2_NARROW_MAX. */
#define NARROW_TOKENS (Q4KH_F2_NARROW_MAX * (Q4KH_F2_NARROW_MAX + 1) / 2 - 1)

static void narrow_steps(struct q4kh_session *cand, const int32_t *probe, int64_t p,
                         const float *rl, float *cl, int64_t v,
                         const struct q4kh_f2_rules *rules, struct q4kh_f2_result *out)
{
	struct q4kh_f2_point pts[NARROW_TOKENS];
	struct q4kh_f2_result narrow = { .points = pts, .n_points = 0 };
	struct q4kh_error e = { { 0 } };
	int64_t c = 0;

	q4kh_session_reset(cand);
	for (int32_t w = 2; w <= Q4KH_F2_NARROW_MAX && p - c >= 2; w++) {
		const int64_t t = p - c < w ? p - c : w;

		if (q4kh_session_eval(cand, probe + c, t, cl + c * v, 1, &e)) {
			not_measured(out, "candidate", "a narrow prefill step", &e);
			return;
		}
		for (int64_t i = c; i < c + t; i++) {
			struct q4kh_f2_point *pt = &pts[narrow.n_points++];

			*pt = (struct q4kh_f2_point){ .position = i, .decode_step = -1,
				                      .judged = i >= 1, .narrow = (int32_t)t };
			q4kh_f2_judge(rl + i * v, cl + i * v, v, rules, pt);
		}
		c += t;
	}
	q4kh_f2_conclude(&narrow, rules);
	if (severity(narrow.verdict) <= severity(out->verdict))
		return;
	for (int64_t k = 0; k < narrow.n_points; k++) {
		struct q4kh_f2_point *pt = &out->points[pts[k].position];

		if (severity(pts[k].verdict) > severity(pt->verdict))
			*pt = pts[k];
	}
	q4kh_f2_conclude(out, rules);
}

/*
 * PROBE[0..n) into S alone, as serve prefills a prompt: the whole blocks
 * of its start that HELD (NULL: none) has computed taken from HELD's cache
 * (q4kh_session_take_prefix) as serve's prefix reuse takes them (at most
 * all but the last token, kv_prefix.h), the rest in steps of its n_batch;
 * -1 with E on a failure.
 */
static int prefill_alone(struct q4kh_session *s, const struct q4kh_session *held,
                         const int32_t *probe, int64_t n, struct q4kh_error *e)
{
	int64_t c = 0;

	if (held) {
		c = (n - 1) / Q4KH_PREFIX_BLOCK * Q4KH_PREFIX_BLOCK;
		c = c < held->n_past ? c : held->n_past / Q4KH_PREFIX_BLOCK * Q4KH_PREFIX_BLOCK;
		if (c > 0 && q4kh_session_take_prefix(s, held, 0, c, e))
			return -1;
	}
	for (; c < n; c += s->p.n_batch) {
		const int64_t t = n - c < s->p.n_batch ? n - c : s->p.n_batch;

		if (q4kh_session_eval(s, probe + c, t, NULL, 0, e))
			return -1;
	}
	return 0;
}

/* One step of the batched steps: B[0..n) together, as serve decodes its
 * slots, or each alone in turn on a model whose sessions cannot batch. */
static int step_together(struct q4kh_batch_seq *b, int32_t n, struct q4kh_error *e)
{
	if (q4kh_session_batchable(b[0].s))
		return q4kh_session_eval_batch(b, n, e);
	for (int32_t j = 0; j < n; j++)
		if (b[j].n_ids ? q4kh_session_eval(b[j].s, b[j].ids, b[j].n_ids, b[j].logits, 0, e)
		               : q4kh_session_eval(b[j].s, &b[j].id, 1, b[j].logits, 1, e))
			return -1;
	return 0;
}

/* The prompt chunk of the batched steps' mixed step, at most: several
 * tokens of one sequence beside one of each other sequence. */
#define F2_MIXED_CHUNK 8

/*
 * The batched steps of PLAN (q4kh_f2_batch_length): CAND, emptied, and
 * sessions of its model opened for the others (with PAGED, four sessions
 * on those pools instead of CAND and three) each prefill their prefix
 * of PROBE alone (the others taking the whole blocks of it that the first
 * computed from its cache, as serve's prefix reuse does), then
 * decode Q4KH_F2_BATCH_STEPS steps together, fed the
 * probe's next tokens. The last sequence leaves its prefix's last
 * F2_MIXED_CHUNK tokens (fewer when it is shorter) to the first step,
 * whose column for it is that chunk and its token: a mixed step, a
 * prompt's chunk beside the others' decoded tokens, as serve's continuous
 * batching runs them. Each sequence's logits (into CL, a row each) are
 * judged against the reference's prefill logits RL of its position, into
 * PTS (OUT's points, or as many). -1 with OUT not measured (F2.4) when a
 * session cannot open or a step fails.
 */
static int batched_steps(struct q4kh_session *cand, const int32_t *probe,
                         const struct q4kh_f2_plan *plan, const float *rl, float *cl, int64_t v,
                         const struct q4kh_f2_rules *rules, struct q4kh_kv_paged *paged,
                         struct q4kh_f2_point *pts, struct q4kh_f2_result *out)
{
	struct q4kh_session *s[Q4KH_F2_BATCH_SEQS] = { paged ? NULL : cand };
	struct q4kh_batch_seq b[Q4KH_F2_BATCH_SEQS];
	int64_t len[Q4KH_F2_BATCH_SEQS];
	struct q4kh_session_params sp = cand->p;
	struct q4kh_error e = { { 0 } };
	const char *phase = "the batched steps' prefill";
	const int32_t last = Q4KH_F2_BATCH_SEQS - 1;
	int64_t chunk;
	int rc = -1;

	if (!plan->batched)
		return 0;
	for (int32_t j = 0; j < Q4KH_F2_BATCH_SEQS; j++)
		len[j] = q4kh_f2_batch_length(plan->prefill, j);
	chunk = len[last] < F2_MIXED_CHUNK ? len[last] : F2_MIXED_CHUNK;
	/* the others only prefill their prefix: no larger steps than that
	 * (a GPU's scratch for 512 tokens, three times over, on a large
	 * model); the batched step runs in cand's scratch */
	sp.n_batch = sp.n_batch < len[0] ? sp.n_batch : (uint32_t)len[0];
	sp.paged = paged;
	for (int32_t j = paged ? 0 : 1; j < Q4KH_F2_BATCH_SEQS; j++) {
		if (q4kh_session_new(cand->m, &sp, &s[j], &e)) {
			phase = "opening the batched steps' sessions";
			goto out;
		}
	}
	q4kh_session_reset(cand);
	for (int32_t j = 0; j < Q4KH_F2_BATCH_SEQS; j++)
		if (prefill_alone(s[j], j && q4kh_session_batchable(cand) ? s[0] : NULL, probe,
		                  len[j] - (j == last ? chunk : 0), &e))
			goto out;
	phase = "a batched step";
	for (int32_t k = 0; k < Q4KH_F2_BATCH_STEPS; k++) {
		const int64_t first = plan->prefill + plan->decode_steps + k * Q4KH_F2_BATCH_SEQS;

		for (int32_t j = 0; j < Q4KH_F2_BATCH_SEQS; j++)
			b[j] = (struct q4kh_batch_seq){ .s = s[j], .id = probe[len[j] + k],
			                                .logits = cl + j * v, .token = -1 };
		if (k == 0 && chunk) {
			b[last].ids = probe + len[last] - chunk;
			b[last].n_ids = (int32_t)chunk + 1;
		}
		if (step_together(b, Q4KH_F2_BATCH_SEQS, &e))
			goto out;
		for (int32_t j = 0; j < Q4KH_F2_BATCH_SEQS; j++) {
			struct q4kh_f2_point *pt = &pts[first + j];

			q4kh_f2_plan_point(plan, first + j, pt);
			pt->paged = paged ? paged->pool.page_size : 0;
			q4kh_f2_judge(rl + pt->position * v, cl + j * v, v, rules, pt);
		}
	}
	rc = 0;
out:
	if (rc)
		not_measured(out, "candidate", phase, &e);
	for (int32_t j = paged ? 0 : 1; j < Q4KH_F2_BATCH_SEQS; j++)
		if (s[j])
			q4kh_session_free(s[j]);
	q4kh_session_reset(cand);
	return rc;
}

/*
 * Rule set 6: on a backend with attention_paged and a model that batches,
 * the batched steps again on pools of pages of Q4KH_F2_PAGE tokens (room
 * for every sequence's tokens and a copied page each); each of OUT's
 * batched points takes the paged run's where that one is worse. -1 with
 * OUT not measured (F2.4) when the pools cannot be made or a step fails.
 */
static int paged_steps(struct q4kh_session *cand, const int32_t *probe,
                       const struct q4kh_f2_plan *plan, const float *rl, float *cl, int64_t v,
                       const struct q4kh_f2_rules *rules, struct q4kh_f2_result *out)
{
	const int64_t first = plan->prefill + plan->decode_steps;
	const int32_t pages = Q4KH_F2_BATCH_SEQS *
	                      ((Q4KH_F2_BATCH_REACH + Q4KH_F2_PAGE - 1) / Q4KH_F2_PAGE + 1);
	struct q4kh_kv_paged *paged = NULL;
	struct q4kh_f2_point *pts;
	struct q4kh_error e = { { 0 } };
	int rc;

	if (!plan->batched || !q4kh_session_batchable(cand) ||
	    !Q4KH_BACKEND_HAS(cand->b->v, attention_paged))
		return 0;
	pts = calloc((size_t)q4kh_f2_plan_points(plan), sizeof(*pts));
	if (!pts || q4kh_kv_paged_new(cand->m, pages, Q4KH_F2_PAGE, cand->stats.kv_type, &paged,
	                              &e)) {
		if (!pts)
			q4kh_fail(&e, "out of memory");
		not_measured(out, "candidate", "the paged batched steps' pools", &e);
		free(pts);
		return -1;
	}
	rc = batched_steps(cand, probe, plan, rl, cl, v, rules, paged, pts, out);
	for (int64_t i = first; !rc && i < first + plan->batched; i++)
		if (severity(pts[i].verdict) > severity(out->points[i].verdict))
			out->points[i] = pts[i];
	q4kh_kv_paged_free(paged);
	free(pts);
	return rc;
}

int q4kh_f2_run(struct q4kh_f2_ref *ref, struct q4kh_session *cand,
                const int32_t *tokens, size_t n,
                const struct q4kh_f2_rules *rules, struct q4kh_f2_result *out,
                struct q4kh_error *err)
{
	const int64_t v = ref->n_vocab;
	const struct q4kh_f2_plan plan = q4kh_f2_probe_plan(n, rules);
	const int64_t p = plan.prefill;
	const int64_t rows = p + plan.decode_steps;
	const int32_t *probe = tokens + (n - (size_t)p);
	struct q4kh_error e = { { 0 } };
	float *rl, *cl;
	double t0 = now();
	int rc;

	memset(out, 0, sizeof(*out));
	if (p < 2 || cand->m->hp.n_vocab != v)
		return q4kh_fail(err, "F2 needs a probe of at least 2 tokens and two sessions of one vocabulary");
	/* the narrow steps read the prefill's rows: nothing more to keep */
	rc = q4kh_f2_ref_begin(ref, &(struct q4kh_f2_ref_shape){ "probe", probe, p, NULL,
	                                                         plan.decode_steps, 0, 0, rows },
	                       err);
	if (rc)
		return rc;
	if (run_alloc(out, q4kh_f2_plan_points(&plan), rows, v, &rl, &cl, err)) {
		q4kh_f2_ref_end(ref);
		return -1;
	}
	q4kh_f2_ref_reset(ref);
	q4kh_session_reset(cand);
	if (q4kh_f2_ref_eval(ref, probe, p, rl, NULL, &e)) {
		not_measured(out, "reference", "prefill", &e);
		goto done;
	}
	if (q4kh_session_eval(cand, probe, p, cl, 1, &e)) {
		not_measured(out, "candidate", "prefill", &e);
		goto done;
	}
	for (int64_t s = 0; s < (int64_t)plan.decode_steps; s++) {
		const int64_t row = p + s;
		/* Teacher forcing: both sides take the reference's greedy token. */
		int32_t tok = q4kh_argmax(rl + (row - 1) * v, (int32_t)v);

		if (decode_both(ref, cand, tok, rl + row * v, cl + row * v, out))
			goto done;
	}
	for (int64_t i = 0; i < rows; i++) {
		q4kh_f2_plan_point(&plan, i, &out->points[i]);
		q4kh_f2_judge(rl + i * v, cl + i * v, v, rules, &out->points[i]);
	}
	/* the judged rows of CL are free again: the batched steps' scratch */
	if (batched_steps(cand, probe, &plan, rl, cl, v, rules, NULL, out->points, out) ||
	    paged_steps(cand, probe, &plan, rl, cl, v, rules, out))
		goto done;
	/* The narrow steps weigh against the one-sequence points, and come
	 * first where both find trouble: a step of 4 sequences multiplies 4
	 * columns at once, the narrow steps' width that names the cause. */
	out->n_points = rows;
	q4kh_f2_conclude(out, rules);
	narrow_steps(cand, probe, p, rl, cl, v, rules, out);
	if (out->verdict != Q4KH_F2_NOT_MEASURED) {
		out->n_points = q4kh_f2_plan_points(&plan);
		q4kh_f2_conclude(out, rules);
	}
done:
	run_end(out, t0, ref, cand, rl, cl);
	return 0;
}

/* A deep run's reference side, the same for every candidate of one chunk
 * size NB: its rows and the logits a side holds at once. */
struct plan_shape {
	int64_t narrow;   /* the narrow steps' tokens: at most a chunk */
	int64_t n_judged; /* judged prefill positions */
	int64_t n_rows;   /* logit rows held: the most judged of one chunk,
	                     the narrow steps' tokens, a decode step */
};

/* How many of JUDGED[c .. c+t) are set. */
static int64_t judged_in(const uint8_t *judged, int64_t c, int64_t t)
{
	int64_t n = 0;

	for (int64_t i = c; i < c + t; i++)
		n += judged[i] != 0;
	return n;
}

/* Whether a deep plan's flags JUDGED judge its last prefill position (its
 * argmax feeds the first decode step) and every decode step. */
static int plan_flags_ok(int64_t prefill, const uint8_t *judged, uint32_t decode_steps)
{
	if (prefill < 2 || !judged[prefill - 1])
		return 0;
	for (int64_t i = prefill; i < prefill + decode_steps; i++)
		if (!judged[i])
			return 0;
	return 1;
}

static struct plan_shape plan_shape(int64_t prefill, const uint8_t *judged, int64_t nb)
{
	struct plan_shape p = { 0, 0, 1 };

	p.narrow = prefill < NARROW_TOKENS && prefill < nb ? prefill
	           : NARROW_TOKENS < nb                    ? NARROW_TOKENS
	                                                   : nb;
	for (int64_t c = 0; c < prefill; c += nb) {
		const int64_t in_chunk = judged_in(judged, c, prefill - c < nb ? prefill - c : nb);

		p.n_judged += in_chunk;
		p.n_rows = in_chunk > p.n_rows ? in_chunk : p.n_rows;
	}
	p.n_rows = p.narrow > p.n_rows ? p.narrow : p.n_rows;
	return p;
}

/* The shared file's description of a deep run's reference rows. The chunk
 * is 0: the reference's logits are the same bits however its prefill is
 * cut into steps, so one recording serves every candidate. */
static struct q4kh_f2_ref_shape plan_ref_shape(const int32_t *tokens, int64_t prefill,
                                               const uint8_t *judged, uint32_t decode_steps,
                                               const struct plan_shape *p)
{
	return (struct q4kh_f2_ref_shape){ "plan", tokens, prefill, judged, decode_steps, 0,
		                           p->narrow, p->n_judged + decode_steps + p->narrow };
}

int q4kh_f2_record_plan(struct q4kh_f2_ref *ref, const int32_t *tokens, int64_t prefill,
                        const uint8_t *judged, uint32_t decode_steps, int64_t nb,
                        void (*done)(void *data, int64_t positions, int64_t total),
                        void *done_data, struct q4kh_error *err)
{
	const int64_t v = ref->n_vocab, rows = prefill + decode_steps;
	const struct plan_shape p = plan_shape(prefill, judged, nb);
	const struct q4kh_f2_ref_shape shape =
		plan_ref_shape(tokens, prefill, judged, decode_steps, &p);
	const float *last = NULL;
	float *rl;
	int rc = -1;

	if (!plan_flags_ok(prefill, judged, decode_steps) || !ref->s || !ref->path)
		return q4kh_fail(err, "F2: recording the reference needs a probe of at least 2 tokens, its last one and its decode steps judged, a reference session and a file");
	if (q4kh_f2_ref_begin(ref, &shape, err))
		return -1;
	if (!(rl = malloc(sizeof(float) * (size_t)(p.n_rows * v)))) {
		q4kh_f2_ref_end(ref);
		return q4kh_fail(err, "F2: out of memory for %lld x %lld logits",
		                 (long long)p.n_rows, (long long)v);
	}
	q4kh_f2_ref_reset(ref);
	/* The rows in run_plan's order: each chunk's judged positions, the
	 * decode steps, the narrow steps' tokens. */
	for (int64_t c = 0; c < prefill; c += nb) {
		const int64_t t = prefill - c < nb ? prefill - c : nb;

		if (q4kh_f2_ref_eval(ref, tokens + c, t, rl, judged + c, err))
			goto out;
		/* the last position, judged, is the last chunk's last row */
		if (c + t == prefill)
			last = rl + (judged_in(judged, c, t) - 1) * v;
		if (done)
			done(done_data, c + t, rows);
	}
	for (int64_t row = prefill; row < rows; row++) {
		int32_t tok = q4kh_argmax(last, (int32_t)v);

		if (tok < 0 || q4kh_f2_ref_eval(ref, &tok, 1, rl, NULL, err))
			goto out;
		last = rl;
		if (done)
			done(done_data, row + 1, rows);
	}
	q4kh_f2_ref_reset(ref);
	rc = q4kh_f2_ref_eval(ref, tokens, p.narrow, rl, NULL, err);
out:
	q4kh_f2_ref_end(ref);
	free(rl);
	if (rc == 0 && !ref->recorded)
		rc = q4kh_fail(err, "F2: the reference's file %s was not written: %s", ref->path,
		               ref->unwritten);
	return rc;
}

int q4kh_f2_run_plan(struct q4kh_f2_ref *ref, struct q4kh_session *cand,
                     const int32_t *tokens, int64_t prefill, const uint8_t *judged,
                     uint32_t decode_steps, const struct q4kh_f2_rules *rules,
                     void (*done)(void *data, int64_t positions, int64_t total),
                     void *done_data, struct q4kh_f2_result *out, struct q4kh_error *err)
{
	const int64_t v = ref->n_vocab, nb = cand->p.n_batch;
	const int64_t rows = prefill + decode_steps;
	const struct plan_shape p = plan_shape(prefill, judged, nb);
	const int64_t narrow = p.narrow;
	const struct q4kh_f2_ref_shape shape =
		plan_ref_shape(tokens, prefill, judged, decode_steps, &p);
	struct q4kh_error e = { { 0 } };
	const float *last = NULL; /* the reference's logits of the last position */
	float *rl, *cl;
	double t0 = now();
	int rc;

	memset(out, 0, sizeof(*out));
	if (!plan_flags_ok(prefill, judged, decode_steps) || cand->m->hp.n_vocab != v)
		return q4kh_fail(err, "F2 needs a probe of at least 2 tokens, its last one and its decode steps judged, and two sessions of one vocabulary");
	rc = q4kh_f2_ref_begin(ref, &shape, err);
	if (rc)
		return rc;
	/* Logits are kept for the judged positions of a chunk, for the narrow
	 * steps' tokens and for a decode step, not for a whole chunk. */
	if (run_alloc(out, rows, p.n_rows, v, &rl, &cl, err)) {
		q4kh_f2_ref_end(ref);
		return -1;
	}
	for (int64_t i = 0; i < rows; i++)
		q4kh_f2_plan_point(&(struct q4kh_f2_plan){ prefill, decode_steps, judged, 0 }, i,
		                   &out->points[i]);
	q4kh_f2_ref_reset(ref);
	q4kh_session_reset(cand);
	for (int64_t c = 0; c < prefill; c += nb) {
		const int64_t t = prefill - c < nb ? prefill - c : nb;

		int64_t j = 0; /* the judged positions' rows, one after another */

		if (q4kh_session_eval_rows(cand, tokens + c, t, cl, judged + c, 0, &e)) {
			not_measured(out, "candidate", "prefill", &e);
			goto done;
		}
		/* The reference takes the chunk in one step too, the output
		 * projection on its judged rows alone: splitting the chunk at
		 * judged positions would read every weight again each step. */
		if (q4kh_f2_ref_eval(ref, tokens + c, t, rl, judged + c, &e)) {
			not_measured(out, "reference", "prefill", &e);
			goto done;
		}
		for (int64_t i = c; i < c + t; i++) {
			if (!judged[i])
				continue;
			q4kh_f2_judge(rl + j * v, cl + j * v, v, rules, &out->points[i]);
			/* the last position is judged: its row is the reference's
			 * last prefill logits, which pick the first decode token */
			if (i == prefill - 1)
				last = rl + j * v;
			j++;
		}
		if (done)
			done(done_data, c + t, rows);
	}
	for (int64_t row = prefill; row < rows; row++) {
		/* Teacher forcing: both sides take the reference's greedy token. */
		int32_t tok = q4kh_argmax(last, (int32_t)v);

		if (decode_both(ref, cand, tok, rl, cl, out))
			goto done;
		q4kh_f2_judge(rl, cl, v, rules, &out->points[row]);
		last = rl;
		if (done)
			done(done_data, row + 1, rows);
	}
	out->n_points = rows;
	q4kh_f2_conclude(out, rules);
	/* The narrow steps, against the reference's logits of their tokens,
	 * all judged here (positions below 128): computed again, as the
	 * chunks above kept none. */
	q4kh_f2_ref_reset(ref);
	if (q4kh_f2_ref_eval(ref, tokens, narrow, rl, NULL, &e)) {
		not_measured(out, "reference", "the narrow steps' prefill", &e);
		goto done;
	}
	narrow_steps(cand, tokens, narrow, rl, cl, v, rules, out);
done:
	run_end(out, t0, ref, cand, rl, cl);
	return 0;
}
