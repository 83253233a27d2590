/*
 * Test plugin: built for a future plugin ABI 2. It exports
 * q4kh_plugin_entry_v2 only, so a host of ABI 1 must refuse it and name
 * both versions.
 */
#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v2(void);

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = 0,
	.kind = Q4KH_KIND_BACKEND,
	.name = "bad-major",
	.version = "2.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
};

const struct q4kh_plugin_desc *q4kh_plugin_entry_v2(void)
{
	return &desc;
}
