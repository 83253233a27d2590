/*
 * Backend conformance: every op a backend offers, run on the same random
 * inputs as the cpu reference and compared with it (q4khost conformance;
 * docs/plugin-abi.md tells vendors to run it). The cases use shapes that
 * are no tile multiple, strided views (rows padded), outputs poisoned with
 * NaN (an element left unwritten shows), guard bytes around every tensor
 * (a write outside the view shows) and a NaN input (it must stay where
 * the reference has it). Each case is judged by the normalised mean
 * squared error against the reference, sum (c - r)^2 / sum r^2 in double,
 * under a limit per op: 1e-7 for f32 arithmetic, 5e-4 for products with
 * quantized weights and for attention (as ggml's test-backend-ops).
 * Used from one thread.
 */
#ifndef Q4KH_CONFORMANCE_H
#define Q4KH_CONFORMANCE_H

#include <stdint.h>

#include "backend.h"
#include "error.h"

struct q4kh_conf_result {
	const char *op;     /* "mul_mat", "attention_ext" */
	char what[96];      /* the case: shapes, type, options */
	double nmse;        /* NaN when the op failed or nothing compared */
	double limit;
	int skipped;        /* the backend lacks the op or the type */
	int ok;             /* passed (skipped counts as passed) */
	char message[256];  /* why it failed or was skipped; "" when passed */
};

/* Called once per case, in order. */
typedef void (*q4kh_conf_fn)(void *data, const struct q4kh_conf_result *r);

/*
 * Run every case on CAND and on REF (the cpu reference, opened on its
 * device), calling FN for each. Inputs come from SEED. Returns the number
 * of failed cases, or -1 with err when a buffer cannot be had on either
 * side.
 */
int q4kh_conformance_run(const struct q4kh_backend *ref, const struct q4kh_backend *cand,
                         uint64_t seed, q4kh_conf_fn fn, void *data,
                         struct q4kh_error *err);

#endif
