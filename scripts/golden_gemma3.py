#!/usr/bin/env python3
"""Golden reference for Gemma 3 270M: writes tests/fixtures/golden-gemma3.json.

Usage:  python3 scripts/golden_gemma3.py      (or `make golden-gemma3`)
Same pinned environment as scripts/golden.py (.venv-golden/ from scripts/golden-requirements.txt,
created on first use; the script re-executes itself inside it). Reuses golden.py's helpers (GGUF
metadata, dequantization, the torch-free transformers GGUF tokenizer loader, the JSON layout)
without changing it. Re-running gives a byte-identical fixture. About 5 minutes on 2 cores.

Model: models/gemma-3-270m-q4_k_m.gguf (`scripts/fetch-model.sh gemma3`; sha256 checked).

Forward pass: numpy, written here from Hugging Face's modeling_gemma3 (the definition), over the
f32 weights that the `gguf` package (llama.cpp's gguf-py) dequantizes; activations in float64.
  x = embed[ids] * sqrt(640); per layer:
    h = x + post_attention_norm(attn(attn_norm(x)));  x = h + post_ffw_norm(mlp(ffn_norm(h)))
  attn: q/k/v projections, RMSNorm over head_dim on q and k per head (attn_q_norm/attn_k_norm),
    then rotate-half (NEOX) RoPE, scale query_pre_attn_scalar**-0.5 = 1/16, 4 query heads share 1
    KV head. Layers i with (i+1) % 6 == 0 (5, 11, 17) are global: full causal, RoPE base 1e6.
    The others are local: key j visible to query i iff i - 512 < j <= i, RoPE base 10000.
  mlp: down(gelu_tanh(gate(x)) * up(x)); final RMSNorm, tied lm head (token_embd); no softcapping.
Findings, checked on the file and in llama.cpp's source (the converter and src/models/gemma3.cpp):
* Norm weights: HF's Gemma3RMSNorm multiplies by (1 + w); llama.cpp's converter (Gemma3Model,
  `norm_shift`) stores w + 1, so the GGUF values are used AS IS. The file confirms it: every one of
  the 55936 values of the *norm.weight tensors minus 1 is exactly a bfloat16 number (the checkpoint
  is bf16), while ~25% of the stored values are not -- the +1 was added in f32 after bf16. The script
  asserts this and also shows that treating them as zero-centred (adding 1 again) wrecks the output.
* Q/K rows: not permuted for gemma3 (only the Llama-family converters permute); llama.cpp runs
  gemma3 with LLAMA_ROPE_TYPE_NEOX (pairs (i, i + 128)), which is HF's rotate-half on HF's row
  order. The script shows that the interleaved (GPT-J) pairing gives a different, worse model.
* Local RoPE base: the GGUF has no `gemma3.rope.freq_base_swa`; both HF (rope_local_base_freq)
  and llama.cpp (rope_freq_base_train_swa) default to 10000. `gemma3.rope.freq_base` = 1e6 is the
  global one. No rope scaling for 270M (none in the file).
* Embedding scale: HF casts sqrt(hidden) to the model dtype (bf16 would give 25.25); llama.cpp uses
  sqrtf(640) = 25.2982; this reference uses sqrt(640) exactly (f64), as the GGUF model is f32-ish.
* The sliding-window mask is the same in HF (masking_utils.sliding_window_overlay: kv > q - 512)
  and llama.cpp (LLAMA_SWA_TYPE_STANDARD masks p1 - p0 >= 512).

Tokenizer: the fixture ids come from transformers' own GGUF conversion,
`AutoTokenizer.from_pretrained(models/, gguf_file=...)` -> GemmaTokenizer (BPE, byte_fallback,
fuse_unk, unk <unk>, normalizer Replace(" " -> "▁"), no prefix space, merges rebuilt from the
vocabulary in file order, space-run tokens respelled "▁▁.."; control tokens (type 3) added as
special tokens, user-defined ones (type 4: newline/tab runs, HTML tags, image markers) as added
tokens, all matched whole in the text; BOS added with add_special_tokens). It is cross-checked
against an independent SentencePiece-BPE encoder written below from Gemma's rules: special and
user-defined tokens matched whole (leftmost-longest) after spaces -> "▁", then repeatedly merge the
adjacent pair whose concatenation is a NORMAL token with the highest score (ties: leftmost), and
byte fallback (<0xXX>) for what is left outside the vocabulary. Disagreements are printed and
listed in the fixture (`tokenizer_disagreements`). Found: one, a run of 40 spaces (longer than the
longest space-run token, 31): transformers' BPE merges give 16 + 24 spaces, SentencePiece's
leftmost-longest match gives 31 + 9 (llama.cpp agrees with the latter; both decode the same).
scripts/llamacpp_second_opinion.py also shows llama.cpp splitting a LITERAL "▁" in the text into
single "▁" tokens where transformers (and SentencePiece, which escapes spaces first) treat it as a
space (llama.cpp matches its space-run tokens, spelled with real spaces, before escaping).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden  # noqa: E402  (stdlib-only at import time; its numpy code imports lazily)

ROOT = golden.ROOT
MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
FIXTURE = ROOT / "tests" / "fixtures" / "golden-gemma3.json"
GREEDY_TOKENS = 32
TOP_K = 20


def ensure_venv() -> None:
    """golden.py's bootstrap (same venv and pins), re-executing THIS script inside it."""
    if Path(sys.prefix).resolve() == golden.VENV.resolve():
        return
    python = golden.VENV / "bin" / "python"
    stamp = golden.VENV / ".golden-requirements.sha256"
    if not python.exists() or not stamp.exists() or \
            stamp.read_text().strip() != golden._sha256(golden.REQUIREMENTS):
        import subprocess  # (golden.ensure_venv itself would re-execute golden.py)
        if not python.exists():
            subprocess.check_call([sys.executable, "-m", "venv", str(golden.VENV)])
        subprocess.check_call([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "-r", str(golden.REQUIREMENTS)])
        stamp.write_text(golden._sha256(golden.REQUIREMENTS) + "\n")
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


# --------------------------------------------------------------------------------------------
# independent SentencePiece-BPE encoder (Gemma's rules), for cross-checking transformers
# --------------------------------------------------------------------------------------------

class SpmBpe:
    def __init__(self, md: dict):
        tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
        scores = md["tokenizer.ggml.scores"]
        self.tokens = tokens
        self.normal = {t: (float(s), i) for i, (t, s, ty) in enumerate(zip(tokens, scores, types)) if ty == 1}
        self.byte = {int(t[3:5], 16): i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 6}
        assert len(self.byte) == 256
        # matched whole in the (space-escaped) text: CONTROL (3) and USER_DEFINED (4) pieces; the
        # GGUF spells the user-defined space runs with real spaces, SentencePiece with "▁"
        self.whole = {t.replace(" ", "\u2581"): i for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)}
        self.max_whole = max(len(t) for t in self.whole)
        self.bos = int(md["tokenizer.ggml.bos_token_id"])
        self.add_bos = bool(md["tokenizer.ggml.add_bos_token"])
        assert not md["tokenizer.ggml.add_space_prefix"]

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        out = [self.bos] if add_special_tokens and self.add_bos else []
        text = text.replace(" ", "\u2581")
        start = i = 0
        while i < len(text):  # leftmost-longest match of whole tokens
            hit = next((n for n in range(min(self.max_whole, len(text) - i), 0, -1)
                        if text[i:i + n] in self.whole), 0)
            if hit:
                out += self._bpe(text[start:i])
                out.append(self.whole[text[i:i + hit]])
                i = start = i + hit
            else:
                i += 1
        return out + self._bpe(text[start:])

    def _bpe(self, fragment: str) -> list[int]:
        syms = list(fragment)
        while len(syms) > 1:
            best = None
            for k in range(len(syms) - 1):
                hit = self.normal.get(syms[k] + syms[k + 1])
                if hit is not None and (best is None or hit[0] > best[0]):
                    best = (hit[0], k)
            if best is None:
                break
            k = best[1]
            syms[k:k + 2] = [syms[k] + syms[k + 1]]
        ids = []
        for s in syms:
            if s in self.normal:
                ids.append(self.normal[s][1])
            else:
                ids += [self.byte[b] for b in s.encode("utf-8")]
        return ids


TOKENIZER_TEXTS = [
    ("Hello, world! This is a plain English sentence.", False),
    ("Hello, world! This is a plain English sentence.", True),
    ("  leading spaces, trailing spaces   ", False),
    ("multiple   internal    spaces\n\nand\n\n\nnewlines\r\nwith CRLF\n", False),
    ("\ttabs\tand\t\tmore tabs\t\t\t", False),
    ("Digits: 1234567890, 3.14159, 2024-01-01, x86_64, 1st 22nd 10% -42 1e-9 0x1F", False),
    ("Punctuation!!! ??? ... --- (parens) [brackets] {braces} \"quotes\" 'single' don't it's", False),
    ("def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)  # recursion\n",
     False),
    ('{"key": [1, 2, 3], "nested": {"a": null}}\n# Title\n- item *bold* `code`', False),
    ("Café naïve résumé façade Ångström Œuvre São Paulo Kraków", False),
    ("Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם नमस्ते दुनिया", False),
    ("你好，世界！日本語のテキスト、한국어 텍스트", False),
    ("Emoji: 😀👍🏽🇫🇷 ❤️ 👨‍👩‍👧 🫠", False),
    ("<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n", False),
    ("<start_of_turn>user\nHi<end_of_turn>", True),
    ("abc<bos>def <start_of_turn <end_of_turn>x<eos>", False),
    ("<table><tr><td>cell</td></tr></table> and <b>bold</b> <start_of_image>[multimodal]<end_of_image>", False),
    ("<unused0><pad><mask><unk>", False),
    ("", False),
    ("", True),
    (" ", False),
    ("\n", False),
    ("Tab\tthen  two spaces  then\n\n\n\n\nfive newlines", False),
    (" " * 40 + "forty spaces, then 33 newlines" + "\n" * 33, False),
    # byte fallback: characters without a token (NUL, control characters, NBSP, unassigned U+0378,
    # a private-use plane character, Egyptian hieroglyph, math alphanumerics, Cyrillic ꙮ, titlecase ǅ)
    ("nul\x00ctl\x04\x1b a\xa0b \u0378 \U000F0000 \U00013000 \U0001D54F ꙮ ǅ", False),
    ("\U00050000\U0010FFFD", False),
    ("Numbers in other scripts: ①②③ ½ ² ٣٤٥ ⅫⅦ १२३", False),
    ("x² + y² = z², ∑_{i=1}^{n} i = n(n+1)/2, π ≈ 3.14159, ∀x∈ℝ", False),
    ("https://example.com/path?q=1&r=2#frag user@example.org", False),
    ("antidisestablishmentarianism supercalifragilisticexpialidocious", False),
    ("literal \u2581 lower block \u2581\u2581 and e\u0301 combining accent", False),
]

# Prompts chosen so that no greedy step is a near-tie: the smallest top1-top2 logit gap over the 32
# steps (printed, and recorded as greedy_min_margin) stays far above f32 rounding.
SHORT_PROMPTS = [
    ("capital_of_france", "Question: What is the capital of France?\nAnswer:"),
    ("code_arithmetic", "def add(a, b):\n    return a + b\n\n\ndef subtract(a, b):\n"),
    ("plain_water_boils", "Water boils at 100 degrees Celsius and freezes at"),
]


def long_prompt() -> str:
    """A deterministic numbered list, longer than the 512-token sliding window. Each name always
    comes with the same city and job, so the continuation is confident (large greedy margins)."""
    names = ["Alice", "Bruno", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivan", "Jia", "Kofi"]
    cities = ["Lisbon", "Oslo", "Nairobi", "Lima", "Seoul", "Cairo", "Quebec", "Perth", "Tallinn", "Dakar", "Bergen"]
    jobs = ["baker", "pilot", "nurse", "teacher", "farmer", "painter", "chemist", "sailor", "writer", "tailor", "miner"]
    lines = ["Staff directory of the Northwind company.\n"]
    for i in range(1, 62):
        k = (7 * i) % 11
        lines.append(f"{i}. {names[k]} from {cities[(3 * k) % 11]} works as a {jobs[(5 * k) % 11]}.\n")
    return "".join(lines) + "62."


# --------------------------------------------------------------------------------------------
# numpy Gemma 3 forward pass
# --------------------------------------------------------------------------------------------

class Gemma3:
    """`window=False` turns the sliding window off (every layer full causal); `rope="interleaved"`
    uses GPT-J pairs (2i, 2i+1) and `norm_shift=1.0` adds 1 to the stored norm weights (both wrong,
    for the checks); `rope_local_base` overrides the local layers' base."""

    def __init__(self, md: dict, weights: dict, dtype, window: bool = True, rope: str = "neox",
                 norm_shift: float = 0.0, rope_local_base: float = 10000.0):
        import numpy as np

        assert md["general.architecture"] == "gemma3"
        self.np, self.dtype, self.rope_style = np, dtype, rope
        a = "gemma3."
        self.n_layer = int(md[a + "block_count"])
        self.d = int(md[a + "embedding_length"])
        self.n_head = int(md[a + "attention.head_count"])
        self.n_kv = int(md[a + "attention.head_count_kv"])
        self.hd = int(md[a + "attention.key_length"])
        assert int(md[a + "attention.value_length"]) == self.hd
        self.eps = float(md[a + "attention.layer_norm_rms_epsilon"])
        self.window = int(md[a + "attention.sliding_window"]) if window else None
        assert a + "rope.freq_base_swa" not in md and a + "final_logit_softcapping" not in md
        assert not any(k.startswith(a + "rope.scaling") for k in md)
        self.is_global = [(i + 1) % 6 == 0 for i in range(self.n_layer)]
        self.embed_scale = dtype(np.sqrt(np.float64(self.d)))
        self.scale = dtype(256 ** -0.5)  # query_pre_attn_scalar ** -0.5 (HF config; = key_length here)

        def get(name, shift=0.0):
            return (weights[name].astype(np.float64) + shift).astype(dtype) if shift else \
                weights[name].astype(dtype, copy=False)

        self.embed = get("token_embd.weight")
        assert "output.weight" not in weights  # tied
        self.out_norm = get("output_norm.weight", norm_shift)
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = {k: get(p + k + ".weight", norm_shift if k.endswith("norm") else 0.0) for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")}
            self.layers.append(L)
        half = self.hd // 2
        exps = np.arange(half, dtype=np.float64) * 2.0 / self.hd
        self.inv_freq = {True: float(md[a + "rope.freq_base"]) ** -exps, False: rope_local_base ** -exps}

    def rms(self, x, w):
        np = self.np
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.dtype(self.eps)) * w

    def rope(self, x, positions, is_global):
        np = self.np
        ang = positions[:, None].astype(np.float64) * self.inv_freq[is_global][None, :]
        cos = np.cos(ang).astype(self.dtype)[:, None, :]
        sin = np.sin(ang).astype(self.dtype)[:, None, :]
        if self.rope_style == "neox":
            x0, x1 = x[..., :self.hd // 2], x[..., self.hd // 2:]
            return np.concatenate([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x1 * cos + x0 * sin
        return out

    def gelu_tanh(self, x):
        np = self.np
        c = self.dtype(np.sqrt(2.0 / np.pi))
        return self.dtype(0.5) * x * (self.dtype(1.0) + np.tanh(c * (x + self.dtype(0.044715) * x * x * x)))

    def new_cache(self):
        return [dict(k=None, v=None) for _ in range(self.n_layer)]

    def step(self, ids, cache):
        """Feed `ids` after what `cache` holds; return the last position's logits."""
        np = self.np
        ids = np.asarray(ids, dtype=np.int64)
        past = 0 if cache[0]["k"] is None else cache[0]["k"].shape[0]
        T, hd, nh, nkv = len(ids), self.hd, self.n_head, self.n_kv
        q_pos = np.arange(past, past + T)
        k_pos = np.arange(past + T)
        causal = k_pos[None, :] > q_pos[:, None]  # True = masked
        local = causal | (k_pos[None, :] <= q_pos[:, None] - self.window) if self.window else causal
        x = self.embed[ids] * self.embed_scale
        for L, c, is_global in zip(self.layers, cache, self.is_global):
            h = self.rms(x, L["attn_norm"])
            q = self.rms((h @ L["attn_q"].T).reshape(T, nh, hd), L["attn_q_norm"])
            k = self.rms((h @ L["attn_k"].T).reshape(T, nkv, hd), L["attn_k_norm"])
            v = (h @ L["attn_v"].T).reshape(T, nkv, hd)
            q, k = self.rope(q, q_pos, is_global), self.rope(k, q_pos, is_global)
            c["k"] = k if c["k"] is None else np.concatenate([c["k"], k])
            c["v"] = v if c["v"] is None else np.concatenate([c["v"], v])
            K = np.repeat(c["k"], nh // nkv, axis=1)
            V = np.repeat(c["v"], nh // nkv, axis=1)
            s = np.einsum("thd,shd->hts", q * self.scale, K)
            s = np.where((causal if is_global else local)[None], -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", s, V).reshape(T, nh * hd)
            x = x + self.rms(attn @ L["attn_output"].T, L["post_attention_norm"])
            h = self.rms(x, L["ffn_norm"])
            m = (self.gelu_tanh(h @ L["ffn_gate"].T) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
            x = x + self.rms(m, L["post_ffw_norm"])
        return self.embed @ self.rms(x[-1], self.out_norm)

    def greedy(self, prompt_ids, n, keep_step=None):
        """(prompt logits, n greedy ids, top1-top2 margins, logits at step `keep_step`)."""
        np = self.np
        cache = self.new_cache()
        logits = self.step(prompt_ids, cache)
        first, kept, out, margins = logits, None, [], []
        for i in range(n):
            if i == keep_step:
                kept = logits
            order = np.argsort(-logits, kind="stable")[:2]
            margins.append(float(logits[order[0]] - logits[order[1]]))
            out.append(int(order[0]))
            if i + 1 < n:
                logits = self.step([out[-1]], cache)
        return first, out, margins, kept


# --------------------------------------------------------------------------------------------

def main() -> None:
    t0 = time.time()
    import gguf
    import numpy as np
    import tokenizers
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    path = golden.MODELS_DIR / MODEL_FILE
    if not path.exists():
        sys.exit(f"{path} is missing: run scripts/fetch-model.sh gemma3")
    sha = golden._sha256(path)
    if sha != MODEL_SHA256:
        sys.exit(f"{path}: sha256 {sha}, expected {MODEL_SHA256}")
    reader = gguf.GGUFReader(str(path))
    md = golden.gguf_metadata(reader)
    tokens = md["tokenizer.ggml.tokens"]

    # ---- tokenizers
    hf = golden.load_transformers_gguf_tokenizer(path)
    conv = json.loads(hf.backend_tokenizer.to_str())
    model_cfg = {k: v for k, v in conv["model"].items() if k not in ("vocab", "merges")}
    print(f"transformers GGUF conversion ({time.time() - t0:.0f}s): {type(hf).__name__}, "
          f"normalizer {json.dumps(conv['normalizer'])}, pre_tokenizer {json.dumps(conv['pre_tokenizer'])}\n"
          f"  model {json.dumps(model_cfg)}, {len(conv['model']['merges'])} merges, "
          f"{len(conv['added_tokens'])} added tokens")
    assert type(hf).__name__ == "GemmaTokenizer" and model_cfg["byte_fallback"] and conv["normalizer"] == {
        "type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    assert (hf.bos_token, hf.eos_token, hf.unk_token, hf.pad_token) == ("<bos>", "<eos>", "<unk>", "<pad>")
    spm = SpmBpe(md)

    disagreements = []

    def encode(text, special):
        ids = hf(text, add_special_tokens=special)["input_ids"]
        other = spm.encode(text, special)
        if ids != other:
            disagreements.append({"text": text, "add_special_tokens": special, "spm_rules_ids": other})
            print(f"  DISAGREE {text!r} (add_special_tokens={special})\n    transformers: {ids}\n"
                  f"      {hf.convert_ids_to_tokens(ids)}\n    SentencePiece rules: {other}\n"
                  f"      {[tokens[i] for i in other]}")
        return ids

    texts = TOKENIZER_TEXTS + [(t, False) for _, t in SHORT_PROMPTS]  # the prompts as text, too
    tokenizer_cases = [{"text": t, "add_special_tokens": s, "ids": encode(t, s)} for t, s in texts]
    for case in tokenizer_cases:  # byte fallback round-trips
        assert hf.decode(case["ids"], skip_special_tokens=False) == case["text"].replace("\u2581", " ") or \
            case["add_special_tokens"], case["text"]
    print(f"tokenizers done ({time.time() - t0:.0f}s): transformers vs SentencePiece-rules encoder: "
          f"{len(disagreements)} of {len(tokenizer_cases)} cases differ")

    # ---- weights; the checks on norm weights
    weights = golden.dequantize_all(reader)
    norms = np.concatenate([w.ravel() for n, w in weights.items() if n.endswith("norm.weight")])
    bf16 = lambda a: (a.astype(np.float32).view(np.uint32) & 0xFFFF) == 0  # noqa: E731
    print(f"dequantized {len(weights)} tensors ({time.time() - t0:.0f}s); norm weights: {norms.size} values, "
          f"bf16-exact as stored {int(bf16(norms).sum())}, bf16-exact minus 1 {int(bf16(norms - 1).sum())} "
          f"-> the GGUF stores 1 + w")
    assert bf16(norms - np.float32(1)).all() and not bf16(norms).all()

    model = Gemma3(md, weights, np.float64)
    print(f"gemma3: {model.n_layer} layers, d={model.d}, heads {model.n_head}/{model.n_kv}, head_dim {model.hd}, "
          f"eps {model.eps}, window {model.window}, global layers "
          f"{[i for i, g in enumerate(model.is_global) if g]}")

    prompts = [(n, hf(t)["input_ids"]) for n, t in SHORT_PROMPTS]
    prompts.append(("long_staff_directory", hf(long_prompt())["input_ids"]))
    assert all(ids[0] == spm.bos and ids == spm.encode(t, True) for (_, ids), t in
               zip(prompts, [t for _, t in SHORT_PROMPTS] + [long_prompt()]))
    long_ids = prompts[-1][1]
    assert 700 <= len(long_ids) <= 800, len(long_ids)

    logits_cases, firsts = [], {}
    for name, ids in prompts:
        check = name in (prompts[0][0], prompts[-1][0])  # a short prompt, and one past the window
        first, greedy, margins, kept = model.greedy(ids, GREEDY_TOKENS, keep_step=5 if check else None)
        firsts[name] = first
        if kept is not None:  # a cached step equals a full recompute
            full = model.step(ids + greedy[:5], model.new_cache())
            dev = np.abs(full - kept).max()
            print(f"  KV cache check ({name}, step 5): |cached - full recompute| max {dev:.2e}")
            assert dev < 1e-9
        order = np.argsort(-first, kind="stable")[:TOP_K]
        text = hf.decode(greedy, skip_special_tokens=False)
        print(f"{name} ({len(ids)} prompt tokens, {time.time() - t0:.0f}s): greedy {greedy}\n  -> {text!r}\n"
              f"  smallest top1-top2 gap {min(margins):.4f} (step {int(np.argmin(margins))})")
        logits_cases.append({
            "name": name,
            "prompt_ids": [int(i) for i in ids],
            "top20": [[int(i), round(float(first[i]), 6)] for i in order],
            "greedy": greedy,
            "greedy_text": text,
            "greedy_min_margin": round(min(margins), 4),
        })
    assert "Paris" in logits_cases[0]["greedy_text"], logits_cases[0]["greedy_text"]

    # ---- cross-checks
    f32 = Gemma3(md, weights, np.float32)
    for case in logits_cases:
        a = firsts[case["name"]]
        b, g32, _, _ = f32.greedy(case["prompt_ids"], GREEDY_TOKENS)
        top = [i for i, _ in case["top20"]]
        print(f"  {case['name']}: |f64 - f32| max {np.abs(a - b).max():.2e} (top20 {np.abs(a - b)[top].max():.2e}); "
              f"f32 greedy identical: {g32 == case['greedy']}")

    def compare(label, other, ids, ref):
        top = np.argsort(-ref, kind="stable")[:TOP_K]
        otop = np.argsort(-other, kind="stable")[:TOP_K]
        diff = float(np.abs(other - ref)[top].max())
        common = len(set(top.tolist()) & set(otop.tolist()))
        print(f"  {label}: top20 max |diff| {diff:.4f}, top20 ids in common {common}/20, argmax "
              f"{int(otop[0])} ({tokens[int(otop[0])]!r}) vs {int(top[0])} ({tokens[int(top[0])]!r})")
        return otop, diff, common

    fr = prompts[0][1]
    for label, m in [("interleaved (GPT-J) RoPE pairs", Gemma3(md, weights, np.float64, rope="interleaved")),
                     ("norm weights + 1 (as if zero-centred)", Gemma3(md, weights, np.float64, norm_shift=1.0)),
                     ("local RoPE base 1e6 instead of 1e4",
                      Gemma3(md, weights, np.float64, rope_local_base=1e6))]:
        compare(f"capital_of_france, {label}", m.step(fr, m.new_cache()), fr, firsts["capital_of_france"])
    nowin = Gemma3(md, weights, np.float64, window=False)
    ref = firsts["long_staff_directory"]
    nw = nowin.step(long_ids, nowin.new_cache())
    otop, diff, common = compare(f"long_staff_directory ({len(long_ids)} tokens) WITHOUT the sliding window",
                                 nw, long_ids, ref)
    short_same = np.abs(nowin.step(fr, nowin.new_cache()) - firsts["capital_of_france"]).max()
    print(f"  (without the window, a prompt shorter than 512 is unchanged: max |diff| {short_same:.1e})")
    assert short_same < 1e-9 and diff > 1e-3

    fixture = {
        "model_file": MODEL_FILE,
        "model_sha256": MODEL_SHA256,
        "generator": "scripts/golden_gemma3.py",
        "versions": {
            "python": ".".join(map(str, sys.version_info[:3])),
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf": golden._dist_version("gguf"),
            "numpy": np.__version__,
        },
        "tokenizer_pipeline": "transformers AutoTokenizer.from_pretrained(gguf_file) -> GemmaTokenizer "
                              "(BPE byte_fallback, Replace(' ', '\u2581'), no prefix space, control and "
                              "user-defined tokens matched whole); cross-checked against SentencePiece-BPE "
                              "rules (score-ordered merges) in scripts/golden_gemma3.py",
        "tokenizer_cases": tokenizer_cases,
        "tokenizer_disagreements": disagreements,
        "architecture": {
            "norm_weights_stored_with_plus_one": True, "qk_rows_permuted": False, "rope_style": "neox",
            "rope_base_global": float(md["gemma3.rope.freq_base"]), "rope_base_local": 10000.0,
            "sliding_window": model.window, "global_layers": [i for i, g in enumerate(model.is_global) if g],
            "embed_scale": float(np.sqrt(640.0)), "attention_scale": 1 / 16, "final_logit_softcap": None,
        },
        "logits_cases": logits_cases,
        "sliding_window_check": {
            "case": "long_staff_directory",
            "top20_without_window": [[int(i), round(float(nw[i]), 6)] for i in otop],
            "top20_max_abs_diff": round(diff, 6),
            "top20_ids_in_common": common,
        },
    }
    golden.FIXTURE = FIXTURE  # golden.write_fixture writes to its module-level FIXTURE
    golden.write_fixture(fixture)
    print(f"wrote {FIXTURE.relative_to(ROOT)} ({FIXTURE.stat().st_size} bytes) in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    ensure_venv()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "2")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
