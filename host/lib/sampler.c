/*
 * Token sampling. Random draws come from xoshiro256** (D. Blackman and
 * S. Vigna, "Scrambled linear pseudorandom number generators", ACM TOMS
 * 2021), its state filled from the seed by splitmix64 (S. Vigna, after
 * G. Steele, D. Lea and C. Flood, OOPSLA 2014), as its authors recommend.
 * Probabilities are computed in double.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

struct cand {
	int32_t id;
	float logit;
};

struct q4kh_sampler {
	struct q4kh_sampler_params p;
	int32_t n_vocab;
	uint64_t rng[4];
	struct cand *cand; /* n_vocab, reused by every call */
	double *w;         /* unnormalised probabilities, same order */
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro256ss(uint64_t s[4])
{
	uint64_t out = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(struct q4kh_sampler *s)
{
	return (double)(xoshiro256ss(s->rng) >> 11) * 0x1.0p-53;
}

struct q4kh_sampler *q4kh_sampler_new(const struct q4kh_sampler_params *p,
                                      int32_t n_vocab)
{
	struct q4kh_sampler *s;
	uint64_t x = p->seed;

	if (n_vocab < 1)
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->p = *p;
	s->n_vocab = n_vocab;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
	s->w = malloc((size_t)n_vocab * sizeof(*s->w));
	if (!s->cand || !s->w) {
		q4kh_sampler_free(s);
		return NULL;
	}
	return s;
}

void q4kh_sampler_free(struct q4kh_sampler *s)
{
	if (!s)
		return;
	free(s->cand);
	free(s->w);
	free(s);
}

int32_t q4kh_argmax(const float *logits, int32_t n)
{
	int32_t best = -1;

	for (int32_t i = 0; i < n; i++)
		if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best]))
			best = i;
	return best;
}

/* The order of likelihood: higher logit first, lower id on ties (so that
 * top_k = 1 is exactly greedy). */
static int better(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_better(const void *a, const void *b)
{
	return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Min-heap on `better`: the root is the worst of the kept candidates. */
static void sift_down(struct cand *h, size_t n, size_t i)
{
	for (;;) {
		size_t c = 2 * i + 1;
		struct cand tmp;
		if (c >= n)
			break;
		if (c + 1 < n && better(&h[c], &h[c + 1]))
			c++;
		if (!better(&h[i], &h[c]))
			break;
		tmp = h[i];
		h[i] = h[c];
		h[c] = tmp;
		i = c;
	}
}

/* Move the K best of C[0..N) to C[0..K), in O(N log K). */
static void keep_top_k(struct cand *c, size_t n, size_t k)
{
	for (size_t i = k / 2; i-- > 0;)
		sift_down(c, k, i);
	for (size_t i = k; i < n; i++) {
		if (better(&c[i], &c[0])) {
			c[0] = c[i];
			sift_down(c, k, 0);
		}
	}
}

/* The non-NaN logits as candidates; returns their count. */
static size_t collect(struct q4kh_sampler *s, const float *logits)
{
	size_t n = 0;

	for (int32_t i = 0; i < s->n_vocab; i++)
		if (!isnan(logits[i]))
			s->cand[n++] = (struct cand){ i, logits[i] };
	return n;
}

/* exp((l - max) / T) for C[0..N) into W; returns the sum. When the maximum
 * is infinite, the tokens at it share all the mass. */
static double weigh(struct q4kh_sampler *s, size_t n)
{
	double max = -INFINITY, sum = 0.0;

	for (size_t i = 0; i < n; i++)
		if (s->cand[i].logit > max)
			max = s->cand[i].logit;
	for (size_t i = 0; i < n; i++) {
		double l = s->cand[i].logit;
		s->w[i] = isinf(max) ? (l == max)
		                     : exp((l - max) / (double)s->p.temperature);
		sum += s->w[i];
	}
	return sum;
}

/* The smallest prefix of the sorted candidates whose mass reaches top_p. */
static size_t nucleus(const struct q4kh_sampler *s, size_t n, double sum)
{
	double acc = 0.0, goal = (double)s->p.top_p * sum;

	for (size_t i = 0; i < n; i++) {
		acc += s->w[i];
		if (acc >= goal)
			return i + 1;
	}
	return n;
}

static int32_t draw(struct q4kh_sampler *s, size_t n, double sum)
{
	double u = next_unit(s) * sum, acc = 0.0;
	size_t last = 0;

	for (size_t i = 0; i < n; i++) {
		if (s->w[i] <= 0.0)
			continue;
		acc += s->w[i];
		last = i;
		if (u < acc)
			return s->cand[i].id;
	}
	return s->cand[last].id; /* u rounded up to the very end of the sum */
}

int q4kh_sampler_greedy(const struct q4kh_sampler_params *p)
{
	return !(p->temperature > 0.0f);
}

int32_t q4kh_sampler_sample(struct q4kh_sampler *s, const float *logits)
{
	size_t n, k;
	double sum;

	if (q4kh_sampler_greedy(&s->p))
		return q4kh_argmax(logits, s->n_vocab);
	n = collect(s, logits);
	if (n == 0)
		return -1;
	k = s->p.top_k > 0 && (size_t)s->p.top_k < n ? (size_t)s->p.top_k : n;
	if (k < n)
		keep_top_k(s->cand, n, k);
	if (s->p.top_p < 1.0f)
		qsort(s->cand, k, sizeof(*s->cand), cmp_better);
	sum = weigh(s, k);
	if (s->p.top_p < 1.0f) {
		k = nucleus(s, k, sum);
		sum = 0.0;
		for (size_t i = 0; i < k; i++)
			sum += s->w[i];
	}
	return draw(s, k, sum);
}
