#!/usr/bin/env python3
"""Beam search reference for Pagoda: writes tests/fixtures/beam-search.json.

Usage:  python3 scripts/golden_beam.py
(It runs inside .venv-golden/, as scripts/golden.py does, and reads the golden prompts from
tests/fixtures/golden.json, which that script writes.)

The search is vLLM's `beam_search` algorithm, written here over scripts/golden.py's float64
numpy SmolLM2 (the Q4_1 GGUF dequantized), each beam with its own KV cache:

* Start from one beam, the prompt. At each of `max_tokens` steps every beam offers its
  `2 * width` most likely next tokens (log-softmax of the raw logits); a continuation ending in
  the model's end-of-sequence token becomes a finished hypothesis, the others are sorted by
  cumulative logprob and the best `width` go on.
* After the last step the live beams are hypotheses too. All are sorted by
  cumulative logprob / (length ** length_penalty), the length counting the prompt and the
  output without its end-of-sequence token, and the best `n` are the result.

For each case it records the `n` hypotheses (output token ids, cumulative logprob, whether the
end-of-sequence token ended them) and the smallest gap in the search between a kept and a
dropped continuation (and between returned and unreturned hypotheses): a float32 engine can
only be held to the same beams where those gaps are wide.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden  # noqa: E402

FIXTURE = golden.ROOT / "tests" / "fixtures" / "beam-search.json"
# (golden prompt, width, n, max_tokens, length_penalty); chosen where the float64 search's
# gaps between kept and dropped are at least 5e-3 (see `min_gap`).
CASES = [
    ("chat_capital_of_france", 3, 2, 8, 1.0),
    ("plain_quick_brown_fox", 3, 3, 6, 1.0),
    ("plain_quick_brown_fox", 4, 1, 5, 1.0),
    ("plain_quick_brown_fox", 2, 2, 10, 0.0),
    ("long_printing_press", 2, 1, 8, 1.0),
    ("long_printing_press", 3, 3, 5, 2.0),
]


def search(model, np, prompt, width, n, max_tokens, penalty, eos):
    def log_softmax(logits):
        top = logits.max()
        return logits - (top + np.log(np.exp(logits - top).sum()))

    def score(tokens, cum, ended):
        length = len(prompt) + len(tokens) - int(ended)
        return cum / (length ** penalty)

    cache = model.new_cache()
    beams = [([], 0.0, cache, log_softmax(model.step(prompt, cache)))]
    done, gaps = [], []
    for step in range(max_tokens):
        candidates = []
        for b, (tokens, cum, cache, logprobs) in enumerate(beams):
            order = np.argsort(-logprobs, kind="stable")[: 2 * width]
            for t in order:
                candidates.append((tokens + [int(t)], cum + float(logprobs[t]), b))
        ended = [c for c in candidates if c[0][-1] == eos]
        going = sorted((c for c in candidates if c[0][-1] != eos), key=lambda c: -c[1])
        done.extend((tokens, cum, True) for tokens, cum, _ in ended)
        if len(going) > width:
            gaps.append(going[width - 1][1] - going[width][1])
        kept = going[:width]
        if not kept or step + 1 == max_tokens:
            done.extend((tokens, cum, False) for tokens, cum, _ in kept)
            break
        parents, beams = beams, []
        for tokens, cum, b in kept:
            # `step` replaces a cache's arrays (never writes into them): a shallow copy forks.
            fork = [dict(c) for c in parents[b][2]]
            logprobs = log_softmax(model.step([tokens[-1]], fork))
            beams.append((tokens, cum, fork, logprobs))
    ranked = sorted(done, key=lambda h: -score(*h))
    if len(ranked) > n:
        gaps.append(score(*ranked[n - 1]) - score(*ranked[n]))
    return ranked[:n], min(gaps) if gaps else None


def main() -> None:
    import gguf
    import numpy as np

    t0 = time.time()
    gguf_path = golden.MODELS_DIR / golden.MODEL_FILE
    if not gguf_path.exists():
        sys.exit(f"{gguf_path} is missing: run scripts/fetch-model.sh")
    reader = gguf.GGUFReader(str(gguf_path))
    md = golden.gguf_metadata(reader)
    model = golden.Llama(reader, md, np.float64, weights=golden.dequantize_all(reader))
    eos = int(md["tokenizer.ggml.eos_token_id"])
    prompts = {c["name"]: c["prompt_ids"] for c in json.loads(golden.FIXTURE.read_text())["logits_cases"]}
    cases = []
    for name, width, n, max_tokens, penalty in CASES:
        best, gap = search(model, np, prompts[name], width, n, max_tokens, penalty, eos)
        hypotheses = [{"token_ids": tokens, "cum_logprob": round(cum, 6), "eos": ended}
                      for tokens, cum, ended in best]
        cases.append({"name": name, "prompt_ids": prompts[name], "width": width, "n": n,
                      "max_tokens": max_tokens, "length_penalty": penalty, "min_gap": round(gap, 6),
                      "hypotheses": hypotheses})
        print(f"{name} width {width} n {n} max_tokens {max_tokens} penalty {penalty}: min gap {gap:.5f} "
              f"({time.time() - t0:.0f}s)")
        for h in hypotheses:
            print(f"  {h['cum_logprob']:9.4f} eos={h['eos']} {h['token_ids']}")
    fixture = {"model_file": golden.MODEL_FILE, "model_sha256": golden.MODEL_SHA256,
               "generator": "scripts/golden_beam.py", "eos_token_id": eos, "cases": cases}
    head = json.dumps({k: v for k, v in fixture.items() if k != "cases"})[:-1]
    lines = ",\n".join(f"  {json.dumps(case)}" for case in cases)
    FIXTURE.write_text(f'{head}, "cases": [\n{lines}\n]}}\n')
    assert json.loads(FIXTURE.read_text()) == fixture
    print(f"wrote {FIXTURE.relative_to(golden.ROOT)}")


if __name__ == "__main__":
    golden.ensure_venv(Path(__file__))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "2")
    main()
