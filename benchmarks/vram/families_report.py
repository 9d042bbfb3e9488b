"""The issue-27 figures from the committed H200 runs (measurements/vram/families/,
measurements/vram/families/, measurements.families_runs()), recomputed with the estimator as it is now: per family the median / worst /
worst-under error of inference and of training (checkpointing on and off apart), plan --train
against real OOM under 6 GiB (all and per family), plan --offload against a real offloaded run,
and the snapshot cases' memory picture, predicted beside measured.

    python benchmarks/vram/families_report.py [--dir DIR] [--json reports/vram-families.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import atomic  # noqa: E402
import measurements  # noqa: E402
from harness.memory.measured import families_truth as T  # noqa: E402
from harness.memory.measured.train_matrix import agreement, false_fits  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="one run's directory (default: every committed run)")
    ap.add_argument("--json", default=str(ROOT / "reports" / "vram-families.json"))
    args = ap.parse_args(argv)
    directory = measurements.run_dir(args.dir) if args.dir else measurements.families_runs()
    if not T.row_files(directory):
        where = args.dir or "measurements/vram/families"
        print(f"no rows under {where}/rows: run scripts/gpu/families.sh on a GPU and commit its rows", file=sys.stderr)
        return 1
    s = T.evaluate_families(directory)
    print("\n".join(T.summary_lines(s)))
    out = {"inference": {a: v.as_dict() for a, v in s.inference.items() if v},
           "train_gc": {a: v.as_dict() for a, v in s.train_gc.items() if v},
           "train_nogc": {a: v.as_dict() for a, v in s.train_nogc.items() if v},
           "boundary": {"cases": len(s.boundary), "agreement": s.agreement, "false_fits": len(s.false_fits),
                        "per_family": {a: {"cases": len(s.boundary_of(a)), "agreement": s.agreement_of(a)}
                                       for a in sorted({r["arch"] for r in s.boundary})}},
           "boundary_expandable": {"cases": len(s.boundary_expandable),
                                   "agreement": agreement(s.boundary_expandable) if s.boundary_expandable else None,
                                   "false_fits": len(false_fits(s.boundary_expandable))},
           "offload": s.offload,
           "pictures": s.pictures, "failed_cases": s.failed, "held_out": list(T.HELD_OUT)}
    atomic.write_json(Path(args.json), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
