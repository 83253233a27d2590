/*
 * Token sampling from logits. Greedy when temperature <= 0; otherwise
 * softmax(logits / temperature) restricted to the top_k most likely tokens
 * (top_k <= 0: all) and then to the smallest set whose probability reaches
 * top_p (nucleus sampling, Holtzman et al. 2020; top_p >= 1: no cut),
 * drawn with a seeded PRNG so a seed reproduces a run. Not thread-safe: one
 * sampler per generation.
 */
#ifndef Q4KH_SAMPLER_H
#define Q4KH_SAMPLER_H

#include <stdint.h>

/* The highest temperature any command or request takes: OpenAI's API range
 * is [0, 2], and above it the text is noise. */
#define Q4KH_TEMPERATURE_MAX 2.0f

struct q4kh_sampler_params {
	float temperature; /* 0 = greedy */
	int32_t top_k;     /* 0 = no cut */
	float top_p;       /* 1 = no cut */
	uint64_t seed;
};

struct q4kh_sampler;

/* NULL when out of memory or n_vocab < 1. n_vocab: length of every logits
 * vector. */
struct q4kh_sampler *q4kh_sampler_new(const struct q4kh_sampler_params *p,
                                      int32_t n_vocab);
void q4kh_sampler_free(struct q4kh_sampler *s);
/* Pick a token from LOGITS[n_vocab]. Greedy ties go to the lowest id. NaN
 * logits are never picked; -1 when every logit is NaN. */
int32_t q4kh_sampler_sample(struct q4kh_sampler *s, const float *logits);
/* Whether P picks greedily (temperature 0, or anything not above 0):
 * then top-k, top-p and the seed play no part. */
int q4kh_sampler_greedy(const struct q4kh_sampler_params *p);
/* Index of the largest logit (lowest id on ties; NaN ignored; -1 when
 * there is none). */
int32_t q4kh_argmax(const float *logits, int32_t n);

#endif
