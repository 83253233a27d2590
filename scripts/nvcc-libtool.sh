#!/bin/sh
# nvcc as libtool's compiler, for Makefile.am's .cu.lo rule:
#   libtool --tag=CC --mode=compile sh scripts/nvcc-libtool.sh NVCC ARGS...
# libtool adds the C compiler's flags for position-independent code, which
# nvcc does not take itself; they go to the host compiler through
# --compiler-options. Everything else passes unchanged. (Makefile.am spells
# host-compiler flags --compiler-options too: libtool would take -Xcompiler
# for itself.)
nvcc=$1
shift
for arg; do
	shift
	case $arg in
	-fPIC | -fpic | -fno-common) set -- "$@" --compiler-options="$arg" ;;
	*) set -- "$@" "$arg" ;;
	esac
done
exec "$nvcc" "$@"
