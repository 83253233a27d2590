/*
 * Qwen3 dense models ("qwen3" GGUF): the llama family without biases, with
 * per-head RMSNorm of q and k before NeoX RoPE, and a head dimension
 * (attention.key_length, 128) that need not be n_embd / n_head
 * (llama.cpp's llm_build_qwen3; Qwen3 technical report, 2025).
 */
#include "arch_llama.h"

static const struct q4kh_llama_family qwen3 = {
	.rope_mode = Q4KH_ROPE_NEOX,
	.qk_norm = 1,
};

const struct q4kh_arch q4kh_arch_qwen3 = {
	.name = "qwen3",
	.load = q4kh_llama_load,
	.build = q4kh_llama_build,
	.data = &qwen3,
};
