/*
 * The forward passes of the tiny random-weight models of
 * scripts/gen-tiny-models.py against llama.cpp, through the fixtures
 * scripts/gen-arch-fixtures.py records (tests/fixtures/arch-NAME.json
 * and .bin: each case's prompt, its token ids, llama.cpp's greedy tokens
 * and its final hidden state at every position). A backend passes a case
 * when:
 *   - our tokenizer gives llama.cpp's prompt ids;
 *   - at every prompt position (one batched prefill) and every one of
 *     STEPS decode steps fed llama.cpp's greedy tokens (through the KV
 *     cache and the recurrent states), cosine(ours, llama.cpp) >=
 *     MIN_COSINE, llama.cpp's logits rebuilt from its hidden state
 *     through the Q8_0 LM head in double (test_q8_0_logits);
 *   - our argmax is llama.cpp's next token at every step.
 * The KV cache is F16, as llama.cpp's.
 */
#ifndef Q4KH_TEST_ARCH_ORACLE_H
#define Q4KH_TEST_ARCH_ORACLE_H

#include "hidden_fixture.h"

#define MIN_COSINE 0.999
#define STEPS 16

/* arch-ARCH.json and .bin (hidden_fixture.h) into O; fails the test when
 * they do not read. The caller frees O with hidden_fixture_free. */
void load_oracle(const char *arch, struct hidden_fixture *o);
/*
 * Model tiny-NAME.gguf of architecture ARCH against its fixture on
 * BACKEND (device 0), through kernel variant VARIANT or its built-in
 * kernels (NULL), its plugins found on PLUGIN_PATH (NULL: the test's):
 * every case as above (at least 3), the lowest cosine to stderr.
 */
void check_on(const char *name, const char *arch, const char *plugin_path,
              const char *backend, const char *variant);

#endif
