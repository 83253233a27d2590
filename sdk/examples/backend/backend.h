/*
 * example-backend: what its four files share. backend.c is the plugin
 * (identity, devices, buffers, the table), ops.c the ops, weights.c the
 * weight types it reads, graph.c the step graph's entries.
 */
#ifndef EXAMPLE_BACKEND_H
#define EXAMPLE_BACKEND_H

#include <stdint.h>

#include <q4khost/backend_base.h>
#include <q4khost/contract.h>
#include <q4khost/plugin.h>

#define NAME "example-backend"

struct q4kh_backend_ctx {
	const struct q4kh_host_api *host;
	char error[512]; /* last_error(): one line */
};

/* One device: this process's memory and one thread. */
struct q4kh_device_ctx {
	q4kh_backend_ctx *ctx;
};

struct q4kh_buffer {
	q4kh_device_ctx *dev;
	uint64_t size;
	unsigned char *data;
};

/* --- backend.c --- */

/* Keep a message as ctx's last error (ctx NULL: init()'s) and return st
 * (Q4KH_BACKEND_ERRORS, q4khost/backend_base.h). */
q4kh_status example_fail(q4kh_backend_ctx *ctx, q4kh_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The contract checks' view of dev (q4khost/contract.h); dev may be NULL. */
struct q4kh_check example_contract(q4kh_device_ctx *dev);

/* The function table (backend.c), which graph.c issues nodes through. */
extern const struct q4kh_backend_v1 example_table;

/* --- weights.c --- */

/* The weight types get_rows and mul_mat read, as Q4KH_TYPE_BIT()s. */
uint32_t example_weight_types(void);

/* Row of N values of TYPE (one of those, or F16) as floats. */
void example_row_to_f32(uint32_t type, const void *row, float *out, int64_t n);

/* --- ops.c: the entries of struct q4kh_backend_v1 (plugin.h) --- */

q4kh_status example_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                             const int32_t *ids, int64_t n, float scale,
                             const struct q4kh_tensor *out);
q4kh_status example_get_rows_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                                 const struct q4kh_tensor *ids, float scale,
                                 const struct q4kh_tensor *out);
q4kh_status example_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                            const struct q4kh_tensor *x, const struct q4kh_tensor *y);
q4kh_status example_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                             const struct q4kh_tensor *w, float eps,
                             const struct q4kh_tensor *out);
q4kh_status example_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                         float base, float freq_scale, const struct q4kh_tensor *out);
q4kh_status example_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                             const struct q4kh_tensor *pos,
                             const struct q4kh_rope_params *params,
                             const struct q4kh_tensor *out);
q4kh_status example_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                        const struct q4kh_tensor *b, const struct q4kh_tensor *out);
q4kh_status example_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                        const struct q4kh_tensor *b, const struct q4kh_tensor *out);
q4kh_status example_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x, float s,
                          const struct q4kh_tensor *out);
q4kh_status example_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                        const struct q4kh_tensor *gate, const struct q4kh_tensor *up,
                        const struct q4kh_tensor *out);
q4kh_status example_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                         const struct q4kh_tensor *dst);
q4kh_status example_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                             const struct q4kh_tensor *rows,
                             const struct q4kh_tensor *dst);
q4kh_status example_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                              const struct q4kh_tensor *k_cache,
                              const struct q4kh_tensor *v_cache,
                              const struct q4kh_attn_params *params,
                              const struct q4kh_tensor *out);
q4kh_status example_attention_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                  const struct q4kh_tensor *k_cache,
                                  const struct q4kh_tensor *v_cache,
                                  const struct q4kh_tensor *pos,
                                  const struct q4kh_attn_params *params,
                                  const struct q4kh_tensor *out);

/* --- graph.c: the step graph's entries (ABI 1.6) --- */

q4kh_status example_graph_prepare(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                                  q4kh_step **out);
q4kh_status example_graph_compute(q4kh_device_ctx *dev, q4kh_step *step,
                                  struct q4kh_step_run *run);
void example_graph_release(q4kh_device_ctx *dev, q4kh_step *step);

#endif
