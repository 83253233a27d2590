/*
 * Test plugin: a backend built against ABI 1.0, whose table ends at
 * native_device (the entries that 1.1 appended are beyond its
 * struct_size). The host must accept it and never read past its size; it
 * calls nothing in it, so every entry points at one function that aborts.
 *
 * Built again with -DNO_DEVICE as no_device.so: a backend that starts but
 * has no device, as the cuda plugin on a machine without a GPU, and says
 * why when asked for device 0; the host must name it as loaded but
 * without a device, with that reason. Its op entries are never called.
 */
#include <stddef.h>
#include <stdlib.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

static void never_called(void)
{
	abort();
}

#define FN(f) .f = (__typeof__(((struct q4kh_backend_v1 *)0)->f))never_called

#ifdef NO_DEVICE
struct q4kh_backend_ctx {
	int unused;
};

static struct q4kh_backend_ctx the_ctx;

static q4kh_status nd_init(const struct q4kh_host_api *host, q4kh_backend_ctx **out)
{
	(void)host;
	*out = &the_ctx;
	return Q4KH_OK;
}

static void nd_shutdown(q4kh_backend_ctx *ctx)
{
	(void)ctx;
}

static const char *nd_last_error(q4kh_backend_ctx *ctx)
{
	return ctx ? "device_info: no device 0 (no-device has 0: this test backend never has one)"
	           : "";
}

static q4kh_status nd_device_count(q4kh_backend_ctx *ctx, uint32_t *count)
{
	(void)ctx;
	*count = 0;
	return Q4KH_OK;
}

static q4kh_status nd_device_info(q4kh_backend_ctx *ctx, uint32_t index,
                                  struct q4kh_device_record *out)
{
	(void)ctx, (void)index, (void)out;
	return Q4KH_ERR_INVALID;
}

#define NAME "no-device"
#define FIRST_ENTRIES .init = nd_init, .shutdown = nd_shutdown, .last_error = nd_last_error, \
	.device_count = nd_device_count, .device_info = nd_device_info
#else
#define NAME "backend-v1-0"
#define FIRST_ENTRIES FN(init), FN(shutdown), FN(last_error), FN(device_count), FN(device_info)
#endif

/* The 1.1 entries hold never_called too: a host that read them would
 * find them non-NULL, so only the struct_size check keeps them unread. */
static const struct q4kh_backend_v1 table = {
	.struct_size = offsetof(struct q4kh_backend_v1, native_device) +
	               sizeof(table.native_device),
	FIRST_ENTRIES, FN(device_open), FN(device_close), FN(supports_type),
	FN(buffer_alloc), FN(buffer_free), FN(buffer_upload),
	FN(buffer_download), FN(get_rows), FN(mul_mat), FN(rms_norm),
	FN(rope), FN(add), FN(mul), FN(scale), FN(glu), FN(copy),
	FN(attention), FN(synchronize), FN(native_device), FN(read_pass),
	FN(timer_start), FN(timer_stop), FN(graph_begin), FN(graph_end),
	FN(graph_launch), FN(graph_free),
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = 0,
	.kind = Q4KH_KIND_BACKEND,
	.name = NAME,
	.version = "1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
	.backend = &table,
};

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc;
}
