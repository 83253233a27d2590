/*
 * Kernel-variant selection for one backend device (design section 5).
 *
 * Today the choice is explicit only: a variant named by --kernel or
 * Q4KHOST_Q4K_KERNEL is opened, checked against the backend and device
 * (score() > 0 for at least one of its types that the model uses) and
 * given every matrix weight of those types. Without a name every weight
 * stays on the backend's built-in kernel: an unvalidated variant is never
 * chosen behind the user's back.
 */
#ifndef Q4KH_POLICY_H
#define Q4KH_POLICY_H

#include "backend.h"
#include "kernel.h"
#include "model.h"
#include "registry.h"

/*
 * The variant to use: the CLI's NAME when not NULL, else
 * Q4KHOST_Q4K_KERNEL, else none. Values "", "none", "0" and "built-in" mean
 * the backend's own kernels. *origin says where the answer came from
 * ("--kernel", "Q4KHOST_Q4K_KERNEL", "default").
 */
const char *q4kh_policy_kernel_name(const char *cli_name, const char **origin);

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

#endif
