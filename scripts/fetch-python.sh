#!/usr/bin/env bash
# Fetch a Python package the tests use, and what it needs, from the Python
# registry into ${XDG_CACHE_HOME:-~/.cache}/q4khost/python/NAME-VERSION:
#   openai               the client tests/test_serve.c talks to q4khost
#                        serve with, as applications do
#   kubernetes-validate  the schema validator (the schemas inside, no
#                        cluster asked) of packaging/kubernetes
# Nothing is installed into Python itself: the folder goes on PYTHONPATH.
# Prints the folder. --cached: fetch nothing; exit 1 when it is missing.
# Usage: scripts/fetch-python.sh [--cached] openai|kubernetes-validate
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail

cached=0
[ "${1:-}" = --cached ] && { cached=1; shift; }
name=${1:?"usage: scripts/fetch-python.sh [--cached] openai|kubernetes-validate"}
case $name in
openai) version=3.51.0 ;;
kubernetes-validate) version=1.37.0 ;;
*) echo "fetch-python: '$name': expected openai or kubernetes-validate" >&2; exit 2 ;;
esac
dir="${XDG_CACHE_HOME:-$HOME/.cache}/q4khost/python/$name-$version"

if [ ! -f "$dir/.complete" ]; then
	[ $cached -eq 1 ] && exit 1
	mkdir -p "$(dirname "$dir")"
	work=$(mktemp -d "$dir.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	echo "fetch-python: installing $name $version into $dir" >&2
	python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
		--root-user-action=ignore --no-compile --only-binary=:all: \
		--target "$work" "$name==$version"
	touch "$work/.complete"
	rm -rf "$dir"
	mv "$work" "$dir"
fi
echo "$dir"
