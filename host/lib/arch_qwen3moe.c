/*
 * Qwen3 mixture-of-experts models ("qwen3moe" GGUF: Qwen3-30B-A3B,
 * Qwen3-235B-A22B): Qwen3's attention (per-head RMSNorm of q and k,
 * NeoX RoPE) with every feed-forward block a mixture of experts: a
 * softmax router picks expert_used_count of expert_count SwiGLU experts
 * per token, their outputs weighted by the router's probabilities
 * renormalised over the chosen ones (llama.cpp's llm_build_qwen3moe, whose
 * build_moe_ffn has norm_w true for this architecture; Qwen3 technical
 * report, 2025).
 */
#include "arch_llama.h"

static const struct q4kh_llama_family qwen3moe = {
	.rope_mode = Q4KH_ROPE_NEOX,
	.qk_norm = 1,
	.moe = 1,
};

const struct q4kh_arch q4kh_arch_qwen3moe = {
	.name = "qwen3moe",
	.load = q4kh_llama_load,
	.build = q4kh_llama_build,
	.data = &qwen3moe,
};
