#!/usr/bin/env bash
# Agent turns on Pagoda and on llama.cpp's llama-server, same GGUF, same cores, one server at a
# time: replays Claude Code's and Codex's multi-turn traces (tests/fixtures/agent-traces/, built
# by scripts/agent_traces.py) and reports each turn's time to first token and each trace's wall
# time, medians over rounds, as a markdown table plus the raw JSON; with --prefill also prefill
# tokens/s at 2k, 8k and 16k prompt tokens on both servers in the same run.
#
#   scripts/bench-agent-turns.sh [--rounds 3] [--turns 5] [--max-tokens 64] [--out FILE.md]
#                                [--max-load L] [--model PATH] [--chat-template FILE]
#                                [--traces claude-code,codex] [--max-prompt-tokens N]
#                                [--prefill] [--prefill-sizes "2048 8192 16384"] [--no-check]
#                                [--pagoda-args "ARGS"] [--llama-args "ARGS"]
#
# - Builds what it needs: Pagoda's release server (cargo; PAGODA_BIN to use another build) and
#   llama-server (scripts/build-llama-server.sh). The model defaults to Gemma 3 270M (make
#   model-gemma3), a base model without a chat template: both servers get --chat-template FILE
#   (default tests/fixtures/agent-traces/gemma3-chat.jinja, Gemma's turn markers), and run with
#   the model's 32k context.
# - Each round starts each server fresh (the order alternates round by round, so drift of the
#   machine touches both alike), sends one warm-up request, then every trace's turns in order,
#   streamed, max_tokens small, temperature 0: follow-up turns find their prefix in the server's
#   cache, as an agent's do. With --prefill the same server then answers the prefill requests.
# - The greedy check (after the rounds; --no-check skips it): each turn is sent alone to a freshly
#   started server, and its answer must equal that turn's answer in round 1's replay on the same
#   server; mismatches are listed in the report, not hidden.
# - --turns N and --max-prompt-tokens N (cut each turn's system text to about N tokens) make a
#   short smoke run: scripts/bench-agent-turns.sh --rounds 1 --turns 1 --max-prompt-tokens 512.
# - Refuses to start when the 1-minute load average is above --max-load (default: a quarter of
#   the cores), as scripts/bench-vs-llamacpp.sh does; never signals processes it did not start.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
rounds=3
turns=5
max_tokens=64
out="$repo/bench-agent-turns.md"
cores="$(nproc)"
max_load="$(python3 -c "print($cores / 4)")"
model="$repo/models/gemma-3-270m-q4_k_m.gguf"
template="$repo/tests/fixtures/agent-traces/gemma3-chat.jinja"
traces="claude-code,codex"
max_prompt_tokens=0
prefill=0
prefill_sizes="2048 8192 16384"
check=1
ctx=32768
pagoda_args=""
llama_args=""
port_pagoda=8471
port_llama=8472
name=agent

die() { echo "bench-agent-turns: $*" >&2; exit 1; }
log() { echo "bench-agent-turns: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds="$2"; shift ;;
    --turns) turns="$2"; shift ;;
    --max-tokens) max_tokens="$2"; shift ;;
    --out) out="$2"; shift ;;
    --max-load) max_load="$2"; shift ;;
    --model) model="$2"; shift ;;
    --chat-template) template="$2"; shift ;;
    --traces) traces="$2"; shift ;;
    --max-prompt-tokens) max_prompt_tokens="$2"; shift ;;
    --prefill) prefill=1 ;;
    --prefill-sizes) prefill_sizes="$2"; shift ;;
    --no-check) check=0 ;;
    --pagoda-args) pagoda_args="$2"; shift ;;
    --llama-args) llama_args="$2"; shift ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done

[ -f "$template" ] || die "no chat template at $template"
load1() { cut -d' ' -f1 /proc/loadavg; }
load="$(load1)"
if python3 -c "import sys; sys.exit(0 if $load > $max_load else 1)"; then
    die "the 1-minute load average is $load on $cores cores (limit $max_load): the machine is busy, so the \
numbers would measure it, not the servers. Wait until it is idle, or pass --max-load to accept the load \
(it is reported in the table)."
fi

if [ ! -f "$model" ]; then
    [ "$model" = "$repo/models/gemma-3-270m-q4_k_m.gguf" ] || die "no model at $model"
    "$repo/scripts/fetch-model.sh" gemma3 >&2
fi
if [ -n "${PAGODA_BIN:-}" ]; then
    pagoda="$PAGODA_BIN"
else
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/pagoda-target}"
    log "building Pagoda (release)"
    # make serve's package set, so the build shares its compiled dependencies.
    (cd "$repo" && cargo build --release --locked -q -p pagoda-server) >&2
    pagoda="$CARGO_TARGET_DIR/release/pagoda"
fi
log "building llama-server"
llama="$("$repo/scripts/build-llama-server.sh")"

work="$(mktemp -d "${TMPDIR:-/tmp}/bench-agent-turns.XXXXXX")"
# shellcheck source=scripts/server-lifecycle.sh
source "$repo/scripts/server-lifecycle.sh"
trap stop_server EXIT

python3 "$repo/scripts/agent_traces.py" build "$repo/tests/fixtures/agent-traces" "$work/traces" \
    --turns "$turns" --max-tokens "$max_tokens" --max-prompt-tokens "$max_prompt_tokens" --traces "$traces"
replay=(python3 "$repo/scripts/agent_replay.py")

# start SERVER LOG: starts a fresh Pagoda or llama-server on its port; sets $port.
start() {
    local server="$1" log_file="$2" cmd
    if [ "$server" = pagoda ]; then
        port=$port_pagoda
        # shellcheck disable=SC2206 # extra arguments are split on spaces on purpose
        cmd=("$pagoda" serve --model "$model" --port "$port" --served-model-name "$name"
            --chat-template "$template" --max-model-len "$ctx" --kv-cache-memory 2GiB $pagoda_args)
    else
        port=$port_llama
        # One slot holding the whole context: the trace's turns reuse its cached prefix.
        # shellcheck disable=SC2206
        cmd=("$llama" -m "$model" --port "$port" --alias "$name" -t "$cores" -c "$ctx" -np 1
            --jinja --chat-template-file "$template" $llama_args)
    fi
    start_server "$port" "$log_file" "${cmd[@]}" || die "$server did not start; its log: $log_file"
    grep -q "^$server:" "$work/commands" 2>/dev/null || echo "$server: ${cmd[*]}" >>"$work/commands"
    "${replay[@]}" warmup --base-url "http://127.0.0.1:$port" --model "$name"
}

load_start="$load"
for round in $(seq 1 "$rounds"); do
    order="pagoda llama"
    [ $((round % 2)) = 1 ] || order="llama pagoda"
    for server in $order; do
        log "round $round: $server"
        start "$server" "$work/$server-r$round.log"
        "${replay[@]}" turns --base-url "http://127.0.0.1:$port" --model "$name" --traces "$work/traces" \
            --out "$work/$server-turns-r$round.json"
        if [ $prefill = 1 ]; then
            "${replay[@]}" prefill --base-url "http://127.0.0.1:$port" --model "$name" \
                --sizes "$(echo "$prefill_sizes" | tr ' ' ',')" --seed "$round" --out "$work/$server-prefill-r$round.json"
        fi
        stop_server
    done
done

if [ $check = 1 ]; then
    for server in pagoda llama; do
        for k in $(seq 1 "$turns"); do
            log "greedy check: $server, turn $k alone on a fresh server"
            start "$server" "$work/$server-single-t$k.log"
            "${replay[@]}" turns --base-url "http://127.0.0.1:$port" --model "$name" --traces "$work/traces" \
                --only-turn "$k" --out "$work/$server-single-r$k.json"
            stop_server
        done
    done
fi

{
    echo "cpu_model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
    echo "cores=$cores"
    echo "load_start=$load_start"
    echo "load_end=$(load1)"
    echo "rounds=$rounds"
    echo "model=$(basename "$model")"
    echo "chat_template=${template#"$repo"/}"
    echo "max_tokens=$max_tokens"
    echo "max_prompt_tokens=$max_prompt_tokens"
    echo "pagoda=$(cd "$repo" && git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "llama=$("$llama" --version 2>&1 | grep -m1 -i version || echo unknown)"
} >"$work/machine"
echo "replay: python3 scripts/agent_traces.py build tests/fixtures/agent-traces TRACES --turns $turns \
--max-tokens $max_tokens --max-prompt-tokens $max_prompt_tokens --traces $traces; \
python3 scripts/agent_replay.py turns --base-url URL --model $name --traces TRACES" >>"$work/commands"
"${replay[@]}" table "$work" >"$out"
log "wrote $out (raw results in $work)"
cat "$out"
