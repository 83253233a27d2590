/*
 * The cuda backend's get_rows and mul_mat for every weight type, and the
 * tensor-core path's dequantisation to fp16, run on a host with no GPU:
 * plugins/cuda/cuda_matmul.cu (its launches, the plain kernel, get_rows),
 * cuda_gemv.cu (mul_mat's dispatch to the GEMV formats) and sdk/lib/cuda_tc.cu's
 * dequant_kernel, as they are, each launch emulated by tests/emu/emu.h.
 * Against gguf-py's values of tests/fixtures/dequant-blocks.txt (each
 * fixture row's blocks repeated along K and its rows cycled, so that a
 * warp's lanes walk several groups of a row; for F32, F16 and BF16 also a
 * row length not a multiple of 32):
 *  - get_rows gives gguf-py's values times the scale, bit for bit;
 *  - the fp16 slice of the tensor cores holds each value rounded to fp16;
 *  - y = W x, 1 to 9 columns, within 1e-5 of sum |w x| of the float64
 *    product (as tests/emu/gemv_emu.cpp judges), padding of y untouched.
 * Built and run by scripts/cuda-emulate.sh (it links cuBLAS and the CUDA
 * runtime for sdk/lib/cuda_tc.cu's other functions, which are not called); exit 0
 * when everything agrees.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu.h"

#include "cuda_gemv_formats.cuh"
#include "cuda_kernels.h"
/* cuda_tc.cu, its launches rewritten for emu.h by the script: its
 * dequant_kernel is launched here. cuda_gemv.cu and cuda_matmul.cu are
 * linked, compiled apart (their objects shared with moe_emu). */
#include "cuda_tc.emu.cu"

static std::mt19937_64 rng(3);

/* One tensor of the fixture: its rows' bytes and gguf-py's values. */
struct fixture_tensor {
	uint32_t type;
	std::string name;
	int64_t ne0, rows;
	std::vector<uint8_t> bytes;
	std::vector<float> values;
};

/* Bytes of a row of K values of TYPE (K a whole number of blocks). */
static size_t row_bytes(uint32_t type, int64_t k)
{
	return (size_t)(k / (int64_t)q4kh_type_block_elems(type)) * q4kh_type_block_bytes(type);
}

static uint32_t type_named(const std::string &name)
{
	for (uint32_t t = 0; t < Q4KH_TYPE_COUNT; t++)
		if (q4kh_type_name(t) && name == q4kh_type_name(t))
			return t;
	fprintf(stderr, "dequant-blocks.txt: unknown type %s\n", name.c_str());
	exit(2);
}

/* tests/fixtures/dequant-blocks.txt, as tests/blocks_fixture.c reads it. */
static std::vector<fixture_tensor> load_fixture(const char *path)
{
	FILE *f = fopen(path, "r");
	std::vector<fixture_tensor> out;
	char word[64];

	if (!f) {
		fprintf(stderr, "cannot open %s\n", path);
		exit(2);
	}
	while (fscanf(f, "%63s", word) == 1) {
		fixture_tensor t;
		char hex[3] = { 0 };
		size_t nb;

		if (strcmp(word, "tensor")) {
			if (fscanf(f, "%*[^\n]") < 0)
				break;
			continue;
		}
		if (fscanf(f, "%63s %ld %ld bytes", word, &t.ne0, &t.rows) != 3) {
			fprintf(stderr, "%s: bad tensor line\n", path);
			exit(2);
		}
		t.name = word;
		t.type = type_named(t.name);
		nb = row_bytes(t.type, t.ne0) * (size_t)t.rows;
		t.bytes.resize(nb);
		for (size_t i = 0; i < nb; i++) {
			if (fscanf(f, " %2c", hex) != 1) {
				fprintf(stderr, "%s: %s: byte %zu\n", path, word, i);
				exit(2);
			}
			t.bytes[i] = (uint8_t)strtoul(hex, nullptr, 16);
		}
		t.values.resize((size_t)(t.ne0 * t.rows));
		if (fscanf(f, " values") < 0)
			exit(2);
		for (float &v : t.values)
			if (fscanf(f, "%f", &v) != 1) {
				fprintf(stderr, "%s: %s: values\n", path, word);
				exit(2);
			}
		out.push_back(t);
	}
	fclose(f);
	return out;
}

static void *aligned(size_t bytes)
{
	void *p = nullptr;

	if (posix_memalign(&p, 16, bytes ? bytes : 16))
		abort();
	return p;
}

/* The fixture's T tiled: N rows of K values, row r fixture row r % rows
 * with its values repeated (for float types cut to K, any length). */
struct tiled {
	int64_t k, n;
	size_t row_bytes;
	uint8_t *w;
	std::vector<double> values;
};

static tiled tile(const fixture_tensor &t, int64_t k, int64_t n)
{
	const size_t frb = row_bytes(t.type, t.ne0);
	tiled o{ k, n, row_bytes(t.type, k), nullptr, {} };

	o.w = (uint8_t *)aligned(o.row_bytes * (size_t)n);
	o.values.resize((size_t)(k * n));
	for (int64_t r = 0; r < n; r++) {
		const int64_t src = r % t.rows;
		const size_t eb = frb / (size_t)t.ne0 * (q4kh_type_block_elems(t.type) == 1);

		for (int64_t v = 0; v < k; v++)
			o.values[(size_t)(r * k + v)] = t.values[(size_t)(src * t.ne0 + v % t.ne0)];
		if (eb) /* an element at a time */
			for (int64_t v = 0; v < k; v++)
				memcpy(o.w + r * o.row_bytes + v * eb,
				       t.bytes.data() + src * frb + (v % t.ne0) * eb, eb);
		else
			for (size_t c = 0; c < o.row_bytes / frb; c++)
				memcpy(o.w + r * o.row_bytes + c * frb, t.bytes.data() + src * frb, frb);
	}
	return o;
}

static cuda_view view(char *data, uint32_t type, int64_t ne0, int64_t ne1, int64_t nb1)
{
	cuda_view v{};

	v.data = data;
	v.type = type;
	v.ne[0] = ne0;
	v.ne[1] = ne1;
	v.ne[2] = v.ne[3] = 1;
	v.nb[0] = (int64_t)q4kh_type_block_bytes(type);
	v.nb[1] = nb1;
	v.nb[2] = v.nb[3] = nb1 * ne1;
	return v;
}

static int check_get_rows(const fixture_tensor &f, const tiled &t)
{
	const int32_t ids[5] = { 0, (int32_t)t.n - 1, 5, 5, 1 };
	std::vector<float> out((size_t)(5 * t.k));
	int32_t fault[CUDA_FAULT_WORDS] = { 0 };
	int bad = 0;

	for (float scale : { 1.0f, 0.75f }) {
		cuda_view w = view((char *)t.w, f.type, t.k, t.n, (int64_t)t.row_bytes);
		cuda_view o = view((char *)out.data(), Q4KH_TYPE_F32, t.k, 5, 4 * t.k);

		if (cuda_launch_get_rows(&w, ids, 5, scale, &o, fault, 0) != cudaSuccess ||
		    fault[0]) {
			fprintf(stderr, "  %s get_rows: launch failed\n", f.name.c_str());
			return 1;
		}
		for (int64_t c = 0; c < 5; c++)
			for (int64_t v = 0; v < t.k; v++) {
				const float want = (float)(t.values[(size_t)(ids[c] * t.k + v)] * scale);
				const float got = out[(size_t)(c * t.k + v)];

				if (memcmp(&got, &want, 4) && !(got == 0 && want == 0) && bad++ < 5)
					fprintf(stderr, "  %s get_rows id %d value %lld: %.9g, want %.9g\n",
					        f.name.c_str(), ids[c], (long long)v, got, want);
			}
	}
	printf("get_rows %-6s k=%lld n=%lld: %s\n", f.name.c_str(), (long long)t.k,
	       (long long)t.n, bad ? "FAIL" : "gguf-py's values");
	return bad != 0;
}

static int check_dequant(const fixture_tensor &f, const tiled &t)
{
	std::vector<__half> out((size_t)(t.k * t.n));
	int bad = 0;

	q4kh_for_type(f.type, [&](auto ty) {
		constexpr uint32_t T = decltype(ty)::value;

		emu_launch(dequant_kernel<T>, emu_cfg(dim3(3), dim3(TC_THREADS)), t.w,
		           (int64_t)t.row_bytes, t.k, t.n, out.data());
		return cudaGetLastError();
	});
	for (size_t i = 0; i < out.size(); i++) {
		const __half want = __float2half_rn((float)t.values[i]);

		if (memcmp(&out[i], &want, 2) && bad++ < 5)
			fprintf(stderr, "  %s fp16 value %zu: %.9g, want %.9g\n", f.name.c_str(), i,
			        __half2float(out[i]), __half2float(want));
	}
	printf("fp16     %-6s k=%lld n=%lld: %s\n", f.name.c_str(), (long long)t.k,
	       (long long)t.n, bad ? "FAIL" : "gguf-py's values rounded");
	return bad != 0;
}

/* Whether mul_mat of W and X takes the GEMV format of W's type (else the
 * plain kernel of cuda_matmul.cu): the loads' test, gv_fits, on the
 * addresses and strides cuda_gemv_launch gives it. */
static bool takes_gemv(const cuda_view &w, const cuda_view &x)
{
	const uintptr_t wa = (uintptr_t)w.data | (uintptr_t)(w.ne[1] > 1 ? w.nb[1] : 0);
	const uintptr_t xa = (uintptr_t)x.data | (uintptr_t)(x.ne[1] > 1 ? x.nb[1] : 0);

	return q4kh_for_type(w.type, [&](auto ty) {
		return gv_fits<decltype(ty)::value>(wa, xa, w.ne[0]) ? cudaSuccess
		                                                      : cudaErrorNotSupported;
	}) == cudaSuccess;
}

static int check_mul_mat(const fixture_tensor &f, const tiled &t, int64_t cols)
{
	const int64_t xcol = t.k + 4, ycol = t.n + 3;
	float *x = (float *)aligned(sizeof(float) * (size_t)(xcol * cols));
	std::vector<float> y((size_t)(ycol * cols), NAN);
	cuda_view w = view((char *)t.w, f.type, t.k, t.n, (int64_t)t.row_bytes);
	cuda_view xv = view((char *)x, Q4KH_TYPE_F32, t.k, cols, 4 * xcol);
	cuda_view yv = view((char *)y.data(), Q4KH_TYPE_F32, t.n, cols, 4 * ycol);
	double worst = 0;
	int bad = 0;

	for (int64_t i = 0; i < xcol * cols; i++)
		x[i] = (float)((double)(rng() >> 11) / 4503599627370496.0 - 1.0);
	if (cuda_launch_mul_mat(&w, &xv, &yv, 2, 1, 0) != cudaSuccess) {
		fprintf(stderr, "  %s mul_mat: launch failed\n", f.name.c_str());
		free(x);
		return 1;
	}
	for (int64_t c = 0; c < cols; c++) {
		for (int64_t r = 0; r < t.n; r++) {
			double s = 0, sa = 0, e;
			const double got = y[(size_t)(c * ycol + r)];

			for (int64_t i = 0; i < t.k; i++) {
				const double p = t.values[(size_t)(r * t.k + i)] * x[c * xcol + i];

				s += p;
				sa += fabs(p);
			}
			e = fabs(got - s) / (sa > 0 ? sa : 1);
			if (!(e < 1e-5) && bad++ < 5)
				fprintf(stderr, "  %s row %lld column %lld: %.9g, want %.9g\n",
				        f.name.c_str(), (long long)r, (long long)c, got, s);
			if (!(e <= worst))
				worst = e;
		}
		for (int64_t r = t.n; r < ycol; r++)
			if (!std::isnan(y[(size_t)(c * ycol + r)]) && bad++ < 5)
				fprintf(stderr, "  padding row %lld of column %lld written\n",
				        (long long)r, (long long)c);
	}
	free(x);
	printf("mul_mat  %-6s k=%lld n=%lld t=%lld (%s): worst %.2g: %s\n", f.name.c_str(),
	       (long long)t.k, (long long)t.n, (long long)cols,
	       takes_gemv(w, xv) ? "GEMV format" : "plain kernel",
	       worst, bad ? "FAIL" : "ok");
	return bad != 0;
}

int main(int argc, char **argv)
{
	const std::vector<fixture_tensor> fx =
		load_fixture(argc > 1 ? argv[1] : "tests/fixtures/dequant-blocks.txt");
	int fails = 0;

	if (fx.size() != 15) {
		fprintf(stderr, "the fixture has %zu types, q4khost runs 15\n", fx.size());
		return 1;
	}
	for (const fixture_tensor &f : fx) {
		const bool flt = q4kh_type_block_elems(f.type) == 1;
		std::vector<int64_t> ks = { 9 * f.ne0 };

		if (flt)
			ks.push_back(9 * f.ne0 - 5);
		if (!cuda_type_supported(f.type)) {
			fprintf(stderr, "  cuda_type_supported(%s) is 0\n", f.name.c_str());
			fails++;
			continue;
		}
		for (int64_t k : ks) {
			tiled t = tile(f, k, 37);

			fails += check_get_rows(f, t);
			if (!flt)
				fails += check_dequant(f, t);
			for (int64_t c = 1; c <= 9; c++)
				fails += check_mul_mat(f, t, c);
			free(t.w);
		}
	}
	printf("%s\n", fails ? "FAILED" : "all agree");
	return fails != 0;
}
