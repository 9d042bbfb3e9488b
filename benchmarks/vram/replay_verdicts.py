"""plan --train's question answered by replaying torch's caching allocator on each committed boundary
case's traced step (harness.memory.replay.step_trace, harness.memory.replay.allocator_sim), against what ran on
the H200 under an emulated 6 GiB card: a real OOM or not.

Each case is traced on the meta device (about 5-10 s on one core) and replayed, for each margin,
under (budget - the row's CUDA context) / (1 + margin): it fits if it runs without OOM there.
Rows go to reports/vram-replay.json as they come (atomic writes; a rerun resumes), then the table:
per margin, agreement and predicted fits that ran out, over all cases and leaving each run out.

    python benchmarks/vram/replay_verdicts.py [--jobs 2] [--runs families] [--out reports/vram-replay.json]
        [--run-dir vram/families/run-18]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from case_pool import case_key, rows_done, work_through  # noqa: E402

MARGINS = tuple(x / 1000 for x in range(0, 31, 5))  # 0 to 3% in steps of 0.5%


def _replay(args: tuple) -> dict:
    key, config, query, attention, line, fits, run = args
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from harness.memory.replay.step_trace import trace_training_step
    from harness.memory.replay.step_verdict import fits_under

    t0 = time.perf_counter()
    try:
        trace = trace_training_step(config, query, attention)
    except Exception as exc:  # noqa: BLE001 - the row says why; the others go on
        return {"key": key, "run": run, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"key": key, "run": run, "fits": fits, "line_bytes": line, "traced_peak_bytes": trace.train_peak_bytes,
            "replay_fits": {f"{m:.3f}": fits_under(trace.events, line, m) for m in MARGINS},
            "events": len(trace.events), "seconds": round(time.perf_counter() - t0, 1)}


def _said(row: dict, margin: float) -> bool:
    return row["replay_fits"][f"{margin:.3f}"]


def table(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if "replay_fits" in r]
    runs = sorted({r["run"] for r in rows})
    out = [f"{len(rows)} cases; verdict: the traced steps replay without OOM under (budget - context) / (1 + margin)"]
    for m in MARGINS:
        said = [(_said(r, m), r["fits"]) for r in rows]
        agree = sum(a == b for a, b in said)
        false_fits = sum(a and not b for a, b in said)
        out.append(f"  margin {m:.3f}: {agree}/{len(rows)} agree ({agree / len(rows):.1%}), {false_fits} predicted fits ran out")
    out.append("leave one run out: the smallest margin with no predicted fit running out on the other runs, "
               "tested on the one left out")
    total = agree_all = ff_all = 0
    for run in runs:
        rest = [r for r in rows if r["run"] != run]
        chosen = next((m for m in MARGINS if not any(_said(r, m) and not r["fits"] for r in rest)), MARGINS[-1])
        mine = [r for r in rows if r["run"] == run]
        said = [(_said(r, chosen), r["fits"]) for r in mine]
        agree, ff = sum(a == b for a, b in said), sum(a and not b for a, b in said)
        total, agree_all, ff_all = total + len(mine), agree_all + agree, ff_all + ff
        out.append(f"  {run:12s} margin {chosen:.3f}: {agree}/{len(mine)} agree, {ff} predicted fits ran out")
    out.append(f"  held out, together: {agree_all}/{total} ({agree_all / max(total, 1):.1%}), {ff_all} predicted fits ran out")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="cases traced at once (one core each)")
    ap.add_argument("--runs", default="families", help="runs whose name starts with this (default: the families "
                    "runs, transformers 5.17 as the tracer's stand-ins were read)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "vram-replay.json")
    ap.add_argument("--limit", type=int, default=None, help="the first N cases only")
    ap.add_argument("--run-dir", action="append", default=[],
                    help="a families run (a directory, an archive or a measurements/ name: vram/families/run-N) not yet among the "
                         "committed runs: its boundary cases only")
    args = ap.parse_args(argv)
    from choose_reserve import boundary_cases

    from harness.memory.fit.estimate import Query
    from harness.memory.fit.config_file import load_config
    from harness.memory.measured.train_matrix import FAMILY_TARGET_SETS

    cases = [c for c in boundary_cases(run_dirs=tuple(args.run_dir)) if c.run.startswith(args.runs)][:args.limit]
    done = rows_done(args.out, "replay_fits")
    todo = []
    for c in cases:
        key = case_key(c.row, c.run)
        if key in done:
            continue
        r = c.row
        query = Query(r["precision"], "train", seq_len=r["seq_len"], batch=r["batch"], lora_r=r["lora_r"],
                      lora_targets=FAMILY_TARGET_SETS[r["targets"]], grad_checkpointing=r["grad_checkpointing"],
                      optimizer=r["optimizer"])
        attention = c.shape.traits.attention if c.shape.traits else "sdpa"
        todo.append((key, load_config(r["arch"])[0], query, attention, c.line, c.fits, c.run))
    work_through(_replay, todo, done, args.out, args.jobs,
                 lambda row: str(row.get("replay_fits", row.get("error"))), table, len(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
