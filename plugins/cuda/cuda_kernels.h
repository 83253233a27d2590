/*
 * The cuda plugin's kernels as the host-side C sees them. Each launch
 * function enqueues its kernels on stream s and returns
 * cudaGetLastError() (launch errors; faults inside a kernel surface at the
 * next synchronisation). Every argument has been validated by the caller
 * (cuda_ops.c): types are supported, views lie inside their buffers,
 * shapes agree, outputs are disjoint from inputs or exactly equal to them
 * where the op allows it. Pointers are device addresses; strides are bytes.
 */
#ifndef Q4KH_CUDA_KERNELS_H
#define Q4KH_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor with its buffer resolved: element (0, i1, i2, i3) of a row is at
 * data + i1 nb[1] + i2 nb[2] + i3 nb[3]; ne[0] is contiguous. */
struct cuda_view {
	char *data;
	uint32_t type;
	int64_t ne[4];
	int64_t nb[4];
};

/* Attention: query t sits at pos[t] when pos (device memory) is not
 * NULL, else at pos0 + t. */
struct cuda_attn {
	int64_t pos0;
	const int32_t *pos;
	int32_t window;
	float scale, softcap;
	/* attention_paged (ABI 1.8): the block table on the device, its
	 * length, the page size and the pools' pages; pages NULL: key j is
	 * row j of the cache */
	const int32_t *pages;
	int64_t n_table;
	int32_t page_size;
	int64_t n_pages;
};

/*
 * RoPE (plugin.h, struct q4kh_rope_params) with YaRN's ramp resolved on
 * the host: pairs below lo extrapolate, above hi interpolate (both 0 and
 * ext_factor 0 without YaRN); mscale scales cos and sin.
 */
struct cuda_rope {
	int32_t n_rot;
	int neox;
	double base, freq_scale, ext_factor, lo, hi, mscale;
	const float *freq_factors; /* device, n_rot / 2 values, or NULL */
};

/*
 * Faults found by a kernel as it runs: an index tensor (ABI 1.2) whose
 * value lies outside the tensor it indexes. The first fault of a stream
 * is kept in four int32 words of device memory, CUDA_FAULT_WORDS:
 * [0] the code below, [1] the element, [2] its value, [3] the limit; the
 * kernel skips the access. The host reads them at its next
 * synchronisation (cuda_device.c).
 */
enum cuda_fault {
	CUDA_FAULT_NONE = 0,
	CUDA_FAULT_GET_ROWS_IDS,
	CUDA_FAULT_ROPE_POS,
	CUDA_FAULT_SET_ROWS_ROWS,
	CUDA_FAULT_ATTENTION_POS,
	CUDA_FAULT_MUL_MAT_ID_IDS,
	CUDA_FAULT_ATTENTION_PAGES,
};
#define CUDA_FAULT_WORDS 4

/* Largest attention head dimension: q, the accumulator and the scores of
 * one chunk of keys live in a block's shared memory. */
#define CUDA_ATTN_MAX_HEAD_DIM 4096

/* out[:, i] = dequant(table[:, ids[i]]) * scale; ids on the device, each
 * checked against table's rows (fault: CUDA_FAULT_GET_ROWS_IDS). */
cudaError_t cuda_launch_get_rows(const struct cuda_view *table,
                                 const int32_t *ids, int64_t n, float scale,
                                 const struct cuda_view *out, int32_t *fault,
                                 cudaStream_t s);
/* y {N, T} = w {K, N} x {K, T}, fp32 accumulation; SMS: the device's
 * multiprocessors. cuda_gemv_launch when it takes the views (PDL: as a
 * programmatic dependent, q4khost/cuda_pdl.cuh), else the plain kernel of
 * cuda_matmul.cu. */
cudaError_t cuda_launch_mul_mat(const struct cuda_view *w,
                                const struct cuda_view *x,
                                const struct cuda_view *y, int sms, int pdl,
                                cudaStream_t s);
/* The same through cuda_gemv.cu, or cudaErrorNotSupported (nothing
 * enqueued) when w's rows or x's columns are not aligned for its loads
 * (see gv_align there; x 16-byte aligned) or an F32 / F16 row length is
 * not a multiple of 4. */
cudaError_t cuda_gemv_launch(const struct cuda_view *w,
                             const struct cuda_view *x,
                             const struct cuda_view *y, int sms, int pdl,
                             cudaStream_t s);
/*
 * out = x / sqrt(mean(x^2) + eps) (* w when w is not NULL), per row, in one
 * kernel for rms_norm, add_rms_norm and norm_add_rms_norm (plugin.h): first
 * x += a when a is not NULL (a of x's shape, apart from x), and before
 * that, with NORM_A, a = rms_norm(a) with eps_a (* wa when wa is not NULL),
 * written back to a. out may be x or a. PDL: launched as a programmatic
 * dependent (q4khost/cuda_pdl.cuh), as the step's other kernels with it.
 */
cudaError_t cuda_launch_norm(const struct cuda_view *x, const struct cuda_view *a,
                             int norm_a, const struct cuda_view *wa, float eps_a,
                             const struct cuda_view *w, float eps,
                             const struct cuda_view *out, int pdl, cudaStream_t s);
/* RoPE over x {hd, heads, T}; pos (device) per token, each checked to be
 * non-negative (fault: CUDA_FAULT_ROPE_POS); neox: halves pair. PDL as
 * cuda_launch_norm's, for every launcher below. */
cudaError_t cuda_launch_rope(const struct cuda_view *x, const int32_t *pos,
                             const struct cuda_rope *p,
                             const struct cuda_view *out, int32_t *fault,
                             int pdl, cudaStream_t s);
/* The same, and in the same kernel out's rows written to cache (f32 or
 * f16 {hd, heads, n}, apart from x and out; NULL: none) at rows pos[t],
 * each checked against n (fault: CUDA_FAULT_SET_ROWS_ROWS). */
cudaError_t cuda_launch_rope_set_rows(const struct cuda_view *x,
                                      const int32_t *pos,
                                      const struct cuda_rope *p,
                                      const struct cuda_view *out,
                                      const struct cuda_view *cache,
                                      int32_t *fault, int pdl, cudaStream_t s);
/*
 * The per-head RMSNorms of q and k (Gemma 3's and Qwen3's attn_q_norm and
 * attn_k_norm) that cuda_launch_rope_store may apply first: q_w and k_w
 * f32 {hd}, contiguous, or NULL (none), and their eps.
 */
struct cuda_head_norms {
	const float *q_w, *k_w;
	float q_eps, k_eps;
};

/* The longest head cuda_launch_rope_store norms: rms_norm's block for
 * such a row is one warp. */
#define CUDA_HEAD_NORM_MAX 256

/*
 * rope_store: q and k {hd, heads, T} rotated in place, k's rows written
 * to k_cache and v's {hd_v, heads_v, T} to v_cache (each f32 or f16, its
 * own type) at rows pos[t], one kernel: positions checked as rope_ext
 * (CUDA_FAULT_ROPE_POS) and set_rows (CUDA_FAULT_SET_ROWS_ROWS) check
 * them. With NORMS (NULL: none) each q and k head is first normed in
 * place as rms_norm norms it, with the bits of the norms' nodes then
 * rope_store's; hd <= CUDA_HEAD_NORM_MAX and each head's values
 * contiguous then.
 */
cudaError_t cuda_launch_rope_store(const struct cuda_view *q,
                                   const struct cuda_view *k,
                                   const struct cuda_view *v, const int32_t *pos,
                                   const struct cuda_rope *p,
                                   const struct cuda_view *k_cache,
                                   const struct cuda_view *v_cache,
                                   const struct cuda_head_norms *norms, int32_t *fault,
                                   int pdl, cudaStream_t s);
/* out = a + b or a * b (mul != 0), b broadcast where its ne is 1. */
cudaError_t cuda_launch_binary(int mul, const struct cuda_view *a,
                               const struct cuda_view *b,
                               const struct cuda_view *out, int pdl, cudaStream_t s);
cudaError_t cuda_launch_scale(const struct cuda_view *x, float v,
                              const struct cuda_view *out, int pdl, cudaStream_t s);
/* out = act(gate) * up: SiLU when silu != 0, else GELU (tanh). */
cudaError_t cuda_launch_glu(int silu, const struct cuda_view *gate,
                            const struct cuda_view *up,
                            const struct cuda_view *out, int pdl, cudaStream_t s);
/* out = f(x) element-wise, f the q4kh_unary_kind KIND (plugin.h):
 * sigmoid, softplus or SiLU, in float. */
cudaError_t cuda_launch_unary(int kind, const struct cuda_view *x,
                              const struct cuda_view *out, int pdl, cudaStream_t s);
/* dst = src element by element, f32/f16 either way (round to nearest even). */
cudaError_t cuda_launch_copy(const struct cuda_view *src,
                             const struct cuda_view *dst, int pdl, cudaStream_t s);
/* dst[:, :, rows[t]] = src[:, :, t], f32 to dst's f32 or f16; each row
 * checked against dst's (fault: CUDA_FAULT_SET_ROWS_ROWS). */
cudaError_t cuda_launch_set_rows(const struct cuda_view *src,
                                 const int32_t *rows,
                                 const struct cuda_view *dst, int32_t *fault,
                                 int pdl, cudaStream_t s);

/*
 * The device context's scratch (cuda.h) starts with this many int
 * counters, zero between launches: a kernel whose blocks count their way
 * to a last block that merges (attention's split form, top2) uses some
 * of them and leaves them at zero again. Its own data lies after them.
 */
#define CUDA_SCRATCH_COUNTERS 1024

/*
 * Causal, windowed, grouped-query attention over the KV cache (plugin.h);
 * positions from p->pos are checked against the cache (fault:
 * CUDA_FAULT_ATTENTION_POS). A few queries at a time (decode) are split
 * over the cache length when cuda_attention_scratch() asks for scratch
 * memory: SCRATCH then holds that many bytes of device memory, zero when
 * first allocated (the launch leaves the counters it keeps there at zero
 * again), else it is NULL. SMS: the device's multiprocessors; CC_MAJOR:
 * its compute capability's major number (both read at device open); PDL
 * as cuda_launch_norm's, for the split form.
 */
size_t cuda_attention_scratch(const struct cuda_view *q,
                              const struct cuda_view *k,
                              const struct cuda_view *v, int sms);
cudaError_t cuda_launch_attention(const struct cuda_view *q,
                                  const struct cuda_view *k,
                                  const struct cuda_view *v,
                                  const struct cuda_attn *p,
                                  const struct cuda_view *out, void *scratch,
                                  int sms, int cc_major, int32_t *fault, int pdl,
                                  cudaStream_t s);

/*
 * The same on tensor cores (cuda_flash.cu) for an F16 cache and a head
 * dimension of 64, 128 or 256 on compute capability 8.0 or later (CC_MAJOR:
 * the device's major number), whatever the number of queries;
 * cudaErrorNotSupported (nothing enqueued) otherwise. Scores from f16-rounded queries and keys, weights rounded to
 * f16 for P V, f32 accumulation.
 */
cudaError_t cuda_launch_flash(const struct cuda_view *q,
                              const struct cuda_view *k,
                              const struct cuda_view *v,
                              const struct cuda_attn *p,
                              const struct cuda_view *out, int cc_major,
                              int32_t *fault, cudaStream_t s);

/*
 * The linear-attention ops with a state (plugin.h: ssm_conv, delta_net),
 * f32 views of the shapes plugin.h gives; each state is read and written
 * in place by the same launch. ssm_conv: x {C, T}, w {K, C}, state
 * {K-1, C}, out {C, T}, any K >= 2 (cuda_conv.cu). delta_net: the
 * one-token form when T = 1, else the whole step's recurrence in one
 * launch (cuda_delta.cu); cudaErrorNotSupported (nothing enqueued) when
 * S_k = q->ne[0] exceeds CUDA_DELTA_MAX_KEYS, a warp's registers.
 */
#define CUDA_DELTA_MAX_KEYS 1024
cudaError_t cuda_launch_ssm_conv(const struct cuda_view *x,
                                 const struct cuda_view *w,
                                 const struct cuda_view *state,
                                 const struct cuda_view *out, cudaStream_t s);
cudaError_t cuda_launch_delta_net(const struct cuda_view *q,
                                  const struct cuda_view *k,
                                  const struct cuda_view *v,
                                  const struct cuda_view *g,
                                  const struct cuda_view *beta,
                                  const struct cuda_view *state, float scale,
                                  const struct cuda_view *out, cudaStream_t s);

/*
 * Read N16 16-byte vectors from p once, as fast as the device can (a few
 * blocks per multiprocessor, SMS of them, streaming loads); the reads'
 * checksum goes to *sink only on an improbable value, so the loads stay.
 */
cudaError_t cuda_launch_read(const void *p, uint64_t n16, int sms,
                             int32_t *sink, cudaStream_t s);

/* 1 when get_rows and mul_mat take weights of TYPE, else 0. */
int cuda_type_supported(uint32_t type);

/*
 * The greedy pick of each column of x F32 {N, T} (plugin.h, top2):
 * idx[t] (device, T values) and val[t nb1], val[t nb1 + 1] (device, nb1
 * in floats). A column is split over several blocks, the last of which
 * merges their picks, when cuda_top2_scratch() asks for scratch: SCRATCH
 * then holds that many bytes of the device context's scratch (its
 * counters at zero), else it is NULL and a block takes a whole column.
 * One launch either way. SMS: the device's multiprocessors; PDL as
 * cuda_launch_norm's.
 */
size_t cuda_top2_scratch(const struct cuda_view *x, int sms);
cudaError_t cuda_launch_top2(const struct cuda_view *x, int32_t *idx,
                             float *val, int64_t nb1, void *scratch, int sms,
                             int pdl, cudaStream_t s);

/*
 * The mixture-of-experts ops (plugin.h, ABI 1.7; cuda_moe.cu). Experts:
 * at most CUDA_MOE_MAX_EXPERTS (moe_route keeps a column's probabilities
 * in shared memory, mul_mat_id's grouping its counts).
 */
#define CUDA_MOE_MAX_EXPERTS 2048

/*
 * moe_route: logits F32 {E, T}, ids I32 {k, T}, weights F32 {k, T} (row
 * strides free). A warp per column: p = softmax in double (the largest
 * logit subtracted, the sum in a fixed tree), the k largest chosen one by
 * one, the lower index first among equal values, the chosen ones' sum in
 * slot order, weights over max(sum, 2^-14) with NORM, rounded once to
 * float: the cpu reference's rule (sdk/lib/moe.c).
 */
cudaError_t cuda_launch_moe_route(const struct cuda_view *logits, int norm,
                                  const struct cuda_view *ids,
                                  const struct cuda_view *weights, cudaStream_t s);

/*
 * mul_mat_id: y {N, k, T} column (j, t) = w's matrix ids[j, t] {K, N} times
 * x's column (j % X, t), for w {K, N, E} of a type cuda_type_supported
 * takes. Each id is checked against E on the device (fault:
 * CUDA_FAULT_MUL_MAT_ID_IDS; the column is left unwritten).
 * With few columns (k T < 2 E: decode) one launch reads each column's
 * expert rows straight from x into y; else the columns are grouped by
 * expert on the device (a counting sort in one block), gathered, run
 * CUDA_MOE_TILE at a time through each expert's matrix and scattered
 * back: four launches, whatever the routing, and no host wait.
 * cuda_mul_mat_id_scratch() bytes of SCRATCH (device memory, 256-aligned;
 * 0: NULL will do) hold the grouping. Products through the GEMV formats
 * where w and x suit them (cuda_gemv.cu), else the plain kernel
 * (cuda_matmul.cu): fp32 throughout, each column as those kernels
 * compute it. SMS: the device's multiprocessors.
 */
#define CUDA_MOE_TILE 8
/* Does mul_mat_id of COLS columns (k T) over E experts take the direct
 * form? */
int cuda_mul_mat_id_direct(int64_t cols, int64_t e);
size_t cuda_mul_mat_id_scratch(const struct cuda_view *w, const struct cuda_view *ids);
cudaError_t cuda_launch_mul_mat_id(const struct cuda_view *w, const struct cuda_view *x,
                                   const struct cuda_view *ids, const struct cuda_view *y,
                                   void *scratch, int sms, int32_t *fault,
                                   cudaStream_t s);

/*
 * A decode's mixture-of-experts block in two launches (cuda_graph.c plans
 * it for the nodes moe_route, mul_mat_id of gate and of up, their SiLU
 * GLU, mul_mat_id of down, the weights' mul and the slots' adds):
 *  1. each token's route (moe_route's warp, into ids and weights), then
 *     gate and up of its k experts' rows, act(gate) up into h;
 *  2. down of each slot's column of h and the slots' products times their
 *     weights added in slot order into out.
 * logits F32 {E, T}, ids I32 {k, T}, weights F32 {k, T}, x F32 {K, 1, T},
 * gate and up {K, F, E} of one type, h F32 {F, k, T}, down {F, K, E}, out
 * F32 {K, T}. Each product is the one mul_mat_id's direct form gives (its
 * formats, its split of rows over warps), the GLU glu's, the sums those of
 * mul and add: the unfused nodes' bits. cudaErrorNotSupported, nothing
 * enqueued, where those nodes would not take the GEMV formats' direct form
 * (k T >= 2 E, types or alignment) or gate's type is not up's. Each launch
 * is at most one wave of the blocks SMS multiprocessors hold (a block
 * routes its token once, then walks its share of the rows), launched as a
 * programmatic dependent (q4khost/cuda_pdl.cuh) when PDL is nonzero.
 */
struct cuda_moe_fused_views {
	struct cuda_view logits, ids, weights, x, gate, up, h, down, out;
};
cudaError_t cuda_launch_moe_fused(const struct cuda_moe_fused_views *v, int norm, int sms,
                                  int pdl, cudaStream_t s);

/* cudaSuccess when this build holds code that the current device runs. */
cudaError_t cuda_kernels_runnable(void);

/*
 * Load a file's kernels on the current device now rather than at their
 * first launch (q4kh_preload, q4khost/cuda_preload.cuh): what a device's first
 * step would otherwise wait for, done by device_open's warm-up thread
 * while the weights go up. cuda_gemv_preload also asks, once, how many
 * blocks of each GEMV kernel a multiprocessor holds, which the launches
 * size their grids by (a launch asks itself when it comes first). The
 * first CUDA error, which the kernel's launch would report again.
 */
cudaError_t cuda_gemv_preload(void);
cudaError_t cuda_matmul_preload(void);
cudaError_t cuda_rowwise_preload(void);
cudaError_t cuda_elementwise_preload(void);
cudaError_t cuda_attention_preload(void);
cudaError_t cuda_flash_preload(void);
cudaError_t cuda_top2_preload(void);

#ifdef __cplusplus
}
#endif

#endif
