/*
 * The reference side of an F2 run (f2.h), and the file through which the
 * measurements of one `validate` command share it (docs/f2.md, "The
 * reference, computed once"). The reference's logits depend on the model,
 * the probe's tokens, the positions judged, the decode steps (teacher-
 * forced on its own argmax) and the reference plugin and its settings,
 * never on the candidate; so the first measurement of a command records
 * them, row by row in the order it computes them, into a file its parent
 * named, and the next ones replay them from there instead of running the
 * reference at all.
 *
 * The file is untrusted input: a text header that must equal, line for
 * line, the one this measurement would write (what was computed: model,
 * tokens, judged positions, steps, vocabulary, rows, reference plugin and
 * settings, float format), then the rows as IEEE binary32 in this
 * machine's byte order, then "sha256 HEX\n" of those bytes. A file that
 * differs in any way, is short or long, or fails its hash is refused, with
 * the reason said; the measurement then computes the reference itself.
 * A writer writes FILE.part and renames it to FILE once every row is in,
 * so that a reader never sees half a file.
 *
 * Not thread-safe: one run uses one q4kh_f2_ref.
 */
#ifndef Q4KH_F2_REFERENCE_H
#define Q4KH_F2_REFERENCE_H

#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "session.h"

/* What a run's reference logits are, beyond the caller's identity: filled
 * by f2.c from the run's arguments. */
struct q4kh_f2_ref_shape {
	const char *run;         /* "probe" (q4kh_f2_run) or "plan" (deep) */
	const int32_t *tokens;   /* the tokens the reference runs */
	int64_t n_tokens;
	const uint8_t *judged;   /* n_tokens flags; NULL: every position */
	uint32_t decode_steps;
	int64_t chunk;           /* the prefill's chunk (tokens); 0: one step */
	int64_t narrow;          /* tokens the narrow steps read again (0: none) */
	int64_t rows;            /* the logit rows the reference produces */
};

struct q4kh_f2_ref {
	/* Set by the caller. */
	struct q4kh_session *s; /* the live reference; NULL: replay only */
	int64_t n_vocab;        /* the vocabulary (the model's) */
	const char *path;       /* the shared file; NULL: no sharing */
	const char *identity;   /* lines naming the model, the reference plugin
	                           and its settings ("key value\n"...); the
	                           caller's, NULL with path NULL */
	/* Kept by the run. */
	int64_t n_past;         /* tokens the reference has taken */
	int replaying;          /* rows come from the file */
	int replay_failed;      /* the file failed mid-run: run again live */
	int refused;            /* the file was tried and refused */
	int recorded;           /* the file was written by this run */
	int64_t rows_done;
	int64_t rows_total;
	FILE *f;                /* the file replayed, or FILE.part recorded */
	struct q4kh_sha256 *md; /* the running hash of the rows written */
	char why[640];          /* why the file was refused */
	char unwritten[320];    /* why a recording was not written, when not */
};

/*
 * A live reference on session S (no sharing), as q4kh_f2_run takes it.
 */
void q4kh_f2_ref_live(struct q4kh_f2_ref *r, struct q4kh_session *s);

/*
 * Start a run of SHAPE on R: with R->path, replay it when the file there
 * is exactly SHAPE's under R->identity (checked in full, its hash
 * included, before any row is used), else record into R->path.part while
 * R->s computes (the refusal, if any, in R->why; a file not there is
 * refused with strerror(ENOENT)). 0 when rows can be
 * produced; 1 when the file was refused and R->s is NULL (the caller opens
 * the reference and starts again); -1 with err on out of memory.
 */
int q4kh_f2_ref_begin(struct q4kh_f2_ref *r, const struct q4kh_f2_ref_shape *shape,
                      struct q4kh_error *err);

/*
 * The reference's logits for IDS[0..n) at positions n_past.. into LOGITS,
 * as q4kh_session_eval computes them (every row) or, with ROWS (n flags),
 * as q4kh_session_eval_rows does (the flagged rows, one after another):
 * from the session (and recorded), or read from the file. -1 with E on a
 * failure of either; a replay failure sets replay_failed.
 */
int q4kh_f2_ref_eval(struct q4kh_f2_ref *r, const int32_t *ids, int64_t n, float *logits,
                     const uint8_t *rows, struct q4kh_error *e);

/* Empty the reference's cache (positions start at 0 again). */
void q4kh_f2_ref_reset(struct q4kh_f2_ref *r);

/*
 * End the run: a recording that holds every row gets its hash and becomes
 * R->path (renamed over any older one; recorded set), else it is removed
 * (the reason in R->unwritten); a replay closes its file.
 */
void q4kh_f2_ref_end(struct q4kh_f2_ref *r);

/*
 * Append one line to PATH.log, where the parent counts what its children
 * did: "read" or "computed". Failing to is harmless (a count
 * goes missing) and silent.
 */
void q4kh_f2_ref_note(const char *path, const char *what);

/*
 * The counts of PATH.log: measurements that computed the reference and
 * that read it from the shared file (0 and 0 without the log).
 */
void q4kh_f2_ref_counts(const char *path, int *computed, int *read);

#endif
