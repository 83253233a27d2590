/*
 * A fixture of final hidden states, as scripts/gen-oracle-fixture.py,
 * scripts/gen-arch-fixtures.py and scripts/oracle-f64.py record them:
 * tests/fixtures/NAME.json (the cases, n_embd, n_vocab, hidden_rows) and
 * NAME.bin (hidden_rows rows of n_embd float32 values, little-endian,
 * row-major). The one loader of tests/test_oracle.c and tests/arch_oracle.c
 * (test_archs, test_cuda_archs).
 */
#ifndef Q4KH_TEST_HIDDEN_FIXTURE_H
#define Q4KH_TEST_HIDDEN_FIXTURE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct hidden_fixture {
	json_t *root;
	float *hidden; /* rows x n_embd */
	size_t rows;
	int64_t n_embd, n_vocab;
};

/* tests/fixtures/NAME under the source tree; free() it. */
char *fixture(const char *name);
/* NAME.json and NAME.bin into O; fails the test when they do not read or
 * the .bin is not hidden_rows rows of n_embd floats. */
void hidden_fixture_load(const char *name, struct hidden_fixture *o);
void hidden_fixture_free(struct hidden_fixture *o);

#endif
