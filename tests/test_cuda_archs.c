/*
 * The forward passes of the tiny architecture fixtures on the cuda backend
 * with its built-in kernels, against llama.cpp (arch_oracle.h: every
 * prompt position of one batched prefill and 16 decode steps, cosine >=
 * 0.999, llama.cpp's greedy tokens): llama, qwen2, qwen3, their RoPE
 * scalings, and qwen35 (issue 14), whose gated delta-net layers run
 * cuda's unary, ssm_conv and delta_net, the prompt through the prompt
 * kernels and each decode step through the one-token kernels and the
 * replayed CUDA graph, the recurrent states carried between them;
 * qwen3moe (issue 31), whose experts run cuda's moe_route and mul_mat_id
 * (the prompt's columns grouped by expert on the device, a decode's read
 * straight from their experts); and
 * against the float64 fixtures of scripts/oracle-f64.py (those models and
 * the default model's), at the bound arch_oracle.h derives for cuda's
 * arithmetic (F16 cache, a prompt's products, FlashAttention and the LM
 * head in fp16). tests/test_archs.c checks the same on the cpu backends.
 * Every test
 * skips where the system shows no NVIDIA GPU (test_no_cuda_device) and
 * fails where the cuda plugin it was built with is not on its path.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "arch_oracle.h"
#include "backend.h"
#include "helpers.h"
#include "registry.h"

/* A skip without a CUDA device. */
static void need_cuda(void)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	uint32_t n = 0;

	cr_assert_eq(q4kh_registry_scan(NULL, NULL, &reg, &err), 0, "%s", err.msg);
	cr_assert(q4kh_registry_find(reg, "cuda"), "the cuda plugin is not on the plugin path %s",
	          reg->path);
	if (q4kh_backend_devices(q4kh_registry_find(reg, "cuda"), &n, &err) || n == 0) {
		q4kh_registry_free(reg);
		test_no_cuda_device("the architectures on cuda",
		                    err.msg[0] ? err.msg : "the cuda backend has 0 devices");
	}
	q4kh_registry_free(reg);
}

/* NAME's fixtures on cuda's device 0: llama.cpp's and the float64 one. */
static void on_cuda(const char *name, const char *arch)
{
	char file[64], *model;

	need_cuda();
	snprintf(file, sizeof(file), "tiny-%s.gguf", name);
	model = fixture(file);
	check_on(name, arch, NULL, "cuda", NULL);
	check_exact_on(model, name, NULL, "cuda", NULL, ARITH_FP16);
	free(model);
}

/* Each fixture (tests/fixtures/tiny-NAME.gguf) and its architecture. Plain
 * tests, not a parameterized one: criterion's workers may be new processes
 * of this program, where the parameters' pointers to string literals would
 * point elsewhere (every case crashed so on the H200). */
Test(cuda_archs, qwen35_matches_llama_cpp, .timeout = 300) { on_cuda("qwen35", "qwen35"); }
Test(cuda_archs, llama_matches_llama_cpp, .timeout = 300) { on_cuda("llama", "llama"); }
Test(cuda_archs, qwen2_matches_llama_cpp, .timeout = 300) { on_cuda("qwen2", "qwen2"); }
Test(cuda_archs, qwen3_matches_llama_cpp, .timeout = 300) { on_cuda("qwen3", "qwen3"); }
Test(cuda_archs, qwen3moe_matches_llama_cpp, .timeout = 300) { on_cuda("qwen3moe", "qwen3moe"); }
/* Llama 3.1's frequency factors */
Test(cuda_archs, llama_ropefreqs_matches_llama_cpp, .timeout = 300)
{
	on_cuda("llama-ropefreqs", "llama");
}
/* YaRN */
Test(cuda_archs, qwen2_yarn_matches_llama_cpp, .timeout = 300) { on_cuda("qwen2-yarn", "qwen2"); }
/* The default model against its float64 fixtures. */
Test(cuda_archs, gemma3_matches_float64, .timeout = 600)
{
	need_cuda();
	check_exact_on(test_model_path(), "gemma3", NULL, "cuda", NULL, ARITH_FP16);
	check_exact_on(test_model_path(), "gemma3-new", NULL, "cuda", NULL, ARITH_FP16);
}
