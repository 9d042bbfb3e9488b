"""The loop the verdict benchmarks share (replay_verdicts.py, plan_verdicts.py): boundary cases
worked through in spawned processes, each row written as it comes (atomic writes), and a rerun
resuming from the rows already there."""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections.abc import Callable
from pathlib import Path

from harness import atomic


def case_key(row: dict, run: str) -> str:
    """A boundary case's setting and run, one string."""
    return "|".join(str(row.get(k)) for k in ("arch", "targets", "lora_r", "grad_checkpointing", "batch", "seq_len",
                                              "optimizer")) + f"|{run}"


def rows_done(out: Path, field: str) -> dict[str, dict]:
    """The rows of a previous run that got `field` (not an error), by key."""
    rows = json.loads(out.read_text())["rows"] if out.is_file() else []
    return {r["key"]: r for r in rows if field in r}


def work_through(work: Callable[[tuple], dict], todo: list[tuple], done: dict[str, dict], out: Path, jobs: int,
                 describe: Callable[[dict], str], table: Callable[[list[dict]], list[str]], cases: int) -> None:
    """work(case) for each case of `todo`, `jobs` at once, each row written to `out` beside the
    `done` ones as it comes; then table(rows), written there too and printed."""
    print(f"{cases} cases, {len(done)} already in {out}, {len(todo)} to go", file=sys.stderr)
    rows = list(done.values())
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for i, row in enumerate(pool.imap_unordered(work, todo), 1):
            rows.append(row)
            atomic.write_json(out, {"rows": rows})
            print(f"[{i}/{len(todo)}] {row['key']}: {describe(row)}", file=sys.stderr, flush=True)
        pool.close()  # let the workers exit before the pool's exit terminates them
        pool.join()
    lines = table(rows)
    atomic.write_json(out, {"rows": rows, "table": lines})
    print("\n".join(lines))
