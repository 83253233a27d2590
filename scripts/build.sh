#!/usr/bin/env bash
# Configure and build q4khost out of tree in ${Q4KH_BUILD_DIR:-_build/main}.
# Extra arguments go to configure (the folder is configured again when they
# change); installs go to ./_prefix unless they say otherwise. Without
# --with-cuda or --without-cuda, configure builds the CUDA plugins whenever
# it finds a toolkit, for every architecture (what CI and packages need).
# Says what it does, one line a stage; make's output goes to BUILD/build.log,
# and also to the terminal when there is one (one short line a file).
# Usage: scripts/build.sh [CONFIGURE-ARGS]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build="${Q4KH_BUILD_DIR:-$top/_build/main}"
log="$build/build.log"
jobs=$(nproc)
cd "$top"
mkdir -p m4 "$build"
if ! { [ -x configure ] && [ configure -nt configure.ac ] && [ Makefile.in -nt Makefile.am ]; }; then
	echo "build: generating configure (autoreconf)"
	autoreconf -fi >"$build/autoreconf.log" 2>&1 ||
		{ tail -n 20 "$build/autoreconf.log"; echo "build: autoreconf failed; see $build/autoreconf.log" >&2; exit 1; }
fi
cd "$build"
# The arguments this folder was configured with, to notice a change.
args="--prefix=$top/_prefix $*"
if [ ! -f Makefile ] || [ "$(cat .configure-args 2>/dev/null)" != "$args" ]; then
	echo "build: configuring $build${*:+ ($*)}"
	"$top/configure" --prefix="$top/_prefix" "$@" >"$build/configure.log" 2>&1 ||
		{ tail -n 20 "$build/configure.log"; echo "build: configure failed; see $build/configure.log" >&2; exit 1; }
	echo "$args" >.configure-args
	sed -n 's/^configure: \(CUDA plugins: .*\)/build: \1/p' "$build/configure.log"
fi
echo "build: compiling with make -j$jobs (log: $log)"
if [ -t 1 ]; then
	make -j"$jobs" -s --no-print-directory V=0 2>&1 | tee "$log"
	status=${PIPESTATUS[0]}
else
	make -j"$jobs" >"$log" 2>&1 && status=0 || status=$?
fi
if [ "$status" -ne 0 ]; then
	[ -t 1 ] || tail -n 30 "$log"
	echo "build: make failed (exit $status); see $log" >&2
	exit 1
fi
