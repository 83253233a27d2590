/*
 * Dequantization of every tensor of the default model through the cpu
 * plugin's get_rows, against gguf-py's NumPy dequantizers
 * (tests/fixtures/dequant-gemma3-270m.txt, written by
 * scripts/gen-dequant-fixture.py): float64 sum, sum of squares, sum of
 * absolute values, min and max of every tensor, and 64 sampled values each.
 * The model is read with our GGUF reader and uploaded as it is on disk.
 * Every weight type, the model's and the rest, is checked on random blocks
 * (tests/fixtures/dequant-blocks.txt, scripts/gen-blocks-fixture.py):
 * get_rows value for value and mul_mat against float64 sums of gguf-py's
 * values.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks_fixture.h"
#include "gguf.h"
#include "helpers.h"
#include "q4khost/plugin.h"
#include "weight_types.h"

#define SAMPLES 64
#define CHUNK_VALUES (1 << 20) /* values dequantized per get_rows call */

struct fixture_tensor {
	char name[128];
	char type[16];
	int64_t ne0, rows;
	double sum, sumsq, sumabs, min, max;
	int64_t idx[SAMPLES];
	double val[SAMPLES];
};

struct plugin {
	void *dl;
	const struct q4kh_backend_v1 *b;
	struct q4kh_host_api api;
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev;
};

static void plugin_open(struct plugin *p)
{
	p->b = test_plugin_load("plugins/cpu/.libs/cpu.so", &p->dl)->backend;
	p->api = test_host_api(NULL, NULL);
	cr_assert_eq(p->b->init(&p->api, &p->ctx), Q4KH_OK, "%s",
	             p->b->last_error(NULL));
	cr_assert_eq(p->b->device_open(p->ctx, 0, &p->dev), Q4KH_OK, "%s",
	             p->b->last_error(p->ctx));
}

static void plugin_close(struct plugin *p)
{
	p->b->device_close(p->dev);
	p->b->shutdown(p->ctx);
	dlclose(p->dl);
}

/* --- the fixture ----------------------------------------------------------- */

static FILE *fixture_open(uint64_t *model_size, int64_t *count)
{
	char path[4096], line[512], name[256];
	unsigned long long size;
	long long n;
	FILE *f;

	snprintf(path, sizeof(path), "%s/tests/fixtures/dequant-gemma3-270m.txt",
	         test_srcdir());
	f = fopen(path, "r");
	cr_assert_not_null(f, "cannot open %s", path);
	do
		cr_assert_not_null(fgets(line, sizeof(line), f), "%s: empty", path);
	while (line[0] == '#');
	cr_assert_str_eq(line, "q4khost-dequant-fixture 1\n", "%s: header", path);
	cr_assert_eq(fscanf(f, "model %255s %llu\n", name, &size), 2);
	cr_assert_eq(fscanf(f, "tensors %lld\n", &n), 1);
	cr_assert_eq(fscanf(f, "samples %d\n", &(int){ 0 }), 1);
	*model_size = size;
	*count = n;
	return f;
}

static void fixture_next(FILE *f, struct fixture_tensor *t)
{
	cr_assert_eq(fscanf(f, " tensor %127s %15s %lld %lld %lf %lf %lf %lf %lf\n",
	                    t->name, t->type, (long long *)&t->ne0,
	                    (long long *)&t->rows, &t->sum, &t->sumsq, &t->sumabs,
	                    &t->min, &t->max),
	             9, "fixture: bad tensor line");
	for (int i = 0; i < SAMPLES; i++)
		cr_assert_eq(fscanf(f, " %lld:%lf", (long long *)&t->idx[i],
		                    &t->val[i]),
		             2, "fixture: %s: bad sample %d", t->name, i);
}

/* --- dequantizing one tensor ------------------------------------------------ */

struct stats {
	double sum, sumsq, sumabs, min, max;
	double got[SAMPLES];
	int seen[SAMPLES];
};

static void account(struct stats *s, const struct fixture_tensor *ft,
                    const float *v, int64_t first, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		double x = v[i];

		cr_assert(isfinite(x), "%s: value %lld is %g", ft->name,
		          (long long)(first + i), x);
		s->sum += x;
		s->sumsq += x * x;
		s->sumabs += fabs(x);
		s->min = fmin(s->min, x);
		s->max = fmax(s->max, x);
	}
	for (int i = 0; i < SAMPLES; i++)
		if (ft->idx[i] >= first && ft->idx[i] < first + n) {
			s->got[i] = v[ft->idx[i] - first];
			s->seen[i] = 1;
		}
}

static void dequantize_all(struct plugin *p, const struct q4kh_gguf_tensor *gt,
                           const struct fixture_tensor *ft, struct stats *s)
{
	int64_t ne0 = gt->ne[0], rows = gt->ne[1] * gt->ne[2] * gt->ne[3];
	int64_t chunk = CHUNK_VALUES / ne0 > 0 ? CHUNK_VALUES / ne0 : 1;
	uint64_t rb = gt->size / (uint64_t)rows;
	struct q4kh_tensor table = {
		.type = gt->type,
		.ne = { ne0, rows, 1, 1 },
		.nb = { q4kh_type_block_bytes(gt->type), (int64_t)rb,
		        (int64_t)gt->size, (int64_t)gt->size },
	};
	struct q4kh_tensor out = { .type = Q4KH_TYPE_F32 };
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)chunk);
	float *v = malloc(sizeof(float) * (size_t)(chunk * ne0));

	cr_assert(ids && v);
	cr_assert_eq(p->b->buffer_alloc(p->dev, gt->size, &table.buffer), Q4KH_OK);
	cr_assert_eq(p->b->buffer_upload(p->dev, table.buffer, 0, gt->data,
	                                 gt->size),
	             Q4KH_OK);
	cr_assert_eq(p->b->buffer_alloc(p->dev, sizeof(float) * (uint64_t)(chunk * ne0),
	                                &out.buffer),
	             Q4KH_OK);
	s->min = INFINITY;
	s->max = -INFINITY;
	for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
		int64_t n = rows - r0 < chunk ? rows - r0 : chunk;

		for (int64_t i = 0; i < n; i++)
			ids[i] = (int32_t)(r0 + i);
		out.ne[0] = ne0;
		out.ne[1] = n;
		out.ne[2] = out.ne[3] = 1;
		out.nb[0] = 4;
		out.nb[1] = 4 * ne0;
		out.nb[2] = out.nb[3] = 4 * ne0 * n;
		cr_assert_eq(p->b->get_rows(p->dev, &table, ids, n, 1.0f, &out),
		             Q4KH_OK, "%s: %s", ft->name, p->b->last_error(p->ctx));
		cr_assert_eq(p->b->buffer_download(p->dev, out.buffer, 0, v,
		                                   sizeof(float) * (uint64_t)(n * ne0)),
		             Q4KH_OK);
		account(s, ft, v, r0 * ne0, n * ne0);
	}
	p->b->buffer_free(p->dev, out.buffer);
	p->b->buffer_free(p->dev, table.buffer);
	free(ids);
	free(v);
}

static void expect_stat(const struct fixture_tensor *ft, const char *what,
                        double got, double want)
{
	/* Summation order differs (NumPy is pairwise): allow for cancellation. */
	double tol = 1e-6 * fabs(want) + 1e-12 * ft->sumabs;

	cr_assert(fabs(got - want) <= tol, "%s: %s = %.17g, gguf-py %.17g",
	          ft->name, what, got, want);
}

static void check_tensor(struct plugin *p, const struct q4kh_gguf *g,
                         const struct fixture_tensor *ft)
{
	const struct q4kh_gguf_tensor *gt = q4kh_gguf_tensor(g, ft->name);
	struct stats s = { 0 };

	cr_assert_not_null(gt, "%s: not in the model", ft->name);
	cr_assert_str_eq(q4kh_type_name(gt->type), ft->type, "%s: type",
	                 ft->name);
	cr_assert_eq(gt->ne[0], ft->ne0, "%s: ne[0]", ft->name);
	cr_assert_eq(gt->ne[1] * gt->ne[2] * gt->ne[3], ft->rows, "%s: rows",
	             ft->name);
	cr_assert_eq(p->b->supports_type(p->ctx, gt->type), 1, "%s: type %s",
	             ft->name, ft->type);
	dequantize_all(p, gt, ft, &s);
	expect_stat(ft, "sum", s.sum, ft->sum);
	expect_stat(ft, "sum of squares", s.sumsq, ft->sumsq);
	expect_stat(ft, "sum of |x|", s.sumabs, ft->sumabs);
	cr_assert_eq(s.min, ft->min, "%s: min %.9g, gguf-py %.9g", ft->name, s.min,
	             ft->min);
	cr_assert_eq(s.max, ft->max, "%s: max %.9g, gguf-py %.9g", ft->name, s.max,
	             ft->max);
	for (int i = 0; i < SAMPLES; i++) {
		double want = ft->val[i];

		cr_assert(s.seen[i], "%s: index %lld outside the tensor", ft->name,
		          (long long)ft->idx[i]);
		cr_assert(fabs(s.got[i] - want) <= fmax(1e-6 * fabs(want), 1e-7),
		          "%s: value %lld = %.9g, gguf-py %.9g", ft->name,
		          (long long)ft->idx[i], s.got[i], want);
	}
}

Test(quant, every_tensor_of_the_model_matches_gguf_py, .timeout = 600)
{
	const char *model = test_model_path();
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	struct fixture_tensor ft;
	struct plugin p = { 0 };
	uint64_t size;
	int64_t count;
	FILE *f;

	f = fixture_open(&size, &count);
	cr_assert_eq(q4kh_gguf_open(model, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(g->size, size,
	             "%s has %llu bytes; the fixture was made from a %llu-byte "
	             "file (regenerate with scripts/gen-dequant-fixture.py)",
	             model, (unsigned long long)g->size,
	             (unsigned long long)size);
	cr_assert_eq((int64_t)g->n_tensors, count, "tensor count");
	plugin_open(&p);
	for (int64_t i = 0; i < count; i++) {
		fixture_next(f, &ft);
		check_tensor(&p, g, &ft);
	}
	plugin_close(&p);
	q4kh_gguf_close(g);
	fclose(f);
}

/* --- every weight type's blocks against gguf-py (needs no model) -------- */

/* get_rows in reverse order with repeats: every value exactly gguf-py's
 * (a zero's sign aside). */
static void blocks_get_rows(struct plugin *p, const struct blocks_tensor *t,
                            const struct q4kh_tensor *table)
{
	int64_t n = t->rows + 1, ne0 = t->ne0;
	struct q4kh_tensor out = {
		.type = Q4KH_TYPE_F32,
		.ne = { ne0, n, 1, 1 },
		.nb = { 4, 4 * ne0, 4 * ne0 * n, 4 * ne0 * n },
	};
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	float *v = malloc(sizeof(float) * (size_t)(ne0 * n));

	cr_assert(ids && v);
	for (int64_t i = 0; i < t->rows; i++)
		ids[i] = (int32_t)(t->rows - 1 - i);
	ids[t->rows] = (int32_t)(t->rows - 1);
	cr_assert_eq(p->b->buffer_alloc(p->dev, (uint64_t)(4 * ne0 * n),
	                                &out.buffer),
	             Q4KH_OK);
	cr_assert_eq(p->b->get_rows(p->dev, table, ids, n, 1.0f, &out), Q4KH_OK,
	             "%s: %s", t->name, p->b->last_error(p->ctx));
	cr_assert_eq(p->b->buffer_download(p->dev, out.buffer, 0, v,
	                                   (uint64_t)(4 * ne0 * n)),
	             Q4KH_OK);
	for (int64_t i = 0; i < n; i++)
		for (int64_t k = 0; k < ne0; k++) {
			float want = t->values[ids[i] * ne0 + k];

			cr_assert(v[i * ne0 + k] == want,
			          "%s: row %d [%lld] = %.9g, gguf-py %.9g", t->name,
			          ids[i], (long long)k, (double)v[i * ne0 + k],
			          (double)want);
		}
	p->b->buffer_free(p->dev, out.buffer);
	free(ids);
	free(v);
}

/*
 * mul_mat against float64 sums of gguf-py's values: the reference sums in
 * double and rounds once, so within 2^-24 |s| plus the double sum's error,
 * 1e-6 of sum |w x| with room.
 */
static void blocks_mul_mat(struct plugin *p, const struct blocks_tensor *t,
                           const struct q4kh_tensor *w)
{
	enum { T = 3 };
	int64_t ne0 = t->ne0, n = t->rows;
	struct q4kh_tensor x = {
		.type = Q4KH_TYPE_F32,
		.ne = { ne0, T, 1, 1 },
		.nb = { 4, 4 * ne0, 4 * ne0 * T, 4 * ne0 * T },
	};
	struct q4kh_tensor y = {
		.type = Q4KH_TYPE_F32,
		.ne = { n, T, 1, 1 },
		.nb = { 4, 4 * n, 4 * n * T, 4 * n * T },
	};
	float *xv = malloc(sizeof(float) * (size_t)(ne0 * T));
	float got[T * 8];

	cr_assert_not_null(xv);
	cr_assert_leq(n, 8);
	/* Values of both signs, none zero, exact in binary. */
	for (int64_t i = 0; i < ne0 * T; i++)
		xv[i] = (float)((i * 37 + 11) % 61 - 30) / 16.0f + 1.0f / 64.0f;
	cr_assert_eq(p->b->buffer_alloc(p->dev, (uint64_t)(4 * ne0 * T),
	                                &x.buffer),
	             Q4KH_OK);
	cr_assert_eq(p->b->buffer_upload(p->dev, x.buffer, 0, xv,
	                                 (uint64_t)(4 * ne0 * T)),
	             Q4KH_OK);
	cr_assert_eq(p->b->buffer_alloc(p->dev, (uint64_t)(4 * n * T), &y.buffer),
	             Q4KH_OK);
	cr_assert_eq(p->b->mul_mat(p->dev, w, &x, &y), Q4KH_OK, "%s: %s",
	             t->name, p->b->last_error(p->ctx));
	cr_assert_eq(p->b->buffer_download(p->dev, y.buffer, 0, got,
	                                   (uint64_t)(4 * n * T)),
	             Q4KH_OK);
	for (int c = 0; c < T; c++)
		for (int64_t r = 0; r < n; r++) {
			double s = 0, m = 0;

			for (int64_t k = 0; k < ne0; k++) {
				double pr = (double)t->values[r * ne0 + k] * xv[c * ne0 + k];

				s += pr;
				m += fabs(pr);
			}
			cr_assert(fabs(got[c * n + r] - s) <= 1e-6 * m,
			          "%s: y[%lld, %d] = %.9g, expected %.9g", t->name,
			          (long long)r, c, (double)got[c * n + r], s);
		}
	p->b->buffer_free(p->dev, x.buffer);
	p->b->buffer_free(p->dev, y.buffer);
	free(xv);
}

/* The types q4khost multiplies (docs/architecture.md "Weight types"). */
static const uint32_t weight_types[] = {
	Q4KH_TYPE_F32,  Q4KH_TYPE_F16,  Q4KH_TYPE_BF16,   Q4KH_TYPE_Q4_0, Q4KH_TYPE_Q4_1,
	Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q5_1, Q4KH_TYPE_Q8_0,   Q4KH_TYPE_Q2_K, Q4KH_TYPE_Q3_K,
	Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q5_K, Q4KH_TYPE_Q6_K,   Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_IQ4_XS,
};

Test(quant, every_weight_type_matches_gguf_py)
{
	struct blocks_fixture bf;
	struct plugin p = { 0 };

	blocks_fixture_load(&bf);
	plugin_open(&p);
	for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++)
		cr_assert_not_null(blocks_fixture_find(&bf, weight_types[i]),
		                   "the fixture lacks %s (scripts/gen-blocks-fixture.py)",
		                   q4kh_type_name(weight_types[i]));
	/* The host refuses files of any other type, and runs these. */
	for (uint32_t t = 0; t < Q4KH_TYPE_COUNT; t++) {
		int listed = 0;

		for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++)
			listed |= weight_types[i] == t;
		cr_assert_eq(q4kh_weight_type_supported(t), listed, "type %u", t);
	}
	for (size_t i = 0; i < bf.n; i++) {
		const struct blocks_tensor *t = &bf.t[i];
		struct q4kh_tensor table = {
			.type = t->type,
			.ne = { t->ne0, t->rows, 1, 1 },
			.nb = { q4kh_type_block_bytes(t->type), (int64_t)t->row_bytes,
			        (int64_t)t->size, (int64_t)t->size },
		};

		cr_assert_eq(p.b->supports_type(p.ctx, t->type), 1, "%s", t->name);
		cr_assert_eq(p.b->buffer_alloc(p.dev, t->size, &table.buffer), Q4KH_OK);
		cr_assert_eq(p.b->buffer_upload(p.dev, table.buffer, 0, t->bytes, t->size),
		             Q4KH_OK);
		blocks_get_rows(&p, t, &table);
		blocks_mul_mat(&p, t, &table);
		p.b->buffer_free(p.dev, table.buffer);
	}
	plugin_close(&p);
	blocks_fixture_free(&bf);
}
