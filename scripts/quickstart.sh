#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to text: install what is
# missing, build what this machine can run, install into ./_prefix, fetch
# the default model, and run it on a default prompt. Each stage says what
# it does and how long it took; make's output goes to _build/main/build.log
# (and to the terminal, when there is one).
#
# The CUDA plugins are built only for the GPUs this machine has (their
# compute capabilities, from nvidia-smi), and only when a CUDA toolkit is
# found; without a GPU and driver they are left out, with one line saying
# so: `scripts/build.sh --with-cuda` builds them anyway, for every
# architecture, as scripts/test.sh and the packages do.
# Usage: scripts/quickstart.sh [PROMPT]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
t0=$(date +%s)
stage() { echo "quickstart: [$1/5] $2 (at $(($(date +%s) - t0)) s)"; }

# The configure arguments for the GPUs here: "--without-cuda" with a note
# on stderr, or "--with-cuda --with-cuda-arch=LIST".
cuda_args() {
	local caps="" nvcc=""
	if command -v nvidia-smi >/dev/null 2>&1; then
		caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
			tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd, -) || caps=""
	fi
	for d in "${CUDA_HOME:-}" /usr/local/cuda; do
		[ -n "$d" ] && [ -x "$d/bin/nvcc" ] && nvcc="$d/bin/nvcc" && break
	done
	[ -n "$nvcc" ] || nvcc=$(command -v nvcc 2>/dev/null) || nvcc=""
	if [ -z "$caps" ]; then
		echo "quickstart: no NVIDIA GPU with a driver here: building without the CUDA plugins (scripts/build.sh --with-cuda builds them anyway)" >&2
		echo "--without-cuda"
	elif [ -z "$nvcc" ]; then
		echo "quickstart: an NVIDIA GPU (compute capability $caps) but no CUDA toolkit (nvcc): building without the CUDA plugins" >&2
		echo "--without-cuda"
	else
		echo "quickstart: building the CUDA plugins for this machine's GPUs (compute capability $caps)" >&2
		echo "--with-cuda --with-cuda-arch=$caps"
	fi
}

stage 1 "installing the build packages that are missing (scripts/install-deps.sh)"
scripts/install-deps.sh
stage 2 "building in _build/main"
# shellcheck disable=SC2046 # the arguments are words on purpose
Q4KH_BUILD_DIR="$top/_build/main" scripts/build.sh $(cuda_args)
stage 3 "installing into $top/_prefix (log: _build/main/install.log)"
make -C "$top/_build/main" install >"$top/_build/main/install.log" 2>&1 ||
	{ tail -n 20 "$top/_build/main/install.log"; exit 1; }
stage 4 "fetching the default model (scripts/fetch-model.sh)"
scripts/fetch-model.sh
prompt=${1:-The three primary colors are}
stage 5 "generating 48 tokens after the prompt \"$prompt\" (a first run checks its kernels against the reference: F2)"
"$top/_prefix/bin/q4khost" run -n 48 -p "$prompt"
echo "quickstart: done in $(($(date +%s) - t0)) s. Next:"
echo "  export PATH=\"$top/_prefix/bin:\$PATH\" MANPATH=\"$top/_prefix/share/man:\""
echo "  q4khost run -p \"Once upon a time\" -n 64; q4khost --help; man q4khost"
