#!/usr/bin/env bash
# make distcheck of the build tree: the tarball builds out of its read-only
# source tree, builds every test program, passes a few of its tests,
# installs and uninstalls within its prefix and cleans up. The main suite
# has just run every test on the same sources; what the tarball can lose
# is files, so instead of running them all again (most of CI's time on
# two cores) this compares the tarball's list with every file git tracks
# in the checkout, but those only a checkout needs (.gitignore, .ci/).
# Without the CUDA plugins: the .deb and .rpm builds compile the tarball's
# CUDA sources, and one compile of them less keeps CI short.
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
# the tests that read the tarball's fixtures, scripts and SDK most
tests="tests/test_abi tests/test_gguf tests/test_quant tests/test_archs tests/test_first_run"
if ! own_make -C "$build" -j"$(nproc)" distcheck DISTCHECK_CONFIGURE_FLAGS="$flags" \
	TESTS="$tests" >"$log" 2>&1; then
	grep -E '^(FAIL|ERROR|XPASS):' "$log" || tail -n 60 "$log"
	die "make distcheck failed (whole log: $log)"
fi
grep -A2 'archives ready for distribution' "$log"

if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	tarball="$build/q4khost-$(package_version).tar.gz"
	missing=$(comm -23 <(git -C "$src" ls-files | grep -vE '^(\.gitignore|\.ci/)' | sort) \
		<(tar -tzf "$tarball" | sed 's|^[^/]*/||' | sort))
	[ -z "$missing" ] ||
		die "$tarball lacks files git tracks (add them to EXTRA_DIST or a _SOURCES list in Makefile.am):
$missing"
	echo "tarball: every file git tracks but .gitignore and .ci/"
fi
