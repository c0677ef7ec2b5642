#!/usr/bin/env bash
# Prefill/decode disaggregation against plain replicas on the same cores: a prefill instance
# (kv_producer) and a decode instance (kv_consumer) behind vllm-router's PD mode, against two
# plain replicas behind vllm-router's round robin. Same model, same router, same load: mixed
# long prompts arriving as a Poisson process, every request generating its full output.
# Configurations alternate inside each round. Prints a markdown table of medians over the rounds
# (min-max) of TTFT, ITL and throughput. On a small CPU machine the two processes share the
# cores either way, so this shows the cost of moving the KV, not the isolation a GPU pair buys.
#
#   scripts/bench-pd.sh [--rounds 3] [--num-prompts 40] [--rate 1] [--input-len 768]
#                       [--output-len 64] [--model PATH] [--out DIR]
#
# With PAGODA_BIN and PAGODA_BENCH_BIN set (binaries built elsewhere) nothing is built. The router
# is vllm-router from `make router-tools`. It signals only the processes it started.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
rounds=3
num_prompts=40
rate=1
input_len=768
output_len=64
model="$repo/models/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$(mktemp -d "${TMPDIR:-/tmp}/bench-pd.XXXXXX")"
router_bin="${PAGODA_ROUTERS_DIR:-$HOME/.cache/pagoda-routers}/bin/vllm-router"

while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds="$2"; shift ;;
    --num-prompts) num_prompts="$2"; shift ;;
    --rate) rate="$2"; shift ;;
    --input-len) input_len="$2"; shift ;;
    --output-len) output_len="$2"; shift ;;
    --model) model="$2"; shift ;;
    --out) out="$2"; shift ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench-pd: unknown argument $1" >&2; exit 1 ;;
    esac
    shift
done

# shellcheck source=scripts/server-lifecycle.sh
source "$repo/scripts/server-lifecycle.sh"
pagoda_binaries "$repo"
[ -f "$model" ] || "$repo/scripts/fetch-model.sh" >&2
[ -x "$router_bin" ] || "$repo/scripts/install-router-tools.sh" >&2

pids=()
stop_all() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
trap stop_all EXIT

# run_bg LOG CMD...: starts CMD in the background, its pid kept for stop_all.
run_bg() {
    local log_file="$1"
    shift
    "$@" >"$log_file" 2>&1 &
    pids+=($!)
}

# wait_url URL: until it answers 2xx (two minutes at most).
wait_url() {
    for _ in $(seq 1 1200); do
        curl -sf "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "bench-pd: $1 never answered" >&2
    return 1
}

serve() { # NAME PORT EXTRA...
    local name="$1" port="$2"
    shift 2
    run_bg "$tag.$name.log" "$pagoda" serve --model "$model" --host 127.0.0.1 --port "$port" \
        --served-model-name smol --max-model-len 2048 "$@"
    wait_url "http://127.0.0.1:$port/ready"
}

for round in $(seq 1 "$rounds"); do
    for config in pd replicas; do
        tag="$out/$config.r$round"
        if [ "$config" = pd ]; then
            serve prefill 8481 --kv-transfer-config '{"kv_role": "kv_producer", "kv_port": 8489}'
            serve decode 8482 --kv-transfer-config '{"kv_role": "kv_consumer"}'
            mode=(--vllm-pd-disaggregation --prefill http://127.0.0.1:8481 --decode http://127.0.0.1:8482)
        else
            serve replica-a 8481
            serve replica-b 8482
            mode=(--worker-urls http://127.0.0.1:8481 http://127.0.0.1:8482)
        fi
        run_bg "$tag.router.log" env HF_HUB_OFFLINE=1 "$router_bin" --host 127.0.0.1 --port 8480 \
            --policy round_robin --prometheus-port 8488 "${mode[@]}"
        wait_url "http://127.0.0.1:8480/health"
        cut -d' ' -f1 /proc/loadavg > "$tag.load"
        "$bench" serve --base-url http://127.0.0.1:8480 --model smol --tokenizer "$model" \
            --dataset random --input-len "$input_len" --output-len "$output_len" --range-ratio 0.5 \
            --ignore-eos --num-prompts "$num_prompts" --request-rate "$rate" --seed "$round" \
            --percentiles 50,90,99 --no-progress --save-result "$tag.json" > "$tag.txt" 2>&1
        curl -s http://127.0.0.1:8482/metrics | grep -E 'kv_transfer|prefix_cache' > "$tag.metrics" || true
        stop_all
        echo "bench-pd: round $round $config: $(grep -i 'output token throughput' "$tag.txt" | head -1)" >&2
    done
done

echo "bench-pd: $num_prompts prompts of ~$input_len tokens (±50%), $output_len output tokens, $rate req/s, model $model, $(nproc) cores" >&2
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def summary(name, r):
    with open(f"{out}/{name}.r{r}.json") as f:
        return json.load(f)["summary"]
def pct(dist, p):
    return dict((float(k), v) for k, v in dist["percentiles"])[p]
def cell(values):
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"
print("| configuration | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | ITL p50 ms | ITL p90 ms | ITL p99 ms | output tok/s | failed | load |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, label in [("pd", "PD pair (prefill + decode)"), ("replicas", "two replicas, round robin")]:
    rs = [summary(name, r) for r in range(1, rounds + 1)]
    row = [label]
    for key in ("ttft_ms", "itl_ms"):
        for p in (50.0, 90.0, 99.0):
            row.append(cell([pct(x[key], p) for x in rs]))
    tps = [x["output_throughput"] for x in rs]
    row.append(f"{statistics.median(tps):.1f} ({min(tps):.1f}-{max(tps):.1f})")
    row.append(str(sum(x["failed"] for x in rs)))
    loads = [float(open(f"{out}/{name}.r{r}.load").read()) for r in range(1, rounds + 1)]
    row.append(f"{min(loads):.1f}-{max(loads):.1f}")
    print("| " + " | ".join(row) + " |")
print(f"\nresults in {out}")
PY
