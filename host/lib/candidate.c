#include "candidate.h"

#include <stdio.h>
#include <string.h>

const char *q4kh_candidate_name(const struct q4kh_candidate *c, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/%s", c->backend, c->variant ? c->variant : "built-in");
	return buf;
}

int q4kh_candidate_is_reference(const struct q4kh_candidate *c)
{
	return !strcmp(c->backend, "cpu") && !c->variant;
}
