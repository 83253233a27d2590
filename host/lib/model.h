/*
 * A GGUF model: its architecture's hyper-parameters, its weights bound by
 * name with shapes checked, and (after q4kh_model_upload) their place on a
 * backend device. The architecture (one file per architecture:
 * arch_NAME.c) describes the forward step as a graph (graph.h) that the
 * session runs.
 * A model is used from one thread at a time.
 */
#ifndef Q4KH_MODEL_H
#define Q4KH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "error.h"
#include "gguf.h"
#include "q4khost/plugin.h"

struct q4kh_graph;
struct q4kh_session;
struct q4kh_kernel;

/*
 * One weight: where it is in the file, its copy on the backend, and the
 * kernel variant (if any) that multiplies by it instead of the backend's
 * built-in mul_mat.
 */
struct q4kh_weight {
	const struct q4kh_gguf_tensor *src; /* NULL when the file lacks it */
	struct q4kh_tensor t;               /* valid after upload */
	const struct q4kh_kernel *kernel;   /* NULL: the backend's built-in */
	q4kh_prepared *prepared;            /* kernel's form of t */
	int not_matrix; /* 2-D but read element-wise (convolution taps): never
	                   multiplied by, so never routed to a kernel */
};

struct q4kh_layer {
	struct q4kh_weight attn_norm, wq, wk, wv, wo, q_norm, k_norm;
	struct q4kh_weight post_attn_norm, ffn_norm, w_gate, w_up, w_down;
	struct q4kh_weight post_ffw_norm;
	struct q4kh_weight bq, bk, bv; /* attention biases (Qwen2); F32 */
	/* A linear-attention layer's (Qwen3.5's gated delta-net): */
	struct q4kh_weight ssm_in;     /* attn_qkv: q, k, v of every head */
	struct q4kh_weight ssm_z;      /* attn_gate: the output gate z */
	struct q4kh_weight ssm_conv;   /* ssm_conv1d {K, channels}: F32 taps */
	struct q4kh_weight ssm_alpha;  /* the decay's input, per value head */
	struct q4kh_weight ssm_beta;   /* the update's strength, per value head */
	struct q4kh_weight ssm_dt;     /* ssm_dt.bias, added to alpha; F32 */
	struct q4kh_weight ssm_a;      /* -exp(A_log), scales the decay; F32 */
	struct q4kh_weight ssm_norm;   /* the gated RMSNorm's weight; F32 */
	struct q4kh_weight ssm_out;    /* value heads back to n_embd */
	/* A mixture-of-experts layer's (Qwen3-MoE's), instead of w_gate,
	 * w_up and w_down: */
	struct q4kh_weight ffn_gate_inp;  /* the router {n_embd, n_expert} */
	struct q4kh_weight ffn_gate_exps; /* {n_embd, n_ff_exp, n_expert} */
	struct q4kh_weight ffn_up_exps;   /* {n_embd, n_ff_exp, n_expert} */
	struct q4kh_weight ffn_down_exps; /* {n_ff_exp, n_embd, n_expert} */
	int recurrent;    /* linear attention: states instead of a KV cache */
	int swa;          /* sliding-window attention in this layer */
	float rope_base;  /* RoPE base for this layer */
	float rope_scale; /* RoPE frequency scale (1/factor) for this layer */
};

struct q4kh_hparams {
	uint32_t n_vocab, n_embd, n_layer, n_ff;
	uint32_t n_head, n_head_kv, head_dim, n_rot;
	uint32_t n_ctx_train, n_swa;
	float eps;           /* RMSNorm epsilon */
	float attn_scale;    /* the attention's scale of each q . k */
	float embd_scale;    /* multiplies embedding rows */
	float final_softcap; /* 0 = none */
	q4kh_rope_mode rope_mode;
	/* RoPE scaling beyond a layer's base and linear scale (plugin.h,
	 * struct q4kh_rope_params): 0, 1, 0, 0, 0 when the model has none. */
	float rope_ext_factor, rope_attn_factor, yarn_beta_fast, yarn_beta_slow;
	uint32_t n_ctx_orig; /* the trained context YaRN corrects for */
	/* Linear-attention layers; n_recurrent 0 when there are none. */
	uint32_t n_recurrent;  /* layers with recurrent set */
	uint32_t ssm_conv_k;   /* taps of the short convolution */
	uint32_t ssm_k_heads;  /* key (and query) heads */
	uint32_t ssm_v_heads;  /* value heads, a multiple of the key heads */
	uint32_t ssm_head_dim; /* values per key head and per value head */
	/* Mixture-of-experts layers; n_expert 0 when there are none. */
	uint32_t n_expert;      /* experts per layer */
	uint32_t n_expert_used; /* experts each token goes through */
	uint32_t n_ff_exp;      /* each expert's feed-forward width */
};

/* The most experts a layer may have: llama.cpp's LLAMA_MAX_EXPERTS. */
#define Q4KH_MAX_EXPERTS 1024

struct q4kh_arch;

struct q4kh_model {
	struct q4kh_gguf *gguf;
	const struct q4kh_arch *arch;
	struct q4kh_hparams hp;
	struct q4kh_weight tok_embd, output_norm, output; /* output may alias tok_embd */
	struct q4kh_weight rope_freqs; /* RoPE frequency factors {n_rot/2}, or none */
	struct q4kh_layer *layers;
	/* After upload: */
	struct q4kh_backend *backend;
	q4kh_buffer *weights; /* the file's data section in place, or a copy */
	/* Changes whenever a weight's route does (q4kh_model_use_kernel,
	 * q4kh_model_release_kernels): step graphs' exports name each
	 * weight's kernel variant, and sessions export theirs again. */
	uint64_t routes;
};

/* What an architecture provides (one per arch_NAME.c). */
/*
 * The sequences a step graph runs (struct q4kh_arch's build). One
 * sequence: the graph's T tokens are consecutive tokens of s[0]'s
 * sequence, at its positions. N > 1 (a batched decode step,
 * q4kh_session_eval_batch): T == N, token j is the next token of s[j]'s
 * sequence at its own position (or, with cols, a run of its next tokens),
 * and the per-sequence parts of the step
 * (cache writes, attention) are nodes of their own on s[j]'s tensors,
 * while everything per column (products, norms, GLU, adds, RoPE) runs
 * once over the N columns. Sessions of one model and backend, distinct.
 */
struct q4kh_seqs {
	const struct q4kh_model *m;
	int32_t n;
	const struct q4kh_session *const *s; /* n of them */
	/* N > 1 with a sequence of several tokens (a mixed step: prompt
	 * chunks beside decoded tokens): n + 1 offsets, s[j]'s tokens are
	 * columns cols[j] .. cols[j + 1] - 1, consecutive tokens of its
	 * sequence at its positions, and T == cols[n]; NULL: one each */
	const int32_t *cols;
};

struct q4kh_arch {
	const char *name; /* general.architecture */
	/* Read hyper-parameters and bind every weight; -1 with err. */
	int (*load)(struct q4kh_model *m, struct q4kh_error *err);
	/*
	 * Describe one step of the forward pass into G (graph.h): the tokens
	 * of G's ids input, at G's positions, through every layer (appending
	 * their keys and values to each sequence's KV cache at those
	 * positions), and when g->n_out > 0 the logits of the last n_out
	 * tokens into a new activation {n_vocab, n_out} named by g->logits.
	 * Builds only; runs nothing. -1 with err, among others for several
	 * sequences on an architecture with recurrent layers, whose states
	 * hold one sequence.
	 */
	int (*build)(struct q4kh_graph *g, const struct q4kh_seqs *seq,
	             struct q4kh_error *err);
	/* What load and build shared by several architectures need to tell
	 * them apart (arch_llama.h); NULL otherwise. */
	const void *data;
};

extern const struct q4kh_arch q4kh_arch_gemma3;
extern const struct q4kh_arch q4kh_arch_llama;
extern const struct q4kh_arch q4kh_arch_qwen2;
extern const struct q4kh_arch q4kh_arch_qwen3;
extern const struct q4kh_arch q4kh_arch_qwen35;
extern const struct q4kh_arch q4kh_arch_qwen3moe;

/*
 * The default model file: $Q4KHOST_MODEL, else
 * q4kh_cache_home()/q4khost/models/gemma-3-270m-q4_k_m.gguf
 * (where scripts/fetch-model.sh puts it). Writes into buf; returns buf.
 */
char *q4kh_default_model_path(char *buf, size_t cap);

/*
 * Open PATH, find its architecture and load it. -1 with err, among others
 * when a tensor's type is not one q4khost runs (weight_types.h).
 */
int q4kh_model_open(const char *path, struct q4kh_model **out,
                    struct q4kh_error *err);
/*
 * Put every bound weight on backend B (kept by m): used in place from the
 * file's read-only mapping when B has buffer_wrap (ABI 1.2), else copied
 * into one buffer of B's memory.
 */
int q4kh_model_upload(struct q4kh_model *m, struct q4kh_backend *b,
                      struct q4kh_error *err);
/*
 * q4kh_model_upload, every matrix weight of the N_TYPES TYPES routed
 * through kernel variant K as q4kh_model_use_kernel routes them (K NULL:
 * none): with a copy, each prepare()d right after its own upload, so that
 * the variant's work on it, and the warm-up a CUDA variant starts at its
 * first prepare (cuda_variant_scratch.h), overlap the rest of the upload;
 * in place, after the wrap. On error the caller releases the weights
 * prepared so far (q4kh_model_release_kernels, or q4kh_model_free).
 */
int q4kh_model_upload_for(struct q4kh_model *m, struct q4kh_backend *b,
                          const struct q4kh_kernel *k, const uint32_t *types,
                          size_t n_types, struct q4kh_error *err);
/*
 * Route every matrix weight of TYPE through kernel variant K: each is
 * prepare()d once. On error the weights prepared so far are released and
 * the model is left on its previous kernels. K must outlive the model's
 * use of it (release with q4kh_model_release_kernels first).
 */
int q4kh_model_use_kernel(struct q4kh_model *m, const struct q4kh_kernel *k,
                          uint32_t type, struct q4kh_error *err);
/* Release every prepared weight; all weights go back to the built-in. */
void q4kh_model_release_kernels(struct q4kh_model *m);
/*
 * The distinct types of M's matrix weights (what matmuls multiply by), in
 * file order, at most CAP of them; returns how many.
 */
size_t q4kh_model_matrix_types(const struct q4kh_model *m, uint32_t *types,
                               size_t cap);
/* The kernel variant multiplying weights of TYPE, or NULL (built-in). */
const struct q4kh_kernel *q4kh_model_kernel_for(const struct q4kh_model *m,
                                                uint32_t type);

/*
 * The distinct matrix weight types of the model at PATH (as
 * q4kh_model_matrix_types after q4kh_model_open), into TYPES (room for
 * CAP), their count in *n. -1 with err when the file does not open as a
 * model.
 */
int q4kh_model_types_at(const char *path, uint32_t *types, size_t cap, size_t *n,
                        struct q4kh_error *err);

/* Free the backend copy (if any), the weights and the file. */
void q4kh_model_free(struct q4kh_model *m);

/*
 * For architecture loaders: bind weight NAME (printf-style with the layer
 * number) and check its shape is {ne0, ne1} (ne1 = 1 for vectors).
 * required: a missing tensor is an error; else w->src stays NULL.
 */
int q4kh_model_bind(struct q4kh_model *m, struct q4kh_weight *w, int required,
                    int64_t ne0, int64_t ne1, struct q4kh_error *err,
                    const char *name_fmt, ...)
	__attribute__((format(printf, 7, 8)));

/*
 * q4kh_model_bind of a required stack of matrices {ne0, ne1, ne2} (the
 * experts of a mixture-of-experts layer: ne2 of them).
 */
int q4kh_model_bind3(struct q4kh_model *m, struct q4kh_weight *w, int64_t ne0, int64_t ne1,
                     int64_t ne2, struct q4kh_error *err, const char *name_fmt, ...)
	__attribute__((format(printf, 7, 8)));

/*
 * For architecture loaders: the hyper-parameters of a transformer with
 * grouped-query attention, from ARCH.embedding_length, block_count,
 * feed_forward_length, attention.head_count, attention.head_count_kv
 * (default: head_count), attention.key_length / value_length (default
 * n_embd / n_head; must be equal and even), rope.dimension_count (default:
 * the head dimension), attention.layer_norm_rms_epsilon and
 * context_length (optional), checked for consistency; no RoPE scaling
 * beyond the layers' own (the architecture's loader sets it). Allocates
 * m->layers. -1 with err naming the key and the value.
 */
int q4kh_model_attn_hparams(struct q4kh_model *m, struct q4kh_error *err);

/*
 * For architecture loaders, after the hyper-parameters: bind
 * token_embd.weight {n_embd, n_vocab} (setting hp.n_vocab),
 * output_norm.weight and output.weight, or token_embd as a tied LM head
 * when the file has no output.weight. -1 with err.
 */
int q4kh_model_bind_io(struct q4kh_model *m, struct q4kh_error *err);

/* Hyper-parameter KEY ("%s.embedding_length" with the arch name). */
int q4kh_model_u32(const struct q4kh_model *m, const char *key_fmt,
                   uint32_t *out, int required, struct q4kh_error *err);
int q4kh_model_f32(const struct q4kh_model *m, const char *key_fmt, float *out,
                   int required, struct q4kh_error *err);

#endif
