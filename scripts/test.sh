#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to test results: install what
# is missing, fetch the default model (the tests need it), build, and run
# every Criterion suite through make check, packaging included (the SDK
# examples, make distcheck, the Debian packages). Ends with "N passed, N
# failed".
# Usage: scripts/test.sh
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build="$top/_build/main"
cd "$top"
bash scripts/install-deps.sh || exit 1
bash scripts/fetch-model.sh || exit 1
Q4KH_BUILD_DIR="$build" bash scripts/build.sh || exit 1

export Q4KH_REQUIRE_MODEL=1
# tests/test_package: the SDK examples, make distcheck and the .debs.
export Q4KH_TEST_PACKAGING=1
make -C "$build" -j"$(nproc)" check >"$build/check.log" 2>&1
rc=$?
grep -E '^(PASS|FAIL|ERROR|XPASS|SKIP):' "$build/check.log" | grep -v '^PASS' || true
if [ $rc -ne 0 ]; then
	for log in "$build"/tests/*.log; do
		grep -qE '^(not ok|Bail out)' "$log" 2>/dev/null && { echo "--- $log"; grep -vE '^ok ' "$log" | head -60; }
	done
	grep -E 'error|Error' "$build/check.log" | head -20
fi
pass=$(cat "$build"/tests/*.trs 2>/dev/null | grep -c '^:test-result: PASS')
fail=$(cat "$build"/tests/*.trs 2>/dev/null | grep -cE '^:test-result: (FAIL|ERROR|XPASS)')
skip=$(cat "$build"/tests/*.trs 2>/dev/null | grep -c '^:test-result: SKIP')
[ $rc -ne 0 ] && [ "$fail" -eq 0 ] && fail=1 # the build or a driver failed
echo "$pass passed, $fail failed, $skip skipped"
[ $rc -eq 0 ] && [ "$fail" -eq 0 ]
