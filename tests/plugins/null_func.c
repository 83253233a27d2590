/*
 * Test plugin: a backend whose table is full size but lacks the required
 * mul_mat. The host must refuse it before calling anything in the table,
 * so the other entries all point at one function that is never called.
 */
#include <stdlib.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

static void never_called(void)
{
	abort();
}

#define FN(f) .f = (__typeof__(((struct q4kh_backend_v1 *)0)->f))never_called

static const struct q4kh_backend_v1 table = {
	.struct_size = sizeof(table),
	FN(init), FN(shutdown), FN(last_error), FN(device_count),
	FN(device_info), FN(device_open), FN(device_close), FN(supports_type),
	FN(buffer_alloc), FN(buffer_free), FN(buffer_upload),
	FN(buffer_download), FN(get_rows), .mul_mat = NULL, FN(rms_norm),
	FN(rope), FN(add), FN(mul), FN(scale), FN(glu), FN(copy),
	FN(attention), FN(synchronize),
	.arith = Q4KH_ARITH_EXACT, /* a declaration does not make a table whole */
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_BACKEND,
	.name = "null-func",
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
