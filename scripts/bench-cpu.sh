#!/usr/bin/env bash
# Both engines on this machine's CPU, on the same files, in one call: for a
# machine without llama-cpp-python (the GPU machine's 16-core Xeon; the
# development VM as well), where scripts/bench-cpu.py cannot run. Makes the
# benchmark models (scripts/gen-bench-model.py), builds llama.cpp's
# llama-bench for the CPU from the carried source (scripts/llamacpp-bundle.sh:
# -DGGML_CUDA=OFF -DGGML_NATIVE=ON, in /tmp/llamacpp-cpu, unless a build of
# an earlier call is there), then times, for each thread count T and prompt
# of P tokens, prefill with llama-bench (-t T -p P) and q4khost bench
# (cpu-fast with cpu-simd, F2 off, T threads; with --kernels, once per
# kernel variant; with --isa, once per instruction set), and decode of GEN
# tokens after the first prompt. Ends with one table: model, threads,
# measure, kernel and isa, llama.cpp, q4khost, ratio; full outputs under
# ${OUT:-/tmp}/bench-cpu. Making the
# models needs a python3 with NumPy: $PYTHON, else python3 on PATH (the
# script says so, and which, before it starts).
#
#   scripts/bench-cpu.sh [--models LIST] [--threads LIST] [--prompts LIST]
#                        [--gen N] [--reps R] [--isa LIST] [--kernels LIST]
#                        [--config FILE]
#                        [--llamacpp TARBALL] [--build DIR] [--lib DIR]
#
#   --models LIST   names of scripts/gen-bench-model.py or GGUF paths,
#                   comma-separated (default gemma3-270m,qwen2.5-1.5b;
#                   llama3-8b adds minutes at one thread)
#   --threads LIST  thread counts (default 1,2,4,8,16)
#   --prompts LIST  prompt lengths P in tokens (default 32,128,512)
#   --gen N         decode tokens timed after the first prompt (default 32)
#   --reps R        timed passes per figure, both engines (default 2)
#   --kernels LIST  the kernel variants to time q4khost with, comma-
#                   separated: cpu-simd (the default; activations in
#                   int16), cpu-simd8 (int8); each variant's
#                   [plugin.NAME] gets threads and isa, and one other
#                   than cpu-simd is named in the table ("cpu-simd8",
#                   "cpu-simd8.amx")
#   --isa LIST      the variants' isa settings to time q4khost with, comma-
#                   separated (amx,avx512-vnni,avx2): each run of q4khost
#                   once per set, a table row each (default: its auto,
#                   "auto" in the table); a set the CPU cannot run fails
#                   its runs, naming why
#   --config FILE   INI lines added to q4khost's configuration of every run
#                   (e.g. [plugin.cpu-simd] repack = off; not isa with --isa)
#   --llamacpp F    llama.cpp source tarball (default .gpu/llama.cpp.tar.xz)
#   --build, --lib  the q4khost build and carried libraries, as
#                   scripts/gpu-check.sh takes them (default .gpu/build
#                   where scripts/gpu-unpack.sh made it, else _build/main)
#   --table DIR     only the table, from the JSON files an earlier call
#                   left in DIR (llama-MODEL.json,
#                   q4k-MODEL-T-P[.KERNEL][.ISA].json)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
. "$top/scripts/bench-lib.sh"

models=gemma3-270m,qwen2.5-1.5b
threads=1,2,4,8,16
prompts=32,128,512
gen=32
reps=2
isas=
kernels=cpu-simd
extra=/dev/null
tarball=.gpu/llama.cpp.tar.xz
build=
lib=.gpu/lib
out="${OUT:-/tmp}/bench-cpu"
lcp=/tmp/llamacpp-cpu

# The table from the JSON files in DIR: llama-bench's per model, q4khost
# bench's per model, thread count and prompt. A figure an engine lacks
# reads nan.
table_from() {
	python3 - "$1" <<'EOF'
import glob, json, math, os, re, sys
d = sys.argv[1]
print("model | threads | measure | kernel, isa | llama.cpp tok/s | q4khost tok/s | q4khost/llama.cpp")
print("--- | --- | --- | --- | --- | --- | ---")
runs = {}
for f in glob.glob(os.path.join(d, "q4k-*.json")):
    m = re.match(r"q4k-(.+)-(\d+)-(\d+)(?:\.([a-z0-9.-]+))?\.json$", os.path.basename(f))
    try:
        runs[(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4) or "auto")] = \
            json.load(open(f))
    except ValueError:  # a run that failed left no JSON: its log says why
        pass
for base, t, p, isa in sorted(runs):
    try:
        lcp = json.load(open(os.path.join(d, "llama-%s.json" % base)))
    except (OSError, ValueError):
        lcp = []
    def ts(n_prompt, n_gen):
        for r in lcp:
            if r["n_threads"] == t and r["n_prompt"] == n_prompt and r["n_gen"] == n_gen:
                return r["avg_ts"]
        return math.nan
    row = runs[(base, t, p, isa)]["rows"][0]
    gen = runs[(base, t, p, isa)]["decode_tokens"]
    figures = [("prefill %d" % p, ts(p, 0), row.get("prefill_tokens_per_second") or math.nan)]
    if gen > 1:
        figures.append(("decode %d" % gen, ts(0, gen),
                        row.get("decode_tokens_per_second") or math.nan))
    for what, ref, ours in figures:
        print("%s | %d | %s | %s | %.1f | %.1f | %.2fx" % (base, t, what, isa, ref, ours,
                                                        ours / ref))
EOF
}

while [ $# -gt 0 ]; do
	case $1 in
	--models) models=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--prompts) prompts=$2; shift 2 ;;
	--gen) gen=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--isa) isas=$2; shift 2 ;;
	--kernels) kernels=$2; shift 2 ;;
	--config) extra=$2; shift 2 ;;
	--llamacpp) tarball=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	--lib) lib=$2; shift 2 ;;
	--table) table_from "$2"; exit ;;
	-h | --help) usage 0 ;;
	*) echo "bench-cpu.sh: unknown argument $1" >&2; usage ;;
	esac
done
bench_setup _build/main || exit 1
bench_models "$models" || exit 1
build_llamacpp "$tarball" "$lcp" llama-bench -DGGML_CUDA=OFF -DGGML_NATIVE=ON || exit 1
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) online" >&2

IFS=, read -ra ts <<<"$threads"
IFS=, read -ra ps <<<"$prompts"
IFS=, read -ra is <<<"${isas:-auto}"
IFS=, read -ra ks <<<"$kernels"
for f in "${files[@]}"; do
	base=$(basename "$f" .gguf)
	step "llama.cpp on $base"
	"$lcp/build/bin/llama-bench" -m "$f" -t "$threads" -p "$prompts" -n "$gen" -r "$reps" \
		-o json >"$out/llama-$base.json" 2>"$out/llama-$base.log" ||
		tail -5 "$out/llama-$base.log" >&2
	for t in "${ts[@]}"; do
		for kernel in "${ks[@]}"; do
			for isa in "${is[@]}"; do
				# Without --isa and --kernels, the names and settings of
				# old: cpu-simd's auto.
				tag=${isas:+.$isa}
				[ "$kernel" = cpu-simd ] || tag=.$kernel$tag
				{ printf '[plugin.cpu-fast]\nthreads = %s\n[plugin.%s]\nthreads = %s\n' \
					"$t" "$kernel" "$t" &&
					{ [ -z "$isas" ] || printf 'isa = %s\n' "$isa"; } &&
					cat "$extra"; } >"$out/threads-$t$tag.ini"
				n=$gen
				for p in "${ps[@]}"; do
					step "q4khost ($kernel) on $base, $t threads, $p-token prompt${isas:+, isa = $isa}"
					"$q4k" bench -m "$f" --backend cpu-fast --kernels "$kernel" --f2 off -n "$n" \
						-r "$reps" --no-built-in --config "$out/threads-$t$tag.ini" \
						-p "$(bench_prompt "$p")" --json >"$out/q4k-$base-$t-$p$tag.json" \
						2>"$out/q4k-$base-$t-$p$tag.log" ||
						{ tail -5 "$out/q4k-$base-$t-$p$tag.log" &&
							grep -o '"note": "[^"]*"' "$out/q4k-$base-$t-$p$tag.json"; } >&2
					n=1
				done
			done
		done
	done
done
table_from "$out" | tee "$out/table.md"
