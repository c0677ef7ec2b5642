#!/usr/bin/env python3
"""Golden-reference generator for Pagoda: writes tests/fixtures/golden.json.

Usage:  python3 scripts/golden.py
(Python 3.10+. It creates .venv-golden/ at the repository root from the pinned
scripts/golden-requirements.txt on first use, re-executes itself inside it, and rewrites the
fixture. Re-running is idempotent: the same model and pins give a byte-identical fixture.)

What it computes, from the real model models/SmolLM2-135M-Instruct.Q4_1.gguf
(scripts/fetch-model.sh fetches it; its sha256 is checked):

* tokenizer_cases: token ids of fixed texts (spaces, newlines, tabs, digits, punctuation, code,
  accented Latin, CJK, emoji, control tokens, the empty string, and text whose UTF-8 bytes include
  some of the 21 byte values that have no byte-level token in SmolLM2's vocabulary -- Hugging Face
  drops those bytes silently, and the fixture records exactly what it does).
* chat_cases: prompts rendered with the GGUF's own `tokenizer.chat_template` through
  transformers' `apply_chat_template` (jinja2), and their ids (encoded without special-token
  post-processing; the control tokens in the text are matched atomically).
* logits_cases: for three prompts, the last-position logits (top 20, by logit, descending) of a
  numpy forward pass and a 32-token greedy continuation (argmax each step, no stop at EOS).
* pooling_cases: for the same three prompts, the final-normed hidden states pooled as a decoder's
  embeddings are (`--pooling last` and `mean`), L2-normalized.
* prompt_logprobs_cases: for the same three prompts, at every position but the last, the logprob
  of the next prompt token and the 5 most likely tokens with theirs (`prompt_logprobs`).
* missing_byte_tokens: the byte values 0..255 whose byte-level symbol is not in the vocabulary.

Why it is independent of Pagoda (Rust, candle):

* Tokenization and chat templates come from Hugging Face `tokenizers`/`transformers` (the
  Rust `tokenizers` crate is not involved; Pagoda has its own tokenizer and template code).
* The forward pass is a plain numpy Llama written here from the architecture's definition, over
  weights that the `gguf` PyPI package (llama.cpp's own gguf-py) reads and dequantizes to f32.
  The Llama hyper-parameters come from the GGUF metadata (`llama.*`). Activations are float64
  (weights are the exact f32 dequantized values), so the reference carries less rounding error
  than any f32 implementation; the script also runs an f32 pass and an un-permuted
  (Hugging Face "rotate-half") RoPE pass as cross-checks and prints their deviations.

Tokenizer: which pipeline, and why
  `transformers.AutoTokenizer.from_pretrained(models_dir, gguf_file=...)` is loaded and checked,
  but it is NOT the reference. transformers (5.23) converts a `tokenizer.ggml.model == "gpt2"`
  vocabulary to a GPT-2 tokenizer: pre-tokenizer ByteLevel(use_regex=True) only. It has no split
  regex for `tokenizer.ggml.pre == "smollm"`, so the Digits step is lost. SmolLM2's real
  tokenizer.json has Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false,
  trim_offsets=true, use_regex=true)], no normalizer, BPE with unk_token=null, fuse_unk=false,
  byte_fallback=false, ignore_merges=false, a ByteLevel post-processor (adds no token) and the 17
  control tokens (ids 0..16) as special added tokens. For ASCII digits both pipelines agree
  (the vocabulary has no multi-digit or space+digit token), but they differ on other numeric
  characters: GPT-2's ` ?\\p{N}+` keeps a run of them, with the space before it, in one pre-token,
  so e.g. "x ①②③", " ½", " ٣٤٥", "¹²³ ⁴", "Ⅰ Ⅱ Ⅲ" get different ids (the script prints them). Other
  differences of the conversion change no id: its BPE has continuing_subword_prefix and
  end_of_word_suffix "" (real: null) and an empty TemplateProcessing post-processor (real:
  ByteLevel(trim_offsets=false)); vocab, merges, control tokens, bos/eos/unk/pad and the chat
  template are identical (the script asserts it). So the
  reference tokenizer is built here with `tokenizers` from the GGUF metadata (tokens, merges,
  token types) with the real SmolLM2 pipeline, wrapped in transformers' PreTrainedTokenizerFast
  (for apply_chat_template). The script prints every case where the two disagree.

  transformers 5.23 needs torch to read GGUF metadata only through an import: its
  `integrations.gguf.reader` imports torch at module level (for tensor loading), and the legacy
  metadata path checks `is_torch_available()`. This script provides a torch-free
  `read_gguf_metadata` built on the `gguf` package (same return shape) and lifts that check
  while loading the tokenizer (no tensor is read there); everything else is transformers' code.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-golden"
REQUIREMENTS = ROOT / "scripts" / "golden-requirements.txt"
MODELS_DIR = ROOT / "models"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FIXTURE = ROOT / "tests" / "fixtures" / "golden.json"
GREEDY_TOKENS = 32
TOP_K = 20
PROMPT_TOP_K = 5


# --------------------------------------------------------------------------------------------
# venv bootstrap
# --------------------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_venv(script: Path | None = None) -> None:
    """Create/refresh .venv-golden from the pinned requirements, then re-exec `script` (this
    file by default) inside it."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if sys.version_info < (3, 10):
        sys.exit("scripts/golden.py needs Python 3.10+ (3.11 is what the pins were verified with)")
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV.relative_to(ROOT)}", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    stamp = VENV / ".golden-requirements.sha256"
    wanted = _sha256(REQUIREMENTS)
    if not stamp.exists() or stamp.read_text().strip() != wanted:
        print(f"installing {REQUIREMENTS.relative_to(ROOT)} into {VENV.relative_to(ROOT)}", file=sys.stderr)
        subprocess.check_call([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "-r", str(REQUIREMENTS)])
        stamp.write_text(wanted + "\n")
    script = (script or Path(__file__)).resolve()
    os.execv(str(python), [str(python), str(script), *sys.argv[1:]])


# --------------------------------------------------------------------------------------------
# GGUF metadata and the tokenizers
# --------------------------------------------------------------------------------------------

def gguf_metadata(reader) -> dict:
    """All metadata keys of a GGUFReader as plain Python values (arrays as lists)."""
    import gguf

    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            value = list(value)
        out[key] = value
    return out


def load_transformers_gguf_tokenizer(gguf_path: Path):
    """transformers' own GGUF tokenizer conversion, loaded through AutoTokenizer without torch."""
    import types

    import gguf

    def read_gguf_metadata(path, string_arrays=()):
        # Same contract as transformers.integrations.gguf.reader.read_gguf_metadata: scalars as
        # values, numeric arrays as lists, string arrays in full only when asked (else a count).
        reader = gguf.GGUFReader(path)
        metadata = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
                if field.types[-1] == gguf.GGUFValueType.STRING and key not in string_arrays:
                    metadata[key] = len(field.data)
                else:
                    metadata[key] = list(field.contents())
            else:
                metadata[key] = field.contents()
        return metadata, tuple(t.name for t in reader.tensors)

    shim = types.ModuleType("transformers.integrations.gguf.reader")
    shim.read_gguf_metadata = read_gguf_metadata
    sys.modules["transformers.integrations.gguf.reader"] = shim

    import transformers.modeling_gguf_pytorch_utils as legacy
    from transformers import AutoTokenizer

    saved = legacy.is_torch_available
    legacy.is_torch_available = lambda: True  # metadata only (return_tensors=False): no torch used
    try:
        return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    finally:
        legacy.is_torch_available = saved


SMOLLM2_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}


def build_reference_tokenizer(md: dict):
    """SmolLM2's tokenizer.json pipeline, built from the GGUF vocabulary and merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    assert md["tokenizer.ggml.model"] == "gpt2", md["tokenizer.ggml.model"]
    assert md["tokenizer.ggml.pre"] == "smollm", md["tokenizer.ggml.pre"]
    tokens = md["tokenizer.ggml.tokens"]
    token_types = md["tokenizer.ggml.token_type"]
    vocab = {token: index for index, token in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens in the GGUF vocabulary"
    merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
    assert all(len(m) == 2 for m in merges)

    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False,
                     ignore_merges=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    control = [t for t, ty in zip(tokens, token_types) if ty == 3]  # 3 = CONTROL
    assert control == tokens[:len(control)], "control tokens are expected to be the first ids"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                                       single_word=False) for t in control])

    def name(key):
        return tokens[md[key]] if key in md else None

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=name("tokenizer.ggml.bos_token_id"),
        eos_token=name("tokenizer.ggml.eos_token_id"),
        unk_token=name("tokenizer.ggml.unknown_token_id"),
        pad_token=name("tokenizer.ggml.padding_token_id"),
        chat_template=md["tokenizer.chat_template"],
        clean_up_tokenization_spaces=False,
    )
    backend = json.loads(wrapped.backend_tokenizer.to_str())
    assert backend["pre_tokenizer"] == SMOLLM2_PRE_TOKENIZER, backend["pre_tokenizer"]
    assert backend["normalizer"] is None
    model_cfg = {k: v for k, v in backend["model"].items() if k not in ("vocab", "merges")}
    assert model_cfg == {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                         "ignore_merges": False}, model_cfg
    return wrapped


def missing_byte_tokens(tokens: list[str]) -> list[int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    present = set(tokens)
    return [b for b, ch in sorted(bytes_to_unicode().items()) if ch not in present]


# --------------------------------------------------------------------------------------------
# numpy Llama forward pass
# --------------------------------------------------------------------------------------------

class Llama:
    """Llama over the dequantized GGUF weights, as stored (Q/K rows in llama.cpp's rotary order:
    pairs of ADJACENT dims (2i, 2i+1) rotate together). With `hf_rope=True` the Q/K rows are
    un-permuted to Hugging Face's order and rotate-half RoPE (pairs (i, i + d/2)) is used instead;
    both must give the same logits."""

    def __init__(self, reader, md: dict, dtype, hf_rope: bool = False, weights=None):
        import numpy as np

        arch = md["general.architecture"]
        assert arch == "llama", arch
        self.np = np
        self.dtype = dtype
        self.n_layer = int(md["llama.block_count"])
        self.d_model = int(md["llama.embedding_length"])
        self.d_ff = int(md["llama.feed_forward_length"])
        self.n_head = int(md["llama.attention.head_count"])
        self.n_kv = int(md["llama.attention.head_count_kv"])
        self.base = float(md["llama.rope.freq_base"])
        self.eps = float(md["llama.attention.layer_norm_rms_epsilon"])
        self.ctx = int(md["llama.context_length"])
        self.head_dim = self.d_model // self.n_head
        self.rope_dim = int(md.get("llama.rope.dimension_count", self.head_dim))
        assert self.rope_dim == self.head_dim
        self.hf_rope = hf_rope
        w = weights if weights is not None else dequantize_all(reader)
        self.raw = w

        def get(name):
            return w[name].astype(dtype, copy=False)

        self.embed = get("token_embd.weight")                      # (vocab, d)
        self.lm_head = get("output.weight") if "output.weight" in w else self.embed  # tied
        self.out_norm = get("output_norm.weight")
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            wq, wk = get(p + "attn_q.weight"), get(p + "attn_k.weight")
            if hf_rope:
                wq, wk = self.unpermute(wq, self.n_head), self.unpermute(wk, self.n_kv)
            self.layers.append(dict(
                attn_norm=get(p + "attn_norm.weight"), wq=wq, wk=wk, wv=get(p + "attn_v.weight"),
                wo=get(p + "attn_output.weight"), ffn_norm=get(p + "ffn_norm.weight"),
                wg=get(p + "ffn_gate.weight"), wu=get(p + "ffn_up.weight"), wd=get(p + "ffn_down.weight"),
            ))
        half = self.head_dim // 2
        self.inv_freq = self.base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)

    def unpermute(self, w, n_head):
        # llama.cpp's convert_hf_to_gguf stores permute(w) = w.reshape(n, 2, hd/2, in).swapaxes(1, 2)
        return w.reshape(n_head, self.head_dim // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)

    def rms_norm(self, x, weight):
        np = self.np
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.dtype(self.eps)) * weight

    def rope(self, x, positions):
        """x: (T, heads, head_dim)."""
        np = self.np
        angles = positions[:, None].astype(np.float64) * self.inv_freq[None, :]  # (T, hd/2)
        cos = np.cos(angles).astype(self.dtype)[:, None, :]
        sin = np.sin(angles).astype(self.dtype)[:, None, :]
        half = self.head_dim // 2
        if self.hf_rope:
            x0, x1 = x[..., :half], x[..., half:]
            return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def new_cache(self):
        return [dict(k=None, v=None) for _ in range(self.n_layer)]

    def step(self, ids, cache):
        """Feed `ids` (new tokens) after what `cache` holds; return the last position's logits."""
        np = self.np
        ids = np.asarray(ids, dtype=np.int64)
        past = 0 if cache[0]["k"] is None else cache[0]["k"].shape[0]
        T = len(ids)
        positions = np.arange(past, past + T)
        assert past + T <= self.ctx
        hd, nh, nkv = self.head_dim, self.n_head, self.n_kv
        group = nh // nkv
        x = self.embed[ids]
        scale = self.dtype(1.0 / np.sqrt(hd))
        # causal mask over (query t at position past+t) x (key s at position s)
        mask = np.arange(past + T)[None, :] > positions[:, None]
        for layer, c in zip(self.layers, cache):
            h = self.rms_norm(x, layer["attn_norm"])
            q = (h @ layer["wq"].T).reshape(T, nh, hd)
            k = (h @ layer["wk"].T).reshape(T, nkv, hd)
            v = (h @ layer["wv"].T).reshape(T, nkv, hd)
            q, k = self.rope(q, positions), self.rope(k, positions)
            c["k"] = k if c["k"] is None else np.concatenate([c["k"], k])
            c["v"] = v if c["v"] is None else np.concatenate([c["v"], v])
            K = np.repeat(c["k"], group, axis=1)  # q head j uses kv head j // group
            V = np.repeat(c["v"], group, axis=1)
            scores = np.einsum("thd,shd->hts", q, K) * scale
            scores = np.where(mask[None], -np.inf, scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", probs, V).reshape(T, nh * hd)
            x = x + attn @ layer["wo"].T
            h = self.rms_norm(x, layer["ffn_norm"])
            gate = h @ layer["wg"].T
            up = h @ layer["wu"].T
            x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ layer["wd"].T
        # The final-normed hidden states of this call's tokens, which embeddings pool.
        self.last_hidden = self.rms_norm(x, self.out_norm)
        return self.last_hidden[-1] @ self.lm_head.T

    def greedy(self, prompt_ids, n):
        """(logits after the prompt, n greedy tokens, the top1-top2 margin of each greedy step)."""
        np = self.np
        cache = self.new_cache()
        logits = self.step(prompt_ids, cache)
        first = logits.copy()
        out, margins = [], []
        for i in range(n):
            order = np.argsort(-logits, kind="stable")
            margins.append(float(logits[order[0]] - logits[order[1]]))
            out.append(int(order[0]))
            if i + 1 < n:
                logits = self.step([out[-1]], cache)
        return first, out, margins


def dequantize_all(reader) -> dict:
    import gguf
    import numpy as np

    weights = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF ne is fastest-first
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        weights[t.name] = arr
    return weights


# --------------------------------------------------------------------------------------------
# the cases
# --------------------------------------------------------------------------------------------

TOKENIZER_TEXTS = [
    ("Hello, world! This is a plain English sentence.", False),
    ("Hello, world! This is a plain English sentence.", True),
    ("  leading spaces, trailing spaces   ", False),
    ("multiple   internal    spaces\n\nand\n\n\nnewlines\r\nwith CRLF\n", False),
    ("\ttabs\tand\t\tmore tabs\t", False),
    ("Digits: 1234567890, 3.14159, 2024-01-01, x86_64, 1st 22nd 10%", False),
    ("Punctuation!!! ??? ... --- (parens) [brackets] {braces} \"quotes\" 'single' don't it's", False),
    ("def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)  # recursion\n",
     False),
    ("Café naïve résumé façade Ångström Œuvre São Paulo Kraków", False),
    ("你好，世界！日本語のテキスト、한국어 텍스트", False),
    ("Emoji: 😀👍🏽🇫🇷 ❤️ 👨‍👩‍👧", False),
    ("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n", False),
    ("<|im_start|>user\nHi<|im_end|>", True),
    ("abc<|endoftext|>def <|im_start <|im_end|>x", False),
    ("", False),
    ("Numbers in other scripts: ①②③ ½ ² ٣٤٥ ⅫⅦ", False),
    # bytes the vocabulary lacks: control characters 0x04 0x06 0x13 0x14 0x16 0x1D
    ("ctrl\x04a\x06b\x13c\x14d\x16e\x1df", False),
    ("\x04\x06\x13\x14\x16\x1d", False),
    # lead bytes 0xF1 / 0xF2 of 4-byte UTF-8 (U+40000..U+BFFFF): the lead byte is missing
    ("x\U00050000y \U0009abcd z \U0001F600", False),
    ("\x1bESC is fine, \x04 is not", False),
]

CHAT_CASES = [
    ([{"role": "system", "content": "You are a concise assistant."},
      {"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Hi! What's 2+2?"},
      {"role": "assistant", "content": "2 + 2 = 4."},
      {"role": "user", "content": "And times 3?"}], True),
    ([{"role": "user", "content": "Tell me a joke."},
      {"role": "assistant", "content": "Why did the chicken cross the road? To get to the other side!"}], False),
]

# Prompts chosen so that no greedy step is a near-tie (see the margins the script prints): the
# smallest top1-top2 gap over the 32 steps stays far above f32 rounding (~1e-4).
PLAIN_PROMPT = "The quick brown fox jumps over the lazy"

LONG_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "developed a system of movable metal type in Mainz. Before his invention, books were copied by "
    "hand, a slow and expensive process that limited the spread of knowledge. The press made it "
    "possible to produce hundreds of identical copies quickly, and within a few decades printing "
    "shops had opened in cities across Europe. Historians often argue that this change helped to "
    "spark the Renaissance, the Reformation, and the scientific revolution, because"
)


def main() -> None:
    t0 = time.time()
    import gguf
    import jinja2
    import numpy as np
    import tokenizers
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    gguf_path = MODELS_DIR / MODEL_FILE
    if not gguf_path.exists():
        sys.exit(f"{gguf_path} is missing: run scripts/fetch-model.sh")
    sha = _sha256(gguf_path)
    if sha != MODEL_SHA256:
        sys.exit(f"{gguf_path}: sha256 {sha}, expected {MODEL_SHA256}")

    reader = gguf.GGUFReader(str(gguf_path))
    md = gguf_metadata(reader)

    # ---- tokenizers
    ref = build_reference_tokenizer(md)
    hf_gguf = load_transformers_gguf_tokenizer(gguf_path)
    conv = json.loads(hf_gguf.backend_tokenizer.to_str())
    print(f"transformers GGUF conversion: {type(hf_gguf).__name__}, pre_tokenizer {json.dumps(conv['pre_tokenizer'])}")
    if conv["pre_tokenizer"] != SMOLLM2_PRE_TOKENIZER:
        print("  differs from SmolLM2's tokenizer.json pre_tokenizer "
              f"{json.dumps(SMOLLM2_PRE_TOKENIZER)} -> the reference is built from the GGUF metadata")
    ref_json = json.loads(ref.backend_tokenizer.to_str())
    assert conv["model"]["vocab"] == ref_json["model"]["vocab"], "vocab differs from transformers' conversion"
    assert conv["model"]["merges"] == ref_json["model"]["merges"], "merges differ from transformers' conversion"
    assert hf_gguf.chat_template == ref.chat_template
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(hf_gguf, attr) == getattr(ref, attr), (attr, getattr(hf_gguf, attr), getattr(ref, attr))

    tokens = md["tokenizer.ggml.tokens"]
    missing = missing_byte_tokens(tokens)
    print(f"missing byte tokens ({len(missing)}): {missing}")

    discrepancies = []

    def encode(text, add_special_tokens):
        ids = ref(text, add_special_tokens=add_special_tokens)["input_ids"]
        other = hf_gguf(text, add_special_tokens=add_special_tokens)["input_ids"]
        if ids != other:
            discrepancies.append((text, ids, other))
        return ids

    tokenizer_cases = []
    for text, special in TOKENIZER_TEXTS:
        tokenizer_cases.append({"text": text, "add_special_tokens": special, "ids": encode(text, special)})
    # the bytes HF drops: decoding the ids gives the text without them
    for case in tokenizer_cases:
        raw = case["text"].encode("utf-8")
        if any(b in missing for b in raw):
            kept = bytes(b for b in raw if b not in missing).decode("utf-8", "replace")
            decoded = ref.decode(case["ids"], skip_special_tokens=False)
            print(f"  {case['text']!r}: decode == text less its missing bytes: {decoded == kept}")

    chat_cases = []
    for messages, gen in CHAT_CASES:
        rendered = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        other = hf_gguf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert rendered == other
        chat_cases.append({"messages": messages, "add_generation_prompt": gen, "rendered": rendered,
                           "ids": encode(rendered, False)})
    assert "You are a helpful AI assistant named SmolLM" in chat_cases[1]["rendered"], "default system prompt"

    # a wider sweep for pipeline differences (not written to the fixture)
    for text in ["a1b2 c33 4444", " 12 345", "¹²³ ⁴", "٠١٢٣", "१२३", "一二三", "Ⅰ Ⅱ Ⅲ", "①②③④", "⑴⑵", "𝟙𝟚",
                 "½¼¾", "x²+y²=z²", "10,000.00", "v1.2.3-rc4"]:
        encode(text, False)

    print(f"tokenizers done ({time.time() - t0:.1f}s); reference vs transformers' GGUF conversion: "
          f"{len(discrepancies)} differing text(s)")
    for text, ids, other in discrepancies:
        print(f"  {text!r}\n    reference (Digits+ByteLevel): {ids}\n    transformers GGUF conversion: {other}")

    # ---- forward pass
    weights = dequantize_all(reader)
    print(f"dequantized {len(weights)} tensors ({time.time() - t0:.1f}s); "
          f"tied lm head: {'output.weight' not in weights}")
    model = Llama(reader, md, np.float64, weights=weights)
    print(f"llama: {model.n_layer} layers, d={model.d_model}, ff={model.d_ff}, heads={model.n_head}/{model.n_kv}, "
          f"head_dim={model.head_dim}, rope base={model.base}, eps={model.eps}, ctx={model.ctx}")

    france = ref.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    prompts = [
        ("chat_capital_of_france", ref(france, add_special_tokens=False)["input_ids"]),
        ("plain_quick_brown_fox", ref(PLAIN_PROMPT, add_special_tokens=False)["input_ids"]),
        ("long_printing_press", ref(LONG_PROMPT, add_special_tokens=False)["input_ids"]),
    ]
    logits_cases = []
    pooling_cases = []
    prompt_logprobs_cases = []
    firsts = {}
    for name, ids in prompts:
        model.step(ids, model.new_cache())
        hidden = model.last_hidden
        logits = hidden @ model.lm_head.T
        logprobs = logits - (np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
                             + logits.max(-1, keepdims=True))
        scored = []
        for p in range(len(ids) - 1):
            order = np.argsort(-logprobs[p], kind="stable")[:PROMPT_TOP_K]
            scored.append([round(float(logprobs[p][ids[p + 1]]), 6),
                           [[int(i), round(float(logprobs[p][i]), 6)] for i in order]])
        prompt_logprobs_cases.append({"name": name, "prompt_ids": [int(i) for i in ids], "logprobs": scored})
        pooled = {"last": hidden[-1], "mean": hidden.mean(axis=0)}
        pooling_cases.append({"name": name, "prompt_ids": [int(i) for i in ids],
                              **{kind: [round(float(v), 7) for v in vec / np.linalg.norm(vec)]
                                 for kind, vec in pooled.items()}})
        first, greedy, margins = model.greedy(ids, GREEDY_TOKENS)
        firsts[name] = first
        order = np.argsort(-first, kind="stable")[:TOP_K]
        text = ref.decode(greedy, skip_special_tokens=False)
        print(f"{name} ({len(ids)} prompt tokens): greedy {greedy}\n  -> {text!r}\n"
              f"  smallest top1-top2 logit gap: first 16 steps {min(margins[:16]):.4f}, "
              f"all {len(margins)} steps {min(margins):.4f} (step {int(np.argmin(margins))})")
        logits_cases.append({
            "name": name,
            "prompt_ids": [int(i) for i in ids],
            "top20": [[int(i), round(float(first[i]), 6)] for i in order],
            "greedy": greedy,
            "greedy_text": text,
            "greedy_min_margin": round(min(margins), 4),
        })
    france_text = logits_cases[0]["greedy_text"]
    assert "Paris" in france_text, f"the France prompt does not answer Paris: {france_text!r}"
    print(f"forward passes done ({time.time() - t0:.1f}s)")

    # ---- cross-checks: HF rotate-half RoPE on un-permuted Q/K, and a pure f32 pass
    hf_model = Llama(reader, md, np.float64, hf_rope=True, weights=weights)
    f32_model = Llama(reader, md, np.float32, weights=weights)
    for name, ids in prompts:
        a = firsts[name]
        b = hf_model.step(ids, hf_model.new_cache())
        c, g32, _ = f32_model.greedy(ids, GREEDY_TOKENS)
        top = np.argsort(-a)[:TOP_K]
        same = g32 == next(case["greedy"] for case in logits_cases if case["name"] == name)
        print(f"  {name}: |interleaved - rotate_half| max {np.abs(a - b).max():.2e}; "
              f"|f64 - f32| max {np.abs(a - c).max():.2e} (top20 {np.abs(a - c)[top].max():.2e}); "
              f"f32 greedy identical: {same}")
        assert np.abs(a - b).max() < 1e-6, "the two RoPE conventions disagree"

    fixture = {
        "model_file": MODEL_FILE,
        "model_sha256": MODEL_SHA256,
        "generator": "scripts/golden.py",
        "versions": {
            "python": ".".join(map(str, sys.version_info[:3])),
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf": _dist_version("gguf"),
            "numpy": np.__version__,
            "jinja2": jinja2.__version__,
        },
        "tokenizer_cases": tokenizer_cases,
        "chat_cases": chat_cases,
        "logits_cases": logits_cases,
        "pooling_cases": pooling_cases,
        "prompt_logprobs_cases": prompt_logprobs_cases,
        "missing_byte_tokens": missing,
    }
    write_fixture(fixture)
    print(f"wrote {FIXTURE.relative_to(ROOT)} ({FIXTURE.stat().st_size} bytes) in {time.time() - t0:.1f}s")


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def write_fixture(fixture: dict) -> None:
    """JSON with one line per case (readable diffs), ASCII-escaped so invisible characters show."""
    def dump(value):
        return json.dumps(value, ensure_ascii=True)

    lines = ["{"]
    items = list(fixture.items())
    for n, (key, value) in enumerate(items):
        comma = "," if n + 1 < len(items) else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"  {dump(key)}: [")
            for m, case in enumerate(value):
                lines.append(f"    {dump(case)}{',' if m + 1 < len(value) else ''}")
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {dump(key)}: {dump(value)}{comma}")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == json.loads(json.dumps(fixture))
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    tmp = FIXTURE.with_suffix(".json.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, FIXTURE)


if __name__ == "__main__":
    ensure_venv()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "2")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner
    main()
