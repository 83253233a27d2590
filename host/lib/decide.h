/*
 * Whether a candidate serves: the one decision of run (q4kh_select),
 * serve's start-up and fall-back (receipts only; what none decides is
 * measured in the background), validate, bench and qa, from the
 * candidate and its F2 state (docs/f2.md, docs/architecture.md section 4):
 *  - the reference cpu backend with its built-in kernels serves, "not
 *    needed";
 *  - with F2 off any other serves, "off", loudly;
 *  - else a valid receipt decides (a deep receipt of every position first,
 *    for a guard of the built-in probe: guard.h), or, when measuring is
 *    allowed, a fresh measurement in a child process: pass serves, any
 *    other verdict rejects; with receipts only, a candidate that no
 *    receipt decides (or any, under --f2 fresh) is undecided.
 * Not thread-safe: one decider per thread.
 */
#ifndef Q4KH_DECIDE_H
#define Q4KH_DECIDE_H

#include <stddef.h>
#include <stdint.h>

#include "candidate.h"
#include "deep.h"
#include "error.h"
#include "guard.h"
#include "select.h"

/*
 * The guard a decision judges with. Either the caller's (G set, the rest
 * zero: validate, bench and qa open theirs with their own limits), or one
 * q4kh_decide_guard_open makes for a select request on first need (G NULL
 * until then), owning its probe tokens and deep plan.
 */
struct q4kh_decide_guard {
	struct q4kh_guard *g;
	struct q4kh_guard own;
	int32_t *probe;
	size_t n_probe;
	struct q4kh_deep_plan deep;
	char fresh_source[320];
};

/*
 * Open DG's own guard for RQ (its host context's model, registry, config
 * and tokenizer): on the deep probe when RQ asks for it (capped by
 * rq->deep_ctx), on RQ's prompt when it asks for that and the prompt has
 * at least Q4KH_F2_PROMPT_MIN_TOKENS, else on the built-in probe. The
 * guard's fresh source names where rq->mode was set. 0 with dg->g set;
 * -1 with err (the probe cannot be tokenized, the model hashed, a limit
 * of [f2] is bad). Release with q4kh_decide_guard_close.
 */
int q4kh_decide_guard_open(struct q4kh_decide_guard *dg, const struct q4kh_select_request *rq,
                           struct q4kh_error *err);
/* Free what q4kh_decide_guard_open made; a guard of the caller's stays. */
void q4kh_decide_guard_close(struct q4kh_decide_guard *dg);

enum q4kh_outcome {
	Q4KH_SERVES = 0, /* it may serve now */
	Q4KH_REJECTED,   /* F2 gave a verdict other than pass */
	Q4KH_UNDECIDED   /* receipts only, and none decides: measure it later */
};

/* How to decide. */
struct q4kh_decide_how {
	enum q4kh_f2_mode mode;
	const char *mode_origin; /* where MODE was set (settings.h); NULL: "default" */
	int receipts_only;       /* never measure: UNDECIDED instead */
	/* The request whose probe the decision describes (probe below), and
	 * from which a guard is opened on first need; NULL: no description,
	 * and DG must hold the caller's guard. */
	const struct q4kh_select_request *rq;
};

/* What q4kh_decide found for one candidate. */
struct q4kh_decision {
	enum q4kh_outcome outcome;
	/* 1: F2 judged it (a receipt or a measurement) and D holds the
	 * verdict, its source and the receipt, whose points are the caller's
	 * (q4kh_receipt_free); 0: the reference or F2 off, D zeroed */
	int judged;
	struct q4kh_guard_decision d;
	char verdict[32];  /* "pass", "reject", "broken", "not measured",
	                      "not needed", "off"; "" when UNDECIDED */
	char source[256];  /* "receipt of DATE", "deep receipt of DATE",
	                      "fresh: REASON", where F2 off was set; or "" */
	char message[512];
	/* With how->rq, for a judged candidate: the probe the verdict came
	 * from (select.h, q4kh_selection's f2_probe and the fields after it);
	 * a deep receipt that decided for a guard of another probe names
	 * itself ("deep probe of a deep receipt: ..."). "" otherwise. */
	char probe[384];
	enum q4kh_f2_probe_kind probe_kind;
	int64_t probe_tokens, probe_positions;
};

/*
 * Decide whether candidate C (on the device DEV describes) serves, as
 * HOW says, with DG's guard (opened from how->rq when it is needed and
 * not open yet). 0 with *OUT filled (free out->d.receipt's points with
 * q4kh_receipt_free when out->judged). -1 with err when F2 cannot decide
 * on C: its rules or receipt key cannot be computed, a child could not
 * start, or a signal stopped the measurement (interrupt.h;
 * q4kh_interrupted() tells); -2 with err when DG's guard cannot be opened,
 * so that no candidate can be judged. *OUT is then empty.
 */
int q4kh_decide(const struct q4kh_decide_how *how, struct q4kh_decide_guard *dg,
                const struct q4kh_candidate *c, const struct q4kh_device_record *dev,
                struct q4kh_decision *out, struct q4kh_error *err);

/*
 * D as selection S's F2 record: f2_verdict, f2_source, f2_message, and
 * the probe fields when D describes its probe (S's other fields stay).
 */
void q4kh_decision_record(const struct q4kh_decision *d, struct q4kh_selection *s);

/*
 * Append the line of a rejection D of the candidate called NAME to BUF
 * (CAP bytes, a string): "NAME: F2 VERDICT: WHY [SOURCE]\n", a receipt's
 * source with how to measure it again. Cut at CAP.
 */
void q4kh_decision_step(const struct q4kh_decision *d, const char *name, char *buf,
                        size_t cap);

#endif
