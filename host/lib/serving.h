/*
 * One candidate opened the way serving runs it: its backend device, the
 * model uploaded there, the kernel variant (if any) routing the weights of
 * its types, and a session with its KV cache. The F2 guard opens one for
 * each side; q4khost bench and qa open one per candidate. Used from one
 * thread at a time.
 */
#ifndef Q4KH_SERVING_H
#define Q4KH_SERVING_H

#include <stdint.h>

#include "backend.h"
#include "candidate.h"
#include "error.h"
#include "host.h"
#include "kernel.h"
#include "model.h"
#include "registry.h"
#include "session.h"

struct q4kh_serving {
	struct q4kh_backend be;
	struct q4kh_kernel k; /* zeroed for the built-in kernels */
	struct q4kh_model *m;
	struct q4kh_session *s;
};

/*
 * Open candidate C of R with the model at MODEL_PATH and a session of
 * N_CTX tokens. -1 with err naming what failed; *out is then closed.
 */
int q4kh_serving_open(const struct q4kh_registry *r, const char *model_path,
                      const struct q4kh_candidate *c, uint32_t n_ctx,
                      struct q4kh_serving *out, struct q4kh_error *err);
/*
 * q4kh_serving_open on host context H (host.h), which holds the model:
 * the backend device is H's (borrowed: H must outlive OUT), its variant
 * opened once there, and the model H's mapping bound again for it. For a
 * command that runs its candidates one after another on its own thread
 * (bench, qa); a part that runs on another thread opens its own
 * (q4kh_serving_open). -1 with err as q4kh_serving_open.
 */
int q4kh_serving_open_on(struct q4kh_host *h, const struct q4kh_candidate *c, uint32_t n_ctx,
                         struct q4kh_serving *out, struct q4kh_error *err);
/* Safe on a zeroed or closed struct. */
void q4kh_serving_close(struct q4kh_serving *sv);

#endif
