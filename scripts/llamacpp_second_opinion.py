#!/usr/bin/env python3
"""Second opinion on tests/fixtures/golden-gemma3.json from llama.cpp's llama-server.

Usage:  python3 scripts/llamacpp_second_opinion.py [--server PATH] [--port 8091] [--fixture PATH]
                                                 [-- EXTRA LLAMA-SERVER ARGS, e.g. -ctk f32 -ctv f32]
(stdlib only). Starts llama-server (default ~/.cache/pagoda-llamacpp/bin/llama-server, built by
scripts/build-llama-server.sh) on the fixture's model, then for every logits case feeds its
prompt_ids to POST /completion (greedy: temperature 0, top_k 1, ignore_eos, n_probs 20) and
compares the continuation with the fixture's greedy ids (agreement, first divergence) and the
first step's top-20 (ids in common; largest difference of logit gaps to the top-1, from
llama.cpp's log-probabilities, which differ from logits by a constant); and for every tokenizer
case POST /tokenize (add_special as the case says, parse_special true) against the fixture's ids.
Prints tables; stops only the server it started. llama.cpp computes in f32 with its own
quantized kernels (activations quantized to Q8 for the quantized matmuls), so small logit
differences are expected; the continuations should agree until a near-tie, if any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def post(base: str, path: str, body: dict, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    sys.exit("llama-server did not become ready")


def compare_logits(base: str, fixture: dict) -> None:
    print(f"{'case':<24} {'prompt':>6} {'greedy agree':>13} {'first diverg.':>13} "
          f"{'top20 common':>12} {'max gap diff':>12}  fixture min margin")
    for case in fixture["logits_cases"]:
        n = len(case["greedy"])
        out = post(base, "/completion", {
            "prompt": case["prompt_ids"], "n_predict": n, "temperature": 0, "top_k": 1,
            "samplers": ["top_k"], "ignore_eos": True, "cache_prompt": False, "return_tokens": True,
            "n_probs": 20, "seed": 0,
        })
        got = [int(t) for t in out["tokens"]]
        agree = sum(a == b for a, b in zip(got, case["greedy"]))
        div = next((i for i, (a, b) in enumerate(zip(got, case["greedy"])) if a != b), None)
        if div is None and len(got) != n:
            div = min(len(got), n)
        first = out["completion_probabilities"][0]["top_logprobs"]
        lp = {int(p["id"]): float(p["logprob"]) for p in first}
        ref = {int(i): float(v) for i, v in case["top20"]}
        common = len(set(lp) & set(ref))
        top_ref, top_lp = case["top20"][0][0], int(first[0]["id"])
        gaps = [abs((ref[i] - ref[top_ref]) - (lp[i] - lp[top_lp])) for i in set(lp) & set(ref)] \
            if top_ref == top_lp else [float("nan")]
        print(f"{case['name']:<24} {len(case['prompt_ids']):>6} {agree:>7}/{n:<5} "
              f"{'none' if div is None else div:>13} {common:>9}/20 {max(gaps):>12.4f}  "
              f"{case['greedy_min_margin']}")
        if div is not None:
            print(f"    llama.cpp: {got}\n    fixture:   {case['greedy']}")


def compare_tokenizer(base: str, fixture: dict) -> None:
    cases = fixture["tokenizer_cases"]
    same = 0
    for n, case in enumerate(cases):
        got = post(base, "/tokenize", {"content": case["text"], "add_special": case["add_special_tokens"],
                                      "parse_special": True})["tokens"]
        got = [t if isinstance(t, int) else int(t["id"]) for t in got]
        if got == case["ids"]:
            same += 1
            continue
        div = next((i for i, (a, b) in enumerate(zip(got, case["ids"])) if a != b), min(len(got), len(case["ids"])))
        print(f"  tokenizer case {n} {case['text'][:60]!r} (add_special_tokens={case['add_special_tokens']}): "
              f"differs at {div}\n    llama.cpp: {got}\n    fixture:   {case['ids']}")
    print(f"tokenizer: {same}/{len(cases)} cases identical to llama.cpp's /tokenize")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=str(Path.home() / ".cache/pagoda-llamacpp/bin/llama-server"))
    ap.add_argument("--fixture", default=str(ROOT / "tests/fixtures/golden-gemma3.json"))
    ap.add_argument("--port", type=int, default=8091)
    ap.add_argument("--threads", type=int, default=2)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    fixture = json.loads(Path(args.fixture).read_text(encoding="utf-8"))
    model = ROOT / "models" / fixture["model_file"]
    base = f"http://127.0.0.1:{args.port}"
    cmd = [args.server, "-m", str(model), "-t", str(args.threads), "--no-repack", "-c", "4096",
           "--port", str(args.port), "--host", "127.0.0.1", "-np", "1", *extra]
    log = open(os.environ.get("LLAMACPP_LOG", "/tmp/llamacpp-second-opinion.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    print(f"started llama-server pid {proc.pid}: {' '.join(cmd)}")
    try:
        wait_ready(base, proc)
        compare_logits(base, fixture)
        compare_tokenizer(base, fixture)
    finally:
        proc.terminate()  # only the server this script started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    main()
