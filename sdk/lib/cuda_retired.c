/*
 * Retired device memory (cuda_retired.h): outgrown scratch, kept until
 * close or shutdown.
 */
#include "buildconf.h"

#include <stdlib.h>

#include "cuda_retired.h"

int cuda_retired_reserve(const void *old, struct cuda_retired **node)
{
	*node = old ? malloc(sizeof(**node)) : NULL;
	return old && !*node ? -1 : 0;
}

void cuda_retire(struct cuda_retired **list, struct cuda_retired *node, void *old)
{
	if (!node)
		return;
	node->ptr = old;
	node->next = *list;
	*list = node;
}

void *cuda_retired_pop(struct cuda_retired **list)
{
	struct cuda_retired *r = *list;
	void *p;

	if (!r)
		return NULL;
	p = r->ptr;
	*list = r->next;
	free(r);
	return p;
}
