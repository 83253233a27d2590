/*
 * The cpu plugin's identity, context, device and buffers. The ops live in
 * cpu_ops.c, cpu_matmul.c, cpu_attention.c and cpu_recurrent.c.
 */
#include "buildconf.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "q4khost/backend_base.h"
#include "q4khost/moe.h"

Q4KH_BACKEND_ERRORS(cpu_fail, cpu_last_error)

static q4kh_status cpu_init(const struct q4kh_host_api *host,
                            q4kh_backend_ctx **out)
{
	unsigned n = q4kh_threads_online();
	q4kh_backend_ctx *ctx;
	q4kh_status st;

	if ((st = q4kh_backend_init_check("cpu", host, out)) ||
	    (st = q4kh_backend_setting_uint(host, "cpu", "threads", 1, Q4KH_MAX_THREADS, &n)))
		return st;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return cpu_fail(NULL, Q4KH_ERR_NOMEM, "cpu: init: out of memory");
	ctx->host = host;
	ctx->threads = n;
	*out = ctx;
	return Q4KH_OK;
}

static void cpu_shutdown(q4kh_backend_ctx *ctx)
{
	free(ctx);
}

static q4kh_status cpu_device_count(q4kh_backend_ctx *ctx, uint32_t *count)
{
	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!count)
		return cpu_fail(ctx, Q4KH_ERR_INVALID, "device_count: count is NULL");
	*count = 1;
	return Q4KH_OK;
}

static q4kh_status cpu_device_info(q4kh_backend_ctx *ctx, uint32_t index,
                                   struct q4kh_device_record *out)
{
	struct q4kh_device_record rec;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (index != 0)
		return cpu_fail(ctx, Q4KH_ERR_INVALID,
		                "device_info: no device %u (the cpu backend has 1)",
		                index);
	q4kh_backend_cpu_record(ctx->threads, &rec);
	snprintf(rec.name, sizeof(rec.name), "cpu (%u thread%s)", ctx->threads,
	         ctx->threads == 1 ? "" : "s");
	return q4kh_backend_put_record(&rec, out, ctx->error, sizeof(ctx->error));
}

q4kh_status cpu_scratch_reserve(q4kh_device_ctx *dev, uint64_t bytes)
{
	const struct q4kh_check c = cpu_contract(dev);

	return q4kh_cpu_scratch_reserve(&c, &dev->scratch, bytes);
}

static void cpu_device_close(q4kh_device_ctx *dev)
{
	if (!dev)
		return;
	q4kh_pool_destroy(dev->pool);
	q4kh_cpu_scratch_free(&dev->scratch);
	free(dev->f16);
	free(dev);
}

static q4kh_status cpu_device_open(q4kh_backend_ctx *ctx, uint32_t index,
                                   q4kh_device_ctx **out)
{
	q4kh_device_ctx *dev;
	char msg[64];

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!out)
		return cpu_fail(ctx, Q4KH_ERR_INVALID, "device_open: out is NULL");
	*out = NULL;
	if (index != 0)
		return cpu_fail(ctx, Q4KH_ERR_INVALID,
		                "device_open: no device %u (the cpu backend has 1)",
		                index);
	dev = calloc(1, sizeof(*dev));
	if (dev)
		dev->f16 = malloc(sizeof(*dev->f16) * 65536);
	if (!dev || !dev->f16 || q4kh_cpu_scratch_init(&dev->scratch, ctx->threads)) {
		if (dev)
			free(dev->f16);
		free(dev);
		return cpu_fail(ctx, Q4KH_ERR_NOMEM, "device_open: out of memory");
	}
	for (uint32_t h = 0; h < 65536; h++)
		dev->f16[h] = q4kh_fp16_to_f32((uint16_t)h);
	dev->ctx = ctx;
	dev->threads = ctx->threads;
	if (q4kh_pool_create(ctx->threads, 0, &dev->pool)) {
		int e = errno;

		cpu_device_close(dev);
		return cpu_fail(ctx, Q4KH_ERR_INTERNAL,
		                "device_open: cannot start %u worker thread%s: %s",
		                ctx->threads - 1, ctx->threads == 2 ? "" : "s", strerror(e));
	}
	if (Q4KH_HOST_HAS(ctx->host, log)) {
		snprintf(msg, sizeof(msg), "cpu: %u thread%s", ctx->threads,
		         ctx->threads == 1 ? "" : "s");
		ctx->host->log(ctx->host->host_data, Q4KH_LOG_DEBUG, msg);
	}
	*out = dev;
	return Q4KH_OK;
}

static int cpu_supports_type(q4kh_backend_ctx *ctx, uint32_t type)
{
	(void)ctx;
	return q4kh_dequant_supported(type);
}

Q4KH_CPU_BUFFER_ENTRIES(cpu, cpu_contract)

/* Every op runs to completion before it returns. */
static q4kh_status cpu_synchronize(q4kh_device_ctx *dev)
{
	return dev ? Q4KH_OK : Q4KH_ERR_INVALID;
}

/* Kernel variants for "cpu" get host pointers: no device, no stream, and
 * no threads: the reference's pool sleeps between ops (T5). */
static q4kh_status cpu_native_device(q4kh_device_ctx *dev,
                                     struct q4kh_native_device *out)
{
	const struct q4kh_check c = cpu_contract(dev);

	return q4kh_cpu_native_device(&c, out);
}

/* --- ABI 1.7: mixture of experts, through the shared code (q4khost/moe.h) --- */

Q4KH_MOE_ENTRIES(cpu_route_entry, cpu_mul_mat_id, cpu_contract, cpu_mul_mat, cpu_buffer_alloc,
                 cpu_buffer_free, q4kh_cpu_at)

static const struct q4kh_backend_v1 cpu_backend = {
	.struct_size = sizeof(struct q4kh_backend_v1),
	.init = cpu_init,
	.shutdown = cpu_shutdown,
	.last_error = cpu_last_error,
	.device_count = cpu_device_count,
	.device_info = cpu_device_info,
	.device_open = cpu_device_open,
	.device_close = cpu_device_close,
	.supports_type = cpu_supports_type,
	.buffer_alloc = cpu_buffer_alloc,
	.buffer_free = cpu_buffer_free,
	.buffer_upload = cpu_buffer_upload,
	.buffer_download = cpu_buffer_download,
	.get_rows = cpu_get_rows,
	.mul_mat = cpu_mul_mat,
	.rms_norm = cpu_rms_norm,
	.rope = cpu_rope,
	.add = cpu_add,
	.mul = cpu_mul,
	.scale = cpu_scale,
	.glu = cpu_glu,
	.copy = cpu_copy,
	.attention = cpu_attention,
	.synchronize = cpu_synchronize,
	.native_device = cpu_native_device,
	/* 1.1's measurement and graph entries stay NULL: the reference runs
	 * every op as it is issued. */
	.get_rows_ext = cpu_get_rows_ext,
	.rope_ext = cpu_rope_ext,
	.set_rows = cpu_set_rows,
	.attention_ext = cpu_attention_ext,
	.buffer_wrap = cpu_buffer_wrap,
	.unary = cpu_unary,
	.ssm_conv = cpu_ssm_conv,
	.delta_net = cpu_delta_net,
	/* double sums, an F32 cache: the exact reference F2 measures against */
	.arith = Q4KH_ARITH_EXACT,
	.moe_route = cpu_route_entry,
	.mul_mat_id = cpu_mul_mat_id,
	.attention_paged = cpu_attention_paged,
};

/* The build id names the compiler; clang's __VERSION__ names itself. */
#ifdef __clang__
#define CPU_COMPILER __VERSION__
#else
#define CPU_COMPILER "gcc " __VERSION__
#endif

static const struct q4kh_plugin_desc cpu_desc = {
	.struct_size = sizeof(struct q4kh_plugin_desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_BACKEND,
	.name = "cpu",
	.version = PACKAGE_VERSION,
	.vendor = "q4khost",
	.license = "MIT",
	.build_id = CPU_COMPILER,
	.backend = &cpu_backend,
	.kernel = NULL,
};

Q4KH_PLUGIN_ENTRY(cpu_desc)
