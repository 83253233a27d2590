/*
 * The op contract as the cpu backend applies it: every op checks its
 * arguments through q4khost/contract.h before it touches memory, with the
 * messages written straight into the context's last error.
 */
#include "cpu.h"

struct q4kh_check cpu_contract(q4kh_device_ctx *dev)
{
	return q4kh_cpu_check(dev, q4kh_dequant_types(), dev ? dev->ctx->error : NULL,
	                      dev ? sizeof(dev->ctx->error) : 0);
}

q4kh_status cpu_index_values(q4kh_device_ctx *dev, const char *what,
                             const struct q4kh_tensor *t, int64_t limit)
{
	const struct q4kh_check c = cpu_contract(dev);

	return q4kh_cpu_index_values(&c, what, t, limit);
}
