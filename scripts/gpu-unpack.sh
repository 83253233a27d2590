#!/usr/bin/env bash
# On the GPU machine: unpack .gpu/bundle.tar.xz (scripts/gpu-bundle.sh)
# into .gpu/build and .gpu/lib, unless they are there and newer than it.
# scripts/gpu-check.sh and scripts/bench-engines.sh run it first.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
packed=.gpu/bundle.tar.xz
[ -f "$packed" ] || exit 0
if [ -d .gpu/build ] && [ .gpu/build -nt "$packed" ]; then
	exit 0
fi
rm -rf .gpu/build .gpu/lib
tar -C .gpu -xJf "$packed"
touch .gpu/build
