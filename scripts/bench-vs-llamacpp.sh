#!/usr/bin/env bash
# Pagoda next to llama.cpp's llama-server on the same GGUF and the same cores, one server at a
# time, at several stream counts for several rounds; writes a markdown table of medians (with
# min and max) plus the CPU, the load it ran under, the large-step kernel Pagoda's start-up
# timing chose and every command, so anyone can rerun it.
#
#   scripts/bench-vs-llamacpp.sh [--rounds 3] [--streams "1 8 32"] [--out FILE.md]
#                                [--max-load L] [--model PATH] [--prompts-per-stream 4]
#                                [--pagoda-args "ARGS"] [--llama-args "ARGS"] [--isa avx2]
#
# - Builds what it needs: Pagoda's release server and pagoda-bench (cargo), llama-server from
#   the llama-cpp-python sdist (scripts/build-llama-server.sh), the model (scripts/fetch-model.sh).
# - Each run starts the server fresh, sends a warm-up of other prompts, then C streams of
#   128-token prompts and 128-token outputs (--ignore-eos, at least 8 and 4 per stream) from
#   pagoda-bench, and stops the server. Servers alternate
#   inside each round, so drift of the machine touches both alike.
# - Refuses to start when the 1-minute load average is above --max-load (default: a quarter of
#   the cores): numbers from a busy machine measure the machine. It never pauses or signals
#   processes it did not start. The load and the CPU time stolen by the hypervisor during each
#   run are in the table.
# - llama-server runs with -t <cores> -np C -c C*320; where it crashes at start (VMs that refuse
#   AMX), it is restarted with --no-repack and the table says so.
# - --isa avx2 runs both as an AVX2-only CPU (AMD Zen 2/3, most cloud VMs) would: Pagoda under
#   PAGODA_CPU_ISA=avx2, llama-server built for AVX2 (PAGODA_LLAMACPP_ISA=avx2). The memory
#   system stays this machine's.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
rounds=3
streams="1 8 32"
out="$repo/bench-vs-llamacpp.md"
cores="$(nproc)"
max_load="$(python3 -c "print($cores / 4)")"
model="$repo/models/SmolLM2-135M-Instruct.Q4_1.gguf"
per_stream=4
pagoda_args=""
llama_args=""
isa=""
port_pagoda=8461
port_llama=8462

die() { echo "bench-vs-llamacpp: $*" >&2; exit 1; }
log() { echo "bench-vs-llamacpp: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds="$2"; shift ;;
    --streams) streams="$2"; shift ;;
    --out) out="$2"; shift ;;
    --max-load) max_load="$2"; shift ;;
    --model) model="$2"; shift ;;
    --prompts-per-stream) per_stream="$2"; shift ;;
    --pagoda-args) pagoda_args="$2"; shift ;;
    --llama-args) llama_args="$2"; shift ;;
    --isa) isa="$2"; shift ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done

case "$isa" in
"") ;;
avx2) export PAGODA_CPU_ISA=avx2 PAGODA_LLAMACPP_ISA=avx2 ;;
*) die "--isa takes avx2, not $isa" ;;
esac

load1() { cut -d' ' -f1 /proc/loadavg; }
load="$(load1)"
if python3 -c "import sys; sys.exit(0 if $load > $max_load else 1)"; then
    die "the 1-minute load average is $load on $cores cores (limit $max_load): the machine is busy, so the \
numbers would measure it, not the servers. Wait until it is idle, or pass --max-load to accept the load \
(it is reported in the table)."
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/pagoda-target}"
[ -f "$model" ] || "$repo/scripts/fetch-model.sh" >&2
log "building Pagoda (release)"
# The package set scripts/check_one_build.py (make script-check) keeps on make serve's compiled
# dependencies: after either, this builds only the load generator's own crates.
(cd "$repo" && cargo build --release --locked -q -p pagoda-server -p pagoda-bench) >&2
pagoda="$CARGO_TARGET_DIR/release/pagoda"
bench="$CARGO_TARGET_DIR/release/pagoda-bench"
log "building llama-server"
llama="$("$repo/scripts/build-llama-server.sh")"

work="$(mktemp -d "${TMPDIR:-/tmp}/bench-vs-llamacpp.XXXXXX")"
# shellcheck source=scripts/server-lifecycle.sh
source "$repo/scripts/server-lifecycle.sh"
trap stop_server EXIT

# Hypervisor-stolen and total CPU ticks so far (from /proc/stat's first line).
cpu_ticks() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print $9, t}' /proc/stat; }

llama_extra=()
bench_args=(--tokenizer "$model" --input-len 128 --output-len 128 --ignore-eos --no-progress --model smol)

# One measured run: server name, streams, round.
run_one() {
    local name="$1" c="$2" round="$3" port cmd
    local result="$work/$name-c$c-r$round.json"
    if [ "$name" = pagoda ]; then
        port=$port_pagoda
        # shellcheck disable=SC2206 # extra arguments are split on spaces on purpose
        cmd=("$pagoda" serve --model "$model" --port "$port" --served-model-name smol $pagoda_args)
    else
        port=$port_llama
        # shellcheck disable=SC2206
        cmd=("$llama" -m "$model" --port "$port" --alias smol -t "$cores" -np "$c" -c $((c * 320)) "${llama_extra[@]}" $llama_args)
    fi
    if ! start_server "$port" "$work/$name-c$c-r$round.log" "${cmd[@]}"; then
        if [ "$name" = llama ] && [ ${#llama_extra[@]} -eq 0 ]; then
            log "llama-server did not start; retrying with --no-repack (VMs that refuse AMX)"
            llama_extra=(--no-repack)
            run_one "$@"
            return
        fi
        die "$name did not start; its log: $work/$name-c$c-r$round.log"
    fi
    echo "$name: ${cmd[*]}" >>"$work/commands"
    # The warm-up's prompts differ from the measured ones (another seed), so that no prompt
    # cache (Pagoda's prefix cache, llama-server's slot reuse) shortens a measured prefill.
    "$bench" serve --base-url "http://127.0.0.1:$port" "${bench_args[@]}" --seed 2 \
        --num-prompts $((c > 4 ? c : 4)) --max-concurrency "$c" --save-result "$work/warmup.json" >/dev/null 2>&1 || true
    local load_before ticks_before ticks_after
    load_before="$(load1)"
    ticks_before="$(cpu_ticks)"
    local prompts=$((c * per_stream > 8 ? c * per_stream : 8))
    "$bench" serve --base-url "http://127.0.0.1:$port" "${bench_args[@]}" --seed 1 \
        --num-prompts "$prompts" --max-concurrency "$c" --save-result "$result" >/dev/null
    ticks_after="$(cpu_ticks)"
    stop_server
    python3 - "$result" "$load_before" "$ticks_before" "$ticks_after" <<'EOF'
import json, sys
path, load, before, after = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
steal, total = int(after[0]) - int(before[0]), int(after[1]) - int(before[1])
d = json.load(open(path))
d["machine"] = {"load1_at_start": load, "steal_fraction": steal / total if total else 0.0}
json.dump(d, open(path, "w"))
EOF
    log "round $round, $name, $c streams: $(python3 -c "import json; s=json.load(open('$result'))['summary']; print(f\"{s['output_throughput']:.1f} tok/s, TTFT p50 {s['ttft_ms']['median']:.0f} ms, {s['failed']} failed\")")"
}

load_start="$load"
for round in $(seq 1 "$rounds"); do
    for c in $streams; do
        for name in pagoda llama; do
            run_one "$name" "$c" "$round"
        done
    done
done

{
    echo "cpu_model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
    echo "cores=$cores"
    echo "flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_vnni|avx512vnni|amx_tile|amx_bf16|amx_int8)$' | sort -u | tr '\n' ' ')"
    echo "isa=${isa:-native}"
    echo "load_start=$load_start"
    echo "load_end=$(load1)"
    echo "pagoda=$(cd "$repo" && git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "llama=$("$llama" --version 2>&1 | grep -m1 -i version || echo unknown)"
    # What `--cpu-gemm-dtype auto` measured and chose for large steps (the same on every start,
    # up to the timing's noise): the kernel the Pagoda rows ran.
    echo "pagoda_large_steps=$(grep -h -m1 'kernel plan:' "$work"/pagoda-*.log 2>/dev/null | head -1 | sed 's/.*kernel plan: *//')"
    echo "llama_extra=${llama_extra[*]}"
    echo "bench=$bench serve --base-url http://127.0.0.1:PORT ${bench_args[*]} --seed 1 --num-prompts max(8, C*$per_stream) --max-concurrency C  (after a warm-up of max(4, C) prompts with --seed 2)"
} >"$work/machine"
python3 "$repo/scripts/bench_vs_llamacpp_table.py" "$work" >"$out"
log "wrote $out (raw results in $work)"
cat "$out"
