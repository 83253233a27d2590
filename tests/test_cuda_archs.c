/*
 * The forward passes of the tiny architecture fixtures on the cuda backend
 * with its built-in kernels, against llama.cpp (arch_oracle.h: every
 * prompt position of one batched prefill and 16 decode steps, cosine >=
 * 0.999, llama.cpp's greedy tokens): llama, qwen2, qwen3, their RoPE
 * scalings, and qwen35 (issue 14), whose gated delta-net layers run
 * cuda's unary, ssm_conv and delta_net, the prompt through the prompt
 * kernels and each decode step through the one-token kernels and the
 * replayed CUDA graph, the recurrent states carried between them.
 * tests/test_archs.c checks the same on the cpu backends. Every test
 * skips where the system shows no NVIDIA GPU (test_no_cuda_device) and
 * fails where the cuda plugin it was built with is not on its path.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "arch_oracle.h"
#include "backend.h"
#include "helpers.h"
#include "registry.h"

/* NAME's fixture on cuda's device 0, or a skip without one. */
static void on_cuda(const char *name, const char *arch)
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
	check_on(name, arch, NULL, "cuda", NULL);
}

/* Each fixture (tests/fixtures/tiny-NAME.gguf) and its architecture. */
struct fixture_arch {
	const char *name, *arch;
};

ParameterizedTestParameters(cuda_archs, matches_llama_cpp)
{
	static struct fixture_arch params[] = {
		{ "qwen35", "qwen35" }, { "llama", "llama" },
		{ "qwen2", "qwen2" },   { "qwen3", "qwen3" },
		{ "llama-ropefreqs", "llama" }, /* Llama 3.1's frequency factors */
		{ "qwen2-yarn", "qwen2" },      /* YaRN */
	};

	return cr_make_param_array(struct fixture_arch, params,
	                           sizeof(params) / sizeof(params[0]));
}

ParameterizedTest(struct fixture_arch *p, cuda_archs, matches_llama_cpp, .timeout = 300)
{
	on_cuda(p->name, p->arch);
}
