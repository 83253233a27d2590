#!/usr/bin/env bash
# Check the cuda backend's GEMV (plugins/cuda/cuda_gemv.cuh) without a GPU:
# builds tests/emu/gemv_emu.cpp with the cpu reference's dequantisation,
# under AddressSanitizer and UBSan, and runs it (a few minutes on 2 cores).
# Needs g++ with C++20 and the CUDA toolkit's headers (CUDA_HOME, default
# /usr/local/cuda). Exit 0 when every check agrees.
# Usage: scripts/gemv-emulate.sh [OUT-DIR]   (default _build/emu)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/_build/emu}
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
flags=(-O1 -g -fsanitize=address,undefined -pthread -I"$cuda/include"
	-I"$top/sdk/include" -I"$top/plugins/cuda" -I"$top/plugins/cpu")
gcc -std=gnu11 "${flags[@]}" -c "$top/plugins/cpu/cpu_quant.c" -o "$out/cpu_quant.o"
g++ -std=c++20 "${flags[@]}" "$top/tests/emu/gemv_emu.cpp" "$out/cpu_quant.o" -o "$out/gemv_emu"
"$out/gemv_emu"
