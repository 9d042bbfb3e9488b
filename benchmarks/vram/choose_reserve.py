"""Choose the training reserve (estimate.RESERVE_FRACTION["train"] and estimate.REALLOCATED_HOLES)
from every committed plan --train boundary case: the two truth runs (measurements/vram/truth/)
and the families runs (measurements.families_runs()), each a real OOM or not under an emulated
6 GiB card with torch's default caching allocator. With `--allocator expandable`, the reserve of
the verdict with expandable segments (budget.EXPANDABLE_TRAIN_RESERVE) from every capped run made
with them.

The rule: of the grid's settings that let no predicted fit run out, the one with the smallest
logistic loss on the margin (need / (budget - context) - 1, at a 1% scale: a verdict 1% on the
wrong side costs about as much as one 1% on the right side saves).

    python benchmarks/vram/choose_reserve.py [--runs N] [--allocator default|expandable]
    # N: the families runs in the choice (default: every committed one)
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import measurements  # noqa: E402
from harness.memory.fit import estimate as E  # noqa: E402
from harness.memory.measured import families_truth as T  # noqa: E402
from harness.memory.family.families import at_transformers  # noqa: E402
from harness.memory.measured.matrix_readback import row_query  # noqa: E402
from harness.memory.fit.shape import model_shape  # noqa: E402
from harness.memory.measured.train_matrix import load_truth, runs_expandable  # noqa: E402

FRACTIONS = tuple(x / 1000 for x in range(20, 71, 5))
LOGITS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.30)
QUARTERS = (0.0, 0.25, 0.5, 0.75, 1.0)
EXPANDABLE_FRACTIONS = tuple(x / 1000 for x in range(0, 81, 5))  # the peak's reserve alone: 0-8%


@dataclass
class Case:
    run: str
    row: dict
    shape: object
    est: E.Estimate
    line: int  # budget - this process's CUDA context
    fits: bool

    def planned(self, shares: dict[str, float]) -> int:
        """The peak and the holes these shares keep (estimate.fragmentation_parts)."""
        holes = E.fragmentation_parts(self.shape, row_query(self.row), self.est.breakdown, self.est.peak_bytes, shares)
        return self.est.peak_bytes + sum(holes.values())

    def margin(self, need: int, fraction: float) -> float:
        """How far `need` x (1 + fraction) lies past the line (negative: under it)."""
        return need * (1 + fraction) / self.line - 1


def boundary_cases(family_runs: int | None = None, expandable: bool = False, run_dirs: tuple = ()) -> list[Case]:
    """The capped cases: boundary rows with the default allocator, or every capped row run with
    expandable segments (the fifth run's misses and the seventh's refusals again, the eighth run).
    run_dirs: those runs only (a directory, an archive or a name such as vram/families/run-18),
    instead of the committed ones."""
    rows = [] if expandable or run_dirs else [dict(r, _run=r["run"]) for r in load_truth(measurements.truth_runs())[0]]
    dirs = measurements.families_runs()[:family_runs] if family_runs else measurements.families_runs()
    labelled = ([(f"families-{int(re.findall(r'[0-9]+', Path(d).name)[-1])}", measurements.run_dir(d))
                 for d in run_dirs] if run_dirs else [(f"families-{i}", d) for i, d in enumerate(dirs, 1)])
    for label, d in labelled:
        rows += [dict(r, _run=label) for r in T.load_rows(d)["train"]]
    shapes: dict = {}
    out = []
    for r in rows:
        wanted = r.get("budget_bytes") if expandable else r.get("role") == "boundary"
        if not wanted or r.get("error") or runs_expandable(r) is not expandable:
            continue
        key = (r["arch"], r.get("transformers"))
        shape = shapes.setdefault(key, at_transformers(model_shape(r["arch"]), r.get("transformers")))
        out.append(Case(r["_run"], r, shape, E.estimate(shape, row_query(r)), r["budget_bytes"] - r["context_bytes"],
                        not r["oom"]))
    return out


def score(margins: list[tuple[float, bool]]) -> tuple[int, int, float]:
    """(predicted fits that ran out, agreements, logistic loss at a 1% scale)."""
    false_fits = sum(m <= 0 and not fits for m, fits in margins)
    agree = sum((m <= 0) == fits for m, fits in margins)
    loss = sum(math.log1p(math.exp(100 * m if fits else -100 * m)) for m, fits in margins)
    return false_fits, agree, loss


def choose(cases: list[Case]) -> tuple[float, dict[str, float], tuple[int, int, float]]:
    best = None
    for logits, optimizer, upcast in itertools.product(LOGITS, QUARTERS, QUARTERS):
        shares = {"logits": logits, "optimizer_states": optimizer, "upcast": upcast}
        planned = [(c, c.planned(shares)) for c in cases]
        for fraction in FRACTIONS:
            s = score([(c.margin(need, fraction), c.fits) for c, need in planned])
            if s[0] == 0 and (best is None or s[2] < best[2][2]):
                best = (fraction, shares, s)
    if best is None:
        raise SystemExit("no setting on the grid lets every predicted fit fit")
    return best


def choose_expandable(cases: list[Case]) -> tuple[float, tuple[int, int, float]]:
    """The same rule for the peak's reserve alone: expandable segments keep no holes."""
    best = None
    for fraction in EXPANDABLE_FRACTIONS:
        s = score([(c.margin(c.est.peak_bytes, fraction), c.fits) for c in cases])
        if s[0] == 0 and (best is None or s[2] < best[1][2]):
            best = (fraction, s)
    if best is None:
        raise SystemExit("no reserve on the grid lets every predicted fit fit")
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="families runs in the choice (default: all committed)")
    ap.add_argument("--allocator", choices=("default", "expandable"), default="default",
                    help="the verdict whose reserve to choose (default: torch's default caching allocator)")
    args = ap.parse_args(argv)
    if args.allocator == "expandable":
        from harness.memory.fit.budget import EXPANDABLE_TRAIN_RESERVE

        cases = boundary_cases(args.runs, expandable=True)
        fraction, (ff, agree, loss) = choose_expandable(cases)
        print(f"{len(cases)} capped runs with expandable segments: reserve {fraction:.3f}: {agree}/{len(cases)} "
              f"agree, {ff} predicted fits that ran out, loss {loss:.1f}")
        print(f"budget.py holds: {EXPANDABLE_TRAIN_RESERVE:.3f}")
        return 0
    cases = boundary_cases(args.runs)
    fraction, shares, (ff, agree, loss) = choose(cases)
    print(f"{len(cases)} boundary cases: fraction {fraction:.3f}, shares {shares}: "
          f"{agree}/{len(cases)} agree, {ff} predicted fits that ran out, loss {loss:.1f}")
    held = (E.RESERVE_FRACTION["train"], E.REALLOCATED_HOLES)
    print(f"estimate.py holds: fraction {held[0]:.3f}, shares {held[1]}")
    print(f"    {'run':12} {'this choice':>30} {'what estimate.py holds':>32}")
    for run in sorted({c.run for c in cases}):
        mine = [c for c in cases if c.run == run]
        cells = []
        for f, sh in ((fraction, shares), held):
            ff, agree, _ = score([(c.margin(c.planned(sh), f), c.fits) for c in mine])
            cells.append(f"{agree:3}/{len(mine):<3} agree, {ff} ran out")
        print(f"    {run:12} {cells[0]:>30} {cells[1]:>32}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
