#!/usr/bin/env bash
# Fetch the openai Python client (and what it needs) from the Python
# registry into ${XDG_CACHE_HOME:-~/.cache}/q4khost/python/openai-VERSION,
# for tests/test_serve.c to talk to q4khost serve as applications do.
# Nothing is installed into Python itself: the folder goes on PYTHONPATH.
# Prints the folder. --cached: fetch nothing; exit 1 when it is missing.
# Usage: scripts/fetch-openai.sh [--cached]
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail

version=3.51.0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/q4khost/python/openai-$version"

if [ ! -f "$dir/.complete" ]; then
	[ "${1:-}" = --cached ] && exit 1
	mkdir -p "$(dirname "$dir")"
	work=$(mktemp -d "$dir.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	echo "fetch-openai: installing openai $version into $dir" >&2
	python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
		--root-user-action=ignore --no-compile --only-binary=:all: \
		--target "$work" "openai==$version"
	touch "$work/.complete"
	rm -rf "$dir"
	mv "$work" "$dir"
fi
echo "$dir"
