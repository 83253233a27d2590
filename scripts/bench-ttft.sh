#!/usr/bin/env bash
# Time to first token, q4khost against llama.cpp on the same file, on a GPU
# machine (issue 30): makes the benchmark model (scripts/gen-bench-model.py),
# builds llama.cpp's llama-completion and llama-server from the carried
# source unless a build from an earlier call is still there
# (scripts/bench-lib.sh), and for each prompt length times
#   run    a one-token answer in a fresh process, twice: "cold", after the
#          model file's pages were dropped from the page cache
#          (posix_fadvise DONTNEED: a process's first read of the file),
#          and "second", right after (pages cached); q4khost's plugin
#          verdicts are cached first (q4khost plugins: once per install,
#          not per process). The time is the process's wall time from its
#          start to its exit: neither program reports from its start to
#          its first token (q4khost run's own figure starts at its first
#          line of code; it is in the log with its phases);
#   serve  a server started (its wall time until /v1/models answers in the
#          log), then two streamed requests of different prompts, so that
#          neither reuses the other's (scripts/serve-load.py): the first
#          request's time from sending it to the first chunk, then the
#          later one's.
# Prompts are raw text (no chat template), one token per character on the
# benchmark vocabularies. Ends with one table: engine, mode, prompt
# length, TTFT in seconds, and the ratio of q4khost's to llama.cpp's same
# row; then q4khost run's prefill rate in a fresh process (cold and
# second) against q4khost bench's prefill of the same prompt after its
# warm-up pass (issue 30 wants them within 10 %), and q4khost run's own
# time to its first token with its start-up phases. Full outputs under
# ${OUT:-/tmp}/bench-ttft.
#
#   scripts/bench-ttft.sh [--model NAME|FILE] [--prompts LIST] [--kernel K]
#                         [--backend NAME] [--engines LIST] [--llamacpp TARBALL]
#                         [--build DIR] [--lib DIR]
#
#   --model M       a name of scripts/gen-bench-model.py or a GGUF path
#                   (default llama3-8b, about 4.6 GiB)
#   --prompts LIST  prompt lengths in tokens (default 512,4096)
#   --kernel K      q4khost's kernel, as run --kernel (default cuda-mwv;
#                   none: the backend's built-in kernels)
#   --backend B     q4khost's backend (default cuda). With cpu, and
#                   --engines q4khost, the script runs on a machine without
#                   a GPU: a check of its own plumbing on a small model
#   --engines LIST  q4khost,llama.cpp (default both); without llama.cpp
#                   nothing is built and the ratio column reads "-"
#   --llamacpp F    llama.cpp source tarball (default .gpu/llama.cpp.tar.xz)
#   --build, --lib  the q4khost build and carried libraries, as
#                   scripts/gpu-check.sh takes them
#   --prepare       only build llama.cpp and make the model, then stop
#   --table DIR     only the tables, from the rows an earlier call left in
#                   DIR (rows.tsv, prefill.tsv, phases.tsv)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
. "$top/scripts/bench-lib.sh"

model=llama3-8b
prompts=512,4096
kernel=cuda-mwv
backend=cuda
engines=q4khost,llama.cpp
tarball=.gpu/llama.cpp.tar.xz
build=
lib=.gpu/lib
out="${OUT:-/tmp}/bench-ttft"
lcp=/tmp/llamacpp
prepare=0
gen=4 # tokens a server request asks for: the first one is timed

# The table from DIR/rows.tsv (engine, mode, prompt, seconds): each row
# with its ratio to llama.cpp's row of the same mode and prompt; then the
# prefill lines of DIR/prefill.tsv and q4khost run's phases of
# DIR/phases.tsv.
show_table() {
	python3 - "$1" <<'EOF'
import csv, os, sys
d = sys.argv[1]
rows = list(csv.reader(open(os.path.join(d, "rows.tsv")), delimiter="\t"))
ref = {(m, p): float(s) for e, m, p, s in rows if e == "llama.cpp" and s != "nan"}
print("engine | mode | prompt | TTFT s | ratio")
for e, m, p, s in rows:
    r = ref.get((m, p))
    ratio = "%.2fx" % (float(s) / r) if r and s != "nan" else "-"
    print(" | ".join([e, m, p, "nan" if s == "nan" else "%.3f" % float(s), ratio]))
path = os.path.join(d, "prefill.tsv")
if os.path.exists(path):
    print()
    print("q4khost prefill | prompt tokens | tok/s | bench tok/s | ratio")
    for what, p, run, bench in csv.reader(open(path), delimiter="\t"):
        run, bench = float(run), float(bench)
        ratio = "%.2f" % (run / bench) if bench > 0 else "-"
        print(" | ".join([what, p, "%.0f" % run, "%.0f" % bench, ratio]))
path = os.path.join(d, "phases.tsv")
if os.path.exists(path):
    print()
    print("q4khost run | prompt | first token s (its own clock) | plugins | model | choice | session | prefill")
    for r in csv.reader(open(path), delimiter="\t"):
        print(" | ".join(r))
EOF
}

while [ $# -gt 0 ]; do
	case $1 in
	--model) model=$2; shift 2 ;;
	--prompts) prompts=$2; shift 2 ;;
	--kernel) kernel=$2; shift 2 ;;
	--backend) backend=$2; shift 2 ;;
	--engines) engines=$2; shift 2 ;;
	--llamacpp) tarball=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	--lib) lib=$2; shift 2 ;;
	--prepare) prepare=1; shift ;;
	--table) show_table "$2"; exit ;;
	-h | --help) usage 0 ;;
	*) echo "bench-ttft.sh: unknown argument $1" >&2; usage ;;
	esac
done
with_llamacpp=0
[[ ,$engines, == *,llama.cpp,* ]] && with_llamacpp=1
bench_setup _build/main || exit 1

# The model made (one core) while llama.cpp builds (the others), for the
# GPU, or for the CPU (a build of its own) with --backend cpu.
bench_models "$model" &
made=$!
if [ $with_llamacpp -eq 1 ]; then
	if [ "$backend" = cpu ]; then
		lcp+=-cpu
		build_llamacpp "$tarball" "$lcp" llama-completion,llama-server
	else
		build_llamacpp "$tarball" "$lcp" llama-completion,llama-server \
			-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
	fi || { wait $made; exit 1; }
fi
wait $made && bench_models "$model" || exit 1
f=${files[0]}
[ $prepare -eq 0 ] || exit 0

# The enumeration helper's verdicts, cached per plugin file: what a first
# command after an install pays once, not what each process does.
"$q4k" plugins >"$out/plugins.log" 2>&1

rows="$out/rows.tsv"
prefill="$out/prefill.tsv"
phases="$out/phases.tsv"
: >"$rows"
: >"$prefill"
: >"$phases"
kernel_args=()
[ "$kernel" = none ] || kernel_args=(--kernel "$kernel")

# Run ARGS... with stdout in LOG.out and stderr in LOG.err, after dropping
# FILE's pages from the page cache when EVICT is 1; print the wall seconds
# from its start to its exit, or nan when it failed.
timed() { # LOG EVICT FILE ARGS...
	python3 - "$@" <<'EOF'
import os, subprocess, sys, time
log, evict, path, cmd = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4:]
if evict:  # written back first: dirty pages (a model just made) stay cached
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
with open(log + ".out", "wb") as o, open(log + ".err", "wb") as e:
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, stdin=subprocess.DEVNULL, stdout=o, stderr=e)
    t = time.perf_counter() - t0
print("%.4f" % t if rc == 0 else "nan")
if rc:
    sys.stderr.write("bench-ttft: %s exited %d; see %s.err\n" % (cmd[0], rc, log))
EOF
}

# Field KEY (dotted) of the JSON object in FILE, or nan.
json_field() { # FILE KEY
	python3 -c '
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for k in sys.argv[2].split("."):
        v = v[k] if not isinstance(v, list) else v[int(k)]
    print(v if v is not None else "nan")
except Exception:
    print("nan")' "$1" "$2"
}

# q4khost run's own time to its first token and its phases (seconds,
# tab-separated: first token, plugins, model, choice, session, prefill)
# from its JSON output FILE; nan each when it has none.
startup() { # FILE
	python3 -c '
import json, sys
try:
    t = json.load(open(sys.argv[1]))["time_to_first_token"]
    v = [t["seconds"]] + [t["startup"][k + "_seconds"] for k in
                          ("plugins", "model", "choice", "session")] + [t["prefill_seconds"]]
    print("\t".join("%.3f" % x for x in v))
except Exception:
    print("\t".join(["nan"] * 6))' "$1"
}

# Start a server (ARGS...) with its output in LOG, wait until PORT
# answers, then time two requests of P-token prompts; append the rows of
# ENGINE and print the start-up seconds on stderr.
serve_rows() { # ENGINE P PORT LOG ARGS...
	local engine=$1 p=$2 port=$3 log=$4 t0 pid up first later
	shift 4
	t0=$(date +%s.%N)
	"$@" >"$log" 2>&1 &
	pid=$!
	if wait_up "$log" "$port" "$pid"; then
		up=$(python3 -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' \
			"$t0" "$(date +%s.%N)")
		python3 scripts/serve-load.py "http://127.0.0.1:$port" --clients 1 --requests 2 \
			--prompt-tokens "$p" --max-tokens $gen --label "$engine" --json \
			>"$log.load.json" 2>"$log.load.err"
		read -r first later < <(python3 -c '
import json, sys
try:
    print(" ".join("%.1f" % v for v in json.load(open(sys.argv[1]))["ttft_each_ms"][:2]))
except Exception:
    print("nan nan")' "$log.load.json")
		step "$engine serve: up in $up s; first request $first ms, later ${later:-nan} ms"
	else
		first=nan later=nan
	fi
	later=${later:-nan}
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	for x in "first request:$first" "later request:$later"; do
		local v=${x#*:}
		[ "$v" = nan ] || v=$(python3 -c 'import sys; print("%.4f" % (float(sys.argv[1]) / 1000))' "$v")
		printf '%s\tserve, %s\t%s\t%s\n' "$engine" "${x%%:*}" "$p" "$v" >>"$rows"
	done
}

IFS=, read -ra ps <<<"$prompts"
for p in "${ps[@]}"; do
	text=$(bench_prompt "$p")
	base="$out/q4k-$p"
	for how in cold second; do
		step "q4khost run, $how process, $p-token prompt"
		s=$(timed "$base-run-$how" $([ $how = cold ] && echo 1 || echo 0) "$f" \
			"$q4k" run -m "$f" --backend "$backend" "${kernel_args[@]}" --f2 off -n 1 \
			--chat-template none -p "$text" --json)
		printf 'q4khost\trun, %s\t%s\t%s\n' "$how" "$p" "$s" >>"$rows"
		printf 'run, %s process\t%s\t%s\n' "$how" "$p" "$(startup "$base-run-$how.out")" >>"$phases"
		step "q4khost run, $how: $s s to exit; its own (first token, plugins, model, choice, session, prefill): $(tail -1 "$phases" | cut -f3- | tr '\t' ' ')"
		if [ $how = cold ]; then
			step "q4khost bench, $p-token prompt"
			bench_args=(--kernels "$kernel")
			[ "$kernel" = none ] || bench_args+=(--no-built-in)
			"$q4k" bench -m "$f" --backend "$backend" "${bench_args[@]}" --f2 off -n 1 \
				-p "$text" --json >"$base-bench.json" 2>"$base-bench.log"
		fi
		printf 'run, %s process\t%s\t%s\t%s\n' "$how" \
			"$(json_field "$base-run-$how.out" prefill.tokens)" \
			"$(json_field "$base-run-$how.out" prefill.tokens_per_second)" \
			"$(json_field "$base-bench.json" rows.0.prefill_tokens_per_second)" >>"$prefill"
	done
	serve_rows q4khost "$p" 18191 "$base-serve.log" "$q4k" serve -m "$f" \
		--backend "$backend" "${kernel_args[@]}" --f2 off --parallel 1 -c $((p + gen + 64)) \
		--port 18191

	[ $with_llamacpp -eq 1 ] || continue
	base="$out/llama-$p"
	for how in cold second; do
		step "llama-completion, $how process, $p-token prompt"
		s=$(timed "$base-run-$how" $([ $how = cold ] && echo 1 || echo 0) "$f" \
			"$lcp/build/bin/llama-completion" -m "$f" -ngl 99 -fa on -no-cnv \
			--no-display-prompt --temp 0 -n 1 -c $((p + 64)) -p "$text")
		printf 'llama.cpp\trun, %s\t%s\t%s\n' "$how" "$p" "$s" >>"$rows"
	done
	serve_rows llama.cpp "$p" 18190 "$base-serve.log" "$lcp/build/bin/llama-server" -m "$f" \
		-ngl 99 -fa on -np 1 -c $((p + gen + 64)) --port 18190
done

echo
show_table "$out"
