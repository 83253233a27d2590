#!/bin/sh
# nvcc as libtool's compiler, for Makefile.am's .cu.lo rule:
#   libtool --tag=CC --mode=compile sh scripts/nvcc-libtool.sh NVCC ARGS...
# libtool adds the C compiler's flags for position-independent code, which
# nvcc does not take itself; they go to the host compiler through
# --compiler-options. Everything else passes unchanged. (Makefile.am spells
# host-compiler flags --compiler-options too: libtool would take -Xcompiler
# for itself.)
#
# The object is the same bytes wherever the tree is built (F2's receipts
# are keyed on each plugin's SHA-256): nvcc names a file's internal symbols
# after a hash of the source's absolute path, which the source's path in
# the tree replaces (cudafe++'s --orig_src_path_name), and its host object
# keeps the name of nvcc's temporary file (tmpxft_PID_...), which is
# stripped (OBJCOPY, default objcopy).
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
nvcc=$1
shift
top=$(cd "$(dirname "$0")/.." && pwd -P)
out="" prev=""
for arg; do
	shift
	case $arg in
	-fPIC | -fpic | -fno-common) set -- "$@" --compiler-options="$arg" ;;
	*.cu)
		src=$(cd "$(dirname "$arg")" && pwd -P)/$(basename "$arg")
		set -- "$@" -Xcudafe "--orig_src_path_name=${src#"$top"/}" "$arg" ;;
	*) set -- "$@" "$arg" ;;
	esac
	[ "$prev" = -o ] && out=$arg
	prev=$arg
done
"$nvcc" "$@" || exit
[ -z "$out" ] || "${OBJCOPY:-objcopy}" --wildcard --strip-symbol='tmpxft_*' "$out"
