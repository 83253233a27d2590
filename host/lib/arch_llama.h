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
};

/*
 * Read the hyper-parameters (q4kh_model_attn_hparams, plus
 * rope.freq_base, default 10000, and linear rope.scaling) and bind every
 * weight of m->arch's family members. -1 with err naming the key or
 * tensor and what was found (YaRN or Llama 3.1 RoPE scaling, for one, is
 * refused rather than computed wrongly).
 */
int q4kh_llama_load(struct q4kh_model *m, struct q4kh_error *err);

/*
 * Every layer's RoPE base (ARCH.rope.freq_base, default 10000) and linear
 * frequency scale (ARCH.rope.scaling.factor); other scalings and
 * rope_freqs.weight are refused. For q4kh_llama_load and architectures
 * outside the family that read RoPE alike. -1 with err.
 */
int q4kh_llama_rope(struct q4kh_model *m, struct q4kh_error *err);

/* struct q4kh_arch's build for the family (model.h). */
int q4kh_llama_build(struct q4kh_graph *g, const struct q4kh_session *s,
                     struct q4kh_error *err);

#endif
