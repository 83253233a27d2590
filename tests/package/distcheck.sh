#!/usr/bin/env bash
# make distcheck of the build tree: the tarball builds out of its read-only
# source tree, passes its own tests, installs and uninstalls within its
# prefix and cleans up. Its tests skip what the main suite has just run on
# the default model, and its own packaging tests. Without the CUDA
# plugins: the .deb and .rpm builds compile the tarball's CUDA sources,
# and one compile of them less keeps CI short.
# The log is kept in BUILD/tests/distcheck.out.
# Usage: tests/package/distcheck.sh WORK
set -euo pipefail
. "$(dirname "$0")/common.sh"
work=$1

flags=--without-cuda
unset Q4KH_TEST_PACKAGING Q4KH_REQUIRE_MODEL
export Q4KHOST_MODEL=$work/no-model.gguf TMPDIR=$work
# Kept beside the build's test logs: the work folder goes with the test.
log=$build/tests/distcheck.out
if ! own_make -C "$build" -j"$(nproc)" distcheck DISTCHECK_CONFIGURE_FLAGS="$flags" \
	>"$log" 2>&1; then
	grep -E '^(FAIL|ERROR|XPASS):' "$log" || tail -n 60 "$log"
	die "make distcheck failed (whole log: $log)"
fi
grep -A2 'archives ready for distribution' "$log"
