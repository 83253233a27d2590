/*
 * A kernel variant's ABI 1.4 products on whole steps, shared by
 * tests/test_graph.c (the reference cpu through cpu-simd) and
 * tests/test_cuda_graph.c (cuda through cuda-mwv, on the GPU machine).
 * Each expect_* runs a model on BACKEND of REG through VARIANT, a prompt
 * and decode steps, and fails the calling Criterion test where the
 * entry's calls or logits are not what they should be; EXACT: every step
 * runs the interpreter (no replayed step), so the calls are counted
 * exactly.
 */
#ifndef Q4KH_TEST_GRAPH_PRODUCTS_H
#define Q4KH_TEST_GRAPH_PRODUCTS_H

#include "registry.h"

/* FILE: a fixture's name (tests/fixtures), or a path (from /); allocated. */
char *graph_model_file(const char *file);

/* One of the expect_* below. */
typedef void (*expect_fn)(struct q4kh_registry *reg, const char *backend, const char *variant,
                          int exact);

/*
 * tiny-qwen2: with gemv_multi, every layer's q, k, v (with biases) and
 * gate, up go as one call each, with the logits of the variant seen as
 * ABI 1.3 and of one that refuses three matrices.
 */
void expect_grouping(struct q4kh_registry *reg, const char *backend, const char *variant,
                     int exact);

/*
 * tiny-qwen2 (SwiGLU): with gemv_glu, every layer's gate, up and GLU go
 * as one call, with the logits of the variant without the entry and of
 * one that refuses it.
 */
void expect_glu(struct q4kh_registry *reg, const char *backend, const char *variant,
                int exact);

/*
 * Gemma 3 (the default model): q, k, v as one gemv_multi and gate, up,
 * tanh GELU as one gemv_glu a layer, with the logits of the variant seen
 * as ABI 1.3.
 */
void expect_gemma3_products(struct q4kh_registry *reg, const char *backend,
                            const char *variant, int exact);

#endif
