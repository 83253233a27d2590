/*
 * The persistent decode kernel (cuda_persist.cu) and its plan
 * (cuda_persist.c): one launch runs every decoder layer of a one-token
 * step, its blocks meeting at grid barriers between the stages of a
 * layer instead of the stream ordering launches.
 *
 * A layer is six stages, each spread over every block:
 *   1. rms_norm of x into each block's shared memory, then q, k, v (with
 *      their biases) as one product over their rows;
 *   2. RoPE on q and k, k and v into the caches (rope_store);
 *   3. attention: flash-decoding's items (cuda_split.cuh), two teams a
 *      block;
 *   4. the output projection, added to x (the residual);
 *   5. rms_norm of x again, then gate and up row by row with the GLU;
 *   6. the down projection, added to x.
 * Activations written in the launch are read past L1 (ld.global.cg):
 * an SM's L1 is not kept coherent with other SMs' writes, and q, k, v,
 * x are the same addresses in every layer. Weights stream through the
 * read-only path.
 *
 * The plan matches the host's step graph (plugin.h, struct
 * q4kh_step_graph) node by node against the llama family's layer
 * (host/lib/arch_blocks.c): any node that differs, a weight routed to a
 * kernel variant, a weight type other than Q4_K and Q6_K, or a shape the
 * kernel does not take, and the step runs as before (cuda_graph.c).
 */
#ifndef Q4KH_CUDA_PERSIST_H
#define Q4KH_CUDA_PERSIST_H

#include <stdint.h>

#include "cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads of a block: two teams of flash-decoding (cuda_split.cuh). */
#define CUDA_PERSIST_THREADS 256

/* One product: y {n} = w {k, n} x (+ bias), or y += w x (the residual). */
struct cuda_pmat {
	const uint8_t *w; /* rows stride bytes apart */
	int64_t stride;
	int64_t n, k;
	uint32_t type;     /* Q4KH_TYPE_Q4_K or Q4KH_TYPE_Q6_K */
	const float *bias; /* n values, or NULL */
	float *y;
};

/* One decoder layer, in device memory. */
struct cuda_player {
	const float *attn_norm, *ffn_norm; /* n_embd values each */
	float attn_eps, ffn_eps;
	struct cuda_pmat q, k, v;   /* y: the graph's q, k, v */
	struct cuda_pmat o, down;   /* y: x, which they add to */
	struct cuda_pmat gate, up;  /* gate's y: the GLU's output */
	int32_t silu;               /* the GLU: SiLU, else GELU (tanh) */
	struct cuda_rope rope;
	struct cuda_attn attn;
	struct cuda_view qh, kh, vh; /* q, k, v as {hd, heads, 1} */
	struct cuda_view kc, vc;     /* the caches {hd, heads_kv, n_ctx} */
	struct cuda_view att;        /* attention's output {hd, heads, 1} */
};

/* A planned launch. */
struct cuda_persist {
	int32_t n_layer;
	int32_t head_dim;   /* 64 or 128 */
	int32_t group;      /* query heads per KV head */
	int32_t ranges;     /* flash-decoding's S */
	int32_t blocks;     /* the grid: every block resident at once */
	int32_t rope_once;  /* every layer's RoPE the same (at most
	                       CUDA_PERSIST_MAX_PAIRS pairs): its angles are
	                       computed once a launch */
	size_t smem;        /* dynamic shared memory of a block, bytes */
	float *x;           /* the residual stream {n_embd} */
	int64_t n_embd;
	const struct cuda_player *layers; /* device memory, n_layer */
	/* device scratch: flash-decoding's counters, partials and (m, l),
	 * and the grid barrier's counter (zeroed before each launch) */
	int *count;
	float *part;
	float2 *ml;
	unsigned *barrier;
	int32_t *fault;
	/* with Q4KH_CUDA_PERSIST_PROFILE=1: the launch's start, then for each
	 * stage the last block's arrival at its barrier and block 0's
	 * departure (2 n_layer CUDA_PERSIST_STAGES + 1 times, ns of
	 * %globaltimer, zeroed before the launch); else NULL */
	unsigned long long *stamps;
};

#define CUDA_PERSIST_STAGES 6
#define CUDA_PERSIST_MAX_PAIRS 128

/*
 * The launch's shape for P (head_dim and smem set): P->blocks from
 * the occupancy of the kernel on device DEV with SMS multiprocessors.
 * cudaErrorNotSupported when not one block fits.
 */
cudaError_t cuda_persist_shape(struct cuda_persist *p, int dev, int sms);

/*
 * Flash-decoding's ranges for one query q {hd, heads, 1} over caches k, v
 * (cuda_split.cuh's plan_split) on SMS multiprocessors, with the query
 * heads per KV head in *GROUP; 0 when the split form does not take them.
 */
int cuda_persist_ranges(const struct cuda_view *q, const struct cuda_view *k,
                        const struct cuda_view *v, int sms, int32_t *group);

/* Enqueue one run of P on stream S: the barrier's reset and the kernel.
 * Returns the launch's error. */
cudaError_t cuda_persist_launch(const struct cuda_persist *p, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
