/*
 * The reference cpu backend: shared types of its files.
 *
 * Every op is deterministic: each output element is computed by exactly one
 * worker thread, and every reduction (dot product, sum of squares, softmax
 * sum, attention accumulation, convolution, delta-rule state) runs in
 * double in an order that depends on neither the thread count nor the batch
 * size.
 */
#ifndef Q4KH_CPU_H
#define Q4KH_CPU_H

#include <stdint.h>

#include "q4khost/contract.h"
#include "q4khost/cpu_backend.h"
#include "q4khost/dequant.h"
#include "q4khost/plugin.h"
#include "q4khost/pool.h"

/*
 * Hot loops are also built for AVX2 where GCC can (the CPU picks at load
 * time). AVX2 brings no FMA and contraction is off, so every build rounds
 * alike.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_VECTOR_CLONES
#endif

struct q4kh_backend_ctx {
	const struct q4kh_host_api *host;
	unsigned threads;
	char error[1024];
};

struct q4kh_device_ctx {
	q4kh_backend_ctx *ctx;
	struct q4kh_pool *pool;
	unsigned threads;
	struct q4kh_cpu_scratch scratch;
	/* q4kh_fp16_to_f32(h) at [h], filled at open: the attention reads
	 * f16 caches through it, the same bits at a load each. */
	float *f16;
};

/* struct q4kh_buffer: q4khost/cpu_backend.h's. */

/* --- errors (cpu_plugin.c) --- */

/* Keep a formatted message as ctx's last error (ctx NULL: init()'s) and
 * return st (Q4KH_BACKEND_ERRORS, q4khost/backend_base.h). */
q4kh_status cpu_fail(q4kh_backend_ctx *ctx, q4kh_status st, const char *fmt,
                     ...)
	__attribute__((format(printf, 3, 4)));

/* Make every thread's scratch at least BYTES long. */
q4kh_status cpu_scratch_reserve(q4kh_device_ctx *dev, uint64_t bytes);

/* Bit for a type in a mask of accepted types. */
#define CPU_T(type) Q4KH_TYPE_BIT(type)

/* --- the op contract (cpu_tensor.c) --- */

/*
 * The contract checks' view of dev (q4khost/contract.h): its buffers, the
 * weight types it multiplies, and its context's last error as the place
 * for a failed check's message. With dev NULL every check fails, without
 * a message (no buffer is NULL's, and there is no context to keep one): an
 * op needs no test of its own.
 */
struct q4kh_check cpu_contract(q4kh_device_ctx *dev);

/*
 * The values of index tensor T, which the op's contract check has
 * accepted as I32 {n}: each in [0, limit), WHAT naming them in the
 * message ("set_rows rows[0] = 5, expected 0 .. 4").
 */
q4kh_status cpu_index_values(q4kh_device_ctx *dev, const char *what,
                             const struct q4kh_tensor *t, int64_t limit);

/* A tensor's elements and rows: q4kh_cpu_at, q4kh_cpu_rows, q4kh_cpu_flat_row
 * (q4khost/cpu_backend.h). */

/*
 * sum a[i] b[i] in double (cpu_matmul.c): 8 lanes, lane l summing i = l
 * (mod 8) in increasing i, combined in one fixed tree. Pure.
 */
double cpu_dot(const double *a, const double *b, int64_t n);

/* --- ops (cpu_ops.c, cpu_matmul.c, cpu_attention.c, cpu_recurrent.c) --- */

q4kh_status cpu_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                         const int32_t *ids, int64_t n, float scale,
                         const struct q4kh_tensor *out);
q4kh_status cpu_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                        const struct q4kh_tensor *x,
                        const struct q4kh_tensor *y);
q4kh_status cpu_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *w, float eps,
                         const struct q4kh_tensor *out);
q4kh_status cpu_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                     const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                     float base, float freq_scale,
                     const struct q4kh_tensor *out);
q4kh_status cpu_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                    const struct q4kh_tensor *b, const struct q4kh_tensor *out);
q4kh_status cpu_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                    const struct q4kh_tensor *b, const struct q4kh_tensor *out);
q4kh_status cpu_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      float s, const struct q4kh_tensor *out);
q4kh_status cpu_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                    const struct q4kh_tensor *gate,
                    const struct q4kh_tensor *up,
                    const struct q4kh_tensor *out);
q4kh_status cpu_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                     const struct q4kh_tensor *dst);
q4kh_status cpu_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                          const struct q4kh_tensor *k_cache,
                          const struct q4kh_tensor *v_cache,
                          const struct q4kh_attn_params *params,
                          const struct q4kh_tensor *out);

/* --- ABI 1.2: per-step values in device (here: host) memory --- */

q4kh_status cpu_get_rows_ext(q4kh_device_ctx *dev,
                             const struct q4kh_tensor *table,
                             const struct q4kh_tensor *ids, float scale,
                             const struct q4kh_tensor *out);
q4kh_status cpu_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *pos,
                         const struct q4kh_rope_params *params,
                         const struct q4kh_tensor *out);
q4kh_status cpu_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                         const struct q4kh_tensor *rows,
                         const struct q4kh_tensor *dst);
q4kh_status cpu_attention_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                              const struct q4kh_tensor *k_cache,
                              const struct q4kh_tensor *v_cache,
                              const struct q4kh_tensor *pos,
                              const struct q4kh_attn_params *params,
                              const struct q4kh_tensor *out);
/* ABI 1.8: attention_ext over pools of pages through a block table. */
q4kh_status cpu_attention_paged(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                const struct q4kh_tensor *k_pool,
                                const struct q4kh_tensor *v_pool,
                                const struct q4kh_tensor *pos,
                                const struct q4kh_tensor *pages, int32_t page_size,
                                const struct q4kh_attn_params *params,
                                const struct q4kh_tensor *out);

/* --- ABI 1.2: linear-attention layers --- */

q4kh_status cpu_unary(q4kh_device_ctx *dev, q4kh_unary_kind kind,
                      const struct q4kh_tensor *x,
                      const struct q4kh_tensor *out);
q4kh_status cpu_ssm_conv(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                         const struct q4kh_tensor *w,
                         const struct q4kh_tensor *state,
                         const struct q4kh_tensor *out);
q4kh_status cpu_delta_net(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                          const struct q4kh_tensor *k,
                          const struct q4kh_tensor *v,
                          const struct q4kh_tensor *g,
                          const struct q4kh_tensor *beta,
                          const struct q4kh_tensor *state, float scale,
                          const struct q4kh_tensor *out);

#endif
