/*
 * example-backend: a complete q4khost backend in portable C, built out of
 * tree against the installed SDK alone (see the Makefile and README.md
 * beside this file, and docs/plugin-abi.md).
 *
 * This file is the part every backend has: the descriptor and the entry
 * symbol, init() and the handshake, one device, buffers of memory, and
 * the function table. A device backend keeps its shape and puts its own
 * allocator, copies and queue where malloc, memcpy and "every op is done
 * when it returns" stand here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#ifndef PLUGIN_VERSION
#define PLUGIN_VERSION "0"
#endif
#ifndef BUILD_ID
#define BUILD_ID "unknown"
#endif

/* example_fail, and last_error(): ctx's line, or init()'s (backend_base.h). */
Q4KH_BACKEND_ERRORS(example_fail, b_last_error)

/* contract.h asks: is BUF one of DEV's, and how large is it? */
static int own_buffer(const void *dev, const q4kh_buffer *buf, uint64_t *size)
{
	*size = buf->size;
	return buf->dev == dev;
}

struct q4kh_check example_contract(q4kh_device_ctx *dev)
{
	struct q4kh_check c = { dev, own_buffer, example_weight_types(),
		                NULL, 0 };

	/* A failed check writes straight into last_error(). */
	if (dev) {
		c.msg = dev->ctx->error;
		c.cap = sizeof(dev->ctx->error);
	}
	return c;
}

/* --- the context --- */

static q4kh_status b_init(const struct q4kh_host_api *host, q4kh_backend_ctx **out)
{
	q4kh_backend_ctx *ctx;
	q4kh_status st;

	/* out, host and the ABI major (rule V5) */
	if ((st = q4kh_backend_init_check(NAME, host, out)))
		return st;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return example_fail(NULL, Q4KH_ERR_NOMEM, NAME ": init: out of memory");
	ctx->host = host;
	if (Q4KH_HOST_HAS(host, log))
		host->log(host->host_data, Q4KH_LOG_DEBUG, NAME ": one device, one thread");
	*out = ctx;
	return Q4KH_OK;
}

static void b_shutdown(q4kh_backend_ctx *ctx)
{
	free(ctx);
}

/* --- one device --- */

static q4kh_status b_device_count(q4kh_backend_ctx *ctx, uint32_t *count)
{
	if (!ctx || !count)
		return example_fail(ctx, Q4KH_ERR_INVALID, "device_count: count is NULL");
	*count = 1;
	return Q4KH_OK;
}

static q4kh_status b_device_info(q4kh_backend_ctx *ctx, uint32_t index,
                                 struct q4kh_device_record *out)
{
	struct q4kh_device_record rec;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (index != 0)
		return example_fail(ctx, Q4KH_ERR_INVALID, "device_info: no device %u (" NAME
		                    " has 1)", index);
	memset(&rec, 0, sizeof(rec));
	snprintf(rec.name, sizeof(rec.name), NAME " (portable C, 1 thread)");
	/* The identity F2 receipts are keyed on: stable across runs. */
	snprintf(rec.uuid, sizeof(rec.uuid), NAME "-0");
	snprintf(rec.arch, sizeof(rec.arch), "generic");
	rec.multiprocessors = 1;
	/* No byte past the host's record (rule V2). */
	return q4kh_backend_put_record(&rec, out, ctx->error, sizeof(ctx->error));
}

static q4kh_status b_device_open(q4kh_backend_ctx *ctx, uint32_t index,
                                 q4kh_device_ctx **out)
{
	if (!ctx || !out || index != 0)
		return example_fail(ctx, Q4KH_ERR_INVALID, "device_open: device %u of 1",
		                    index);
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return example_fail(ctx, Q4KH_ERR_NOMEM, "device_open: out of memory");
	(*out)->ctx = ctx;
	return Q4KH_OK;
}

static void b_device_close(q4kh_device_ctx *dev)
{
	free(dev);
}

static int b_supports_type(q4kh_backend_ctx *ctx, uint32_t type)
{
	(void)ctx;
	return type < 32 && (example_weight_types() & Q4KH_TYPE_BIT(type));
}

/* Every op has finished when it returns. */
static q4kh_status b_synchronize(q4kh_device_ctx *dev)
{
	return dev ? Q4KH_OK : Q4KH_ERR_INVALID;
}

/* --- buffers: the device's memory --- */

static q4kh_status b_buffer_alloc(q4kh_device_ctx *dev, uint64_t size, q4kh_buffer **out)
{
	q4kh_buffer *buf;

	if (!dev || !out)
		return Q4KH_ERR_INVALID;
	*out = NULL;
	if (size >= SIZE_MAX)
		return example_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                    "buffer_alloc: %llu bytes", (unsigned long long)size);
	buf = calloc(1, sizeof(*buf));
	/* malloc's alignment covers every type's (contract.h: 4 at most). */
	if (buf)
		buf->data = malloc(size ? (size_t)size : 1);
	if (!buf || !buf->data) {
		free(buf);
		return example_fail(dev->ctx, Q4KH_ERR_NOMEM,
		                    "buffer_alloc: cannot allocate %llu bytes",
		                    (unsigned long long)size);
	}
	buf->dev = dev;
	buf->size = size;
	*out = buf;
	return Q4KH_OK;
}

static void b_buffer_free(q4kh_device_ctx *dev, q4kh_buffer *buf)
{
	(void)dev;
	if (buf)
		free(buf->data);
	free(buf);
}

/* Synchronous: SRC is the host's again when this returns (rule M6). */
static q4kh_status b_buffer_upload(q4kh_device_ctx *dev, q4kh_buffer *buf,
                                   uint64_t offset, const void *src, uint64_t size)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_transfer(&c, "buffer_upload", buf, offset, src, size);

	if (!st && size)
		memcpy(buf->data + offset, src, (size_t)size);
	return st;
}

static q4kh_status b_buffer_download(q4kh_device_ctx *dev, q4kh_buffer *buf,
                                     uint64_t offset, void *dst, uint64_t size)
{
	const struct q4kh_check c = example_contract(dev);
	q4kh_status st = q4kh_check_transfer(&c, "buffer_download", buf, offset, dst, size);

	if (!st && size)
		memcpy(dst, buf->data + offset, (size_t)size);
	return st;
}

/*
 * The table: ABI 1.0's entries, of 1.2 the four that take a step's ids
 * and positions from device memory (so the host needs no 1.0 fallback
 * whose positions must be consecutive), and 1.6's step graph entries.
 * Everything else stays NULL: no kernel variants (native_device), no
 * measurement or recording (1.1), no weights in place (buffer_wrap), no
 * linear-attention layers (qwen35), none of the deprecated fused entries.
 */
const struct q4kh_backend_v1 example_table = {
	.struct_size = sizeof(example_table),
	.init = b_init,
	.shutdown = b_shutdown,
	.last_error = b_last_error,
	.device_count = b_device_count,
	.device_info = b_device_info,
	.device_open = b_device_open,
	.device_close = b_device_close,
	.supports_type = b_supports_type,
	.buffer_alloc = b_buffer_alloc,
	.buffer_free = b_buffer_free,
	.buffer_upload = b_buffer_upload,
	.buffer_download = b_buffer_download,
	.get_rows = example_get_rows,
	.mul_mat = example_mul_mat,
	.rms_norm = example_rms_norm,
	.rope = example_rope,
	.add = example_add,
	.mul = example_mul,
	.scale = example_scale,
	.glu = example_glu,
	.copy = example_copy,
	.attention = example_attention,
	.synchronize = b_synchronize,
	.get_rows_ext = example_get_rows_ext,
	.rope_ext = example_rope_ext,
	.set_rows = example_set_rows,
	.attention_ext = example_attention_ext,
	.graph_prepare = example_graph_prepare,
	.graph_compute = example_graph_compute,
	.graph_release = example_graph_release,
	/* The arithmetic F2 holds it to (docs/plugin-abi.md): float ops, but
	 * the host gives every backend but the reference an F16 KV cache,
	 * which its attention reads: f16 is the coarsest rounding it does. */
	.arith = Q4KH_ARITH_F16,
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_BACKEND,
	.name = NAME,
	.version = PLUGIN_VERSION,
	.vendor = "q4khost SDK example",
	.license = "MIT",
	.build_id = BUILD_ID,
	.backend = &example_table,
};

/* The one symbol the plugin exports (-fvisibility=hidden hides the rest). */
Q4KH_PLUGIN_ENTRY(desc)
