/*
 * Whole steps on the cuda backend through the cuda-mwv kernel variant,
 * recorded into the replayed CUDA graph (graph_products.h): on tiny-qwen2,
 * mul_mat nodes of one input go to gemv_multi as one launch (Q4_K and
 * Q6_K, with q, k, v's biases) and gate, up and their GLU to gemv_glu,
 * with the logits, bit for bit, of the variant without the entries and of
 * one that refuses them. tests/test_graph.c checks the same on the
 * reference cpu through cpu-simd. Every test skips where the system shows
 * no NVIDIA GPU (test_no_cuda_device) and fails where the CUDA plugins it
 * was built with are not on its path.
 */
#include <criterion/criterion.h>

#include "backend.h"
#include "graph_products.h"
#include "helpers.h"
#include "registry.h"

/*
 * EXPECT on cuda through cuda-mwv, recorded into the replayed CUDA graph
 * (not exact: replayed steps do not run the interpreter). Skips without
 * the CUDA plugins or a device.
 */
static void on_cuda_mwv(expect_fn expect)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_registry *reg = NULL;
	uint32_t n = 0;

	cr_assert_eq(q4kh_registry_scan(NULL, NULL, &reg, &err), 0, "%s", err.msg);
	/* built with the CUDA plugins: they must be on the test's path */
	cr_assert(q4kh_registry_find(reg, "cuda") && q4kh_registry_find(reg, "cuda-mwv"),
	          "the cuda and cuda-mwv plugins are not on the plugin path %s", reg->path);
	if (q4kh_backend_devices(q4kh_registry_find(reg, "cuda"), &n, &err) || n == 0) {
		q4kh_registry_free(reg);
		test_no_cuda_device("the recorded steps on cuda-mwv",
		                    err.msg[0] ? err.msg : "the cuda backend has 0 devices");
	}
	expect(reg, "cuda", "cuda-mwv", 0);
	q4kh_registry_free(reg);
}

/* gemv_multi: one launch for Q4_K and Q6_K with the biases. */
Test(gemv_multi, cuda_mwv_groups_with_the_same_logits, .timeout = 300)
{
	on_cuda_mwv(expect_grouping);
}

/* gemv_glu (tiny-qwen2's gate and up are both Q4_K). */
Test(gemv_glu, cuda_mwv_fuses_with_the_same_logits, .timeout = 300)
{
	on_cuda_mwv(expect_glu);
}
