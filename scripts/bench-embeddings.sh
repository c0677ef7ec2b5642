#!/usr/bin/env bash
# Embedding throughput: Pagoda and llama.cpp's llama-server serving all-MiniLM-L6-v2 on the same
# cores, one server at a time, timed by Pagoda's load generator (`pagoda-bench serve --endpoint
# embeddings`, one text per request, all sent at once under a concurrency cap).
#
#   scripts/bench-embeddings.sh [--rounds 3] [--streams "1 32"] [--num-prompts 256]
#                               [--input-len 96] [--out DIR]
#   (PAGODA_BIN=... PAGODA_BENCH_BIN=... run those binaries instead of building them.)
#
# - Pagoda serves the safetensors directory (make model-minilm); llama-server the same weights as
#   an f32 GGUF written by scripts/bert_to_gguf.py, with --embeddings and the model's mean pooling,
#   -t <cores>, one slot per stream, 512 tokens per slot and a batch that holds them all.
# - Before timing, both embed the same texts and the script prints the cosine between their
#   vectors: the peer must compute the same embedding for the comparison to mean anything.
# - Rounds alternate the servers, so drift of the machine touches both alike. Prints a markdown
#   table of sequences/s, median (min-max) of the rounds, and the median of per-round ratios;
#   each run's pagoda-bench output and JSON result stay in DIR.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
rounds=3 streams_list="1 32" num_prompts=256 input_len=96
out="$repo/bench-embeddings"
port=8471
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds="$2"; shift ;;
    --streams) streams_list="$2"; shift ;;
    --num-prompts) num_prompts="$2"; shift ;;
    --input-len) input_len="$2"; shift ;;
    --out) out="$2"; shift ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bench-embeddings: unknown argument $1" >&2; exit 1 ;;
    esac
    shift
done

# PAGODA_BIN and PAGODA_BENCH_BIN run binaries built elsewhere instead of building here.
# shellcheck source=scripts/server-lifecycle.sh
source "$repo/scripts/server-lifecycle.sh"
pagoda_binaries "$repo"
"$repo/scripts/fetch-model.sh" minilm >&2
model_dir="$repo/models/all-MiniLM-L6-v2"
gguf="$repo/models/all-MiniLM-L6-v2.f32.gguf"
[ -f "$gguf" ] || python3 "$repo/scripts/bert_to_gguf.py" "$model_dir" "$gguf" >&2
llama_server="$("$repo/scripts/build-llama-server.sh")"
cores="$(nproc)"
mkdir -p "$out"

trap stop_server EXIT

# start NAME STREAMS LOG: one of the two servers, ready on $port as model "minilm".
start() {
    case "$1" in
    pagoda) start_server "$port" "$3" "$pagoda" serve --model "$model_dir" --served-model-name minilm \
        --host 127.0.0.1 --port "$port" ;;
    llama.cpp) start_server "$port" "$3" "$llama_server" -m "$gguf" --alias minilm --embeddings \
        --pooling mean -t "$cores" -np "$2" -c $(($2 * 512)) -b $(($2 * 512)) -ub $(($2 * 512)) \
        --host 127.0.0.1 --port "$port" ;;
    esac || { cat "$3" >&2; exit 1; }
}

texts='["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "北京是中国的首都。"]'
for name in pagoda llama.cpp; do
    start "$name" 1 "$out/$name.check.log"
    curl -s "127.0.0.1:$port/v1/embeddings" -H 'Content-Type: application/json' \
        -d "{\"model\": \"minilm\", \"input\": $texts}" > "$out/$name.check.json"
    stop_server
done
python3 - "$out" <<'PY'
import json, math, sys
out = sys.argv[1]
vecs = [[d["embedding"] for d in json.load(open(f"{out}/{n}.check.json"))["data"]] for n in ("pagoda", "llama.cpp")]
for a, b in zip(*vecs):
    cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    print(f"bench-embeddings: cosine pagoda vs llama.cpp {cos:.6f}", file=sys.stderr)
PY

for round in $(seq 1 "$rounds"); do
    for streams in $streams_list; do
        for name in pagoda llama.cpp; do
            tag="$out/$name.s$streams.r$round"
            start "$name" "$streams" "$tag.server.log"
            echo "$(cut -d' ' -f1 /proc/loadavg)" > "$tag.load"
            "$bench" serve --base-url "http://127.0.0.1:$port" --model minilm --endpoint embeddings \
                --dataset random --input-len "$input_len" --num-prompts "$num_prompts" \
                --max-concurrency "$streams" --seed 1 --no-progress --save-result "$tag.json" > "$tag.txt" 2>&1
            stop_server
            echo "bench-embeddings: round $round, $streams stream(s), $name: $(grep -i 'request throughput' "$tag.txt" | head -1)" >&2
        done
    done
done

python3 - "$out" "$rounds" "$streams_list" "$num_prompts" "$input_len" <<'PY'
import json, statistics, sys
out, rounds, streams_list, prompts, input_len = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]
def summary(name, s, r):
    return json.load(open(f"{out}/{name}.s{s}.r{r}.json"))["summary"]
print(f"{prompts} inputs of about {input_len} tokens each, {rounds} rounds\n")
print("| streams | server | sequences/s, median (min-max) | failed | latency p50 ms | Pagoda / llama.cpp, median of per-round ratios (min-max) |")
print("|---|---|---|---|---|---|")
for s in streams_list:
    rates = {n: [summary(n, s, r)["request_throughput"] for r in range(1, rounds + 1)] for n in ("pagoda", "llama.cpp")}
    ratios = [a / b for a, b in zip(rates["pagoda"], rates["llama.cpp"]) if b > 0]
    for n in ("pagoda", "llama.cpp"):
        rs = [summary(n, s, r) for r in range(1, rounds + 1)]
        failed = sum(x["failed"] for x in rs)
        p50 = statistics.median(x["e2el_ms"]["median"] for x in rs if x.get("e2el_ms"))
        ratio = f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})" if n == "pagoda" and ratios else ""
        v = rates[n]
        print(f"| {s} | {n} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) | {failed} | {p50:.1f} | {ratio} |")
PY
