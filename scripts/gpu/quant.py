"""The quantize step on a real-size architecture, on a GPU: GPTQ and AWQ W4A16 with llm-compressor,
its wall time and peak memory, the drift (KL) against the unquantized model, and the predicted
against the measured weights of the checkpoint: as stored, as transformers' compressed-tensors
support holds it after from_pretrained (packed), and after the first forward (decompressed to bf16).

Run from the tree on the GPU machine (scripts/gpu/quant.sh shows how the wheels are brought):
    PYTHONPATH=/tmp/site:$PWD python3 scripts/gpu/quant.py [ARCH]     (default qwen2.5-1.5b)
Writes $OUT/quant-gpu.json after every stage (a cut-off run keeps what it measured).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from harness import atomic
from harness.memory.fit import estimate as E
from harness.memory.fit.shape import model_shape
from harness.memory.fit.weights import w4a16_linear_bytes, weight_bytes
from harness.modeldir import check_dir
from harness.modeldir.safetensors_header import read_header
from harness.models import save_random_model
from harness.quant import QuantizeJob, drift, run_quantize
from harness.quant.drift import model_logits
from harness.quant.tokens import CALIBRATION_SEED, EVALUATION_SEED, random_token_ids

ARCH = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-1.5b"
OUT = Path(os.environ.get("OUT", "reports/gpu-quant"))
WORK = Path(os.environ.get("QUANT_WORK", "/tmp/quant-gpu"))
DEVICE = os.environ.get("QUANT_DEVICE", "cuda:0")  # cpu: a dry run of the script on a tiny model directory
CUDA = DEVICE.startswith("cuda")
PYTHON = os.environ.get("QUANT_PYTHON", sys.executable)  # the interpreter that has llm-compressor
METHODS = os.environ.get("QUANT_METHODS", "gptq,awq").split(",")
summary: dict = {"arch": ARCH, "device": torch.cuda.get_device_name(0) if CUDA else "cpu", "torch": torch.__version__,
                 "stages": {}}


def save() -> None:
    atomic.write_text(OUT / "quant-gpu.json", json.dumps(summary, indent=1))


def stored_bytes(d: Path) -> int:
    total = 0
    for f in d.glob("*.safetensors"):
        with open(f, "rb") as fh:
            total += sum(t.end - t.begin for t in read_header(fh, f.stat().st_size).tensors.values())
    return total


def predicted_stored(shape, asym: bool) -> int:
    linear = sum(g.count * w4a16_linear_bytes(g.in_features, g.out_features, zero_points=asym, rounded=False)
                 for g in shape.linears)
    return linear + 2 * (shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params)


def loaded(d: Path) -> dict:
    """Allocator bytes held by the loaded model and the peak while loading, over what was there."""
    from harness.models import load_model

    if not CUDA:
        return {"held_bytes": 0, "peak_bytes": 0, "load_s": 0.0, "linear_classes": []}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    model = load_model(d, "bf16", DEVICE)
    torch.cuda.synchronize()
    out = {"held_bytes": torch.cuda.memory_allocated() - before, "peak_bytes": torch.cuda.max_memory_allocated() - before,
           "load_s": round(time.monotonic() - started, 2),
           "linear_classes": sorted({type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__})}
    # where the parameters live: compressed-tensors may keep decompressed weights offloaded on the host
    by_device: dict[str, int] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        key = f"{tensor.device.type}:{tensor.dtype}".replace("torch.", "")
        by_device[key] = by_device.get(key, 0) + tensor.numel() * tensor.element_size()
    out["tensor_bytes_by_device"] = by_device
    out["hf_device_map_values"] = sorted({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()})
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        model(torch.zeros(1, 256, dtype=torch.long, device=DEVICE))
    torch.cuda.synchronize()
    out["after_forward_held_bytes"] = torch.cuda.memory_allocated() - before
    out["forward_peak_bytes"] = torch.cuda.max_memory_allocated() - before
    del model
    torch.cuda.empty_cache()
    return out


def pct(measured: int, predicted: int) -> float | None:
    if not measured:
        return None
    return round(100.0 * (predicted - measured) / measured, 3)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    base = Path(ARCH) if Path(ARCH).is_dir() else WORK / "base"
    started = time.monotonic()
    if not (base / "config.json").is_file():
        save_random_model(ARCH, base, dtype="bf16", device=DEVICE)
    summary["stages"]["random_base_s"] = round(time.monotonic() - started, 1)
    config = json.loads((base / "config.json").read_text())
    shape = model_shape(base if base != WORK / "base" else ARCH)
    samples = random_token_ids(config["vocab_size"], 32, 128, seed=CALIBRATION_SEED)
    eval_ids = torch.tensor(random_token_ids(config["vocab_size"], 8, 256, seed=EVALUATION_SEED))
    reference = model_logits(base, eval_ids, DEVICE, "bf16").to(DEVICE)
    base_load = loaded(base)
    bf16_pred = weight_bytes(shape, "bf16")
    summary["bf16_base"] = base_load | {"predicted_bytes": bf16_pred, "error_pct": pct(base_load["held_bytes"], bf16_pred)}
    save()

    for method, scheme in (("gptq", "W4A16"), ("awq", "W4A16_ASYM")):
        if method not in METHODS:
            continue
        out_dir = WORK / method
        # AWQ's scale grid: 10 points instead of 20 halves its search (the device budget is minutes)
        job = QuantizeJob(base, out_dir, samples if CUDA else samples[:4], method=method, scheme=scheme, device=DEVICE,
                          awq_n_grid=10 if CUDA else 4)
        (result,) = run_quantize(PYTHON, [job], log_path=OUT / "quantize.log")
        entry = {"scheme": scheme, "quantize_s": result.quantize_s, "job_s": result.seconds,
                 "process_s": result.process_seconds, "peak_gpu_bytes": result.peak_gpu_bytes,
                 "peak_rss_bytes": result.peak_rss_bytes, "versions": result.versions,
                 "samples": f"{len(job.samples)} x {len(job.samples[0])}", "awq_n_grid": job.awq_n_grid if method == "awq" else None}
        summary[method] = entry
        save()
        report = check_dir(out_dir)
        entry["check_dir"] = {"ok": report.ok, "findings": [f.code for f in report.findings]}
        stored = stored_bytes(out_dir)
        predicted = predicted_stored(shape, asym=scheme.endswith("ASYM"))
        entry["stored"] = {"measured_bytes": stored, "predicted_bytes": predicted, "error_pct": pct(stored, predicted)}
        measured = loaded(out_dir)
        est = E.estimate(shape, E.Query("w4a16", "weights")).breakdown
        # transformers 5.17 + compressed-tensors 0.19 load it packed and decompress at the first forward
        entry["transformers_loaded"] = measured | {
            "predicted_packed_bytes": est["weights"], "after_load_error_pct": pct(measured["held_bytes"], est["weights"]),
            "predicted_decompressed_bytes": est["transformers_decompressed_weights"],
            "after_forward_error_pct": pct(measured.get("after_forward_held_bytes", 0), est["transformers_decompressed_weights"])}
        entry["vllm_packed_predicted_bytes"] = est["weights"]
        result_drift = drift(reference, model_logits(out_dir, eval_ids, DEVICE, "bf16").to(DEVICE), eval_ids.to(DEVICE))
        entry["drift"] = result_drift.to_dict()
        save()
        print(f"{method}: quantize {result.quantize_s} s, peak GPU {(result.peak_gpu_bytes or 0) / 2**30:.2f} GiB, "
              f"stored {stored / 1e9:.3f} GB (pred {pct(stored, predicted)}%), held after load "
              f"{measured['held_bytes'] / 1e9:.3f} GB (pred {entry['transformers_loaded']['after_load_error_pct']}%), "
              f"after a forward {measured.get('after_forward_held_bytes', 0) / 1e9:.3f} GB "
              f"(pred {entry['transformers_loaded']['after_forward_error_pct']}%), "
              f"{result_drift.verdict()}", flush=True)
    summary["total_s"] = round(time.monotonic() - started, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
