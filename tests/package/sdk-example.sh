#!/usr/bin/env bash
# The SDK as a vendor meets it: q4khost's `make install DESTDIR=WORK/stage`,
# then an example plugin copied out of the tree and built and installed with
# its own Makefile, finding the SDK through pkg-config alone. The host and
# plugin folder it leaves in WORK/stage are what tests/test_package.c runs.
# Usage: tests/package/sdk-example.sh EXAMPLE WORK, EXAMPLE a folder of
# sdk/examples (cpu-q4k, cuda-q4k, backend)
set -euo pipefail
. "$(dirname "$0")/common.sh"
example=$1 work=$2
stage=$work/stage

if [ "$example" = cuda-q4k ]; then
	nvcc=$(command -v "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" nvcc | head -n 1 || true)
	[ -n "$nvcc" ] || skip "no nvcc in \$CUDA_HOME/bin, /usr/local/cuda/bin or on PATH"
	# its gemm links the SDK's CUDA library, which only a build with CUDA installs
	arch=$(cuda_arch)
	[ -n "$arch" ] || skip "q4khost is configured without CUDA here: no SDK CUDA library" \
		"(libq4khost_sdk_cuda.a, pkg-config q4khost-plugin-cuda) for the CUDA example to link"
	export CUDA_HOME=$(cd "$(dirname "$nvcc")/.." && pwd)
	export CUDA_ARCHS=$arch
fi

logged "$work/install.log" own_make -C "$build" install DESTDIR="$stage"

build_vendor_example "$src/sdk/examples/$example" "$stage" "$Q4KH_TEST_LIBDIR" \
	"$Q4KH_TEST_PLUGINDIR" "$work/vendor"
echo "host: $stage$Q4KH_TEST_BINDIR/q4khost"
echo "plugins: $stage$Q4KH_TEST_PLUGINDIR"
echo "completion: $stage$Q4KH_TEST_COMPLETIONDIR/q4khost"
