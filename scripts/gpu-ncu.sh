#!/usr/bin/env bash
# Inside one decode kernel, on a GPU machine with Nsight Compute (ncu): runs
# q4khost on MODEL (a 511-token prompt, then 6 decode tokens) under
# `ncu --set full --clock-control none` and profiles COUNT launches of the
# kernels whose name matches REGEX after skipping SKIP of them (caches
# flushed before each, as a decode step finds them). Prints each launch's
# grid, duration, occupancy and its warp stalls (cycles per issued
# instruction, largest first); leaves in DIR (default /tmp/gpu-ncu) NAME.txt
# (ncu's details page), NAME.raw.csv (every metric) and NAME.sass.csv (the
# samples per SASS instruction).
#
#   scripts/gpu-ncu.sh MODEL REGEX [SKIP [COUNT [VARIANT [DIR]]]]
#
#   MODEL    a GGUF file, or a name of scripts/gen-bench-model.py
#            (generated under /tmp/models when missing)
#   REGEX    kernel names, e.g. split_kernel, q4kh_cv_stream_kernel
#   SKIP     matching launches to skip (default 70: past the prompt, into
#            the decode steps of a 32-layer model)
#   COUNT    launches to profile (default 1)
#   VARIANT  the kernel variant (default cuda-mwv; none: built-in kernels)
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
[ $# -ge 2 ] || { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
model=$1 regex=$2 skip=${3:-70} count=${4:-1} variant=${5:-cuda-mwv} dir=${6:-/tmp/gpu-ncu}

ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
[ -n "$ncu" ] || { echo "gpu-ncu.sh: no Nsight Compute (ncu) here" >&2; exit 1; }
. scripts/gpu-env.sh

name=$(basename "$model" .gguf)-$(echo "$regex" | tr -c 'A-Za-z0-9_\n' _)
mkdir -p "$dir"
prompt=$(python3 -c 'print(("the quick brown fox " * 512)[:511])')
"$ncu" --clock-control none --set full --import-source no -k "regex:$regex" -s "$skip" -c "$count" \
	-o "$dir/$name" -f "$build/host/cli/q4khost" run -m "$model" --backend cuda --kernel "$variant" \
	--f2 off -n 6 -p "$prompt" >"$dir/$name.log" 2>&1 ||
	{ tail -n 20 "$dir/$name.log" >&2; exit 1; }
"$ncu" -i "$dir/$name.ncu-rep" --page details >"$dir/$name.txt"
"$ncu" -i "$dir/$name.ncu-rep" --page raw --csv >"$dir/$name.raw.csv"
"$ncu" -i "$dir/$name.ncu-rep" --page source --csv --print-source sass >"$dir/$name.sass.csv" 2>/dev/null || true
python3 - "$dir/$name.raw.csv" <<'PY'
import csv, sys

rows = list(csv.reader(open(sys.argv[1])))
head, pre = rows[0], "smsp__average_warps_issue_stalled_"
col = {k: i for i, k in enumerate(head)}
for r in rows[2:]:
    get = lambda k: r[col[k]] if k in col else "?"
    stalls = []
    for k, i in col.items():
        if k.startswith(pre) and k.endswith("_per_issue_active.ratio"):
            try:
                stalls.append((float(r[i].replace(",", "")), k[len(pre):-len("_per_issue_active.ratio")]))
            except ValueError:
                pass
    stalls.sort(reverse=True)
    print("%s\n  grid %s x block %s, %s us, %s registers, achieved occupancy %s %%, DRAM %s %%" % (
        get("Kernel Name"), get("launch__grid_size"), get("launch__block_size"),
        get("gpu__time_duration.sum"), get("launch__registers_per_thread"),
        get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        get("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")))
    print("  stalls (cycles per issued instruction): " +
          ", ".join("%s %.2f" % (k, v) for v, k in stalls[:8]))
PY
echo "gpu-ncu.sh: details in $dir/$name.txt, .raw.csv, .sass.csv"
