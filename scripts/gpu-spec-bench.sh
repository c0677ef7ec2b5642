#!/usr/bin/env bash
# Speculative decoding on a GPU host, in one command: the default model (SmolLM2) on cuda:0,
# greedy, the grounded set, without speculation and with n-gram proposals, through
# scripts/bench-speculative.sh (fresh server per run, configurations alternating, medians of
# per-round ratios, and how many answers are the same text as without speculation).
#
#   scripts/gpu-check.sh build                  # on any machine: binaries + the model, packed
#   gpu-spec-bench.sh OUT [--pack DIR] [--rounds 3] [--streams "1 8 32"] [--k 8]
#                     [--sets "f32 draft invariant"]
#                                               # on the GPU host, from the repo root
#
# At every stream count: bf16 (CUDA's default dtype) off and n-gram k, with no batch-size
# switch-off (disable_by_batch_size 1024), so the crossover shows. At the first stream count
# also the sets named by --sets (default all three): f32, off and n-gram k, where the
# verification's larger matmuls should not change a greedy token; draft, the model drafting for
# itself as a separate draft model (k = 3) in both dtypes; invariant, bf16 off and n-gram k
# with --batch-invariant, where every answer must be the text without speculation. Writes OUT/streams-N.md (the tables) and OUT/streams-N/ (every run's result, texts
# included, and server log). The model may arrive in parts over several calls, as for
# gpu-check.sh run (exit 3 until all are staged).
set -euo pipefail

# stage_binaries, stage_model, export_cuda_libs, $STAGE.
# shellcheck source=scripts/gpu-check.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-check.sh"
log() { echo "gpu-spec-bench: $*" >&2; }
die() {
    log "$*"
    exit 2
}

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="" pack="$repo/gpu-check" rounds=3 streams_list="1 8 32" k=8 sets="f32 draft invariant"
while [ $# -gt 0 ]; do
    case "$1" in
    --pack) pack="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --streams) streams_list="$2"; shift ;;
    --k) k="$2"; shift ;;
    --sets) sets="$2"; shift ;;
    -*) die "unknown option $1" ;;
    *) out="$1" ;;
    esac
    shift
done
[ -n "$out" ] || die "usage: gpu-spec-bench.sh OUT [--pack DIR] [--rounds N] [--streams \"1 8 32\"] [--k K]"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

stage_binaries "$pack" "$STAGE" pagoda pagoda-bench
stage_model "$pack" "$STAGE"
export_cuda_libs
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true

export PAGODA_BIN="$STAGE/bin/pagoda" PAGODA_BENCH_BIN="$STAGE/bin/pagoda-bench"
spec="--speculative-config {\"method\":\"ngram\",\"num_speculative_tokens\":$k,\"disable_by_batch_size\":1024}"
draft="--speculative-config {\"method\":\"draft_model\",\"model\":\"$staged_model\",\"num_speculative_tokens\":3,\"disable_by_batch_size\":1024}"
first=1
for streams in $streams_list; do
    configs=("bf16-off=--device cuda" "bf16-ngram$k=--device cuda $spec")
    if [ "$first" = 1 ]; then
        for set in $sets; do
            case "$set" in
            f32) configs+=("f32-off=--device cuda --dtype float32" "f32-ngram$k=--device cuda --dtype float32 $spec") ;;
            # The model as its own draft: every greedy proposal should hold, unless the draft's
            # cache falls out of step with the target's.
            draft) configs+=("bf16-draft3=--device cuda $draft" "f32-draft3=--device cuda --dtype float32 $draft") ;;
            invariant) configs+=("inv-off=--device cuda --batch-invariant" "inv-ngram$k=--device cuda --batch-invariant $spec") ;;
            *) die "unknown set $set (f32, draft, invariant)" ;;
            esac
        done
        first=0
    fi
    log "$streams stream(s): ${configs[*]}"
    "$repo/scripts/bench-speculative.sh" --rounds "$rounds" --streams "$streams" --model "$staged_model" \
        --out "$out/streams-$streams" "${configs[@]}" | tee "$out/streams-$streams.md"
done
