#!/usr/bin/env bash
# Speed on a GPU host, in one command (the GPU half of the CUDA work; correctness is gpu-check.sh).
#
#   scripts/gpu-check.sh build --no-model      # on any machine: packs pagoda, pagoda-gpu-check
#                                              # and pagoda-bench into ./gpu-check/bin
#   gpu-bench.sh OUT [--pack DIR]              # on the GPU host, from the repo root
#
# Reference model: random weights in Llama-3.1-8B's shape, bf16 (configs/serve-dummy-8b.toml),
# so nothing is downloaded, and a character-level tokenizer over the whole vocabulary, made here
# (answers are noise, speed is real). Every request ignores EOS and has
# fixed lengths. Writes OUT/bench.md (the table), OUT/timings.md (gpu-check's timings section:
# copy bandwidth, paged decode attention, prefill attention), OUT/runs.json (every load
# generator summary) and OUT/server.log.
#
# Phases (the load generator against the release server on cuda:0):
#   decode   batch B in $DECODE_BATCHES (default "1 8 32 128"): B streams, 128-token prompts,
#            256 output tokens; ms/token is the median TPOT, MBU its ratio to the floor
#            (weight bytes over the measured device copy bandwidth, read + written)
#   prefill  one stream, prompts of $PREFILL_LENS tokens (default "1024 4096"), one output
#            token: TTFT median, and MFU against $PEAK_TFLOPS (default 989, bf16 dense, the
#            H100/H200 SXM datasheet)
#   serving  the sharegpt-like set, $SERVE_PROMPTS prompts (default 500) at each rate of
#            $SERVE_RATES (default "4 16 inf")
set -euo pipefail

# stage_binaries, export_cuda_libs (the pack's layout is gpu-check.sh's).
# shellcheck source=scripts/gpu-check.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-check.sh"
# start_server, stop_server.
# shellcheck source=scripts/server-lifecycle.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-lifecycle.sh"
trap stop_server EXIT
log() { echo "gpu-bench: $*" >&2; }
die() {
    log "$*"
    exit 2
}

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="" pack="$repo/gpu-check"
while [ $# -gt 0 ]; do
    case "$1" in
    --pack)
        pack="$2"
        shift
        ;;
    -*) die "unknown option $1" ;;
    *) out="$1" ;;
    esac
    shift
done
[ -n "$out" ] || die "usage: gpu-bench.sh OUT [--pack DIR]"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
stage="$STAGE"
runs="$stage/bench-runs"
mkdir -p "$stage/bin" "$runs"
rm -f "$runs"/*.json

stage_binaries "$pack" "$stage" pagoda pagoda-gpu-check pagoda-bench
bin="$stage/bin"
# The CUDA 13 libraries (cuBLAS, cuRAND, NVRTC) from PyTorch's wheels or a toolkit.
export_cuda_libs

nvidia-smi -L >&2 || true
log "timings (gpu-check)"
rm -rf "$stage/timings" # a failed section must not leave an earlier run's copy bandwidth behind
"$bin/pagoda-gpu-check" --model /dev/null --out "$stage/timings" --sections timings >&2 ||
    log "the timings section failed (see $out/timings.md)"
cp "$stage/timings/results.md" "$out/timings.md" 2>/dev/null || echo "no timings" >"$out/timings.md"

config="$repo/configs/serve-dummy-8b.toml"
# Another shape from configs/models (the weights stay random), e.g. for a smoke test on the CPU.
model_config="$repo/configs/models/${MODEL_CONFIG:-llama-3.1-8b.json}"
# A tokenizer made here that covers the whole vocabulary: each printable ASCII character is a
# token (so the load generator's prompts, made of words, are distinct token sequences and miss
# the prefix cache as real prompts do), and fillers "<wN>" take the other ids. With random
# weights most sampled ids lie beyond any small real vocabulary, and ids that decode to nothing
# would stream no text, leaving the client no token times.
tokenizer="$stage/tokenizer"
mkdir -p "$tokenizer"
python3 - "$model_config" "$tokenizer/tokenizer.json" <<'EOF_TOKENIZER'
import json, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
chars = [chr(c) for c in range(32, 127)]
words = {"<unk>": 0, **{c: i + 1 for i, c in enumerate(chars)}}
words.update({f"<w{i}>": i for i in range(len(words), vocab)})
unk = {"id": 0, "content": "<unk>", "single_word": False, "lstrip": False, "rstrip": False,
       "normalized": False, "special": True}
split = {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False}
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [unk],
           "normalizer": None, "pre_tokenizer": split, "post_processor": None,
           "decoder": {"type": "Fuse"}, "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"}},
          open(sys.argv[2], "w"))
EOF_TOKENIZER
port="${PORT:-8765}"
# shellcheck disable=SC2086 # SERVE_ARGS: extra flags, split on purpose (e.g. a CPU smoke test).
start_server "$port" "$out/server.log" \
    "$bin/pagoda" serve --config "$config" --model "$model_config" --tokenizer "$tokenizer" --port "$port" ${SERVE_ARGS:-} ||
    die "the server did not get ready: $(tail -5 "$out/server.log")"

load() { # NAME ARGS...: one load generator run, its summary saved as runs/NAME.json
    local name="$1"
    shift
    log "$name"
    "$bin/pagoda-bench" serve --base-url "http://127.0.0.1:$port" --tokenizer "$tokenizer" --ignore-eos \
        --no-progress --save-result "$runs/$name.json" "$@" >&2
}
for b in ${DECODE_BATCHES:-1 8 32 128}; do
    load "decode-$b" --dataset random --input-len 128 --output-len 256 --max-concurrency "$b" \
        --num-prompts "$((b == 1 ? 3 : 2 * b))"
done
for len in ${PREFILL_LENS:-1024 4096}; do
    load "prefill-$len" --dataset random --input-len "$len" --output-len 1 --max-concurrency 1 --num-prompts 5
done
for rate in ${SERVE_RATES:-4 16 inf}; do
    load "serve-$rate" --dataset sharegpt-like --num-prompts "${SERVE_PROMPTS:-500}" --request-rate "$rate"
done

python3 - "$model_config" "$stage/timings/results.json" "$runs" \
    "${PEAK_TFLOPS:-989}" "$out" <<'EOF'
import glob, json, os, re, sys

config_path, timings_path, runs, peak_tflops, out = sys.argv[1:]
c = json.load(open(config_path))
h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
hd = c.get("head_dim", h // c["num_attention_heads"])
kv = c["num_key_value_heads"] * hd
per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h
params = layers * per_layer + vocab * h * (1 if c.get("tie_word_embeddings") else 2) + h
weight_bytes = 2 * params  # bf16
try:
    timings = json.load(open(timings_path))
except (OSError, ValueError):
    timings = {"device": "an unknown device (no timings)", "rows": []}
copy = next((r["measured"] for r in timings["rows"] if r["check"].startswith("device-to-device copy")), "none")
match = re.match(r"([\d.]+) GB/s", copy)
floor_ms = weight_bytes / (float(match.group(1)) * 1e9) * 1e3 if match else float("nan")
summaries = {}
for path in sorted(glob.glob(os.path.join(runs, "*.json"))):
    summaries[os.path.basename(path)[:-5]] = json.load(open(path))["summary"]
json.dump(summaries, open(os.path.join(out, "runs.json"), "w"), indent=1)

def med(s, key):
    d = s.get(key)
    return d["median"] if d else float("nan")

lines = [f"# Pagoda on {timings['device']}", "",
         f"{os.path.basename(config_path)}, random bf16 weights: {params / 1e9:.2f} B parameters, {weight_bytes / 1e9:.2f} GB. "
         f"Device copy {copy} (read + written): floor {floor_ms:.2f} ms/token.", "",
         "| phase | requests | failed | output tok/s | TTFT p50 ms | TPOT p50 ms | ITL p50 ms | MBU, MFU or req/s |",
         "|---|---|---|---|---|---|---|---|"]
def order(name):
    kind, _, arg = name.partition("-")
    return ({"decode": 0, "prefill": 1, "serve": 2}.get(kind, 3), float(arg) if arg != "inf" else 1e18)
for name in sorted(summaries, key=order):
    s = summaries[name]
    tpot, ttft = med(s, "tpot_ms"), med(s, "ttft_ms")
    util = ""
    if name.startswith("decode-"):
        util = f"MBU {floor_ms / tpot:.0%}"
    elif name.startswith("prefill-"):
        tokens = s["total_input_tokens"] / max(s["completed"], 1)
        util = f"MFU {2 * params * tokens / (ttft / 1e3) / (float(peak_tflops) * 1e12):.0%}"
    else:
        util = f"{s['request_throughput']:.1f} req/s"
    lines.append(f"| {name} | {s['completed']} | {s['failed']} | {s['output_throughput']:.0f} | {ttft:.1f} | "
                 f"{tpot:.2f} | {med(s, 'itl_ms'):.2f} | {util} |")
open(os.path.join(out, "bench.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
