/*
 * The rig of the CUDA kernel variant tests (tests/test_cuda_variant_*.c):
 * cuda-mwv, cuda-dp4a and cuda-gemv-iq against the reference cpu plugin's
 * mul_mat. Every plugin is loaded through the real registry from the
 * plugin path make check sets (Q4KHOST_PLUGIN_PATH); a variant is opened
 * on the cuda backend's device 0 with q4kh_kernel_open, so it prepares and
 * runs with the backend's own native handles (ordinal, stream, buffer
 * addresses). The random numbers, the plugin lookup and the device count
 * are cuda_rig.h's.
 *
 * Weights are random valid blocks (random fp16 scales in a sane range,
 * 6-bit scales never zero, random codes), uploaded to both backends.
 *
 * Agreement is the normalised mean squared error
 *     NMSE = sum (gpu - cpu)^2 / sum cpu^2      (double, over all of y)
 *  - below 1e-6 (NMSE_BOUND) for the fp32-activation variants (cuda-mwv,
 *    cuda-gemv-iq): they dequantize every weight exactly as the cpu does
 *    and differ only by fp32 against double accumulation, about 1e-13
 *    here; a wrong scale, code or row costs more than 1e-3;
 *  - below 5e-4 (INT8_BOUND) for cuda-dp4a: rounding activations to int8
 *    per block of 32 (scale max|x| / 127) adds an error of variance
 *    (max|x| / 127)^2 / 12 per value, an NMSE near 1.4e-5 for activations
 *    in +-[0.1, 1) (E x^2 = 0.37); 5e-4 is llama.cpp's bound for quantized
 *    matrix products.
 * No output may be NaN. Every output buffer is poisoned (0xFF bytes, NaN)
 * before each run, with POISON_LEAD bytes before the view, padding between
 * its columns and GUARD bytes after it; all of them must stay poison, and
 * every element of the view must have been written.
 *
 * Without a CUDA device (CI) vrig_open skips the test with the backend's
 * reason; what needs only the plugins' tables (vrig_scan) runs everywhere.
 */
#ifndef Q4KH_TEST_CUDA_VARIANT_RIG_H
#define Q4KH_TEST_CUDA_VARIANT_RIG_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "cuda_rig.h"
#include "kernel.h"
#include "q4khost/plugin.h"
#include "registry.h"

#define INT8_BOUND 5e-4

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* --- the variants and what they must declare --- */

struct variant {
	const char *name;
	uint32_t types[2];
	uint32_t n_types;
	double bound; /* of the NMSE */
};

extern const struct variant mwv, dp4a, iq;
extern const struct variant *const variants[3];

#define N_VARIANTS N_OF(variants)

/* N random valid rows of K values of TYPE (Q4_K, Q6_K, IQ4_NL or IQ4_XS),
 * packed; free() them. */
uint8_t *random_blocks(uint32_t type, int64_t k, int64_t n);

/* --- the registry, the two backends, a variant --- */

/* The variants' rig. */
struct vrig {
	struct q4kh_config *config;
	struct q4kh_registry *reg;
	struct q4kh_backend cpu, gpu;
};

/*
 * The registry only, with [plugin.NAME] warps = WARPS for every variant
 * (NULL: unset) and no config file of this machine; the backends stay
 * closed.
 */
void vrig_scan(struct vrig *r, const char *warps);
/* Both backends on device 0 as well; skips without a CUDA device. */
void vrig_open(struct vrig *r, const char *warps);
void vrig_close(struct vrig *r);
/* Variant V on R's cuda backend, into K. */
void kernel_open(struct vrig *r, const struct variant *v, struct q4kh_kernel *k);
/* The random numbers seeded with SEED, R open (warps unset) and variant V
 * on it in K; variant_close closes both. */
void variant_open(struct vrig *r, const struct variant *v, long seed, struct q4kh_kernel *k);
void variant_close(struct vrig *r, struct q4kh_kernel *k);

/* --- views in poisoned buffers --- */

struct view {
	struct q4kh_tensor t;
	uint64_t size;  /* of its buffer */
	uint8_t *bytes; /* what was uploaded: the whole buffer */
};

/*
 * An {ne0, ne1} tensor of TYPE on backend B, columns NB1 bytes apart, at
 * offset POISON_LEAD of a buffer of poison that reaches GUARD bytes past
 * it; DATA (columns packed) fills the view unless NULL.
 */
struct view put(struct q4kh_backend *b, uint32_t type, int64_t ne0, int64_t ne1,
                int64_t nb1, const void *data);
void drop(struct q4kh_backend *b, struct view *v);
/* The whole buffer of v as it is now (waits for the ops before it). */
uint8_t *fetch(struct q4kh_backend *b, const struct view *v);
/* Is byte i of the buffer inside v's view? */
int in_view(const struct view *v, uint64_t i);
/* y[row, col] of an f32 view V in RAW, its whole buffer. */
float f32_at(const struct view *v, const uint8_t *raw, int64_t row, int64_t col);

/* --- one multiplication, both ways --- */

struct weight {
	const struct variant *v;
	uint32_t type;
	int64_t k, n;
	struct view cpu, gpu;
	q4kh_prepared *p;
};

/*
 * A random {KK, N} weight of TYPE on both backends, rows PAD bytes apart
 * beyond their length, prepared by variant V (open in K).
 */
void weight_new(struct vrig *r, struct q4kh_kernel *k, const struct variant *v,
                uint32_t type, int64_t kk, int64_t n, int64_t pad, struct weight *w);
/* Release it; the backend's copy must be exactly what was uploaded. */
void weight_free(struct vrig *r, struct q4kh_kernel *k, struct weight *w);
/*
 * The gpu's y against the cpu's (f32 views of one shape): every element
 * of the view written (not NaN), no byte of its buffer outside it; returns
 * the NMSE. WHAT names the product in a failure.
 */
double nmse(struct vrig *r, const struct view *yc, const struct view *yg, const char *what);
/*
 * y = w x for T columns of XV on both backends, through gemv (GEMV) or
 * gemm; their nmse().
 */
double multiply(struct vrig *r, struct q4kh_kernel *k, const struct weight *w,
                int64_t t, const float *xv, int gemv);

/* Status ST must be WANT (INVALID or UNSUPPORTED), with a last_error of
 * K holding NEEDLE. */
void expect_error(struct q4kh_kernel *k, q4kh_status st, q4kh_status want,
                  const char *needle);
/* ST, a call of K's after refused ones, must succeed, and R's cuda
 * device then synchronise cleanly. */
void expect_good_call(struct vrig *r, struct q4kh_kernel *k, q4kh_status st);

#endif
