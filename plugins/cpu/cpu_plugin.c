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

static void free_scratch(q4kh_device_ctx *dev)
{
	for (unsigned i = 0; i < dev->threads; i++) {
		free(dev->scratch[i]);
		dev->scratch[i] = NULL;
	}
	dev->scratch_size = 0;
}

q4kh_status cpu_scratch_reserve(q4kh_device_ctx *dev, uint64_t bytes)
{
	uint64_t size = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;

	if (bytes <= dev->scratch_size)
		return Q4KH_OK;
	free_scratch(dev);
	for (unsigned i = 0; i < dev->threads; i++) {
		dev->scratch[i] = aligned_alloc(CPU_ALIGN, size);
		if (!dev->scratch[i]) {
			free_scratch(dev);
			return cpu_fail(dev->ctx, Q4KH_ERR_NOMEM,
			                "cannot allocate %u x %llu bytes of scratch",
			                dev->threads, (unsigned long long)size);
		}
	}
	dev->scratch_size = size;
	return Q4KH_OK;
}

static void cpu_device_close(q4kh_device_ctx *dev)
{
	if (!dev)
		return;
	q4kh_pool_destroy(dev->pool);
	free_scratch(dev);
	free(dev->scratch);
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
	if (dev) {
		dev->scratch = calloc(ctx->threads, sizeof(*dev->scratch));
		dev->f16 = malloc(sizeof(*dev->f16) * 65536);
	}
	if (!dev || !dev->scratch || !dev->f16) {
		if (dev) {
			free(dev->scratch);
			free(dev->f16);
		}
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

static q4kh_status cpu_buffer_alloc(q4kh_device_ctx *dev, uint64_t size,
                                    q4kh_buffer **out)
{
	q4kh_buffer *buf;
	uint64_t padded;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!out)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "buffer_alloc: out is NULL");
	*out = NULL;
	/* aligned_alloc wants a multiple of the alignment, and at least one. */
	if (size > UINT64_MAX - CPU_ALIGN || size + CPU_ALIGN > SIZE_MAX)
		return cpu_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                "buffer_alloc: %llu bytes is more than this host "
		                "can address",
		                (unsigned long long)size);
	padded = (size + CPU_ALIGN) / CPU_ALIGN * CPU_ALIGN;
	buf = calloc(1, sizeof(*buf));
	if (buf)
		buf->data = aligned_alloc(CPU_ALIGN, (size_t)padded);
	if (!buf || !buf->data) {
		free(buf);
		return cpu_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                "buffer_alloc: cannot allocate %llu bytes",
		                (unsigned long long)size);
	}
	buf->dev = dev;
	buf->size = size;
	*out = buf;
	return Q4KH_OK;
}

static q4kh_status cpu_buffer_wrap(q4kh_device_ctx *dev, const void *host,
                                   uint64_t size, q4kh_buffer **out)
{
	q4kh_buffer *buf;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!out || !host || (uintptr_t)host % 32)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "buffer_wrap: out %p, host %p: expected an out "
		                "pointer and host memory aligned to 32 bytes",
		                (void *)out, host);
	*out = NULL;
	buf = calloc(1, sizeof(*buf));
	if (!buf)
		return cpu_fail(dev->ctx, Q4KH_ERR_NOMEM, "buffer_wrap: out of memory");
	buf->dev = dev;
	buf->size = size;
	buf->data = (unsigned char *)(uintptr_t)host;
	buf->wrapped = 1;
	*out = buf;
	return Q4KH_OK;
}

static void cpu_buffer_free(q4kh_device_ctx *dev, q4kh_buffer *buf)
{
	(void)dev;
	if (!buf)
		return;
	if (!buf->wrapped)
		free(buf->data);
	free(buf);
}

static q4kh_status cpu_buffer_upload(q4kh_device_ctx *dev, q4kh_buffer *buf,
                                     uint64_t offset, const void *src,
                                     uint64_t size)
{
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_transfer(&c, "buffer_upload", buf, offset, src, size)))
		return st;
	if (buf->wrapped)
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "buffer_upload: the buffer wraps read-only host "
		                "memory (buffer_wrap)");
	if (size)
		memcpy(buf->data + offset, src, (size_t)size);
	return Q4KH_OK;
}

static q4kh_status cpu_buffer_download(q4kh_device_ctx *dev, q4kh_buffer *buf,
                                       uint64_t offset, void *dst,
                                       uint64_t size)
{
	const struct q4kh_check c = cpu_contract(dev);
	q4kh_status st;

	if ((st = q4kh_check_transfer(&c, "buffer_download", buf, offset, dst, size)))
		return st;
	if (size)
		memcpy(dst, buf->data + offset, (size_t)size);
	return Q4KH_OK;
}

/* Every op runs to completion before it returns. */
static q4kh_status cpu_synchronize(q4kh_device_ctx *dev)
{
	return dev ? Q4KH_OK : Q4KH_ERR_INVALID;
}

static void *cpu_address(const q4kh_buffer *buf)
{
	return buf ? buf->data : NULL;
}

/* Kernel variants for "cpu" get host pointers: no device, no stream. */
static q4kh_status cpu_native_device(q4kh_device_ctx *dev,
                                     struct q4kh_native_device *out)
{
	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!out || out->struct_size < sizeof(*out))
		return cpu_fail(dev->ctx, Q4KH_ERR_INVALID,
		                "native_device: record of %u bytes, expected %zu",
		                out ? out->struct_size : 0, sizeof(*out));
	out->ordinal = -1;
	out->stream = NULL;
	out->address = cpu_address;
	return Q4KH_OK;
}

/* --- ABI 1.7: mixture of experts, through the shared code (q4khost/moe.h) --- */

Q4KH_MOE_ENTRIES(cpu_route_entry, cpu_mul_mat_id, cpu_contract, cpu_mul_mat, cpu_buffer_alloc,
                 cpu_buffer_free, cpu_row)

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
