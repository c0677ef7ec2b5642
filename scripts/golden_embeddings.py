#!/usr/bin/env python3
"""Embedding reference for Pagoda: writes tests/fixtures/embeddings-minilm.json.

Usage:  python3 scripts/golden_embeddings.py
(It runs inside .venv-golden/, created from scripts/golden-requirements.txt as scripts/golden.py
creates it. `make model-minilm` fetches the model first.)

What it computes, for all-MiniLM-L6-v2 (models/all-MiniLM-L6-v2, a sentence-transformers
directory): for each of the texts below, its token ids and its embedding, as
sentence-transformers defines it for this model:

* Tokens: the model's own tokenizer.json through Hugging Face `tokenizers` (Python), with its
  fixed padding to 128 turned off and truncation at `max_seq_length` (256, from
  sentence_bert_config.json) -- [CLS], at most 254 word pieces, [SEP] -- as
  sentence-transformers' Transformer module calls the tokenizer.
* The encoder: a plain numpy BERT written here from the architecture (embeddings of word,
  position and token type 0 summed and LayerNorm-ed; per layer, bidirectional softmax attention
  with a 1/sqrt(head_dim) scale, output projection, residual and LayerNorm, then the erf GELU MLP,
  residual and LayerNorm), over the safetensors weights read with `safetensors.numpy`, in float64.
* Pooling and normalization from modules.json: the mean over the input's tokens (no padding is
  involved: each text is run alone), then L2 normalization (the Normalize module).

Independent of Pagoda's Rust code: no candle, no Rust tokenizer wrapper; the float64 forward pass
carries less rounding error than any float32 implementation (the script prints how far a float32
pass of the same code lands, as a check of the tolerance the tests use).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden  # noqa: E402  (the shared venv bootstrap)

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "models" / "all-MiniLM-L6-v2"
FIXTURE = ROOT / "tests" / "fixtures" / "embeddings-minilm.json"

LONG = " ".join(f"Sentence {i} of a long document about rivers, cities and the weather in spring." for i in range(40))

TEXTS = [
    "",
    " ",
    ".",
    "a",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps above a sleepy hound.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Berlin is the capital of Germany.",
    "How do I reset my password?",
    "To reset your password, open Settings and choose Security.",
    "The stock market fell sharply on Monday after the announcement.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "I love eating pizza with extra cheese on Friday nights.",
    "The mitochondria is the powerhouse of the cell.",
    "Machine learning models need a lot of training data.",
    "def add(a, b):\n    return a + b",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "3.14159 2.71828 1.41421 6.02214076e23",
    "Call me at +1 (555) 010-9999 before 10:30 p.m.",
    "UPPERCASE TEXT SHOULD BE LOWERCASED BY THE TOKENIZER",
    "Café naïve résumé façade coöperate — déjà vu.",
    "Ünïcödé àccents are stripped? Maybe not: ñ, ß, ø, å.",
    "北京是中国的首都。",
    "我喜欢在周末读书和喝茶。",
    "東京は日本の首都です。",
    "ひらがなとカタカナと漢字が混ざった文章です。",
    "서울은 대한민국의 수도입니다.",
    "Москва — столица России.",
    "Я люблю читать книги по вечерам.",
    "القاهرة هي عاصمة مصر.",
    "नई दिल्ली भारत की राजधानी है।",
    "Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "שלום עולם",
    "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย",
    "Emoji: 😀🎉🚀 and symbols ©®™ ∑∫√ ≠ ≤ ≥",
    "tab\tseparated\tvalues\nand\nnew lines",
    "     leading and trailing spaces     ",
    "!!!???...,,,;;;:::",
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.org wrote: <b>bold</b> &amp; <i>italic</i>",
    "The the the the the the the the the the",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "A sentence with [CLS] and [SEP] and [MASK] written in it.",
    "It was the best of times, it was the worst of times.",
    "To be, or not to be, that is the question.",
    "Rerank me: which document answers the query best?",
    "Embeddings map text to vectors so that similar meanings lie close together.",
    "The weather today is sunny with a light breeze from the west.",
    "Tomorrow it will rain in the morning and clear up by the afternoon.",
    LONG,
    "word " * 300,
    "日本語のテキスト" * 60,
]


def tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    config = json.loads((MODEL_DIR / "sentence_bert_config.json").read_text())
    tok.no_padding()
    tok.enable_truncation(max_length=config["max_seq_length"])
    return tok


class Bert:
    def __init__(self, dtype):
        import numpy as np
        from safetensors.numpy import load_file

        self.np = np
        self.dtype = dtype
        self.w = {k: v.astype(dtype) for k, v in load_file(str(MODEL_DIR / "model.safetensors")).items()
                  if v.dtype.kind == "f"}
        config = json.loads((MODEL_DIR / "config.json").read_text())
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.eps = config["layer_norm_eps"]
        self.erf = np.vectorize(math.erf, otypes=[dtype])

    def norm(self, x, name):
        np = self.np
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def embed(self, ids):
        np, w = self.np, self.w
        n = len(ids)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self.norm(x, "embeddings.LayerNorm")
        d = x.shape[1] // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (self.dense(x, p + f"attention.self.{m}").reshape(n, self.heads, d).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            ctx = (scores @ v).transpose(1, 0, 2).reshape(n, -1)
            x = self.norm(self.dense(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = self.dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + self.erf(h / math.sqrt(2.0)))
            x = self.norm(self.dense(h, p + "output.dense") + x, p + "output.LayerNorm")
        pooled = x.mean(0)
        return pooled / max(np.linalg.norm(pooled), 1e-12)


def main() -> None:
    golden.ensure_venv(Path(__file__))
    import numpy as np

    if not (MODEL_DIR / "model.safetensors").exists():
        sys.exit("models/all-MiniLM-L6-v2 is missing: run `make model-minilm`")
    tok = tokenizer()
    f64, f32 = Bert(np.float64), Bert(np.float32)
    cases, worst = [], 1.0
    for text in TEXTS:
        ids = tok.encode(text).ids
        reference = f64.embed(ids)
        single = f32.embed(ids).astype(np.float64)
        worst = min(worst, float(reference @ single / np.linalg.norm(single)))
        cases.append({"text": text, "token_ids": ids, "embedding": [float(f"{v:.7g}") for v in reference]})
        print(f"{len(ids):4d} tokens  {text[:40]!r}", file=sys.stderr)
    print(f"float32 pass: lowest cosine to the float64 reference {worst:.9f}", file=sys.stderr)
    fixture = {
        "model": "all-MiniLM-L6-v2",
        "generator": "scripts/golden_embeddings.py (float64 numpy BERT, mean pooling, L2 normalized)",
        "max_seq_length": 256,
        "cases": cases,
    }
    # One case per line: diffs of a regenerated fixture stay readable.
    head = json.dumps({k: v for k, v in fixture.items() if k != "cases"}, ensure_ascii=False)[:-1]
    lines = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)
    FIXTURE.write_text(f'{head}, "cases": [\n{lines}\n]}}\n')
    print(f"wrote {FIXTURE.relative_to(ROOT)} ({len(cases)} texts)", file=sys.stderr)


if __name__ == "__main__":
    main()
