#!/usr/bin/env bash
# One command on a GPU machine: what the GPU sees, every GPU test suite,
# F2 (q4khost validate, fresh) of every cuda candidate against the cpu
# reference on each tiny model of tests/fixtures (tiny-qwen35 among them:
# the gated delta-net layers' states through prefill and decode) and on
# each --f2-model, (with --model) each model end to end on the cuda
# backend with its built-in kernels and with every kernel-variant plugin in
# the build, each against the cpu reference's greedy text, (with --bench)
# q4khost bench-kernels, and (with --bench-model) q4khost bench on a large
# model, F2 off. Ends with one summary table; exits non-zero when anything
# failed (a variant that has none of a model's weight types is a skip, not
# a failure).
#
# The tree is built elsewhere (scripts/gpu-bundle.sh) and carried here with
# the shared libraries this machine lacks.
#
#   scripts/gpu-check.sh [--build DIR] [--lib DIR] [--model FILE]
#                        [--prompt TEXT] [-n N] [--bench] [--bench-types LIST]
#                        [--bench-model FILE] [--f2-model FILE] [--logs DIR]
#
#   --build DIR   the build: .gpu/build when it exists, else _build/gpu
#   --lib DIR     carried libraries, put on LD_LIBRARY_PATH (.gpu/lib)
#   --model FILE  run the model checks on this GGUF file (repeatable); a
#                 file named as the default model (gemma-3-270m-q4_k_m.gguf)
#                 is also the suites' default model, whose fixtures
#                 (llama.cpp's and the float64 pass's) hold for that file
#                 only, so another file never stands in for it there
#   --prompt, -n  the model checks' prompt and tokens to generate
#   --bench       time every variant's GEMV: q4khost bench-kernels
#   --bench-types LIST  bench-kernels --types LIST (Q4_K,Q8_0,..., or all;
#                 default the variants' four)
#   --bench-model FILE  q4khost bench -m FILE --backend cuda --f2 off -n 64
#                 (repeatable): end-to-end speed of every variant on a
#                 model too large for the cpu reference in a call's time
#   --f2-model FILE  F2 rows for this GGUF file too (repeatable), after
#                 the tiny fixtures'
#   --logs DIR    every command's full output (${OUT:-/tmp}/gpu-check)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

build=
lib=.gpu/lib
models=()
bench=0
bench_types=
bench_models=()
f2_models=(tests/fixtures/tiny-*.gguf)
prompt="The history of the printing press begins in the fifteenth century, when"
n_predict=64
logs="${OUT:-/tmp}/gpu-check"

usage() { # STATUS: 0 for --help (on stdout), 2 for a wrong argument
	sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&"$((${1:-2} ? 2 : 1))"
	exit "${1:-2}"
}

while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$2; shift 2 ;;
	--lib) lib=$2; shift 2 ;;
	--model) models+=("$2"); shift 2 ;;
	--prompt) prompt=$2; shift 2 ;;
	-n) n_predict=$2; shift 2 ;;
	--bench) bench=1; shift ;;
	--bench-types) bench_types=$2; shift 2 ;;
	--bench-model) bench_models+=("$2"); shift 2 ;;
	--f2-model) f2_models+=("$2"); shift 2 ;;
	--logs) logs=$2; shift 2 ;;
	-h | --help) usage 0 ;;
	*) echo "gpu-check.sh: unknown argument $1" >&2; usage ;;
	esac
done
scripts/gpu-unpack.sh || exit 1
if [ -z "$build" ]; then
	build=_build/gpu
	[ -d .gpu/build ] && build=.gpu/build
fi
build=$(cd "$build" 2>/dev/null && pwd) || { echo "gpu-check.sh: no build folder $build" >&2; exit 1; }
mkdir -p "$logs"

# The carried libraries, then the toolkit's runtime (the plugins' rpath
# names the build machine's toolkit folder, which may differ here).
ld_path=$(cd "$lib" 2>/dev/null && pwd || true)
for d in "${CUDA_HOME:-}" /usr/local/cuda; do
	[ -n "$d" ] && [ -d "$d/lib64" ] && ld_path="$ld_path:$d/lib64"
done
export LD_LIBRARY_PATH="$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
plugin_path=$(find "$build/plugins" -path '*/.libs/*.so' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
export Q4KHOST_PLUGIN_PATH="$plugin_path"
export Q4KH_TEST_BUILDDIR="$build" Q4KH_TEST_SRCDIR="$top"
export CRITERION_JOBS="${CRITERION_JOBS:-4}"
for m in "${models[@]}"; do
	[ "$(basename "$m")" = gemma-3-270m-q4_k_m.gguf ] && export Q4KHOST_MODEL="$m"
done
q4khost="$build/host/cli/q4khost"

rows=()
failed=0
# row CHECK RESULT NUMBERS: one line of the summary.
row() {
	rows+=("$1"$'\t'"$2"$'\t'"$3")
	case $2 in ok | skip*) ;; *) failed=1 ;; esac
}

echo "== nvidia-smi"
if nvidia-smi 2>&1 | tee "$logs/nvidia-smi.log"; then
	gpu=$(nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
	row "nvidia-smi" ok "$gpu"
else
	row "nvidia-smi" FAIL "nvidia-smi failed (no driver?)"
fi

echo "== q4khost plugins"
if "$q4khost" plugins --json >"$logs/plugins.json" 2>"$logs/plugins.err"; then
	"$q4khost" plugins 2>&1 | tee "$logs/plugins.log"
	devices=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
for b in j["backends"]:
    if b["name"] == "cuda":
        print(" | ".join("%s %s %s driver %s" % (d["name"], d["uuid"], d["arch"], d["driver_version"]) for d in b["devices"]))
' "$logs/plugins.json")
	smi_uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -n 1)
	if [ -z "$devices" ]; then
		row "cuda devices" FAIL "the cuda plugin lists no device: $(cat "$logs/plugins.err")"
	elif [ -n "$smi_uuid" ] && [[ $devices != *"$smi_uuid"* ]]; then
		row "cuda devices" FAIL "nvidia-smi's $smi_uuid not among: $devices"
	else
		row "cuda devices" ok "$devices"
	fi
else
	row "q4khost plugins" FAIL "$(tail -n 3 "$logs/plugins.err")"
fi

# Every GPU suite is a test_cuda_* program (test_cuda_graph: whole steps
# through cuda-mwv), plus the cuda cases of CPU suites: test_batch's
# batched decode against each sequence alone (on the default model too
# when --model names one), and test_serve's q4khost serve on cuda over
# the paged KV cache, a small pool and the default's, against a cache per
# slot (its requests go through curl: a skip on a machine without it);
# the rest of those suites is CI's.
suites=()
for t in "$build"/tests/test_cuda_* "$build"/tests/test_batch "$build"/tests/test_serve; do
	[ -f "$t" ] && [ -x "$t" ] || continue
	case $t in *.o | *.c | *.log | *.trs) continue ;; esac
	suites+=("$t")
done
for t in "${suites[@]}"; do
	name=$(basename "$t")
	filter=
	case $name in
	test_cuda_*) ;;
	test_serve)
		filter="--filter=serve/*_on_cuda_*"
		if ! command -v curl >/dev/null; then
			row "$name" "skip: no curl here, which its requests go through" ""
			continue
		fi
		;;
	*) filter="--filter=*/cuda_*" ;;
	esac
	echo "== $name${filter:+ $filter}"
	"$t" --verbose $filter >"$logs/$name.log" 2>&1
	rc=$?
	grep -E '^\[(FAIL|SKIP|====)\]|Assertion Failed' -A2 "$logs/$name.log" |
		grep -v -e '^--$' -e 'Test is disabled$' | head -80
	synth=$(grep -o 'Tested: [0-9]* | Passing: [0-9]* | Failing: [0-9]* | Crashing: [0-9]*' "$logs/$name.log" | tail -n 1)
	# a filter's tests left out say "Test is disabled": not skips
	skips=$(grep '^\[SKIP\]' "$logs/$name.log" | grep -vc 'Test is disabled$')
	if [ $rc -eq 0 ] && [ -n "$synth" ]; then
		row "$name" ok "$synth | Skipped: $skips"
	else
		row "$name" FAIL "exit $rc; ${synth:-no synthesis line} | Skipped: $skips (log $logs/$name.log)"
	fi
done

# F2, fresh, of every cuda candidate of each model: one row per candidate.
for model in "${f2_models[@]}"; do
	m=$(basename "$model" .gguf)
	echo "== q4khost validate --f2 fresh --backend cuda -m $model"
	Q4KHOST_F2_RECEIPT_DIR="$logs/receipts" "$q4khost" validate --json --f2 fresh \
		--backend cuda -m "$model" >"$logs/f2-$m.json" 2>"$logs/f2-$m.err"
	rc=$?
	lines=$(python3 -c '
import json, re, sys
j = json.load(open(sys.argv[1]))
for c in j["candidates"]:
    m = c["message"].replace("\t", " ").replace("\n", " ")
    # an architecture whose ops cuda lacks: a skip, not a failure
    lacks = c["verdict"] != "pass" and re.search(r"cannot run .*: it has no [a-z_0-9]+", m)
    print("%s\t%s\t%s" % (c["kernel"], "ok" if c["verdict"] == "pass" else
                          "skip" if lacks else "FAIL", lacks.group(0) if lacks else m))
for u in j["unmeasurable"]:
    print("unmeasurable\tFAIL\t%s" % u)
' "$logs/f2-$m.json" 2>/dev/null)
	if [ -z "$lines" ]; then
		row "F2 $m" FAIL "exit $rc: $(tail -n 3 "$logs/f2-$m.err" | tr '\n' ' ')"
		continue
	fi
	while IFS=$'\t' read -r kernel result numbers; do
		echo "$kernel: $numbers"
		row "F2 $m: cuda/$kernel" "$result" "$numbers"
	done <<<"$lines"
done

# run_model NAME MODEL ARGS...: q4khost run --json; sets run_text,
# run_numbers, run_rc.
run_model() {
	local name=$1 model=$2 json="$logs/run-$1.json" rc
	shift
	shift
	echo "== q4khost run $*"
	"$q4khost" run -m "$model" -p "$prompt" -n "$n_predict" --temp 0 --json "$@" \
		>"$json" 2>"$logs/run-$name.err"
	rc=$?
	run_rc=$rc
	if [ $rc -eq 0 ]; then
		run_numbers=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
k = ", ".join("%s=%s" % (t, v.get("plugin", "?") if v.get("kernel") != "built-in" else v["plugin"] + " built-in") for t, v in j["kernels"].items())
print("prefill %.1f tok/s, decode %.1f tok/s; %s; F2 %s" % (j["prefill"]["tokens_per_second"], j["decode"]["tokens_per_second"], k, j["f2"]["verdict"]))
' "$json")
		run_text=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["text"])' "$json")
		printf '%s\n%s\n' "$run_numbers" "$run_text"
		return 0
	fi
	run_numbers="exit $rc: $(tail -n 3 "$logs/run-$name.err" | tr '\n' ' ')"
	echo "$run_numbers"
	return 1
}

# Where two texts part: "same text" or "differs from char N".
compare_text() {
	python3 -c '
import sys
a, b = sys.argv[1], sys.argv[2]
if a == b:
    print("same text as cpu")
else:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print("text differs from cpu at char %d of %d" % (n, len(a)))
' "$1" "$2"
}

variants=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(" ".join(p["name"] for p in j["plugins"]
               if p["state"] == "accepted" and p.get("backend") == "cuda"))
' "$logs/plugins.json" 2>/dev/null)
for model in "${models[@]}"; do
	m=$(basename "$model" .gguf)
	if [ ! -r "$model" ]; then
		row "$m" FAIL "cannot read $model"
		continue
	fi
	if run_model "$m-cpu" "$model" --backend cpu; then
		cpu_text=$run_text
		row "$m: cpu (reference)" ok "$run_numbers"
	else
		cpu_text=
		row "$m: cpu (reference)" FAIL "$run_numbers"
	fi
	for v in none $variants; do
		label="$m: cuda --kernel $v"
		[ "$v" = none ] && label="$m: cuda (built-in kernels)"
		if run_model "$m-cuda-$v" "$model" --backend cuda --kernel "$v"; then
			row "$label" ok "$run_numbers; $(compare_text "$cpu_text" "$run_text")"
		elif [ $run_rc -eq 4 ] && grep -q 'has none of its types' "$logs/run-$m-cuda-$v.err"; then
			row "$label" skip "the model has none of the variant's weight types"
		else
			row "$label" FAIL "$run_numbers"
		fi
	done
done

if [ $bench -eq 1 ]; then
	echo "== q4khost bench-kernels"
	"$q4khost" bench-kernels ${bench_types:+--types "$bench_types"} 2>&1 |
		tee "$logs/bench-kernels.log"
	rc=${PIPESTATUS[0]}
	ceiling=$(grep -o 'read ceiling.*' "$logs/bench-kernels.log" | head -n 1)
	if [ $rc -eq 0 ]; then
		row "bench-kernels" ok "$ceiling"
	else
		row "bench-kernels" FAIL "exit $rc; $(grep -E 'WRONG|failed' "$logs/bench-kernels.log" | head -n 2 | tr '\n' ' ')"
	fi
fi

for model in "${bench_models[@]}"; do
	m=$(basename "$model" .gguf)
	echo "== q4khost bench -m $model --backend cuda --f2 off -n 64"
	"$q4khost" bench -m "$model" --backend cuda --f2 off -n 64 --json \
		>"$logs/bench-$m.json" 2>"$logs/bench-$m.err"
	# Untimed rows fail the check, but a variant without the model's
	# weight types is a skip.
	if numbers=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
out, bad = [], 0
for r in j["rows"]:
    note = r.get("note") or ""
    if r["decode_tokens_per_second"] is not None:
        out.append("%s %.1f/%.2f" % (r["kernel"], r["prefill_tokens_per_second"], r["decode_tokens_per_second"]))
    elif "has none of its types" not in note:
        out.append("%s NOT TIMED: %s" % (r["kernel"], note))
        bad = 1
print("prefill/decode tok/s: " + "; ".join(out))
sys.exit(bad)
' "$logs/bench-$m.json" 2>&1); then
		row "bench $m (F2 off)" ok "$numbers"
	else
		row "bench $m (F2 off)" FAIL "${numbers:-$(tail -n 2 "$logs/bench-$m.err" | tr '\n' ' ')}"
	fi
	echo "$numbers"
done

echo
echo "== summary (logs in $logs)"
{
	printf 'CHECK\tRESULT\tNUMBERS\n'
	printf '%s\n' "${rows[@]}"
} | python3 -c '
import sys
rows = [l.rstrip("\n").split("\t") for l in sys.stdin]
w = [max(len(r[i]) for r in rows) for i in range(2)]
for r in rows:
    print("%-*s  %-*s  %s" % (w[0], r[0], w[1], r[1], r[2]))
'
exit $failed
