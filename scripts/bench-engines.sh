#!/usr/bin/env bash
# Both engines on the same files in one call, on a GPU machine: makes the
# benchmark models (scripts/gen-bench-model.py), builds llama.cpp's
# llama-bench from the carried source (scripts/llamacpp-bundle.sh) unless a
# build from an earlier call is still there, measures the read ceiling
# (q4khost bench-kernels), and times prefill of D tokens and decode of GEN
# tokens after D tokens with llama-bench (flash attention on, every layer on
# the GPU) and q4khost bench (cuda backend, F2 off, every kernel named).
# Ends with one table: model, measure, llama.cpp, each q4khost kernel, the
# best ratio; full outputs under ${OUT:-/tmp}/bench-engines.
#
#   scripts/bench-engines.sh [--models LIST] [--depths LIST] [--gen N]
#                            [--kernels LIST] [--llamacpp TARBALL]
#                            [--build DIR] [--lib DIR]
#
#   --models LIST   names of scripts/gen-bench-model.py (llama3-8b,
#                   qwen2.5-1.5b, gemma3-270m: the default model's shape,
#                   qwen35-4b: Qwen3.5-4B's hybrid delta-net layers,
#                   qwen3-30b-a3b: Qwen3-30B-A3B's mixture of experts, about
#                   17 GiB; any name it takes is passed on as is) or GGUF paths,
#                   comma-separated (default
#                   llama3-8b,qwen2.5-1.5b)
#   --depths LIST   prompt lengths D (default 512,4096)
#   --gen N         decode tokens timed after each prompt (default 128)
#   --kernels LIST  q4khost kernels, as bench --kernels (default: none and
#                   every cuda variant in the build); none is the built-in
#                   kernels, timed only when listed
#   --llamacpp F    llama.cpp source tarball (default .gpu/llama.cpp.tar.xz)
#   --build, --lib  the q4khost build and carried libraries, as
#                   scripts/gpu-check.sh takes them
#   --prepare       only build llama.cpp and make the models, then stop
#                   (run it in the background while other work uses the GPU)
#   --targets LIST  llama.cpp programs to build (default llama-bench, the
#                   only one this script runs: about 4 minutes on 16 cores;
#                   add llama-batched-bench,llama-server for other work)
#   --table DIR     only the table, from the JSON files an earlier call
#                   left in DIR (llama-MODEL.json, q4k-MODEL-D.json); no GPU
#   --self-check    --table on the recorded files of
#                   tests/fixtures/bench-engines, compared with the table
#                   there (table.txt); exit 0 when they agree
#   --serve LIST    instead of the table: the servers side by side, for
#                   each number of concurrent clients C in LIST (e.g.
#                   1,4,16,64), one server at a time on this GPU:
#                   llama-server (-np C slots, continuous batching on,
#                   flash attention on, every layer on the GPU, a context
#                   of C x (D + GEN + 64) tokens) and q4khost serve (cuda
#                   backend, F2 off, the first kernel of --kernels,
#                   --parallel C, --ctx D + GEN + 64, every other setting
#                   its default: the paged KV cache, whose start-up line
#                   is shown), each loaded by scripts/serve-load.py (C
#                   clients, 4 streamed requests each: a D-token prompt,
#                   D the first of --depths, and GEN tokens); then
#                   llama-batched-bench on the same file (D-token prompts,
#                   GEN tokens, LIST sequences). Ends with a table per
#                   model: clients, both servers' aggregate tok/s and
#                   their ratio, time to first token p50 and p99, lost
#                   requests, mean tokens an answer (GEN: both take
#                   ignore_eos), llama-batched-bench's decode and total
#                   tok/s at as many sequences; the outputs under
#                   ${OUT:-/tmp}/bench-engines (serve-*). Builds
#                   llama-server and llama-batched-bench
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
. "$top/scripts/bench-lib.sh"

models=llama3-8b,qwen2.5-1.5b
depths=512,4096
gen=128
kernels=
tarball=.gpu/llama.cpp.tar.xz
build=
lib=.gpu/lib
out="${OUT:-/tmp}/bench-engines"
lcp=/tmp/llamacpp
targets=llama-bench
prepare=0
serve=

# The table's lines, tab-separated, for model BASE and a prompt of D tokens
# from llama-bench's JSON LLAMA and q4khost bench's JSON Q4K (its decode
# tokens are the measure's): prefill, then decode after the prompt. A row
# q4khost did not time (bench exits 1 then, having written every row)
# reads "KERNEL not timed"; llama.cpp's figure is nan when it lacks the
# measure.
table_rows() {
	python3 - "$@" <<'EOF'
import json, sys
lcp, q4k, base, d = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
runs = json.load(open(lcp))
q = json.load(open(q4k))
gen = q["decode_tokens"]
def ts(p, n, depth):
    for r in runs:
        if r["n_prompt"] == p and r["n_gen"] == n and r.get("n_depth", 0) == depth:
            return r["avg_ts"]
    return float("nan")
for what, ref, key in (("prefill %d" % d, ts(d, 0, 0), "prefill_tokens_per_second"),
                       ("decode %d after %d" % (gen, d), ts(0, gen, d), "decode_tokens_per_second")):
    ours = [(r["kernel"], r.get(key)) for r in q["rows"]]
    timed = [v for _, v in ours if v]
    best = max(timed) / ref if timed and ref > 0 else float("nan")
    print("\t".join([base, what, "%.1f" % ref] +
                    ["%s %.1f" % (k, v) if v else "%s not timed" % k for k, v in ours] +
                    ["%.2fx" % best]))
EOF
}

# The table from the JSON files in DIR, model by model, prompts in order.
table_from() {
	local f name base
	for f in $(ls "$1"/q4k-*.json | sort -V); do
		name=$(basename "$f" .json)
		base=${name#q4k-}
		table_rows "$1/llama-${base%-*}.json" "$f" "${base%-*}" "${base##*-}" || return 1
	done
}

# Start a server (ARGS...) with its output in BASE.log, wait until it
# answers on PORT, load it with C clients of scripts/serve-load.py (P-token
# prompts, GEN tokens) into BASE.json, and stop it.
serve_load() { # BASE PORT C LABEL ARGS...
	local base=$1 port=$2 c=$3 label=$4 pid
	shift 4
	rm -f "$base.json"
	"$@" >"$base.log" 2>&1 &
	pid=$!
	wait_up "$base.log" "$port" "$pid" &&
		python3 scripts/serve-load.py "http://127.0.0.1:$port" --clients "$c" \
			--prompt-tokens "$p" --max-tokens "$gen" --label "$label" --json >"$base.json"
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
}

# The servers' table of model BASE from DIR's serve-*.json and
# serve-batched-bench-BASE.jsonl, a row for each number of clients in LIST.
serve_table() { # DIR BASE LIST
	python3 - "$@" <<'EOF'
import json, sys
d, base, cs = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3].split(",")]
def load(engine, c):
    try:
        return json.load(open("%s/serve-%s-%s-%d.json" % (d, engine, base, c)))
    except (OSError, ValueError):
        return None  # the server did not come up, or the load script failed
def show(r, key, f="%.1f"):
    return f % r[key] if r and r.get(key) is not None else "-"
def lost(r):
    return "%d of %d" % (r["errors"], r["requests"]) if r else "no server"
bb = {}
try:
    for line in open("%s/serve-batched-bench-%s.jsonl" % (d, base)):
        if line.startswith("{"):
            r = json.loads(line)
            bb[r["pl"]] = r
except (OSError, ValueError):
    pass
print("clients | llama-server tok/s | q4khost tok/s | q4khost/llama-server | "
      "TTFT p50 ms (llama-server / q4khost) | TTFT p99 ms | lost requests | "
      "tokens an answer | llama-batched-bench decode / total tok/s")
for c in cs:
    l, q, b = load("llama", c), load("q4k", c), bb.get(c)
    key = "aggregate_tokens_per_second"
    ratio = "%.2fx" % (q[key] / l[key]) if l and q and l[key] > 0 else "-"
    print(" | ".join([
        str(c), show(l, key), show(q, key), ratio,
        "%s / %s" % (show(l, "ttft_p50_ms"), show(q, "ttft_p50_ms")),
        "%s / %s" % (show(l, "ttft_p99_ms"), show(q, "ttft_p99_ms")),
        "%s / %s" % (lost(l), lost(q)),
        "%s / %s" % (show(l, "answer_tokens_mean"), show(q, "answer_tokens_mean")),
        "%s / %s" % (show(b, "speed_tg"), show(b, "speed"))]))
EOF
}

show_table() { # the table's TSV lines on stdin
	echo "model | measure | llama.cpp tok/s | q4khost tok/s by kernel | best/llama.cpp"
	sed 's/\t/ | /g'
}

while [ $# -gt 0 ]; do
	case $1 in
	--models) models=$2; shift 2 ;;
	--depths) depths=$2; shift 2 ;;
	--gen) gen=$2; shift 2 ;;
	--kernels) kernels=$2; shift 2 ;;
	--llamacpp) tarball=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	--lib) lib=$2; shift 2 ;;
	--targets) targets=$2; shift 2 ;;
	--prepare) prepare=1; shift ;;
	--serve) serve=$2; targets=llama-server,llama-batched-bench; shift 2 ;;
	--table) table_from "$2" | show_table; exit "${PIPESTATUS[0]}" ;;
	--self-check)
		fixtures=$top/tests/fixtures/bench-engines
		table_from "$fixtures" | show_table | diff -u "$fixtures/table.txt" - &&
			echo "bench-engines.sh: the table from $fixtures is table.txt"
		exit ;;
	-h | --help) usage 0 ;;
	*) echo "bench-engines.sh: unknown argument $1" >&2; usage ;;
	esac
done
bench_setup _build/gpu || exit 1

# 1. The models (first: a single core makes them while the GPU works).
bench_models "$models" || exit 1
# 2. llama.cpp, built once per machine.
build_llamacpp "$tarball" "$lcp" "$targets" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 ||
	exit 1

[ $prepare -eq 0 ] || exit 0
if [ -z "$kernels" ]; then
	kernels=none
	for k in $("$q4k" plugins --json 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin).get("plugins", []):
    if p.get("kind") == "kernel" and p.get("backend") == "cuda" and p.get("state") == "accepted":
        print(p["name"])'); do
		kernels+=",$k"
	done
fi

# The servers instead of the table: the same client, the same file, one
# server at a time on this GPU.
if [ -n "$serve" ]; then
	p=${depths%%,*}
	k=${kernels#,}
	k=${k%%,*}
	IFS=, read -ra cs <<<"$serve"
	most=$(printf '%s\n' "${cs[@]}" | sort -n | tail -1)
	for f in "${files[@]}"; do
		base=$(basename "$f" .gguf)
		for c in "${cs[@]}"; do
			step "llama-server on $base, $c clients"
			serve_load "$out/serve-llama-$base-$c" 18180 "$c" "$base llama-server" \
				"$lcp/build/bin/llama-server" -m "$f" -ngl 99 -fa on -np "$c" -cb \
				-c $((c * (p + gen + 64))) --port 18180
			step "q4khost serve ($k) on $base, $c clients"
			serve_load "$out/serve-q4k-$base-$c" 18181 "$c" "$base q4khost $k" \
				"$q4k" serve -m "$f" --backend cuda --kernel "$k" --f2 off --parallel "$c" \
				-c $((p + gen + 64)) --port 18181
			grep -m1 "KV cache:" "$out/serve-q4k-$base-$c.log" >&2
		done
		step "llama-batched-bench on $base, $serve sequences"
		"$lcp/build/bin/llama-batched-bench" -m "$f" -ngl 99 -fa on -c $((most * (p + gen))) \
			-npp "$p" -ntg "$gen" -npl "$serve" --output-format jsonl \
			>"$out/serve-batched-bench-$base.jsonl" 2>"$out/serve-batched-bench-$base.log" ||
			tail -5 "$out/serve-batched-bench-$base.log" >&2
		echo
		echo "$base: $p-token prompts, $gen tokens per answer, 4 requests per client"
		serve_table "$out" "$base" "$serve"
	done
	exit 0
fi

# The built-in kernels' row only when the list names them (none).
built_in=--no-built-in
[[ ,$kernels, == *,none,* ]] && built_in=

# 3. The read ceiling of this run.
step "read ceiling"
"$q4k" bench-kernels --shapes large --types Q4_K --max-batch 1 --json \
	>"$out/bench-kernels.json" 2>"$out/bench-kernels.log"
ceiling=$(python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["read_ceiling_gbps"])' \
	"$out/bench-kernels.json" 2>/dev/null || echo "?")

# 4. Both engines, model by model.
IFS=, read -ra ds <<<"$depths"
table="$out/table.tsv"
: >"$table"
for f in "${files[@]}"; do
	base=$(basename "$f" .gguf)
	step "llama.cpp on $base"
	"$lcp/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -r 3 -o json \
		-p "$depths" -n "$gen" -d "0,$depths" >"$out/llama-$base.json" 2>"$out/llama-$base.log" ||
		{ tail -5 "$out/llama-$base.log" >&2; continue; }
	for d in "${ds[@]}"; do
		step "q4khost on $base, $d-token prompt"
		text=$(bench_prompt "$d")
		# bench exits 1 when a row was not timed (a variant the model
		# has no type of): its JSON still holds every row.
		"$q4k" bench -m "$f" --backend cuda --kernels "$kernels" --f2 off -n "$gen" \
			$built_in -p "$text" --json >"$out/q4k-$base-$d.json" 2>"$out/q4k-$base-$d.log"
		[ $? -le 1 ] && [ -s "$out/q4k-$base-$d.json" ] ||
			{ tail -5 "$out/q4k-$base-$d.log" >&2; continue; }
		table_rows "$out/llama-$base.json" "$out/q4k-$base-$d.json" "$base" "$d" >>"$table"
	done
done

echo
echo "read ceiling: $ceiling GB/s (q4khost bench-kernels, this run)"
show_table <"$table"
