#include "weight_types.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "q4khost/quant.h"

/* In the order docs/architecture.md lists them: floats, the legacy
 * quants, the K-quants, the i-quants. */
static const uint32_t supported[] = {
	Q4KH_TYPE_F32,  Q4KH_TYPE_F16,  Q4KH_TYPE_BF16,   Q4KH_TYPE_Q4_0,   Q4KH_TYPE_Q4_1,
	Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q8_0,   Q4KH_TYPE_Q2_K,   Q4KH_TYPE_Q3_K,
	Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_K, Q4KH_TYPE_Q6_K,   Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS,
};

#define N_SUPPORTED (sizeof(supported) / sizeof(supported[0]))

int q4kh_weight_type_supported(uint32_t type)
{
	for (size_t i = 0; i < N_SUPPORTED; i++)
		if (supported[i] == type)
			return 1;
	return 0;
}

const char *q4kh_weight_types_list(char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = 0;
	for (size_t i = 0; i < N_SUPPORTED && used < cap; i++)
		used += (size_t)snprintf(buf + used, cap - used, "%s%s",
		                         !i ? "" : i + 1 < N_SUPPORTED ? ", " : " and ",
		                         q4kh_type_name(supported[i]));
	return buf;
}

const struct q4kh_gguf_tensor *q4kh_weight_types_unsupported(const struct q4kh_gguf *g,
                                                              uint64_t *count)
{
	const struct q4kh_gguf_tensor *first = NULL;
	uint64_t n = 0;

	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (!q4kh_weight_type_supported(g->tensors[i].type)) {
			first = first ? first : &g->tensors[i];
			n++;
		}
	if (count)
		*count = n;
	return first;
}

int q4kh_weight_types_check(const struct q4kh_gguf *g, struct q4kh_error *err)
{
	uint64_t n;
	const struct q4kh_gguf_tensor *t = q4kh_weight_types_unsupported(g, &n);
	char list[256], more[64] = "";

	if (!t)
		return 0;
	if (n > 1)
		snprintf(more, sizeof(more), " (%" PRIu64 " tensors of such types in all)", n);
	return q4kh_fail(err,
	                 "%s: tensor %.*s has type %s (GGUF type %" PRIu32 "), which q4khost "
	                 "does not run%s; it runs %s: re-quantize the model to one of them "
	                 "with llama.cpp's llama-quantize (llama-quantize "
	                 "--allow-requantize IN.gguf OUT.gguf Q4_K_M)",
	                 g->path, (int)(t->name.len < 200 ? t->name.len : 200), t->name.data,
	                 q4kh_type_name(t->type), t->type, more,
	                 q4kh_weight_types_list(list, sizeof(list)));
}
