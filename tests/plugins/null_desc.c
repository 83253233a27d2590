/* Test plugin: the ABI 1 entry returns NULL instead of a descriptor. */
#include <stddef.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return NULL;
}
