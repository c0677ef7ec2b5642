#!/usr/bin/env python3
"""A tiny random-weight Idefics3 (SmolVLM) and transformers' outputs: tests/fixtures/tiny/idefics3/.

Usage:  python3 scripts/tiny_vlm.py
(Runs inside .venv-tiny/, the pinned environment of scripts/tiny_models.py; CPU only;
re-running gives byte-identical files.)

The model is transformers' own `Idefics3ForConditionalGeneration`:

* vision (SigLIP as Idefics3 has it): hidden 32, intermediate 64, 2 layers, 2 heads, image_size
  64, patch_size 8 (8 x 8 = 64 patches a tile, so the bucketed position ids of a full tile are
  exact in binary: 0..63), GELU-tanh, LayerNorm eps 1e-6;
* connector: pixel shuffle by scale_factor 2 (64 patches -> 16 image tokens a tile of 32 * 4 =
  128 values), then the bias-free modality projection 128 -> 64;
* text: the tiny llama of tiny_models.py (COMMON sizes, rms eps 1e-5, rope theta 1e4, untied
  head), its 512-token byte-level BPE vocabulary extended by 8 special tokens at ids 512-519:
  512 `<image>` (image_token_id), 513 `<fake_token_around_image>`, 514 `<global-img>`,
  515 `<end_of_utterance>`, 516-519 `<row_1_col_1>`, `<row_1_col_2>`, `<row_2_col_1>`,
  `<row_2_col_2>` -- vocab_size 520.

It writes config.json, model.safetensors (`save_pretrained`, float32), tokenizer.json,
tokenizer_config.json, preprocessor_config.json and processor_config.json (the image processor's
settings for this model: 64-pixel tiles, longest edge 128, 16 placeholders a tile), `pixels_a.bin` / `pixels_b.bin` (two deterministic pixel inputs, float32
little-endian, shape [3, 3, 64, 64]: a 1 x 2 split plus the global tile, in the processor's
order, values in [-1, 1] as SmolVLM's normalization gives) and reference.json: per pixel input
the image features (the connector's output, [48, 64]), and for the prompt with that image's
placeholders (the processor's layout: `<fake_token_around_image><row_1_col_c>` + 16 `<image>`
per tile, `\\n` after the row, then `\\n<fake_token_around_image><global-img>` + 16 `<image>` +
`<fake_token_around_image>`, between random text ids) the logits at every position of the
float64 model (`float64_everywhere`), and a 16-token greedy continuation (no EOS stop,
recomputed from the whole sequence each step and cross-checked with `generate`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_models  # noqa: E402
from tiny_models import BOS, COMMON, EOS, GREEDY_TOKENS, sig  # noqa: E402

NAME = "idefics3"
OUT = tiny_models.OUT / NAME
SEED = 67
SPECIAL = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
           "<row_1_col_1>", "<row_1_col_2>", "<row_2_col_1>", "<row_2_col_2>"]
VOCAB = COMMON["vocab_size"] + len(SPECIAL)
IMAGE, FAKE, GLOBAL = 512, 513, 514
ROW_COL = {(r, c): 516 + 2 * (r - 1) + (c - 1) for r in (1, 2) for c in (1, 2)}
NEWLINE = ord("\n")  # byte-level id of "\n"
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              image_size=64, patch_size=8, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
SCALE_FACTOR = 2
TILE_TOKENS = (VISION["image_size"] // VISION["patch_size"]) ** 2 // SCALE_FACTOR**2
GRID = (1, 2)  # rows x cols of split tiles; the global tile follows
TILES = GRID[0] * GRID[1] + 1
# Weight std by parameter-name substring, first match; LayerNorm/RMSNorm weights are 1 + N(0, 0.2),
# LayerNorm biases N(0, 0.1).
INIT = {"text_model.embed_tokens": 1.0, "lm_head": 0.4, "patch_embedding": 0.15, "position_embedding": 0.5,
        "modality_projection": 0.1, "vision_model": 0.2, "*": 0.15}


def make_config():
    from transformers import AutoConfig, Idefics3Config

    text = AutoConfig.for_model("llama", **{**COMMON, "vocab_size": VOCAB}, rms_norm_eps=1e-5,
                                rope_theta=10000.0, tie_word_embeddings=False)
    return Idefics3Config(vision_config=VISION, text_config=text.to_dict(), scale_factor=SCALE_FACTOR,
                          image_token_id=IMAGE, tie_word_embeddings=False, pad_token_id=None)


def init_weights(model) -> None:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif "norm" in name and name.endswith(".bias"):
                p.copy_(0.1 * noise)
            else:
                std = next((s for key, s in INIT.items() if key in name), INIT["*"])
                p.copy_(std * noise)


def save_tokenizer(out: Path) -> None:
    """tiny_models.py's vocabulary plus the special tokens above (added tokens, ids 512-519)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer

    tokens, merges = tiny_models.vocabulary()
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens[:BOS])}, merges=merges, unk_token=None,
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens[BOS:] + SPECIAL])
    tok.save(str(out / "tokenizer.json"))
    config = {"add_bos_token": False, "add_eos_token": False, "bos_token": tokens[BOS], "eos_token": tokens[EOS],
              "chat_template": tiny_models.CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
              "model_max_length": COMMON["max_position_embeddings"], "tokenizer_class": "PreTrainedTokenizerFast",
              "extra_special_tokens": {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                                       "global_image_token": "<global-img>", "end_of_utterance_token":
                                       "<end_of_utterance>"}}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    text = "a cat<fake_token_around_image><row_1_col_2><image><image>\n<global-img><end_of_utterance>"
    ids = tok.encode(text).ids
    assert ids[-7:] == [513, 517, IMAGE, IMAGE, NEWLINE, GLOBAL, 515], ids
    assert AutoTokenizer.from_pretrained(str(out))(text)["input_ids"] == ids


def save_processor_config(out: Path) -> None:
    """preprocessor_config.json (transformers' own `Idefics3ImageProcessor` saves it) and
    processor_config.json, sized for the tiny model: tiles of the encoder's 64 pixels, images
    resized to a longest edge of 128 (so at most a 2 x 2 grid, whose `<row_r_col_c>` tokens the
    vocabulary has, plus the global tile), 16 placeholders a tile; SmolVLM's other settings
    (Lanczos, mean and std 0.5)."""
    from transformers import Idefics3ImageProcessor

    size = VISION["image_size"]
    processor = Idefics3ImageProcessor(size={"longest_edge": 2 * size}, max_image_size={"longest_edge": size},
                                       do_image_splitting=True, resample=1, image_mean=[0.5] * 3,
                                       image_std=[0.5] * 3)
    processor.save_pretrained(str(out))
    path = out / "preprocessor_config.json"
    config = json.loads(path.read_text())
    assert config["max_image_size"] == {"longest_edge": size} and config["resample"] == 1, config
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    processor_config = {"image_seq_len": TILE_TOKENS, "processor_class": "Idefics3Processor"}
    (out / "processor_config.json").write_text(json.dumps(processor_config, indent=2, sort_keys=True) + "\n")


def pixel_inputs() -> dict:
    """Two deterministic [TILES, 3, 64, 64] inputs in [-1, 1]: smooth colour ramps (a different
    pattern per input and tile) plus seeded noise."""
    import torch

    size = VISION["image_size"]
    y, x = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    out = {}
    for k, name in enumerate(["a", "b"]):
        gen = torch.Generator().manual_seed(SEED + 100 + k)
        tiles = []
        for t in range(TILES):
            freq = 1.0 + 2.0 * k + t
            channels = [torch.sin(freq * 3.1 * x + c) * torch.cos((2 - k) * 2.3 * y - c * t) for c in range(3)]
            base = torch.stack(channels) * (0.8 if k == 0 else 0.6)
            tiles.append((base + 0.25 * torch.randn(base.shape, generator=gen)).clamp(-1.0, 1.0))
        out[name] = torch.stack(tiles).to(torch.float32).contiguous()
    return out


def prompt_ids() -> list[int]:
    """Random text ids around the image's placeholders, laid out as Idefics3's processor does."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    text = lambda n: torch.randint(0, BOS, (n,), generator=gen).tolist()  # noqa: E731
    image = []
    for r in range(1, GRID[0] + 1):
        for c in range(1, GRID[1] + 1):
            image += [FAKE, ROW_COL[(r, c)]] + [IMAGE] * TILE_TOKENS
        image.append(NEWLINE)
    image += [NEWLINE, FAKE, GLOBAL] + [IMAGE] * TILE_TOKENS + [FAKE]
    return [BOS] + text(5) + image + text(7)


def load(dtype: str):
    """The saved model, eager attention; float64-full rebuilds the RoPE buffers in float64 (run
    it under float64_everywhere)."""
    import torch
    from transformers import Idefics3ForConditionalGeneration

    torch_dtype = torch.float32 if dtype == "float32" else torch.float64
    model = Idefics3ForConditionalGeneration.from_pretrained(str(OUT), dtype=torch_dtype,
                                                             attn_implementation="eager").eval()
    if dtype == "float64-full":
        tiny_models.rebuild_rotary_in_float64(model)
    return model


def logits_of(model, ids: list[int], pixels):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), pixel_values=pixels.to(model.dtype)[None], use_cache=False)
    return out.logits[0].to(torch.float64).numpy()


def features_of(model, pixels):
    import torch

    with torch.no_grad():
        out = model.model.get_image_features(pixels.to(model.dtype)[None], return_dict=True)
    return torch.cat(out.pooler_output).to(torch.float64).numpy()


def greedy(model, ids: list[int], pixels) -> tuple[list[int], list[float]]:
    seq, margins = list(ids), []
    for _ in range(GREEDY_TOKENS):
        row = logits_of(model, seq, pixels)[-1]
        margins.append(tiny_models.top2_margin(row))
        seq.append(int(row.argmax()))
    cont = seq[len(ids):]
    assert IMAGE not in cont, "the continuation holds an <image> token: the merge would fail; change SEED"
    return cont, margins


def generate_cached(model, ids: list[int], pixels) -> list[int]:
    import torch

    model.generation_config.eos_token_id = None
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), pixel_values=pixels.to(model.dtype)[None],
                         max_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=EOS)
    return out[0, len(ids):].tolist()


def assert_float64_only(model, ids: list[int], pixels) -> None:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    low = {torch.float32, torch.float16, torch.bfloat16}

    # The vision embeddings compute the patches' fractional coordinates in float32 (index
    # arithmetic: the bucketed position ids); of a full 8 x 8 tile they are exact, checked here.
    n = VISION["image_size"] // VISION["patch_size"]
    coords = torch.arange(n, dtype=torch.float32) * (1.0 / torch.tensor(float(n)))
    boundaries = torch.arange(1 / n, 1.0, 1 / n)
    assert torch.bucketize(coords, boundaries, right=True).tolist() == list(range(n))
    index_ops = {"aten.arange.start_step", "aten.mul.Tensor", "aten.reciprocal.default", "aten.unsqueeze.default"}

    class Spy(TorchDispatchMode):
        seen: set[str] = set()
        in_embeddings = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(o, torch.Tensor) and o.dtype in low:
                    if not (self.in_embeddings and str(func) in index_ops and o.numel() <= TILES * n):
                        self.seen.add(f"{func} {tuple(o.shape)} {o.dtype} emb={self.in_embeddings}")
            return out

    spy = Spy()
    embeddings = model.model.vision_model.embeddings
    hooks = [embeddings.register_forward_pre_hook(lambda *_: setattr(spy, "in_embeddings", True)),
             embeddings.register_forward_hook(lambda *_: setattr(spy, "in_embeddings", False))]
    with spy:
        logits_of(model, ids, pixels)
    for h in hooks:
        h.remove()
    assert not spy.seen, f"the float64 reference ran lower-precision operations: {sorted(spy.seen)}"


def rows(array) -> list[list[float]]:
    import numpy as np

    return [[sig(float(np.float32(v))) for v in row] for row in array]


def reference(images: dict) -> dict:
    import numpy as np
    import torch
    import transformers

    ids = prompt_ids()
    assert ids.count(IMAGE) == TILES * TILE_TOKENS
    with tiny_models.float64_everywhere():
        full = load("float64-full")
        assert_float64_only(full, ids, images["a"])
    f32 = load("float32")
    out_images, prompts = [], []
    checks = {"f32_logits_max_abs_dev": 0.0, "f32_features_max_abs_dev": 0.0, "f32_greedy_agrees": True}
    refs = {}
    for name, pixels in images.items():
        with tiny_models.float64_everywhere():
            feats = features_of(full, pixels)
            ref = logits_of(full, ids, pixels)
            cont, margins = greedy(full, ids, pixels)
            cached = generate_cached(full, ids, pixels)
        assert cached == cont, f"{name}: generate() {cached} != recomputed greedy {cont}"
        assert feats.shape == (TILES * TILE_TOKENS, COMMON["hidden_size"]), feats.shape
        refs[name] = ref
        checks["f32_features_max_abs_dev"] = max(checks["f32_features_max_abs_dev"],
                                                 float(np.abs(features_of(f32, pixels) - feats).max()))
        checks["f32_logits_max_abs_dev"] = max(checks["f32_logits_max_abs_dev"],
                                               float(np.abs(logits_of(f32, ids, pixels) - ref).max()))
        checks["f32_greedy_agrees"] &= greedy(f32, ids, pixels)[0] == cont
        out_images.append({"name": name, "file": f"pixels_{name}.bin", "shape": list(pixels.shape),
                           "features_abs_max": sig(float(np.abs(feats).max()), 4), "features": rows(feats)})
        prompts.append({"name": name, "image": name, "ids": ids, "logits": rows(ref),
                        "argmax": [int(r.argmax()) for r in ref],
                        "min_top2_margin": sig(min(tiny_models.top2_margin(r) for r in ref), 4),
                        "greedy": cont, "greedy_margins": [sig(m, 4) for m in margins],
                        "greedy_min_margin": sig(min(margins), 4)})
    first_image = ids.index(IMAGE)
    diff = np.abs(refs["a"] - refs["b"]).max(axis=-1)
    assert diff[:first_image].max() == 0.0 and diff[first_image] > 0.1, "images change only what follows them"
    checks["a_vs_b_max_abs_logit_diff"] = sig(float(diff.max()), 4)
    for key in ("f32_logits_max_abs_dev", "f32_features_max_abs_dev"):
        checks[key] = sig(checks[key], 2)
    return {
        "model": NAME, "model_type": "idefics3", "generator": "scripts/tiny_vlm.py",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__.split("+")[0],
        "dtype": "float64", "attn_implementation": "eager", "vocab_size": VOCAB, "bos_token_id": BOS,
        "eos_token_id": EOS, "image_token_id": IMAGE, "scale_factor": SCALE_FACTOR,
        "image_tokens_per_tile": TILE_TOKENS, "greedy_tokens": GREEDY_TOKENS,
        "pixels": "float32 little-endian, C order, [tiles, 3, height, width]",
        "images": out_images, "prompts": prompts, "checks": checks,
    }


def main() -> None:
    tiny_models.ensure_venv(Path(__file__))
    import torch
    from transformers import Idefics3ForConditionalGeneration

    tiny_models.fresh_output(OUT)
    torch.manual_seed(SEED)
    model = Idefics3ForConditionalGeneration._from_config(make_config(), attn_implementation="eager",
                                                           dtype=torch.float32)
    init_weights(model)
    model.save_pretrained(str(OUT), safe_serialization=True)
    (OUT / "generation_config.json").unlink(missing_ok=True)
    cfg = json.loads((OUT / "config.json").read_text())
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(OUT)
    save_processor_config(OUT)
    images = pixel_inputs()
    for name, pixels in images.items():
        (OUT / f"pixels_{name}.bin").write_bytes(pixels.numpy().astype("<f4").tobytes())
    again = load("float32")
    ids = prompt_ids()
    model.eval()
    import numpy as np
    dev = np.abs(logits_of(again, ids, images["a"]) - logits_of(model, ids, images["a"])).max()
    assert dev == 0.0, f"reload changed the model: {dev}"
    ref = reference(images)
    (OUT / "reference.json").write_text(tiny_models.dump_json(ref) + "\n")
    c = ref["checks"]
    sizes = ", ".join(f"{p.name} {p.stat().st_size // 1024} KiB" for p in sorted(OUT.iterdir()))
    print(f"{NAME}: {sizes}\n  {c}")
    for p in ref["prompts"]:
        print(f"  {p['name']} ({len(p['ids'])} ids): greedy {p['greedy']}, greedy min margin "
              f"{p['greedy_min_margin']}, logits min top-2 margin {p['min_top2_margin']}")


if __name__ == "__main__":
    main()
