# Shared by the scripts in tests/package/, which tests/test_package.c runs
# with make check's environment (Q4KH_TEST_BUILDDIR, Q4KH_TEST_SRCDIR, ...).
build=${Q4KH_TEST_BUILDDIR:?run through make check (tests/test_package)}
src=${Q4KH_TEST_SRCDIR:?run through make check (tests/test_package)}

die()
{
	echo "${0##*/}: $*" >&2
	exit 1
}

# Exit 77: tests/test_package.c skips the test with this reason.
skip()
{
	echo "$*"
	exit 77
}

# A make of our own, not a job of the make check that runs us.
own_make()
{
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make "$@"
}

# Run "$@" with its output in LOG; on failure show the end and die.
logged()
{
	local log=$1
	shift
	echo "+ $* >$log"
	"$@" >"$log" 2>&1 || {
		tail -n 60 "$log"
		die "failed: $* (whole log: $log)"
	}
}

# The CUDA architecture the packaging builds compile for: "75", the oldest
# the plugins support, when the build tree has the CUDA plugins (whatever
# it was built for: CI builds 9.0 there, so both sides of the
# architecture tests compile), nothing when it was configured without
# CUDA. One architecture only, to keep CI short.
cuda_arch()
{
	if grep -q '^#define Q4KH_CUDA_ARCHS "sm_' "$build/buildconf.h"; then
		echo 75
	fi
}

# The version make dist names the tree with.
package_version()
{
	sed -n 's/^PACKAGE_VERSION = //p' "$build/Makefile"
}

# build_vendor_example SRC STAGE LIBDIR PLUGINDIR DIR [MAKE-ARG...]: copy the
# SDK example SRC to DIR, then build and install it there with its own
# Makefile against the SDK installed under STAGE (q4khost's LIBDIR and
# PLUGINDIR inside it), found through pkg-config alone. The MAKE-ARGs go to
# its `make install`.
build_vendor_example()
{
	local example=$1 stage=$2 libdir=$3 plugindir=$4 dir=$5 got
	shift 5
	# pkg-config puts the stage in front of every path, plugindir included,
	# so the vendor's `make install` needs no DESTDIR.
	export PKG_CONFIG_LIBDIR=$stage$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
	unset PKG_CONFIG_PATH
	got=$(pkg-config --variable=plugindir q4khost-plugin)
	[ "$got" = "$stage$plugindir" ] ||
		die "pkg-config's plugindir is '$got', expected '$stage$plugindir'"
	cp -r "$example" "$dir"
	chmod -R u+w "$dir" # a read-only source tree stays read-only
	logged "$dir.log" own_make -C "$dir"
	logged "$dir-install.log" own_make -C "$dir" install "$@"
}
