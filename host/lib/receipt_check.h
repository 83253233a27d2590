/*
 * Whether a receipt may be believed (docs/f2.md, "Receipts"): a receipt is
 * a file anyone who can write the receipt folder can edit, so nothing it
 * summarises is taken on its word. Its points must be those of the probe
 * plan its key determines (f2.h's struct q4kh_f2_plan), each mark one its
 * cosine allows, and its verdict, lowest cosine, deciding position, decode
 * step, near-ties and message those that F2's own conclusion
 * (q4kh_f2_conclude) derives from the points. A receipt that fails is void:
 * it reads as no receipt, and the candidate is measured again. Pure and
 * thread-safe.
 */
#ifndef Q4KH_RECEIPT_CHECK_H
#define Q4KH_RECEIPT_CHECK_H

#include "error.h"
#include "f2.h"
#include "receipt.h"

/* The F2 rules KEY's receipt was measured under: the defaults, with the
 * key's floor, decode steps and probe tokens. */
void q4kh_receipt_rules(const struct q4kh_receipt_key *key, struct q4kh_f2_rules *rules);

/*
 * Whether receipt R, read from the file PATH, says what its points say on
 * PLAN, the plan of its key (q4kh_guard_plan), under its key's rules
 * (q4kh_receipt_rules):
 *  - its created is a time as receipts write it (Q4KH_RECEIPT_TIME_FORMAT);
 *  - its points are PLAN's: as many, each at PLAN's decode step, and marked
 *    as PLAN treats its position ("unjudged": compared, not judged;
 *    "skipped": not compared; any other mark: judged);
 *  - each judged point's mark is one its cosine allows
 *    (q4kh_f2_cosine_verdict: "broken" exactly below the catastrophic
 *    floor, "reject" below the acceptance floor or for a null cosine, and
 *    above it "pass", "reject" (F2.3) or, from the near-tie cosine on,
 *    "near-tie");
 *  - verdict, min_cosine, worst_position, worst_decode_step and near_ties
 *    are q4kh_f2_conclude's over the points, and the message is the one it
 *    writes (q4kh_f2_message_matches);
 *  - a receipt without points (a measurement stopped by a crash or a
 *    limit, or a rejection by serve's shadow parity) is a rejection that
 *    names no position: verdict "reject" or "broken", min_cosine null,
 *    worst_position and worst_decode_step -1, near_ties 0.
 * 0 when it does; 1 with err in one line naming PATH and the first field
 * that disagrees, e.g. "receipt PATH: min_cosine 0.9990 but its points'
 * lowest judged cosine is 0.7060: ignored". -1 with err on out of memory.
 */
int q4kh_receipt_check(const char *path, const struct q4kh_receipt *r,
                       const struct q4kh_f2_plan *plan, struct q4kh_error *err);

#endif
