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
#   prebuild    the sanitizer and fuzz builds (scripts/test-sanitizers.sh
#               --build, scripts/fuzz.sh --build)
#   main        every Criterion suite through make check, packaging
#               included (the SDK examples, make distcheck, the .debs
#               and the .rpms)
#   sanitizers  every suite again on an ASan/LSan/UBSan build, but for
#               the tests on the default model (the tiny fixtures run the
#               same host code there; valgrind runs the default model)
#               (scripts/test-sanitizers.sh)
#   fuzz        each libFuzzer target for 30 s (scripts/fuzz.sh 30)
#   valgrind    q4khost run on the default model under memcheck, the
#               main build's (scripts/valgrind-run.sh), counted as one test
#   emulate     the cuda backend's kernels without a GPU
#               (scripts/cuda-emulate.sh), a test per harness; skipped
#               without the CUDA toolkit's headers
# Beside build and main, a lane at the lowest priority (nice 19) runs
# prebuild, then emulate, on the cores they leave idle (tests that wait,
# compiles of one file, a package build's single-threaded steps): neither
# needs their results (scripts/test.sh --stages prebuild,emulate; a lane's
# lines are shown as they come, marked |). Once main and prebuild have
# ended, the sanitizer stage, which keeps every core busy, runs beside a
# lane of fuzz and valgrind, which take a core or two for a few minutes,
# and beside what is left of emulate; all find their builds made.
# Each stage's output goes to _build/STAGE.log; its closing line is shown,
# and while it runs, a line a minute: while compiling, the objects built
# and the file last compiled, then the tests it has finished.
# Ends with the totals, "N passed, N failed, N skipped". Ctrl-C stops the
# stages, prints the stages done and the totals so far, and exits 130.
# Usage: scripts/test.sh [--quick]   (--quick: build and main stages only)
#        scripts/test.sh --stages LIST   (only these of prebuild,
#                                         sanitizers, fuzz, valgrind,
#                                         emulate, one by one, on the
#                                         build main made)
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
	case $s in prebuild | sanitizers | fuzz | valgrind | emulate) ;;
	*) echo "test.sh --stages: no stage '$s' (prebuild, sanitizers, fuzz, valgrind, emulate)" >&2; exit 2 ;;
	esac
done

t0=$(date +%s)
passed=0 failed=0 skipped=0 status=0
# The stage running: its name, process, check log, build folder, start.
current=setup pid="" checks=/dev/null dir="" started=$t0 done_stages=()
# The lanes beside the stages (each a test.sh --stages of its own), by
# their stages' names joined with '-': process, log, lines of it shown.
declare -A lane_pid=() lane_log=() lane_shown=()
# Tests a stage has finished: automake's result lines in its make check log.
finished() {
	cat "$@" 2>/dev/null | grep -cE '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR): '
}
# Ctrl-C (SIGINT to the process group) or SIGTERM: the stage runs in a
# process group of its own (set -m below), so stop it here, then say where
# it stopped and what is done.
interrupted() {
	local sig=$1 code=$2 tree l
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
	for l in "${!lane_pid[@]}"; do # each stops its own stage, and says so
		kill -INT -- -"${lane_pid[$l]}" 2>/dev/null
		wait "${lane_pid[$l]}" 2>/dev/null
	done
	relay_lanes
	echo "== $current: interrupted after $(($(date +%s) - started)) s${pid:+, $(progress)}"
	echo "== stages done: ${done_stages[*]:-none}"
	echo "$passed passed, $failed failed, $skipped skipped (so far)"
	echo "test.sh: interrupted by SIG$sig after $(($(date +%s) - t0)) s" >&2
	exit "$code"
}
trap 'interrupted INT 130' INT
trap 'interrupted TERM 143' TERM

# The lanes' lines not shown yet, shown.
relay_lanes() {
	local l n shown
	for l in "${!lane_pid[@]}"; do
		[ -f "${lane_log[$l]}" ] || continue
		n=$(wc -l <"${lane_log[$l]}") shown=${lane_shown[$l]}
		[ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "${lane_log[$l]}" |
			grep -vE '^[0-9]+ passed, [0-9]+ failed' | sed 's/^/  | /'
		lane_shown[$l]=$n
	done
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

prebuild_stage() {
	bash scripts/test-sanitizers.sh --build && bash scripts/fuzz.sh --build
}

valgrind_stage() {
	bash scripts/valgrind-run.sh "$build" && echo "1 passed, 0 failed" ||
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
	if [ -f "$checks" ] || [ -z "$dir" ] || [ ! "$dir/build.log" -nt "$top/_build/.$current-start" ]; then
		[ "$checks" = /dev/null ] && echo "running" || echo "$(finished "$checks") tests finished"
		return
	fi
	objs=$(find "$dir" -name '*.lo' -newer "$top/_build/.$current-start" 2>/dev/null | wc -l)
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
	touch "$top/_build/.$current-start"
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
		relay_lanes
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

# stage_named NAME: one of the stages beside or after build and main.
stage_named() {
	case $1 in
	prebuild) stage prebuild /dev/null "$top/_build/asan" prebuild_stage ;;
	sanitizers) stage sanitizers "$top/_build/asan/check.log" "$top/_build/asan" \
		bash scripts/test-sanitizers.sh ;;
	fuzz) stage fuzz /dev/null "" bash scripts/fuzz.sh 30 ;;
	valgrind) stage valgrind /dev/null "" valgrind_stage ;;
	emulate) stage emulate /dev/null "" emulate_stage ;;
	esac
}

# lane_start [nice] LIST: a lane of the stages of LIST (names joined with
# ','), one by one; with "nice", at the lowest priority.
lane_start() {
	local prio=() l
	[ "$1" = nice ] && prio=(nice -n 19) && shift
	l=${1//,/-}
	echo "== ${1//,/, }: started beside the stages${prio[*]:+, at the lowest priority} (lines marked |)"
	lane_log[$l]="$top/_build/lane-$l.log" lane_shown[$l]=0
	mkdir -p "$top/_build"
	set -m
	"${prio[@]}" bash "$0" --stages "$1" </dev/null >"${lane_log[$l]}" 2>&1 &
	lane_pid[$l]=$!
	set +m
}

# lane_past LIST STAGE: wait until the lane of LIST has ended STAGE (its
# closing line) or ended.
lane_past() {
	local l=${1//,/-}
	while kill -0 "${lane_pid[$l]}" 2>/dev/null &&
		! grep -q "^== $2 (" "${lane_log[$l]}" 2>/dev/null; do
		sleep 5
		relay_lanes
	done
	relay_lanes
}

# lane_end LIST: wait until the lane of LIST has ended, then add its totals
# ("N passed, N failed, N skipped", its last line) to ours; its stages
# count as done.
lane_end() {
	local l=${1//,/-} rc line
	while kill -0 "${lane_pid[$l]}" 2>/dev/null; do
		sleep 5
		relay_lanes
	done
	wait "${lane_pid[$l]}"
	rc=$?
	relay_lanes
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "${lane_log[$l]}" | tail -n 1)
	unset "lane_pid[$l]" "lane_log[$l]" "lane_shown[$l]"
	[ $rc -eq 0 ] || status=1
	# shellcheck disable=SC2206 # the stages' names, split at commas
	done_stages+=(${1//,/ })
	set -- ${line:-0 passed, 1 failed, 0 skipped}
	passed=$((passed + $1)) failed=$((failed + $3)) skipped=$((skipped + ${5:-0}))
}

if [ -n "$only" ]; then
	for s in ${only//,/ }; do
		stage_named "$s"
	done
else
	setup
	[ $quick -eq 1 ] || lane_start nice prebuild,emulate
	if stage build /dev/null "$build" build_stage; then
		stage main "$build/check.log" "" main_stage
	fi
	if [ $quick -eq 0 ]; then
		# the sanitizer tests need the sanitizer build, not the emulation
		lane_past prebuild,emulate prebuild
		lane_start fuzz,valgrind
		stage_named sanitizers
		lane_end fuzz,valgrind
		lane_end prebuild,emulate
	fi
fi
current=""
[ $status -ne 0 ] && [ $failed -eq 0 ] && failed=1
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
