#!/usr/bin/env python3
"""Two PEFT LoRA adapters on the tiny llama and transformers + PEFT's logits: tests/fixtures/tiny/lora/.

Usage:  python3 scripts/tiny_lora.py   (also run by `make tiny-models`)
(Runs inside .venv-tiny/, the pinned environment of scripts/tiny_models.py, which pins peft;
CPU only; re-running gives byte-identical files.)

The base is tests/fixtures/tiny/llama (scripts/tiny_models.py). It writes, under
tests/fixtures/tiny/lora/:

* `a/`, `b/`: PEFT's own `save_pretrained` of two adapters (adapter_config.json,
  adapter_model.safetensors), their weights drawn from fixed seeds (N(0, 0.3), so that every
  adapted module moves the logits; PEFT's default initialization would make B zero):
  - a: rank 4, alpha 8, on all seven projections (q, k, v, o, gate, up, down);
  - b: rank 8, alpha 4, rsLoRA scaling (alpha / sqrt(rank)), on q, v, o and down only.
* reference.json: for the base and each adapter, the logits at every position of the tiny
  llama's `short` prompt and a 16-token greedy continuation of its `long` prompt, from the
  float64 model with the adapter applied by PEFT (`PeftModel`, adapter not merged).
* `phi3/`, `gemma3_text/`, `qwen3_moe/`: one adapter of the other architectures' layouts, each
  with its own reference.json (the adapter's logits at every position of that model's `short`
  prompt, float64 PEFT): Phi-3's fused `qkv_proj` and `gate_up_proj` (with o and down, rank 4,
  alpha 8); Gemma 3 on all seven projections (rank 4, alpha 8); Qwen3-MoE on q, k, v and o only
  (its MLP is experts; rank 8, alpha 16).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_models  # noqa: E402

BASE = tiny_models.OUT / "llama"
OUT = tiny_models.OUT / "lora"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "a": dict(seed=4601, r=4, lora_alpha=8, target_modules=ALL, use_rslora=False),
    "b": dict(seed=4602, r=8, lora_alpha=4, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
              use_rslora=True),
}


# Adapters of other architectures: (base model directory, seed, rank, alpha, target modules).
OTHER = {
    "phi3": (4604, 4, 8, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
    "gemma3_text": (4605, 4, 8, ALL),
    "qwen3_moe": (4606, 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]),
}


def save_adapter(name: str, spec: dict, base_dir: Path = BASE, dest: Path | None = None) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(r=spec["r"], lora_alpha=spec["lora_alpha"], target_modules=spec["target_modules"],
                        use_rslora=spec["use_rslora"], lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    torch.manual_seed(spec["seed"])
    with torch.no_grad():
        for pname, param in sorted(model.named_parameters()):
            if "lora_" in pname:
                param.copy_(0.3 * torch.randn_like(param))
    dest = dest or OUT / name
    model.save_pretrained(str(dest), safe_serialization=True)
    (dest / "README.md").unlink(missing_ok=True)
    cfg = json.loads((dest / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = f"tests/fixtures/tiny/{base_dir.name}"
    cfg["target_modules"] = sorted(cfg["target_modules"])  # a set in PEFT: its order varies
    (dest / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def other_reference(arch: str) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = tiny_models.OUT / arch
    prompts = json.loads((base_dir / "reference.json").read_text())["prompts"]
    short = next(p["ids"] for p in prompts if p["name"] == "short")
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float64, attn_implementation="eager",
                                                **tiny_models.EAGER_EXPERTS)
    model = PeftModel.from_pretrained(base.eval(), str(OUT / arch), torch_dtype=torch.float64).eval().double()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([short]), use_cache=False).logits[0]
    return {"prompt": short, "logits": [[tiny_models.sig(float(v)) for v in row] for row in logits]}


def reference() -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    prompts = json.loads((BASE / "reference.json").read_text())["prompts"]
    ids = {p["name"]: p["ids"] for p in prompts}

    def outputs(model) -> dict:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids["short"]]), use_cache=False).logits[0]
            greedy, seq = [], list(ids["long"])
            for _ in range(tiny_models.GREEDY_TOKENS):
                row = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
                greedy.append(int(row.argmax()))
                seq.append(greedy[-1])
        return {"short_logits": [[tiny_models.sig(float(v)) for v in row] for row in logits],
                "long_greedy": greedy}

    base = lambda: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        str(BASE), dtype=torch.float64, attn_implementation="eager").eval()
    out = {"prompts": {"short": ids["short"], "long": ids["long"]}, "base": outputs(base())}
    for name in ADAPTERS:
        model = PeftModel.from_pretrained(base(), str(OUT / name), torch_dtype=torch.float64).eval()
        model = model.double()
        out[name] = outputs(model)
    return out


def main() -> None:
    tiny_models.ensure_venv(Path(__file__))
    tiny_models.fresh_output(OUT)
    for name, spec in ADAPTERS.items():
        save_adapter(name, spec)
    ref = reference()
    (OUT / "reference.json").write_text(tiny_models.dump_json(ref) + "\n")
    for arch, (seed, r, alpha, targets) in OTHER.items():
        spec = dict(seed=seed, r=r, lora_alpha=alpha, target_modules=targets, use_rslora=False)
        save_adapter(arch, spec, tiny_models.OUT / arch)
        (OUT / arch / "reference.json").write_text(tiny_models.dump_json(other_reference(arch)) + "\n")
    for name in ["base", *ADAPTERS]:
        print(f"{name}: greedy {ref[name]['long_greedy']}")


if __name__ == "__main__":
    main()
