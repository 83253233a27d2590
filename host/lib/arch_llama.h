/*
 * The llama family of architectures: one loader and one step graph,
 * shared by every architecture that is Llama's decoder with small changes
 * (arch_llama.c, arch_qwen2.c, arch_qwen3.c). An architecture of the family
 * is a struct q4kh_arch whose load and build are the two functions below
 * and whose data is a struct q4kh_llama_family saying what differs.
 */
#ifndef Q4KH_ARCH_LLAMA_H
#define Q4KH_ARCH_LLAMA_H

#include "model.h"

struct q4kh_llama_family {
	q4kh_rope_mode rope_mode; /* as llama.cpp's llama_model_rope_type */
	int qkv_bias;             /* blk.N.attn_{q,k,v}.bias required (else optional) */
	int qk_norm;              /* blk.N.attn_{q,k}_norm: per-head RMSNorm before RoPE */
	int rope_freqs;           /* rope_freqs.weight (frequency factors) is read */
	int moe;                  /* a mixture of experts replaces every layer's
	                             feed-forward block (q4kh_block_moe) */
};

/*
 * Read the hyper-parameters (q4kh_model_attn_hparams, plus
 * RoPE: rope.freq_base (default 10000), rope.scaling none, linear or
 * yarn, and rope_freqs.weight where the family reads it; with moe,
 * expert_count, expert_used_count and expert_feed_forward_length) and bind every
 * weight of m->arch's family members. -1 with err naming the key or
 * tensor and what was found (another RoPE scaling, for one, is refused
 * rather than computed wrongly).
 */
int q4kh_llama_load(struct q4kh_model *m, struct q4kh_error *err);

/*
 * RoPE as llama.cpp 0.3.36 reads it: every layer's base
 * (ARCH.rope.freq_base, default 10000) and scaling (rope.scaling.type
 * none, linear or yarn, with its factor, original context, attention
 * factor and log multiplier), and, when ROPE_FREQS, the frequency factors
 * of rope_freqs.weight (refused otherwise). Other scalings are refused.
 * For q4kh_llama_load and architectures outside the family that read RoPE
 * alike. -1 with err.
 */
int q4kh_llama_rope(struct q4kh_model *m, int rope_freqs, struct q4kh_error *err);

/* struct q4kh_arch's build for the family (model.h). */
int q4kh_llama_build(struct q4kh_graph *g, const struct q4kh_seqs *seq,
                     struct q4kh_error *err);

#endif
