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
# Each stage's output goes to _build/STAGE.log; its closing line is shown.
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

passed=0 failed=0 skipped=0 status=0
# stage NAME COMMAND...: run it, show its closing line, add it up.
stage() {
	local name=$1 log="$top/_build/$1.log" line start rc
	shift
	mkdir -p "$top/_build"
	start=$(date +%s)
	"$@" >"$log" 2>&1
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

stage main main_stage
if [ $quick -eq 0 ]; then
	stage sanitizers bash scripts/test-sanitizers.sh
	stage fuzz bash scripts/fuzz.sh 60
	stage valgrind valgrind_stage
fi
[ $status -ne 0 ] && [ $failed -eq 0 ] && failed=1
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
