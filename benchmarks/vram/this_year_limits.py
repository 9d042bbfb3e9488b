"""The longest QLoRA context and generation context of this year's reference configs on 6 and 8 GiB
cards (plan's reserve rule, an unverified family's uncertainty kept free), with the KV cache a token
costs and the cache layers transformers keeps. Writes a Markdown table.

    .venv/bin/python benchmarks/vram/this_year_limits.py [--out FILE.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.memory.fit import budget as B  # noqa: E402
from harness.memory.fit.cache_layout import summary  # noqa: E402
from harness.memory.fit.estimate import Query, estimate  # noqa: E402
from harness.memory.fit.shape import model_shape  # noqa: E402
from harness.memory.fit.config_file import load_config  # noqa: E402

CONFIGS = ("gemma-4-e2b", "gemma-4-e4b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "gpt-oss-20b", "lfm2-1.2b",
           "granite-4.0-h-tiny")
CARDS = {"6 GiB": 6 * 2**30, "8 GiB": 8 * 2**30}
RECIPE = dict(lora_r=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), optimizer="paged_adamw_8bit")


def row(name: str) -> list[str]:
    try:
        shape = model_shape(name)
    except Exception as exc:  # noqa: BLE001 - a refusal is a row
        return [name, f"refused: {exc}"]
    limit = B.context_limit(load_config(name)[0])
    kv = estimate(shape, Query("bf16", "prefill", seq_len=2048)).breakdown["kv_cache"]
    kv1 = estimate(shape, Query("bf16", "prefill", seq_len=1024)).breakdown["kv_cache"]
    weights = estimate(shape, Query("nf4-dq", "weights")).breakdown["weights"]
    cells = [name, f"{weights / 2**30:.2f}", f"{(kv - kv1) / 1024 / 1024:.0f}",
             ", ".join(f"{n} {k.replace('Layer', '')}" for k, n in summary(shape.cache or ()).items())]
    for card in CARDS.values():
        for train in (True, False):
            (p,) = B.plan(shape, card, train=train, precisions=("nf4-dq",), max_seq_len=limit.tokens,
                          **(RECIPE if train else {}))
            value = str(p.max_seq_len) if p.fits else ("tight" if p.verdict == "tight" else "no")
            cells.append(f"{value} (±{p.uncertainty:.1%})".replace(".0%", "%") if p.uncertainty else value)
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    head = ["config", "nf4-dq weights GiB", "KV MiB per 1024 tokens (bf16)", "cache layers"] + [
        f"{card} {what}" for card in CARDS for what in ("QLoRA context", "generation context")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row(n)) + " |" for n in CONFIGS]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
