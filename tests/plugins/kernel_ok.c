/*
 * Test plugin: a well-formed kernel variant of a newer minor version (its
 * descriptor carries one field ABI 1.0 lacks). It can run nowhere (score
 * 0) and does nothing, but the host must accept it and record its minor.
 * Each load appends a line to the file $Q4KH_TEST_LOADS, when set, so a
 * test can count dlopen()s: a shadowed copy must not run this at all.
 * Built with -DKERNEL_V1_3 (kernel_v1_3): the same variant as built for
 * ABI 1.3, its table ending before gemv_multi, which a 1.4 host accepts.
 * Its arithmetic class is one a later minor might add, past INT8: a host
 * that does not know it judges the variant as undeclared.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

/* ABI 1.0's descriptor plus a field a later minor might append. */
struct desc_v1_1 {
	struct q4kh_plugin_desc v1_0;
	const char *appended;
};

__attribute__((constructor)) static void count_load(void)
{
	const char *path = getenv("Q4KH_TEST_LOADS");
	FILE *f = path ? fopen(path, "a") : NULL;

	if (f) {
		fputs("loaded\n", f);
		fclose(f);
	}
}

static q4kh_status k_init(const struct q4kh_host_api *host,
                          q4kh_kernel_ctx **out)
{
	(void)host;
	*out = NULL;
	return Q4KH_OK;
}

static void k_shutdown(q4kh_kernel_ctx *ctx)
{
	(void)ctx;
}

static const char *k_last_error(q4kh_kernel_ctx *ctx)
{
	(void)ctx;
	return "the test kernel variant runs nowhere";
}

static uint32_t k_score(q4kh_kernel_ctx *ctx,
                        const struct q4kh_device_record *dev, uint32_t type)
{
	(void)ctx;
	(void)dev;
	(void)type;
	return 0;
}

static q4kh_status k_prepare(q4kh_kernel_ctx *ctx,
                             const struct q4kh_native_device *dev,
                             const struct q4kh_tensor *w, q4kh_prepared **out)
{
	(void)ctx;
	(void)dev;
	(void)w;
	*out = NULL;
	return Q4KH_ERR_UNSUPPORTED;
}

static q4kh_status k_apply(q4kh_kernel_ctx *ctx,
                           const struct q4kh_native_device *dev,
                           q4kh_prepared *w, const struct q4kh_tensor *x,
                           const struct q4kh_tensor *y)
{
	(void)ctx;
	(void)dev;
	(void)w;
	(void)x;
	(void)y;
	return Q4KH_ERR_UNSUPPORTED;
}

static void k_release(q4kh_kernel_ctx *ctx, q4kh_prepared *w)
{
	(void)ctx;
	(void)w;
}

static const uint32_t types[] = { Q4KH_TYPE_Q4_K };

static const struct q4kh_kernel_v1 table = {
#if defined(KERNEL_V1_3)
	.struct_size = offsetof(struct q4kh_kernel_v1, gemv_multi),
#else
	.struct_size = sizeof(table),
#endif
	.n_types = 1,
	.backend = "cuda",
	.types = types,
	.max_gemv_columns = 8,
	.init = k_init,
	.shutdown = k_shutdown,
	.last_error = k_last_error,
	.score = k_score,
	.prepare = k_prepare,
	.gemv = k_apply,
	.gemm = k_apply,
	.release = k_release,
	.arith = Q4KH_ARITH_INT8 + 1,
};

static const struct desc_v1_1 desc = {
	.v1_0 = {
		.struct_size = sizeof(desc),
#if defined(KERNEL_V1_3)
		.abi_minor = 3,
#else
		.abi_minor = Q4KH_ABI_MINOR + 1,
#endif
		.kind = Q4KH_KIND_KERNEL,
#if defined(KERNEL_V1_3)
		.name = "kernel-v1-3",
#else
		.name = "kernel-ok",
#endif
		.version = "1.1",
		.vendor = "q4khost tests",
		.license = "MIT",
		.build_id = "test",
		.kernel = &table,
	},
	.appended = "ignored by an ABI 1.0 host",
};

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc.v1_0;
}
