/*
 * The cuda backend's attention over pages (attention_paged, ABI 1.8:
 * plugins/cuda/cuda_attention.cu with the block table read by
 * cuda_attention.cuh's key_row) run on a host, with no GPU: the .cu file
 * as it is, launch code included, each launch emulated by
 * tests/emu/emu.h. Both of its forms: the split form of decode (scratch
 * given, head dimensions 64, 128 and 256) and the one-pass form (no
 * scratch, head dimension 96); the tensor-core form (cuda_flash.cu,
 * mma.sync) has no emulation and declines here as it does before compute
 * capability 8.0. The split form is cut for a device of the case's
 * multiprocessors: the decode shapes of Llama-3-8B (group 4),
 * Qwen3-30B-A3B (group 8) and Qwen2.5-1.5B (group 6, the kernel for any
 * group) on 132, up to 4,096 keys (ranges of one batch a warp, of several
 * with the next in flight, of one range for the whole query without a
 * merge, merges of more partials than a thread has in flight), and few
 * multiprocessors for ranges of thousands of keys.
 * For each: F16 and F32 caches, pages of 16 and of 7, block tables that
 * shuffle the pools' pages (two more pages than a table names, NaN in
 * every row no key of the table is in: read, they show), windows, one to
 * eight queries at any positions:
 *  - over pages, the bits the same kernel gives over a contiguous cache
 *    holding the same rows (only the rows' addresses differ);
 *  - both within a bound of the attention computed here in double from the
 *    cache's values (plugin.h, attention_ext);
 *  - the split form leaves its counters at zero;
 *  - a table entry outside the pools that a query reads is the fault
 *    CUDA_FAULT_ATTENTION_PAGES with its index, value and limit;
 *  - a launch whose parameters stay (a recording's replays) reads the
 *    table and positions rewritten in place since: each run gives the
 *    contiguous cache's bits for the new ones.
 * Built and run by scripts/cuda-emulate.sh; exit 0 when everything agrees.
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "emu.h"

/* The .cu file, its launches rewritten for emu.h by the script. */
#include "cuda_attention.emu.cu"

/* cuda_flash.cu's tensor cores have no emulation: they decline, as they
 * do on a device before compute capability 8.0. */
extern "C" cudaError_t cuda_launch_flash(const struct cuda_view *, const struct cuda_view *,
                                         const struct cuda_view *, const struct cuda_attn *,
                                         const struct cuda_view *, int, int32_t *,
                                         cudaStream_t)
{
	return cudaErrorNotSupported;
}

static std::mt19937_64 rng(7);

static double urand(void)
{
	return (double)(rng() >> 11) * (1.0 / 9007199254740992.0);
}

/* A contiguous {n0, n1, n2} view over BYTES of its own. */
struct buf {
	std::vector<unsigned char> bytes;
	cuda_view v{};

	buf(uint32_t type, int64_t n0, int64_t n1, int64_t n2)
	{
		const int64_t es = type == Q4KH_TYPE_F16 ? 2 : 4;

		bytes.resize((size_t)(es * n0 * n1 * n2));
		v.data = (char *)bytes.data();
		v.type = type;
		v.ne[0] = n0;
		v.ne[1] = n1;
		v.ne[2] = n2;
		v.ne[3] = 1;
		v.nb[0] = es;
		v.nb[1] = es * n0;
		v.nb[2] = v.nb[1] * n1;
		v.nb[3] = v.nb[2] * n2;
	}
	void put(int64_t i, float x)
	{
		if (v.type == Q4KH_TYPE_F16)
			((__half *)v.data)[i] = __float2half(x);
		else
			((float *)v.data)[i] = x;
	}
	double get(int64_t i) const
	{
		return v.type == Q4KH_TYPE_F16 ? (double)__half2float(((const __half *)v.data)[i])
		                               : (double)((const float *)v.data)[i];
	}
};

struct attn_case {
	const char *name;
	int64_t hd, nh, nkv, n_ctx;
	int32_t window;
	uint32_t type;
	std::vector<int32_t> pos;
	bool split; /* give scratch: the split form, where it takes the shape */
	int sms;    /* the device's multiprocessors, which cut the split form */
};

/* C's launch parameters over K with the table PAGES (NULL: contiguous)
 * of N_TABLE pages of PAGE, positions POS: what a recording freezes, the
 * table and positions by address. */
static cuda_attn params(const attn_case &c, const buf &k, const int32_t *pos,
                        const int32_t *pages, int64_t n_table, int32_t page)
{
	cuda_attn a{};

	a.pos = pos;
	a.window = c.window;
	a.scale = (float)(1.0 / sqrt((double)c.hd));
	a.pages = pages;
	a.n_table = n_table;
	a.page_size = page;
	a.n_pages = pages ? k.v.ne[2] / page : 0;
	return a;
}

/* Launch C once with A over the cache K, V; the output, and the fault
 * words into FAULT. */
static std::vector<float> launch(const attn_case &c, const buf &q, const buf &k, const buf &v,
                                 const cuda_attn &a, int32_t *fault)
{
	const int64_t T = (int64_t)c.pos.size();
	buf out(Q4KH_TYPE_F32, c.hd, c.nh, T);
	std::vector<unsigned char> scratch;
	const size_t need = cuda_attention_scratch(&q.v, &k.v, &v.v, c.sms);

	scratch.assign(need, 0);
	memset(fault, 0, sizeof(int32_t) * CUDA_FAULT_WORDS);
	if (cuda_launch_attention(&q.v, &k.v, &v.v, &a, &out.v,
	                          c.split && need ? scratch.data() : NULL, c.sms, 7, fault, 1,
	                          0) != cudaSuccess) {
		fprintf(stderr, "  %s: the launch failed\n", c.name);
		exit(1);
	}
	for (size_t i = 0; c.split && i < need && i < CUDA_SCRATCH_COUNTERS * sizeof(int); i++)
		if (scratch[i]) {
			fprintf(stderr, "  %s: counter byte %zu is %d after the launch\n", c.name, i,
			        scratch[i]);
			exit(1);
		}
	return std::vector<float>((const float *)out.v.data,
	                          (const float *)out.v.data + c.hd * c.nh * T);
}

/* Run C once over CACHE (K, V) with the table PAGES (NULL: contiguous);
 * the output, and the fault words into FAULT. */
static std::vector<float> run(const attn_case &c, const buf &q, const buf &k, const buf &v,
                              const int32_t *pos, const int32_t *pages, int64_t n_table,
                              int32_t page, int32_t *fault)
{
	return launch(c, q, k, v, params(c, k, pos, pages, n_table, page), fault);
}

/* The pools KP, VP of PAGE-token pages NaN but for the N_CTX rows of K, V,
 * row j in slot table[j / page] * page + j % page. */
static void fill_pools(const buf &k, const buf &v, int64_t n_ctx, const int32_t *table,
                       int32_t page, buf &kp, buf &vp)
{
	const int64_t n = kp.v.ne[0] * kp.v.ne[1] * kp.v.ne[2];

	for (int64_t i = 0; i < n; i++) {
		kp.put(i, NAN);
		vp.put(i, NAN);
	}
	for (int64_t j = 0; j < n_ctx; j++) {
		const int64_t s = (int64_t)table[j / page] * page + j % page;

		memcpy(kp.v.data + s * kp.v.nb[2], k.v.data + j * k.v.nb[2], (size_t)k.v.nb[2]);
		memcpy(vp.v.data + s * vp.v.nb[2], v.v.data + j * v.v.nb[2], (size_t)v.v.nb[2]);
	}
}

/* Random values in [-1, 1) for the first N of B. */
static void fill_random(buf &b, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		b.put(i, (float)(2.0 * urand() - 1.0));
}

/* Case C with pages of PAGE: 0 when everything agrees. */
static int check(const attn_case &c, int32_t page)
{
	const int64_t T = (int64_t)c.pos.size(), row = c.hd * c.nkv;
	const int64_t n_table = (c.n_ctx + page - 1) / page, n_pages = n_table + 2;
	buf q(Q4KH_TYPE_F32, c.hd, c.nh, T), k(c.type, c.hd, c.nkv, c.n_ctx),
		v(c.type, c.hd, c.nkv, c.n_ctx), kp(c.type, c.hd, c.nkv, n_pages * page),
		vp(c.type, c.hd, c.nkv, n_pages * page);
	std::vector<int32_t> table((size_t)n_pages);
	int32_t fault[CUDA_FAULT_WORDS];
	int bad = 0;

	fill_random(q, c.hd * c.nh * T);
	fill_random(k, row * c.n_ctx);
	fill_random(v, row * c.n_ctx);
	for (int64_t i = 0; i < n_pages; i++)
		table[(size_t)i] = (int32_t)i;
	std::shuffle(table.begin(), table.end(), rng);
	fill_pools(k, v, c.n_ctx, table.data(), page, kp, vp);

	const std::vector<float> flat = run(c, q, k, v, c.pos.data(), NULL, 0, 0, fault);
	const std::vector<float> paged = run(c, q, kp, vp, c.pos.data(), table.data(), n_table,
	                                     page, fault);

	if (fault[0]) {
		fprintf(stderr, "  %s, pages of %d: fault %d\n", c.name, page, fault[0]);
		return 1;
	}
	for (int64_t t = 0; t < T; t++)
		for (int64_t h = 0; h < c.nh; h++) {
			const int64_t p = c.pos[(size_t)t], g = h / (c.nh / c.nkv);
			const int64_t first = c.window && p - c.window + 1 > 0 ? p - c.window + 1 : 0;
			std::vector<double> s((size_t)(p - first + 1));
			double mx = -INFINITY, sum = 0;

			for (int64_t j = first; j <= p; j++) {
				double d = 0;

				for (int64_t i = 0; i < c.hd; i++)
					d += (double)((const float *)q.v.data)[(t * c.nh + h) * c.hd + i] *
					     k.get((j * c.nkv + g) * c.hd + i);
				s[(size_t)(j - first)] = d / sqrt((double)c.hd);
				mx = fmax(mx, s[(size_t)(j - first)]);
			}
			for (double &x : s)
				sum += x = exp(x - mx);
			for (int64_t i = 0; i < c.hd; i++) {
				const size_t at = (size_t)((t * c.nh + h) * c.hd + i);
				double want = 0;

				for (int64_t j = first; j <= p; j++)
					want += s[(size_t)(j - first)] * v.get((j * c.nkv + g) * c.hd + i);
				want /= sum;
				if (memcmp(&paged[at], &flat[at], sizeof(float)) && bad++ < 3)
					fprintf(stderr, "  %s, pages of %d: out[%zu] = %.9g over pages, %.9g contiguous\n",
					        c.name, page, at, (double)paged[at], (double)flat[at]);
				if (!(fabs(flat[at] - want) <= 1e-4 * (1.0 + fabs(want))) && bad++ < 3)
					fprintf(stderr, "  %s: out[%zu] = %.9g, float64 %.9g\n", c.name, at,
					        (double)flat[at], want);
			}
		}
	return bad != 0;
}

/* A table entry past the pools, read by the query at 40: the fault. */
static int check_fault(void)
{
	const attn_case c = { "fault", 64, 1, 1, 64, 0, Q4KH_TYPE_F16, { 40 }, true, 4 };
	buf q(Q4KH_TYPE_F32, 64, 1, 1), k(Q4KH_TYPE_F16, 64, 1, 64), v(Q4KH_TYPE_F16, 64, 1, 64);
	const int32_t pages[3] = { 1, 3, 9 };
	int32_t fault[CUDA_FAULT_WORDS];

	run(c, q, k, v, c.pos.data(), pages, 3, 16, fault);
	if (fault[0] != CUDA_FAULT_ATTENTION_PAGES || fault[1] != 2 || fault[2] != 9 ||
	    fault[3] != 4) {
		fprintf(stderr, "  fault words %d %d %d %d, expected %d 2 9 4\n", fault[0], fault[1],
		        fault[2], fault[3], CUDA_FAULT_ATTENTION_PAGES);
		return 1;
	}
	return 0;
}

/*
 * A recorded launch replayed (plugins/cuda/cuda_graph.c): a decode's
 * parameters frozen once, and its block table and position rewritten in
 * place between launches, as the host rewrites a step's inputs between
 * replays, for a sequence on other pages of the pools at another
 * position each time. Each launch gives the bits of a contiguous cache
 * holding that table's rows, at that position.
 */
static int check_replayed(void)
{
	const attn_case c = { "replayed", 128, 8, 2, 96, 0, Q4KH_TYPE_F16, { 0 }, true, 4 };
	const int32_t page = 16, n_table = 6, n_pages = 9;
	const int64_t row = c.hd * c.nkv;
	buf q(Q4KH_TYPE_F32, c.hd, c.nh, 1), k(c.type, c.hd, c.nkv, c.n_ctx),
		v(c.type, c.hd, c.nkv, c.n_ctx), kp(c.type, c.hd, c.nkv, n_pages * page),
		vp(c.type, c.hd, c.nkv, n_pages * page);
	std::vector<int32_t> table((size_t)n_table), all((size_t)n_pages);
	int32_t pos = 0, fault[CUDA_FAULT_WORDS];
	const cuda_attn a = params(c, kp, &pos, table.data(), n_table, page);
	int bad = 0;

	for (int32_t at : { 40, 95, 17 }) {
		fill_random(q, c.hd * c.nh);
		fill_random(k, row * c.n_ctx);
		fill_random(v, row * c.n_ctx);
		for (int32_t i = 0; i < n_pages; i++)
			all[(size_t)i] = i;
		std::shuffle(all.begin(), all.end(), rng);
		std::copy(all.begin(), all.begin() + n_table, table.begin());
		pos = at;
		fill_pools(k, v, c.n_ctx, table.data(), page, kp, vp);

		const std::vector<float> got = launch(c, q, kp, vp, a, fault);
		const int32_t paged_fault = fault[0];
		const std::vector<float> want = run(c, q, k, v, &pos, NULL, 0, 0, fault);

		if (paged_fault || memcmp(got.data(), want.data(), sizeof(float) * got.size())) {
			fprintf(stderr, "  replayed at position %d: %s\n", at,
			        paged_fault ? "a fault" : "not the contiguous cache's bits");
			bad++;
		}
	}
	return bad != 0;
}

int main(void)
{
	const attn_case cases[] = {
		{ "decode, hd 128, GQA 4", 128, 8, 2, 300, 0, Q4KH_TYPE_F16, { 299 }, true, 4 },
		{ "decode, hd 64, window 50, F32", 64, 4, 1, 200, 50, Q4KH_TYPE_F32, { 150 }, true, 4 },
		{ "three queries anywhere, hd 128", 128, 4, 4, 120, 0, Q4KH_TYPE_F16, { 119, 3, 64 },
		  true, 4 },
		{ "Llama-3-8B decode at 512, 132 SMs", 128, 32, 8, 520, 0, Q4KH_TYPE_F16, { 511 },
		  true, 132 },
		{ "Qwen3-30B-A3B decode at 4096, 132 SMs", 128, 32, 4, 4100, 0, Q4KH_TYPE_F16,
		  { 4095 }, true, 132 },
		{ "group 8, 2 SMs: ranges of 1,504 keys", 128, 16, 2, 3001, 0, Q4KH_TYPE_F16,
		  { 3000 }, true, 2 },
		{ "eight queries, group 8, window 700", 128, 16, 2, 3000, 700, Q4KH_TYPE_F16,
		  { 2999, 0, 31, 32, 700, 1500, 2047, 2998 }, true, 132 },
		{ "Qwen2.5-1.5B decode at 1000 (group 6), two queries", 128, 12, 2, 1100, 0,
		  Q4KH_TYPE_F16, { 999, 1000 }, true, 132 },
		{ "group 3, F32, hd 64", 64, 6, 2, 300, 0, Q4KH_TYPE_F32, { 299 }, true, 4 },
		{ "21 keys in one range, 40 in two, hd 64", 64, 8, 2, 40, 0, Q4KH_TYPE_F16, { 20, 39 }, true, 132 },
		{ "hd 256, one KV head, 65 ranges", 256, 4, 1, 4200, 0, Q4KH_TYPE_F16, { 4100 }, true,
		  132 },
		{ "hd 128, F32, window 1000", 128, 8, 2, 2100, 1000, Q4KH_TYPE_F32, { 2050 }, true, 4 },
		{ "one-pass, hd 96, five queries", 96, 6, 2, 90, 0, Q4KH_TYPE_F16,
		  { 10, 11, 12, 50, 89 }, false, 4 },
		{ "one-pass, hd 64, window 9, F32", 64, 2, 1, 40, 9, Q4KH_TYPE_F32, { 39, 0, 20 },
		  false, 4 },
	};
	int failed = 0, n = 0;

	for (const attn_case &c : cases)
		for (int32_t page : { 16, 7 }) {
			const int bad = check(c, page);

			printf("%s  %s, pages of %d\n", bad ? "FAIL" : "ok  ", c.name, page);
			failed += bad;
			n++;
		}
	const int replay_bad = check_replayed();

	printf("%s  a frozen launch, its table and position rewritten\n", replay_bad ? "FAIL" : "ok  ");
	failed += replay_bad;
	n++;
	const int fault_bad = check_fault();

	printf("%s  a table entry past the pools is a fault\n", fault_bad ? "FAIL" : "ok  ");
	failed += fault_bad;
	printf("attention: %d of %d checks failed\n", failed, n + 1);
	return failed != 0;
}
