#!/usr/bin/env bash
# `q4khost run` on the default model under valgrind memcheck: the reference
# cpu backend with its built-in kernels (no variant, so F2 has nothing to
# measure and spawns nothing; children are traced all the same), two
# threads, a short prompt and four decode tokens (the step recorded on the
# second and replayed from the third). Built normally, with debug info,
# in _build/valgrind; given BUILD, a folder scripts/build.sh has built
# with its default flags (-g -O2), that build as it is (scripts/test.sh
# gives its main build: the same host and cpu plugin, built once). Fails
# on any memory error and on any definitely lost block. About 10 tokens
# through the forward pass: a few minutes on 2 cores.
# Usage: scripts/valgrind-run.sh [BUILD]
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/_build/valgrind}
cd "$top"
bash scripts/install-deps.sh valgrind || exit 1
model=$(bash scripts/fetch-model.sh | sed -n 's/^model: //p')
[ -f "$model" ] || { echo "valgrind-run: no default model" >&2; exit 1; }
if [ $# -eq 0 ]; then
	Q4KH_BUILD_DIR="$build" bash scripts/build.sh --without-cuda 'CFLAGS=-g -O2' || exit 1
elif [ ! -x "$build/host/cli/q4khost" ] || [ ! -f "$build/plugins/cpu/.libs/cpu.so" ]; then
	echo "valgrind-run: $build has no built q4khost and cpu plugin (scripts/build.sh builds them)" >&2
	exit 1
fi

# Only this build's cpu plugin, no user config, receipts in a scratch folder.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
logs="$build/valgrind-logs"
rm -rf "$logs"
mkdir -p "$logs"
verr=99 # memcheck's exit status on an error: none of q4khost's own (0-4)
start=$(date +%s)
env -u Q4KHOST_MODEL -u Q4KHOST_BACKEND -u Q4KHOST_Q4K_KERNEL -u Q4KHOST_F2 \
	-u Q4KHOST_CONFIG -u Q4KHOST_PLUGIN_PATH -u Q4KHOST_LOG \
	XDG_CONFIG_HOME="$scratch/config" Q4KHOST_F2_RECEIPT_DIR="$scratch/receipts" \
	valgrind --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite \
	--error-exitcode=$verr --trace-children=yes --num-callers=30 \
	--log-file="$logs/memcheck.%p.log" \
	"$build/host/cli/q4khost" run -m "$model" --backend cpu --kernel none \
	--plugin-path "$build/plugins/cpu/.libs" --threads 2 -c 64 \
	-p "The capital of France is" -n 4 >"$logs/stdout" 2>"$logs/stderr"
rc=$?
secs=$(($(date +%s) - start))

grep -h 'ERROR SUMMARY\|definitely lost' "$logs"/memcheck.*.log
if [ $rc -eq $verr ] || grep -q 'ERROR SUMMARY: [1-9]' "$logs"/memcheck.*.log; then
	echo "valgrind-run: memcheck found errors (${secs} s); the logs:"
	cat "$logs"/memcheck.*.log
	exit 1
fi
if [ $rc -ne 0 ]; then
	echo "valgrind-run: q4khost run exited with status $rc (${secs} s):"
	cat "$logs/stderr"
	exit 1
fi
grep '^q4khost: \(backend\|kernels\|F2\|prefill\)' "$logs/stderr"
echo "valgrind-run: no memory errors, no definite leaks (${secs} s)"
