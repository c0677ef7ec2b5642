#!/usr/bin/env python3
"""Random LoRA adapters for a llama-type GGUF model, written as GGUF LoRA files (what llama.cpp's
convert_lora_to_gguf.py writes: general.type adapter, adapter.lora.alpha, blk.N.<module>.weight.
lora_a / .lora_b, f32 or bf16) with gguf-py's own writer: the benchmarks' adapters
(scripts/bench-lora.sh).

Usage:  python3 scripts/random_lora_gguf.py MODEL.gguf OUT_DIR [--count 4] [--rank 16] [--seed 1]
                                            [--dtype f32|bf16]
(Runs inside .venv-golden/, the pinned environment of scripts/golden.py.) Writes
OUT_DIR/lora-0.gguf ... lora-(count-1).gguf, each adapting q, k, v, o, gate, up and down of every
layer; A ~ N(0, 1/in), B ~ N(0, 0.02^2), alpha = 2 * rank. Their outputs mean nothing: they cost
what trained adapters of that rank cost. --dtype bf16 stores the same draws rounded to bfloat16
(as adapters trained in bf16 ship); with alpha / rank = 2, Pagoda keeps them in bfloat16.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden  # noqa: E402


def main() -> None:
    golden.ensure_venv(Path(__file__))
    import gguf
    import numpy as np

    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = ap.parse_args()
    qtype = gguf.GGMLQuantizationType.BF16 if args.dtype == "bf16" else None

    def add(writer, name: str, data) -> None:
        if qtype is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    reader = gguf.GGUFReader(str(args.model))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    arch = field("general.architecture")
    layers, hidden = field(f"{arch}.block_count"), field(f"{arch}.embedding_length")
    ffn, heads = field(f"{arch}.feed_forward_length"), field(f"{arch}.attention.head_count")
    kv_heads = field(f"{arch}.attention.head_count_kv")
    head_dim = reader.fields[f"{arch}.attention.key_length"].contents() \
        if f"{arch}.attention.key_length" in reader.fields else hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    modules = {"attn_q": (hidden, q), "attn_k": (hidden, kv), "attn_v": (hidden, kv), "attn_output": (q, hidden),
               "ffn_gate": (hidden, ffn), "ffn_up": (hidden, ffn), "ffn_down": (ffn, hidden)}
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for i in range(args.count):
        path = args.out / f"lora-{i}.gguf"
        writer = gguf.GGUFWriter(str(path), arch)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(2 * args.rank))
        for layer in range(layers):
            for name, (n_in, n_out) in modules.items():
                a = (rng.standard_normal((args.rank, n_in)) / n_in ** 0.5).astype(np.float32)
                b = (0.02 * rng.standard_normal((n_out, args.rank))).astype(np.float32)
                add(writer, f"blk.{layer}.{name}.weight.lora_a", a)
                add(writer, f"blk.{layer}.{name}.weight.lora_b", b)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        print(path)


if __name__ == "__main__":
    main()
