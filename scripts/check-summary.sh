#!/usr/bin/env bash
# The end of a `make check` run in BUILD: every result other than PASS, the
# failing suites' TAP logs and build errors when RC (make's exit status) is
# not 0, then the closing line "N passed, N failed, N skipped" counted from
# BUILD/tests/*.trs. Exits 1 when make failed or a test failed.
# Usage: scripts/check-summary.sh BUILD RC   (make's output in BUILD/check.log)
set -uo pipefail
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
[ $# -eq 2 ] || { echo "usage: $0 BUILD RC" >&2; exit 2; }
build=$1
rc=$2

grep -E '^(PASS|FAIL|ERROR|XPASS|SKIP):' "$build/check.log" | grep -v '^PASS' || true
if [ "$rc" -ne 0 ]; then
	for log in "$build"/tests/*.log; do
		grep -qE '^(not ok|Bail out)' "$log" 2>/dev/null && { echo "--- $log"; grep -vE '^ok ' "$log" | head -60; }
	done
	grep -E 'error|Error' "$build/check.log" | head -20
fi
pass=$(cat "$build"/tests/*.trs 2>/dev/null | grep -c '^:test-result: PASS')
fail=$(cat "$build"/tests/*.trs 2>/dev/null | grep -cE '^:test-result: (FAIL|ERROR|XPASS)')
skip=$(cat "$build"/tests/*.trs 2>/dev/null | grep -c '^:test-result: SKIP')
[ "$rc" -ne 0 ] && [ "$fail" -eq 0 ] && fail=1 # the build or a driver failed
echo "$pass passed, $fail failed, $skip skipped"
[ "$rc" -eq 0 ] && [ "$fail" -eq 0 ]
