#!/usr/bin/env bash
# A draft model under a JSON schema on CUDA, in one command: the default model drafting for
# itself (k = 3) against no speculation, greedy, four JSON-schema chats, in float32 and bfloat16,
# a fresh server each. Prints how many answers are the same and the spec_decode counters, and
# leaves OUT/DTYPE-{off,draft}.{json,metrics,log}.
#
#   scripts/gpu-check.sh build                 # on any machine: binaries + the model, packed
#   scripts/gpu-draft-grammar.sh OUT [--pack DIR]   # on the GPU host, from the repo root
#
# The model may arrive in parts over several calls, as for gpu-check.sh run (exit 3 until all
# are staged).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?usage: gpu-draft-grammar.sh OUT [--pack DIR]}"
pack="$repo/gpu-check"
[ "${2:-}" = --pack ] && pack="${3:?--pack DIR}"
mkdir -p "$OUT"
# stage_binaries, stage_model, export_cuda_libs.
# shellcheck source=scripts/gpu-check.sh
source "$repo/scripts/gpu-check.sh"
set +e
stage_binaries "$pack" "$STAGE" pagoda
stage_model "$pack" "$STAGE" || exit 3
export_cuda_libs
# shellcheck source=scripts/server-lifecycle.sh
source "$repo/scripts/server-lifecycle.sh"
trap stop_server EXIT
bin="$STAGE/bin/pagoda"
m="$staged_model"
draft="{\"method\":\"draft_model\",\"model\":\"$m\",\"num_speculative_tokens\":3}"
ask() {  # ask TAG: JSON-schema chats, greedy; answers and metrics under $OUT/TAG.*
python3 - "$1" <<'PY'
import json, sys, urllib.request as u
tag = sys.argv[1]
schema = {"type": "object", "properties": {"name": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}, "count": {"type": "integer"}}, "required": ["name", "items", "count"]}
prompts = ["List the fruits in this sentence as JSON: apples, oranges, pears and plums are on the table.",
           "Give the name of the capital of France and three of its landmarks as JSON.",
           "Copy into JSON: the team Red Lions has players Ann, Bob, Cid and Dee.",
           "Describe a shopping list with milk, eggs, bread, butter and jam as JSON."]
out = []
for p in prompts:
    body = {"model": "smol", "messages": [{"role": "user", "content": p}], "max_tokens": 96, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    req = u.Request("http://127.0.0.1:8471/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = json.load(u.urlopen(req, timeout=120))
    out.append([r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]])
json.dump(out, open(f"{sys.argv[1]}.json", "w"), indent=1)
m = u.urlopen("http://127.0.0.1:8471/metrics").read().decode()
open(f"{tag}.metrics", "w").write("\n".join(l for l in m.splitlines() if "spec_decode_num" in l and "_total" in l))
PY
}
for dtype in float32 bfloat16; do
  for cfg in off draft; do
    tag="$OUT/$dtype-$cfg"
    if [ $cfg = off ]; then extra=(); else extra=(--speculative-config "$draft"); fi
    start_server 8471 "$tag.log" "$bin" serve --model "$m" --device cuda --dtype $dtype --port 8471 --served-model-name smol "${extra[@]}" || { tail -5 "$tag.log"; continue; }
    ask "$tag"; stop_server
  done
  python3 -c "
import json,sys
a=json.load(open('$OUT/$dtype-off.json')); b=json.load(open('$OUT/$dtype-draft.json'))
print('$dtype same answers:', sum(x==y for x,y in zip(a,b)), 'of', len(a))
for x in b: print('  ', x[1], x[0][:100])
"
  grep -E "num_(draft_tokens|accepted_tokens)_total" "$OUT/$dtype-draft.metrics"
done
