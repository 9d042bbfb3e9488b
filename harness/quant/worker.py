"""The quantize step, run by the llm-compressor venv's python as a script: `python worker.py REQUEST.json`.

It imports nothing from the harness (that venv has llm-compressor's own transformers and
compressed-tensors, not the harness), reads one JSON request, prints progress lines, and writes
one JSON result per job:

- quantize: model_dir -> out_dir with llm-compressor's oneshot (GPTQ, AWQ or RTN, a preset scheme such
  as W4A16), calibrated on the token ids given; the tokenizer files are copied.
- logits: a model directory's logits on token ids, through this venv's transformers and
  compressed-tensors (the pair that wrote the checkpoint), saved as safetensors.

The result carries the wall time, the peak resident memory of this process, the peak of torch's
CUDA allocator when a GPU was used, and the versions that ran.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
import traceback
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def say(text: str) -> None:
    print(f"[quant] {text}", flush=True)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("llmcompressor", "compressed-tensors", "transformers", "torch"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _dataset(samples):
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": [list(map(int, s)) for s in samples],
                              "attention_mask": [[1] * len(s) for s in samples]})


def _modifier(req: dict):
    method = req["method"].lower()
    kwargs = {"targets": req.get("targets", ["Linear"]), "ignore": req.get("ignore", ["lm_head"])}
    scheme = req.get("scheme", "W4A16")
    if req.get("group_size"):
        from compressed_tensors.quantization import preset_name_to_scheme

        base = preset_name_to_scheme(scheme, kwargs["targets"])
        weights = base.weights.model_copy(update={"group_size": int(req["group_size"])})
        kwargs["config_groups"] = {"group_0": base.model_copy(update={"weights": weights}).model_dump()}
    else:
        kwargs["scheme"] = scheme
    if method == "gptq":
        from llmcompressor.modifiers.quantization import GPTQModifier

        if req.get("actorder"):
            kwargs["actorder"] = req["actorder"]
        return GPTQModifier(**kwargs)
    if method == "rtn":  # round-to-nearest: no calibration, seconds on a CPU
        from llmcompressor.modifiers.quantization import QuantizationModifier

        return QuantizationModifier(**kwargs)
    if method == "awq":
        from llmcompressor.modifiers.awq import AWQModifier

        if req.get("awq_n_grid"):
            kwargs["n_grid"] = int(req["awq_n_grid"])
        _no_pinning_without_accelerator()
        return AWQModifier(**kwargs)
    raise SystemExit(f"unknown method {method!r} (gptq, awq or rtn)")


def _no_pinning_without_accelerator() -> None:
    """AWQ pins its cached activations for faster host-to-device copies, unconditionally, and
    pin_memory() raises on a CPU-only torch ("Cannot access accelerator device"). With no device
    there is nothing to copy to: in this process only, pinning becomes a no-op (the installed
    library is not modified)."""
    import torch

    if torch.accelerator.is_available():
        return
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    say("CPU-only torch: AWQ's activation pinning is skipped in this process (nothing to copy to)")


def quantize(req: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from llmcompressor import oneshot

    device = req.get("device", "cpu")
    src, out = Path(req["model_dir"]), Path(req["out_dir"])
    samples = req["samples"]
    seq_len = max((len(s) for s in samples), default=0)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    say(f"loading {src} ({req.get('dtype', 'auto')}) on {device}")
    started = time.monotonic()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}.get(req.get("dtype"), "auto")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, device_map={"": device})
    loaded = time.monotonic()
    if req["method"].lower() == "rtn":
        say(f"RTN {req.get('scheme', 'W4A16')} (no calibration data)")
        oneshot(model=model, recipe=[_modifier(req)], pipeline="datafree")
    else:
        say(f"{req['method'].upper()} {req.get('scheme', 'W4A16')} on {len(samples)} samples x {seq_len} tokens")
        oneshot(model=model, dataset=_dataset(samples), recipe=[_modifier(req)], max_seq_length=seq_len,
                num_calibration_samples=len(samples), shuffle_calibration_samples=False,
                pipeline=req.get("pipeline", "independent"))
    quantized = time.monotonic()
    say(f"saving compressed checkpoint to {out}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, save_compressed=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    if (src / "generation_config.json").is_file() and not (out / "generation_config.json").is_file():
        shutil.copy(src / "generation_config.json", out / "generation_config.json")
    done = time.monotonic()
    return {
        "out_dir": str(out),
        "load_s": round(loaded - started, 2),
        "quantize_s": round(quantized - loaded, 2),
        "save_s": round(done - quantized, 2),
        "seconds": round(done - started, 2),
        "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else None,
        "quantization_config": json.loads((out / "config.json").read_text()).get("quantization_config"),
    }


def logits(req: dict) -> dict:
    """Logits of a model directory on the given ids, computed with this venv's transformers and
    compressed-tensors (the versions that wrote the checkpoint), saved as a safetensors file."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    device = req.get("device", "cpu")
    say(f"logits of {req['model_dir']} on {len(req['samples'])} rows ({device})")
    model = AutoModelForCausalLM.from_pretrained(req["model_dir"], dtype=torch.float32, device_map={"": device}).eval()
    ids = torch.tensor(req["samples"], dtype=torch.long)
    rows = []
    with torch.no_grad():
        for start in range(0, ids.shape[0], 8):
            rows.append(model(ids[start:start + 8].to(device)).logits.float().cpu())
    save_file({"logits": torch.cat(rows).contiguous()}, req["logits_path"])
    out = {"logits_path": req["logits_path"],
           "linear_classes": sorted({type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__})}
    if req.get("prompts"):
        out["greedy"] = _greedy(model, req["prompts"], int(req.get("max_new_tokens", 32)), device)
    return out


def _greedy(model, prompts, max_new_tokens: int, device: str) -> list[list[int]]:
    """Greedy continuations (token ids) of each prompt, one at a time (no padding)."""
    import torch

    out = []
    with torch.no_grad():
        for ids in prompts:
            tensor = torch.tensor([ids], dtype=torch.long, device=device)
            generated = model.generate(tensor, attention_mask=torch.ones_like(tensor),
                                       max_new_tokens=max_new_tokens, do_sample=False)
            out.append(generated[0, len(ids):].tolist())
    return out


def run_job(req: dict) -> int:
    result_path = Path(req["result_path"])
    action = {"quantize": quantize, "logits": logits}.get(req.get("action", "quantize"))
    try:
        if action is None:
            raise ValueError(f"unknown action {req.get('action')!r}")
        result = action(req)
        status = 0
    except Exception as exc:  # the caller reads the error from the result, the traceback from the log
        traceback.print_exc()
        result, status = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}, 1
    result.update(action=req.get("action", "quantize"), versions=versions(), peak_rss_bytes=peak_rss_bytes(),
                  pid=os.getpid())
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, result_path)
    return status


def main(argv: list[str]) -> int:
    """REQUEST.json holds one job, or {"jobs": [...]} run in order in this process (one import of
    llm-compressor); the first failing job stops the rest."""
    if len(argv) != 2:
        print("usage: python worker.py REQUEST.json", file=sys.stderr)
        return 2
    req = json.loads(Path(argv[1]).read_text())
    jobs = req.get("jobs", [req])
    for i, job in enumerate(jobs):
        what = (f"{job.get('method', '').upper()} {job.get('scheme', '')} -> {job.get('out_dir')}"
                if job.get("action", "quantize") == "quantize" else f"logits of {job.get('model_dir')}")
        say(f"job {i + 1}/{len(jobs)}: {what}")
        if run_job(job):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
