#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to test results: install what
# is missing, fetch the default model (the tests need it), the DeepSeek
# vocabulary (scripts/fetch-deepseek-vocab.py) and SmolLM2's Q4_1 model
# (scripts/fetch-smollm2.py), and run
#   build       scripts/build.sh --this-machine in _build/main: what
#               scripts/quickstart.sh builds here (the CUDA plugins for
#               this machine's GPUs, none without a GPU and driver; one
#               line says which). Q4KH_CUDA=all builds them for every
#               architecture whenever a CUDA toolkit is found,
#               Q4KH_CUDA=90 for that one (CI sets it, .ci/run).
#   main        every Criterion suite through make check, packaging
#               included (the SDK examples, make distcheck, the .debs
#               and the .rpms)
#   sanitizers  every suite again on an ASan/LSan/UBSan build, but for
#               the tests on the default model (the tiny fixtures run the
#               same host code there; valgrind runs the default model)
#               (scripts/test-sanitizers.sh)
#   fuzz        each libFuzzer target for 30 s (scripts/fuzz.sh 30)
#   valgrind    q4khost run on the default model under memcheck
#               (scripts/valgrind-run.sh), counted as one test
#   emulate     the cuda backend's kernels without a GPU
#               (scripts/cuda-emulate.sh), a test per harness; skipped
#               without the CUDA toolkit's headers
# After main, the sanitizer stage, which keeps every core busy, runs beside
# a second lane of fuzz, valgrind and emulate, which mostly take one core
# each (scripts/test.sh --stages fuzz,valgrind,emulate, its lines shown as
# they come).
# Each stage's output goes to _build/STAGE.log; its closing line is shown,
# and while it runs, a line a minute: while compiling, the objects built
# and the file last compiled, then the tests it has finished.
# Ends with the totals, "N passed, N failed, N skipped". Ctrl-C stops the
# stages, prints the stages done and the totals so far, and exits 130.
# Usage: scripts/test.sh [--quick]   (--quick: build and main stages only)
#        scripts/test.sh --stages LIST   (only these of sanitizers, fuzz,
#                                         valgrind, emulate, one by one,
#                                         on the build main made)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build="$top/_build/main"
cd "$top"
quick=0 only=""
case ${1:-} in
'') ;;
--quick) quick=1 ;;
--stages) only=${2:-} ;;
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
*) echo "usage: scripts/test.sh [--quick | --stages LIST]" >&2; exit 2 ;;
esac
for s in ${only//,/ }; do
	case $s in sanitizers | fuzz | valgrind | emulate) ;;
	*) echo "test.sh --stages: no stage '$s' (sanitizers, fuzz, valgrind, emulate)" >&2; exit 2 ;;
	esac
done

t0=$(date +%s)
passed=0 failed=0 skipped=0 status=0
# The stage running: its name, process, check log, build folder, start.
current=setup pid="" checks=/dev/null dir="" started=$t0 done_stages=()
# The second lane (a test.sh --stages of its own): its process, its log,
# the lines of it shown so far.
lane="" lane_log="$top/_build/lane.log" lane_shown=0
# Tests a stage has finished: automake's result lines in its make check log.
finished() {
	cat "$@" 2>/dev/null | grep -cE '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR): '
}
# Ctrl-C (SIGINT to the process group) or SIGTERM: the stage runs in a
# process group of its own (set -m below), so stop it here, then say where
# it stopped and what is done.
interrupted() {
	local sig=$1 code=$2 tree
	trap - INT TERM
	if [ -n "$pid" ]; then
		# The test programs (Criterion) put themselves and their workers
		# in process groups of their own: stop every descendant too.
		tree=$(ps -eo pid=,ppid= | awk -v root="$pid" '{ kids[$2] = kids[$2] " " $1 }
			END { n = split(kids[root], q, " ")
			      for (i = 1; i <= n; i++) { print q[i]; m = split(kids[q[i]], c, " ")
			                                 for (j = 1; j <= m; j++) q[++n] = c[j] } }')
		kill -INT -- -"$pid" 2>/dev/null
		# shellcheck disable=SC2086 # a list of process ids
		kill -TERM $tree 2>/dev/null
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			# shellcheck disable=SC2086
			kill -0 -- -"$pid" $tree 2>/dev/null || break
			sleep 1
		done
		# shellcheck disable=SC2086
		kill -KILL -- -"$pid" $tree 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	if [ -n "$lane" ]; then # it stops its own stage, and says so
		kill -INT -- -"$lane" 2>/dev/null
		wait "$lane" 2>/dev/null
		relay_lane
	fi
	echo "== $current: interrupted after $(($(date +%s) - started)) s${pid:+, $(progress)}"
	echo "== stages done: ${done_stages[*]:-none}"
	echo "$passed passed, $failed failed, $skipped skipped (so far)"
	echo "test.sh: interrupted by SIG$sig after $(($(date +%s) - t0)) s" >&2
	exit "$code"
}
trap 'interrupted INT 130' INT
trap 'interrupted TERM 143' TERM

# The lane's lines not shown yet, shown.
relay_lane() {
	local n
	[ -n "$lane_log" ] && [ -f "$lane_log" ] || return 0
	n=$(wc -l <"$lane_log")
	[ "$n" -gt "$lane_shown" ] && sed -n "$((lane_shown + 1)),${n}p" "$lane_log" |
		grep -vE '^[0-9]+ passed, [0-9]+ failed' | sed 's/^/  | /'
	lane_shown=$n
}

# What test.sh does before the stages: the packages, the model and the
# test inputs; the build's CUDA choice.
setup() {
# the second lane's tools too: two lanes must not both install
# shellcheck disable=SC2046 # the words are package names
bash scripts/install-deps.sh $([ $quick -eq 0 ] && echo clang libclang-rt-dev llvm valgrind) ||
	exit 1
bash scripts/fetch-model.sh || exit 1
# a real test input, optional: test_bpe's DeepSeek cases skip without it.
# It needs NumPy: python3 on PATH may be another than Debian's, which
# scripts/install-deps.sh gave python3-numpy.
py=python3
python3 -c 'import numpy' 2>/dev/null ||
	{ /usr/bin/python3 -c 'import numpy' 2>/dev/null && py=/usr/bin/python3; }
"$py" scripts/fetch-deepseek-vocab.py ||
	echo "test.sh: no DeepSeek-R1 vocabulary; its tokenizer cases will skip" >&2
# a real Q4_1 model, optional: tests/test_smollm2 skips without it.
"$py" scripts/fetch-smollm2.py >/dev/null ||
	echo "test.sh: no SmolLM2 Q4_1 model; tests/test_smollm2 will skip" >&2
bash scripts/fetch-python.sh openai >/dev/null || exit 1 # tests/test_serve's client
# the Kubernetes example's validator, optional: its test skips without it
bash scripts/fetch-python.sh kubernetes-validate >/dev/null ||
	echo "test.sh: no kubernetes-validate; the Kubernetes example's test will skip" >&2
# What quickstart.sh builds here, and a line that says which.
cuda_args=$(bash scripts/build.sh --which-cuda) || exit 1
}

build_stage() {
	# shellcheck disable=SC2086 # the arguments are words on purpose
	Q4KH_BUILD_DIR="$build" bash scripts/build.sh $cuda_args
}

main_stage() {
	# tests/test_package: the SDK examples, make distcheck, the .debs and
	# the .rpms.
	Q4KH_REQUIRE_MODEL=1 Q4KH_TEST_PACKAGING=1 \
		make -C "$build" -j"$(nproc)" check >"$build/check.log" 2>&1
	bash scripts/check-summary.sh "$build" $?
}

valgrind_stage() {
	bash scripts/valgrind-run.sh && echo "1 passed, 0 failed" ||
		{ echo "0 passed, 1 failed"; return 1; }
}

emulate_stage() {
	local cuda=${CUDA_HOME:-/usr/local/cuda}
	if [ ! -f "$cuda/include/cuda_fp16.h" ] && [ ! -f /usr/include/cuda_fp16.h ]; then
		echo "no CUDA headers (CUDA_HOME=$cuda): the emulation skips"
		echo "0 passed, 0 failed, 4 skipped"
		return 0
	fi
	bash scripts/cuda-emulate.sh "$top/_build/emu"
}

# What the stage has done so far: the tests $checks shows finished once it
# exists, before that what make has compiled in $dir (the stage's own
# build) since the stage started.
progress() {
	local objs last
	if [ -f "$checks" ] || [ -z "$dir" ] || [ ! "$dir/build.log" -nt "$top/_build/.stage-start" ]; then
		[ "$checks" = /dev/null ] && echo "running" || echo "$(finished "$checks") tests finished"
		return
	fi
	objs=$(find "$dir" -name '*.lo' -newer "$top/_build/.stage-start" 2>/dev/null | wc -l)
	last=$(tail -n 40 "$dir/build.log" | grep -oE "[[:alnum:]_./+-]+\.(c|cu|cpp)\b" | tail -n 1)
	last=${last#"$top"/}
	while [ "${last#../}" != "$last" ]; do last=${last#../}; done
	echo "compiling: $objs objects built${last:+, last $last} (log: ${dir#"$top"/}/build.log)"
}
# stage NAME CHECKLOG BUILD COMMAND...: run it (a line a minute while it
# runs: the time so far and its progress), show its closing line, add it up.
stage() {
	local name=$1 log="$top/_build/$1.log" line rc n=0
	current=$1 checks=$2 dir=$3
	shift 3
	mkdir -p "$top/_build"
	started=$(date +%s)
	touch "$top/_build/.stage-start"
	[ -f "$checks" ] && rm -f "$checks" # the last run's
	echo "== $name: started (output in ${log#"$top"/})"
	# A process group of its own: a Ctrl-C reaches this script, whose
	# trap stops the stage (a background job would ignore SIGINT).
	set -m
	"$@" </dev/null >"$log" 2>&1 &
	pid=$!
	set +m
	while kill -0 "$pid" 2>/dev/null; do
		sleep 5
		relay_lane
		n=$((n + 1))
		[ $((n % 12)) -eq 0 ] && kill -0 "$pid" 2>/dev/null &&
			echo "   $name: $(($(date +%s) - started)) s, $(progress)"
	done
	wait "$pid"
	rc=$? pid=""
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
	[ "$name" = build ] && [ $rc -eq 0 ] && line="" # no tests of its own
	[ $rc -eq 0 ] || [ -n "$line" ] || line="failed (exit $rc)"
	echo "== $name ($(($(date +%s) - started)) s): ${line:-done}"
	done_stages+=("$name")
	if [ $rc -ne 0 ]; then
		status=1
		grep -vE '^[0-9]+ passed, ' "$log" | tail -n 40
		[ "${line#failed}" = "$line" ] || line="0 passed, 1 failed"
	fi
	set -- ${line:-0 passed, 0 failed}
	passed=$((passed + $1)) failed=$((failed + $3)) skipped=$((skipped + ${5:-0}))
	return $rc
}

# stage_named NAME: one of the stages after main.
stage_named() {
	case $1 in
	sanitizers) stage sanitizers "$top/_build/asan/check.log" "$top/_build/asan" \
		bash scripts/test-sanitizers.sh ;;
	fuzz) stage fuzz /dev/null "" bash scripts/fuzz.sh 30 ;;
	valgrind) stage valgrind /dev/null "" valgrind_stage ;;
	emulate) stage emulate /dev/null "" emulate_stage ;;
	esac
}

# The second lane's totals ("N passed, N failed, N skipped", its last
# line) added to ours once it has ended; its stages count as done.
lane_end() {
	local rc line
	while kill -0 "$lane" 2>/dev/null; do
		sleep 5
		relay_lane
	done
	wait "$lane"
	rc=$? lane=""
	relay_lane
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$lane_log" | tail -n 1)
	[ $rc -eq 0 ] || status=1
	done_stages+=(fuzz valgrind emulate)
	set -- ${line:-0 passed, 1 failed, 0 skipped}
	passed=$((passed + $1)) failed=$((failed + $3)) skipped=$((skipped + ${5:-0}))
}

if [ -n "$only" ]; then
	lane_log="" # this is a lane: it shows no other
	for s in ${only//,/ }; do
		stage_named "$s"
	done
else
	rm -f "$lane_log" # the last run's
	setup
	if stage build /dev/null "$build" build_stage; then
		stage main "$build/check.log" "" main_stage
	fi
	if [ $quick -eq 0 ]; then
		mkdir -p "$top/_build"
		echo "== fuzz, valgrind, emulate: started beside sanitizers (their lines marked |)"
		set -m
		bash "$0" --stages fuzz,valgrind,emulate </dev/null >"$lane_log" 2>&1 &
		lane=$! lane_shown=0
		set +m
		stage_named sanitizers
		lane_end
	fi
fi
current=""
[ $status -ne 0 ] && [ $failed -eq 0 ] && failed=1
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
