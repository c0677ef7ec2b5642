#!/usr/bin/env python3
"""The client side of scripts/bench-agent-turns.sh (stdlib only).

  turns   --base-url URL --model NAME --traces DIR --out FILE [--only-turn K]
          Sends every trace's turns (scripts/agent_traces.py build) in order, streamed, one at a
          time, and records per turn the time to the first text delta (TTFT), the wall time, the
          answer's text and the prompt tokens the server counted; per trace the wall time of all
          its turns. --only-turn K sends turn K alone (the fresh-server check).
  prefill --base-url URL --model NAME --sizes 2048,8192,16384 --seed S --out FILE
          One /v1/completions request per size, a prompt of exactly that many token ids (drawn
          at random from ordinary vocabulary ids, a new draw per request, so no prompt cache
          helps), max_tokens 1, not streamed: the wall time is the prefill plus one decode step.
  table   DIR   The markdown report of a run directory (medians over rounds, the greedy check).
  warmup  --base-url URL --model NAME   one short chat request (first-request set-up off the clock).
"""

import argparse
import glob
import http.client
import json
import os
import random
import statistics
import sys
import time
import urllib.parse


def post(base_url, path, body, stream, timeout=900):
    u = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json",
                                                 "Accept": "text/event-stream" if stream else "application/json"})
    return conn, conn.getresponse()


def sse_events(resp):
    """(event name or None, parsed data) for each SSE event of a streamed answer."""
    name, data = None, []
    for raw in resp:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                payload = "\n".join(data)
                if payload != "[DONE]":
                    yield name, json.loads(payload)
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def usage_counts(endpoint, usage):
    """(prompt tokens, of them cached) from a usage object, or (None, None).

    Anthropic's input_tokens leaves out the tokens read from (or written to) the prompt cache;
    OpenAI's counts them all and names the cached ones in input_tokens_details."""
    if not isinstance(usage, dict) or "input_tokens" not in usage:
        return None, None
    if endpoint == "/v1/messages":
        cached = usage.get("cache_read_input_tokens") or 0
        return usage["input_tokens"] + cached + (usage.get("cache_creation_input_tokens") or 0), cached
    return usage["input_tokens"], (usage.get("input_tokens_details") or {}).get("cached_tokens")


def text_and_usage(endpoint, name, ev):
    """The text delta an event carries, and the usage object it reports (either may be None)."""
    kind = ev.get("type") or name
    if endpoint == "/v1/messages":
        if kind == "content_block_delta" and ev.get("delta", {}).get("type") == "text_delta":
            return ev["delta"].get("text"), None
        if kind == "message_start":
            return None, ev.get("message", {}).get("usage")
        if kind == "message_delta":
            return None, ev.get("usage")
        if kind == "error":
            raise RuntimeError("error event: %s" % json.dumps(ev)[:300])
    else:
        if kind == "response.output_text.delta":
            return ev.get("delta"), None
        if kind in ("response.completed", "response.incomplete"):
            return None, (ev.get("response") or {}).get("usage")
        if kind in ("response.failed", "error"):
            raise RuntimeError("error event: %s" % json.dumps(ev)[:300])
    return None, None


def send_turn(base_url, model, req):
    body = dict(req["body"], model=model)
    start = time.perf_counter()
    conn, resp = post(base_url, req["endpoint"], body, stream=True)
    try:
        if resp.status != 200:
            raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:400].decode("utf-8", "replace")))
        ttft, pieces, prompt_tokens, cached = None, [], None, None
        for name, ev in sse_events(resp):
            text, usage = text_and_usage(req["endpoint"], name, ev)
            if text:
                if ttft is None:
                    ttft = time.perf_counter() - start
                pieces.append(text)
            n, c = usage_counts(req["endpoint"], usage)
            # Servers put the whole count in the start or the end event: keep the largest seen.
            if n is not None and (prompt_tokens is None or n >= prompt_tokens):
                prompt_tokens, cached = n, c
    finally:
        conn.close()
    wall = time.perf_counter() - start
    return {"trace": req["trace"], "turn": req["turn"], "endpoint": req["endpoint"],
            # No text at all (the model ended at once): the wall time stands in, flagged.
            "ttft_s": ttft if ttft is not None else wall, "ttft_is_wall": ttft is None,
            "wall_s": wall, "prompt_tokens": prompt_tokens, "cached_tokens": cached, "text": "".join(pieces)}


def cmd_turns(a):
    out = {"turns": [], "traces": {}}
    for path in sorted(glob.glob(os.path.join(a.traces, "*.jsonl"))):
        reqs = [json.loads(line) for line in open(path, encoding="utf-8")]
        if a.only_turn:
            reqs = [r for r in reqs if r["turn"] == a.only_turn]
        if not reqs:
            continue
        start = time.perf_counter()
        for r in reqs:
            res = send_turn(a.base_url, a.model, r)
            out["turns"].append(res)
            print("  %s turn %d: TTFT %.3f s, wall %.3f s, %s prompt tokens (%s cached)" % (
                res["trace"], res["turn"], res["ttft_s"], res["wall_s"], res["prompt_tokens"], res["cached_tokens"]),
                file=sys.stderr)
        out["traces"][reqs[0]["trace"]] = {"wall_s": time.perf_counter() - start, "turns": len(reqs)}
    json.dump(out, open(a.out, "w"), indent=1)


def cmd_prefill(a):
    rng = random.Random(a.seed)
    out = []
    for n in [int(s) for s in a.sizes.split(",") if s]:
        ids = [rng.randrange(a.id_low, a.id_high) for _ in range(n)]
        body = {"model": a.model, "prompt": ids, "max_tokens": 1, "temperature": 0, "stream": False}
        start = time.perf_counter()
        conn, resp = post(a.base_url, "/v1/completions", body, stream=False)
        try:
            raw = resp.read()
            if resp.status != 200:
                raise RuntimeError("HTTP %d: %s" % (resp.status, raw[:400].decode("utf-8", "replace")))
        finally:
            conn.close()
        wall = time.perf_counter() - start
        counted = (json.loads(raw).get("usage") or {}).get("prompt_tokens")
        out.append({"tokens": n, "prompt_tokens": counted, "wall_s": wall, "tokens_per_s": n / wall})
        print("  prefill %d tokens: %.3f s, %.0f tokens/s" % (n, wall, n / wall), file=sys.stderr)
    json.dump(out, open(a.out, "w"), indent=1)


def cmd_warmup(a):
    body = {"model": a.model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    conn, resp = post(a.base_url, "/v1/chat/completions", body, stream=False)
    resp.read()
    conn.close()


# ---------------------------------------------------------------- table


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, unit=""):
    return "-" if x is None else ("%.3f%s" % (x, unit))


def ratio(p, q):
    return "-" if not p or not q else "%.2f" % (p / q)


def load_runs(d, kind):
    """{server: [per-round result]} for files <server>-<kind>-r<round>.json."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "*-%s-r*.json" % kind))):
        server = os.path.basename(path).split("-%s-" % kind)[0]
        runs.setdefault(server, []).append(json.load(open(path)))
    return runs


def cmd_table(a):
    d = a.dir
    meta = dict(line.rstrip("\n").split("=", 1) for line in open(os.path.join(d, "machine")) if "=" in line)
    runs = load_runs(d, "turns")
    print("# Agent turns: Pagoda and llama.cpp\n")
    print("Model `%s`, %s rounds, servers alternating per round; CPU %s (%s cores), load %s at the start, %s at the end." % (
        meta.get("model"), meta.get("rounds"), meta.get("cpu_model"), meta.get("cores"), meta.get("load_start"),
        meta.get("load_end")))
    print("Medians over rounds. TTFT: request sent to the first text delta, streamed, turns in order on one server "
          "(the prefix cache applies to follow-ups). `max_tokens` %s, temperature 0.\n" % meta.get("max_tokens"))
    print("Replay form: each trace through its client's API (Claude Code: `/v1/messages`, Codex: `/v1/responses`; "
          "llama.cpp's server has both), with the tool definitions written into the system text and the tool "
          "calls and results as text, so both servers render the same prompt with the same template (`%s`); "
          "no `tools` field is sent (scripts/agent_traces.py says why).%s\n" % (
              meta.get("chat_template"), (" Prompts cut to about %s tokens." % meta["max_prompt_tokens"])
              if meta.get("max_prompt_tokens", "0") != "0" else ""))
    if runs:
        keys = sorted({(t["trace"], t["turn"]) for rs in runs.values() for r in rs for t in r["turns"]})
        print("| trace | turn | prompt tokens, cached in brackets (Pagoda / llama.cpp) | Pagoda TTFT s | llama.cpp TTFT s "
              "| ratio Pagoda / llama.cpp |")
        print("|---|---|---|---|---|---|")

        def per(server, key, field):
            return [t[field] for r in runs.get(server, []) for t in r["turns"] if (t["trace"], t["turn"]) == key]

        flagged = False
        for key in keys:
            p, q = med(per("pagoda", key, "ttft_s")), med(per("llama", key, "ttft_s"))
            star = "*" if any(any(per(s, key, "ttft_is_wall")) for s in runs) else ""
            flagged |= bool(star)
            toks = " / ".join("%s (%s)" % (med(per(s, key, "prompt_tokens")), med(per(s, key, "cached_tokens")))
                              for s in ("pagoda", "llama"))
            print("| %s | %d%s | %s | %s | %s | %s |" % (key[0], key[1], star, toks, fmt(p), fmt(q), ratio(p, q)))
        print()
        differ = [k for k in keys if med(per("pagoda", k, "prompt_tokens")) != med(per("llama", k, "prompt_tokens"))]
        if differ and all(s in runs for s in ("pagoda", "llama")):
            print("**The servers counted different prompt tokens for %s: they did not do the same work there.**\n"
                  % ", ".join("%s turn %d" % k for k in differ))
        if flagged:
            print("\\* a server answered with no text, so its wall time stands in for the TTFT.\n")
        print("| trace | turns | Pagoda total wall s | llama.cpp total wall s | ratio |")
        print("|---|---|---|---|---|")
        for trace in sorted({t for rs in runs.values() for r in rs for t in r["traces"]}):
            p = med([r["traces"][trace]["wall_s"] for r in runs.get("pagoda", []) if trace in r["traces"]])
            q = med([r["traces"][trace]["wall_s"] for r in runs.get("llama", []) if trace in r["traces"]])
            n = max(r["traces"][trace]["turns"] for rs in runs.values() for r in rs if trace in r["traces"])
            print("| %s | %d | %s | %s | %s |" % (trace, n, fmt(p), fmt(q), ratio(p, q)))
        print()
    pre = load_runs(d, "prefill")
    if pre:
        print("## Prefill\n")
        print("One `/v1/completions` request of N random vocabulary ids, `max_tokens` 1, not streamed; tokens/s = N / "
              "wall time (prefill plus one decode step), median over rounds.\n")
        print("| prompt tokens | Pagoda tokens/s | llama.cpp tokens/s | ratio Pagoda / llama.cpp |")
        print("|---|---|---|---|")
        for n in sorted({x["tokens"] for rs in pre.values() for r in rs for x in r}):
            p = med([x["tokens_per_s"] for r in pre.get("pagoda", []) for x in r if x["tokens"] == n])
            q = med([x["tokens_per_s"] for r in pre.get("llama", []) for x in r if x["tokens"] == n])
            print("| %d | %s | %s | %s |" % (n, "-" if p is None else "%.0f" % p, "-" if q is None else "%.0f" % q,
                                           ratio(p, q)))
        print()
    check = load_runs(d, "single")
    if check:
        print("## Greedy check\n")
        print("Each turn sent alone to a freshly started server, its answer compared with the same turn's answer "
              "in round 1's in-order replay on the same server.\n")
        bad = 0
        for server, singles in sorted(check.items()):
            replay = {(t["trace"], t["turn"]): t["text"] for t in runs.get(server, [{}])[0].get("turns", [])}
            for s in singles:
                for t in s["turns"]:
                    key = (t["trace"], t["turn"])
                    if key in replay and replay[key] != t["text"]:
                        bad += 1
                        print("- MISMATCH %s %s turn %d: replayed %r, alone %r" % (
                            server, key[0], key[1], replay[key][:120], t["text"][:120]))
        n = sum(len(s["turns"]) for ss in check.values() for s in ss)
        print("%d of %d turns answered the same alone as in the replay.\n" % (n - bad, n))
    print("## Commands\n")
    print("```")
    for line in open(os.path.join(d, "commands")):
        print(line.rstrip("\n"))
    print("```")
    print("\nRaw results: `%s`." % d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("turns", "prefill", "warmup"):
        p = sub.add_parser(name)
        p.add_argument("--base-url", required=True)
        p.add_argument("--model", required=True)
        if name != "warmup":
            p.add_argument("--out", required=True)
    t = sub.choices["turns"]
    t.add_argument("--traces", required=True)
    t.add_argument("--only-turn", type=int, default=0)
    p = sub.choices["prefill"]
    p.add_argument("--sizes", default="2048,8192,16384")
    p.add_argument("--seed", type=int, default=0)
    # In Gemma 3's vocabulary every id in 6000..200000 is an ordinary piece (the control, byte and
    # unused tokens sit below 500 and above 255967).
    p.add_argument("--id-low", type=int, default=6000)
    p.add_argument("--id-high", type=int, default=200000)
    tb = sub.add_parser("table")
    tb.add_argument("dir")
    a = ap.parse_args()
    {"turns": cmd_turns, "prefill": cmd_prefill, "table": cmd_table, "warmup": cmd_warmup}[a.cmd](a)


if __name__ == "__main__":
    main()
