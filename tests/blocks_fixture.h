/*
 * tests/fixtures/dequant-blocks.txt (scripts/gen-blocks-fixture.py): a few
 * rows of every weight type q4khost multiplies, as GGUF stores them, and
 * gguf-py's dequantized values of them. Read by the suites that check a
 * backend's or a kernel variant's get_rows and mul_mat per type.
 */
#ifndef Q4KH_TEST_BLOCKS_FIXTURE_H
#define Q4KH_TEST_BLOCKS_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

struct blocks_tensor {
	uint32_t type;      /* Q4KH_TYPE_* */
	const char *name;   /* GGUF's name of type */
	int64_t ne0, rows;
	uint8_t *bytes;     /* rows * row_bytes, as in a GGUF file */
	size_t size, row_bytes;
	float *values;      /* ne0 * rows, row after row: gguf-py's */
};

struct blocks_fixture {
	size_t n;
	struct blocks_tensor t[16];
};

/* Read the whole fixture; fails the test (Criterion) on a bad file. */
void blocks_fixture_load(struct blocks_fixture *f);
void blocks_fixture_free(struct blocks_fixture *f);

/* The fixture's tensor of TYPE, or NULL. */
const struct blocks_tensor *blocks_fixture_find(const struct blocks_fixture *f, uint32_t type);

#endif
