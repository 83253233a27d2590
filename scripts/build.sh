#!/usr/bin/env bash
# Configure and build q4khost out of tree in ${Q4KH_BUILD_DIR:-_build/main}.
# Extra arguments go to configure; installs go to ./_prefix unless they say
# otherwise. Usage: scripts/build.sh [CONFIGURE-ARGS]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build="${Q4KH_BUILD_DIR:-$top/_build/main}"
cd "$top"
mkdir -p m4
[ -x configure ] && [ configure -nt configure.ac ] && [ Makefile.in -nt Makefile.am ] ||
	autoreconf -fi >/dev/null 2>&1
mkdir -p "$build"
cd "$build"
[ -f Makefile ] || "$top/configure" --quiet --prefix="$top/_prefix" "$@"
make -j"$(nproc)" >/dev/null
