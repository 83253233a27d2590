/*
 * Test plugin: a name that is no identifier. It would end up in config
 * section names and messages, so the host refuses it.
 */
#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = Q4KH_KIND_KERNEL,
	.name = "../Evil Name",
	.version = "1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
};

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc;
}
