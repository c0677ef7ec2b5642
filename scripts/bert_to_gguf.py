#!/usr/bin/env python3
"""Writes a sentence-transformers BERT directory (all-MiniLM-L6-v2) as an f32 GGUF that
llama.cpp's `llama-server --embeddings` loads, for the embedding benchmark's peer.

    python3 scripts/bert_to_gguf.py models/all-MiniLM-L6-v2 models/all-MiniLM-L6-v2.f32.gguf

It runs inside .venv-golden/ (as scripts/golden.py creates it; the `gguf` package there is
llama.cpp's own gguf-py). llama.cpp's converter needs torch; this one reads the safetensors with
numpy and names the tensors with gguf-py's own BERT name map, and writes what llama.cpp's BERT
loader reads: the hyper-parameters, non-causal attention, the pooling from 1_Pooling (mean for
MiniLM), and the WordPiece vocabulary in llama.cpp's spelling (a word-initial piece gets a
leading U+2581, a continuation piece loses its "##", control tokens stay as they are).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden  # noqa: E402  (the shared venv bootstrap)


def main() -> None:
    golden.ensure_venv(Path(__file__))
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((src / "config.json").read_text())
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    layers = config["num_hidden_layers"]

    writer = gguf.GGUFWriter(str(dst), "bert")
    writer.add_name(src.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(layers)
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if pooling.get("pooling_mode_mean_tokens"):
        writer.add_pooling_type(gguf.PoolingType.MEAN)
    elif pooling.get("pooling_mode_cls_token"):
        writer.add_pooling_type(gguf.PoolingType.CLS)
    else:
        sys.exit("only mean and cls pooling are written")

    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab))), "vocabulary ids must be dense"
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens, types = [], []
    for text, _ in vocab:
        if text in special:
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(text[2:] if text.startswith("##") else "\u2581" + text)
            types.append(gguf.TokenType.NORMAL)
    writer.add_token_type_count(config.get("type_vocab_size", 2))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    ids = tokenizer["model"]["vocab"]
    writer.add_unk_token_id(ids["[UNK]"])
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_pad_token_id(ids["[PAD]"])
    # llama.cpp's WordPiece tokenizer opens an input with its BOS: BERT's [CLS].
    writer.add_bos_token_id(ids["[CLS]"])
    writer.add_mask_token_id(ids["[MASK]"])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, layers)
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            sys.exit(f"no GGUF name for {name}")
        writer.add_tensor(new, tensor.astype(np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {dst}", file=sys.stderr)


if __name__ == "__main__":
    main()
