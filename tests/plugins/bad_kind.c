/* Test plugin: a full-size descriptor of a kind that ABI 1 does not know. */
#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = Q4KH_ABI_MINOR,
	.kind = 7,
	.name = "bad-kind",
	.version = "1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
};

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc;
}
