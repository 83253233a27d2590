#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to test results: install what
# is missing, fetch the default model (the tests need it) and the DeepSeek
# vocabulary (scripts/fetch-deepseek-vocab.py), build, and run
#   main        every Criterion suite through make check, packaging
#               included (the SDK examples, make distcheck, the .debs
#               and the .rpms)
#   sanitizers  every suite again on an ASan/LSan/UBSan build
#               (scripts/test-sanitizers.sh)
#   fuzz        each libFuzzer target for 60 s (scripts/fuzz.sh 60)
#   valgrind    q4khost run on the default model under memcheck
#               (scripts/valgrind-run.sh), counted as one test
#   emulate     the cuda backend's kernels without a GPU
#               (scripts/cuda-emulate.sh), a test per harness; skipped
#               without the CUDA toolkit's headers
# Each stage's output goes to _build/STAGE.log; its closing line is shown,
# and while it runs, a line a minute with the tests it has finished.
# Ends with the totals, "N passed, N failed, N skipped".
# Usage: scripts/test.sh [--quick]   (--quick: the main stage only)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build="$top/_build/main"
cd "$top"
quick=0
case ${1:-} in
'') ;;
--quick) quick=1 ;;
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
*) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac

bash scripts/install-deps.sh || exit 1
bash scripts/fetch-model.sh || exit 1
# a real test input, optional: test_bpe's DeepSeek cases skip without it
python3 scripts/fetch-deepseek-vocab.py ||
	echo "test.sh: no DeepSeek-R1 vocabulary; its tokenizer cases will skip" >&2
bash scripts/fetch-openai.sh >/dev/null || exit 1 # tests/test_serve's client

main_stage() {
	Q4KH_BUILD_DIR="$build" bash scripts/build.sh || return 1
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
		echo "0 passed, 0 failed, 2 skipped"
		return 0
	fi
	bash scripts/cuda-emulate.sh "$top/_build/emu"
}

passed=0 failed=0 skipped=0 status=0
# Tests a stage has finished: automake's result lines in its make check log.
finished() {
	cat "$@" 2>/dev/null | grep -cE '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR): '
}
# stage NAME CHECKLOG COMMAND...: run it (a line a minute while it runs:
# the time so far and the tests CHECKLOG shows finished), show its closing
# line, add it up.
stage() {
	local name=$1 log="$top/_build/$1.log" checks=$2 line start rc pid n=0
	shift 2
	mkdir -p "$top/_build"
	start=$(date +%s)
	[ -f "$checks" ] && rm -f "$checks" # the last run's
	echo "== $name: started (output in ${log#"$top"/})"
	"$@" >"$log" 2>&1 &
	pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		sleep 5
		n=$((n + 1))
		[ $((n % 12)) -eq 0 ] && kill -0 "$pid" 2>/dev/null &&
			echo "   $name: $(($(date +%s) - start)) s, $(finished "$checks") tests finished"
	done
	wait "$pid"
	rc=$?
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
	echo "== $name ($(($(date +%s) - start)) s): ${line:-no closing line}"
	if [ $rc -ne 0 ]; then
		status=1
		grep -vE '^[0-9]+ passed, ' "$log" | tail -n 40
		[ -n "$line" ] || line="0 passed, 1 failed"
	fi
	set -- $line
	passed=$((passed + $1)) failed=$((failed + $3)) skipped=$((skipped + ${5:-0}))
}

stage main "$build/check.log" main_stage
if [ $quick -eq 0 ]; then
	stage sanitizers "$top/_build/asan/check.log" bash scripts/test-sanitizers.sh
	stage fuzz /dev/null bash scripts/fuzz.sh 60
	stage valgrind /dev/null valgrind_stage
	stage emulate /dev/null emulate_stage
fi
[ $status -ne 0 ] && [ $failed -eq 0 ] && failed=1
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
