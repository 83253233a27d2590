#!/usr/bin/env bash
# Install the Debian packages q4khost needs to build and test, and the
# extra PACKAGEs a script asks for (valgrind for scripts/valgrind-run.sh;
# clang, libclang-rt-dev and llvm for scripts/fuzz.sh), when missing.
# rpm, rpmlint and elfutils (eu-strip, for rpm's debuginfo split) build and
# check the RPMs in tests/test_package.c; haproxy balances q4khost serve
# replicas in tests/test_serve.c.
# Usage: scripts/install-deps.sh [PACKAGE...]   (as root, or through sudo when available)
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail

pkgs=(build-essential autoconf automake libtool pkg-config
      libiniparser-dev libcriterion-dev libjansson-dev libssl-dev libpcre2-dev
      libmicrohttpd-dev curl haproxy
      python3 python3-pip python3-numpy ca-certificates
      debhelper dpkg-dev lintian bash-completion
      rpm rpmlint elfutils "$@")

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
		missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
