#!/usr/bin/env bash
# Build the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang in
# ${Q4KH_FUZZ_BUILD_DIR:-_build/fuzz} (configure --enable-fuzzers) and run
# each for SECONDS (default 60), as many at a time as there are cores
# (each target on one). Each
# target's corpus stays in BUILD/fuzz-corpus/TARGET between runs; it starts
# from the committed seeds and regression inputs (tests/fuzz/seeds,
# tests/fuzz/regressions) and seeds made here from real files: the default
# model's header region and the tiny models (gguf), the project's texts
# (tokenizer) and its INI files (config). A crashing input lands in
# BUILD/fuzz-crashes/TARGET; keep it in tests/fuzz/regressions/TARGET once
# the bug is fixed. Prints one line per target (seconds, executions,
# crashes) and ends with "N passed, N failed"; exits 1 on any crash.
# --build builds and runs nothing (scripts/test.sh does that beside the
# main stage, where it keeps idle cores busy).
# Usage: scripts/fuzz.sh [SECONDS [TARGET...]]  (TARGET: gguf, tokenizer,
# config, receipt; default all)
#        scripts/fuzz.sh --build
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -uo pipefail
usage="usage: scripts/fuzz.sh [SECONDS [gguf|tokenizer|config|receipt...] | --build]"
build_only=0
[ "${1:-}" = --build ] && [ $# -eq 1 ] && build_only=1 && shift
secs=${1:-60}
case $secs in '' | *[!0-9]*) echo "$usage" >&2; exit 2 ;; esac
[ $# -gt 0 ] && shift
all="gguf tokenizer config receipt"
targets=${*:-$all}
for t in $targets; do
	case " $all " in *" $t "*) ;; *) echo "$usage" >&2; exit 2 ;; esac
done
top=$(cd "$(dirname "$0")/.." && pwd)
build="${Q4KH_FUZZ_BUILD_DIR:-$top/_build/fuzz}"
# The fuzz build: clang with sanitizers (configure --enable-fuzzers), the
# fuzzers and the library they link, nothing else of the tree.
bash "$top/scripts/install-deps.sh" clang libclang-rt-dev llvm || exit 1
mkdir -p "$build"
# shellcheck disable=SC2086 # the targets, split
Q4KH_MAKE_GOALS=$(printf 'tests/fuzz/fuzz-%s ' $all) \
	Q4KH_BUILD_DIR="$build" bash "$top/scripts/build.sh" --without-cuda \
	--enable-fuzzers CC=clang CFLAGS="-g -O1" 2>"$build/fuzz-build.log" ||
	{ tail -20 "$build/fuzz-build.log"; exit 1; }
[ $build_only -eq 0 ] || exit 0
cd "$build" || exit 1
export Q4KH_TEST_SRCDIR="$top"

# seeds made from real files, fresh each run (not committed: megabytes)
made_seeds() {
	local t=$1 dir=$2 model f i=0
	case $t in
	gguf)
		cp "$top"/tests/fixtures/tiny-*.gguf "$dir"/
		model=${Q4KHOST_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/q4khost/models/gemma-3-270m-q4_k_m.gguf}
		# metadata and tensor infos end at 6.3 MiB in the default model
		[ -f "$model" ] && head -c $((7 * 1024 * 1024)) "$model" >"$dir/model-head.gguf"
		;;
	tokenizer)
		# selector byte (fuzz_tokenizer.c) then a stretch of real text
		for f in "$top"/README.md "$top"/docs/*.md; do
			{ printf "\\$(printf '%03o' $((i % 4)))"; head -c 2048 "$f"; } >"$dir/text-$i"
			i=$((i + 1))
		done
		;;
	config)
		{ cat "$top/data/q4khost.ini"; printf '\0'; cat "$top/data/conf.d/50-cuda.ini"; } \
			>"$dir/data-ini"
		;;
	esac
}

# fuzz_one TARGET: one target for $secs s; its line, and on a crash the
# report's gist, on stdout; exit 1 on a crash.
fuzz_one() {
	local t=$1 corpus="$build/fuzz-corpus/$1" seeds="$build/fuzz-seeds/$1"
	local crashes="$build/fuzz-crashes/$1" log="$build/fuzz-$1.log" tmp rc start took execs
	rm -rf "$seeds"
	mkdir -p "$corpus" "$seeds" "$crashes"
	for d in seeds regressions; do
		[ -d "$top/tests/fuzz/$d/$t" ] && cp "$top/tests/fuzz/$d/$t"/* "$seeds"/ 2>/dev/null
	done
	made_seeds "$t" "$seeds"
	# libFuzzer exits without atexit handlers: the targets' scratch files
	# go to a folder cleared here instead of /tmp
	tmp="$build/fuzz-tmp/$t"
	rm -rf "$tmp"
	mkdir -p "$tmp"
	start=$(date +%s)
	TMPDIR="$tmp" timeout $((secs + 120)) "$build/tests/fuzz/fuzz-$t" -max_total_time="$secs" \
		-print_final_stats=1 -timeout=30 -rss_limit_mb=4096 \
		-artifact_prefix="$crashes/" "$corpus" "$seeds" >"$log" 2>&1
	rc=$?
	took=$(($(date +%s) - start))
	rm -rf "$tmp"
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	echo "fuzz-$t: ${took} s, ${execs:-0} executions, $((rc != 0)) crashes"
	if [ $rc -ne 0 ]; then
		grep -E '^(fuzz: violated|==[0-9]+==ERROR|SUMMARY)|Test unit written' "$log" | head -5
		echo "  (log: $log)"
		return 1
	fi
}

# The targets side by side, a core each; each one's lines as it ends.
passed=0 failed=0 jobs=$(nproc) running=()
for t in $targets; do
	fuzz_one "$t" >"$build/fuzz-$t.out" &
	running+=("$!:$t")
	[ ${#running[@]} -lt "$jobs" ] && [ "$t" != "${targets##* }" ] && continue
	for job in "${running[@]}"; do
		if wait "${job%%:*}"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
		cat "$build/fuzz-${job#*:}.out"
	done
	running=()
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
