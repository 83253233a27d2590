#include "blocks_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "q4khost/quant.h"

static uint32_t type_by_name(const char *name)
{
	for (uint32_t t = 0; t < Q4KH_TYPE_COUNT; t++)
		if (q4kh_type_name(t) && !strcmp(q4kh_type_name(t), name))
			return t;
	cr_assert_fail("blocks fixture: unknown type %s", name);
	return 0;
}

static void read_tensor(FILE *f, struct blocks_tensor *t)
{
	char name[16];

	cr_assert_eq(fscanf(f, " tensor %15s %lld %lld", name, (long long *)&t->ne0,
	                    (long long *)&t->rows),
	             3, "blocks fixture: bad tensor line");
	t->type = type_by_name(name);
	t->name = q4kh_type_name(t->type);
	t->row_bytes = (size_t)(t->ne0 / q4kh_type_block_elems(t->type)) *
	               q4kh_type_block_bytes(t->type);
	t->size = t->row_bytes * (size_t)t->rows;
	t->bytes = malloc(t->size);
	t->values = malloc(sizeof(float) * (size_t)(t->ne0 * t->rows));
	cr_assert(t->bytes && t->values);
	cr_assert_eq(fscanf(f, " bytes"), 0);
	for (size_t i = 0; i < t->size; i++)
		cr_assert_eq(fscanf(f, "%2hhx", &t->bytes[i]), 1, "blocks fixture: %s: byte %zu",
		             t->name, i);
	cr_assert_eq(fscanf(f, " values"), 0);
	for (int64_t i = 0; i < t->ne0 * t->rows; i++)
		cr_assert_eq(fscanf(f, "%f", &t->values[i]), 1, "blocks fixture: %s: value %lld",
		             t->name, (long long)i);
}

void blocks_fixture_load(struct blocks_fixture *bf)
{
	char path[4096], line[512];
	long long count;
	FILE *f;

	snprintf(path, sizeof(path), "%s/tests/fixtures/dequant-blocks.txt", test_srcdir());
	f = fopen(path, "r");
	cr_assert_not_null(f, "cannot open %s", path);
	do
		cr_assert_not_null(fgets(line, sizeof(line), f), "%s: empty", path);
	while (line[0] == '#');
	cr_assert_str_eq(line, "q4khost-blocks-fixture 1\n", "%s: header", path);
	cr_assert_eq(fscanf(f, "tensors %lld", &count), 1);
	cr_assert(count > 0 && count <= (long long)(sizeof(bf->t) / sizeof(bf->t[0])),
	          "%s: %lld tensors", path, count);
	bf->n = (size_t)count;
	for (size_t i = 0; i < bf->n; i++)
		read_tensor(f, &bf->t[i]);
	fclose(f);
}

void blocks_fixture_free(struct blocks_fixture *f)
{
	for (size_t i = 0; i < f->n; i++) {
		free(f->t[i].bytes);
		free(f->t[i].values);
	}
	f->n = 0;
}

const struct blocks_tensor *blocks_fixture_find(const struct blocks_fixture *f, uint32_t type)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->t[i].type == type)
			return &f->t[i];
	return NULL;
}
