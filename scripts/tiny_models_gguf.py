"""model.gguf for scripts/tiny_models.py: a Hugging Face directory's weights in llama.cpp's format.

Written with the `gguf` package (llama.cpp's gguf-py) following llama.cpp's convert_hf_to_gguf.py
(`--outtype f32`): its tensor-name table (gguf.TensorNameMap), the same metadata keys per
architecture, and its tensor conventions:

* `llama` (Llama, Mistral, Mixtral): Q and K rows permuted per head so that rotary pairs are
  adjacent dimensions (LlamaModel.permute); Mixtral's experts stacked into
  `blk.N.ffn_{gate,up,down}_exps.weight` [n_expert, rows, cols] (w1 = gate, w3 = up, w2 = down).
* `qwen3`, `qwen3moe`, `phi3`, `gemma2`, `gemma3`: no permutation (NeoX-style rotary); Qwen3-MoE's
  experts stacked the same way; Phi-3's fused `qkv_proj` -> `attn_qkv`, `gate_up_proj` -> `ffn_up`,
  and its LongRoPE factor tables `rope_factors_long.weight` / `rope_factors_short.weight` with
  `rope.scaling.attn_factor` = sqrt(1 + ln(max / original) / ln(original)).
* Gemma 2 / 3: every `*norm.weight` stored as 1 + w (llama.cpp multiplies by the stored weight).
* Tied embeddings: no `output.weight` (llama.cpp falls back to `token_embd.weight`).

The vocabulary is the directory's byte-level BPE (`tokenizer.ggml.model` = gpt2, pre = gpt-2).
Deliberate extra: Mistral's `llama.attention.sliding_window` (llama.cpp's converter drops the
window for MistralForCausalLM and its `llama` graph has no sliding window; without the key the
file would describe a different model for sequences longer than the window).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# HF module names of stacked experts, per expert projection, by model_type.
EXPERT_NAMES = {
    "mixtral": ("block_sparse_moe.experts.{x}.{p}.weight", {"w1": "gate", "w3": "up", "w2": "down"}),
    "qwen3_moe": ("mlp.experts.{x}.{p}_proj.weight", {"gate": "gate", "up": "up", "down": "down"}),
}


def permute(w, n_head: int):
    """llama.cpp's LlamaModel.permute: per head, rows (2, half) -> (half, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def metadata(w, arch: str, cfg: dict, window: int | None) -> None:
    """The `{arch}.*` keys convert_hf_to_gguf.py writes for this architecture."""
    mt = cfg["model_type"]
    rope = cfg["rope_parameters"]
    if mt == "phi3":  # Phi3MiniModel.set_gguf_parameters (no generic keys)
        original = rope["original_max_position_embeddings"]
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * cfg["hidden_size"])
                                   // cfg["num_attention_heads"])
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        scale = cfg["max_position_embeddings"] / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        return
    if mt == "gemma2":  # Gemma2Model.set_gguf_parameters (no generic keys, no rope keys)
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
        return
    # TextModel.set_gguf_parameters (the generic keys), then the model class's own.
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    full = rope.get("full_attention", rope)
    w.add_rope_freq_base(full["rope_theta"])
    if "sliding_attention" in rope:
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    if experts is not None:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("head_dim") is not None:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch == "llama":  # LlamaModel
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        if window:  # the deliberate extra (see the module docstring)
            w.add_sliding_window(window)
    if mt == "qwen3_moe":  # Qwen2MoeModel
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if mt == "gemma3_text":  # Gemma3Model
        assert cfg.get("attn_logit_softcapping") is None
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        if cfg.get("sliding_window_pattern") != 1:
            w.add_sliding_window(cfg["sliding_window"])


def tokenizer(w, vocab, bos: int, eos: int, chat_template: str) -> None:
    import gguf

    tokens, merges = vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i >= bos else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(chat_template)


def tensors(arch: str, cfg: dict, state: dict) -> list[tuple[str, object]]:
    """(GGUF name, float32 array) in llama.cpp's conventions."""
    import gguf
    import numpy as np

    mt, n_layer = cfg["model_type"], cfg["num_hidden_layers"]
    arch_id = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    names = gguf.get_tensor_name_map(arch_id, n_layer)
    out, state = [], dict(state)
    if mt == "phi3":
        rope = cfg["rope_parameters"]
        out.append(("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32)))
        out.append(("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32)))
    if mt in EXPERT_NAMES:
        pattern, projections = EXPERT_NAMES[mt]
        n_expert = cfg.get("num_local_experts", cfg.get("num_experts"))
        for bid in range(n_layer):
            for hf_proj, role in projections.items():
                keys = [f"model.layers.{bid}." + pattern.format(x=x, p=hf_proj) for x in range(n_expert)]
                stacked = np.stack([state.pop(k) for k in keys])
                state[f"model.layers.{bid}.mlp.experts.{role}_proj"] = stacked  # a name TensorNameMap knows
    for hf_name in sorted(state, key=_order):
        data = np.ascontiguousarray(state[hf_name], dtype=np.float32)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no llama.cpp name for {hf_name}")
        if arch == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg["num_attention_heads"] if "attn_q" in gguf_name else cfg["num_key_value_heads"]
            data = permute(data, heads)
        if mt.startswith("gemma") and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)
        if not gguf_name.endswith((".weight", ".bias")):
            gguf_name += ".weight"
        out.append((gguf_name, np.ascontiguousarray(data, dtype=np.float32)))
    return out


def _order(hf_name: str):
    """Embeddings, then layers in order, then the final norm and head."""
    parts = hf_name.split(".")
    if "layers" in parts:
        return (1, int(parts[parts.index("layers") + 1]), hf_name)
    return (0 if "embed" in hf_name else 2, 0, hf_name)


def write_gguf(model_dir: Path, arch: str, vocab, bos: int, eos: int, chat_template: str,
               window: int | None = None) -> Path:
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    state = load_file(str(model_dir / "model.safetensors"))
    path = model_dir / "model.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    # Not the model's name: llama.cpp keys tokenizer quirks off general.name (e.g. "phi3").
    w.add_name("pagoda tiny fixture")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    metadata(w, arch, cfg, window if arch == "llama" else None)
    tokenizer(w, vocab, bos, eos, chat_template)
    for name, data in tensors(arch, cfg, state):
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
