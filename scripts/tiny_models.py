#!/usr/bin/env python3
"""Tiny random-weight checkpoints and Hugging Face reference outputs: tests/fixtures/tiny/.

Usage:  python3 scripts/tiny_models.py [--only NAME ...] [--check-llamacpp]
(Python 3.10+. It creates .venv-tiny/ at the repository root from the pinned
scripts/tiny-requirements.txt on first use -- `pip install --no-deps`, see that file for why --
re-executes itself inside it and rewrites tests/fixtures/tiny/<name>/ for every model. CPU only.
Re-running is idempotent: the same pins give byte-identical files.)

For each architecture (MODELS below: llama, qwen2, qwen3, qwen3_moe, mixtral, phi3, gemma2, mistral,
gemma3_text) it writes, under tests/fixtures/tiny/<name>/:

* config.json, model.safetensors: transformers' own `save_pretrained` (safetensors, float32) of
  a tiny model whose weights are drawn from a fixed seed. config.json is transformers' output
  with sorted keys plus the pre-5.0 keys (`rope_theta`, `rope_scaling`, `rope_local_base_freq`,
  `partial_rotary_factor`) that transformers 5 folds into `rope_parameters` -- Hub checkpoints
  carry those, and loaders that predate transformers 5 read only them. The script reloads the
  directory and asserts that transformers reads back the same model (identical logits).
* tokenizer.json, tokenizer_config.json: a 512-token byte-level BPE (256 byte symbols, 254
  merges, `<|bos|>` = 510, `<|eos|>` = 511), so the directory is a complete HF model.
* reference.json: logits at every position of each prompt from one forward pass of the float64
  model, a 16-token greedy continuation (no EOS stop) and diagnostics (see README.md there).
* model.gguf (every model; Mistral and Mixtral as llama.cpp's `llama`; see tiny_models_gguf.py):
  the same weights in F32 with llama.cpp's names, metadata and tensor conventions, and the same
  vocabulary.

Precision of the reference: transformers keeps RMSNorm, the attention softmax, the MoE router
softmax and the RoPE tables in float32 even in a float64 model (`.float()`, `.to(torch.float32)`,
`softmax(..., dtype=torch.float32)`). The reference is computed with those conversions mapped to
float64 as well (`float64_everywhere` below; RoPE buffers rebuilt under it), i.e. transformers'
code run entirely in double precision; the plain `.double()` model's deviation from it is
recorded in the diagnostics.

--check-llamacpp (no fixture is written): runs llama.cpp's own convert_hf_to_gguf.py on each
model directory and compares its tensors and metadata with model.gguf, and asks llama-server
for greedy continuations of the prompts (tiny_models_llamacpp.py).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-tiny"
REQUIREMENTS = ROOT / "scripts" / "tiny-requirements.txt"
OUT = ROOT / "tests" / "fixtures" / "tiny"
GREEDY_TOKENS = 16
PROMPT_LENGTHS = {"long": 40, "short": 12, "tiny": 3}

# --------------------------------------------------------------------------------------------
# venv bootstrap (as scripts/golden.py, but `--no-deps`: the file pins everything, see there)
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_venv(script: Path = Path(__file__)) -> None:
    """Create/refresh .venv-tiny from the pinned requirements, then re-exec `script` inside it."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if sys.version_info < (3, 10):
        sys.exit("scripts/tiny_models.py needs Python 3.10+ (3.11 is what the pins were verified with)")
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV.relative_to(ROOT)}", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    stamp = VENV / ".tiny-requirements.sha256"
    wanted = _sha256(REQUIREMENTS)
    if not stamp.exists() or stamp.read_text().strip() != wanted:
        print(f"installing {REQUIREMENTS.relative_to(ROOT)} into {VENV.relative_to(ROOT)} (~2.4 GB download)",
              file=sys.stderr)
        subprocess.check_call([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "--no-deps", "-r", str(REQUIREMENTS)])
        stamp.write_text(wanted + "\n")
    os.execv(str(python), [str(python), str(script.resolve()), *sys.argv[1:]])


# --------------------------------------------------------------------------------------------
# The models
# --------------------------------------------------------------------------------------------

BOS, EOS = 510, 511
COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
              bos_token_id=BOS, eos_token_id=EOS, pad_token_id=None)
LONGROPE_SHORT = [1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.6, 2.0]
LONGROPE_LONG = [1.0, 1.3, 1.9, 2.9, 4.5, 7.0, 11.0, 16.0]


def _set(**values):
    """An ablation: config attributes to override."""
    return lambda cfg: [setattr(cfg, k, v) for k, v in values.items()]


def _local_rope_theta(theta):
    def apply(cfg):
        cfg.rope_parameters["sliding_attention"]["rope_theta"] = theta
    return apply


def _no_longrope(cfg):
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_parameters["rope_theta"]}


# Per model: `config` (HF config kwargs over COMMON), `legacy` (pre-5.0 keys added to config.json),
# `init` (std of the weights by parameter-name substring, first match; `*` is the default; norm
# weights are 1 + N(0, norm_std), or N(0, norm_std) for Gemma's (1 + w) norms, plus `norm_base` by
# name substring: with tied embeddings, larger sublayer outputs keep the residual stream from being
# dominated by the token's own embedding, which makes a model predict its input token), `gguf` (llama.cpp
# architecture or None) and `ablations` (config changes whose effect on the long prompt's logits
# is recorded, to show that the feature is live).
MODELS: dict[str, dict] = {
    "llama": dict(
        seed=4, gguf="llama",
        config=dict(model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False),
        legacy=dict(rope_theta=10000.0),
        init={"embed_tokens": 1.0, "lm_head": 0.4, "*": 0.15}, norm_std=0.2, ablations={}),
    "qwen3": dict(
        seed=7, gguf="qwen3",
        config=dict(model_type="qwen3", head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True),
        legacy=dict(rope_theta=1000000.0),
        init={"embed_tokens": 0.2, "o_proj": 0.25, "down_proj": 0.25, "*": 0.15}, norm_std=0.2,
        norm_base={"model.norm": 1.0}, ablations={}),
    "qwen2": dict(
        seed=5, gguf="qwen2",
        config=dict(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                    use_sliding_window=False),
        legacy=dict(rope_theta=1000000.0),
        init={"embed_tokens": 1.0, "lm_head": 0.4, "bias": 0.3, "*": 0.15}, norm_std=0.2, ablations={}),
    "qwen3_moe": dict(
        seed=11, gguf="qwen3moe",
        config=dict(model_type="qwen3_moe", rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[]),
        legacy=dict(rope_theta=1000000.0),
        init={"embed_tokens": 1.0, "lm_head": 0.4, "mlp.gate": 0.3, "*": 0.15}, norm_std=0.2,
        ablations={"norm_topk_prob_off": _set(norm_topk_prob=False)}),
    "mixtral": dict(
        seed=8, gguf="llama",
        config=dict(model_type="mixtral", intermediate_size=64, rms_norm_eps=1e-5, rope_theta=1000000.0,
                    tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
        legacy=dict(rope_theta=1000000.0),
        init={"embed_tokens": 1.0, "lm_head": 0.4, "mlp.gate": 0.3, "*": 0.15}, norm_std=0.2, ablations={}),
    "phi3": dict(
        seed=7, gguf="phi3",
        config=dict(model_type="phi3", rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
                    original_max_position_embeddings=64,
                    rope_scaling=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=1.0,
                                      short_factor=LONGROPE_SHORT, long_factor=LONGROPE_LONG)),
        legacy=dict(rope_theta=10000.0, partial_rotary_factor=1.0,
                    rope_scaling=dict(type="longrope", short_factor=LONGROPE_SHORT, long_factor=LONGROPE_LONG)),
        init={"embed_tokens": 1.0, "lm_head": 0.4, "*": 0.15}, norm_std=0.2,
        ablations={"longrope_off": _no_longrope}),
    "gemma2": dict(
        seed=9, gguf="gemma2",
        config=dict(model_type="gemma2", head_dim=32, query_pre_attn_scalar=32, rms_norm_eps=1e-6,
                    rope_theta=10000.0, tie_word_embeddings=True, sliding_window=8,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                    hidden_activation="gelu_pytorch_tanh"),
        legacy=dict(rope_theta=10000.0),
        init={"embed_tokens": 0.3, "q_proj": 0.45, "k_proj": 0.45, "*": 0.15}, norm_std=0.2,
        norm_base={"model.norm": 3.0, "post_": 3.0},
        ablations={"window_off": _set(sliding_window=4096),
                   "attn_softcap_off": _set(attn_logit_softcapping=None),
                   "final_softcap_off": _set(final_logit_softcapping=None)}),
    "mistral": dict(
        seed=2, gguf="llama",
        config=dict(model_type="mistral", rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                    sliding_window=8),
        legacy=dict(rope_theta=10000.0),
        init={"embed_tokens": 1.0, "lm_head": 0.4, "*": 0.15}, norm_std=0.2,
        ablations={"window_off": _set(sliding_window=4096)}),
    "gemma3_text": dict(
        seed=3, gguf="gemma3",
        config=dict(model_type="gemma3_text", num_hidden_layers=6, num_key_value_heads=1, head_dim=32,
                    query_pre_attn_scalar=32, rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=8,
                    sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                    hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None,
                    final_logit_softcapping=None),
        legacy=dict(rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window_pattern=6),
        init={"embed_tokens": 0.15, "*": 0.15}, norm_std=0.2, norm_base={"model.norm": 1.0, "post_": 3.0},
        ablations={"window_off": _set(sliding_window=4096),
                   "local_rope_theta_1e6": _local_rope_theta(1000000.0)}),
}


def make_config(spec: dict):
    from transformers import AutoConfig

    kwargs = {**COMMON, **spec["config"]}
    if kwargs["model_type"] == "gemma3_text":
        pattern = kwargs["sliding_window_pattern"]
        kwargs["layer_types"] = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                 for i in range(kwargs["num_hidden_layers"])]
    if kwargs["model_type"] == "phi3":
        kwargs.pop("head_dim")  # Phi-3 derives it (hidden_size / heads)
    return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)


def init_weights(model, spec: dict) -> None:
    """Overwrite every parameter from the model's own seed (CPU generator, fixed order)."""
    import torch

    gen = torch.Generator().manual_seed(spec["seed"])
    gemma = spec["config"]["model_type"].startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                base = next((b for key, b in spec.get("norm_base", {}).items() if key in name), 0.0)
                p.copy_(base + (0.0 if gemma else 1.0) + spec["norm_std"] * noise)
            else:
                std = next((s for key, s in spec["init"].items() if key in name), spec["init"]["*"])
                p.copy_(std * noise)


# --------------------------------------------------------------------------------------------
# Vocabulary (shared by tokenizer.json and the GGUF files)
# --------------------------------------------------------------------------------------------


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68
    bytes map to U+0100 onwards in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(0x100 + extra))
            extra += 1
    return symbols


def vocabulary() -> tuple[list[str], list[tuple[str, str]]]:
    """512 tokens: 256 byte symbols (id = byte), 254 merges, <|bos|>, <|eos|>."""
    symbols = byte_symbols()
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    space = symbols[ord(" ")]
    merges = [(space, c) for c in letters] + [(a, b) for a in letters for b in letters]
    merges = merges[: BOS - 256]
    tokens = symbols + [a + b for a, b in merges] + ["<|bos|>", "<|eos|>"]
    assert len(tokens) == len(set(tokens)) == COMMON["vocab_size"]
    return tokens, merges


CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>{% endfor %}"
                 "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")


def save_tokenizer(out: Path) -> None:
    """tokenizer.json (`tokenizers`) and a hand-written tokenizer_config.json; transformers must
    load them and agree with the raw tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer

    tokens, merges = vocabulary()
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens[:BOS])}, merges=merges, unk_token=None,
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens[BOS:]])
    tok.save(str(out / "tokenizer.json"))
    config = {"add_bos_token": False, "add_eos_token": False, "bos_token": tokens[BOS], "eos_token": tokens[EOS],
              "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
              "model_max_length": COMMON["max_position_embeddings"], "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    text = "the tiny cat sat\n on 12 mats <|eos|>"
    hf = AutoTokenizer.from_pretrained(str(out))
    assert hf(text)["input_ids"] == tok.encode(text).ids and tok.encode(text).ids[-1] == EOS, text
    assert hf.decode(tok.encode(text).ids) == text


# --------------------------------------------------------------------------------------------
# float64 everywhere
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def float64_everywhere():
    """Map every request for float32 (`.float()`, `.to(torch.float32)`, softmax's and arange's /
    tensor's `dtype=torch.float32`) to float64 while transformers' code runs."""
    import torch
    import torch.nn.functional as F

    f32, f64 = torch.float32, torch.float64
    fix = lambda d: f64 if d is f32 else d  # noqa: E731
    orig = dict(to=torch.Tensor.to, float=torch.Tensor.float, softmax=F.softmax, arange=torch.arange,
                tensor=torch.tensor)

    def to(self, *args, **kwargs):
        args = tuple(fix(a) if isinstance(a, torch.dtype) else a for a in args)
        if "dtype" in kwargs:
            kwargs["dtype"] = fix(kwargs["dtype"])
        return orig["to"](self, *args, **kwargs)

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        return orig["softmax"](x, dim=dim, dtype=fix(dtype))

    def with_dtype(fn):
        return lambda *a, **k: fn(*a, **({**k, "dtype": fix(k["dtype"])} if "dtype" in k else k))

    patches = dict(to=to, float=lambda self, *a, **k: orig["to"](self, f64), softmax=softmax,
                   arange=with_dtype(orig["arange"]), tensor=with_dtype(orig["tensor"]))
    owners = dict(to=torch.Tensor, float=torch.Tensor, softmax=F, arange=torch, tensor=torch)
    try:
        for key, fn in patches.items():
            setattr(owners[key], key, fn)
        yield
    finally:
        for key, fn in orig.items():
            setattr(owners[key], key, fn)


# The reference MoE path: transformers' per-expert loop (its grouped_mm kernel has no float64).
EAGER_EXPERTS = {"experts_implementation": "eager"}


def assert_float64_only(model, ids: list[int]) -> None:
    """Run a forward pass and fail if any operation produced a tensor below float64."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    low = {torch.float32, torch.float16, torch.bfloat16}

    class Spy(TorchDispatchMode):
        seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(o, torch.Tensor) and o.dtype in low:
                    self.seen.add(str(func))
            return out

    spy = Spy()
    with spy:
        logits_of(model, ids)
    assert not spy.seen, f"the float64 reference ran lower-precision operations: {sorted(spy.seen)}"


def load(model_dir: Path, dtype: str, ablate=None):
    """The saved model, eager attention. dtype: float32, float64 (transformers' `.double()`) or
    float64-full (float64 with RoPE buffers rebuilt under float64_everywhere; run it there)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    if ablate is not None:
        ablate(config)
    torch_dtype = torch.float32 if dtype == "float32" else torch.float64
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), config=config, dtype=torch_dtype,
                                                 attn_implementation="eager", **EAGER_EXPERTS).eval()
    if dtype == "float64-full":
        rebuild_rotary_in_float64(model)
    return model


def rebuild_rotary_in_float64(model) -> None:
    """Rebuilds every rotary embedding's buffers under `float64_everywhere` (transformers builds
    its RoPE tables in float32 even in a float64 model)."""
    import torch
    with float64_everywhere():
        for module in model.modules():
            if type(module).__name__.endswith("RotaryEmbedding"):
                fresh = type(module)(config=module.config)
                for name, buf in fresh.named_buffers(recurse=False):
                    assert buf.dtype == torch.float64, name
                    setattr(module, name, buf)


# --------------------------------------------------------------------------------------------
# Reference outputs
# --------------------------------------------------------------------------------------------


def prompts(seed: int) -> dict[str, list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randint(0, BOS, (n,), generator=gen).tolist() for name, n in PROMPT_LENGTHS.items()}


def logits_of(model, ids: list[int]):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].to(torch.float64).numpy()


def top2_margin(row) -> float:
    import numpy as np

    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Argmax continuation, recomputing the whole sequence each step (no cache, no EOS stop)."""
    seq, margins = list(ids), []
    for _ in range(n):
        row = logits_of(model, seq)[-1]
        margins.append(top2_margin(row))
        seq.append(int(row.argmax()))
    return seq[len(ids):], margins


def generate_cached(model, ids: list[int], n: int) -> list[int]:
    """transformers' own generate (KV cache, greedy), as a cross-check of `greedy`."""
    import torch

    model.generation_config.eos_token_id = None
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         pad_token_id=EOS)
    return out[0, len(ids):].tolist()


def router_margins(model, ids: list[int]) -> float | None:
    """Smallest gap between the k-th and (k+1)-th router logit over tokens and MoE layers."""
    import numpy as np
    import torch

    gaps, hooks = [], []
    for name, module in model.named_modules():
        if type(module).__name__.endswith("TopKRouter"):
            k = module.top_k

            def hook(_m, _inp, out, k=k):
                logits = np.sort(out[0].to(torch.float64).numpy(), axis=-1)[:, ::-1]
                gaps.append(float((logits[:, k - 1] - logits[:, k]).min()))
            hooks.append(module.register_forward_hook(hook))
    if not hooks:
        return None
    logits_of(model, ids)
    for h in hooks:
        h.remove()
    return min(gaps)


def sig(x: float, digits: int = 7) -> float:
    return float(f"{x:.{digits}g}")


def reference(name: str, spec: dict, model_dir: Path) -> dict:
    import numpy as np
    import torch
    import transformers

    with float64_everywhere():
        full = load(model_dir, "float64-full")
        assert_float64_only(full, prompts(spec["seed"])["long"])
    plain, f32 = load(model_dir, "float64"), load(model_dir, "float32")
    cases, checks = [], {"f32_max_abs_dev": 0.0, "plain_f64_max_abs_dev": 0.0, "f32_greedy_agrees": True}
    for case, ids in prompts(spec["seed"]).items():
        with float64_everywhere():
            ref = logits_of(full, ids)
            cont, margins = greedy(full, ids, GREEDY_TOKENS)
            cached = generate_cached(full, ids, GREEDY_TOKENS)
            router = router_margins(full, ids + cont)
        assert cached == cont, f"{name}/{case}: generate() {cached} != recomputed greedy {cont}"
        checks["f32_max_abs_dev"] = max(checks["f32_max_abs_dev"], float(np.abs(logits_of(f32, ids) - ref).max()))
        checks["plain_f64_max_abs_dev"] = max(checks["plain_f64_max_abs_dev"],
                                              float(np.abs(logits_of(plain, ids) - ref).max()))
        checks["f32_greedy_agrees"] &= greedy(f32, ids, GREEDY_TOKENS)[0] == cont
        entry = {"name": case, "ids": ids,
                 "logits": [[sig(float(np.float32(v))) for v in row] for row in ref],
                 "argmax": [int(row.argmax()) for row in ref],
                 "min_top2_margin": sig(min(top2_margin(row) for row in ref), 4),
                 "greedy": cont, "greedy_margins": [sig(m, 4) for m in margins],
                 "greedy_min_margin": sig(min(margins), 4)}
        if router is not None:
            entry["router_min_margin"] = sig(router, 4)
        cases.append(entry)
        if case == "long":
            checks["long_logits_abs_max"] = sig(float(np.abs(ref).max()), 4)
            checks["long_logits_std"] = sig(float(ref.std()), 4)
            checks["ablations"] = ablations(model_dir, spec, ids, ref)
    for key in ("f32_max_abs_dev", "plain_f64_max_abs_dev"):
        checks[key] = sig(checks[key], 2)
    return {
        "model": name,
        "model_type": spec["config"]["model_type"],
        "generator": "scripts/tiny_models.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "dtype": "float64",
        "attn_implementation": "eager",
        "vocab_size": COMMON["vocab_size"],
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "greedy_tokens": GREEDY_TOKENS,
        "prompts": cases,
        "checks": checks,
    }


def ablations(model_dir: Path, spec: dict, ids: list[int], ref) -> dict:
    """Max |logit difference| on the long prompt when a feature is turned off, and the first
    position that changes (a window of 8 leaves positions 0..7 untouched)."""
    import numpy as np

    out = {}
    for label, ablate in spec["ablations"].items():
        with float64_everywhere():
            other = logits_of(load(model_dir, "float64-full", ablate), ids)
        per_pos = np.abs(other - ref).max(axis=-1)
        changed = np.nonzero(per_pos > 1e-9)[0]
        out[label] = {"max_abs_dev": sig(float(per_pos.max()), 3),
                      "first_changed_position": int(changed[0]) if len(changed) else None}
        assert len(changed), f"ablation {label} changes nothing"
    return out


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def fresh_output(out: Path) -> None:
    """Quiet, single-threaded, deterministic torch and transformers (the same files on every
    run), and `out` emptied for the fixture."""
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)


def dump_json(obj, indent: int = 0) -> str:
    """JSON with lists of scalars on one line (logit rows stay readable and diffable)."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {dump_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + dump_json(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def save_model(name: str, spec: dict, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec["seed"])
    config = make_config(spec)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32,
                                             **EAGER_EXPERTS)
    init_weights(model, spec)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(copy.deepcopy(spec["legacy"]))
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(out)
    # transformers must read the edited config.json back as the model it saved.
    ids = prompts(spec["seed"])["long"]
    again = load(out, "float32")
    assert (logits_of(again, ids) == logits_of(model.eval(), ids)).all(), f"{name}: reload changed the model"


def generate(name: str) -> None:
    from tiny_models_gguf import write_gguf

    spec = MODELS[name]
    out = OUT / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_model(name, spec, out)
    ref = reference(name, spec, out)
    (out / "reference.json").write_text(dump_json(ref) + "\n")
    if spec["gguf"]:
        write_gguf(out, spec["gguf"], vocabulary(), BOS, EOS, CHAT_TEMPLATE,
                   window=spec["config"].get("sliding_window"))
    c = ref["checks"]
    sizes = ", ".join(f"{p.name} {p.stat().st_size // 1024} KiB" for p in sorted(out.iterdir()))
    print(f"{name}: {sizes}")
    print(f"  f32 dev {c['f32_max_abs_dev']}, plain .double() dev {c['plain_f64_max_abs_dev']}, "
          f"f32 greedy agrees {c['f32_greedy_agrees']}, |logit| max {c['long_logits_abs_max']}, "
          f"std {c['long_logits_std']}")
    for p in ref["prompts"]:
        extra = f", router min margin {p['router_min_margin']}" if "router_min_margin" in p else ""
        print(f"  {p['name']:>5} ({len(p['ids'])} ids): greedy min margin {p['greedy_min_margin']}, "
              f"logits min top-2 margin {p['min_top2_margin']}{extra}")
    for label, a in c["ablations"].items():
        print(f"  ablation {label}: max dev {a['max_abs_dev']}, first changed position {a['first_changed_position']}")


def main() -> None:
    ensure_venv()
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(MODELS), help="regenerate only these models")
    parser.add_argument("--check-llamacpp", action="store_true",
                        help="compare with llama.cpp's converter and llama-server; writes nothing")
    args = parser.parse_args()
    names = args.only or list(MODELS)
    if args.check_llamacpp:
        from tiny_models_llamacpp import check_all

        sys.exit(check_all(OUT, [n for n in names if MODELS[n]["gguf"]]))
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    torch.use_deterministic_algorithms(True)
    for name in names:
        generate(name)


if __name__ == "__main__":
    main()
