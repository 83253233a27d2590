#!/usr/bin/env bash
# The GEMV harness alone: scripts/cuda-emulate.sh [OUT-DIR] gemv.
# Usage: scripts/gemv-emulate.sh [OUT-DIR]   (default _build/emu)
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
top=$(cd "$(dirname "$0")/.." && pwd)
exec bash "$top/scripts/cuda-emulate.sh" "${1:-$top/_build/emu}" gemv
