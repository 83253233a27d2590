/*
 * What the cpu-fast suites (tests/test_cpu_fast_*.c, one program:
 * test_cpu_fast) share: cpu-fast.so opened on an instruction set, tensors
 * in its buffers, random values and the float64 checks of RoPE.
 */
#ifndef Q4KH_TEST_CPU_FAST_RIG_H
#define Q4KH_TEST_CPU_FAST_RIG_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>

#include "q4khost/plugin.h"

/* float32's unit roundoff. */
#define U 0x1p-24

/* cpu-fast.so loaded, and (env_open) its backend and device open. */
struct env {
	void *dl;
	const struct q4kh_plugin_desc *desc;
	const struct q4kh_backend_v1 *b;
	struct q4kh_host_api api;
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev;
	const char *isa, *threads, *spin;
};

/* cpu-fast loaded with 2 threads and no instruction set asked for; not
 * initialised. */
struct env *env_load(void);

/* Init with the settings in E; the status of init. */
q4kh_status env_init(struct env *e);

/* cpu-fast on instruction set ISA (NULL: its own pick), device 0 open. */
struct env *env_open(const char *isa);

void env_close(struct env *e);

/* Does this CPU run ISA (cpu-fast's name)? Asked of libgcc. */
int cpu_runs(const char *isa);

/* cpu-fast's instruction sets: "avx2", "avx512". */
extern const char *const isas[2];

/* An env on the instruction set cpu-fast picks itself; skips the test on
 * a CPU without AVX2, where cpu-fast has no device. */
struct env *env_open_default(void);

/* The body once per instruction set this CPU runs, with env E open on it
 * and its name isas[isa_]. */
#define FOR_EACH_ISA(e)                                                      \
	for (int isa_ = 0; isa_ < 2; isa_++)                                 \
		if (!cpu_runs(isas[isa_]))                                   \
			continue;                                            \
		else                                                         \
			for (struct env *e = env_open(isas[isa_]); e;        \
			     env_close(e), e = NULL)

/* A contiguous tensor of TYPE {ne0, ne1, ne2} in a new buffer, holding
 * DATA when not NULL. */
struct q4kh_tensor tensor(struct env *e, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                          const void *data);

/* T's bytes, malloc()ed. */
void *fetch(struct env *e, const struct q4kh_tensor *t);

/* Free T's buffer. */
void drop(struct env *e, struct q4kh_tensor *t);

/* The next of one xorshift sequence shared by the suites: [-1, 1). */
double uniform(void);

/* N values uniform in [-SCALE, SCALE), malloc()ed. */
float *randoms(int64_t n, double scale);

#define EXPECT_NEAR(got, exact, bound, fmt, ...)                               \
	cr_expect(fabs((double)(got) - (exact)) <= (bound),                    \
	          fmt ": %.9g, float64 %.9g, error %.3g > bound %.3g", __VA_ARGS__, \
	          (double)(got), (double)(exact), fabs((double)(got) - (exact)), \
	          (double)(bound))

/*
 * GOT, x {hd, heads, T} rotated at POS with P (frequency factors FF or
 * NULL), against float64: within the rounding of the angles, the values
 * past n_rot passed through. WHAT names the case.
 */
void expect_rope(const struct q4kh_rope_params *p, const float *ff, const int32_t *pos,
                 int64_t hd, int64_t heads, int64_t T, const float *x, const float *got,
                 const char *what);

#endif
