#!/usr/bin/env bash
# Where one decode step's GPU time goes, kernel by kernel, on a GPU host with Nsight Compute.
#
#   scripts/gpu-check.sh build --no-model        # on any machine: the pack in ./gpu-check
#   scripts/gpu-step-kernels.sh OUT [BATCH...]   # on the GPU host, from the repo root
#
# For each BATCH (default 1), runs gpu-check's `steps` section (random Llama-3.1-8B weights in
# bf16, each sequence decoding after a 128-token context) under
# `ncu --profile-from-start off`; the section wraps one step at that batch in
# cuProfilerStart/Stop, so exactly that step's kernels are recorded, each timed alone
# (gpu__time_duration, with warm caches and unlocked clocks). Writes OUT/kernels-BATCH.md: per kernel, launches, total and mean
# microseconds and share of the step; and OUT/steps-BATCH.md, the section's own table (step,
# host enqueue, matmuls alone). The sum of kernel times next to the step's wall time tells
# whether the gaps between kernels (launches, host work) or the kernels themselves hold a step
# above the weight-read floor.
set -euo pipefail

# shellcheck source=scripts/gpu-check.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-check.sh"
log() { echo "gpu-step-kernels: $*" >&2; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: gpu-step-kernels.sh OUT [BATCH...]}"
shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
stage_binaries "$repo/gpu-check" "$STAGE" pagoda-gpu-check
export_cuda_libs
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
[ -x "$ncu" ] || {
    log "no ncu (Nsight Compute) on this host"
    exit 2
}

for batch in "${@:-1}"; do
    log "batch $batch"
    # Caches and clocks as the step leaves them (ncu's defaults flush the caches and lock the
    # clocks at base, which stretches small kernels).
    PAGODA_PROFILE_BATCHES="$batch" "$ncu" --profile-from-start off --metrics gpu__time_duration.sum \
        --cache-control none --clock-control none --csv --print-units base --log-file "$out/ncu-$batch.csv" \
        "$STAGE/bin/pagoda-gpu-check" --model /dev/null --dummy-config "$repo/configs/models/llama-3.1-8b.json" \
        --out "$STAGE/steps-$batch" --sections steps >&2
    cp "$STAGE/steps-$batch/results.md" "$out/steps-$batch.md"
    python3 - "$out/ncu-$batch.csv" "$batch" >"$out/kernels-$batch.md" <<'EOF_SUMMARY'
import csv, re, sys
from collections import defaultdict
path, batch = sys.argv[1], sys.argv[2]
# ncu's log holds its own "==PROF==" lines before the CSV rows.
lines = [l for l in open(path) if l.startswith('"')]
rows = [r for r in csv.DictReader(lines) if r.get("Metric Name") == "gpu__time_duration.sum"]
def short(name):
    name = re.sub(r"\(.*", "", name)          # drop argument lists
    name = re.sub(r"<.*>", "<..>", name)      # and template arguments
    return name.split("::")[-1][:70]
total, count = defaultdict(float), defaultdict(int)
for r in rows:
    k = short(r["Kernel Name"])
    total[k] += float(r["Metric Value"].replace(",", "")) / 1e3  # ns -> us
    count[k] += 1
step = sum(total.values())
print(f"# Kernels of one decode step, batch {batch} ({len(rows)} launches, {step:.0f} us of kernel time)\n")
print("| kernel | launches | total us | mean us | share |")
print("|---|---|---|---|---|")
for k in sorted(total, key=total.get, reverse=True):
    print(f"| `{k}` | {count[k]} | {total[k]:.1f} | {total[k] / count[k]:.2f} | {100 * total[k] / step:.1f}% |")
EOF_SUMMARY
    cat "$out/kernels-$batch.md" >&2
done
