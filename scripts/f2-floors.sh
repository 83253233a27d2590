#!/usr/bin/env bash
# The measurements behind F2's floors (docs/f2.md, "Floors that follow the
# arithmetic"): q4khost validate --json --f2 fresh on each model, one row
# per candidate with its arithmetic class, the floor it was judged by, its
# lowest cosine to the reference (9 digits), 1 - cosine, and the margin
# (1 - floor) / (1 - cosine); then, per class, the lowest cosine of all
# rows. Exits 1 when a candidate was rejected or not measured.
#
#   scripts/f2-floors.sh [--q4khost FILE] [--model FILE]... [-- VALIDATE-ARGS]
#
#   --q4khost FILE  the CLI (default: _build/main/host/cli/q4khost)
#   --model FILE    a model to measure (repeatable; default: every
#                   tests/fixtures/tiny-*.gguf and the default model)
#   VALIDATE-ARGS   passed on: --deep, --ctx N, --backend cuda,
#                   --plugin-path P, --timeout S ...
# Receipts go to a fresh folder, removed at the end.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
q4khost="$top/_build/main/host/cli/q4khost"
models=()

usage() { # STATUS: 0 for --help (on stdout), 2 for a wrong argument
	sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&"$((${1:-2} ? 2 : 1))"
	exit "${1:-2}"
}

while [ $# -gt 0 ]; do
	case $1 in
	--q4khost) q4khost=$2; shift 2 ;;
	--model) models+=("$2"); shift 2 ;;
	--) shift; break ;;
	-h | --help) usage 0 ;;
	*) echo "f2-floors.sh: unknown argument $1" >&2; usage ;;
	esac
done
if [ ${#models[@]} -eq 0 ]; then
	models=("$top"/tests/fixtures/tiny-*.gguf)
	default=$("$q4khost" info --json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["path"])' 2>/dev/null)
	[ -n "$default" ] && models+=("$default")
fi
receipts=$(mktemp -d "${TMPDIR:-/tmp}/f2-floors.XXXXXX") || exit 1
trap 'rm -rf "$receipts"' EXIT

status=0
for model in "${models[@]}"; do
	Q4KHOST_F2_RECEIPT_DIR="$receipts" "$q4khost" validate --json --f2 fresh -m "$model" "$@" \
		>"$receipts/out.json" 2>"$receipts/err" || status=1
	python3 - "$model" "$receipts/out.json" "$receipts/rows" <<'EOF' || {
import json, os, sys
model, out, rows = sys.argv[1], sys.argv[2], sys.argv[3]
with open(out) as f, open(rows, "a") as r:
    for c in json.load(f)["candidates"]:
        print("\t".join(str(x) for x in (os.path.basename(model), c["backend"], c["kernel"],
              c["arith"], c["floor"], c["min_cosine"], c["verdict"])), file=r)
EOF
		echo "f2-floors.sh: $model: no JSON from validate: $(tail -n 2 "$receipts/err")" >&2
		status=1
	}
done
[ -f "$receipts/rows" ] && python3 - "$receipts/rows" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
lowest = {}
print("%-28s %-26s %-10s %-9s %-12s %-9s %-7s %s" % ("model", "path", "class", "floor",
      "min cosine", "1-cosine", "margin", "verdict"))
for model, backend, kernel, arith, floor, cos, verdict in rows:
    if cos == "None" or floor == "None":
        print("%-28s %-26s %-10s %-9s %-12s %-9s %-7s %s" % (model, backend + "/" + kernel,
              arith, floor, "-", "-", "-", verdict))
        continue
    c, f = float(cos), float(floor)
    print("%-28s %-26s %-10s %-9g %.9f %.2e %-7s %s" % (model, backend + "/" + kernel, arith,
          f, c, 1 - c, "%.0fx" % ((1 - f) / (1 - c)) if c < 1 else "-", verdict))
    if arith not in lowest or c < lowest[arith][0]:
        lowest[arith] = (c, model, backend + "/" + kernel)
print()
for arith, (c, model, path) in sorted(lowest.items()):
    print("lowest of class %-10s %.9f (1-cosine %.2e): %s on %s" % (arith, c, 1 - c, path, model))
EOF
exit $status
