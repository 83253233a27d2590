#!/usr/bin/env bash
# The RPM packages, built on this Debian machine with Debian's rpm: make
# dist's tarball and the spec it ships through rpmbuild -bb, with
# tests/package/rpm-macros standing in for a distribution's rpm
# configuration; rpmlint over the spec and the packages with the tarball's
# q4khost.rpmlintrc, failing on any error or warning it does not filter;
# every package but the debug ones installed with rpm --root WORK/root
# --nodeps (the root holds no system to satisfy their dependencies); and
# the cpu SDK example, copied from the installed -devel documents, built
# against the installed -devel files through pkg-config into
# WORK/vendor-plugins. tests/test_package.c then runs from WORK/root.
#
# rpmbuild --nodeps: rpm looks for the build dependencies in its own
# database, which holds nothing on Debian; Debian's packages supply them
# here. --without cuda unless Q4KH_TEST_RPM_CUDA=1 and the build tree has
# the CUDA plugins (then for one architecture, tests/package/common.sh's
# cuda_arch): the .deb build compiles and checks the CUDA bundle, and a
# third compile of it would cost CI minutes. The main suite has just run the tests, so the package build does
# not (--nocheck). The .rpms and rpmlint's report are kept in
# BUILD/tests/rpms/.
# Usage: tests/package/rpms.sh WORK
set -euo pipefail
. "$(dirname "$0")/common.sh"
work=$1
for tool in rpmbuild rpmlint eu-strip; do
	command -v $tool >/dev/null ||
		skip "no $tool here (Debian: apt-get install rpm rpmlint elfutils, as scripts/install-deps.sh does)"
done
version=$(package_version)
top=$work/rpmbuild
root=$work/root
keep=$build/tests/rpms
libdir=$(rpm --eval '%{_libdir}')

mkdir -p "$top/SOURCES" "$top/SPECS"
logged "$work/dist.log" own_make -C "$build" dist
mv "$build/q4khost-$version.tar.gz" "$top/SOURCES/"
tar -xzf "$top/SOURCES/q4khost-$version.tar.gz" -C "$top/SPECS" --strip-components=3 \
	"q4khost-$version/packaging/rpm/q4khost.spec" \
	"q4khost-$version/packaging/rpm/q4khost.rpmlintrc"
arch=""
[ "${Q4KH_TEST_RPM_CUDA:-0}" = 1 ] && arch=$(cuda_arch)
if [ -n "$arch" ]; then
	cuda=(--with cuda --define "cuda_arch $arch")
else
	cuda=(--without cuda)
fi
logged "$work/rpmbuild.log" rpmbuild -bb --nodeps --nocheck --define "_topdir $top" \
	--load "$src/tests/package/rpm-macros" "${cuda[@]}" "$top/SPECS/q4khost.spec"
rpms=("$top"/RPMS/*/*.rpm)

# Errors and unfiltered warnings fail; the caller's rpmlint settings stay out.
XDG_CONFIG_HOME=$work/config rpmlint -c "$src/tests/package/rpmlint.toml" \
	-r "$top/SPECS/q4khost.rpmlintrc" \
	"$top/SPECS/q4khost.spec" "${rpms[@]}" >"$work/rpmlint.txt" 2>&1 || true
summary=$(sed -n 's/^ *\([0-9]* packages and [0-9]* specfiles checked.*[^ ]\) *$/\1/p' "$work/rpmlint.txt")
case $summary in
*"; 0 errors, 0 warnings,"*) ;;
*) cat "$work/rpmlint.txt"; die "rpmlint: ${summary:-no summary line}" ;;
esac

rm -rf "$keep"
mkdir -p "$keep" "$root"
installed=()
for rpm in "${rpms[@]}"; do
	cp "$rpm" "$keep/"
	echo "built: $(rpm -qp --qf '%{NAME} %{VERSION}-%{RELEASE} %{ARCH}' "$rpm") ($(du -k "$rpm" | cut -f1) KiB)"
	case $rpm in
	*-debuginfo-* | *-debugsource-*) ;;
	*) installed+=("$rpm") ;;
	esac
done
cp "$work/rpmlint.txt" "$keep/"
logged "$work/rpm-install.log" rpm --root "$root" --nodeps -i "${installed[@]}"

# The ELF files installed: each stripped, with its debug information in
# -debuginfo, and none with a RUNPATH or RPATH. The SDK's static library
# (-devel) is an archive of objects that keep their debug information
# (the spec says why), not one of these.
elf=0 debuglink=0 runpath=0
while IFS= read -r -d '' file; do
	[ "${file%.a}" = "$file" ] || continue
	readelf -h "$file" >/dev/null 2>&1 || continue
	elf=$((elf + 1))
	sections=$(readelf -S -W "$file")
	if grep -q ' \.gnu_debuglink ' <<<"$sections" && ! grep -q ' \.debug_info ' <<<"$sections"; then
		debuglink=$((debuglink + 1))
	fi
	if readelf -d "$file" | grep -qE '\((RUNPATH|RPATH)\)'; then
		echo "RUNPATH in ${file#"$root"}"
		runpath=$((runpath + 1))
	fi
done < <(find "$root/usr" -type f -print0)
debug=$(rpm -qlp "$top"/RPMS/*/q4khost-debuginfo-*.rpm | grep -c '^/usr/lib/debug/usr/.*\.debug$' || true)

examples=$(rpm --root "$root" -ql q4khost-devel | sed -n 's|/cpu-q4k/Makefile$||p')
[ -n "$examples" ] || die "q4khost-devel holds no examples/cpu-q4k/Makefile"
build_vendor_example "$root$examples/cpu-q4k" "$root" "$libdir" \
	"$libdir/q4khost/plugins-abi$(sed -n 's/^Q4KH_ABI_MAJOR = //p' "$build/Makefile")" \
	"$work/vendor" PLUGINDIR="$work/vendor-plugins"

echo "rpmlint: $summary"
echo "libdir: $libdir"
echo "elf: $elf"
echo "debuglink: $debuglink"
echo "debuginfo: $debug"
echo "runpath: $runpath"
echo "vendor-plugins: $work/vendor-plugins"
echo "cuda: $([ -n "$arch" ] && echo yes || echo no)"
