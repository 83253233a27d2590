#!/usr/bin/env bash
# The Debian packages: dpkg-buildpackage -us -uc -b in a copy of the
# release tree (make distdir), lintian over the result, and every package
# unpacked into WORK/root, which tests/test_package.c then runs from. The
# CUDA bundle is built when the build tree has the CUDA plugins (for its
# first architecture only, to keep CI short), else the nocuda profile is on.
# The main suite has just run the tests, so the package build does not.
# The .debs and lintian's report are kept in BUILD/tests/debs/.
#
# Then the same tree is built again at the same path (the build path is
# part of a build's environment, as Debian's .buildinfo records it),
# without the CUDA bundle to keep CI short, and every package both builds
# made must hold the same files with the same modes, byte for byte
# ("reproducible: yes", else the differences).
# Usage: tests/package/debs.sh WORK
set -euo pipefail
. "$(dirname "$0")/common.sh"
work=$1
tree=$work/q4khost-$(package_version)
keep=$build/tests/debs

# build_debs LOG PROFILE...: the .debs of a fresh copy of the release tree
# at $tree, left in $work.
build_debs() {
	local log=$1
	shift
	rm -rf "$tree"
	logged "$work/distdir.log" own_make -C "$build" distdir distdir="$tree"
	(cd "$tree" && logged "$log" env DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" \
		dpkg-buildpackage -us -uc -b "$@")
}

arch=$(cuda_arch)
if [ -n "$arch" ]; then
	export DEB_CONFIGURE_EXTRA_FLAGS=--with-cuda-arch=$arch
	profiles=()
else
	profiles=(-Pnocuda)
fi
build_debs "$work/dpkg-buildpackage.log" "${profiles[@]}"
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

# The second build, and what each package holds: "MODE TYPE PATH [SHA-256
# | link target]", a line a file.
contents() {
	local dir=$1
	rm -rf "$dir"
	dpkg-deb -x "$2" "$dir"
	(cd "$dir" && find . -printf '%m %y %p %l\n' | sort -k3 | while read -r mode type path rest; do
		[ "$type" = f ] && rest=$(sha256sum "$path" | cut -d' ' -f1)
		echo "$mode $type $path $rest"
	done)
}
mkdir -p "$work/first" "$work/second"
mv "$work"/*.deb "$work/first/"
build_debs "$work/dpkg-buildpackage-again.log" -Pnocuda
mv "$work"/*.deb "$work/second/"
differ=()
for deb in "$work"/second/*.deb; do
	first=$work/first/$(basename "$deb")
	[ -f "$first" ] || continue
	if ! diff -u <(contents "$work/x1" "$first") <(contents "$work/x2" "$deb") \
		>"$work/$(basename "$deb").diff"; then
		differ+=("$(basename "$deb") ($work/$(basename "$deb").diff)")
	fi
done
echo "lintian: $(grep -c '^E:' "$work/lintian.txt" || true) errors, $(grep -c '^W:' "$work/lintian.txt" || true) warnings"
echo "multiarch: $(dpkg-architecture -qDEB_HOST_MULTIARCH)"
echo "cuda: $([ -n "$arch" ] && echo yes || echo no)"
compared=$(ls "$work"/second/*.deb | while read -r deb; do
	[ -f "$work/first/$(basename "$deb")" ] && basename "$deb"
done | wc -l)
if [ ${#differ[@]} -eq 0 ] && [ "$compared" -gt 0 ]; then
	echo "reproducible: yes"
else
	echo "reproducible: no: $compared packages compared; they differ: ${differ[*]}"
fi
