/*
 * The op contract as the cpu backend applies it: every op checks its
 * arguments through q4khost/contract.h before it touches memory, with the
 * messages written straight into the context's last error.
 */
#include "cpu.h"

struct q4kh_check cpu_contract(q4kh_device_ctx *dev)
{
	struct q4kh_check c = {
		.dev = dev,
		.buffer = q4kh_cpu_buffer_owned,
		.weight_types = q4kh_dequant_types(),
		.msg = dev ? dev->ctx->error : NULL,
		.cap = dev ? sizeof(dev->ctx->error) : 0,
	};

	return c;
}

q4kh_status cpu_index_values(q4kh_device_ctx *dev, const char *what,
                             const struct q4kh_tensor *t, int64_t limit)
{
	const struct q4kh_check c = cpu_contract(dev);

	return q4kh_check_index_values(&c, what, (const int32_t *)cpu_row(t, 0, 0, 0),
	                               t->ne[0], limit);
}
