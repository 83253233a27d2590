#include "serving.h"

#include <string.h>

#include "policy.h"

void q4kh_serving_close(struct q4kh_serving *sv)
{
	q4kh_session_free(sv->s);
	q4kh_model_free(sv->m); /* releases what the variant prepared */
	q4kh_kernel_close(&sv->k);
	q4kh_backend_close(&sv->be);
	memset(sv, 0, sizeof(*sv));
}

/* The rest of OUT once its backend is open: model MODEL_PATH uploaded,
 * C's variant routing it, a session of N_CTX tokens. */
static int open_on_backend(const struct q4kh_registry *r, const char *model_path,
                           const struct q4kh_candidate *c, uint32_t n_ctx,
                           struct q4kh_serving *out, struct q4kh_error *err)
{
	struct q4kh_session_params sp = { .n_ctx = n_ctx };

	if (q4kh_model_open(model_path, &out->m, err) ||
	    q4kh_policy_upload(r, &out->be, out->m, c->variant, &out->k, err) ||
	    q4kh_session_new(out->m, &sp, &out->s, err)) {
		q4kh_serving_close(out);
		return -1;
	}
	return 0;
}

int q4kh_serving_open(const struct q4kh_registry *r, const char *model_path,
                      const struct q4kh_candidate *c, uint32_t n_ctx,
                      struct q4kh_serving *out, struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(r, c->backend);

	memset(out, 0, sizeof(*out));
	if (!p)
		return q4kh_fail(err, "backend %s is not available", c->backend);
	if (q4kh_backend_open(p, c->device, &out->be, err))
		return -1;
	return open_on_backend(r, model_path, c, n_ctx, out, err);
}

int q4kh_serving_open_on(struct q4kh_host *h, const struct q4kh_candidate *c, uint32_t n_ctx,
                         struct q4kh_serving *out, struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(h->registry, c->backend);

	memset(out, 0, sizeof(*out));
	if (!p)
		return q4kh_fail(err, "backend %s is not available", c->backend);
	if (q4kh_host_backend_open(h, p, c->device, &out->be, err))
		return -1;
	/* the host's file, bound again for this backend: nothing is read twice */
	return open_on_backend(h->registry, h->model_path, c, n_ctx, out, err);
}
