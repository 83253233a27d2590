#!/usr/bin/env bash
# make install as a user meets it, and the bytes it installs: the build
# tree installed with DESTDIR under umask 002 (what Debian, Ubuntu and
# Fedora give users) into WORK/umask-002 and under umask 022 into
# WORK/umask-022; then the release tree (make distdir) at another path,
# configured as the build tree was in a build folder of another depth,
# its plugins built there without ccache. tests/test_package.c checks the
# modes, runs the installed host, and compares every plugin's SHA-256:
# the same sources and toolchain must give the same bytes whatever the
# folder (F2's receipts are keyed on them).
#
# With CUDA the second build makes the cpu plugins and cuda-dp4a only
# (every .cu file goes through the one rule of scripts/nvcc-libtool.sh),
# to keep CI short.
# Usage: tests/package/install.sh WORK
set -euo pipefail
. "$(dirname "$0")/common.sh"
work=$1

for mask in 002 022; do
	(umask $mask && logged "$work/install-$mask.log" own_make -C "$build" install \
		DESTDIR="$work/umask-$mask")
	echo "umask-$mask: $work/umask-$mask"
done

tree=$work/elsewhere/q4khost-$(package_version)
mkdir -p "$work/elsewhere"
logged "$work/distdir.log" own_make -C "$build" distdir distdir="$tree"
# The build tree's configure arguments, as config.status quotes them.
eval "set -- $(cd "$build" && ./config.status --config)"
mkdir -p "$tree/_b/x"
(cd "$tree/_b/x" && logged "$work/configure.log" ../../configure "$@")
targets=()
for so in "$work/umask-022$Q4KH_TEST_PLUGINDIR"/*.so; do
	name=$(basename "$so" .so)
	case $name in
	cuda-dp4a | cpu*) targets+=("plugins/$name/$name.la") ;;
	esac
done
[ ${#targets[@]} -gt 0 ] || die "no plugin installed in $work/umask-022$Q4KH_TEST_PLUGINDIR"
export CCACHE_DISABLE=1 # the compiler's own bytes, not a cache's
logged "$work/elsewhere.log" own_make -C "$tree/_b/x" -j"$(nproc)" \
	"${targets[@]}"
echo "elsewhere: $tree/_b/x"
echo "built elsewhere: ${targets[*]}"
