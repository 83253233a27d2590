/*
 * What every op checks before it touches memory: the SDK's contract checks
 * (q4khost/contract.h), which the reference makes too, so cpu-fast refuses
 * exactly what cpu refuses, with the same one line.
 */
#include "fast.h"

struct q4kh_check fast_contract(q4kh_device_ctx *dev)
{
	return q4kh_cpu_check(dev, q4kh_dequant_types(), dev ? dev->ctx->error : NULL,
	                      dev ? sizeof(dev->ctx->error) : 0);
}

q4kh_status fast_index_values(q4kh_device_ctx *dev, const char *what,
                              const struct q4kh_tensor *t, int64_t limit)
{
	const struct q4kh_check c = fast_contract(dev);

	return q4kh_cpu_index_values(&c, what, t, limit);
}
