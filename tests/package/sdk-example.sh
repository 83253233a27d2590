#!/usr/bin/env bash
# The SDK as a vendor meets it: q4khost's `make install DESTDIR=WORK/stage`,
# then an example plugin copied out of the tree and built and installed with
# its own Makefile, finding the SDK through pkg-config alone. The host and
# plugin folder it leaves in WORK/stage are what tests/test_package.c runs.
# Usage: tests/package/sdk-example.sh cpu|cuda WORK
set -euo pipefail
. "$(dirname "$0")/common.sh"
kind=$1 work=$2
stage=$work/stage

if [ "$kind" = cuda ]; then
	nvcc=$(command -v "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" nvcc | head -n 1 || true)
	[ -n "$nvcc" ] || skip "no nvcc in \$CUDA_HOME/bin, /usr/local/cuda/bin or on PATH"
	export CUDA_HOME=$(cd "$(dirname "$nvcc")/.." && pwd)
	arch=$(cuda_arch)
	export CUDA_ARCHS=${arch:-90}
fi

logged "$work/install.log" own_make -C "$build" install DESTDIR="$stage"

# A staged SDK: pkg-config puts the stage in front of every path, plugindir
# included, so the vendor's `make install` needs no DESTDIR.
export PKG_CONFIG_LIBDIR=$stage$Q4KH_TEST_LIBDIR/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
unset PKG_CONFIG_PATH
want=$stage$Q4KH_TEST_PLUGINDIR
got=$(pkg-config --variable=plugindir q4khost-plugin)
[ "$got" = "$want" ] || die "pkg-config's plugindir is '$got', expected '$want'"

cp -r "$src/sdk/examples/$kind-q4k" "$work/vendor"
chmod -R u+w "$work/vendor" # a read-only source tree stays read-only
logged "$work/vendor.log" own_make -C "$work/vendor"
logged "$work/vendor-install.log" own_make -C "$work/vendor" install
echo "host: $stage$Q4KH_TEST_BINDIR/q4khost"
echo "plugins: $want"
echo "completion: $stage$Q4KH_TEST_COMPLETIONDIR/q4khost"
