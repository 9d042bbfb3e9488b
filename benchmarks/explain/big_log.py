"""Time and peak memory of `python -m harness explain` on a 200 MB log (issue 44: it took 106 s).

Writes two logs to a temporary directory and explains each in a fresh process, measuring wall time
and the child's peak RSS (os.wait4's ru_maxrss):
- training: Trainer loss dicts, vLLM metrics lines and tqdm redraws, the CUDA OOM at the very end;
- warnings: every line a WARNING with an error word (the worst case for the pre-filter that keeps
  only lines a recogniser could read), the same OOM at the end.
The machine's load average is written beside the figures (the machine is shared).

    python3 benchmarks/explain/big_log.py [--size-mb 200] [--out measurements/explain/big_log.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of 15.77 "
       "GiB of which 514.19 MiB is free. Of the allocated memory 13.73 GiB is allocated by PyTorch, and 736.86 MiB is "
       "reserved by PyTorch but unallocated.\n")


def _block(kind: str) -> bytes:
    lines = []
    for i in range(2000):
        if kind == "training":
            lines.append(f"{{'loss': {1 + (i % 97) / 100:.4f}, 'grad_norm': {(i % 13) / 10:.4f}, 'learning_rate': 2e-05, "
                         f"'epoch': {i / 100:.2f}}}\n")
            lines.append(f"INFO 12-02 10:11:{i % 60:02d} [metrics.py:{i}] Avg prompt throughput: {i % 900}.0 tokens/s\n")
            lines.append(f" 38%|###8      | {i}/5000 [00:02<00:03,  1.28it/s]\r")
        else:
            lines.append(f"WARNING 12-02 10:11:{i % 60:02d} [utils.py:{i}] retrying request {i}: connection error, "
                         f"timeout after 30 s\n")
    return "".join(lines).encode()


def _write(path: Path, kind: str, size: int) -> int:
    block = _block(kind)
    with path.open("wb") as handle:
        written = 0
        while written < size:
            handle.write(block)
            written += len(block)
        handle.write(OOM.encode())
    return path.stat().st_size


def _explain(path: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "explain", str(path), "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    result = json.loads(out)
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "exit": os.waitstatus_to_exitcode(status), "kind": result["kind"], "input": result.get("input")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "measurements" / "explain" / "big_log.json"))
    args = parser.parse_args(argv)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("training", "warnings"):
            path = Path(tmp) / f"{kind}.log"
            size = _write(path, kind, args.size_mb * 1024**2)
            rows[kind] = dict(_explain(path), bytes=size)
            print(f"{kind}: {size / 1024**2:.0f} MiB -> {rows[kind]['kind']} in {rows[kind]['wall_s']} s, "
                  f"peak RSS {rows[kind]['peak_rss_mib']} MiB")
    out = {"logs": rows, "load_average": os.getloadavg(), "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"written: {args.out} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
