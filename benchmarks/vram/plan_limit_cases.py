"""Cases at plan --train's own replayed limits, for the H200 to judge (families.py --set planlimit,
the nineteenth run): per drawn recipe, the longest context at batch 1 that plan answers (replayed
on torch's caching allocator, harness.memory.replay.replay_limits), and the context about 1% of the
step's bytes past it. The first must fit on the card; the second says how much the replay's
margin leaves unused.

Recipes: two per family of the boundary sets (random LoRA targets, rank, checkpointing and
optimizer; seed PLANLIMIT_SEED), none at a committed setting, planned for a 6 GiB card losing the
CUDA context the H200's capped processes measured (CONTEXT_BYTES). Written to --out, committed, and
read by families.py, so the run needs no tracing on the device.

    python benchmarks/vram/plan_limit_cases.py [--jobs 2] [--out measurements/vram/plan-limit-cases.json]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import random
import sys
import warnings
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import atomic  # noqa: E402

PLANLIMIT_SEED = 2740
PER_FAMILY = 2
CONTEXT_BYTES = 639631360  # the CUDA context every capped process of the eighteenth run measured
TRANSFORMERS = "5.17.0"  # the H200's: the attention the trace follows
PAST = 0.01  # the second case: the fewest more tokens whose planned bytes are this much larger


def recipes(rng: random.Random, seen: set[tuple]) -> list[dict]:
    """PER_FAMILY recipes per family, none a recipe a committed row ran at batch 1."""
    from families import BOUNDARY_FAMILIES, FRESH_RANKS, attn_targets

    ran = {(s[0], s[1], s[2], s[3], s[6]) for s in seen if s[4] == 1}  # recipes run at batch 1, any length
    out = []
    for arch in BOUNDARY_FAMILIES:
        mine = 0
        while mine < PER_FAMILY:
            r = {"arch": arch, "targets": rng.choice(("all", attn_targets(arch))), "lora_r": rng.choice(FRESH_RANKS),
                 "grad_checkpointing": rng.random() < 0.8, "optimizer": rng.choice(("adamw_torch", "adamw_8bit"))}
            if r in out or tuple(r.values()) in ran:
                continue
            out.append(r)
            mine += 1
    return out


def committed() -> set[tuple]:
    """The settings of every training row committed before the nineteenth run: the families runs
    and the truth runs, and the sixteenth to eighteenth runs (outside measurements.families_runs())."""
    from families import committed_settings, setting

    import measurements
    from harness.memory.measured import families_truth as T

    seen = committed_settings(len(measurements.families_runs()), truth=True)
    for run in (16, 17, 18):
        seen |= {setting(r) for r in T.load_rows(measurements.unpacked(f"vram/families/run-{run:02d}"))["train"]}
    return seen


def limit_of(recipe: dict) -> dict:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from case_pool import replayed_limit_of
    from families import BUDGET

    from harness.memory.fit.estimate import estimate

    row = dict(recipe, precision="nf4-dq", budget_bytes=BUDGET, context_bytes=CONTEXT_BYTES, seq_len=2048,
               transformers=TRANSFORMERS)
    plan, shape, q, found = replayed_limit_of(row, "seq_len")
    out = dict(recipe, limit=found.value, closed=found.closed, reserve_rule=plan.max_seq_len, traces=len(found.points))
    if found.value:
        planned = lambda s: estimate(shape, replace(q, seq_len=s)).planned_bytes  # noqa: E731
        past = found.value + 1
        while planned(past) < (1 + PAST) * planned(found.value):
            past += 1
        out["past"] = past
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "measurements" / "vram" / "plan-limit-cases.json")
    args = ap.parse_args(argv)
    todo = recipes(random.Random(PLANLIMIT_SEED), committed())
    rows = []
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap(limit_of, todo):
            rows.append(row)
            atomic.write_json(args.out, {"seed": PLANLIMIT_SEED, "context_bytes": CONTEXT_BYTES,
                                         "transformers": TRANSFORMERS, "cases": rows})
            print(f"[{len(rows)}/{len(todo)}] {row}", file=sys.stderr, flush=True)
        pool.close()  # let the workers exit before the pool's exit terminates them
        pool.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
