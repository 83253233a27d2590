/*
 * cpu-fast: a backend for the host's cores that computes every op in
 * float32 SIMD (AVX2, or AVX-512 where the CPU and the OS's saved register
 * state allow), where the reference cpu backend computes in double. It is
 * of kind "cpu" (plugin.h, backend_kind), so the kernel variants for the
 * reference run on it too, on its worker threads (the SDK's spinning pool,
 * q4khost/pool.h, lent through native_device), and F2 judges it against
 * the reference like any other candidate.
 *
 * Files: fast_plugin.c (identity, settings, devices, and the SDK's
 * scaffolding: q4khost/backend_base.h's errors and records,
 * q4khost/cpu_backend.h's buffers and scratch), fast_tensor.c (argument
 * checks, through the SDK's contract.h), fast_ops.c (row-wise ops),
 * fast_rope.c, fast_attention.c,
 * fast_recurrent.c (the linear-attention ops), fast_graph.c (the step graph
 * entries of ABI 1.6), fast_matmul.c (the
 * built-in matrix product), and the inner loops once per instruction set
 * (fast_kernels.h, built by fast_avx2.c and fast_avx512.c with their own
 * -m flags).
 */
#ifndef Q4KH_FAST_H
#define Q4KH_FAST_H

#include <stdint.h>

#include "q4khost/contract.h"
#include "q4khost/cpu_backend.h"
#include "q4khost/dequant.h"
#include "q4khost/plugin.h"

#include "q4khost/pool.h"

/* Values a part of a row-wise op holds at least: smaller parts cost more
 * to hand out than to compute. */
#define FAST_GRAIN_VALUES 16384

/*
 * One instruction set's inner loops over contiguous f32 (or f16) rows of
 * n values, any n >= 0. Pure functions; out may be an input (in place).
 */
struct fast_kernels {
	const char *name; /* "avx2", "avx512" */
	float (*sum_squares)(const float *x, int64_t n);
	void (*scale)(const float *x, float s, float *out, int64_t n);
	/* out = x * s * w, rounded in that order (ggml's) */
	void (*scale_mul)(const float *x, float s, const float *w, float *out,
	                  int64_t n);
	void (*add)(const float *a, const float *b, float *out, int64_t n);
	void (*mul)(const float *a, const float *b, float *out, int64_t n);
	/* out = act(g) * u, act as q4kh_glu_kind says */
	void (*glu)(q4kh_glu_kind kind, const float *g, const float *u, float *out,
	            int64_t n);
	void (*to_f16)(const float *x, uint16_t *out, int64_t n);
	void (*from_f16)(const uint16_t *x, float *out, int64_t n);
	float (*dot)(const float *a, const float *b, int64_t n);
	float (*dot_f16)(const float *a, const uint16_t *b, int64_t n);
	/* y += a x */
	void (*axpy)(float a, const float *x, float *y, int64_t n);
	void (*axpy_f16)(float a, const uint16_t *x, float *y, int64_t n);
	/* s[i] = exp(s[i] - max); returns the sum of the new s */
	float (*exp_sum)(float *s, float max, int64_t n);
	/*
	 * RoPE of one head: NEOX rotates (x[i], x[i + half]) by (c[i], s[i]);
	 * NORM rotates (x[2i], x[2i + 1]), with cc and ss the angles laid out
	 * per value: cc = c0 c0 c1 c1 .., ss = -s0 s0 -s1 s1 .. (n_rot values).
	 */
	void (*rope_neox)(const float *x, const float *c, const float *s,
	                  float *out, int64_t half);
	void (*rope_norm)(const float *x, const float *cc, const float *ss,
	                  float *out, int64_t n_rot);
	/* out = f(x), f as q4kh_unary_kind says */
	void (*unary)(q4kh_unary_kind kind, const float *x, float *out, int64_t n);
	/*
	 * One row of a delta-rule state and one token (plugin.h, delta_net):
	 * with r the row's products with k and q and kq = k . q,
	 *   d = beta (v - decay (row . k)),  row = decay row + d k,
	 * returning the new row . q = decay (old row . q) + d kq.
	 */
	float (*delta_row)(float *row, const float *k, const float *q, int64_t n,
	                   float decay, float beta, float v, float kq);
};

extern const struct fast_kernels fast_avx2_kernels;
extern const struct fast_kernels fast_avx512_kernels;

/* The (cos, sin) tables of one set of RoPE parameters (fast_rope.c). */
struct fast_angles;

struct q4kh_backend_ctx {
	const struct q4kh_host_api *host;
	unsigned threads;
	unsigned spin_us;
	const struct fast_kernels *k; /* NULL: this CPU runs neither set */
	char error[1024];
};

struct q4kh_device_ctx {
	q4kh_backend_ctx *ctx;
	const struct fast_kernels *k;
	struct q4kh_pool *pool;
	unsigned threads;
	struct q4kh_cpu_scratch scratch; /* floats */
	struct fast_angles *angles;
};

/* struct q4kh_buffer: q4khost/cpu_backend.h's. */

/* Keep a formatted message as ctx's last error (ctx NULL: init()'s) and
 * return st (Q4KH_BACKEND_ERRORS, q4khost/backend_base.h). */
q4kh_status fast_fail(q4kh_backend_ctx *ctx, q4kh_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Make every thread's scratch at least BYTES long. */
q4kh_status fast_scratch(q4kh_device_ctx *dev, uint64_t bytes);

/* Rows per part of a row-wise op over rows of ROW_LEN values. */
static inline int64_t fast_grain(int64_t row_len)
{
	return row_len >= FAST_GRAIN_VALUES ? 1 : FAST_GRAIN_VALUES / row_len;
}

/* --- argument checks (fast_tensor.c) --- */

/*
 * The contract checks' view of DEV (q4khost/contract.h): its buffers, the
 * weight types it decodes, its last error as the message. With DEV NULL
 * every op check fails.
 */
struct q4kh_check fast_contract(q4kh_device_ctx *dev);
/* The values of index tensor T, checked as I32 {n}: each in [0, limit). */
q4kh_status fast_index_values(q4kh_device_ctx *dev, const char *what,
                              const struct q4kh_tensor *t, int64_t limit);

/* A tensor's elements and rows: q4kh_cpu_at, q4kh_cpu_rows, q4kh_cpu_flat_row
 * (q4khost/cpu_backend.h). */

/* --- ops --- */

q4kh_status fast_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                          const int32_t *ids, int64_t n, float scale,
                          const struct q4kh_tensor *out);
q4kh_status fast_get_rows_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                              const struct q4kh_tensor *ids, float scale,
                              const struct q4kh_tensor *out);
q4kh_status fast_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                         const struct q4kh_tensor *x, const struct q4kh_tensor *y);
/*
 * mul_mat, then r = r + y (add's arithmetic) in the same pool job: each
 * value added as it is made (the step graph's fusion, fast_graph.c). R
 * f32 of y's shape, rows contiguous, sharing no byte with w, x or y; NULL
 * for mul_mat alone.
 */
q4kh_status fast_mul_mat_add(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                             const struct q4kh_tensor *x, const struct q4kh_tensor *y,
                             const struct q4kh_tensor *r);
q4kh_status fast_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w, float eps,
                          const struct q4kh_tensor *out);
/*
 * ABI 1.4 (plugin.h): add then rms_norm of the sum, one pass over each
 * row; rope_ext in place then set_rows of the rotated rows at the same
 * positions, one pass over each head (fast_rope.c); rope_store, the
 * queries rotated, the keys rotated and cached and the values cached in
 * one pool job over the heads of all three (fast_rope.c).
 */
q4kh_status fast_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *a, const struct q4kh_tensor *w,
                              float eps, const struct q4kh_tensor *out);
q4kh_status fast_norm_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                   const struct q4kh_tensor *a, const struct q4kh_tensor *w_a,
                                   float eps_a, const struct q4kh_tensor *w, float eps,
                                   const struct q4kh_tensor *out);
q4kh_status fast_rope_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                               const struct q4kh_tensor *pos,
                               const struct q4kh_rope_params *params,
                               const struct q4kh_tensor *cache);
q4kh_status fast_rope_store(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                            const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                            const struct q4kh_tensor *pos,
                            const struct q4kh_rope_params *params,
                            const struct q4kh_tensor *k_cache,
                            const struct q4kh_tensor *v_cache);
/* ABI 1.4 (plugin.h): the greedy pick of each column, columns spread over
 * the pool (fast_ops.c). */
q4kh_status fast_top2(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const struct q4kh_tensor *idx, const struct q4kh_tensor *val);
q4kh_status fast_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                      float base, float freq_scale, const struct q4kh_tensor *out);
q4kh_status fast_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *pos,
                          const struct q4kh_rope_params *params,
                          const struct q4kh_tensor *out);
q4kh_status fast_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b, const struct q4kh_tensor *out);
q4kh_status fast_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b, const struct q4kh_tensor *out);
q4kh_status fast_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x, float s,
                       const struct q4kh_tensor *out);
q4kh_status fast_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                     const struct q4kh_tensor *gate, const struct q4kh_tensor *up,
                     const struct q4kh_tensor *out);
q4kh_status fast_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                      const struct q4kh_tensor *dst);
q4kh_status fast_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                          const struct q4kh_tensor *rows,
                          const struct q4kh_tensor *dst);
q4kh_status fast_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k_cache,
                           const struct q4kh_tensor *v_cache,
                           const struct q4kh_attn_params *params,
                           const struct q4kh_tensor *out);
q4kh_status fast_attention_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                               const struct q4kh_tensor *k_cache,
                               const struct q4kh_tensor *v_cache,
                               const struct q4kh_tensor *pos,
                               const struct q4kh_attn_params *params,
                               const struct q4kh_tensor *out);
/* ABI 1.8: attention_ext over pools of pages through a block table. */
q4kh_status fast_attention_paged(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                 const struct q4kh_tensor *k_pool,
                                 const struct q4kh_tensor *v_pool,
                                 const struct q4kh_tensor *pos,
                                 const struct q4kh_tensor *pages, int32_t page_size,
                                 const struct q4kh_attn_params *params,
                                 const struct q4kh_tensor *out);

q4kh_status fast_unary(q4kh_device_ctx *dev, q4kh_unary_kind kind,
                       const struct q4kh_tensor *x, const struct q4kh_tensor *out);
q4kh_status fast_ssm_conv(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w, const struct q4kh_tensor *state,
                          const struct q4kh_tensor *out);
q4kh_status fast_delta_net(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                           const struct q4kh_tensor *g, const struct q4kh_tensor *beta,
                           const struct q4kh_tensor *state, float scale,
                           const struct q4kh_tensor *out);

/*
 * N values of row S (type FROM) into row D (type TO), f32 or f16 each,
 * with K's conversions (copy and the cache writes; fast_ops.c). S and D
 * are one row or share no byte. Thread-safe.
 */
void fast_convert(const struct fast_kernels *k, uint32_t from, uint32_t to, const void *s,
                  void *d, int64_t n);

/* The function table (fast_plugin.c), which the step graph's nodes are
 * issued through (fast_graph.c). */
extern const struct q4kh_backend_v1 fast_table;

/* ABI 1.6: the step graph's entries (fast_graph.c). */
q4kh_status fast_graph_prepare(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                               q4kh_step **out);
q4kh_status fast_graph_compute(q4kh_device_ctx *dev, q4kh_step *step,
                               struct q4kh_step_run *run);
void fast_graph_release(q4kh_device_ctx *dev, q4kh_step *step);

/* Free DEV's RoPE tables (fast_rope.c). */
void fast_angles_free(q4kh_device_ctx *dev);

#endif
