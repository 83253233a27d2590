#!/usr/bin/env bash
# Configure and build q4khost out of tree in ${Q4KH_BUILD_DIR:-_build/main}.
# Extra arguments go to configure (the folder is configured again when they
# change); installs go to ./_prefix unless they say otherwise. Without
# --with-cuda or --without-cuda, configure builds the CUDA plugins whenever
# it finds a toolkit, for every architecture (what packages need).
# Says what it does, one line a stage; make's output goes to BUILD/build.log,
# and also to the terminal when there is one (one short line a file).
#
# --this-machine builds what this machine can run, as scripts/quickstart.sh
# and scripts/test.sh do: the CUDA plugins only for the GPUs nvidia-smi
# lists (their compute capabilities) when a CUDA toolkit is found, and none
# without an NVIDIA GPU and driver, with one line saying which. With
# Q4KH_CUDA=all in the environment it adds nothing instead: configure's
# default, every architecture whenever a toolkit is found (what packages
# build); with Q4KH_CUDA=LIST (compute capabilities, "75,90") it builds
# for those whenever a toolkit is found, GPU or not (CI sets 90).
# --which-cuda prints the configure arguments --this-machine adds (and its
# line on stderr) and does nothing else. Q4KH_MAKE_GOALS in the environment
# makes those goals instead of everything (scripts/fuzz.sh: the fuzzers).
# Usage: scripts/build.sh [--this-machine] [CONFIGURE-ARGS]
#        scripts/build.sh --which-cuda
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

# The configure arguments for this machine: "--without-cuda" or
# "--with-cuda --with-cuda-arch=LIST" (nothing with Q4KH_CUDA=all,
# "--with-cuda-arch=LIST" with Q4KH_CUDA=LIST), with a line on stderr that
# says which and how to build every architecture.
which_cuda() {
	local caps="" nvcc="" d anyway="Q4KH_CUDA=all in the environment builds them anyway"
	case ${Q4KH_CUDA:-} in
	all)
		echo "build: Q4KH_CUDA=all: the CUDA plugins for every architecture when a CUDA toolkit is found" >&2
		return 0 ;;
	'') ;;
	*[!0-9,]* | ,* | *, | *,,*)
		echo "build: Q4KH_CUDA=$Q4KH_CUDA: unknown (all, compute capabilities such as 75,90, or unset for this machine's GPUs)" >&2
		exit 2 ;;
	*)
		echo "build: Q4KH_CUDA=$Q4KH_CUDA: the CUDA plugins for compute capability $Q4KH_CUDA when a CUDA toolkit is found" >&2
		echo "--with-cuda-arch=$Q4KH_CUDA"
		return 0 ;;
	esac
	if command -v nvidia-smi >/dev/null 2>&1; then
		caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
			tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd, -) || caps=""
	fi
	for d in "${CUDA_HOME:-}" /usr/local/cuda; do
		[ -n "$d" ] && [ -x "$d/bin/nvcc" ] && nvcc="$d/bin/nvcc" && break
	done
	[ -n "$nvcc" ] || nvcc=$(command -v nvcc 2>/dev/null) || nvcc=""
	if [ -z "$caps" ]; then
		echo "build: no NVIDIA GPU with a driver here: building without the CUDA plugins ($anyway)" >&2
		echo "--without-cuda"
	elif [ -z "$nvcc" ]; then
		echo "build: an NVIDIA GPU (compute capability $caps) but no CUDA toolkit (nvcc): building without the CUDA plugins" >&2
		echo "--without-cuda"
	else
		echo "build: building the CUDA plugins for this machine's GPUs (compute capability $caps; $anyway for every architecture)" >&2
		echo "--with-cuda --with-cuda-arch=$caps"
	fi
}

case ${1:-} in
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
--which-cuda) which_cuda; exit 0 ;;
--this-machine)
	shift
	cuda=$(which_cuda) || exit 2
	# shellcheck disable=SC2086 # the arguments are words on purpose
	set -- $cuda "$@" ;;
esac

build="${Q4KH_BUILD_DIR:-$top/_build/main}"
# A relative folder is the caller's: made absolute before the cd below.
mkdir -p "$build" && build=$(cd "$build" && pwd) || exit 1
log="$build/build.log"
jobs=$(nproc)
cd "$top"
mkdir -p m4 "$build"
# Builds of other folders may start at the same time (scripts/test.sh
# starts the sanitizer and fuzz builds beside the main one): one of them
# generates configure, the others wait for it and use it.
exec 9>m4/.autoreconf.lock
flock 9
if ! { [ -x configure ] && [ configure -nt configure.ac ] && [ Makefile.in -nt Makefile.am ]; }; then
	echo "build: generating configure (autoreconf)"
	autoreconf -fi >"$build/autoreconf.log" 2>&1 ||
		{ tail -n 20 "$build/autoreconf.log"; echo "build: autoreconf failed; see $build/autoreconf.log" >&2; exit 1; }
fi
exec 9>&-
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
	# shellcheck disable=SC2086 # make goals, split
	make -j"$jobs" -s --no-print-directory V=0 ${Q4KH_MAKE_GOALS:-} 2>&1 | tee "$log"
	status=${PIPESTATUS[0]}
else
	# shellcheck disable=SC2086
	make -j"$jobs" ${Q4KH_MAKE_GOALS:-} >"$log" 2>&1 && status=0 || status=$?
fi
if [ "$status" -ne 0 ]; then
	[ -t 1 ] || tail -n 30 "$log"
	echo "build: make failed (exit $status); see $log" >&2
	exit 1
fi
