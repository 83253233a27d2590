/*
 * q4khost bench-kernels: the GEMV of every kernel variant and of the
 * backend's built-in mul_mat, on the weight shapes of real models, for 1 to
 * 8 activation columns, against the device's read-bandwidth ceiling
 * measured in the same run.
 *
 * Weights are random quantization blocks (valid fp16 scales), in as many
 * copies as it takes to total --min-mib, and each timed pass rotates over
 * the copies, so the L2 cache cannot serve them: every launch reads its
 * weights from device memory, as a layer of a model larger than the cache
 * does. Launches go back to back inside one recording (a CUDA graph on the
 * cuda backend, ABI 1.1 graph_*), timed with device events (timer_*); a
 * backend without those entries is timed by the host clock around the same
 * launches and one synchronize. Before a kernel is timed, its output on the
 * first copy is compared with the built-in mul_mat's by normalised mean
 * squared error (ggml's test-backend-ops bound for quantized products,
 * 5e-4): a fast wrong kernel is reported as wrong, never as fast.
 *
 * Its timed passes are in cmd_bench_kernels_timing.c, what it shows (the
 * status line, the table, the --json object) in cmd_bench_kernels_report.c.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd_bench_kernels.h"
#include "enumerate.h"
#include "host.h"
#include "interrupt.h"
#include "progress.h"
#include "select.h"

/* ggml test-backend-ops: NMSE bound for quantized matrix products. */
#define NMSE_MAX 5e-4

/* Distinct matmul weight shapes of each model (N x K, GGUF's {K, N}). */
static const struct shape shapes[] = {
	{ "gemma3-270m", "attn_output", 640, 1024 },
	{ "gemma3-270m", "ffn_down", 640, 2048 },
	{ "qwen2.5-1.5b", "attn_q/o", 1536, 1536 },
	{ "qwen2.5-1.5b", "attn_k/v", 256, 1536 },
	{ "qwen2.5-1.5b", "ffn_gate/up", 8960, 1536 },
	{ "qwen2.5-1.5b", "ffn_down", 1536, 8960 },
	{ "qwen2.5-1.5b", "lm_head", 151936, 1536 },
	{ "llama3-8b", "attn_q/o", 4096, 4096 },
	{ "llama3-8b", "attn_k/v", 1024, 4096 },
	{ "llama3-8b", "ffn_gate/up", 14336, 4096 },
	{ "llama3-8b", "ffn_down", 4096, 14336 },
	{ "llama3-8b", "lm_head", 128256, 4096 },
	{ "large", "131072x4096", 131072, 4096 },
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The variants' types first: the default list. */
static const uint32_t types[] = { Q4KH_TYPE_Q4_K, Q4KH_TYPE_Q6_K, Q4KH_TYPE_IQ4_XS,
	                          Q4KH_TYPE_IQ4_NL, Q4KH_TYPE_Q5_K, Q4KH_TYPE_Q8_0,
	                          Q4KH_TYPE_Q5_0, Q4KH_TYPE_Q4_0, Q4KH_TYPE_F16,
	                          Q4KH_TYPE_F32, Q4KH_TYPE_Q4_1, Q4KH_TYPE_Q5_1,
	                          Q4KH_TYPE_Q2_K, Q4KH_TYPE_Q3_K, Q4KH_TYPE_BF16 };
#define DEFAULT_TYPES "Q4_K,Q6_K,IQ4_XS,IQ4_NL"

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost bench-kernels [OPTIONS]\n\n"
	        "Time the GEMV of every kernel variant and of the backend's built-in\n"
	        "mul_mat on the weight shapes of real models, for 1 to 8 activation\n"
	        "columns, and the device's read ceiling in the same run. Weights rotate\n"
	        "over copies larger than the L2 cache; launches run back to back in one\n"
	        "recorded graph, timed on the device. Each kernel's output is checked\n"
	        "against the built-in's first (NMSE <= 5e-4).\n\n"
	        "      --backend NAME    backend (default: the one q4khost run tries\n"
	        "                        first here, cuda with a GPU, else cpu-fast;\n"
	        "                        stderr names it)\n"
	        "      --device N        device index within the backend (default 0)\n"
	        "      --kernels LIST    comma-separated variants to time (default: every\n"
	        "                        variant for the backend); the built-in always runs\n"
	        "                        ('' for the built-in alone)\n"
	        "      --shapes LIST     gemma3-270m, qwen2.5-1.5b, llama3-8b, large\n"
	        "                        (default: all)\n"
	        "      --types LIST      Q4_K, Q6_K, IQ4_XS, IQ4_NL, Q5_K, Q8_0, Q5_0,\n"
	        "                        Q4_0, F16, F32, Q4_1, Q5_1, Q2_K, Q3_K, BF16, or\n"
	        "                        all (default: the first four; a type the backend\n"
	        "                        lacks is left out)\n"
	        "      --max-batch N     columns 1 .. N, N <= 8 (default 8)\n"
	        "      --min-mib N       weight copies total at least N MiB (default 256)\n"
	        "      --repeat N        timed passes, the median is kept (default 5)\n"
	        "      --plugin-path P   ':'-separated plugin folders\n"
	        "      --config FILE     extra INI configuration file\n"
	        "      --json            one JSON object\n"
	        "  -h, --help            this help\n\n"
	        "On a terminal, a status line on stderr names the row being timed (N of M:\n"
	        "type, shape, kernel) and its column. SIGINT (Ctrl-C) or SIGTERM stops it\n"
	        "within a pass: the rows done are printed (with --json, the object, with\n"
	        "\"interrupted\": \"SIGINT\"), then a line saying after how many of the rows\n"
	        "it stopped; a second signal at least half a second later ends the process\n"
	        "at once.\n\n"
	        "exit codes: 0 every kernel timed and correct, 1 a kernel failed or gave\n"
	        "            a wrong result, 2 usage, 3 bad config file, 4 no such\n"
	        "            backend, device or variant, 130 or 143 stopped by SIGINT\n"
	        "            or SIGTERM\n");
}

static int parse_long(const char *s, const char *what, long lo, long hi, long *out)
{
	return q4kh_cli_parse_long("bench-kernels", s, what, lo, hi, out);
}

/* 1 when NAME is an item of comma-separated LIST (NULL: everything). */
static int listed(const char *list, const char *name)
{
	size_t len = strlen(name);

	if (!list)
		return 1;
	for (const char *p = list; *p;) {
		const char *e = strchr(p, ',');
		size_t l = e ? (size_t)(e - p) : strlen(p);

		if (l == len && !strncmp(p, name, len))
			return 1;
		p += l + (e ? 1 : 0);
	}
	return 0;
}

/* Every item of LIST must be one of the NAMES (n of them). */
static int check_list(const char *list, const char *opt, const char *const *names, size_t n)
{
	char item[64];

	for (const char *p = list; p && *p;) {
		const char *e = strchr(p, ',');
		size_t l = e ? (size_t)(e - p) : strlen(p), i;

		snprintf(item, sizeof(item), "%.*s", (int)(l < 63 ? l : 63), p);
		for (i = 0; i < n && strcmp(item, names[i]); i++)
			;
		if (i == n) {
			fprintf(stderr, "q4khost bench-kernels: %s: unknown '%s'; expected one of:",
			        opt, item);
			for (i = 0; i < n; i++)
				fprintf(stderr, " %s", names[i]);
			fputc('\n', stderr);
			return -1;
		}
		p += l + (e ? 1 : 0);
	}
	return 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
	enum { O_BACKEND = 256, O_DEVICE, O_KERNELS, O_SHAPES, O_TYPES, O_MAXB, O_MIB,
	       O_REPEAT, O_PPATH, O_CONFIG, O_JSON };
	static const struct option longs[] = {
		{ "backend", required_argument, 0, O_BACKEND },
		{ "device", required_argument, 0, O_DEVICE },
		{ "kernels", required_argument, 0, O_KERNELS },
		{ "shapes", required_argument, 0, O_SHAPES },
		{ "types", required_argument, 0, O_TYPES },
		{ "max-batch", required_argument, 0, O_MAXB },
		{ "min-mib", required_argument, 0, O_MIB },
		{ "repeat", required_argument, 0, O_REPEAT },
		{ "plugin-path", required_argument, 0, O_PPATH },
		{ "config", required_argument, 0, O_CONFIG },
		{ "json", no_argument, 0, O_JSON },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	static const char *const set_names[] = { "gemma3-270m", "qwen2.5-1.5b", "llama3-8b",
		                                 "large" };
	static const char *const type_names[] = { "Q4_K", "Q6_K", "IQ4_XS", "IQ4_NL", "Q5_K",
		                                  "Q8_0", "Q5_0", "Q4_0", "F16", "F32",
		                                  "Q4_1", "Q5_1", "Q2_K", "Q3_K", "BF16" };
	int c;

	memset(o, 0, sizeof(*o));
	o->type_list = DEFAULT_TYPES;
	o->max_cols = MAX_COLS;
	o->min_mib = 256;
	o->repeat = 5;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
		switch (c) {
		case O_BACKEND: o->backend = optarg; break;
		case O_KERNELS: o->kernels = optarg; break;
		case O_SHAPES: o->sets = optarg; break;
		case O_TYPES: o->type_list = optarg; break;
		case O_PPATH: o->plugin_path = optarg; break;
		case O_CONFIG: o->config_file = optarg; break;
		case O_JSON: o->json = 1; break;
		case O_DEVICE:
			if (parse_long(optarg, "--device", 0, 1023, &o->device))
				return -1;
			break;
		case O_MAXB:
			if (parse_long(optarg, "--max-batch", 1, MAX_COLS, &o->max_cols))
				return -1;
			break;
		case O_MIB:
			if (parse_long(optarg, "--min-mib", 1, 1 << 16, &o->min_mib))
				return -1;
			break;
		case O_REPEAT:
			if (parse_long(optarg, "--repeat", 1, 1000, &o->repeat))
				return -1;
			break;
		case 'h': usage(stdout); return 1;
		default: q4kh_cli_bad_option("bench-kernels", argv, c); return -1;
		}
	}
	/* --kernels '' times the built-in alone: no empty name to refuse */
	if (q4kh_cli_given_check("bench-kernels",
	                         &(struct q4kh_cli_given){ NULL, o->config_file, o->plugin_path,
	                                                   o->backend, NULL, NULL }))
		return -1;
	if (optind < argc) {
		q4kh_cli_extra_argument("bench-kernels", argv[optind]);
		return -1;
	}
	if (!strcmp(o->type_list, "all"))
		o->type_list = NULL;
	if (check_list(o->sets, "--shapes", set_names, N_OF(set_names)) ||
	    check_list(o->type_list, "--types", type_names, N_OF(type_names)))
		return -1;
	return 0;
}

/* --- random weights and activations ---------------------------------------- */

static uint64_t next(uint64_t *s)
{
	/* xorshift64* (Vigna 2016): fast, and good enough for test data. */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1DULL;
}

/* Offsets of the fp16 scales inside one block of TYPE (at most 2); every
 * element of F16. */
static int half_fields(uint32_t type, size_t off[2])
{
	switch (type) {
	case Q4KH_TYPE_Q4_K:
		off[0] = offsetof(struct q4kh_block_q4_k, d);
		off[1] = offsetof(struct q4kh_block_q4_k, dmin);
		return 2;
	case Q4KH_TYPE_Q5_K:
		off[0] = offsetof(struct q4kh_block_q5_k, d);
		off[1] = offsetof(struct q4kh_block_q5_k, dmin);
		return 2;
	case Q4KH_TYPE_Q6_K: off[0] = offsetof(struct q4kh_block_q6_k, d); return 1;
	case Q4KH_TYPE_IQ4_NL: off[0] = offsetof(struct q4kh_block_iq4_nl, d); return 1;
	case Q4KH_TYPE_IQ4_XS: off[0] = offsetof(struct q4kh_block_iq4_xs, d); return 1;
	case Q4KH_TYPE_Q8_0: off[0] = offsetof(struct q4kh_block_q8_0, d); return 1;
	case Q4KH_TYPE_Q5_0: off[0] = offsetof(struct q4kh_block_q5_0, d); return 1;
	case Q4KH_TYPE_Q4_0: off[0] = offsetof(struct q4kh_block_q4_0, d); return 1;
	case Q4KH_TYPE_Q4_1:
		off[0] = offsetof(struct q4kh_block_q4_1, d);
		off[1] = offsetof(struct q4kh_block_q4_1, m);
		return 2;
	case Q4KH_TYPE_Q5_1:
		off[0] = offsetof(struct q4kh_block_q5_1, d);
		off[1] = offsetof(struct q4kh_block_q5_1, m);
		return 2;
	case Q4KH_TYPE_Q2_K:
		off[0] = offsetof(struct q4kh_block_q2_k, d);
		off[1] = offsetof(struct q4kh_block_q2_k, dmin);
		return 2;
	case Q4KH_TYPE_Q3_K: off[0] = offsetof(struct q4kh_block_q3_k, d); return 1;
	case Q4KH_TYPE_F16: off[0] = 0; return 1;
	}
	return 0;
}

/*
 * BYTES of random blocks of TYPE: random codes and sub-scales, and fp16
 * scales between 2^-9 and 2^-8 (finite, normal), so every output is a sum
 * of well-scaled products of random sign. F32 elements are random in
 * [-2^-8, 2^-8), F16 ones take the scales' values.
 */
static void fill_blocks(uint8_t *p, size_t bytes, uint32_t type, uint64_t *seed)
{
	const size_t bb = q4kh_type_block_bytes(type);
	size_t off[2];
	const int nh = half_fields(type, off);

	for (size_t i = 0; i + 8 <= bytes; i += 8) {
		uint64_t v = next(seed);
		memcpy(p + i, &v, 8);
	}
	if (type == Q4KH_TYPE_F32)
		for (size_t i = 0; i + 4 <= bytes; i += 4) {
			const float f = (float)((double)(next(seed) >> 11) / 9007199254740992.0 *
			                        (2.0 / 256) - 1.0 / 256);
			memcpy(p + i, &f, 4);
		}
	/* BF16: an exponent byte of about 2^-9 under random sign and mantissa. */
	if (type == Q4KH_TYPE_BF16)
		for (size_t i = 1; i < bytes; i += 2)
			p[i] = (uint8_t)((p[i] & 0x80) | 0x3B);
	for (size_t b = 0; b + bb <= bytes; b += bb)
		for (int h = 0; h < nh; h++) {
			uint16_t v = (uint16_t)(0x1800 | (next(seed) & 0x3FF));
			memcpy(p + b + off[h], &v, 2);
		}
}

/* --- the read ceiling ----------------------------------------------------------- */

struct read_ctx {
	q4kh_buffer *buf;
	uint64_t bytes;
};

static int launch_read(struct bench *B, void *ctx, size_t i, int c, struct q4kh_error *err)
{
	const struct read_ctx *r = ctx;

	(void)i;
	(void)c;
	return q4kh_backend_check(&B->b, B->b.v->read_pass(B->b.dev, r->buf, 0, r->bytes),
	                          "read_pass", err);
}

/* Bytes per second of read_pass over 1 GiB of random bytes. */
static int measure_ceiling(struct bench *B, struct q4kh_error *err)
{
	const uint64_t bytes = 1ULL << 30, chunk = 64ULL << 20;
	struct read_ctx r = { NULL, bytes };
	uint64_t seed = 0x9E3779B97F4A7C15ULL;
	uint8_t *host;
	double s;
	int rc = -1;

	if (!Q4KH_BACKEND_HAS(B->b.v, read_pass))
		return 0; /* no ceiling: percentages are left out */
	host = malloc(chunk);
	if (!host)
		return q4kh_fail(err, "out of memory");
	fill_blocks(host, chunk, Q4KH_TYPE_F32, &seed);
	if (q4kh_backend_check(&B->b, B->b.v->buffer_alloc(B->b.dev, bytes, &r.buf),
	                       "buffer_alloc (read ceiling)", err))
		goto out;
	for (uint64_t o = 0; o < bytes; o += chunk)
		if (q4kh_backend_check(&B->b,
		                       B->b.v->buffer_upload(B->b.dev, r.buf, o, host, chunk),
		                       "buffer_upload", err))
			goto out;
	bench_kernels_status_ceiling(B);
	rc = bench_kernels_time_passes(B, launch_read, &r, 1, 4, 1, &s, err);
	q4kh_progress_clear();
	if (rc < 0)
		goto out;
	if (rc == 0)
		B->ceiling = 4.0 * (double)bytes / s;
	rc = 0; /* stopped: no ceiling, and no rows */
out:
	if (r.buf)
		B->b.v->buffer_free(B->b.dev, r.buf);
	free(host);
	return rc;
}

/* --- one shape, one type ------------------------------------------------------- */

static struct q4kh_tensor weight_copy(const struct shape_run *s, size_t i)
{
	struct q4kh_tensor t = s->tw;

	t.offset = i * s->stride;
	return t;
}

static int launch_gemv(struct bench *B, void *ctx, size_t i, int c, struct q4kh_error *err)
{
	struct shape_run *s = ctx;

	if (!s->k) {
		struct q4kh_tensor w = weight_copy(s, i);

		return q4kh_backend_check(&B->b,
		                          B->b.v->mul_mat(B->b.dev, &w, &s->tx[c - 1],
		                                          &s->ty[c - 1]),
		                          "mul_mat", err);
	}
	return q4kh_kernel_check(s->k,
	                         s->k->v->gemv(s->k->ctx, &s->k->native, s->prep[i],
	                                       &s->tx[c - 1], &s->ty[c - 1]),
	                         "gemv", err);
}

static struct q4kh_tensor f32_matrix(q4kh_buffer *buf, int64_t rows, int64_t cols)
{
	struct q4kh_tensor t = { .buffer = buf, .type = Q4KH_TYPE_F32 };

	t.ne[0] = rows;
	t.ne[1] = cols;
	t.ne[2] = t.ne[3] = 1;
	t.nb[0] = 4;
	t.nb[1] = 4 * rows;
	t.nb[2] = t.nb[3] = t.nb[1] * cols;
	return t;
}

/* Normalised mean squared error of got against want (n values). */
static double nmse(const float *got, const float *want, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		const double d = (double)got[i] - want[i];

		num += d * d;
		den += (double)want[i] * want[i];
	}
	return den > 0 ? num / den : INFINITY;
}

static int alloc_shape(struct bench *B, struct shape_run *s, struct q4kh_error *err)
{
	const struct q4kh_backend_v1 *v = B->b.v;
	const uint64_t be = q4kh_type_block_elems(s->type), bb = q4kh_type_block_bytes(s->type);
	const uint64_t row = (uint64_t)s->sh->k / be * bb;
	const uint64_t min_bytes = (uint64_t)B->o->min_mib << 20;
	uint64_t seed = 0x243F6A8885A308D3ULL ^ (uint64_t)s->sh->n * 31 ^ s->type;
	uint8_t *host;
	float *xs;
	int rc = -1;

	s->bytes = row * (uint64_t)s->sh->n;
	s->stride = (s->bytes + 255) / 256 * 256;
	s->copies = (size_t)((min_bytes + s->bytes - 1) / s->bytes);
	if (s->copies < 2)
		s->copies = 2;
	/* Enough launches that one graph launch's own cost is noise. */
	s->launches = s->copies < 16 ? (16 + s->copies - 1) / s->copies * s->copies : s->copies;
	host = malloc(s->bytes);
	xs = malloc((size_t)s->sh->k * MAX_COLS * sizeof(float));
	if (!host || !xs) {
		q4kh_fail(err, "out of memory for %llu bytes of weights",
		          (unsigned long long)s->bytes);
		goto out;
	}
	fill_blocks(host, s->bytes, s->type, &seed);
	for (size_t i = 0; i < (size_t)s->sh->k * MAX_COLS; i++)
		xs[i] = (float)((double)(next(&seed) >> 11) / 9007199254740992.0 * 2 - 1);
	if (q4kh_backend_check(&B->b, v->buffer_alloc(B->b.dev, s->stride * s->copies, &s->w),
	                       "buffer_alloc (weights)", err) ||
	    q4kh_backend_check(&B->b,
	                       v->buffer_alloc(B->b.dev, (uint64_t)s->sh->k * MAX_COLS * 4, &s->x),
	                       "buffer_alloc (x)", err) ||
	    q4kh_backend_check(&B->b,
	                       v->buffer_alloc(B->b.dev, (uint64_t)s->sh->n * MAX_COLS * 4, &s->y),
	                       "buffer_alloc (y)", err))
		goto out;
	for (size_t i = 0; i < s->copies; i++)
		if (q4kh_backend_check(&B->b,
		                       v->buffer_upload(B->b.dev, s->w, i * s->stride, host, s->bytes),
		                       "buffer_upload (weights)", err))
			goto out;
	if (q4kh_backend_check(&B->b,
	                       v->buffer_upload(B->b.dev, s->x, 0, xs,
	                                        (uint64_t)s->sh->k * MAX_COLS * 4),
	                       "buffer_upload (x)", err))
		goto out;
	s->tw = (struct q4kh_tensor){ .buffer = s->w, .type = s->type };
	s->tw.ne[0] = s->sh->k;
	s->tw.ne[1] = s->sh->n;
	s->tw.ne[2] = s->tw.ne[3] = 1;
	s->tw.nb[0] = (int64_t)bb;
	s->tw.nb[1] = (int64_t)row;
	s->tw.nb[2] = s->tw.nb[3] = (int64_t)s->bytes;
	for (int c = 1; c <= MAX_COLS; c++) {
		s->tx[c - 1] = f32_matrix(s->x, s->sh->k, c);
		s->ty[c - 1] = f32_matrix(s->y, s->sh->n, c);
	}
	rc = 0;
out:
	free(host);
	free(xs);
	return rc;
}

static void free_shape(struct bench *B, struct shape_run *s)
{
	if (s->w)
		B->b.v->buffer_free(B->b.dev, s->w);
	if (s->x)
		B->b.v->buffer_free(B->b.dev, s->x);
	if (s->y)
		B->b.v->buffer_free(B->b.dev, s->y);
}

static void release_all(struct shape_run *s)
{
	for (size_t i = 0; s->prep && i < s->copies; i++)
		if (s->prep[i])
			s->k->v->release(s->k->ctx, s->prep[i]);
	free(s->prep);
	s->prep = NULL;
}

/* Prepare every copy for variant K; -1 with err when one fails. */
static int prepare_all(struct shape_run *s, struct q4kh_kernel *k, struct q4kh_error *err)
{
	s->k = k;
	s->prep = calloc(s->copies, sizeof(*s->prep));
	if (!s->prep)
		return q4kh_fail(err, "out of memory");
	for (size_t i = 0; i < s->copies; i++) {
		struct q4kh_tensor w = weight_copy(s, i);

		if (q4kh_kernel_check(k, k->v->prepare(k->ctx, &k->native, &w, &s->prep[i]),
		                      "prepare", err))
			return -1;
	}
	return 0;
}

/* Check, then time, the current kernel of S into RES. */
static void run_kernel(struct bench *B, struct shape_run *s, const float *want, float *got,
                       struct result *res)
{
	const int cols = (int)B->o->max_cols;
	struct q4kh_error err = { { 0 } };

	if (launch_gemv(B, s, 0, cols, &err) ||
	    q4kh_backend_check(&B->b,
	                       B->b.v->buffer_download(B->b.dev, s->y, 0, got,
	                                               (uint64_t)s->sh->n * cols * 4),
	                       "buffer_download", &err)) {
		snprintf(res->note, sizeof(res->note), "failed: %.490s", err.msg);
		B->failed = 1;
		return;
	}
	res->nmse = nmse(got, want, (size_t)s->sh->n * cols);
	if (!(res->nmse <= NMSE_MAX)) {
		snprintf(res->note, sizeof(res->note),
		         "WRONG: NMSE %.3g against the built-in, above %.0e; not timed",
		         res->nmse, NMSE_MAX);
		B->failed = 1;
		return;
	}
	for (int c = 1; c <= cols; c++) {
		double sec;
		int rc;

		bench_kernels_status_row(B, s, res, c);
		rc = bench_kernels_time_passes(B, launch_gemv, s, s->copies, s->launches, c, &sec,
		                               &err);
		if (rc == STOPPED) {
			snprintf(res->note, sizeof(res->note),
			         "interrupted by %s after %d of %d columns; not timed",
			         q4kh_signal_name(q4kh_interrupted()), c - 1, cols);
			res->stopped = 1;
			return;
		}
		if (rc) {
			snprintf(res->note, sizeof(res->note), "failed while timed: %.480s",
			         err.msg);
			B->failed = 1;
			return;
		}
		res->us[c - 1] = sec / (double)s->launches * 1e6;
	}
}

/* Whether variant K gets a row for TYPE. */
static int times(struct bench *B, struct q4kh_kernel *k, uint32_t type)
{
	return q4kh_kernel_implements(k, type) && k->v->score(k->ctx, &B->b.record, type) != 0;
}

/* Whether shape SH of TYPE is benchmarked. */
static int planned(const struct bench *B, const struct shape *sh, uint32_t type)
{
	return listed(B->o->type_list, q4kh_type_name(type)) &&
	       B->b.v->supports_type(B->b.ctx, type) && listed(B->o->sets, sh->set) &&
	       sh->k % q4kh_type_block_elems(type) == 0;
}

/* The rows the run will print: the built-in's and each variant's. */
static size_t count_rows(struct bench *B)
{
	size_t n = 0;

	for (size_t t = 0; t < N_OF(types); t++)
		for (size_t i = 0; i < N_OF(shapes); i++) {
			if (!planned(B, &shapes[i], types[t]))
				continue;
			n++;
			for (size_t j = 0; j < B->n_k; j++)
				n += times(B, &B->k[j], types[t]) != 0;
		}
	return n;
}

static int bench_shape(struct bench *B, const struct shape *sh, uint32_t type,
                       struct q4kh_error *err)
{
	const int cols = (int)B->o->max_cols;
	struct shape_run s = { .sh = sh, .type = type };
	float *want = NULL, *got = NULL;
	struct result res;
	int rc = -1;

	if (alloc_shape(B, &s, err))
		goto out;
	rc = 0;
	if (q4kh_interrupted()) /* while the weights were uploaded: no row begun */
		goto out;
	rc = -1;
	want = malloc((size_t)sh->n * cols * sizeof(float));
	got = malloc((size_t)sh->n * cols * sizeof(float));
	if (!want || !got) {
		q4kh_fail(err, "out of memory");
		goto out;
	}
	/* The reference: the built-in mul_mat on copy 0. */
	if (launch_gemv(B, &s, 0, cols, err) ||
	    q4kh_backend_check(&B->b,
	                       B->b.v->buffer_download(B->b.dev, s.y, 0, want,
	                                               (uint64_t)sh->n * cols * 4),
	                       "buffer_download", err))
		goto out;
	res = (struct result){ .kernel = "built-in" };
	B->row++;
	run_kernel(B, &s, want, got, &res);
	bench_kernels_report(B, &s, &res);
	for (size_t i = 0; i < B->n_k && !q4kh_interrupted(); i++) {
		struct q4kh_kernel *k = &B->k[i];
		struct q4kh_error e = { { 0 } };

		if (!times(B, k, type))
			continue;
		res = (struct result){ .kernel = k->plugin->name };
		B->row++;
		if (prepare_all(&s, k, &e)) {
			snprintf(res.note, sizeof(res.note), "failed: %.490s", e.msg);
			B->failed = 1;
		} else {
			run_kernel(B, &s, want, got, &res);
		}
		release_all(&s);
		bench_kernels_report(B, &s, &res);
	}
	rc = 0;
out:
	free(want);
	free(got);
	free_shape(B, &s);
	return rc;
}

/* --- setup ---------------------------------------------------------------------- */

/*
 * Without --backend, the backend q4khost run tries first on this machine
 * (select.h's order: a GPU backend with the device, else the host's fast
 * one, else the reference), named on stderr.
 */
static int default_backend(struct q4kh_host *h, struct opts *o, struct q4kh_error *err)
{
	struct q4kh_candidate *list = calloc(Q4KH_SELECT_MAX, sizeof(*list));
	const struct q4kh_select_request rq = { .host = h, .device = (uint32_t)o->device };
	int n;

	if (!list)
		return q4kh_fail(err, "out of memory");
	n = q4kh_select_plan(&rq, list, NULL, 0, err);
	o->backend = n > 0 ? list[0].backend : NULL; /* the registry's string */
	free(list);
	if (n == 0)
		return q4kh_fail(err, "no backend on the plugin path has device %ld", (long)o->device);
	if (n < 0)
		return -1;
	q4kh_progress_note("backend %s, the one q4khost run tries first here (--backend NAME "
	                   "times another)", o->backend);
	return 0;
}

/* The backend and its variants, on host context H: the ones the default
 * backend's plan started, opened once. */
static int open_all(struct bench *B, struct q4kh_host *h, struct q4kh_error *err)
{
	const struct q4kh_registry *r = h->registry;
	const struct q4kh_plugin *p = q4kh_registry_find(r, B->o->backend);

	if (q4kh_registry_check_backend(r, B->o->backend, "--backend", err) ||
	    q4kh_host_backend_open(h, p, (uint32_t)B->o->device, &B->b, err))
		return -1;
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *kp = &r->plugins[i];

		if (kp->state != Q4KH_PLUGIN_ACCEPTED || kp->desc->kind != Q4KH_KIND_KERNEL ||
		    strcmp(kp->desc->kernel->backend, q4kh_backend_kind(p)) ||
		    !listed(B->o->kernels, kp->name))
			continue;
		if (B->n_k == MAX_KERNELS)
			return q4kh_fail(err, "more than %d kernel variants", MAX_KERNELS);
		if (q4kh_kernel_open(kp, &B->b, &B->k[B->n_k], err))
			return -1;
		B->n_k++;
	}
	for (const char *q = B->o->kernels; q && *q;) {
		const char *e = strchr(q, ',');
		size_t l = e ? (size_t)(e - q) : strlen(q), i;

		for (i = 0; i < B->n_k && (strlen(B->k[i].plugin->name) != l ||
		                           strncmp(B->k[i].plugin->name, q, l));
		     i++)
			;
		if (i == B->n_k)
			return q4kh_fail(err, "--kernels: no accepted variant '%.*s' for backend %s",
			                 (int)l, q, B->o->backend);
		q += l + (e ? 1 : 0);
	}
	B->graphs = Q4KH_BACKEND_HAS(B->b.v, graph_begin) &&
	            Q4KH_BACKEND_HAS(B->b.v, graph_end) &&
	            Q4KH_BACKEND_HAS(B->b.v, graph_launch) && Q4KH_BACKEND_HAS(B->b.v, graph_free);
	B->timers = Q4KH_BACKEND_HAS(B->b.v, timer_start) &&
	            Q4KH_BACKEND_HAS(B->b.v, timer_stop);
	return 0;
}

static void close_all(struct bench *B)
{
	for (size_t i = 0; i < B->n_k; i++)
		q4kh_kernel_close(&B->k[i]);
	q4kh_backend_close(&B->b);
}

int q4kh_cmd_bench_kernels(int argc, char **argv)
{
	struct opts o;
	struct bench B = { .o = &o };
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *config = NULL;
	struct q4kh_registry *reg = NULL;
	struct q4kh_host h = { 0 }; /* no model: the weights are made up */
	int rc = parse(argc, argv, &o);

	if (rc)
		return rc > 0 ? Q4KH_EXIT_OK : Q4KH_EXIT_USAGE;
	q4kh_interrupt_install();
	q4kh_progress_init("bench-kernels");
	rc = Q4KH_EXIT_INPUT;
	if (q4kh_cli_config("bench-kernels", o.config_file, 0, &config, &err))
		goto out;
	rc = Q4KH_EXIT_FAIL;
	if (q4kh_registry_scan(o.plugin_path, config, &reg, &err) ||
	    q4kh_enumerate_vet(reg, config, &err) || q4kh_host_open(&h, reg, config, NULL, &err))
		goto out;
	rc = Q4KH_EXIT_PLUGIN;
	if ((!o.backend && default_backend(&h, &o, &err)) || open_all(&B, &h, &err))
		goto out;
	rc = Q4KH_EXIT_FAIL;
	if (!B.b.v->supports_type(B.b.ctx, Q4KH_TYPE_Q4_K)) {
		q4kh_fail(&err, "backend %s has no built-in Q4_K mul_mat to check against",
		          o.backend);
		goto out;
	}
	if (measure_ceiling(&B, &err))
		goto out;
	B.rows = json_array();
	B.total = count_rows(&B);
	if (!o.json)
		bench_kernels_print_header(&B);
	for (size_t t = 0; t < N_OF(types) && !q4kh_interrupted(); t++)
		for (size_t i = 0; i < N_OF(shapes) && !q4kh_interrupted(); i++)
			if (planned(&B, &shapes[i], types[t]) &&
			    bench_shape(&B, &shapes[i], types[t], &err))
				goto out;
	if (o.json)
		bench_kernels_print_json(&B);
	rc = B.failed ? Q4KH_EXIT_FAIL : Q4KH_EXIT_OK;
	err.msg[0] = 0;
	if (q4kh_interrupted()) {
		q4kh_fail(&err, "interrupted by %s after %zu of %zu rows; the rows done are above",
		          q4kh_signal_name(q4kh_interrupted()), B.done, B.total);
		rc = q4kh_interrupt_exit_code(q4kh_interrupted());
	}
out:
	q4kh_progress_clear();
	if (err.msg[0])
		fprintf(stderr, "q4khost bench-kernels: %s\n", err.msg);
	json_decref(B.rows);
	close_all(&B);
	q4kh_host_close(&h);
	q4kh_registry_free(reg);
	q4kh_config_free(config);
	return rc;
}
