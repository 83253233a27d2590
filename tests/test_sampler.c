/*
 * The sampler: greedy rules, seeding, and the empirical distribution against
 * softmax(logits / T) with the top-k and top-p cuts computed here in double.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "sampler.h"

static struct q4kh_sampler *make(float temperature, int32_t top_k,
                                 float top_p, uint64_t seed, int32_t n)
{
	struct q4kh_sampler_params p = { temperature, top_k, top_p, seed };
	struct q4kh_sampler *s = q4kh_sampler_new(&p, n);

	cr_assert_not_null(s);
	return s;
}

Test(sampler, argmax_ties_go_to_the_lowest_id)
{
	const float a[] = { 1.0f, 3.0f, 3.0f, 2.0f, 3.0f };
	const float b[] = { NAN, -1.0f, NAN, -1.0f };
	const float c[] = { NAN, NAN };
	const float d[] = { -INFINITY, -INFINITY, -INFINITY };

	cr_assert_eq(q4kh_argmax(a, 5), 1);
	cr_assert_eq(q4kh_argmax(b, 4), 1);
	cr_assert_eq(q4kh_argmax(c, 2), -1);
	cr_assert_eq(q4kh_argmax(d, 3), 0);
	cr_assert_eq(q4kh_argmax(a, 0), -1);
}

Test(sampler, rejects_an_empty_vocabulary)
{
	struct q4kh_sampler_params p = { 1.0f, 0, 1.0f, 1 };

	cr_assert_null(q4kh_sampler_new(&p, 0));
}

Test(sampler, greedy_equals_argmax_and_skips_nan)
{
	const float l[] = { NAN, 0.5f, 7.0f, NAN, 7.0f, -2.0f };
	struct q4kh_sampler *s = make(0.0f, 0, 1.0f, 42, 6);

	for (int i = 0; i < 10; i++)
		cr_assert_eq(q4kh_sampler_sample(s, l), 2);
	q4kh_sampler_free(s);
}

/* A small LCG for test inputs only (Knuth's MMIX constants). */
static uint64_t lcg(uint64_t *x)
{
	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	return *x >> 33;
}

Test(sampler, top_k_one_is_greedy_at_any_temperature)
{
	const float temps[] = { 0.01f, 0.5f, 1.0f, 10.0f, 1e6f };
	uint64_t x = 7;
	float l[64];

	for (size_t ti = 0; ti < sizeof(temps) / sizeof(temps[0]); ti++) {
		struct q4kh_sampler *s = make(temps[ti], 1, 1.0f, ti, 64);
		for (int rep = 0; rep < 200; rep++) {
			/* few distinct values, so ties for the maximum are common */
			for (int i = 0; i < 64; i++)
				l[i] = (float)(lcg(&x) % 8);
			l[lcg(&x) % 64] = NAN;
			cr_assert_eq(q4kh_sampler_sample(s, l), q4kh_argmax(l, 64),
			             "T=%g rep %d", temps[ti], rep);
		}
		q4kh_sampler_free(s);
	}
}

Test(sampler, never_picks_nan_or_minus_infinity)
{
	const float l[] = { NAN, 1.0f, NAN, -INFINITY, 1.0f, NAN, 0.9f };
	const float top_p[] = { 1.0f, 0.9f, 0.3f };

	for (size_t k = 0; k < 3; k++) {
		struct q4kh_sampler *s = make(5.0f, 0, top_p[k], 3, 7);
		for (int i = 0; i < 5000; i++) {
			int32_t id = q4kh_sampler_sample(s, l);
			cr_assert(id == 1 || id == 4 || id == 6, "picked %d", id);
		}
		q4kh_sampler_free(s);
	}
}

Test(sampler, all_nan_gives_minus_one)
{
	const float l[] = { NAN, NAN, NAN };
	struct q4kh_sampler *s = make(1.0f, 0, 1.0f, 3, 3);

	cr_assert_eq(q4kh_sampler_sample(s, l), -1);
	q4kh_sampler_free(s);
}

static void draw_many(uint64_t seed, int32_t *out, int n)
{
	float l[32];
	struct q4kh_sampler *s = make(1.0f, 0, 1.0f, seed, 32);

	for (int i = 0; i < 32; i++)
		l[i] = 0.0f; /* uniform: every draw carries about 5 bits */
	for (int i = 0; i < n; i++)
		out[i] = q4kh_sampler_sample(s, l);
	q4kh_sampler_free(s);
}

Test(sampler, same_seed_same_sequence_other_seed_differs)
{
	int32_t a[1000], b[1000], c[1000];
	int differ = 0;

	draw_many(1234, a, 1000);
	draw_many(1234, b, 1000);
	draw_many(1235, c, 1000);
	for (int i = 0; i < 1000; i++) {
		cr_assert_eq(a[i], b[i], "draw %d", i);
		differ += a[i] != c[i];
	}
	/* independent streams agree on about 1 draw in 32 */
	cr_assert(differ > 900, "seeds 1234 and 1235 differ in %d of 1000",
	          differ);
}

/* --- the distribution ---------------------------------------------------- */

#define NTOK 5

/* softmax(l / T) over the top_k largest, then the smallest prefix reaching
 * top_p, renormalised: the definition in sampler.h, in double. */
static void expected(const float *l, double t, int top_k, double top_p,
                     double *p)
{
	int order[NTOK], keep = top_k > 0 && top_k < NTOK ? top_k : NTOK;
	double sum = 0.0, acc = 0.0, max = -INFINITY;

	for (int i = 0; i < NTOK; i++)
		order[i] = i;
	for (int i = 0; i < NTOK; i++) /* selection sort: largest first */
		for (int j = i + 1; j < NTOK; j++)
			if (l[order[j]] > l[order[i]]) {
				int tmp = order[i];
				order[i] = order[j];
				order[j] = tmp;
			}
	for (int i = 0; i < NTOK; i++)
		p[i] = 0.0;
	for (int i = 0; i < keep; i++)
		max = fmax(max, l[order[i]]);
	for (int i = 0; i < keep; i++)
		sum += p[order[i]] = exp((l[order[i]] - max) / t);
	for (int i = 0; i < keep; i++) {
		acc += p[order[i]] / sum;
		if (acc >= top_p) {
			for (int j = i + 1; j < keep; j++)
				p[order[j]] = 0.0;
			break;
		}
	}
	sum = 0.0;
	for (int i = 0; i < NTOK; i++)
		sum += p[i];
	for (int i = 0; i < NTOK; i++)
		p[i] /= sum;
}

/*
 * Over N draws the count of token i is Binomial(N, p_i): mean N p_i,
 * standard deviation sqrt(N p_i (1 - p_i)). A correct sampler stays within
 * five standard deviations with probability 1 - 5.7e-7 per count (and the
 * run is seeded, so the outcome is fixed). At N = 20000 that bound is at
 * most 1.8 points of probability; the runs at N = 200000 tighten it to
 * 0.56 points, which a temperature off by 5% already exceeds here. Tokens
 * outside the cut must never be drawn.
 */
static void check_distribution(float t, int top_k, float top_p, int n_draws)
{
	const float l[NTOK] = { 1.0f, 2.5f, -0.5f, 2.0f, 0.25f };
	double p[NTOK];
	int count[NTOK] = { 0 };
	struct q4kh_sampler *s = make(t, top_k, top_p, 99, NTOK);

	expected(l, t, top_k, top_p, p);
	for (int i = 0; i < n_draws; i++) {
		int32_t id = q4kh_sampler_sample(s, l);
		cr_assert(id >= 0 && id < NTOK);
		count[id]++;
	}
	for (int i = 0; i < NTOK; i++) {
		double mean = n_draws * p[i];
		double sd = sqrt(n_draws * p[i] * (1.0 - p[i]));
		if (p[i] == 0.0)
			cr_expect_eq(count[i], 0, "T=%g k=%d p=%g: token %d is cut "
			             "but drawn %d times", t, top_k, top_p, i,
			             count[i]);
		else
			cr_expect(fabs(count[i] - mean) <= 5.0 * sd,
			          "T=%g k=%d p=%g: token %d drawn %d times, expected "
			          "%.1f +- %.1f (5 sd)", t, top_k, top_p, i, count[i],
			          mean, 5.0 * sd);
	}
	q4kh_sampler_free(s);
}

Test(sampler, frequencies_match_softmax)
{
	check_distribution(1.0f, 0, 1.0f, 20000);
	check_distribution(0.5f, 0, 1.0f, 20000);
	check_distribution(3.0f, 0, 1.0f, 20000);
	check_distribution(1.0f, 1000, 1.0f, 200000); /* k > vocab: no cut */
}

Test(sampler, frequencies_match_after_top_k_and_top_p)
{
	check_distribution(1.0f, 3, 1.0f, 20000);
	check_distribution(0.7f, 2, 1.0f, 20000);
	check_distribution(1.0f, 0, 0.8f, 20000);
	check_distribution(2.0f, 4, 0.9f, 20000);
	check_distribution(1.0f, 0, 0.0f, 20000); /* only the top token */
	check_distribution(1.5f, 3, 0.6f, 200000);
}
