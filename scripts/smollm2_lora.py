#!/usr/bin/env python3
"""A PEFT LoRA adapter on SmolLM2, its GGUF conversion by llama.cpp, and transformers + PEFT's
logits: tests/fixtures/smollm2-lora/ (plus tests/fixtures/tiny/lora/a.gguf).

Usage:  python3 scripts/smollm2_lora.py   (also run by `make tiny-models`; needs `make model` and
llama.cpp's source, which scripts/build-llama-server.sh unpacks, or $LLAMACPP_SRC)
(Runs inside .venv-tiny/, the pinned environment of scripts/tiny_models.py; CPU only;
re-running gives byte-identical files.)

1. The base: models/SmolLM2-135M-Instruct.Q4_1.gguf dequantized to a float32 Hugging Face
   LlamaForCausalLM by transformers' own GGUF loader (which also undoes llama.cpp's Q/K row
   permutation). It is kept in a temporary directory only.
2. `adapter/`: a rank-4 PEFT adapter (alpha 8) on all seven projections of every layer, its
   weights drawn from a fixed seed (A ~ N(0, 1/in), B ~ N(0, 0.05^2)) and rounded to bfloat16,
   stored as bfloat16 (PEFT's adapter_config.json, weights in PEFT's names).
3. `adapter.gguf`: that adapter converted by llama.cpp's own `convert_lora_to_gguf.py`
   (`--outtype bf16`, `--base` the dequantized checkpoint), so its Q/K rows are llama.cpp's.
   The tiny llama's adapter `a` (scripts/tiny_lora.py) is converted the same way, f32, into
   tests/fixtures/tiny/lora/a.gguf.
4. `reference.json`: for two prompts of tests/fixtures/golden.json (token ids), the float32
   logits of transformers + PEFT (adapter not merged) and of the base alone at every prompt
   position, each position kept as its 20 highest logits plus every 1024th token's, and a
   16-token greedy continuation of each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_models  # noqa: E402
import tiny_models_llamacpp  # noqa: E402

ROOT = tiny_models.ROOT
GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "tests" / "fixtures" / "smollm2-lora"
TINY_LORA = tiny_models.OUT / "lora"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEED = 4603
CASES = ["plain_quick_brown_fox", "chat_capital_of_france"]
TOP = 20
STRIDE = 1024
GREEDY = 16


def dequantized_base(tmp: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from safetensors.torch import save_file

    model = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32)
    out = tmp / "base"
    out.mkdir()
    # transformers refuses to save a model it loaded from GGUF; its weights are plain f32 tensors.
    tied = model.config.tie_word_embeddings
    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = config.get("architectures") or ["LlamaForCausalLM"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def save_adapter(base_dir: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=ALL, lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    torch.manual_seed(SEED)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_A" in name:
                param.copy_(torch.randn_like(param) / param.shape[1] ** 0.5)
            elif "lora_B" in name:
                param.copy_(0.05 * torch.randn_like(param))
            else:
                continue
            param.copy_(param.to(torch.bfloat16).to(torch.float32))
    dest = OUT / "adapter"
    model.save_pretrained(str(dest), safe_serialization=True)
    (dest / "README.md").unlink(missing_ok=True)
    weights = dest / "adapter_model.safetensors"
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in sorted(load_file(str(weights)).items())}
    save_file(tensors, str(weights))
    weights.chmod(0o644)
    cfg = json.loads((dest / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    cfg["target_modules"] = sorted(cfg["target_modules"])
    (dest / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def convert(src: Path, base_dir: Path, adapter: Path, out: Path, outtype: str) -> None:
    run = subprocess.run([sys.executable, str(src / "convert_lora_to_gguf.py"), "--base", str(base_dir),
                          "--outtype", outtype, "--outfile", str(out), str(adapter)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src / "gguf-py")})
    if run.returncode != 0:
        sys.exit(f"convert_lora_to_gguf.py failed on {adapter}:\n{run.stderr[-3000:]}")


def reference(base_dir: Path) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    golden = {c["name"]: c for c in json.loads((ROOT / "tests" / "fixtures" / "golden.json").read_text())["logits_cases"]}
    load = lambda: AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()  # noqa: E731

    def outputs(model, prompt: list[int]) -> dict:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0]
            greedy, seq = [], list(prompt)
            for _ in range(GREEDY):
                row = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
                greedy.append(int(row.argmax()))
                seq.append(greedy[-1])
        positions = []
        for row in logits:
            ids = sorted(set(row.topk(TOP).indices.tolist()) | set(range(0, row.shape[0], STRIDE)))
            positions.append([[i, tiny_models.sig(float(row[i]))] for i in ids])
        return {"logits": positions, "greedy": greedy}

    base, adapted = load(), PeftModel.from_pretrained(load(), str(OUT / "adapter")).eval()
    cases = []
    for name in CASES:
        prompt = golden[name]["prompt_ids"]
        cases.append({"name": name, "prompt_ids": prompt, "base": outputs(base, prompt),
                      "adapter": outputs(adapted, prompt)})
    return {"model_file": GGUF.name, "cases": cases}


def main() -> None:
    tiny_models.ensure_venv(Path(__file__))
    if not GGUF.exists():
        sys.exit(f"{GGUF} is missing: run `make model`")
    src = tiny_models_llamacpp.llama_src()
    if src is None or not (src / "convert_lora_to_gguf.py").exists():
        sys.exit("llama.cpp's source is missing: run scripts/build-llama-server.sh (or set LLAMACPP_SRC)")
    tiny_models.fresh_output(OUT)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = dequantized_base(Path(tmp))
        save_adapter(base_dir)
        convert(src, base_dir, OUT / "adapter", OUT / "adapter.gguf", "bf16")
        convert(src, tiny_models.OUT / "llama", TINY_LORA / "a", TINY_LORA / "a.gguf", "f32")
        ref = reference(base_dir)
    (OUT / "reference.json").write_text(tiny_models.dump_json(ref) + "\n")
    for case in ref["cases"]:
        print(f"{case['name']}: base {case['base']['greedy']}\n  adapter {case['adapter']['greedy']}")


if __name__ == "__main__":
    main()
