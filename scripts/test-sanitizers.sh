#!/usr/bin/env bash
# Every test suite (make check) on a build with AddressSanitizer,
# LeakSanitizer and UndefinedBehaviorSanitizer (configure
# --enable-sanitizers, no CUDA) in _build/asan; the tests on the default
# model skip there (tests/helpers.h, test_model_path), the tiny fixtures
# run the same host code. Fails on a failed test and
# on any sanitizer report from any process: test workers, the q4khost
# commands the tests start, and the `q4khost validate --one` processes the
# host spawns for F2 (which the host would otherwise take for a rejected
# plugin). Ends with "N passed, N failed, N skipped".
# --build builds, the test programs too, and runs nothing (scripts/test.sh
# does that beside the main stage, where it keeps idle cores busy).
# Usage: scripts/test-sanitizers.sh [--build]
build_only=0
case ${1:-} in
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
--build) build_only=1 ;;
'') ;;
*) echo "usage: scripts/test-sanitizers.sh [--build]" >&2; exit 2 ;;
esac
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build="$top/_build/asan"
logs="$build/sanitizer-logs"
cd "$top"
bash scripts/install-deps.sh || exit 1
bash scripts/fetch-model.sh >/dev/null || exit 1
if [ -f "$build/Makefile" ] && ! grep -q '^SANITIZER_CFLAGS = -fsanitize' "$build/Makefile"; then
	echo "test-sanitizers: $build is configured without --enable-sanitizers; remove it" >&2
	exit 1
fi
Q4KH_BUILD_DIR="$build" bash scripts/build.sh --without-cuda --enable-sanitizers || exit 1
if [ $build_only -eq 1 ]; then
	make -C "$build" -j"$(nproc)" check-programs >"$build/check-build.log" 2>&1 ||
		{ tail -n 30 "$build/check-build.log"; echo "test-sanitizers: building the tests failed; see $build/check-build.log" >&2; exit 1; }
	exit 0
fi

# ASan and LSan reports go to files (log_path, one per process:
# asan.PID), never to stderr: tests compare the stderr of the host and of
# plugins exactly, and a report from a child must not be lost when its
# parent only reads its exit status. GCC 12's libubsan ignores log_path
# when libasan is loaded too (it writes to stderr whatever the options
# say), so UBSan reports go to stderr; -fno-sanitize-recover and abort_on_error make every
# one fatal, so the test that hit it, or whose child hit it, fails, and any
# report that reached a log is listed below. abort_on_error: a Criterion
# worker with a report dies of SIGABRT, so Criterion fails the test.
# allocator_may_return_null: an allocation too large for the sanitizer's
# allocator returns NULL as glibc's does, so the tests of absurd sizes in
# broken files still see the host's own error instead of a report.
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:allocator_may_return_null=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"
export LSAN_OPTIONS="suppressions=$top/scripts/lsan.supp:print_suppressions=0"
export Q4KH_REQUIRE_MODEL=1
make -C "$build" -j"$(nproc)" check >"$build/check.log" 2>&1
rc=$?

if grep -l 'runtime error:' "$build/check.log" "$build"/tests/*.log 2>/dev/null; then
	echo "test-sanitizers: the files above hold UndefinedBehaviorSanitizer reports:"
	grep -h -A12 'runtime error:' "$build/check.log" "$build"/tests/*.log | head -80
	rc=1
fi

reports=$(find "$logs" -type f | sort)
if [ -n "$reports" ]; then
	echo "test-sanitizers: $(echo "$reports" | wc -l) sanitizer report(s) in $logs:"
	for r in $reports; do
		echo "--- $r"
		head -40 "$r"
	done
	rc=1
fi
bash scripts/check-summary.sh "$build" "$rc"
