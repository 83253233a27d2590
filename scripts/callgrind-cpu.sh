#!/usr/bin/env bash
# Instructions per decode step, q4khost's fast cpu path next to llama.cpp,
# counted by valgrind --tool=callgrind: the noise-free figure next to
# scripts/bench-cpu.py's timings (docs/perf.md). One thread each; N1 and N2
# greedy steps after the same prompt, per step = the difference / (N2 - N1),
# so loading and prefill cancel out.
#
# valgrind runs no AVX-512: q4khost then picks its AVX2 loops and kernels
# by itself; llama.cpp is the llama-cpp-python 0.3.36 sdist's
# vendor/llama.cpp built here for AVX2 (the wheel's AVX-512 build stops
# valgrind), driven through libllama by the small program below. The
# build (about 10 minutes on 2 cores) is kept in _build/llamacpp-avx2.
#
#   scripts/callgrind-cpu.sh Q4KHOST-BINARY MODEL [N1 N2]
# Q4KHOST_PLUGIN_PATH must name the cpu, cpu-fast and cpu-simd plugins.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
q4khost=$1 model=$2 n1=${3:-4} n2=${4:-12}
prompt="The history of computing is"
work="$top/_build/llamacpp-avx2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if [ ! -x "$work/decode" ]; then
	mkdir -p "$work"
	pip download --quiet --no-binary :all: --no-deps -d "$work" "llama-cpp-python==0.3.36"
	tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
	src="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
	cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
		-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
		-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
	cmake --build "$work/build" -j2 --target llama >/dev/null
	# N greedy steps after a prompt, one thread: what q4khost run -n N does.
	cat >"$work/decode.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
int main(int argc, char **argv)
{
	struct llama_model *m;
	struct llama_context *ctx;
	struct llama_context_params cp = llama_context_default_params();
	const struct llama_vocab *v;
	llama_token toks[512];
	int n = atoi(argv[2]), nt, nv;

	llama_backend_init();
	m = llama_model_load_from_file(argv[1], llama_model_default_params());
	cp.n_ctx = cp.n_batch = 512;
	cp.n_threads = cp.n_threads_batch = 1;
	ctx = llama_init_from_model(m, cp);
	v = llama_model_get_vocab(m);
	nt = llama_tokenize(v, argv[3], (int)strlen(argv[3]), toks, 512, 1, 0);
	nv = llama_vocab_n_tokens(v);
	llama_decode(ctx, llama_batch_get_one(toks, nt));
	for (int i = 0; i < n; i++) {
		const float *lg = llama_get_logits_ith(ctx, -1);
		llama_token best = 0;

		for (int j = 1; j < nv; j++)
			best = lg[j] > lg[best] ? j : best;
		llama_decode(ctx, llama_batch_get_one(&best, 1));
	}
	return 0;
}
EOF
	cc -O2 -I"$src/include" -I"$src/ggml/include" "$work/decode.c" -o "$work/decode" \
		-L"$work/build/bin" -lllama -Wl,-rpath,"$work/build/bin"
fi

printf '[plugin.cpu]\nthreads = 1\n[plugin.cpu-fast]\nthreads = 1\nspin_us = 0\n[plugin.cpu-simd]\nthreads = 1\n' \
	>"$out/one-thread.ini"
# The instructions valgrind counted for one run of "$@".
count() {
	valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$@" >"$out/log" 2>&1
	sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/log"
}
for engine in q4khost llama.cpp; do
	for n in "$n1" "$n2"; do
		if [ $engine = q4khost ]; then
			c[$n]=$(count "$q4khost" run -m "$model" -p "$prompt" -n "$n" --raw --f2 off \
				--config "$out/one-thread.ini" --backend cpu-fast --kernel cpu-simd)
		else
			c[$n]=$(count "$work/decode" "$model" "$n" "$prompt")
		fi
	done
	echo "$engine: $(((c[$n2] - c[$n1]) / (n2 - n1))) instructions per decode step"
done
