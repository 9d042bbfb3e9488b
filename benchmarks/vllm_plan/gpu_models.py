"""The model directories the GPU vLLM runs use (scripts/gpu/vllm_steps.sh `models`), built on the
lent machine: nothing is downloaded and nothing this large is carried.

- qwen2.5-1.5b: harness/configs/qwen2.5-1.5b.json with random bf16 weights (harness.models), and the
  tiny local model's tokenizer (its vocabulary is smaller than the model's: vLLM serves it; sampled
  ids past the tokenizer decode to nothing).
- qwen2.5-1.5b-w4a16: the same architecture in compressed-tensors pack-quantized W4A16 layout
  (group 128, symmetric, lm_head kept bf16) with random int4 values and scales: what a GPTQ/AWQ
  export of it stores, byte for byte in shapes and dtypes, without running a quantizer.
- qwen2.5-1.5b-gptq / -awq (--gptq / --awq, when llm-compressor is importable): the quantize
  chain's own GPTQ / AWQ W4A16 output of the bf16 model (harness.quant.quantize, 32 samples x 128
  random token ids).

    python3 benchmarks/vllm_plan/gpu_models.py --out /tmp/vmodels [--gptq] [--awq] [--device cuda]
Prints one JSON line per model: its directory, stored bytes and seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import models  # noqa: E402

REFERENCE = "qwen2.5-1.5b"
GROUP = 128
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def copy_tokenizer(dst: Path) -> None:
    """The tiny model's tokenizer, its vocabulary grown to the model's with one entry per id past
    it ("w2048", ...; no merge makes them, so encoding is unchanged): every id the random model
    samples decodes to visible text. Without them most ids decode to nothing, the client's TTFT
    waits for the first visible text and a third of the requests carry none (docs/gpu.md)."""
    tiny = models.tiny_model_dir("qwen2")
    for name in TOKENIZER_FILES:
        if (tiny / name).is_file():
            shutil.copy(tiny / name, dst / name)
    config = json.loads((dst / "config.json").read_text())
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    spec = json.loads((dst / "tokenizer.json").read_text())
    taken = set(spec["model"]["vocab"].values()) | {t["id"] for t in spec.get("added_tokens", [])}
    start = max(taken) + 1
    spec["model"]["vocab"].update({f"w{i}": i for i in range(start, vocab_size)})
    (dst / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))


def bf16_model(out: Path) -> Path:
    target = out / REFERENCE
    if not (target / "config.json").is_file():
        models.save_random_model(REFERENCE, target, dtype="bf16")
        copy_tokenizer(target)
    return target


def w4a16_config(config: dict, ignore: list[str]) -> dict:
    return {**config, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "ignore": ignore, "kv_cache_scheme": None, "global_compression_ratio": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": GROUP, "dynamic": False, "actorder": None, "observer": "minmax",
                        "observer_kwargs": {}, "block_structure": None}}}}}


def w4a16_model(src: Path, out: Path) -> Path:
    """Every decoder Linear as weight_packed (int32 [out, in/8]), weight_scale (bf16 [out, in/128])
    and weight_shape (int64 [2]); everything else copied as stored."""
    import torch
    from safetensors.torch import load_file, save_file

    target = out / f"{REFERENCE}-w4a16"
    if (target / "config.json").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(src.glob("*.safetensors")):
        for name, t in load_file(path).items():
            linear = name.endswith(".weight") and t.dim() == 2 and ".layers." in name
            if not linear:
                tensors[name] = t
                continue
            rows, cols = t.shape
            base = name[: -len(".weight")]
            tensors[f"{base}.weight_packed"] = torch.randint(-2**31, 2**31 - 1, (rows, cols // 8), dtype=torch.int32,
                                                             generator=gen)
            tensors[f"{base}.weight_scale"] = (torch.rand(rows, cols // GROUP, generator=gen) * 2e-3 + 1e-3).to(torch.bfloat16)
            tensors[f"{base}.weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(w4a16_config(config, ["lm_head"]), indent=1) + "\n")
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, target / name)
    return target


def quantized_model(src: Path, out: Path, device: str, method: str = "gptq") -> Path:
    """The quantize chain (llm-compressor GPTQ or AWQ W4A16) on `device`, in this interpreter."""
    import random

    from harness.quant.quantize import QuantizeJob, run_quantize

    target = out / f"{REFERENCE}-{method}"
    if (target / "config.json").is_file():
        return target
    rng = random.Random(0)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    samples = [[rng.randrange(vocab) for _ in range(128)] for _ in range(32)]
    job = QuantizeJob(model_dir=src, out_dir=target, samples=samples, method=method, device=device, dtype="bf16")
    run_quantize(sys.executable, [job], log_path=out / f"{method}.log")
    return target


def stored_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.safetensors"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/vmodels")
    parser.add_argument("--gptq", action="store_true", help="also run the quantize chain's GPTQ (needs llm-compressor)")
    parser.add_argument("--awq", action="store_true", help="also run the quantize chain's AWQ (after the GPTQ)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = [("bf16", lambda: bf16_model(out)), ("w4a16", lambda: w4a16_model(out / REFERENCE, out))]
    if args.gptq:
        steps.append(("gptq", lambda: quantized_model(out / REFERENCE, out, args.device, "gptq")))
    if args.awq:
        steps.append(("awq", lambda: quantized_model(out / REFERENCE, out, args.device, "awq")))
    rc = 0
    for name, build in steps:
        started = time.monotonic()
        try:
            path = build()
            print(json.dumps({"model": name, "dir": str(path), "stored_bytes": stored_bytes(path),
                              "seconds": round(time.monotonic() - started, 1)}), flush=True)
        except Exception as exc:  # one failed build must not stop the others
            print(json.dumps({"model": name, "error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
