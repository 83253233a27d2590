#!/usr/bin/env bash
# The peer, carried: llama.cpp's source as the llama-cpp-python 0.3.36
# sdist vendors it, trimmed to what llama-bench, llama-batched-bench and
# llama-server need on a CUDA machine (no other ggml backend, no docs,
# models, tests or web UI assets), packed as .gpu/llama.cpp.tar.xz for the
# device tool to carry. scripts/bench-engines.sh unpacks and builds it
# there. Prints the size.
#   scripts/llamacpp-bundle.sh [--build-cpu]
# --build-cpu: also configure and build the three programs here for the
# CPU (a check that the trimmed tree still builds; about 10 minutes on 2
# cores), in _build/llamacpp-cpu.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
version=0.3.36
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "llamacpp-bundle: fetching llama-cpp-python $version (sdist)" >&2
pip download --quiet --no-binary :all: --no-deps -d "$work" "llama-cpp-python==$version"
tar -xzf "$work"/llama_cpp_python-$version.tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
[ -f "$src/CMakeLists.txt" ] || { echo "llamacpp-bundle: no vendor/llama.cpp in the sdist" >&2; exit 1; }

# What none of the three programs builds from.
rm -rf "$src"/{docs,models,media,gguf-py,benches,conversion,.github,.devops,.git}
for d in "$src"/ggml/src/ggml-*/; do
	case $(basename "$d") in ggml-cpu | ggml-cuda) ;; *) rm -rf "$d" ;; esac
done
# The web UI's sources and assets. Its CMake files and the templates of the
# embedded-asset table stay: llama-server builds without a UI from them
# when the assets cannot be downloaded, as on the GPU machine.
find "$src/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt \
	! -name sources.cmake ! -name '*.in' -exec rm -rf {} +

mkdir -p .gpu
tar -C "$(dirname "$src")" -cJf .gpu/llama.cpp.tar.xz llama.cpp
echo "llamacpp-bundle: .gpu/llama.cpp.tar.xz $(du -h .gpu/llama.cpp.tar.xz | cut -f1) (llama.cpp of llama-cpp-python $version)" >&2

if [ "${1:-}" = --build-cpu ]; then
	rm -rf _build/llamacpp-cpu
	mkdir -p _build/llamacpp-cpu
	tar -C _build/llamacpp-cpu -xJf .gpu/llama.cpp.tar.xz
	cmake -S _build/llamacpp-cpu/llama.cpp -B _build/llamacpp-cpu/build \
		-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
	cmake --build _build/llamacpp-cpu/build -j"$(nproc)" \
		--target llama-bench llama-batched-bench llama-server >/dev/null
	ls -la _build/llamacpp-cpu/build/bin/
fi
