/*
 * What the F2 guard judges and what may serve (docs/architecture.md
 * sections 4 and 5): a backend plugin, one of its devices, and a kernel
 * variant or the backend's built-in kernels. One struct for every list of
 * them: a plan of q4kh_select_plan, q4kh_candidates_list's, serve's.
 */
#ifndef Q4KH_CANDIDATE_H
#define Q4KH_CANDIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "q4khost/plugin.h"

struct q4kh_candidate {
	const char *backend;  /* backend plugin name (the registry's string) */
	uint32_t device;      /* index within the backend */
	const char *variant;  /* kernel-variant plugin name, NULL = built-in */
	/* What a list knows of it; zero where it was not made by one: */
	int explicit_request; /* named by the command line or the environment */
	char why[800];        /* why these kernels: "cpu-q8act, named by FILE:LINE
	                         [gpu.0]", "the built-in kernels" */
	struct q4kh_device_record dev; /* its device's record; struct_size 0:
	                                  not known */
};

/* "cpu/cpu-q8act" or "cuda/built-in" into BUF; returns BUF. */
const char *q4kh_candidate_name(const struct q4kh_candidate *c, char *buf, size_t cap);

/* 1 when C is the reference: the cpu backend with its built-in kernels,
 * which needs no F2. */
int q4kh_candidate_is_reference(const struct q4kh_candidate *c);

#endif
