#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to text: install what is
# missing, build, install into ./_prefix, fetch the default model, and run
# it on a default prompt through the reference cpu plugin.
# Usage: scripts/quickstart.sh [PROMPT]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/install-deps.sh
Q4KH_BUILD_DIR="$top/_build/main" scripts/build.sh
make -C "$top/_build/main" install >/dev/null
scripts/fetch-model.sh
exec "$top/_prefix/bin/q4khost" run -n 48 -p "${1:-The three primary colors are}"
