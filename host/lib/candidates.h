/*
 * Every candidate the F2 guard can judge (q4khost validate, bench, qa):
 * each backend other than the reference, with its built-in kernels, and
 * every kernel variant that targets a backend (the cpu backend included),
 * on each device of that backend. Not thread-safe (opens plugins).
 */
#ifndef Q4KH_CANDIDATES_H
#define Q4KH_CANDIDATES_H

#include <stddef.h>

#include "candidate.h"
#include "error.h"
#include "host.h"
#include "registry.h"

/* Which candidates to list; zero for all. */
struct q4kh_candidate_filter {
	const char *backend; /* only this backend */
	int device_set;      /* only device `device` */
	uint32_t device;
	const char *kernel;  /* only this variant; "none": built-in kernels only */
	/* The model's matrix weight types (q4kh_model_types_at), or NULL: a
	 * variant that implements none of them is left out, not applicable. */
	const uint32_t *types;
	size_t n_types;
	/* With types: a backend without one of them is left out, and when
	 * PASSED_OVER is not NULL q4kh_candidates_list writes a line for it
	 * there ("cuda: backend cuda does not implement Q4_1 ..."), each
	 * ending in a newline; "" when none. */
	char *passed_over;
	size_t passed_over_cap;
};

/* 1 when kernel variant K implements one of the N TYPES. */
int q4kh_candidate_applies(const struct q4kh_plugin *k, const uint32_t *types, size_t n);

/*
 * The candidates of host context H's registry passing F, in plugin path
 * order: per backend, per device, its variants (path order) then its
 * built-in kernels, each with its device's record (names point into the
 * registry). The backends are started, and their devices opened, in H
 * (host.h), once for the command. *out is malloc()ed (NULL when none).
 * -1 with err when a backend fails to start or on out of memory.
 */
int q4kh_candidates_list(struct q4kh_host *h, const struct q4kh_candidate_filter *f,
                         struct q4kh_candidate **out, size_t *n, struct q4kh_error *err);

/*
 * What ought to be judged on R under F but cannot be: the reference cpu
 * backend missing (nothing can be measured against it), and every kernel
 * variant whose backend is not on the plugin path (F2.4: what cannot be
 * measured is no pass). One line each into BUF ("cpu/cpu-simd: its
 * backend cpu is not on the plugin path ..."); returns how many. An
 * install that lacks them is broken, and q4khost validate must say so.
 */
size_t q4kh_candidates_unmeasurable(const struct q4kh_registry *r,
                                    const struct q4kh_candidate_filter *f, char *buf,
                                    size_t cap);

/*
 * The kernel variants F leaves out because the model has none of their
 * types (F's types set), as "cuda/cuda-gemv-iq, ..." into BUF; returns how
 * many. Not applicable is no failure: nothing of the model would run
 * through them.
 */
size_t q4kh_candidates_not_applicable(const struct q4kh_registry *r,
                                      const struct q4kh_candidate_filter *f, char *buf,
                                      size_t cap);

#endif
