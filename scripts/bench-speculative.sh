#!/usr/bin/env bash
# Speculative decoding at one stream, several server configurations side by side: each run starts
# a fresh `pagoda serve` with one configuration's flags, sends a chat dataset one request at a time
# (greedy, so every configuration generates the same tokens), saves pagoda-bench's result and the
# server's spec_decode metrics, and stops the server. Configurations alternate inside each round,
# so drift of the machine touches all alike. Prints a markdown table of medians (min-max), the
# median of per-round ratios against each configuration's baseline, how many answers are the
# same text as the baseline's in the same round, and the load.
#
#   scripts/bench-speculative.sh [--rounds 3] [--dataset benches/datasets/grounded.jsonl]
#                                [--streams 1] [--num-prompts N] [--model PATH]
#                                [--out DIR] NAME='FLAGS' [NAME='FLAGS' ...]
#
# --streams N sends N requests at a time (default 1); --num-prompts defaults to the dataset's
# lines, or 2N when that is more (the file is repeated). With PAGODA_BIN and PAGODA_BENCH_BIN
# set (binaries built elsewhere, e.g. on a GPU host without Rust) nothing is built. A word
# `--binary=PATH` in FLAGS runs that server binary for the configuration (an old build against
# the new one).
#
# A NAME ending in "-off" is a baseline; NAME "X-…" is compared with "X-off". Example:
#   scripts/bench-speculative.sh f32-off='' f32-ngram4='--speculative-config {"method":"ngram","num_speculative_tokens":4}'
# It never pauses or signals processes it did not start.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
rounds=3
dataset="$repo/benches/datasets/grounded.jsonl"
out="$(mktemp -d "${TMPDIR:-/tmp}/bench-speculative.XXXXXX")"
model="$repo/models/SmolLM2-135M-Instruct.Q4_1.gguf"
port=8471
streams=1
num_prompts=""
names=()
flags=()

while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds="$2"; shift ;;
    --dataset) dataset="$2"; shift ;;
    --out) out="$2"; shift ;;
    --streams) streams="$2"; shift ;;
    --num-prompts) num_prompts="$2"; shift ;;
    --model) model="$2"; shift ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *=*) names+=("${1%%=*}"); flags+=("${1#*=}") ;;
    *) echo "bench-speculative: unknown argument $1" >&2; exit 1 ;;
    esac
    shift
done
[ ${#names[@]} -gt 0 ] || { echo "bench-speculative: name at least one NAME='FLAGS'" >&2; exit 1; }

# shellcheck source=scripts/server-lifecycle.sh
source "$repo/scripts/server-lifecycle.sh"
pagoda_binaries "$repo"
[ -f "$model" ] || "$repo/scripts/fetch-model.sh" >&2
mkdir -p "$out"

trap stop_server EXIT

prompts="${num_prompts:-$(wc -l < "$dataset")}"
[ -n "$num_prompts" ] || [ "$prompts" -ge $((2 * streams)) ] || prompts=$((2 * streams))
for round in $(seq 1 "$rounds"); do
    for i in "${!names[@]}"; do
        name="${names[$i]}"
        tag="$out/$name.r$round"
        # FLAGS is a list of words split on spaces, with globbing off (JSON values without spaces).
        set -f
        # shellcheck disable=SC2086
        set -- ${flags[$i]}
        set +f
        # A word `--binary=PATH` runs that server binary for this configuration (old against new).
        binary="$pagoda" args=()
        for word in "$@"; do
            case "$word" in
            --binary=*) binary="${word#--binary=}" ;;
            *) args+=("$word") ;;
            esac
        done
        start_server "$port" "$tag.server.log" \
            "$binary" serve --model "$model" --host 127.0.0.1 --port "$port" --served-model-name smol ${args[@]+"${args[@]}"} ||
            { cat "$tag.server.log" >&2; exit 1; }
        echo "$(cut -d' ' -f1 /proc/loadavg)" > "$tag.load"
        "$bench" serve --base-url "http://127.0.0.1:$port" --model smol --endpoint chat \
            --dataset "$dataset" --num-prompts "$prompts" --max-concurrency "$streams" --temperature 0 \
            --seed 1 --no-progress --save-text --save-result "$tag.json" > "$tag.txt" 2>&1
        curl -s "127.0.0.1:$port/metrics" | grep 'spec_decode' > "$tag.metrics" || true
        stop_server
        echo "bench-speculative: round $round $name: $(grep -i 'output token throughput' "$tag.txt" | head -1)" >&2
    done
done

echo "bench-speculative: $streams stream(s), $prompts prompts of $dataset, model $model" >&2
python3 - "$out" "$rounds" "${names[@]}" <<'EOF'
import json, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def result(name, r):
    with open(f"{out}/{name}.r{r}.json") as f:
        return json.load(f)
def summary(name, r):
    return result(name, r)["summary"]
def same_text(name, base):
    # Answers equal to the baseline's, request by request, over all rounds.
    same = total = 0
    for r in range(1, rounds + 1):
        ours, theirs = result(name, r)["requests"], result(base, r)["requests"]
        for a, b in zip(ours, theirs):
            total += 1
            same += a.get("text") is not None and a.get("text") == b.get("text")
    return f"{same}/{total}"
print("| configuration | output tok/s, median (min-max) | vs its -off, median of per-round ratios (min-max) | same text as its -off | generated tokens | failed | TPOT p50 ms | TTFT p50 ms | load |")
print("|---|---|---|---|---|---|---|---|---|")
for name in names:
    rs = [summary(name, r) for r in range(1, rounds + 1)]
    tps = [x["output_throughput"] for x in rs]
    base = name.rsplit("-", 1)[0] + "-off"
    ratio = same = ""
    if base != name and base in names:
        same = same_text(name, base)
        ratios = [t / summary(base, r)["output_throughput"] for r, t in zip(range(1, rounds + 1), tps)]
        ratio = f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})"
    gen = sorted({x["total_output_tokens"] for x in rs})
    failed = sum(x["failed"] for x in rs)
    tpot = statistics.median(x["tpot_ms"]["median"] for x in rs)
    ttft = statistics.median(x["ttft_ms"]["median"] for x in rs)
    loads = [float(open(f"{out}/{name}.r{r}.load").read()) for r in range(1, rounds + 1)]
    print(f"| {name} | {statistics.median(tps):.1f} ({min(tps):.1f}-{max(tps):.1f}) | {ratio} | {same} | {','.join(map(str, gen))} | {failed} | {tpot:.2f} | {ttft:.0f} | {min(loads):.1f}-{max(loads):.1f} |")
print(f"\nresults in {out}")
EOF
