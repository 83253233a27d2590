/*
 * Kernel-variant selection for one backend device (docs/architecture.md section 5;
 * docs/config.md for operators).
 *
 * A device's kernel setting comes from the first of:
 *   1. the command line (--kernel VALUE);
 *   2. the environment, Q4KHOST_Q4K_KERNEL;
 *   3. the key q4k_kernel in the config sections [gpu.UUID], [gpu.INDEX],
 *      [gpu.NAME], [gpu.ARCH], then [gpu] (the first that holds wins);
 *   4. none: "default".
 * A value is a comma-separated list of entries. On the command line and in
 * the environment an entry may carry a selector, SELECTOR=NAME, that
 * matches a device's UUID, index within its backend, name or architecture
 * (case-insensitive); an entry without one holds for every device. Of the
 * entries that hold for a device, those of the most specific selector kind
 * win (UUID, index, name, architecture, none), in their order. A config
 * value has no selectors: its section is the selector. NAME is a
 * kernel-variant plugin, or "none", "0" or "built-in" for the backend's own
 * kernels. An entry that names a variant for another backend kind
 * (plugin.h, backend_kind) is skipped for this backend's devices, so one
 * list serves a machine with several backends; a variant for "cpu" serves
 * every backend of that kind.
 *
 * A command-line or environment setting with any entry whose selector
 * holds for the device is an explicit request for it: exactly its
 * entries for this backend are tried (possibly none), and a failure is an
 * error, never a fall-back. A config section holds only when it names
 * something for this backend; it is a preference: its list first, then
 * (unless it names the built-in kernels) the other variants by score, then
 * the built-in kernels. For the reference cpu backend the built-in kernels
 * are the reference itself, which needs no guard.
 * Not thread-safe (opens plugins).
 */
#ifndef Q4KH_POLICY_H
#define Q4KH_POLICY_H

#include "backend.h"
#include "config.h"
#include "kernel.h"
#include "model.h"
#include "registry.h"

enum q4kh_kernel_source {
	Q4KH_KERNEL_DEFAULT = 0,
	Q4KH_KERNEL_CONFIG,
	Q4KH_KERNEL_ENV,
	Q4KH_KERNEL_CLI
};

#define Q4KH_KERNEL_LIST 16

/* A device's kernel setting. */
struct q4kh_kernel_choice {
	enum q4kh_kernel_source source;
	/* "--kernel", "Q4KHOST_Q4K_KERNEL", "FILE:LINE [gpu.0]", "default" */
	char origin[700];
	/* The entries that hold for this device and backend, in order: plugin
	 * names (the registry's strings), NULL for the built-in kernels. */
	const char *names[Q4KH_KERNEL_LIST];
	size_t n;
	/* Variants the setting names for this device but other backends,
	 * each once, for messages ("x (for cuda)", q4kh_select_elsewhere). */
	const struct q4kh_plugin *others[Q4KH_KERNEL_LIST];
	size_t n_others;
};

/*
 * Add to SET (*N of CAP) each variant of CH->others that SET lacks: the
 * variants a request names for other backends, gathered over the
 * backends it was asked of, each once.
 */
void q4kh_policy_others_add(const struct q4kh_kernel_choice *ch,
                            const struct q4kh_plugin **set, size_t *n, size_t cap);

/* CH->others as "x (for cuda), y (for cpu)" into BUF ("" for none); BUF. */
const char *q4kh_policy_others_text(const struct q4kh_kernel_choice *ch, char *buf, size_t cap);

/*
 * The kernel setting of device DEV (index DEV->index) of a backend of kind
 * BACKEND (q4kh_backend_kind): CLI is
 * the value of the command-line flag FLAG (NULL: "--kernel"), or NULL; C
 * may be NULL (no config). -1 with err naming where the value came from on
 * an unknown name (listing the valid ones), an empty entry or selector, or
 * a list longer than Q4KH_KERNEL_LIST.
 */
int q4kh_policy_kernel_choice(const struct q4kh_registry *r,
                              const struct q4kh_config *c, const char *cli,
                              const char *flag, const char *backend,
                              const struct q4kh_device_record *dev,
                              struct q4kh_kernel_choice *out,
                              struct q4kh_error *err);

/*
 * Whether Q4KHOST_Q4K_KERNEL, when set, has the form of a kernel list
 * (its names are not looked up): -1 with err naming the variable and the
 * mistake (an empty entry or selector, too many entries), a bad
 * environment value as a bad config value is, which no plugin could
 * change; 0 when it is unset or well formed.
 */
int q4kh_policy_kernel_env_check(struct q4kh_error *err);

/*
 * The selectors (SELECTOR=NAME) in the command-line value CLI of FLAG
 * (NULL: "--kernel") and in Q4KHOST_Q4K_KERNEL that match no device of
 * any backend R accepted, into BUF ("--kernel: '5', Q4KHOST_Q4K_KERNEL:
 * 'sm_90'"); returns how many. Their entries are ignored, so the caller
 * warns: a device that does not exist is a mistake until shown otherwise.
 * A value that does not parse counts none (its error comes from
 * q4kh_policy_kernel_choice). Opens every backend's devices.
 */
size_t q4kh_policy_unmatched_selectors(const struct q4kh_registry *r, const char *cli,
                                       const char *flag, char *buf, size_t cap);

/* "a, b (for cuda)" of every accepted kernel-variant plugin, for messages. */
void q4kh_policy_list_variants(const struct q4kh_registry *r, char *buf, size_t cap);

/* One step of a device's chain. */
struct q4kh_policy_step {
	const char *variant; /* NULL: the backend's built-in kernels */
	int named;           /* named by the setting (else chosen by score) */
	uint32_t score;      /* the variant's best score on the device; 0 built-in */
	/* Per type: the variant's score, or for the built-in kernels 1 when
	 * the backend supports the type. */
	uint32_t scores[Q4KH_TYPE_COUNT];
	/* The variant would not start on the device (its init failed, e.g. on
	 * a bad setting): kept in the chain so that selection tries it and
	 * the report says why, never dropped in silence; why_not: the
	 * failure's message. */
	int init_failed;
	char why_not[512];
};

#define Q4KH_POLICY_STEPS 48

/* The order in which one device's kernels are tried. */
struct q4kh_policy_order {
	struct q4kh_kernel_choice choice;
	int explicit_request; /* choice from the CLI or the environment */
	struct q4kh_policy_step steps[Q4KH_POLICY_STEPS];
	size_t n;
};

/*
 * The chain for open backend device B under the setting above: for an
 * explicit request exactly the entries that hold (possibly none); else the
 * configured entries, then (unless the setting names the built-in kernels)
 * every other variant for B's kind with a score above 0, highest first
 * (plugin path order on ties), then the built-in kernels. -1 with err as
 * q4kh_policy_kernel_choice.
 */
int q4kh_policy_order(const struct q4kh_registry *r, const struct q4kh_config *c,
                      const char *cli, const char *flag, const struct q4kh_backend *b,
                      struct q4kh_policy_order *out, struct q4kh_error *err);

/*
 * Why step S of O is where it is, into BUF: "named by ORIGIN", "by score (N)",
 * "would not start: WHY" (the variant's init() failure, "cpu-simd: init
 * failed (unsupported): [plugin.cpu-simd] isa = amx: ..."), "the built-in
 * kernels, named by ORIGIN" or "the built-in kernels".
 * Returns BUF.
 */
const char *q4kh_policy_step_why(const struct q4kh_policy_order *o,
                                 const struct q4kh_policy_step *s, char *buf,
                                 size_t cap);

/*
 * Open variant NAME on B and route M's weights through it. An explicit
 * request that cannot be honoured is an error naming why (unknown name
 * with the list of variants found, wrong backend, score 0 on this device,
 * no weight of its types in the model, a failing prepare): the caller must
 * not fall back silently. On success *k is open; close it after
 * q4kh_model_release_kernels(m).
 */
int q4kh_policy_use_kernel(const struct q4kh_registry *r,
                           const struct q4kh_backend *b, struct q4kh_model *m,
                           const char *name, struct q4kh_kernel *k,
                           struct q4kh_error *err);

/*
 * Upload M to B (q4kh_model_upload) with variant NAME (NULL: none) routing
 * its weights as q4kh_policy_use_kernel would, each prepared as soon as
 * it is uploaded (q4kh_model_upload_for): what a run and serve do, so
 * that a variant's start-up overlaps the upload. Errors as
 * q4kh_policy_use_kernel's, and the upload's; on failure K is closed and
 * no weight is prepared.
 */
int q4kh_policy_upload(const struct q4kh_registry *r, struct q4kh_backend *b,
                       struct q4kh_model *m, const char *name,
                       struct q4kh_kernel *k, struct q4kh_error *err);

#endif
