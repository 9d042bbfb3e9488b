"""Merging a QLoRA adapter: into the 4-bit base (what check-dir refuses) vs a bf16 base.

    python benchmarks/modeldir/gpu_merge_4bit.py --device cuda:0 --out reports/gpu-merge-4bit.json [--models tiny,qwen2.5-0.5b]

For each model: train a LoRA adapter on the NF4 base (QLoRA), then compare next-token logits of
(ref) the NF4 base + the unmerged adapter, the way it was trained, with
(4bit) the adapter merged into the NF4 base and saved (a bitsandbytes checkpoint),
(bf16) the adapter merged into the bf16 base and saved, and
(deq) the NF4 base dequantized to bf16, adapter merged, saved.
Each saved directory goes through check_dir. Figures: max |diff| / std(ref), top-1 agreement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _compare(ref, other) -> dict:
    diff = (other.float() - ref.float()).abs()
    return {"max_abs_diff_over_std": round(float(diff.max() / ref.float().std()), 4),
            "mean_abs_diff_over_std": round(float(diff.mean() / ref.float().std()), 4),
            "top1_agreement": round(float((other.argmax(-1) == ref.argmax(-1)).float().mean()), 4)}


def run_one(name: str, device: str, work: Path) -> dict:
    import torch
    from peft import PeftModel

    from harness.nan import lora
    from harness.modeldir import check_dir
    from harness.models import load_model, save_random_model, tiny_model_dir

    if name == "tiny":
        base_dir = tiny_model_dir("qwen2", work / "cache")
    else:
        base_dir = save_random_model(name, work / name, dtype="bf16")
    torch.manual_seed(0)
    vocab = json.loads((base_dir / "config.json").read_text())["vocab_size"]
    ids = torch.randint(0, min(vocab, 2000), (4, 64), device=device)
    result: dict = {"model": name}

    started = time.monotonic()
    q_base = load_model(base_dir, "nf4", device)
    peft_model = lora.attach_lora(q_base, r=16, init_nonzero=True)
    result["qlora_losses"] = lora.train_steps(peft_model, [ids], steps=3, lr=1e-3).losses
    adapter = work / f"{name}-adapter"
    peft_model.save_pretrained(adapter)
    with torch.no_grad():
        ref = peft_model(ids).logits
    result["train_s"] = round(time.monotonic() - started, 1)

    outcomes = {}
    # (4bit) merge into the quantized base
    merged = peft_model.merge_and_unload()
    with torch.no_grad():
        outcomes["4bit"] = {"compare": _compare(ref, merged(ids).logits)}
    merged.save_pretrained(work / f"{name}-merged-4bit")
    del merged, peft_model, q_base

    # (bf16) merge into the bf16 base
    base = load_model(base_dir, "bf16", device)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    with torch.no_grad():
        outcomes["bf16"] = {"compare": _compare(ref, merged(ids).logits)}
    merged.save_pretrained(work / f"{name}-merged-bf16")
    del merged, base

    # (deq) dequantize the NF4 base, then merge
    try:
        deq = load_model(base_dir, "nf4", device).dequantize()
        deq = deq.to(torch.bfloat16)
        merged = PeftModel.from_pretrained(deq, adapter).merge_and_unload()
        with torch.no_grad():
            outcomes["deq"] = {"compare": _compare(ref, merged(ids).logits)}
        merged.save_pretrained(work / f"{name}-merged-deq")
        del merged, deq
    except Exception as exc:  # noqa: BLE001 - report, keep the other figures
        outcomes["deq"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}

    for key, value in outcomes.items():
        d = work / f"{name}-merged-{key}"
        if d.is_dir():
            for tok in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
                if (base_dir / tok).exists():
                    (d / tok).write_bytes((base_dir / tok).read_bytes())
            report = check_dir(d)
            value["check_dir_ok"] = report.ok
            value["check_dir_errors"] = sorted({f.code for f in report.errors})
            value["dir_bytes"] = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    result["merges"] = outcomes
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--models", default="tiny,qwen2.5-0.5b")
    parser.add_argument("--out", default=str(ROOT / "reports" / "gpu-merge-4bit.json"))
    args = parser.parse_args()
    import peft
    import torch
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
           "python": platform.python_version(), "device": args.device}
    try:
        import bitsandbytes

        env["bitsandbytes"] = bitsandbytes.__version__
    except Exception as exc:  # noqa: BLE001
        env["bitsandbytes"] = f"unavailable: {exc}"
    if args.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
    figures = {"environment": env, "runs": []}
    work = Path(tempfile.mkdtemp(prefix="merge4bit-"))
    for name in args.models.split(","):
        t = time.monotonic()
        try:
            run = run_one(name, args.device, work)
        except Exception as exc:  # noqa: BLE001
            run = {"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        run["seconds"] = round(time.monotonic() - t, 1)
        figures["runs"].append(run)
        print(json.dumps(run), file=sys.stderr, flush=True)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(figures, indent=2))
        os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
