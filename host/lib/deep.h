/*
 * F2's deep probe (docs/f2.md, "Which probe"; `q4khost validate --deep`,
 * `[f2] require_deep`): a suite of texts (a chat turn laid out by the
 * model's own template, prose, code, other languages, numbers) long enough
 * to cross every length where a backend's kernels or the model change
 * behaviour, and the plan of which positions are judged. The lengths are
 * one table in deep.c (chunk sizes, attention tiles and split ranges of the
 * backends, 1,024 and 4,096) plus the model's own sliding window; the
 * probe reaches past the longest that the context holds, then runs
 * Q4KH_DEEP_DECODE_STEPS teacher-forced decode steps.
 *
 * Judged, in bands: every position from 1 to 128, then every 8th, every
 * length of the table +-2, the last prefill position and every decode step.
 * Everything here is pure and thread-safe.
 */
#ifndef Q4KH_DEEP_H
#define Q4KH_DEEP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define Q4KH_DEEP_DECODE_STEPS 32
/* Past the longest length of the table: its +2 and a few more. */
#define Q4KH_DEEP_PAST 8
/* The fewest prefill positions a deep probe may have (a context below
 * this plus the decode steps is refused). */
#define Q4KH_DEEP_MIN_PREFILL 64

/*
 * What a position of the deep probe costs, in multiply-adds of the model's
 * own arithmetic, for an estimate of how long a run takes: the layers'
 * weights, the output projection on a position whose logits are computed,
 * and attention over the keys it sees (a sliding-window layer's at most
 * its window). Counted from the model's tensors and shapes; a backend's
 * speed per multiply-add is measured, not modelled (guard.c).
 */
struct q4kh_deep_cost {
	double weights;   /* per position: every layer's weight matrices */
	double output;    /* per position with logits: n_vocab x n_embd */
	double attn_full; /* per position and key: layers that see every key */
	double attn_swa;  /* the same, for the sliding-window layers */
	uint32_t swa;     /* their window (keys) */
};

struct q4kh_deep_plan {
	int64_t prefill;        /* positions 0 .. prefill-1 are the probe's tokens */
	uint32_t decode_steps;  /* then these teacher-forced decode steps */
	uint8_t *judged;        /* prefill + decode_steps flags; malloc()ed */
	int64_t n_judged;       /* how many are set */
	char lengths[256];      /* the lengths crossed, "32 64 ... 512 (sliding
	                           window) 1024 4096", for the report */
	struct q4kh_deep_cost cost;
};

/*
 * The deep probe for the model at MODEL_PATH: *ids (malloc()ed, plan->prefill
 * of them) and *plan (free with q4kh_deep_plan_free). Its prefill reaches
 * Q4KH_DEEP_PAST positions past the longest length (4,104 on Gemma 3), then
 * the decode steps follow, unless the smaller of the model's trained
 * context and CTX (0: no cap of the caller; `validate --ctx`, `run --ctx`)
 * ends it sooner: then the prefill fills that context but for the decode
 * steps, and the lengths past it are not crossed. -1 with err when
 * that context leaves fewer than Q4KH_DEEP_MIN_PREFILL prefill positions,
 * or on a model or tokenizer error.
 */
int q4kh_deep_probe(const char *model_path, uint32_t ctx, int32_t **ids,
                    struct q4kh_deep_plan *plan, struct q4kh_error *err);

void q4kh_deep_plan_free(struct q4kh_deep_plan *plan);

/*
 * The work (multiply-adds, plan->cost) of positions FROM .. TO-1 of PLAN's
 * run (prefill, then decode steps): logits for the judged positions alone,
 * as the reference computes them, or with ALL_ROWS for every position, as
 * a candidate does (a step with one judged position computes all its
 * rows; every chunk of the deep probe has one). A row of logits counts
 * LOGITS_ROW multiply-adds of the layers' pace (a backend's output
 * projection may run far faster per multiply-add than its layers do: the
 * reference's, by a calibration of each, guard.c), or plan->cost.output
 * when LOGITS_ROW < 0.
 */
double q4kh_deep_work(const struct q4kh_deep_plan *plan, int64_t from, int64_t to,
                      int all_rows, double logits_row);

/*
 * What PLAN judges, for reports: "deep probe: N positions judged of M, up
 * to position P, D decode steps" into BUF (CAP bytes).
 */
void q4kh_deep_describe(const struct q4kh_deep_plan *plan, char *buf, size_t cap);

#endif
