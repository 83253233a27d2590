/*
 * F2, the parity guard (docs/architecture.md section 4; docs/f2.md for users).
 *
 * A candidate (a backend, with or without a kernel variant, on one device)
 * and the reference cpu plugin run the same probe: one batched prefill of
 * the probe tokens with the logits of every position, then teacher-forced
 * decode steps through each side's own KV cache, both fed the reference's
 * greedy tokens. Then the candidate runs the probe's first tokens again in
 * narrow steps, of 2 to Q4KH_F2_NARROW_MAX tokens: the widths of a short
 * prompt's chunks and of a batched decode step of that many sequences,
 * which multiply that many columns at once on kernel paths (GEMV tiles of
 * 2 to 8 columns) that one wide prefill and one-token decode never take.
 * Every position's two logit vectors are compared and the positions p >= 1
 * are judged by the rules below (rule numbers are cited in messages and
 * docs):
 *   F2.1 any NaN/Inf logit or a zero-norm vector rejects;
 *   F2.2 cosine (in double) < the acceptance floor rejects; below the fixed
 *        catastrophic floor the candidate is broken, not merely imprecise.
 *        The acceptance floor follows the path's arithmetic class (its
 *        plugins' q4kh_arith declarations, q4kh_f2_arith_floor) unless a
 *        setting (f2_floor) chose it;
 *   F2.3 an argmax disagreement is a tolerated near-tie only when cosine >=
 *        near_tie_cosine and the reference's logit for the candidate's token
 *        is within near_tie_logits of its maximum; any other disagreement
 *        rejects;
 *   F2.4 what could not be measured is "not measured", never a pass.
 * Position 0 is reported but not judged (a benign near-tie at the start of
 * a sequence). Pure functions are thread-safe; a run uses its sessions.
 */
#ifndef Q4KH_F2_H
#define Q4KH_F2_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "f2_reference.h"
#include "session.h"

/* Bumped whenever a rule or a default changes: receipts key on it. 2: the
 * narrow steps; 3: the batched steps; 4: their first step a mixed step;
 * 5: their sequences reuse the first one's prefix (serve's prefix cache);
 * 6: they run over pages too, on a backend with attention_paged. */
#define Q4KH_F2_RULESET 6
/*
 * Rule set 6: on a backend with attention_paged (ABI 1.8), the batched
 * steps run a second time on sessions of one paged KV cache (kv_paged.h),
 * pages of this many tokens: not a divisor of the 16-token blocks a
 * sequence takes from another's cache, so that a prefix taken ends inside
 * a shared page, which the sequence's first write then copies.
 */
#define Q4KH_F2_PAGE 12
/* The narrow steps' widths: 2, 3, .., this (35 tokens in all). */
#define Q4KH_F2_NARROW_MAX 8
/*
 * The batched steps (q4kh_f2_run): this many sequences, each a prefix of
 * the probe prefilled alone at a length of its own, then this many decode
 * steps of all of them together in one step each (serve's batched decode,
 * q4kh_session_eval_batch; in the first, the last sequence's column is
 * the end of its prefix and its token, a prompt chunk beside the others'
 * decoded tokens, as serve's continuous batching steps carry them), fed
 * the probe's next tokens, so that every
 * position they judge is one the reference's prefill already computed.
 * They use the probe's first Q4KH_F2_BATCH_REACH tokens at most, and need
 * Q4KH_F2_BATCH_SEQS + Q4KH_F2_BATCH_STEPS of them (none below).
 */
#define Q4KH_F2_BATCH_SEQS 4
#define Q4KH_F2_BATCH_STEPS 4
#define Q4KH_F2_BATCH_REACH 64
#define Q4KH_F2_CATASTROPHIC 0.90 /* fixed */
/* The acceptance floor of a path that declares no arithmetic class (a
 * plugin built before ABI 1.6): the floor F2 had before the classes. */
#define Q4KH_F2_FLOOR_DEFAULT 0.95

struct q4kh_f2_rules {
	double floor;           /* acceptance floor, >= Q4KH_F2_CATASTROPHIC */
	uint32_t arith;         /* the path's class (q4kh_arith; UNDECLARED
	                           unless q4kh_f2_rules_class set it) */
	int floor_set;          /* 1: a setting (f2_floor) chose the floor, not
	                           the class */
	double near_tie_cosine; /* 0.98 */
	double near_tie_logits; /* 0.5 */
	uint32_t decode_steps;  /* >= 1; default 8 */
	uint32_t probe_tokens;  /* the probe's last tokens used; default 64 */
};

/* The defaults of docs/architecture.md section 4: an undeclared class,
 * floor Q4KH_F2_FLOOR_DEFAULT. */
void q4kh_f2_rules_default(struct q4kh_f2_rules *r);

/*
 * The acceptance floor of arithmetic class ARITH (docs/f2.md, "Floors that
 * follow the arithmetic": each class's lowest cosine measured on correct
 * code, with a margin): Q4KH_F2_FLOOR_DEFAULT for UNDECLARED. ARITH must
 * be a q4kh_arith value (q4kh_f2_arith_known).
 */
double q4kh_f2_arith_floor(uint32_t arith);

/* Whether ARITH is a class this host knows (UNDECLARED .. INT8). */
int q4kh_f2_arith_known(uint32_t arith);

/* "undeclared", "exact", "f32", "f16", "int16", "int8"; "unknown" else. */
const char *q4kh_f2_arith_name(uint32_t arith);

/*
 * Decimals of a cosine shown beside RULES' acceptance floor: two more
 * than the floor has, at least 4, so that a cosine just under a floor of
 * 0.9999 never reads as 0.9999 itself ("%.*f" of F2's messages and of a
 * void receipt's reason).
 */
int q4kh_f2_cosine_digits(const struct q4kh_f2_rules *rules);

/* The class named NAME by q4kh_f2_arith_name ("f16"); UNDECLARED for NULL,
 * "undeclared" or a name this host does not know. */
uint32_t q4kh_f2_arith_of_name(const char *name);

/*
 * The class of a path of two parts (a backend and its kernel variant):
 * the coarser of A and B, in q4kh_arith's order; UNDECLARED when either
 * is, since a part that declares nothing may round anything.
 */
uint32_t q4kh_f2_arith_coarsest(uint32_t a, uint32_t b);

/* R judges a path of class ARITH: R->arith, and R->floor its class's
 * floor (floor_set 0). */
void q4kh_f2_rules_class(struct q4kh_f2_rules *r, uint32_t arith);

/*
 * Where R's floor comes from, for a message: "set by f2_floor", "int8
 * arithmetic", "no arithmetic class declared". Static text.
 */
const char *q4kh_f2_floor_source(const struct q4kh_f2_rules *r);

enum q4kh_f2_verdict {
	Q4KH_F2_PASS = 0,
	Q4KH_F2_REJECT,       /* imprecise or wrong: F2.1, F2.2, F2.3 */
	Q4KH_F2_BROKEN,       /* cosine below the catastrophic floor */
	Q4KH_F2_NOT_MEASURED  /* F2.4: fail closed */
};

/* "pass", "reject", "broken", "not measured". */
const char *q4kh_f2_verdict_name(enum q4kh_f2_verdict v);

/* A threshold as text (q4kh_f2_threshold). */
struct q4kh_f2_threshold_text {
	char s[32];
};

/*
 * Threshold V (a floor, a near-tie tolerance) as it was set: two decimals
 * ("0.95", "0.90"), or as many more as V needs to read back as itself
 * ("0.995", "0.9999"), never rounded past what was set. A value, so that
 * q4kh_f2_threshold(v).s can stand in a printf argument list.
 */
struct q4kh_f2_threshold_text q4kh_f2_threshold(double v);

/*
 * MESSAGE (a verdict's message, e.g. a receipt's) without the name of
 * verdict V it may start with ("not measured: the candidate could not
 * start" gives "the candidate could not start"), for a line that names
 * the verdict before it. Points into MESSAGE.
 */
const char *q4kh_f2_message_after_verdict(enum q4kh_f2_verdict v, const char *message);

/* What one position showed. */
struct q4kh_f2_point {
	int64_t position;    /* 0 .. probe + steps - 1 */
	int32_t decode_step; /* -1 in prefill */
	double cosine;       /* NaN when not computable */
	int32_t ref_argmax, cand_argmax;
	double ref_margin;   /* reference top-1 minus top-2 logit */
	double ref_gap;      /* reference max minus its logit at cand_argmax */
	int nonfinite;       /* candidate (1) or reference (2) had NaN/Inf */
	int zero_norm;       /* a vector of zeros */
	int judged;          /* position >= 1 */
	int computed;        /* compared (q4kh_f2_judge); 0 only between the
	                        deep probe's bands (q4kh_f2_run_plan) */
	int near_tie;        /* a tolerated argmax disagreement */
	int32_t narrow;      /* 0, or the width of the narrow step it came from */
	int32_t batch;       /* 0, or the sequences of the batched step it came
	                        from (decode_step is then that sequence's) */
	int32_t seq;         /* with batch: its sequence, 0 .. batch - 1 */
	int32_t paged;       /* with batch: 0, or the page size of the paged
	                        batched steps it came from (rule set 6) */
	enum q4kh_f2_verdict verdict;
	const char *rule;    /* the rule that fired, or NULL */
};

/*
 * What the cosine COS of a judged position decides by itself under RULES:
 * reject when it is NaN (F2.1: NaN or Inf logits, or a vector of zeros),
 * broken below the catastrophic floor, reject below the acceptance floor
 * (F2.2), else pass, which an argmax disagreement beyond a near-tie may
 * still turn into a rejection (F2.3). q4kh_f2_judge decides with it, and a
 * receipt's marks are held to it (receipt_check.h).
 */
enum q4kh_f2_verdict q4kh_f2_cosine_verdict(double cos, const struct q4kh_f2_rules *rules);

/*
 * Compare one position: REF and CAND are logit vectors of N floats. Fills
 * every field of *pt but position/decode_step/judged, which the caller
 * sets first; computed becomes 1. near_tie is left set only where the
 * position passes: a disagreement at a rejected position is not tolerated.
 */
void q4kh_f2_judge(const float *ref, const float *cand, int64_t n,
                   const struct q4kh_f2_rules *rules, struct q4kh_f2_point *pt);

/*
 * The one line that names what fired at PT, e.g.
 * "position 64 (decode step 0): argmax 74455 (agrees), cosine 0.8675 <
 * 0.90 catastrophic floor", or under the acceptance floor "cosine 0.9650
 * < 0.9999 acceptance floor (f16 arithmetic)" (q4kh_f2_floor_source).
 * Never prints agreeing argmaxes as a != b.
 */
void q4kh_f2_describe(const struct q4kh_f2_point *pt,
                      const struct q4kh_f2_rules *rules, char *buf, size_t cap);

/*
 * Which positions an F2 measurement has and which it judges: PREFILL
 * positions of the probe's tokens (0 .. prefill-1), then DECODE_STEPS
 * teacher-forced decode steps, then BATCHED points of the batched steps
 * (Q4KH_F2_BATCH_SEQS sequences x Q4KH_F2_BATCH_STEPS steps, step by step,
 * or none: q4kh_f2_batch_length). Without JUDGED (the built-in and prompt
 * probes, q4kh_f2_run) every position is compared and every one but
 * position 0 judged; with it (the deep probe, q4kh_f2_run_plan: prefill +
 * decode_steps flags, owned by the caller; no batched points) only the
 * flagged positions are compared, and judged. The narrow steps judge
 * prefill positions again and add none. A receipt must hold exactly its
 * plan's points (receipt_check.h).
 */
struct q4kh_f2_plan {
	int64_t prefill;
	uint32_t decode_steps;
	const uint8_t *judged;
	int64_t batched;
};

/* The points of PLAN: prefill + decode_steps + batched. */
int64_t q4kh_f2_plan_points(const struct q4kh_f2_plan *plan);

/*
 * How many of a probe of PREFILL tokens sequence SEQ (0 ..
 * Q4KH_F2_BATCH_SEQS - 1) of the batched steps prefills alone before
 * they decode together: staggered, sequence 0 the longest, each at least
 * 1; 0 for every SEQ when the probe is too short for the batched steps
 * (fewer than Q4KH_F2_BATCH_SEQS + Q4KH_F2_BATCH_STEPS tokens).
 */
int64_t q4kh_f2_batch_length(int64_t prefill, int32_t seq);

/* The plan of q4kh_f2_run on a probe of N tokens under RULES: its last
 * rules->probe_tokens tokens (all N when fewer), then rules->decode_steps
 * decode steps, then the batched steps' points. */
struct q4kh_f2_plan q4kh_f2_probe_plan(size_t n, const struct q4kh_f2_rules *rules);

/*
 * Point I of PLAN (0 <= I < q4kh_f2_plan_points) as a finished
 * measurement holds it: *PT zeroed but for position, decode_step (-1 in
 * prefill), judged, computed and, for a batched point, batch and seq
 * (its position that sequence's, its decode step that sequence's), with
 * a NaN cosine and argmaxes of -1 until q4kh_f2_judge compares it. The
 * measurements and the receipt checks take their positions from here.
 */
void q4kh_f2_plan_point(const struct q4kh_f2_plan *plan, int64_t i, struct q4kh_f2_point *pt);

struct q4kh_f2_result {
	enum q4kh_f2_verdict verdict;
	double min_cosine;          /* over judged positions */
	int64_t worst;              /* index into points of the deciding point */
	int near_ties;
	int64_t n_points;
	struct q4kh_f2_point *points; /* malloc()ed; q4kh_f2_result_free */
	char message[512];          /* the deciding line, or a pass summary */
	double seconds;
};

void q4kh_f2_result_free(struct q4kh_f2_result *r);

/*
 * The verdict of OUT's n_points points (judged by q4kh_f2_judge): the
 * worst over the judged ones, the first point of that severity as worst
 * (for a pass, the first of the lowest cosine), min_cosine (NaN when a
 * judged cosine is), near_ties (of the judged points) and the message
 * naming what fired (or a pass summary naming the floor and where it came
 * from). q4kh_f2_run ends with it; serve's shadow parity judges the
 * positions of a served request with it, and a receipt's summary is
 * derived again with it (receipt_check.h).
 */
void q4kh_f2_conclude(struct q4kh_f2_result *out, const struct q4kh_f2_rules *rules);

/*
 * Whether MESSAGE is the one q4kh_f2_conclude gives RES, whose points keep
 * only what a receipt keeps (cosine, decode step, verdict, near-tie). What
 * they lack is read from MESSAGE itself, and must fit the deciding point:
 * the argmaxes and the reference gap (they differ exactly where a passing
 * point is a near-tie or an F2.3 rejection), a narrow step's width, which
 * side's logits held NaN. 1 when it is; 0 when MESSAGE states anything
 * else (another verdict, position, decode step, cosine, floor or count).
 */
int q4kh_f2_message_matches(const char *message, const struct q4kh_f2_result *res,
                            const struct q4kh_f2_rules *rules);

/*
 * Run the probe TOKENS[0..n) (its last rules->probe_tokens tokens) on REF
 * (a live session, q4kh_f2_ref_live, or one shared through a file:
 * f2_reference.h) and CAND from empty caches, then rules->decode_steps teacher-forced
 * decode steps, and judge; then the batched steps on CAND and
 * Q4KH_F2_BATCH_SEQS - 1 sessions of its model opened for them (each
 * sequence against the reference's prefill logits of its positions; on a
 * model whose sessions cannot batch, q4kh_session_batchable, each
 * sequence steps alone in turn, as serve runs them); then the probe's first tokens on CAND again in
 * narrow steps, judged against the same reference logits, which decide
 * only when they find worse than the rest (their points replace the
 * others where worse, marked with their width). Both sessions are reset
 * before and after. A
 * forward that fails on either side gives NOT_MEASURED with its error in
 * the message (a shared file that fails mid-run also sets
 * ref->replay_failed: run again); -1 only on out of memory or bad
 * arguments; 1, OUT empty, when REF's shared file was refused and REF has
 * no session to compute with (q4kh_f2_ref_begin).
 */
int q4kh_f2_run(struct q4kh_f2_ref *ref, struct q4kh_session *cand,
                const int32_t *tokens, size_t n,
                const struct q4kh_f2_rules *rules, struct q4kh_f2_result *out,
                struct q4kh_error *err);

/*
 * The deep probe's measurement (deep.h): TOKENS[0..prefill) on REF and CAND
 * from empty caches, then DECODE_STEPS teacher-forced decode steps, judging
 * the positions JUDGED[0..prefill + decode_steps) flags (JUDGED[prefill-1]
 * must be set: its argmax feeds the first step; so must every decode
 * step's). The prefill goes in
 * chunks of the candidate's n_batch tokens, as a long prompt does, each
 * chunk one step on both sides with every row's logits computed, of which
 * each side keeps the judged rows only (q4kh_session_eval_rows): 2 x the
 * most judged positions of a chunk x n_vocab floats are held. OUT gets a
 * point per position, the ones not judged with judged 0 and a NaN cosine
 * (not computed). DONE (NULL: none) hears after every chunk and decode
 * step how many of the prefill + decode_steps positions both sides have
 * run: minutes of work, for a progress line. Errors as q4kh_f2_run's. The
 * reference's rows, for a shared file: the judged prefill positions in
 * order, the decode steps, then the narrow steps' tokens (their number
 * depends on n_batch when it is under 35, so the header names it).
 */
int q4kh_f2_run_plan(struct q4kh_f2_ref *ref, struct q4kh_session *cand,
                     const int32_t *tokens, int64_t prefill, const uint8_t *judged,
                     uint32_t decode_steps, const struct q4kh_f2_rules *rules,
                     void (*done)(void *data, int64_t positions, int64_t total),
                     void *done_data, struct q4kh_f2_result *out, struct q4kh_error *err);

/*
 * The reference side of q4kh_f2_run_plan alone, for a candidate of chunk
 * NB: REF (a live session and a file path) computes the rows run_plan
 * would record and writes them to REF->path, so that a candidate measured
 * afterwards replays them without the reference ever sharing its process
 * memory with the candidate. DONE as run_plan's. 0 when the file was
 * written (REF->recorded); -1 with err otherwise (a failed forward, out of
 * memory, a file that could not be written: no file is left).
 */
int q4kh_f2_record_plan(struct q4kh_f2_ref *ref, const int32_t *tokens, int64_t prefill,
                        const uint8_t *judged, uint32_t decode_steps, int64_t nb,
                        void (*done)(void *data, int64_t positions, int64_t total),
                        void *done_data, struct q4kh_error *err);

#endif
