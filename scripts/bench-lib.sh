# What the side-by-side scripts with llama.cpp share (sourced by
# scripts/bench-engines.sh, scripts/bench-ttft.sh and scripts/bench-cpu.sh
# from the repository root, $top, before they read their arguments: the
# functions read $build, $lib and $out when called).

# The calling script's header comment as its help, and exit: STATUS 0 for
# --help (on stdout), 2 for a wrong argument (on stderr).
usage() { # STATUS
	sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&"$((${1:-2} ? 2 : 1))"
	exit "${1:-2}"
}

step() { echo "== $* ($(date +%T))" >&2; }

# The q4khost build to time: $build, else .gpu/build where
# scripts/gpu-unpack.sh unpacked the carried one, else DEFAULT. Its carried
# libraries ($lib) go on the library path, its plugin folders on
# Q4KHOST_PLUGIN_PATH; sets q4k (its CLI) and makes $out.
bench_setup() {
	scripts/gpu-unpack.sh || return 1
	if [ -z "$build" ]; then
		build=$1
		[ -d .gpu/build ] && build=.gpu/build
	fi
	[ -d "$lib" ] && export LD_LIBRARY_PATH="$top/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	q4k="$top/$build/host/cli/q4khost"
	export Q4KHOST_PLUGIN_PATH
	Q4KHOST_PLUGIN_PATH=$(ls -d "$top/$build"/plugins/*/.libs | paste -sd:)
	mkdir -p "$out"
}

# The python3 that makes the models (scripts/gen-bench-model.py needs
# NumPy) into $python: $PYTHON, else the first python3 on PATH. 1, having
# said which python3 lacks NumPy and what to do, when it has none.
bench_python() {
	python=${PYTHON:-python3}
	"$python" -c 'import numpy' 2>/dev/null && return 0
	echo "$(basename "$0"): $(command -v "$python" || echo "$python") ($("$python" --version 2>&1)) has no NumPy, which scripts/gen-bench-model.py needs to make the benchmark models" >&2
	if [ "$(command -v "$python")" != /usr/bin/python3 ] &&
		/usr/bin/python3 -c 'import numpy' 2>/dev/null; then
		echo "  /usr/bin/python3 has it: run again with PYTHON=/usr/bin/python3 (a pyenv python3 ahead of Debian's on PATH does not see Debian's python3-numpy)" >&2
	else
		echo "  install it (apt-get install python3-numpy, or $python -m pip install numpy), or name a python3 that has it in PYTHON" >&2
	fi
	return 1
}

# The benchmark models named in the comma-separated LIST into the array
# files: names of scripts/gen-bench-model.py, made once per machine under
# /tmp/models by bench_python's python3, or GGUF paths, taken as they are.
# 1 when one cannot be made.
bench_models() {
	local m f names
	files=()
	IFS=, read -ra names <<<"$1"
	for m in "${names[@]}"; do
		case $m in
		*.gguf) files+=("$m") ;;
		*)
			f=/tmp/models/$m.gguf
			if [ ! -f "$f" ]; then
				bench_python || return 1
				step "generating $m"
				mkdir -p /tmp/models
				"$python" scripts/gen-bench-model.py "$m" "$f.part" >"$out/gen-$m.log" 2>&1 &&
					mv "$f.part" "$f" ||
					{ tail -5 "$out/gen-$m.log" >&2; return 1; }
			fi
			files+=("$f")
			;;
		esac
	done
}

# llama.cpp's programs TARGETS (comma-separated) built in DIR/build from the
# source tarball TARBALL (scripts/llamacpp-bundle.sh), with the extra cmake
# arguments after the third; only those not built there already, so once
# per machine. Logs in $out. 1 when the build fails.
build_llamacpp() {
	local tarball=$1 dir=$2 targets=$3 missing= t
	shift 3
	for t in ${targets//,/ }; do
		[ -x "$dir/build/bin/$t" ] || missing+=" $t"
	done
	[ -n "$missing" ] || return 0
	step "building llama.cpp ($targets) in $dir"
	[ -d "$dir/llama.cpp" ] || { mkdir -p "$dir" && tar -C "$dir" -xJf "$tarball"; } || return 1
	cmake -S "$dir/llama.cpp" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
		-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "$@" \
		>"$out/cmake.log" 2>&1 &&
		cmake --build "$dir/build" -j"$(nproc)" --target $missing >"$out/build.log" 2>&1 ||
		{ tail -30 "$out/build.log" >&2; return 1; }
}

# A raw prompt of D tokens on the benchmark vocabularies (one token per
# character: byte tokens, gemma3-270m's one-character pieces): BOS and D - 1.
bench_prompt() {
	python3 -c 'import sys; n=int(sys.argv[1]); print(("the quick brown fox " * n)[:n-1])' "$1"
}

# 0 once the server on 127.0.0.1:PORT answers GET /v1/models (polled every
# 0.1 s, up to 5 minutes); 1, with the end of its log LOG, when its process
# PID died first or the time ran out.
wait_up() { # LOG PORT PID
	for _ in $(seq 3000); do
		python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
			"http://127.0.0.1:$2/v1/models" 2>/dev/null && return 0
		kill -0 "$3" 2>/dev/null || { tail -5 "$1" >&2; return 1; }
		sleep 0.1
	done
	return 1
}
