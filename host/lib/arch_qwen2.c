/*
 * Qwen2 and Qwen2.5 ("qwen2" GGUF): the llama family with biases on q, k
 * and v, and NeoX RoPE (llama.cpp's llm_build_qwen2; Qwen2 technical
 * report, 2024). Small models tie the LM head to token_embd.
 */
#include "arch_llama.h"

static const struct q4kh_llama_family qwen2 = {
	.rope_mode = Q4KH_ROPE_NEOX,
	.qkv_bias = 1,
};

const struct q4kh_arch q4kh_arch_qwen2 = {
	.name = "qwen2",
	.load = q4kh_llama_load,
	.build = q4kh_llama_build,
	.data = &qwen2,
};
