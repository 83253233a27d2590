/*
 * The weight types q4khost runs: those the exact cpu reference implements
 * for get_rows and mul_mat (sdk/lib/dequant.c), so every model that
 * opens can be run and checked (F2) against it. A file holding any tensor
 * of another type is refused when it is opened, in one line that names the
 * tensor, its type and what to do (docs/architecture.md "Weight types").
 */
#ifndef Q4KH_WEIGHT_TYPES_H
#define Q4KH_WEIGHT_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "gguf.h"

/* 1 when q4khost runs weights of GGUF type TYPE. Pure, thread-safe. */
int q4kh_weight_type_supported(uint32_t type);

/*
 * "F32, F16, BF16, Q4_0, ... and IQ4_XS" (GGUF's names, llama.cpp's too)
 * into BUF of CAP bytes, cut to fit; returns BUF. Thread-safe.
 */
const char *q4kh_weight_types_list(char *buf, size_t cap);

/* The first tensor of G whose type q4khost does not run, or NULL; with
 * *count (when not NULL) the number of such tensors. */
const struct q4kh_gguf_tensor *q4kh_weight_types_unsupported(const struct q4kh_gguf *g,
                                                              uint64_t *count);

/*
 * 0 when q4khost runs every tensor of G, else -1 with err:
 * "PATH: tensor NAME has type Q8_K (GGUF type 15), which q4khost does not
 * run (N tensors in all); it runs F32, ...: re-quantize the model to one
 * of them with llama.cpp's llama-quantize (llama-quantize IN.gguf OUT.gguf
 * Q4_K_M)". Thread-safe for distinct err.
 */
int q4kh_weight_types_check(const struct q4kh_gguf *g, struct q4kh_error *err);

#endif
