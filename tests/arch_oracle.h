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
#include "model.h"

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
/*
 * What a path's arithmetic adds to the float64 forward pass, the bound of
 * check_exact_on. Every path here keeps its KV cache in F16; flags add:
 *   ARITH_INT16  products of activations rounded to int16 codes in blocks
 *                of 32, scale max|x| / 32639 (cpu-simd);
 *   ARITH_FP16   a prompt's products on tensor cores (weights and
 *                activations rounded to fp16), FlashAttention's q and
 *                softmax weights in fp16, the LM head's product too (cuda).
 *
 * The bound. With e our logits' error against the exact z, 1 - cosine is
 * |e_perp|^2 / (2 |z|^2) <= delta^2 / 2 to second order, delta = |e| / |z|.
 * One rounding of a tensor moves it by a relative error of mean square
 *   - fp16: at most u16^2 / 3, u16 = 2^-11: uniform within half an ulp,
 *     which is at most u16 |x|;
 *   - integer codes in blocks of 32 with scale d = max|x| / Q: a uniform
 *     error within d / 2 per value, 32 d^2 / 12 per block, and max|x|^2 is
 *     at most the block's sum of squares: at most (8/3) / Q^2;
 *   - float32 accumulation: about n u^2 / lanes for a dot product of n
 *     terms summed in lanes partial sums, below 1e-11 for every product
 *     here (n <= 2048, u = 2^-24): left out.
 * A product, an attention or a cache read carries its inputs' relative
 * error to its output (errors in no preferred direction: neither cancelled
 * nor amplified), a layer's branch adds to the residual stream no more
 * than the stream's own norm (pre-norm blocks), and roundings are
 * independent, so their mean squares add, and the final norm and the LM
 * head keep the relative error. Hence 1 - cosine <= (1/2) sum of the mean
 * squares, with L layers of which L_att attend (the rest are qwen35's
 * linear-attention layers, f32 states), and at most 8 products a layer
 * (q, k, v, o, or qwen35's 5 projections; gate, up, down, or qwen3moe's
 * experts' gate, up and down beside its F32 router, which no path rounds)
 * and the LM head:
 *   F16 cache (K and V):  2 L_att u16^2 / 3 / 2
 *   ARITH_INT16:          (8 L + 1) (8/3) / 32639^2 / 2
 *   ARITH_FP16:           (2 (8 L + 1) + 2 L_att) u16^2 / 3 / 2
 * Measured on cpu-fast (2026-12-06, AVX2), largest 1 - cosine over every
 * row of every case, against the bound:
 *   tiny llama, qwen2, qwen3, llama-ropefreqs, qwen2-yarn (L_att = 4):
 *     built-in 2.4e-8 to 4.2e-8 of 3.2e-7, cpu-simd 2.7e-8 to 5.4e-8 of 3.6e-7;
 *   tiny qwen35 (L_att = 2 of 4): 6.3e-9 of 1.6e-7, 8.0e-9 of 2.0e-7 (its
 *     attention's output is gated by a sigmoid: a smaller branch);
 *   tiny qwen3moe (L_att = 4): 1.6e-8 of 3.2e-7, 1.5e-8 of 3.6e-7;
 *   gemma3, gemma3-new (Gemma 3 270M, L_att = 18): built-in 2.7e-7 and
 *     4.4e-7 of 1.4e-6, cpu-simd 1.5e-7 and 2.6e-7 of 1.6e-6.
 * The exact cpu reference with this F16 cache measures as cpu-fast does
 * (2.9e-8 on tiny llama, 2.2e-7 on gemma3): the cache is the error.
 */
#define ARITH_INT16 1u
#define ARITH_FP16 2u

/* The bound above on 1 - cosine against the exact result, for model M
 * on a path of the ARITH_ flags. */
double arch_exact_bound(const struct q4kh_model *m, unsigned arith);

/*
 * Model MODEL_PATH against the float64 fixture oracle-f64-NAME
 * (scripts/oracle-f64.py) on BACKEND as check_on opens it: every case's
 * prompt in one batched prefill, then a decode step on each of the
 * fixture's greedy tokens, and at every row 1 - cosine(ours, exact) within
 * the bound above for ARITH (ARITH_ flags). The largest distance and the
 * bound go to stderr.
 */
void check_exact_on(const char *model_path, const char *name, const char *plugin_path,
                    const char *backend, const char *variant, unsigned arith);

#endif
