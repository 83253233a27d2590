/*
 * Choosing what serves a request, with the F2 guard in the loop
 * (docs/architecture.md sections 4 and 5). The candidates, in order: for
 * the backend named by --backend, or else for every backend of a device
 * kind (a GPU) that has the device, then every other backend of kind
 * "cpu" (the host's cores, plugin.h backend_kind) and then the reference
 * cpu backend, the device's kernel chain (policy.h): the variants its
 * kernel setting names, then, unless that setting is an explicit request
 * (the command line or the environment), the other variants by score and
 * the backend's built-in kernels. So with no GPU serving, the first fast
 * path of the host's cores that passes F2 serves, its variants by score
 * first. With an
 * explicit kernel request for the device only the named kernels are
 * candidates; with a named backend only its chain.
 * Each candidate other than the reference with its built-in kernels must
 * pass F2 (a valid receipt, or a fresh measurement in a child process:
 * decide.h, the one decision of every command and serve). A
 * rejected one is reported and the next is tried; a named request that
 * cannot be honoured is an error, never a silent fall-back. Not
 * thread-safe.
 */
#ifndef Q4KH_SELECT_H
#define Q4KH_SELECT_H

#include <stdint.h>

#include "backend.h"
#include "candidate.h"
#include "error.h"
#include "guard.h"
#include "host.h"
#include "kernel.h"
#include "model.h"
#include "registry.h"

struct q4kh_select_request {
	/* The command's host context (host.h): its registry, config, model
	 * (NULL for a plan that needs none), backends and variants. */
	struct q4kh_host *host;
	const char *config_file;  /* handed to validation child processes */
	const char *backend;      /* NULL: automatic */
	uint32_t device;
	const char *kernel;       /* the --kernel value (policy.h), or NULL */
	enum q4kh_f2_mode mode;
	/* Where the mode was set (settings.h: "--f2", "Q4KHOST_F2",
	 * "FILE:LINE [f2]", "default"), for the report of an F2 that is off. */
	const char *mode_origin;
	/* What F2 judges on (guard.h): the built-in probe, or PROMPT[0..n_prompt),
	 * the ids the run will prefill, when probe is Q4KH_F2_PROBE_PROMPT and
	 * it has at least Q4KH_F2_PROMPT_MIN_TOKENS (else the built-in probe,
	 * and f2_probe says why). PROBE_ORIGIN names where probe was set
	 * ("--f2-probe", "FILE:LINE [f2]"). */
	enum q4kh_f2_probe_kind probe;
	const char *probe_origin;
	const int32_t *prompt;
	size_t n_prompt;
	/* With probe Q4KH_F2_PROBE_DEEP ([f2] require_deep; PROBE_ORIGIN says
	 * where it was set): the context that caps the deep probe (deep.h;
	 * 0: the model's) */
	uint32_t deep_ctx;
};

struct q4kh_selection {
	struct q4kh_backend backend;
	struct q4kh_kernel kernel;  /* zeroed when the built-in kernels serve */
	struct q4kh_model *model;   /* uploaded to backend, variant prepared */
	char f2_verdict[32];        /* "pass", "not needed", "off" */
	uint32_t device;            /* the device that serves, within backend */
	char f2_source[256];        /* "receipt of DATE", "fresh: REASON",
	                               "Q4KHOST_F2=off" */
	char f2_message[512];
	/* The probe of the last F2 decision, "" when none was made (the
	 * reference served at once, or F2 is off): "built-in probe, 64
	 * tokens", "this prompt, 23 tokens", "this prompt, its last 64 of 300
	 * tokens (f2_probe_tokens)", with the reason when a prompt probe was
	 * asked for but the built-in one judged. */
	char f2_probe[384];
	enum q4kh_f2_probe_kind f2_probe_kind;
	int64_t f2_probe_tokens;    /* the probe tokens judged in prefill */
	int64_t f2_probe_positions; /* positions measured from 0: those tokens
	                               and the decode steps; none past them */
	char kernel_choice[800];    /* why these kernels: "cpu-q8act, named by
	                               FILE:LINE [gpu.0]", "the built-in kernels" */
	char steps[2048];           /* every backend that could not start and every
	                               candidate tried before, one per line */
	char not_applicable[512];   /* variants with none of the model's types,
	                               left out: "cuda/cuda-gemv-iq, ..." */
	int explicit_failure;       /* a named request could not be honoured */
	int interrupted;            /* the signal that stopped the choice, or 0 */
	/* With interrupted: the candidate F2 was measuring
	 * ("cpu-fast/cpu-simd"), its backend plugin and that backend's
	 * device, for a report of what was known when it stopped. */
	char measuring[160];
	const struct q4kh_plugin *measuring_plugin;
	struct q4kh_device_record measuring_device;
};

#define Q4KH_SELECT_MAX 64

/*
 * The candidates q4kh_select tries for RQ, in order, into LIST (room for
 * Q4KH_SELECT_MAX; RQ's mode is not used, its host's model only for its
 * weight types, when it has one), each with its device's record, why it
 * is there and whether it was named explicitly. The reference cpu
 * backend's one device stands in last for device RQ->device of another
 * backend, but not for a device no backend has. Returns how many; -1 with
 * err when a named backend is missing, a kernel setting is invalid, an
 * explicit kernel request names nothing the device can run, or nothing
 * can be tried at all: the error then says why (no backend on the plugin
 * path, the reference among them; the backends that could not start, with
 * their plugins' reasons; no backend with the device). SKIPPED (NULL: not
 * wanted) gets a line for each backend left out because it could not
 * start, its plugin's reason ("cpu-fast: init failed (invalid argument):
 * ..."), and for each backend passed over because it does not implement
 * one of the model's weight types (q4kh_backend_check_types), each ending
 * in a newline, so that a plan that goes on without it can still say why.
 */
int q4kh_select_plan(const struct q4kh_select_request *rq,
                     struct q4kh_candidate *list, char *skipped, size_t skipped_cap,
                     struct q4kh_error *err);

/*
 * Whether q4kh_select may need a receipt for RQ: F2 is not off and its
 * plan (q4kh_select_plan) holds a candidate other than the reference. 0
 * too when the plan fails (q4kh_select then says why). A run that needs
 * none needs no receipt folder (docs/config.md, receipt_dir).
 */
int q4kh_select_needs_receipts(const struct q4kh_select_request *rq);

/*
 * Why each of the N kernel VARIANTS (named for device DEVICE, but for
 * backends other than those asked: policy.h's others) cannot serve it
 * here, "; "-joined into BUF (CAP bytes): "cuda-mwv is a kernel variant
 * for backend cuda, which has no device: WHY" (the backend's own words,
 * as q4khost plugins shows them), "... which has no device 1 (it has
 * 1)", "... which is not on the plugin path" or "... which does not
 * serve device 0 here" (it has the device, but was passed over); "" for
 * none. For the message of a request that names only such variants.
 */
void q4kh_select_elsewhere(struct q4kh_host *h, uint32_t device,
                           const struct q4kh_plugin *const *variants, size_t n, char *buf,
                           size_t cap);

/*
 * 0 when some accepted backend of host context H (BACKEND alone, when not
 * NULL) has device DEVICE, the backends started in H; else -1 with the
 * error q4kh_select_plan gives for it: no backend plugin on the path (the
 * reference among them), the backends that could not start, or how many
 * devices each backend has. For the commands that filter by --device
 * (validate, qa, bench) to say what run says.
 */
int q4kh_select_check_device(struct q4kh_host *h, const char *backend, uint32_t device,
                             struct q4kh_error *err);

/*
 * Choose, guard and open what serves RQ, on its host's backends and
 * model. On success every part of *out is open (the backend device
 * borrowed from the host, which must outlive it); release it with
 * q4kh_selection_close. -1 with err when nothing can
 * serve, or a named request cannot be honoured (explicit_failure set), or
 * when a SIGINT or SIGTERM stopped an F2 measurement (interrupt.h;
 * interrupted set, no receipt written).
 */
int q4kh_select(const struct q4kh_select_request *rq, struct q4kh_selection *out,
                struct q4kh_error *err);
void q4kh_selection_close(struct q4kh_selection *s);

#endif
