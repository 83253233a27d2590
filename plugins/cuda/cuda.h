/*
 * The cuda backend: shared types of its host-side files.
 *
 * Each device context owns one CUDA stream; every op is validated on the
 * host, then enqueued on that stream and returns without waiting.
 * synchronize() and buffer_download() wait; buffer_upload() is ordered
 * after the ops before it and returns once the host's bytes have been
 * read (cuda_buffer.c: from pinned memory, after its copy; from pageable
 * memory, once they are in staging memory). Token ids and
 * positions arrive in host memory: they are copied on the stream into a
 * staging buffer of the device context, which the stream's order makes
 * safe to reuse by the next op. The ABI 1.2 entries take those values in
 * device tensors instead, check them as they run and leave a fault
 * (cuda_kernels.h) that the next synchronisation reports.
 */
#ifndef Q4KH_CUDA_H
#define Q4KH_CUDA_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "cuda_persist.h"
#include "q4khost/cuda_retired.h"
#include "q4khost/contract.h"
#include "q4khost/plugin.h"

struct q4kh_backend_ctx {
	const struct q4kh_host_api *host;
	int n_devices;
	unsigned persistent; /* [plugin.cuda] persistent: 1 lets one-token
	                        steps run the persistent kernel (default 0) */
	unsigned pdl;        /* [plugin.cuda] pdl: 1 (default) launches a
	                        step's kernels as programmatic dependents on
	                        devices of compute capability 9.0 and later */
	unsigned fuse;       /* [plugin.cuda] fuse: 1 (default) lets the graph
	                        entry plan its own groups (match_head_norms);
	                        0 plans the host's patterns only (A/B runs) */
	char no_devices[512]; /* why n_devices is 0: the CUDA error and what to do */
	char error[1024];
};

/* Shapes of products on tensor cores graph_prepare runs once per device
 * (cuda_graph.c); a model has a handful. */
#define CUDA_TC_WARM_SHAPES 32

struct q4kh_device_ctx {
	q4kh_backend_ctx *ctx;
	int ordinal;
	cudaStream_t stream;
	int32_t *stage;   /* device memory for ids and positions */
	int64_t stage_n;  /* int32 values it holds */
	cudaEvent_t timer[2]; /* timer_start's and timer_stop's; made on first use */
	int recording;    /* between graph_begin and graph_end */
	int sms;          /* the device's multiprocessors */
	int cc_major;     /* its compute capability's major number */
	int pdl;          /* launch as programmatic dependents
	                     (q4khost/cuda_pdl.cuh): ctx->pdl and cc_major >= 9 */
	int32_t *fault;   /* device: CUDA_FAULT_WORDS, zero while none */
	int32_t *fault_seen; /* pinned host copy, read at each synchronisation */
	void *scratch;    /* device: attention's partial results */
	size_t scratch_size;
	struct q4kh_retired *retired; /* earlier scratch, freed on close */
	void *blas;       /* cuda_tc's cuBLAS handle: made on the warm-up
	                     thread, else by the first product that goes to
	                     tensor cores */
	pthread_t warm;   /* the warm-up thread (cuda_device.c) */
	int warming;      /* it runs or has not been joined yet */
	struct {
		int64_t k, n, t;
	} tc_warm[CUDA_TC_WARM_SHAPES]; /* products on tensor cores that
	                                   graph_prepare ran once */
	int n_tc_warm;
	struct cuda_ring *ring; /* the uploads' pinned staging; made by the
	                           first large upload from pageable memory */
};

struct q4kh_buffer {
	q4kh_device_ctx *dev;
	uint64_t size;
	char *ptr; /* device memory */
};

/* --- devices (cuda_device.c) and buffers (cuda_buffer.c) --- */

q4kh_status cuda_device_count(q4kh_backend_ctx *ctx, uint32_t *count);
q4kh_status cuda_device_info(q4kh_backend_ctx *ctx, uint32_t index,
                             struct q4kh_device_record *out);
q4kh_status cuda_device_open(q4kh_backend_ctx *ctx, uint32_t index,
                             q4kh_device_ctx **out);
void cuda_device_close(q4kh_device_ctx *dev);
q4kh_status cuda_synchronize(q4kh_device_ctx *dev);
q4kh_status cuda_native_device(q4kh_device_ctx *dev,
                               struct q4kh_native_device *out);
q4kh_status cuda_buffer_alloc(q4kh_device_ctx *dev, uint64_t size,
                              q4kh_buffer **out);
void cuda_buffer_free(q4kh_device_ctx *dev, q4kh_buffer *buf);
q4kh_status cuda_buffer_upload(q4kh_device_ctx *dev, q4kh_buffer *buf,
                               uint64_t offset, const void *src,
                               uint64_t size);
q4kh_status cuda_buffer_download(q4kh_device_ctx *dev, q4kh_buffer *buf,
                                 uint64_t offset, void *dst, uint64_t size);

/* Free dev's upload staging (NULL: nothing); its stream has no copy in
 * flight from it. */
void cuda_ring_free(struct cuda_ring *ring);

/*
 * Join dev's warm-up thread, which device_open starts to make dev->blas
 * and load the kernels while the weights go up: the first product on
 * tensor cores calls it before it looks at dev->blas, graph_begin before
 * a recording starts (so that none runs beside the warm-up), and
 * device_close before it frees the handle. A warm-up that failed
 * leaves dev->blas NULL, for that product to make the handle and report
 * the failure itself. Idempotent.
 */
void cuda_warm_join(q4kh_device_ctx *dev);

/*
 * Block every signal in the calling thread, keeping its mask in *OLD, so
 * that the threads it starts next leave SIGINT and SIGTERM to the host's
 * threads (its handler and the system calls it interrupts); then
 * cuda_signals_restore(OLD).
 */
void cuda_signals_block(sigset_t *old);
void cuda_signals_restore(const sigset_t *old);

/* Make dev's device current for this thread; WHAT names the caller. */
q4kh_status cuda_enter(q4kh_device_ctx *dev, const char *what);

/*
 * Wait for the stream and report the first fault its kernels found (as
 * Q4KH_ERR_INVALID, "WHAT: set_rows rows[3] = 9000, expected 0 .. 4095"),
 * then clear it. The wait's own error as cuda_check reports it.
 */
q4kh_status cuda_wait(q4kh_device_ctx *dev, const char *what);

/* At least SIZE bytes of dev->scratch, zeroed when allocated. Growing
 * keeps the old memory (recorded graphs point at it); while recording it
 * cannot grow, and fails with Q4KH_ERR_NOMEM. */
q4kh_status cuda_scratch(q4kh_device_ctx *dev, const char *what, size_t size);

/* Copy N int32 values from host memory to dev->stage on the stream,
 * growing the staging buffer first when it is too small. */
q4kh_status cuda_stage(q4kh_device_ctx *dev, const char *what,
                       const int32_t *values, int64_t n);

/* --- measurement and graphs, ABI 1.1 (cuda_measure.c) --- */

q4kh_status cuda_read_pass(q4kh_device_ctx *dev, q4kh_buffer *buf,
                           uint64_t offset, uint64_t size);
q4kh_status cuda_timer_start(q4kh_device_ctx *dev);
q4kh_status cuda_timer_stop(q4kh_device_ctx *dev, double *seconds);
q4kh_status cuda_graph_begin(q4kh_device_ctx *dev);
q4kh_status cuda_graph_end(q4kh_device_ctx *dev, q4kh_graph **out);
/* cuda_graph_end, with the recorded graph's node count (the kernels and
 * copies one launch of it runs) in *NODES unless NODES is NULL. */
q4kh_status cuda_graph_end_counted(q4kh_device_ctx *dev, q4kh_graph **out,
                                   size_t *nodes);
q4kh_status cuda_graph_launch(q4kh_device_ctx *dev, q4kh_graph *graph);
void cuda_graph_free(q4kh_device_ctx *dev, q4kh_graph *graph);
/* Q4KH_OK unless dev records a graph; then fail naming WHAT. */
q4kh_status cuda_not_recording(q4kh_device_ctx *dev, const char *what);

/* --- ABI 1.6: whole steps (cuda_graph.c) --- */

/*
 * graph_prepare: copy G's nodes, values and value names (G is the host's
 * during the call only), check that every node can run here, and plan
 * its calls with q4kh_step_next over cuda_backend (fused groups as the
 * host's interpreter finds them), but for a decode's blocks of experts,
 * each two launches of cuda_launch_moe_fused with its nodes' bits
 * (cuda_graph.c's match_moe). Q4KH_ERR_UNSUPPORTED, nothing kept and
 * the reason in last_error, for a node this backend cannot take (a weight
 * type it does not multiply, a delta_net beyond CUDA_DELTA_MAX_KEYS keys,
 * a moe_route or mul_mat_id beyond CUDA_MOE_MAX_EXPERTS experts, a routed
 * weight whose variant has no gemv or gemm);
 * Q4KH_ERR_INVALID for a graph that is not well formed (an index out of
 * range, a missing source, a cycle of views). A prepared step's built-in
 * products on tensor cores of a shape new to the device are run once
 * (on scratch, synchronously), so that its first run waits for no choice
 * or load of cuBLAS's kernels.
 */
q4kh_status cuda_graph_prepare(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                               q4kh_step **out);
/*
 * graph_compute: the first run issues the planned calls on dev's stream
 * (Q4KH_PATH_NODES); the second records them (cuda_graph_begin ..
 * cuda_graph_end_counted) and launches the recording, and every later run
 * is that one cudaGraphLaunch (Q4KH_PATH_REPLAY). A recording that fails
 * is logged once and leaves the step's runs eager; the reason stays in
 * the step (and in last_error until the next failure). RUN, when not
 * NULL, gets the path, the launches (the recording's node count, or the
 * calls issued) and the nodes inside fused groups. Asynchronous: ids,
 * positions, slots and block table entries (a step over a paged KV cache,
 * ABI 1.8: the host rewrites them before every run, replays included) out
 * of range are found on the device and reported by the next wait
 * (cuda_wait). Not while a graph_begin recording is open.
 * A one-token step whose layers the persistent kernel takes
 * (cuda_persist_plan; with [plugin.cuda] persistent = 1) issues
 * them as that one launch in place of their nodes, eagerly or recorded,
 * and reports Q4KH_PATH_PERSISTENT.
 */
q4kh_status cuda_graph_compute(q4kh_device_ctx *dev, q4kh_step *step,
                               struct q4kh_step_run *run);
/* graph_release: wait for dev's stream, then free the recording and the
 * copies (STEP NULL: nothing). */
void cuda_graph_release(q4kh_device_ctx *dev, q4kh_step *step);

/* --- the persistent decode kernel's plan (cuda_persist.c) --- */

/* A one-token step's layers as one persistent launch (cuda_persist.h):
 * nodes [first, end) of the graph, the rest issued as before. */
struct cuda_persist_plan {
	int32_t first, end;
	struct cuda_persist run;
	void *scratch; /* device: run's counters, partials and barrier */
};

/*
 * Read G's decoder layers for the persistent kernel on DEV: Q4KH_OK with
 * *OUT (free with cuda_persist_free); Q4KH_ERR_UNSUPPORTED with *OUT NULL
 * and the reason in WHY (WHY_SIZE bytes) when the step is not one token
 * of one sequence, its layers are not the llama family's as the kernel
 * reads them (a node, an operand, a weight routed to a kernel variant, a
 * weight type other than Q4_K and Q6_K, a head dimension other than 64
 * and 128, caches other than f16, a device before compute capability
 * 9.0), or the device cannot take the launch; Q4KH_ERR_NOMEM.
 */
q4kh_status cuda_persist_plan(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                              struct cuda_persist_plan **out, char *why, size_t why_size);
void cuda_persist_free(struct cuda_persist_plan *p);
/* With Q4KH_CUDA_PERSIST_PROFILE=1 in the environment when P was planned:
 * log (info) the time of each stage, summed over the layers, in P's last
 * run (waits for it). */
void cuda_persist_profile(q4kh_device_ctx *dev, const struct cuda_persist_plan *p);

/* --- errors and logging (cuda_plugin.c) --- */

/* The backend's table: the entries that graph_compute issues nodes and
 * fused groups through (q4khost/step.h). */
extern const struct q4kh_backend_v1 cuda_backend;

/* Log one line through the host, when it offers logging. */
void cuda_log(q4kh_backend_ctx *ctx, q4kh_log_level level, const char *fmt,
              ...)
	__attribute__((format(printf, 3, 4)));

/* Keep a formatted message as ctx's last error (ctx NULL: init()'s) and
 * return st (Q4KH_BACKEND_ERRORS, q4khost/backend_base.h). */
q4kh_status cuda_fail(q4kh_backend_ctx *ctx, q4kh_status st, const char *fmt,
                      ...)
	__attribute__((format(printf, 3, 4)));

/*
 * Q4KH_OK when e is cudaSuccess; else keep "WHAT: CUDA's text (its name)"
 * and return Q4KH_ERR_NOMEM for an allocation failure, Q4KH_ERR_DEVICE
 * otherwise. Clears CUDA's last error when it is not sticky, so the next
 * op's check does not see it again.
 */
q4kh_status cuda_check(q4kh_device_ctx *dev, cudaError_t e, const char *what);

/* cuda_check of a kernel launch's error E, named "OP: kernel launch". */
q4kh_status cuda_launched(q4kh_device_ctx *dev, const char *op, cudaError_t e);

/* --- the driver's version (cuda_driver.c) --- */

/* The display driver's version ("580.65.06") from NVML when present, else
 * the CUDA driver API version ("13.0"), else "". */
void cuda_driver_version(char *out, size_t size);

/* --- the op contract (cuda_tensor.c) --- */

/* Bit for a type in a mask of accepted types. */
#define CUDA_T(type) Q4KH_TYPE_BIT(type)

/* The types get_rows and mul_mat take, as a mask of CUDA_T bits. */
uint32_t cuda_weight_types(void);

/*
 * The contract checks' view of dev (q4khost/contract.h): its buffers, the
 * weight types it multiplies, and its context's last error as the place
 * for a failed check's message. With dev NULL every check fails, without
 * a message (no buffer is NULL's, and there is no context to keep one): an
 * op needs no test of its own.
 */
struct q4kh_check cuda_contract(q4kh_device_ctx *dev);

/* The kernels' view of a checked tensor. */
struct cuda_view cuda_view_of(const struct q4kh_tensor *t);

/* --- ops (cuda_ops.c) --- */

q4kh_status cuda_get_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
                          const int32_t *ids, int64_t n, float scale,
                          const struct q4kh_tensor *out);
q4kh_status cuda_mul_mat(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                         const struct q4kh_tensor *x,
                         const struct q4kh_tensor *y);
q4kh_status cuda_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w, float eps,
                          const struct q4kh_tensor *out);
/* ABI 1.4: add, then rms_norm of the sum, in one kernel (plugin.h). */
q4kh_status cuda_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *a,
                              const struct q4kh_tensor *w, float eps,
                              const struct q4kh_tensor *out);
q4kh_status cuda_norm_add_rms_norm(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                                   const struct q4kh_tensor *a,
                                   const struct q4kh_tensor *w_a, float eps_a,
                                   const struct q4kh_tensor *w, float eps,
                                   const struct q4kh_tensor *out);
q4kh_status cuda_rope(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
                      float base, float freq_scale,
                      const struct q4kh_tensor *out);
q4kh_status cuda_add(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b,
                     const struct q4kh_tensor *out);
q4kh_status cuda_mul(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
                     const struct q4kh_tensor *b,
                     const struct q4kh_tensor *out);
q4kh_status cuda_scale(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                       float s, const struct q4kh_tensor *out);
q4kh_status cuda_glu(q4kh_device_ctx *dev, q4kh_glu_kind kind,
                     const struct q4kh_tensor *gate,
                     const struct q4kh_tensor *up,
                     const struct q4kh_tensor *out);
q4kh_status cuda_copy(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                      const struct q4kh_tensor *dst);
q4kh_status cuda_attention(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k_cache,
                           const struct q4kh_tensor *v_cache,
                           const struct q4kh_attn_params *params,
                           const struct q4kh_tensor *out);

/* ABI 1.2's ops of linear-attention layers (plugin.h); delta_net takes
 * S_k up to CUDA_DELTA_MAX_KEYS (cuda_kernels.h), else
 * Q4KH_ERR_UNSUPPORTED. */
q4kh_status cuda_unary(q4kh_device_ctx *dev, q4kh_unary_kind kind,
                       const struct q4kh_tensor *x,
                       const struct q4kh_tensor *out);
q4kh_status cuda_ssm_conv(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *w,
                          const struct q4kh_tensor *state,
                          const struct q4kh_tensor *out);
q4kh_status cuda_delta_net(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                           const struct q4kh_tensor *k,
                           const struct q4kh_tensor *v,
                           const struct q4kh_tensor *g,
                           const struct q4kh_tensor *beta,
                           const struct q4kh_tensor *state, float scale,
                           const struct q4kh_tensor *out);

/* ABI 1.7's ops of mixture-of-experts layers (plugin.h), up to
 * CUDA_MOE_MAX_EXPERTS experts (else Q4KH_ERR_UNSUPPORTED). Routing stays
 * on the device: an id mul_mat_id reads out of range is reported by the
 * next wait (cuda_wait). mul_mat_id of many columns uses the device
 * context's scratch (cuda_scratch), so a recording finds it sized only
 * after the same shape ran once. */
q4kh_status cuda_moe_route(q4kh_device_ctx *dev, const struct q4kh_tensor *logits,
                           int32_t norm, const struct q4kh_tensor *ids,
                           const struct q4kh_tensor *weights);
q4kh_status cuda_mul_mat_id(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
                            const struct q4kh_tensor *x, const struct q4kh_tensor *ids,
                            const struct q4kh_tensor *y);

/* The attention launch shared by attention, attention_ext and
 * attention_paged: POS is the device's positions or NULL for
 * params->pos0 + t; PAGES the block table (pages of PAGE_SIZE tokens of
 * the pools k_cache and v_cache) or NULL for a contiguous cache. */
q4kh_status cuda_attend(q4kh_device_ctx *dev, const char *op,
                        const struct q4kh_tensor *q,
                        const struct q4kh_tensor *k_cache,
                        const struct q4kh_tensor *v_cache, const int32_t *pos,
                        const struct q4kh_tensor *pages, int32_t page_size,
                        const struct q4kh_attn_params *params,
                        const struct q4kh_tensor *out);

/* The kernels' RoPE parameters: YaRN's ramp and scale resolved as the cpu
 * reference resolves them (plugin.h). */
struct cuda_rope cuda_rope_of(const struct q4kh_rope_params *p);

/* --- ABI 1.2: per-step values in device tensors (cuda_step.c) --- */

q4kh_status cuda_get_rows_ext(q4kh_device_ctx *dev,
                              const struct q4kh_tensor *table,
                              const struct q4kh_tensor *ids, float scale,
                              const struct q4kh_tensor *out);
q4kh_status cuda_rope_ext(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                          const struct q4kh_tensor *pos,
                          const struct q4kh_rope_params *params,
                          const struct q4kh_tensor *out);
q4kh_status cuda_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
                          const struct q4kh_tensor *rows,
                          const struct q4kh_tensor *dst);
/* ABI 1.4: rope_ext in place, then set_rows of x at the same positions,
 * in one kernel; positions checked on the device as the two do. */
q4kh_status cuda_rope_set_rows(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                              const struct q4kh_tensor *pos,
                              const struct q4kh_rope_params *params,
                              const struct q4kh_tensor *cache);
/* ABI 1.4: rope_ext of q, rope_set_rows of k and set_rows of v, all in
 * place at one set of positions, in one kernel; positions checked on the
 * device as the three do. */
q4kh_status cuda_rope_store(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                            const struct q4kh_tensor *k, const struct q4kh_tensor *v,
                            const struct q4kh_tensor *pos,
                            const struct q4kh_rope_params *params,
                            const struct q4kh_tensor *k_cache,
                            const struct q4kh_tensor *v_cache);
/* ABI 1.4: the greedy pick of each column of x in one launch
 * (cuda_top2.cu), with the device context's scratch for a long column. */
q4kh_status cuda_top2(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
                      const struct q4kh_tensor *idx, const struct q4kh_tensor *val);
q4kh_status cuda_attention_ext(q4kh_device_ctx *dev,
                               const struct q4kh_tensor *q,
                               const struct q4kh_tensor *k_cache,
                               const struct q4kh_tensor *v_cache,
                               const struct q4kh_tensor *pos,
                               const struct q4kh_attn_params *params,
                               const struct q4kh_tensor *out);
/* ABI 1.8: attention_ext through a block table over pools of pages; the
 * positions and the table's pages checked on the device (faults
 * CUDA_FAULT_ATTENTION_POS, CUDA_FAULT_ATTENTION_PAGES). */
q4kh_status cuda_attention_paged(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
                                 const struct q4kh_tensor *k_pool,
                                 const struct q4kh_tensor *v_pool,
                                 const struct q4kh_tensor *pos,
                                 const struct q4kh_tensor *pages, int32_t page_size,
                                 const struct q4kh_attn_params *params,
                                 const struct q4kh_tensor *out);

#endif
