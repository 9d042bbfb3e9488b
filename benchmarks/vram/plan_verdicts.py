"""plan --train's verdicts, replayed (harness.memory.replay_limits), against what ran on the H200
under an emulated 6 GiB card, per boundary case of a families run: a real OOM or not.

For each case plan runs as `plan --train --budget 6GiB --context-bytes <the row's measured CUDA
context> --batch-seq-len <the case's length>` would, for the one limit that decides the case: the
longest context at batch 1 (batch-1 cases) or the largest batch at the case's length. The case is
predicted to fit when its length (or batch) is within that limit. The reserve rule's own limits are
kept beside it. Rows go to --out as they come (atomic writes; a rerun resumes), then the table.

    python benchmarks/vram/plan_verdicts.py --run-dir vram/families/run-18 [--jobs 2]
        [--out reports/vram-plan-verdicts.json]
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

from case_pool import case_key, replayed_limit_of, rows_done, work_through  # noqa: E402


def _plan_case(args: tuple) -> dict:
    key, run, r, fits = args
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    axis, value = ("seq_len", r["seq_len"]) if r["batch"] == 1 else ("batch", r["batch"])
    try:
        plan, _, _, found = replayed_limit_of(r, axis)
    except Exception as exc:  # noqa: BLE001 - the row says why; the others go on
        return {"key": key, "run": run, "error": f"{type(exc).__name__}: {exc}"[:300]}
    reserve = plan.max_seq_len if axis == "seq_len" else plan.max_batch
    return {"key": key, "run": run, "fits": fits, "axis": axis, "value": value,
            "replayed_limit": found.value, "closed": found.closed, "traces": len(found.points),
            "plan_fits": found.value is not None and value <= found.value,
            "reserve_limit": reserve, "reserve_fits": reserve is not None and value <= reserve,
            "seconds": round(time.perf_counter() - t0, 1)}


def table(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if "plan_fits" in r]
    out = [f"{len(rows)} cases; {sum(r['fits'] for r in rows)} fitted, {sum(not r['fits'] for r in rows)} ran out"]
    for name, said in (("plan --train (replayed)", "plan_fits"), ("the reserve rule alone", "reserve_fits")):
        agree = sum(r[said] == r["fits"] for r in rows)
        false_fits = [r["key"] for r in rows if r[said] and not r["fits"]]
        out.append(f"  {name}: {agree}/{len(rows)} agree ({agree / max(len(rows), 1):.1%}), "
                   f"{len(false_fits)} predicted fits ran out{': ' + ', '.join(false_fits) if false_fits else ''}")
    traces = sorted(r["traces"] for r in rows)
    if traces:
        out.append(f"  traces per limit: median {traces[len(traces) // 2]}, most {traces[-1]}; "
                   f"{sum(not r['closed'] for r in rows)} searches not closed")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="cases planned at once (one core each)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "vram-plan-verdicts.json")
    ap.add_argument("--runs", default="families", help="runs whose name starts with this (default: the families "
                    "runs, transformers 5.17 as the tracer's stand-ins were read)")
    ap.add_argument("--run-dir", action="append", default=[],
                    help="a families run (a directory, an archive or a measurements/ name: vram/families/run-N): its boundary cases "
                         "(default: every committed run's)")
    args = ap.parse_args(argv)
    from choose_reserve import boundary_cases

    cases = [c for c in boundary_cases(run_dirs=tuple(args.run_dir)) if c.run.startswith(args.runs)]
    done = rows_done(args.out, "plan_fits")
    todo = [(k, c.run, c.row, c.fits) for c in cases if (k := case_key(c.row, c.run)) not in done]
    work_through(_plan_case, todo, done, args.out, args.jobs,
                 lambda row: f"{row.get('plan_fits', row.get('error'))} (ran {'fit' if row.get('fits') else 'out'}; "
                             f"{row.get('seconds')} s)", table, len(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
