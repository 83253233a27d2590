/*
 * The rig of the cuda op tests: the reference cpu plugin and the cuda
 * plugin, both loaded through the real registry from the plugin path that
 * make check sets (Q4KHOST_PLUGIN_PATH), fed the same fresh random inputs,
 * and their outputs compared.
 *
 * Agreement is measured as the normalised mean squared error
 *     NMSE = sum_i (cuda_i - cpu_i)^2 / sum_i cpu_i^2     (in double)
 * and must stay below 1e-6 (NMSE_BOUND) for every op with fp32 activations:
 * the cuda kernels accumulate in fp32 where the cpu accumulates in double,
 * which costs about 1e-7 relative per element, far inside the bound, while
 * a wrong block, scale, stride or mask costs more than 1e-3. Ops that round
 * once from exactly computed values (get_rows, add, mul, scale, copy) must
 * agree bit for bit. No output may hold a NaN.
 *
 * Every output buffer is poisoned (0xFF bytes, a NaN in f32 and f16) before
 * the op, with POISON_LEAD bytes before the view and GUARD bytes after it;
 * afterwards every element of the view must have been written and every
 * other byte (lead, padding between rows, guard) must still be poison.
 *
 * Without a CUDA device (CI) rig_open skips the test with the reason the
 * plugin gives. Criterion runs each test in a process of its own; the
 * random numbers are one stream per process.
 *
 * The kernel variants' rig (cuda_variant_rig.h) builds on the random
 * numbers, the plugin lookup and the device count here.
 */
#ifndef Q4KH_TEST_CUDA_RIG_H
#define Q4KH_TEST_CUDA_RIG_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "q4khost/plugin.h"
#include "registry.h"

#define NMSE_BOUND 1e-6
#define POISON 0xFF
#define POISON_LEAD 64 /* bytes before every view */
#define GUARD 256      /* bytes after every view */
#define MAX_HEAD_DIM 4096 /* the cuda attention kernel's (cuda_kernels.h) */

enum { REF = 0, GPU = 1 }; /* the cpu plugin, the cuda plugin */

/* --- random numbers --- */

void rng_seed(long seed);
double urand(void);                    /* [0, 1) */
int64_t irand(int64_t lo, int64_t hi); /* inclusive */
float rval(void);                      /* uniform in +-[0.1, 1) */
float *rvals(size_t n);                /* N rval()s; free() them */

/* --- the two backends --- */

struct rig {
	struct q4kh_registry *reg;
	struct q4kh_backend be[2];
};

/* Plugin NAME of REG; fails the test, with the reason, when it is absent
 * or was rejected. */
const struct q4kh_plugin *find_plugin(const struct q4kh_registry *reg,
                                      const char *name);
/* The plugin path's registry; fails the test on an error. */
struct q4kh_registry *scan(void);
/* Devices the cuda plugin P reports; when none, why into WHY (SIZE bytes). */
uint32_t cuda_devices(const struct q4kh_plugin *p, char *why, size_t size);
/* The cpu and cuda backends on device 0; skips without a CUDA device. */
struct rig *rig_open(void);
void rig_close(struct rig *r);

#define V(r, s) ((r)->be[s].v)
#define DEV(r, s) ((r)->be[s].dev)
#define ERR(r, s) ((r)->be[s].v->last_error((r)->be[s].ctx))

/* --- tensors on both backends --- */

/* Bytes of a row of K values of TYPE. */
size_t row_bytes(uint32_t type, int64_t k);

/* One tensor in a buffer of its own on each backend, the same bytes. */
struct twin {
	struct q4kh_tensor t[2];
	uint64_t size; /* buffer bytes */
};

/*
 * A {ne0, ne1, ne2} tensor of TYPE, rows PAD bytes apart beyond their
 * length, at offset POISON_LEAD of a buffer of POISON bytes that reaches
 * GUARD bytes past the view. DATA (rows packed) fills the view unless NULL.
 */
struct twin twin_new(struct rig *r, uint32_t type, int64_t ne0, int64_t ne1,
                     int64_t ne2, int64_t pad, const void *data);
struct twin twin_f32(struct rig *r, int64_t ne0, int64_t ne1, int64_t ne2,
                     const float *data);
void twin_free(struct rig *r, struct twin *w);
/* Element i of an f32 or f16 view in RAW (its whole buffer), as a double. */
double element(const struct q4kh_tensor *t, const uint8_t *raw, int64_t i);
/*
 * ROWS rows of K values of TYPE: random bytes everywhere but the fp16
 * scales (quant.h's layouts), set to moderate values so that every weight
 * is finite; free() them. twin_weights puts them in a twin, rows PAD bytes
 * apart beyond their length.
 */
uint8_t *random_weights(uint32_t type, int64_t k, int64_t rows);
struct twin twin_weights(struct rig *r, uint32_t type, int64_t k,
                         int64_t rows, int64_t pad);
/*
 * The cuda output O against the cpu's: every element written (not NaN),
 * nothing outside the view touched, and NMSE <= BOUND, or with BOUND 0 the
 * same bits in every element.
 */
void expect_agree(struct rig *r, const char *what, const struct twin *o,
                  double bound);

/*
 * The cuda output O against WANT, the test's own computation of its
 * elements (in order, ne[0] fastest): every element written, nothing
 * outside the view touched, NMSE <= BOUND against WANT.
 */
void expect_near(struct rig *r, const char *what, const struct twin *o,
                 const double *want, double bound);
/* The elements of side S's view of O, in order; free() them. */
double *twin_values(struct rig *r, const struct twin *o, int s);

/* Both sides' status for one op; the cuda one must succeed. */
#define BOTH(r, call)                                                          \
	do {                                                                   \
		for (int s_ = 0; s_ < 2; s_++)                                 \
			cr_assert_eq(V(r, s_)->call, Q4KH_OK, "%s: %s",        \
			             s_ ? "cuda" : "cpu", ERR(r, s_));         \
	} while (0)
/* The operand X of side s_ inside BOTH. */
#define T(x) (&(x).t[s_])

#endif
