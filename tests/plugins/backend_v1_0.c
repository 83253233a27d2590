/*
 * Test plugin: a backend built against ABI 1.0, whose table ends at
 * native_device (the entries that 1.1 appended are beyond its
 * struct_size). The host must accept it and never read past its size; it
 * calls nothing in it, so every entry points at one function that aborts.
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

/* The 1.1 entries hold never_called too: a host that read them would
 * find them non-NULL, so only the struct_size check keeps them unread. */
static const struct q4kh_backend_v1 table = {
	.struct_size = offsetof(struct q4kh_backend_v1, native_device) +
	               sizeof(table.native_device),
	FN(init), FN(shutdown), FN(last_error), FN(device_count),
	FN(device_info), FN(device_open), FN(device_close), FN(supports_type),
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
	.name = "backend-v1-0",
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
