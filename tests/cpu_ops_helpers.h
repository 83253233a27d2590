/*
 * What the suites of the reference cpu plugin share (tests/test_cpu_ops*.c):
 * the plugin loaded the way the host loads it (dlopen of the built cpu.so,
 * the entry symbol, init with a test host API), random inputs from one
 * seeded generator, quantized rows packed from chosen integer codes with
 * their exact values, tensors in plugin buffers poisoned with NaN, and the
 * attention and delta_net workloads a suite and the determinism test both
 * run.
 */
#ifndef Q4KH_TEST_CPU_OPS_HELPERS_H
#define Q4KH_TEST_CPU_OPS_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "q4khost/plugin.h"

/* --- the plugin under a test host --------------------------------------- */

/* The cpu plugin loaded as the host loads it, its backend and device 0. */
struct env {
	void *dl;
	const struct q4kh_plugin_desc *desc;
	const struct q4kh_backend_v1 *b;
	struct q4kh_host_api api;
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev;
	const char *threads;
};

/* Load the plugin and find its entry, without init (env_open does both). */
void env_load(struct env *e);

/* Load, init with THREADS (NULL: unset) and open device 0. */
struct env *env_open(const char *threads);

/* Close the device, shut the plugin down, unload it and free E. */
void env_close(struct env *e);

/* --- random numbers and fp16, independent of the plugin ------------------ */

/* The state of the generator behind every random input: a test sets
 * it first, so its inputs are the same on every run. */
extern uint64_t rng_state;

/* binary16 of x, rounded to nearest even, from frexp/ldexp. */
uint16_t ref_to_half(double x);

/* The exact value of binary16 H. */
double ref_from_half(uint16_t h);

/* --- quantized rows, packed from chosen codes ---------------------------- */

/* The weight types the reference backend supports. */
extern const uint32_t all_types[8];

/* --- tensors in plugin buffers ------------------------------------------- */

/*
 * A tensor of TYPE {ne0, ne1, ne2} in a buffer of its own, rows PAD bytes
 * apart beyond their size, filled with DATA (contiguous) or NaN bytes.
 */
struct q4kh_tensor make_tensor(struct env *e, uint32_t type, int64_t ne0,
                               int64_t ne1, int64_t ne2,
                               const void *data, int64_t pad);

/* An F32 tensor, rows contiguous (make_tensor without padding). */
struct q4kh_tensor f32_tensor(struct env *e, int64_t ne0, int64_t ne1,
                              int64_t ne2, const float *data);

/* The f32 values of t, rows packed. */
float *fetch(struct env *e, const struct q4kh_tensor *t);

/* Free t's buffer. */
void drop(struct env *e, struct q4kh_tensor *t);

/* N values uniform in +-[0.1, 1) from the shared generator; free() them. */
float *random_floats(size_t n);

/* Compare got with want within atol + rtol |want|; every element written. */
void expect_close(const char *what, const float *got, const double *want,
                  size_t n, double rtol, double atol);

/* ST is Q4KH_ERR_INVALID and last_error names NEEDLE. */
void expect_status(struct env *e, q4kh_status st, const char *needle);

/* --- workloads the suites share ----------------------------------------- */

/* A random {K, N} weight of TYPE: a tensor and its exact values. */
struct q4kh_tensor make_weight(struct env *e, uint32_t type, int64_t k,
                               int64_t n, double **exact);

/* One attention case: shapes, parameters, the cache type. */
struct attn_case {
	int64_t hd, nh, nkv, T, n_ctx;
	struct q4kh_attn_params p;
	uint32_t kv_type;
	const int32_t *pos; /* attention_ext's positions; NULL: attention, pos0 */
	int cancel;         /* big terms that cancel in pairs (an f32 cache):
	                       the order of sums then shows in float */
	/* attention_paged too (ABI 1.8) when page_size > 0: the cache's rows
	 * scattered over pools of pool_pages pages (NaN wherever no key of
	 * the table is) through the block table pages[0 .. n_pages), which
	 * covers n_ctx positions */
	int32_t page_size, pool_pages, n_pages;
	const int32_t *pages;
};

/*
 * The dot product of A and B (N values) in double, in the reference's
 * order of sums (plugins/cpu/cpu_lanes.h): product i in lane i mod 8,
 * each lane in increasing i, the lanes in the tree ((0 + 1) + (2 + 3)) +
 * ((4 + 5) + (6 + 7)). Its caller's bits match the plugin's only where
 * the compiler fuses no multiply-add (-ffp-contract=off, as the plugin).
 */
double ref_lanes_dot(const float *a, const double *b, int64_t n);

/*
 * Random q and caches; out and the float64 reference, computed in the
 * order the plugin's header states (each score a ref_lanes_dot times the
 * scale, then the soft cap; the exponentials, their sum and each
 * dimension's weighted sum in increasing key position), so that rounded
 * to float it is the plugin's output bit for bit. With c->page_size, the
 * same queries through attention_paged must give attention's (or
 * attention_ext's) bits, asserted here; out is then the paged output.
 */
void run_attention(struct env *e, const struct attn_case *c, float **got,
                   double **want);

/* One delta_net case: shapes and its inputs. */
struct delta_case {
	int64_t sk, sv, hk, hv, T;
	float *q, *k, *v, *g, *beta, *s0; /* packed */
};

/* Random inputs: q and k of norm 1, as the layer gives them; log decays
 * in (-2, 0); beta in (0, 1). */
void delta_inputs(struct delta_case *c);

/* Free the inputs delta_inputs made. */
void delta_free(struct delta_case *c);

/* Run delta_net on tokens [t0, t0 + n) of c against STATE; returns out. */
float *run_delta(struct env *e, const struct delta_case *c, struct q4kh_tensor *state,
                 int64_t t0, int64_t n, float scale);

#endif
