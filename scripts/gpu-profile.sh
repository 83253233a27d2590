#!/usr/bin/env bash
# Where a decode step's GPU time goes, on a GPU machine without Nsight
# Systems: builds scripts/cupti-trace.c against the CUPTI found there (the
# toolkit's, or the one PyTorch ships) and runs q4khost bench under it, or
# llama.cpp's llama-bench (as scripts/bench-engines.sh built it) on the same
# file, to see kernel by kernel where the two engines differ.
# Prints one line per kernel (launches, total and mean microseconds, share)
# and the kernels' total against their span.
#
#   scripts/gpu-profile.sh MODEL [KERNEL [N [PROMPT_TOKENS]]]
#
#   MODEL          a GGUF file, or a name of scripts/gen-bench-model.py
#                  (generated under /tmp/models when missing)
#   KERNEL         the variant (default cuda-mwv; none: built-in kernels;
#                  llama.cpp: llama-bench, flash attention on, one run)
#   N              decode tokens (default 128)
#   PROMPT_TOKENS  prompt length (default 512)
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
[ $# -ge 1 ] || { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
model=$1 kernel=${2:-cuda-mwv} n=${3:-128} d=${4:-512}

. scripts/gpu-env.sh

header=$(find /usr/local/cuda*/ /usr/local/cuda/extras /usr/lib/python3*/ /opt /usr/local/lib -name cupti.h 2>/dev/null | head -n 1)
lib=$(find /usr/local/cuda*/ /opt /usr/local/lib /usr/lib -name 'libcupti.so*' 2>/dev/null | head -n 1)
[ -n "$header" ] && [ -n "$lib" ] || { echo "gpu-profile.sh: no CUPTI here (cupti.h: ${header:-none}, libcupti: ${lib:-none})" >&2; exit 1; }
tracer=/tmp/cupti-trace.so
gcc -O2 -shared -fPIC -I"$(dirname "$header")" -I/usr/local/cuda/include \
	scripts/cupti-trace.c -o "$tracer" "$lib" -Wl,-rpath,"$(dirname "$lib")"

prompt=$(python3 -c 'import sys; n=int(sys.argv[1]); print(("the quick brown fox " * n)[:n-1])' "$d")
out=/tmp/gpu-profile.txt
if [ "$kernel" = llama.cpp ]; then
	lb=/tmp/llamacpp/build/bin/llama-bench
	[ -x "$lb" ] || { echo "gpu-profile.sh: no $lb (scripts/bench-engines.sh --prepare builds it)" >&2; exit 1; }
	CUPTI_TRACE_OUT=$out LD_PRELOAD=$tracer "$lb" -m "$model" -ngl 99 -fa 1 \
		-r 1 -p 0 -n "$n" -d "$d" | tail -n 3
else
	CUPTI_TRACE_OUT=$out LD_PRELOAD=$tracer "$build/host/cli/q4khost" bench -m "$model" \
		--backend cuda --kernels "$kernel" --f2 off -n "$n" -r 1 -p "$prompt" \
		$([ "$kernel" = none ] || echo --no-built-in) | tail -n 3
fi
head -n 30 "$out"
tail -n 1 "$out"
