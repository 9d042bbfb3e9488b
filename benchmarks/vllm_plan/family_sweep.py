"""`plan --engine vllm` for this year's reference configs on 6, 8, 12, 16 and 24 GB cards: the
longest --max-model-len that starts (bf16 weights, utilization 0.9, vLLM 0.32, the serve defaults)
and the max concurrency vLLM would log at 8192 tokens (or at that longest length when shorter).

    .venv/bin/python benchmarks/vllm_plan/family_sweep.py [--version 0.32] [--out FILE]

Writes measurements/vllm_plan/family_sweep.json and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.commands.plan_vllm_cards import AT_TOKENS as AT, card_cell  # noqa: E402
from harness.errors import UsageError  # noqa: E402
from harness.memory.fit.gpus import resolve_gpu  # noqa: E402
from harness.memory.vllm.vllm_plan import plan  # noqa: E402
from harness.memory.vllm.vllm_query import VllmQuery  # noqa: E402
from harness.memory.vllm.vllm_model import model_facts  # noqa: E402

MODELS = ["gemma-3-1b", "gemma-3-4b", "gemma-4-e2b", "gemma-4-e4b", "qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b",
          "qwen3.5-9b", "qwen3-next-80b-a3b", "gpt-oss-20b", "olmo-3-7b", "lfm2-1.2b", "granite-4.0-h-tiny"]
CARDS = {"6 GB": "rtx-4050-6gb", "8 GB": "rtx-4060-8gb", "12 GB": "rtx-3060-12gb", "16 GB": "rtx-4060-ti-16gb",
         "24 GB": "rtx-4090-24gb"}
OUT = ROOT / "measurements" / "vllm_plan" / "family_sweep.json"


def cell(facts, gpu, version: str) -> dict:
    q = VllmQuery(gpu=gpu, gpu_memory_utilization=0.9, max_model_len=AT, vllm_version=version)
    try:
        return card_cell(facts, q, plan)
    except UsageError as exc:
        return {"verdict": "refused", "reason": str(exc)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.32")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    rows = []
    print(f"vLLM {args.version}, bf16, utilization 0.9: longest max-model-len that starts / max concurrency at "
          f"{AT} tokens (or at the longest when shorter)")
    print(f"{'model':20s} " + " ".join(f"{c:>20s}" for c in CARDS))
    for name in MODELS:
        facts = model_facts(name)
        cells = {label: cell(facts, resolve_gpu(card), args.version) for label, card in CARDS.items()}
        rows.append({"model": name, "cards": {label: {"gpu": CARDS[label], **c} for label, c in cells.items()}})
        texts = [(f"{c['longest_max_model_len']:,} / {c['max_concurrency']:.1f}x@{c['at'] // 1024}k"
                  if c["verdict"] == "yes" else c["verdict"]) for c in cells.values()]
        print(f"{name:20s} " + " ".join(f"{t:>20s}" for t in texts))
    write_json(args.out, {"vllm_version": args.version, "utilization": 0.9, "at_tokens": AT, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
