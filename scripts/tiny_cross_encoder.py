#!/usr/bin/env python3
"""A tiny random-weight BERT cross-encoder and transformers' scores: tests/fixtures/tiny/bert_cross_encoder/.

Usage:  python3 scripts/tiny_cross_encoder.py   (also run by `make tiny-models`)
(Runs inside .venv-tiny/, the pinned environment of scripts/tiny_models.py; CPU only;
re-running gives byte-identical files.)

It writes:

* config.json, model.safetensors: transformers' `save_pretrained` (float32) of a
  `BertForSequenceClassification` with one label (a reranker's shape), weights drawn from a
  fixed seed at a scale where every part (token types, pooler, classifier) moves the score.
* tokenizer.json, tokenizer_config.json: a small WordPiece vocabulary of our own (special
  tokens, letters, digits, their `##` continuations and common English words) with BERT's
  normalizer, pre-tokenizer and pair template (`[CLS] A [SEP] B [SEP]`, B of token type 1).
  `model_max_length` is the model's 64 positions, so long pairs are truncated.
* reference.json: for each (query, document) pair, what transformers computes as
  sentence-transformers' CrossEncoder does -- the tokenizer called on the pair with
  `truncation=True` (longest first), the float64 model's logit, and its sigmoid (the score).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_models  # noqa: E402

OUT = tiny_models.OUT / "bert_cross_encoder"
SEED = 4501
MAX_POSITIONS = 64
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """the a an of to in is are was be and or for on with as by at from it this that what which
who how when where why not no yes can do does did has have had will would capital city country
france paris germany berlin italy rome spain madrid river sea mountain weather rain sun today
tomorrow cat cats dog dogs animal pet pets food eat eats cook cooking recipe bread cheese water
drink coffee tea python rust code program programs computer language languages fast slow speed
model models embedding rerank search query document answer question good bad best new old big
small red blue green music play plays game games sport football book books read reads write
writes learn learning machine deep neural network train training data""".split()
PUNCTUATION = list(".,?!'-:;()")

PAIRS = [
    ("what is the capital of france", "paris is the capital of france"),
    ("what is the capital of france", "berlin is the capital of germany"),
    ("what is the capital of france", "cats are good pets"),
    ("what is the capital of france", "what is the capital of france"),
    ("how to cook bread", "a recipe for bread with cheese and water"),
    ("how to cook bread", "the weather today is rain"),
    ("best programming language", "rust programs are fast, python code is slow!"),
    ("best programming language", ""),
    ("", "paris"),
    ("Dogs?", "DOGS are animals; cats too."),
    ("neural network training", "深度学习 (deep learning) trains neural networks on data"),
    # Long pairs: truncated to the model's 64 positions, the longer text first.
    ("machine learning", " ".join(["deep neural network models learn from training data"] * 9)),
    (" ".join(["what is a good book to read"] * 8), " ".join(["books read by cats and dogs"] * 7)),
    (" ".join(["music and games"] * 20), "football"),
]


def vocabulary() -> list[str]:
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    vocab = SPECIAL + chars + PUNCTUATION + ["##" + c for c in chars]
    vocab += [w for w in dict.fromkeys(WORDS) if w not in vocab]
    return vocab


def save_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(vocabulary())}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, clean_text=True,
                                                handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece(prefix="##")
    for token in SPECIAL:
        tok.add_special_tokens([token])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": MAX_POSITIONS,
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_model(out: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(SEED)
    config = BertConfig(vocab_size=len(vocabulary()), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=MAX_POSITIONS,
                        type_vocab_size=2, num_labels=1, hidden_act="gelu", pad_token_id=0,
                        architectures=["BertForSequenceClassification"])
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm.weight" in name:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.copy_(0.3 * torch.randn_like(param))
    model.save_pretrained(str(out), safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def reference(out: Path) -> dict:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    model = BertForSequenceClassification.from_pretrained(str(out), dtype=torch.float64,
                                                          attn_implementation="eager").eval()
    f32 = BertForSequenceClassification.from_pretrained(str(out), dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    cases = []
    for query, document in PAIRS:
        # As lists, as CrossEncoder calls it: a lone "" second text would count as no pair.
        enc = {k: v[0] for k, v in tokenizer([query], [document], truncation=True).items()}
        ids = torch.tensor([enc["input_ids"]])
        types = torch.tensor([enc["token_type_ids"]])
        with torch.no_grad():
            logit = model(input_ids=ids, token_type_ids=types).logits[0, 0].item()
            logit32 = f32(input_ids=ids, token_type_ids=types).logits[0, 0].item()
            # Token types matter: the same ids all of type 0 score differently.
            untyped = model(input_ids=ids, token_type_ids=torch.zeros_like(types)).logits[0, 0].item()
        cases.append({
            "query": query, "document": document,
            "input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
            "logit": tiny_models.sig(logit, 10), "score": tiny_models.sig(float(torch.sigmoid(torch.tensor(logit))), 10),
            "f32_logit_dev": tiny_models.sig(abs(logit32 - logit), 3),
            "untyped_logit_dev": tiny_models.sig(abs(untyped - logit), 3),
        })
    return {"max_length": MAX_POSITIONS, "pairs": cases}


def main() -> None:
    tiny_models.ensure_venv(Path(__file__))
    tiny_models.fresh_output(OUT)
    save_tokenizer(OUT)
    save_model(OUT)
    ref = reference(OUT)
    (OUT / "reference.json").write_text(tiny_models.dump_json(ref) + "\n")
    logits = [p["logit"] for p in ref["pairs"]]
    print(f"bert_cross_encoder: {len(logits)} pairs, logits {min(logits):.3f}..{max(logits):.3f}, "
          f"max f32 dev {max(p['f32_logit_dev'] for p in ref['pairs'])}, "
          f"min token-type effect {min(p['untyped_logit_dev'] for p in ref['pairs'])}, "
          f"lengths {sorted({len(p['input_ids']) for p in ref['pairs']})}")


if __name__ == "__main__":
    main()
