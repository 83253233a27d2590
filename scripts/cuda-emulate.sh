#!/usr/bin/env bash
# Run the cuda backend's kernels without a GPU: builds the harnesses of
# tests/emu (tests/emu/emu.h emulates a launch: threads as fibers, warp
# shuffles, __syncthreads) under AddressSanitizer and UBSan, and runs them:
#   gemv       plugins/cuda/cuda_gemv.cuh against the cpu reference's
#              dequantisation (tests/emu/gemv_emu.cpp)
#   matmul     get_rows, mul_mat and the tensor cores' fp16 weights of
#              every weight type (cuda_matmul.cu, cuda_gemv.cu's dispatch,
#              sdk/lib/cuda_tc.cu) against gguf-py's values of
#              tests/fixtures/dequant-blocks.txt (tests/emu/matmul_emu.cpp)
#   recurrent  delta_net, ssm_conv and unary (cuda_delta.cu, cuda_conv.cu,
#              cuda_elementwise.cu) against references in double
#              (tests/emu/recurrent_emu.cpp)
#   moe        moe_route and mul_mat_id (cuda_moe.cu, with the grouped
#              products of cuda_gemv.cu and cuda_matmul.cu) against
#              plugin.h's routing in double and the cpu reference's
#              dequantisation, and a decode's block of experts fused
#              against its ops bit for bit (tests/emu/moe_emu.cpp)
#   mwv        cuda-mwv's Q5_0 and Q8_0 copies and GEMV against the cpu
#              reference's dequantisation, its gemv_multi (types mixed)
#              and gemv_glu against its gemv, bit for bit
#              (tests/emu/mwv_emu.cpp)
#   dp4a       cuda-dp4a's int8 kernels (plugins/cuda-dp4a) against the
#              cpu reference's dequantisation times int8-rounded
#              activations (tests/emu/dp4a_emu.cpp)
#   attention  attention_paged (cuda_attention.cu's split and one-pass
#              forms through a block table) against the same kernels over
#              a contiguous cache, bit for bit, and attention in double
#              (tests/emu/attention_emu.cpp)
#   rowwise    rms_norm and rope (cuda_rowwise.cu) against references in
#              double, and their fused forms (add_rms_norm,
#              norm_add_rms_norm, rope_set_rows, rope_store) against
#              their ops bit for bit (tests/emu/rowwise_emu.cpp)
# A .cu file is compiled as C++ after a sed that turns its launches
# k<<<grid, block, shm, s>>>(args) into emu_launch(k, emu_cfg(grid, block,
# shm, s), args) and extern __shared__ arrays into emu.h's dynamic shared
# memory; #line keeps the .cu's own file and line numbers in messages.
# What two harnesses link is compiled once, first, and shared: cuda_gemv.cu
# and cuda_matmul.cu (matmul, moe; compiled on their own, g++ -include
# emu.h) and the SDK's dequantisers, sdk/lib/dequant.c (gemv, moe, mwv,
# dp4a); so are cuda-dp4a's two .cu files, side by side with them (dp4a alone).
# Needs g++ with C++20 on x86-64 and the CUDA toolkit's headers (CUDA_HOME,
# default /usr/local/cuda; matmul links its cuBLAS and runtime libraries,
# never called). The builds take most of the time: on 2 cores about 12
# minutes in all (dp4a alone: 3.5 minutes of CPU, its two .cu files
# most of it). Exit 0 when every check agrees; the last line counts the
# harnesses that pass and fail.
# Usage: scripts/cuda-emulate.sh [OUT-DIR [HARNESS...]]
#        (default _build/emu, every harness)
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/_build/emu}
[ $# -gt 0 ] && shift
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(gemv matmul recurrent moe attention rowwise mwv dp4a)
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
flags=(-O1 -g -fsanitize=address,undefined -pthread -I"$out" -I"$cuda/include"
	-I"$top/sdk/include" -I"$top/plugins/cuda" -I"$top/plugins/cuda-dp4a")

# DIR/NAME.cu of the tree as $out/NAME.emu.cu, for emu.h. Harnesses that
# run side by side may make the same one: each writes its own temporary
# file and renames it into place (the same bytes either way).
emu_source() {
	local src="$top/$1.cu" tmp
	set -- "$(basename "$1")"
	tmp=$(mktemp "$out/$1.emu.cu.XXXXXX")
	{
		echo "#line 1 \"$src\""
		sed -e 's/extern __shared__ \(.*[^ ]\)  *\([A-Za-z_][A-Za-z0-9_]*\)\[\];/\1 *\2 = (\1 *)emu_dynamic_shared();/' \
			-e 's/\([A-Za-z_][A-Za-z0-9_]*\(<[^<>]*>\)\{0,1\}\)<<</emu_launch(\1, emu_cfg(/' \
			-e 's/>>>()/))/' -e 's/>>>(/), /' "$src"
	} >"$tmp"
	# (a static __shared__ array needs no change: emu.h makes it static storage)
	if grep -n '<<<\|>>>\|extern __shared__' "$tmp" | grep -v '^[0-9]*:\s*[/*]'; then
		echo "cuda-emulate.sh: $1.cu: a launch or shared array the sed does not know" >&2
		rm -f "$tmp"
		return 1
	fi
	mv "$tmp" "$out/$1.emu.cu"
}

# object PATH: $out/NAME.o of the tree's PATH.c (C) or PATH.cu (emulated),
# NAME its last part.
object() {
	local name
	name=$(basename "$1")
	if [ -f "$top/$1.c" ]; then
		gcc -std=gnu11 "${flags[@]}" -c "$top/$1.c" -o "$out/$name.o"
	else
		emu_source "$1" &&
			g++ -std=c++20 "${flags[@]}" -include "$top/tests/emu/emu.h" -x c++ \
				-c "$out/$name.emu.cu" -o "$out/$name.o"
	fi
}

# shared HARNESS: the objects it shares with another harness.
shared() {
	case $1 in
	gemv | mwv) echo sdk/lib/dequant ;;
	dp4a) echo sdk/lib/dequant plugins/cuda-dp4a/dp4a_kernels plugins/cuda-dp4a/dp4a_fused ;;
	matmul) echo plugins/cuda/cuda_gemv plugins/cuda/cuda_matmul ;;
	moe) echo plugins/cuda/cuda_gemv plugins/cuda/cuda_matmul sdk/lib/dequant ;;
	esac
}

# harness NAME: build it and run it.
harness() {
	case $1 in
	gemv)
		g++ -std=c++20 "${flags[@]}" "$top/tests/emu/gemv_emu.cpp" "$out/dequant.o" \
			-o "$out/gemv_emu"
		;;
	matmul)
		emu_source sdk/lib/cuda_tc
		g++ -std=c++20 "${flags[@]}" "$top/tests/emu/matmul_emu.cpp" "$out/cuda_gemv.o" \
			"$out/cuda_matmul.o" -o "$out/matmul_emu" \
			-L"$cuda/lib64" -Wl,-rpath,"$cuda/lib64" -lcublas -lcudart
		"$out/matmul_emu" "$top/tests/fixtures/dequant-blocks.txt"
		return
		;;
	moe)
		object plugins/cuda/cuda_moe
		g++ -std=c++20 "${flags[@]}" "$top/tests/emu/moe_emu.cpp" "$out/cuda_gemv.o" \
			"$out/cuda_matmul.o" "$out/cuda_moe.o" "$out/dequant.o" -o "$out/moe_emu"
		;;
	recurrent)
		for s in cuda_delta cuda_conv cuda_elementwise; do emu_source plugins/cuda/$s; done
		g++ -std=c++20 "${flags[@]}" "$top/tests/emu/recurrent_emu.cpp" -o "$out/recurrent_emu"
		;;
	mwv)
		for s in mwv_b32_kernels mwv_glu mwv_kernels mwv_multi mwv_q6k_kernels; do
			emu_source plugins/cuda-mwv/$s
		done
		g++ -std=c++20 "${flags[@]}" -I"$top/plugins/cuda-mwv" "$top/tests/emu/mwv_emu.cpp" \
			"$out/dequant.o" -o "$out/mwv_emu"
		;;
	dp4a)
		g++ -std=c++20 "${flags[@]}" "$top/tests/emu/dp4a_emu.cpp" "$out/dequant.o" \
			"$out/dp4a_kernels.o" "$out/dp4a_fused.o" -o "$out/dp4a_emu"
		;;
	attention)
		emu_source plugins/cuda/cuda_attention
		g++ -std=c++20 "${flags[@]}" "$top/tests/emu/attention_emu.cpp" -o "$out/attention_emu"
		;;
	rowwise)
		emu_source plugins/cuda/cuda_rowwise
		g++ -std=c++20 "${flags[@]}" "$top/tests/emu/rowwise_emu.cpp" -o "$out/rowwise_emu"
		;;
	*) echo "cuda-emulate.sh: no harness $1" >&2; return 2 ;;
	esac
	"$out/$1_emu"
}

# The shared objects first, side by side, each once; then the harnesses
# side by side, each into its log, shown in order.
# shellcheck disable=SC2046 # object names, split
objects=$(printf '%s\n' $(for h in "${harnesses[@]}"; do shared "$h"; done) | sort -u)
pids=()
for o in $objects; do
	object "$o" >"$out/$(basename "$o").log" 2>&1 &
	pids+=($!)
done
i=0 broken=0
for o in $objects; do
	wait "${pids[$i]}" || { echo "== $o, shared"; cat "$out/$(basename "$o").log"; broken=1; }
	i=$((i + 1))
done
[ $broken -eq 0 ] || { echo "0 passed, ${#harnesses[@]} failed"; exit 1; }
pids=()
for h in "${harnesses[@]}"; do
	harness "$h" >"$out/$h.log" 2>&1 &
	pids+=($!)
done
pass=0 fail=0 i=0
for h in "${harnesses[@]}"; do
	if wait "${pids[$i]}"; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
	echo "== $h"
	cat "$out/$h.log"
	i=$((i + 1))
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
