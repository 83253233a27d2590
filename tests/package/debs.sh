#!/usr/bin/env bash
# The Debian packages: dpkg-buildpackage -us -uc -b in a copy of the
# release tree (make distdir), lintian over the result, and every package
# unpacked into WORK/root, which tests/test_package.c then runs from. The
# CUDA bundle is built when the build tree has the CUDA plugins (for its
# first architecture only, to keep CI short), else the nocuda profile is on.
# The main suite has just run the tests, so the package build does not.
# The .debs and lintian's report are kept in BUILD/tests/debs/.
# Usage: tests/package/debs.sh WORK
set -euo pipefail
. "$(dirname "$0")/common.sh"
work=$1
tree=$work/q4khost-$(package_version)
keep=$build/tests/debs

logged "$work/distdir.log" own_make -C "$build" distdir distdir="$tree"
arch=$(cuda_arch)
if [ -n "$arch" ]; then
	export DEB_CONFIGURE_EXTRA_FLAGS=--with-cuda-arch=$arch
	profiles=()
else
	profiles=(-Pnocuda)
fi
cd "$tree"
logged "$work/dpkg-buildpackage.log" env DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" \
	dpkg-buildpackage -us -uc -b "${profiles[@]}"
cd "$work"
changes=$(ls "$work"/q4khost_*.changes)
# Errors fail; warnings and the rest are reported.
lintian --fail-on error --display-info "$changes" >"$work/lintian.txt" 2>&1 ||
	{ cat "$work/lintian.txt"; die "lintian found errors"; }

rm -rf "$keep"
mkdir -p "$keep" "$work/root"
for deb in "$work"/*.deb; do
	dpkg-deb -x "$deb" "$work/root"
	cp "$deb" "$keep/"
	echo "built: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) ($(du -k "$deb" | cut -f1) KiB)"
done
cp "$work/lintian.txt" "$keep/"
echo "lintian: $(grep -c '^E:' "$work/lintian.txt" || true) errors, $(grep -c '^W:' "$work/lintian.txt" || true) warnings"
echo "multiarch: $(dpkg-architecture -qDEB_HOST_MULTIARCH)"
echo "cuda: $([ -n "$arch" ] && echo yes || echo no)"
