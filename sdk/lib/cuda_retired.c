/*
 * Retired device memory (q4khost/cuda_retired.h): outgrown scratch, kept until
 * close or shutdown.
 */
#include "buildconf.h"

#include <stdlib.h>

#include "q4khost/cuda_retired.h"

int q4kh_retired_reserve(const void *old, struct q4kh_retired **node)
{
	*node = old ? malloc(sizeof(**node)) : NULL;
	return old && !*node ? -1 : 0;
}

void q4kh_retire(struct q4kh_retired **list, struct q4kh_retired *node, void *old)
{
	if (!node)
		return;
	node->ptr = old;
	node->next = *list;
	*list = node;
}

void *q4kh_retired_pop(struct q4kh_retired **list)
{
	struct q4kh_retired *r = *list;
	void *p;

	if (!r)
		return NULL;
	p = r->ptr;
	*list = r->next;
	free(r);
	return p;
}
