/*
 * q4khost's greedy pick, ABI 1.4: the definition of the top2 entry
 * (plugin.h, struct q4kh_backend_v1) as the one scan that the host's
 * q4kh_top2 and an in-tree backend run. Header-only (static inline);
 * link nothing.
 *
 * A host-memory backend implements top2 with it, column by column, and
 * gives the host's result bit for bit (docs/plugin-abi.md, P1); a device
 * backend matches it in its own kernels (the cuda backend's are tested
 * against it, tests/test_cuda_step.c).
 */
#ifndef Q4KHOST_TOP2_H
#define Q4KHOST_TOP2_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The greedy pick of one column: V[0..n) F32, contiguous, n >= 0 (n at
 * most INT32_MAX, as top2 checks; n 0 is a column with no finite value).
 * Returns the index of the largest finite value, the lowest such index
 * on ties, or -1 when no value is finite. NaN, +Inf and -Inf are skipped;
 * -0 and +0 compare equal, so the first of them wins. VAL[0] is that
 * value (its bits as V holds them), VAL[1] the largest finite value of
 * the other indices (again the lowest index's on ties: VAL[1] == VAL[0]
 * when the maximum is tied); each -INFINITY when there is none. No
 * arithmetic, only comparisons: the result does not depend on the
 * compiler's floating-point settings.
 *
 * Reads V, writes VAL[0..2) (which must not overlap V) and nothing else:
 * thread-safe, and columns may be scanned by different threads at once.
 */
static inline int32_t q4kh_top2_scan(const float *v, int64_t n, float val[2])
{
	int32_t best = -1;

	val[0] = val[1] = -INFINITY;
	for (int64_t i = 0; i < n; i++) {
		if (!isfinite(v[i]))
			continue;
		if (best < 0 || v[i] > val[0]) {
			if (best >= 0)
				val[1] = val[0];
			best = (int32_t)i;
			val[0] = v[i];
		} else if (v[i] > val[1]) {
			val[1] = v[i];
		}
	}
	return best;
}

#ifdef __cplusplus
}
#endif

#endif
