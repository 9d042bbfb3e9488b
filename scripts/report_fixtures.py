#!/usr/bin/env python3
"""Keep results files that real runs wrote as the browser tests' fixtures (tests/data/reports/).

    python scripts/report_fixtures.py hw-cpu=reports/hw-20261201-062450.json \\
        serving-gate... gate-new=reports/serving/gate-new.json ...

Each KIND=PATH is stored gzipped as tests/data/reports/KIND.json.gz, unchanged: the tests render
them with the current writers. Kinds the tests use: hw-gpu, hw-cpu, vram, nan, modeldir, serving,
timings (pytest runs) and gate-old, gate-new, gate-new-max-num-seqs-1, sweep-new (bench results).
"""

import gzip
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "reports"


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    for arg in argv:
        kind, path = arg.split("=", 1)
        data = json.loads(Path(path).read_text(encoding="utf-8"))  # must be JSON
        blob = gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0)
        (OUT / f"{kind}.json.gz").write_bytes(blob)
        print(f"{kind}: {len(blob) / 1024:.0f} KiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
