#!/usr/bin/env bash
# The cost of LoRA adapters: output tok/s of the base model alone against requests spread over
# adapters, at 32 streams (4 adapters, request i on adapter i % 4, so every step mixes them) and at
# one stream (one adapter), same model and load, configurations alternating inside each round.
# The adapters are random GGUF LoRA files of --rank on all seven projections of every layer
# (scripts/random_lora_gguf.py): they cost what trained adapters of that rank cost. The base runs
# on a server without --enable-lora. Prints a markdown table of medians (min-max) and the median
# of per-round ratios against the base at the same streams. --adapter-dtype bf16 writes the
# adapters in bfloat16 (alpha / rank = 2, so the server keeps them in bfloat16: half the bytes);
# --server-args "--lora-dtype bfloat16" instead rounds f32 adapters on load.
#
#   scripts/bench-lora.sh [--rounds 3] [--rank 16] [--adapter-dtype f32|bf16] [--input-len 128]
#                         [--output-len 128] [--model PATH] [--out DIR] [--server-args "ARGS"]
#
# With PAGODA_BIN and PAGODA_BENCH_BIN set (binaries built elsewhere) nothing is built. It never
# pauses or signals processes it did not start.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
rounds=3
rank=16
adapter_dtype=f32
input_len=128
output_len=128
model="$repo/models/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$(mktemp -d "${TMPDIR:-/tmp}/bench-lora.XXXXXX")"
server_args=""
port=8473

while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds="$2"; shift ;;
    --rank) rank="$2"; shift ;;
    --adapter-dtype) adapter_dtype="$2"; shift ;;
    --input-len) input_len="$2"; shift ;;
    --output-len) output_len="$2"; shift ;;
    --model) model="$2"; shift ;;
    --out) out="$2"; shift ;;
    --server-args) server_args="$2"; shift ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench-lora: unknown argument $1" >&2; exit 1 ;;
    esac
    shift
done

# shellcheck source=scripts/server-lifecycle.sh
source "$repo/scripts/server-lifecycle.sh"
pagoda_binaries "$repo"
[ -f "$model" ] || "$repo/scripts/fetch-model.sh" >&2
mkdir -p "$out/adapters"
trap stop_server EXIT

case "$adapter_dtype" in
f32 | bf16) ;;
*) echo "bench-lora: --adapter-dtype is f32 or bf16, not $adapter_dtype" >&2; exit 1 ;;
esac
python3 "$repo/scripts/random_lora_gguf.py" "$model" "$out/adapters" --count 4 --rank "$rank" \
    --dtype "$adapter_dtype" >&2
modules=()
for i in 0 1 2 3; do modules+=("l$i=$out/adapters/lora-$i.gguf"); done
lora_flags=(--enable-lora --lora-modules "${modules[@]}" --max-loras 4 --max-lora-rank "$rank")

# name streams prompts use-lora adapters...
configs=(
    "base-32 32 96 no"
    "lora4-32 32 96 yes l0 l1 l2 l3"
    "base-1 1 8 no"
    "lora1-1 1 8 yes l0"
)
for round in $(seq 1 "$rounds"); do
    for config in "${configs[@]}"; do
        # shellcheck disable=SC2086
        set -- $config
        name="$1" streams="$2" prompts="$3" lora="$4"
        shift 4
        tag="$out/$name.r$round"
        extra=()
        [ "$lora" = yes ] && extra=("${lora_flags[@]}")
        # shellcheck disable=SC2086
        start_server "$port" "$tag.server.log" "$pagoda" serve --model "$model" --host 127.0.0.1 \
            --port "$port" --served-model-name smol "${extra[@]}" $server_args ||
            { cat "$tag.server.log" >&2; exit 1; }
        cut -d' ' -f1 /proc/loadavg > "$tag.load"
        adapters=()
        [ $# -gt 0 ] && adapters=(--lora-modules "$@")
        "$bench" serve --base-url "http://127.0.0.1:$port" --model smol --dataset random \
            --input-len "$input_len" --output-len "$output_len" --ignore-eos --num-prompts "$prompts" \
            --max-concurrency "$streams" --seed "$round" --no-progress --save-result "$tag.json" \
            "${adapters[@]}" > "$tag.txt" 2>&1
        curl -s "127.0.0.1:$port/metrics" | grep 'lora_requests_info' > "$tag.metrics" || true
        stop_server
        echo "bench-lora: round $round $name: $(grep -i 'output token throughput' "$tag.txt" | head -1)" >&2
    done
done

echo "bench-lora: rank $rank ($adapter_dtype adapters), $input_len prompt / $output_len output tokens, model $model, $(nproc) cores" >&2
python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def summary(name, r):
    with open(f"{out}/{name}.r{r}.json") as f:
        return json.load(f)["summary"]
print("| configuration | streams | output tok/s, median (min-max) | vs base, median of per-round ratios (min-max) | failed | TPOT p50 ms | TTFT p50 ms | load |")
print("|---|---|---|---|---|---|---|---|")
for name, base in [("base-32", None), ("lora4-32", "base-32"), ("base-1", None), ("lora1-1", "base-1")]:
    rs = [summary(name, r) for r in range(1, rounds + 1)]
    tps = [x["output_throughput"] for x in rs]
    ratio = ""
    if base:
        ratios = [t / summary(base, r)["output_throughput"] for r, t in zip(range(1, rounds + 1), tps)]
        ratio = f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})"
    failed = sum(x["failed"] for x in rs)
    tpot = statistics.median(x["tpot_ms"]["median"] for x in rs)
    ttft = statistics.median(x["ttft_ms"]["median"] for x in rs)
    loads = [float(open(f"{out}/{name}.r{r}.load").read()) for r in range(1, rounds + 1)]
    streams = name.rsplit("-", 1)[1]
    print(f"| {name} | {streams} | {statistics.median(tps):.1f} ({min(tps):.1f}-{max(tps):.1f}) | {ratio} | {failed} | {tpot:.2f} | {ttft:.0f} | {min(loads):.1f}-{max(loads):.1f} |")
print(f"\nresults in {out}")
EOF
