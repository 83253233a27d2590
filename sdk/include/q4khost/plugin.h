/*
 * q4khost plugin ABI, major version 1.
 *
 * A plugin is a shared object that exports exactly one symbol,
 * Q4KH_ENTRY_SYMBOL (q4kh_plugin_entry_v1). The host dlopen()s the file with
 * RTLD_NOW | RTLD_LOCAL, resolves that symbol, calls it, and checks the
 * returned descriptor (struct_size, abi_minor, kind, tables) before it calls
 * anything else in the plugin. The entry function must do nothing but return
 * a pointer to static, constant data: no allocation, no device calls.
 *
 * Versioning rules (docs/plugin-abi.md has the full contract):
 *  1. The major version is part of the entry symbol's name. A plugin built for
 *     another major exports another symbol and is rejected with both versions
 *     named.
 *  2. Every struct that crosses the boundary starts with uint32_t struct_size.
 *     Fields are only ever appended, never removed or reordered; a minor
 *     version bump appends. The host reads no field at or beyond the
 *     plugin's struct_size, so old plugins keep working with newer hosts, and
 *     a newer plugin's extra fields are ignored by an older host.
 *  3. Optional function pointers may be NULL; required ones may not (the host
 *     refuses the plugin when a required one is NULL).
 *
 * Conventions for every function below:
 *  - Return Q4KH_OK or an error status; on error the plugin keeps a message
 *    that the host fetches with the table's last_error(). Plugins never write
 *    to stdout or stderr; they log through q4kh_host_api.log.
 *  - Thread-safety: the host calls one backend (or kernel-variant) context
 *    from one thread at a time. Different contexts may be used from different
 *    threads. A plugin may run its own worker threads inside a call.
 *  - Memory: what the host passes in stays owned by the host and is valid for
 *    the duration of the call only, unless said otherwise: a backend that
 *    queues work copies what the work reads (ids, positions, parameters,
 *    the tensors' fields) before it returns. What a plugin
 *    returns (contexts, buffers, prepared weights) is owned by the plugin and
 *    released through the matching free/shutdown/release function.
 */
#ifndef Q4KHOST_PLUGIN_H
#define Q4KHOST_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "q4khost/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

#define Q4KH_ABI_MAJOR 1
#define Q4KH_ABI_MINOR 9
#define Q4KH_ENTRY_SYMBOL "q4kh_plugin_entry_v1"

/* Status codes returned by every plugin function. */
typedef enum q4kh_status {
	Q4KH_OK = 0,
	Q4KH_ERR_INVALID = 1,     /* a bad argument: shape, type, stride, NULL */
	Q4KH_ERR_NOMEM = 2,       /* host or device memory exhausted */
	Q4KH_ERR_UNSUPPORTED = 3, /* a type, shape or op this plugin lacks */
	Q4KH_ERR_DEVICE = 4,      /* the device or its driver failed */
	Q4KH_ERR_INTERNAL = 5     /* anything else; last_error() says what */
} q4kh_status;

typedef enum q4kh_plugin_kind {
	Q4KH_KIND_BACKEND = 1, /* runs every op of a forward pass */
	Q4KH_KIND_KERNEL = 2   /* replaces one backend's matmul for some types */
} q4kh_plugin_kind;

typedef enum q4kh_log_level {
	Q4KH_LOG_DEBUG = 0,
	Q4KH_LOG_INFO = 1,
	Q4KH_LOG_WARN = 2,
	Q4KH_LOG_ERROR = 3
} q4kh_log_level;

/* Opaque handles; each plugin defines the structs for itself. */
typedef struct q4kh_backend_ctx q4kh_backend_ctx;
typedef struct q4kh_device_ctx q4kh_device_ctx;
typedef struct q4kh_buffer q4kh_buffer;
typedef struct q4kh_kernel_ctx q4kh_kernel_ctx;
typedef struct q4kh_prepared q4kh_prepared;
typedef struct q4kh_graph q4kh_graph;
typedef struct q4kh_step q4kh_step;
/* Defined below; declared here so the backend table and the step graph
 * can name them. */
struct q4kh_native_device;
struct q4kh_kernel_v1;

/*
 * What the host offers a plugin. Passed to init(); valid until shutdown()
 * returns. host_data identifies the plugin to the host; pass it back.
 */
struct q4kh_host_api {
	uint32_t struct_size;
	uint32_t abi_major; /* the host's Q4KH_ABI_MAJOR */
	uint32_t abi_minor; /* the host's Q4KH_ABI_MINOR */
	uint32_t reserved;
	void *host_data;
	/* Log one line (no trailing newline needed). Thread-safe. */
	void (*log)(void *host_data, q4kh_log_level level, const char *msg);
	/*
	 * The value of KEY in this plugin's [plugin.NAME] config section, or
	 * NULL when unset or set to nothing ("KEY =" counts as unset). The
	 * string is owned by the host and valid until shutdown(). Thread-safe.
	 */
	const char *(*config_get)(void *host_data, const char *key);
};

/* One compute device, as a backend describes it. Strings are NUL-terminated. */
struct q4kh_device_record {
	uint32_t struct_size;
	uint32_t index;            /* 0-based within the backend */
	char name[128];            /* "NVIDIA H200", "cpu (x86_64, 2 threads)" */
	char uuid[64];             /* stable identity, e.g. "GPU-…"; "cpu" for CPUs */
	char arch[32];             /* "sm_90", "x86_64" */
	char driver_version[64];   /* "580.65.06"; "" when not applicable */
	uint64_t memory_bytes;     /* total device memory */
	uint32_t multiprocessors;  /* SMs, or CPU threads used */
	uint32_t reserved;
};

/*
 * A view of backend memory, in ggml's order: ne[0] is the contiguous,
 * innermost dimension. nb[i] is the distance in bytes between consecutive
 * indices of dimension i. For quantized types ne[0] counts values, a
 * multiple of the type's block size (quant.h), nb[0] is the size of one
 * block in bytes and nb[1] the size of one row. The first byte of the
 * tensor is at offset bytes into buffer (for kernel variants:
 * (char *)native->address(buffer) + offset).
 * Unused dimensions have ne = 1. A weight matrix of N rows of K inputs is
 * ne = {K, N, 1, 1}; an activation batch of T vectors of K values is
 * ne = {K, T, 1, 1}. Output row r of a matmul is dot(weight row r, x).
 */
struct q4kh_tensor {
	q4kh_buffer *buffer;
	uint64_t offset; /* bytes from the start of buffer */
	uint32_t type;   /* enum q4kh_type */
	uint32_t reserved;
	int64_t ne[4];
	int64_t nb[4];
};

typedef enum q4kh_rope_mode {
	/* Pairs (x[2i], x[2i+1]) rotate: Llama, Qwen2/3. */
	Q4KH_ROPE_NORM = 0,
	/* Pairs (x[i], x[i + n_rot/2]) rotate: GPT-NeoX, Gemma. */
	Q4KH_ROPE_NEOX = 2
} q4kh_rope_mode;

typedef enum q4kh_glu_kind {
	Q4KH_GLU_GELU_TANH = 0, /* 0.5 g (1 + tanh(sqrt(2/pi)(g + 0.044715 g^3))) */
	Q4KH_GLU_SILU = 1       /* g / (1 + exp(-g)) */
} q4kh_glu_kind;

/* Element-wise functions of the unary entry (ABI 1.2). */
typedef enum q4kh_unary_kind {
	Q4KH_UNARY_SIGMOID = 0,  /* 1 / (1 + exp(-x)) */
	Q4KH_UNARY_SOFTPLUS = 1, /* log(1 + exp(x)) */
	Q4KH_UNARY_SILU = 2      /* x / (1 + exp(-x)) */
} q4kh_unary_kind;

/* Parameters of attention over the KV cache. */
struct q4kh_attn_params {
	uint32_t struct_size;
	int32_t window;  /* sliding window in keys, query included; 0 = none */
	int64_t pos0;    /* cache position of the first query */
	float scale;     /* multiplies q.k before softmax (1 if q is pre-scaled) */
	float softcap;   /* 0 = none; else s = softcap * tanh(s / softcap) */
};

/*
 * Parameters of rope_ext (ABI 1.2): the rotation of the 1.0 rope entry,
 * plus frequency factors (Llama 3.1) and YaRN scaling (Peng et al. 2023),
 * computed as ggml's rope_ext does (ggml-cpu ops.cpp, rope_yarn). For
 * pair i of n_rot / 2 at position p:
 *   extrap = p * base^(-2i/n_rot) / ff[i]   (ff[i] = 1 without factors)
 *   interp = freq_scale * extrap
 *   theta  = interp                          when ext_factor is 0, else
 *   theta  = interp (1 - r) + extrap r,  r = ext_factor * ramp(i)
 *   ramp(i) = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)
 *   lo, hi = max(0, floor(d(beta_fast))), min(n_rot - 1, ceil(d(beta_slow)))
 *   d(b)   = n_rot ln(n_ctx_orig / (2 pi b)) / (2 ln base)
 *   m      = attn_factor (* (1 + 0.1 ln(1 / freq_scale)) when ext_factor
 *            is not 0)
 * and the pair rotates by theta with cos and sin both scaled by m.
 * The 1.0 entry is the case ff = 1, ext_factor = 0, attn_factor = 1.
 */
struct q4kh_rope_params {
	uint32_t struct_size;
	int32_t n_rot;      /* rotated values per head: even, 2 .. head_dim */
	uint32_t mode;      /* q4kh_rope_mode */
	float base;
	float freq_scale;
	float ext_factor;   /* YaRN's mix of extrapolation; 0 = none */
	float attn_factor;  /* scales cos and sin (1 = none) */
	float beta_fast;    /* YaRN's correction range (32, 1 in llama.cpp) */
	float beta_slow;
	int32_t n_ctx_orig; /* the context the model was trained on; > 0 */
	/* F32 {n_rot / 2} in a buffer of this device, or NULL for none. */
	const struct q4kh_tensor *freq_factors;
};

/*
 * ABI 1.6: the arithmetic a plugin's products and ops use, which sets how
 * close F2 holds its logits to the exact reference's (docs/f2.md,
 * "Floors that follow the arithmetic"; docs/plugin-abi.md, "Arithmetic
 * class"). A backend declares the class of its own ops and built-in
 * products, a kernel variant the class of its products (gemm's too);
 * a path's class is the coarsest of its parts. In order from the finest:
 * each class's rounding contains the ones before it. Declare the coarsest
 * rounding your code does in any configuration: the host gives every
 * backend but the reference an F16 KV cache, so a backend whose
 * attention reads it is F16 at the finest. UNDECLARED, or a value the
 * host does not know, keeps F2's default floor (0.95); any declaration
 * holds the plugin to a tighter one, and no declaration saves a wrong
 * result.
 */
typedef enum q4kh_arith {
	Q4KH_ARITH_UNDECLARED = 0, /* a plugin before 1.6: F2's default floor */
	Q4KH_ARITH_EXACT = 1,      /* double accumulation: the reference */
	Q4KH_ARITH_F32 = 2,        /* f32 activations, caches and sums */
	Q4KH_ARITH_F16 = 3,        /* activations or the KV cache rounded to
	                              f16 or bf16 (tensor cores, F16 caches) */
	Q4KH_ARITH_INT16 = 4,      /* activations quantised to 16-bit integers
	                              per block */
	Q4KH_ARITH_INT8 = 5        /* activations quantised to 8-bit integers
	                              per block (dp4a, VNNI on int8) */
} q4kh_arith;

/*
 * ABI 1.6: the step graph as a backend receives it whole (graph_prepare
 * below; docs/plugin-abi.md section 4, "The step as the unit of work").
 * A step is nodes over values. Node k computes
 *   values[out] = op(values[src[0]], values[src[1]], ...)
 * with the parameters that q4kh_op's comment names, in the order the
 * nodes come: a later node may read what an earlier one wrote, and may
 * overwrite what no later node reads (the host's planner lays activations
 * out so; a backend reorders only where the data allow it). Every node is
 * exactly the backend entry of the same name, with the 1.2 semantics for
 * ids and positions (device tensors read when the op runs): a backend that
 * takes a graph computes what calling those entries in node order
 * computes, fusing as it likes.
 */
typedef enum q4kh_op {
	Q4KH_OP_GET_ROWS = 0,  /* src table, ids; f[0] scale: get_rows_ext */
	Q4KH_OP_MUL_MAT = 1,   /* src w (a weight value), x, bias (F32 {N}
	                          added to every column, or -1): the weight's
	                          kernel variant's gemv/gemm, else mul_mat */
	Q4KH_OP_RMS_NORM = 2,  /* src x, w (or -1); f[0] eps */
	Q4KH_OP_ROPE = 3,      /* src x, pos, freq factors (or -1); rope:
	                          rope_ext's parameters, freq_factors NULL */
	Q4KH_OP_ADD = 4,       /* src a, b (b broadcast as add's) */
	Q4KH_OP_SCALE = 5,     /* src x; f[0] */
	Q4KH_OP_GLU = 6,       /* src gate, up; i[0] q4kh_glu_kind */
	Q4KH_OP_SET_ROWS = 7,  /* src rows {a, b, T}, pos; out the cache */
	Q4KH_OP_ATTENTION = 8, /* src q, k_cache, v_cache, pos; i[0] window;
	                          f[0] scale, f[1] softcap: attention_ext */
	Q4KH_OP_MUL = 9,       /* src a, b (b broadcast as mul's) */
	Q4KH_OP_COPY = 10,     /* src x (any strides); out */
	Q4KH_OP_UNARY = 11,    /* src x; i[0] q4kh_unary_kind */
	Q4KH_OP_SSM_CONV = 12, /* src x, w, state (rewritten in place) */
	Q4KH_OP_DELTA_NET = 13, /* src q, k, v, g, beta, state (rewritten);
	                          f[0] scale */
	/* ABI 1.7: a mixture-of-experts layer (moe_route, mul_mat_id) */
	Q4KH_OP_MOE_ROUTE = 14, /* src logits, ids (I32 {k, T}, written);
	                           out the weights; i[0] norm */
	Q4KH_OP_MUL_MAT_ID = 15, /* src w (a weight value {K, N, E}), x, ids */
	/* ABI 1.8: attention over a paged KV cache (attention_paged) */
	Q4KH_OP_ATTENTION_PAGED = 16 /* src q, k_pool, v_pool, pos, pages (a
	                                PAGES value or a view of one); i[0]
	                                window, i[1] page_size; f[0] scale,
	                                f[1] softcap. Its keys and values are
	                                written by SET_ROWS nodes whose rows
	                                are a SLOTS value (or a view) */
} q4kh_op;

/* What a value of a step graph is. */
typedef enum q4kh_value_kind {
	Q4KH_VAL_FIXED = 0, /* outlives the step: a weight, a cache, a state */
	Q4KH_VAL_IDS = 1,   /* the step's token ids, I32 {T} */
	Q4KH_VAL_POS = 2,   /* the step's positions, I32 {T}; the cache rows */
	Q4KH_VAL_ACT = 3,   /* an activation in the step's scratch: f32, or
	                       I32 for moe_route's expert ids (ABI 1.7) */
	Q4KH_VAL_VIEW = 4,  /* bytes of another value (base), reshaped */
	/* ABI 1.8, steps over a paged KV cache; rewritten before every run,
	 * as IDS and POS are: */
	Q4KH_VAL_SLOTS = 5, /* the pool slot of each of the step's tokens,
	                       I32 {T}: the rows its SET_ROWS nodes write */
	Q4KH_VAL_PAGES = 6  /* each sequence's block table, I32 {B, n_seqs}:
	                       column j sequence j's (attention_paged) */
} q4kh_value_kind;

#define Q4KH_STEP_SRC 6 /* sources a node names at most */

/* One node (ABI 1.6). Sources and out index the graph's values. */
struct q4kh_step_node {
	uint32_t op; /* q4kh_op */
	int32_t src[Q4KH_STEP_SRC]; /* -1 where unused */
	int32_t out;
	int32_t i[2];
	float f[2];
	/* ROPE only: freq_factors is NULL here; the factors are src[2] */
	struct q4kh_rope_params rope;
};

/*
 * One value (ABI 1.6): its tensor, bound (buffer, offset, shape and
 * strides final), and for a weight that a mul_mat node reads, the route
 * of its product: the kernel variant the host chose for it on this device
 * (docs/architecture.md section 5), with what to pass that variant's
 * entries. kernel NULL: the backend's own mul_mat.
 */
struct q4kh_step_value {
	struct q4kh_tensor t;
	uint32_t kind;    /* q4kh_value_kind */
	int32_t base;     /* VIEW: the value it views; else -1 */
	const char *name; /* "blk.3.attn_q", "blk.3.q (heads)": for messages */
	const struct q4kh_kernel_v1 *kernel;
	q4kh_kernel_ctx *kernel_ctx;
	q4kh_prepared *prepared;                 /* kernel's prepare() of t */
	const struct q4kh_native_device *native; /* the dev argument for it */
};

/*
 * A whole step (ABI 1.6). The arrays are strided by the host's node_size
 * and value_size (q4kh_step_node_at, q4kh_step_value_at), so a backend
 * built against an older header reads the host's arrays right and a
 * newer one reads no field past those sizes. Valid during graph_prepare
 * only: a backend copies what it keeps. The tensors it names stay where
 * they are, and the buffers stay allocated, until graph_release.
 */
struct q4kh_step_graph {
	uint32_t struct_size;
	uint32_t node_size;  /* bytes from one node to the next */
	uint32_t value_size; /* bytes from one value to the next */
	int32_t n_nodes;
	int32_t n_values;
	int32_t ids, pos; /* the step's inputs: values of kind IDS and POS */
	int32_t logits;   /* F32 {n_vocab, n_out}, or -1 when n_out is 0 */
	int64_t n_tokens; /* T: columns of the step */
	int64_t n_out;    /* logits of n_out columns: the last n_out, or
	                     those F2's deep probe judges, or each
	                     sequence's last of a mixed step (the nodes say
	                     which); 0: none */
	uint32_t n_seqs;  /* sequences in the step: 1, or N of a batched
	                     step, their columns in order: one token each
	                     (batched decode), or some a run of consecutive
	                     tokens (a prompt's chunk beside the others'
	                     decoded tokens: a mixed step of serve's
	                     continuous batching, which F2's batched steps
	                     judge since rule set 4) */
	uint32_t reserved;
	const struct q4kh_step_node *nodes;
	const struct q4kh_step_value *values;
};

/* Node I and value I of graph G, whatever the sizes the host built. */
static inline const struct q4kh_step_node *
q4kh_step_node_at(const struct q4kh_step_graph *g, int32_t i)
{
	return (const struct q4kh_step_node *)(const void *)((const char *)g->nodes +
	                                                      (size_t)i * g->node_size);
}

static inline const struct q4kh_step_value *
q4kh_step_value_at(const struct q4kh_step_graph *g, int32_t i)
{
	return (const struct q4kh_step_value *)(const void *)((const char *)g->values +
	                                                       (size_t)i * g->value_size);
}

/* How a backend ran one step (ABI 1.6, graph_compute's report). */
typedef enum q4kh_step_path {
	Q4KH_PATH_NODES = 1,     /* issued node by node or fused group by
	                            group, by the backend itself */
	Q4KH_PATH_REPLAY = 2,    /* a recording of the step replayed (a CUDA
	                            graph) */
	Q4KH_PATH_PERSISTENT = 3 /* a persistent kernel ran the step */
} q4kh_step_path;

struct q4kh_step_run {
	uint32_t struct_size; /* set by the host */
	uint32_t path;        /* q4kh_step_path */
	uint32_t launches;    /* kernels launched or pool jobs run; 0 unknown */
	uint32_t fused;       /* nodes computed inside a fused group */
};

/*
 * Backend function table, ABI 1.8 (1.0 ends at native_device, 1.1 at
 * graph_free, 1.2 and 1.3 at delta_net, 1.4 at rope_store, 1.5 at
 * norm_add_rms_norm, 1.6 at reserved_1_6, 1.7 at mul_mat_id). All tensors
 * passed to ops live in buffers of the same device context. Ops may run
 * asynchronously, in the order they are issued; synchronize() waits for
 * all of them. Types: f32 unless said otherwise. An op's output may be one of its inputs only
 * where the entry says so, and then exactly the same view; otherwise it
 * shares no byte with them. q4khost/contract.h checks every op's arguments so
 * (docs/plugin-abi.md section 12, rules A1 to A4).
 */
struct q4kh_backend_v1 {
	uint32_t struct_size;
	uint32_t reserved;

	/* Create the backend context. host stays valid until shutdown().
	 * A setting read through config_get whose value is malformed or out
	 * of range: Q4KH_ERR_INVALID (the host refuses its configuration); a
	 * valid value this machine cannot honour: Q4KH_ERR_UNSUPPORTED (the
	 * host falls back past the plugin). docs/plugin-abi.md section 8. */
	q4kh_status (*init)(const struct q4kh_host_api *host,
	                    q4kh_backend_ctx **out);
	/* Free everything; devices and buffers must be closed/freed first. */
	void (*shutdown)(q4kh_backend_ctx *ctx);
	/*
	 * Text of the last error on ctx or its devices; never NULL. With ctx
	 * NULL: why the last failed init() on this thread failed.
	 */
	const char *(*last_error)(q4kh_backend_ctx *ctx);

	/* Number of usable devices; 0 is not an error. */
	q4kh_status (*device_count)(q4kh_backend_ctx *ctx, uint32_t *count);
	/* Fill *out (the host sets out->struct_size first). */
	q4kh_status (*device_info)(q4kh_backend_ctx *ctx, uint32_t index,
	                           struct q4kh_device_record *out);
	q4kh_status (*device_open)(q4kh_backend_ctx *ctx, uint32_t index,
	                           q4kh_device_ctx **out);
	void (*device_close)(q4kh_device_ctx *dev);

	/* Does the backend implement matmul for this weight type? 1 or 0. */
	int (*supports_type)(q4kh_backend_ctx *ctx, uint32_t type);

	/* Device memory of SIZE bytes, uninitialised. */
	q4kh_status (*buffer_alloc)(q4kh_device_ctx *dev, uint64_t size,
	                            q4kh_buffer **out);
	void (*buffer_free)(q4kh_device_ctx *dev, q4kh_buffer *buf);
	/* Copy SIZE bytes from host SRC to buf+offset; synchronous. */
	q4kh_status (*buffer_upload)(q4kh_device_ctx *dev, q4kh_buffer *buf,
	                             uint64_t offset, const void *src,
	                             uint64_t size);
	/* Copy SIZE bytes from buf+offset to host DST; waits for prior ops. */
	q4kh_status (*buffer_download)(q4kh_device_ctx *dev, q4kh_buffer *buf,
	                               uint64_t offset, void *dst, uint64_t size);

	/*
	 * out[:, i] = table[:, ids[i]] * scale for i < n (dequantized to f32).
	 * table {K, V} of any supported type; out {K, n}; ids in host memory.
	 * Fails with Q4KH_ERR_INVALID when an id is outside [0, V).
	 */
	q4kh_status (*get_rows)(q4kh_device_ctx *dev, const struct q4kh_tensor *table,
	                        const int32_t *ids, int64_t n, float scale,
	                        const struct q4kh_tensor *out);
	/*
	 * y[n, t] = sum_k w[k, n] * x[k, t]: w {K, N} of any supported type,
	 * x {K, T}, y {N, T}.
	 */
	q4kh_status (*mul_mat)(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
	                       const struct q4kh_tensor *x,
	                       const struct q4kh_tensor *y);
	/*
	 * RMSNorm over ne[0] of every row (Zhang & Sennrich 2019):
	 * out = x / sqrt(mean(x^2) + eps) * w. w {ne0} or NULL for no weight.
	 * x and out may be the same tensor.
	 */
	q4kh_status (*rms_norm)(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
	                        const struct q4kh_tensor *w, float eps,
	                        const struct q4kh_tensor *out);
	/*
	 * Rotary position embedding (Su et al. 2021, RoFormer) over x
	 * {head_dim, n_heads, T}; pos[t] (host memory) is token t's position.
	 * The first n_rot values of each head rotate by
	 * theta_i = freq_scale * pos * base^(-2i/n_rot); the rest pass through.
	 * x and out may be the same tensor.
	 */
	q4kh_status (*rope)(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
	                    const int32_t *pos, int32_t n_rot, q4kh_rope_mode mode,
	                    float base, float freq_scale,
	                    const struct q4kh_tensor *out);
	/*
	 * out = a + b, out = a * b: b broadcasts over dimensions where its ne is
	 * 1 (a bias {ne0} over T rows). out may be a or b.
	 */
	q4kh_status (*add)(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
	                   const struct q4kh_tensor *b,
	                   const struct q4kh_tensor *out);
	q4kh_status (*mul)(q4kh_device_ctx *dev, const struct q4kh_tensor *a,
	                   const struct q4kh_tensor *b,
	                   const struct q4kh_tensor *out);
	/* out = x * s. out may be x. */
	q4kh_status (*scale)(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
	                     float s, const struct q4kh_tensor *out);
	/* Gated activation: out = act(gate) * up, element-wise; out may be
	 * gate or up. */
	q4kh_status (*glu)(q4kh_device_ctx *dev, q4kh_glu_kind kind,
	                   const struct q4kh_tensor *gate,
	                   const struct q4kh_tensor *up,
	                   const struct q4kh_tensor *out);
	/*
	 * Copy src into dst element by element, converting between f32 and f16
	 * (and f32 to f32, f16 to f16). Shapes must match; strides may differ;
	 * dst may be src. Used to write new keys and values into the KV cache,
	 * and to copy a cache's first tokens into another session's cache of
	 * the same type (serve's prefix reuse: docs/plugin-abi.md, "KV caches
	 * between sessions").
	 */
	q4kh_status (*copy)(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
	                    const struct q4kh_tensor *dst);
	/*
	 * Causal multi-head attention of T queries over the KV cache
	 * (Vaswani et al. 2017; grouped-query heads, Ainslie et al. 2023).
	 * q {head_dim, n_head, T}; k_cache, v_cache {head_dim, n_kv, n_ctx},
	 * f32 or f16, holding keys/values for positions 0 .. pos0+T-1;
	 * out {head_dim, n_head, T}. Query head h reads KV head
	 * h / (n_head / n_kv). Query t (position p = pos0 + t) sees key j iff
	 * j <= p and (window == 0 or p - j < window).
	 */
	q4kh_status (*attention)(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
	                         const struct q4kh_tensor *k_cache,
	                         const struct q4kh_tensor *v_cache,
	                         const struct q4kh_attn_params *params,
	                         const struct q4kh_tensor *out);
	/* Wait until every op issued on dev has finished. */
	q4kh_status (*synchronize)(q4kh_device_ctx *dev);

	/*
	 * Optional (may be NULL). The native handles a kernel variant needs
	 * to run on this device; see struct q4kh_native_device.
	 */
	q4kh_status (*native_device)(q4kh_device_ctx *dev,
	                             struct q4kh_native_device *out);

	/*
	 * ABI 1.1: measurement and replay. Every entry below is optional (may
	 * be NULL), and a host calls one only when the table's struct_size
	 * covers it (Q4KH_BACKEND_HAS), so 1.0 backends keep loading.
	 */

	/*
	 * Enqueue one pass that reads bytes [offset, offset + size) of buf
	 * once, as fast as the device can, and writes nothing a caller may
	 * rely on: the read-bandwidth ceiling that kernels are measured
	 * against. offset and size: multiples of 16, inside buf.
	 */
	q4kh_status (*read_pass)(q4kh_device_ctx *dev, q4kh_buffer *buf,
	                         uint64_t offset, uint64_t size);
	/*
	 * Device-side timing: timer_start marks the queue of dev; timer_stop
	 * marks it again, waits for that mark and stores in *seconds the
	 * device time between the two marks (the work enqueued between them,
	 * the kernel variants' too). One pair at a time per device.
	 */
	q4kh_status (*timer_start)(q4kh_device_ctx *dev);
	q4kh_status (*timer_stop)(q4kh_device_ctx *dev, double *seconds);
	/*
	 * Record instead of run: between graph_begin and graph_end, the ops
	 * issued on dev (and the kernel variants' work on the native stream)
	 * are recorded, not run; graph_end returns the recording, which
	 * graph_launch enqueues as a whole, any number of times, with the
	 * same tensors and arguments. While recording, calls that wait for
	 * the device (synchronize, buffer_upload, buffer_download) and ops
	 * that take host-memory arguments fail with Q4KH_ERR_INVALID;
	 * graph_end ends the recording even when it fails. graph_free
	 * releases a recording (NULL is ignored).
	 */
	q4kh_status (*graph_begin)(q4kh_device_ctx *dev);
	q4kh_status (*graph_end)(q4kh_device_ctx *dev, q4kh_graph **out);
	q4kh_status (*graph_launch)(q4kh_device_ctx *dev, q4kh_graph *graph);
	void (*graph_free)(q4kh_device_ctx *dev, q4kh_graph *graph);

	/*
	 * ABI 1.2: the per-step values in device memory. Each entry below is
	 * optional and does what the 1.0 entry of the same name does, except
	 * that token ids and positions are an I32 tensor {n} in a buffer of
	 * this device context instead of host memory, read when the op runs,
	 * not when it is issued. A step whose ops all take their per-step
	 * values this way can be recorded once (graph_begin) and replayed for
	 * every later token with only those tensors rewritten in between
	 * (docs/plugin-abi.md, "The step graph"); the host replays only when
	 * every op of the step has its 1.2 entry. Ops check an id or position
	 * against the tensors' bounds as they run and fail (at the next call
	 * that reports errors, on asynchronous backends) instead of reading
	 * outside them.
	 */

	/* out[:, i] = table[:, ids[i]] * scale; ids I32 {n}, out {K, n}. */
	q4kh_status (*get_rows_ext)(q4kh_device_ctx *dev,
	                            const struct q4kh_tensor *table,
	                            const struct q4kh_tensor *ids, float scale,
	                            const struct q4kh_tensor *out);
	/*
	 * rope with token t of x {head_dim, n_heads, T} at position pos[t],
	 * pos I32 {T}. x and out may be the same tensor.
	 */
	q4kh_status (*rope_ext)(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
	                        const struct q4kh_tensor *pos,
	                        const struct q4kh_rope_params *params,
	                        const struct q4kh_tensor *out);
	/*
	 * The KV-cache write: dst[:, :, rows[t]] = src[:, :, t] for t < T,
	 * converting f32 to dst's type (f32 or f16). src {a, b, T} f32, rows
	 * I32 {T}, dst {a, b, n} with every rows[t] in [0, n); rows are
	 * distinct (which of two writes to one row wins is unspecified).
	 */
	q4kh_status (*set_rows)(q4kh_device_ctx *dev, const struct q4kh_tensor *src,
	                        const struct q4kh_tensor *rows,
	                        const struct q4kh_tensor *dst);
	/*
	 * attention with query t at position pos[t] (pos I32 {T}) instead of
	 * params->pos0 + t, which is ignored: query t sees key j iff
	 * j <= pos[t] and (window == 0 or pos[t] - j < window); the cache
	 * holds keys 0 .. pos[t] for every t.
	 */
	q4kh_status (*attention_ext)(q4kh_device_ctx *dev,
	                             const struct q4kh_tensor *q,
	                             const struct q4kh_tensor *k_cache,
	                             const struct q4kh_tensor *v_cache,
	                             const struct q4kh_tensor *pos,
	                             const struct q4kh_attn_params *params,
	                             const struct q4kh_tensor *out);

	/*
	 * ABI 1.2, optional: a buffer over SIZE bytes of host memory at HOST
	 * instead of device memory of its own, for a backend that computes
	 * from host memory (weights used in place, from the model file's
	 * read-only mapping). The memory stays the caller's: it stays mapped
	 * and unchanged until buffer_free, which frees only the buffer. It is
	 * read-only: the host never uploads into it nor names it as an op's
	 * output, and the backend refuses an upload. HOST is aligned to at
	 * least 32 bytes (GGUF's data alignment).
	 */
	q4kh_status (*buffer_wrap)(q4kh_device_ctx *dev, const void *host,
	                           uint64_t size, q4kh_buffer **out);

	/*
	 * ABI 1.2, continued: the ops of linear-attention layers (Qwen3.5's
	 * gated delta-net). Each is optional; the host checks, before the
	 * first step of a model that needs them, that the backend has every
	 * one its layers use, and refuses the model with the name of the
	 * missing entry otherwise. Tensors are f32 views whose rows are
	 * contiguous along ne[0]; row strides are free.
	 *
	 * A state tensor (the convolution's, the delta rule's) belongs to one
	 * sequence and one layer: the op reads it when it runs and writes it
	 * back in place, so a recorded step replays against the state as it
	 * is then. The host zeroes it before a sequence's first token.
	 */

	/*
	 * out = f(x) element-wise, f as q4kh_unary_kind says; a backend with
	 * this entry implements every kind of its minor. x and out {ne0, ne1,
	 * ne2} of one shape; out may be x.
	 */
	q4kh_status (*unary)(q4kh_device_ctx *dev, q4kh_unary_kind kind,
	                     const struct q4kh_tensor *x,
	                     const struct q4kh_tensor *out);
	/*
	 * The short causal convolution of a linear-attention layer, one
	 * filter of K taps per channel, over the step's T tokens and the K-1
	 * inputs before them that state keeps. With u_c the K-1 kept values
	 * of channel c (oldest first) followed by x[c, 0 .. T):
	 *   out[c, t] = sum_{j < K} w[j, c] u_c[t + j]
	 * and afterwards state[:, c] holds the last K-1 values of u_c, oldest
	 * first. x {C, T}; w {K, C} with K >= 2; state {K-1, C}; out {C, T},
	 * overlapping neither x nor state.
	 */
	q4kh_status (*ssm_conv)(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
	                        const struct q4kh_tensor *w,
	                        const struct q4kh_tensor *state,
	                        const struct q4kh_tensor *out);
	/*
	 * The gated delta rule (Yang, Kautz & Hatamizadeh 2024, "Gated Delta
	 * Networks"): for each of the H_v value heads h, with key head
	 * kh = h % H_k (tiled, the order of Qwen3.5's GGUF files), and each
	 * token t of the step in order:
	 *   S = exp(g[h, t]) S
	 *   d = beta[h, t] (v[:, h, t] - S k[:, kh, t])
	 *   S = S + d k[:, kh, t]^T
	 *   out[:, h, t] = scale S q[:, kh, t]
	 * S is head h's S_v x S_k state matrix, held as state[j, i, h] =
	 * S[i][j] (ne[0] runs over the S_k keys), read before the first token
	 * and written after the last. q, k {S_k, H_k, T}; v {S_v, H_v, T};
	 * g (the log decay) and beta {H_v, T}; state {S_k, S_v, H_v}; out
	 * {S_v, H_v, T}, overlapping no input. H_v is a multiple of H_k.
	 * This is the definition: a backend may compute a step's tokens in
	 * chunks (the parallel form) when its result is this one within
	 * float rounding; F2 compares it with the reference, which runs the
	 * recurrence token by token.
	 */
	q4kh_status (*delta_net)(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
	                         const struct q4kh_tensor *k,
	                         const struct q4kh_tensor *v,
	                         const struct q4kh_tensor *g,
	                         const struct q4kh_tensor *beta,
	                         const struct q4kh_tensor *state, float scale,
	                         const struct q4kh_tensor *out);

	/*
	 * ABI 1.4, optional: two ops fused into one call, for pairs that a
	 * step graph issues back to back (docs/plugin-abi.md, "Fused
	 * entries"). Each gives what the two entries it stands for give when
	 * called one after the other, the same arithmetic in the same order,
	 * in one pass over the data (one kernel on a GPU). The host calls one
	 * only where its interpreter finds the pair (host/lib/graph_run.c).
	 */

	/*
	 * add, then rms_norm of its result: x = x + a, then
	 * out = x / sqrt(mean(x^2) + eps) * w over ne[0] of every row. x and
	 * a f32 of one shape (no broadcast); x is written (the sum) as well as
	 * out. w F32 {ne0} or NULL. a shares no byte with x; out has x's
	 * shape and is exactly x, exactly a, or apart from both, and apart
	 * from w.
	 */
	q4kh_status (*add_rms_norm)(q4kh_device_ctx *dev,
	                            const struct q4kh_tensor *x,
	                            const struct q4kh_tensor *a,
	                            const struct q4kh_tensor *w, float eps,
	                            const struct q4kh_tensor *out);
	/*
	 * rope_ext of x in place, then set_rows of the result at the same
	 * positions: x {head_dim, n_heads, T} rotated at pos[t] (pos I32 {T},
	 * params as rope_ext's), then cache[:, :, pos[t]] = x[:, :, t],
	 * converted to cache's type (f32 or f16). cache {head_dim, n_heads, n}
	 * shares no byte with x or pos. Every pos[t] must lie in [0, n): a
	 * negative one fails as rope_ext's does (x and the cache left as
	 * they are for that token), one at or beyond n as set_rows' rows do
	 * (x rotated, the cache not written).
	 */
	q4kh_status (*rope_set_rows)(q4kh_device_ctx *dev,
	                             const struct q4kh_tensor *x,
	                             const struct q4kh_tensor *pos,
	                             const struct q4kh_rope_params *params,
	                             const struct q4kh_tensor *cache);

	/*
	 * ABI 1.4, optional: greedy selection on the device, so that a host
	 * choosing tokens by argmax reads 12 bytes per column instead of the
	 * logits. For each column t of x F32 {N, T} (rows contiguous, row
	 * stride free), over the finite values of x[:, t] (NaN and +-Inf are
	 * skipped; -0 and +0 compare equal):
	 *   idx[t]    the index of the largest, the lowest such index on
	 *             ties; -1 when the column holds no finite value;
	 *   val[0, t] that largest value (its bits as x holds them), or
	 *             -INFINITY when there is none;
	 *   val[1, t] the largest of the other indices' values (again the
	 *             lowest index's on ties: val[1, t] == val[0, t] when the
	 *             maximum is tied), or -INFINITY when there is none.
	 * idx I32 {T}; val F32 {2, T}, row stride free. Neither overlaps x
	 * nor the other, so a host can place them back to back in one
	 * 12 T-byte range (idx, then val) and read both with one
	 * buffer_download. N at most INT32_MAX. Runs on the device like any
	 * op, records into a graph, and fails as the other ops do
	 * (Q4KH_ERR_INVALID with contract.h's q4kh_check_top2 line).
	 * q4khost/top2.h's q4kh_top2_scan is this pick of one column, the
	 * host's own: a backend that holds x in host memory can call it.
	 */
	q4kh_status (*top2)(q4kh_device_ctx *dev, const struct q4kh_tensor *x,
	                    const struct q4kh_tensor *idx,
	                    const struct q4kh_tensor *val);

	/*
	 * ABI 1.4, optional: an attention layer's inputs in one call, three
	 * ops rather than two: rope_ext(q, pos, params, q), then
	 * rope_set_rows(k, pos, params, k_cache), then
	 * set_rows(v, pos, v_cache). q {hd, n_head, T}, k {hd_k, n_head_kv, T}
	 * and v {hd_v, n_heads_v, T} f32, pos I32 {T}; k_cache
	 * {hd_k, n_head_kv, n_k} and v_cache {hd_v, n_heads_v, n_v} f32 or
	 * f16, each type its own. q, k, v and the two caches share no byte
	 * with one another nor with pos. A position fails as the ops' do: a
	 * negative one as rope_ext's (nothing written for that token), one at
	 * or beyond a cache as set_rows' rows (q and k rotated, that cache's
	 * row not written).
	 */
	q4kh_status (*rope_store)(q4kh_device_ctx *dev, const struct q4kh_tensor *q,
	                          const struct q4kh_tensor *k,
	                          const struct q4kh_tensor *v,
	                          const struct q4kh_tensor *pos,
	                          const struct q4kh_rope_params *params,
	                          const struct q4kh_tensor *k_cache,
	                          const struct q4kh_tensor *v_cache);

	/*
	 * ABI 1.5, optional, fused as the 1.4 entries above are: a block's
	 * output norm, the residual add and the next norm in one call (each
	 * half of a Gemma layer ends so): rms_norm(a, w_a, eps_a, a), then
	 * add_rms_norm(x, a, w, eps, out). That is a = a / sqrt(mean(a^2) +
	 * eps_a) * w_a, x = x + a, out = x / sqrt(mean(x^2) + eps) * w over
	 * ne[0] of every row; a, x and out are all written. x and a f32 of one
	 * shape (no broadcast), a apart from x; w_a and w F32 {ne0} or NULL;
	 * out of x's shape, exactly x, exactly a or apart from both, and apart
	 * from w_a and w. Checks: q4kh_check_norm_add_rms_norm.
	 */
	q4kh_status (*norm_add_rms_norm)(q4kh_device_ctx *dev,
	                                 const struct q4kh_tensor *x,
	                                 const struct q4kh_tensor *a,
	                                 const struct q4kh_tensor *w_a, float eps_a,
	                                 const struct q4kh_tensor *w, float eps,
	                                 const struct q4kh_tensor *out);

	/*
	 * ABI 1.6, optional, all three or none: the backend takes the whole
	 * step (struct q4kh_step_graph) and runs it its own way: fusing
	 * neighbouring nodes, recording and replaying, a persistent kernel.
	 * The fused entries of ABI 1.4 and 1.5 (add_rms_norm, rope_set_rows,
	 * rope_store, norm_add_rms_norm) are deprecated: a backend with these
	 * entries fuses behind them instead, the host calls the fused entries
	 * only for backends without them, and no new fused entry is added.
	 *
	 * graph_prepare: analyse G once (a shape class: tokens, sequences,
	 * logits wanted) and return in *out what graph_compute runs. G is the
	 * host's during the call only; the tensors it names stay put until
	 * graph_release. Q4KH_ERR_UNSUPPORTED with nothing kept when the
	 * backend cannot take this graph (an op or a layout it does not
	 * take): the host then runs the nodes itself, through the entries
	 * above. Kernel variants keep their entries: for a mul_mat node whose
	 * weight names a kernel, the backend calls that kernel's gemv (at most
	 * max_gemv_columns columns), gemv_multi, gemv_glu or gemm with the
	 * value's kernel_ctx, native and prepared, and never its own mul_mat.
	 *
	 * graph_compute: enqueue one run of the step. Between two runs the
	 * host changes nothing but the contents of the IDS and POS values
	 * (and of SLOTS and PAGES, ABI 1.8; one buffer_upload before each
	 * run) and what the step itself writes
	 * (caches, states); a backend may therefore record the step once and
	 * replay it. Asynchronous like any op: errors of the run (an id or a
	 * position out of range) are reported by it or by the next call that
	 * waits. RUN (NULL for none; the host sets struct_size and zeroes the
	 * rest) says how this run went: the path, launches, fused nodes.
	 *
	 * graph_release: free what graph_prepare made (NULL is ignored); the
	 * host calls it before it frees or moves any buffer the graph names.
	 */
	q4kh_status (*graph_prepare)(q4kh_device_ctx *dev,
	                             const struct q4kh_step_graph *g,
	                             q4kh_step **out);
	q4kh_status (*graph_compute)(q4kh_device_ctx *dev, q4kh_step *step,
	                             struct q4kh_step_run *run);
	void (*graph_release)(q4kh_device_ctx *dev, q4kh_step *step);

	/* ABI 1.6: q4kh_arith of the backend's ops and built-in products, the
	 * KV cache it reads included (0: undeclared). */
	uint32_t arith;
	uint32_t reserved_1_6;

	/*
	 * ABI 1.7, optional, both or neither: the ops of a mixture-of-experts
	 * feed-forward block (Shazeer et al. 2017; llama.cpp's build_moe_ffn
	 * with softmax gating, as Qwen3-MoE runs it). The host checks before
	 * the first step of a model that needs them that the backend has
	 * both, and refuses the model with the name of the missing entry
	 * otherwise (docs/plugin-abi.md, "Mixture of experts").
	 */

	/*
	 * The router's choice for each column t of logits F32 {E, T} (the
	 * router's product, one logit per expert):
	 *   p = softmax(logits[:, t])
	 *   ids[:, t]  the k experts of the largest p, largest first, the
	 *              lower index first among equal values (ggml_top_k's
	 *              argsort, descending)
	 *   weights[j, t] = p[ids[j, t]], divided by
	 *              max(sum_j p[ids[j, t]], 2^-14) when norm is 1 (Qwen3-MoE,
	 *              llama.cpp's norm_w; the clamp is its division guard)
	 * ids I32 {k, T} and weights F32 {k, T}, 1 <= k <= E, rows contiguous,
	 * row strides free; they overlap neither logits nor each other. norm
	 * is 0 or 1. Checks: q4kh_check_moe_route.
	 */
	q4kh_status (*moe_route)(q4kh_device_ctx *dev, const struct q4kh_tensor *logits,
	                         int32_t norm, const struct q4kh_tensor *ids,
	                         const struct q4kh_tensor *weights);
	/*
	 * Products with one of E matrices per column, the matrix chosen per
	 * token and slot (ggml_mul_mat_id): w {K, N, E} of a type
	 * supports_type names (E matrices {K, N}, nb[2] bytes apart), x F32
	 * {K, X, T} with X = 1 (one input for every slot) or X = k, ids I32
	 * {k, T} (moe_route's), y F32 {N, k, T}:
	 *   y[n, j, t] = sum_i w[i, n, ids[j, t]] x[i, j % X, t]
	 * each column the product mul_mat gives for that matrix and column
	 * (its arithmetic). An id outside [0, E) fails the call as a
	 * set_rows row does (Q4KH_ERR_INVALID, at the call or the next one
	 * that reports errors). y overlaps neither x, ids nor w. Checks:
	 * q4kh_check_mul_mat_id.
	 */
	q4kh_status (*mul_mat_id)(q4kh_device_ctx *dev, const struct q4kh_tensor *w,
	                          const struct q4kh_tensor *x,
	                          const struct q4kh_tensor *ids,
	                          const struct q4kh_tensor *y);

	/*
	 * ABI 1.8, optional: attention_ext over a paged KV cache (Kwon et al.
	 * 2023, vLLM's PagedAttention; docs/plugin-abi.md, "Paged KV cache").
	 * Every sequence's keys and values live in a layer's pools of pages
	 * of page_size (>= 1) tokens: k_pool and v_pool {hd, n_kv, n_slots},
	 * f32 or f16, of one shape, n_slots a multiple of page_size (page i
	 * is slots i * page_size .. i * page_size + page_size - 1). pages
	 * I32 {B} is one sequence's block table: its key at position j is
	 * pool slot
	 *   pages[j / page_size] * page_size + j % page_size.
	 * Query t at position pos[t] (pos I32 {T}) sees key j iff j <= pos[t]
	 * and (window == 0 or pos[t] - j < window); params->pos0 is ignored.
	 * Every pos[t] lies in [0, B * page_size) and every pages[b] in
	 * [0, n_slots / page_size); a value outside fails the call as a
	 * set_rows row does. The result is attention_ext's over a contiguous
	 * cache holding the table's rows at positions 0, 1, ... (the same
	 * keys in the same order): the reference gives the same bits both
	 * ways. Slots of pages the table does not name, and slots past the
	 * keys a query sees, are never read. The pools are written by
	 * set_rows with rows = each token's slot (the slot mapping); two
	 * sequences may name the same page (a shared prefix) in their tables.
	 * pos and pages are device tensors read when the op runs, as the 1.2
	 * entries' positions are. q, out: as attention_ext's; out apart from
	 * pos and pages. Checks: q4kh_check_attention_paged.
	 */
	q4kh_status (*attention_paged)(q4kh_device_ctx *dev,
	                               const struct q4kh_tensor *q,
	                               const struct q4kh_tensor *k_pool,
	                               const struct q4kh_tensor *v_pool,
	                               const struct q4kh_tensor *pos,
	                               const struct q4kh_tensor *pages,
	                               int32_t page_size,
	                               const struct q4kh_attn_params *params,
	                               const struct q4kh_tensor *out);
};

/*
 * 1 when backend table B (its struct_size as the plugin set it) holds
 * FIELD and FIELD is not NULL: the test a host makes before calling an
 * entry added after ABI 1.0.
 */
#define Q4KH_BACKEND_HAS(b, field)                                             \
	((b)->struct_size >= offsetof(struct q4kh_backend_v1, field) +          \
	                             sizeof((b)->field) &&                      \
	 (b)->field != NULL)

/*
 * The same tests for the tables a host hands plugins and for a kernel
 * table: 1 when H (struct q4kh_host_api, as the host set its struct_size)
 * holds FIELD and FIELD is not NULL; likewise K (struct q4kh_kernel_v1).
 * Test every host entry before calling it: log and config_get may be NULL.
 */
#define Q4KH_HOST_HAS(h, field)                                                \
	((h)->struct_size >= offsetof(struct q4kh_host_api, field) +           \
	                             sizeof((h)->field) &&                      \
	 (h)->field != NULL)
#define Q4KH_KERNEL_HAS(k, field)                                              \
	((k)->struct_size >= offsetof(struct q4kh_kernel_v1, field) +          \
	                             sizeof((k)->field) &&                      \
	 (k)->field != NULL)

#ifdef __cplusplus
#define Q4KH_ENTRY_LINKAGE extern "C"
#else
#define Q4KH_ENTRY_LINKAGE
#endif

/*
 * Define a plugin's one exported function, Q4KH_ENTRY_SYMBOL, returning
 * the address of DESC, a static const struct q4kh_plugin_desc. Build with
 * -fvisibility=hidden: this is the only symbol left visible.
 */
#define Q4KH_PLUGIN_ENTRY(desc)                                                \
	Q4KH_ENTRY_LINKAGE __attribute__((visibility("default")))             \
	const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);             \
	Q4KH_ENTRY_LINKAGE __attribute__((visibility("default")))             \
	const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)              \
	{                                                                      \
		return &(desc);                                                \
	}

/*
 * ABI 1.3: one part of a job that a backend runs on its worker threads
 * (struct q4kh_native_device, parallel): items [begin, end) of the job,
 * on thread THREAD (0 .. threads - 1; the thread that called parallel()
 * is 0). A thread runs one part at a time, so THREAD may index scratch
 * of its own.
 */
typedef void (*q4kh_task_fn)(void *arg, unsigned thread, int64_t begin,
                             int64_t end);

/*
 * Native handles a backend lends to kernel variants of its kind. For
 * "cuda": ordinal is the CUDA device ordinal, stream a cudaStream_t on which
 * the variant must enqueue its work, and address() the device pointer of a
 * buffer. For "cpu": ordinal -1, stream NULL, address() a host pointer.
 * Valid while the device context stays open. The host sets struct_size to
 * its own sizeof and zeroes the struct; a backend fills the fields it
 * knows.
 */
struct q4kh_native_device {
	uint32_t struct_size;
	int32_t ordinal;
	void *stream;
	void *(*address)(const q4kh_buffer *buf);
	/*
	 * ABI 1.3, optional: the backend's worker threads, lent by a backend
	 * that computes on the host's cores so that a variant's product runs
	 * on them instead of on threads of its own (two pools on the same
	 * cores take turns through the scheduler). Present when struct_size
	 * covers parallel and it is not NULL (Q4KH_NATIVE_HAS).
	 * parallel(pool, n, grain, fn, arg) calls fn over items [0, n) in
	 * contiguous parts of at least grain items (the last may be shorter)
	 * on up to threads threads, the caller's included, and returns when
	 * every part is done; which thread runs which part is not fixed.
	 * Call it from gemv() or gemm() only, never from inside fn.
	 */
	uint32_t threads;
	uint32_t reserved;
	void *pool;
	void (*parallel)(void *pool, int64_t n, int64_t grain, q4kh_task_fn fn,
	                 void *arg);
	/*
	 * ABI 1.9: how the backend launches on stream, Q4KH_NATIVE_ bits (0
	 * from an older backend or host: read it with Q4KH_NATIVE_FLAGS).
	 */
	uint32_t flags;
	uint32_t reserved_1_9;
};

/*
 * flags: the backend launches its kernels on stream as programmatic
 * dependents (CUDA, compute capability 9.0 and later; q4khost/cuda_pdl.cuh),
 * so that a variant may launch its own the same way (q4kh_pdl_launch with
 * pdl true) when they keep that header's contract.
 */
#define Q4KH_NATIVE_CUDA_PDL 1u

/* N's flags (struct_size as the host set it), 0 when it has none. */
#define Q4KH_NATIVE_FLAGS(n)                                                   \
	((n)->struct_size >= offsetof(struct q4kh_native_device, flags) +       \
	                             sizeof((n)->flags)                         \
	         ? (n)->flags                                                   \
	         : 0u)

/* 1 when native handles N (struct_size as the host set it) hold FIELD and
 * the backend filled it (not NULL). */
#define Q4KH_NATIVE_HAS(n, field)                                              \
	((n)->struct_size >= offsetof(struct q4kh_native_device, field) +       \
	                             sizeof((n)->field) &&                      \
	 (n)->field != NULL)

/*
 * Kernel-variant function table, ABI 1.6 (1.0 ends at release, 1.4 at
 * gemv_glu). A kernel
 * variant implements the matmul of some weight types on one backend kind.
 * The host asks score() for each device, prepare()s every weight of those
 * types, and then calls gemv()/gemm() (or gemv_multi() for several that
 * share their activations, gemv_glu() for a gate and up product with
 * their gated activation) instead of the backend's built-in mul_mat for
 * them.
 */
struct q4kh_kernel_v1 {
	uint32_t struct_size;
	uint32_t n_types;         /* entries in types */
	const char *backend;      /* the backend kind it targets: "cuda", "cpu" */
	const uint32_t *types;    /* enum q4kh_type values it implements */
	uint32_t max_gemv_columns; /* gemv() takes 1..this many columns */
	uint32_t reserved;

	/* As the backend's, settings' values included. */
	q4kh_status (*init)(const struct q4kh_host_api *host,
	                    q4kh_kernel_ctx **out);
	void (*shutdown)(q4kh_kernel_ctx *ctx);
	/* As the backend's: never NULL; ctx NULL for a failed init(). */
	const char *(*last_error)(q4kh_kernel_ctx *ctx);
	/*
	 * How well the variant suits a device for a type: 0 = cannot run
	 * there, higher = preferred. Only the order matters, and any score
	 * above 0 is tried before the backend's built-in kernels
	 * (docs/plugin-abi.md rules K1 to K3). Pure; no device work.
	 */
	uint32_t (*score)(q4kh_kernel_ctx *ctx,
	                  const struct q4kh_device_record *dev, uint32_t type);
	/*
	 * Take weight w {K, N} (in backend memory on dev) and make it ready;
	 * the variant may repack it into memory of its own. w stays valid
	 * until release().
	 */
	q4kh_status (*prepare)(q4kh_kernel_ctx *ctx,
	                       const struct q4kh_native_device *dev,
	                       const struct q4kh_tensor *w, q4kh_prepared **out);
	/* y {N, T} = w x, x {K, T}, 1 <= T <= max_gemv_columns (decode). */
	q4kh_status (*gemv)(q4kh_kernel_ctx *ctx,
	                    const struct q4kh_native_device *dev,
	                    q4kh_prepared *w, const struct q4kh_tensor *x,
	                    const struct q4kh_tensor *y);
	/* The same for any T >= 1 (batched prefill). */
	q4kh_status (*gemm)(q4kh_kernel_ctx *ctx,
	                    const struct q4kh_native_device *dev,
	                    q4kh_prepared *w, const struct q4kh_tensor *x,
	                    const struct q4kh_tensor *y);
	void (*release)(q4kh_kernel_ctx *ctx, q4kh_prepared *w);

	/*
	 * ABI 1.4, optional (Q4KH_KERNEL_HAS): several products of one
	 * activation, with their biases, in one call (on a GPU: one launch),
	 * for 1 <= n <= Q4KH_GEMV_MULTI_MAX:
	 *   y[i] {N_i, T} = w[i] x (+ bias[i] broadcast over the T columns)
	 * w[i] prepared by this context, all of the same K; x {K, T} with
	 * 1 <= T <= max_gemv_columns; bias NULL for none, else an array of n
	 * entries, each NULL or an F32 {N_i} in backend memory. Every y[i]
	 * is a separate f32 output: it overlaps neither x, nor any weight or
	 * bias, nor another y[j]. The result is gemv(w[i], x, y[i]) followed
	 * by the backend's add of bias[i]: y[i][r, t] is rounded once from
	 * the product and once more from the bias, so a variant whose gemv
	 * and gemv_multi share the per-row arithmetic matches its own gemv
	 * and add bit for bit. The host's arrays are read during the call
	 * only. Q4KH_ERR_UNSUPPORTED, with nothing written or enqueued, for a
	 * combination the variant does not fuse (more matrices than it
	 * takes, types it cannot mix, a layout it wants otherwise): the host
	 * then calls gemv() for each matrix and the backend's add for each
	 * bias. Other errors are failures, as gemv()'s.
	 */
	q4kh_status (*gemv_multi)(q4kh_kernel_ctx *ctx,
	                          const struct q4kh_native_device *dev, uint32_t n,
	                          q4kh_prepared *const w[],
	                          const struct q4kh_tensor *x,
	                          const struct q4kh_tensor *const y[],
	                          const struct q4kh_tensor *const bias[]);
	/*
	 * ABI 1.4, optional (Q4KH_KERNEL_HAS): a feed-forward block's gate and
	 * up products and its gated activation in one call (on a GPU: one
	 * launch):
	 *   y {N, T} = act(w_gate x) * (w_up x), act as the backend's glu
	 * w_gate and w_up prepared by this context, both {K, N}; x {K, T}
	 * with 1 <= T <= max_gemv_columns; y an f32 {N, T} that overlaps
	 * neither x nor a weight. The result is gemv(w_gate, x, g), gemv(w_up,
	 * x, u), then the backend's glu(kind, g, u, y): each product rounded
	 * to f32 as gemv rounds it, then act and the multiplication exactly as
	 * that backend's glu computes them (for "cuda": in float, as its
	 * glu kernel); g and u are never stored. The host's tensors are read
	 * during the call only. Q4KH_ERR_UNSUPPORTED, with nothing written or
	 * enqueued, when the variant cannot give those bits (a kind, a pair of
	 * types, a layout or a backend it does not fuse): the host then runs
	 * the two products (gemv_multi or gemv) and the backend's glu. Other
	 * errors are failures, as gemv()'s.
	 */
	q4kh_status (*gemv_glu)(q4kh_kernel_ctx *ctx,
	                        const struct q4kh_native_device *dev,
	                        q4kh_glu_kind kind, q4kh_prepared *w_gate,
	                        q4kh_prepared *w_up, const struct q4kh_tensor *x,
	                        const struct q4kh_tensor *y);

	/* ABI 1.6: q4kh_arith of the variant's products, prompts' included
	 * (0: undeclared). */
	uint32_t arith;
	uint32_t reserved_1_6;
};

/* The most matrices one gemv_multi() call takes (ABI 1.4). */
#define Q4KH_GEMV_MULTI_MAX 4

/*
 * What the entry symbol returns: identity first, then the one table that
 * matches kind (the other is NULL). All strings are static and
 * NUL-terminated.
 */
struct q4kh_plugin_desc {
	uint32_t struct_size; /* sizeof(struct q4kh_plugin_desc) when built */
	uint32_t abi_minor;   /* Q4KH_ABI_MINOR when built */
	uint32_t kind;        /* q4kh_plugin_kind */
	uint32_t reserved;
	const char *name;     /* unique: "cpu", "cuda", "cuda-mwv" */
	const char *version;  /* the plugin's own version */
	const char *vendor;
	const char *license;  /* SPDX identifier */
	const char *build_id; /* version-control id and compiler */
	const struct q4kh_backend_v1 *backend;
	const struct q4kh_kernel_v1 *kernel;
	/*
	 * ABI 1.3, backends, optional: the kind of memory and native handles
	 * this backend lends, which a kernel variant names in its table's
	 * `backend`: a variant binds to every backend of its kind. NULL, or a
	 * descriptor too short to hold it: the plugin's name. "cpu" for a
	 * backend that computes on the host's cores from host memory and
	 * lends host pointers, as the reference does. Same rules as name.
	 */
	const char *backend_kind;
};

/*
 * The one exported function. Returns a pointer to static data; must not
 * allocate, touch devices or call back into the host.
 */
typedef const struct q4kh_plugin_desc *(*q4kh_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* Q4KHOST_PLUGIN_H */
