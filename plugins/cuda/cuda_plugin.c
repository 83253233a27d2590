/*
 * The cuda plugin's identity, context and error reporting. Devices live in
 * cuda_device.c, buffers in cuda_buffer.c, the ops in cuda_ops.c, whole
 * steps (ABI 1.6) in cuda_graph.c and the kernels in the .cu files.
 */
#include "buildconf.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda.h"
#include "q4khost/backend_base.h"

Q4KH_BACKEND_ERRORS(cuda_fail, cuda_last_error)

q4kh_status cuda_check(q4kh_device_ctx *dev, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return Q4KH_OK;
	/* Reset a non-sticky error; a sticky one stays and fails every call. */
	cudaGetLastError();
	return cuda_fail(dev->ctx,
	                 e == cudaErrorMemoryAllocation ? Q4KH_ERR_NOMEM
	                                                : Q4KH_ERR_DEVICE,
	                 "%s: %s (%s)", what, cudaGetErrorString(e),
	                 cudaGetErrorName(e));
}

q4kh_status cuda_launched(q4kh_device_ctx *dev, const char *op, cudaError_t e)
{
	char what[64];

	snprintf(what, sizeof(what), "%s: kernel launch", op);
	return cuda_check(dev, e, what);
}

void cuda_log(q4kh_backend_ctx *ctx, q4kh_log_level level, const char *fmt,
              ...)
{
	const struct q4kh_host_api *host = ctx->host;
	char msg[1024];
	va_list ap;

	if (!Q4KH_HOST_HAS(host, log))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	host->log(host->host_data, level, msg);
}

/*
 * No GPU, no driver, or a driver too old for this runtime: the backend has
 * no devices, which is not an error (CI machines, hosts without a GPU).
 */
static int means_no_devices(cudaError_t e)
{
	return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver;
}

/*
 * 1 when any part of the NVIDIA driver loads. cudaErrorInsufficientDriver
 * also means "no driver at all" (a machine without a GPU): that is no news
 * worth a line on every command, while a driver that is there but too old
 * for this runtime is something to fix, and stays loud.
 */
static int driver_installed(void)
{
	static const char *const libs[] = { "libcuda.so.1", "libnvidia-ml.so.1" };

	for (int i = 0; i < 2; i++) {
		void *dl = dlopen(libs[i], RTLD_LAZY | RTLD_LOCAL);

		if (dl) {
			dlclose(dl);
			return 1;
		}
	}
	return 0;
}

/*
 * Why cudaGetDeviceCount's E (means_no_devices) leaves no device, with the
 * CUDA error and what to do, into BUF: what device_info(0) answers, which
 * q4khost plugins shows. NO_DRIVER: no part of the driver loads.
 */
static void why_no_devices(cudaError_t e, int no_driver, char *buf, size_t cap)
{
	int driver = 0, runtime = 0;

	if (no_driver) {
		snprintf(buf, cap, "no NVIDIA driver is installed: neither libcuda.so.1 nor "
		         "libnvidia-ml.so.1 loads (%s, CUDA error %d); install the NVIDIA driver "
		         "on a machine with an NVIDIA GPU, else the cpu backends serve",
		         cudaGetErrorName(e), (int)e);
	} else if (e == cudaErrorNoDevice) {
		snprintf(buf, cap, "%s (%s, CUDA error %d): the NVIDIA driver loads but shows no "
		         "GPU to this process; nvidia-smi lists the GPUs it sees, and "
		         "CUDA_VISIBLE_DEVICES, when set, hides the others",
		         cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
	} else {
		cudaDriverGetVersion(&driver);
		cudaRuntimeGetVersion(&runtime);
		snprintf(buf, cap, "%s (%s, CUDA error %d): the NVIDIA driver supports CUDA %d.%d, "
		         "this plugin's runtime is CUDA %d.%d; update the driver (nvidia-smi shows "
		         "its version)", cudaGetErrorString(e), cudaGetErrorName(e), (int)e,
		         driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
	}
}

static q4kh_status cuda_init(const struct q4kh_host_api *host,
                             q4kh_backend_ctx **out)
{
	q4kh_backend_ctx *ctx;
	q4kh_status st;
	cudaError_t e;
	int n = 0;

	if ((st = q4kh_backend_init_check("cuda", host, out)))
		return st;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return cuda_fail(NULL, Q4KH_ERR_NOMEM, "cuda: init: out of memory");
	ctx->host = host;
	ctx->persistent = 0;
	ctx->pdl = 1;
	ctx->fuse = 1;
	if ((st = q4kh_backend_setting_bool(host, "cuda", "persistent", &ctx->persistent)) ||
	    (st = q4kh_backend_setting_bool(host, "cuda", "pdl", &ctx->pdl)) ||
	    (st = q4kh_backend_setting_bool(host, "cuda", "fuse", &ctx->fuse))) {
		free(ctx);
		return st;
	}
	e = cudaGetDeviceCount(&n);
	if (e == cudaSuccess) {
		ctx->n_devices = n;
	} else if (means_no_devices(e)) {
		int no_driver = e == cudaErrorInsufficientDriver && !driver_installed();

		cudaGetLastError();
		why_no_devices(e, no_driver, ctx->no_devices, sizeof(ctx->no_devices));
		cuda_log(ctx, no_driver ? Q4KH_LOG_DEBUG : Q4KH_LOG_INFO, "cuda: no devices: %s",
		         ctx->no_devices);
	} else {
		cuda_fail(NULL, Q4KH_ERR_DEVICE, "cuda: init: cudaGetDeviceCount: %s (%s, CUDA error %d)",
		          cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
		free(ctx);
		return Q4KH_ERR_DEVICE;
	}
	*out = ctx;
	return Q4KH_OK;
}

static void cuda_shutdown(q4kh_backend_ctx *ctx)
{
	free(ctx);
}

static int cuda_supports_type(q4kh_backend_ctx *ctx, uint32_t type)
{
	(void)ctx;
	return cuda_type_supported(type);
}

const struct q4kh_backend_v1 cuda_backend = {
	.struct_size = sizeof(struct q4kh_backend_v1),
	.init = cuda_init,
	.shutdown = cuda_shutdown,
	.last_error = cuda_last_error,
	.device_count = cuda_device_count,
	.device_info = cuda_device_info,
	.device_open = cuda_device_open,
	.device_close = cuda_device_close,
	.supports_type = cuda_supports_type,
	.buffer_alloc = cuda_buffer_alloc,
	.buffer_free = cuda_buffer_free,
	.buffer_upload = cuda_buffer_upload,
	.buffer_download = cuda_buffer_download,
	.get_rows = cuda_get_rows,
	.mul_mat = cuda_mul_mat,
	.rms_norm = cuda_rms_norm,
	.rope = cuda_rope,
	.add = cuda_add,
	.mul = cuda_mul,
	.scale = cuda_scale,
	.glu = cuda_glu,
	.copy = cuda_copy,
	.attention = cuda_attention,
	.synchronize = cuda_synchronize,
	.native_device = cuda_native_device,
	.read_pass = cuda_read_pass,
	.timer_start = cuda_timer_start,
	.timer_stop = cuda_timer_stop,
	.graph_begin = cuda_graph_begin,
	.graph_end = cuda_graph_end,
	.graph_launch = cuda_graph_launch,
	.graph_free = cuda_graph_free,
	.get_rows_ext = cuda_get_rows_ext,
	.rope_ext = cuda_rope_ext,
	.set_rows = cuda_set_rows,
	.attention_ext = cuda_attention_ext,
	.unary = cuda_unary,
	.ssm_conv = cuda_ssm_conv,
	.delta_net = cuda_delta_net,
	.add_rms_norm = cuda_add_rms_norm,
	.rope_set_rows = cuda_rope_set_rows,
	.top2 = cuda_top2,
	.rope_store = cuda_rope_store,
	.norm_add_rms_norm = cuda_norm_add_rms_norm,
	.graph_prepare = cuda_graph_prepare,
	.graph_compute = cuda_graph_compute,
	.graph_release = cuda_graph_release,
	/* a prompt's products and attention on fp16 tensor cores (sdk/lib/cuda_tc.cu,
	 * cuda_flash.cu), the host's F16 cache */
	.arith = Q4KH_ARITH_F16,
	.moe_route = cuda_moe_route,
	.mul_mat_id = cuda_mul_mat_id,
	.attention_paged = cuda_attention_paged,
};

#ifdef __clang__
#define CUDA_HOST_COMPILER __VERSION__
#else
#define CUDA_HOST_COMPILER "gcc " __VERSION__
#endif

static const struct q4kh_plugin_desc cuda_desc = {
	.struct_size = sizeof(struct q4kh_plugin_desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_BACKEND,
	.name = "cuda",
	.version = PACKAGE_VERSION,
	.vendor = "q4khost",
	.license = "MIT",
	.build_id = "nvcc " Q4KH_NVCC_VERSION " (" Q4KH_CUDA_ARCHS "), "
	            CUDA_HOST_COMPILER,
	.backend = &cuda_backend,
	.kernel = NULL,
};

Q4KH_PLUGIN_ENTRY(cuda_desc)
