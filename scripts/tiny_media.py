#!/usr/bin/env python3
"""Reference pixel tensors for crates/media (pagoda-media): tests/fixtures/media/.

Usage:  python3 scripts/tiny_media.py
(Re-executes itself inside .venv-tiny/, the pinned environment of scripts/tiny_models.py, which
pins pillow and transformers; CPU only, a few seconds; re-running gives byte-identical files.)

The resampling reference is Pillow 13's: it runs the vertical pass first when the height shrinks
by more than twice as many pixels as the width (earlier Pillows always ran horizontal first), and
the 8-bit intermediate makes the order visible. crates/media/src/resample.rs follows 13.

It writes, under tests/fixtures/media/:

* Small test images drawn from fixed seeds (smooth gradients plus noise, so that every filter tap
  matters): landscape and portrait RGB PNGs of odd sizes, a grayscale PNG, an RGBA PNG with every
  kind of alpha, a palette PNG with a transparent index, a 3x2 PNG (upscaling), and a 4:2:0 colour
  JPEG and a grayscale JPEG.
* `decoded/<image>.rgb`: PIL's `convert_to_rgb` of each image (transformers' own, alpha composited
  onto white), raw HxWx3 uint8: the decoder + colour conversion reference.
* `alpha_composite.bin`: PIL's `alpha_composite` of every (value, alpha) pair onto opaque white,
  65536 bytes, index `alpha * 256 + value`.
* `resample/<image>_<filter>_<w>x<h>.rgb`: `PIL.Image.resize` of the decoded RGB with the bilinear,
  bicubic and Lanczos filters, down and up, raw uint8.
* `processors/<config>/<image>.f32`: `pixel_values` of transformers' PIL image processors
  (`Idefics3ImageProcessorPil`, `Gemma3ImageProcessorPil`) as raw little-endian float32 where small (and
  for the lossy formats), shape and SHA-256 of each in manifest.json (for the full-size Gemma 3,
  896x896, only the SHA-256 and a few values).
* `manifest.json`: every file above with its shape, plus the expanded prompt strings of
  `Idefics3Processor` and `Gemma3Processor` for each image (through the processors' own
  `replace_image_token` / `get_text_with_replacements`, with a word-level tokenizer that has the
  models' special tokens).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_models  # noqa: E402

if __name__ == "__main__":
    tiny_models.ensure_venv(Path(__file__))  # re-executes inside .venv-tiny/ (numpy, Pillow)

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "media"

# The filters the HF processors use (Gemma 3: bilinear, Idefics3: lanczos, many others: bicubic).
FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
           "lanczos": Image.Resampling.LANCZOS}


RAW_SPLIT = {"landscape.png", "photo.jpg", "lossy.webp"}


def smooth_noise(rng: np.random.RandomState, h: int, w: int, c: int) -> np.ndarray:
    """Gradients plus noise, uint8 HxWxC."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 / max(w - 1, 1)), (y * 255 / max(h - 1, 1)), ((x + y) * 127 / max(h + w - 2, 1))], -1)
    base = base[..., :c] if c <= 3 else np.concatenate([base, base[..., :c - 3]], -1)
    noisy = base + rng.normal(0, 40, size=(h, w, c))
    return np.clip(np.round(noisy), 0, 255).astype(np.uint8)


def make_images() -> dict[str, bytes]:
    rng = np.random.RandomState(6701)
    images: dict[str, bytes] = {}

    def png(img: Image.Image, **kw) -> bytes:
        buf = io.BytesIO()
        img.save(buf, format="PNG", optimize=False, compress_level=9, **kw)
        return buf.getvalue()

    images["landscape.png"] = png(Image.fromarray(smooth_noise(rng, 45, 77, 3), "RGB"))
    images["portrait.png"] = png(Image.fromarray(smooth_noise(rng, 90, 33, 3), "RGB"))
    images["gray.png"] = png(Image.fromarray(smooth_noise(rng, 37, 50, 1)[..., 0], "L"))
    rgba = smooth_noise(rng, 29, 40, 4)
    rgba[0, :, 3] = 0  # fully transparent row
    rgba[1, :, 3] = 255  # fully opaque row
    rgba[2, :, 3] = np.arange(40) * 6  # a ramp
    images["rgba.png"] = png(Image.fromarray(rgba, "RGBA"))
    pal = Image.fromarray(smooth_noise(rng, 23, 31, 3), "RGB").quantize(colors=16, method=Image.Quantize.MEDIANCUT)
    images["palette.png"] = png(pal, transparency=3)
    images["tiny.png"] = png(Image.fromarray(smooth_noise(rng, 2, 3, 3), "RGB"))
    buf = io.BytesIO()
    Image.fromarray(smooth_noise(rng, 48, 64, 3), "RGB").save(buf, format="JPEG", quality=90)
    images["photo.jpg"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(smooth_noise(rng, 40, 56, 1)[..., 0], "L").save(buf, format="JPEG", quality=85)
    images["gray.jpg"] = buf.getvalue()
    rgb16 = (smooth_noise(rng, 21, 19, 3).astype(np.uint16) * 257 + rng.randint(0, 256, (21, 19, 3))).astype(">u2")
    images["rgb16.png"] = png16(rgb16)
    frames = [Image.fromarray(smooth_noise(rng, 26, 35, 3), "RGB").quantize(colors=32) for _ in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    images["anim.gif"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(smooth_noise(rng, 27, 36, 4), "RGBA").save(buf, format="WEBP", lossless=True)
    images["lossless.webp"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(smooth_noise(rng, 32, 40, 3), "RGB").save(buf, format="WEBP", quality=80)
    images["lossy.webp"] = buf.getvalue()
    return images


def png16(rgb: np.ndarray) -> bytes:
    """A 16-bit RGB PNG written by hand (PIL cannot write one): PIL reads it back as 8-bit RGB."""
    import struct
    import zlib

    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def word_tokenizer(special: list[str]):
    """A PreTrainedTokenizerFast that knows the processors' special tokens (the processors read
    their ids; the expansion itself is string work)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "Describe": 1, "this": 2, "and": 3, "that": 4}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def idefics3_processor(image_processor, image_seq_len: int):
    from transformers import Idefics3Processor

    special = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    special += [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    return Idefics3Processor(image_processor=image_processor, tokenizer=word_tokenizer(special),
                             image_seq_len=image_seq_len)


def gemma3_processor(image_processor, image_seq_length: int):
    from transformers import Gemma3Processor

    tok = word_tokenizer(["<start_of_image>", "<image_soft_token>", "<end_of_image>"])
    # Gemma 3's tokenizer carries these as named special tokens; the processor reads them by name.
    tok.boi_token, tok.eoi_token, tok.image_token = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
    tok.boi_token_id = tok.convert_tokens_to_ids("<start_of_image>")
    tok.image_token_id = tok.convert_tokens_to_ids("<image_soft_token>")
    return Gemma3Processor(image_processor=image_processor, tokenizer=tok, image_seq_length=image_seq_length)


def main() -> None:
    from transformers.image_transforms import convert_to_rgb
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    for sub in ("decoded", "resample", "processors"):
        (OUT / sub).mkdir(parents=True, exist_ok=True)
    manifest: dict = {"images": {}, "resample": [], "processors": [], "prompts": []}

    # alpha_composite of (v, a) over opaque white, the table convert_to_rgb applies per channel.
    v, a = np.meshgrid(np.arange(256), np.arange(256))
    src = np.stack([v, v, v, a], -1).astype(np.uint8)
    white = Image.new("RGBA", (256, 256), (255, 255, 255, 255))
    table = np.array(Image.alpha_composite(white, Image.fromarray(src, "RGBA")))[..., 0]
    (OUT / "alpha_composite.bin").write_bytes(table.tobytes())

    images = make_images()
    decoded: dict[str, Image.Image] = {}
    for name, data in images.items():
        (OUT / name).write_bytes(data)
        img = Image.open(io.BytesIO(data))
        rgb = convert_to_rgb(img, return_numpy=True)
        (OUT / "decoded" / f"{name}.rgb").write_bytes(rgb.tobytes())
        decoded[name] = Image.open(io.BytesIO(data))
        manifest["images"][name] = {"mode": img.mode, "width": img.width, "height": img.height,
                                    "decoded": f"decoded/{name}.rgb"}

    # PIL's resize on the decoded RGB: every filter, down, up and mixed.
    # Down, up, one axis only, and both orders of Pillow's two passes ((24, 64) and (60, 20) run
    # the vertical pass first).
    sizes = {"landscape.png": [(30, 17), (128, 75), (77, 20)],
             "portrait.png": [(13, 64), (40, 91), (40, 90), (33, 41), (24, 64)],
             "photo.jpg": [(32, 32), (60, 20)], "tiny.png": [(17, 9), (1, 1)]}
    for name, targets in sizes.items():
        rgb = Image.fromarray(np.frombuffer((OUT / "decoded" / f"{name}.rgb").read_bytes(), np.uint8).reshape(
            decoded[name].height, decoded[name].width, 3), "RGB")
        for fname, filt in FILTERS.items():
            for w, h in targets:
                out = np.array(rgb.resize((w, h), resample=filt))
                rel = f"resample/{name.split('.')[0]}_{fname}_{w}x{h}.rgb"
                (OUT / rel).write_bytes(out.tobytes())
                manifest["resample"].append({"image": name, "filter": fname, "width": w, "height": h, "file": rel})

    configs = {
        "idefics3_split": (Idefics3ImageProcessorPil, dict(size={"longest_edge": 64},
                                                           max_image_size={"longest_edge": 32},
                                                           do_image_splitting=True)),
        "idefics3_nosplit": (Idefics3ImageProcessorPil, dict(size={"longest_edge": 64},
                                                             max_image_size={"longest_edge": 32},
                                                             do_image_splitting=False)),
        "gemma3_small": (Gemma3ImageProcessorPil, dict(size={"height": 32, "width": 32})),
        "gemma3_896": (Gemma3ImageProcessorPil, dict(size={"height": 896, "width": 896})),
    }
    for cname, (cls, kwargs) in configs.items():
        proc = cls(**kwargs)
        (OUT / "processors" / cname).mkdir(exist_ok=True)
        for name in images:
            pv = proc(decoded[name], return_tensors="np")["pixel_values"].astype(np.float32)
            # One image per call: drop the batch axis; Idefics3 keeps its tiles axis.
            pv = pv[0]
            raw = np.ascontiguousarray(pv).astype("<f4").tobytes()
            entry = {"config": cname, "kwargs": kwargs, "image": name, "shape": list(pv.shape), "sha256": sha256(raw)}
            # Raw bytes where they stay small, and always for the lossy decoders (their tests use a
            # tolerance, which needs values); the SHA-256 checks every other one exactly.
            if len(raw) <= 16 * 1024 or (len(raw) <= 64 * 1024 and name in RAW_SPLIT):
                rel = f"processors/{cname}/{name}.f32"
                (OUT / rel).write_bytes(raw)
                entry["file"] = rel
            else:
                flat = pv.reshape(-1)
                idx = [0, 1, 2, 1000, len(flat) // 2, len(flat) - 1]
                entry["samples"] = [[i, float(flat[i])] for i in idx]
            manifest["processors"].append(entry)

    prompt_cases = [("idefics3_split", 4, "Describe <image> and that"), ("idefics3_nosplit", 3, "<image>this<image>")]
    for cname, seq, prompt in prompt_cases:
        proc = idefics3_processor(configs[cname][0](**configs[cname][1]), seq)
        for name in ("landscape.png", "portrait.png", "tiny.png"):
            n = prompt.count("<image>")
            _, repl = proc._process_images([[decoded[name]] * n], **proc._merge_kwargs(
                tokenizer_init_kwargs=proc.tokenizer.init_kwargs)["images_kwargs"])
            text = proc.get_text_with_replacements([prompt], images_replacements=repl)[0][0]
            manifest["prompts"].append({"processor": "idefics3", "config": cname, "image_seq_len": seq,
                                        "image": name, "prompt": prompt, "expanded": text})
    gproc = gemma3_processor(Gemma3ImageProcessorPil(size={"height": 32, "width": 32}), 5)
    for prompt in ("Describe <start_of_image> and that", "<start_of_image><start_of_image>"):
        n = prompt.count("<start_of_image>")
        _, repl = gproc._process_images([[decoded["landscape.png"]] * n], **gproc._merge_kwargs(
            tokenizer_init_kwargs=gproc.tokenizer.init_kwargs)["images_kwargs"])
        text = gproc.get_text_with_replacements([prompt], images_replacements=repl)[0][0]
        manifest["prompts"].append({"processor": "gemma3", "config": "gemma3_small", "mm_tokens_per_image": 5,
                                    "image": "landscape.png", "prompt": prompt, "expanded": text})

    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
