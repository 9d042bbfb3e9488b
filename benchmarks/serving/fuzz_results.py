"""How many malformed results files `report` and `compare` were fuzzed with, and how many of the
fuzz properties failed (must be 0: a traceback, an exit code other than 0/1/2, or an error of more
than one line fails one): tests/test_serving_fuzz.py with many more examples than CI runs.

Run:  .venv/bin/python benchmarks/serving/fuzz_results.py [--examples 2000] [--out reports]
Writes OUT/serving-fuzz.json and OUT/serving-fuzz.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_text  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="hypothesis examples per command (default 2000)")
    parser.add_argument("--out", default=str(ROOT / "reports"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts_file = out / "serving-fuzz-counts.json"
    counts_file.unlink(missing_ok=True)
    env = {**os.environ, "HARNESS_FUZZ_EXAMPLES": str(args.examples), "HARNESS_FUZZ_OUT": str(counts_file),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_serving_fuzz.py", "-p", "no:cacheprovider",
                           "--report-dir", str(out / "serving-fuzz-pytest"), "-q", "--timeout", "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    minutes = (time.monotonic() - started) / 60
    counts = json.loads(counts_file.read_text()) if counts_file.is_file() else {}
    # A bad answer anywhere fails its hypothesis test (which then shrinks it to one example).
    failed = re.search(r"(\d+) failed", proc.stdout)
    failed_properties = int(failed.group(1)) if failed else 0
    figures = {"examples_per_command": args.examples, "inputs": sum(counts.values()), "by_command_and_exit": counts,
               "malformed_refused": sum(v for k, v in counts.items() if k.endswith("exit 2")),
               "failed_properties": failed_properties, "pytest_exit": proc.returncode, "minutes": round(minutes, 1)}
    write_text(out / "serving-fuzz.json", json.dumps(figures, indent=1) + "\n")
    lines = [f"Fuzzed `report` and `compare` in process: {figures['inputs']} inputs, "
             f"{figures['malformed_refused']} refused as malformed (exit 2, one line), "
             f"{figures['failed_properties']} failed properties; pytest exit {proc.returncode} ({minutes:.1f} min)", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(counts.items())]
    write_text(out / "serving-fuzz.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    if proc.returncode:
        print(proc.stdout[-3000:], file=sys.stderr)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
