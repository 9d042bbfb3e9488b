"""plan --train's verdicts, replayed (harness.memory.replay.replay_limits), against what ran on the H200
under an emulated 6 GiB card, per boundary case of a families run: a real OOM or not.

For each case plan runs as `plan --train --budget 6GiB --context-bytes <the row's measured CUDA
context> --batch-seq-len <the case's length>` would, for the one limit that decides the case: the
longest context at batch 1 (batch-1 cases) or the largest batch at the case's length. The case is
predicted to fit when its length (or batch) is within that limit. The reserve rule's own limits are
kept beside it. Rows go to --out as they come (atomic writes; a rerun resumes), then the table.

    python benchmarks/vram/plan_verdicts.py --run-dir vram/families/run-18 [--jobs 2]
        [--out reports/vram-plan-verdicts.json] [--sample N [--seed S]] [--against ROWS.json]

--sample N plans a stratified sample of the cases instead of all: N split evenly over the
families, and within a family over (axis, fitted or ran out). --against compares each row with a
committed rows file (measurements/vram/replay/plan-verdicts-committed.json): the same limit, the
same verdict.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections import defaultdict
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


def stratified(cases: list, n: int, seed: int) -> list:
    """n of the cases: an even share per family (arch), each share spread evenly over the family's
    strata (axis, fitted or ran out), drawn at random within a stratum."""
    rng = random.Random(seed)
    strata: dict = defaultdict(lambda: defaultdict(list))
    for c in sorted(cases, key=lambda c: case_key(c.row, c.run)):
        strata[c.row["arch"]][("seq_len" if c.row["batch"] == 1 else "batch", c.fits)].append(c)
    shares = []
    for f, arch in enumerate(sorted(strata)):
        share = n // len(strata) + (f < n % len(strata))
        groups = [rng.sample(g, len(g)) for _, g in sorted(strata[arch].items())]
        picked = []
        for i in range(share):  # round robin over the strata
            g = [g for g in groups if g]
            if not g:
                break
            picked.append(g[i % len(g)].pop())
        shares.append(picked)
    # the families interleaved, so a run stopped early still covers all of them
    return [c for i in range(max(map(len, shares), default=0)) for s in shares if i < len(s) for c in [s[i]]]


def compared(rows: list[dict], against: Path) -> list[str]:
    """Each row's limit and verdict beside the committed row of its case."""
    old = {r["key"]: r for r in json.loads(against.read_text())["rows"] if "plan_fits" in r}
    pairs = [(r, old[r["key"]]) for r in rows if "plan_fits" in r and r["key"] in old]
    same_limit = sum(r["replayed_limit"] == o["replayed_limit"] for r, o in pairs)
    same_verdict = sum(r["plan_fits"] == o["plan_fits"] for r, o in pairs)
    out = [f"against {against.name}: {len(pairs)} cases; the same replayed limit {same_limit}/{len(pairs)}, "
           f"the same verdict {same_verdict}/{len(pairs)}"]
    out += [f"  {r['key']}: limit {o['replayed_limit']} -> {r['replayed_limit']}, verdict {o['plan_fits']} -> "
            f"{r['plan_fits']} (ran {'fit' if r['fits'] else 'out'})" for r, o in pairs
            if r["replayed_limit"] != o["replayed_limit"] or r["plan_fits"] != o["plan_fits"]]
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
    ap.add_argument("--sample", type=int, default=None, help="a stratified sample of this many cases")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--against", type=Path, default=None, help="committed rows to compare each row with")
    args = ap.parse_args(argv)
    from choose_reserve import boundary_cases

    cases = [c for c in boundary_cases(run_dirs=tuple(args.run_dir)) if c.run.startswith(args.runs)]
    if args.sample:
        cases = stratified(cases, args.sample, args.seed)
    done = rows_done(args.out, "plan_fits")
    todo = [(k, c.run, c.row, c.fits) for c in cases if (k := case_key(c.row, c.run)) not in done]
    against = args.against
    work_through(_plan_case, todo, done, args.out, args.jobs,
                 lambda row: f"{row.get('plan_fits', row.get('error'))} (ran {'fit' if row.get('fits') else 'out'}; "
                             f"{row.get('seconds')} s)",
                 (lambda rows: table(rows) + compared(rows, against)) if against else table, len(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
