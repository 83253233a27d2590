#!/usr/bin/env bash
# Build here what scripts/gpu-check.sh runs on a GPU machine, small enough
# to carry there (the tool that reaches it takes 64 MiB a call):
#   _build/gpu          configure --with-cuda --with-cuda-arch=90 (H200 only:
#                       a fast build), everything plus the test programs
#   .gpu/build          the CLI, the tests/test_cuda_* programs (among them
#                       test_cuda_graph: whole steps through cuda-mwv's
#                       fused products), test_batch (its cuda case),
#                       test_serve (serve over pages on cuda),
#                       test_cpu_simd (the AVX-512 VNNI gemm, on the
#                       machine's Xeon) and every plugins/*/.libs/*.so,
#                       in the build folder's layout
#   .gpu/lib            the shared libraries they need that a bare Ubuntu
#                       24.04 with the CUDA toolkit lacks: everything ldd
#                       names except glibc, libstdc++/libgcc and CUDA's
#   .gpu/bundle.tar.xz  both, packed: what is carried (the two folders are
#                       removed here; scripts/gpu-unpack.sh unpacks them
#                       there, as gpu-check.sh and bench-engines.sh do)
# Other files in .gpu (llama.cpp.tar.xz) stay. Then prints the sizes. Usage: scripts/gpu-bundle.sh [CONFIGURE-ARGS]
# (default --with-cuda-arch=90; they apply when _build/gpu is configured,
# that is when it has no Makefile yet). Carry .gpu; run
# scripts/gpu-check.sh there.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build="$top/_build/gpu"
bundle="$top/.gpu"
cd "$top"

[ $# -gt 0 ] || set -- --with-cuda-arch=90
Q4KH_BUILD_DIR="$build" scripts/build.sh --with-cuda "$@"
grep -q 'define Q4KH_CUDA_ARCHS' "$build/buildconf.h" ||
	{ echo "gpu-bundle.sh: $build was configured without CUDA; remove it and retry" >&2; exit 1; }
make -C "$build" -j"$(nproc)" check TESTS= >/dev/null

rm -rf "$bundle/build" "$bundle/lib" "$bundle/bundle.tar.xz"
mkdir -p "$bundle/build" "$bundle/lib"
(
	cd "$build"
	files=(host/cli/q4khost)
	for f in tests/test_cuda_* tests/test_batch tests/test_serve tests/test_cpu_simd \
		plugins/*/.libs/*.so; do
		case $f in *.c | *.o | *.log | *.trs) continue ;; esac
		[ -f "$f" ] && [ -x "$f" ] && files+=("$f")
	done
	for f in "${files[@]}"; do
		mkdir -p "$bundle/build/$(dirname "$f")"
		cp -p "$f" "$bundle/build/$f"
	done
	printf '%s\n' "${files[@]}" >"$bundle/build/FILES"
)

# What the GPU machine has: the C library, the compiler's runtime, CUDA.
system_lib='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libmvec|libstdc\+\+|libgcc_s|libcuda|libcudart|libnvidia-|libnvrtc|libnvJitLink|libcublas|libcublasLt)[.-]'
missing=0
while read -r name arrow path rest; do
	[ "$arrow" = "=>" ] || continue
	if [ "$path" = "not" ]; then
		echo "gpu-bundle.sh: $name not found here" >&2
		missing=1
		continue
	fi
	[[ $name =~ $system_lib ]] && continue
	cp -L "$path" "$bundle/lib/$name"
done < <(cd "$bundle/build" && xargs ldd <FILES | grep '=>' | sort -u)
[ $missing -eq 0 ] || exit 1

echo "binaries and plugins: $(du -sh "$bundle/build" | cut -f1) ($(wc -l <"$bundle/build/FILES") files)"
echo "libraries:            $(du -sh "$bundle/lib" | cut -f1): $(ls "$bundle/lib" | tr '\n' ' ')"
tar -C "$bundle" -cJf "$bundle/bundle.tar.xz" build lib
rm -rf "$bundle/build" "$bundle/lib"
kib=$(du -sk "$bundle" | cut -f1)
echo "carried:              $((kib / 1024)) MiB in $bundle ($(ls "$bundle" | tr '\n' ' '))"
[ "$kib" -le $((30 * 1024)) ] ||
	echo "gpu-bundle.sh: warning: more than 30 MiB; a call carries 64 MiB with the working tree" >&2
