/*
 * Test plugin: exports the ABI 1 entry, but its descriptor declares a
 * struct_size that ends before the function tables, as a plugin built
 * against a broken header would. The host must read nothing past it.
 */
#include <stddef.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

static const struct q4kh_plugin_desc desc = {
	.struct_size = offsetof(struct q4kh_plugin_desc, backend),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_BACKEND,
	.name = "truncated",
	.version = "1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
};

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc;
}
