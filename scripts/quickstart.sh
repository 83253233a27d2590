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
# so (scripts/build.sh --this-machine, which scripts/test.sh uses too):
# `Q4KH_CUDA=all scripts/quickstart.sh` or `scripts/build.sh --with-cuda`
# builds them anyway, for every architecture, as CI and the packages do.
# Usage: scripts/quickstart.sh [PROMPT]   (-h, --help: this text)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
t0=$(date +%s)
stage() { echo "quickstart: [$1/5] $2 (at $(($(date +%s) - t0)) s)"; }

case ${1:-} in
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac

stage 1 "installing the build packages that are missing (scripts/install-deps.sh)"
scripts/install-deps.sh
stage 2 "building in _build/main"
Q4KH_BUILD_DIR="$top/_build/main" scripts/build.sh --this-machine
stage 3 "installing into $top/_prefix (log: _build/main/install.log)"
# Folders no group may write, whatever the user's umask: the host refuses
# plugins below one that others could write (docs/config.md).
(umask 022 && make -C "$top/_build/main" install) >"$top/_build/main/install.log" 2>&1 ||
	{ tail -n 20 "$top/_build/main/install.log"; exit 1; }
stage 4 "fetching the default model (scripts/fetch-model.sh)"
scripts/fetch-model.sh
prompt=${1:-The three primary colors are}
stage 5 "generating 48 tokens after the prompt \"$prompt\" (a first run checks its kernels against the reference: F2)"
"$top/_prefix/bin/q4khost" run -n 48 -p "$prompt"
echo "quickstart: done in $(($(date +%s) - t0)) s. Next:"
echo "  export PATH=\"$top/_prefix/bin:\$PATH\" MANPATH=\"$top/_prefix/share/man:\""
echo "  q4khost run -p \"Once upon a time\" -n 64; q4khost --help; man q4khost"
