/*
 * Choosing what serves a request, with the F2 guard in the loop (design
 * sections 4 and 5). The candidates, in order:
 *   - a kernel variant named by --kernel / Q4KHOST_Q4K_KERNEL: only it;
 *   - else, for the backend named by --backend (or, when none is named,
 *     every backend other than cpu that has the device): the kernel
 *     variants that target it, highest score() first, then its built-in
 *     kernels;
 *   - last, unless a backend or kernel was named explicitly: the reference
 *     cpu backend, which needs no guard.
 * Each candidate other than the reference must pass F2 (a valid receipt, or
 * a fresh measurement in a child process). A rejected one is reported and
 * the next is tried; a named request that cannot be honoured is an error,
 * never a silent fall-back. Not thread-safe.
 */
#ifndef Q4KH_SELECT_H
#define Q4KH_SELECT_H

#include <stdint.h>

#include "backend.h"
#include "error.h"
#include "guard.h"
#include "kernel.h"
#include "model.h"
#include "registry.h"

struct q4kh_select_request {
	const struct q4kh_registry *registry;
	const struct q4kh_config *config;
	const char *config_file;  /* handed to validation child processes */
	const char *model_path;
	const char *backend;      /* NULL: automatic */
	uint32_t device;
	const char *kernel;       /* NULL: automatic */
	int builtin_only;         /* --kernel none: no kernel variants */
	enum q4kh_f2_mode mode;
};

struct q4kh_selection {
	struct q4kh_backend backend;
	struct q4kh_kernel kernel;  /* zeroed when the built-in kernels serve */
	struct q4kh_model *model;   /* uploaded to backend, variant prepared */
	char f2_verdict[32];        /* "pass", "not needed", "off" */
	char f2_source[256];        /* "receipt (...)", "fresh (reason: ...)" */
	char f2_message[512];
	char steps[2048];           /* every candidate tried before, one per line */
	int explicit_failure;       /* a named request could not be honoured */
};

/*
 * Choose, guard and open what serves RQ. On success every part of *out is
 * open; release it with q4kh_selection_close. -1 with err when nothing can
 * serve, or a named request cannot be honoured (explicit_failure set).
 */
int q4kh_select(const struct q4kh_select_request *rq, struct q4kh_selection *out,
                struct q4kh_error *err);
void q4kh_selection_close(struct q4kh_selection *s);

#endif
