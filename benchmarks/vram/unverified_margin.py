"""The uncertainty an unverified family's estimate carries (harness.memory.family.families.UNVERIFIED_MARGIN),
derived from the spread of the measured families.

A family no GPU measurement backs is estimated with its exact layout (weights, cache) and the
transient terms fitted on Llama/Qwen2; what it does differently in its transients is unknown until
measured. The measured families show how far that gets: each committed families-run row is estimated
again as the generic path would estimate its family - the same layout, its own traits dropped (a
bare dense family's: SDPA, two norms, no q/k norms, no soft-capping) - and the error's spread is
read per mode group. The margin is the worst under-prediction over those rows (the side a false fit
comes from), rounded up to the next half per cent.

    PYTHONPATH=. .venv/bin/python benchmarks/vram/unverified_margin.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import measurements  # noqa: E402
from harness.memory.fit.estimate import estimate  # noqa: E402
from harness.memory.family.families import at_transformers, traits_from_config  # noqa: E402
from harness.memory.measured.families_truth import load_rows  # noqa: E402
from harness.memory.measured.matrix_readback import measured_bytes, row_query  # noqa: E402
from harness.memory.fit.shape import model_shape  # noqa: E402


def generic(shape):
    """The family as the generic path sees an unmodelled one: its layout, a bare dense family's traits."""
    bare = traits_from_config({"model_type": "llama"})
    return replace(shape, traits=replace(bare, family=shape.family, sliding_layers=shape.traits.sliding_layers))


def errors(run_dirs) -> dict[str, list[dict]]:
    rows = load_rows(run_dirs)
    out: dict[str, list[dict]] = {"inference": [], "train": []}
    shapes: dict = {}
    for group, items in (("inference", rows["infer"]), ("train", rows["train"])):
        for row in items:
            if row.get("error") or row.get("role") == "boundary" or row.get("oom"):
                continue
            measured = measured_bytes(row) if group == "inference" else row.get("peak_bytes")
            if not measured:
                continue
            key = (row["arch"], row.get("transformers"))
            shape = shapes.setdefault(key, generic(at_transformers(model_shape(row["arch"]), row.get("transformers"))))
            pred = estimate(shape, row_query(row)).peak_bytes
            out[group].append({"arch": row["arch"], "mode": row["mode"], "error": (pred - measured) / measured})
    return out


def margin_of(errs: list[dict]) -> float:
    worst_under = max((-e["error"] for e in errs), default=0.0)
    return math.ceil(max(worst_under, 0.0) * 200) / 200


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the per-row errors and the margins here")
    args = ap.parse_args(argv)
    errs = errors(measurements.families_runs())
    result = {}
    for group, rows in errs.items():
        by_arch: dict[str, list[float]] = {}
        for r in rows:
            by_arch.setdefault(r["arch"], []).append(r["error"])
        result[group] = {"margin": margin_of(rows), "rows": len(rows),
                         "by_arch": {a: {"n": len(v), "worst_under": min(v), "worst_over": max(v)} for a, v in by_arch.items()}}
        print(f"{group}: margin {result[group]['margin']:.1%} over {len(rows)} rows of {len(by_arch)} families")
        for a, s in result[group]["by_arch"].items():
            print(f"  {a:18s} n {s['n']:3d}  worst under {s['worst_under']:+.1%}  worst over {s['worst_over']:+.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
