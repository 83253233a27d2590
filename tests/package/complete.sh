#!/usr/bin/env bash
# What bash-completion offers for a q4khost command line: loads the
# completion file FILE and completes the last of WORDS (the first word is
# the q4khost to run), printing one candidate a line.
# Usage: tests/package/complete.sh FILE WORD...
set -uo pipefail
file=$1
shift
. /usr/share/bash-completion/bash_completion || exit 1
. "$file" || exit 1
COMP_WORDS=("$@")
COMP_CWORD=$(($# - 1))
COMP_LINE="$*"
COMP_POINT=${#COMP_LINE}
COMPREPLY=()
_q4khost
printf '%s\n' "${COMPREPLY[@]}"
