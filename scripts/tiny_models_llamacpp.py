"""`scripts/tiny_models.py --check-llamacpp`: llama.cpp's opinion on tests/fixtures/tiny/.

Writes no fixture. For each model with a model.gguf:

1. Converter: runs llama.cpp's own convert_hf_to_gguf.py (`--outtype f32`, the source vendored in
   the llama-cpp-python sdist that scripts/build-llama-server.sh unpacks under
   ~/.cache/pagoda-llamacpp/src, or $LLAMACPP_SRC) on the model directory into a temporary file,
   and compares it with model.gguf: every tensor (name, shape, type, bytes) and every metadata key
   outside general.* (value). Its vocabulary step is pointed at the directory's tokenizer.json
   (`_set_vocab_gpt2`, pre-tokenizer `gpt-2`: the converter only knows the hashes of real models'
   tokenizers, and Gemma 2 / Phi-3 would otherwise look for a SentencePiece model).
2. llama-server (~/.cache/pagoda-llamacpp/bin/llama-server or $LLAMA_SERVER, F32 KV cache, no
   flash attention (its CPU path rounds Q to F16); Phi-3 see short_factors_only): greedy continuation of
   each prompt (POST /completion, top_k 1, ignore_eos) against reference.json, the first step's
   top-5 log-probability gaps against the reference logits, and POST /tokenize of a few texts
   against the directory's tokenizer.json.
Stops only the servers it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CACHE = Path.home() / ".cache" / "pagoda-llamacpp"
TEXTS = ["the tiny cat sat on 12 mats", "Hello, World!\n\ttabs  and   spaces", "ünïcödé ✓ 猫", "<|bos|>x<|eos|>"]
# HF architectures whose converter class is pointed at tokenizer.json.
HF_ARCHS = ["LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen3ForCausalLM",
            "Qwen3MoeForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"]

CONVERT = """
import sys
src, model_dir, out = sys.argv[1:4]
sys.path[0:0] = [src, src + "/gguf-py"]
import convert_hf_to_gguf as conv
from conversion import base, get_model_class
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for arch in {archs!r}:
    get_model_class(arch).set_vocab = base.TextModel._set_vocab_gpt2
sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", "f32", "--outfile", out]
conv.main()
"""


def llama_src() -> Path | None:
    if os.environ.get("LLAMACPP_SRC"):
        return Path(os.environ["LLAMACPP_SRC"])
    found = sorted(CACHE.glob("src/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    return found[-1].parent if found else None


def gguf_contents(path: Path) -> tuple[dict, dict]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith(("GGUF.", "general.")):
            continue
        value = field.contents()
        meta[key] = value
    tensors = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name, bytes(t.data.tobytes()))
               for t in reader.tensors}
    return meta, tensors


def check_converter(src: Path, model_dir: Path) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "converted.gguf"
        script = Path(tmp) / "convert.py"
        script.write_text(CONVERT.format(archs=HF_ARCHS))
        run = subprocess.run([sys.executable, str(script), str(src), str(model_dir), str(out)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(f"  converter failed:\n{run.stderr[-3000:]}")
            return False
        theirs_meta, theirs = gguf_contents(out)
    ours_meta, ours = gguf_contents(model_dir / "model.gguf")
    ok = True
    for name in sorted(set(ours) | set(theirs)):
        if name not in theirs or name not in ours:
            print(f"  tensor {name}: only in {'ours' if name in ours else 'llama.cpp'}")
            ok = False
        elif ours[name] != theirs[name]:
            what = "shape/type" if ours[name][:2] != theirs[name][:2] else "data"
            print(f"  tensor {name}: {what} differs: ours {ours[name][:2]}, llama.cpp {theirs[name][:2]}")
            ok = False
    for key in sorted(set(ours_meta) | set(theirs_meta)):
        a, b = ours_meta.get(key, "<absent>"), theirs_meta.get(key, "<absent>")
        if a != b:
            show = lambda v: (str(v)[:80] + "...") if len(str(v)) > 80 else v  # noqa: E731
            print(f"  metadata {key}: ours {show(a)!r}, llama.cpp {show(b)!r}")
            ok = ok and key.startswith("tokenizer.")  # vocabulary differences are reported, not fatal
    print(f"  converter: {len(ours)} tensors, {len(ours_meta)} metadata keys; "
          f"{'identical' if ok else 'DIFFERENT'} (general.* not compared)")
    return ok


def post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def short_factors_only(gguf_path: Path, tmp: Path) -> Path:
    """A copy whose long LongRoPE factors are the short ones. llama.cpp picks the long table for
    the whole context when the slot's context exceeds the original one, and llama-server rounds
    the context up to 256 (> 64); the reference's sequences are all shorter than 64, where
    transformers uses the short factors."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    short = np.asarray(tensors["rope_factors_short.weight"].data, dtype=np.float32).tobytes()
    data = bytearray(gguf_path.read_bytes())
    offset = tensors["rope_factors_long.weight"].data_offset
    data[offset:offset + len(short)] = short
    out = tmp / "model-short-factors.gguf"
    out.write_bytes(bytes(data))
    return out


def check_server(server: Path, model_dir: Path, port: int) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir / "model.gguf"
        if json.loads((model_dir / "config.json").read_text())["model_type"] == "phi3":
            model = short_factors_only(model, Path(tmp))
            print("  (phi3: llama-server gets a copy with long factors := short factors, see short_factors_only)")
        return _check_server(server, model_dir, model, port)


def _check_server(server: Path, model_dir: Path, model: Path, port: int) -> bool:
    import math

    from transformers import AutoTokenizer

    ref = json.loads((model_dir / "reference.json").read_text())
    base = f"http://127.0.0.1:{port}"
    cmd = [str(server), "-m", str(model), "-c", "64", "-np", "1", "-t", "2",
           "--host", "127.0.0.1", "--port", str(port), "-ctk", "f32", "-ctv", "f32", "-fa", "off"]
    log = open(Path(tempfile.gettempdir()) / f"tiny-llama-server-{model_dir.name}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    ok = True
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None or time.time() > deadline:
                print(f"  llama-server did not start (see {log.name})")
                return False
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        for case in ref["prompts"]:
            # ignore_eos would ban <|eos|>; where the reference emits it, compare up to it instead.
            want = case["greedy"][: case["greedy"].index(ref["eos_token_id"]) + 1] \
                if ref["eos_token_id"] in case["greedy"] else case["greedy"]
            out = post(base, "/completion", {
                "prompt": case["ids"], "n_predict": len(want), "temperature": 0, "top_k": 1,
                "samplers": ["top_k"], "ignore_eos": len(want) == len(case["greedy"]), "cache_prompt": False,
                "return_tokens": True, "n_probs": 5})
            got = [int(t) for t in out["tokens"]]
            agree = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            last = case["logits"][-1]
            top = out["completion_probabilities"][0]["top_logprobs"]
            gap = max(abs((float(p["logprob"]) - float(top[0]["logprob"]))
                          - (last[int(p["id"])] - last[int(top[0]["id"])])) for p in top)
            eos_note = " (up to the reference's <|eos|>)" if len(want) < len(case["greedy"]) else ""
            print(f"  {case['name']:>5}: greedy agrees on {agree}/{len(want)} tokens{eos_note}; first step "
                  f"top-5 logit gaps differ by at most {gap:.2e} (reference min margin {case['greedy_min_margin']})")
            if agree < len(want):
                print(f"         llama.cpp {got}\n         reference {want}")
                ok = False
            ok = ok and math.isfinite(gap)
        hf = AutoTokenizer.from_pretrained(str(model_dir))
        same = 0
        for text in TEXTS:
            ids = post(base, "/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
            same += ids == hf(text)["input_ids"]
        print(f"  /tokenize: {same}/{len(TEXTS)} texts identical to tokenizer.json")
        ok = ok and same == len(TEXTS)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return ok


def check_all(out: Path, names: list[str]) -> int:
    src = llama_src()
    server = Path(os.environ.get("LLAMA_SERVER", CACHE / "bin" / "llama-server"))
    if src is None:
        print("no llama.cpp source (run scripts/build-llama-server.sh or set LLAMACPP_SRC): converter check skipped")
    if not server.is_file():
        print(f"no {server} (run scripts/build-llama-server.sh or set LLAMA_SERVER): server check skipped")
    failures = 0
    for n, name in enumerate(names):
        print(f"{name}:")
        if src is not None:
            failures += not check_converter(src, out / name)
        if server.is_file():
            failures += not check_server(server, out / name, 8190 + n)
    print(f"{failures} check(s) with differences")
    return 1 if failures else 0
