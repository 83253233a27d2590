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
 * Agreement is judged element by element, as tests/test_cpu_simd.c judges
 * cpu-simd: |gpu - cpu| within a bound derived from the arithmetic, for
 * every element of y: product_bounds.h's, from each group's range s_g
 * decoded from the blocks (the fp32 GEMV for a variant's gemv and its gemm
 * below its tensor-core columns, 9 for cuda-mwv, 17 for the others:
 * q4khost/cuda_tc.h; the tensor cores' from there). cuda-dp4a's GEMV also rounds
 * activations to int8 per block b of 32 (d_b = max_{i in b} |x_i| / 127):
 * a value moves by at most d_b / 2, so y by at most
 * sum_b d_b / 2 sum_{i in b} |w_i| <= 16 sum_b d_b s_b.
 * The fp32 bound is about 6e-4 of a typical |y| at K = 640 and 3e-3 at
 * K = 8192 (for this rig's random blocks and activations): one output 1 %
 * off fails. A measured error far below its bound is expected: the bound
 * adds every rounding's worst case, where they mostly cancel. The int8
 * bound is loose by nature (at K = 8192 about |y| itself), and so is the
 * tensor cores' (a third of |y| at K = 8192, mostly for the order of sums
 * that cuBLAS does not say), so those products also keep a normalised mean
 * squared error, sum (gpu - cpu)^2 / sum cpu^2 over all of y: below 5e-4
 * for cuda-dp4a's GEMV (INT8_BOUND, llama.cpp's bound for quantized
 * products; the int8 rounding's variance (max|x| / 127)^2 / 12 a value
 * gives about 1.4e-5 for activations in +-[0.1, 1)) and below 1e-6 on
 * tensor cores (FP16_BOUND; fp16 rounding of both operands gives about
 * 1e-7). No output may be NaN. Every output buffer is poisoned (0xFF bytes, NaN)
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
#include "product_bounds.h"
#include "q4khost/plugin.h"
#include "registry.h"

#define INT8_BOUND 5e-4
#define FP16_BOUND 1e-6
#define CV_GROUP 32 /* values of a group of the bounds, and of an int8 block */

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* --- the variants and what they must declare --- */

struct variant {
	const char *name;
	uint32_t types[4];
	uint32_t n_types;
	int int8;           /* its GEMV rounds activations to int8 */
	int64_t tc_columns; /* gemm from this many columns runs on tensor cores */
};

extern const struct variant mwv, dp4a, iq;
extern const struct variant *const variants[3];

#define N_VARIANTS N_OF(variants)

/* Whether V takes weights of TYPE (one of its types). */
int variant_takes(const struct variant *v, uint32_t type);

/* N random valid rows of K values of TYPE (Q4_K, Q6_K, Q5_0, Q8_0, IQ4_NL
 * or IQ4_XS), packed; free() them. */
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
	double *range; /* s_g of each group of 32 values, row by row (above) */
};

/*
 * A random {KK, N} weight of TYPE on both backends, rows PAD bytes apart
 * beyond their length, prepared by variant V (open in K).
 */
void weight_new(struct vrig *r, struct q4kh_kernel *k, const struct variant *v,
                uint32_t type, int64_t kk, int64_t n, int64_t pad, struct weight *w);
/* Release it; the backend's copy must be exactly what was uploaded. */
void weight_free(struct vrig *r, struct q4kh_kernel *k, struct weight *w);
/* How far a product's y came from the cpu's. */
struct agreement {
	double nmse;  /* sum (gpu - cpu)^2 / sum cpu^2 */
	double worst; /* the largest |gpu - cpu| over its element's bound */
};

/*
 * The gpu's y against the cpu's (f32 views of one shape) for w (T columns
 * of activations XV, through gemv when GEMV, else gemm): every element of
 * the view written (not NaN) and within its bound (above), no byte of its
 * buffer outside the view, and the NMSE below INT8_BOUND or FP16_BOUND
 * where they apply. WHAT names the product in a failure.
 */
struct agreement agree(struct vrig *r, const struct weight *w, const float *xv, int64_t t,
                       int gemv, const struct view *yc, const struct view *yg,
                       const char *what);
/* y = w x for T columns of XV on both backends, through gemv (GEMV) or
 * gemm; their agree(). */
struct agreement multiply(struct vrig *r, struct q4kh_kernel *k, const struct weight *w,
                          int64_t t, const float *xv, int gemv);

/* Status ST must be WANT (INVALID or UNSUPPORTED), with a last_error of
 * K holding NEEDLE. */
void expect_error(struct q4kh_kernel *k, q4kh_status st, q4kh_status want,
                  const char *needle);
/* ST, a call of K's after refused ones, must succeed, and R's cuda
 * device then synchronise cleanly. */
void expect_good_call(struct vrig *r, struct q4kh_kernel *k, q4kh_status st);

#endif
