/*
 * cpu-fast: identity, settings, the device, buffers and the native handles
 * it lends to kernel variants (fast.h says what the backend is).
 *
 * Settings ([plugin.cpu-fast]):
 *   threads = 1..256   worker threads, the caller's included (default:
 *                      the online CPUs)
 *   isa = auto | avx2 | avx512
 *                      the loops to use (default auto: the best this CPU
 *                      and OS run); naming one they cannot run fails init()
 *   spin_us = 0..100000
 *                      how long an idle worker spins for the next job
 *                      before it sleeps (default 200)
 */
#include "buildconf.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4khost/backend_base.h"
#include "q4khost/cpu_isa.h"
#include "q4khost/moe.h"
#include "fast.h"

#define NAME "cpu-fast"
#define DEFAULT_SPIN_US 200
#define MAX_SPIN_US 100000

Q4KH_BACKEND_ERRORS(fast_fail, f_last_error)

/* The loops an "isa" setting asks for; -1 when the value is unknown. */
static int parse_isa(const char *s, const struct fast_kernels **out)
{
	if (!strcmp(s, "auto"))
		*out = q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX512_VNNI) ? &fast_avx512_kernels :
		       q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX2)        ? &fast_avx2_kernels :
		                                                       NULL;
	else if (!strcmp(s, "avx2"))
		*out = q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX2) ? &fast_avx2_kernels : NULL;
	else if (!strcmp(s, "avx512"))
		*out = q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AVX512_VNNI) ? &fast_avx512_kernels : NULL;
	else
		return -1;
	return 0;
}

static q4kh_status f_init(const struct q4kh_host_api *host, q4kh_backend_ctx **out)
{
	unsigned n = q4kh_threads_online(), spin_us = DEFAULT_SPIN_US;
	const char *isa = NULL;
	const struct fast_kernels *k;
	q4kh_status st;

	if ((st = q4kh_backend_init_check(NAME, host, out)) ||
	    (st = q4kh_backend_setting_uint(host, NAME, "threads", 1, Q4KH_MAX_THREADS, &n)) ||
	    (st = q4kh_backend_setting_uint(host, NAME, "spin_us", 0, MAX_SPIN_US, &spin_us)))
		return st;
	if (Q4KH_HOST_HAS(host, config_get))
		isa = host->config_get(host->host_data, "isa");
	if (parse_isa(isa ? isa : "auto", &k))
		return fast_fail(NULL, Q4KH_ERR_INVALID,
		                 "[plugin." NAME "] isa = \"%s\": expected auto, avx2 or avx512",
		                 isa);
	if (isa && strcmp(isa, "auto") && !k)
		return fast_fail(NULL, Q4KH_ERR_UNSUPPORTED,
		                 "[plugin." NAME "] isa = %s: this CPU, or the OS's saved register "
		                 "state (XCR0), does not support it", isa);
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return fast_fail(NULL, Q4KH_ERR_NOMEM, NAME ": init: out of memory");
	(*out)->host = host;
	(*out)->threads = n;
	(*out)->spin_us = spin_us;
	(*out)->k = k;
	return Q4KH_OK;
}

static void f_shutdown(q4kh_backend_ctx *ctx)
{
	free(ctx);
}

/* One device, the host's cores, where they run AVX2 at least; else none. */
static q4kh_status f_device_count(q4kh_backend_ctx *ctx, uint32_t *count)
{
	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!count)
		return fast_fail(ctx, Q4KH_ERR_INVALID, "device_count: count is NULL");
	*count = ctx->k ? 1 : 0;
	return Q4KH_OK;
}

static q4kh_status f_device_info(q4kh_backend_ctx *ctx, uint32_t index,
                                 struct q4kh_device_record *out)
{
	struct q4kh_device_record rec;

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (index != 0 || !ctx->k)
		return fast_fail(ctx, Q4KH_ERR_INVALID, "device_info: no device %u (%s)", index,
		                 ctx->k ? "cpu-fast has 1" : "this CPU runs neither AVX2 nor AVX-512");
	q4kh_backend_cpu_record(ctx->threads, &rec);
	/* The instruction set and threads are what tells this device apart. */
	snprintf(rec.name, sizeof(rec.name), "cpu (%s float32, %u thread%s)", ctx->k->name,
	         ctx->threads, ctx->threads == 1 ? "" : "s");
	return q4kh_backend_put_record(&rec, out, ctx->error, sizeof(ctx->error));
}

q4kh_status fast_scratch(q4kh_device_ctx *dev, uint64_t bytes)
{
	const struct q4kh_check c = fast_contract(dev);

	return q4kh_cpu_scratch_reserve(&c, &dev->scratch, bytes);
}

static void f_device_close(q4kh_device_ctx *dev)
{
	if (!dev)
		return;
	q4kh_pool_destroy(dev->pool);
	q4kh_cpu_scratch_free(&dev->scratch);
	fast_angles_free(dev);
	free(dev);
}

static q4kh_status f_device_open(q4kh_backend_ctx *ctx, uint32_t index, q4kh_device_ctx **out)
{
	q4kh_device_ctx *dev;
	char msg[128];

	if (!ctx)
		return Q4KH_ERR_INVALID;
	if (!out)
		return fast_fail(ctx, Q4KH_ERR_INVALID, "device_open: out is NULL");
	*out = NULL;
	if (index != 0 || !ctx->k)
		return fast_fail(ctx, Q4KH_ERR_INVALID, "device_open: no device %u", index);
	dev = calloc(1, sizeof(*dev));
	if (!dev || q4kh_cpu_scratch_init(&dev->scratch, ctx->threads)) {
		free(dev);
		return fast_fail(ctx, Q4KH_ERR_NOMEM, "device_open: out of memory");
	}
	dev->ctx = ctx;
	dev->k = ctx->k;
	dev->threads = ctx->threads;
	if (q4kh_pool_create(ctx->threads, ctx->spin_us, &dev->pool)) {
		int e = errno;

		f_device_close(dev);
		return fast_fail(ctx, Q4KH_ERR_INTERNAL,
		                 "device_open: cannot start %u worker thread%s: %s",
		                 ctx->threads - 1, ctx->threads == 2 ? "" : "s", strerror(e));
	}
	if (Q4KH_HOST_HAS(ctx->host, log)) {
		snprintf(msg, sizeof(msg), NAME ": %s loops, %u thread%s, spinning %u us",
		         ctx->k->name, ctx->threads, ctx->threads == 1 ? "" : "s", ctx->spin_us);
		ctx->host->log(ctx->host->host_data, Q4KH_LOG_DEBUG, msg);
	}
	*out = dev;
	return Q4KH_OK;
}

static int f_supports_type(q4kh_backend_ctx *ctx, uint32_t type)
{
	(void)ctx;
	return q4kh_dequant_supported(type);
}

Q4KH_CPU_BUFFER_ENTRIES(f, fast_contract)

/* Every op runs to completion before it returns. */
static q4kh_status f_synchronize(q4kh_device_ctx *dev)
{
	return dev ? Q4KH_OK : Q4KH_ERR_INVALID;
}

/* Host pointers, as the reference lends, and the worker pool (ABI 1.3). */
static q4kh_status f_native_device(q4kh_device_ctx *dev, struct q4kh_native_device *out)
{
	const struct q4kh_check c = fast_contract(dev);
	q4kh_status st = q4kh_cpu_native_device(&c, out);

	if (!st)
		q4kh_pool_lend(dev->pool, out);
	return st;
}

/* --- ABI 1.7: mixture of experts, the reference's code (q4khost/moe.h) with
 * cpu-fast's own products --- */

Q4KH_MOE_ENTRIES(f_moe_route, f_mul_mat_id, fast_contract, fast_mul_mat, f_buffer_alloc,
                 f_buffer_free, q4kh_cpu_at)

/*
 * No graph_begin: a recording would replay only the backend's own ops,
 * while the kernel variants' products, which the host calls directly and
 * which run at once on the host's cores, have no queue to be captured in.
 */
const struct q4kh_backend_v1 fast_table = {
	.struct_size = sizeof(struct q4kh_backend_v1),
	.init = f_init,
	.shutdown = f_shutdown,
	.last_error = f_last_error,
	.device_count = f_device_count,
	.device_info = f_device_info,
	.device_open = f_device_open,
	.device_close = f_device_close,
	.supports_type = f_supports_type,
	.buffer_alloc = f_buffer_alloc,
	.buffer_free = f_buffer_free,
	.buffer_upload = f_buffer_upload,
	.buffer_download = f_buffer_download,
	.get_rows = fast_get_rows,
	.mul_mat = fast_mul_mat,
	.rms_norm = fast_rms_norm,
	.rope = fast_rope,
	.add = fast_add,
	.mul = fast_mul,
	.scale = fast_scale,
	.glu = fast_glu,
	.copy = fast_copy,
	.attention = fast_attention,
	.synchronize = f_synchronize,
	.native_device = f_native_device,
	.get_rows_ext = fast_get_rows_ext,
	.rope_ext = fast_rope_ext,
	.set_rows = fast_set_rows,
	.attention_ext = fast_attention_ext,
	.buffer_wrap = f_buffer_wrap,
	.unary = fast_unary,
	.ssm_conv = fast_ssm_conv,
	.delta_net = fast_delta_net,
	.add_rms_norm = fast_add_rms_norm,
	.rope_set_rows = fast_rope_set_rows,
	.top2 = fast_top2,
	.rope_store = fast_rope_store,
	.norm_add_rms_norm = fast_norm_add_rms_norm,
	.graph_prepare = fast_graph_prepare,
	.graph_compute = fast_graph_compute,
	.graph_release = fast_graph_release,
	/* Its ops run in f32, but its attention reads keys and values the
	 * host's F16 cache rounded (every backend but the reference gets one):
	 * f16 is the coarsest rounding on its path, and F2 measures it so. */
	.arith = Q4KH_ARITH_F16,
	.moe_route = f_moe_route,
	.mul_mat_id = f_mul_mat_id,
	.attention_paged = fast_attention_paged,
};

#ifdef __clang__
#define FAST_COMPILER __VERSION__
#else
#define FAST_COMPILER "gcc " __VERSION__
#endif

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_BACKEND,
	.name = NAME,
	.version = PACKAGE_VERSION,
	.vendor = "q4khost",
	.license = "MIT",
	.build_id = FAST_COMPILER,
	.backend = &fast_table,
	.backend_kind = "cpu",
};

Q4KH_PLUGIN_ENTRY(desc)
